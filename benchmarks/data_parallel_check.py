"""The 200,000-row data-parallel check (issue 24): one SEP epoch in one process against 2 workers, as a user runs it.

Protocol, options and commands: benchmarks/README.md, section "data_parallel_check.py".
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import warnings

import numpy as np
from _runner import (
    begin, cpu_bound, data_parallel_plans, end, header, options, parse, parse_list, patched, row, test_scores,
    thread_variables, users_cluster, write_json,
)
from _runner import show as fmt

CELLS = ("one", "cluster", "n_jobs")
TARGET_RATIO = 1.4
TARGET_NLL = 0.005


def parse_args(argv=None):
    p = options(__doc__, "22,000 rows, m = 20, chunks of 2,500, minibatch 100", out="data_parallel_check")
    p.add_argument("--rows", type=int, default=None, help="rows generated (default 210,000)")
    p.add_argument("--train", type=int, default=None, help="the first this many train, the rest test (default 200,000)")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per dask chunk (default 25,000)")
    p.add_argument("--inducing", type=int, default=None, help="m (default 200)")
    p.add_argument("--batch", type=int, default=None, help="minibatch rows (default 200)")
    p.add_argument("--epochs", type=int, default=1, help="max_iter (default 1)")
    p.add_argument("--workers", type=int, default=2, help="cluster workers and n_jobs (default 2)")
    p.add_argument("--method", default="sep", choices=["sep", "ep", "adf", "svi"])
    p.add_argument("--local-steps", type=int, default=None,
                   help="local_steps of the data-parallel cells (default: the library's, balanced rounds)")
    p.add_argument("--cells", default=",".join(CELLS), help=f"which of {', '.join(CELLS)} (default all)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each cell, interleaved (the median is shown)")
    p.add_argument("--busy", type=int, default=0, help="extra CPU-bound processes during every cell (default 0)")
    p.add_argument("--busy-nice", type=int, default=0, help="their niceness (default 0: normal priority)")
    p.add_argument("--crossover", default="", help="training sizes of a one-process against n_jobs table")
    args = parse(p, argv, full=dict(rows=210_000, train=200_000, chunk_rows=25_000, inducing=200, batch=200),
                 quick=dict(rows=22_000, train=20_000, chunk_rows=2_500, inducing=20, batch=100))
    args.cells = parse_list(args.cells, CELLS, "cell")
    args.crossover = parse_list(args.crossover, convert=int)
    return args


class Phases:
    """Moments of a fit, from hooks on the library: k-means's start and end (``initial_inducing_points``), each
    training step's or round's start and end (``Trainer.step`` of the driver), and the rounds' own record (the
    ``DataParallel`` plan: steps of each shard, task seconds)."""

    def __init__(self):
        self.marks, self.steps, self.plans = {}, [], []

    @contextlib.contextmanager
    def hooked(self):
        from agpc import classifier
        from agpc.inference import training

        def initial_model(real_init):
            def init(*args, **kwargs):
                self.marks["init_start"] = time.perf_counter()
                out = real_init(*args, **kwargs)
                self.marks["init_end"] = time.perf_counter()
                return out

            return init

        def step(real_step):
            def timed(trainer, *args, **kwargs):
                t, cpu = time.perf_counter(), time.thread_time()
                out = real_step(trainer, *args, **kwargs)
                self.steps.append((t, time.perf_counter(), time.thread_time() - cpu))
                return out

            return timed

        with patched(classifier, "initial_inducing_points", initial_model), \
                patched(training.Trainer, "step", step), data_parallel_plans() as self.plans:
            yield self

    def summary(self, t0, t_end):
        """Seconds of each phase of a fit that ran from t0 to t_end."""
        m, steps = self.marks, self.steps
        out = {"before_init": m["init_start"] - t0, "init": m["init_end"] - m["init_start"],
               "to_first_step": steps[0][0] - m["init_end"], "first_step": steps[0][1] - steps[0][0],
               "rest_of_training": steps[-1][1] - steps[0][1], "after_training": t_end - steps[-1][1],
               "steps": len(steps), "cpu_ms_per_step": 1e3 * sum(s[2] for s in steps) / len(steps)}
        if self.plans:
            plan = self.plans[-1]
            rounds = plan.rounds
            seconds = [r["seconds"] for r in rounds]
            # (an agpc before balanced rounds recorded one step count and the slowest task's seconds a round)
            per_shard = [r["steps"] if isinstance(r["steps"], list) else [r["steps"]] * len(plan.shards)
                         for r in rounds]
            slowest = [max(np.atleast_1d(r["task_seconds"])) for r in rounds]
            minibatches = sum(sum(steps) for steps in per_shard)
            out.update(rounds=len(rounds), round_steps=per_shard, steps=minibatches,
                       median_round=statistics.median(seconds),
                       round_overhead=statistics.median(r - t for r, t in zip(seconds, slowest)),
                       fixed_cost=steps[0][0] - t0 + max(0.0, seconds[0] - statistics.median(seconds)))
            if all("task_cpu_seconds" in r for r in rounds):
                out["cpu_ms_per_step"] = 1e3 * sum(sum(r["task_cpu_seconds"]) for r in rounds) / minibatches
            else:
                out["cpu_ms_per_step"] = None
        return out


def run_cell(cell, args, data, cluster_data):
    """One fit of ``cell``: its row of the table."""
    from agpc import GPClassifier

    X_train, y_train, X_test, y_test = data
    params = dict(method=args.method, n_inducing=args.inducing, batch_size=args.batch, max_iter=args.epochs,
                  random_state=0)
    if cell == "n_jobs":
        params["n_jobs"] = args.workers
    if cell != "one" and args.local_steps is not None:
        params["local_steps"] = args.local_steps
    X, y = cluster_data if cell == "cluster" else (X_train, y_train)
    phases = Phases()
    with phases.hooked(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        model = GPClassifier(**params).fit(X, y)
        t_end = time.perf_counter()
    nll, err = test_scores(model, X_test, y_test)
    seconds = t_end - t0
    return {"cell": cell, "fit_seconds": seconds, "rows_per_second": len(y_train) * args.epochs / seconds,
            "nll": nll, "error": err, "n_jobs_used": getattr(model, "n_jobs_", None), **phases.summary(t0, t_end)}


def print_table(rows, one):
    header(["cell", "fit s", "rows / s", "x one process", "set-up s", "k-means s", "to first step s",
            "first step / round s", "rest of training s", "end s", "rounds", "steps a round (first, last)",
            "round overhead ms", "CPU ms a step", "fixed cost s", "test NLL", "NLL - one"], "lrrrrrrrrrrlrrrrr")
    for r in rows:
        ratio = r["rows_per_second"] / one["rows_per_second"] if one else None
        steps = f"{r['round_steps'][0]}, {r['round_steps'][-1]}" if r.get("round_steps") else "-"
        label = {"one": "one process", "cluster": "user's LocalCluster", "n_jobs": "n_jobs"}[r["cell"]]
        row(label, f"{r['fit_seconds']:.2f}", f"{r['rows_per_second']:,.0f}", fmt(ratio, ".2f"), f"{r['before_init']:.2f}",
            f"{r['init']:.2f}", f"{r['to_first_step']:.2f}", f"{r['first_step']:.3f}", f"{r['rest_of_training']:.2f}",
            f"{r['after_training']:.2f}", r.get("rounds", "-"), steps,
            fmt(r.get("round_overhead") and 1e3 * r["round_overhead"], ".1f"), fmt(r["cpu_ms_per_step"], ".2f"),
            fmt(r.get("fixed_cost"), ".2f"), f"{r['nll']:.4f}", fmt(r["nll"] - one["nll"] if one else None, "+.4f"))


def median_row(runs):
    """The run of median fit seconds (its own figures, not a mix of runs)."""
    ordered = sorted(runs, key=lambda r: r["fit_seconds"])
    return ordered[(len(ordered) - 1) // 2]


def main(argv=None):
    args = parse_args(argv)
    started = begin("The 200,000-row data-parallel check (issue 24)", args, argv)
    from agpc.datasets import make_airline_like

    print("\n".join(thread_variables()))
    X, y = make_airline_like(args.rows, random_state=0)
    data = (X[:args.train], y[:args.train], X[args.train:], y[args.train:])
    print(f"- data: make_airline_like({args.rows:,}, random_state=0): {args.train:,} training rows, "
          f"{args.rows - args.train:,} test; {args.method.upper()}, m = {args.inducing}, minibatch {args.batch}, "
          f"{args.epochs} epoch(s); {args.workers} workers; chunks of {args.chunk_rows:,} rows; "
          f"local_steps {args.local_steps}; {args.busy} extra CPU-bound process(es) during the cells"
          f"{f' (nice {args.busy_nice})' if args.busy else ''}; {args.repeats} run(s) a cell\n", flush=True)

    runs = {cell: [] for cell in args.cells}
    for _ in range(args.repeats):
        for cell in args.cells:
            # (the user's cluster exists only around its own cell: its scheduler's threads share this process)
            with (users_cluster(*data[:2], args.workers, args.chunk_rows) if cell == "cluster"
                  else contextlib.nullcontext()) as cluster_data:
                with cpu_bound(args.busy, args.busy_nice):
                    runs[cell].append(run_cell(cell, args, data, cluster_data))
            print(f"<!-- {cell}: {runs[cell][-1]['fit_seconds']:.2f} s, NLL {runs[cell][-1]['nll']:.4f} -->",
                  flush=True)
    rows = [median_row(runs[cell]) for cell in args.cells]
    one = next((r for r in rows if r["cell"] == "one"), None)
    print(f"\n### One epoch, {args.train:,} rows ({'median of ' + str(args.repeats) + ' runs' if args.repeats > 1 else 'one run'})\n")
    print_table(rows, one)
    if one:
        print()
        for r in rows:
            if r["cell"] != "one":
                ratio = r["rows_per_second"] / one["rows_per_second"]
                print(f"- {'met' if ratio >= TARGET_RATIO else 'NOT met'}: {r['cell']} rows / s {ratio:.2f}x one "
                      f"process (target >= {TARGET_RATIO})")
                delta = r["nll"] - one["nll"]
                print(f"- {'met' if abs(delta) <= TARGET_NLL else 'NOT met'}: {r['cell']} test NLL "
                      f"{r['nll']:.4f} vs {one['nll']:.4f} ({delta:+.4f}; target within {TARGET_NLL})")
    if args.repeats > 1:
        print("\nEvery run (fit seconds): " + "; ".join(
            f"{cell} " + ", ".join(f"{r['fit_seconds']:.2f}" for r in runs[cell]) for cell in args.cells))

    crossover = []
    if args.crossover:
        header(["training rows", "one process s", "n_jobs s", "n_jobs / one (rows / s)", "NLL one", "NLL n_jobs"],
               "rrrrrr", f"One process against n_jobs={args.workers}: one epoch at each size")
        for n in args.crossover:
            sized = (data[0][:n], data[1][:n], data[2], data[3])
            with cpu_bound(args.busy, args.busy_nice):
                pair = [run_cell(cell, args, sized, None) for cell in ("one", "n_jobs")]
            crossover.append({"rows": n, "one": pair[0], "n_jobs": pair[1]})
            row(f"{n:,}", f"{pair[0]['fit_seconds']:.2f}", f"{pair[1]['fit_seconds']:.2f}",
                f"{pair[0]['fit_seconds'] / pair[1]['fit_seconds']:.2f}", f"{pair[0]['nll']:.4f}", f"{pair[1]['nll']:.4f}")

    write_json(args.out, {"argv": sys.argv if argv is None else argv, "runs": runs, "crossover": crossover})
    end(started)


if __name__ == "__main__":
    main()
