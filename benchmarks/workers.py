"""How a batch pass's operations scale over workers: Python threads against processes, by operation and size.

Protocol, options and commands: benchmarks/README.md, section "workers.py".
"""

from __future__ import annotations

import contextvars
import multiprocessing
import statistics
import threading
import time

import numpy as np
from _runner import begin, end, header, numbers, options, parse, parse_list, row

OPERATIONS = {
    "multiply": "np.multiply(A, v[None, :], out=B): an element-wise operation of a block, in place",
    "column_dot": "agpc.backend.row_dot(A, B, axis=-2): a block's column dot products (the marginals' d_i, |A_i|^2)",
    "exp": "np.exp(A, out=B): a kernel block's exponential",
    "product": "np.matmul(M, A, out=B), M m x m: a block's general product (P = C^-1 A)",
    "triangular": "agpc.backend.triangular_matmul(T, A, overwrite=True), T m x m: a block's trmm (A = L_K^-1 K)",
    "vectors": "eight operations on one n-vector (twice abs, add, sqrt, multiply): a block's per-row site arithmetic",
}


def parse_args(argv=None):
    p = options(__doc__, "arrays of 100 x 250, 0.05 s a measurement, one round")
    p.add_argument("--ops", default=",".join(OPERATIONS), help=f"comma list of {list(OPERATIONS)}")
    p.add_argument("--sizes", default=None, help="the blocks' rows n (arrays m x n; default 250,2250,20000)")
    p.add_argument("--m", type=int, default=100, help="the blocks' other dimension (inducing points; default 100)")
    p.add_argument("--workers", type=int, default=None, help="threads / processes at once (default: the usable "
                   "cores, at least 2)")
    p.add_argument("--seconds", type=float, default=None, help="each worker's timed seconds a measurement (default 1)")
    p.add_argument("--rounds", type=int, default=None, help="rounds, each alone / threads / processes / alone "
                   "(default 2)")
    args = parse(p, argv, full=dict(sizes="250,2250,20000", seconds=1.0, rounds=2),
                 quick=dict(sizes="250", seconds=0.05, rounds=1))
    args.ops = parse_list(args.ops, OPERATIONS, "operation")
    args.sizes = numbers(args.sizes)
    if args.workers is None:
        from agpc import threads

        args.workers = max(2, threads.available_cores())
    return args


def operation(name, m, n, seed):
    """A function that runs operation ``name`` once on its own m x n arrays."""
    from agpc import backend

    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((m, n)), np.empty((m, n))
    v = rng.standard_normal(n)
    if name == "multiply":
        return lambda: np.multiply(A, v[None, :], out=B)
    if name == "column_dot":
        return lambda: backend.row_dot(A, B, axis=-2)
    if name == "exp":
        A *= -1.0
        return lambda: np.exp(A, out=B)
    if name == "product":
        M = rng.standard_normal((m, m))
        return lambda: np.matmul(M, A, out=B)
    if name == "triangular":
        T = np.tril(rng.standard_normal((m, m))) / m + np.eye(m)
        F = np.asfortranarray(A)
        return lambda: backend.triangular_matmul(T, F, overwrite=True)
    return lambda: [np.sqrt(np.abs(v) + 1.0) * v for _ in range(2)]


def rate(name, m, n, seconds, seed=0, barrier=None, queue=None):
    """Operations per second of one worker on one BLAS thread, its BLAS calls releasing the interpreter lock (as
    agpc's block passes run them: ``blocks.map_blocks``); into ``queue`` when given (a process)."""
    from threadpoolctl import threadpool_limits

    from agpc import backend

    with threadpool_limits(1, user_api="blas"), backend.blas_releasing_the_lock():
        run = operation(name, m, n, seed)
        for _ in range(5):
            run()
        if barrier is not None:
            barrier.wait()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(5):
                run()
            count += 5
        result = count / (time.perf_counter() - start)
    if queue is not None:
        queue.put(result)
    return result


def in_threads(name, m, n, seconds, workers):
    """Each worker's rate with ``workers`` Python threads running at once, each in a copy of this context."""
    barrier, results = threading.Barrier(workers), []

    def one(seed):
        results.append(rate(name, m, n, seconds, seed, barrier))

    pool = [threading.Thread(target=contextvars.copy_context().run, args=(one, k)) for k in range(workers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


def in_processes(name, m, n, seconds, workers):
    """Each worker's rate with ``workers`` processes running at once (spawned: nothing of this process's threads)."""
    context = multiprocessing.get_context("spawn")
    barrier, queue = context.Barrier(workers), context.Queue()
    pool = [context.Process(target=rate, args=(name, m, n, seconds, k, barrier, queue)) for k in range(workers)]
    for p in pool:
        p.start()
    results = [queue.get() for _ in pool]
    for p in pool:
        p.join()
    return results


def main(argv=None):
    import sys

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run = begin("Scaling over workers: Python threads against processes", args, ["benchmarks/workers.py"] + argv)
    print(f"{args.workers} workers at once, arrays {args.m} x n, {args.seconds:g} s a measurement, "
          f"{args.rounds} round{'s' if args.rounds > 1 else ''} (alone, threads, processes, alone); one BLAS thread "
          "a worker. Speed: a worker's operations per second beside the others over one worker's alone (the median "
          "of the rounds' alone runs); 1 is perfect scaling, below 1 / workers the workers together do less than "
          "one alone.\n")
    for name in args.ops:
        print(f"- {name}: {OPERATIONS[name]}")
    print()
    header(["operation", "n", "alone: ops / s", "threads: speed a worker", "processes: speed a worker"])
    for name in args.ops:
        for n in args.sizes:
            alone, threads_, processes = [], [], []
            for _ in range(args.rounds):
                alone.append(rate(name, args.m, n, args.seconds))
                threads_ += in_threads(name, args.m, n, args.seconds, args.workers)
                processes += in_processes(name, args.m, n, args.seconds, args.workers)
                alone.append(rate(name, args.m, n, args.seconds))
            base = statistics.median(alone)
            row(name, f"{n:,}", f"{base:,.0f}", f"{statistics.median(threads_) / base:.2f}",
                f"{statistics.median(processes) / base:.2f}")
    end(run)


if __name__ == "__main__":
    main()
