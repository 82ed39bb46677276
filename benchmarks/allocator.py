"""What keeping freed memory for the next iteration is worth (``agpc.allocator``): the default fit's first
iterations with glibc's malloc as agpc sets it for a fit, against malloc as it is (``AGPC_MALLOC=default``).

Each round runs both, alternated, each in a fresh process: it loads the set (split 0 of the protocol's 90/10 random
splits, standardised on the training part), fits once to warm up (the first fit sets malloc, where it does), then
times ``--fits`` fits of ``GPClassifier(random_state=0, plateau=None, max_iter=--iterations)`` on one BLAS thread
(``--blas-threads`` another count; the rounds alternate which way goes first),
with the minor page faults each took (``resource.getrusage``) and its test NLL. The table gives the medians over
rounds and fits. Linux with glibc only (elsewhere agpc leaves malloc as it is and both columns are the same).

    PYTHONPATH=.:benchmarks python benchmarks/allocator.py           # 6 sets, 3 rounds of 2 fits; ~6 min
    PYTHONPATH=.:benchmarks python benchmarks/allocator.py --quick   # smoke test (seconds)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from _runner import begin, end, header, options, parse, parse_list, row

SETS = ("banana", "waveform", "satellite", "clf-10000x20", "moons-5000", "airline-20000")
WAYS = ("as agpc sets it", "malloc as it is")
CHILD = r"""
import json, resource, sys, time
import numpy as np
from threadpoolctl import threadpool_limits
from _protocol import split_indices
from _runner import standardise
from stopping import load
from agpc import GPClassifier, allocator

name, data_dir = sys.argv[1], sys.argv[2]
iterations, fits, threads = (int(v) for v in sys.argv[3:6])
data = load(name, data_dir)
if data is None:
    print(json.dumps(None))
    sys.exit()
X, y = data
train, test = split_indices(X.shape[0], 0, 0.10)
X_train, X_test = standardise(X[train], X[test])


def fit():
    with threadpool_limits(threads):
        faults, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        model = GPClassifier(random_state=0, plateau=None, max_iter=iterations).fit(X_train, y[train])
        seconds = time.perf_counter() - started
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    log_p = model.predict_log_proba(X_test)
    nll = -float(np.mean(log_p[np.arange(len(test)), np.searchsorted(model.classes_, y[test])]))
    return {"seconds": seconds, "faults": faults, "nll": nll}


fit()
print(json.dumps({"fits": [fit() for _ in range(fits)], "tuned": allocator.tuned(), "rows": int(len(train))}))
"""


def parse_args(argv=None):
    p = options(__doc__, "clf-2000x10, 3 iterations, 1 round of 1 fit", data_dir=True)
    p.add_argument("--sets", default=None, help=f"comma-separated (default {','.join(SETS)})")
    p.add_argument("--iterations", type=int, default=None, help="max_iter of each fit (default 20)")
    p.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 3)")
    p.add_argument("--fits", type=int, default=None, help="timed fits a process (default 2)")
    return parse(p, argv, full={"sets": ",".join(SETS), "iterations": 20, "rounds": 3, "fits": 2},
                 quick={"sets": "clf-2000x10", "iterations": 3, "rounds": 1, "fits": 1})


def child(name, args, way):
    """One process's warm-up and timed fits (None: the set's data are absent)."""
    env = {k: v for k, v in os.environ.items() if k not in ("AGPC_MALLOC", "MALLOC_TRIM_THRESHOLD_",
                                                            "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    if way == WAYS[1]:
        env["AGPC_MALLOC"] = "default"
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(here), here, env.get("PYTHONPATH")) if p)
    argv = [name, args.data_dir, str(args.iterations), str(args.fits), str(args.blas_threads or 1)]
    out = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{name} ({way}): the child process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run = begin("Freed memory kept for the next iteration: default fits with and without agpc's malloc settings",
                args, ["benchmarks/allocator.py"] + argv)
    print(f"{args.iterations} iterations a fit (plateau=None), {args.blas_threads or 1} BLAS thread(s); medians of "
          f"{args.rounds} rounds (which way first alternated) x {args.fits} fits; page faults: minor faults during a "
          "fit.\n")
    header(["set (train rows)", "s: kept", "s: as it is", "kept / as it is", "page faults: kept", "as it is",
            "test NLL: kept", "as it is", "malloc set"], "lrrrrrrrl")
    for name in parse_list(args.sets):
        results = {way: [] for way in WAYS}
        tuned, rows = None, None
        for round_ in range(args.rounds):
            for way in (WAYS if round_ % 2 == 0 else WAYS[::-1]):
                out = child(name, args, way)
                if out is None:
                    break
                results[way] += out["fits"]
                rows = out["rows"]
                tuned = out["tuned"] if way == WAYS[0] else tuned
        if not results[WAYS[0]]:
            row(f"{name}: data not found, skipped", *[""] * 8)
            continue
        median = {way: {key: statistics.median(f[key] for f in results[way]) for key in ("seconds", "faults", "nll")}
                  for way in WAYS}
        kept, plain = median[WAYS[0]], median[WAYS[1]]
        row(f"{name} ({rows:,})", f"{kept['seconds']:.2f}", f"{plain['seconds']:.2f}",
            f"{kept['seconds'] / plain['seconds']:.2f}", f"{kept['faults']:,.0f}", f"{plain['faults']:,.0f}",
            f"{kept['nll']:.6f}", f"{plain['nll']:.6f}", "yes" if tuned else "no (not glibc, or opted out)")
    end(run)


if __name__ == "__main__":
    main()
