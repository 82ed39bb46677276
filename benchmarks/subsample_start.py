"""How a start on a random subsample was chosen (``agpc.size_rule.subsample_start_rows``): the default binary batch
fit on all rows alone against a fit on a random subsample of them, then one on all rows from the kernel and inducing
points it reached, stopping on a window of W steps; one BLAS thread, the fits one after another in this process.

Variants: ``whole`` (the default fit on all rows alone: ``GPClassifier(random_state=split)``, 20-step window above
20,000 rows, as before 2026-12-01) and ``SUBwW`` (``10000w5``: a fit on SUB rows drawn at random, then
``GPClassifier(random_state=split, kernel=its kernel_, inducing=its inducing_points_)`` on all rows with the window of
batch fits above 20,000 rows set to W for it). Every fit here runs with the library's own start on a subsample turned
off (this script asks for it by hand): ``10000w5`` is what the default does since then, but for the subsample's draw
(uniform here, stratified by class there) and the priors' centres (the second fit re-centres them on all rows'
default kernel, as the first one did). 90/10 random splits (the generator of the split number; the test part's
rows are the same as ``benchmarks/stopping.py``'s ``load`` sets drawn), features standardised on the training part.
The record of 2026-12-01: benchmarks/results/subsample_start.md (its fits ran from a scratch script of the same fits
before this one was written; this script's run of airline-50000, at the end of the record, gives the same iterations
and test NLL).

    PYTHONPATH=.:benchmarks python benchmarks/subsample_start.py --sets airline-50000,clf-50000x20 --splits 0,1 \\
        --variants whole,10000w20,10000w5,5000w5
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
from _protocol import mean_se
from _runner import begin, end, header, options, parse, parse_list, patched, row
from stopping import load


def fit_variant(variant, split, X_train, y_train):
    """(model, record) of one variant's fit (the library's start on a subsample off)."""
    from agpc import GPClassifier, size_rule

    started = time.perf_counter()
    with patched(size_rule, "subsample_start_rows", lambda original: lambda *args, **kwargs: None):
        if variant == "whole":
            model = GPClassifier(random_state=split).fit(X_train, y_train)
            return model, {"seconds": time.perf_counter() - started}
        rows, window = (int(v) for v in variant.split("w"))
        n = X_train.shape[0]
        picked = np.random.default_rng(split + 100).choice(n, min(rows, n), replace=False)
        first = GPClassifier(random_state=split).fit(X_train[picked], y_train[picked])
        first_seconds = time.perf_counter() - started
        with patched(size_rule, "LARGE_BATCH_PLATEAU_STEPS", lambda original: window):
            model = GPClassifier(random_state=split, kernel=first.kernel_, inducing=first.inducing_points_).fit(
                X_train, y_train)
    return model, {"seconds": time.perf_counter() - started, "subsample_seconds": first_seconds,
                   "subsample_iter": int(first.n_iter_)}


def nll(model, X_test, y_test):
    proba = model.predict_proba(X_test)
    column = np.searchsorted(model.classes_, y_test)
    return float(-np.mean(np.log(np.clip(proba[np.arange(len(y_test)), column], 1e-300, None))))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = options(__doc__, "moons-30000, split 0, whole and 10000w5", data_dir=True, blas_threads=1)
    p.add_argument("--sets", default=None, help="comma list of benchmarks/stopping.py's sets (clf-NxD, moons-N, "
                   "airline-N)")
    p.add_argument("--splits", default=None, help="comma list of split numbers (default 0,1)")
    p.add_argument("--variants", default=None, help="comma list of whole and SUBwW (default whole,10000w5)")
    args = parse(p, argv, full=dict(sets="airline-50000,clf-50000x20", splits="0,1", variants="whole,10000w5"),
                 quick=dict(sets="moons-30000", splits="0", variants="whole,10000w5"))
    sets, variants = parse_list(args.sets), parse_list(args.variants)
    splits = parse_list(args.splits, convert=int)
    run = begin("A start on a random subsample: fit time and test NLL against the fit on all rows alone", args, argv)
    records = []
    for name in sets:
        data = load(name, args.data_dir)
        if data is None:
            print(f"{name}: data not found, skipped")
            continue
        X, y = data
        for split in splits:
            perm = np.random.default_rng(split).permutation(len(y))
            n = len(y) * 9 // 10
            train, test = perm[:n], perm[n:]
            mean, std = X[train].mean(0), X[train].std(0)
            std[std == 0] = 1.0
            X_train, X_test = (X[train] - mean) / std, (X[test] - mean) / std
            for variant in variants:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", category=UserWarning)
                    model, record = fit_variant(variant, split, X_train, y[train])
                record.update(set=name, split=split, variant=variant, iterations=int(model.n_iter_),
                              stop=model.stop_reason_, nll=nll(model, X_test, y[test]))
                records.append(record)
                print(json.dumps(record), flush=True)
    header(["set", "variant", "splits", "fit s (median)", "x whole (median)", "iterations on all rows",
            "test NLL - whole"], "llrrrrr", title="Against the fit on all rows alone, paired by split")
    for name in sets:
        whole = {r["split"]: r for r in records if r["set"] == name and r["variant"] == "whole"}
        for variant in variants:
            mine = [r for r in records if r["set"] == name and r["variant"] == variant and r["split"] in whole]
            if not mine:
                continue
            diff, se, _ = mean_se([r["nll"] - whole[r["split"]]["nll"] for r in mine])
            row(name, variant, len(mine), f"{np.median([r['seconds'] for r in mine]):.1f}",
                f"{np.median([r['seconds'] / whole[r['split']]['seconds'] for r in mine]):.2f}",
                f"{np.median([r['iterations'] for r in mine]):.0f}",
                f"{diff:+.4f}" + (f" ± {se:.4f}" if np.isfinite(se) else ""))
    end(run)


if __name__ == "__main__":
    main()
