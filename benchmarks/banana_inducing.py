"""Hernandez-Lobato & Hernandez-Lobato (2016), Fig. 2: decision boundaries and learned inducing points on banana for a
growing m.

Protocol, options and commands: benchmarks/README.md, section "banana_inducing.py".
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from _protocol import agpc_model, fit_scored, pyplot, save_figure, split_indices, split_methods
from _runner import begin, end, header, load_npz, options, parse, parse_list, row, standardise

METHODS = ("gfitc", "ep", "sep", "svi")
OPTIONAL = ("adf", "vi-jj", "vi-taylor")


def parse_args(argv=None):
    p = options(__doc__, "m = 4,8, 5 iterations, coarse grid", data_dir=True)
    p.add_argument("--m", default=None, help="numbers of inducing points (default 4,8,16,32,64,128)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS + OPTIONAL)}")
    p.add_argument("--max-iter", type=int, default=None, help="agpc max_iter (default 250; quick 5)")
    p.add_argument("--split", type=int, default=0, help="which random 90/10 split (default 0)")
    p.add_argument("--grid", type=int, default=None, help="points per axis of the probability grid (default 200)")
    args = parse(p, argv, full=dict(m="4,8,16,32,64,128", max_iter=250, grid=200),
                 quick=dict(m="4,8", max_iter=5, grid=40, blas_threads=1))
    args.m = parse_list(args.m, convert=int)
    args.methods = parse_list(args.methods, METHODS + OPTIONAL, "method")
    return args


def load_banana(data_dir):
    path = Path(data_dir) / "banana.npz"
    if path.is_file():
        X, y, _ = load_npz(data_dir, "banana")
        return X, y, str(path)
    from agpc.datasets import make_banana

    X, y = make_banana(5300, random_state=0)
    return X, y, "agpc.datasets.make_banana(5300, random_state=0) (banana.npz not found)"


def draw(plt, method, fits, X_train, y_train, grid):
    """One figure: a panel per m with data, the p = 0.5 contour and the inducing points."""
    cols = min(3, len(fits))
    rows = math.ceil(len(fits) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False)
    lo, hi = X_train.min(axis=0) - 0.3, X_train.max(axis=0) + 0.3
    g0, g1 = np.meshgrid(np.linspace(lo[0], hi[0], grid), np.linspace(lo[1], hi[1], grid))
    cells = np.column_stack([g0.ravel(), g1.ravel()])
    classes = np.unique(y_train)
    for ax, (m, model, err, nll) in zip(axes.ravel(), fits):
        for c, colour in zip(classes, ("tab:blue", "tab:red")):
            pts = X_train[y_train == c]
            ax.scatter(pts[:, 0], pts[:, 1], s=1.5, c=colour, alpha=0.35, linewidths=0)
        if model is not None:
            p = np.asarray(model.predict_proba(cells))[:, 1].reshape(g0.shape)
            ax.contour(g0, g1, p, levels=[0.5], colors="k", linewidths=1.2)
            Z = np.asarray(model.inducing_points_).reshape(-1, 2)
            ax.scatter(Z[:, 0], Z[:, 1], s=14, c="k", zorder=3)
        ax.set(xlim=(lo[0], hi[0]), ylim=(lo[1], hi[1]), xticks=[], yticks=[],
               title=f"m = {m}" + (f": error {err:.3f}, NLL {nll:.3f}" if model is not None else ": failed"))
        ax.title.set_fontsize(8)
    for ax in axes.ravel()[len(fits):]:
        ax.axis("off")
    fig.suptitle(f"banana, {method}: decision boundary p = 0.5 and learned inducing points", fontsize=10)
    return fig


def main(argv=None):
    args = parse_args(argv)
    started = begin("Banana: decision boundary and inducing points against m (Hernandez-Lobato & Hernandez-Lobato (2016), "
                    "Fig. 2)", args, argv)
    X, y, source = load_banana(args.data_dir)
    train, test = split_indices(X.shape[0], args.split, 0.1)
    X_train, X_test = standardise(X[train], X[test])
    y_train, y_test = y[train], y[test]
    print(f"\nData: {source}; split {args.split}: {len(train)} training / {len(test)} test rows, standardised on the "
          f"training part; max_iter = {args.max_iter}; initial inducing points: random training rows (same for "
          f"every method).\n", flush=True)
    _, unavailable = split_methods(args.methods, 2)
    plt = pyplot()
    scores = {}
    for method in args.methods:
        if method in unavailable:
            continue
        fits = []
        for m in args.m:
            model = agpc_model(method, m, args.split, args.max_iter, "random")
            try:
                nll, err, elapsed = fit_scored(model, X_train, y_train, X_test, y_test)
            except Exception as exc:  # noqa: BLE001
                print(f"<!-- {method} m={m} failed: {type(exc).__name__}: {exc} -->", flush=True)
                fits.append((m, None, math.nan, math.nan))
                continue
            scores[(method, m)] = (err, nll, elapsed)
            fits.append((m, model, err, nll))
            print(f"<!-- {method} m={m}: error {err:.4f}, NLL {nll:.4f}, {elapsed:.1f} s -->", flush=True)
        if plt is not None:
            save_figure(draw(plt, method, fits, X_train, y_train, args.grid),
                        f"banana_inducing_{method}{'_quick' if args.quick else ''}.png")
    header(["m", *args.methods], "r" + "l" * len(args.methods), "Banana, test error / test NLL (fit seconds) against m")
    for m in args.m:
        cells = []
        for method in args.methods:
            if method in unavailable:
                cells.append("not available")
            elif (method, m) in scores:
                err, nll, elapsed = scores[(method, m)]
                cells.append(f"{err:.3f} / {nll:.3f} ({elapsed:.1f} s)")
            else:
                cells.append("failed")
        row(m, *cells)
    if unavailable:
        print("\nNot available in this agpc: " + "; ".join(f"{mt} ({why})" for mt, why in unavailable.items()) + ".")
    end(started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
