"""The estimator's input checks, written once for the four kinds of input; the labels' own checks are ``agpc.labels``.

The kinds of input: NumPy arrays and lists (checked by scikit-learn's ``validate_data``), a foreign array-API
array (CuPy, array_api_strict, ...: checked in its own namespace and on its own device, never copied to the host),
data on disk or anywhere sliceable (a NumPy memmap, a zarr array: checked a chunk at a time, never held whole) and,
for ``fit``, dask arrays (``agpc.dask_inputs``: the same checks, run on the cluster, and the same ``TrainingInputs``).
Every check raises one ValueError naming the problem. The functions take the fit's ``plan.FitPlan`` for its
parameters (``dtype``, ``method``, ``likelihood``, ``random_state``) and the feature count a fitted model expects
(``FitPlan.n_features``); they return what they found and write nothing on the estimator, which records
``n_features_in_`` and ``feature_names_in_`` itself (scikit-learn's ``validate_data``).
"""

from __future__ import annotations

import collections.abc
import hashlib
import math
import numbers
import os
import warnings
from typing import Any, NamedTuple

import numpy as np
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, column_or_1d

from . import backend as B
from . import labels as L
from . import threads
from . import validation as V
from .kernels import RBF, Categorical, OnColumns, mixed_kernel
from .checkpoints import check_checkpoint_path, check_resume_path, check_site_directory
from .inducing import initial_inducing_points, kmeans_with_levels, start_rows, variance_points
from .inference.training import data_fingerprint, fingerprint_stride
from .methods import ORDINAL, methods_supporting, supports
from .plan import DTYPES, dtype_name
from .untrusted import check_zarr_array, shown

__all__ = [
    "warn_blas_threads",
    "check_kernel_values",
    "check_label_kind",
    "check_feature_dtype",
    "HeldOut",
    "column_scales",
    "check_precision_keeps_spread",
    "held_out",
    "EARLY_STOPPING_PATIENCE",
    "training_weights",
    "stream_weights",
    "class_weights",
    "every_class_needs_weight",
    "row_classes",
    "refuse_unweighted_method",
    "score_weights",
    "CHUNK",
    "INIT_SAMPLE",
    "DTYPES",
    "NEEDS_CHECKPOINT_PATH",
    "dtype_name",
    "EncodedLabels",
    "is_foreign_array",
    "check_conversion_keeps_spread",
    "check_feature_values",
    "check_features",
    "check_rows",
    "check_feature_count",
    "check_target_shape",
    "check_out_of_core",
    "check_classes",
    "rows_and_features",
    "check_known_shapes",
    "data_files",
    "check_fit_paths",
    "host_targets",
    "host_labels",
    "labels_on_disk",
    "device_targets",
    "initial_sample",
    "default_kernel",
    "start_inducing_points",
    "prior_reference",
    "OutlierScales",
    "outlier_scales",
    "StartScales",
    "start_scales",
    "typical_rows",
    "warn_outlier_columns",
    "OUTLIER_SAMPLE_ROWS",
    "OUTLIER_MIN_ROWS",
    "listed_levels",
    "DEFAULT_LISTED_LEVELS",
    "note_tf32",
    "sample_row_indices",
    "sample_weights",
    "start_of",
    "rows_counted",
    "rows_by_weight",
    "sample_rows",
    "fingerprint_rows",
    "training_fingerprint",
    "stays_on_host",
    "TrainingInputs",
    "training_inputs",
    "validation_set",
    "check_n_total",
]

CHUNK = 65536  # rows read at a time from data on disk
INIT_SAMPLE = 20000  # rows read from data on disk to initialise the kernel and the inducing points
NEEDS_CHECKPOINT_PATH = "checkpoint_every and resume=True need checkpoint_path (where checkpoints are written and read)"


def is_foreign_array(X):
    """An array-API array of a library other than NumPy (CuPy, array_api_strict, ...)."""
    return B.is_array_api_obj(X) and not isinstance(X, np.ndarray) and not B.is_numpy_namespace(B.array_namespace(X))


# A column survives conversion to a floating type when its spread is at least this many units of that type's
# resolution at the column's magnitude (eps * max|x|): below it, the kernel's distances are round-off (x + 1e7
# in float32, whose spacing at 1e7 is 1: train error 0.42 where the centred data give 0.01).
_SPREAD_RESOLUTIONS = 2.0 ** 10


def column_scales(X, weights=None):
    """Per column of X ((n, d), any array-API namespace): (standard deviation, max |x|) as NumPy float64
    vectors, computed in X's own precision without overflow or underflow (``backend.scaled_std``). A column of
    zeros has spread 0 and magnitude 0. ``weights`` (n,), on the host, positive: each row counted by its weight (the
    standard deviation of the rows repeated, ``inducing.start_rows``)."""
    xp = B.array_namespace(X)
    both = B.to_numpy(xp.stack(_device_scales(X, weights))).astype(np.float64)  # one copy to the host (a device sync)
    return both[0], both[1]


def _device_scales(X, weights):
    """``column_scales`` on X's device: (spread, magnitude), each (d,)."""
    xp = B.array_namespace(X)
    magnitude = xp.max(xp.abs(X), axis=0)
    if weights is not None and X.shape[0] > 1:
        return _weighted_scales(X, weights, magnitude), magnitude
    return (B.scaled_std(X, axis=0) if X.shape[0] > 1 else xp.zeros_like(magnitude)), magnitude


def _weighted_scales(X, weights, magnitude):
    """The spread of ``column_scales`` with rows counted by ``weights`` (on X's device): the weighted mean and
    variance of X divided by each column's largest |x| (no overflow or underflow, as ``backend.scaled_std``),
    scaled back."""
    xp = B.array_namespace(X)
    w = B.asarray_like(np.asarray(weights, dtype=np.float64) / float(np.sum(weights)), xp, device=B.array_device(X),
                     dtype=X.dtype)
    unit = xp.where(magnitude > 0, magnitude, xp.ones_like(magnitude))
    scaled = X / unit
    mean = xp.sum(w[:, None] * scaled, axis=0)
    return xp.sqrt(xp.sum(w[:, None] * (scaled - mean) ** 2, axis=0)) * unit


def check_precision_keeps_spread(X, dtype_name, what="X"):
    """Refuse (one ValueError) to convert X to the floating type ``dtype_name`` when that would erase the
    variation of some column: a spread below ``_SPREAD_RESOLUTIONS`` eps * max|x| of the target type.
    Constant columns (spread 0) lose nothing and pass. X is in its own (wider) type: compare before converting."""
    spread, magnitude = _integer_scales(X) if B.array_namespace(X).isdtype(X.dtype, "integral") else column_scales(X)
    eps = float(np.finfo(dtype_name).eps)
    lost = np.flatnonzero((spread > 0) & (spread < _SPREAD_RESOLUTIONS * eps * magnitude))
    if lost.size:
        shown = "; ".join(f"column {j}: spread {spread[j]:.3g} at magnitude {magnitude[j]:.3g}" for j in lost[:5])
        more = f" ({lost.size} columns in all)" if lost.size > 5 else ""
        raise ValueError(
            f"{what} in {dtype_name} would lose the variation of its features ({shown}{more}): {dtype_name} resolves "
            f"{eps:.2g} of a value's magnitude, so these columns' values would differ only by round-off; "
            + ("subtract each column's least value in integers first (or drop an identifier column)"
               if dtype_name == "float64" else
               "centre or standardise the features (e.g. sklearn's StandardScaler) or use dtype='float64'")
        )


def _integer_scales(X):
    """``column_scales`` of an integer X, exactly: of X less each column's least value, whose differences are exact
    in float64 where a column's range is below 2^53 (X itself in float64 is not: 2**60 + i is one number, a constant
    column, for i < 128). A range of 2^62 or more is wide whatever the type (its spread: inf)."""
    xp = B.array_namespace(X)
    low, high = xp.min(X, axis=0), xp.max(X, axis=0)
    lows, highs = B.to_numpy(low).tolist(), B.to_numpy(high).tolist()
    narrow = [h - lo < 2 ** 62 for lo, h in zip(lows, highs)]
    keep = B.asarray_like(np.asarray(narrow), xp, device=B.array_device(X))
    shifted = xp.where(keep[None, :], X - low[None, :], xp.zeros_like(X))  # (a wide column's wrap is not read)
    spread, _ = column_scales(xp.astype(shifted, xp.float64))
    magnitude = np.array([float(max(abs(lo), abs(h))) for lo, h in zip(lows, highs)], dtype=np.float64)
    return np.where(narrow, spread, np.inf), magnitude


def check_conversion_keeps_spread(X, target, what="X"):
    """Before X (any array-API array, in its own type) is converted to ``target`` (one of ``DTYPES``) for a fit:
    refuse a
    narrower type that would erase a column's variation (``check_precision_keeps_spread``;
    float32 of x + 1e7 fitted a chance-level model, exit 0, no warning). A type that holds X exactly is
    not checked (float64, float32 input in float32)."""
    xp = B.array_namespace(X)
    bits = xp.finfo(getattr(xp, target)).bits
    if xp.isdtype(X.dtype, "real floating"):
        wider = xp.finfo(X.dtype).bits > bits
    else:  # integers of as many bits as the target's have more digits than its significand
        wider = xp.isdtype(X.dtype, "integral") and xp.iinfo(X.dtype).bits >= bits
    if wider:
        check_precision_keeps_spread(X if xp.isdtype(X.dtype, "integral") else xp.astype(X, xp.float64), target,
                                     what=what)


def check_feature_count(n_features, expected, owner="GPClassifier"):
    """X's ``n_features`` against the ``expected`` count of a fitted model (None: training data, nothing to match),
    in scikit-learn's words (``owner``: the estimator's name)."""
    if expected is not None and n_features != expected:
        raise ValueError(f"X has {n_features} features, but {owner} is expecting {expected} features as input")


def check_rows(shape):
    if len(shape) != 2:
        raise ValueError(f"Expected 2D array, got {len(shape)}D array instead: reshape your data to (n_samples, "
                         "n_features)")
    if shape[0] < 1:
        raise ValueError("Found array with 0 sample(s) while a minimum of 1 is required")


def check_feature_dtype(X):
    """Refuse (one ValueError) an array whose values NumPy converts to floats silently but not as numbers a kernel
    can read: dates and durations (datetime64, timedelta64: their ticks, so the same dates in another unit were
    other rows, and NaT a number of -9.2e18), complex numbers on disk (cast to their real part with only NumPy's
    ComplexWarning; in memory scikit-learn refuses them) and structured records. A DataFrame's columns are checked
    by name (``check_feature_values``)."""
    dtype = getattr(X, "dtype", None)
    if not isinstance(dtype, np.dtype):
        return
    if dtype.kind in "mM":
        raise ValueError(f"X holds dates or times ({dtype}): features must be numbers; convert them first (e.g. to "
                         "seconds since a date)")
    if dtype.kind == "c":
        raise ValueError(f"Complex data not supported: X is {dtype}; features must be real numbers")
    if dtype.kind == "V":
        raise ValueError(f"X has a structured dtype ({dtype}): give one number a feature (e.g. "
                         "numpy.lib.recfunctions.structured_to_unstructured(X))")


def check_feature_values(X):
    """Refuse (one ValueError naming the column or row) the host inputs whose conversion to numbers fails with
    another library's words: a DataFrame column of categories, dates or text ("could not convert string to float:
    'hi'", NumPy's DTypePromotionError, neither naming the column), a generator ("float() argument must be ... not
    'generator'"), a list of rows of different lengths ("inhomogeneous shape after 1 dimensions"); an array's dtype
    as ``check_feature_dtype`` takes it."""
    check_feature_dtype(X)
    if isinstance(X, np.ma.MaskedArray) and np.ma.getmask(X) is not np.ma.nomask and np.ma.getmask(X).any():
        row, column = np.argwhere(np.ma.getmaskarray(X))[0] if np.ndim(X) == 2 else (0, 0)
        raise ValueError(f"X is a masked array with masked values (first at row {row}, column {column}): its mask "
                         "would be ignored and the values under it used; fill them (X.filled(...)) or drop those rows")
    if isinstance(X, collections.abc.Iterator):
        raise ValueError(f"X is a {type(X).__name__}: give the rows as an array (or a list of rows), each with one "
                         "number a feature")
    check_distinct_columns(X)
    dtypes = getattr(X, "dtypes", None)
    if dtypes is not None and hasattr(X, "columns") and hasattr(dtypes, "items"):
        for name, dtype in dtypes.items():
            kind = getattr(dtype, "kind", None)
            categories = getattr(dtype, "categories", None)  # (a Categorical of numbers converts as numbers)
            if categories is not None and getattr(categories.dtype, "kind", None) not in tuple("biuf"):
                raise ValueError(f"X column {str(name)!r} is categorical but not among categorical_features: name it "
                                 "there (or leave categorical_features='from_dtype'), or encode it as numbers")
            if kind in tuple("mM"):
                raise ValueError(f"X column {str(name)!r} holds dates or times ({dtype}): features must be numbers; "
                                 "convert it first (e.g. to seconds since a date)")
            if categories is None and kind not in tuple("biuf") and not _numbers_in(X[name]):
                raise ValueError(f"X column {str(name)!r} holds text or other objects ({dtype}): features must be "
                                 "numbers, or categories named in categorical_features")
    if isinstance(X, (list, tuple)) and X and all(isinstance(row, (list, tuple, np.ndarray)) for row in X):
        lengths = [len(row) for row in X]
        if len(set(lengths)) > 1:
            odd = next(k for k, length in enumerate(lengths) if length != lengths[0])
            raise ValueError(f"X is a list of rows of different lengths (row 0 has {lengths[0]} values, row {odd} has "
                             f"{lengths[odd]}): every row needs one value a feature")


def check_distinct_columns(X):
    """Refuse a DataFrame two of whose columns have one name (``pd.concat`` of two tables that share a column, a CSV
    header written twice): its columns cannot be told apart by name, as ``feature_names_in_`` and a later
    ``predict`` on a reordered frame need; scikit-learn's conversion raised narwhals' DuplicateError, a library
    the user never called."""
    names = getattr(X, "column_names", None)  # (a pyarrow Table's: its ``columns`` are the columns themselves)
    names = getattr(X, "columns", None) if names is None else names
    if names is None or isinstance(X, np.ndarray):
        return
    counts = collections.Counter(names)
    repeated = [name for name, count in counts.items() if count > 1]
    if repeated:
        listed = ", ".join(f"{name!r} ({counts[name]} times)" for name in repeated[:5])  # (0 as 0, 'a' as 'a')
        raise ValueError(f"X has columns of the same name: {listed}; give each column its own name (e.g. "
                         "X.columns = [...]) or drop the repeated ones")


def _numbers_in(column):
    """Whether a DataFrame column of objects holds numbers only (booleans, ints, floats: NumPy converts them)."""
    return all(isinstance(v, (numbers.Real, np.bool_)) for v in column.tolist())


def check_features(X, target, *, expected=None, owner="GPClassifier"):
    """Returns (X as an array of the input's namespace in ``target``, one of ``DTYPES``, checked; input namespace,
    or None for NumPy arrays and lists). ``expected``: the feature count of the fitted model X is for
    (``check_feature_count``); None: X is training data, and a narrower ``target`` is checked to keep its columns'
    spread. ``owner``: the estimator's name in scikit-learn's messages."""
    reset = expected is None
    if is_foreign_array(X):
        xp = B.array_namespace(X)
        B.check_device(xp)  # CuPy arrays on a machine whose CUDA libraries or driver cannot compute: said first
        check_rows(X.shape)
        if not xp.isdtype(X.dtype, ("real floating", "integral", "bool")):
            raise ValueError(f"X must be real-valued, got dtype {X.dtype}")
        if reset:
            check_conversion_keeps_spread(X, target)
        X = xp.astype(X, getattr(xp, target))
        if not bool(xp.all(xp.isfinite(X))):
            raise ValueError(f"Input X contains NaN or infinity (or values too large for {target})")
        check_feature_count(X.shape[1], expected, owner)
        return X, xp
    check_feature_values(X)
    if reset and isinstance(X, np.ndarray) and X.dtype.kind in "iu" and X.ndim == 2 and X.size:
        # in the integers themselves: in float64 int64 beyond 2^53 is rounded, 2**60 + i to one number for i < 128
        check_conversion_keeps_spread(X, target)
    if target != "float64":
        # checked in the input's own type (float64 for lists and integers) before the conversion, whose overflow
        # would otherwise come first, as NumPy's RuntimeWarning (a row of 1e39 given to a float32 model)
        X = _checked_array(X, ["float64", target], expected, owner)
        if X.size and np.max(np.abs(X)) > np.finfo(target).max:  # the cast would make inf
            raise ValueError(f"Input X contains NaN or infinity (or values too large for {target})")
        if reset:
            check_conversion_keeps_spread(X, target)
        return X.astype(target), None
    return _checked_array(X, target, expected, owner), None


def _checked_array(X, dtype, expected, owner):
    """Host rows through scikit-learn's ``check_array`` (2-D, finite, of ``dtype``), then their feature count. A
    cell that is not a number is named by its row and column (``_first_non_number``): the conversion's own words
    were Python's (TypeError of a complex number, OverflowError of 10**400) or NumPy's, naming neither."""
    try:
        # (its finiteness check sums X first: rows of +-1.7e308 overflowed there to a NumPy warning, though every
        # value is finite and taken)
        with np.errstate(over="ignore", invalid="ignore"):
            X = check_array(X, dtype=dtype, ensure_all_finite=True, estimator=owner, input_name="X")
    except (ValueError, TypeError, OverflowError) as exc:
        cell = _first_non_number(X)
        if cell is None:
            if isinstance(exc, ValueError):
                raise
            raise ValueError(f"X cannot be read as numbers ({type(exc).__name__}: {exc})") from None
        row, column, value, too_large = cell
        where = f"X row {row}, column {column} holds {shown(value, limit=40)}"
        if isinstance(exc, TypeError):  # (scikit-learn's estimator checks expect a TypeError there, in its words)
            raise TypeError(f"{where}: {exc}") from None
        what = "a number too large for a float" if too_large else "not a real number"
        raise ValueError(f"{where}, {what}: features must be real numbers (text is a category: name its column in "
                         "categorical_features)") from None
    check_feature_count(X.shape[1], expected, owner)
    return X


def _first_non_number(X):
    """(row, column, value, whether it is a number too large for a float) of the first cell of 2-D host rows (a list
    of rows, an array of text or objects) that Python's float does not read as a real number, or None (all
    numbers, or not a table)."""
    try:
        cells = np.asarray(X, dtype=object)
    except (ValueError, TypeError):
        return None
    if cells.ndim != 2:
        return None
    for (row, column), value in np.ndenumerate(cells):
        if isinstance(value, (bool, np.bool_)):
            continue
        try:
            float(value)
        except OverflowError:
            return row, column, value, True
        except (TypeError, ValueError):
            return row, column, value, False
        if isinstance(value, (complex, np.complexfloating)):
            return row, column, value, False
    return None


def check_out_of_core(X, target, *, expected=None, owner="GPClassifier", y=None):
    """Shape and finiteness of on-disk data, checked a chunk at a time (never all in memory), after the checks that
    read no row: X's rows against the labels' count (``y``, a fit's labels) and a zarr array's declared shape against
    the bytes its store holds (``untrusted.check_zarr_array``, as ``agpc fit`` checks a store): a shape forged to
    2 x 10^6 rows was scanned for 20 s (10^12: for ever) before its rows were compared with y's 120. ``target``:
    one of ``DTYPES``; ``expected`` and ``owner``: as ``check_features`` takes them."""
    check_rows(X.shape)
    check_feature_dtype(X)
    if y is not None:
        labels = getattr(y, "shape", None) or np.shape(y)
        if len(labels) >= 1:
            L.check_target_shape(labels[:1], X.shape[0])  # (the labels' own checks follow: ``host_targets``)
    check_zarr_array(X)
    for lo in range(0, X.shape[0], CHUNK):
        try:
            with np.errstate(over="ignore"):  # (a value too large for ``target`` is inf, refused below by name)
                block = np.asarray(X[lo:lo + CHUNK], dtype=target)
        except (ValueError, TypeError) as exc:  # (a chunk that is not what the metadata says: zarr's reshape error)
            hi = min(X.shape[0], lo + CHUNK) - 1
            raise ValueError(f"X cannot be read at rows {lo}..{hi} ({' '.join(str(exc).split())}): its stored chunks "
                             f"do not hold the {X.dtype} values of shape {tuple(X.shape)} its metadata declares "
                             "(damaged, or a forged dtype or shape?)") from None
        if not np.all(np.isfinite(block)):
            raise ValueError(f"Input X contains NaN or infinity (rows {lo}..{lo + block.shape[0] - 1})")
    check_feature_count(X.shape[1], expected, owner)


def host_targets(plan, y, n_rows, classes=None):
    """Check y (host side) and return (classes, labels as a NumPy array, or None for labels on disk, which are
    read a chunk at a time)."""
    if L.labels_on_disk(y):
        L.check_target_shape(y.shape, n_rows)
        found = np.unique(np.concatenate([L.chunk_labels(y[lo:lo + CHUNK], lo)
                                          for lo in range(0, n_rows, CHUNK)]))
        return L.check_classes(plan, found, classes), None
    y_host = host_labels(y, n_rows, plan.estimator_name)
    found = np.unique(y_host)
    L.check_whole_labels(found)  # (first: in agpc's words; scikit-learn's check below reads floats through int64)
    if y_host.dtype.kind != "f":
        check_classification_targets(y_host)
    return L.check_classes(plan, found, classes), y_host


def in_memory_targets(plan, y, n_rows, classes=None):
    """``host_targets`` for rows in memory: labels on disk (a memmapped .npy, a zarr array) beside them are read
    whole, n labels, a column of the rows' size (they were left on disk, as beside rows on disk, and the fit then
    failed with an IndexError on a 0-d array)."""
    classes, y_host = host_targets(plan, y, n_rows, classes)
    if y_host is None:
        y_host = np.asarray(B.row_slice(y, 0, n_rows))
    return classes, y_host


def host_labels(y, n_rows, estimator_name):
    """y in memory as a 1-D NumPy array of ``n_rows`` labels (``labels.check_labels``; a column vector taken as
    one column, with scikit-learn's warning), else one ValueError: what ``fit`` and ``score`` take as labels."""
    if y is None:
        raise ValueError(f"{estimator_name} requires y to be passed, but the target y is None")
    y_host = L.check_labels(B.to_numpy(y) if B.is_array_api_obj(y) else y)
    if y_host.ndim == 2 and y_host.shape[1] == 1:
        y_host = column_or_1d(y_host, warn=True)  # warns, as scikit-learn estimators do
    L.check_target_shape(y_host.shape, n_rows)
    return y_host


def ordinal_labels(plan, y, order=None, given=None):
    """An ordinal model's labels as ranks (0 .. K-1, int64, on the host) in the order of ``order`` (default: the
    classes ``given`` in their order, else the plan's ``classes``, else y's sorted distinct labels), and that
    order (a NumPy array): the classes of an
    ordinal model are ordered, and its labels travel as their ranks (whose sorted order is the model's). A label
    not among the classes, or classes given twice or fewer than two, is one ValueError."""
    if y is None:
        raise ValueError(f"{plan.estimator_name} requires y to be passed, but the target y is None")
    declared = declared_order(y)
    y_host = L.check_labels(B.to_numpy(y) if B.is_array_api_obj(y) else np.asarray(y))
    if y_host.ndim == 2 and y_host.shape[1] == 1:
        y_host = column_or_1d(y_host, warn=True)
    L.check_whole_labels(np.unique(y_host) if y_host.dtype.kind in "fO" else y_host[:0])
    if order is None:
        given = plan.classes if given is None else given
        given = declared if given is None else given
        order = np.unique(y_host) if given is None else L.check_labels(given, what="classes")
        if given is None:
            refuse_text_order(order)
        if order.ndim == 1 and np.unique(order).shape[0] != order.shape[0]:
            values, counts = np.unique(order, return_counts=True)
            twice = values[counts > 1][0]
            raise ValueError(f"classes lists {L.label_text(twice)} {int(counts[counts > 1][0])} times, in "
                             f"{L.label_text(order)}: each class once, in their order")
        if order.ndim != 1 or order.shape[0] < 2:
            raise ValueError(f"classes must list at least two distinct labels, in their order, got {order.tolist()}")
    L.check_label_length(order)
    return L.label_ranks(y_host, order), order


def declared_order(y):
    """The classes of labels given as an ordered pandas Categorical (or a Series of one), in their declared order
    (a NumPy array), the order an ordinal model takes where ``classes=`` is not given; None for other labels."""
    dtype = getattr(y, "dtype", None)
    categories = getattr(dtype, "categories", None)
    if categories is None or not getattr(dtype, "ordered", False):
        return None
    return np.asarray(categories)


def refuse_text_order(order):
    """Refuse an ordinal model's classes taken from labels that are text, sorted (``classes=`` not given): their
    sorted order (best, fair, good, poor) is seldom theirs, and a model trained in it is silently a wrong one (the
    command line refuses the same labels without ``--classes``). Numbers and booleans keep their numeric order."""
    if order.dtype.kind in "biuf" or not any(isinstance(v, (str, bytes)) for v in order.tolist()):
        return
    shown = L.label_text(order[:8]) + (f" and {order.shape[0] - 8:,} more" if order.shape[0] > 8 else "")
    raise ValueError(f"likelihood='ordinal': the labels are text ({shown}), whose order agpc cannot "
                     "know: give classes=[...] in their order, lowest first, or y as an ordered pandas Categorical")


def check_known_shapes(X, y=None):
    """A dask array whose chunk sizes are unknown (after boolean indexing, or read from a format that does not
    record them) has NaN in its shape: the rows cannot be counted, split or matched with the labels. Refused in
    one ValueError saying what dask offers (``compute_chunk_sizes``: one pass over the data)."""
    for name, values in (("X", X), ("y", y)):
        shape = getattr(values, "shape", None) if B.is_dask_array(values) else None
        if shape is not None and any(isinstance(size, float) and math.isnan(size) for size in shape):
            raise ValueError(f"{name} is a dask array of unknown chunk sizes (shape {tuple(shape)}, e.g. after boolean "
                             f"indexing): call {name} = {name}.compute_chunk_sizes() first (one pass over the data)")


def rows_and_features(X, y=None):
    """(rows, features) of X as given, before its checks: what a fit's steps are resolved from (``FitPlan.steps``) and
    its BLAS scope is sized by. A dask array of unknown chunk sizes (X or the labels y) is refused first
    (``check_known_shapes``). Lists and array-likes are read through NumPy; what cannot be (the checks will say
    why) counts as 1 x 1."""
    check_known_shapes(X, y)
    shape = getattr(X, "shape", None)
    if shape is None:
        try:
            shape = np.asarray(X).shape
        except (TypeError, ValueError):
            shape = ()
    return (int(shape[0]) if len(shape) else 1), (int(shape[1]) if len(shape) > 1 else 1)


# ``early_stopping="auto"``'s patience where ``n_iter_no_change`` is None: epochs whose validation NLL does not improve
# before the fit stops (docs/small_data_defaults.md, "Early stopping on held-out rows")
EARLY_STOPPING_PATIENCE = 3
# the split's seed where ``random_state`` is None: the same rows are held out on every fit of the same data (two fits
# that differ in a parameter are scored on the same rows)
HOLDOUT_SEED = 0


class HeldOut(NamedTuple):
    """A fit's rows once ``early_stopping`` has held some out: the training rows, labels and weights, and the
    held-out rows as its ``validation_data``."""

    X: Any
    y: Any
    sample_weight: Any
    validation_data: tuple
    n_rows: int  # the training rows'


def held_out(plan, X, y, sample_weight, n_rows, random_state):
    """The rows ``plan.early_stopping`` holds out for validation (scikit-learn's ``HistGradientBoostingClassifier``
    convention), or None: False (the default) none; ``"auto"`` holds out ``validation_fraction`` of the rows
    (``labels.holdout_mask``) where the rows left take minibatches (``FitPlan.steps``: above
    ``batch_size.full_batch_max_rows`` on the CPU by default) and are in memory, and none where the fraction holds
    out no row; True holds them out whatever the size, and refuses rows it cannot hold out (a dask array, data on
    disk: pass validation_data). The split is drawn from ``random_state`` (an int, or a generator it advances), else
    from ``HOLDOUT_SEED``."""
    auto = isinstance(plan.early_stopping, str)  # ("auto"; else a bool, NumPy's too)
    if not auto and not plan.early_stopping:
        return None
    if auto:
        n_val = int(round(plan.validation_fraction * n_rows))
        if not (plan.spec.supports("minibatch") and plan.steps(n_rows - n_val).minibatch):
            return None
    in_memory = not (B.is_dask_array(X) or B.is_out_of_core(X) or L.labels_on_disk(y))
    if auto and not in_memory:
        return None
    if not in_memory:
        raise ValueError("early_stopping=True holds out rows of X in memory; for a dask array or data on disk pass "
                         "fit(..., validation_data=(X_val, y_val)) ('agpc fit': --validation-fraction), or set "
                         "early_stopping=False")
    labels = B.to_numpy(y) if B.is_array_api_obj(y) else np.asarray(y)
    column = labels.ndim == 2 and labels.shape[1] == 1  # (a column of labels: fit takes it, with a warning)
    if column:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.shape[0] != n_rows:  # (the label checks say what is wrong, on the whole y)
        return None
    seed = random_state if isinstance(random_state, numbers.Integral) else (
        HOLDOUT_SEED if random_state is None else B.host_rng(random_state).integers(2**32))
    # (checked here as the fit checks them, before the split reads them: weights of another length made the split's
    # mask an IndexError, string weights NumPy's UFuncTypeError)
    weights = None if sample_weight is None or np.ndim(sample_weight) == 0 else V.check_sample_weight(
        sample_weight, n_rows)
    try:
        val = L.holdout_mask(L.check_labels(labels), plan.validation_fraction, seed, weights=weights)
    except ValueError:
        if auto:  # (too few rows to hold any out: "auto" trains on them all)
            return None
        raise
    fit, held = np.flatnonzero(~val), np.flatnonzero(val)
    return HeldOut(B.rows_at(X, fit), B.rows_at(y, fit), B.rows_at(sample_weight, fit),
                   (B.rows_at(X, held), labels[held] if column else B.rows_at(y, held)), fit.shape[0])


def data_files(*arrays):
    """The files (and zarr store directories) that arrays read a block at a time come from: NumPy memmaps, zarr
    arrays. An output of the fit (a checkpoint) must not replace one of them."""
    files = []
    for values in arrays:
        filename = getattr(values, "filename", None) if isinstance(values, np.memmap) else None
        if filename:
            files.append(os.fspath(filename))
        store = getattr(values, "store", None)
        root = getattr(store, "root", None) or getattr(store, "path", None)  # zarr 3 LocalStore / zarr 2 DirectoryStore
        if isinstance(root, (str, os.PathLike)) and os.path.exists(root):
            files.append(os.fspath(root))
    return files


def check_fit_paths(plan, X, y, resume):
    """The paths a fit reads and writes, checked before any work (a bad path must not cost the fit): the
    checkpoint to resume from, the checkpoint path (writable, not one of the training data's files) and the site
    directory. A ``checkpoint_path`` that nothing will write or read is warned about (from the user's line). ``resume``
    is True or False (a string "no" is true)."""
    if not isinstance(resume, (bool, np.bool_)):
        raise ValueError(f"resume must be True or False, got {resume!r}")
    if resume and plan.checkpoint_path is None:
        raise ValueError(NEEDS_CHECKPOINT_PATH)
    if resume:
        check_resume_path(plan.checkpoint_path)
    if plan.checkpoint_every is not None:
        check_checkpoint_path(plan.checkpoint_path, inputs=data_files(X, y), resume=bool(resume))
    elif plan.checkpoint_path is not None and not resume:  # a path alone writes nothing (a resume reads it)
        warnings.warn(f"checkpoint_path={str(plan.checkpoint_path)!r} is set without checkpoint_every: no "
                      "checkpoint will be written (set checkpoint_every, a number of steps)", UserWarning,
                      stacklevel=B.outside_stacklevel())
    if plan.site_directory is not None:
        check_site_directory(plan.site_directory)


def initial_sample(plan, X, xp, dtype, check_spread=False):
    """At most ``INIT_SAMPLE`` rows of data read a block at a time, drawn at random (sorted: one pass), in
    the compute namespace: what the kernel and the inducing points are initialised from. ``check_spread``:
    the sample, in the file's own type, is checked to keep its columns' spread in ``dtype`` first."""
    rows = sample_row_indices(plan, X.shape[0])
    if rows is None:  # as the in-memory path: all rows, no draw (same seed, same model)
        sample = np.asarray(X[0:X.shape[0]])
    else:
        try:
            sample = np.asarray(X[rows])
        except (IndexError, TypeError):  # array-likes without integer-array indexing (zarr: oindex)
            sample = np.asarray(X.oindex[rows, :])
    if check_spread:
        check_conversion_keeps_spread(sample, plan.dtype, what="X (a sample of its rows)")
    return B.asarray_like(sample, xp, dtype=dtype)


DEFAULT_LISTED_LEVELS = 64
"""The most levels of a column the default kernel gives a lengthscale of their own (``listed_levels``): those most
frequent among the start's rows; the column's other values share its lengthscale."""


def default_kernel(X, weights=None, categorical=(), start=None):
    """The kernel ``GPClassifier(kernel=None)`` starts from on the rows X (the initial sample; ``weights``: each row's
    count, ``inducing.start_rows``'s): RBF with lengthscales sqrt(d) times each column's standard deviation (1 for a
    constant column), amplitude 1 and latent noise 1e-3. The deviations are taken without overflow or underflow
    (``column_scales``), so that the lengthscales follow features on any scale (X * 1e-300 or X * 1e154 in
    float64: ``xp.std`` gave 0 or inf there, a chance-level model or an error about infinite lengthscales).
    ``categorical``: the categorical columns, where there are any: the RBF over the d other columns, a per-level
    ``kernels.Categorical`` over these (the levels of X, ``listed_levels``) and their product, summed
    (``kernels.mixed_kernel``, issue 45); the categorical kernel alone where every column is categorical. Its
    lengthscales are all sqrt(k), k the number of categorical columns, so that two rows that differ in every one of
    them are correlated exp(-1) through it, as the RBF's sqrt(d) puts two typical rows at a distance of about one
    lengthscale: with 1, rows differing in six columns started correlated exp(-6), a kernel too rough for 100
    inducing points to cover (monk2's and tic-tac-toe's test NLL, docs/results.md). ``start``: the rows'
    ``start_scales``, where the caller has them (else taken here)."""
    if not categorical:
        return RBF(lengthscales=_default_lengthscales(X, weights, scales=_scales_of(start, range(X.shape[1]))),
                   amplitude=1.0, noise=1e-3)
    chosen = sorted(set(int(j) for j in categorical))
    continuous = _continuous(X, chosen)
    scale = math.sqrt(len(chosen))
    categories = dict(columns=chosen, lengthscales=scale, amplitude=1.0, levels=listed_levels(X, chosen, weights),
                      level_lengthscales=scale)
    if not continuous:
        return Categorical(**categories, noise=1e-3)
    rbf = RBF(lengthscales=_default_lengthscales(_columns_of(X, continuous), weights, continuous,
                                                 _scales_of(start, continuous)), amplitude=1.0)
    return mixed_kernel(OnColumns(rbf, continuous), Categorical(**categories), noise=1e-3)


def listed_levels(X, columns, weights=None):
    """The levels of each of ``columns`` of the rows X (the start's sample, ``weights`` their counts) that the default
    kernel lists: every distinct value, or the ``DEFAULT_LISTED_LEVELS`` most frequent (ties: the smaller code)."""
    xp = B.array_namespace(X)
    taken = B.to_numpy(xp.take(X, B.asarray_like(np.asarray(columns), xp, device=B.array_device(X)), axis=1))
    counts_of = None if weights is None else np.asarray(weights, dtype=np.float64)
    out = []
    for values in np.asarray(taken, dtype=np.float64).T:
        found, inverse = np.unique(values, return_inverse=True)
        counts = np.bincount(inverse.reshape(-1), weights=counts_of, minlength=found.shape[0])
        if found.shape[0] > DEFAULT_LISTED_LEVELS:
            found = np.sort(found[np.argsort(-counts, kind="stable")[:DEFAULT_LISTED_LEVELS]])
        out.append([float(v) for v in found])
    return out


KERNEL_CHECK_POINTS = 256  # inducing points ``check_kernel_values`` evaluates the kernel on, at most


def check_kernel_values(kernel, Z, given="kernel"):
    """A user's kernel whose covariance of the start's inducing points Z is not finite (an overflow: lengthscales of
    1e-300 scale the inputs to 1e300, whose squared distances are inf), or a user's inducing points that overflow
    the default kernel (``given="inducing"``: points 1e200 times the rows' scale), is one ValueError before any
    step; it was a CholeskyError of K(Z, Z) at the first step, after NumPy's overflow warnings. One host read."""
    xp = B.array_namespace(Z)
    points = Z[:min(Z.shape[0], KERNEL_CHECK_POINTS), ...]  # (an exact model's Z is every row: not its n x n kernel)
    try:
        with B.overflow_raises():
            finite = bool(xp.all(xp.isfinite(kernel.K(points))))
    except FloatingPointError:
        finite = False
    if not finite and given == "inducing":
        raise ValueError(f"inducing: the kernel's covariances of these inducing points are not finite in {Z.dtype} "
                         "(they overflow): the points are far out of scale with the training rows, whose spread the "
                         "kernel's lengthscales follow; give points among the rows (or rescale them as the rows)")
    if not finite:
        raise ValueError(f"kernel: its covariances of the inducing points are not finite in {Z.dtype} (they overflow):"
                         " a parameter is out of scale for these inputs (a lengthscale far below the columns' spread,"
                         " or an amplitude near the type's largest number); rescale the inputs or the kernel's "
                         "parameters")


def start_inducing_points(X, n_points, method, columns, *, random_state=None, weights=None, deadline=None,
                          start=None):
    """The inducing points ``GPClassifier(inducing=method)`` starts from on the rows X (the start's, ``weights``
    their counts) with categorical ``columns``: "auto" is "variance" where there are categorical columns (their
    points hold their levels, so the start is the model's: ``inducing.variance_points``), else "kmeans"; "variance"
    and, with categorical columns, "kmeans" (``inducing.kmeans_with_levels``) read the rows in the default kernel's
    geometry at its start, its RBF's lengthscales (``prior_reference``) and the levels it lists (``listed_levels``);
    "random", "kmeans" without categorical columns and an array of points are ``inducing.initial_inducing_points``'s.
    ``deadline``: k-means's (``inducing.kmeans``). Rules pick from the rows less the outliers (``typical_rows``; ``start``:
    the rows' ``start_scales`` where the caller has them).
    """
    if isinstance(method, str) and method == "auto":
        method = "variance" if columns else "kmeans"
    if isinstance(method, str):  # (points the user gave are theirs, outliers included)
        typical = typical_rows(X, weights, columns, start)
        if n_points <= typical.shape[0] < X.shape[0]:
            xp = B.array_namespace(X)
            X = xp.take(X, B.asarray_like(typical, xp, device=B.array_device(X)), axis=0)
            weights = None if weights is None else np.asarray(B.to_numpy(weights))[typical]
            start = None  # (the scales were the rows' before these were left out)
    if not (isinstance(method, str) and (method == "variance" or (method == "kmeans" and columns))):
        return initial_inducing_points(X, n_points, method, random_state=random_state, weights=weights,
                                       deadline=deadline)
    scales = np.exp(np.asarray(B.to_numpy(prior_reference(X, weights, columns, start).params["log_lengthscales"]),
                               dtype=np.float64).reshape(-1))
    levels = listed_levels(X, columns, weights) if columns else []
    if method == "variance":
        return variance_points(X, n_points, columns, levels, scales, random_state=random_state)
    return kmeans_with_levels(X, n_points, columns, levels, scales, random_state=random_state, weights=weights,
                              deadline=deadline)


def prior_reference(X, weights=None, categorical=(), start=None):
    """The RBF over every column whose lengthscales ``kernel_prior="auto"`` centres the priors on
    (``kernels.with_default_priors``): the default kernel where no column is categorical; else the default mixed
    kernel's RBF lengthscales on the continuous columns (sqrt(d) there counts those) and 1 on the categorical ones
    (which the categorical kernel's own priors do not read). ``start``: as ``default_kernel`` takes it."""
    if not categorical:
        return default_kernel(X, weights, start=start)
    continuous = _continuous(X, categorical)
    lengthscales = np.ones(X.shape[1])
    if continuous:
        lengthscales[continuous] = _default_lengthscales(_columns_of(X, continuous), weights, continuous,
                                                         _scales_of(start, continuous))
    return RBF(lengthscales=list(lengthscales), amplitude=1.0, noise=1e-3)


def _default_lengthscales(X, weights, columns=None, scales=None):
    """The default RBF's lengthscales on the columns of X: sqrt(d) times each one's standard deviation, or the spread
    of its other rows where a few rows set that deviation (``outlier_scales``) (``columns``: the features X's columns
    are, as an error names them; ``scales``: their ``outlier_scales``, where the caller has them)."""
    d = X.shape[1]
    scales = outlier_scales(X, weights) if scales is None else scales
    std, magnitude = np.where(scales.dominated, scales.bulk, scales.std), scales.magnitude
    # a constant column (spread 0) takes its magnitude as its scale (at least 1): it adds nothing to a distance
    # whatever its lengthscale, but its values scaled by 1 stayed ~1e23, where the mean the kernel centres on is one
    # ulp off (1e23 + 1.7e7), and the round-off of that offset's squares (2.8e14) broke K(Z, Z) at every jitter
    std = np.where(std > 0, std, np.maximum(magnitude, 1.0))
    lengthscales = std * math.sqrt(d)
    limits = B.array_namespace(X).finfo(X.dtype)
    tiny, huge = float(limits.smallest_normal), float(limits.max)
    if not np.all((lengthscales >= tiny) & (lengthscales <= huge)):
        bad = np.flatnonzero(~((lengthscales >= tiny) & (lengthscales <= huge)))
        named = bad.tolist() if columns is None else [columns[k] for k in bad]
        raise ValueError(
            f"features {named} have standard deviations {std[bad].tolist()}: the default kernel's "
            f"lengthscales (sqrt(d) = {math.sqrt(d):.3g} times them) are not representable in {X.dtype}; "
            "standardise the features (e.g. sklearn's StandardScaler)"
        )
    return list(lengthscales)


OUTLIER_SAMPLE_ROWS = 20000  # rows (at a fixed stride) ``outlier_scales`` reads: a few outliers among millions raise
# the deviation of every column they are in, which the sample's other rows show whether or not it holds them


class OutlierScales(NamedTuple):
    """Per column (NumPy float64 (d,)): the standard deviation and largest |x| of all rows (``column_scales``), the
    mean and spread of the rows less their few extreme ones (``backend.moments_without_extremes``), and whether a
    few rows set the deviation (``backend.few_rows_set_spread``)."""

    std: np.ndarray
    magnitude: np.ndarray
    centre: np.ndarray
    bulk: np.ndarray
    dominated: np.ndarray


OUTLIER_MIN_ROWS = 10  # fewer rows tell no outlier from chance: 5% of 3 normal draws, 0.15% of 4, set the rule off


def outlier_scales(X, weights=None):
    """``OutlierScales`` of the columns of X (any namespace; ``weights``: the rows' counts): the deviation of every
    row (``column_scales``), the bulk's of at most ``OUTLIER_SAMPLE_ROWS`` rows at a fixed stride; computed on X's
    device, NumPy results."""
    n, d = X.shape
    stride = max(1, -(-n // OUTLIER_SAMPLE_ROWS))
    rows = X[0:n:stride, :]
    if rows.shape[0] < OUTLIER_MIN_ROWS:
        std, magnitude = column_scales(X, weights)
        return OutlierScales(std, magnitude, np.zeros(d), np.zeros(d), np.zeros(d, dtype=bool))
    xp = B.array_namespace(X)
    w = None if weights is None else B.asarray_like(np.asarray(weights, dtype=np.float64)[0:n:stride], xp,
                                                       device=B.array_device(X), dtype=X.dtype)
    # (computed on X's device; the four (d,) results come to the host in one copy, one device sync)
    std, magnitude, centre, bulk = B.to_numpy(xp.stack([*_device_scales(X, weights),
                                                        *B.moments_without_extremes(rows, w)])).astype(np.float64)
    return OutlierScales(std, magnitude, centre, bulk, B.few_rows_set_spread(std, bulk))


class StartScales(NamedTuple):
    """The ``outlier_scales`` of a fit's start rows on their ``continuous`` columns (None where there are none),
    taken once a fit (one device sync) for its default kernel, its warning and its inducing points."""

    continuous: list
    scales: OutlierScales | None


def start_scales(X, weights=None, categorical=()):
    """``StartScales`` of the start's rows X (``weights`` their counts), whose ``categorical`` columns (codes of
    levels) are left out."""
    continuous = _continuous(X, categorical)
    return StartScales(continuous, outlier_scales(_columns_of(X, continuous), weights) if continuous else None)


def _continuous(X, categorical):
    """The columns of X that are not among ``categorical``, in order."""
    chosen = set(int(c) for c in categorical)
    return [j for j in range(X.shape[1]) if j not in chosen]


def _scales_of(start, continuous):
    """``start``'s scales where they are those of the ``continuous`` columns, else None (taken again)."""
    return start.scales if start is not None and start.continuous == list(continuous) else None


def typical_rows(X, weights=None, categorical=(), start=None):
    """The indices (NumPy int64) of the rows of X (the start's; ``weights`` their counts) that inducing points start
    from: those within ``backend.OUTLIER_SPREAD_RATIO`` bulk spreads of the bulk's mean in every continuous column
    whose deviation a few rows set (``outlier_scales``; ``start``: the rows' ``start_scales``, where the caller has
    them); every row where no column is such. A point on an outlier (1e8 among values within +-3) centred the
    kernel's distances far from the others (K(Z, Z) centred on the points' mean then), whose squares' round-off broke
    it at every jitter: the fit diverged at its first step."""
    continuous = _continuous(X, categorical)
    everything = np.arange(X.shape[0])
    if not continuous:
        return everything
    xp = B.array_namespace(X)
    rows = _columns_of(X, continuous)
    scales = _scales_of(start, continuous)
    scales = outlier_scales(rows, weights) if scales is None else scales
    chosen = np.flatnonzero(scales.dominated)
    if not chosen.size:
        return everything

    def on_device(values):
        return B.asarray_like(values, xp, device=B.array_device(X), dtype=X.dtype)

    values = xp.take(rows, B.asarray_like(chosen, xp, device=B.array_device(X)), axis=1)
    near = xp.all(xp.abs(values - on_device(scales.centre[chosen]))
                  <= on_device(B.OUTLIER_SPREAD_RATIO * scales.bulk[chosen]), axis=1)
    # (the rows' indices come to the host only here, where some column has outliers: the weights are the host's)
    return np.asarray(B.to_numpy(xp.nonzero(near)[0]), dtype=np.int64)


def _columns_of(X, columns):
    """The ``columns`` of X (every one: X itself), in X's namespace and device."""
    if len(columns) == X.shape[1]:
        return X
    xp = B.array_namespace(X)
    return xp.take(X, B.asarray_like(np.asarray(columns), xp, device=B.array_device(X)), axis=1)


def warn_outlier_columns(start, names=None):
    """Say in one UserWarning which continuous columns of a fit's start rows (their ``start_scales``; ``names``: the
    features' names, where known) have a standard deviation that a few extreme rows set: the default kernel's
    lengthscales, and the priors centred on them, start from their other rows' spread there
    (``_default_lengthscales``), inducing points picked from the rows leave those out (``typical_rows``), and the
    user should know their data hold such values (a typo, a code such as -999 for "missing", a unit mixed up)."""
    if start.scales is None:
        return
    scales, continuous = start.scales, start.continuous
    chosen = np.flatnonzero(scales.dominated)
    if chosen.size:
        def named(j):
            return f"column {j}" + ("" if names is None else f" ({shown(str(names[j]))})")

        listed = "; ".join(f"{named(continuous[j])}: {scales.std[j]:.3g} where its other rows' is "
                           f"{scales.bulk[j]:.3g}" for j in chosen[:5])
        more = f" ({chosen.size} columns in all)" if chosen.size > 5 else ""
        warnings.warn(f"a few extreme values set the standard deviation of some features ({listed}{more}): the "
                      "default kernel's lengthscales and their priors start from the other rows' spread there, and "
                      "inducing points picked from the rows leave those out (from the deviation, the fit would drop "
                      "such a feature); check those values (a typo, a code such as -999 for missing, mixed units) "
                      "or clip them", UserWarning, stacklevel=B.outside_stacklevel())


def note_tf32(plan, xp):
    """Whether the float32 products of the plan's fit run in TF32 (``backend.uses_tf32``; the estimator's
    ``tf32_``), said once a fit by a ``backend.TF32Warning`` (from the user's line)."""
    tf32 = B.uses_tf32(xp, plan.dtype)
    if tf32:
        warnings.warn("float32 products on the GPU run in TF32 (CUPY_TF32 is set): about 3 significant digits per "
                      "product instead of 7, so this fit differs from NumPy's float32 by far more than round-off; "
                      "unset CUPY_TF32 before CuPy's first float32 product for float32 accuracy", B.TF32Warning,
                      stacklevel=B.outside_stacklevel())
    return tf32


def stays_on_host(X, xp, device):
    """Host data (a NumPy array, already in the model's type) too large for ``DEVICE_MEMORY_FRACTION`` of the
    compute device's free memory: kept on the host and moved a block at a time (``backend.HostRows``).
    Never on the host itself (``device_free_bytes`` None)."""
    fit = B.rows_within_memory(X.shape[1] * X.dtype.itemsize, xp, device)
    return fit is not None and X.shape[0] > fit


class TrainingInputs(NamedTuple):
    """Validated training data as the training loop takes them."""

    X: Any  # rows in the compute namespace and dtype, or rows read a block at a time (on disk, HostRows)
    y: Any  # labels encoded (``encode_labels``), likewise
    classes: np.ndarray
    sample: Any  # rows in memory that the kernel and the inducing points are initialised from
    xp: Any  # the compute namespace
    device: Any
    client: Any = None  # a dask array's: the distributed.Client its rows are on
    blocks: Any = None  # a dask array's persisted row chunks (futures of X's and y's; ``dask_engine.persisted_blocks``)
    pending: Any = None  # a dask array's checks still running on the cluster, and the workers' warm-up (futures)
    fingerprint_rows: Any = None  # (rows, labels) of ``fingerprint_rows`` read with the checks; None: slice X, y
    class_labels: Any = None  # a dask array's ordinal classes as the user names them (``classes``: their ranks)


def training_inputs(plan, X, y, *, target_xp=None, classes=None):
    """Validated training data in the compute namespace (``target_xp``, the estimator's ``backend``; None: the
    input's own namespace and device, NumPy for lists), a ``TrainingInputs``. Rows for a fitted model
    (``FitPlan.n_features`` known: ``partial_fit`` continuing it) must have its features; new training data have
    their columns' spread checked against a narrower ``dtype``."""
    target, reset = plan.dtype, plan.n_features is None
    if B.is_out_of_core(X):
        check_out_of_core(X, target, expected=plan.n_features, owner=plan.estimator_name, y=y)
        xp = target_xp or B.resolve_backend("numpy")
        dtype = getattr(xp, target)
        sample = initial_sample(plan, X, xp, dtype, check_spread=reset)
        classes, _ = host_targets(plan, y, X.shape[0], classes)
        device = B.array_device(xp.zeros((1,), dtype=dtype))
        return TrainingInputs(X, L.EncodedLabels(y, classes), classes, sample, xp, device)
    X, in_xp = check_features(X, target, expected=plan.n_features, owner=plan.estimator_name)
    xp = target_xp or in_xp or B.resolve_backend("numpy")
    dtype = getattr(xp, target)
    device = B.array_device(X) if (in_xp is not None and target_xp is None) else None
    if in_xp is None and stays_on_host(X, xp, device):  # moved a block at a time, as data on disk
        X = B.HostRows(X)
        sample = initial_sample(plan, X, xp, dtype)
        classes, y_host = in_memory_targets(plan, y, X.shape[0], classes)
        device = B.array_device(xp.zeros((1,), dtype=dtype, device=device))
        return TrainingInputs(X, L.encode_labels(y_host, classes), classes, sample, xp, device)
    Xc = B.asarray_like(X, xp, device=device, dtype=dtype)
    sample = sample_rows(plan, Xc)
    device = B.array_device(Xc)
    if is_foreign_array(y):  # labels on a device stay there: only the (at most two) classes come back
        y_encoded, classes = L.device_targets(plan, y, X.shape[0], classes, xp, device)
    else:
        classes, y_host = in_memory_targets(plan, y, X.shape[0], classes)
        encoded = L.encode_labels(y_host, classes)
        y_encoded = B.asarray_like(encoded, xp, device=device, dtype=dtype)
    return TrainingInputs(Xc, y_encoded, classes, sample, xp, device)


def sample_rows(plan, X):
    """The rows of X (in memory, any namespace) that the kernel and the inducing points are initialised from: all
    of them up to ``INIT_SAMPLE``, else that many drawn at random as ``initial_sample`` draws them from data on disk
    (the same rows, so a fit gives the same model from either). The default kernel's column scales over 2 million
    rows took a second of a fit's set-up; over the sample, a few milliseconds."""
    rows = sample_row_indices(plan, X.shape[0])
    if rows is None:
        return X
    xp = B.array_namespace(X)
    return xp.take(X, xp.asarray(rows, device=B.array_device(X)), axis=0)


def sample_row_indices(plan, n):
    """Which of n training rows the kernel and the inducing points are initialised from, wherever the rows are (in
    memory, on disk, on a dask cluster): None for all of them (up to ``INIT_SAMPLE``: no draw, so the same seed
    gives the same model), else ``INIT_SAMPLE`` rows drawn by a generator of their own from the plan's
    ``random_state`` (the training's generator is not advanced by it), sorted (one pass over data on disk)."""
    if n <= INIT_SAMPLE:
        return None
    return np.sort(B.host_rng(plan.random_state).choice(n, size=INIT_SAMPLE, replace=False))


def sample_weights(plan, weights, n, client=None):
    """The weights (host, float64) of the rows a fit's start is read from (``sample_row_indices`` of its n rows),
    or None without weights: ``weights`` as the training loop takes them (an array of the compute namespace, or a
    dask array, whose sampled weights ``client`` brings here: at most ``INIT_SAMPLE`` numbers)."""
    if weights is None:
        return None
    rows = sample_row_indices(plan, n)
    if B.is_dask_array(weights):
        picked = weights if rows is None else weights[rows]
        return np.asarray(client.compute(picked, sync=True) if client is not None else picked.compute(),
                          dtype=np.float64)
    host = np.asarray(B.to_numpy(weights), dtype=np.float64)
    return host if rows is None else host[rows]


def start_of(plan, inputs, weights):
    """The rows a fit's start (default kernel, priors, inducing points, cut points) is read from, with their counts:
    ``inducing.start_rows`` of the sample (``TrainingInputs.sample``) and its rows' ``weights`` (the loop's,
    ``sample_weights``). Rows that each count once: (the sample, None), the start as it always was."""
    return start_rows(inputs.sample, sample_weights(plan, weights, inputs.X.shape[0], inputs.client))


def rows_counted(weights, n):
    """The training rows that are in the model: the n rows, less those of weight 0 (``weights``: the loop's, in
    memory), which the size rule counts (a row of weight 0 is the row removed)."""
    if weights is None:
        return n
    xp = B.array_namespace(weights)
    return int(xp.sum(xp.astype(weights > 0, xp.int64)))


def rows_by_weight(weights, n):
    """The n training rows counted by their weights: the weights' sum (n without weights, or where they are not in
    memory), what a fit's log Z sums the rows' terms by (``size_rule.fit_plateau``)."""
    if weights is None or B.is_dask_array(weights) or B.is_out_of_core(weights):
        return n
    xp = B.array_namespace(weights)
    return float(xp.sum(weights))


def fingerprint_rows(X, y):
    """The rows and labels a checkpoint's data fingerprint reads (``training.fingerprint_stride``: at most a few
    thousand, at fixed positions), sliced lazily from arrays of any kind (on disk and dask arrays too)."""
    n = X.shape[0]
    stride = fingerprint_stride(n)
    return X[0:n:stride, :], y[0:n:stride]


def training_fingerprint(inputs, weights=None):
    """The fingerprint of a fit's training data (``training.data_fingerprint``) for its checkpoints: resumed on
    those data only. Of the rows in the caller's order, encoded labels in the model's type, wherever the rows are;
    with sample weights (``training_weights``), of every row's weight too."""
    rows, labels = inputs.fingerprint_rows or fingerprint_rows(inputs.X, inputs.y)
    fingerprint = data_fingerprint(inputs.X.shape[0], inputs.X.shape[1], rows, labels, inputs.classes)
    if weights is None:
        return fingerprint
    if B.is_dask_array(weights):  # the chunks' digests, taken where the chunks are, then theirs
        chunks = inputs.client.compute([weights.blocks[k] for k in range(weights.numblocks[0])])
        digest = b"".join(inputs.client.gather([inputs.client.submit(_digest, chunk) for chunk in chunks]))
    else:
        digest = B.to_numpy(weights).tobytes()
    return fingerprint[:16] + _digest(digest).hex()[:16]


def _digest(values):
    """SHA-256 of the bytes of ``values`` (bytes, or a NumPy array: a chunk of weights, a task on a worker)."""
    return hashlib.sha256(values if isinstance(values, bytes) else np.ascontiguousarray(values).tobytes()).digest()


def validation_set(plan, validation_data, classes, n_features, xp, device, client=None):
    """``validation_data`` checked as the training data are (features: finiteness, shape, the training data's
    ``n_features``; labels:
    1-D, one per row, no missing ones, among the training classes), every error naming validation_data;
    returned as the loop takes it (compute namespace, labels encoded). Dask arrays are brought to this process
    whole by ``client`` (they are scored here: keep them small)."""
    if not (isinstance(validation_data, (tuple, list)) and len(validation_data) == 2):
        raise ValueError(f"validation_data must be a pair (X_val, y_val), got {type(validation_data).__name__}"
                         + (f" of length {len(validation_data)}" if isinstance(validation_data, (tuple, list)) else ""))
    if client is not None and any(B.is_dask_array(values) for values in validation_data):
        validation_data = client.compute(list(validation_data), sync=True)
    X_val, y_val = validation_data
    try:
        X_val, _ = check_features(X_val, plan.dtype, expected=n_features, owner=plan.estimator_name)
    except ValueError as error:  # the same message as for training data, saying which data it is about
        raise ValueError(f"validation_data: X_val: {error}") from error
    labels = L.check_labels(B.to_numpy(y_val) if B.is_array_api_obj(y_val) else y_val, what="validation_data: y_val")
    if labels.ndim != 1 or labels.shape[0] != X_val.shape[0]:
        raise ValueError(f"validation_data: X_val has {X_val.shape[0]} rows but y_val has shape "
                         f"{labels.shape}: y_val must be 1-D with one label per row")
    unknown = np.setdiff1d(np.unique(labels), classes) if labels.dtype.kind == classes.dtype.kind or (
        labels.dtype.kind in "biuf" and classes.dtype.kind in "biuf") else np.unique(labels)
    if unknown.size:
        raise ValueError(f"validation_data: y_val has labels {unknown.tolist()} that are not among the training "
                         f"classes {classes.tolist()}")
    dtype = getattr(xp, plan.dtype)
    return (B.asarray_like(X_val, xp, device=device, dtype=dtype),
            B.asarray_like(L.encode_labels(labels, classes), xp, device=device, dtype=dtype))


# The most rows a stream may stand for: every count up to it is exact in float64 (a count of 10^300 overflowed the
# float the steps scale by).
MAX_N_TOTAL = 2 ** 53


def check_n_total(n_total, rows):
    """``n_total`` is a count of rows that includes this batch's (SEP replaces a share rows / n_total of its
    tied factor a step: 0, a negative, a fraction or NaN have no meaning there). It may be below the rows
    seen so far: a stream of a fixed data set visited for several epochs stands for that data set."""
    if n_total is None:
        return
    if isinstance(n_total, bool) or not isinstance(n_total, numbers.Integral) or not rows <= n_total <= MAX_N_TOTAL:
        raise ValueError(f"n_total must be a positive integer at least the {rows} rows of this batch and at most "
                         f"2**53 (the number of rows the model stands for), got {n_total!r}")


def training_weights(plan, sample_weight, inputs, *, every_class=True, class_labels=None):
    """The rows' weights for the training loop: ``sample_weight`` (checked, ``validation.check_sample_weight``)
    times ``class_weight``'s weight of each row's class (``class_weights``), as an array of the compute namespace and
    dtype; None when neither is given (the unweighted fit, unchanged). A method that does not weight the rows refuses
    them here, with one ValueError naming it (docs/weights.md). ``every_class``: each class needs a row of positive
    weight (a fit's rows; not one ``partial_fit`` call's, which need not hold every class). ``class_labels``: the
    classes as the user names them, when the labels travel as their ranks (an ordinal model's). Rows on a cluster:
    ``dask_inputs.training_weights``."""
    if sample_weight is None and plan.class_weight is None:
        return None
    n = inputs.X.shape[0]
    weights = np.ones(n) if sample_weight is None else V.check_sample_weight(sample_weight, n)
    encoded = B.to_numpy(inputs.y[0:n])  # (labels on disk: read once, as the n weights are held in memory)
    class_index = row_classes(encoded, len(inputs.classes))
    per_class = class_weights(plan, inputs.classes, np.bincount(class_index, minlength=len(inputs.classes)),
                              class_labels)
    if per_class is not None:
        weights = weights * per_class[class_index]
        if not np.any(weights > 0):  # (an ordinal model's classes may be absent, but not every row's weight)
            raise ValueError("sample_weight times class_weight: every row's weight is zero (class_weight="
                             f"{shown(plan.class_weight)}); at least one row needs a positive weight")
    heaviest = int(np.argmax(weights))
    V.check_weight_scale(float(weights[heaviest]), heaviest, plan.dtype)
    if every_class and every_class_needs_weight(plan):
        V.check_positive_per_class(weights, class_index, inputs.classes)
    if every_class:  # (a fit's rows; a ``partial_fit`` batch stands for a share of the stream)
        V.warn_light_weights(float(np.sum(weights)), n, len(inputs.classes))
    refuse_unweighted_method(plan)
    dtype = getattr(inputs.xp, plan.dtype)
    return B.asarray_like(weights, inputs.xp, device=inputs.device, dtype=dtype)


def every_class_needs_weight(plan):
    """Whether a fit needs a row of positive weight in every class (else the class is not in the weighted data): not
    an ordinal model's, whose classes are given and one may be absent from y (it keeps an interval of its own,
    docs/ordinal.md), weighted or not."""
    return plan.likelihood != ORDINAL


def row_classes(encoded, n_classes):
    """Each row's class index (0 .. n_classes - 1) from its encoded label (two classes: -1 / +1)."""
    return (encoded > 0).astype(np.intp) if n_classes == 2 else encoded.astype(np.intp)


def class_weights(plan, classes, counts, class_labels=None):
    """``class_weight``'s weight of each class (None without one), scikit-learn's meanings: "balanced" is
    n / (n_classes * count of the class) (``sklearn.utils.class_weight.compute_class_weight``'s formula, from the
    classes' ``counts``), a dict maps classes to weights, the others 1. ``class_labels``: the user's names of
    ``classes`` when the labels travel as ranks (an ordinal model's), which a dict's keys name."""
    class_weight = plan.class_weight
    if class_weight is None:
        return None
    named = classes if class_labels is None else np.asarray(class_labels)
    if isinstance(class_weight, dict) and set(class_weight) - set(named.tolist()):
        unknown = sorted(set(class_weight) - set(named.tolist()), key=repr)
        raise ValueError(f"class_weight={class_weight!r}: {unknown} are not classes of y (its classes: "
                         f"{named.tolist()})")
    if isinstance(class_weight, dict) and class_labels is not None:  # keyed by the ranks the labels travel as
        class_weight = {rank: class_weight[label] for rank, label in zip(classes.tolist(), named.tolist())
                        if label in class_weight}
    if isinstance(class_weight, str):  # ("balanced": the parameter checks allow no other string)
        # over the classes that have rows: an ordinal model's class absent from y (docs/ordinal.md) has no row to
        # weigh (its weight, 0, weighs nothing), and the weights still sum to the rows' count
        counts = np.asarray(counts, dtype=np.float64)
        present = counts > 0
        return np.divide(np.sum(counts), np.count_nonzero(present) * counts, out=np.zeros_like(counts),
                         where=present)
    odd = next(((k, v) for k, v in class_weight.items() if isinstance(v, bool) or not isinstance(v, numbers.Real)),
               None)
    if odd is not None:  # (scikit-learn's compute_class_weight read "2" as 2.0)
        raise ValueError(f"class_weight: the weight of class {L.label_text(odd[0])} is {shown(odd[1])}, not a "
                         "number")
    try:
        per_class = compute_class_weight(class_weight, classes=classes, y=classes)
    except (TypeError, ValueError) as error:
        raise ValueError(f"class_weight={class_weight!r}: {error}") from None
    if not np.all(np.isfinite(per_class) & (per_class >= 0)):
        raise ValueError(f"class_weight={class_weight!r}: a class's weight must be finite and non-negative")
    return per_class


def refuse_unweighted_method(plan):
    """A method that does not weight the rows refuses weights (one ValueError naming it)."""
    if not supports(plan.method, "sample_weight"):
        raise ValueError(f"sample_weight / class_weight: method={plan.method!r} does not take row weights yet "
                         f"(docs/weights.md; the methods that do: {list(methods_supporting('sample_weight'))})")


def stream_weights(plan, sample_weight, inputs, class_labels=None):
    """``partial_fit``'s weights of this call's rows (``training_weights``); "balanced" is refused, as scikit-learn's
    ``partial_fit`` refuses it: a batch's class counts are not the stream's. ``class_labels``: as for
    ``training_weights``."""
    if plan.class_weight == "balanced":
        raise ValueError("class_weight='balanced' is not supported by partial_fit (a batch's class counts are not the "
                         "stream's): pass the weights of each class as a dict, e.g. from "
                         "sklearn.utils.class_weight.compute_class_weight('balanced', classes=classes, y=y)")
    return training_weights(plan, sample_weight, inputs, every_class=False, class_labels=class_labels)


def score_weights(sample_weight, n_rows):
    """``score``'s weights: None (every row counts once) or checked as ``fit``'s are, scaled to a largest weight of 1
    (an average's weights count only by their ratios: weights of 1e308 summed to inf, and the accuracy was NaN with
    NumPy's warnings)."""
    if sample_weight is None:
        return None
    weights = V.check_sample_weight(sample_weight, n_rows)
    largest = float(np.max(weights)) if weights.size else 0.0
    return weights / largest if largest > 0 else weights


def check_label_kind(y, classes):
    """``score``'s labels against the model's classes: labels of another kind (text against numbers) are one
    ValueError in scikit-learn's words; compared as they were, no label matched, and the accuracy was 0.0."""
    def kind(values):
        return "string" if L.labels_kind(values) == "str" else "number"

    if len(y) and len(classes) and kind(y) != kind(classes):
        raise ValueError(f"Mix of label input types (string and number): y holds {kind(y)}s, the model's classes "
                         f"are {kind(classes)}s ({L.label_text(list(np.asarray(classes)))})")


def warn_blas_threads(value):
    """Say in a UserWarning where an explicit ``blas_threads`` is above the cores this process may use: a fit's and a
    prediction's BLAS scopes use those cores (``threads.explicit_beyond_cores``). Said by the outermost scope only: a
    prediction inside a fit (its check of the fitted probabilities) adds nothing to the fit's warning."""
    note = None if threads.in_scope() else threads.explicit_beyond_cores(value)
    if note is not None:
        warnings.warn(note, UserWarning, stacklevel=B.outside_stacklevel())
