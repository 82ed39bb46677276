"""Peak memory of training on data read from disk, at n = 1e5, 1e6, 1e7 rows (synthetic airline-like data).

Protocol, options and commands: benchmarks/README.md, section "memory.py".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from _runner import PROJECT_ROOT, begin, end, header, numbers, options, parse, row

MB = 1024.0 * 1024.0


def parse_args(argv=None):
    p = options(__doc__, "n = 1e4, 1e5, max_time 1 s")
    p.add_argument("--ns", default=None, help="comma-separated n (default 1e5,1e6,1e7)")
    p.add_argument("--methods", default="sep,ep")
    p.add_argument("--max-time", type=float, default=None, help="max_time of each fit (default 60; quick: 1)")
    p.add_argument("--dir", default=None, help="parent folder for the data (default: a new folder under /tmp)")
    p.add_argument("--no-tracemalloc", action="store_true", help="children do not run tracemalloc")
    p.add_argument("--child", nargs=3, metavar=("METHOD", "FOLDER", "MAX_TIME"), help=argparse.SUPPRESS)
    p.add_argument("--child-tracemalloc", action="store_true", help=argparse.SUPPRESS)
    args = parse(p, argv, full=dict(ns="1e5,1e6,1e7", max_time=60.0), quick=dict(ns="1e4,1e5", max_time=1.0))
    args.ns, args.methods = numbers(args.ns), [m for m in args.methods.split(",") if m]
    return args


# -- the child -------------------------------------------------------------------------------------

def _status_kb():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


class _AnonPeak(threading.Thread):
    def __init__(self, interval=0.002):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_kb = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak_kb = max(self.peak_kb, _status_kb().get("RssAnon", 0))
            time.sleep(self.interval)


def child(method, folder, max_time, use_tracemalloc, blas_threads=None):
    import numpy as np

    if blas_threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(blas_threads, user_api="blas")

    import agpc  # noqa: F401  (the baseline pays for the imports too)
    from agpc import GPClassifier

    X = np.load(os.path.join(folder, "X.npy"), mmap_mode="r")
    y = np.load(os.path.join(folder, "y.npy"), mmap_mode="r")
    before = _status_kb()
    poller = _AnonPeak()
    poller.start()
    result = {"method": method, "n": int(X.shape[0])}
    if use_tracemalloc:
        import tracemalloc

        tracemalloc.start()
    if method != "baseline":
        t0 = time.perf_counter()
        clf = GPClassifier(method=method, n_inducing=200, batch_size=200, max_iter=1, max_time=max_time,
                           random_state=0).fit(X, y)
        result["fit_seconds"] = time.perf_counter() - t0
        result["n_iter"] = int(getattr(clf, "n_iter_", 0))
        result["stopped_by_time"] = bool(getattr(clf, "stopped_by_time_", False))
        result["train_seconds"] = float(clf.history_["time"][-1]) if clf.history_.get("time") else None
    if use_tracemalloc:
        result["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    end = _status_kb()
    poller.stop.set()
    poller.join()
    result["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["peak_anon"] = max(poller.peak_kb, end.get("RssAnon", 0)) * 1024
    result["anon_end"] = end.get("RssAnon", 0) * 1024
    result["file_end"] = end.get("RssFile", 0) * 1024
    result["anon_before_fit"] = before.get("RssAnon", 0) * 1024
    print("RESULT " + json.dumps(result))


# -- the parent ------------------------------------------------------------------------------------

def run_child(method, folder, max_time, use_tracemalloc, blas_threads=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, folder, str(max_time)]
    if blas_threads is not None:
        cmd += ["--blas-threads", str(blas_threads)]
    if use_tracemalloc:
        cmd.append("--child-tracemalloc")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(f"child {method} {folder} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
        return None
    out = json.loads(lines[-1][len("RESULT "):])
    out["wall"] = wall
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        method, folder, max_time = args.child
        child(method, folder, float(max_time), args.child_tracemalloc, args.blas_threads)
        return
    started = begin("Peak memory of out-of-core training (memmaps) against n", args, argv, user_api="blas")
    from agpc.datasets import make_airline_like

    use_tm = not args.no_tracemalloc
    parent = args.dir or tempfile.gettempdir()
    root = tempfile.mkdtemp(prefix="agpc_memory_", dir=parent)
    print(f"Data folder: {root} (removed at the end). max_time {args.max_time:g} s, max_iter 1, m = 200, "
          f"minibatch 200; tracemalloc in the children: {'yes' if use_tm else 'no'}.\n", flush=True)
    results = {}
    try:
        for n in args.ns:
            folder = os.path.join(root, f"n{n}")
            t0 = time.perf_counter()
            make_airline_like(n, random_state=0, path=folder)
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
            print(f"n = {n:,}: wrote {size / MB:,.0f} MB in {time.perf_counter() - t0:.1f} s", flush=True)
            for method in ["baseline"] + args.methods:
                r = run_child(method, folder, args.max_time, use_tm, args.blas_threads)
                if r is None:
                    continue
                results[(method, n)] = r
                extra = ""
                if method != "baseline":
                    extra = (f", fit {r['fit_seconds']:.1f} s (training loop {r['train_seconds'] or 0:.1f} s, "
                             f"stopped by time: {r['stopped_by_time']})")
                print(f"  {method}: ru_maxrss {r['ru_maxrss'] / MB:.1f} MB, peak RssAnon {r['peak_anon'] / MB:.1f} MB, "
                      f"tracemalloc peak {r.get('tracemalloc_peak', 0) / MB:.1f} MB, RssFile at end "
                      f"{r['file_end'] / MB:.1f} MB, child wall {r['wall']:.1f} s{extra}", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print("\n### Peak memory above the baseline child (imports + open memmaps)\n")
    print("MB = 2^20 bytes. Growth columns: bytes per extra row from the previous n.\n")
    header(["method", "n", "ru_maxrss (MB)", "peak RssAnon (MB)", "tracemalloc peak (MB)", "RssFile at end (MB)",
            "ru_maxrss growth (B/row)", "RssAnon growth (B/row)", "tracemalloc growth (B/row)", "fit (s)"], "lrrrrrrrrr")
    base_rows = {n: results.get(("baseline", n)) for n in args.ns}
    for n in args.ns:
        b = base_rows[n]
        if b:
            row("baseline (absolute)", f"{n:,}", f"{b['ru_maxrss'] / MB:.1f}", f"{b['peak_anon'] / MB:.1f}",
                f"{b.get('tracemalloc_peak', 0) / MB:.1f}", f"{b['file_end'] / MB:.1f}", "", "", "", "")
    for method in args.methods:
        prev = None
        for n in args.ns:
            r, b = results.get((method, n)), base_rows[n]
            if r is None or b is None:
                continue
            v = {
                "rss": r["ru_maxrss"] - b["ru_maxrss"],
                "anon": r["peak_anon"] - b["peak_anon"],
                "tm": r.get("tracemalloc_peak", 0),
            }
            growth = ["", "", ""]
            if prev is not None:
                dn = n - prev[0]
                growth = [f"{(v[k] - prev[1][k]) / dn:.1f}" for k in ("rss", "anon", "tm")]
            row(method, f"{n:,}", f"{v['rss'] / MB:.1f}", f"{v['anon'] / MB:.1f}", f"{v['tm'] / MB:.1f}",
                f"{r['file_end'] / MB:.1f}", *growth, f"{r['fit_seconds']:.1f}")
            prev = (n, v)
    end(started)


if __name__ == "__main__":
    main()
