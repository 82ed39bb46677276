"""The study behind GPClassifier's default priors (``kernel_prior="auto"``, docs/small_data_defaults.md): test NLL
before (``kernel_prior=None``, type-II maximum likelihood) and after (the default priors) on small data sets that
are NOT the seven of Hernandez-Lobato & Hernandez-Lobato (2016) Table 1 (pima, australian, breast, crabs, heart,
ionosphere, sonar): those are kept for the check that follows the choice (``uci_binary.py --preset ep-sklearn``), never for the
choice itself (issue 19).

Sets (30): generated -- banana (400 rows, ``agpc.datasets.make_banana``), clf-300x10, clf-1000x30, clf-700x8 and
clf-700x14 (``sklearn.datasets.make_classification``; the last two added for the model's size, ``size_rule.py``),
moons-300, circles-300; scikit-learn's bundled digits 3 v 8 and
1 v 7, iris, wine; the multiclass sets of ``../shared/data`` -- glass, newthyroid, svmguide2, vehicle, vowel and
1000-row samples of waveform and satellite (a set whose file is absent is skipped with a note); and 12 two-class
tables of about 300 rows cut from them and from scikit-learn's breast cancer (``BINARY_CUTS``, ``binary_cut``).

Protocol: random 90/10 splits (split s: ``numpy.random.default_rng(s)``), features standardised on the training
part, m = max(4, round(``--fraction`` x n_train)) at most ``--max-m`` (per class for multiclass), k-means
initial inducing points, ``GPClassifier(method=M, n_inducing=m, max_iter=--max-iter, random_state=split)`` at
library defaults otherwise, "M-ml" the same with ``kernel_prior=None``. Per set and method: mean test NLL ± SE
before and after, the paired difference (after - before) ± its SE over the splits, and "better" / "worse" when
that difference is beyond one SE. The summary counts them per method.

    PYTHONPATH=. python benchmarks/small_data_defaults.py --blas-threads 1                       # EP, 16 sets
    PYTHONPATH=. python benchmarks/small_data_defaults.py --methods sep,svi --splits 5
    PYTHONPATH=. python benchmarks/small_data_defaults.py --quick                                # smoke test
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _protocol import (
    ML_SUFFIX, agpc_model, finish_grid, mean_se, run_grid, split_indices, split_methods, standardised_splits,
    with_ml_twins,
)
from _runner import begin, header, load_npz, options, parse, parse_list, row

GENERATED = ("banana", "clf-300x10", "clf-1000x30", "moons-300", "circles-300", "clf-700x8", "clf-700x14")
BUNDLED = ("digits-3v8", "digits-1v7", "iris", "wine")
SHARED = ("glass", "newthyroid", "svmguide2", "vehicle", "vowel", "waveform-1000", "satellite-1000")
# Two-class tables of about 300 rows cut from the same files and scikit-learn's breast cancer (WDBC), added for
# the choice of ard="auto" (size_rule.py): real, noisy tables of the size where the exact model runs
BINARY_CUTS = ("wq-red-300", "wq-white-300", "waveform-0v1-300", "waveform-0v2-300", "waveform-1v2-300",
               "vehicle-bus-300", "vehicle-van-300", "satellite-1v2-300", "satellite-3v4-300", "svmguide2-1vrest",
               "svmguide2-2vrest", "wdbc-300")
DATASETS = GENERATED + BUNDLED + SHARED + BINARY_CUTS
TEST_SETS = ("pima", "australian", "breast", "crabs", "heart", "ionosphere", "sonar")  # never used here
METHODS = ("ep", "sep", "adf", "svi")
SAMPLE_SEED = 0  # the 1000-row samples of waveform and satellite


def parse_args(argv=None):
    p = options(__doc__, "moons-300 and iris, 1 split, 3 iterations", data_dir=True)
    p.add_argument("--datasets", default=None, help=f"comma-separated subset of {','.join(DATASETS)} (default all)")
    p.add_argument("--methods", default="ep", help=f"comma-separated subset of {','.join(METHODS)} (default ep)")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits (default 5; quick 1)")
    p.add_argument("--fraction", type=float, default=0.25, help="m = fraction x n_train (default 0.25)")
    p.add_argument("--max-m", type=int, default=100, help="at most this many inducing points (default 100)")
    p.add_argument("--max-iter", type=int, default=None, help="agpc max_iter (default 250, the library's; quick 3)")
    p.add_argument("--test-fraction", type=float, default=0.10)
    p.add_argument("--json", default=None, help="also write the per-split results to this JSON file")
    args = parse(p, argv, full=dict(datasets=",".join(DATASETS), splits=5, max_iter=250),
                 quick=dict(datasets="moons-300,iris", splits=1, max_iter=3, blas_threads=1))
    args.datasets = parse_list(args.datasets, DATASETS, "dataset")
    args.methods = parse_list(args.methods, METHODS, "method")
    return args


def load(name, data_dir):
    """(X, y) of a study set, or None when its file is absent."""
    from sklearn import datasets as sk

    if name == "banana":
        from agpc.datasets import make_banana

        return make_banana(400, random_state=0)
    if name.startswith("clf-"):
        n, d = (int(v) for v in name[4:].split("x"))
        return sk.make_classification(n, d, n_informative=max(2, d // 3), n_redundant=d // 3, flip_y=0.05,
                                      random_state=0)
    if name == "moons-300":
        return sk.make_moons(300, noise=0.3, random_state=0)
    if name == "circles-300":
        return sk.make_circles(300, noise=0.15, factor=0.5, random_state=0)
    if name.startswith("digits-"):
        a, b = (int(v) for v in name[7:].split("v"))
        X, y = sk.load_digits(return_X_y=True)
        keep = (y == a) | (y == b)
        return X[keep].astype(np.float64), (y[keep] == b).astype(int)
    if name in ("iris", "wine"):
        X, y = (sk.load_iris if name == "iris" else sk.load_wine)(return_X_y=True)
        return X, y
    if name in BINARY_CUTS:
        return binary_cut(name, data_dir, sk)
    file = name.split("-")[0]
    path = Path(data_dir) / f"{file}.npz"
    if not path.is_file():
        return None
    X, y, _ = load_npz(data_dir, file)
    if name.endswith("-1000"):
        rows = np.sort(np.random.default_rng(SAMPLE_SEED).choice(X.shape[0], size=1000, replace=False))
        X, y = X[rows], y[rows]
    return X, y


def binary_cut(name, data_dir, sk):
    """A two-class table of ``BINARY_CUTS``: wine quality 6 or more against less (red or white); a pair of
    waveform's or satellite's classes (their indices); one of vehicle's or svmguide2's classes against the rest;
    WDBC. Tables of more than 300 rows: 300 rows drawn at random (seed 0). None when the file is absent."""
    if name == "wdbc-300":
        X, y = sk.load_breast_cancer(return_X_y=True)
    else:
        file = {"wq-red": "wine_quality_red", "wq-white": "wine_quality_white"}.get(name[:name.rfind("-")],
                                                                                   name.split("-")[0])
        if not (Path(data_dir) / f"{file}.npz").is_file():
            return None
        X, y, _ = load_npz(data_dir, file)
        classes = {"vehicle-bus": 0, "vehicle-van": 3, "satellite-1v2": (0, 1), "satellite-3v4": (2, 3),
                   "svmguide2-1vrest": 0, "svmguide2-2vrest": 1}
        key = name[:name.rfind("-")] if name.endswith("-300") else name
        if file.startswith("wine_quality"):
            y = (y >= 3).astype(int)  # the class indices of quality 3, 4, 5, 6, ...: quality 6 or more
        elif file == "waveform":
            a, b = int(key[-3]), int(key[-1])
            keep = (y == a) | (y == b)
            X, y = X[keep], (y[keep] == b).astype(int)
        elif isinstance(classes[key], tuple):
            a, b = classes[key]
            keep = (y == a) | (y == b)
            X, y = X[keep], (y[keep] == b).astype(int)
        else:
            y = (y == classes[key]).astype(int)
    if name.endswith("-300") and X.shape[0] > 300:
        rows = np.sort(np.random.default_rng(SAMPLE_SEED).choice(X.shape[0], size=300, replace=False))
        X, y = X[rows], y[rows]
    return np.asarray(X, dtype=np.float64), y


def verdict(after, before):
    """(mean of after - before, its SE over the splits, "better" / "worse" / "") on paired splits (no verdict
    from one split: it has no SE)."""
    difference = np.asarray(after) - np.asarray(before)
    mean, se, _ = mean_se(difference)
    if not np.isfinite(se):
        return mean, se, ""
    return mean, se, "better" if mean < -se else ("worse" if mean > se else "")


def print_study(results, found, methods, fraction):
    counts = {}
    header(["dataset", "n_train", "d", "classes", "m", "method", "before", "after", "after - before", ""],
           "lrrrrlllll", "Test NLL before (kernel_prior=None) and after (kernel_prior=\"auto\"): mean ± SE over the splits")
    for name, (d, n_classes) in found.items():
        for method in methods:
            before, after = results.get((name, fraction, method + ML_SUFFIX)), results.get((name, fraction, method))
            if not before or not after or not after.nll or len(after.nll) != len(before.nll):
                continue
            mean, se, word = verdict(after.nll, before.nll)
            counts.setdefault(method, {"better": 0, "worse": 0, "": 0, "sets": 0})
            counts[method][word] += 1
            counts[method]["sets"] += 1
            cells = [f"{mean_se(v)[0]:.3f} ± {mean_se(v)[1]:.3f}" for v in (before.nll, after.nll)]
            row(name, after.n_train, d, n_classes, after.m, method, *cells, f"{mean:+.3f} ± {se:.3f}", word)
    print("\nBetter / worse: the paired difference beyond one standard error of it.\n")
    for method, c in counts.items():
        print(f"- {method}: better on {c['better']} of {c['sets']} sets, worse on {c['worse']}, "
              f"within one SE on {c['']}.")
    return counts


def main(argv=None):
    args = parse_args(argv)
    started = begin("Small-data defaults: kernel_prior=None against \"auto\" on sets other than the test sets",
                    args, argv)
    methods, unavailable = split_methods(with_ml_twins(args.methods), 3)
    if unavailable:
        print("Not available: " + "; ".join(f"{m} ({why})" for m, why in unavailable.items()))
    tasks, found = {}, {}
    for name in args.datasets:
        data = load(name, args.data_dir)
        if data is None:
            print(f"{name}: not found under {args.data_dir}, skipped.")
            continue
        X, y = np.asarray(data[0], dtype=np.float64), np.asarray(data[1])
        tasks[name] = standardised_splits(X, y, lambda split, n=X.shape[0]: split_indices(n, split, args.test_fraction))
        found[name] = (X.shape[1], len(np.unique(y)))
    print(f"\n{args.splits} random {1 - args.test_fraction:.0%}/{args.test_fraction:.0%} splits; features "
          f"standardised on the training part; m = max(4, round({args.fraction:g} n_train)) <= {args.max_m}; "
          f"k-means initial inducing points; max_iter = {args.max_iter}. Not used: {', '.join(TEST_SETS)}.")

    def count(fraction, n_total, n_train):
        return max(4, min(args.max_m, n_train, int(round(fraction * n_train))))

    results = run_grid(tasks, args.splits, [args.fraction], methods,
                       lambda method, m, split: agpc_model(method, m, split, args.max_iter, "kmeans"), count)
    print_study(results, found, args.methods, args.fraction)
    finish_grid(started, args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
