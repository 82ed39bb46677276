"""Distributed training on a LocalCluster (issue 6): seconds per epoch, rows per second, peak memory per worker,
strong scaling and the Dask overhead against the NumPy path.

Protocol, options and commands: benchmarks/README.md, section "dask_scaling.py" (with ``--check``: "dask_scaling.py --check").
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
import types
import warnings

import numpy as np
from _runner import (
    begin, cpu_bound, data_parallel_plans, end, header, options, parse, parse_list, patched, row, test_scores,
    thread_variables, users_cluster, write_json,
)
from _runner import show as fmt

CHECK_DOC = ("The 200,000-row data-parallel check (issue 24): one SEP epoch in one process against 2 workers, as a "
             "user runs it.")


def parse_args(argv=None):
    p = options(__doc__, "20,000 rows, m = 20, chunks of 5,000, 1 s cells, one SEP data-parallel cell", blas_threads=1)
    p.add_argument("--check", action="store_true", help="the 200,000-row data-parallel check instead (its options: "
                   "--check --help)")
    p.add_argument("--rows", type=float, nargs="+", default=None, help="training rows per scale cell (default 1e6 1e7)")
    p.add_argument("--scaling-rows", type=float, default=None, help="rows of the strong-scaling cells (default 1e6)")
    p.add_argument("--inducing", type=int, default=None, help="m (default 200)")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per dask chunk, one task each (default 250,000)")
    p.add_argument("--budget", type=float, default=None, help="seconds of training per cell (default 240)")
    p.add_argument("--scaling-passes", type=int, default=None, help="EP passes timed per strong-scaling cell (default 3)")
    p.add_argument("--store", default="/tmp/agpc-dask-scaling", help="folder of the zarr store (created if missing)")
    p.add_argument("--methods", nargs="+", default=None, choices=["sep", "svi", "ep", "ep-files"],
                   help="methods of the scale table (default sep ep; quick: and ep-files)")
    p.add_argument("--skip-scaling", action="store_true", help="no strong-scaling table")
    p.add_argument("--only-scaling", action="store_true", help="only the strong-scaling table")
    p.add_argument("--only-minibatch", action="store_true", help="only the data-parallel minibatch table")
    p.add_argument("--skip-minibatch", action="store_true", help="no data-parallel minibatch table")
    p.add_argument("--mb-rows", type=float, default=None, help="rows of the data-parallel minibatch cells (one epoch)")
    p.add_argument("--mb-methods", nargs="+", default=None, choices=["sep", "ep", "svi"],
                   help="methods of the minibatch cells (default sep ep svi)")
    p.add_argument("--local-steps", type=int, nargs="+", default=None,
                   help="local steps per round of the 2-worker cells, default 1 4 16 64 (the 1-worker cell: the "
                        "library default)")
    p.add_argument("--test-rows", type=int, default=None, help="held-out rows for the test NLL (default 100,000)")
    args = parse(p, argv, full=dict(rows=[1e6, 1e7], scaling_rows=1e6, inducing=200, chunk_rows=250_000, budget=240.0,
                                    scaling_passes=3, methods=["sep", "ep"], mb_rows=1e6,
                                    mb_methods=["sep", "ep", "svi"], local_steps=[1, 4, 16, 64], test_rows=100_000),
                 quick=dict(rows=[20_000], scaling_rows=20_000, inducing=20, chunk_rows=5_000, budget=1.0,
                            scaling_passes=2, methods=["sep", "ep", "ep-files"], mb_rows=20_000, local_steps=[4],
                            test_rows=2_000, mb_methods=["sep"]))
    if args.quick:
        args.store += "-quick"
    args.rows, args.scaling_rows, args.mb_rows = [int(r) for r in args.rows], int(args.scaling_rows), int(args.mb_rows)
    if args.only_minibatch:
        args.methods, args.skip_scaling = [], True
    return args


def open_data(args, n):
    """The first n rows of the store (written on first use, a chunk at a time) as dask arrays."""
    import dask.array as da
    import zarr

    from agpc.datasets import make_airline_like

    need = max(max(args.rows), args.scaling_rows, args.mb_rows)
    folder = os.path.join(args.store, f"chunks-{args.chunk_rows}")  # stored chunks = dask chunks: no rechunking
    store = os.path.join(folder, "data.zarr")
    if os.path.exists(store) and zarr.open_group(store, mode="r")["X"].shape[0] < need:
        import shutil

        shutil.rmtree(folder)
    if not os.path.exists(store):
        t0 = time.perf_counter()
        make_airline_like(need, random_state=0, path=folder, format="zarr", chunk_size=args.chunk_rows)
        print(f"(wrote {need:,} rows to {store} in {time.perf_counter() - t0:.0f} s)\n", flush=True)
    root = zarr.open_group(store, mode="r")
    return da.from_zarr(root["X"])[:n], da.from_zarr(root["y"])[:n]


@contextlib.contextmanager
def step_clock():
    """Times every step the training loop takes (``Trainer.step`` wrapped): ``clock.times``, the seconds of each step
    taken, and ``clock.started``, time.time() of the first."""
    from agpc.inference import training

    clock = types.SimpleNamespace(times=[], started=None)

    def make(real):
        def step(trainer, *a, **k):
            if clock.started is None:
                clock.started = time.time()
            t0 = time.perf_counter()
            out = real(trainer, *a, **k)
            if out[0]:
                clock.times.append(time.perf_counter() - t0)
            return out

        return step

    with patched(training.Trainer, "step", make):
        yield clock


def rows_of_rounds(plan):
    """Rows the shards stepped on in all rounds of a fit."""
    return sum(sum(r["steps"]) for r in plan.rounds) * plan.batch_size


class WorkerMemory:
    """Peak resident set size of each worker, sampled every ``every`` seconds in a thread."""

    def __init__(self, client, every=0.5):
        self.client, self.every = client, every
        self.samples = []  # (time.time(), {worker: rss})
        self.before = self.sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self):
        import psutil

        return self.client.run(lambda: psutil.Process().memory_info().rss)

    def _run(self):
        while not self._stop.wait(self.every):
            try:
                self.samples.append((time.time(), self.sample()))
            except Exception:  # the cluster closing under the sampler
                return

    def stop(self, since):
        """(peak RSS of any worker over the whole fit, the same from ``since`` on, RSS before the fit)."""
        self._stop.set()
        self._thread.join()

        def peak(samples):
            return max((max(rss.values()) for _, rss in samples), default=float("nan"))

        training = [(t, rss) for t, rss in self.samples if since is not None and t >= since]
        return peak(self.samples), peak(training), max(self.before.values())


def local_cluster(workers):
    """The cluster ``fit`` starts when given none (agpc's worker settings), with no memory limit: no spilling or
    pausing, the benchmark measures what the fit needs."""
    from distributed import Client

    from agpc.inference.dask_engine import local_cluster as agpc_local_cluster

    cluster = agpc_local_cluster(workers, memory_limit=0)
    return cluster, Client(cluster)


def scale_cell(args, method, n):
    from agpc import GPClassifier

    X, y = open_data(args, n)
    cluster, client = local_cluster(2)
    try:
        with step_clock() as clock, data_parallel_plans() as plans:
            client.run(lambda: __import__("agpc.inference.ep"))  # imports counted in the baseline, not the peak
            memory = WorkerMemory(client)
            batch = 200 if method in MINIBATCH else None
            sites = os.path.join(args.store, "sites") if method == "ep-files" else None
            t0 = time.perf_counter()
            GPClassifier(method=method.split("-")[0], n_inducing=args.inducing, batch_size=batch, max_iter=1000,
                         max_time=args.budget, random_state=0, client=client, site_directory=sites).fit(X, y)
            wall = time.perf_counter() - t0
            peak, training_peak, before = memory.stop(clock.started)
    finally:
        client.close()
        cluster.close()
    steps = clock.times
    row = {"method": method, "n": n, "wall": wall, "train": sum(steps), "steps": len(steps), "peak": peak,
           "training_peak": training_peak, "before": before}
    if method in MINIBATCH:  # data-parallel rounds (the default on a dask array): a step is a round
        row["rows_seen"] = rows_of_rounds(plans[-1])
        # max_time bounds the whole fit (set-up included): on a loaded machine a short budget may end before a
        # round, and the cell then has no rate to give
        row["rows_per_s"] = row["rows_seen"] / sum(steps) if steps else float("nan")
        row["epoch_s"] = n / row["rows_per_s"]
    else:
        warm, graded = steps[:10], steps[10:]
        row["pass_s"] = statistics.median(warm) if warm else float("nan")  # (no pass within a short budget)
        row["grad_pass_s"] = statistics.median(graded) if graded else float("nan")
        row["rows_per_s"] = n / row["pass_s"]
        row["epoch_s"] = row["pass_s"]
    return row


def ep_pass_seconds(args, workers, in_files=False):
    """Median seconds of the first ``--scaling-passes`` warm-up EP passes; workers=0: the NumPy path."""
    from agpc import GPClassifier

    X, y = open_data(args, args.scaling_rows)
    params = dict(method="ep", n_inducing=args.inducing, batch_size=None, max_iter=1, random_state=0,
                  site_directory=os.path.join(args.store, "sites") if in_files else None)
    with step_clock() as clock:
        if workers == 0:
            Xn, yn = X.compute(scheduler="threads"), y.compute(scheduler="threads")
            GPClassifier(**params, max_time=0.01).fit(Xn[:2000], yn[:2000])  # warm the imports
            clock.times.clear()
            _fit_passes(GPClassifier, params, args, Xn, yn)
        else:
            cluster, client = local_cluster(workers)
            try:
                X = client.persist(X)  # strong scaling: the passes, not the disk
                _fit_passes(GPClassifier, dict(params, client=client), args, X, y)
            finally:
                client.close()
                cluster.close()
    return statistics.median(clock.times)


def _fit_passes(GPClassifier, params, args, X, y):
    """Fit until ``--scaling-passes`` passes have been timed (the first 10 are warm-up passes)."""
    from agpc.inference import training

    count = {"n": 0}

    def make(real):
        def limited(trainer, *a, **k):
            count["n"] += 1
            if count["n"] > args.scaling_passes:
                raise _Enough
            return real(trainer, *a, **k)

        return limited

    with patched(training.Trainer, "step", make), contextlib.suppress(_Enough):
        GPClassifier(**params).fit(X, y)


class _Enough(Exception):
    pass


MINIBATCH = ("sep", "svi")  # section 1's minibatch methods (200 rows a step, data-parallel rounds)
LABELS = {"sep": "SEP minibatch 200, data-parallel", "svi": "SVI minibatch 200, data-parallel",
          "ep": "EP batch, sites in memory",
          "ep-files": "EP batch, sites in files"}

MB_BATCH = 200  # rows of a minibatch step in section 3


def test_rows(args):
    """Held-out rows from the same generator (another seed), in memory."""
    from agpc.datasets import make_airline_like

    return make_airline_like(args.test_rows, random_state=1)


def minibatch_cell(args, method, workers, local_steps, X_test, y_test):
    """One epoch of minibatch ``method``: workers=0 in this process (rows in memory), else data-parallel on a
    fresh cluster of ``workers`` (rows read from zarr by the workers)."""
    from agpc import GPClassifier

    n = args.mb_rows
    X, y = open_data(args, n)
    if X.chunks[0][0] > args.chunk_rows:  # (--quick: the store's 65,536-row chunks would be one shard)
        X, y = X.rechunk({0: args.chunk_rows}), y.rechunk({0: args.chunk_rows})
    params = dict(method=method, n_inducing=args.inducing, batch_size=MB_BATCH, max_iter=1, random_state=0)
    row = {"method": method, "workers": workers, "local_steps": local_steps}
    with step_clock() as clock, data_parallel_plans() as plans:
        if workers == 0:
            Xn, yn = X.compute(scheduler="threads"), y.compute(scheduler="threads")
            model = GPClassifier(**params).fit(Xn, yn)
            row["rows_seen"] = n
        else:
            cluster, client = local_cluster(workers)
            try:
                client.run(lambda: __import__("agpc.inference.data_parallel"))
                memory = WorkerMemory(client)
                model = GPClassifier(**params, client=client, local_steps=local_steps).fit(X, y)
                row["peak"] = memory.stop(clock.started)[1]
            finally:
                client.close()
                cluster.close()
            plan = plans[-1]
            rounds = plan.rounds[1:] or plan.rounds  # (the first round also reads the chunks)
            row["rows_seen"] = rows_of_rounds(plan)
            row["round_s"] = statistics.median(r["seconds"] for r in rounds)
            row["task_s"] = statistics.median(max(r["task_seconds"]) for r in rounds)  # the slowest task's
            row["overhead_s"] = statistics.median(r["seconds"] - max(r["task_seconds"]) for r in rounds)
            row["sent"] = statistics.median(r["bytes_sent"] for r in rounds)
            row["received"] = statistics.median(r["bytes_received"] for r in rounds)
            row["shards"] = len(plan.shards)
            row["rounds"] = len(plan.rounds)
    row["train_s"] = sum(clock.times)
    row["rows_per_s"] = row["rows_seen"] / row["train_s"]
    row["nll"] = test_scores(model, X_test, y_test)[0]
    return row


# Assumed for the projection: the driver's link (10 Gb/s) carries every shard's bytes of a round in turn.
LINK_BYTES_PER_S = 1.25e9


def minibatch_section(args):
    from agpc.inference.data_parallel import DEFAULT_LOCAL_STEPS

    X_test, y_test = test_rows(args)
    n = args.mb_rows
    print(f"\nData-parallel minibatch training (issue 18): {n:,} airline-like rows (one epoch per cell, chunks of "
          f"{args.chunk_rows:,} rows), m = {args.inducing}, {MB_BATCH} rows a step, test NLL on {args.test_rows:,} "
          f"held-out rows. Library default: {DEFAULT_LOCAL_STEPS} local steps per round.\n")
    header(["method", "where", "local steps", "rows seen", "rows / s", "vs one process", "vs 1 worker", "test NLL",
            "NLL - one process", "round ms", "slowest task ms", "overhead ms", "KB sent / round", "KB back / round",
            "peak worker RSS MB"])
    cells = []
    for method in args.mb_methods:
        plan = [(0, None), (1, DEFAULT_LOCAL_STEPS)] + [(2, steps) for steps in args.local_steps]
        base = {}
        for workers, steps in plan:
            r = minibatch_cell(args, method, workers, steps, X_test, y_test)
            cells.append(r)
            if workers < 2:
                base[workers] = r
            one = base[0]
            where = "one process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
            vs_one_worker = f"{r['rows_per_s'] / base[1]['rows_per_s']:.2f}" if workers > 1 and 1 in base else "-"

            def ms(key):
                return f"{1000 * r[key]:.1f}" if key in r else "-"

            def kb(key):
                return f"{r[key] / 1024:.0f}" if key in r else "-"

            peak = f"{r['peak'] / 1024 ** 2:.0f}" if "peak" in r else "-"
            row(method, where, steps or "-", f"{r['rows_seen']:,}", f"{r['rows_per_s']:,.0f}",
                f"{r['rows_per_s'] / one['rows_per_s']:.2f}", vs_one_worker, f"{r['nll']:.4f}",
                f"{r['nll'] - one['nll']:+.4f}", ms("round_s"), ms("task_s"), ms("overhead_s"), kb("sent"),
                kb("received"), peak)
    print("\nProjection to more workers (one core each; a model, not a measurement): a round takes the slowest "
          "task's seconds at 2 workers (a shard's work does not depend on the number of shards) plus an "
          "overhead growing linearly in the workers through the 1- and 2-worker overheads measured above "
          "(the driver submits, gathers and combines every shard's factors in turn), plus every shard's bytes "
          f"over a {8 * LINK_BYTES_PER_S / 1e9:.0f} Gb/s link to the driver. Rows per second = workers x local "
          f"steps x {MB_BATCH} / round seconds.\n")
    header(["method", "local steps", "workers", "round ms (projected)", "rows / s (projected)", "x one process"])
    for method in args.mb_methods:
        mine = [r for r in cells if r["method"] == method]
        one_process = next(r for r in mine if r["workers"] == 0)
        one = next((r for r in mine if r["workers"] == 1), None)
        for two in (r for r in mine if r["workers"] == 2):
            if one is None:
                continue
            per_worker = two["overhead_s"] - one["overhead_s"]
            bytes_per_shard = (two["sent"] + two["received"]) / two["shards"]
            for workers in (16, 64):
                seconds = (two["task_s"] + one["overhead_s"] + (workers - 1) * max(per_worker, 0.0)
                           + workers * bytes_per_shard / LINK_BYTES_PER_S)
                rate = workers * two["local_steps"] * MB_BATCH / seconds
                row(method, two["local_steps"], workers, f"{1000 * seconds:.0f}", f"{rate:,.0f}",
                    f"{rate / one_process['rows_per_s']:.1f}")
    return cells


def main(argv=None):
    if "--check" in (sys.argv[1:] if argv is None else argv):
        return check_main(argv)
    args = parse_args(argv)
    # The driver computes the minibatch steps and the m x m algebra: one BLAS thread, like each worker
    # (the nanny starts workers with OMP/OPENBLAS/MKL_NUM_THREADS=1); a spinning second thread on a loaded
    # 2-core machine made a 200 x 200 Cholesky take 0.3 s.
    started = begin("Distributed training on a LocalCluster (issues 6 and 18)", args, argv, imports=("distributed",))
    if args.methods and not args.only_scaling:
        scale_table(args)
    if not args.skip_scaling:
        strong_scaling(args)
    if not (args.only_scaling or args.skip_minibatch):
        minibatch_section(args)
    end(started)


def scale_table(args):
    mb = 1024.0 ** 2
    print(f"m = {args.inducing}, chunks of {args.chunk_rows:,} rows read from zarr each pass, {args.budget:.0f} s of "
          "training per cell, fresh cluster per cell.\n")
    header(["method", "rows", "steps timed", "rows / s", "s / epoch", "s / EP pass with gradient", "worker RSS before",
            "peak worker RSS, whole fit", "peak worker RSS, training steps", "fit wall s"])
    rows = []
    for method in args.methods:
        for n in args.rows:
            r = scale_cell(args, method, n)
            rows.append(r)
            extrapolated = " (extrapolated)" if method in MINIBATCH and r["rows_seen"] < n else ""
            grad = f"{r['grad_pass_s']:.1f}" if method not in MINIBATCH and np.isfinite(r["grad_pass_s"]) else "-"
            row(LABELS[method], f"{n:,}", r["steps"], f"{r['rows_per_s']:,.0f}", f"{r['epoch_s']:,.1f}{extrapolated}",
                grad, f"{r['before'] / mb:.0f} MB", f"{r['peak'] / mb:.0f} MB", f"{r['training_peak'] / mb:.0f} MB",
                f"{r['wall']:.0f}")
    print()
    for method in args.methods:
        cells = sorted((r for r in rows if r["method"] == method), key=lambda r: r["n"])
        if len(cells) > 1:
            a, b = cells[0], cells[-1]
            for key, what in (("peak", "whole fit"), ("training_peak", "training steps")):
                growth = (b[key] - a[key]) / a[key]
                print(f"- {method}, {what}: peak worker RSS {a[key] / mb:.0f} MB at {a['n']:,} rows -> "
                      f"{b[key] / mb:.0f} MB at {b['n']:,} rows: {100 * growth:+.0f}% "
                      f"({'flat within 20%' if abs(growth) <= 0.2 else 'NOT flat'})")


def strong_scaling(args):
    n = args.scaling_rows
    print(f"\nStrong scaling, batch EP at {n:,} rows (X persisted on the workers), median of "
          f"{args.scaling_passes} warm-up passes:\n")
    numpy_s = ep_pass_seconds(args, 0)
    one = ep_pass_seconds(args, 1)
    two = ep_pass_seconds(args, 2)
    one_files = ep_pass_seconds(args, 1, in_files=True)
    header(["path", "s / pass", "vs NumPy", "speed-up vs 1 worker"])
    row(f"NumPy, this process, {args.blas_threads} BLAS thread(s)", f"{numpy_s:.2f}", "1.00", "-")
    for label, seconds in (("Dask, 1 worker", one), ("Dask, 1 worker, sites in files", one_files)):
        row(label, f"{seconds:.2f}", f"{seconds / numpy_s:.2f} (overhead {100 * (seconds / numpy_s - 1):+.0f}%)",
            f"{one / seconds:.2f}")
    row("Dask, 2 workers", f"{two:.2f}", f"{two / numpy_s:.2f}", f"{one / two:.2f}")


# -- the data-parallel check (--check) -------------------------------------------------------------

CELLS = ("one", "cluster", "n_jobs")
TARGET_RATIO = 1.4
TARGET_NLL = 0.005


def check_args(argv=None):
    p = options(CHECK_DOC, "22,000 rows, m = 20, chunks of 2,500, minibatch 100", out="data_parallel_check")
    p.add_argument("--check", action="store_true", help="this check")
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
    """Moments of a fit, from hooks on the library: the initial inducing points' start and end
    (``inputs.start_inducing_points``), each training step's or round's start and end (``Trainer.step`` of the
    driver), and the rounds' own record (the ``DataParallel`` plan: steps of each shard, task seconds)."""

    def __init__(self):
        self.marks, self.steps, self.plans = {}, [], []

    @contextlib.contextmanager
    def hooked(self):
        from agpc import inputs
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

        with patched(inputs, "start_inducing_points", initial_model), \
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
            rounds = self.plans[-1].rounds
            seconds = [r["seconds"] for r in rounds]
            per_shard = [list(r["steps"]) for r in rounds]
            slowest = [max(r["task_seconds"]) for r in rounds]
            minibatches = sum(sum(steps) for steps in per_shard)
            out.update(rounds=len(rounds), round_steps=per_shard, steps=minibatches,
                       median_round=statistics.median(seconds),
                       round_overhead=statistics.median(r - t for r, t in zip(seconds, slowest)),
                       fixed_cost=steps[0][0] - t0 + max(0.0, seconds[0] - statistics.median(seconds)))
            out["cpu_ms_per_step"] = 1e3 * sum(sum(r["task_cpu_seconds"]) for r in rounds) / minibatches
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


def check_main(argv=None):
    args = check_args(argv)
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
