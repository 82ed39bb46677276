"""Class weights on an imbalanced real set: ``GPClassifier(class_weight=None)`` against ``"balanced"``, beside
scikit-learn's LogisticRegression with the same weights (docs/weights.md, docs/results.md).

The set (``--set``, default pima: 500 negatives, 268 positives) is made 1:``--ratio`` (default 10) imbalanced by
keeping every row of its larger class and a random ``1 / ratio`` of that count from the smaller one (drawn once,
seeded by ``--subsample-seed``); then ``--splits`` random stratified 70/30 splits, features standardised on the
training part. Per model and weighting: the minority class's recall, the balanced accuracy and the test NLL, mean
± standard error over the splits. The GPs: the default model (``n_inducing="auto"``: the exact full GP on these few
hundred rows) with nothing else set but ``random_state``; batch EP and batch SVI with 30 inducing points.

    PYTHONPATH=. python benchmarks/class_weights.py
    PYTHONPATH=. python benchmarks/class_weights.py --quick
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _runner import begin, end, header, load_npz, options, parse, row, show, standardise, test_scores
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, recall_score
from sklearn.model_selection import train_test_split

from agpc import GPClassifier


def imbalanced(X, y, ratio, seed):
    """Every row of the larger class and ``count / ratio`` rows of the smaller, drawn at random; labels 0 / 1 with 1
    the minority."""
    counts = np.bincount(y)
    major, minor = int(np.argmax(counts)), int(np.argmin(counts))
    keep_minor = np.random.default_rng(seed).choice(np.flatnonzero(y == minor), size=counts[major] // ratio,
                                                    replace=False)
    rows = np.r_[np.flatnonzero(y == major), keep_minor]
    return X[rows], (y[rows] == minor).astype(int)


def models(split, weighting, max_iter):
    gp = dict(random_state=split, class_weight=weighting)
    if max_iter is not None:
        gp["max_iter"] = max_iter
    return {"agpc (default)": GPClassifier(**gp), "agpc ep, m = 30": GPClassifier(n_inducing=30, **gp),
            "agpc svi, m = 30": GPClassifier(method="svi", n_inducing=30, batch_size=None, **gp),
            "logistic regression": LogisticRegression(class_weight=weighting)}


def main(argv=None):
    p = options(__doc__, "generated banana 1:10, 2 splits, 5 iterations", data_dir=True)
    p.add_argument("--set", default="pima", help="a binary set of ../shared/data (default pima)")
    p.add_argument("--ratio", type=int, default=10, help="the minority class kept at 1 : RATIO (default 10)")
    p.add_argument("--splits", type=int, default=None, help="random stratified 70/30 splits (default 10)")
    p.add_argument("--subsample-seed", type=int, default=0, help="seed of the minority subsample (default 0)")
    p.add_argument("--max-iter", type=int, default=None, help="agpc max_iter (default: the library's; quick 5)")
    args = parse(p, argv, full=dict(splits=10), quick=dict(splits=2, max_iter=5, blas_threads=1))
    run = begin("Class weights on an imbalanced set", args, argv)
    path = Path(args.data_dir) / f"{args.set}.npz"
    if path.exists() and not args.quick:
        X, y, _ = load_npz(args.data_dir, args.set)
        name = args.set
    else:
        from agpc.datasets import make_banana

        X, y = make_banana(1100, random_state=0)
        y = (np.asarray(y) > 0).astype(int)
        name = "generated banana" + ("" if args.quick else f" ({path} not found)")
    X, y = imbalanced(X, y, args.ratio, args.subsample_seed)
    print(f"{name}, 1:{args.ratio}: {len(y)} rows, {int(y.sum())} in the minority class; {args.splits} stratified "
          "70/30 splits\n")
    scores = {}
    for split in range(args.splits):
        X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, stratify=y, random_state=split)
        X_train, X_test = standardise(X_train, X_test)
        for weighting in (None, "balanced"):
            for label, model in models(split, weighting, args.max_iter).items():
                model.fit(X_train, y_train)
                predicted = np.asarray(model.predict(X_test))
                nll, _ = test_scores(model, X_test, y_test)
                scores.setdefault((label, weighting), []).append(
                    (recall_score(y_test, predicted), balanced_accuracy_score(y_test, predicted), nll))
    header(["model", "class_weight", "minority recall", "balanced accuracy", "test NLL"], "llrrr")
    for (label, weighting), values in scores.items():
        values = np.asarray(values)
        mean, se = values.mean(axis=0), values.std(axis=0, ddof=1) / np.sqrt(len(values))
        row(label, repr(weighting), *(f"{show(m, '.3f')} ± {show(s, '.3f')}" for m, s in zip(mean, se)))
    end(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
