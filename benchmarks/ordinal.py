"""Ordered classes on the real ordinal sets (wine quality, red and white): mean absolute error in class ranks and
test NLL of agpc's ordinal GP, agpc's multiclass GP, an ordinal logistic regression and a multinomial logistic
regression, over random splits.

Protocol, options and commands: benchmarks/README.md, section "ordinal.py".

    PYTHONPATH=. python benchmarks/ordinal.py
    PYTHONPATH=. python benchmarks/ordinal.py --quick   # red, 300 rows, 2 splits (generated data without the folder)
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _ordinal_logistic import OrdinalLogisticRegression
from _runner import begin, end, header, load_npz, options, parse, parse_list, row, standardise, write_json
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

from agpc import GPClassifier

SETS = ("wine_quality_red", "wine_quality_white")
MODELS = ("agpc-ordinal", "agpc-multiclass", "ordinal-logistic", "multinomial-logistic")
LABELS = {"agpc-ordinal": "agpc ordinal", "agpc-multiclass": "agpc multiclass", "ordinal-logistic": "ordinal logistic",
          "multinomial-logistic": "multinomial logistic"}
# the one refusal that means "this agpc has no ordinal likelihood" (any other error is a failure to report)
NO_ORDINAL = re.compile(r"likelihood must be .*got 'ordinal'")


class NotAvailable(Exception):
    """This agpc refuses ``likelihood="ordinal"``."""


def parse_args(argv=None):
    p = options(__doc__, "wine_quality_red subsampled to 300 rows (generated ordinal data without the data folder), "
                "2 splits, agpc max_iter 5", data_dir=True, out="ordinal")
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated sets (default {','.join(SETS)})")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated models (default {','.join(MODELS)})")
    p.add_argument("--splits", type=int, default=None, help="random stratified 90/10 splits (default 10; quick 2)")
    p.add_argument("--multiclass-method", default=None, help="agpc multiclass method (default: the library's)")
    p.add_argument("--n-inducing", default=None, help="agpc n_inducing (default: the library's)")
    p.add_argument("--max-iter", type=int, default=None, help="agpc max_iter (default: the library's; quick 5)")
    p.add_argument("--rows", type=int, default=None, help="use a random subset of this many rows (quick 300)")
    args = parse(p, argv, full=dict(splits=10), quick=dict(splits=2, max_iter=5, rows=300, blas_threads=1))
    args.sets = parse_list(args.sets, allowed=SETS, kind="set")
    args.models = parse_list(args.models, allowed=MODELS, kind="model")
    if args.n_inducing is not None and args.n_inducing != "auto":
        args.n_inducing = int(args.n_inducing)
    return args


def generated_ordinal(n, seed=0):
    """A stand-in with 5 ordered classes for the smoke test without the data folder: a smooth latent of 4 features
    plus logistic noise, cut at its quantiles 10/30/70/90%."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4))
    latent = X @ np.array([1.0, -0.6, 0.3, 0.0]) + np.sin(2.0 * X[:, 1]) + 0.5 * rng.logistic(size=n)
    return X, np.searchsorted(np.quantile(latent, [0.1, 0.3, 0.7, 0.9]), latent)


def data_sets(args):
    """name -> (X, y) of the sets found (quick: a random ``--rows`` of the first)."""
    found = {}
    for name in args.sets[:1] if args.quick else args.sets:
        if (Path(args.data_dir) / f"{name}.npz").is_file():
            X, y, _ = load_npz(args.data_dir, name)
            y = y.astype(np.int64)
        elif args.quick:
            name, (X, y) = "generated ordinal (data folder not found)", generated_ordinal(args.rows)
        else:
            print(f"{name}: {Path(args.data_dir) / (name + '.npz')} not found, skipped.")
            continue
        if args.rows is not None and args.rows < len(y):
            # stratified, so that the rarest classes keep the two rows a stratified split needs
            X, _, y, _ = train_test_split(X, y, train_size=args.rows, stratify=y, random_state=0)
        found[name] = (X, y)
    return found


def agpc_kwargs(args):
    kwargs = {}
    if args.max_iter is not None:
        kwargs["max_iter"] = args.max_iter
    if args.n_inducing is not None:
        kwargs["n_inducing"] = args.n_inducing
    return kwargs


def make_model(name, split, classes, n_train, args):
    if name == "agpc-ordinal":
        # ``classes`` (the order) is a parameter of the ordinal GPClassifier only: an agpc without it is asked for the
        # likelihood alone, and its refusal of the likelihood at fit is what marks the column "not available"
        order = {"classes": list(classes)} if "classes" in GPClassifier().get_params() else {}
        return GPClassifier(likelihood="ordinal", random_state=split, **order, **agpc_kwargs(args))
    if name == "agpc-multiclass":
        method = {"method": args.multiclass_method} if args.multiclass_method else {}
        return GPClassifier(random_state=split, **method, **agpc_kwargs(args))
    if name == "ordinal-logistic":
        return OrdinalLogisticRegression(alpha=1.0 / n_train)
    return LogisticRegression(max_iter=2000)


def fit_scored(model, X_train, y_train, X_test, y_test, classes):
    """(MAE in ranks, NLL, error rate, CPU seconds of the fit); NotAvailable where agpc refuses the likelihood."""
    t0 = time.process_time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(X_train, y_train)
    except ValueError as error:
        if NO_ORDINAL.search(str(error)):
            raise NotAvailable(str(error)) from error
        raise
    seconds = time.process_time() - t0
    proba = np.asarray(model.predict_proba(X_test), dtype=np.float64)
    model_classes = np.asarray(model.classes_)
    if not np.array_equal(model_classes, classes):
        raise ValueError(f"the model's classes {model_classes} are not the set's {classes}")
    predicted = np.argmax(proba, axis=1)  # ranks: the classes are the codes 0..C-1 in order
    p_true = proba[np.arange(len(y_test)), y_test]
    return (float(np.mean(np.abs(predicted - y_test))), float(-np.mean(np.log(np.clip(p_true, 1e-300, None)))),
            float(np.mean(predicted != y_test)), seconds)


def print_table(set_name, cells, table):
    """The set's rows (mean ± standard error over the splits), appended to ``table`` for the results file."""
    header(["set", "model", "MAE (ranks)", "test NLL", "error rate", "fit CPU s", "splits"], "llrrrrr",
           f"{set_name}: mean ± standard error over the splits")
    for name, cell in cells.items():
        if cell["note"] is not None:
            row(set_name, LABELS[name], "not available", "–", "–", "–", 0)
            table.append(dict(set=set_name, model=name, note=cell["note"]))
            continue
        values = np.asarray(cell["scores"])
        mean = values.mean(axis=0)
        se = values.std(axis=0, ddof=1) / np.sqrt(len(values)) if len(values) > 1 else np.full(4, np.nan)
        row(set_name, LABELS[name], *(f"{m:.3f} ± {s:.3f}" for m, s in zip(mean[:3], se[:3])), f"{mean[3]:.1f}",
            len(values))
        table.append(dict(set=set_name, model=name, mae=values[:, 0].tolist(), nll=values[:, 1].tolist(),
                          error=values[:, 2].tolist(), fit_cpu_s=values[:, 3].tolist()))


def main(argv=None):
    args = parse_args(argv)
    run = begin("Ordinal classification: wine quality, MAE and NLL over random splits", args, argv)
    found = data_sets(args)
    if not found:
        print("No data set found: nothing to run.")
        end(run)
        return 0
    print(f"{args.splits} random stratified 90/10 splits, features standardised on the training part; agpc options "
          f"beyond random_state: {agpc_kwargs(args) or 'none (library defaults)'}; agpc multiclass method: "
          f"{args.multiclass_method or 'the default'}.\n")
    results, table = {}, []
    for set_name, (X, y) in found.items():
        classes = np.unique(y)
        print(f"{set_name}: {len(y)} rows, {X.shape[1]} features, classes {classes.tolist()} with counts "
              f"{np.bincount(y).tolist()}", flush=True)
        for split in range(args.splits):
            X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.1, stratify=y, random_state=split)
            X_train, X_test = standardise(X_train, X_test)
            for name in args.models:
                cell = results.setdefault(set_name, {}).setdefault(name, {"scores": [], "note": None})
                if cell["note"] is not None:
                    continue
                model = make_model(name, split, classes, len(y_train), args)
                try:
                    cell["scores"].append(fit_scored(model, X_train, y_train, X_test, y_test, classes))
                except NotAvailable as refusal:
                    cell["note"] = f"not available ({refusal})"
            print(f"{set_name}: split {split} done, {time.perf_counter() - run.t0:.0f} s", file=sys.stderr, flush=True)
        print_table(set_name, results[set_name], table)
        print(flush=True)
    notes = {cell["note"] for cells in results.values() for cell in cells.values() if cell["note"]}
    for note in sorted(notes):
        print(f"\n- {note}")
    write_json(args.out, dict(args={k: v for k, v in vars(args).items() if k != "out"}, rows=table))
    end(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
