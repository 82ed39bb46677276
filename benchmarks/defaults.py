"""What a default fit costs and gives: ``GPClassifier(random_state=split)`` with nothing else set (``n_jobs`` 1 and 2),
its wall time, iterations, why it stopped and its test NLL, beside scikit-learn's LogisticRegression and
HistGradientBoostingClassifier at their defaults, and (``--candidates`` with ``agpc-all``) the fit that runs every
iteration (``plateau=None``: the default before the stop on a plateau), or (``agpc-batch``) the default fit in batch
steps on every row (``batch_size=None``, what ``batch_size="auto"`` does for binary EP up to 200,000 rows since
2026-11-30; for the other sets above 20,000 rows it would take minibatches), or (``agpc-whole``) the default fit
without its start on a random subsample (``size_rule.subsample_start_rows``, since 2026-12-01: the default before
it), or (``agpc-mb``) in minibatches of 200
(``batch_size=200``, the default of binary sets above 20,000 rows before that), and (``gpflow``, binary
sets) GPflow SVGP at its harness's defaults in its own process (``../shared/peers``; skipped, saying why, where its
environment is not built). ``--baseline DIR``: ``base-1`` and ``base-2`` are the default fits (n_jobs 1 and 2) of the
agpc of another checkout, imported beside this one (``_runner.import_baseline``), each paired with agpc-1 / agpc-2
of the same split (test NLL difference, ratio of fit times); not for fits that start local worker processes (the
data-parallel rounds of a multiclass or ordinal minibatch fit with n_jobs 2), whose workers would import this
checkout's agpc (refused with an error), nor with a growth (@G). The candidates of a split run in the order given, and
in the reverse order on odd splits, so that two candidates timed against each other take turns first.

Sets: the shared sets of 4,900 to 6,500 rows (banana; waveform and satellite, multiclass; wine_quality_white,
ordinal), airline subsets of 20,000, 50,000 and 200,000 training rows (arr_delay > 0), generated tables
(``make_classification``). 90/10 random splits (``--splits``, default 3), features standardised on the training part;
medians of the splits' wall times, mean ± SE of their test NLL. Each fit runs in this process, one after another.

BLAS: OpenBLAS's kernel is chosen at load time by ``OPENBLAS_CORETYPE`` (and its block sizes by ``OPENBLAS_L2_SIZE``);
where either is set, the script runs again in a child process with both unset (a user's machine sets neither) and
prints that table too, each under the kernel threadpoolctl reports.

    PYTHONPATH=. python benchmarks/defaults.py --sets banana,waveform,satellite,wq-white-ordinal,airline-20000,airline-50000
    PYTHONPATH=. python benchmarks/defaults.py --sets airline-200000 --splits 1
    PYTHONPATH=. python benchmarks/defaults.py --sets waveform,satellite --candidates agpc-1,base-1 --baseline /tmp/base
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from _protocol import mean_se, split_indices
from _runner import (add_blas_env_option, begin, blas_variables_set, end, header, import_baseline, options, parse,
                     parse_list, rerun_with_blas_unset, row, standardise, test_scores, write_json)
from airline import PEER_HOME, PEERS_DIR
from stopping import load

SETS = ["banana", "waveform", "satellite", "wq-white-ordinal", "airline-20000", "airline-50000", "airline-200000"]
CANDIDATES = ["agpc-1", "agpc-2", "agpc-all", "agpc-batch", "agpc-whole", "agpc-mb", "logreg", "hgb", "gpflow",
              "base-1", "base-2"]
BASELINE = "agpc_baseline"  # the package name ``--baseline``'s checkout is imported under
PEER_PYTHON = PEER_HOME / "gpflow" / "bin" / "python"  # (airline.py's --peer-python default)


def model_of(candidate, split, ordinal, method=None):
    """The estimator of ``candidate`` (nothing set but the seed, n_jobs, ``method`` where given and, for agpc-all,
    plateau=None; for agpc-batch, batch_size=None; for agpc-mb, batch_size=200; agpc-whole is agpc-1's, fitted without
    the start on a subsample: ``run_one``)."""
    if candidate == "logreg":
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=1000)
    if candidate == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(random_state=split)
    if candidate.startswith("base-"):  # (the baseline checkout's, imported by ``main``)
        GPClassifier = importlib.import_module(BASELINE).GPClassifier
    else:
        from agpc import GPClassifier

    extra = {"likelihood": "ordinal"} if ordinal else {}
    if method is not None:
        extra["method"] = method
    if candidate == "agpc-all":
        extra["plateau"] = None
    if candidate == "agpc-batch":  # (every row a step, whatever batch_size="auto" would choose)
        extra["batch_size"] = None
    if candidate == "agpc-mb":  # (minibatches of 200, whatever batch_size="auto" would choose)
        extra["batch_size"] = 200
    return GPClassifier(random_state=split, n_jobs=2 if candidate.endswith("-2") else None, **extra)


def growth_of(candidate):
    """(candidate without its "@G" suffix, G or None): ``agpc-1@1.02`` is agpc-1 with Rprop's growth in the sparse
    model's binary batch fits set to 1.02 (``engines.SPARSE_BATCH_GROWTH``; docs/small_data_defaults.md, "Rprop's
    growth")."""
    base, _, growth = candidate.partition("@")
    return base, (float(growth) if growth else None)


def peer_missing():
    """Why GPflow's harness cannot run here (None: it can)."""
    if not (PEERS_DIR / "gpflow_svgp.py").is_file():
        return f"no harness at {PEERS_DIR}"
    if not PEER_PYTHON.is_file():
        return f"no GPflow environment at {PEER_PYTHON} (../shared/peers/README.md builds it)"
    return None


def run_gpflow(name, split, X_train, y_train, X_test, y_test):
    """GPflow SVGP through ../shared/peers/gpflow_svgp.py in its own process, at the harness's defaults (ARD RBF,
    probit, whitened q(u), m = 200 k-means inducing points, minibatches of 200, Adam 0.01, 100 epochs, threads = the
    CPU count), on this split written to a temporary folder (labels as -1 / +1). Seconds: the harness's training
    seconds (its test scoring after each epoch excluded; the first step's graph tracing included); wall: the
    process's (TensorFlow's import and the k-means too). None where the set has more than two classes."""
    classes = np.unique(y_train)
    if classes.size != 2:
        return None
    with tempfile.TemporaryDirectory(prefix="agpc-peer-") as folder:
        for file, array in (("X_train", X_train), ("X_test", X_test),
                            ("y_train", np.where(y_train == classes[1], 1.0, -1.0)),
                            ("y_test", np.where(y_test == classes[1], 1.0, -1.0))):
            np.save(Path(folder) / f"{file}.npy", np.ascontiguousarray(array, dtype=np.float64))
        started = time.perf_counter()
        done = subprocess.run([str(PEER_PYTHON), str((PEERS_DIR / "gpflow_svgp.py").resolve()), folder, "--seed",
                               str(split), "--threads", str(os.cpu_count() or 1)],
                              capture_output=True, text=True, cwd=str(PEERS_DIR))
        wall = time.perf_counter() - started
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = next((record for record in records if record.get("summary")), None)
    if done.returncode != 0 or summary is None:
        raise RuntimeError(f"GPflow harness failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"candidate": "gpflow", "set": name, "split": split, "n_train": int(X_train.shape[0]),
            "seconds": summary["train_s"], "wall": wall, "nll": summary["final_test_nll"],
            "error": summary["final_test_err"], "n_iter": summary["epochs_run"], "stop_reason": summary["stopped_by"],
            "n_jobs_used": summary["threads"]}


@contextlib.contextmanager
def no_baseline_workers(candidate):
    """For a baseline candidate (base-1 / base-2), its fit's local worker processes refused with an error: they would
    import this checkout's agpc (``workers`` boots them with ``from agpc.workers import serve``), and time it."""
    if not candidate.startswith("base-"):
        yield
        return
    workers = importlib.import_module(f"{BASELINE}.workers")
    pool = workers.LocalWorkers

    def refused(*args, **kwargs):
        raise RuntimeError(f"{candidate}: the baseline's fit would start local worker processes, which import this "
                           "checkout's agpc: not comparable (leave this set or candidate out)")

    workers.LocalWorkers = refused
    try:
        yield
    finally:
        workers.LocalWorkers = pool


def run_one(candidate, name, split, X, y, method=None):
    from agpc import size_rule
    from agpc.inference import engines

    train, test = split_indices(X.shape[0], split, 0.10)
    X_train, X_test = standardise(X[train], X[test])
    if candidate == "gpflow":
        return run_gpflow(name, split, X_train, y[train], X_test, y[test])
    base, growth = growth_of(candidate)
    model = model_of(base, split, name.endswith("ordinal"), method)
    default_growth, default_subsample = engines.SPARSE_BATCH_GROWTH, size_rule.subsample_start_rows
    engines.SPARSE_BATCH_GROWTH = default_growth if growth is None else growth
    if base == "agpc-whole":  # (every fit on all rows from the start, as before the subsample start)
        size_rule.subsample_start_rows = lambda *args, **kwargs: None
    started = time.perf_counter()
    try:
        with warnings.catch_warnings(), no_baseline_workers(base):
            warnings.simplefilter("ignore", category=UserWarning)  # (LogisticRegression's convergence, in n_iter)
            model.fit(X_train, y[train])
    finally:
        engines.SPARSE_BATCH_GROWTH, size_rule.subsample_start_rows = default_growth, default_subsample
    seconds = time.perf_counter() - started
    nll, error = test_scores(model, X_test, y[test])
    iterations = getattr(model, "n_iter_", None)
    if iterations is not None and not np.isscalar(iterations):
        iterations = int(np.max(iterations))
    return {"candidate": candidate, "set": name, "split": split, "n_train": int(X_train.shape[0]), "seconds": seconds,
            "nll": nll, "error": error, "n_iter": None if iterations is None else int(iterations),
            "stop_reason": getattr(model, "stop_reason_", None), "n_jobs_used": getattr(model, "n_jobs_", None),
            "subsample_iter": getattr(model, "subsample_iter_", None)}


def print_table(results, sets, candidates):
    header(["set (train rows)", "candidate", "fit s (median)", "iterations (median)", "on the subsample first",
            "stopped", "test NLL", "error"], "llrrrlll", title="Default fits")
    for name in sets:
        for candidate in candidates:
            mine = [r for r in results if r["set"] == name and r["candidate"] == candidate]
            if not mine:
                continue
            nll, nll_se, _ = mean_se([r["nll"] for r in mine])
            err, err_se, _ = mean_se([r["error"] for r in mine])
            its = [r["n_iter"] for r in mine if r["n_iter"] is not None]
            reasons = sorted({r["stop_reason"] for r in mine if r["stop_reason"]})
            first = [r["subsample_iter"] for r in mine if r.get("subsample_iter")]
            row(f"{name} ({mine[0]['n_train']:,})", candidate, f"{np.median([r['seconds'] for r in mine]):.1f}",
                f"{np.median(its):.0f}" if its else "–", f"{np.median(first):.0f}" if first else "–",
                ", ".join(reasons) or "–",
                f"{nll:.4f} ± {0 if np.isnan(nll_se) else nll_se:.4f}", f"{err:.4f} ± {0 if np.isnan(err_se) else err_se:.4f}")
    growths = [c for c in candidates if "@" in c]
    for name in sets:  # each growth against the first one asked, paired by split
        first = {r["split"]: r["nll"] for r in results if r["set"] == name and growths and r["candidate"] == growths[0]}
        for candidate in growths[1:]:
            mine = [r["nll"] - first[r["split"]] for r in results
                    if r["set"] == name and r["candidate"] == candidate and r["split"] in first]
            if mine:
                diff, se, _ = mean_se(mine)
                print(f"- {name}, {candidate} - {growths[0]}: test NLL {diff:+.4f} ± {0 if np.isnan(se) else se:.4f}")
    for base, said in (("agpc-all", "the fit of every iteration"),
                       ("agpc-whole", "the fit without the start on a subsample"),
                       ("base-1", "the baseline checkout's fit, n_jobs 1 (--baseline)"),
                       ("base-2", "the baseline checkout's fit, n_jobs 2 (--baseline)")):
        lines = []
        for name, candidate in [(name, c) for name in sets for c in candidates if c.startswith("agpc-")
                                and c not in ("agpc-all", base) and "@" not in c
                                and (not base.startswith("base-") or c == "agpc-" + base[-1])]:
            reference = {r["split"]: r for r in results if r["set"] == name and r["candidate"] == base}
            mine = [r for r in results if r["set"] == name and r["candidate"] == candidate and r["split"] in reference]
            if mine:
                diff, se, _ = mean_se([r["nll"] - reference[r["split"]]["nll"] for r in mine])
                ratio = np.median([r["seconds"] / reference[r["split"]]["seconds"] for r in mine])
                lines.append(f"- {name}, {candidate} - {base}: test NLL {diff:+.4f} ± "
                             f"{0 if np.isnan(se) else se:.4f}, fit time x{ratio:.2f} (median of the splits' ratios)")
        if lines:
            print(f"\nPaired to {said} (same splits):\n")
            print("\n".join(lines))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = options(__doc__, "one split of a 2,000-row generated table, agpc-1 and logreg", data_dir=True,
                out="defaults")
    p.add_argument("--sets", default=None, help=f"comma list of {SETS} or clf-NxD (default: all but airline-200000)")
    p.add_argument("--candidates", default=None, help=f"comma list of {CANDIDATES} (default: all but agpc-all); an "
                   "agpc candidate with @G (agpc-1@1.02) fits with Rprop's growth G in the sparse model's binary batch fits")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits a set (default 3)")
    p.add_argument("--baseline", default=None, help="another checkout, whose agpc the candidates base-1 / base-2 fit")
    p.add_argument("--method", default=None, help="the agpc candidates' method (default: the default method, ep)")
    add_blas_env_option(p)
    args = parse(p, argv, full=dict(sets=",".join(SETS[:-1]), candidates="agpc-1,agpc-2,logreg,hgb", splits=3),
                 quick=dict(sets="clf-2000x10", candidates="agpc-1,logreg", splits=1))
    args.sets = parse_list(args.sets)
    args.candidates = parse_list(args.candidates)
    parse_list(",".join(growth_of(c)[0] for c in args.candidates), CANDIDATES, "candidate")  # (refuses unknown ones)
    if any(c.startswith("base-") for c in args.candidates) != bool(args.baseline):
        p.error("the candidates base-1 / base-2 and --baseline DIR go together")
    if any(c.startswith("base-") and "@" in c for c in args.candidates):
        p.error("a growth (@G) patches this checkout's engines, not the baseline's: base-1 / base-2 take none")
    if args.baseline:
        import_baseline(args.baseline)
    run = begin("Default fits: time, iterations and test NLL", args, argv)
    if args.baseline:
        print(f"Baseline (base-1 / base-2): the agpc of {Path(args.baseline).resolve()}, imported as {BASELINE}\n")
    if args.method:
        print(f"The agpc candidates fit method={args.method!r}, nothing else set\n")
    set_here = blas_variables_set()
    results = []
    for name in args.sets:
        data = load(name, args.data_dir)
        if data is None:
            print(f"{name}: data not found, skipped")
            continue
        X, y = data
        for split in range(args.splits):
            for candidate in (args.candidates if split % 2 == 0 else args.candidates[::-1]):
                if candidate == "gpflow" and (peer_missing() or name.endswith("ordinal")):
                    print(f"{name} split {split} gpflow: skipped ({peer_missing() or 'ordinal labels'})", flush=True)
                    continue
                result = run_one(candidate, name, split, X, y, args.method)
                if result is None:
                    print(f"{name} split {split} {candidate}: skipped (more than two classes)", flush=True)
                    continue
                results.append(result)
                print(f"{name} split {split} {candidate}: {results[-1]['seconds']:.1f} s, NLL {results[-1]['nll']:.4f}"
                      + (f" (process wall {result['wall']:.1f} s)" if "wall" in result else ""), flush=True)
    print_table(results, args.sets, args.candidates)
    write_json(args.out, {"results": results,
                          "baseline": str(Path(args.baseline).resolve()) if args.baseline else None})
    if set_here and args.blas_env == "both":
        rerun_with_blas_unset(__file__, argv)
    end(run)


if __name__ == "__main__":
    main()
