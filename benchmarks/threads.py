"""The BLAS thread rule (agpc.threads) against fixed thread counts, in one run.

Protocol, options and commands: benchmarks/README.md, section "threads.py".
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from _runner import begin, end, header, numbers, options, parse, patched, row


def parse_args(argv=None):
    p = options(__doc__, "m = 20, 1 round of 5 steps, one pass at n = 2000")
    p.add_argument("--m", type=int, default=None, help="inducing points (default 200)")
    p.add_argument("--batch", type=int, default=200, help="minibatch rows (default 200)")
    p.add_argument("--steps", type=int, default=None, help="SEP steps timed per round (default 100)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of SEP settings (default 5)")
    p.add_argument("--ns", default=None, help="batch EP pass sizes (default 100000,1000000)")
    p.add_argument("--pass-rounds", type=int, default=None, help="rounds of batch settings (default 3; 2 at n >= 10^6)")
    args = parse(p, argv, full=dict(m=200, steps=100, rounds=5, ns="100000,1000000", pass_rounds=3),
                 quick=dict(m=20, steps=5, rounds=1, ns="2000", pass_rounds=1))
    args.ns = numbers(args.ns)
    return args


def settings(threads):
    """(label, explicit count or None for the rule): 1 thread, every core, the rule."""
    cores = threads.available_cores()
    fixed = [1] if cores == 1 else [1, cores]
    return [(f"{k} thread{'s' if k > 1 else ''} (blas_threads={k})", k) for k in fixed] + [("nothing set (rule)", None)]


def current_counts(controller):
    return tuple(lib.num_threads for lib in controller.lib_controllers)


def sep_steps(args, threads, training, controller):
    from agpc import RBF, datasets
    from agpc.inference import engines

    n = max(20 * args.batch, 20000)
    X, y = datasets.make_airline_like(n, random_state=0)
    y = np.where(y > 0, 1.0, -1.0)
    rng = np.random.default_rng(0)
    Z = X[rng.choice(n, size=args.m, replace=False)].copy()
    kernel = RBF(lengthscales=[float(np.sqrt(X.shape[1]))] * X.shape[1], amplitude=1.0, noise=1e-3)
    trainer = training.Trainer(engines.make_engine("sep", kernel, Z, n_total=n, minibatch=True))
    n_batches = n // args.batch
    position = [0]
    seen = {}

    def run(label, explicit):
        scope = threads.blas_threads(args.batch, args.m, n_features=X.shape[1], threads=explicit) if explicit else None
        if scope is not None:
            scope.__enter__()
        try:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                lo = (position[0] % n_batches) * args.batch
                position[0] += 1
                trainer.step(X, y, lo, lo + args.batch, stepping=True)
            elapsed = (time.perf_counter() - t0) / args.steps * 1e3
        finally:
            if scope is not None:
                scope.__exit__(None, None, None)
        return elapsed

    # what the BLAS ran with inside each step: read by a wrapper of the step's evaluation (on the module,
    # where the step looks it up; put back at the end)
    current_label = [None]

    def recording(original):
        def evaluate_factor(*a, **k):
            seen.setdefault(current_label[0], set()).add(current_counts(controller))
            return original(*a, **k)

        return evaluate_factor

    with patched(sys.modules["agpc.inference.ep"], "evaluate_factor", recording):
        run("warm-up", 1)
        times = {}
        for _ in range(args.rounds):
            for label, explicit in settings(threads):
                current_label[0] = label
                times.setdefault(label, []).append(run(label, explicit))
    return times, seen


def batch_passes(args, threads, ep, controller, n):
    from agpc import RBF, datasets

    X, y = datasets.make_airline_like(n, random_state=1)
    y = np.where(y > 0, 1.0, -1.0)
    rng = np.random.default_rng(1)
    Z = X[rng.choice(n, size=args.m, replace=False)].copy()
    kernel = RBF(lengthscales=[float(np.sqrt(X.shape[1]))] * X.shape[1], amplitude=1.0, noise=1e-3)
    nu = rng.uniform(0.0, 0.5, size=n)
    mu = rng.normal(0.0, 0.3, size=n)
    rounds = args.pass_rounds if n < 10**6 else min(args.pass_rounds, 2)
    times, seen = {}, {}
    for _ in range(rounds):
        for label, explicit in settings(threads):
            with threads.blas_threads(n, args.m, n_features=X.shape[1], threads=explicit):
                seen.setdefault(label, set()).add(current_counts(controller))
                t0 = time.perf_counter()
                out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-6, want_grad=True)
                float(out["log_z"])
                times.setdefault(label, []).append(time.perf_counter() - t0)
            del out
    return times, seen


def scope_costs(threads):
    from threadpoolctl import ThreadpoolController, threadpool_limits

    def per_call(fn, calls):
        fn()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls * 1e6

    def limits():
        with threadpool_limits(limits=1, user_api="blas"):
            pass

    controller = ThreadpoolController().select(user_api="blas")

    def cached():
        with controller.limit(limits=1, user_api="blas"):
            pass

    def scope():
        with threads.blas_threads(200, 200):
            pass

    rows = [("threadpoolctl.threadpool_limits(1)", per_call(limits, 200)),
            ("cached ThreadpoolController.limit(1)", per_call(cached, 2000)),
            ("agpc.threads.blas_threads, outermost (checks the caller's setting)", per_call(scope, 2000))]
    with threads.blas_threads(10**6, 200):
        rows.append(("agpc.threads.blas_threads, nested in a fit's scope", per_call(scope, 2000)))
    return rows


def ms(values):
    return statistics.median(values)


def print_table(times, seen, unit, runs, digits):
    """One row a setting: median, every run, the BLAS thread counts seen, and the ratio to the best."""
    best = min(ms(v) for v in times.values())
    header(["setting", unit, runs, "BLAS threads (per library)", "/ best"])
    for label, values in times.items():
        row(label, f"{ms(values):.{digits}f}", ", ".join(f"{v:.{digits - 1}f}" for v in values),
            sorted(seen.get(label, [])), f"{ms(values) / best:.2f}")


def main(argv=None):
    args = parse_args(argv)
    from threadpoolctl import ThreadpoolController

    from agpc import threads
    from agpc.inference import ep, training

    started = begin("BLAS threads: the rule (agpc.threads) against fixed counts", args, argv)
    controller = ThreadpoolController().select(user_api="blas")
    print(f"Cores available to this process: {threads.available_cores()}; BLAS libraries at start "
          f"(threads): {[lib.num_threads for lib in controller.lib_controllers]}; caller set a count: "
          f"{threads.caller_set_blas_threads()}")
    busy_start = threads.busy_cores_elsewhere()

    print(f"\n### SEP minibatch step: m = {args.m}, minibatch {args.batch}, d = 8, "
          f"{args.rounds} rounds x {args.steps} steps per setting, interleaved\n")
    times, seen = sep_steps(args, threads, training, controller)
    print_table(times, seen, "ms / step (median of rounds)", "rounds (ms)", 2)
    print(f"\nCores busy elsewhere during the SEP rounds: {threads.busy_cores_elsewhere():.2f}")

    for n in args.ns:
        print(f"\n### Batch EP pass (ep.evaluate with the gradient, default blocks): n = {n:,}, m = {args.m}\n")
        times, seen = batch_passes(args, threads, ep, controller, n)
        print_table(times, seen, "s / pass (median)", "runs (s)", 3)
        print(f"\nCores busy elsewhere during these passes: {threads.busy_cores_elsewhere():.2f}")

    header(["scope", "us / call"], title="What a scope costs (us per enter + exit)")
    for label, us in scope_costs(threads):
        row(label, f"{us:.1f}")
    print(f"\nCores busy elsewhere: {busy_start:.2f} at the start (since import).")
    end(started)


if __name__ == "__main__":
    main()
