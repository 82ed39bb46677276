"""Distributed training on a LocalCluster (issue 6): seconds per epoch, rows per second, peak memory per worker,
strong scaling and the Dask overhead against the NumPy path.

Protocol, options and commands: benchmarks/README.md, section "dask_scaling.py".
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import types

import numpy as np
from _runner import begin, data_parallel_plans, end, header, options, parse, patched, row, test_scores


def parse_args(argv=None):
    p = options(__doc__, "20,000 rows, m = 20, chunks of 5,000, 4 s cells, one SEP data-parallel cell", blas_threads=1)
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
                 quick=dict(rows=[20_000], scaling_rows=20_000, inducing=20, chunk_rows=5_000, budget=4.0,
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


if __name__ == "__main__":
    main()
