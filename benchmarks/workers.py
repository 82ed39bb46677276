"""How a batch pass's operations scale over workers: Python threads against processes, by operation and size.

Protocol, options and commands: benchmarks/README.md, section "workers.py".
"""

from __future__ import annotations

import contextlib
import contextvars
import multiprocessing
import queue as queues
import statistics
import sys
import threading
import time

import numpy as np
from _runner import begin, end, header, numbers, options, parse, parse_list, row

OPERATIONS = {
    "multiply": "np.multiply(A, v[None, :], out=B): an element-wise operation of a block, into a kept array",
    "column_dot": "agpc.backend.row_dot(A, B, axis=-2): a block's column dot products (the marginals' d_i, |A_i|^2)",
    "exp": "np.exp(A, out=B), A <= 0: a kernel block's exponential",
    "product": "np.matmul(M, A, out=B), M m x m: a block's general product (P = C^-1 A)",
    "triangular": "agpc.backend.triangular_matmul(T, F, overwrite=True), T m x m lower-triangular, F m x n, in place "
                  "(T and its inverse in turn, so that F stays bounded): a block's trmm (A = L_K^-1 K)",
    "vectors": "eight operations on one n-vector (twice abs, add, sqrt, multiply): a block's per-row site arithmetic "
               "(below 500 elements NumPy keeps the interpreter lock through an operation, so threads take turns)",
}
TIMEOUT = 300  # seconds a worker may take to start and report, past its measurement (else the run fails, no hang)


def parse_args(argv=None):
    p = options(__doc__, "arrays of 100 x 250, 0.05 s a measurement, one round")
    p.add_argument("--ops", default=",".join(OPERATIONS), help=f"comma list of {list(OPERATIONS)}")
    p.add_argument("--sizes", default=None, help="the blocks' rows n (arrays m x n; default 250,2250,20000)")
    p.add_argument("--m", type=int, default=100, help="the blocks' other dimension (inducing points; default 100)")
    p.add_argument("--workers", type=int, default=None, help="threads / processes at once (default: the usable "
                   "cores, at least 2)")
    p.add_argument("--seconds", type=float, default=None, help="each measurement's timed seconds (default 1)")
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
    A, B = rng.standard_normal((m, n)), rng.standard_normal((m, n))
    v = rng.standard_normal(n)
    if name == "multiply":
        return lambda: np.multiply(A, v[None, :], out=B)
    if name == "column_dot":
        return lambda: backend.row_dot(A, B, axis=-2)
    if name == "exp":
        np.negative(np.abs(A), out=A)
        return lambda: np.exp(A, out=B)
    if name == "product":
        M = rng.standard_normal((m, m))
        return lambda: np.matmul(M, A, out=B)
    if name == "triangular":
        T = np.tril(rng.standard_normal((m, m))) / m + np.eye(m)
        pair, F, turn = (T, np.linalg.inv(T)), np.asfortranarray(A), [0]

        def triangular():  # (T then T^-1: F returns to itself up to round-off, and never overflows)
            turn[0] ^= 1
            return backend.triangular_matmul(pair[turn[0]], F, overwrite=True)

        return triangular
    return lambda: [np.sqrt(np.abs(v) + 1.0) * v for _ in range(2)]


@contextlib.contextmanager
def as_a_pass():
    """One BLAS thread and BLAS calls releasing the interpreter lock, as agpc's block passes run (``map_blocks``
    enters both once, in the caller, and runs each block in a copy of its context)."""
    from threadpoolctl import threadpool_limits

    from agpc import backend

    with threadpool_limits(1, user_api="blas"), backend.blas_releasing_the_lock():
        yield


def count_until(run, stopped):
    """(operations, seconds) of ``run`` repeated until ``stopped()`` (asked after every operation: a cheap read)."""
    count, start = 0, time.perf_counter()
    while not stopped():
        run()
        count += 1
    return count, time.perf_counter() - start


def rate_alone(name, m, n, seconds):
    """Operations per second of one worker in this process, alone."""
    with as_a_pass():
        run = operation(name, m, n, 0)
        for _ in range(5):
            run()
        done = threading.Event()
        threading.Timer(seconds, done.set).start()
        count, elapsed = count_until(run, done.is_set)
    return count / elapsed


def in_threads(name, m, n, seconds, workers):
    """Each worker's operations per second with ``workers`` Python threads at once, each in a copy of this context
    (as ``map_blocks`` runs them); all start together and stop together. A worker that fails fails the run with its
    error."""
    results, failures = [], []
    ready, done = threading.Barrier(workers + 1, timeout=TIMEOUT), threading.Event()

    def one(seed):
        try:
            run = operation(name, m, n, seed)
            for _ in range(5):
                run()
            ready.wait()
            count, elapsed = count_until(run, done.is_set)
            results.append(count / elapsed)
        except BaseException as error:  # (the barrier is broken for the others and the caller)
            failures.append(error)
            ready.abort()

    with as_a_pass():
        pool = [threading.Thread(target=contextvars.copy_context().run, args=(one, k), daemon=True)
                for k in range(workers)]
        for t in pool:
            t.start()
        started = False
        try:
            ready.wait()
            started = True
            time.sleep(seconds)
        except threading.BrokenBarrierError:
            pass  # (a worker failed or hung before the start: reported below)
        finally:
            done.set()
            # Frees any worker still waiting at the start, only when the start did not happen: after it, a worker
            # released by the barrier but not yet scheduled (a loaded machine, 0.05 s measurements) would find it
            # broken and fail a run that had started (tests/test_benchmarks_quick.py runs every script at once).
            if not started:
                ready.abort()
            for t in pool:
                t.join(TIMEOUT)
    if failures or len(results) != workers:
        error = failures[0] if failures else None
        raise RuntimeError(f"{name}: {len(results)} of {workers} threads reported") from error
    return results


def process_worker(name, m, n, seed, go, stop, out):
    """A spawned worker: warm up, say so, wait for the start, count until the shared flag ``stop`` is set (read
    without a lock), report its rate; an error is reported instead."""
    try:
        with as_a_pass():
            run = operation(name, m, n, seed)
            for _ in range(5):
                run()
            out.put(("ready", seed, None))
            if not go.wait(TIMEOUT):
                raise TimeoutError("no start")
            count, elapsed = count_until(run, lambda: stop.value)
        out.put(("rate", seed, count / elapsed))
    except BaseException as error:
        out.put(("error", seed, repr(error)))


def _collect(out, pool, kind, expected, deadline):
    """``expected`` messages of ``kind`` from the workers, failing at once on a worker's error or exit, or at
    ``deadline``; {seed: value}."""
    got = {}
    while len(got) < expected:
        try:
            what, seed, value = out.get(timeout=1.0)
        except queues.Empty:
            dead = [p.exitcode for p in pool if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"worker processes: {len(got)} of {expected} {kind} messages; exit codes "
                                   f"{[p.exitcode for p in pool]}") from None
            continue
        if what == "error":
            raise RuntimeError(f"a worker process failed: {value}")
        if what == kind:
            got[seed] = value
    return got


def in_processes(name, m, n, seconds, workers):
    """Each worker's operations per second with ``workers`` spawned processes at once (nothing of this process's
    threads or state), started together once all are ready and stopped together."""
    context = multiprocessing.get_context("spawn")
    go, stop, out = context.Event(), context.RawValue("b", 0), context.Queue()
    pool = [context.Process(target=process_worker, args=(name, m, n, k, go, stop, out), daemon=True)
            for k in range(workers)]
    for p in pool:
        p.start()
    try:
        _collect(out, pool, "ready", workers, time.monotonic() + TIMEOUT)
        go.set()
        time.sleep(seconds)
        stop.value = 1
        rates = _collect(out, pool, "rate", workers, time.monotonic() + TIMEOUT)
    finally:
        stop.value = 1
        go.set()
        for p in pool:
            p.join(TIMEOUT)
            if p.is_alive():
                p.terminate()
    return list(rates.values())


def measure(name, m, n, args, busy):
    """(alone rate, threads' speeds, processes' speeds) over the rounds; ``busy`` collects the cores other
    processes kept busy during each alone run (``agpc.threads.busy_cores_elsewhere``)."""
    from agpc import threads

    def alone_here():
        threads.busy_cores_elsewhere()  # (resets the meter: what follows is this run's)
        rate = rate_alone(name, m, n, args.seconds)
        busy.append(threads.busy_cores_elsewhere())
        return rate

    alone, in_process_alone, threaded, spawned = [], [], [], []
    for _ in range(args.rounds):
        alone.append(alone_here())
        threaded += in_threads(name, m, n, args.seconds, args.workers)
        spawned += in_processes(name, m, n, args.seconds, args.workers)
        in_process_alone += in_processes(name, m, n, args.seconds, 1)
        alone.append(alone_here())
    base, process_base = statistics.median(alone), statistics.median(in_process_alone)
    return base, statistics.median(threaded) / base, process_base, statistics.median(spawned) / process_base


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run = begin("Scaling over workers: Python threads against processes", args, ["benchmarks/workers.py"] + argv)
    print(f"{args.workers} workers at once, arrays {args.m} x n, {args.seconds:g} s a measurement, "
          f"{args.rounds} round{'s' if args.rounds > 1 else ''}; one BLAS thread a worker whatever --blas-threads "
          "says. A worker's speed: its operations per second while every worker runs, over one worker's alone. "
          "Threads: against this process alone (its median over the rounds, before and after the threads); "
          "processes: against one spawned process alone (its median over the rounds). 1 is perfect scaling; below "
          "1 / workers the workers together do less than one alone. Every worker starts after a common barrier "
          "and stops when told; the two alone columns differ by up to a quarter from run to run, the noise of "
          "comparing them.\n")
    for name in args.ops:
        print(f"- {name}: {OPERATIONS[name]}")
    print()
    busy = []
    header(["operation", "n", "alone (this process): ops / s", "threads: speed a worker",
            "alone (a process): ops / s", "processes: speed a worker"])
    for name in args.ops:
        for n in args.sizes:
            base, threaded, process_base, spawned = measure(name, args.m, n, args, busy)
            row(name, f"{n:,}", f"{base:,.0f}", f"{threaded:.2f}", f"{process_base:,.0f}", f"{spawned:.2f}")
    print(f"\nCores other processes kept busy during the in-process alone runs (the meter sees no other window): at "
          f"most {max(busy):.2f}, median {statistics.median(busy):.2f} (`agpc.threads.busy_cores_elsewhere`). Over "
          "runs of a second or more, a value above about 0.1 means another job shared the machine then; over the "
          "short runs of --quick the meter itself reads that high.")
    end(run)


if __name__ == "__main__":
    main()
