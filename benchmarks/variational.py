"""Izmailov & Kropotov (2017) Figs. 4-7 style: test error and NLL against training time for the variational methods and
EP.

Data bundled with scikit-learn (no download): breast cancer (569 x 30) and digits odd-vs-even (1797 x 64),
80/20 split (Izmailov & Kropotov (2017)'s protocol for data without a test set), features standardised on the training
part. Each method is trained anew with growing time budgets (``max_time``) and scored at the end of each: the
curve is (budget actually used, test error, test NLL). SVI uses Adadelta with the best learning rate of a
grid, as Izmailov & Kropotov (2017) does (chosen by the final test NLL at the largest budget); it is also shown with
Adam at its default. Prints a Markdown table and writes benchmarks/results/variational_<data>_m<m>.png.

    python benchmarks/variational.py            # full
    python benchmarks/variational.py --quick    # seconds, for a smoke test
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import load_line, print_machine  # noqa: E402

from agpc import GPClassifier  # noqa: E402
from agpc.datasets import split_standardised  # noqa: E402

METHODS = ["ep", "vi-jj", "vi-jj-hybrid", "vi-jj-full", "vi-taylor", "svi-adam", "svi-adadelta"]


def load(name):
    from sklearn.datasets import load_breast_cancer, load_digits

    if name == "breast":
        data = load_breast_cancer()
        X, y = data.data, data.target
    else:
        data = load_digits()
        X, y = data.data, data.target % 2
    return split_standardised(X, y, train_fraction=0.8, random_state=0)


def score(model, X, y):
    proba = model.predict_proba(X)
    p = np.clip(proba[np.arange(len(y)), np.searchsorted(model.classes_, y)], 1e-300, None)
    return float(np.mean(model.classes_[np.argmax(proba, 1)] != y)), float(-np.mean(np.log(p)))


def make(method, m, learning_rate=None):
    common = dict(n_inducing=m, random_state=0, max_iter=100000)
    if method == "svi-adam":
        return GPClassifier(method="svi", optimizer="adam", **common)
    if method == "svi-adadelta":
        return GPClassifier(method="svi", optimizer="adadelta", learning_rate=learning_rate, **common)
    return GPClassifier(method=method, **common)


def curve(method, m, data, budgets, learning_rate=None):
    X, y, Xt, yt = data
    points = []
    for budget in budgets:
        model = make(method, m, learning_rate)
        t0 = time.perf_counter()
        model.set_params(max_time=budget).fit(X, y)
        used = time.perf_counter() - t0
        error, nll = score(model, Xt, yt)
        points.append((used, error, nll))
    return points


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--datasets", nargs="+", default=["breast", "digits"])
    parser.add_argument("--inducing", nargs="+", type=int, default=[50, 100])
    args = parser.parse_args(argv)
    print_machine("Variational methods and EP: test error / NLL against training time")
    budgets = [0.3, 1.0] if args.quick else [0.5, 1, 2, 4, 8, 16]
    grid = [0.1, 0.3, 1.0] if args.quick else [0.03, 0.1, 0.3, 1.0, 3.0]
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    for name in (["breast"] if args.quick else args.datasets):
        data = load(name)
        for m in ([20] if args.quick else args.inducing):
            print(f"\n### {name}: n_train={len(data[1])}, d={data[0].shape[1]}, m={m}\n", flush=True)
            # SVI's learning rate, as Izmailov & Kropotov (2017): a grid, the best final NLL at the largest budget
            best = None
            for lr in grid:
                (_, _, nll), = curve("svi-adadelta", m, data, budgets[-1:], lr)
                if np.isfinite(nll) and (best is None or nll < best[1]):
                    best = (lr, nll)
            lr = best[0] if best else grid[0]
            print(f"SVI Adadelta learning rate chosen from {grid}: {lr}\n")
            print("| method | budget s | used s | test error | test NLL |")
            print("|---|---|---|---|---|")
            curves = {}
            for method in METHODS:
                points = curve(method, m, data, budgets, lr if method == "svi-adadelta" else None)
                curves[method] = points
                for budget, (used, error, nll) in zip(budgets, points):
                    print(f"| {method} | {budget} | {used:.2f} | {error:.4f} | {nll:.4f} |", flush=True)
            try:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt

                fig, axes = plt.subplots(1, 2, figsize=(10, 4))
                for method, points in curves.items():
                    t = [p[0] for p in points]
                    axes[0].plot(t, [p[1] for p in points], marker="o", label=method)
                    axes[1].plot(t, [p[2] for p in points], marker="o", label=method)
                for ax, label in zip(axes, ("test error", "test NLL")):
                    ax.set_xscale("log")
                    ax.set_xlabel("training time (s)")
                    ax.set_ylabel(label)
                axes[1].legend(fontsize=8)
                fig.suptitle(f"{name}, n={len(data[1])}, d={data[0].shape[1]}, m={m}")
                fig.tight_layout()
                path = out_dir / f"variational_{name}_m{m}.png"
                fig.savefig(path, dpi=100)
                print(f"\nPlot: {path.relative_to(out_dir.parent.parent)}")
            except ImportError:
                print("\n(matplotlib not installed: no plot)")
    print("\n" + load_line())


if __name__ == "__main__":
    main()
