"""The study behind ``GPClassifier(n_inducing="auto")`` (``agpc.size_rule``, docs/small_data_defaults.md): models of
several sizes, nothing else set, against logistic regression, on random 90/10 splits.

Candidates (``--candidates``): ``auto`` -- ``GPClassifier(random_state=split)``, nothing set (the default, whatever
it is in this agpc); ``all`` -- ``n_inducing="all"``, the exact model (an inducing point at every row, held there);
``mK`` -- ``n_inducing=K`` learned with the kernel (``m100``: the default before the rule); ``mK-fixed`` -- K inducing
points held at their k-means start (``optimize="kernel"``); ``logreg`` -- scikit-learn's LogisticRegression at its
defaults; a suffix ``-es`` (``all-es``): early stopping on 20% of the training rows held out (``HeldOutStopping``);
``auto`` with modifiers (``auto-ls0.5``, ``auto-amp1``, ``auto-init2``, combined as ``auto-ls1-amp1``): the default
with its kernel's weak priors or start changed (``KernelVariant``: ``-lsS`` the sd of the log-lengthscale prior, ``-ampS``
that of the log-amplitude prior, ``-initF`` the initial lengthscales and the prior's centre F times the default's),
given as the user's own kernel and priors; ``auto-ls1.7320508075688772`` is the default itself; ``auto-per-feature``
and ``auto-shared``: the default with ``ard=True`` (lengthscales per feature, the default before ``ard="auto"``) and
``ard=False`` (one shared scale); ``auto-rbf``: the default without its last two stages, the linear and the
quadratic kernel (``agpc.size_rule.linear_start`` answering None for the fit: the default before those stages);
``auto-linear``: the default without its last stage, the quadratic kernel (``quadratic_start`` answering None);
``all-shared`` and ``all-linear``: the exact model with one kernel, learned with one shared scale (``ard=False``):
the default RBF, or a linear kernel started as ``ard="auto"`` starts it (slope variances 1 / d on standardised
features, bias 1); a suffix ``-noprior`` (``all-shared-noprior``) fits them without the default weak priors
(``kernel_prior=None``). Every agpc fit's log Z is recorded beside its test NLL (in the JSON, and as a paired
difference to the reference's in the first table), so that what the evidence prefers can be set beside what predicts.
Every fit is timed: seconds of ``fit`` on the wall clock, and the CPU seconds of the process for the fit and its
scoring, which at one BLAS thread (``--blas-threads 1``, ``taskset -c 0``) is what a quiet core's wall clock shows
while other processes load the machine.

Sets (``--sets``): ``study`` -- the sets of ``small_data_defaults.py`` (generated, bundled, the multiclass sets of
../shared/data), which choose the rule; ``test`` -- the seven of Hernandez-Lobato & Hernandez-Lobato (2016) Table 1
(pima, australian, breast, crabs, heart, ionosphere, sonar), which check it; or a comma list of names of either.
Per set and candidate: test NLL mean ± SE over the splits, the paired difference to the reference candidate
(``--reference``, default logreg) ± its SE, and the median fit time. On the test sets also the paper's SEP
figure ± SE (Table 1, m = 25%) and whether the two targets of issue 29 hold for each candidate.

    PYTHONPATH=. taskset -c 0 python benchmarks/size_rule.py --sets test --candidates auto,logreg --blas-threads 1
    PYTHONPATH=. taskset -c 0 python benchmarks/size_rule.py --sets test --candidates auto,logreg --first-split 100 \\
        --blas-threads 1
    PYTHONPATH=. python benchmarks/size_rule.py --sets study --candidates all,m100,m100-fixed,logreg --splits 5
    PYTHONPATH=. python benchmarks/size_rule.py --quick
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import small_data_defaults as study
import uci_binary
from _protocol import finish_grid, mean_se, run_grid, split_indices, standardised_splits
from _runner import begin, header, load_npz, options, parse, parse_list, row

TEST_SETS = study.TEST_SETS
CANDIDATE = re.compile(r"^(auto|all|logreg|m(\d+)(-fixed)?)(-es)?$")
LENGTHSCALES = re.compile(r"^auto-(per-feature|shared|rbf|linear)$")  # ard=True / False / no linear, quadratic stage
EXACT = re.compile(r"^all-(shared|linear)(-noprior)?$")  # the exact model, one kernel with one shared scale
VARIANT = re.compile(r"^auto((?:-(?:ls|amp|init)\d+(?:\.\d+)?)+)$")
MODIFIER = re.compile(r"-(ls|amp|init)(\d+(?:\.\d+)?)")
HELD_OUT = 0.2  # "-es": the share of the training rows held out to stop on
PATIENCE = 20  # "-es": n_iter_no_change


class Wrapped:
    """A candidate that fits an agpc estimator its own way (``fit``) and scores as it: ``classes_``,
    ``predict_proba`` and the log Z the tables show (``_protocol.fitted_log_z``) are the fitted ``model``'s."""

    @property
    def classes_(self):
        return self.model.classes_

    @property
    def log_marginal_likelihood_(self):
        return self.model.log_marginal_likelihood_

    def predict_proba(self, X):
        return self.model.predict_proba(X)


class HeldOutStopping(Wrapped):
    """``-es`` candidates: the estimator fitted on 80% of the training rows, scored every iteration on the other
    20% (drawn at random, seeded by the split), stopped after ``PATIENCE`` iterations without a better held-out NLL
    and kept at its best (``fit(validation_data=...)``, ``n_iter_no_change``)."""

    def __init__(self, model, seed):
        self.model, self.seed = model, seed

    def fit(self, X, y):
        order = np.random.default_rng(self.seed).permutation(len(y))
        held = order[:int(round(HELD_OUT * len(y)))]
        kept = order[len(held):]
        self.model.set_params(n_iter_no_change=PATIENCE)
        self.model.fit(X[kept], y[kept], validation_data=(X[held], y[held]))
        return self

    @property
    def log_marginal_likelihood_(self):
        return None  # the evidence of 80% of the rows: not comparable with a model's of all of them


class WithoutStages(Wrapped):
    """``auto-rbf``, ``auto-linear``: the default estimator fitted with some of ``ard="auto"``'s last stages off
    (their starts, ``agpc.size_rule``'s functions named ``starts``, answering None, as for a kernel other than the
    default RBF), so that the default before those stages is measured beside it."""

    def __init__(self, model, starts):
        self.model, self.starts = model, starts

    def fit(self, X, y):
        from contextlib import ExitStack
        from unittest import mock

        from agpc import size_rule as rule

        with ExitStack() as stack:
            for name in self.starts:
                stack.enter_context(mock.patch.object(rule, name, lambda kernel: None))
            self.model.fit(X, y)
        return self


class LinearStart(Wrapped):
    """``all-linear``: the estimator given ``agpc.Linear`` with slope variances 1 / d and a bias of 1, the start
    ``agpc.size_rule.linear_start`` takes from the default RBF on standardised features (lengthscales sqrt(d))."""

    def __init__(self, model):
        self.model = model

    def fit(self, X, y):
        import agpc

        self.model.set_params(kernel=agpc.Linear(variances=1.0 / X.shape[1], bias=1.0))
        self.model.fit(X, y)
        return self


class KernelVariant(Wrapped):
    """``auto-...`` candidates: ``GPClassifier(kernel=...)`` with the default kernel of the training rows
    (``agpc.inputs.default_kernel``: RBF, lengthscales sqrt(d) times each feature's SD, amplitude 1, latent noise
    1e-3), its lengthscales times ``init``, and the default priors' form as the user's own: log l_j ~ Normal(log of
    the initial l_j, ``ls_sd``), log amplitude ~ Normal(0, ``amp_sd``) (``agpc.kernels.with_default_priors``)."""

    def __init__(self, options, ls_sd, amp_sd, init):
        self.options, self.ls_sd, self.amp_sd, self.init = options, ls_sd, amp_sd, init

    def fit(self, X, y):
        import agpc
        from agpc.inputs import default_kernel
        from agpc.priors import LogNormal

        log_lengthscales = np.log(self.init) + np.asarray(default_kernel(X).params["log_lengthscales"]).reshape(-1)
        priors = {"lengthscales": LogNormal([float(v) for v in log_lengthscales], self.ls_sd),
                  "amplitude": LogNormal(0.0, self.amp_sd)}
        kernel = agpc.RBF(lengthscales=list(np.exp(log_lengthscales)), amplitude=1.0, noise=1e-3, priors=priors)
        self.model = agpc.GPClassifier(kernel=kernel, **self.options).fit(X, y)
        return self


def parse_args(argv=None):
    p = options(__doc__, "moons-300, 1 split, auto and logreg, 5 iterations", data_dir=True)
    p.add_argument("--sets", default=None, help="'study', 'test' or a comma list of set names (default test)")
    p.add_argument("--candidates", default=None, help="comma list: auto, all, mK, mK-fixed, logreg (default auto,logreg)")
    p.add_argument("--reference", default="logreg", help="the candidate the paired differences are taken to")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits (default 20)")
    p.add_argument("--first-split", type=int, default=0, help="number of the first split (default 0; e.g. 100)")
    p.add_argument("--max-iter", type=int, default=None, help="agpc max_iter (default: the library's; quick 5)")
    p.add_argument("--json", default=None, help="also write the per-split results to this JSON file")
    args = parse(p, argv, full=dict(sets="test", candidates="auto,logreg", splits=20),
                 quick=dict(sets="moons-300", candidates="auto,logreg", splits=1, max_iter=5, blas_threads=1))
    named = {"study": list(study.DATASETS), "test": list(TEST_SETS)}
    args.sets = named.get(args.sets) or parse_list(args.sets, study.DATASETS + TEST_SETS, "set")
    args.candidates = parse_list(args.candidates)
    bad = [c for c in args.candidates
           if not (CANDIDATE.match(c) or VARIANT.match(c) or LENGTHSCALES.match(c) or EXACT.match(c))]
    if bad:
        raise SystemExit(f"unknown candidates {bad}: use auto, all, mK, mK-fixed, logreg, auto-lsS-ampS-initF, "
                         "auto-per-feature, auto-shared, auto-rbf, auto-linear, all-shared, all-linear (-noprior)")
    return args


def make_model(candidate, split, max_iter):
    """A fresh estimator for ``candidate`` (see the module docstring)."""
    if candidate == "logreg":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=1000)
    import agpc

    options = {"random_state": split}
    if max_iter is not None:
        options["max_iter"] = max_iter
    exact = EXACT.match(candidate)
    if exact:
        options.update(n_inducing="all", ard=False, kernel_prior=None if exact.group(2) else "auto")
        return (agpc.GPClassifier(**options) if exact.group(1) == "shared"
                else LinearStart(agpc.GPClassifier(**options)))
    lengthscales = LENGTHSCALES.match(candidate)
    if lengthscales and lengthscales.group(1) == "rbf":
        return WithoutStages(agpc.GPClassifier(**options), ("linear_start", "quadratic_start"))
    if lengthscales and lengthscales.group(1) == "linear":
        return WithoutStages(agpc.GPClassifier(**options), ("quadratic_start",))
    if lengthscales:
        return agpc.GPClassifier(ard=lengthscales.group(1) == "per-feature", **options)
    variant = VARIANT.match(candidate)
    if variant:
        given = {name: float(value) for name, value in MODIFIER.findall(variant.group(1))}
        return KernelVariant(options, given.get("ls", math.sqrt(3.0)), given.get("amp", math.sqrt(3.0)),
                             given.get("init", 1.0))
    match = CANDIDATE.match(candidate)
    if match.group(4):
        return HeldOutStopping(make_model(candidate[:-3], split, max_iter), split)
    if match.group(1) == "all":
        options["n_inducing"] = "all"
    elif match.group(2):
        options["n_inducing"] = int(match.group(2))
        if match.group(3):
            options["optimize"] = "kernel"
    return agpc.GPClassifier(**options)


def load(name, data_dir):
    if name in TEST_SETS:
        return load_npz(data_dir, name)[:2] if (Path(data_dir) / f"{name}.npz").is_file() else None
    return study.load(name, data_dir)


def print_table(results, found, candidates, reference, test_sets):
    header(["set", "n_train", "d", "classes", "candidate", "test NLL", f"- {reference}", f"log Z - {reference}'s",
            "median fit s", "median CPU s", "errors"], "lrrrllllrrr", "Test NLL (mean ± SE over the splits), paired "
           f"difference to {reference} (± SE of the paired difference), the same of log Z with the splits where it is "
           "above, median fit seconds")
    for name, (d, n_classes) in found.items():
        ref = results.get((name, 0.0, reference))
        for candidate in candidates:
            rec = results.get((name, 0.0, candidate))
            if rec is None or not rec.nll:
                continue
            mean, se, _ = mean_se(rec.nll)
            cell = evidence = ""
            if ref is not None and candidate != reference and len(ref.nll) == len(rec.nll):
                diff, diff_se, _ = mean_se(np.asarray(rec.nll) - np.asarray(ref.nll))
                cell = f"{diff:+.3f} ± {diff_se:.3f}"
                if None not in rec.log_z + ref.log_z:
                    above = np.asarray(rec.log_z) - np.asarray(ref.log_z)
                    diff, diff_se, _ = mean_se(above)
                    evidence = f"{diff:+.2f} ± {diff_se:.2f} ({int(np.sum(above > 0))}/{len(above)})"
            row(name, rec.n_train, d, n_classes, candidate, f"{mean:.3f} ± {se:.3f}", cell, evidence,
                f"{np.median(rec.time):.2f}", f"{np.median(rec.cpu):.2f}", len(rec.failures))
    checks = [n for n in found if n in test_sets]
    if not checks:
        return
    paper = uci_binary.PAPER_TABLE1[0.25]
    header(["set", "candidate", "test NLL", "paper SEP ± SE", "<= paper + SE", f"- {reference}", "<= SE", "median fit s",
            "median CPU s"], "lllllllrr", "Issue 29's targets on the test sets: test NLL <= paper SEP + SE (Table 1, "
           f"m = 25%, ± / sqrt(20)), and - {reference} <= one SE of the paired difference")
    for name in checks:
        ref = results.get((name, 0.0, reference))
        p_mean, p_pm = paper[name][1]
        p_se = p_pm / np.sqrt(20)
        y_train = found_labels[name]
        share = np.bincount(np.searchsorted(np.unique(y_train), y_train)) / len(y_train)
        near_chance = p_mean > uci_binary.NEAR_CHANCE * float(-np.sum(share * np.log(share)))
        for candidate in candidates:
            rec = results.get((name, 0.0, candidate))
            if candidate == reference or rec is None or not rec.nll or ref is None or len(ref.nll) != len(rec.nll):
                continue
            mean, se, _ = mean_se(rec.nll)
            diff, diff_se, _ = mean_se(np.asarray(rec.nll) - np.asarray(ref.nll))
            paper_ok = "near chance" if near_chance else ("yes" if mean <= p_mean + p_se else "**no**")
            row(name, candidate, f"{mean:.3f} ± {se:.3f}", f"{p_mean:.2f} ± {p_se:.3f}", paper_ok,
                f"{diff:+.3f} ± {diff_se:.3f}", "yes" if diff <= diff_se else "**no**", f"{np.median(rec.time):.2f}",
                f"{np.median(rec.cpu):.2f}")


found_labels = {}


def main(argv=None):
    args = parse_args(argv)
    started = begin("Model size by the data: n_inducing candidates, nothing else set, against logistic regression",
                    args, argv)
    tasks, found = {}, {}
    for name in args.sets:
        data = load(name, args.data_dir)
        if data is None:
            print(f"{name}: not found under {args.data_dir}, skipped.")
            continue
        X, y = np.asarray(data[0], dtype=np.float64), np.asarray(data[1])
        tasks[name] = standardised_splits(X, y, lambda split, n=X.shape[0]: split_indices(n, split, 0.1))
        found[name] = (X.shape[1], len(np.unique(y)))
        found_labels[name] = y
    splits = range(args.first_split, args.first_split + args.splits)
    print(f"\nSplits {splits.start} to {splits.stop - 1}, random 90/10, features standardised on the training part; "
          f"candidates {', '.join(args.candidates)}; agpc max_iter {args.max_iter or 'the default'}.")
    results = run_grid(tasks, splits, [0.0], args.candidates,
                       lambda candidate, m, split: make_model(candidate, split, args.max_iter), lambda *_: 0)
    print_table(results, found, args.candidates, args.reference, TEST_SETS)
    finish_grid(started, args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
