"""Test NLL against the number of hyper-parameter steps, on the Hernandez-Lobato & Hernandez-Lobato (2016), Table 1 and
Villacampa-Calvo & Hernandez-Lobato (2017), Table 2 datasets.

Protocol, options and commands: benchmarks/README.md, section "uci_iterations.py".
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
from _protocol import fmt, mean_se, pyplot, save_figure, split_indices, standardised_splits
from _runner import begin, end, header, load_npz, options, parse, parse_list, row, test_scores
from uci_binary import DATASETS as BINARY_DATASETS, PAPER as BINARY_PAPER, make_model
from uci_multiclass import DATASETS as MULTICLASS_DATASETS, PAPER as MULTICLASS_PAPER, load as load_multiclass
from uci_multiclass import protocol_split

DATASETS = BINARY_DATASETS + MULTICLASS_DATASETS

AGPC_METHODS = ("ep", "sep", "adf", "gfitc", "svi", "vi-jj", "vi-taylor")
EP_METHODS = ("ep", "sep", "adf")  # the methods with validation_data / n_iter_no_change


def parse_args(argv=None):
    p = options(__doc__, "crabs, 1 split, iterations 2,5, no baselines", data_dir=True)
    p.add_argument("--datasets", default=None,
                   help=f"comma-separated subset of {','.join(DATASETS)} (default heart,crabs,sonar)")
    p.add_argument("--method", default="ep", choices=AGPC_METHODS)
    p.add_argument("--iters", default=None, help="comma-separated max_iter values (default 10,25,50,100,250)")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits (default 20)")
    p.add_argument("--fraction", type=float, default=0.25, help="m = round(fraction * n) (default 0.25)")
    p.add_argument("--no-baselines", action="store_true", help="skip sklearn-gpc and logreg")
    p.add_argument("--test-fraction", type=float, default=0.10)
    p.add_argument("--json", default=None, help="also write the per-split results to this JSON file")
    p.add_argument("--figure", default=None, help="PNG name in benchmarks/results (default uci_iterations.png)")
    args = parse(p, argv, full=dict(datasets="heart,crabs,sonar", iters="10,25,50,100,250", splits=20),
                 quick=dict(datasets="crabs", iters="2,5", splits=1, blas_threads=1))
    args.no_baselines = args.no_baselines or args.quick
    args.datasets = parse_list(args.datasets, DATASETS, "dataset")
    args.iters = sorted(set(parse_list(args.iters, convert=int)))
    if not args.iters or args.iters[0] < 1:
        raise SystemExit("--iters needs positive integers")
    return args


def _fit(model, X_train, y_train, validation_fraction=0.0, split=0):
    """Fit; the number of rows the model was fitted to."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not validation_fraction:
            model.fit(X_train, y_train)
            return X_train.shape[0]
        order = np.random.default_rng(10_000 + split).permutation(X_train.shape[0])
        n_val = max(1, int(round(validation_fraction * X_train.shape[0])))
        val, fit = order[:n_val], order[n_val:]
        model.fit(X_train[fit], y_train[fit], validation_data=(X_train[val], y_train[val]))
        return fit.shape[0]


def _load(data_dir, name, test_fraction):
    """(split function, number of instances) of a binary or multiclass set under its table's protocol."""
    if name in BINARY_DATASETS:
        path = data_dir / f"{name}.npz"
        if not path.is_file():
            print(f"{name}: {path} not found, skipped.")
            return None
        X, y, _ = load_npz(data_dir, name)
        return standardised_splits(X, y, lambda s, n=X.shape[0]: split_indices(n, s, test_fraction)), X.shape[0]
    data = load_multiclass(data_dir, name)
    if data is None:
        return None
    X, y = data
    return standardised_splits(X, y, lambda s: protocol_split(name, X, y, s)), X.shape[0]


def _amplitude(kernel):
    """The fitted amplitude; the median over the classes' kernels of a multiclass model."""
    import agpc

    kernels = getattr(kernel, "kernels", [kernel])
    return float(np.median([float(agpc.backend.to_numpy(k.amplitude)) for k in kernels]))


def _paper(name, fraction):
    """(column name, (mean, ±)) of the paper's counterpart, or None."""
    if name in BINARY_DATASETS:
        row = BINARY_PAPER.nll.get(fraction, {}).get(name)
        return ("paper SEP", row[1]) if row else None
    row = MULTICLASS_PAPER.nll.get(fraction, {}).get(name)
    return ("paper EP", row[1]) if row else None


def run(args):
    """{dataset: {column: {"nll": [...], "log_z": [...], "amplitude": [...]}}}, a value a split."""
    import agpc

    data_dir = Path(args.data_dir)
    columns = [f"{args.method}@{k}" for k in args.iters] + ["fixed"]
    if args.method in EP_METHODS:
        columns.append(f"{args.method}+early")
    if not args.no_baselines:
        columns += ["sklearn-gpc", "logreg"]
    results = {}
    for name in args.datasets:
        data = _load(data_dir, name, args.test_fraction)
        if data is None:
            continue
        split_fn, n_total = data
        cells = results[name] = {c: {"nll": [], "log_z": [], "amplitude": []} for c in columns}
        for split in range(args.splits):
            X_train, y_train, X_test, y_test, _ = split_fn(split)
            # uci_binary.py: m of all instances; uci_multiclass.py: m per class of the training rows
            m = max(1, int(round(args.fraction * (n_total if name in BINARY_DATASETS else X_train.shape[0]))))
            for column in columns:
                if column in ("sklearn-gpc", "logreg"):
                    model = make_model(column, m, split, None)
                    rows = _fit(model, X_train, y_train)
                elif column.endswith("+early"):
                    model = agpc.GPClassifier(method=args.method, n_inducing=m, max_iter=args.iters[-1],
                                              random_state=split, inducing="random", n_iter_no_change=10,
                                              plateau=None)
                    rows = _fit(model, X_train, y_train, validation_fraction=0.2, split=split)
                else:
                    steps = args.iters[-1] if column == "fixed" else int(column.split("@")[1])
                    model = agpc.GPClassifier(method=args.method, n_inducing=m, max_iter=steps, random_state=split,
                                              inducing="random", optimize=column != "fixed", plateau=None)
                    rows = _fit(model, X_train, y_train)
                cell = cells[column]
                cell["nll"].append(test_scores(model, X_test, y_test)[0])
                if hasattr(model, "kernel_"):
                    cell["log_z"].append(float(model.log_marginal_likelihood_) / rows)
                    cell["amplitude"].append(_amplitude(model.kernel_))
            print(f"<!-- {name} split {split + 1}/{args.splits} m={m}: "
                  + ", ".join(f"{c} {cells[c]['nll'][-1]:.3f}" for c in columns) + " -->", flush=True)
    return columns, results


def print_tables(args, columns, results):
    print(f"\n### Test NLL against max_iter, {args.method}, m = {args.fraction:.0%} of n "
          f"(mean ± standard error over {args.splits} splits)\n")
    head = columns + ["paper (Hernandez-Lobato & Hernandez-Lobato (2016) SEP / Villacampa-Calvo & Hernandez-Lobato (2017) EP)"]
    header(["dataset", *head])
    for name, by_column in results.items():
        paper = _paper(name, args.fraction)
        cells = [fmt(*mean_se(by_column[c]["nll"])[:2]) for c in columns]
        cells.append("%s %.2f ± %.2f" % ((paper[0],) + paper[1]) if paper else "—")
        row(name, *cells)
    fitted = [c for c in columns if c not in ("sklearn-gpc", "logreg")]
    header(["dataset", *fitted], title="Log marginal likelihood estimate a training row (mean) / median fitted amplitude")
    for name, cells in results.items():
        row(name, *(f"{np.mean(cells[c]['log_z']):.4f} / {np.median(cells[c]['amplitude']):.3g}" for c in fitted))


def plot(args, columns, results):
    plt = pyplot()
    if plt is None or not results:
        return
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), squeeze=False)
    for ax, (name, cells) in zip(axes[0], results.items()):
        stats = np.array([mean_se(cells[f"{args.method}@{k}"]["nll"])[:2] for k in args.iters])
        ax.errorbar(args.iters, stats[:, 0], yerr=np.nan_to_num(stats[:, 1]), fmt="o-", ms=4, capsize=2,
                    label=args.method)
        for column, style in (("fixed", "k--"), (f"{args.method}+early", "b--"), ("sklearn-gpc", "g:"),
                              ("logreg", "r-.")):
            if column in cells:
                ax.axhline(mean_se(cells[column]["nll"])[0], ls=style[1:], color=style[0], lw=1, label=column)
        paper = _paper(name, args.fraction)
        if paper:
            ax.axhline(paper[1][0], color="m", lw=1, label=paper[0])
        ax.set(xscale="log", title=name, xlabel="max_iter (hyper-parameter steps)", ylabel="test NLL")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, args.figure or ("uci_iterations_quick.png" if args.quick else "uci_iterations.png"))


def main(argv=None):
    args = parse_args(argv)
    started = begin("Test NLL against the number of hyper-parameter steps (uci_iterations.py)", args, argv,
                    imports=("sklearn.gaussian_process",))
    print(f"\n{args.splits} random {1 - args.test_fraction:.0%}/{args.test_fraction:.0%} splits (uci_binary.py's); "
          f"features standardised on the training part; m = round({args.fraction:g} * n) (multiclass: per class, "
          f"round({args.fraction:g} * n_train), Villacampa-Calvo & Hernandez-Lobato (2017)'s splits); initial inducing points: random training rows; "
          f"method {args.method}, max_iter in {args.iters}.")
    columns, results = run(args)
    print_tables(args, columns, results)
    plot(args, columns, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    end(started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
