"""The study behind the default fit's stop on a plateau (``GPClassifier(plateau="auto")``, ``agpc.size_rule``,
docs/usage.md "When a fit stops"): log Z and the test NLL after every recorded iteration of default fits run to
``max_iter``, and the stop each candidate rule would have made on them.

Phase one (``--record``) fits ``GPClassifier(random_state=split, plateau=None)`` (nothing else set: the default
method, model size and batch size) with the test part as ``validation_data``, so that the history holds the test
NLL after every batch step or every minibatch epoch, and writes the histories to a JSON file. Phase two (the default)
reads that file and replays the candidate rules on the recorded log Z exactly as the training loop's
``hooks.Plateau`` reads it: stop at the first recorded iteration past the warm-up and past ``steps`` recorded
iterations where log Z rose by less than ``rise`` nats a training row over the last ``steps`` of them. For each
rule: iterations to the stop, the share of the fit's time, and the test NLL at the stop minus the NLL after all
``max_iter`` iterations (paired per split, mean ± SE), per set.

Sets (none of issue 43's three): the shared sets of 4,000-6,500 rows (banana, waveform and satellite multiclass,
wine_quality_white ordinal), generated tables (scikit-learn's ``make_classification`` and ``make_moons``), airline
subsets (18,000 rows: the full batch; 50,000 and 200,000: minibatches of 200, ``--batch-size 200`` since the
default takes batch steps there). 90/10 random splits, features standardised on the training part, one BLAS thread
(the curves, not the times, are the point).

    PYTHONPATH=. python benchmarks/stopping.py --record --sets batch --splits 3 --out benchmarks/results/stopping_batch.json
    PYTHONPATH=. python benchmarks/stopping.py --record --sets minibatch --batch-size 200 --splits 2 --out benchmarks/results/stopping_minibatch.json

Batch steps above 20,000 rows (binary EP's default up to 200,000 rows: docs/small_data_defaults.md, "Batch steps up
to 200,000 rows"), replayed at the default ``max_iter`` (260 records with the warm-up) against the minibatch fits'
test NLL of the same splits (``--reference``):

    PYTHONPATH=. python benchmarks/stopping.py --record --sets airline-50000,clf-50000x20 --splits 2 --max-iter 400 \
        --batch-size 1000000 --out batch50k.json
    PYTHONPATH=. python benchmarks/stopping.py --record --sets airline-200000 --splits 1 --batch-size 1000000 \
        --out batch200k.json
    PYTHONPATH=. python benchmarks/stopping.py batch50k.json batch200k.json --cap 260 --reference \
        airline-50000:0=0.6086,airline-50000:1=0.6208,clf-50000x20:0=0.2210,clf-50000x20:1=0.2422,airline-200000:0=0.6110
    PYTHONPATH=. python benchmarks/stopping.py benchmarks/results/stopping_batch.json benchmarks/results/stopping_minibatch.json

``--per-class`` replays the rules with their rise a row and latent function (a multiclass fit's classes; one for
binary and ordinal fits), the rule tried for multiclass fits (docs/small_data_defaults.md, "A rise a row and class"):

    PYTHONPATH=. python benchmarks/stopping.py --record --sets waveform,satellite,svmguide2 --splits 3 --out mc3.json
    PYTHONPATH=. python benchmarks/stopping.py --record --sets vehicle,vowel --splits 10 --out mc10.json
    PYTHONPATH=. python benchmarks/stopping.py --per-class mc3.json mc10.json
    PYTHONPATH=. python benchmarks/stopping.py --per-class sqrt mc3.json mc10.json   # or C-1, log2: slower in C
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from _protocol import mean_se, split_indices
from _runner import begin, end, load_airline, load_npz, options, parse, parse_list, standardise, write_json

BATCH_SETS = ["banana", "waveform", "satellite", "wq-white-ordinal", "clf-2000x10", "clf-10000x20", "moons-5000",
              "airline-18000"]
MINIBATCH_SETS = ["airline-50000", "clf-50000x20", "airline-200000"]
# Candidate rules: (steps, rise in nats a training row), batch and minibatch alike (a minibatch fit records an epoch)
STEPS = (3, 5, 10, 20)
RISES = (1e-5, 3e-5, 1e-4, 2e-4, 3e-4, 1e-3)
# ``--per-class``: the rise a row scaled by a function of a multiclass fit's latent functions C (binary and ordinal
# fits: 1): C itself, or a slower growth that asks less of many classes (vowel's 11)
CLASS_SCALINGS = {"C": lambda c: c, "C-1": lambda c: c - 1, "sqrt": math.sqrt, "log2": math.log2}


def load(name, data_dir):
    """(X, y) of a study set (class codes), or None when its file is absent."""
    from sklearn import datasets as sk

    if name.startswith("clf-"):
        n, d = (int(v) for v in name[4:].split("x"))
        return sk.make_classification(n, d, n_informative=max(2, d // 3), n_redundant=d // 3, flip_y=0.05,
                                      random_state=0)
    if name.startswith("moons-"):
        return sk.make_moons(int(name[6:]), noise=0.3, random_state=0)
    if name.startswith("airline-"):
        path = Path(data_dir) / "airline2008.npz"
        if not path.is_file():
            return None
        X, y, _ = load_airline(path)
        rows = np.random.default_rng(0).choice(X.shape[0], size=int(name[8:]) * 10 // 9, replace=False)
        return X[rows], y[rows]
    file = {"wq-white-ordinal": "wine_quality_white"}.get(name, name)
    if not (Path(data_dir) / f"{file}.npz").is_file():
        return None
    X, y, _ = load_npz(data_dir, file)
    return X, y


def record(args):
    runs = []
    for name in args.sets:
        data = load(name, args.data_dir)
        if data is None:
            print(f"{name}: data not found, skipped", flush=True)
            continue
        X, y = data
        for split in range(1 if (X.shape[0] > 100_000 and args.one_split_large) else args.splits):
            runs.append(record_one(name, split, X, y, args.max_iter, args.batch_size))
            write_json(args.out, {"runs": runs, "max_iter": args.max_iter})


def record_one(name, split, X, y, max_iter, batch_size="auto"):
    """One default fit's curves on split ``split`` of (X, y) (``batch_size``: the default's, or another)."""
    from agpc import GPClassifier

    train, test = split_indices(X.shape[0], split, 0.10)
    X_train, X_test = standardise(X[train], X[test])
    options = {"likelihood": "ordinal"} if name.endswith("ordinal") else {}
    model = GPClassifier(random_state=split, plateau=None, max_iter=max_iter, batch_size=batch_size, **options)
    started = time.perf_counter()
    model.fit(X_train, y[train], validation_data=(X_test, y[test]))
    seconds = time.perf_counter() - started
    h = model.history_
    print(f"{name} split {split}: {len(h['log_marginal_likelihood'])} records, {seconds:.1f} s, "
          f"final test NLL {h['validation_nll'][-1]:.4f}", flush=True)
    return {"set": name if batch_size == "auto" else f"{name} (batch {batch_size})", "split": split, "n_train": int(X_train.shape[0]), "seconds": seconds,
            "n_warmup": int(model.n_warmup_), "minibatch": h["n_steps"][0] > 1 + model.n_warmup_,
            "log_z": [float(v) for v in h["log_marginal_likelihood"]], "time": [float(v) for v in h["time"]],
            "val_step": [int(v) for v in h["validation_step"]], "val_nll": [float(v) for v in h["validation_nll"]],
            "n_steps": [int(v) for v in h["n_steps"]], "method": model.method, "n_classes": int(len(model.classes_)),
            "ordinal": name.endswith("ordinal"),
            "n_inducing": int(model.inducing_points_.shape[-2])}


def stop_index(log_z, warmup, steps, rise):
    """The recorded iteration (index into ``log_z``) at which ``hooks.Plateau`` with (steps, rise) stops, or the
    last one."""
    for k in range(len(log_z)):
        if k + 1 <= warmup + steps or k < steps:
            continue
        if log_z[k] - log_z[k - steps] < rise:
            return k
    return len(log_z) - 1


def nll_at(run, index):
    """The test NLL recorded at the recorded iteration ``index`` (the validation record of the same step)."""
    step = run["n_steps"][index]
    at = {s: v for s, v in zip(run["val_step"], run["val_nll"])}
    if step in at:
        return at[step]
    before = [s for s in run["val_step"] if s <= step]
    return at[before[-1]] if before else float("nan")


def latent_functions(run):
    """The latent functions of a recorded fit: one a class for more than two (multiclass EP), else one (binary,
    ordinal); ``--per-class`` scales a rule's rise by it."""
    if "n_classes" not in run:
        raise SystemExit(f"{run['set']}: recorded without its classes; record it again for --per-class")
    return run["n_classes"] if run["n_classes"] > 2 and not run.get("ordinal") else 1


def analyse(paths, per_class=None, cap=None, reference=None):
    """The rules replayed on the recorded runs of ``paths`` (their first ``cap`` records where given: a fit whose
    ``max_iter`` is that many records less its warm-up). ``reference``: {(set, split): test NLL} the stops are
    compared with instead of each run's own last record (another fit of the same split: ``--reference``)."""
    runs = []
    for path in paths:
        runs += json.loads(Path(path).read_text())["runs"]
    if cap is not None:
        runs = [dict(r, log_z=r["log_z"][:cap], time=r["time"][:cap], n_steps=r["n_steps"][:cap]) for r in runs]
    seen = set()  # (a run recorded twice, in two files: its first record)
    runs = [r for r in runs if (r["set"], r["split"]) not in seen and not seen.add((r["set"], r["split"]))]

    def baseline(run):
        if reference is None:
            return nll_at(run, len(run["log_z"]) - 1)
        return reference[(run["set"].split(" (batch")[0], run["split"])]
    sets = list(dict.fromkeys(r["set"] for r in runs))
    for kind in (False, True):
        chosen = [r for r in runs if r["minibatch"] == kind]
        if not chosen:
            continue
        print(f"\n### {'Minibatch' if kind else 'Batch'} fits: iterations to the stop (share of the fit's time), "
              "test NLL at the stop - at max_iter (mean ± SE over splits)\n")
        unit = f"row x {per_class} (C: latent functions)" if per_class else "row"
        print(f"| rule (steps, rise / {unit}) | " + " | ".join(s for s in sets if any(r["set"] == s for r in chosen))
              + " | worst set | mean share of time |")
        print("|---|" + "---|" * (sum(any(r["set"] == s for r in chosen) for s in sets) + 2))
        for steps, rise in itertools.product(STEPS, RISES):
            cells, worst, shares = [], -math.inf, []
            for name in sets:
                mine = [r for r in chosen if r["set"] == name]
                if not mine:
                    continue
                diffs, counts = [], []
                for r in mine:
                    latent = latent_functions(r) if per_class else 1  # (older records without their classes)
                    scale = CLASS_SCALINGS[per_class](latent) if latent > 1 else 1
                    k = stop_index(r["log_z"], r["n_warmup"], steps, rise * scale * r["n_train"])
                    diffs.append(nll_at(r, k) - baseline(r))
                    counts.append(k + 1)
                    shares.append(r["time"][k] / r["time"][-1])
                mean, se, _ = mean_se(diffs)
                worst = max(worst, mean)
                cells.append(f"{np.mean(counts):.0f} {mean:+.4f} ± {0 if math.isnan(se) else se:.4f}")
            print(f"| {steps}, {rise:g} | " + " | ".join(cells) + f" | {worst:+.4f} | {np.mean(shares):.2f} |")
        print("\nRecorded iterations at max_iter and test NLL there: " + "; ".join(
            f"{s} {len(r['log_z'])} it, {nll_at(r, len(r['log_z']) - 1):.4f}" for s in sets for r in chosen
            if r["set"] == s and r["split"] == 0))
        if reference is not None:
            print("(the NLL differences are to --reference: " + "; ".join(f"{s} split {k}: {v:.4f}" for (s, k), v in
                                                                     reference.items()) + ")")


def main(argv=None):
    p = options(__doc__, "one split of clf-2000x10, 40 iterations, recorded and analysed", data_dir=True,
                out="stopping", blas_threads=1)
    p.add_argument("files", nargs="*", help="recorded JSON files to analyse (without --record)")
    p.add_argument("--record", action="store_true", help="record the curves (phase one) into --out")
    p.add_argument("--sets", default=None, help="'batch', 'minibatch' or a comma list of set names")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits a set (default 3)")
    p.add_argument("--one-split-large", action="store_true", help="one split of sets of more than 100,000 rows")
    p.add_argument("--max-iter", type=int, default=None, help="iterations (epochs) a fit runs (default 250)")
    p.add_argument("--per-class", nargs="?", const="C", default=None, choices=sorted(CLASS_SCALINGS),
                   help="the rules' rise a row times C, the latent functions of a multiclass fit (one a class), or "
                        "C-1, sqrt or log2 of C (default with the flag alone: C); not a row's")
    p.add_argument("--batch-size", default="auto", type=lambda v: v if v == "auto" else int(v),
                   help="rows a step (default: the library's choice)")
    p.add_argument("--cap", type=int, default=None, help="replay on the first CAP records of each run (a max_iter)")
    p.add_argument("--reference", default=None, help="SET:SPLIT=NLL,...: compare the stops with these test NLLs "
                   "(another fit of the split) instead of each run's last record")
    args = parse(p, argv, full=dict(sets="batch", splits=3, max_iter=250),
                 quick=dict(sets="clf-2000x10", splits=1, max_iter=40))
    args.sets = {"batch": BATCH_SETS, "minibatch": MINIBATCH_SETS}.get(args.sets) or parse_list(args.sets)
    run = begin("Stopping study: the curves of default fits and the stop each rule makes on them", args,
                argv if argv is not None else sys.argv[1:])
    if args.record or args.quick:
        record(args)
    reference = None
    if args.reference:
        reference = {(item.split(":")[0], int(item.split(":")[1].split("=")[0])): float(item.split("=")[1])
                     for item in args.reference.split(",")}
    analyse([args.out] if args.quick else args.files, per_class=args.per_class, cap=args.cap, reference=reference)
    end(run)


if __name__ == "__main__":
    main()
