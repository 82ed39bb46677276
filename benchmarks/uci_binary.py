"""Hernandez-Lobato & Hernandez-Lobato (2016), Table 1 protocol on the UCI binary datasets: every agpc method beside the
published numbers.

Protocol, options and commands: benchmarks/README.md, section "uci_binary.py".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _protocol import (
    ML_SUFFIX, Paper, agpc_model, base_method, finish_grid, mean_se, methods_for_kernel_prior, parse_table_options,
    plot_against_paper, print_accuracy_tables, run_grid, split_indices, split_methods, standardised_splits,
    table_options,
)
from _runner import begin, load_npz

DATASETS = ("banana", "pima", "australian", "breast", "crabs", "heart", "ionosphere", "sonar")
METHODS = ("gfitc", "ep", "sep", "adf", "svi", "vi-jj", "vi-taylor")
BASELINES = ("sklearn-gpc", "logreg")

# Hernandez-Lobato & Hernandez-Lobato (2016) (/work/shared/seeds/000_e1426393d1439e16.txt), Table 1: "Average negative
# test log likelihood for each method and average training time in seconds", 20 splits, columns GFITC, SEP, SVI, each
# (mean, ±) as printed. The m = 25% block is PAPER_M25 of uci_binary_ep.py's first version, moved here.
PAPER_TABLE1 = {
    0.15: {
        "australian": ((0.68, 0.06), (0.69, 0.07), (0.63, 0.05)),
        "breast": ((0.10, 0.05), (0.11, 0.05), (0.10, 0.05)),
        "crabs": ((0.07, 0.07), (0.06, 0.06), (0.07, 0.06)),
        "heart": ((0.43, 0.12), (0.40, 0.13), (0.39, 0.11)),
        "ionosphere": ((0.30, 0.22), (0.26, 0.19), (0.26, 0.14)),
        "pima": ((0.54, 0.08), (0.52, 0.07), (0.49, 0.05)),
        "sonar": ((0.35, 0.13), (0.33, 0.10), (0.40, 0.17)),
    },
    0.25: {
        "australian": ((0.68, 0.08), (0.67, 0.07), (0.63, 0.05)),
        "breast": ((0.11, 0.06), (0.11, 0.05), (0.10, 0.05)),
        "crabs": ((0.06, 0.07), (0.06, 0.06), (0.07, 0.07)),
        "heart": ((0.42, 0.12), (0.41, 0.12), (0.40, 0.11)),
        "ionosphere": ((0.29, 0.23), (0.27, 0.20), (0.27, 0.18)),
        "pima": ((0.53, 0.07), (0.51, 0.06), (0.50, 0.05)),
        "sonar": ((0.35, 0.12), (0.32, 0.10), (0.40, 0.19)),
    },
    0.5: {
        "australian": ((0.67, 0.09), (0.64, 0.05), (0.63, 0.05)),
        "breast": ((0.11, 0.05), (0.11, 0.05), (0.10, 0.05)),
        "crabs": ((0.06, 0.07), (0.06, 0.06), (0.09, 0.06)),
        "heart": ((0.42, 0.13), (0.41, 0.11), (0.40, 0.10)),
        "ionosphere": ((0.30, 0.24), (0.27, 0.19), (0.26, 0.16)),
        "pima": ((0.53, 0.07), (0.50, 0.05), (0.49, 0.05)),
        "sonar": ((0.35, 0.13), (0.29, 0.09), (0.35, 0.16)),
    },
}
PAPER_TIME = {0.15: ((59, 4), (17, 1), (40, 2)), 0.25: ((133, 6), (37, 2), (65, 3)), 0.5: ((494, 29), (130, 5), (195, 10))}
PAPER = Paper(
    name="Hernandez-Lobato & Hernandez-Lobato (2016), Table 1", columns=("GFITC", "SEP", "SVI"), nll=PAPER_TABLE1, time=PAPER_TIME,
    counterpart={"gfitc": 0, "ep": 1, "sep": 1, "adf": 1, "svi": 2, "vi-jj": 2, "vi-taylor": 2},
    pm_is_std=True, splits=20,
)


PRESETS = {"ep-sklearn": dict(datasets="pima,breast,sonar,ionosphere,australian,heart,crabs",
                             methods="ep,sklearn-gpc,logreg", fractions="0.25", m_of="train", inducing="kmeans",
                             kernel_prior="both", title="UCI binary classification, Hernandez-Lobato & "
                             "Hernandez-Lobato (2016), Table 1 protocol (EP against scikit-learn)")}
PRESET_QUICK = {"ep-sklearn": dict(datasets="crabs,heart", max_iter=20, splits=2)}


def parse_args(argv=None):
    p = table_options(__doc__, "crabs (no data folder: generated banana), 1 split, m = 15%, 5 iterations",
                      datasets=DATASETS, methods=METHODS + BASELINES, fractions="0.15,0.25,0.5", splits="90/10")
    p.add_argument("--m-of", choices=("all", "train"), default="all",
                   help="m = fraction of all instances (the paper, default) or of the training rows")
    p.add_argument("--test-fraction", type=float, default=0.10)
    p.add_argument("--title", default="UCI binary classification, Hernandez-Lobato & Hernandez-Lobato (2016), "
                                      "Table 1 protocol")
    p.add_argument("--first-split", type=int, default=0, help="number of the first split (default 0; e.g. 100)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a named set of the options above")
    known = p.parse_known_args(argv)[0]
    if known.preset:  # the preset's settings as defaults, which the options given override
        p.set_defaults(**{**PRESETS[known.preset], **(PRESET_QUICK[known.preset] if known.quick else {})})
    return parse_table_options(p, argv, datasets=DATASETS, methods=METHODS, allowed_methods=METHODS + BASELINES,
                               fractions="0.15,0.25,0.5", quick_fraction="0.15",
                               quick_dataset=lambda a: "crabs" if Path(a.data_dir).is_dir() else "banana")


class _SklearnGPC:
    """scikit-learn's GaussianProcessClassifier (Laplace) with ConstantKernel() * RBF(ones(d)), d set at fit."""

    def fit(self, X, y):
        from sklearn.gaussian_process import GaussianProcessClassifier
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel

        self.model = GaussianProcessClassifier(kernel=ConstantKernel() * RBF(length_scale=np.ones(X.shape[1])))
        self.model.fit(X, y)
        self.classes_ = self.model.classes_
        return self

    def predict_proba(self, X):
        return self.model.predict_proba(X)


def make_model(method, m, split, args):
    if method == "sklearn-gpc":
        return _SklearnGPC()
    if method == "logreg":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=1000)
    return agpc_model(method, m, split, args.max_iter, args.inducing)


def tasks(args):
    """name -> split function, for the datasets found (banana generated when the data folder is absent)."""
    data_dir = Path(args.data_dir)
    found = {}
    for name in args.datasets:
        path = data_dir / f"{name}.npz"
        if path.is_file():
            X, y, _ = load_npz(data_dir, name)
        elif name == "banana" and not data_dir.is_dir():
            from agpc.datasets import make_banana

            n = 400 if args.quick else 5300
            X, y = make_banana(n, random_state=0)
            print(f"banana: data folder absent, using agpc.datasets.make_banana({n}, random_state=0).")
        else:
            print(f"{name}: {path} not found, skipped.")
            continue
        found[name] = standardised_splits(
            X, y, lambda split, n=X.shape[0]: split_indices(n, split, args.test_fraction))
    return found


NEAR_CHANCE = 0.9  # a paper figure above this fraction of the class-prior entropy is "near chance"


def print_prior_check(results, found, fractions, methods):
    """Issue 19's targets per dataset for each method run before (M-ml) and after (M): paired over the splits."""
    pairs = [m for m in methods if m + ML_SUFFIX in methods]
    for fraction in fractions:
        for method in pairs:
            col = PAPER.counterpart.get(base_method(method))
            print(f"\n### Issue 19 check, {method}, m = {fraction:.0%}: test NLL mean ± SE over the splits\n")
            print("| dataset | before (ML) | after (auto) | paper " + PAPER.columns[col] + " ± SE | logreg | "
                  "after <= paper + SE | after - logreg <= SE | after - before <= SE |")
            print("|---|---|---|---|---|---|---|---|")
            for name, split_fn in found.items():
                before, after = (results.get((name, fraction, m)) for m in (method + ML_SUFFIX, method))
                logreg = results.get((name, fraction, "logreg"))
                if not before or not after or len(before.nll) != len(after.nll) or not after.nll:
                    continue
                a, b = np.asarray(after.nll), np.asarray(before.nll)
                cells = [fmt_se(b), fmt_se(a)]
                ref = PAPER.nll.get(fraction, {}).get(name)
                if ref is not None:
                    p_mean, p_pm = ref[col]
                    p_se = PAPER.se(p_pm)
                    y_train = split_fn(0)[1]
                    share = np.bincount(np.searchsorted(np.unique(y_train), y_train)) / len(y_train)
                    chance = float(-np.sum(share * np.log(share)))
                    near = p_mean > NEAR_CHANCE * chance
                    cells.append(f"{p_mean:.2f} ± {p_se:.3f}")
                    verdict = "near chance" if near else yes_no(a.mean() <= p_mean + p_se)
                else:
                    cells.append("")
                    verdict = ""
                if logreg is not None and len(logreg.nll) == len(a):
                    cells.append(fmt_se(np.asarray(logreg.nll)))
                    logreg_check = paired_check(a, np.asarray(logreg.nll))
                else:
                    cells.append("")
                    logreg_check = ""
                print(f"| {name} | " + " | ".join(cells + [verdict, logreg_check, paired_check(a, b)]) + " |")
            print("\nPaired checks: the mean over the splits of (after - other) against the standard error of that "
                  f"difference; near chance: the paper's figure above {NEAR_CHANCE:g} x the class-prior entropy.")


def fmt_se(values):
    mean, se, _ = mean_se(values)
    return f"{mean:.3f} ± {se:.3f}"


def yes_no(ok):
    return "yes" if ok else "**no**"


def paired_check(after, other):
    difference = after - other
    mean, se, _ = mean_se(difference)
    se = 0.0 if not np.isfinite(se) else se
    return f"{yes_no(mean <= se)} ({mean:+.3f}, SE {se:.3f})"


def main(argv=None):
    args = parse_args(argv)
    started = begin(args.title, args, argv, imports=("sklearn.gaussian_process",))
    args.methods = methods_for_kernel_prior(args.methods, args.kernel_prior, skip=BASELINES)
    methods, unavailable = split_methods(args.methods, 2, skip=BASELINES)
    found = tasks(args)
    print(f"\n{args.splits} random {1 - args.test_fraction:.0%}/{args.test_fraction:.0%} splits; features standardised "
          f"on the training part; m = round(fraction * {'n' if args.m_of == 'all' else 'n_train'}); agpc max_iter = "
          f"{args.max_iter}; initial inducing points: {args.inducing}.")

    def count(fraction, n_total, n_train):
        return max(1, min(n_train, int(round(fraction * (n_total if args.m_of == "all" else n_train)))))

    splits = range(args.first_split, args.first_split + args.splits)
    print(f"Splits {splits.start} to {splits.stop - 1}; kernel_prior: {args.kernel_prior}.")
    results = run_grid(found, splits, args.fractions, methods,
                       lambda method, m, split: make_model(method, m, split, args), count)
    print_accuracy_tables(results, list(found), args.fractions, args.methods, unavailable, PAPER, "std", "UCI binary")
    if args.kernel_prior == "both":
        print_prior_check(results, found, args.fractions, methods)
    plot_against_paper(results, list(found), args.fractions, args.methods, PAPER,
                       args.figure or ("uci_binary_nll_quick.png" if args.quick else "uci_binary_nll.png"))
    finish_grid(started, args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
