"""Tables of features and labels from data files: CSV (a header row), Parquet, ``.npy``, ``.npz`` and zarr stores,
read for the ``agpc`` command (``load_data``).

A file is untrusted: its arrays are read through :mod:`agpc.untrusted` (no pickle, sizes checked before reading),
and every problem with it is one :class:`TableError` (a ``ValueError``) whose one line names the file and, where
there is one, the row and column. Labels are read exactly as written (never through float64); features must be
numbers, with no missing value in a column that is used. A file with column names (CSV, Parquet) yields them as
the features' names, and a model's feature names select its columns by name.
"""

from __future__ import annotations

import codecs
import csv
import functools
import re
import warnings
import zipfile
from array import array
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .untrusted import (RefusedFile, check_regular_file, open_zarr, printable, read_npy, read_npz,
                        read_parquet_columns)

__all__ = ["Data", "TableError", "load_data", "load_weighted_data", "FORMATS", "preview", "exception_line", "one_line",
           "labels_from_text", "header_name"]

_PARQUET_HINT = "reading Parquet needs pyarrow >= 14.0.1: pip install pyarrow (or pip install 'agpc[parquet]')"
FORMATS = {".csv": "CSV", ".tsv": "CSV", ".parquet": "Parquet", ".pq": "Parquet", ".npy": "npy",
           ".npz": "npz", ".zarr": "zarr"}


class TableError(ValueError):
    """A data file that cannot be read as a table of features and labels: one line naming the file and the
    problem (the ``agpc`` command reports it as ``agpc: error: ...``, exit status 2)."""


def one_line(text):
    """The text on one line: its lines stripped and joined by spaces."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def exception_line(exc):
    """An exception as one line; an OSError as its file name and the system's reason."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return one_line(exc)


def _format_of(path):
    if not path.exists():
        raise TableError(f"{path}: no such file or directory")
    kind = FORMATS.get(path.suffix.lower())
    if kind is None and path.is_dir():
        kind = "zarr"
    if kind is None:
        raise TableError(
            f"{path}: unknown data format {path.suffix or '(no suffix)'!r}: use .csv, .parquet, .npy, .npz or a zarr store"
        )
    return kind


class Data(NamedTuple):
    """What :func:`load_data` read: the features ``X`` (2-D, numeric), the labels ``y`` (None without a
    target) and the features' column names, in the order of X's columns (None for a file without names:
    .npy, .npz, a zarr store)."""

    X: Any
    y: Any
    feature_names: list | None


def load_data(path, target=None, *, labels_required=False, features=None, text_features=()):
    """Data(X, y, feature_names) from a data file. ``target`` names the label column (CSV, Parquet; a column
    index also works, and is the only way for .npy and a zarr array) or the label array (.npz, zarr group:
    default ``y`` when ``labels_required``). Without a target, y is None. X is 2-D and numeric (a zarr
    group's X stays on disk); labels are numbers when they all read as numbers (integers when whole), else
    strings; an empty cell in a column that is used is an error naming its row and column.

    ``features`` (a model's ``feature_names_in_``) selects the feature columns of a file with column names
    (CSV, Parquet) by name, in that order; the file's other columns are ignored, and a missing one is an
    error naming it. A file without names ignores ``features``: its columns are features by position.
    ``text_features``: the names of those that are the model's categorical columns of text, read as text whatever
    their cells look like (a file of mostly "10" in a column of levels "10", "S", "M" was refused as "not numeric
    (value 'S')": the hostile-input audit of 2026-12-04)."""
    path = Path(path)
    kind = _format_of(path)
    if target is None and labels_required and kind in ("CSV", "Parquet", "npy"):
        raise TableError(f"{path}: give --target, the label column (a name or a column index)")
    reader = {"CSV": _read_csv, "Parquet": _read_parquet, "npy": _read_npy, "npz": _read_npz, "zarr": _read_zarr}[kind]
    by_name = {"features": features, "text_features": text_features} if kind in ("CSV", "Parquet") else {}
    try:
        X, y, names = reader(path, target, labels_required, **by_name)
    except (TableError, ImportError, RefusedFile):  # RefusedFile: one line that names the file already
        raise
    except (ValueError, OSError, EOFError, KeyError, TypeError, zipfile.BadZipFile, csv.Error) as exc:
        raise TableError(f"cannot read {path} as {kind}: {exception_line(exc)}") from None
    _check_features(X, path)
    if y is not None and y.shape[0] != X.shape[0]:
        raise TableError(f"{path}: {X.shape[0]} rows of features but {y.shape[0]} labels")
    return Data(X, y, names)


def load_weighted_data(path, target, weight_column):
    """(Data, weights) from a table with named columns (CSV, Parquet): ``load_data``'s features and labels, the
    column ``weight_column`` (a name, or an integer index) read as each row's weight, a number (``fit``'s
    ``sample_weight``, checked there), and not a feature."""
    path = Path(path)
    kind = _format_of(path)
    if kind not in ("CSV", "Parquet"):
        raise TableError(f"{path}: a weight column needs a table with named columns (CSV or Parquet), not {kind}")
    if target is None:
        raise TableError(f"{path}: give --target, the label column (a name or a column index)")
    weights = [weight_column]
    try:
        data = (_read_csv if kind == "CSV" else _read_parquet)(path, target, True, weight_column=weights)
    except (TableError, ImportError, RefusedFile):
        raise
    except (ValueError, OSError, EOFError, KeyError, TypeError, csv.Error) as exc:
        raise TableError(f"cannot read {path} as {kind}: {exception_line(exc)}") from None
    _check_features(data.X, path)
    return data, weights[1]


def _check_features(X, path):
    """2-D and numeric, or numbers and text (categorical columns); in memory, the numbers also finite (data on disk are
    checked a chunk at a time by fit / predict)."""
    if len(X.shape) != 2 or X.shape[1] < 1 or X.shape[0] < 1:
        raise TableError(f"{path}: the features must be a 2-D table with rows and columns, got shape {tuple(X.shape)}")
    text = text_columns(X)
    if np.dtype(X.dtype).kind not in "biuf" and not text:  # (columns of text: categorical)
        raise TableError(f"{path}: the features are not numeric (dtype {X.dtype}); features must be numbers")
    numeric = [j for j in range(X.shape[1]) if j not in set(text)]
    numbers = X[:, numeric].astype(np.float64) if text else X
    if isinstance(X, np.ndarray) and not np.all(np.isfinite(numbers)):
        row, k = np.argwhere(~np.isfinite(numbers))[0]
        column = numeric[k]
        raise TableError(f"{path}: the features hold NaN or infinity (first at data row {row + 1}, feature column "
                         f"{column + 1}); fill or drop missing values first")


# A label written as a whole number: digits, and at most a fraction of zeros ("3", "-7", "1.0", as programs that
# write every number as a float do). No exponent: "1e999999999" would make a billion-digit integer.
# ASCII digits only: \d also matches other scripts' digits, and int() reads them, so "\u0661" (Arabic-Indic one)
# became the class 1 of rows labelled "1" (the hostile-input audit of 2026-12-04)
_WHOLE_NUMBER_TEXT = re.compile(r"[+-]?[0-9]+(?:\.0*)?\Z")
_INT64, _UINT64 = np.iinfo(np.int64), np.iinfo(np.uint64)


def _exact_integers(numbers):
    """Python integers as an int64 array, else uint64, else None (beyond both: kept as text by the caller)."""
    low, high = min(numbers), max(numbers)
    if _INT64.min <= low and high <= _INT64.max:
        return np.array(numbers, dtype=np.int64)
    if 0 <= low and high <= _UINT64.max:
        return np.array(numbers, dtype=np.uint64)
    return None


def _canonical_integer(digits):
    """Whether the text of a whole number has no leading zero ("-7", "+1", "0", not "007" or "02134": an identifier
    or a postal code, whose zeros are part of the label)."""
    body = digits.lstrip("+-")
    # (beyond 20 digits it is past uint64 and stays text anyway: int() of thousands of digits is refused by Python)
    return len(body) <= 20 and (body == "0" or not body.startswith("0"))


def _labels(values):
    """Labels exactly as written, never through float64 (which merges integers above 2^53): integers when
    every label is a whole number (int64, or uint64 above it; beyond both, the text as written), the values
    themselves for integer and boolean columns, and otherwise text: a label such as 0.5 names a class as
    "0.5" does (a float column's labels as NumPy prints them)."""
    values = np.asarray(values)
    if values.dtype.kind in "biu":
        return values
    if values.dtype.kind == "f":
        whole = np.all(np.isfinite(values)) and np.all(values == np.round(values))
        # (bounds compared in float64 at least: float16 labels cast int64's bounds to inf, "overflow encountered
        # in cast", a RuntimeWarning that agpc fit printed for a file of labels 0.0 and 1.0)
        wide = values.astype(np.promote_types(values.dtype, np.float64), copy=False)
        if whole and np.all((wide >= _INT64.min) & (wide < 2.0 ** 63)):
            return values.astype(np.int64)
        return values.astype(str)
    text = [v.decode() if isinstance(v, bytes) else str(v) for v in values.tolist()]
    # (only where none is written with a leading zero: "007" and "7" are two classes, and "02134" is written back as
    # it was, not as 2134)
    if text and all(_WHOLE_NUMBER_TEXT.match(v) and _canonical_integer(v.split(".")[0]) for v in text):
        integers = _exact_integers([int(v.split(".")[0]) for v in text])
        if integers is not None:
            return integers
    return np.asarray(text, dtype=str)


def labels_from_text(texts):
    """Labels written as text elsewhere than in a data file (the command line's): read as a file's labels are
    (``_labels``), so that "3" names the class 3 of a file whose labels are whole numbers."""
    return _labels(np.asarray(list(texts), dtype=str))


def _floats(values):
    """A column's cells as float64: NumPy's conversion, which reads text as Python's float does, but only text that
    may be a number (``_plain``)."""
    if values.dtype.kind == "U":  # (read as ASCII bytes: another character is a UnicodeEncodeError, a ValueError)
        values = values.astype("S")
    if values.dtype.kind == "S" and values.size and np.any(np.char.find(values, b"_") >= 0):
        raise ValueError("a cell with an underscore is not a number")
    if values.dtype.kind == "O" and not all(_plain(v) for v in values.tolist() if isinstance(v, (str, bytes))):
        raise ValueError("a cell with an underscore or a character beyond ASCII is not a number")
    return values.astype(np.float64)


def _plain(text):
    """Whether text (str or bytes) may be a number: ASCII, without an underscore. Python's float also reads "1_000"
    (1000: an identifier "12_5" was read as 125, where "1,000" is refused) and other scripts' digits (full-width
    "\uff11\uff12" as 12: a feature cell so written was a number where a label so written is text,
    ``_WHOLE_NUMBER_TEXT``; a careless-input audit)."""
    return text.isascii() and ("_" if isinstance(text, str) else b"_") not in text


# A digit of another script than ASCII's (full-width, Arabic-Indic: ``_plain``), which messages say how to write
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")


def _feature_values(values, name, path, row_of):
    """A feature column's values: numbers (float64), or, where at most half of them are numbers and none marks a
    missing value, the column's text (a categorical column: ``text_columns``)."""
    values = np.asarray(values)
    try:
        return _floats(values)
    except (ValueError, TypeError):
        text = values.tolist()
        # ("NA", "?": a missing value, not a level; a column of mostly numbers with some text: a typo in a numeric
        # column, which would otherwise become a column of categories silently; some numbers among mostly text:
        # levels that are numbers, "10" among colours)
        if any(_looks_missing(v) for v in text) or 2 * sum(_is_number(v) for v in text) > len(text):
            return _numeric(values, name, path, row_of)
        _refuse_other_notations(text, name, path, row_of)
        return _as_text(text)


# Numbers written another way, which a spreadsheet's export may hold: a decimal comma ("1,5"), thousands separators
# ("1,000", "1.000.000", "1.234,5"), each possibly with a percent sign ("50%", "12,5 %"). Versions ("1.2.3") and
# ranges ("1-2") are not numbers in any notation.
_OTHER_NOTATION = re.compile(r"[-+]?(\d+,\d+|\d{1,3}([,.]\d{3})+([.,]\d+)?|\d*\.?\d+)\s*%?")


def _in_other_notation(value):
    """Whether text that is not a number reads as one written another way (``_OTHER_NOTATION``)."""
    return isinstance(value, str) and not _is_number(value) and _OTHER_NOTATION.fullmatch(value.strip()) is not None


def _refuse_other_notations(text, name, path, row_of):
    """A feature column of text every one of whose values that is not a number is one written another way
    (``_in_other_notation``) is refused (a TableError naming the column and the first such value): it would have
    become a categorical column of one level per distinct number, silently (an audit of 2026-12-02: "1,5" from a
    spreadsheet of decimal commas, "50%")."""
    odd = [i for i, v in enumerate(text) if not _is_number(v)]
    if not odd or not all(_in_other_notation(text[i]) for i in odd):
        return
    where = f"{row_of(odd[0])}, " if row_of else ""
    hint = ("in ASCII digits 0-9 (agpc reads no other script's digits as a number, in features as in labels)"
            if _OTHER_DIGIT.search(text[odd[0]]) else "with a '.' decimal point and without '%' or thousands "
            "separators (pandas.read_csv(decimal=',', thousands='.') reads such a file)")
    raise TableError(f"{path}: {where}feature column {printable(repr(name))} holds numbers agpc does not read (value "
                     f"{printable(repr(text[odd[0]]))}): write them {hint}")


def _feature_table(columns):
    """The features as one 2-D array: float64 where every column is numbers, else an object array holding each
    text column's strings and the others' floats (``GPClassifier`` takes those columns as categorical). Each column
    of the list, which the caller hands over, is let go once copied (the columns and the table were both held at the
    peak)."""
    numbers = all(column.dtype != object for column in columns)
    dtype = functools.reduce(np.promote_types, (column.dtype for column in columns)) if numbers else object
    X = np.empty((columns[0].shape[0], len(columns)), dtype=dtype)  # (result_type takes at most 32 or 64 arrays)
    for j in range(len(columns)):
        X[:, j], columns[j] = columns[j], None
    return X


def text_columns(X):
    """The indices of the columns of text of a table :func:`load_data` read (categorical columns): none unless X is
    an object array."""
    if not isinstance(X, np.ndarray) or X.dtype != object or X.shape[0] == 0:
        return []
    return [j for j in range(X.shape[1]) if isinstance(X[0, j], str)]


def _numeric(values, name, path, row_of=None, what="feature"):
    values = np.asarray(values)
    try:
        return _floats(values)
    except (ValueError, TypeError):
        row, bad = next((i, v) for i, v in enumerate(values.tolist()) if not _is_number(v))
        where = f"{row_of(row)}, " if row_of else ""
        hint = ("fill in or drop rows with missing values first" if _looks_missing(bad)
                else f"{what}s must be numbers" + (" in ASCII digits 0-9" if _OTHER_DIGIT.search(str(bad)) else ""))
        raise TableError(f"{path}: {where}{what} column {name!r} is not numeric (value {bad!r}); {hint}") from None


# Text that marks a missing value in tables written by other programs (among the strings pandas.read_csv reads
# as missing by default). As a feature it is not a number (an error); as a label it would be a class of its
# own, which agpc says in a warning rather than refusing: a class may well be called "None".
_MISSING_TEXT = frozenset({"na", "n/a", "#n/a", "<na>", "null", "none", "nil", "missing", "?"})
_NAN_TEXT = frozenset({"nan", "-nan", "+nan"})  # read as a float NaN: never a label, never a feature


def _looks_missing(value):
    return isinstance(value, str) and value.strip().lower() in _MISSING_TEXT | _NAN_TEXT


def _is_number(value):
    if isinstance(value, (str, bytes)) and not _plain(value):
        return False  # (Python's float reads "1_000" as 1000, and other scripts' digits)
    try:
        float(value)
    except (ValueError, TypeError):
        return False
    return True


NAME_SHOWN = 80  # characters of a name a message shows (a model file's name of 200,000 made a 400 kB error line)


def preview(names, most=12):
    """The first ``most`` of ``names`` (column names, labels: a file's, untrusted) as one line of text, each
    through ``untrusted.printable`` (no character in it acts on a terminal), and how many there are in all."""
    shown = ", ".join(printable(n, limit=NAME_SHOWN) for n in names[:most])
    return shown + (f", ... ({len(names)} in all)" if len(names) > most else "")


def _column_index(names, target, path):
    """The position of the target column: by name first, then as an integer index (negative counts from the end)."""
    if target in names:
        return names.index(target)
    try:
        index = int(target)
    except ValueError:
        index = None
    if index is not None and -len(names) <= index < len(names):
        return index % len(names)
    raise TableError(f"{path}: no column {target!r} (columns: {preview(names)})")


def _empty_cells(values):
    """Which entries of a column hold no value: an empty (or blank) string, None (a Parquet null), NaN (a
    number, or its text)."""
    values = np.asarray(values)
    if values.dtype.kind in "OUS":
        return np.array([v is None or (isinstance(v, float) and v != v)
                         or (isinstance(v, (str, bytes)) and (not v.strip() or str(v).strip().lower() in _NAN_TEXT))
                         for v in values.tolist()], dtype=bool)
    if values.dtype.kind in "fc":
        return np.isnan(values)
    return np.zeros(values.shape, dtype=bool)


def _check_filled(values, name, path, row_of, what):
    empty = np.flatnonzero(_empty_cells(values))
    if empty.size:
        first = np.asarray(values).tolist()[empty[0]]
        cell = ("a null" if first is None else "an empty cell" if isinstance(first, (str, bytes)) and not first.strip()
                else repr(first))
        more = f" (and {empty.size - 1} more rows)" if empty.size > 1 else ""
        raise TableError(f"{path}: {row_of(int(empty[0]))}, {what} column {name!r}: missing value, {cell}{more}; "
                         f"fill in or drop rows with missing values first")


def _check_weights(weights, name, path, row_of):
    """A weight column's values: finite and non-negative, else one TableError naming the file, the line and the column
    (the estimator's own check counts rows from 0 and names neither: ``validation.check_sample_weight``)."""
    bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
    if bad.size:
        value = weights[bad[0]]
        what = "finite" if not np.isfinite(value) else "non-negative"
        more = f" (and {bad.size - 1} more rows)" if bad.size > 1 else ""
        raise TableError(f"{path}: {row_of(int(bad[0]))}, weight column {name!r}: {value:g}, a weight must be "
                         f"{what}{more}")


def _label_column(values, name, path, row_of):
    """Labels from a column (see _labels); a missing one is an error naming its row, text that often marks
    a missing value is a warning."""
    _check_filled(values, name, path, row_of, "label")
    labels = _labels(values)
    if labels.dtype.kind == "U":
        marked = sorted({v for v in labels.tolist() if _looks_missing(v)})
        if marked:
            warnings.warn(f"{path}: label column {name!r} holds {preview([repr(v) for v in marked], 4)}, taken as a "
                          f"class of its own; if that marks a missing label, drop those rows", UserWarning)
    return labels


def _feature_columns(names, target_index, features, path, weight_index=None):
    """The positions of the feature columns: every column but the target (and the weights), or, given ``features``
    (the model's feature names), those columns by name in that order."""
    if features is None:
        chosen = [i for i in range(len(names)) if i not in (target_index, weight_index)]
        if not chosen:
            raise TableError(f"{path}: no feature columns besides the target")
        unnamed = [i + 1 for i in chosen if not names[i]]
        if unnamed:
            raise TableError(f"{path}: column {unnamed[0]} has no name in the header: feature columns need names")
        wanted = [names[i] for i in chosen]
    else:
        missing = [name for name in features if name not in names]
        if missing:
            raise TableError(f"{path}: no column {preview([repr(name) for name in missing], 5)}, which the model was "
                             f"trained on (it needs {preview(features, 8)}; the file has {preview(names, 8)})")
        if target_index is not None and names[target_index] in features:
            raise TableError(f"{path}: the --target column {names[target_index]!r} is one of the model's features")
        chosen = [names.index(name) for name in features]
        wanted = list(features)
    repeated = sorted({name for name in wanted if names.count(name) > 1})
    if repeated:
        raise TableError(f"{path}: the header names column {repeated[0]!r} {names.count(repeated[0])} times: "
                         f"a feature column needs a name of its own")
    return chosen


def _from_columns(names, columns, target, path, features=None, row_of=None, weight_column=None, utf8=False,
                  text_features=()):
    """Features and labels from named columns (CSV, Parquet); ``features`` selects and orders the feature
    columns by name (see load_data). ``row_of(i)`` says where data row i is in the file, for error messages.
    ``weight_column``: [name] (``load_weighted_data``), to which the weights read from that column are appended.
    ``utf8``: the columns are a CSV file's, each cell's UTF-8 bytes (``_add_chunk``); other files' columns are
    judged as they come. ``text_features``: ``load_data``'s."""
    decoded = _decoded if utf8 else (lambda values: values)
    row_of = row_of or (lambda i: f"data row {i + 1}")
    index = None if target is None else _column_index(names, target, path)
    weight_index = None if weight_column is None else _column_index(names, weight_column[0], path)
    if weight_index is not None and weight_index == index:
        raise TableError(f"{path}: the weight column {names[index]!r} is the --target column")
    if weight_index is not None:
        weights = decoded(columns[weight_index])
        _check_filled(weights, names[weight_index], path, row_of, "weight")
        weights = _numeric(weights, names[weight_index], path, row_of, "weight")
        _check_weights(weights, names[weight_index], path, row_of)
        weight_column.append(weights)
    chosen = _feature_columns(names, index, features, path, weight_index)
    text = [names[i] in text_features for i in chosen]
    values = [_numbers_at_once(columns[i]) if utf8 and not text[j] else columns[i]  # (then the others' missing cells)
              for j, i in enumerate(chosen)]
    read = [utf8 and v.dtype.kind == "f" for v in values]
    for j, i in enumerate(chosen):
        if read[j]:
            columns[i] = None  # (a CSV column's bytes, read into floats: let go)
        else:
            values[j] = decoded(values[j])
            _check_filled(values[j], names[i], path, row_of, "feature")
    for j, i in enumerate(chosen):  # (in the list handed to _feature_table, which lets each go once copied)
        values[j] = (values[j] if read[j] else _as_text(values[j]) if text[j]
                     else _feature_values(values[j], names[i], path, row_of))
    X = _feature_table(values)
    labels = None if index is None else _label_column(decoded(columns[index]), names[index], path, row_of)
    return Data(X, labels, [names[i] for i in chosen])


def _as_text(values):
    """A column of categorical levels as text: one string object a level, which its cells share (a string of each
    cell's own took ~55 bytes a cell)."""
    levels = {}
    return np.asarray([levels.setdefault(v, v) for v in (v if isinstance(v, str) else str(v) for v in
                                                         np.asarray(values).tolist())], dtype=object)


def _numbers_at_once(values):
    """A CSV column of numbers (UTF-8 bytes, ``_add_chunk``) as float64 without its text ever made (4 bytes a
    character); a column with a NaN (missing: ``_check_filled`` says so from its text), or of text, as it came."""
    try:
        numbers = _floats(values)
    except (ValueError, TypeError):
        return values
    return values if np.isnan(numbers).any() else numbers


def _from_matrix(data, target, path):
    """A 2-D array whose target (if any) is a column index; its columns have no names."""
    if target is None:
        return Data(data, None, None)
    if len(data.shape) == 2 and data.shape[0] == 0:  # (before a list a column: a forged (0, 10**18) declares 0 bytes)
        raise TableError(f"{path}: the array has no rows (shape {tuple(data.shape)})")
    data = np.asarray(data[...])
    if data.ndim != 2:
        raise TableError(f"{path}: a label column needs a 2-D array (rows x columns), got shape {data.shape}")
    X, y, _ = _from_columns([str(i) for i in range(data.shape[1])], list(data.T), target, path)
    return Data(X, y, None)


# The most characters a CSV record (a line, or the lines a quoted field spans) may hold. Python's csv module holds a
# record's fields as strings in a list, ~30 bytes a field: a 1 GB line of commas took 15.6 GB before it was killed.
# A record is read within this bound (memory O(bound), not O(line)); a field within the csv module's own
# ``csv.field_size_limit()`` (131,072 characters unless a program changed it). 1 Mi characters is 50,000 features of
# 20 characters: wider tables belong in .npy or Parquet.
MAX_RECORD_CHARS = 1 << 20


class _BoundedLines:
    """The lines of a text file for ``csv.reader``, each record (the lines read since ``record_read`` was last
    called) refused past ``MAX_RECORD_CHARS`` characters, before more than that is read, in one ``TableError``
    naming the file and the record's first line."""

    def __init__(self, fh, path):
        self.fh, self.path = fh, path
        self.line = 0  # lines read
        self.start = 1  # the first line of the record being read
        self.chars = 0  # its characters so far

    def __iter__(self):
        return self

    def __next__(self):
        text = self.fh.readline(MAX_RECORD_CHARS + 1 - self.chars)  # (never more than the bound allows)
        if self.line == 0:  # byte order marks at the start are none of the header's (utf-8-sig drops only one: a
            text = text.lstrip("\ufeff")  # file that got two kept U+FEFF in its first column's name; an audit)
        if not text:
            raise StopIteration
        self.line += 1
        self.chars += len(text)
        if self.chars > MAX_RECORD_CHARS:
            raise TableError(f"{self.path}: line {self.start} is longer than {MAX_RECORD_CHARS:,} characters (a "
                             "CSV record agpc reads is at most that, quoted line breaks included: a quote never "
                             "closed makes one; a wider table: .npy or Parquet)")
        return text

    def record_read(self):
        """The reader has returned a record: the next starts on the next line."""
        self.start, self.chars = self.line + 1, 0


def _csv_records(fh, path):
    """(the record's first line, cells stripped) of each record of a CSV file in turn, each within
    ``MAX_RECORD_CHARS``; the csv module's errors (a field beyond its limit, a NUL in older Pythons) name the file and
    the line. A record whose quoted field spans lines is named by its first (the csv module's ``line_num`` is its
    last: an error in a record of lines 3-6 was said to be on line 6, a careless-input audit)."""
    lines = _BoundedLines(fh, path)
    # strict: a quote that opens a field and is never closed is an error (the lenient reader took the rest of the
    # file into that one field: a truncated file's last rows became one label, a class of their own, silently)
    reader = csv.reader(lines, delimiter="\t" if path.suffix.lower() == ".tsv" else ",", strict=True)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            what = ("a quoted field is not closed (its opening \" has no closing one before the file ends)"
                    if "unexpected end of data" in str(exc) else exception_line(exc))
            raise TableError(f"{path}: line {lines.start}: {what}") from None
        record = (lines.start, [cell.strip() for cell in row])
        lines.record_read()
        yield record


# Rows of a CSV file turned into arrays at a time (``_csv_columns``): a file's cells held as Python strings until the
# whole file was read took 14 times its size (200,000 rows x 21 columns of numbers, 38 MB: 541 MB of peak RSS growth),
# NumPy text arrays of them 7.7 times (294 MB); UTF-8 bytes, a column of numbers read into floats from them, 2.9 (111);
# each column let go once copied into the table, 2.1 (81)
CSV_CHUNK_ROWS = 8192


def _csv_columns(records, path):
    """(the header's names, the line of each data row, the columns as arrays of each cell's UTF-8 bytes,
    ``_add_chunk``) of a CSV file's ``records`` (``_csv_records``), CSV_CHUNK_ROWS rows turned into arrays at a time. A blank line (no field, or one of spaces)
    is no row; a line of empty cells (",,") is a row whose values are missing: an error naming its line and column
    (``_check_filled``), not a row dropped unsaid."""
    first = next(records, None)
    if first is None:
        raise TableError(f"{path}: the file is empty (a header row is needed)")
    names = first[1]
    if all(_is_number(name) for name in names):
        warnings.warn(f"{path}: the header row ({preview(names, 4)}) looks like data: agpc reads the first row of "
                      f"a CSV file as the column names", UserWarning)
    pieces, lines, chunk = [[] for _ in names], array("q"), []
    for line, row in records:
        if len(row) > 1 or any(row):
            _check_csv_row(row, names, line, path)
            chunk.append(row)
            lines.append(line)
        if len(chunk) == CSV_CHUNK_ROWS:
            _add_chunk(pieces, chunk)
    if chunk:
        _add_chunk(pieces, chunk)
    if not lines:
        raise TableError(f"{path}: no data rows below the header")
    columns = []
    for piece in pieces:  # (each column's chunks freed once it is joined)
        columns.append(np.concatenate(piece))
        piece.clear()
    return names, lines, columns


def _check_csv_row(row, names, line, path):
    if len(row) != len(names):
        raise TableError(f"{path}: line {line} has {len(row)} fields but the header has {len(names)}")
    # NumPy's strings drop trailing NUL bytes ("2\x00" would read as 2): a NUL is never part of a number or a label
    # written as text, so a cell holding one is refused rather than silently cut
    if "\x00" not in "".join(row):  # (one search of the row: a search of each cell took a tenth of the read)
        return
    nul = next(i for i, cell in enumerate(row) if "\x00" in cell)
    raise TableError(f"{path}: line {line}, column {names[nul]!r}: the cell {row[nul]!r} holds a NUL byte "
                     "(a binary file, or one damaged in transfer?)")


def _add_chunk(pieces, chunk):
    """Each column's cells of the rows in ``chunk`` appended to ``pieces`` as a NumPy array of their UTF-8 bytes (a
    byte a character where NumPy's text takes four; ``_decoded`` gives the text back); ``chunk`` emptied."""
    for piece, column in zip(pieces, zip(*chunk)):
        try:
            piece.append(np.asarray(column).astype("S"))  # (ASCII: one cast)
        except UnicodeEncodeError:
            piece.append(np.asarray([cell.encode("utf-8") for cell in column]))
    chunk.clear()


def _decoded(values):
    """A column as NumPy text: a CSV column's UTF-8 bytes (``_add_chunk``) decoded, any other column as it is."""
    if values.dtype.kind != "S":
        return values
    try:
        return values.astype("U")  # (ASCII: one cast)
    except UnicodeDecodeError:
        return np.asarray([cell.decode("utf-8") for cell in values.tolist()], dtype=str)


def _not_utf8(path):
    """What a CSV file that is not UTF-8 is told: the line of its first byte that is not (Python's decoder names an
    offset into the block it was decoding, which is not the file's), that byte, and what to do. The file is read
    again in pieces of at most ``MAX_RECORD_CHARS`` bytes, each line's decoded on its own: UTF-8 never holds a
    newline inside a character."""
    decoder, line = codecs.getincrementaldecoder("utf-8")(), 1
    with open(path, "rb") as fh:
        if fh.read(2) in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):  # (iconv -f latin1 would be wrong advice)
            return (f"{path}: the file is UTF-16 (it starts with UTF-16's byte order mark): agpc reads CSV files as "
                    "UTF-8; save it as UTF-8, e.g. iconv -f utf-16 -t utf-8")
        fh.seek(0)
        while True:
            piece = fh.readline(MAX_RECORD_CHARS)
            ends = piece.endswith(b"\n") or not piece  # (the file's end: a character cut short there is an error)
            try:
                decoder.decode(piece, final=ends)
            except UnicodeDecodeError as exc:
                byte = f" (byte 0x{exc.object[exc.start]:02x})" if exc.start < len(exc.object) else ""
                return (f"{path}: line {line} is not UTF-8{byte}: agpc reads CSV files as UTF-8; save the file as "
                        "UTF-8 (a spreadsheet's \"CSV UTF-8\"), or convert it, e.g. iconv -f latin1 -t utf-8")
            if not piece:
                return f"{path}: the file is not UTF-8, the encoding agpc reads CSV files in; save the file as UTF-8"
            if ends:
                line, decoder = line + 1, codecs.getincrementaldecoder("utf-8")()


def header_name(path, name):
    """A column ``name`` given for the table at ``path`` (an option's value), as agpc reads the names of its header:
    a CSV file's without the spaces around them (``_csv_name``); a Parquet file's names, and a column index, as
    they are."""
    return _csv_name(name) if _format_of(Path(path)) == "CSV" else name


def _csv_name(name):
    """A name given for a column of a CSV file (an option's, a model's feature name) as its header is read: without
    the spaces around it, as every cell (``_csv_records``). pandas' read_csv keeps them ("a, b, label": " b" and
    " label"), so a model fitted on such a DataFrame, or --target " label", named a column the file has but agpc
    did not find (a careless-input audit)."""
    return name.strip() if isinstance(name, str) else name


def _csv_features(features, path):
    """A model's feature names (None: it has none) as the header of the CSV file at ``path`` is read
    (``_csv_name``); two that become one ("b" and " b") are one TableError naming both: they would take one
    column twice."""
    if features is None:
        return None
    read = {}
    for name in features:
        first = read.setdefault(_csv_name(name), name)
        if first != name:
            raise TableError(f"{path}: the model's features {first!r} and {name!r} are both the column "
                             f"{_csv_name(name)!r} of a CSV file (agpc reads a header cell without the spaces "
                             "around it): give the features names that differ in more than spaces, and fit again")
    return list(read)


def _read_csv(path, target, labels_required, features=None, weight_column=None, text_features=()):
    # utf-8-sig: spreadsheet programs start a UTF-8 CSV with a byte order mark, which is not part of the
    # first column's name. A FIFO blocked the open until a writer came (the other formats' readers check this
    # already; the hostile-input audit of 2026-12-04 found the CSV reader's missing)
    check_regular_file(path)
    target, features = _csv_name(target), _csv_features(features, path)  # (as the header's names are read)
    text_features = {_csv_name(name) for name in text_features}
    if weight_column is not None:
        weight_column[0] = _csv_name(weight_column[0])
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            names, lines, columns = _csv_columns(_csv_records(fh, path), path)
    except UnicodeDecodeError:
        raise TableError(_not_utf8(path)) from None
    return _from_columns(names, columns, target, path, features, text_features=text_features,
                         row_of=lambda i: f"line {lines[i]}",
                         weight_column=weight_column, utf8=True)


def _parquet_columns(path, select=None):
    try:
        import pyarrow.parquet  # noqa: F401  (pandas reads Parquet with pyarrow too: without it no safe reader)
    except ImportError:
        raise TableError(_PARQUET_HINT) from None
    return read_parquet_columns(path, select)


def _read_parquet(path, target, labels_required, features=None, weight_column=None, text_features=()):
    target_name = target

    def used(names):
        """With the model's feature names, only those columns and the target are read (the others, of any
        type, are ignored, as a CSV's are); at fit, every column is a feature or the target."""
        nonlocal target_name
        if features is None:
            return names
        index = None if target is None else _column_index(names, target, path)
        chosen = _feature_columns(names, index, features, path)  # a missing column: an error naming the file's
        if index is not None:
            target_name = names[index]  # (an index into the whole file, not into the columns read)
        return [names[i] for i in chosen] + ([] if index is None else [target_name])

    names, columns = _parquet_columns(path, used)
    return _from_columns(names, columns, target_name, path, features, weight_column=weight_column,
                         text_features=text_features)


def _read_npy(path, target, labels_required):
    return _from_matrix(read_npy(path), target, path)


def _from_arrays(arrays, target, labels_required, path):
    """An npz archive or a zarr group: features in ``X``; labels in the array ``target`` names (default
    ``y`` when labels are required), or in a column of X when ``target`` is a column index."""
    if "X" not in arrays:
        raise TableError(f"{path}: no array named 'X' (arrays: {preview(sorted(arrays))})")
    X = arrays["X"]
    name = target if target is not None else ("y" if labels_required else None)
    if name is None:
        return Data(X, None, None)
    if name in arrays and name != "X":
        labels = _label_array(arrays[name], name, path)
        return Data(X, _label_column(labels, name, path, lambda i: f"data row {i + 1}"), None)
    if target is not None and re.fullmatch(r"-?\d+", target):
        return _from_matrix(X, target, path)
    raise TableError(f"{path}: no label array {name!r} (arrays: {preview(sorted(arrays))}); name it with --target")


def _label_array(values, name, path):
    """A label array as 1-D: one column (n, 1) is taken as its n labels, as the estimator takes it
    (scikit-learn's column_or_1d); any other shape is refused from its declared shape, before reading."""
    shape = tuple(values.shape)
    if len(shape) == 2 and shape[1] == 1:
        return np.asarray(values[...]).reshape(-1)
    if len(shape) != 1:
        raise TableError(f"{path}: label array {name!r} has shape {shape}: labels are one per row, a 1-D array "
                         "(or a single column)")
    return np.asarray(values[...])


def _read_npz(path, target, labels_required):
    return _from_arrays(read_npz(path), target, labels_required, path)


def _read_zarr(path, target, labels_required):
    try:
        import zarr  # noqa: F401
    except ImportError:
        raise TableError("reading a zarr store needs zarr: pip install zarr (or pip install 'agpc[zarr]')") from None
    node = open_zarr(path)  # metadata checked (no pickle codec, no object dtype) before zarr reads it
    if isinstance(node, dict):
        return _from_arrays(node, target, labels_required, path)
    if target is None and labels_required:
        raise TableError(f"{path}: a zarr array has no label array: give --target, the label column index")
    return _from_matrix(node, target, path)
