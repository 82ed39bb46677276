"""Seconds for one full EP iteration against one Knm^T Knm product of the same shape.

One full iteration = one call of ``agpc.inference.ep.evaluate(kernel, Z, X, y, site_precision, site_shift,
jitter=1e-6, want_grad=True, block_rows=B)``: it rebuilds q from the sites (one pass over the rows), sweeps
every site and computes the gradient (a second pass). With one block the second pass reuses the projection
of the first (cached); with several blocks it recomputes it.

Reference, timed in the same run on the same kernel blocks: ``Kb.T @ Kb`` summed over the same row blocks
(NumPy sends ``A.T @ A`` to BLAS syrk, n m^2 flops) and ``Kb.T @ W`` with W a copy of Kb (a plain gemm,
2 n m^2 flops). Target (issue): iteration / (Knm^T Knm) at most 8.

Synthetic data: X standard Gaussian (n x d, float64), labels +-1 from a smooth function, Z = m random rows
of X, sites nu ~ U(0, 0.5), mu ~ N(0, 0.3^2), RBF(lengthscales 1, amplitude 1, noise 1e-3).

    PYTHONPATH=. python benchmarks/ep_iteration.py            # n = 1e4, 1e5, 1e6 x m = 50, 200, 500
    PYTHONPATH=. python benchmarks/ep_iteration.py --quick    # smoke test
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import limit_blas, load_line, print_machine  # noqa: E402

TARGET_RATIO = 8.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny smoke-test setting (n = 2000, 20000; m = 20, 100)")
    p.add_argument("--ns", default=None, help="comma-separated n values (default 10000,100000,1000000)")
    p.add_argument("--ms", default=None, help="comma-separated m values (default 50,200,500)")
    p.add_argument("-d", "--dim", type=int, default=8, help="input dimension d (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="timings per configuration, median reported (default 3)")
    p.add_argument("--max-config-seconds", type=float, default=150.0,
                   help="fewer repeats when repeats x first timing would exceed this (default 150)")
    p.add_argument("--block-bytes", type=float, default=0,
                   help="block_rows = min(n, block_bytes // (8 m)): an n x m float64 block stays under this; "
                        "0 (default): the library's default blocks (block_rows=None)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blas-threads", type=int, default=None,
                   help="limit BLAS/OpenMP threads with threadpoolctl; 0 leaves them as configured "
                        "(default 0, but 1 with --quick: on a small shared machine a multi-threaded BLAS "
                        "stalls on small matrices whenever another process holds a core)")
    args = p.parse_args(argv)
    if args.quick and args.blas_threads is None:
        args.blas_threads = 1
    if args.quick:
        args.ns = args.ns or "2000,20000"
        args.ms = args.ms or "20,100"
    args.ns = [int(float(v)) for v in (args.ns or "10000,100000,1000000").split(",")]
    args.ms = [int(float(v)) for v in (args.ms or "50,200,500").split(",")]
    return args


def make_data(n, d, rng):
    X = rng.standard_normal((n, d))
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] - 0.3 * X[:, 3 % d] ** 2 + 0.3
    y = np.where(f + 0.1 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def n_repeats(first, args):
    if args.repeats <= 1:
        return 1
    return int(max(1, min(args.repeats, args.max_config_seconds // max(first, 1e-9))))


class ProjectionCounter:
    """Counts calls of ``ep.whiten`` (the n x m kernel block and its whitening) during one evaluate.

    Installed on the module at run time, nothing in the library is changed: one call a block means
    the gradient pass reused the projections of the first pass, two calls a block mean it recomputed them.
    """

    def __init__(self, ep):
        self.ep = ep
        self.calls = 0
        self.original = getattr(ep, "whiten", None)
        if self.original is not None:
            def counted(*a, **k):
                self.calls += 1
                return self.original(*a, **k)

            ep.whiten = counted

    def label(self, n_blocks):
        if self.original is None:
            return "unknown"
        if self.calls == n_blocks:
            return "cached"
        if self.calls == 2 * n_blocks:
            return "recomputed"
        return f"{self.calls} projections"


def time_iteration(ep, kernel, Z, X, y, nu, mu, block_rows, args, counter=None):
    times = []

    def once():
        t0 = time.perf_counter()
        out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-6, want_grad=True, block_rows=block_rows, checked=False)
        float(out["log_z"])  # synchronise (a no-op on NumPy)
        return time.perf_counter() - t0, out

    if counter is not None:
        counter.calls = 0
    t, out = once()
    calls = counter.calls if counter is not None else None
    times.append(t)
    if not np.isfinite(float(out["log_z"])):
        raise FloatingPointError("log Z_q is not finite on the benchmark data")
    del out
    for _ in range(n_repeats(times[0], args) - 1):
        times.append(once()[0])
    if counter is not None:
        counter.calls = calls  # the count of one evaluate
    return times


def time_products(kernel, Z, X, block_rows, reps, min_seconds=0.02):
    """Per repeat, the sum over row blocks of the time of Kb.T @ Kb (syrk) and of Kb.T @ W (gemm).

    A product shorter than ``min_seconds`` is looped and the mean taken, so that tiny shapes are not
    dominated by timer and call overhead.
    """
    n = X.shape[0]
    syrk = np.zeros(reps)
    gemm = np.zeros(reps)

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        if t >= min_seconds:
            return t
        loops = int(min(10000, max(2, min_seconds / max(t, 1e-7))))
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        return (time.perf_counter() - t0) / loops

    for lo in range(0, n, block_rows):
        Kb = np.asarray(kernel.K(X[lo:lo + block_rows], Z))
        W = Kb.copy()
        for r in range(reps):
            syrk[r] += timed(lambda: Kb.T @ Kb)
            gemm[r] += timed(lambda: Kb.T @ W)
        del Kb, W
    return list(syrk), list(gemm)


def step_counts(n_blocks):
    """Array operations, O(m^3) operations and host conversions of one ``ep.evaluate`` with its gradient over
    ``n_blocks`` row blocks, counted on the counting namespace of tests/array_counting.py (over
    array_api_strict) on a small problem with the same number of blocks: the counts depend on the number of
    blocks only, not on n or m (tests/test_step_budgets.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        import array_api_strict
        from array_counting import CountingNamespace
    except ImportError:
        return None
    from agpc import threads
    from agpc.inference import ep

    rows, m, d = 30, 24, 3
    xp = CountingNamespace(array_api_strict, m=m, rows=(rows,))
    rng = np.random.default_rng(0)
    X = xp.asarray(rng.normal(size=(rows * n_blocks, d)))
    y = xp.asarray(np.sign(rng.normal(size=rows * n_blocks)))
    import agpc

    kernel = agpc.RBF(lengthscales=[1.0] * d, amplitude=1.0, noise=1e-3).for_inputs(X)
    nu = xp.asarray(rng.uniform(0.0, 0.5, size=rows * n_blocks))
    mu = xp.asarray(rng.normal(0.0, 0.3, size=rows * n_blocks))
    Z = X[:m, ...]
    xp.start()
    out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-6, want_grad=True, block_rows=rows, checked=False)
    float(out["log_z"])
    counts = xp.stop().folded(("_log_ndtr_generic",)).counts()
    return counts["op"], counts["m3"], counts["host"] + counts["data_dependent"]


def main(argv=None):
    args = parse_args(argv)
    import agpc  # loads scipy's BLAS too: --blas-threads and the machine facts must see every pool
    from agpc import threads
    from agpc.inference import ep

    limiter = limit_blas(args.blas_threads)

    print_machine("Time of one full EP iteration (agpc.inference.ep.evaluate, want_grad=True)")
    d = args.dim
    blocks_text = (f"block_rows = min(n, {int(args.block_bytes):,} // (8 m))" if args.block_bytes
                   else "the library's default blocks")
    print(f"d = {d}, float64, jitter 1e-6, {blocks_text}; "
          f"times are medians of up to {args.repeats} runs (fewer when {args.repeats} x the first run would exceed "
          f"{args.max_config_seconds:.0f} s). projection: 'cached' when evaluate called ep.whiten once per block "
          f"(the gradient pass reused A = L_K^-1 Knm^T and Knm from the first pass), 'recomputed' when twice "
          f"(counted at run time). "
          f"syrk = Knm.T @ Knm (n m^2 flops), gemm = Knm.T @ W with W a copy (2 n m^2 flops), both summed over the "
          f"same row blocks. Target: iteration / syrk <= {TARGET_RATIO:g}. ops / m^3 ops / host syncs: of one "
          f"iteration as the training loop runs it (unchecked factorisations, one log Z read), counted on a "
          f"small problem with the same number of blocks (they depend on nothing else).\n")
    print("| n | m | blocks x rows | projection | runs | iteration s | Knm.T@Knm s | iteration / Knm.T@Knm "
          "| Knm.T@W s | iteration / gemm | target <= 8 | ops / m^3 ops / host syncs | BLAS threads |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    counter = ProjectionCounter(ep)
    rows = []
    t_start = time.perf_counter()
    for n in args.ns:
        rng = np.random.default_rng(args.seed)
        X, y = make_data(n, d, rng)
        kernel = agpc.RBF(lengthscales=[1.0] * d, amplitude=1.0, noise=1e-3).for_inputs(X)
        nu = rng.uniform(0.0, 0.5, size=n)
        mu = rng.normal(0.0, 0.3, size=n)
        for m in args.ms:
            if m > n:
                continue
            Z = X[rng.choice(n, size=m, replace=False)].copy()
            block_rows = int(min(n, args.block_bytes // (8 * m))) if args.block_bytes else None
            n_blocks = len(ep.row_blocks(n, block_rows, m))
            rows_per_block = ep.row_blocks(n, block_rows, m)[0][1]
            # the library's BLAS thread rule for a batch pass of this shape (agpc.threads), as fit applies it;
            # a --blas-threads limit set above is the caller's and is left alone by the rule
            with threads.blas_threads(n, m, n_features=d, block_rows=rows_per_block):
                it_times = time_iteration(ep, kernel, Z, X, y, nu, mu, block_rows, args, counter)
                reps = max(len(it_times), 3)
                syrk, gemm = time_products(kernel, Z, X, rows_per_block, reps)
                from threadpoolctl import threadpool_info

                chosen = sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})
            t_it, t_syrk, t_gemm = statistics.median(it_times), statistics.median(syrk), statistics.median(gemm)
            ratio = t_it / t_syrk
            rows.append((n, m, ratio))
            projection = counter.label(n_blocks)
            counts = step_counts(n_blocks) if n_blocks <= 200 else None
            counts_text = "n/a" if counts is None else " / ".join(str(c) for c in counts)
            print(f"| {n:,} | {m} | {n_blocks} x {rows_per_block:,} | {projection} "
                  f"| {len(it_times)} | {t_it:.3f} | {t_syrk:.4f} | {ratio:.1f} | {t_gemm:.4f} | {t_it / t_gemm:.1f} "
                  f"| {'yes' if ratio <= TARGET_RATIO else 'no'} | {counts_text} | {chosen} |", flush=True)
        del X, y, nu, mu, kernel
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    met = sum(r <= TARGET_RATIO for _, _, r in rows)
    print(f"\nTarget iteration / Knm.T@Knm <= {TARGET_RATIO:g} met in {met} of {len(rows)} configurations.")
    print(f"Peak RSS (resource.getrusage, ru_maxrss): {peak_kb / 1024:.0f} MiB. "
          f"Total wall time: {time.perf_counter() - t_start:.0f} s.", flush=True)
    print(load_line(), flush=True)
    del limiter
    return 0


if __name__ == "__main__":
    sys.exit(main())
