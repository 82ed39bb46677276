"""Airline delays (seed 000 sec. 4.6, Fig. 4 bottom): test NLL and error against training time.

Data: ``../shared/data/airline2008.npz`` (X float32, 2,058,097 x 8; label = arr_delay > 0). A seeded random
10,000 rows are the test set, the rest the training set; features are standardised with the training part's
mean and standard deviation. Methods, minibatches of 200 rows, m = 200 inducing points:

* ``GPClassifier(method="sep", n_inducing=200, batch_size=200)`` (Adadelta steps, damping 0.99: the defaults);
* ``GPClassifier(method="ep", n_inducing=200, batch_size=200)`` (minibatch EP: 2 floats per row, its
  factor rebuilt exactly once an epoch);
* linear logistic regression: scikit-learn ``SGDClassifier(loss="log_loss", average=True)`` (averaged SGD:
  lower test NLL than plain SGD at every minibatch count we tried) fed the same minibatch size
  with ``partial_fit`` (default "optimal" learning-rate schedule, alpha 1e-4), and as a reference line the
  converged full-data ``LogisticRegression`` (lbfgs, no penalty to speak of: C = 1e6).

Time axis: wall-clock seconds from the call of ``fit`` (so set-up, k-means initialisation and the row shuffle
count) with the time spent scoring the test set removed. The GP runs use
``fit(X, y, validation_data=(X_test, y_test), eval_every=K, max_time=budget)``; ``history_`` records the
validation step but times only once per epoch (9,000+ steps), so this script wraps
``agpc.inference.training._validation_scores`` to note, at each scoring, the clock and the scoring's own
duration (the scores themselves are the library's, unchanged). Scores are taken at roughly log-spaced
step counts. For minibatch EP a mid-epoch score uses the running site product (what training itself uses);
the fitted model's final posterior is rebuilt exactly from all sites, and its test scores are reported
separately ("final model").

    PYTHONPATH=. python benchmarks/airline.py                # about 20 minutes
    PYTHONPATH=. python benchmarks/airline.py --quick        # 20,000 training rows, a few seconds a method
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import DEFAULT_DATA_DIR, load_line, print_machine  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHECKPOINTS = (1, 3, 10, 30, 100, 300, 1000)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: 20,000 training rows, 2,000 test rows, 6 s a method")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR / "airline2008.npz"), help="path of airline2008.npz")
    p.add_argument("--budget", type=float, default=None,
                   help="max_time (s) of each GP fit (default 480; quick: 6)")
    p.add_argument("--linear-budget", type=float, default=None,
                   help="training seconds for the SGD logistic regression (default 90; quick: 3)")
    p.add_argument("--n-test", type=int, default=None, help="test rows (default 10000; quick: 2000)")
    p.add_argument("--n-train", type=int, default=None, help="use only this many training rows (default all; quick: 20000)")
    p.add_argument("--methods", default="sep,ep", help="GP methods to run (default sep,ep)")
    p.add_argument("--seed", type=int, default=0, help="seeds the split, the shuffles and the inducing points")
    p.add_argument("--plot", default=None, help="PNG path (default benchmarks/results/airline.png; quick: airline_quick.png)")
    p.add_argument("--blas-threads", type=int, default=None, help="limit BLAS threads with threadpoolctl")
    args = p.parse_args(argv)
    q = args.quick
    args.budget = args.budget if args.budget is not None else (6.0 if q else 480.0)
    args.linear_budget = args.linear_budget if args.linear_budget is not None else (3.0 if q else 90.0)
    args.n_test = args.n_test if args.n_test is not None else (2000 if q else 10000)
    args.n_train = args.n_train if args.n_train is not None else (20000 if q else None)
    args.plot = args.plot or str(RESULTS_DIR / ("airline_quick.png" if q else "airline.png"))
    args.methods = [m for m in args.methods.split(",") if m]
    return args


# -- data ------------------------------------------------------------------------------------------

def load_split(args):
    path = Path(args.data)
    if not path.exists():
        print(f"Data file {path} not found: this benchmark needs ../shared/data/airline2008.npz; skipping.")
        sys.exit(0)
    with np.load(path, allow_pickle=False) as f:
        X = np.asarray(f["X"], dtype=np.float64)
        y = (np.asarray(f["arr_delay"]) > 0).astype(np.int8)
        names = [str(v) for v in f["feature_names"]] if "feature_names" in f.files else None
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
    X_train = (X_train - mean) / std
    X_test = (X_test - mean) / std
    return X_train, y_train, X_test, y_test, n, names


def scores_from_proba(p_pos, y):
    """Mean negative log-likelihood and error of P(y = 1) against labels in {0, 1}."""
    p = np.clip(p_pos, 1e-300, 1.0)
    q = np.clip(1.0 - p_pos, 1e-300, 1.0)
    nll = -np.mean(np.where(y == 1, np.log(p), np.log(q)))
    err = np.mean((p_pos > 0.5) != (y == 1))
    return float(nll), float(err)


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
    """Wraps training._validation_scores: scores only at scheduled steps, notes clock and scoring time."""

    def __init__(self, training_module, steps, every):
        self.training = training_module
        self.original = training_module._validation_scores
        self.steps = set(steps)
        self.every = every
        self.reset(None)

    def reset(self, t_start):
        self.t_start = t_start
        self.eval_seconds = 0.0
        self.rows = []  # (train seconds, step, nll, error)

    def __enter__(self):
        original, rec = self.original, self

        def wrapped(trainer, X, y, validation):
            t = time.perf_counter()
            step = trainer.n_steps
            if step not in rec.steps and step % rec.every != 0:
                rec.eval_seconds += time.perf_counter() - t
                return float("inf"), float("nan")
            nll, err = original(trainer, X, y, validation)
            rec.rows.append((t - rec.t_start - rec.eval_seconds, step, nll, err))
            rec.eval_seconds += time.perf_counter() - t
            return nll, err

        self.training._validation_scores = wrapped
        return self

    def __exit__(self, *exc):
        self.training._validation_scores = self.original


# -- runs ------------------------------------------------------------------------------------------

def run_gp(method, X_train, y_train, X_test, y_test, args):
    from agpc import GPClassifier
    from agpc.inference import training

    if not hasattr(training, "_validation_scores"):
        raise SystemExit("agpc.inference.training._validation_scores is gone: update benchmarks/airline.py")
    steps_per_epoch = -(-X_train.shape[0] // 200)
    early, late = schedule(steps_per_epoch, args.quick)
    clf = GPClassifier(method=method, n_inducing=200, batch_size=200, max_iter=10_000, max_time=args.budget,
                       eval_every=1, random_state=args.seed)
    with Recorder(training, early, late) as rec:
        rec.reset(time.perf_counter())
        t0 = time.perf_counter()
        clf.fit(X_train, y_train, validation_data=(X_test, y_test))
        wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    proba = clf.predict_proba(X_test)[:, list(clf.classes_).index(1)]
    predict_seconds = time.perf_counter() - t1
    final = scores_from_proba(proba, y_test)
    steps = clf.history_.get("validation_step", [])
    info = {
        "wall": wall,
        "train_seconds": wall - rec.eval_seconds,
        "eval_seconds": rec.eval_seconds,
        "fit_time_": clf.fit_time_,
        "steps": int(steps[-1]) if steps else 0,
        "epochs": (int(steps[-1]) if steps else 0) / steps_per_epoch,
        "final": final,
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
    clf = SGDClassifier(loss="log_loss", average=True, random_state=args.seed)
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
            clf.partial_fit(Xs[lo:lo + 200], ys[lo:lo + 200], classes=np.array([0, 1]))
            step += 1
            t = time.perf_counter()
            trained = t - t_start - eval_seconds
            if step in early or step % late == 0:
                p = clf.predict_proba(X_test)[:, 1]
                nll, err = scores_from_proba(p, y_test)
                rows.append((trained, step, nll, err))
            eval_seconds += time.perf_counter() - t
            if trained >= args.linear_budget:
                if not rows or rows[-1][1] != step:  # score the last state too
                    p = clf.predict_proba(X_test)[:, 1]
                    rows.append((trained, step, *scores_from_proba(p, y_test)))
                done = True
                break
    return rows, {"train_seconds": time.perf_counter() - t_start - eval_seconds, "steps": step,
                  "epochs": step / steps_per_epoch}


def run_logreg(X_train, y_train, X_test, y_test):
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    clf = LogisticRegression(C=1e6, max_iter=1000).fit(X_train, y_train)
    seconds = time.perf_counter() - t0
    return scores_from_proba(clf.predict_proba(X_test)[:, 1], y_test), seconds


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


def fmt(v, spec):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def plot(curves, logreg, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"SEP": "tab:red", "EP": "tab:blue", "linear (SGD)": "tab:gray"}
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
    # SGD's first minibatches give NLLs of 10 and more: show the range the GP curves and the linear line span
    gp = [r for label, rows in curves.items() if label != "linear (SGD)" for r in rows]
    ref = [r for rows in curves.values() for r in rows]
    if gp:
        lo_n = min(r[2] for r in ref)
        hi_n = max([r[2] for r in gp] + ([logreg[0][0]] if logreg else []))
        axes[0].set_ylim(lo_n - 0.01, min(hi_n + 0.03, 0.8))
        lo_e = min(r[3] for r in ref)
        hi_e = max([r[3] for r in gp] + ([logreg[0][1]] if logreg else []))
        axes[1].set_ylim(lo_e - 0.01, min(hi_e + 0.03, 0.55))
    for ax, name in zip(axes, ("test NLL", "test error")):
        ax.set_xscale("log")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Airline delays 2008 (m = 200, minibatch 200)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    limiter = None
    if args.blas_threads is not None:
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(args.blas_threads, user_api="blas")
    print_machine("Airline delays: test NLL / error against training time (seed 000 Fig. 4 bottom)", argv)
    t0 = time.perf_counter()
    X_train, y_train, X_test, y_test, n_all, names = load_split(args)
    print(f"Data: {args.data}: {n_all:,} rows; training {X_train.shape[0]:,}, test {X_test.shape[0]:,} "
          f"(seed {args.seed}); positive (delayed) rate train {y_train.mean():.4f}, test {y_test.mean():.4f}; "
          f"loaded and standardised in {time.perf_counter() - t0:.1f} s.")
    if names:
        print(f"Features: {', '.join(names)}.")
    print(f"Budgets: GP max_time {args.budget:g} s each; SGD {args.linear_budget:g} s. "
          f"Steps per epoch: {-(-X_train.shape[0] // 200):,}.\n", flush=True)

    curves, infos = {}, {}
    logreg = run_logreg(X_train, y_train, X_test, y_test)
    print(f"Full-data LogisticRegression (lbfgs, C=1e6): test NLL {logreg[0][0]:.4f}, error {logreg[0][1]:.4f}, "
          f"fit {logreg[1]:.1f} s.", flush=True)
    rows, info = run_sgd(X_train, y_train, X_test, y_test, args)
    curves["linear (SGD)"], infos["linear (SGD)"] = rows, info
    print(f"SGD logistic regression: {info['steps']:,} minibatches ({info['epochs']:.2f} epochs) in "
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
    print("| method | checkpoint (s) | time (s) | step | epochs | test NLL | test error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
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
            print(f"| {label} | {cname} | {r[0]:.1f} | {r[1]:,} | {r[1] / spe:.3f} | {r[2]:.4f} | {r[3]:.4f} |")
    (lr_nll, lr_err), lr_seconds = logreg
    print(f"| LogisticRegression (full data, lbfgs) | – | {lr_seconds:.1f} | – | – | {lr_nll:.4f} | {lr_err:.4f} |")
    for label in args.methods:
        info = infos[label.upper()]
        print(f"| {label.upper()} final model (exact posterior) | – | {info['train_seconds']:.1f} | {info['steps']:,} | "
              f"{info['epochs']:.3f} | {info['final'][0]:.4f} | {info['final'][1]:.4f} |")

    print("\n### Seconds to reach within 1% of the final test NLL\n")
    print("| method | final NLL (last score) | seconds to within 1% | training seconds run |")
    print("|---|---:|---:|---:|")
    for label, rows in curves.items():
        t, final = time_to_within(rows)
        print(f"| {label} | {fmt(final, '.4f')} | {fmt(t, '.1f')} | {fmt(rows[-1][0] if rows else None, '.1f')} |")

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
    plot(curves, logreg, args.plot)
    print(f"\nPlot: {args.plot}")
    print(f"Total run {time.perf_counter() - t0:.0f} s. {load_line()}")
    if limiter is not None:
        limiter.unregister() if hasattr(limiter, "unregister") else None


if __name__ == "__main__":
    main()
