"""Airline delays (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 4.6, Fig. 4 bottom; Villacampa-Calvo &
Hernandez-Lobato (2017), sec. 4, last experiment): test NLL and error against training time.

Protocol, options and commands: benchmarks/README.md, section "airline.py".
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from _protocol import ML_SUFFIX, base_method, methods_for_kernel_prior, pyplot
from _runner import DEFAULT_DATA_DIR, RESULTS_DIR, begin, end, header, load_airline, options, parse, patched, row
from _runner import show as fmt

CLASS_NAMES = {2: ("not delayed", "delayed"), 3: ("early", "on time", "late")}
CHECKPOINTS = (1, 3, 10, 30, 100, 300, 1000)


def parse_args(argv=None):
    p = options(__doc__, "10,000 training rows, 2,000 test rows, 4 s a GP method")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR / "airline2008.npz"), help="path of airline2008.npz")
    p.add_argument("--budget", type=float, default=None, help="max_time (s) of each GP fit (default 480; quick: 4)")
    p.add_argument("--linear-budget", type=float, default=None,
                   help="training seconds for the SGD logistic regression (default 90; quick: 3)")
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
    args = parse(p, argv, full=dict(budget=480.0, linear_budget=90.0, n_test=10000),
                 quick=dict(budget=4.0, linear_budget=3.0, n_test=2000, n_train=10000))
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
    mean, std = X_train.mean(axis=0), X_train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (X_train - mean) / std, y_train, (X_test - mean) / std, y_test, n, names


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
    """Wraps ``module.name``, a function of the library's training loop, for the length of a fit: at
    scheduled step counts the wrapper scores the current state on the test set (with the library's own
    predictive) and notes the training clock, seconds since the fit began minus all scoring so far."""

    def __init__(self, module, name, steps, every):
        if not hasattr(module, name):
            raise SystemExit(f"{module.__name__}.{name} is gone: update benchmarks/airline.py")
        self.module, self.name, self.original = module, name, getattr(module, name)
        self.steps, self.every = set(steps), every
        self.eval_seconds, self.n_steps, self.t_start = 0.0, 0, None
        self.rows = []  # (train seconds, step, nll, error)

    def score(self, t, step, scorer):
        """The state after ``step`` steps, clock read at t: (nll, error) from ``scorer()`` if scheduled, else None."""
        out = None
        if step > 0 and (step in self.steps or step % self.every == 0):
            out = scorer()
            self.rows.append((t - self.t_start - self.eval_seconds, step, *out))
        self.eval_seconds += time.perf_counter() - t
        return out

    def wrap(self, original):
        raise NotImplementedError

    def __enter__(self):
        self.patch = patched(self.module, self.name, self.wrap)
        self.patch.__enter__()
        self.t_start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.patch.__exit__(*exc)


class ValidationRecorder(Recorder):
    """``training.Trainer.validation_scores``, called after every step (eval_every=1)."""

    def wrap(self, original):
        def wrapped(trainer, X, y, validation):
            self.n_steps = trainer.n_steps
            out = self.score(time.perf_counter(), trainer.n_steps, lambda: original(trainer, X, y, validation))
            return out if out is not None else (float("inf"), float("nan"))

        return wrapped


# -- runs ------------------------------------------------------------------------------------------

def run_gp(method, X_train, y_train, X_test, y_test, args):
    from agpc import GPClassifier
    from agpc.inference import training

    steps_per_epoch = -(-X_train.shape[0] // 200)
    early, late = schedule(steps_per_epoch, args.quick)
    clf = GPClassifier(method=base_method(method), n_inducing=200, batch_size=200, max_iter=10_000,
                       max_time=args.budget, random_state=args.seed,
                       kernel_prior=None if method.endswith(ML_SUFFIX) else "auto")
    clf.set_params(eval_every=1)
    rec = ValidationRecorder(training.Trainer, "validation_scores", early, late)
    fit_kw = {"validation_data": (X_test, y_test)}
    with rec:
        t0 = time.perf_counter()
        clf.fit(X_train, y_train, **fit_kw)
        wall = time.perf_counter() - t0
    assert list(clf.classes_) == list(range(args.classes))
    t1 = time.perf_counter()
    proba = clf.predict_proba(X_test)
    predict_seconds = time.perf_counter() - t1
    info = {
        "wall": wall,
        "train_seconds": wall - rec.eval_seconds,
        "eval_seconds": rec.eval_seconds,
        "fit_time_": clf.fit_time_,
        "steps": rec.n_steps,
        "epochs": rec.n_steps / steps_per_epoch,
        "final": scores_from_proba(proba, y_test),
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
                  "epochs": step / steps_per_epoch}


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


def time_to_within(rows, rel=0.01):
    if not rows:
        return None, None
    final = rows[-1][2]
    for r in rows:
        if r[2] <= final * (1.0 + rel):
            return r[0], final
    return None, final


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


def main(argv=None):
    args = parse_args(argv)
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

    curves, infos = {}, {}
    logreg = run_logreg(X_train, y_train, X_test, y_test)
    print(f"Full-data LogisticRegression (lbfgs, C=1e6{', multinomial' if C > 2 else ''}): test NLL {logreg[0][0]:.4f}, error {logreg[0][1]:.4f}, "
          f"fit {logreg[1]:.1f} s.", flush=True)
    rows, info = run_sgd(X_train, y_train, X_test, y_test, args)
    curves["linear (SGD)"], infos["linear (SGD)"] = rows, info
    print(f"SGD logistic regression{' (one-vs-rest)' if C > 2 else ''}: {info['steps']:,} minibatches ({info['epochs']:.2f} epochs) in "
          f"{info['train_seconds']:.1f} s; last test NLL {rows[-1][2]:.4f}, error {rows[-1][3]:.4f}.", flush=True)
    for method in args.methods:
        label = method.upper()
        rows, info = run_gp(method, X_train, y_train, X_test, y_test, args)
        curves[label], infos[label] = rows, info
        epoch_times = ", ".join(f"{v:.0f}" for v in info["epoch_times"][:6])
        print(f"{label}: {info['steps']:,} steps ({info['epochs']:.2f} epochs) in {info['wall']:.1f} s of fit, "
              f"of which {info['eval_seconds']:.1f} s scoring; fit_time_ {info['fit_time_']:.1f} s; "
              f"history_['time'] at epoch ends: [{epoch_times}]; "
              f"final model test NLL {info['final'][0]:.4f}, error {info['final'][1]:.4f} "
              f"(predict {info['predict_seconds']:.2f} s).", flush=True)

    print("\n### Test NLL and error at training-time checkpoints\n")
    print("Each cell: the last score taken at or before the checkpoint (time = training seconds at that score).\n")
    header(["method", "checkpoint (s)", "time (s)", "step", "epochs", "test NLL", "test error"], "lrrrrrr")
    spe = -(-X_train.shape[0] // 200)
    for label, rows in curves.items():
        if not rows:
            continue
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
    for label in args.methods:
        info = infos[label.upper()]
        row(f"{label.upper()} final model", "–", f"{info['train_seconds']:.1f}", f"{info['steps']:,}",
            f"{info['epochs']:.3f}", f"{info['final'][0]:.4f}", f"{info['final'][1]:.4f}")

    header(["method", "final NLL (last score)", "seconds to within 1%", "training seconds run"], "lrrr",
           "Seconds to reach within 1% of the final test NLL")
    for label, rows in curves.items():
        t, final = time_to_within(rows)
        row(label, fmt(final, ".4f"), fmt(t, ".1f"), fmt(rows[-1][0] if rows else None, ".1f"))

    print("\n### GP against the linear model\n")
    sgd_rows = curves.get("linear (SGD)", [])
    for label in (m.upper() for m in args.methods):
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
    plot(curves, logreg, args.plot, f"Airline delays 2008, {C} classes (m = 200{' per class' if C > 2 else ''}, "
                                     f"minibatch 200)", C)
    print(f"\nPlot: {args.plot}")
    end(started)


if __name__ == "__main__":
    main()
