"""Class labels: the checks of what a user gives as y or ``classes``, the classes a fit's model has, and the labels
as the passes take them (encoded, or an ordinal model's ranks).

One module for the labels, below the input checks (``agpc.inputs``, which calls it once a fit and adds
scikit-learn's conventions for a column of labels) and importing no scikit-learn: a dask fit encodes its labels in
tasks on the workers (``encode_labels``, ``encoded_ranks``), and a task's function is imported there. Every check
raises one ValueError naming the labels, the problem and the rows.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from . import backend as B
from .methods import ORDINAL, methods_supporting

__all__ = ["FILE_LABEL_KINDS", "MAX_LABEL_BYTES", "EncodedLabels", "check_labels", "holdout_mask", "stratified_rows", "encode_labels",
           "label_ranks", "encoded_ranks", "label_text", "check_label_length", "check_classes", "check_target_shape",
           "labels_on_disk", "chunk_labels", "labels_kind", "kind_words", "merged_labels", "label_column",
           "device_targets"]

# A class label is a number or a short name: a longer string is a way to take memory. A model file holds each label in
# at most this many bytes (as NumPy stores text: 4 bytes a character); fit refuses longer labels, load refuses them.
MAX_LABEL_BYTES = 4096


_SHOWN_ROWS = 5


def _rows_text(rows, offset):
    rows = [int(r) + offset for r in rows]
    shown = ", ".join(str(r) for r in rows[:_SHOWN_ROWS])
    more = f", ... ({len(rows)} in all)" if len(rows) > _SHOWN_ROWS else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


# The words of the checks' messages: class labels (y, classes), or the values of a categorical feature column
_WORDS = {"label": {"items": "labels", "item": "label", "one": "a class", "fill": "give them a class",
                    "named": "the classes"},
          "level": {"items": "values", "item": "value", "one": "a level", "fill": "give them a level",
                    "named": "the levels"}}


# The NumPy kinds of class labels a model file holds as they are (booleans, integers, floats, text): ``model_file``
# writes and reads these, ``check_labels`` refuses labels of any other kind at fit.
FILE_LABEL_KINDS = "biufU"


def _label_kind(value):
    """The kind of one label in an object array: "str", "number", "bool", "None", "NaN", or its type's name."""
    if value is None:
        return "None"
    if type(value).__name__ == "NAType":  # (pandas' missing value, in nullable and string columns)
        return "NA"
    if isinstance(value, (str, bytes)):
        return "str"
    if isinstance(value, (bool, np.bool_)):  # a kind of its own: True == 1, so beside numbers it merges into a class
        return "bool"
    if isinstance(value, numbers.Real):  # ints and floats order among themselves
        return "NaN" if value != value else "number"
    return type(value).__name__


def encode_labels(y, classes):
    """Labels as the inference code takes them: +1 / -1 for two classes (+1 = classes[1]), else the
    index into ``classes`` (floats, so they travel like the features). Here rather than beside the input
    checks (``inputs``, which imports scikit-learn): a dask fit encodes its labels in tasks on the workers, and a
    task's function is imported there; this module costs a worker nothing the rounds do not import anyway."""
    if len(classes) == 2:
        return np.where(y == classes[1], 1.0, -1.0)
    return np.searchsorted(classes, y).astype(np.float64)


def label_ranks(y, order):
    """Labels' ranks (0 .. K-1, int64) in ``order`` (the K classes of an ordinal model, in their order); a label not
    among them is one ValueError naming it. Here beside ``encode_labels`` for the same reason: a dask fit ranks its
    labels in tasks on the workers (``encoded_ranks``)."""
    sorter = np.argsort(order, kind="stable")
    try:
        position = np.clip(np.searchsorted(order[sorter], y), 0, order.shape[0] - 1)
        known = order[sorter][position] == y
    except TypeError:  # labels of another kind than the classes (strings against numbers)
        known = np.zeros(y.shape, dtype=bool)
        position = np.zeros(y.shape, dtype=np.intp)
    if not np.all(known):
        raise ValueError(f"y contains labels {np.unique(y[~known]).tolist()} not in classes {order.tolist()}")
    return sorter[position].astype(np.int64)


def encoded_ranks(y, order):
    """An ordinal model's labels as its passes take them: their ranks in ``order`` (``label_ranks``) encoded as
    labels of the classes 0 .. K-1 are (``encode_labels``: the ranks, or -1 / +1 for two classes)."""
    return encode_labels(label_ranks(y, order), np.arange(order.shape[0]))


def check_labels(y, what="y", offset=0, kind="label"):
    """Class labels (1-D, on the host) that a classifier can take, else one ValueError naming ``what``, the
    problem and the rows (counted from ``offset``): no missing labels (None, NaN, pandas' NA), no empty or blank
    strings (an empty cell in a file is a missing value, not a class), and one kind of label, strings or numbers
    (mixed, they have no order: ``np.unique`` fails, and a list of them would silently become strings).
    ``kind="level"``: the values of a categorical feature column, which the messages call so. Returns y as a
    NumPy array."""
    words = _WORDS[kind]
    mixed_container = isinstance(y, (list, tuple))
    values = np.asarray(y)
    if values.dtype == object or mixed_container:
        objects = np.asarray(y, dtype=object).ravel()
        kinds = {}
        for row, value in enumerate(objects):
            kinds.setdefault(_label_kind(value), []).append(row)
        for missing in ("None", "NaN", "NA"):
            if missing in kinds:
                raise ValueError(f"{what} has missing {words['items']} ({missing}) at "
                                 f"{_rows_text(kinds[missing], offset)}: drop those rows or {words['fill']}")
        if len(kinds) > 1:
            found = ", ".join(f"{kind} at row {rows[0] + offset}" for kind, rows in kinds.items())
            merged = (": a bool is the number 1 or 0 to NumPy, so True and 1 would be taken as one;"
                      if set(kinds) == {"bool", "number"} else ":")
            raise ValueError(f"{what} mixes kinds of {words['items']} ({found}){merged} use one kind for every "
                             f"{words['item']}, e.g. all strings or all integers")
        blank = [row for row, value in enumerate(objects) if isinstance(value, (str, bytes)) and not value.strip()]
        _refuse_trailing_nul(objects, what, offset, words)
        if set(kinds) in ({"number"}, {"bool"}):
            values = _numbers(objects, what).reshape(np.shape(y))
    elif values.dtype.kind == "f":
        nan = np.flatnonzero(np.isnan(values))
        if nan.size:
            raise ValueError(f"{what} has missing {words['items']} (NaN) at {_rows_text(nan, offset)}: drop those "
                             f"rows or {words['fill']}")
        blank = []
    elif values.dtype.kind in "US":
        blank = np.flatnonzero(np.char.strip(values) == ("" if values.dtype.kind == "U" else b""))
    else:
        blank = []
    if len(blank):
        raise ValueError(f"{what} has empty {words['items']} at {_rows_text(blank, offset)}: an empty cell is a "
                         f"missing {words['item']}, not {words['one']}; drop those rows or {words['fill']}")
    if kind == "label":
        _refuse_labels_a_file_cannot_keep(values, what)
    return values


def _refuse_labels_a_file_cannot_keep(values, what):
    """Class labels a model file gives back as they are: booleans, integers, floats and text (``model_file`` writes
    any other kind as text, and a loaded model would then predict '2020-01-01' where the fitted one predicted a
    date: a score of 0 against the same labels). Dates, time spans, complex numbers, bytes and other objects are one
    ValueError saying how to convert them."""
    if values.dtype.kind in FILE_LABEL_KINDS:
        return
    if values.dtype.kind == "O":
        odd = next((v for v in values.ravel() if isinstance(v, bytes) or _label_kind(v) not in ("str", "number",
                                                                                               "bool")),
                   None)
        if odd is None:
            return
        found = f"{type(odd).__name__} labels (e.g. {odd!r})"
    else:
        found = f"labels of dtype {values.dtype}"
    raise ValueError(f"{what} holds {found}, which a model file cannot give back as they are (it keeps booleans, "
                     "integers, floats and text): convert them, e.g. to text (y.astype(str)) or to integer codes")


def holdout_mask(y, fraction, seed, what="validation_fraction", weights=None):
    """The rows held out for validation (a boolean mask over the labels ``y``, on the host): round(fraction n) rows
    drawn at random (``seed``), less the first drawn row of any class whose every row was drawn (so that the model
    learns every class, and every validation row can be scored); with ``weights``, of any class whose every row of
    positive weight was drawn (a fit needs one a class). One ValueError naming ``what`` where that leaves no rows for
    validation or none for training."""
    n = y.shape[0]
    n_val = int(round(fraction * n))
    if not 1 <= n_val < n:
        if n_val < 1:
            raise ValueError(f"{what}={fraction} holds out no row of the {n} for validation; give a larger fraction")
        raise ValueError(f"{what}={fraction} holds out all {n} rows for validation, none left for training; give a "
                         "smaller fraction")
    val = np.zeros(n, dtype=bool)
    chosen = np.random.default_rng(seed).choice(n, size=n_val, replace=False)
    val[chosen] = True
    counted = _positive(weights, n)
    for label in np.setdiff1d(np.unique(y[counted]), np.unique(y[~val & counted])):
        val[chosen[np.flatnonzero((y[chosen] == label) & counted[chosen])[0]]] = False
    if not val.any():
        raise ValueError(f"{what}={fraction} leaves no rows for validation once every class keeps a row for training; "
                         "give a larger fraction")
    return val


def _positive(weights, n):
    """Which of n rows are in the model: those of positive weight (``weights`` on the host; None: every row)."""
    return np.ones(n, dtype=bool) if weights is None else np.asarray(weights) > 0


def stratified_rows(y, rows, rng, weights=None):
    """About ``rows`` row indices of the labels ``y`` (on the host), drawn at random (``rng``, a NumPy Generator)
    without replacement among the rows of positive weight (``weights``; all rows without), each class in its share of
    them and at least one row of it (so that a subsample of data with a rare class keeps the class), sorted."""
    labels = np.asarray(y)
    counted = _positive(weights, labels.shape[0])
    classes, counts = np.unique(labels[counted], return_counts=True)
    shares = np.minimum(counts, np.maximum(1, np.round(rows * counts / counts.sum()).astype(np.int64)))
    return np.sort(np.concatenate([rng.choice(np.flatnonzero((labels == label) & counted), size=int(share),
                                              replace=False) for label, share in zip(classes, shares)]))


def _refuse_trailing_nul(objects, what, offset, words=None):
    """NumPy's string arrays, and so a model file's classes, drop a string's trailing NUL characters: "x" and "x\0"
    would be one class there (fit trained two, load refused the file). A label ending in NUL (from Python objects:
    a NumPy string array has dropped it already) is one ValueError naming its row."""
    nul = [row for row, value in enumerate(objects) if isinstance(value, (str, bytes)) and value[-1:] in ("\0", b"\0")]
    if nul:
        words, shown = words or _WORDS["label"], objects[nul[0]]
        raise ValueError(f"{what} has {words['items']} ending in a NUL character ({shown!r}) at "
                         f"{_rows_text(nul, offset)}: NumPy's strings and a model file drop trailing NULs, so it would "
                         f"be the {words['item']} {shown.rstrip(chr(0) if isinstance(shown, str) else bytes(1))!r}; "
                         f"give {words['named']} names without them")


def _numbers(objects, what):
    """Labels that are all numbers, held as Python objects (an object array, a list), as the NumPy array of
    their own type (int64, uint64, float64, bool): a model's classes are then numbers, which a model file
    holds as such (an object array would be written as text and come back as strings). Integers beyond 64 bits
    have no NumPy type: refused, as text they are taken as written."""
    numbers_ = objects.tolist()
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in numbers_):
        return np.asarray(numbers_)  # floats (and bools) as NumPy takes them
    low, high = min(numbers_), max(numbers_)  # integers exactly: never through float64
    for dtype in (np.int64, np.uint64):
        if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return np.asarray(numbers_, dtype=dtype)
    raise ValueError(f"{what} holds integers beyond 64 bits (e.g. {max(numbers_, key=abs)}): NumPy has no type for "
                     "them; give the labels as strings")


def label_text(labels):
    """A label (or a list or array of them) as a message shows it: as the user wrote it, a Python value's repr
    (``'cat'``, ``-1``, ``[0, 1]``), not NumPy's (``np.int64(-1)``, ``np.str_('cat')``)."""
    if isinstance(labels, np.ndarray):
        return repr(labels.tolist())
    if isinstance(labels, (list, tuple)):
        return repr([value.item() if isinstance(value, np.generic) else value for value in labels])
    return repr(labels.item() if isinstance(labels, np.generic) else labels)


class EncodedLabels:
    """Labels on disk (or anywhere sliceable) encoded by ``encode_labels`` a block at a time."""

    dtype = np.float64

    def __init__(self, y, classes):
        self.y = y
        self.classes = classes
        self.shape = (y.shape[0],)

    def __getitem__(self, key):
        return encode_labels(np.asarray(self.y[key]), self.classes)


def check_label_length(classes, what="y", kind="label"):
    """A model file holds each label in at most ``MAX_LABEL_BYTES`` (as NumPy stores text: 4 bytes a
    character), and ``load`` refuses more: a fit whose model could not be loaded back is refused first."""
    stored = classes if classes.dtype.kind in FILE_LABEL_KINDS else classes.astype(str)  # as the model file writes them
    if stored.dtype.kind == "U" and stored.dtype.itemsize > MAX_LABEL_BYTES:
        longest = max(stored.tolist(), key=len)
        words = _WORDS[kind]
        raise ValueError(f"{what} has a {words['item']} of {len(longest):,} characters ({longest[:20]!r}...): a model "
                         f"file holds {words['items']} of at most {MAX_LABEL_BYTES // 4:,} characters, so the fitted "
                         f"model could not be saved and loaded back; give {words['named']} shorter names")


def check_whole_labels(found):
    """Refuse labels that are numbers with a fraction (0.5, 1.5): a class is a category, and such labels are a
    regression target given to a classifier (scikit-learn's "continuous"). One rule, in agpc's words, for labels in
    memory, on disk and on a cluster (``found``: their distinct values): on disk and on dask they were taken as
    classes, a single 0.5 in a later chunk a class of its own. Whole numbers of any size are classes (scikit-learn's
    check casts to int64: 1e20 was "continuous", with NumPy's warning about the cast)."""
    values = found if found.dtype.kind == "f" else np.asarray([v for v in found.tolist() if isinstance(v, float)],
                                                               dtype=np.float64)
    infinite = values[np.isinf(values)]
    if infinite.size:  # (scikit-learn's check had said "Input y contains infinity"; a model file holds no inf class)
        raise ValueError(f"y holds infinite labels ({label_text(infinite[:2])}): a class needs a finite label")
    fractional = values[values != np.floor(values)]
    if fractional.size:
        more = f" and {fractional.size - 5:,} more" if fractional.size > 5 else ""
        # (scikit-learn's words first, which code catching them looks for, then what is wrong)
        raise ValueError(f"Unknown label type: continuous. y holds labels that are not whole numbers "
                         f"({label_text(fractional[:5])}{more}): a classifier's labels are classes (0 / 1, whole "
                         "numbers, names), and these look like a regression target")


MAX_CLASS_SHARE = 0.5
"""The most classes a fit takes as a share of its rows (above ``MAX_CLASS_SHARE_FROM`` classes): more is y of fewer
than two rows a class, an identifier column taken for the labels, whose multiclass model of one latent function a
class never ended (an audit, 2026-12-02: 100,000 labels in 100,000 rows, no output for minutes)."""
MAX_CLASS_SHARE_FROM = 20


def check_class_share(classes, n_rows):
    """A fit's ``classes`` of its ``n_rows`` rows: not more than ``MAX_CLASS_SHARE`` of them (a stream's batch may
    hold few rows of many classes: ``fit`` only)."""
    if MAX_CLASS_SHARE_FROM < len(classes) > MAX_CLASS_SHARE * n_rows:
        raise ValueError(f"y has {len(classes):,} classes in {n_rows:,} rows (the first {label_text(classes[:3])}): a "
                         "class is a label that many rows share, and these are nearly one a row; is y an "
                         "identifier column, or a regression target?")


def check_classes(plan, found, classes=None):
    """The model's classes: those ``found`` in y, or the ``classes`` given (which must cover y); at least two, and
    more only for a method with a multiclass model (``agpc.methods``); each a label a model file can hold."""
    check_whole_labels(found)
    if classes is not None:
        given = check_labels(classes, what="classes")
        if np.size(found) and labels_kind(found) != labels_kind(given):  # (y of bools and classes=[0, 1] were one
            # class each of True and 1: equal in NumPy; text against numbers, no label was found among the classes)
            raise ValueError(f"y holds {kind_words(found)} ({label_text(found[:3])}) and classes {kind_words(given)} "
                             f"({label_text(given[:3])}): give the classes as the labels of y are, of one kind")
        classes = np.unique(given)
        if classes.shape[0] < np.size(given):  # (a partial_fit's classes=[-1, 1, 1] was taken as [-1, 1] unsaid: the
            # hostile-input audit of 2026-12-04)
            values, counts = np.unique(given, return_counts=True)
            raise ValueError(f"classes lists {label_text(values[counts > 1])} more than once: give each class once")
        check_whole_labels(classes)  # (as y's: classes=[-1.0, 1.0, 1.5] was taken, where fit refuses 1.5)
        unknown = np.setdiff1d(found, classes)
        if unknown.size:
            raise ValueError(f"y contains labels {label_text(unknown)} not in classes {label_text(classes)}")
        found = classes
    classes = found
    check_label_length(classes)
    if classes.shape[0] < 2:
        raise ValueError(f"y has only one class ({label_text(classes[0])}): a classifier needs two classes to learn")
    method = plan.spec
    if plan.likelihood == ORDINAL:  # one latent GP whatever the number of (ordered) classes
        return classes
    if classes.shape[0] > 2 and not method.supports("multiclass"):
        raise ValueError(f"y has {classes.shape[0]} classes but method={method.name!r} is binary only: the multiclass "
                         f"model is trained by {list(methods_supporting('multiclass'))}")
    if classes.shape[0] > 2 and plan.likelihood is not None and plan.likelihood not in method.likelihoods:
        raise ValueError(f"y has {classes.shape[0]} classes but likelihood={plan.likelihood!r} is a registered binary "
                         f"likelihood: multiclass {method.name} trains its own; leave likelihood=None")
    if classes.shape[0] > 2 and method.multiclass_likelihood is not None and plan.likelihood is not None:
        raise ValueError(f"multiclass {method.name} uses the {method.multiclass_likelihood} likelihood; leave "
                         f"likelihood=None, got {plan.likelihood!r}")
    return classes


def check_target_shape(shape, n_rows):
    if len(shape) != 1:
        raise ValueError(f"y must be 1-D (n_samples,), got shape {tuple(shape)}")
    if shape[0] != n_rows:
        raise ValueError(f"X has {n_rows} rows but y has {shape[0]}: they must match")


def labels_on_disk(y):
    """Labels read a chunk at a time (a memmap, a zarr array): ``backend.is_out_of_core``, but not an in-memory
    column of a data-frame library (a pandas ``Categorical``, a polars or pyarrow array: they convert with
    ``to_numpy``)."""
    return B.is_out_of_core(y) and not hasattr(y, "to_numpy")


def chunk_labels(block, offset):
    """The distinct labels of a chunk of labels on a cluster (a task) or on disk, checked as ``check_labels`` checks
    labels in memory, its rows counted from ``offset``: a missing label, or labels of two kinds, is one ValueError naming the
    rows (NumPy's unique raised a bare TypeError on mixed kinds, and a NaN was named by its place among the
    distinct labels)."""
    return np.unique(check_labels(block, offset=offset))


def labels_kind(values):
    """The kind of checked labels (``check_labels``: one kind in all): "str", "bool" or "number" (``_label_kind`` of
    the first, for an object array)."""
    values = np.asarray(values)
    if values.dtype == object:
        return _label_kind(values.flat[0]) if values.size else "number"
    return "str" if values.dtype.kind in "US" else "bool" if values.dtype.kind == "b" else "number"


def kind_words(values):
    """What checked labels (``check_labels``: one kind in all) are, as a message says it: "text", "booleans",
    "integers" or "numbers"."""
    kind = labels_kind(values)
    if kind != "number":
        return {"str": "text", "bool": "booleans"}[kind]
    return "integers" if np.asarray(values).dtype.kind in "iu" else "numbers"


def merged_labels(parts, bounds):
    """The distinct labels of every chunk (``chunk_labels``'s, the chunks' rows [lo, hi) in ``bounds``): labels of
    one kind in every chunk, else one ValueError naming a chunk's rows of each kind (a chunk of numbers beside a
    chunk of strings, in an object array, has no order: ``np.unique`` fails)."""
    kinds = {}
    for part, (lo, hi) in zip(parts, bounds):
        if len(part):
            kinds.setdefault(labels_kind(part), (lo, hi))
    if len(kinds) > 1:
        found = ", ".join(f"{kind} in rows {lo}..{hi - 1}" for kind, (lo, hi) in kinds.items())
        raise ValueError(f"y mixes kinds of labels ({found}): use one kind for every label, e.g. all strings or all "
                         "integers")
    return np.unique(np.concatenate(parts))


def label_column(y):
    """Labels given as one column, shape (n, 1), in an array (NumPy's or another array-API library's, a memmap, a
    zarr or dask array), as the column's n labels (a view of a memmap, lazy on dask; a zarr array's column is read,
    n labels), with the
    DataConversionWarning scikit-learn gives a NumPy column (``sklearn.utils.column_or_1d``); any other y as it is.
    Only a NumPy column was taken: on disk, on a device or on a cluster it was refused as "y must be 1-D"."""
    shape = getattr(y, "shape", None)
    if shape is None or len(shape) != 2 or shape[1] != 1 or not (
            labels_on_disk(y) or B.is_dask_array(y) or B.is_array_api_obj(y)):
        return y
    from sklearn.exceptions import DataConversionWarning  # (here: a dask worker imports this module)

    warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape of y to "
                  "(n_samples, ), for example using ravel().", DataConversionWarning,
                  stacklevel=B.outside_stacklevel())
    return y[:, 0]


def device_targets(plan, y, n_rows, classes, xp, device):
    """Numeric labels held by an array-API library: checked and encoded (as ``encode_labels`` does) on their
    device, without a copy to the host. Returns (encoded labels in ``xp`` on ``device``, classes)."""
    yx = B.array_namespace(y)
    check_target_shape(y.shape, n_rows)
    distinct = check_labels(B.to_numpy(yx.unique_values(y)), what="y (its distinct values)")
    classes = check_classes(plan, np.sort(distinct), classes)
    target = plan.dtype
    dtype = getattr(yx, target)

    def is_class(c):
        return yx.astype(y == yx.asarray(classes[c], dtype=y.dtype, device=B.array_device(y)), dtype)

    if len(classes) == 2:
        encoded = 2.0 * is_class(1) - 1.0
    else:
        encoded = is_class(1)
        for c in range(2, len(classes)):
            encoded = encoded + float(c) * is_class(c)
    return B.asarray_like(encoded, xp, device=device, dtype=getattr(xp, target)), classes
