"""Seconds for one full EP iteration against one Knm^T Knm product of the same shape.

Protocol, options and commands: benchmarks/README.md, section "ep_iteration.py".
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _runner import begin, end, header, numbers, options, parse, row

TARGET_RATIO = 12.0


def parse_args(argv=None):
    p = options(__doc__, "n = 2000, 20000; m = 20, 100; one BLAS thread")
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
    p.add_argument("--no-block-threads", action="store_true",
                   help="run a pass's row blocks on one Python thread, the BLAS threads of the rule going to BLAS "
                        "(default: as many Python threads as the rule's BLAS threads, each BLAS call on one)")
    args = parse(p, argv, full=dict(ns="10000,100000,1000000", ms="50,200,500"),
                 quick=dict(ns="2000,20000", ms="20,100", blas_threads=1))
    args.ns, args.ms = numbers(args.ns), numbers(args.ms)
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


def time_iteration(ep, kernel, Z, X, y, nu, mu, block_rows):
    """Seconds of one ``ep.evaluate`` as the training loop calls it on a step of the hyper-parameters."""
    t0 = time.perf_counter()
    out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-6, want_grad=True, block_rows=block_rows, damping=0.5,
                      checked=False, nonnegative_sites=True)
    float(out["log_z"])  # synchronise (a no-op on NumPy)
    seconds = time.perf_counter() - t0
    if not np.isfinite(float(out["log_z"])):
        raise FloatingPointError("log Z_q is not finite on the benchmark data")
    return seconds


def time_products(blocks, min_seconds=0.02):
    """The sum over row blocks of the time of Kb.T @ Kb (syrk) and of Kb.T @ W (gemm), for the kernel blocks
    ``blocks`` (each Kb with its copy W).

    A product shorter than ``min_seconds`` is looped and the mean taken, so that tiny shapes are not
    dominated by timer and call overhead.
    """
    syrk = gemm = 0.0

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

    for Kb, W in blocks:
        syrk += timed(lambda: Kb.T @ Kb)
        gemm += timed(lambda: Kb.T @ W)
    return syrk, gemm


def kernel_blocks(kernel, Z, X, block_rows, max_bytes=1 << 30):
    """A function giving the reference's kernel blocks (K(X_b, Z) with a copy each): formed once and kept when
    they take at most ``max_bytes``, else formed again at each call (outside the timed products)."""
    n = X.shape[0]
    bounds = [(lo, min(n, lo + block_rows)) for lo in range(0, n, block_rows)]

    def formed():
        for lo, hi in bounds:
            K = np.asarray(kernel.K(X[lo:hi], Z))
            yield K, K.copy()

    if 2 * n * Z.shape[0] * 8 > max_bytes:
        return formed
    kept = list(formed())
    return lambda: kept


def step_counts(n_blocks):
    """Array operations, O(m^3) operations and host conversions of one ``ep.evaluate`` with its gradient over
    ``n_blocks`` wide row blocks, counted on the counting namespace of tests/array_counting.py (over
    array_api_strict, one thread) on a small problem with the same number of blocks: the counts depend on the
    number of blocks only, not on n or m (tests/test_step_budgets.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' counter
    try:
        import array_api_strict
        from array_counting import CountingNamespace
    except ImportError:
        return None
    from agpc.inference import ep

    rows, m, d = 100, 24, 3  # wide blocks (more than 4 rows per inducing point), as a batch pass's are
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
    out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-6, want_grad=True, block_rows=rows, damping=0.5,
                      checked=False, nonnegative_sites=True)
    float(out["log_z"])
    counts = xp.stop().folded(("_log_ndtr_generic",)).counts()
    return counts["op"], counts["m3"], counts["host"] + counts["data_dependent"]


def main(argv=None):
    args = parse_args(argv)
    import agpc
    from agpc import threads
    from agpc.inference import blocks, ep

    if args.no_block_threads:  # a pass on one Python thread, its threads to BLAS (the library before block threads)
        threads.pass_workers = lambda: 1

    started = begin("Time of one full EP iteration (agpc.inference.ep.evaluate, want_grad=True)", args, argv)
    d = args.dim
    blocks_text = (f"block_rows = min(n, {int(args.block_bytes):,} // (8 m))" if args.block_bytes
                   else "the library's default blocks")
    one_thread = ", a pass's blocks on one Python thread" if args.no_block_threads else ""
    print(f"d = {d}, float64, jitter 1e-6, {blocks_text}{one_thread}; up to {args.repeats} repeats (fewer when "
          f"{args.repeats} x the first iteration would exceed {args.max_config_seconds:.0f} s), each timing the "
          f"iteration and then the products: times are medians, 'iteration / Knm.T@Knm' the median of the repeats' "
          f"own ratios (interleaved, so that a load that comes and goes touches both sides of a ratio alike). "
          f"projection: 'kept' when the first visit keeps every block's A and K(Z, X) for the second "
          f"(blocks.CACHE_ELEMENTS), 'formed again' otherwise. syrk = Knm.T @ Knm (n m^2 flops), gemm = Knm.T @ W with "
          f"W a copy (2 n m^2 flops), both summed over the library's default row blocks. Target: iteration / syrk "
          f"<= {TARGET_RATIO:g}. ops / m^3 ops / host syncs: of one iteration as the training loop runs it, counted "
          f"on a small problem (m = 24) with the same number of wide blocks (they depend on nothing else).\n")
    header(["n", "m", "blocks x rows (threads)", "projection", "runs", "iteration s", "Knm.T@Knm s",
            "iteration / Knm.T@Knm", "Knm.T@W s", "iteration / gemm", f"target <= {TARGET_RATIO:g}",
            "ops / m^3 ops / host syncs", "BLAS threads"])
    rows = []
    for n in args.ns:
        rng = np.random.default_rng(args.seed)
        X, y = make_data(n, d, rng)
        kernel = agpc.RBF(lengthscales=[1.0] * d, amplitude=1.0, noise=1e-3).for_inputs(X)
        nu = rng.uniform(0.0, 0.5, size=n)
        mu = rng.normal(0.0, 0.3, size=n)
        for m in args.ms:
            if m > n:
                continue
            Z = X[rng.choice(n, m, replace=False)].copy()
            block_rows = int(min(n, args.block_bytes // (8 * m))) if args.block_bytes else None
            reference_rows = block_rows or blocks.default_block_rows(Z, n)
            products = kernel_blocks(kernel, Z, X, reference_rows)
            # the library's BLAS thread rule for a batch pass of this shape (agpc.threads), as fit applies it;
            # a --blas-threads limit set above is the caller's and is left alone by the rule
            with threads.blas_threads(n, m, n_features=d, block_rows=reference_rows):
                rows_per_block, workers = blocks.pass_layout(Z, n, block_rows)
                iterations, syrks, gemms = [], [], []
                while not iterations or len(iterations) < n_repeats(iterations[0], args):
                    iterations.append(time_iteration(ep, kernel, Z, X, y, nu, mu, block_rows))
                    syrk, gemm = time_products(products())
                    syrks.append(syrk)
                    gemms.append(gemm)
                from threadpoolctl import threadpool_info

                chosen = sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})
            t_it, t_syrk, t_gemm = (statistics.median(v) for v in (iterations, syrks, gemms))
            ratio = statistics.median(i / s for i, s in zip(iterations, syrks))
            ratio_gemm = statistics.median(i / g for i, g in zip(iterations, gemms))
            rows.append((n, m, ratio))
            n_blocks = -(-n // rows_per_block)
            projection = "kept" if blocks.projections_fit(n, Z) else "formed again"
            counts = step_counts(n_blocks) if n_blocks <= 200 else None
            counts_text = "n/a" if counts is None else " / ".join(str(c) for c in counts)
            row(f"{n:,}", m, f"{n_blocks} x {min(n, rows_per_block):,} ({workers})", projection, len(iterations),
                f"{t_it:.3f}", f"{t_syrk:.4f}", f"{ratio:.1f}", f"{t_gemm:.4f}", f"{ratio_gemm:.1f}",
                "yes" if ratio <= TARGET_RATIO else "no", counts_text, chosen)
            del products
        del X, y, nu, mu, kernel
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    met = sum(r <= TARGET_RATIO for _, _, r in rows)
    print(f"\nTarget iteration / Knm.T@Knm <= {TARGET_RATIO:g} met in {met} of {len(rows)} configurations.")
    print(f"Peak RSS (resource.getrusage, ru_maxrss): {peak_kb / 1024:.0f} MiB.")
    end(started)


if __name__ == "__main__":
    sys.exit(main())
