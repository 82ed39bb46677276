"""What a triangular inverse, the inverse of a Cholesky factor's product and a triangular solve with m right-hand
sides cost on the NumPy fast path (``agpc.backend``): LAPACK's trtri / potri / BLAS's trsm against the inverse by
halves (``backend.TRIANGULAR_INVERSE_BLOCK``), its lauum and its trmm, on 1 and 2 BLAS threads.

Each row: one order m and thread count, the medians of ``--repeats`` calls of each way, interleaved call by call
(the same matrices; a well-conditioned Cholesky factor; potrf of L L^T for scale). A star marks the way agpc takes:
by halves above twice the block and on one OpenBLAS thread (``backend.inverts_by_halves``), else the LAPACK routine;
likewise a solve with m right-hand sides (the carry's L_C^-1 R^T, ``posterior.moved_factor``) by that inverse and a
trmm, else by trsm. Commands:

    PYTHONPATH=. python benchmarks/triangular_inverse.py              # m = 100, 200, 500, 1000; ~20 s
    PYTHONPATH=. python benchmarks/triangular_inverse.py --quick      # smoke test (seconds)
"""

from __future__ import annotations

import functools
import statistics
import time

import numpy as np
from _runner import (add_blas_env_option, begin, blas_variables_set, end, header, options, parse, parse_list,
                     rerun_with_blas_unset, row)
from airline import blas_thread_counts

BASES = (32, 64, 128)  # blocks of the halving timed beside the default one


def parse_args(argv=None):
    p = options(__doc__, "m = 40 and 150, 3 repeats")
    p.add_argument("--orders", default=None, help="comma list of m (default 100,200,500,1000)")
    p.add_argument("--threads", default="1,2", help="comma list of BLAS thread counts (default 1,2)")
    p.add_argument("--repeats", type=int, default=None, help="calls of each way, interleaved (default 40)")
    add_blas_env_option(p)
    args = parse(p, argv, full=dict(orders="100,200,500,1000", repeats=40), quick=dict(orders="40,150", repeats=3))
    args.orders = parse_list(args.orders, convert=int)
    args.threads = parse_list(args.threads, convert=int)
    return args


def ways(backend, L, R):
    """{name: a call}: each operation by the LAPACK / BLAS routine and by halves, on the F-ordered lower L; potrf of
    L L^T for scale."""
    K = L @ L.T
    calls = {"potrf (of L L^T)": lambda: backend.cholesky_or_nan(K),
             "trtri": lambda: backend.lower_triangular_inverse(L, halves=False)}
    calls.update({f"halves, blocks <= {b}": functools.partial(backend.lower_triangular_inverse, L, halves=True, block=b)
                  for b in BASES})
    calls["potri"] = lambda: backend.cholesky_inverse(L, halves=False)
    calls["halves + lauum"] = lambda: backend.cholesky_inverse(L, halves=True)
    calls["trsm (m columns)"] = lambda: backend.solve_triangular(L, R)
    calls["halves + trmm"] = lambda: backend.triangular_matmul(backend.lower_triangular_inverse(L, halves=True), R)
    return calls


def time_ways(calls, repeats):
    """{name: median seconds}, the ways called one after another, ``repeats`` rounds after one warm-up round."""
    seconds = {name: [] for name in calls}
    for k in range(repeats + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if k:
                seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main(argv=None):
    import sys

    from threadpoolctl import threadpool_limits

    from agpc import backend

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run = begin("Triangular inverses on the NumPy fast path: LAPACK's routines against the inverse by halves", args,
                ["benchmarks/triangular_inverse.py"] + argv)
    set_here = blas_variables_set()
    names = list(ways(backend, np.eye(2, order="F"), np.eye(2, order="F")))
    print(f"Default block {backend.TRIANGULAR_INVERSE_BLOCK}; ms, median of {args.repeats} interleaved calls; "
          "* marks the way agpc takes.\n")
    header(["BLAS threads", "m", *names], "rr" + "r" * len(names))
    rng = np.random.default_rng(0)
    for threads in args.threads:
        with threadpool_limits(threads, user_api="blas"):
            counts = blas_thread_counts()
            for m in args.orders:
                A = rng.normal(size=(m, m))
                L = np.asfortranarray(np.linalg.cholesky(A @ A.T / m + 0.1 * np.eye(m)))
                R = np.asfortranarray(rng.normal(size=(m, m)))
                median = time_ways(ways(backend, L, R), args.repeats)
                taken = backend.inverts_by_halves(L)
                marks = {"trtri": not taken, f"halves, blocks <= {backend.TRIANGULAR_INVERSE_BLOCK}": taken,
                         "potri": not taken, "halves + lauum": taken, "trsm (m columns)": not taken,
                         "halves + trmm": taken}
                row(f"{threads} (threadpoolctl: {counts})", m,
                    *(f"{1e3 * median[n]:.3f}{' *' if marks.get(n) else ''}" for n in names))
    if set_here and args.blas_env == "both":
        rerun_with_blas_unset(__file__, argv)
    end(run)


if __name__ == "__main__":
    main()
