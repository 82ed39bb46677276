"""The papers' evaluation protocol, shared by the accuracy benchmarks (uci_binary.py, uci_multiclass.py,
banana_inducing.py, time_curves.py, uci_iterations.py, small_data_defaults.py, size_rule.py).

* ``split_indices``: random train/test split number ``split`` (``numpy.random.default_rng(split)``);
* ``table_options`` / ``parse_table_options``: the papers' table scripts' options and their defaults;
* ``method_available``: whether this agpc knows a method (``gfitc`` may be missing) for 2 or more classes;
* ``ML_SUFFIX``: "ep-ml" is "ep" with ``kernel_prior=None`` (type-II maximum likelihood, the fits before the
  default priors of docs/small_data_defaults.md): ``with_ml_twins`` adds it beside each method (before / after);
* ``run_grid``: every (dataset, split, inducing fraction, method) fit, failures recorded, not fatal;
* ``print_accuracy_tables``: per inducing fraction, NLL / error / time tables with a paper's numbers
  beside ours and a mark where ours is worse by more than one standard error of the difference.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _runner import RESULTS_DIR, end, options, parse, parse_list, standardise, test_scores

WORSE_MARK = "†"


# -- data and splits ------------------------------------------------------------------------------

def split_indices(n, split, test_fraction):
    """Random split number ``split``: (train rows, test rows), round((1 - test_fraction) n) for training."""
    rng = np.random.default_rng(split)
    perm = rng.permutation(n)
    n_train = int(round((1.0 - test_fraction) * n))
    return perm[:n_train], perm[n_train:]


def standardised_splits(X, y, splitter):
    """split -> (X_train, y_train, X_test, y_test, n) standardised on the training part, where
    ``splitter(split)`` gives (train rows, test rows): the task form ``run_grid`` takes."""

    def split_fn(split):
        train, test = splitter(split)
        X_train, X_test = standardise(X[train], X[test])
        return X_train, y[train], X_test, y[test], X.shape[0]

    return split_fn


# -- statistics and formatting --------------------------------------------------------------------

def mean_se(values):
    """(mean, standard error, standard deviation with ddof=1); NaN where undefined."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    std = float(np.std(v, ddof=1)) if v.size > 1 else float("nan")
    return float(np.mean(v)), std / math.sqrt(v.size) if v.size > 1 else float("nan"), std


def fmt(mean, spread, digits=3):
    if not math.isfinite(mean):
        return "—"
    return f"{mean:.{digits}f} ± {spread:.{digits}f}" if math.isfinite(spread) else f"{mean:.{digits}f}"


def worse_by_more_than_one_se(ours_mean, ours_se, paper_mean, paper_se):
    """True when ours - paper > sqrt(ours_se^2 + paper_se^2) (lower is better); a single split has SE 0."""
    if not math.isfinite(ours_mean):
        return False
    se = math.sqrt((ours_se if math.isfinite(ours_se) else 0.0) ** 2 + paper_se ** 2)
    return ours_mean - paper_mean > se


# -- methods --------------------------------------------------------------------------------------

def table_options(doc, quick, *, datasets, methods, fractions, splits):
    """The options of the papers' table scripts (uci_binary.py, uci_multiclass.py) on the runner's: which
    ``datasets`` and ``methods`` (of each, comma lists), how many ``splits``, the inducing ``fractions``,
    ``--max-iter``, the initial inducing points, ``--kernel-prior`` and the outputs."""
    p = options(doc, quick, data_dir=True)
    p.add_argument("--datasets", default=None, help=f"comma-separated subset of {','.join(datasets)}")
    p.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(methods)}")
    p.add_argument("--splits", type=int, default=None, help=f"random splits (default 20; quick 1): {splits}")
    p.add_argument("--fractions", default=None, help=f"m as fractions (default {fractions})")
    p.add_argument("--max-iter", type=int, default=None, help="agpc max_iter (default 250 as the papers; quick 5)")
    p.add_argument("--inducing", choices=("random", "kmeans"), default="random",
                   help="initial inducing points (default random training rows, as the papers)")
    p.add_argument("--json", default=None, help="also write the per-split results to this JSON file")
    p.add_argument("--figure", default=None, help="PNG name in benchmarks/results")
    p.add_argument("--kernel-prior", choices=("auto", "none", "both"), default="auto",
                   help="agpc's kernel_prior: the default 'auto', 'none' (maximum likelihood: methods named "
                        "M-ml), or 'both' (before / after on the same splits)")
    return p


def parse_table_options(p, argv, *, datasets, methods, allowed_methods, fractions, quick_dataset, quick_fraction):
    """Parse ``table_options``: an option left unset takes ``--quick``'s value (one split of ``quick_dataset``, m =
    ``quick_fraction``, 5 iterations, 1 BLAS thread) or the papers' protocol (all ``datasets``, 20 splits, m =
    ``fractions``, 250 iterations); the comma lists parsed."""
    args = parse(p, argv, full=dict(datasets=",".join(datasets), methods=",".join(methods), splits=20,
                                    fractions=fractions, max_iter=250),
                 quick=dict(datasets=quick_dataset, splits=1, fractions=quick_fraction, max_iter=5, blas_threads=1))
    args.datasets = parse_list(args.datasets, datasets, "dataset")
    args.methods = parse_list(args.methods, allowed_methods, "method")
    args.fractions = parse_list(args.fractions, convert=float)
    return args


ML_SUFFIX = "-ml"


def base_method(method):
    """The agpc method of a benchmark method name ("ep-ml" -> "ep")."""
    return method[:-len(ML_SUFFIX)] if method.endswith(ML_SUFFIX) else method


def with_ml_twins(methods, skip=()):
    """Each agpc method M followed by M-ml (the same fit with kernel_prior=None); ``skip``: not agpc methods."""
    out = []
    for method in methods:
        out += [method] if method in skip or method.endswith(ML_SUFFIX) else [method + ML_SUFFIX, method]
    return out


def methods_for_kernel_prior(methods, kernel_prior, skip=()):
    """The benchmark's method names for ``--kernel-prior`` (``skip``: baselines, not agpc methods)."""
    if kernel_prior == "both":
        return with_ml_twins(methods, skip)
    if kernel_prior == "none":
        return [m if m in skip or m.endswith(ML_SUFFIX) else m + ML_SUFFIX for m in methods]
    return list(methods)


def method_available(method, n_classes=2):
    """None if ``agpc.GPClassifier(method=method)`` fits data with ``n_classes`` classes, else the reason
    (e.g. "gfitc" not written yet, or a binary-only method on multiclass data). Other errors: available."""
    import agpc

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12 * n_classes, 2))
    y = np.arange(X.shape[0]) % n_classes
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agpc.GPClassifier(method=base_method(method), n_inducing=2, max_iter=1, random_state=0).fit(X, y)
    except ValueError as exc:
        text = str(exc)
        if "unknown method" in text or "binary only" in text:
            return text.split(":")[0]
    except Exception:  # noqa: BLE001  (the method exists; per-split failures are recorded by run_grid)
        pass
    return None


def split_methods(methods, n_classes, skip=()):
    """(methods to run, {method: reason} for those this agpc cannot train); ``skip``: not agpc methods."""
    unavailable = {m: why for m in methods if m not in skip and (why := method_available(m, n_classes))}
    return [m for m in methods if m not in unavailable], unavailable


def agpc_model(method, m, split, max_iter, inducing):
    """GPClassifier of ``method`` at library defaults but m, max_iter (every iteration: the papers' protocols fix
    them, so no stop on a plateau), the seed and the initial inducing points; an "-ml" method with kernel_prior=None."""
    import agpc

    prior = {"kernel_prior": None} if method.endswith(ML_SUFFIX) else {}
    return agpc.GPClassifier(method=base_method(method), n_inducing=m, max_iter=max_iter, random_state=split,
                             inducing=inducing, plateau=None, **prior)


@dataclass
class Record:
    nll: list = field(default_factory=list)
    err: list = field(default_factory=list)
    time: list = field(default_factory=list)
    cpu: list = field(default_factory=list)  # CPU seconds of this process for the fit and its scoring
    log_z: list = field(default_factory=list)  # the fit's log Z (``fitted_log_z``), None for a model without one
    failures: list = field(default_factory=list)
    m: int = 0
    n_train: int = 0


def fit_scored(model, X_train, y_train, X_test, y_test):
    """(NLL, error, fit seconds) of one fit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        model.fit(X_train, y_train)
        elapsed = time.perf_counter() - t0
        nll, err = test_scores(model, X_test, y_test)
    return nll, err, elapsed


def fitted_log_z(model):
    """A fitted candidate's ``log_marginal_likelihood_``, None for one without (logistic regression) or whose log Z
    is of other rows than the training split's: what the evidence says of the model beside its test NLL."""
    log_z = getattr(model, "log_marginal_likelihood_", None)
    return None if log_z is None else float(log_z)


def run_grid(tasks, n_splits, fractions, methods, make_model, inducing_count):
    """Fit every method on every split of every task at every inducing fraction.

    ``n_splits``: a count (splits 0 .. n_splits - 1) or the split numbers themselves (e.g. range(100, 120)).
    tasks: name -> split(s) giving (X_train, y_train, X_test, y_test, n_total), already standardised.
    make_model(method, m, split): a fresh estimator. inducing_count(fraction, n_total, n_train): m.
    Returns {(name, fraction, method): Record}; failed fits are counted and reported, never fatal.
    """
    results = {}
    splits = list(range(n_splits)) if isinstance(n_splits, int) else list(n_splits)
    n_splits = len(splits)
    for name, split_fn in tasks.items():
        for index, split in enumerate(splits):
            X_train, y_train, X_test, y_test, n_total = split_fn(split)
            for fraction in fractions:
                m = inducing_count(fraction, n_total, X_train.shape[0])
                done = []
                for method in methods:
                    rec = results.setdefault((name, fraction, method), Record())
                    rec.m, rec.n_train = m, X_train.shape[0]
                    try:
                        cpu = time.process_time()  # what a quiet machine's wall clock would show, at one BLAS thread
                        model = make_model(method, m, split)
                        nll, err, elapsed = fit_scored(model, X_train, y_train, X_test, y_test)
                        cpu = time.process_time() - cpu
                    except Exception as exc:  # noqa: BLE001  (one failed split must not lose the run)
                        rec.failures.append(f"{type(exc).__name__}: {exc}"[:200])
                        print(f"<!-- {name} split {split} m={m} {method} failed: {rec.failures[-1]} -->", flush=True)
                        continue
                    rec.nll.append(nll)
                    rec.err.append(err)
                    rec.time.append(elapsed)
                    rec.cpu.append(cpu)
                    rec.log_z.append(fitted_log_z(model))
                    done.append(f"{method} {nll:.3f}/{elapsed:.1f}s/{cpu:.1f}cpu")
                print(f"<!-- {name} split {split} ({index + 1}/{n_splits}) m={m} ({fraction:g}): {', '.join(done)} -->", flush=True)
    return results


# -- tables ---------------------------------------------------------------------------------------

@dataclass
class Paper:
    """Published numbers: nll[fraction][dataset] = ((mean, ±), ...) in ``columns`` order; time[fraction] the
    same for the average training time. ``pm_is_std``: the ± is a standard deviation over ``splits`` splits
    (its SE is ± / sqrt(splits)), else a standard error. ``counterpart``: our method -> paper column index."""

    name: str
    columns: tuple
    nll: dict
    time: dict
    counterpart: dict
    pm_is_std: bool
    splits: int = 20

    def se(self, pm):
        return pm / math.sqrt(self.splits) if self.pm_is_std else pm


def finish_grid(started, json_path, results):
    """``run_grid``'s results, one entry per (data set, fraction, method), as JSON at ``json_path`` (``--json``,
    None: no file), then the runner's end."""
    if json_path:
        Path(json_path).write_text(json.dumps({f"{d}/{f}/{m}": vars(r) for (d, f, m), r in results.items()}, indent=1))
    end(started)


def _cell(rec, key, spread, digits=3):
    mean, se, std = mean_se(getattr(rec, key))
    cell = fmt(mean, std if spread == "std" else se, digits)
    if rec.failures:
        cell += f" ({len(rec.failures)} failed)"
    return cell


def print_accuracy_tables(results, datasets, fractions, methods, unavailable, paper, spread, title):
    """Per fraction: NLL table (ours and the paper's), error table, time table; then the list of cells
    where ours is worse than the paper's counterpart by more than one standard error of the difference.
    ``spread``: "std" or "se", what our ± is. Returns {fraction: [(dataset, method, ours, paper), ...]}."""
    worse_all = {}
    what = "standard deviation" if spread == "std" else "standard error"
    for fraction in fractions:
        present = [d for d in datasets if any((d, fraction, mt) in results for mt in methods)]
        if not present:
            continue
        published = paper.nll.get(fraction, {}) if paper else {}
        worse = []
        print(f"\n### {title}, m = {fraction:.0%}: test NLL (mean ± {what} over splits; lower is better)\n")
        paper_cols = [f"paper {c}" for c in paper.columns] if published else []
        print("| dataset | n_train | m | " + " | ".join(methods + paper_cols) + " |")
        print("|---|---:|---:|" + "---|" * (len(methods) + len(paper_cols)))
        for d in present:
            ref = published.get(d)
            cells = []
            some = next(results[(d, fraction, mt)] for mt in methods if (d, fraction, mt) in results)
            for mt in methods:
                if mt in unavailable:
                    cells.append("not available")
                    continue
                rec = results.get((d, fraction, mt))
                if rec is None:
                    cells.append("")
                    continue
                cell = _cell(rec, "nll", spread)
                col = paper.counterpart.get(base_method(mt)) if (paper and ref) else None
                if col is not None:
                    mean, se, _ = mean_se(rec.nll)
                    p_mean, p_pm = ref[col]
                    if worse_by_more_than_one_se(mean, se, p_mean, paper.se(p_pm)):
                        cell += f" {WORSE_MARK}"
                        worse.append((d, mt, mean, paper.columns[col], p_mean))
                cells.append(cell)
            if published:
                cells += [f"{v:.2f} ± {pm:.2f}" for v, pm in ref] if ref else [""] * len(paper_cols)
            print(f"| {d} | {some.n_train} | {some.m} | " + " | ".join(cells) + " |")
        if published:
            pairs = ", ".join(f"{mt} ~ {paper.columns[paper.counterpart[base_method(mt)]]}" for mt in methods
                              if base_method(mt) in paper.counterpart)
            pse = "± / sqrt(%d) (the paper's ± read as a standard deviation)" % paper.splits if paper.pm_is_std else "the paper's ± (a standard error)"
            print(f"\n{WORSE_MARK}: worse than the paper's counterpart ({pairs}) by more than one standard error of the "
                  f"difference, sqrt(SE_ours^2 + SE_paper^2), SE_paper = {pse}.")
            if worse:
                print("Worse by more than one SE: " + "; ".join(
                    f"{d} {mt} {ours:.3f} vs {col} {p:.2f}" for d, mt, ours, col, p in worse) + ".")
            else:
                print("Worse by more than one SE: none.")
        worse_all[fraction] = worse
        for key, label, digits in (("err", f"test error rate (mean ± {what})", 3),
                                   ("time", "mean training time in seconds (± " + what + ")", 2)):
            print(f"\n### {title}, m = {fraction:.0%}: {label}\n")
            print("| dataset | " + " | ".join(methods) + " |")
            print("|---|" + "---|" * len(methods))
            for d in present:
                cells = ["not available" if mt in unavailable else
                         (_cell(results[(d, fraction, mt)], key, spread, digits) if (d, fraction, mt) in results else "")
                         for mt in methods]
                print(f"| {d} | " + " | ".join(cells) + " |")
        if paper and fraction in paper.time:
            print(f"\nPaper average training time at m = {fraction:.0%} (R code, seconds, all datasets): " + ", ".join(
                f"{c} {v:g} ± {pm:g}" for c, (v, pm) in zip(paper.columns, paper.time[fraction])) + ".")
    if unavailable:
        print("\nNot available in this agpc: " + "; ".join(f"{mt} ({why})" for mt, why in unavailable.items()) + ".")
    return worse_all


# -- figures --------------------------------------------------------------------------------------

def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no figure written.")
        return None
    return plt


def plot_against_paper(results, datasets, fractions, methods, paper, filename):
    """One panel per fraction: our mean test NLL (± SE) against the paper's counterpart, a point a dataset."""
    plt = pyplot()
    fractions = [f for f in fractions if f in paper.nll]
    if plt is None or not fractions:
        return
    fig, axes = plt.subplots(1, len(fractions), figsize=(4.2 * len(fractions), 4), squeeze=False)
    for ax, fraction in zip(axes[0], fractions):
        for i, method in enumerate(methods):
            col = paper.counterpart.get(base_method(method))
            rows = [(paper.nll[fraction][d][col][0],) + mean_se(results[(d, fraction, method)].nll)[:2]
                    for d in datasets if col is not None and d in paper.nll[fraction]
                    and (d, fraction, method) in results and results[(d, fraction, method)].nll]
            if rows:
                x, y, se = np.array(rows).T
                ax.errorbar(x, y, yerr=np.nan_to_num(se), fmt="os^vD<>"[i % 7], ms=4, label=method, capsize=2)
        top = max([ax.get_xlim()[1], ax.get_ylim()[1]])
        ax.plot([0, top], [0, top], "k:", lw=0.8)
        ax.set(title=f"m = {fraction:.0%}", xlabel=f"{paper.name}: counterpart's NLL", ylabel="agpc test NLL")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, filename)


def save_figure(fig, filename):
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / filename
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"Figure: benchmarks/results/{filename}")
    return path
