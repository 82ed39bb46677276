"""Hernandez-Lobato & Hernandez-Lobato (2016), Fig. 3 (left) style: test NLL and error against training time for m = 4,
50, 200.

Protocol, options and commands: benchmarks/README.md, section "time_curves.py".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from _protocol import agpc_model, fit_scored, mean_se, pyplot, save_figure, split_indices, split_methods
from _runner import begin, end, header, load_npz, options, parse, parse_list, row, standardise

METHODS = ("gfitc", "ep", "sep", "svi")
OPTIONAL = ("adf",)


def parse_args(argv=None):
    p = options(__doc__, "1 split, m = 4,20, budgets 1,3", data_dir=True)
    p.add_argument("--dataset", default="banana", help="a dataset of the data folder (default banana)")
    p.add_argument("--m", default=None, help="numbers of inducing points (default 4,50,200)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS + OPTIONAL)}")
    p.add_argument("--iters", default=None, help="iteration budgets (default 1,2,4,8,16,32,64,128,250)")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits (default 100 as the paper)")
    args = parse(p, argv, full=dict(m="4,50,200", iters="1,2,4,8,16,32,64,128,250", splits=100),
                 quick=dict(m="4,20", iters="1,3", splits=1, blas_threads=1))
    args.m, args.iters = parse_list(args.m, convert=int), parse_list(args.iters, convert=int)
    args.methods = parse_list(args.methods, METHODS + OPTIONAL, "method")
    return args


def load(args):
    data_dir = Path(args.data_dir)
    if (data_dir / f"{args.dataset}.npz").is_file():
        X, y, _ = load_npz(data_dir, args.dataset)
        return X, y, str(data_dir / f"{args.dataset}.npz")
    if args.dataset == "banana":
        from agpc.datasets import make_banana

        X, y = make_banana(5300, random_state=0)
        return X, y, "agpc.datasets.make_banana(5300, random_state=0) (banana.npz not found)"
    return None


def run(args, X, y, methods):
    """{(m, method, k): {"nll": [...], "err": [...], "time": [...]}} over the splits."""
    out = {}
    for split in range(args.splits):
        train, test = split_indices(X.shape[0], split, 0.1)
        X_train, X_test = standardise(X[train], X[test])
        for m in args.m:
            for method in methods:
                for k in args.iters:
                    rec = out.setdefault((m, method, k), {"nll": [], "err": [], "time": []})
                    try:
                        nll, err, elapsed = fit_scored(agpc_model(method, m, split, k, "random"),
                                                       X_train, y[train], X_test, y[test])
                    except Exception as exc:  # noqa: BLE001
                        print(f"<!-- split {split} m={m} {method} k={k} failed: {type(exc).__name__}: {exc} -->")
                        continue
                    rec["nll"].append(nll)
                    rec["err"].append(err)
                    rec["time"].append(elapsed)
                last = out[(m, method, args.iters[-1])]
                if last["nll"]:
                    print(f"<!-- split {split + 1}/{args.splits} m={m} {method}: k={args.iters[-1]} NLL "
                          f"{last['nll'][-1]:.4f} in {last['time'][-1]:.1f} s -->", flush=True)
    return out


def print_table(args, out, methods, unavailable):
    header(["m", "method", *(f"k = {k}" for k in args.iters), f"test error at k = {args.iters[-1]}"],
           "rl" + "l" * (len(args.iters) + 1),
           f"{args.dataset}: test NLL (mean over {args.splits} splits) and mean fit seconds after k iterations")
    for m in args.m:
        for method in args.methods:
            if method in unavailable:
                row(m, method, *["not available"] * (len(args.iters) + 1))
                continue
            cells = []
            for k in args.iters:
                rec = out[(m, method, k)]
                cells.append(f"{np.mean(rec['nll']):.3f} ({np.mean(rec['time']):.2f} s)" if rec["nll"] else "failed")
            err = out[(m, method, args.iters[-1])]["err"]
            mean, se, _ = mean_se(err)
            cells.append(f"{mean:.3f}" + (f" ± {se:.3f}" if np.isfinite(se) else ""))
            row(m, method, *cells)
    if unavailable:
        print("\nNot available in this agpc: " + "; ".join(f"{mt} ({why})" for mt, why in unavailable.items()) + ".")


def plot(args, out, methods):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = dict(zip(METHODS + OPTIONAL, ("tab:green", "tab:blue", "tab:orange", "tab:red", "tab:purple")))
    styles = ("-", "--", ":", "-.")
    for j, m in enumerate(args.m):
        for method in methods:
            pts = [(np.mean(out[(m, method, k)]["time"]), np.mean(out[(m, method, k)]["nll"]),
                    np.mean(out[(m, method, k)]["err"])) for k in args.iters if out[(m, method, k)]["nll"]]
            if not pts:
                continue
            t, nll, err = np.array(pts).T
            for ax, values in zip(axes, (nll, err)):
                ax.plot(np.log10(t), values, styles[j % 4], marker="o", ms=3, color=colours[method], label=f"{method} m={m}")
    axes[0].set(xlabel="log10 training time (s)", ylabel="test NLL", title=f"{args.dataset}: test NLL")
    axes[1].set(xlabel="log10 training time (s)", ylabel="test error", title=f"{args.dataset}: test error")
    axes[0].legend(fontsize=7, ncol=2)
    save_figure(fig, f"time_curves_{args.dataset}{'_quick' if args.quick else ''}.png")


def main(argv=None):
    args = parse_args(argv)
    started = begin("Test NLL against training time (Hernandez-Lobato & Hernandez-Lobato (2016), Fig. 3 left style)",
                    args, argv)
    data = load(args)
    if data is None:
        print(f"{args.dataset}.npz not found in {args.data_dir}: nothing to do.")
        return end(started)
    X, y, source = data
    n_classes = len(np.unique(y))
    methods, unavailable = split_methods(args.methods, n_classes)
    print(f"\nData: {source} ({X.shape[0]} rows, {X.shape[1]} features, {n_classes} classes); {args.splits} random "
          f"90/10 splits, standardised on the training part; m = {args.m}; budgets k = {args.iters} iterations, "
          f"each a fresh fit from the same random initial inducing points.", flush=True)
    out = run(args, X, y, methods)
    print_table(args, out, methods, unavailable)
    plot(args, out, methods)
    end(started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
