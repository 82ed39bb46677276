"""Multiclass EP and SEP (Villacampa-Calvo & Hernandez-Lobato 2017) on scikit-learn's bundled wine, iris and digits, and
the cost in C and m.

Accuracy table: random 90/10 train/test splits (seeded by the split number), features standardised on the
training part, m = 5%, 10%, 20% of n (rounded, per class), ``max_iter`` iterations of batch training with
the library's defaults: EP, SEP, and the robust-max variational baseline of Villacampa-Calvo & Hernandez-Lobato (2017),
sec. 3 (``agpc-svi``: Adam at its default 0.01, ``max_iter`` full-batch steps). On the same splits: one-vs-rest logistic
regression (``LogisticRegression`` in a ``OneVsRestClassifier``, default C) and scikit-learn's
``GaussianProcessClassifier`` (Laplace, one-vs-rest, ``ConstantKernel() * RBF()`` isotropic: an ARD kernel on digits' 64
features is out of reach for it). Per cell: mean and standard error over the splits of the test NLL (natural log) and
error rate, and the mean training time. Villacampa-Calvo & Hernandez-Lobato (2017), Table 2 (20 splits) gives wine:
GFITC 0.08 / EP 0.07 / SEP 0.08 at m = 5%.

Cost table (``--timing``): seconds per batch EP iteration (one ``multiclass_ep.evaluate`` with the
gradient: sweep + adjoints for every class) on synthetic data with n rows, for C in (3, 10) and several m;
the last column divides by C n m^2, which must stay roughly constant if the cost grows as C n m^2.

    PYTHONPATH=. python benchmarks/multiclass_sklearn.py --blas-threads 1
    PYTHONPATH=. python benchmarks/multiclass_sklearn.py --quick
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import limit_blas, load_line, print_machine  # noqa: E402
from _protocol import fmt, mean_se, split_indices, test_scores  # noqa: E402
from uci_multiclass import PAPER_TABLE2  # noqa: E402

DATASETS = ("wine", "iris", "digits")
METHODS = ("agpc-ep", "agpc-sep", "agpc-svi", "logreg-ovr", "sklearn-gpc")
PAPER = {"wine": {f: tuple(v for v, _ in PAPER_TABLE2[f]["wine"][:3]) for f in PAPER_TABLE2}}  # GFITC, EP, SEP


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: wine and iris, 2 splits, m = 10%%, 20 iterations")
    p.add_argument("--datasets", default=None, help=f"comma-separated subset of {DATASETS}")
    p.add_argument("--splits", type=int, default=None, help="random splits (default 10)")
    p.add_argument("--fractions", default=None, help="m as fractions of n (default 0.05,0.1,0.2)")
    p.add_argument("--max-iter", type=int, default=None, help="agpc iterations (default 250)")
    p.add_argument("--methods", default=None, help=f"comma-separated subset of {METHODS}")
    p.add_argument("--digits-splits", type=int, default=None, help="splits for digits (default: --splits)")
    p.add_argument("--digits-max-iter", type=int, default=None, help="iterations for digits (default: --max-iter)")
    p.add_argument("--timing", action="store_true", help="also print the cost table (seconds per iteration vs C, m)")
    p.add_argument("--timing-only", action="store_true", help="print only the cost table")
    p.add_argument("--timing-n", type=int, default=2000)
    p.add_argument("--timing-ms", default="25,50,100,200")
    p.add_argument("--blas-threads", type=int, default=None, help="limit BLAS threads with threadpoolctl")
    args = p.parse_args(argv)
    if args.quick:
        args.datasets = args.datasets or "wine,iris"
        args.splits = args.splits or 2
        args.fractions = args.fractions or "0.1"
        args.max_iter = args.max_iter or 20
        args.timing_ms = "20,40"
        args.timing_n = 500
        if args.blas_threads is None:
            args.blas_threads = 1
    args.datasets = [d for d in (args.datasets or ",".join(DATASETS)).split(",") if d]
    args.methods = [m for m in (args.methods or ",".join(METHODS)).split(",") if m]
    args.splits = args.splits or 10
    args.fractions = [float(f) for f in (args.fractions or "0.05,0.1,0.2").split(",")]
    args.max_iter = args.max_iter or 250
    args.timing_ms = [int(v) for v in args.timing_ms.split(",")]
    return args


def load(name):
    from sklearn import datasets

    loader = {"wine": datasets.load_wine, "iris": datasets.load_iris, "digits": datasets.load_digits}[name]
    return loader(return_X_y=True)


def make_model(method, m, split, max_iter):
    if method in ("agpc-ep", "agpc-sep", "agpc-svi"):
        import agpc

        return agpc.GPClassifier(method=method.split("-")[1], n_inducing=m, max_iter=max_iter, random_state=split)
    if method == "logreg-ovr":
        from sklearn.linear_model import LogisticRegression
        from sklearn.multiclass import OneVsRestClassifier

        return OneVsRestClassifier(LogisticRegression(max_iter=2000))
    if method == "sklearn-gpc":
        from sklearn.gaussian_process import GaussianProcessClassifier
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel

        return GaussianProcessClassifier(kernel=ConstantKernel() * RBF(), multi_class="one_vs_rest")
    raise ValueError(method)


def run(args):
    from sklearn.preprocessing import StandardScaler

    rows = []
    for name in args.datasets:
        X, y = load(name)
        n = X.shape[0]
        splits = args.digits_splits if (name == "digits" and args.digits_splits) else args.splits
        max_iter = args.digits_max_iter if (name == "digits" and args.digits_max_iter) else args.max_iter
        for fraction in args.fractions:
            for method in args.methods:
                if method in ("logreg-ovr", "sklearn-gpc") and fraction != args.fractions[0]:
                    continue  # no inducing points: one row per dataset
                record = {"nll": [], "err": [], "time": []}
                for split in range(splits):
                    train, test = split_indices(n, split, 0.1)
                    scaler = StandardScaler().fit(X[train])
                    X_train, X_test = scaler.transform(X[train]), scaler.transform(X[test])
                    m = max(1, int(round(fraction * len(train))))
                    model = make_model(method, m, split, max_iter)
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        model.fit(X_train, y[train])
                    record["time"].append(time.perf_counter() - t0)
                    nll, err = test_scores(model, X_test, y[test])
                    record["nll"].append(nll)
                    record["err"].append(err)
                label = f"{fraction:.0%}" if method.startswith("agpc") else "full"
                rows.append((name, label, method, splits, max_iter, record))
                nll_m, nll_se, _ = mean_se(record["nll"])
                err_m, err_se, _ = mean_se(record["err"])
                print(f"  {name:7s} m={label:5s} {method:12s} NLL {fmt(nll_m, nll_se)}  error {fmt(err_m, err_se)}  "
                      f"fit {np.mean(record['time']):.1f} s  ({splits} splits)", flush=True)
    return rows


def print_table(rows):
    print("\n### Test NLL and error (mean ± standard error over the splits)\n")
    print("| data | m | method | splits | iterations | test NLL | test error | fit (s) | Villacampa-Calvo & Hernandez-Lobato (2017), Table 2 (GFITC / EP / SEP) |")
    print("|---|---|---|---:|---:|---|---|---:|---|")
    for name, label, method, splits, max_iter, rec in rows:
        nll_m, nll_se, _ = mean_se(rec["nll"])
        err_m, err_se, _ = mean_se(rec["err"])
        paper = ""
        if name in PAPER and label.endswith("%"):
            published = PAPER[name].get(round(float(label[:-1]) / 100, 2))
            paper = " / ".join(f"{v:.2f}" for v in published) if published else ""
        iters = str(max_iter) if method.startswith("agpc") else ""
        print(f"| {name} | {label} | {method} | {splits} | {iters} | {fmt(nll_m, nll_se)} | {fmt(err_m, err_se)} | "
              f"{np.mean(rec['time']):.2f} | {paper} |")


def timing(args):
    from agpc.inference import multiclass_ep, training
    from agpc.kernels import RBF, ClassKernels

    rng = np.random.default_rng(0)
    n, d = args.timing_n, 8
    X = rng.normal(size=(n, d))
    print(f"\n### Seconds per batch EP iteration (sweep + gradient), n = {n:,}, d = {d}\n")
    print("| C | m | s / iteration | s / (C n m^2) x 1e9 |")
    print("|---:|---:|---:|---:|")
    for C in (3, 10):
        y = rng.integers(C, size=n).astype(np.float64)
        for m in args.timing_ms:
            kernels = ClassKernels([RBF([2.0] * d, 1.0, 0.1).for_inputs(X)] * C)
            Z = np.stack([X[rng.choice(n, m, replace=False)] for _ in range(C)])
            fit = training.train(X, y, kernels, Z, max_iter=3, optimize=(), jitter=1e-6)  # sites away from zero
            nu, mu = fit.site_precision, fit.site_shift
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                multiclass_ep.evaluate(kernels, Z, X, y, nu, mu, jitter=1e-6, want_grad=True)
                times.append(time.perf_counter() - t0)
            best = float(np.median(times))
            print(f"| {C} | {m} | {best:.3f} | {best / (C * n * m * m) * 1e9:.2f} |", flush=True)


def main(argv=None):
    args = parse_args(argv)
    import scipy.linalg  # noqa: F401  (load every BLAS user before threadpoolctl looks)
    import sklearn.gaussian_process  # noqa: F401
    import sklearn.linear_model  # noqa: F401

    import agpc  # noqa: F401

    limiter = limit_blas(args.blas_threads)
    print_machine("Multiclass EP / SEP on scikit-learn's wine, iris, digits (Villacampa-Calvo & Hernandez-Lobato (2017) protocol)")
    t0 = time.perf_counter()
    if not args.timing_only:
        print_table(run(args))
    if args.timing or args.timing_only:
        timing(args)
    print(f"\nTotal wall time: {time.perf_counter() - t0:.0f} s.")
    print(load_line(), flush=True)
    del limiter
    return 0


if __name__ == "__main__":
    sys.exit(main())
