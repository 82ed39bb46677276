"""The ``agpc`` command.

    agpc fit DATA --target COL --out model.agpc          train a GPClassifier on a data file, save the model
    agpc predict MODEL DATA --out predictions.csv        predicted labels, class probabilities (and latent moments)
    agpc inspect MODEL [--plot out.png]                  what a model learned and how its training went
    agpc demo [--plot PNG]                               train and evaluate on built-in data, plot the banana fit
    agpc bench [--quick] [--out DIR]                     run the source checkout's benchmark scripts

DATA is a CSV (header row), Parquet, ``.npy``, ``.npz`` file or a zarr store. ``fit`` on a file with column
names (CSV, Parquet) records them as the model's ``feature_names_in_``; ``predict`` then takes those columns
from a file with column names by name, in the model's order, whatever else the file holds.

Every failure is one line on stderr. A problem with the input (a missing file, an unknown format, a missing
column, an empty cell, non-numeric features, one class, a file that is not an agpc model, a bad option, ...) is
``agpc: error: ...`` with exit status 2; anything else is an internal error, ``agpc: internal error: ...`` with
exit status 1 (``--debug``, or ``AGPC_TRACEBACK=1``, shows the traceback instead of the line, with the same exit
status); an interrupt (Ctrl-C, SIGINT, even in a background job that inherited it ignored) exits with 130, and
SIGTERM, after the same clean-up, with 143.
Warnings are collected while a command runs and printed as ``agpc: warning: ...`` lines on stderr once it
ends: after its output, or before its error line, which is always the last line. Every output is written to a
temporary file beside its target and renamed, so a failure leaves nothing half-written. A command's results are
its files, written before its summary is printed; a reader that stops reading standard output early
(``agpc fit ... | head -1``) does not stop the command: the rest of the summary is dropped, the files are
written, and the exit status is the command's own (0), not an error.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from . import __version__
from . import backend as B
from . import checkpoints, persistence
from .classifier import GPClassifier
from .datasets import banana_bayes_error, load_breast_cancer, make_banana, split_standardised
from .inference.hooks import ENDED_BECAUSE, close_progress_bars
from .inspection import expected_calibration_error, plot_model
from .likelihoods import negative_log_likelihood
from .methods import ORDINAL, RegisteredLikelihood, method_names
from .model_file import MIN_SCALE
from .plan import FitPlan
from .tables import (exception_line, header_name, labels_from_text, load_data, load_weighted_data, one_line, preview,
                     text_columns)
from .untrusted import printable
from .labels import holdout_mask, kind_words, labels_kind

__all__ = ["main", "UsageError"]

PREDICTED_LABEL = "predicted_label"  # 'agpc predict''s column of the most probable class
BENCH_SCRIPTS = ("uci_binary.py", "uci_iterations.py", "uci_multiclass.py", "banana_inducing.py", "airline.py",
                 "time_curves.py")


class UsageError(Exception):
    """A problem with the user's input or files: reported as one line on stderr, exit status 2."""


# -- writing outputs -----------------------------------------------------------------------------------

def _check_png_name(path):
    """``--plot``: the file is a PNG image; a name of another kind (plot.pdf, plot.txt) got PNG bytes under it."""
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix and suffix.lower() != ".png":
        raise UsageError(f"--plot {path}: agpc writes PNG images; name the file .png (not {suffix})")


def _check_writable(path, inputs=()):
    """Fail before any long computation if ``path`` cannot be written (``checkpoints.check_writable``: no such
    directory, a directory, a device, a FIFO, a path under /proc, /sys or /dev, a directory this process cannot
    write in) or is one of the command's ``inputs`` (the rename would replace the model or the data)."""
    if os.fspath(path) == "-":
        raise UsageError("--out -: agpc writes its results to files, not to standard output; name a file "
                         "(./- for a file named '-')")
    try:
        checkpoints.check_writable(path, inputs=inputs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _write_csv(path, columns, labels=None):
    """A header row of column names, then one row per sample: ``labels`` (a column name and one text a row: class
    labels, which the csv module quotes where they hold a comma, a quote or a line break) first, then the number
    columns at full float64 precision."""
    table = np.column_stack([np.asarray(values, dtype=np.float64) for values in columns.values()])
    with checkpoints.atomic_write(path, "w") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        if labels is None:
            writer.writerow(list(columns))
            np.savetxt(fh, table, delimiter=",", fmt="%.17g")
            return
        name, text = labels
        writer.writerow([name, *columns])
        writer.writerows([label, *(f"{v:.17g}" for v in row)] for label, row in zip(text, table.tolist()))


# A cell a spreadsheet runs as a formula: one that starts with =, +, -, @, a tab or a carriage return (OWASP's "CSV
# injection": a class label "=HYPERLINK(...)" or "-2+3+cmd|..." in predictions.csv ran when the file was opened), but
# not a number as a spreadsheet reads one ("-1", "+0.5", "-1e-05": a class that is a number stays one)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_SPREADSHEET_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _formula_safe(labels):
    """({key: cell}, the labels altered) of ``labels`` ({key: a label's text}): a label a spreadsheet would run as a
    formula (``_FORMULA_START``) written with a single quote before it, as OWASP advises (spreadsheets show the label
    without it), the others as they are. The caller warns of the altered ones, naming them."""
    cells = {key: f"'{text}" if text.startswith(_FORMULA_START) and not _SPREADSHEET_NUMBER.match(text) else text
             for key, text in labels.items()}
    return cells, [text for key, text in labels.items() if cells[key] != text]


# -- scores --------------------------------------------------------------------------------------------

def _class_index(y, classes):
    """Each label's column in ``classes``; a label the model does not know is an error."""
    lookup = {c: i for i, c in enumerate(np.asarray(classes).tolist())}
    labels = np.asarray(y).tolist()
    index = [lookup.get(v) for v in labels]
    unknown = sorted({v for v, i in zip(labels, index) if i is None}, key=str)
    if unknown and labels_kind(y) != labels_kind(classes):
        raise UsageError(_other_kind(y, classes, unknown))
    if unknown:
        raise UsageError(f"labels {preview(unknown, 5)} are not among the model's classes {preview(list(lookup), 5)}")
    return np.asarray(index, dtype=np.intp)


def _other_kind(y, classes, unknown):
    """The error of labels of another kind than the model's classes, which would print as they do ("labels -1, 1
    are not among the model's classes -1, 1": integers read from the file, the classes the text '-1', '1' of a
    model fitted in Python on strings), and what to do."""
    if labels_kind(classes) == "str":  # (quoting does not help: a column of whole numbers is read as integers)
        fix = ("the model was fitted on labels of text, and agpc reads a label column of whole numbers as integers, "
               "quoted or not: fit the model on the labels as numbers (y.astype(int) in Python), or with agpc fit")
    else:
        fix = f"the file's labels must be the model's classes, as {kind_words(classes)}"
    return (f"the labels are read as {kind_words(y)} ({preview([repr(v) for v in unknown], 5)}) but the model's "
            f"classes are {kind_words(classes)} ({preview([repr(v) for v in np.asarray(classes).tolist()], 5)}): "
            f"a label is a class only as the same kind; {fix}")


def _scores(proba, y, classes):
    """(error rate, mean negative log predictive probability, expected calibration error over 10 equal-width bins
    of the top-class probability) of the probabilities ``proba`` (n, C)."""
    proba = np.asarray(proba)
    index = _class_index(y, classes)
    error = float(np.mean(np.argmax(proba, axis=1) != index))
    nll = float(negative_log_likelihood(np.log(np.clip(proba, 1e-300, None)), index))
    return error, nll, expected_calibration_error(proba, index, n_bins=10)


def _print_scores(what, scores, rows):
    print(f"{what + ':':<12} error {scores[0]:.4f}   NLL {scores[1]:.4f}   ECE {scores[2]:.4f}   ({rows} rows)")


# -- agpc fit ------------------------------------------------------------------------------------------

def _split(X, y, fraction, seed):
    """(X_train, y_train, X_val, y_val): a seeded random validation part (held in memory), or none."""
    val = _validation_rows(y, fraction, seed)
    if val is None:
        return X, y, None, None
    X = np.asarray(X[...])
    return X[~val], y[~val], X[val], y[val]


def _validation_rows(y, fraction, seed):
    """The rows ``_split`` holds out for validation (a mask: ``labels.holdout_mask``), or None."""
    if not fraction:
        return None
    try:
        return holdout_mask(y, fraction, seed, what="--validation-fraction")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _class_order(args, y):
    """``--classes`` as the ordinal model's classes in their order (labels of y's kind: "3" is the class 3 of
    whole-number labels), or None (another model, or ordinal numeric labels: their numeric order). String grades
    without ``--classes`` are refused: their sorted order (best, fair, good, poor) is seldom theirs."""
    if args.likelihood != ORDINAL:
        if args.classes is not None:
            raise UsageError("--classes gives the order of ordered classes: it goes with --likelihood ordinal (other "
                             "models take their classes from the labels)")
        return None
    present = np.unique(y)
    if args.classes is None:
        if present.dtype.kind in "biu":
            return None
        raise UsageError(f"--likelihood ordinal: the labels of {args.data} are text ({preview(present.tolist(), 8)}), "
                         "whose order agpc cannot know: give it with --classes, lowest first, comma-separated "
                         "(e.g. --classes poor,fair,good,best)")
    names = _class_names(args.classes)
    if present.dtype.kind in "iu":
        order = labels_from_text(names)
        if order.dtype.kind not in "iu":
            raise UsageError(f"--classes {args.classes}: the labels of {args.data} are whole numbers; "
                             f"{preview([n for n in names if labels_from_text([n]).dtype.kind not in 'iu'], 5)} "
                             "is not")
    else:  # text, or booleans (a Parquet column), named as they print
        known = {f"{label}": label for label in present.tolist()}
        if present.dtype.kind == "b" and not set(names) <= set(known):
            raise UsageError(f"--classes {args.classes}: the labels of {args.data} are booleans, True and False")
        order = np.asarray([known.get(name, name) for name in names])
    twice = sorted({label for label in order.tolist() if order.tolist().count(label) > 1}, key=str)
    if twice or len(names) < 2:
        raise UsageError(f"--classes {args.classes}: name two classes or more, each once, lowest first"
                         + (f" ({preview(twice, 5)} named more than once)" if twice else ""))
    unlisted = sorted(set(present.tolist()) - set(order.tolist()), key=str)
    if unlisted:
        raise UsageError(f"labels {preview(unlisted, 5)} of {args.data} are not among --classes {args.classes}: "
                         "list every class, lowest first")
    return order


def _nth(k):
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _class_names(text):
    """The names of ``--classes``: one CSV record, so that a label holding a comma can be named as the data file
    writes it, in double quotes ('"bad, really",fair'); spaces around a name are not part of it ("poor, fair").
    An empty name (",," or a trailing comma) and an unclosed quote are errors of their own: either would otherwise
    be reported as a class missing from, or not among, the labels."""
    try:
        names = next(csv.reader([text], skipinitialspace=True, strict=True), [])
    except csv.Error:
        raise UsageError(f"--classes {text}: a quoted name is not closed (a name holding a comma goes in double "
                         'quotes: "bad, really",fair)') from None
    names = [name.strip() for name in names]
    if not names:  # (--classes '' or spaces: no record at all; "name two classes" below would say it after a
        # whole-number check that named none: "the labels of d.csv are whole numbers;  is not")
        raise UsageError(f"--classes {text!r} names no class: name the classes, comma-separated, lowest first")
    if "" in names:
        raise UsageError(f"--classes {text}: its {_nth(names.index('') + 1)} name is empty: name the classes, "
                         "comma-separated, lowest first")
    return names


def _fit_on_cluster(model, X, y, address, validation_data=None):
    """Fit on a dask array over the cluster whose scheduler is at ``address``, one chunk of rows per thread
    (``validation_data``, held in memory, scored as a fit in memory scores it)."""
    import dask.array as da
    from distributed import Client

    try:
        client = Client(address, timeout="30s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UsageError(f"cannot connect to the dask scheduler at {address}: {exception_line(exc)}") from None
    with client:
        threads = max(1, sum(client.nthreads().values()))
        rows = max(1, math.ceil(X.shape[0] / threads))
        model.set_params(client=client)
        try:
            model.fit(da.from_array(X, chunks=(rows, -1)), da.from_array(y, chunks=rows),
                      validation_data=validation_data)
        finally:
            model.set_params(client=None)


def _record_feature_names(model, names):
    """Give the model the column names of the file it was fitted on, as ``feature_names_in_``: the attribute
    scikit-learn's ``fit`` sets from a DataFrame's columns (an object array of str). The CLI reads tables
    without pandas and fits on a NumPy array, so it sets the names itself, after fit (and after the scores,
    which predict on the same unnamed array); 'agpc predict' then takes the feature columns by these names."""
    if names is not None:
        model.feature_names_in_ = np.asarray(names, dtype=object)


def fit(args):
    _check_writable(args.out, [args.data])
    X, y, names, weights = _fit_rows(args)
    classes = np.unique(y)
    order = _class_order(args, y)
    X_train, y_train, X_val, y_val = _split(X, y, args.validation_fraction, args.random_state)
    if weights is not None and X_val is not None:
        weights = weights[~_validation_rows(y, args.validation_fraction, args.random_state)]
    model = _fit_model(args, order, (X_train, y_train), _categorical_columns(args, X, names))
    where = f"the dask cluster at {args.scheduler}" if args.scheduler else args.backend
    scaler = None
    if args.standardize:  # on the training rows only; the model file keeps the means and scales (a Pipeline)
        scaler, X_train, X_val = _standardised(X_train, X_val, weights, names)
    shown = f"ordered classes {preview((classes if order is None else order).tolist(), 6)} (lowest first)" \
        if args.likelihood == ORDINAL else f"classes {preview(classes.tolist(), 6)}"
    print(f"agpc fit: {printable(args.data)}: {X_train.shape[0]} training rows, {X.shape[1]} features, {shown}; method "
          f"{args.method}, n_inducing {args.inducing}, on {where}", flush=True)
    # the held-out rows are the fit's validation_data, so that the model's history (and so the model file,
    # 'agpc inspect' and its --plot) keeps their NLL and error along the training, not only the final scores
    validation = None if X_val is None else (X_val, y_val)
    t0 = time.perf_counter()
    if args.scheduler:
        _fit_on_cluster(model, X_train, y_train, args.scheduler, validation)
    else:
        model.fit(X_train, y_train, sample_weight=weights, validation_data=validation)
    seconds = time.perf_counter() - t0
    # the last stage, named as the library's progress lines name theirs (a prediction pass over every row)
    if not args.quiet:
        rows = f"{len(y_train):,} training" + ("" if X_val is None else f" and {len(y_val):,} validation")
        print(f"agpc fit: scoring the {rows} rows", file=sys.stderr, flush=True)
    scores = [("train", _scores(model.predict_proba(X_train), y_train, model.classes_), len(y_train))]
    if X_val is not None:
        scores.append(("validation", _scores(model.predict_proba(X_val), y_val, model.classes_), len(y_val)))
    # the model is written before the summary is printed: the summary is for whoever reads it, the model is
    # the command's result, and must not depend on the reader of standard output (agpc fit ... | head -1)
    _save_fitted(model, scaler, names, args.out)
    for what, values, rows in scores:
        _print_scores(what, values, rows)
    trained = _iterations(model, args.max_iter, (X_train, y_train), on_cluster=bool(args.scheduler))
    print(f"fit time:    {seconds:.2f} s ({trained}; "
          f"{_model_size(model)})")
    print(f"wrote {printable(args.out)}")
    return 0


def _fit_rows(args):
    """``agpc fit``'s rows: (X, y, the feature names, the rows' weights or None) read from DATA, the rows of weight
    0 left out, and the combinations of arguments that cannot train these rows refused (a ``UsageError``)."""
    if args.weight_column is not None:
        (X, y, names), weights = load_weighted_data(args.data, args.target, args.weight_column)
    else:
        (X, y, names), weights = load_data(args.data, args.target, labels_required=True), None
    if args.standardize and (args.scheduler or B.is_out_of_core(X)):
        # the scaler is fitted on, and applied to, the training rows held in memory: rows meant to stay on disk or
        # on the cluster would all be read in, which is what those fits are there to avoid
        where = ("--scheduler: a fit on a dask cluster" if args.scheduler
                 else f"{args.data}, data read from disk a chunk at a time")
        raise UsageError(f"--standardize holds the training rows in memory to scale them: it does not go with {where}; "
                         "standardise the stored features first")
    if args.scheduler and (weights is not None or args.class_weight):
        raise UsageError("--weight-column and --class-weight train in this process: a fit on a dask cluster "
                         "(--scheduler) does not take row weights yet")
    dropped = 0
    if weights is not None and np.any(weights == 0) and np.any(weights > 0):  # a row of weight 0 is not there
        present = weights > 0
        dropped = int(np.sum(~present))
        X, y, weights = np.asarray(X[...])[present], y[present], weights[present]
    classes = np.unique(y)
    if classes.shape[0] < 2:  # (said of the rows of weight 0 too: the file holds two classes, the audit's)
        if dropped:
            raise UsageError(f"{args.data}: the rows of a weight above 0 in --weight-column {args.weight_column!r} "
                             f"({y.shape[0]:,} of {y.shape[0] + dropped:,}: those of weight 0 are left out) are all "
                             f"labelled {classes[0].item()!r}: a classifier needs two classes or more")
        raise UsageError(f"{args.data}: every label is {classes[0].item()!r}: a classifier needs two classes or more")
    if args.site_directory is not None and not args.scheduler:
        raise UsageError("--site-directory keeps batch EP's sites in files on a dask cluster: it needs --scheduler")
    return X, y, names, weights


def _categorical_columns(args, X, names):
    """The categorical feature columns of ``agpc fit``'s table: its columns of text (``tables.text_columns``) and
    those --categorical names (a column name, or an index among the feature columns), as indices; --standardize
    scales numbers only, and is refused with them."""
    chosen = set(text_columns(X))
    for given in args.categorical or ():
        name = header_name(args.data, given)  # (as the file's header is read: a CSV's without spaces around)
        if names is not None and name in names:
            chosen.add(names.index(name))
        elif given.isdigit() and int(given) < X.shape[1]:  # (no negative index: GPClassifier refuses them too)
            chosen.add(int(given))
        else:
            raise UsageError(f"--categorical {given!r}: not a feature column of {args.data} (a name, or an index "
                             f"among its {X.shape[1]} feature columns, 0 to {X.shape[1] - 1})")
    if chosen and args.standardize:
        raise UsageError("--standardize scales numeric columns: it does not go with categorical columns "
                         f"({preview([names[j] if names else j for j in sorted(chosen)], 6)}) yet; standardise the "
                         "numeric columns first")
    return sorted(chosen)


def _fit_model(args, order, rows, categorical=()):
    """The ``GPClassifier`` ``agpc fit``'s arguments ask for (``order``: an ordinal model's classes in their order;
    ``categorical``: the categorical columns), its ``n_jobs`` for the training ``rows`` (X, y; ``_fit_jobs``), its
    parameters checked: a method that does not take --likelihood is refused before anything is printed."""
    model = GPClassifier(
        method=args.method, n_inducing=args.inducing, batch_size=args.batch_size, backend=args.backend,
        max_iter=args.max_iter, max_time=args.max_time, random_state=args.random_state, verbose=not args.quiet,
        site_directory=args.site_directory, dtype=args.dtype,
        kernel_prior=None if args.kernel_prior == "none" else args.kernel_prior, class_weight=args.class_weight,
        ard={"auto": "auto", "per-feature": True, "shared": False}[args.ard],
        likelihood=args.likelihood, classes=None if order is None else order.tolist(),
        plateau=None if args.plateau == "none" else args.plateau,
        early_stopping={"auto": "auto", "on": True, "off": False}[args.early_stopping],
        categorical_features=list(categorical) or None,
    )
    model.set_params(n_jobs=_fit_jobs(args, model, rows))
    model.check_params()
    return model


def _standardised(X_train, X_val, weights, names=None):
    """(scaler, X_train, X_val) for --standardize: a ``StandardScaler`` fitted on the training rows, counted by their
    ``weights`` as the fit counts them (a row of weight 2 is the row twice), and both sets of rows scaled by it. A
    column whose mean or variance overflows float64 (values near 1e154 and beyond: finite, but their squares are not)
    is one error naming it (``names``: the columns' names, or None), not the fit's "contains NaN" of the NaN its
    scaling made."""
    from sklearn.preprocessing import StandardScaler  # (60-70 ms that other commands need not wait)

    X_train = np.asarray(X_train[...])  # (read once: in memory already, on-disk rows were refused)
    with np.errstate(over="ignore", invalid="ignore"):  # (an overflow is said below, naming its column)
        scaler = StandardScaler().fit(X_train, sample_weight=weights)
    moments = np.isfinite(scaler.mean_) & np.isfinite(scaler.var_)
    if not np.all(moments):
        j = int(np.flatnonzero(~moments)[0])
        column = f"column {names[j]!r}" if names is not None and j < len(names) else f"column {j}"
        raise ValueError(f"--standardize: {column}'s mean or variance overflows float64 (its values reach "
                         f"{np.max(np.abs(X_train[:, j])):.3g}): rescale that column, or fit without --standardize")
    tiny = scaler.scale_ < MIN_SCALE  # (a model file refuses such a scale: the fit wrote one 'agpc predict' refused)
    if np.any(tiny):
        j = int(np.flatnonzero(tiny)[0])
        column = f"column {names[j]!r}" if names is not None and j < len(names) else f"column {j}"
        raise ValueError(f"--standardize: {column}'s standard deviation, {scaler.scale_[j]:.3g}, is below "
                         f"{MIN_SCALE:.3g} (its variance underflows float64): rescale that column, or fit without "
                         "--standardize")
    return scaler, scaler.transform(X_train), None if X_val is None else scaler.transform(X_val)


def _save_fitted(model, scaler, names, out):
    """Write the fitted ``model`` to ``out``, behind ``scaler`` (--standardize: a Pipeline, whose input columns are
    the scaler's, named ``names``) or alone."""
    if scaler is None:
        _record_feature_names(model, names)
        persistence.save_model(model, out)
        return
    from sklearn.pipeline import Pipeline

    _record_feature_names(scaler, names)
    persistence.save_model(Pipeline([("standardscaler", scaler), ("gpclassifier", model)]), out)


def _steps(model, rows, n_rows=None, on_cluster=False):
    """The steps of ``model``'s fit of the training ``rows`` (X, y; ``n_rows`` of them where fewer were trained on:
    those left by early stopping's hold-out), as the fit resolves them (``agpc.plan.FitPlan.for_rows`` and
    ``steps``): what the command line says of it, ahead and after. ``on_cluster``: the fit was given the rows as dask
    arrays (--scheduler), which are not rows on the host."""
    X, y = rows
    n_rows = X.shape[0] if n_rows is None else n_rows
    plan = FitPlan.of(type(model).__name__, model.get_params(deep=False))
    if model.backend == "numpy" and not on_cluster:  # (a GPU's steps are its own rule's: ``placement``)
        plan = plan.for_rows(X, y, X.shape[0], B.resolve_backend("numpy"))  # (all of them, as ``fit`` asks)
    return plan.steps(n_rows)


def _fit_jobs(args, model, rows):
    """GPClassifier's n_jobs for ``agpc fit``: ``--jobs``, else every core where the fit runs batch passes in this
    process on the CPU (threads over their row blocks: the model n_jobs=1 gives, sooner), else one (minibatches in
    more processes are data-parallel rounds, another model; a GPU or a cluster spreads the work itself)."""
    if args.jobs is not None:
        return args.jobs
    if args.scheduler or args.backend != "numpy":
        return None
    return None if _steps(model, rows).minibatch else -1


def _iterations(model, max_iter, rows, on_cluster=False):
    """What the fit trained, counted as --max-iter counts it (epochs with minibatches; batch EP / SEP / ADF's
    warm-up sweeps, which ``n_iter_`` includes, apart), and why it stopped before the cap; the rows the fit held out
    for early stopping (``early_stopping``), which its epochs do not count."""
    n_rows = rows[0].shape[0]
    held = getattr(model, "early_stopping_", False) and n_rows - int(model.n_samples_fit_)
    if held:
        n_rows -= held
    warmup = getattr(model, "n_warmup_", 0) or 0
    steps = _steps(model, rows, n_rows, on_cluster)
    rows = steps.step_rows
    rounds = steps.minibatch and (int(getattr(model, "n_jobs_", 1)) > 1 or (on_cluster and model.local_steps != 0))
    taken = int(model.history_["n_steps"][-1]) if model.history_.get("n_steps") else 0
    if rounds:  # a step is a data-parallel round of many minibatches, as many a round as the timing gave: a history
        # entry an epoch (a rounds' fit of 25 epochs in 100 rounds was said as "0.25 epochs", its rounds counted as
        # minibatches: the hostile-input audit of 2026-12-04)
        said = f"{model.n_iter_} epochs of --max-iter {max_iter} ({taken:,} data-parallel rounds)"
    elif steps.minibatch:  # an epoch cut short is a history entry too: the epochs from the steps
        said = f"{taken / math.ceil(n_rows / rows):.3g} epochs of --max-iter {max_iter} ({taken:,} steps)"
    else:
        said = f"{model.n_iter_ - warmup} iterations of --max-iter {max_iter}"
    if warmup:
        said += f" + {warmup} warm-up sweeps"
    if getattr(model, "subsample_rows_", 0):  # (its own iterations, which --max-iter caps too, are not those above)
        said += (f" on all rows, after {model.subsample_iter_} iterations (warm-up sweeps included) on a random "
                 f"{model.subsample_rows_:,} of them")
    reason = getattr(model, "stop_reason_", None)  # (said as the progress bar of a stage that ended early says it)
    said += f", stopped: {ENDED_BECAUSE[reason]}" if reason in ENDED_BECAUSE and reason != "max_iter" else ""
    return said + (f"; {held:,} of the rows held out to stop on (early_stopping)" if held else "")


# -- agpc predict --------------------------------------------------------------------------------------

def _load_model(path):
    """The model of the file at ``path``, or a UsageError where it cannot be one. Read before the output's checks, so
    that a directory given as the model is named as the model, not blamed on where the output would go (the audit's
    ``agpc predict .``)."""
    if Path(path).is_dir():
        raise UsageError(f"{path} is a directory, not a model file (those are files written by 'agpc fit')")
    if not Path(path).exists():
        raise UsageError(f"{path}: no such model file")
    if not Path(path).is_file():
        raise UsageError(f"{path} is not a regular file (a device, a FIFO?), not a model file")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path} is not an agpc model file (those are npz archives written by 'agpc fit')")
    return persistence.load_model(path)


def _categorical_levels(model):
    """{column index: levels} of a model's categorical columns of text (a Pipeline's: its classifier's)."""
    return getattr(model[-1] if not isinstance(model, GPClassifier) else model, "categorical_levels_", {})


def _text_features(model, wanted):
    """The names, among a model's feature names ``wanted`` (None: a model without names), of its categorical columns
    of text, which a file's column is read as whatever its cells look like (``load_data``)."""
    return () if wanted is None else {str(wanted[j]) for j in _categorical_levels(model)}


def _check_feature_count(X, model, path, target, names=None):
    have, want = X.shape[1], int(model.n_features_in_)
    if have != want:
        hint = " (drop the label column with --target COL)" if target is None and have == want + 1 else ""
        raise UsageError(f"{path} has {have} feature columns but the model was trained on {want}{hint}")
    # a column of text where the model has numbers (not one of its categorical columns of text), named here: the
    # estimator could only say that a string is not a float
    levels = _categorical_levels(model)
    for j in text_columns(X):
        if j not in levels:
            shown = names[j] if names is not None else j
            raise UsageError(f"{path}: feature column {shown!r} is not numeric (value {X[0, j]!r}), and the model "
                             "was trained on numbers there")


def _latent_columns(model, X):
    if not isinstance(model, GPClassifier):  # a Pipeline (agpc fit --standardize): the latent f of scaled rows
        X, model = model[:-1].transform(X), model[-1]
    mean, var = (np.asarray(a) for a in model.predict_latent(X))
    if mean.ndim == 1:
        return {"latent_mean": mean, "latent_var": var}
    columns = {}
    for i, c in enumerate(model.classes_):
        columns[f"latent_mean_{c}"] = mean[:, i]
        columns[f"latent_var_{c}"] = var[:, i]
    return columns


def _feature_names(model):
    names = getattr(model, "feature_names_in_", None)
    return None if names is None else [str(name) for name in names]


@contextlib.contextmanager
def _columns_already_matched():
    """Predict on a NumPy array whose columns 'agpc predict' has already put in the model's order by name
    (or, for a file without names, has warned about): scikit-learn's warning that the array has no feature
    names says nothing more."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="X does not have valid feature names", category=UserWarning)
        yield


def predict(args):
    model = _load_model(args.model)  # (first: a directory given as the model is named as the model, not the output)
    _check_writable(args.out, [args.model, args.data])
    wanted = _feature_names(model)
    X, y, names = load_data(args.data, args.target, features=wanted, text_features=_text_features(model, wanted))
    _check_feature_count(X, model, args.data, args.target, names)
    with _columns_already_matched():
        proba = np.asarray(model.predict_proba(X))
        scores = None if y is None else _scores(proba, y, model.classes_)  # unknown labels fail before writing
        columns = {f"p_{c}": proba[:, i] for i, c in enumerate(model.classes_)}
        if args.latent:
            columns.update(_latent_columns(model, X))
    # the class of each row's highest written probability (the first of equal ones), written as the class is
    # written in the p_<class> headers (the labels of the file the model was fitted on, strings or numbers), but
    # for a label a spreadsheet would run as a formula (``_formula_safe``; the headers start with p_)
    best = np.argmax(proba, axis=1)
    predicted, altered = _formula_safe({i: f"{model.classes_[i]}" for i in np.unique(best).tolist()})
    _write_csv(args.out, columns, labels=(PREDICTED_LABEL, [predicted[i] for i in best.tolist()]))
    written = [PREDICTED_LABEL, *columns]
    print(f"wrote {printable(args.out)}: {proba.shape[0]} rows, columns "
          f"{', '.join(printable(name) for name in written)}")
    if scores is not None:
        _print_scores("scores", scores, len(y))
    _warn_columns_by_position(wanted, names, args.data)  # said once the predictions are written
    if altered:
        warnings.warn(f"{PREDICTED_LABEL} writes the classes {preview([repr(v) for v in altered], 5)} with a ' before "
                      f"each, which a spreadsheet would otherwise run as a formula (CSV injection; the p_<class> "
                      f"headers name them as they are)", UserWarning)
    return 0


def _warn_columns_by_position(wanted, names, path):
    """Warn that the columns of ``path`` were taken by position: the model (``wanted``: its feature names) or the
    file (``names``: its column names) has no names to match them by."""
    if wanted is None:
        warnings.warn(f"the model has no feature names (it was fitted on a file without column names, or saved by "
                      f"an older agpc): the columns of {path} were taken by position, unchecked", UserWarning)
    elif names is None:
        warnings.warn(f"{path} has no column names: its columns were taken by position as the model's features "
                      f"{preview(wanted, 8)}, unchecked", UserWarning)


# -- agpc inspect --------------------------------------------------------------------------------------

def _classifier_named_as(model):
    """The classifier of a model file; of a Pipeline ('agpc fit --standardize'), a shallow copy that bears the
    pipeline's feature names: they are on its first step, the scaler that took the file's columns, and the
    classifier, fitted on the scaler's unnamed output, has none, so its summary and plot would say x0, x1, ..."""
    if isinstance(model, GPClassifier):
        return model
    classifier, names = model[-1], getattr(model, "feature_names_in_", None)
    if names is None or getattr(classifier, "feature_names_in_", None) is not None:
        return classifier
    named = copy.copy(classifier)
    named.feature_names_in_ = names
    return named


def inspect(args):
    if (args.data is None) != (args.target is None):
        raise UsageError("--data and --target go together: the rows to score the model's calibration on, and their "
                         "label column")
    model = _load_model(args.model)  # (first: a directory given as the model is named as the model, not the plot)
    if args.plot is not None:
        _check_png_name(args.plot)
        _check_writable(args.plot, [args.model] + ([args.data] if args.data is not None else []))
    # (load_model gives a GPClassifier, or a Pipeline ending in one: a file of 'agpc fit --standardize')
    classifier = _classifier_named_as(model)
    calibration = scores = None
    if args.data is not None:
        wanted = _feature_names(model)
        X, y, names = load_data(args.data, args.target, features=wanted, text_features=_text_features(model, wanted))
        _check_feature_count(X, model, args.data, args.target, names)
        with _columns_already_matched():
            proba = np.asarray(model.predict_proba(X))
        scores = _scores(proba, y, model.classes_)
        calibration = proba, _class_index(y, model.classes_)
    if args.plot is not None:  # the command's file, written before what it prints
        plot_model(classifier.report(), args.plot, calibration, max_features=args.max_features)
    print(classifier.summary(max_features=args.max_features), end="")
    if classifier is not model:
        print("standardised: the features were standardised on the training rows before the classifier (the model "
              "file holds their means and scales; predictions take raw features); lengthscales and relevance are "
              "in units of each feature's standard deviation")
    if scores is not None:
        _print_scores(f"scores on {printable(args.data)}", scores, len(calibration[1]))
    if args.plot is not None:
        print(f"wrote {printable(args.plot)}")
    if args.data is not None:
        _warn_columns_by_position(wanted, names, args.data)
    return 0


# -- agpc demo -----------------------------------------------------------------------------------------

def _run(name, model, X_train, y_train, X_test, y_test, extra=""):
    t0 = time.perf_counter()
    model.fit(X_train, y_train)
    seconds = time.perf_counter() - t0
    error, nll, _ = _scores(model.predict_proba(X_test), y_test, model.classes_)
    print(
        f"| {name:<29} | {len(y_train):>6} | {model.inducing_points_.shape[0]:>4} | {error:>6.3f} | "
        f"{nll:>6.3f} | {seconds:>7.2f} | {extra}"
    )
    return model


def _plot_banana(model, X, y, path):
    """Probability contours of a binary model on 2-D data, the training points and the inducing points."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("the demo's plot needs matplotlib: pip install matplotlib") from None
    lo, hi = X.min(axis=0) - 0.5, X.max(axis=0) + 0.5
    g0, g1 = np.meshgrid(np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120))
    p = np.asarray(model.predict_proba(np.column_stack([g0.ravel(), g1.ravel()])))[:, 1].reshape(g0.shape)
    fig = Figure(figsize=(7, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    filled = ax.contourf(g0, g1, p, levels=np.linspace(0.0, 1.0, 11), cmap="RdBu_r", alpha=0.6)
    fig.colorbar(filled, ax=ax, label=f"p(y = {model.classes_[1]} | x)")
    ax.contour(g0, g1, p, levels=[0.5], colors="k", linewidths=1.5)
    for label, colour in zip(model.classes_, ("#08306b", "#67000d")):
        ax.scatter(*X[y == label].T, s=3, c=colour, alpha=0.5, label=f"class {label}")
    Z = np.asarray(B.to_numpy(model.inducing_points_))
    ax.scatter(Z[:, 0], Z[:, 1], marker="X", s=60, c="yellow", edgecolors="k", label=f"{Z.shape[0]} inducing points")
    ax.set(title="agpc demo: banana, EP with inducing points (black: p = 0.5)", xlabel="x1", ylabel="x2")
    ax.legend(loc="lower right", fontsize=8)
    with checkpoints.atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=100)


def demo(args):
    if args.plot is not None:
        _check_png_name(args.plot)
        _check_writable(args.plot)
    X, y = make_banana(2000, random_state=0)
    Xt, yt = make_banana(10000, random_state=1)
    cancer = split_standardised(*load_breast_cancer(), train_fraction=0.9, random_state=0)
    # (the options checked before the table starts: a bad one is the one error line, not a table cut short)
    def model():
        return GPClassifier(n_inducing=args.inducing, max_iter=args.max_iter, random_state=0)

    model().check_params()
    rows = min(X.shape[0], cancer[0].shape[0])
    if args.inducing > rows:
        raise ValueError(f"--inducing {args.inducing}: at most {rows}, the rows of the demo's smaller training set "
                         "(breast cancer)")
    print("agpc demo: binary EP with inducing points (Hernandez-Lobato & Hernandez-Lobato 2016), NumPy backend")
    print(f"| {'data':<29} | {'n':>6} | {'m':>4} | {'error':>6} | {'NLL':>6} | {'fit s':>7} | note")
    print(f"|{'-' * 31}|{'-' * 8}|{'-' * 6}|{'-' * 8}|{'-' * 8}|{'-' * 9}|------")
    banana = _run("banana (synthetic, 2-D)", model(), X, y, Xt, yt,
                  extra=f"Bayes error {banana_bayes_error():.3f}")
    _run("breast cancer (sklearn, 30-D)", model(), *cancer, extra="90/10 split")
    # a file only where the user asked for one: a default name would be left in whatever directory the demo ran in,
    # a source checkout's among them
    if args.plot is None:
        print("Plot: none written (--plot PATH draws the banana decision boundary and the inducing points)")
        return 0
    _plot_banana(banana, X, y, args.plot)
    print(f"Plot: {printable(args.plot)} (banana decision boundary, inducing points marked)")
    return 0


# -- agpc bench ----------------------------------------------------------------------------------------

def _benchmarks_dir():
    """The source checkout's benchmarks/ beside the agpc package, or None (an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    bench = root / "benchmarks"
    return bench if bench.is_dir() and (root / "pyproject.toml").is_file() else None


def _png_times(directory):
    return {p: p.stat().st_mtime_ns for p in directory.rglob("*.png")}


def _written_pngs(before, directory, output, cwd, started_ns):
    """PNGs a script wrote: new or changed under ``directory``, or named in its output and written since it started."""
    written = {p for p, t in _png_times(directory).items() if before.get(p) != t}
    for name in re.findall(r"[\w./\\~-]+\.png", output):
        p = (cwd / Path(name).expanduser()).resolve()
        if p.is_file() and p.stat().st_mtime_ns >= started_ns:
            written.add(p)
    return sorted(written)


def _tee(command, cwd, env):
    """Run ``command``, echo its standard output line by line, return (output, exit status)."""
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        lines = []
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
        return "".join(lines), proc.wait()


def _markdown_tables(output):
    """The headings (one level down) and the tables (runs of lines starting with '|') of printed Markdown."""
    blocks, table = [], []
    for line in output.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            blocks.append("\n".join(table))
            table = []
        if line.startswith("#"):
            blocks.append("#" + line)
    if table:
        blocks.append("\n".join(table))
    return "\n\n".join(blocks)


def _write_result(out, name, content):
    """Write ``content`` (bytes or text) to ``out``/``name`` as every output is written (``checkpoints.atomic_write``):
    a name in --out that links to a device, a FIFO or /proc is one UsageError (shutil.copy2 followed it)."""
    path = out / name
    try:
        checkpoints.check_output_path(path, what=f"--out: {name}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with checkpoints.atomic_write(path, "wb" if isinstance(content, bytes) else "w") as fh:
        fh.write(content)


def _run_benchmark(script, quick, out):
    """Run one script, keep its log and PNGs in ``out``; its section of results.md and its exit status."""
    root = script.parent.parent
    command = [sys.executable, str(script)] + (["--quick"] if quick else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    shown = f"python benchmarks/{script.name}" + (" --quick" if quick else "")
    print(f"agpc bench: {shown}", flush=True)
    before, started_ns = _png_times(script.parent), time.time_ns()
    t0 = time.perf_counter()
    output, status = _tee(command, root, env)
    seconds = time.perf_counter() - t0
    pngs = _written_pngs(before, script.parent, output, root, started_ns)
    for png in pngs:
        _write_result(out, png.name, png.read_bytes())
    _write_result(out, f"{script.stem}.log", output)
    lines = [f"## benchmarks/{script.name}", "",
             f"`{shown}`: exit status {status}, {seconds:.0f} s; full output in `{script.stem}.log`.", ""]
    tables = _markdown_tables(output)
    lines += [tables, ""] if tables else ["(no tables printed)", ""]
    lines += [f"![{png.name}]({png.name})" for png in pngs]
    return "\n".join(lines).rstrip() + "\n", status


def _output_directory(path):
    """``agpc bench --out``: a directory to write results into, made if missing. An existing file that is not a
    directory (a regular file, /dev/null) and a path under /proc, /sys or /dev are one UsageError saying so (mkdir
    said "/dev/null: File exists")."""
    if not os.fspath(path):  # (Path("") is ".": the results would land among the caller's files)
        raise UsageError("--out: an empty path names no directory; name a directory")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {path}: not a directory ('agpc bench' writes a directory of results: results.md, "
                         "the scripts' logs and PNGs); name a directory")
    try:
        checkpoints.check_output_path(out / "results.md", what=f"--out {path}")
    except ValueError as exc:
        if out.exists() or "no directory" not in str(exc):
            raise UsageError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    return out


def bench(args):
    bench_dir = _benchmarks_dir()
    if bench_dir is None:
        raise UsageError("the benchmarks ship with the source repository, not with the installed package: "
                         "run 'agpc bench' in a source checkout (pip install -e .)")
    out = _output_directory(args.out)
    sections, failed = [], []
    for name in BENCH_SCRIPTS:
        script = bench_dir / name
        if not script.is_file():
            print(f"agpc bench: skipped benchmarks/{name}: not in this checkout", flush=True)
            sections.append(f"## benchmarks/{name}\n\nSkipped: not in this checkout.\n")
            continue
        section, status = _run_benchmark(script, args.quick, out)
        sections.append(section)
        if status != 0:
            failed.append(name)
    head = (f"# agpc bench{' --quick' if args.quick else ''}\n\n{time.strftime('%Y-%m-%d %H:%M')}: "
            f"the tables each benchmark script printed (headings one level down) and the PNGs it wrote.\n")
    with checkpoints.atomic_write(out / "results.md", "w") as fh:
        fh.write("\n".join([head] + sections))
    print(f"agpc bench: wrote {printable(out / 'results.md')}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# -- the parser ----------------------------------------------------------------------------------------

def _positive_or(words, text):
    """``text`` as one of ``words`` (the keys: what each stands for) or a positive integer, for argparse."""
    if text.lower() in words:
        return words[text.lower()]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        named = "".join(f"'{word}', " for word in words)[:-2]
        raise argparse.ArgumentTypeError(f"expected {named + ' or ' if named else ''}a positive integer, got {text!r}")
    return value


def _positive(text):
    return _positive_or({}, text)


def _batch_size(text):
    return _positive_or({"auto": "auto", "none": None}, text)


def _inducing(text):
    """``--inducing``: ``GPClassifier``'s ``n_inducing`` as text ('auto', 'all' or a positive integer)."""
    return _positive_or({"auto": "auto", "all": "all"}, text)


def _model_size(model):
    """The fitted model's size for the summary line: its inducing points (a class's, for more than two classes)."""
    m = model.inducing_points_.shape[-2]
    return f"{m} inducing point{'s' if m != 1 else ''}" + (" a class" if len(model.inducing_points_.shape) == 3 else "")


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}")
    return value


def _fit_parser(sub):
    p = sub.add_parser("fit", help="train a classifier on a data file and save the model",
                       description="Train a GPClassifier on DATA and write the model (an .agpc file).")
    _fit_model_arguments(p)
    _fit_run_arguments(p)
    p.set_defaults(func=fit)


def _fit_model_arguments(p):
    """``agpc fit``'s arguments of what is fitted: the data, the labels, the method and the model."""
    p.add_argument("data", metavar="DATA", help="a .csv (header row), .parquet, .npy, .npz file or a zarr store; "
                   "the column names of a CSV or Parquet file become the model's feature names")
    p.add_argument("--target", metavar="COL", help="the label column: a name or an integer index (.npy: an index); "
                   ".npz / zarr group: the array of labels (default y, features in X)")
    p.add_argument("--method", choices=method_names(), default="ep", help="inference method (default ep)")
    p.add_argument("--likelihood", choices=RegisteredLikelihood.names(),
                   help="the method's likelihood (default: its own, probit for the EP family and svi, logistic for "
                        "vi-*); 'ordinal': ordered classes, one latent GP and learned cut points (ep, sep, adf, svi; "
                        "docs/ordinal.md)")
    p.add_argument("--classes", metavar="A,B,...", help="with --likelihood ordinal: the classes in their order, lowest "
                   "first, comma-separated, e.g. poor,fair,good,best (needed for text labels; numbers default to "
                   "their numeric order); a class may have no rows; a label holding a comma in double quotes, as "
                   "in a CSV file")
    p.add_argument("--inducing", type=_inducing, default="auto", metavar="M",
                   help="'auto' (default: the exact model on small binary data, else 100 learned inducing points), "
                        "'all' (the exact model) or a number of inducing points")
    p.add_argument("--kernel-prior", choices=["auto", "none"], default="auto",
                   help="'auto' (default): weak priors on the kernel's lengthscales and amplitude (a linear "
                        "kernel's slope variances and bias) (MAP); 'none': type-II maximum likelihood "
                        "(docs/small_data_defaults.md)")
    p.add_argument("--ard", choices=["auto", "per-feature", "shared"], default="auto",
                   help="the lengthscales: 'auto' (default: on up to 500 rows, and on all the exact model's rows "
                        "with categorical columns, the exact model keeps one scale shared by every feature unless "
                        "lengthscales per feature are worth the parameters they free by Akaike's criterion, a "
                        "linear kernel instead if its log Z is a nat higher, and on up to 400 rows a "
                        "quadratic one if 2 nats higher still), 'per-feature' or 'shared' (the RBF)")
    p.add_argument("--standardize", action="store_true",
                   help="standardise each feature to mean 0 and standard deviation 1 on the training rows before "
                        "fitting (scikit-learn's StandardScaler); the model file keeps the means and scales, so "
                        "'agpc predict' takes the raw features (Python: agpc.load_model gives the Pipeline); rows "
                        "counted by --weight-column; not with --scheduler or a zarr store (it holds the rows in memory)")


def _fit_run_arguments(p):
    """``agpc fit``'s arguments of how the fit runs: its steps, where it computes, its weights, when it stops, its
    validation rows, its seed, what it shows and where the model goes."""
    p.add_argument("--batch-size", type=_batch_size, default="auto", metavar="B",
                   help="rows per minibatch: a number, 'none' (full batch) or 'auto' (default: full batch up to "
                        "20,000 rows, 200,000 for method ep on two classes, which above 20,000 fits a random 10,000 "
                        "first; else 200)")
    p.add_argument("--backend", choices=["numpy", "cupy"], default="numpy", help="compute on the CPU (numpy, "
                   "default) or a CUDA GPU (cupy)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="the floating type the model computes in (default float64; float32 is many times faster on "
                        "consumer GPUs)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="train on the dask cluster whose scheduler is at ADDRESS "
                   "(e.g. tcp://host:8786); the methods that train on dask arrays are "
                   "listed in docs/methods.md")
    p.add_argument("--site-directory", metavar="DIR", help="with --scheduler, batch ep: keep the sites (16 bytes a "
                   "row) in files under DIR, which every worker must reach, instead of in the workers' memory")
    p.add_argument("--class-weight", choices=["balanced"], help="weigh each class by n / (classes x its rows), "
                   "scikit-learn's class_weight='balanced' (imbalanced classes; docs/weights.md)")
    p.add_argument("--weight-column", metavar="NAME", help="a column (CSV, Parquet) holding each row's weight, "
                   "fit's sample_weight (not a feature; docs/weights.md)")
    p.add_argument("--max-iter", type=int, default=250, metavar="N",
                   help="iterations (epochs with minibatches) at most (default 250); the fit stops sooner once its log "
                        "Z stops rising (--plateau)")
    p.add_argument("--plateau", choices=["auto", "none"], default="auto",
                   help="auto (default): stop once log Z stops rising (GPClassifier's plateau='auto'); none: run every "
                        "iteration of --max-iter")
    p.add_argument("--categorical", action="append", metavar="COL",
                   help="a feature column (name or index) whose values are categories, not numbers (integer codes); "
                        "columns of text are categorical already. Repeat for more")
    p.add_argument("--early-stopping", choices=["off", "auto", "on"], default="off",
                   help="auto: a fit of minibatch size without --validation-fraction holds out 10%% of its rows and "
                        "stops when their NLL stops improving (GPClassifier's early_stopping: much sooner on some "
                        "tables, worse on slowly learning ones); on: at any size; off (default): never")
    p.add_argument("--jobs", type=int, metavar="N", help="cores the fit uses (GPClassifier's n_jobs; -1 every core). "
                   "Default: every core for a batch fit (its passes' threads: the same model), one for minibatches "
                   "(more would train data-parallel rounds in processes: another model)")
    p.add_argument("--max-time", type=float, metavar="S", help="seconds for the fit itself (GPClassifier's max_time): "
                   "no step starts that would end past S; reading DATA, scoring and writing the model come on top")
    p.add_argument("--validation-fraction", type=_fraction, metavar="F",
                   help="hold out this fraction of the rows (at random, keeping a row of every class for "
                        "training): the fit's validation data, scored every iteration into the model's history "
                        "('agpc inspect' shows it) and reported (error, NLL) at the end")
    p.add_argument("--random-state", type=int, default=0, metavar="S",
                   help="seed of the inducing points and the validation split (default 0)")
    p.add_argument("--quiet", action="store_true", help="do not show the progress lines and bars (the plan, the time "
                   "estimate, one bar a stage) on standard error")
    p.add_argument("--out", required=True, metavar="MODEL", help="where to write the model (e.g. model.agpc)")


def _predict_parser(sub):
    p = sub.add_parser("predict", help="predicted labels and class probabilities for a data file, as CSV",
                       description="Write, for every row of DATA, the most probable class (predicted_label, as the "
                                   "labels were written in the training file) and one probability column per class "
                                   "(p_<class>).")
    p.add_argument("model", metavar="MODEL", help="a model written by 'agpc fit' (or GPClassifier.save)")
    p.add_argument("data", metavar="DATA", help="a .csv, .parquet, .npy, .npz file or a zarr store: from a CSV or "
                   "Parquet file the model's feature columns are taken by name (other columns, the label's too, are "
                   "ignored); from a file without column names, by position")
    p.add_argument("--target", metavar="COL", help="a label column (or .npz / zarr array) to drop from the features "
                   "and score against: then error, NLL and the expected calibration error (ECE: 10 equal-width bins of "
                   "the top-class probability, Guo et al. 2017) are printed")
    p.add_argument("--latent", action="store_true", help="also write the latent mean and variance (per class "
                   "for more than two classes)")
    p.add_argument("--out", required=True, metavar="CSV", help="where to write the predictions (e.g. predictions.csv)")
    p.set_defaults(func=predict)


def _inspect_parser(sub):
    p = sub.add_parser("inspect", help="print what a model learned and how its training went; --plot draws it",
                       description="Print MODEL's method, data shape, classes and features, its kernel with the "
                                   "relevance of each feature (from the ARD lengthscales), its inducing points, its "
                                   "training history (final log Z or bound, iterations, time, jitter, why it "
                                   "stopped) and its validation scores; with --data and --target, its error, NLL "
                                   "and expected calibration error on those rows.")
    p.add_argument("model", metavar="MODEL", help="a model written by 'agpc fit' (or GPClassifier.save)")
    p.add_argument("--data", metavar="DATA", help="a labelled table (as for 'agpc predict') to score the model's "
                   "calibration on: error, NLL, ECE, and the reliability diagram of --plot")
    p.add_argument("--target", metavar="COL", help="the label column of --data")
    p.add_argument("--plot", metavar="PNG", help="also write one PNG: the training curve, the reliability diagram "
                   "(with --data) and the feature relevance")
    p.add_argument("--max-features", type=_positive, default=20, metavar="N",
                   help="list the N most relevant features (default 20)")
    p.set_defaults(func=inspect)


def _demo_parser(sub):
    p = sub.add_parser("demo", help="train and evaluate on built-in data, print error / NLL / time; --plot draws the "
                       "banana fit")
    p.add_argument("--inducing", type=int, default=50, help="number of inducing points (default 50)")
    p.add_argument("--max-iter", type=int, default=250, help="EP iterations (default 250)")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of the banana decision boundary and inducing points "
                   "to PATH (default: no file)")
    p.set_defaults(func=demo)


def _bench_parser(sub):
    p = sub.add_parser("bench", help="run the benchmark scripts of a source checkout and collect their tables",
                       description="Run benchmarks/{" + ",".join(BENCH_SCRIPTS) + "} (those present) and collect "
                                   "their Markdown tables into DIR/results.md, with their logs and PNGs.")
    p.add_argument("--quick", action="store_true", help="pass --quick to every script (small smoke-test settings)")
    p.add_argument("--out", default="agpc-bench", metavar="DIR", help="output directory (default agpc-bench)")
    p.set_defaults(func=bench)


_EPILOG = """\
Exit status: 0 success; 2 bad input (a missing or unreadable file, a missing column, a bad option, data the
model cannot use), as one line 'agpc: error: ...' on stderr; 1 an internal error, as one line 'agpc: internal
error: ...' (--debug, or AGPC_TRACEBACK=1, prints the traceback instead, with the same exit status); 130
interrupted (Ctrl-C, SIGINT). A reader that closes standard output early (agpc fit ... | head -1), or standard
output closed from the start (>&-), is not an error: the output files are still written. Outputs are written
only to regular files (not to a device, a FIFO, /proc, /sys or /dev), through a temporary file beside them.
Warnings (the library's and the command's own) are collected while the command runs and printed once it ends,
one line 'agpc: warning: ...' each on stderr: after the command's output, or, when it fails, just before its
error line, which is always the last line.
"""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are a UsageError, so that they reach the one-line report of ``main`` (argparse
    itself prints the whole usage text and exits)."""

    def error(self, message):
        option = re.fullmatch(r"argument (--[\w-]+)(?:/\S+)?: expected one argument", message)
        if option:  # (argparse reads a value that starts with '-' as an option: ``--classes -2,-1,0`` was "expected
            # one argument", with no word of why: the hostile-input audit of 2026-12-04)
            message += f" (a value that starts with '-' is written with '=': {option.group(1)}=-2)"
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _version():
    """The installed distribution's version; the package's own ``__version__`` when it runs from a source
    tree that is not installed."""
    try:
        return version("agpc")
    except PackageNotFoundError:
        return __version__


def _parser():
    parser = _ArgumentParser(prog="agpc", description="Scalable Gaussian process classification", epilog=_EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"agpc {_version()}")
    parser.add_argument("--debug", action="store_true", help="on an error, print the traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_fit_parser, _predict_parser, _inspect_parser, _demo_parser, _bench_parser):
        add(sub)
    for command in sub.choices.values():  # 'agpc fit ... --debug' as well as 'agpc --debug fit ...'
        command.epilog = _EPILOG
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="on an error, print the traceback instead of one line")
    return parser


# Bad input: the user's data, options or files (OSError: a path that is missing, unreadable, a directory, a
# full disk). A ValueError is the library's report of bad input (its CholeskyError is one too). Everything
# else is a bug or a failure of agpc itself, reported as an internal error.
_BAD_INPUT = (UsageError, ValueError, OSError)


def _report(exc):
    """(exit status, the one line for stderr) for an exception that ended a command (``untrusted.printable``: a
    message may quote a name or a label from a file)."""
    status, line = _classified(exc)
    return status, printable(line)


def _classified(exc):
    """(exit status, the line) of ``_report``, by the kind of exception."""
    if isinstance(exc, Terminated):
        return 128 + signal.SIGTERM, "agpc: terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return 130, "agpc: interrupted"
    missing = exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
    if missing and missing != "agpc":  # an optional package that is not installed
        return 2, f"agpc: error: this needs the package {missing!r}, which is not installed ({exception_line(exc)})"
    if isinstance(exc, _BAD_INPUT):
        return 2, f"agpc: error: {exception_line(exc)}"
    detail = exception_line(exc)
    return 1, (f"agpc: internal error: {type(exc).__name__}" + (f": {detail}" if detail else "")
               + " (run again with --debug for the traceback)")


class _OutputReaderMayLeave:
    """Standard output whose reader may stop reading (``agpc fit ... | head -1``). A command's results are
    files; what it prints is a summary for the reader. When the reader has gone (a write or flush raises
    BrokenPipeError: Python ignores SIGPIPE), the rest of the summary is dropped and the command goes on to
    its end and its own exit status: the reader leaving is not a failure of the command. As Python's
    documentation advises (signal module, "Note on SIGPIPE"), the descriptor is pointed at os.devnull, so
    that the text still buffered does not fail again when Python flushes standard output at exit."""

    def __init__(self, stream):
        self._stream = stream

    def _reader_gone(self):
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):
            fd = None
        if fd is not None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)
        self._stream = open(os.devnull, "w")  # kept open: the command may still print

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _warning_lines(caught):
    """One line per distinct warning, in the order first seen."""
    lines = {}
    for item in caught:
        kind = "" if issubclass(item.category, UserWarning) else f"{item.category.__name__}: "
        lines.setdefault(printable(f"agpc: warning: {kind}{one_line(item.message)}"), None)
    return list(lines)


@contextlib.contextmanager
def _interrupts_raise():
    """SIGINT raises KeyboardInterrupt while a command runs (in the main thread), whatever the process
    inherited: a process started as a background job of a shell without job control (``agpc fit ... &`` in a
    script, or a test runner started so) inherits SIGINT ignored, and Python then leaves it ignored, so the
    documented interrupt (exit 130, nothing written) would do nothing until the fit ended. The handler the
    caller had is put back afterwards (``main`` may run inside another program)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
        signal.signal(signal.SIGTERM, previous_term if previous_term is not None else signal.SIG_DFL)


class Terminated(KeyboardInterrupt):
    """SIGTERM while a command runs (``timeout``, a batch system's end of a job, ``kill``): raised as an interrupt is,
    so that what the command set up is taken down as for Ctrl-C (a fit's local workers, the copies of the rows they
    share in /dev/shm, temporary files), where Python's default ending left the rows in memory-backed /dev/shm until
    a reboot (the hostile-input audit of 2026-12-04). Exit status 143, as a shell gives a process SIGTERM ended."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _stream_or_devnull(stream, fd):
    """``stream`` (sys.stdout or sys.stderr), or, when the process started with that descriptor closed
    (``agpc ... >&-``: Python then sets the stream to None), a sink: the descriptor is first pointed at
    os.devnull, so that no file the command opens takes its number (a library printing there would write into
    it), and what the command prints is dropped; its results are its files."""
    if stream is not None:
        return stream
    try:
        os.fstat(fd)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != fd:
            os.dup2(devnull, fd)
            os.close(devnull)
    return open(os.devnull, "w")  # (lives as long as the command)


def main(argv=None):
    """Run one command; returns its exit status. Every exception ends as one line on stderr, after the
    warnings the command raised (see _EPILOG)."""
    debug = bool(os.environ.get("AGPC_TRACEBACK"))
    stdout, stderr = sys.stdout, sys.stderr
    sys.stderr = _stream_or_devnull(stderr, 2)
    sys.stdout = _OutputReaderMayLeave(_stream_or_devnull(stdout, 1))
    try:
        with _interrupts_raise():
            return _run_command(argv, debug)
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _run_command(argv, debug):
    status = failure = None
    with warnings.catch_warnings(record=True) as caught:
        # deprecations speak to programmers, not to the user of the command
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        try:
            args = _parser().parse_args(argv)
            debug = debug or args.debug
            status = args.func(args)
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 -- the one place failures are classified
            failure = exc
            close_progress_bars()  # (the error line below on a line of its own, and the last)
    sys.stdout.flush()  # the warnings come after the output
    for line in _warning_lines(caught):
        print(line, file=sys.stderr)
    if failure is None:
        return status
    status, line = _report(failure)
    if debug:  # the traceback instead of the one line; the exit status stays what the failure is
        traceback.print_exception(type(failure), failure, failure.__traceback__, file=sys.stderr)
    else:
        print(line, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
