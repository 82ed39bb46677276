"""What every benchmark script shares: its common options (``--quick``, ``--blas-threads``, ``--data-dir``,
``--seeds``, ``--out``), the machine facts printed first (house rule), its Markdown tables, its results file, the
shared data of ``../shared/data`` and the hooks on the library that time a fit from inside.

A script: ``p = options(__doc__, "what --quick runs", ...)``, its own ``p.add_argument(...)``, then
``args = parse(p, argv, full={...}, quick={...})`` (an option left unset takes its ``--quick`` value or else its
full one), ``run = begin(title, args, argv)``, ``header(...)`` / ``row(...)`` for each table, and ``end(run)``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROJECT_ROOT = HERE.parent
DEFAULT_DATA_DIR = PROJECT_ROOT / ".." / "shared" / "data"
RESULTS_DIR = HERE / "results"


# -- options ---------------------------------------------------------------------------------------

def options(doc, quick, *, data_dir=False, seeds=None, out=None, blas_threads=None):
    """An ArgumentParser described by the first paragraph of ``doc``, with ``--quick`` (``quick``: what it runs)
    and ``--blas-threads``; ``data_dir``: ``--data-dir`` (default ../shared/data); ``seeds``: ``--seeds`` with that
    default; ``out``: ``--out``, the results file (default benchmarks/results/<out>[_quick].json)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"smoke test: {quick}")
    p.add_argument("--blas-threads", type=int, default=blas_threads,
                   help="limit BLAS/OpenMP threads with threadpoolctl (0 or unset: as configured)")
    if data_dir:
        p.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR), help="folder of the shared .npz files "
                       "(default ../shared/data)")
    if seeds is not None:
        p.add_argument("--seeds", default=seeds, help=f"comma-separated seeds (default {seeds})")
    if out is not None:
        p.add_argument("--out", default=None, help=f"results file (default benchmarks/results/{out}[_quick].json)")
        p.set_defaults(out_name=out)
    return p


def parse(p, argv=None, full=None, quick=None):
    """Parse ``argv``; each option named in ``quick`` or ``full`` and left unset (None) takes its ``--quick``
    value with ``--quick``, else its ``full`` value (a callable: of the parsed options); ``--seeds`` becomes a list of ints and ``--out`` a Path."""
    args = p.parse_args(argv)
    quick, full = (quick or {}) if args.quick else {}, full or {}
    for name in {**full, **quick}:
        if getattr(args, name, None) is None:
            value = quick[name] if name in quick else full[name]
            setattr(args, name, value(args) if callable(value) else value)
    if isinstance(getattr(args, "seeds", None), str):
        args.seeds = parse_list(args.seeds, convert=int)
    if hasattr(args, "out_name"):
        args.out = Path(args.out or RESULTS_DIR / f"{args.out_name}{'_quick' if args.quick else ''}.json")
    return args


def parse_list(text, allowed=None, kind="item", convert=str):
    """A comma list of ``convert``-ed values (strings lower-cased), each among ``allowed`` when given."""
    if not isinstance(text, str):
        return list(text)
    values = [convert(s.strip().lower() if convert is str else s.strip()) for s in text.split(",") if s.strip()]
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise SystemExit(f"unknown {kind}(s) {bad}: choose from {list(allowed)}")
    return values


def numbers(text):
    """A comma list of numbers written as integers or floats ("1e6"): ints."""
    return [int(float(v)) for v in parse_list(text)]


# -- start and end ---------------------------------------------------------------------------------

@dataclass
class Run:
    t0: float
    limiter: object


def begin(title, args=None, argv=None, imports=(), user_api=None):
    """Load the numerical libraries (and ``imports``) so that threadpoolctl sees every BLAS pool, limit BLAS and
    OpenMP (``user_api="blas"``: BLAS alone) to ``args.blas_threads``, print the machine facts under ``title``: the
    run, for ``end``."""
    for module in ("scipy.linalg", "sklearn.linear_model", "agpc", *imports):
        importlib.import_module(module)
    threads = getattr(args, "blas_threads", None)
    limiter = None
    if threads:
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(limits=threads, user_api=user_api)
    print(f"## {title}\n")
    print(f"Command: `{' '.join(['python'] + (list(argv) if argv is not None else sys.argv))}`\n")
    for line in machine_lines():
        print(line)
    print(flush=True)
    return Run(time.perf_counter(), limiter)


def end(run):
    """The run's wall time and the load average now."""
    print(f"\nTotal wall time: {time.perf_counter() - run.t0:.0f} s.")
    print(load_line(), flush=True)


def machine_lines():
    """Markdown bullet lines describing the machine and the BLAS in effect now."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "n/a"
    lines = [f"- CPUs: {os.cpu_count()} (os.cpu_count); usable by this process: {affinity}",
             f"- CPU model: {_cpu_model()}", f"- Python {platform.python_version()}, NumPy {np.__version__}",
             f"- OPENBLAS_CORETYPE = {os.environ.get('OPENBLAS_CORETYPE', '(not set)')!s}"]
    from threadpoolctl import threadpool_info

    for info in threadpool_info():
        name = Path(info.get("filepath", "?")).name
        if info.get("user_api") == "blas":
            lines.append(f"- BLAS: {info.get('internal_api')} {info.get('version')}, kernel/architecture "
                         f"{info.get('architecture', '?')}, threads {info.get('num_threads')}, threading layer "
                         f"{info.get('threading_layer', '?')} ({name})")
        elif info.get("user_api") == "openmp":
            lines.append(f"- OpenMP: {info.get('internal_api')}, threads {info.get('num_threads')} ({name})")
    lines.append(f"- agpc source: {source_fingerprint()}")
    load = os.getloadavg()
    lines.append(f"- load average at start (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    return lines


def _cpu_model():
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load_line():
    """The load average now (other processes perturb timings on a small machine)."""
    load = os.getloadavg()
    return f"Load average at end (1/5/15 min): {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}."


def source_fingerprint():
    """sha256 (12 hex digits) of the agpc/*.py files and their newest modification time: the library measured."""
    files = sorted((PROJECT_ROOT / "agpc").rglob("*.py"))
    if not files:
        return "not found"
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(PROJECT_ROOT)).encode())
        digest.update(f.read_bytes())
    when = datetime.datetime.fromtimestamp(max(f.stat().st_mtime for f in files)).strftime("%Y-%m-%d %H:%M:%S")
    return f"sha256 {digest.hexdigest()[:12]} over {len(files)} files, newest modified {when}"


def thread_variables():
    """The machine-header lines on the thread-count variables set in the environment (a user sets none)."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
    found = [f"{k}={os.environ[k]}" for k in names if k in os.environ]
    lines = [f"- thread-count variables: {', '.join(found) if found else 'none set (as a user runs it)'}"]
    if found:
        lines.append("- WARNING: a thread count is set in the environment: the agpc rows are not 'nothing set'.")
    return lines


# -- tables and results ----------------------------------------------------------------------------

BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # set on the project's machines, not on a user's


def add_blas_env_option(p):
    """``--blas-env``: both (default) reruns the script with ``BLAS_VARIABLES`` unset where either is set
    (``rerun_with_blas_unset``), as-is runs it once."""
    p.add_argument("--blas-env", choices=["both", "as-is"], default="both",
                   help="both (default): also run with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset where either is set")


def blas_variables_set():
    """The ``BLAS_VARIABLES`` set in this process's environment, printed on one line."""
    set_here = [name for name in BLAS_VARIABLES if os.environ.get(name)]
    said = ", ".join(f"{k}={os.environ[k]}" for k in set_here) if set_here else (
        "neither OPENBLAS_CORETYPE nor OPENBLAS_L2_SIZE is set: this run is also the run with both unset")
    print(f"BLAS environment: {said}\n")
    return set_here


def rerun_with_blas_unset(script, argv):
    """``script`` again, in a child process with ``BLAS_VARIABLES`` unset (its output printed here)."""
    env = {k: v for k, v in os.environ.items() if k not in BLAS_VARIABLES}
    print("\n## The same with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (a user's machine)\n", flush=True)
    child = subprocess.run([sys.executable, script, *argv, "--blas-env", "as-is"], env=env, text=True,
                           capture_output=True)
    print(child.stdout + child.stderr[-2000:], flush=True)


def import_baseline(directory):
    """DIR/agpc imported as the package ``agpc_baseline`` (a copy in a temporary folder on sys.path), to time beside
    this checkout's agpc in one process (``--baseline`` of step_cost.py and defaults.py). The copy is removed when
    the process exits (each run left its 1.7 MB folder in /tmp)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="agpc-baseline-")
    atexit.register(shutil.rmtree, folder, True)
    shutil.copytree(Path(directory) / "agpc", Path(folder) / "agpc_baseline")
    sys.path.insert(0, folder)
    return importlib.import_module("agpc_baseline")


def header(columns, align=None, title=None):
    """A Markdown table's head (``align``: one "l" or "r" a column, default all left), under ``### title``."""
    if title:
        print(f"\n### {title}\n")
    align = align or "l" * len(columns)
    print("| " + " | ".join(columns) + " |")
    print("|" + "".join("---:|" if a == "r" else "---|" for a in align), flush=True)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def show(value, spec):
    """``value`` formatted by ``spec``, or "–" when there is none (None or NaN)."""
    return "–" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def write_json(path, payload):
    """``payload`` (with the load average at the end) as JSON at ``path``; its path printed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**payload, "loadavg_end": os.getloadavg()}, indent=1, default=str))
    print(f"\nResults: {path}")


# -- data ------------------------------------------------------------------------------------------

def load_npz(data_dir, name):
    """(X float64, y, class names) of ``data_dir/name.npz`` (the shared data's format)."""
    with np.load(Path(data_dir) / f"{name}.npz", allow_pickle=False) as f:
        return np.asarray(f["X"], dtype=np.float64), np.asarray(f["y"]), np.asarray(f["classes"])


def load_airline(path, n_classes=2, minutes=0.0):
    """(X float64, class indices, feature names) of airline2008.npz: 2 classes, arr_delay > 0 (1 = delayed);
    3 classes, 0 early (< -minutes), 1 on time, 2 late (> minutes). Exits with a note when the file is absent."""
    if not Path(path).exists():
        print(f"Data file {path} not found: this benchmark needs ../shared/data/airline2008.npz; skipping.")
        sys.exit(0)
    with np.load(path, allow_pickle=False) as f:
        X, delay = np.asarray(f["X"], dtype=np.float64), np.asarray(f["arr_delay"])
        names = [str(v) for v in f["feature_names"]] if "feature_names" in f.files else None
    if n_classes == 2:
        return X, (delay > 0).astype(np.int8), names
    return X, np.where(delay < -minutes, 0, np.where(delay > minutes, 2, 1)).astype(np.int8), names


def standardise(X_train, X_test):
    """Both parts scaled by the training part's mean and standard deviation (constant columns: 1)."""
    mean, std = X_train.mean(axis=0), X_train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (X_train - mean) / std, (X_test - mean) / std


def test_scores(model, X_test, y_test):
    """(NLL, error rate) with the predict_proba columns ordered by model.classes_."""
    proba = np.asarray(model.predict_proba(X_test), dtype=np.float64)
    classes = np.asarray(model.classes_)
    col = np.minimum(np.searchsorted(classes, y_test), len(classes) - 1)
    if not np.all(classes[col] == y_test):
        raise ValueError("a test label is not among the classes seen in training")
    p_true = proba[np.arange(len(y_test)), col]
    return float(-np.mean(np.log(np.clip(p_true, 1e-300, None)))), float(np.mean(classes[np.argmax(proba, 1)] != y_test))


# -- hooks on the library --------------------------------------------------------------------------

@contextlib.contextmanager
def patched(owner, name, make):
    """``owner.name`` replaced by ``make(original)`` for the duration (a fit timed from inside)."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield original
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def data_parallel_plans():
    """The ``DataParallel`` plans the fits inside make (their rounds' record: steps, seconds, bytes of each)."""
    from agpc.inference import data_parallel

    plans = []

    def make(real):
        def init(plan, *args, **kwargs):
            real(plan, *args, **kwargs)
            plans.append(plan)

        return init

    with patched(data_parallel.DataParallel, "__init__", make):
        yield plans


# -- a machine shared with other work --------------------------------------------------------------

@contextlib.contextmanager
def users_cluster(X_train, y_train, workers, chunk_rows):
    """A user's own ``LocalCluster(n_workers=workers, threads_per_worker=1)`` and the training rows on it as the
    user wraps them, ``da.from_array(X, chunks=(chunk_rows, d)).persist()`` (and the labels alike): the fit's data.
    Set up before any clock; closed afterwards. No dashboard (no free port needed), nothing else set."""
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    client = Client(cluster)
    try:
        X = da.from_array(X_train, chunks=(chunk_rows, X_train.shape[1])).persist()
        y = da.from_array(y_train, chunks=chunk_rows).persist()
        wait([X, y])
        yield X, y
    finally:
        client.close()
        cluster.close()


@contextlib.contextmanager
def cpu_bound(n, nice=0):
    """``n`` extra CPU-bound processes (``while True: pass`` at niceness ``nice``) for the duration, ended by their
    handles afterwards: a machine shared with other work."""
    hogs = [subprocess.Popen([sys.executable, "-c", f"import os; os.nice({int(nice)})\nwhile True: pass"])
            for _ in range(n)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
