"""Long runs (issue 39): every method over many epochs, seeds, sizes and settings, each run judged STABLE or
UNSTABLE by stated rules.

Data: the real airline delays (``../shared/data/airline2008.npz``, 8 features): a seeded random 10,000 rows are the
test set (``--split-seed``, fixed across runs), a run's training rows are drawn from the rest with the run's seed;
features standardised on them. Binary: delayed (arrival delay > 0); 3 classes: early (< -5 min), on time, late
(> 5 min), also as ordered classes (``likelihood="ordinal"``); 1:50: all negatives and 2% as many positives.
Multiclass batch runs: waveform (1,000 rows, 3 classes, 21 features). ``--quick``: generated banana and three
classes, a few hundred rows, seconds.

A run is a ``GPClassifier`` fit with the test rows as its validation data (scored after every epoch, or every
tenth of a batch fit's iterations); a ``partial_fit`` stream is scored after each pass. Per run: log Z per epoch, the
failed cavities, the damping, the guard's actions (``history_["guard_*"]``), the test NLL per epoch and the time.

The rules (any one makes the run UNSTABLE; the reasons are printed):
- ``nan``: a log Z or a test NLL that is not finite, or a fit that raised;
- ``jump``: log Z of an epoch more than ten times as far from the epoch before as that one's size (|dZ| > 10
  max(|Z|, 1)), or above +0.05 nats a row after the first epoch (a log marginal likelihood of labels is <= 0);
- ``damping``: a damped method's damping below 0.1 at the end;
- ``nll``: the test NLL at the end worse than after the first epoch by more than 0.01.
The guard's actions are reported beside the verdict: a repaired run can be STABLE, and says so. Two kinds of case
over-fit by what the model does: weights that make a few rows count as many (the 1:50 set with
``class_weight="balanced"``, weights 10^U(-3, 3)) over-fit those rows (docs/weights.md), and on waveform the
kernel's evidence optimum predicts worse than its early iterates (docs/results.md, "Long runs"): the test NLL rises
after the first epoch. Such a case runs as it is, its rising NLL said as that over-fitting (not an instability) when
nothing else is wrong, and beside it with the documented remedy, early stopping on the validation data
(``n_iter_no_change``), judged by every rule.

    PYTHONPATH=. python benchmarks/stability.py                       # the whole grid, 3 seeds
    PYTHONPATH=. python benchmarks/stability.py --runs ep-50k,sep-50k --seeds 0
    PYTHONPATH=. python benchmarks/stability.py --quick
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from _runner import (begin, end, header, load_airline, load_npz, options, parse, parse_list, row, show, standardise,
                     write_json)

from agpc import GPClassifier

GUARD_KEYS = ("guard_rejected", "guard_rebuilds", "guard_halvings", "guard_restored")
JUMP_FACTOR, POSITIVE_PER_ROW, DAMPING_FLOOR, NLL_SLACK = 10.0, 0.05, 0.1, 0.01
N_TEST = 10_000


@dataclass
class Case:
    """One configuration of the grid: the data (``task``: binary, three, ordinal, imbalanced, waveform; ``rows``),
    the estimator's parameters, how it is fitted (``fit``: "fit", "stream"), and its epochs (or iterations)."""

    name: str
    task: str
    rows: int
    params: dict
    epochs: int = 5
    fit: str = "fit"
    weights: str | None = None  # "extreme": log-uniform 1e-3..1e3
    extra: dict = field(default_factory=dict)  # fit(...) keywords besides the data
    # A case whose test NLL rises after the first epoch by what the model does, not by a numerical fault: weights
    # that make a few rows count as many over-fit those rows (docs/weights.md), and on waveform the evidence's
    # optimum predicts worse than its early iterates (docs/results.md, "Long runs"). Early stopping on validation
    # data remedies both. Such a case runs without that remedy beside one with it, and its "nll" is said as this
    # (the string), not as an instability, when nothing else is wrong.
    overfits: str | None = None
    # Batch ADF's log Z in its warm-up sweeps: the factor starts from nothing, and ADF's estimate is first-order
    # sensitive to the factor's distance from its fixed point (docs/methods/adf.md): a jump within those sweeps is
    # said as that; a jump after them is judged as any.
    warmup_not_evidence: bool = False


HEAVY_ROWS = "over-fits its heavy rows: docs/weights.md"
EVIDENCE = "the evidence over-fits: docs/results.md"


def _m(method, m=200, batch=200, **more):
    return dict(method=method, n_inducing=m, batch_size=batch, **more)


GRID = [
    # binary airline, minibatches
    Case("ep-20k", "binary", 20_000, _m("ep")),
    Case("ep-50k", "binary", 50_000, _m("ep")),
    Case("ep-200k", "binary", 200_000, _m("ep"), epochs=3),
    Case("ep-full-airline", "binary", 3_000_000, _m("ep"), epochs=5),  # every training row (2,048,097)
    Case("ep-20k-batch50", "binary", 20_000, _m("ep", batch=50)),
    Case("ep-50k-batch2000", "binary", 50_000, _m("ep", batch=2000), epochs=10),
    Case("ep-50k-m50", "binary", 50_000, _m("ep", m=50)),
    Case("ep-50k-m500", "binary", 50_000, _m("ep", m=500), epochs=3),
    Case("sep-50k", "binary", 50_000, _m("sep")),
    Case("sep-50k-m500", "binary", 50_000, _m("sep", m=500), epochs=3),
    Case("adf-50k", "binary", 50_000, _m("adf")),
    Case("svi-50k", "binary", 50_000, _m("svi")),
    Case("ep-50k-float32", "binary", 50_000, _m("ep", dtype="float32")),
    Case("sep-50k-float32", "binary", 50_000, _m("sep", dtype="float32")),
    Case("ep-50k-njobs2", "binary", 50_000, _m("ep", n_jobs=2)),
    Case("sep-50k-njobs2", "binary", 50_000, _m("sep", n_jobs=2)),
    Case("ep-50k-dask", "binary", 50_000, _m("ep"), extra={"dask": True}),
    Case("sep-stream-50k", "binary", 50_000, dict(method="sep", n_inducing=200), fit="stream"),
    Case("adf-stream-50k", "binary", 50_000, dict(method="adf", n_inducing=200), fit="stream"),
    Case("ep-50k-balanced-1:50", "imbalanced", 50_000, _m("ep", class_weight="balanced"),
         overfits=HEAVY_ROWS),
    Case("ep-50k-balanced-1:50-early-stop", "imbalanced", 50_000,
         _m("ep", class_weight="balanced", n_iter_no_change=2), epochs=10),
    Case("ep-20k-extreme-weights", "binary", 20_000, _m("ep"), weights="extreme", overfits=HEAVY_ROWS),
    Case("ep-20k-extreme-weights-early-stop", "binary", 20_000, _m("ep", n_iter_no_change=2), epochs=10,
         weights="extreme"),
    # the documented remedy for extreme weights in batch mode (docs/weights.md): early stopping on validation data
    Case("ep-batch-5k-extreme-weights", "binary", 5_000,
         dict(method="ep", n_inducing=50, batch_size=None, n_iter_no_change=3), epochs=100, weights="extreme"),
    # three classes: the multiclass model, and ordered classes
    Case("ep-3class-50k", "three", 50_000, _m("ep", m=100)),
    Case("sep-3class-50k", "three", 50_000, _m("sep", m=100)),
    Case("adf-3class-50k", "three", 50_000, _m("adf", m=100)),
    Case("svi-3class-50k", "three", 50_000, _m("svi", m=100)),
    Case("ep-ordinal-50k", "ordinal", 50_000, _m("ep", m=100)),
    # batch methods (iterations instead of epochs)
    Case("ep-batch-5k", "binary", 5_000, dict(method="ep", n_inducing=50, batch_size=None), epochs=100),
    Case("sep-batch-5k", "binary", 5_000, dict(method="sep", n_inducing=50, batch_size=None), epochs=100),
    Case("adf-batch-5k", "binary", 5_000, dict(method="adf", n_inducing=50, batch_size=None), epochs=100),
    Case("gfitc-5k", "binary", 5_000, dict(method="gfitc", n_inducing=50), epochs=50),
    Case("vi-jj-5k", "binary", 5_000, dict(method="vi-jj", n_inducing=50), epochs=50),
    Case("vi-taylor-5k", "binary", 5_000, dict(method="vi-taylor", n_inducing=50), epochs=50),
    *[Case(f"{method}-batch-waveform{tail}", "waveform", 1_000,
           dict(method=method, n_inducing=20, batch_size=None, **more), epochs=100, overfits=overfits,
           warmup_not_evidence=method == "adf")
      for method in ("ep", "sep", "adf")
      for tail, more, overfits in (("", {}, EVIDENCE), ("-early-stop", {"n_iter_no_change": 3}, None))],
]

QUICK = [
    Case("ep-quick", "binary", 600, _m("ep", m=10, batch=50), epochs=3),
    Case("sep-quick", "binary", 600, _m("sep", m=10, batch=50), epochs=3),
    Case("svi-quick", "binary", 600, _m("svi", m=10, batch=50), epochs=3),
    Case("ep-3class-quick", "three", 600, _m("ep", m=8, batch=50), epochs=3),
    Case("sep-stream-quick", "binary", 600, dict(method="sep", n_inducing=10), epochs=2, fit="stream"),
    Case("ep-batch-quick", "binary", 300, dict(method="ep", n_inducing=10, batch_size=None), epochs=20),
]


# -- data ------------------------------------------------------------------------------------------------------

class Data:
    """The rows of each task: the airline split (or, quick, generated rows), a run's training rows by its seed."""

    def __init__(self, data_dir, quick, split_seed):
        self.quick, self.data_dir, self.split_seed = quick, data_dir, split_seed
        self.cache = {}

    def pool(self, task):
        """(X_pool, y_pool, X_test, y_test) of a task, cached."""
        if task in self.cache:
            return self.cache[task]
        if self.quick:
            from agpc.datasets import make_banana

            rng = np.random.default_rng(self.split_seed)
            if task in ("three", "ordinal"):
                X = rng.normal(size=(3000, 2))
                y = np.argmax(np.stack([X[:, 0], X[:, 1] - X[:, 0], np.sin(2 * X[:, 1])], axis=1)
                              + 0.3 * rng.normal(size=(3000, 3)), axis=1)
            else:
                X, y = make_banana(3000, random_state=self.split_seed)
                y = (np.asarray(y) > 0).astype(int)
            out = X[:2000], y[:2000], X[2000:], y[2000:]
        elif task == "waveform":
            X, y, _ = load_npz(self.data_dir, "waveform")
            rng = np.random.default_rng(self.split_seed)
            rows = rng.permutation(len(y))
            out = X[rows[:4000]], y[rows[:4000]], X[rows[4000:]], y[rows[4000:]]
        else:
            classes = 3 if task in ("three", "ordinal") else 2
            X, y, _ = load_airline(str(self.data_dir / "airline2008.npz"), classes, 5.0)
            rng = np.random.default_rng(self.split_seed)
            test = np.zeros(len(y), dtype=bool)
            test[rng.choice(len(y), size=N_TEST, replace=False)] = True
            out = X[~test], y[~test], X[test], y[test]
        self.cache[task] = out
        return out

    def split(self, case, seed):
        X_pool, y_pool, X_test, y_test = self.pool(case.task)
        rng = np.random.default_rng([seed, 7])
        if case.task == "imbalanced":
            rows = _one_in_fifty(y_pool, case.rows, rng)
            test = _one_in_fifty(y_test, len(y_test), np.random.default_rng([self.split_seed, 1]))
            X_test, y_test = X_test[test], y_test[test]  # (scored on the same imbalance)
        else:
            rows = rng.choice(len(y_pool), size=min(case.rows, len(y_pool)), replace=False)
        X_train, X_test = standardise(np.asarray(X_pool[rows], dtype=float), np.asarray(X_test, dtype=float))
        weights = None
        if case.weights == "extreme":
            weights = 10.0 ** rng.uniform(-3.0, 3.0, size=len(rows))
        return X_train, y_pool[rows], X_test, y_test, weights


def _one_in_fifty(y, rows, rng):
    """Up to ``rows`` rows of class 0 and 2% as many of class 1, drawn at random and shuffled."""
    negatives = rng.choice(np.flatnonzero(y == 0), size=min(int(np.sum(y == 0)), rows), replace=False)
    positives = rng.choice(np.flatnonzero(y == 1), size=max(2, len(negatives) // 50), replace=False)
    return rng.permutation(np.r_[negatives, positives])


# -- one run ---------------------------------------------------------------------------------------------------

def fit_run(case, seed, data, client):
    """Fit the case at the seed: (history, the fitted model's test NLL, seconds)."""
    X, y, X_test, y_test, weights = data.split(case, seed)
    params = dict(case.params, random_state=seed)
    if case.task == "ordinal":
        params.update(likelihood="ordinal", classes=[0, 1, 2])
    if case.extra.get("dask"):
        params["client"] = client
    t = time.perf_counter()
    if case.fit == "stream":
        clf = GPClassifier(**params)  # (a stream has no stop of its own)
        classes = np.unique(y)
        chunk = max(1, len(y) // 5)
        log_z, nll = [], []
        for _ in range(case.epochs):
            for lo in range(0, len(y), chunk):
                clf.partial_fit(X[lo:lo + chunk], y[lo:lo + chunk], classes=classes)
            log_z.append(float(clf.log_marginal_likelihood_))
            nll.append(_nll(clf, X_test, y_test))
        history = {"log_marginal_likelihood": log_z, "validation_nll": nll}
        return history, nll[-1], time.perf_counter() - t
    batch = params.get("batch_size", "auto") is None or params.get("method") in ("gfitc", "vi-jj", "vi-taylor")
    params["max_iter"] = case.epochs
    params["plateau"] = None  # (every epoch the case asks for: the long run is what is measured)
    if batch:
        params.setdefault("eval_every", max(1, case.epochs // 10))
    if case.extra.get("dask"):
        import dask.array as da

        X, y = da.from_array(X, chunks=(len(y) // 4, X.shape[1])), da.from_array(y, chunks=len(y) // 4)
    clf = GPClassifier(**params).fit(X, y, sample_weight=weights, validation_data=(X_test, y_test))
    seconds = time.perf_counter() - t
    return dict(clf.history_, n_warmup=clf.n_warmup_), _nll(clf, X_test, y_test), seconds


def _nll(clf, X, y):
    proba = np.asarray(clf.predict_proba(X))
    index = np.searchsorted(clf.classes_, y)
    return float(-np.mean(np.log(np.clip(proba[np.arange(len(y)), index], 1e-300, None))))


def _jumps(log_z, rows):
    """Whether log Z jumps by the ``jump`` rule between these records (the first may be above the per-row cap)."""
    return any(abs(b - a) > JUMP_FACTOR * max(abs(a), 1.0) for a, b in zip(log_z, log_z[1:])) or any(
        v > POSITIVE_PER_ROW * rows for v in log_z[1:])


def verdict(history, final_nll, rows, overfits=None, warmup_not_evidence=False):
    """(STABLE or UNSTABLE, reasons) of a run's history and its fitted model's test NLL by the rules of the module
    docstring (the end is the model the fit returned: an early-stopped fit's best state). ``overfits``,
    ``warmup_not_evidence``: the ``Case``'s."""
    reasons, said = [], []
    log_z = [float(v) for v in history.get("log_marginal_likelihood", [])]
    nll = [float(v) for v in history.get("validation_nll", [])]
    if not log_z or not nll or not all(map(math.isfinite, log_z + nll + [final_nll])):
        reasons.append("nan")
    else:
        warmup = int(history.get("n_warmup", 0))
        if warmup_not_evidence and _jumps(log_z, rows) and not _jumps(log_z[max(warmup - 1, 0):], rows):
            said.append("ADF's warm-up log Z is no evidence: docs/methods/adf.md")  # (its last record on: judged)
        elif _jumps(log_z, rows):
            reasons.append("jump")
        if final_nll > nll[0] + NLL_SLACK:
            reasons.append("nll")
    damping = history.get("damping") or []
    if damping and math.isfinite(damping[-1]) and damping[-1] < DAMPING_FLOOR:
        reasons.append("damping")
    if overfits and reasons == ["nll"]:  # (``Case.overfits``: no instability, the documented over-fitting)
        return "STABLE", said + [overfits]
    return ("UNSTABLE" if reasons else "STABLE"), reasons or said


def main(argv=None):
    p = options(__doc__, "6 cases of a few hundred generated rows, 3 seeds", data_dir=True, seeds="0,1,2",
                out="stability")
    p.add_argument("--runs", default=None, help="comma-separated case names (default: the whole grid)")
    p.add_argument("--split-seed", type=int, default=0, help="seeds the test rows (default 0)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs (a batch case's iterations, a stream's passes) of every case run (default: each "
                        "case's own); a longer run than the grid's is a stronger check")
    args = parse(p, argv)
    grid = QUICK if args.quick else GRID
    if args.runs:
        names = parse_list(args.runs, allowed=[c.name for c in grid], kind="run")
        grid = [c for c in grid if c.name in names]
    if args.epochs is not None:
        if args.epochs < 1:
            p.error(f"--epochs must be at least 1, not {args.epochs}")
        grid = [replace(c, epochs=args.epochs) for c in grid]
    run = begin("Long runs: every method over epochs, seeds and sizes", args, argv)
    print("Rules: UNSTABLE on a non-finite log Z or NLL (nan); log Z moving more than 10x its size between epochs or "
          "above +0.05 nats a row after the first (jump); damping below 0.1 at the end (damping); the final test "
          "NLL worse than the first epoch's by more than 0.01 (nll).\n", flush=True)
    data = Data(Path(args.data_dir), args.quick, args.split_seed)
    client = None
    if any(case.extra.get("dask") for case in grid):
        from distributed import Client, LocalCluster

        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None))
    results, stable = [], 0
    header(["run", "seed", "verdict", "s", "log Z first -> last", "damping end", "invalid", "guard (rej/rebuild/"
            "halve/restore)", "test NLL first -> best -> model"], "lrlrrrrrr")
    try:
        for case in grid:
            for seed in args.seeds:
                rows = case.rows if not args.quick else min(case.rows, 2000)
                try:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        history, final_nll, seconds = fit_run(case, seed, data, client)
                    said = sorted({type(w.message).__name__ for w in caught})
                except (FloatingPointError, np.linalg.LinAlgError, ValueError) as exc:
                    history, final_nll, seconds = {}, float("nan"), float("nan")
                    said = [f"{type(exc).__name__}: {exc}"[:120]]
                kind, reasons = verdict(history, final_nll, rows, case.overfits, case.warmup_not_evidence)
                stable += kind == "STABLE"
                log_z, nll = history.get("log_marginal_likelihood", []), history.get("validation_nll", [])
                damping = history.get("damping") or [float("nan")]
                guard = [int(sum(history.get(k, []))) for k in GUARD_KEYS]
                row(case.name, seed, kind + (f" ({', '.join(reasons)})" if reasons else ""), show(seconds, ".0f"),
                    f"{show(log_z[0], '.6g')} -> {show(log_z[-1], '.6g')}" if log_z else "-",
                    show(damping[-1], ".3g"), int(sum(history.get("n_invalid_sites", []))), "/".join(map(str, guard)),
                    f"{show(nll[0], '.4f')} -> {show(min(nll), '.4f')} -> {show(final_nll, '.4f')}" if nll else "-")
                results.append({"run": case.name, "seed": seed, "verdict": kind, "reasons": reasons,
                                "seconds": seconds, "warnings": said, "test_nll": final_nll,
                                "n_warmup": history.get("n_warmup", 0),
                                "history": {k: [float(v) for v in vals] for k, vals in history.items()
                                            if k != "n_warmup"}})
    finally:
        if client is not None:
            client.close()
    print(f"\n{stable} of {len(results)} runs STABLE.")
    write_json(args.out, {"results": results})
    end(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
