"""What one minibatch step of SEP, EP, ADF and SVI costs at m = 200, minibatch 200, on airline-like data: the NumPy
fast path against the array-API reference path (``agpc.backend.reference_paths``), in one run.

Protocol, options and commands: benchmarks/README.md, section "step_cost.py".
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _runner import PROJECT_ROOT, begin, end, header, import_baseline, options, parse, parse_list, row

METHODS = ("sep", "ep", "adf", "svi")
PATHS = ("fast", "reference")
MARKER = "time_thread_time"  # the C function callgrind dumps before: agpc never calls time.thread_time


def parse_args(argv=None):
    p = options(__doc__, "m = 20, minibatch 30, n = 600, 2 + 6 steps")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of sep, ep, adf, svi")
    p.add_argument("--m", type=int, default=None, help="inducing points (default 200)")
    p.add_argument("--batch", type=int, default=None, help="minibatch rows (default 200)")
    p.add_argument("--n", type=int, default=None, help="training rows (default 20,000)")
    p.add_argument("--steps", type=int, default=None, help="steps timed per method and path (default 200)")
    p.add_argument("--warmup", type=int, default=None, help="steps before the timed ones (default 10)")
    p.add_argument("--callgrind", action="store_true", help="instructions a step under valgrind's callgrind")
    p.add_argument("--source", default=None, help="with --callgrind: the agpc checkout to measure (default: this one)")
    p.add_argument("--baseline", default=None, help="another checkout whose agpc is timed beside this one")
    p.add_argument("--counts", action="store_true", help="BLAS / LAPACK calls of the fast path a step")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the process valgrind runs
    args = parse(p, argv, full=dict(m=200, batch=200, n=20_000, steps=200, warmup=10),
                 quick=dict(m=20, batch=30, n=600, steps=6, warmup=2))
    args.methods = parse_list(args.methods, METHODS, "method")
    return args


def make_problem(args, package="agpc"):
    """(X, y, one trainer factory) for the step described in benchmarks/README.md, with the agpc of
    ``package`` ("agpc", or "agpc_baseline")."""
    import importlib

    from array_api_compat import numpy as xp

    GPClassifier = importlib.import_module(f"{package}.classifier").GPClassifier
    make_airline_like = importlib.import_module(f"{package}.datasets").make_airline_like
    training = importlib.import_module(f"{package}.inference.training")
    engines = importlib.import_module(f"{package}.inference.engines")
    with_default_priors = importlib.import_module(f"{package}.kernels").with_default_priors

    X, y = make_airline_like(args.n, random_state=0)
    y = y.astype(np.float64)
    rng = np.random.default_rng(0)
    Z = X[rng.choice(args.n, args.m, replace=False)]
    kernel = GPClassifier._default_kernel(X)
    kernel = with_default_priors(kernel, kernel).for_inputs(xp.asarray(X))

    def trainer(method):
        return training.Trainer(engines.make_engine(method, kernel, xp.asarray(Z.copy()), n_total=args.n,
                                                    minibatch=True, jitter=1e-6))

    return X, y, trainer


def path_scope(path):
    """The scope a path's steps run in: the reference path inside ``backend.reference_paths()``."""
    if path != "reference":
        return contextlib.nullcontext()
    from agpc import backend

    return backend.reference_paths()


def batches(args):
    """The minibatches' (lo, hi), in order: consecutive rows (the data are i.i.d.), wrapping around."""
    count = (args.n - args.batch) // args.batch + 1
    return lambda k: ((k % count) * args.batch, (k % count) * args.batch + args.batch)


def time_steps(args, X, y, trainer, baseline=None):
    """{(method, path): [seconds a step]}, the paths' steps interleaved one by one (``baseline``: a trainer
    factory of the baseline checkout, its steps a third path)."""
    batch = batches(args)
    paths = PATHS + (("baseline",) if baseline else ())
    out, reverted = {}, {}
    for method in args.methods:
        trainers = {path: (baseline if path == "baseline" else trainer)(method) for path in paths}
        for k in range(args.warmup + args.steps):
            lo, hi = batch(k)
            for path in paths:
                with path_scope(path):
                    start = time.perf_counter()
                    took, _, _ = trainers[path].step(X, y, lo, hi, stepping=True)
                    elapsed = time.perf_counter() - start
                if not took:  # the divergence guard reverted it (minibatch EP's factor can drift): counted, timed
                    reverted[(method, path)] = reverted.get((method, path), 0) + 1
                if k >= args.warmup:
                    out.setdefault((method, path), []).append(elapsed)
    return out, reverted


def count_calls(args, X, y, trainer):
    """{method: Counter of BLAS / LAPACK routines} of one fast-path step after the warm-up."""
    from agpc import backend

    batch = batch_of = batches(args)
    out = {}
    for method in args.methods:
        t = trainer(method)
        for k in range(args.warmup):
            t.step(X, y, *batch_of(k), stepping=True)
        with backend.counting_fast_calls() as calls:
            t.step(X, y, *batch(args.warmup), stepping=True)
        out[method] = calls
    return out


def child(args):
    """Under valgrind: a marker (a dump) before and after each method's and path's steps, malloc as a fit sets it
    (``allocator.fit_scope``), as for the timed steps; a ``--source`` checkout from before agpc.allocator leaves malloc
    as it is."""
    try:
        from agpc.allocator import fit_scope
    except ImportError:
        fit_scope = contextlib.nullcontext
    X, y, trainer = make_problem(args)
    with fit_scope():
        order = [run_marked(args, X, y, trainer, method, path) for method in args.methods for path in PATHS]
    print("ORDER " + " ".join(order), flush=True)


def run_marked(args, X, y, trainer, method, path):
    """The warm-up steps of one method and path, then its measured steps between two markers; its name."""
    batch = batches(args)
    t = trainer(method)
    with path_scope(path):
        for k in range(args.warmup):
            t.step(X, y, *batch(k), stepping=True)
        time.thread_time()
        for k in range(args.warmup, args.warmup + args.steps):
            t.step(X, y, *batch(k), stepping=True)
        time.thread_time()
    return f"{method}:{path}"


def run_callgrind(args, argv):
    """Run this script as ``--child`` under callgrind; {(method, path): instructions a step}."""
    source = Path(args.source).resolve() if args.source else PROJECT_ROOT
    with tempfile.TemporaryDirectory(prefix="agpc-callgrind-") as tmp:
        out_file = os.path.join(tmp, "cg.out")
        child_argv = [a for a in argv if a not in ("--callgrind",)]
        if "--source" in child_argv:
            i = child_argv.index("--source")
            del child_argv[i:i + 2]
        command = ["valgrind", "--tool=callgrind", f"--dump-before={MARKER}", f"--callgrind-out-file={out_file}",
                   sys.executable, str(Path(__file__).resolve()), "--child"] + child_argv
        env = dict(os.environ, PYTHONPATH=str(source), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"valgrind run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        order = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("ORDER"))
        dumps = sorted(glob.glob(out_file + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        totals = []
        for dump in dumps:
            text = Path(dump).read_text()
            totals.append(int(re.search(r"^(?:summary|totals): (\d+)", text, re.M).group(1)))
    # dumps: [before the first marker, then between markers]; each phase is warm-up, marker, steps, marker
    if len(totals) != 2 * len(order):
        raise RuntimeError(f"expected {2 * len(order)} callgrind dumps, found {len(totals)}")
    return {tuple(label.split(":")): totals[2 * i + 1] / args.steps for i, label in enumerate(order)}, source


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    started = begin("Cost of one minibatch step: NumPy fast path against the array-API reference path", args,
                    ["benchmarks/step_cost.py"] + argv)
    print(f"m = {args.m}, minibatch {args.batch}, n = {args.n:,} airline-like rows; {args.warmup} warm-up steps, "
          f"then {args.steps} measured per method and path\n")
    if args.callgrind:
        per_step, source = run_callgrind(args, argv)
        print(f"Instructions a step (callgrind Ir, OPENBLAS_NUM_THREADS=1), agpc from {source}:\n")
        header(["method", "fast path (M Ir)", "reference path (M Ir)", "reference / fast"])
        for method in args.methods:
            fast, ref = per_step.get((method, "fast")), per_step.get((method, "reference"))
            row(method, f"{fast / 1e6:.1f}", "-" if ref is None else f"{ref / 1e6:.1f}",
                f"{ref / fast:.2f}" if fast and ref else "-")
        return end(started)
    X, y, trainer = make_problem(args)
    baseline = None
    if args.baseline:
        import_baseline(args.baseline)
        baseline = make_problem(args, "agpc_baseline")[2]
        print(f"Baseline: the agpc of {Path(args.baseline).resolve()}, imported as agpc_baseline\n")
    if args.counts:
        calls = count_calls(args, X, y, trainer)
        print("BLAS / LAPACK calls of the fast path in one step:\n")
        header(["method", "calls", "by routine"])
        for method, counter in calls.items():
            row(method, sum(counter.values()), ", ".join(f"{k} {v}" for k, v in sorted(counter.items())))
        print()
    from agpc import allocator

    with allocator.fit_scope():  # (malloc as a fit sets it: the steps' m x m temporaries reuse freed memory)
        times, reverted = time_steps(args, X, y, trainer, baseline)
    paths = [p for p in PATHS + ("baseline",) if (args.methods[0], p) in times]
    print("ms a step (the paths' steps interleaved one by one; min / median; ratios of medians to the fast "
          "path's):\n")
    header(["method", *(f"{p} min / median" for p in paths), *(f"{p} / fast" for p in paths[1:])])
    for method in args.methods:
        fast = statistics.median(times[(method, "fast")])
        cells = [f"{1e3 * min(times[(method, p)]):.2f} / {1e3 * statistics.median(times[(method, p)]):.2f}"
                 for p in paths]
        cells += [f"{statistics.median(times[(method, p)]) / fast:.2f}" for p in paths[1:]]
        row(method, *cells)
    print()
    if reverted:
        print("Steps the divergence guard reverted (timed all the same): "
              + ", ".join(f"{method} {path} {count}" for (method, path), count in sorted(reverted.items())) + "\n")
    end(started)


if __name__ == "__main__":
    main()
