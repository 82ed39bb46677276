"""Izmailov & Kropotov (2017) Figs. 4-7 style: test error and NLL against training time for the variational methods and
EP.

Protocol, options and commands: benchmarks/README.md, section "variational.py".
"""

from __future__ import annotations

import time

import numpy as np
from _protocol import pyplot, save_figure
from _runner import begin, end, header, options, parse, row, test_scores

from agpc import GPClassifier
from agpc.datasets import split_standardised

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
        nll, error = test_scores(model, Xt, yt)
        points.append((used, error, nll))
    return points


def plot(name, data, m, curves):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, points in curves.items():
        t = [p[0] for p in points]
        axes[0].plot(t, [p[1] for p in points], marker="o", label=method)
        axes[1].plot(t, [p[2] for p in points], marker="o", label=method)
    for ax, label in zip(axes, ("test error", "test NLL")):
        ax.set(xscale="log", xlabel="training time (s)", ylabel=label)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{name}, n={len(data[1])}, d={data[0].shape[1]}, m={m}")
    fig.tight_layout()
    save_figure(fig, f"variational_{name}_m{m}.png")


def main(argv=None):
    p = options(__doc__, "breast, m = 20, budgets 0.3 and 1 s, a learning-rate grid of 3")
    p.add_argument("--datasets", nargs="+", default=["breast", "digits"])
    p.add_argument("--inducing", nargs="+", type=int, default=[50, 100])
    args = parse(p, argv, full=dict(budgets=[0.5, 1, 2, 4, 8, 16], grid=[0.03, 0.1, 0.3, 1.0, 3.0]),
                 quick=dict(budgets=[0.3, 1.0], grid=[0.1, 0.3, 1.0], datasets=None, inducing=None))
    if args.quick:
        args.datasets, args.inducing = ["breast"], [20]
    started = begin("Variational methods and EP: test error / NLL against training time", args, argv)
    budgets, grid = args.budgets, args.grid
    for name in args.datasets:
        data = load(name)
        for m in args.inducing:
            print(f"\n### {name}: n_train={len(data[1])}, d={data[0].shape[1]}, m={m}\n", flush=True)
            # SVI's learning rate, as Izmailov & Kropotov (2017): a grid, the best final NLL at the largest budget
            best = None
            for lr in grid:
                (_, _, nll), = curve("svi-adadelta", m, data, budgets[-1:], lr)
                if np.isfinite(nll) and (best is None or nll < best[1]):
                    best = (lr, nll)
            lr = best[0] if best else grid[0]
            print(f"SVI Adadelta learning rate chosen from {grid}: {lr}\n")
            header(["method", "budget s", "used s", "test error", "test NLL"])
            curves = {}
            for method in METHODS:
                curves[method] = curve(method, m, data, budgets, lr if method == "svi-adadelta" else None)
                for budget, (used, error, nll) in zip(budgets, curves[method]):
                    row(method, budget, f"{used:.2f}", f"{error:.4f}", f"{nll:.4f}")
            plot(name, data, m, curves)
    end(started)


if __name__ == "__main__":
    main()
