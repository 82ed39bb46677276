"""Airline delays (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 4.6, Fig. 4 bottom; Villacampa-Calvo &
Hernandez-Lobato (2017), sec. 4, last experiment): test NLL and error against training time.

Protocol, options and commands: benchmarks/README.md, section "airline.py" (with ``--vs-gpflow``: "airline.py --vs-gpflow").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _protocol import ML_SUFFIX, base_method, methods_for_kernel_prior, pyplot
from _runner import (
    DEFAULT_DATA_DIR, PROJECT_ROOT, RESULTS_DIR, begin, cpu_bound, data_parallel_plans, end, header, load_airline,
    options, parse, parse_list, patched, row, standardise, test_scores, thread_variables, users_cluster, write_json,
)
from _runner import show as fmt

GPFLOW_DOC = "agpc SEP, EP and SVI against GPflow SVGP on the peers' airline split, side by side in one run."

CLASS_NAMES = {2: ("not delayed", "delayed"), 3: ("early", "on time", "late")}
CHECKPOINTS = (1, 3, 10, 30, 100, 300, 1000)


def parse_args(argv=None):
    p = options(__doc__, "10,000 training rows, 2,000 test rows, 2 s a GP method")
    p.add_argument("--vs-gpflow", action="store_true", help="agpc against GPflow SVGP instead (its options: "
                   "--vs-gpflow --help)")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR / "airline2008.npz"), help="path of airline2008.npz")
    p.add_argument("--budget", type=float, default=None, help="max_time (s) of each GP fit (default 480; quick: 2)")
    p.add_argument("--linear-budget", type=float, default=None,
                   help="training seconds for the SGD logistic regression (default 90; quick: 1.5)")
    p.add_argument("--n-test", type=int, default=None, help="test rows (default 10000; quick: 2000)")
    p.add_argument("--n-train", type=int, default=None, help="use only this many training rows (default all; quick: 10000)")
    p.add_argument("--methods", default="sep,ep,svi", help="GP methods to run (default sep,ep,svi)")
    p.add_argument("--classes", type=int, choices=(2, 3), default=2,
                   help="2: delayed or not; 3: early / on time / late (Villacampa-Calvo & Hernandez-Lobato 2017)")
    p.add_argument("--delay-minutes", type=float, default=5.0,
                   help="T of the 3-class task (Villacampa-Calvo & Hernandez-Lobato (2017)'s text lost it; default 5)")
    p.add_argument("--seed", type=int, default=0, help="seeds the split, the shuffles and the inducing points")
    p.add_argument("--plot", default=None, help="PNG path (default benchmarks/results/airline[_3class][_quick].png)")
    p.add_argument("--kernel-prior", choices=("auto", "none", "both"), default="auto",
                   help="agpc's kernel_prior: 'none' (maximum likelihood: methods named M-ml), or 'both'")
    p.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                   help="where the GP fits compute (cupy: their training and test arrays on the GPU)")
    p.add_argument("--batches", default=None,
                   help="comma-separated batch_size values, a GP fit (a curve) each: a number of rows or auto "
                        "(the library's: 200 rows above 20,000 on the CPU, 200,000 for binary EP, on a GPU the rows "
                        "that keep it busy); "
                        "default 200, with --backend cupy 200,auto (the GPU's default against the CPU's)")
    args = parse(p, argv, full=dict(budget=480.0, linear_budget=90.0, n_test=10000,
                                    batches=lambda a: "200,auto" if a.backend == "cupy" else "200"),
                 quick=dict(budget=2.0, linear_budget=1.5, n_test=2000, n_train=10000))
    args.batches = [b if b == "auto" else int(b) for b in parse_list(args.batches)]
    args.plot = args.plot or str(RESULTS_DIR / f"airline{'_3class' if args.classes == 3 else ''}"
                                               f"{'_quick' if args.quick else ''}.png")
    args.methods = methods_for_kernel_prior([m for m in args.methods.split(",") if m], args.kernel_prior)
    return args


# -- data ------------------------------------------------------------------------------------------

def load_split(args):
    X, y, names = load_airline(args.data, args.classes, args.delay_minutes)
    rng = np.random.default_rng(args.seed)
    n = X.shape[0]
    test = np.zeros(n, dtype=bool)
    test[rng.choice(n, size=args.n_test, replace=False)] = True
    X_train, y_train, X_test, y_test = X[~test], y[~test], X[test], y[test]
    if args.n_train is not None and args.n_train < X_train.shape[0]:
        keep = np.sort(rng.choice(X_train.shape[0], size=args.n_train, replace=False))
        X_train, y_train = X_train[keep], y_train[keep]
    X_train, X_test = standardise(X_train, X_test)
    return X_train, y_train, X_test, y_test, n, names


def scores_from_proba(proba, y):
    """Mean negative log-likelihood and error of an (n, C) probability matrix (column c: class c) against
    class indices y; the predicted class is the most probable one."""
    proba = np.asarray(proba)
    p = np.clip(proba[np.arange(y.shape[0]), y], 1e-300, 1.0)
    return float(-np.mean(np.log(p))), float(np.mean(np.argmax(proba, axis=1) != y))


# -- scoring schedule ------------------------------------------------------------------------------

def schedule(steps_per_epoch, quick):
    """Step counts at which to score: about 4 a factor of two early, then every ~1/8 epoch."""
    points = set()
    s = 5.0
    late = max(25, steps_per_epoch // 8)
    while s < late:
        points.add(int(round(s)))
        s *= 2 ** 0.5
    return sorted(points), late


class Recorder:
    """Wraps ``Trainer.validation_scores`` (called after every step: eval_every=1) for the length of a fit: at
    scheduled step counts the wrapper scores the current state on the test set (with the library's own
    predictive) and notes the training clock, seconds since the fit began minus all scoring so far."""

    def __init__(self, steps, every):
        from agpc.inference import training

        self.trainer_class = training.Trainer
        self.steps, self.every = set(steps), every
        self.eval_seconds, self.n_steps, self.t_start = 0.0, 0, None
        self.rows = []  # (train seconds, step, nll, error)

    def wrap(self, original):
        def wrapped(trainer, X, y, validation):
            self.n_steps, step, t = trainer.n_steps, trainer.n_steps, time.perf_counter()
            out = None
            if step > 0 and (step in self.steps or step % self.every == 0):
                out = original(trainer, X, y, validation)
                self.rows.append((t - self.t_start - self.eval_seconds, step, *out))
            self.eval_seconds += time.perf_counter() - t
            return out if out is not None else (float("inf"), float("nan"))

        return wrapped

    def __enter__(self):
        self.patch = patched(self.trainer_class, "validation_scores", self.wrap)
        self.patch.__enter__()
        self.t_start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.patch.__exit__(*exc)


# -- runs ------------------------------------------------------------------------------------------

def rows_a_step(clf, X, n_classes):
    """The rows a step of ``clf``'s fit on X takes: its ``batch_size``, "auto" resolved as the library resolves it
    for X's device (``agpc.batch_size.rows_per_step``; the initial inducing points stand in by their shape, type and
    device)."""
    from agpc.backend import array_namespace
    from agpc.batch_size import rows_per_step
    from agpc.plan import FitPlan

    xp = array_namespace(X)
    Z = xp.zeros((clf.n_inducing, X.shape[1]), dtype=X.dtype)
    plan = FitPlan.of(type(clf).__name__, clf.get_params())
    if n_classes == 2:  # (binary EP on the host: its own bound, ``FitPlan.for_rows``; the labels stand in by count)
        plan = plan.for_rows(X, np.arange(X.shape[0]) % 2, X.shape[0])
    return rows_per_step(plan, X.shape[0], xp, Z, n_classes) or X.shape[0]


def run_gp(method, X_train, y_train, X_test, y_test, args, batch=200):
    """One GP fit's scores along its training time; the arrays are where it computes (NumPy, or CuPy on the GPU)."""
    from agpc import GPClassifier
    from agpc.backend import to_numpy

    clf = GPClassifier(method=base_method(method), n_inducing=200, batch_size=batch, max_iter=10_000,
                       max_time=args.budget, random_state=args.seed, plateau=None,  # (a curve to the budget)
                       kernel_prior=None if method.endswith(ML_SUFFIX) else "auto", backend=args.backend)
    rows_per_step = rows_a_step(clf, X_train, args.classes)
    steps_per_epoch = -(-X_train.shape[0] // rows_per_step)
    early, late = schedule(steps_per_epoch, args.quick)
    clf.set_params(eval_every=1)
    rec = Recorder(early, late)
    fit_kw = {"validation_data": (X_test, y_test)}
    with rec:
        t0 = time.perf_counter()
        clf.fit(X_train, y_train, **fit_kw)
        wall = time.perf_counter() - t0
    assert list(to_numpy(clf.classes_)) == list(range(args.classes))
    t1 = time.perf_counter()
    proba = to_numpy(clf.predict_proba(X_test))
    predict_seconds = time.perf_counter() - t1
    info = {
        "wall": wall,
        "train_seconds": wall - rec.eval_seconds,
        "eval_seconds": rec.eval_seconds,
        "fit_time_": clf.fit_time_,
        "steps": rec.n_steps,
        "epochs": rec.n_steps / steps_per_epoch,
        "rows_per_step": rows_per_step,
        "steps_per_epoch": steps_per_epoch,
        "final": scores_from_proba(proba, to_numpy(y_test)),
        "predict_seconds": predict_seconds,
        "stopped_by_time": getattr(clf, "stopped_by_time_", None),
        "n_iter": clf.n_iter_,
        "epoch_times": list(clf.history_.get("time", [])),
    }
    return rec.rows, info


def run_sgd(X_train, y_train, X_test, y_test, args):
    from sklearn.linear_model import SGDClassifier

    rng = np.random.default_rng(args.seed + 1)
    n = X_train.shape[0]
    steps_per_epoch = -(-n // 200)
    early, late = schedule(steps_per_epoch, args.quick)
    early = set(early)
    clf = SGDClassifier(loss="log_loss", average=args.classes == 2, random_state=args.seed)  # (README: airline.py)
    classes = np.arange(args.classes)
    rows = []
    t_start = time.perf_counter()
    eval_seconds = 0.0
    step = 0
    # the same preparation as the GP fits: one random reordering of the rows, contiguous minibatches
    # visited in a new random order each epoch
    perm = rng.permutation(n)
    Xs, ys = X_train[perm], y_train[perm]
    done = False
    while not done:
        for b in rng.permutation(steps_per_epoch):
            lo = b * 200
            clf.partial_fit(Xs[lo:lo + 200], ys[lo:lo + 200], classes=classes)
            step += 1
            t = time.perf_counter()
            trained = t - t_start - eval_seconds
            done = trained >= args.linear_budget
            if step in early or step % late == 0 or done:  # the last state too
                rows.append((trained, step, *scores_from_proba(clf.predict_proba(X_test), y_test)))
            eval_seconds += time.perf_counter() - t
            if done:
                break
    return rows, {"train_seconds": time.perf_counter() - t_start - eval_seconds, "steps": step,
                  "epochs": step / steps_per_epoch, "steps_per_epoch": steps_per_epoch}


def run_logreg(X_train, y_train, X_test, y_test):
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    clf = LogisticRegression(C=1e6, max_iter=1000).fit(X_train, y_train)
    seconds = time.perf_counter() - t0
    return scores_from_proba(clf.predict_proba(X_test), y_test), seconds


# -- reporting -------------------------------------------------------------------------------------

def at_time(rows, t):
    """The last score taken at or before t training seconds (None if none yet)."""
    best = None
    for r in rows:
        if r[0] <= t:
            best = r
    return best


def at_epochs(rows, steps_per_epoch, epochs):
    """The last score taken at or before ``epochs`` epochs (None if none yet)."""
    best = None
    for r in rows:
        if r[1] <= epochs * steps_per_epoch:
            best = r
    return best


def time_to_within(rows, rel=0.01):
    if not rows:
        return None, None
    final = rows[-1][2]
    for r in rows:
        if r[2] <= final * (1.0 + rel):
            return r[0], final
    return None, final


def report_gp(label, info, backend):
    epoch_times = ", ".join(f"{v:.0f}" for v in info["epoch_times"][:6])
    print(f"{label} ({backend}; {info['rows_per_step']:,} rows a step, {info['steps_per_epoch']:,} steps an epoch): "
          f"{info['steps']:,} steps ({info['epochs']:.2f} epochs) in {info['wall']:.1f} s of fit, "
          f"of which {info['eval_seconds']:.1f} s scoring; fit_time_ {info['fit_time_']:.1f} s; "
          f"history_['time'] at epoch ends: [{epoch_times}]; "
          f"final model test NLL {info['final'][0]:.4f}, error {info['final'][1]:.4f} "
          f"(predict {info['predict_seconds']:.2f} s).", flush=True)


def batch_table(gp_labels, curves, infos, args):
    """Each method's fits with the other batches against its fit with the first (with --backend cupy: the GPU's
    default batch, auto, against the CPU's, 200), in the same time budget and after the same epochs (the fewer
    of the two fits')."""
    first = args.batches[0]
    header(["method", "batch", "rows a step", "epochs in the budget", "final model NLL", f"minus batch {first}'s",
            "epochs compared", "NLL then", f"minus batch {first}'s then"], "llrrrrrrr",
           f"Each batch against batch {first}: test NLL in the same time and after the same epochs")
    for label, (method, batch) in gp_labels.items():
        reference = next(name for name, (m, b) in gp_labels.items() if m == method and b == first)
        info, base = infos[label], infos[reference]
        epochs = min(info["epochs"], base["epochs"])
        own = at_epochs(curves[label], info["steps_per_epoch"], epochs)
        theirs = at_epochs(curves[reference], base["steps_per_epoch"], epochs)
        row(method.upper(), str(batch), f"{info['rows_per_step']:,}", f"{info['epochs']:.2f}",
            f"{info['final'][0]:.4f}", f"{info['final'][0] - base['final'][0]:+.4f}", f"{epochs:.2f}",
            fmt(own[2] if own else None, ".4f"), fmt(own[2] - theirs[2] if own and theirs else None, "+.4f"))


def plot(curves, logreg, path, title, n_classes):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"SEP": "tab:red", "EP": "tab:blue", "SVI": "tab:green", "linear (SGD)": "tab:gray"}
    for label, rows in curves.items():
        if not rows:
            continue
        t = [max(r[0], 1e-2) for r in rows]
        axes[0].plot(t, [r[2] for r in rows], label=label, color=colours.get(label))
        axes[1].plot(t, [r[3] for r in rows], label=label, color=colours.get(label))
    if logreg is not None:
        (nll, err), _ = logreg
        axes[0].axhline(nll, ls="--", color="k", lw=1, label="linear (full-data LogisticRegression)")
        axes[1].axhline(err, ls="--", color="k", lw=1, label="linear (full-data LogisticRegression)")
    # SGD's first minibatches give NLLs of 10 and more: show the range the GP curves and the linear line span,
    # capped a little above a constant predictor's (log C) and a little above 1 - 1/C for the error
    gp = [r for label, rows in curves.items() if label != "linear (SGD)" for r in rows]
    ref = [r for rows in curves.values() for r in rows]
    if gp:
        lo_n = min([r[2] for r in ref] + ([logreg[0][0]] if logreg else []))
        hi_n = max([r[2] for r in gp] + ([logreg[0][0]] if logreg else []))
        axes[0].set_ylim(lo_n - 0.01, min(hi_n + 0.03, math.log(n_classes) + 0.1))
        lo_e = min([r[3] for r in ref] + ([logreg[0][1]] if logreg else []))
        hi_e = max([r[3] for r in gp] + ([logreg[0][1]] if logreg else []))
        axes[1].set_ylim(lo_e - 0.01, min(hi_e + 0.03, 1.0 - 1.0 / n_classes + 0.05))
    for ax, name in zip(axes, ("test NLL", "test error")):
        ax.set_xscale("log")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


PEERS_DIR = PROJECT_ROOT / ".." / "shared" / "peers"
PEER_HOME = Path.home() / ".cache" / "agpc-peers"
N_TEST = 10_000
M = 200  # inducing points of every fit of the comparison (``--m`` sets it for the run: ``gpflow_main``)
BATCH = 200
SEED = 0
TARGET_DATA_PARALLEL = 1.4  # issue 24: two workers' rows / s against one process's
# issue 24: ms per step against GPflow's in the same run, and the 60-s NLL race (medians over --seeds)
TARGET_STEP_RATIO = {"sep": 0.8, "ep": 0.8, "adf": 0.8, "svi": 0.9}
TARGET_REACH_SECONDS = 30  # the fastest default method reaches GPflow's 60-s NLL within this budget
TARGET_NLL_MARGIN = 0.002  # ... and is at least this far below it at 60 s
METHODS = ("sep", "ep", "svi")

# (module, class or None, function, accept(args, kwargs, result)): the library's function called once per
# minibatch step, and which calls are steps. EP / SEP / ADF: Trainer.step returns (took, change, log_z), took
# False for a reverted step (since the one loop, every method's step); SVI before the one loop: svi_elbo with
# gradients (its call without them is the final bound on all rows). Only the outermost hooked call counts, so
# the svi_elbo inside a Trainer.step is not a second step.
STEP_HOOKS = (
    ("agpc.inference.training", "Trainer", "step", lambda args, kwargs, out: bool(out[0])),
    ("agpc.inference.variational", None, "svi_elbo", lambda args, kwargs, out: kwargs.get("want_grad", True)),
)

def gpflow_args(argv=None):
    p = options(GPFLOW_DOC, "10,000 training rows, 3 s budgets, 1 s thread-table fits, no peer", seeds="0",
                out="airline_vs_gpflow")
    p.add_argument("--vs-gpflow", action="store_true", help="this comparison")
    p.add_argument("--budgets", default=None, help="comma-separated max_time values in seconds (default 15,60,240)")
    p.add_argument("--methods", default=",".join(METHODS), help="agpc methods (default sep,ep,svi)")
    p.add_argument("--m", type=int, default=M, help=f"inducing points of agpc and GPflow (default {M}; the harness "
                   "runs and caches its k-means of m centres the first time)")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR / "airline2008.npz"), help="path of airline2008.npz")
    p.add_argument("--n-train", type=int, default=None,
                   help="use the first this many training rows (default all; quick: 10000)")
    p.add_argument("--inducing", choices=("peer", "kmeans"), default=None,
                   help="agpc's initial Z: the peer's cached k-means centres (default) or agpc's own k-means "
                        "(default with --quick)")
    p.add_argument("--no-peer", action="store_true", help="skip the GPflow rows (implied by --quick)")
    p.add_argument("--peer-budgets", default=None, help="budgets at which GPflow runs (default: every budget; 'none')")
    p.add_argument("--peer-python", default=str(PEER_HOME / "gpflow" / "bin" / "python"))
    p.add_argument("--peers-dir", default=str(PEERS_DIR), help="the peer harnesses' folder (default ../shared/peers)")
    p.add_argument("--peer-data", default=str(PEER_HOME / "airline_real"),
                   help="the harness's data folder, written by make_airline_real.py")
    p.add_argument("--peer-threads", type=int, default=os.cpu_count() or 1,
                   help="GPflow's --threads (default: the CPU count)")
    p.add_argument("--peer-chunk", type=int, default=500, help="the harness's --round-steps: its time cap is checked "
                   "every this many steps (default 500; 0: only at real epoch ends)")
    p.add_argument("--peer-one-thread-budgets", default=None,
                   help="budgets at which GPflow also runs with one thread (default: the smallest; 'none')")
    p.add_argument("--data-parallel", default="n_jobs,cluster",
                   help="data-parallel rows: n_jobs (local workers), cluster (a user's LocalCluster), none")
    p.add_argument("--dp-method", default="sep", choices=METHODS, help="method of the data-parallel rows")
    p.add_argument("--workers", type=int, default=2, help="workers of the data-parallel rows (default 2)")
    p.add_argument("--dask-chunk-rows", type=int, default=25_000, help="rows per chunk of the cluster row's array")
    p.add_argument("--busy", type=int, default=0, help="extra CPU-bound processes of the loaded table (default 0: none)")
    p.add_argument("--busy-budget", type=float, default=None, help="budget of the loaded table (default 60; quick 3)")
    p.add_argument("--thread-table", action="store_true",
                   help="also time SEP steps with 1 and 2 BLAS threads and with nothing set")
    p.add_argument("--thread-budget", type=float, default=None,
                   help="max_time of each thread-table fit (default 20; quick: 1)")
    args = parse(p, argv, full=dict(budgets="15,60,240", inducing="peer", thread_budget=20.0, busy_budget=60.0),
                 quick=dict(budgets="3", n_train=10_000, inducing="kmeans", thread_budget=1.0, busy_budget=3.0))
    args.budgets = parse_list(args.budgets, convert=float)
    args.peer_budgets = (list(args.budgets) if args.peer_budgets is None else [] if args.peer_budgets == "none"
                         else parse_list(args.peer_budgets, convert=float))
    args.methods = parse_list(args.methods, METHODS, "method")
    args.no_peer = args.no_peer or args.quick
    if args.blas_threads:
        p.error("--blas-threads: the agpc rows run as a user runs them, with nothing set (see --thread-table)")
    one_thread = args.peer_one_thread_budgets
    args.peer_one_thread_budgets = ([] if one_thread == "none" else [min(args.budgets)] if one_thread is None
                                    else parse_list(one_thread, convert=float))
    args.data_parallel = [] if args.data_parallel == "none" else parse_list(args.data_parallel, ("n_jobs", "cluster"),
                                                                            "data-parallel row")
    return args


# -- against GPflow: data ------------------------------------------------------------------------------------------

def peer_split(path, n_train=None):
    """(X_train, y_train, X_test, y_test, n rows) of the peers' airline split; labels 1 = delayed."""
    X, y, _ = load_airline(path)
    order = np.random.default_rng(SEED).permutation(X.shape[0])
    test, train = order[:N_TEST], order[N_TEST:]
    if n_train is not None:
        train = train[:n_train]  # the first rows of the permuted training part
    X_train, X_test = standardise(X[train], X[test])
    return X_train, y[train], X_test, y[test], X.shape[0]


def same_test_rows(peer_data, X_test, y_test):
    """'identical' when the peer's data folder holds our test rows and labels, else why not."""
    folder = Path(peer_data)
    try:
        peer_X = np.load(folder / "X_test.npy")
        peer_y = np.load(folder / "y_test.npy")
    except OSError as exc:
        return f"not checked ({exc})"
    if peer_X.shape == X_test.shape and np.array_equal(peer_X, X_test) and np.array_equal(peer_y > 0, y_test == 1):
        return "identical"
    return "DIFFERENT: the GPflow rows are not on this split"


def peer_z(args, seed=SEED):
    """agpc's initial Z: the peer's cached k-means centres of ``seed`` with ``--inducing peer`` once the harness has
    written them; else None (agpc's own k-means inside ``fit``)."""
    path = Path(args.peer_data) / f"Z_kmeans_m{M}_seed{seed}.npy"
    return np.load(path) if args.inducing == "peer" and path.is_file() else None


# -- agpc ------------------------------------------------------------------------------------------

class StepClock:
    """Counts the steps of a fit through ``STEP_HOOKS`` and notes when the first began and the last ended."""

    def __init__(self):
        self.steps, self.first_start, self.last_end, self.hooked = 0, None, None, []
        self.depth = 0  # hooked calls under way

    def _wrap(self, original, accept):
        def counted(*args, **kwargs):
            t = time.perf_counter()
            self.depth += 1
            try:
                out = original(*args, **kwargs)
            finally:
                self.depth -= 1
            if self.depth == 0 and accept(args, kwargs, out):
                self.steps += 1
                self.first_start = t if self.first_start is None else self.first_start
                self.last_end = time.perf_counter()
            return out

        return counted

    @contextlib.contextmanager
    def counting(self):
        with contextlib.ExitStack() as hooks:
            for module_name, class_name, name, accept in STEP_HOOKS:
                try:
                    owner = importlib.import_module(module_name)
                    owner = getattr(owner, class_name) if class_name else owner
                    hooks.enter_context(patched(owner, name, lambda original, a=accept: self._wrap(original, a)))
                except (ImportError, AttributeError):
                    continue
                self.hooked.append(f"{module_name}.{class_name + '.' if class_name else ''}{name}")
            yield self


def run_agpc(method, budget, data, Z, threads=None, where="one process", fit_data=None, seed=SEED, **params):
    """One fit and its test scores: a dict of the table's columns. ``threads``: BLAS limit around the fit
    (None: nothing set); ``where``: "one process", "n_jobs" or "cluster" (the fit on ``fit_data``, dask arrays on
    the current client); ``params``: more GPClassifier parameters."""
    import agpc

    X_train, y_train, X_test, y_test = data
    model = agpc.GPClassifier(method=method, n_inducing=M, batch_size=BATCH, max_time=budget, random_state=seed,
                              inducing="kmeans" if Z is None else Z, **params)
    clock = StepClock()
    limits = contextlib.nullcontext()
    if threads is not None:
        from threadpoolctl import threadpool_limits

        limits = threadpool_limits(limits=threads, user_api="blas")
    with warnings.catch_warnings(), limits, clock.counting(), data_parallel_plans() as plans:
        warnings.simplefilter("ignore")
        blas_threads = blas_thread_counts()
        t0 = time.perf_counter()
        model.fit(*(fit_data or (X_train, y_train)))
        t_end = time.perf_counter()
    nll, err = test_scores(model, X_test, y_test)
    rounds = plans[-1].rounds if plans else None
    steps = sum(sum(r["steps"]) for r in rounds) if rounds is not None else clock.steps
    row = {"library": "agpc", "method": method, "budget": budget, "seed": seed, "steps": steps, "nll": nll, "error": err,
           "fit_seconds": t_end - t0, "threads": threads, "blas_pool_threads": blas_threads, "where": where,
           "inducing": "agpc k-means" if Z is None else "peer Z", "n_jobs_used": getattr(model, "n_jobs_", None)}
    if rounds is not None:
        row["rounds"] = len(rounds)
    if clock.steps:
        train = clock.last_end - clock.first_start
        row.update(setup_seconds=clock.first_start - t0, train_seconds=train, ms_per_step=1e3 * train / steps,
                   final_seconds=t_end - clock.last_end, rows_per_second=steps * BATCH / train)
    else:
        # max_time bounds the whole fit: a budget that cannot hold one step and the final pass takes none
        row["note"] = (f"no step counted through {clock.hooked}: the fit took none within max_time, or the "
                       f"library's per-step function changed (STEP_HOOKS)")
    return row


def blas_thread_counts():
    """The thread counts of the loaded BLAS pools, as threadpoolctl reports them now."""
    from threadpoolctl import threadpool_info

    return sorted({info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"})


def time_agpc_kmeans(X_train):
    import agpc.inducing

    t0 = time.perf_counter()
    agpc.inducing.initial_inducing_points(X_train, M, "kmeans", random_state=SEED)
    return time.perf_counter() - t0


# -- GPflow ----------------------------------------------------------------------------------------

def peer_build_commands(peer_python, peer_data, peers_dir=PEERS_DIR):
    venv = Path(peer_python).parent.parent
    peers = Path(peers_dir).resolve()
    return (f"python3 -m venv {venv} && {peer_python} -m pip install -r {peers / 'requirements-gpflow.txt'}\n"
            f"    {peer_python} {peers / 'make_airline_real.py'} {peer_data}")


def peer_missing(args):
    """None when the harness can run, else the reason (printed with the commands that build what is missing)."""
    if not (Path(args.peers_dir) / "gpflow_svgp.py").is_file():
        return f"the harness {Path(args.peers_dir) / 'gpflow_svgp.py'} is absent"
    if not Path(args.peer_python).is_file():
        return f"no peer Python at {args.peer_python} (the virtual environment is not built)"
    probe = subprocess.run([args.peer_python, "-c", "import gpflow, tensorflow"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`import gpflow, tensorflow` fails in {args.peer_python}: {probe.stderr.strip()[-600:]}"
    if not (Path(args.peer_data) / "X_train.npy").is_file():
        return f"the peer's data folder {args.peer_data} is not written"
    return None


def run_peer(args, budget, threads=None, seed=SEED):
    """GPflow SVGP for ``budget`` training seconds through the harness, with ``threads`` (default
    ``--peer-threads``): a dict of the table's columns."""
    harness = str((Path(args.peers_dir) / "gpflow_svgp.py").resolve())
    threads = args.peer_threads if threads is None else threads
    cmd = [args.peer_python, harness, args.peer_data, "--round-steps", str(args.peer_chunk),
           "--m", str(M), "--batch", str(BATCH), "--time-cap", f"{budget:g}", "--threads", str(threads),
           "--seed", str(seed), "--epochs", str(10**6 if args.peer_chunk > 0 else 1000),
           "--label", f"budget {budget:g}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(args.peers_dir))
    wall = time.perf_counter() - t0
    records = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    summary = next((r for r in records if r.get("summary")), None)
    row = {"library": "GPflow", "method": "svgp", "budget": budget, "seed": seed, "process_seconds": wall}
    if proc.returncode != 0 or summary is None:
        row["note"] = f"harness exited with {proc.returncode}: {proc.stderr.strip()[-800:]}"
        return row
    row.update(steps=summary["steps"], train_seconds=summary["train_s"], ms_per_step=1e3 * summary["sec_per_step"],
               rows_per_second=BATCH / summary["sec_per_step"],
               nll=summary["final_test_nll"], error=summary["final_test_err"], setup_seconds=summary["init_s"],
               Z_sha=summary["Z_sha"], other_cores=summary.get("other_cores_avg"), stopped_by=summary["stopped_by"],
               versions=summary["versions"], threads=summary["threads"])
    errors = [r for r in records if "error" in r]
    if errors:
        row["note"] = errors[0]["error"]
    return row


# -- report ----------------------------------------------------------------------------------------

def row_name(r):
    if r["library"] == "agpc":
        where = r.get("where", "one process")
        return {"one process": f"agpc {r['method'].upper()}, nothing set",
                "n_jobs": f"agpc {r['method'].upper()}, n_jobs={r.get('workers', 2)}",
                "cluster": f"agpc {r['method'].upper()}, user's LocalCluster ({r.get('workers', 2)} workers), "
                           "nothing set"}[where]
    version, threads = r.get("versions", {}).get("gpflow", "?"), r.get("threads", "?")
    return f"GPflow {version} SVGP, Adam 0.01, float64, {threads} thread{'s' if threads != 1 else ''}"


def print_budget_table(rows, budget, seed=None):
    header(["run", "Z", "set-up / init (s)", "training (s)", "steps", "ms / step", "rows / s", "x SEP", "final pass (s)",
            "fit wall (s)", "test NLL", "test error"], "llrrrrrrrrrr",
           f"Budget {budget:g} s" + ("" if seed is None else f", seed {seed}"))
    sep = next((r for r in rows if r["library"] == "agpc" and r["method"] == "sep"
                and r.get("where", "one process") == "one process" and "rows_per_second" in r), None)
    for r in rows:
        wall = r.get("fit_seconds", r.get("process_seconds"))
        z = r.get("inducing", "peer Z (its cache)" if r["library"] == "GPflow" else "")
        rate = r.get("rows_per_second")
        ratio = rate / sep["rows_per_second"] if rate and sep else None
        row(row_name(r), z, fmt(r.get("setup_seconds"), ".1f"), fmt(r.get("train_seconds"), ".1f"),
            fmt(r.get("steps"), ","), fmt(r.get("ms_per_step"), ".2f"), fmt(rate, ",.0f"), fmt(ratio, ".2f"),
            fmt(r.get("final_seconds"), ".1f"), fmt(wall, ".1f"), fmt(r.get("nll"), ".4f"), fmt(r.get("error"), ".4f"))
    for r in rows:
        if r.get("note"):
            print(f"- {r['library']} {r['method']}: {r['note']}")
    peer = next((r for r in rows if r["library"] == "GPflow" and "nll" in r), None)
    for r in rows:
        if r.get("rounds"):
            print(f"- {row_name(r)}: {r['rounds']} rounds, {r['steps']:,} minibatch steps of all workers.")
    if peer is not None:
        print(f"- GPflow: stopped by {peer['stopped_by']}; other processes used "
              f"{fmt(peer['other_cores'], '.2f')} cores "
              f"on average during its run; wall of the process (TensorFlow import, data, scoring) "
              f"{peer['process_seconds']:.0f} s.")


def _median(values):
    values = sorted(v for v in values if v is not None)
    return None if not values else statistics.median(values)


def _one_process(rows, method):
    return [r for r in rows if r["library"] == "agpc" and r["method"] == method
            and r.get("where", "one process") == "one process" and r.get("threads") is None and "nll" in r]


def _peer(rows, threads=None):
    """GPflow's rows at its default threads (``threads`` None) or at ``threads``."""
    return [r for r in rows if r["library"] == "GPflow" and "nll" in r
            and (r.get("one_thread") if threads == 1 else not r.get("one_thread"))]


def median_table(rows_by_budget):
    """Each run's median over the seeds (test NLL, ms / step), a budget a column pair."""
    budgets = list(rows_by_budget)
    header(["run", *(f"{b:g} s: {what}" for b in budgets for what in ("NLL", "ms / step"))],
           "l" + "rr" * len(budgets), "Medians over the seeds")
    names = []
    for rows in rows_by_budget.values():
        for r in rows:
            if row_name(r) not in names and r.get("where", "one process") == "one process":  # (GPflow's too)
                names.append(row_name(r))
    for name in names:
        cells = []
        for b in budgets:
            mine = [r for r in rows_by_budget[b] if row_name(r) == name and r.get("where", "one process") == "one process"]
            cells += [fmt(_median(r.get("nll") for r in mine), ".4f"),
                      fmt(_median(r.get("ms_per_step") for r in mine), ".2f")]
        row(name, *cells)


def targets(rows_by_budget):
    """(text, met or None) lines for the targets of issue 24 that the rows speak to: medians over the seeds."""
    out = []
    for budget, rows in rows_by_budget.items():
        peer_ms = _median(r.get("ms_per_step") for r in _peer(rows))
        peer_one_ms = _median(r.get("ms_per_step") for r in _peer(rows, threads=1))
        for method, bound in TARGET_STEP_RATIO.items():
            ms = _median(r.get("ms_per_step") for r in _one_process(rows, method))
            if ms is None or peer_ms is None:
                continue
            out.append((f"budget {budget:g} s: agpc {method.upper()} {ms:.2f} ms / step vs GPflow {peer_ms:.2f} at its "
                        f"default threads (ratio {ms / peer_ms:.2f}; target <= {bound})", ms / peer_ms <= bound))
            if peer_one_ms is not None:
                out.append((f"budget {budget:g} s: agpc {method.upper()} {ms:.2f} ms / step vs GPflow {peer_one_ms:.2f} at "
                            f"1 thread (ratio {ms / peer_one_ms:.2f}; target <= {bound})", ms / peer_one_ms <= bound))
        one = {r["method"]: r for r in rows if r["library"] == "agpc" and r.get("where") == "one process"
               and r.get("seed", SEED) == min(x.get("seed", SEED) for x in rows)}
        for r in rows:
            base = one.get(r["method"])
            if r.get("where") in ("n_jobs", "cluster") and base and r.get("rows_per_second") and base.get(
                    "rows_per_second"):
                ratio = r["rows_per_second"] / base["rows_per_second"]
                out.append((f"budget {budget:g} s: {row_name(r)} {ratio:.2f}x one process's rows / s (target >= "
                            f"{TARGET_DATA_PARALLEL})", ratio >= TARGET_DATA_PARALLEL))
                if budget == 60:
                    out.append((f"60 s: {row_name(r)} test NLL {r['nll']:.4f} vs one process {base['nll']:.4f} "
                                "(target: at most one process's)", r["nll"] <= base["nll"]))
    if 60 in rows_by_budget:
        peer_60 = _median(r["nll"] for r in _peer(rows_by_budget[60]))
        if peer_60 is not None:
            methods = sorted({r["method"] for r in _one_process(rows_by_budget[60], "sep") + _one_process(
                rows_by_budget[60], "ep") + _one_process(rows_by_budget[60], "svi") + _one_process(rows_by_budget[60],
                                                                                                   "adf")})
            race = rows_by_budget.get(TARGET_REACH_SECONDS, rows_by_budget[60])
            at_reach = {m: _median(r["nll"] for r in _one_process(race, m)) for m in methods}
            at_reach = {m: v for m, v in at_reach.items() if v is not None}
            if at_reach:
                fastest = min(at_reach, key=at_reach.get)
                n_seeds = len(_one_process(rows_by_budget[60], fastest))
                if TARGET_REACH_SECONDS in rows_by_budget:
                    out.append((f"the fastest method ({fastest.upper()}, lowest median NLL at {TARGET_REACH_SECONDS} s) "
                                f"reaches GPflow's 60-s NLL {peer_60:.4f} within {TARGET_REACH_SECONDS} s: "
                                f"{at_reach[fastest]:.4f} (median of {n_seeds})", at_reach[fastest] <= peer_60))
                at_60 = _median(r["nll"] for r in _one_process(rows_by_budget[60], fastest))
                out.append((f"60 s: {fastest.upper()} {at_60:.4f} against GPflow {peer_60:.4f} (medians; target at least "
                            f"{TARGET_NLL_MARGIN} below: <= {peer_60 - TARGET_NLL_MARGIN:.4f})",
                            at_60 <= peer_60 - TARGET_NLL_MARGIN))
            sep_60 = _median(r["nll"] for r in _one_process(rows_by_budget[60], "sep"))
            if sep_60 is not None:
                out.append((f"60 s: SEP {sep_60:.4f} against GPflow {peer_60:.4f} (medians; target: at most GPflow's)",
                            sep_60 <= peer_60))
    return out


def data_parallel_rows(args, budget, data, Z):
    """The data-parallel rows of a budget (``--data-parallel``): ``n_jobs`` and a user's own LocalCluster."""
    rows = []
    for where in args.data_parallel:
        if where == "n_jobs":
            row = run_agpc(args.dp_method, budget, data, Z, where="n_jobs", n_jobs=args.workers)
        else:
            with users_cluster(data[0], data[1], args.workers, args.dask_chunk_rows) as fit_data:
                row = run_agpc(args.dp_method, budget, data, Z, where="cluster", fit_data=fit_data)
        row["workers"] = args.workers
        rows.append(row)
        print(f"<!-- agpc {args.dp_method} {where} {budget:g} s done: {row['nll']:.4f} -->", flush=True)
    return rows


def busy_table(args, data, Z):
    """SEP in one process and the data-parallel rows at ``--busy-budget``, each beside ``--busy`` extra CPU-bound
    processes: does a busy core slow the rounds by its share of the CPU only?"""
    budget = args.busy_budget
    rows = []
    with cpu_bound(args.busy):
        rows.append(run_agpc(args.dp_method, budget, data, Z))
    for where in args.data_parallel:
        single = dict(args.__dict__, data_parallel=[where])
        with cpu_bound(args.busy):
            rows += data_parallel_rows(argparse.Namespace(**single), budget, data, Z)
    header(["run", "training (s)", "steps", "rows / s", "x one process", "test NLL"], "lrrrrr",
           f"Beside {args.busy} extra CPU-bound process(es): {args.dp_method.upper()} at {budget:g} s")
    for r in rows:
        ratio = r.get("rows_per_second", 0) / rows[0]["rows_per_second"] if rows[0].get("rows_per_second") else None
        row(row_name(r), fmt(r.get("train_seconds"), ".1f"), fmt(r.get("steps"), ","),
            fmt(r.get("rows_per_second"), ",.0f"), fmt(ratio, ".2f"), f"{r['nll']:.4f}")
    return rows


def busy_targets(rows):
    if not rows or not rows[0].get("rows_per_second"):
        return []
    base = rows[0]
    return [(f"beside an extra CPU-bound process: {row_name(r)} {r['rows_per_second'] / base['rows_per_second']:.2f}x "
             "one process's rows / s under the same load (target >= 1)",
             r["rows_per_second"] >= base["rows_per_second"]) for r in rows[1:] if r.get("rows_per_second")]


def thread_table(args, data, Z):
    """ms per SEP step with nothing set, 1 and 2 BLAS threads (threadpoolctl inside this process) and with 1 and 2
    passed as GPClassifier's ``blas_threads``: agpc's thread rule leaves a caller's limit
    alone only when it differs from the BLAS default, so threadpool_limits(2) on 2 cores is 'nothing set'."""
    header(["BLAS threads", "threadpoolctl reports before fit", "steps", "ms / step", "test NLL"], "llrrr",
           f"Thread policy: ms per SEP step (max_time {args.thread_budget:g} s a fit, one after another)")
    settings = [(None, {}), (1, {}), (2, {}), (None, {"blas_threads": 1}), (None, {"blas_threads": 2})]
    rows = []
    for threads, params in settings:
        fit = run_agpc("sep", args.thread_budget, data, Z, threads=threads, **params)
        fit.update(params)
        rows.append(fit)
        label = (f"GPClassifier(blas_threads={params['blas_threads']})" if params else
                 "nothing set" if threads is None else f"{threads} (threadpool_limits)")
        row(label, fit["blas_pool_threads"], fmt(fit["steps"], ","), fmt(fit.get("ms_per_step"), ".2f"),
            f"{fit['nll']:.4f}")
    return rows


def gpflow_main(argv=None):
    global M
    args = gpflow_args(argv)
    M = args.m  # (read by every agpc and GPflow fit of this run, and by the peer's cached k-means file name)
    started = begin("agpc against GPflow SVGP on the airline split", args, argv)
    env = ", ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith("OPENBLAS_")) or "none"
    print(f"- OPENBLAS_* variables: {env}")
    print(f"- BLAS threads threadpoolctl reports before any fit: {blas_thread_counts()}")
    print("\n".join(thread_variables()))
    path = Path(args.data)
    t0 = time.perf_counter()
    X_train, y_train, X_test, y_test, n_all = peer_split(path, args.n_train)
    data = (X_train, y_train, X_test, y_test)
    print(f"\nData: {path}: {n_all:,} rows; training {X_train.shape[0]:,}, test {X_test.shape[0]:,} (permutation "
          f"seed {SEED}, first {N_TEST:,} test); delayed rate train / test {y_train.mean():.4f} / {y_test.mean():.4f}; "
          f"loaded in {time.perf_counter() - t0:.1f} s. Steps per epoch: {-(-X_train.shape[0] // BATCH):,}.")
    kmeans_seconds = time_agpc_kmeans(X_train)
    print(f"agpc's own k-means (initial_inducing_points, m = {M}, 20,000-row subsample), timed alone: "
          f"{kmeans_seconds:.2f} s.")

    why_no_peer = "--quick / --no-peer" if args.no_peer else peer_missing(args)
    if why_no_peer and not args.no_peer:
        print(f"\nGPflow rows skipped: {why_no_peer}.\nBuild the peer's environment and data folder with:\n"
              f"    {peer_build_commands(args.peer_python, args.peer_data, args.peers_dir)}")
    elif not why_no_peer:
        print(f"GPflow harness: {Path(args.peers_dir).resolve() / 'gpflow_svgp.py'} in {args.peer_python}; data folder "
              f"{args.peer_data}: test rows {same_test_rows(args.peer_data, X_test, y_test)} to ours; time cap "
              f"checked every {args.peer_chunk or 'epoch of'} steps.")
    start_z = "the peer's cached k-means Z" if args.inducing == "peer" else "its own k-means"
    print(f"Budgets {', '.join(f'{b:g}' for b in args.budgets)} s; agpc methods {', '.join(args.methods)}; "
          f"agpc starts from {start_z}.", flush=True)

    rows_by_budget = {budget: [] for budget in args.budgets}
    for seed in args.seeds:
        for budget in args.budgets:
            rows = []
            if not why_no_peer and budget in args.peer_budgets:
                one_thread = budget in args.peer_one_thread_budgets and seed == args.seeds[0]
                for threads in [None] + ([1] if one_thread else []):
                    rows.append(run_peer(args, budget, threads, seed))
                    rows[-1]["one_thread"] = threads == 1
                    print(f"<!-- GPflow {budget:g} s seed {seed} done: {rows[-1].get('nll', rows[-1].get('note'))} -->",
                          flush=True)
            Z = peer_z(args, seed)
            for method in args.methods:
                rows.append(run_agpc(method, budget, data, Z, seed=seed))
                print(f"<!-- agpc {method} {budget:g} s seed {seed} done: {rows[-1]['nll']:.4f} -->", flush=True)
            if seed == args.seeds[0]:
                rows += data_parallel_rows(args, budget, data, Z)
            rows_by_budget[budget] += rows
            print_budget_table(rows, budget, seed if len(args.seeds) > 1 else None)
    if len(args.seeds) > 1:
        median_table(rows_by_budget)

    busy_rows = busy_table(args, data, peer_z(args)) if args.busy else []

    met = targets(rows_by_budget) + busy_targets(busy_rows)
    print("\n### Targets (issue 24)\n")
    for text, ok in met:
        print(f"- {'met' if ok else 'NOT met'}: {text}")
    if not met:
        print("- none applies to this run (they need the GPflow rows, budgets of 15 and 60 s, or data-parallel rows)")

    threads = []
    if args.thread_table:
        threads = thread_table(args, data, peer_z(args))

    write_json(args.out, {"argv": sys.argv if argv is None else argv, "agpc_kmeans_seconds": kmeans_seconds,
                          "rows": [r for rows in rows_by_budget.values() for r in rows], "thread_table": threads,
                          "busy": busy_rows, "targets": [{"text": t, "met": ok} for t, ok in met]})
    end(started)


def main(argv=None):
    if "--vs-gpflow" in (sys.argv[1:] if argv is None else argv):
        return gpflow_main(argv)
    args = parse_args(argv)
    if args.backend == "cupy":  # a machine where CuPy cannot compute: one line, before any work
        from agpc.backend import DeviceUnavailableError, check_device

        try:
            check_device()
        except DeviceUnavailableError as exc:
            print(f"airline.py: --backend cupy: {exc}", file=sys.stderr)
            sys.exit(2)
    C = args.classes
    figure = "Hernandez-Lobato & Hernandez-Lobato (2016), Fig. 4 bottom" if C == 2 else "Villacampa-Calvo & Hernandez-Lobato (2017), Fig. 5 bottom"
    started = begin(f"Airline delays, {C} classes: test NLL / error against training time ({figure})", args, argv,
                    user_api="blas")
    t0 = time.perf_counter()
    X_train, y_train, X_test, y_test, n_all, names = load_split(args)
    rates = "; ".join(f"{name} {np.mean(y_train == c):.4f} / {np.mean(y_test == c):.4f}"
                      for c, name in enumerate(CLASS_NAMES[C]))
    print(f"Data: {args.data}: {n_all:,} rows; training {X_train.shape[0]:,}, test {X_test.shape[0]:,} "
          f"(seed {args.seed}); class rates train / test: {rates}; "
          f"loaded and standardised in {time.perf_counter() - t0:.1f} s.")
    if C == 3:
        T = f"{args.delay_minutes:g}"
        print(f"Classes: early = arr_delay < -{T} min, on time = |arr_delay| <= {T} min, late = arr_delay > {T} min. "
              f"T = {T} minutes is --delay-minutes (default 5): Villacampa-Calvo & Hernandez-Lobato (2017)'s text lost the paper's number.")
    if names:
        print(f"Features: {', '.join(names)}.")
    print(f"Budgets: GP max_time {args.budget:g} s each; SGD {args.linear_budget:g} s. "
          f"Steps per epoch: {-(-X_train.shape[0] // 200):,}.\n", flush=True)

    gp_data = (X_train, y_train, X_test, y_test)
    if args.backend == "cupy":  # on the GPU from the start, as a GPU user's data: no transfer a step
        import cupy

        gp_data = tuple(cupy.asarray(a) for a in gp_data)
    curves, infos = {}, {}
    logreg = run_logreg(X_train, y_train, X_test, y_test)
    print(f"Full-data LogisticRegression (lbfgs, C=1e6{', multinomial' if C > 2 else ''}): test NLL {logreg[0][0]:.4f}, error {logreg[0][1]:.4f}, "
          f"fit {logreg[1]:.1f} s.", flush=True)
    rows, info = run_sgd(X_train, y_train, X_test, y_test, args)
    curves["linear (SGD)"], infos["linear (SGD)"] = rows, info
    print(f"SGD logistic regression{' (one-vs-rest)' if C > 2 else ''}: {info['steps']:,} minibatches ({info['epochs']:.2f} epochs) in "
          f"{info['train_seconds']:.1f} s; last test NLL {rows[-1][2]:.4f}, error {rows[-1][3]:.4f}.", flush=True)
    gp_labels = {}  # label: (method, batch)
    for method in args.methods:
        for batch in args.batches:
            label = method.upper() if batch == 200 else f"{method.upper()} batch {batch}"
            gp_labels[label] = (method, batch)
            rows, info = run_gp(method, *gp_data, args, batch)
            curves[label], infos[label] = rows, info
            report_gp(label, info, args.backend)

    print("\n### Test NLL and error at training-time checkpoints\n")
    print("Each cell: the last score taken at or before the checkpoint (time = training seconds at that score).\n")
    header(["method", "checkpoint (s)", "time (s)", "step", "epochs", "test NLL", "test error"], "lrrrrrr")
    for label, rows in curves.items():
        if not rows:
            continue
        spe = infos[label]["steps_per_epoch"]
        picked = []
        for c in CHECKPOINTS:
            r = at_time(rows, c)
            if c <= rows[-1][0] and r is not None and (not picked or picked[-1][1][1] != r[1]):
                picked.append((f"{c:g}", r))
        if not picked or picked[-1][1][1] != rows[-1][1]:
            picked.append(("end", rows[-1]))
        for cname, r in picked:
            row(label, cname, f"{r[0]:.1f}", f"{r[1]:,}", f"{r[1] / spe:.3f}", f"{r[2]:.4f}", f"{r[3]:.4f}")
    (lr_nll, lr_err), lr_seconds = logreg
    row("LogisticRegression (full data, lbfgs)", "–", f"{lr_seconds:.1f}", "–", "–", f"{lr_nll:.4f}", f"{lr_err:.4f}")
    for label in gp_labels:
        info = infos[label]
        row(f"{label} final model", "–", f"{info['train_seconds']:.1f}", f"{info['steps']:,}",
            f"{info['epochs']:.3f}", f"{info['final'][0]:.4f}", f"{info['final'][1]:.4f}")

    header(["method", "final NLL (last score)", "seconds to within 1%", "training seconds run"], "lrrr",
           "Seconds to reach within 1% of the final test NLL")
    for label, rows in curves.items():
        t, final = time_to_within(rows)
        row(label, fmt(final, ".4f"), fmt(t, ".1f"), fmt(rows[-1][0] if rows else None, ".1f"))

    print("\n### GP against the linear model\n")
    sgd_rows = curves.get("linear (SGD)", [])
    for label in gp_labels:
        rows = curves[label]
        beat_full = next((r for r in rows if r[2] < lr_nll), None)
        beat_sgd = None
        for r in rows:
            s = at_time(sgd_rows, r[0])
            if s is not None and r[2] < s[2]:
                beat_sgd = (r, s)
                break
        first = rows[0] if rows else None
        line = f"- {label}: first score at {fmt(first[0] if first else None, '.1f')} s (NLL {fmt(first[2] if first else None, '.4f')}). "
        line += (f"NLL below the converged full-data linear model ({lr_nll:.4f}) from {beat_full[0]:.1f} s "
                 f"(step {beat_full[1]:,}, NLL {beat_full[2]:.4f})" if beat_full else
                 f"never below the converged full-data linear model ({lr_nll:.4f})")
        line += (f"; below SGD-at-the-same-time from {beat_sgd[0][0]:.1f} s (GP {beat_sgd[0][2]:.4f} vs SGD {beat_sgd[1][2]:.4f})."
                 if beat_sgd else "; never below SGD at the same time.")
        print(line)
    if len(args.batches) > 1:
        batch_table(gp_labels, curves, infos, args)
    batches = ", ".join(str(b) for b in args.batches)
    plot(curves, logreg, args.plot, f"Airline delays 2008, {C} classes (m = 200{' per class' if C > 2 else ''}, "
                                     f"minibatch {batches}, {args.backend})", C)
    print(f"\nPlot: {args.plot}")
    end(started)


if __name__ == "__main__":
    main()
