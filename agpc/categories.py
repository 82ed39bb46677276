"""Categorical feature columns: which columns of X are categorical (``GPClassifier(categorical_features=...)``, in
scikit-learn's values: ``HistGradientBoostingClassifier(categorical_features=...)``), and X as the kernels take it.

The categorical kernel (``kernels.Categorical``) reads only whether two values of a column are equal. So a
categorical column of numbers (integer codes, as ``australian.npz`` and most files hold them) is used as it is: on
every kind of input (in memory, another array-API library, on disk, dask) nothing is converted, and a value never
seen at fit equals no training value, so it is its own level, correlated with every level as two different levels
are. A column of text (a pandas ``category`` or string column, or Python strings in an object column) is turned into
numbers by its levels learned at fit (sorted): level i is the number i, and a level unseen at fit is ``UNSEEN``
(-1), its own level again. The text levels are a fitted attribute (``categorical_levels_``) and part of the model
file; nothing else about the columns is.
"""

from __future__ import annotations

import numbers
import warnings
from typing import NamedTuple

import numpy as np

from . import labels as L
from .backend import outside_stacklevel
from .kernels import ANY_LEVEL

__all__ = ["FROM_DTYPE", "UNSEEN", "MAX_LEVELS", "CategoricalColumns", "categorical_mask", "learn_columns",
           "encoded_rows", "encode", "is_text_column", "row_width", "may_hold_text", "check_exact_codes"]

FROM_DTYPE = "from_dtype"
UNSEEN = -1.0  # the code of a text level the fit never saw (a number no level has)
# More distinct text values than this in one column is an identifier, not a category (and a model file holds each
# level): refused, naming the column.
MAX_LEVELS = 1 << 16
# Fewer levels, but more than IDENTIFIER_LEVELS and more than IDENTIFIER_SHARE of the rows, is most likely an identifier
# too: trained, and said (``_warn_if_identifier``). Measured: banana, 3,000 rows, beside them a text column of one value
# a row: the default fit took 7.7 s against 1.2 s without it, for the same test NLL (0.3203 / 0.3202), and predict
# then warned that no value of the test rows was a level.
IDENTIFIER_LEVELS = 100
IDENTIFIER_SHARE = 0.5


class CategoricalColumns(NamedTuple):
    """A fit's categorical columns: ``mask`` (n_features booleans) and, for each column of text, its levels in code
    order (``levels``: {column index: NumPy array of the sorted distinct values}); columns of numbers have none."""

    mask: np.ndarray
    levels: dict

    @property
    def columns(self):
        """The indices of the categorical columns."""
        return tuple(int(j) for j in np.flatnonzero(self.mask))


def _column_names(X):
    columns = getattr(X, "columns", None)
    return None if columns is None else [str(name) for name in columns]


def is_text_column(dtype):
    """Whether a DataFrame column of ``dtype`` holds categories or text (``"from_dtype"``'s categorical columns): a
    pandas ``category`` (of any values) or a string or object column."""
    if getattr(dtype, "categories", None) is not None:
        return True
    kind = getattr(dtype, "kind", None)
    return kind in ("O", "U", "S") or str(dtype) in ("string", "str")


def categorical_mask(X, categorical_features, n_features):
    """The n_features booleans of ``categorical_features`` for X (as given: a DataFrame, an array, a list):
    ``"from_dtype"`` a DataFrame's category and text columns (none for arrays: their columns are numbers); None:
    none; a boolean mask; or column indices, or column names (X a DataFrame). One ValueError naming the problem."""
    mask = np.zeros(n_features, dtype=bool)
    if categorical_features is None:
        return mask
    if isinstance(categorical_features, str):  # ("from_dtype": the parameter's constraints refuse other strings)
        dtypes = getattr(X, "dtypes", None)
        if dtypes is not None and hasattr(X, "columns") and hasattr(dtypes, "items"):
            # a pandas category of numbers (codes) is categorical, as HistGradientBoostingClassifier's "from_dtype"
            # takes it (it was taken as a continuous column); a text column, or a category of text, where it holds
            # text (numbers written as text refused: ``_holds_text``)
            mask[:] = [is_text_column(dtype) and (_category_of_numbers(dtype)
                                                  or _holds_text(_column(X, j), name=_name(X, j)))
                       for j, (_, dtype) in enumerate(dtypes.items())]
        return mask
    given = list(categorical_features)
    if given and all(isinstance(v, (bool, np.bool_)) for v in given):
        if len(given) != n_features:
            raise ValueError(f"categorical_features: a boolean mask needs one entry a feature ({n_features}), got "
                             f"{len(given)}")
        return np.asarray(given, dtype=bool)
    names = _column_names(X)
    _refuse_repeated(given)
    for value in given:
        if isinstance(value, str):
            if names is None:
                raise ValueError(f"categorical_features names a column ({value!r}) but X has no column names: give "
                                 "indices, or X as a DataFrame")
            if value not in names:
                raise ValueError(f"categorical_features: X has no column {value!r} (its columns: {names[:10]}...)")
            mask[names.index(value)] = True
        elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
            if not 0 <= int(value) < n_features:
                # (a negative index is refused, as HistGradientBoostingClassifier and agpc's own OnColumns and
                # Categorical refuse it: -1 read as the last column hid a mask written as integers)
                raise ValueError(f"categorical_features: column {int(value)} is out of range for X of {n_features} "
                                 f"features (indices 0 to {n_features - 1})")
            mask[int(value)] = True
        else:
            raise ValueError(f"categorical_features: {value!r} is neither a column index nor a column name")
    return mask


def _refuse_repeated(given):
    """Refuse a column listed twice in ``categorical_features``: a mask written as integers ([0, 0, 1]) was read as
    the indices {0, 1}, the continuous columns taken as categorical and the categorical one as continuous, silently."""
    seen = set()
    for value in given:
        key = int(value) if isinstance(value, numbers.Integral) else value
        if isinstance(key, (int, str)) and key in seen:
            mask_hint = (f" (a mask is of booleans: {[int(v) == 1 for v in given][:10]})"
                         if all(isinstance(v, numbers.Integral) and int(v) in (0, 1) for v in given) else "")
            raise ValueError(f"categorical_features lists column {key!r} more than once, in {_shown(given)}: each "
                             f"column once{mask_hint}")
        seen.add(key)


def _shown(values, most=10):
    """A list as a message shows it: its first ``most`` entries, as Python values."""
    shown = [v.item() if isinstance(v, np.generic) else v for v in values[:most]]
    return repr(shown)[:-1] + (f", ... ({len(values)} in all)]" if len(values) > most else "]")


def _category_of_numbers(dtype):
    """Whether a DataFrame column's dtype is a pandas category whose categories are numbers or booleans."""
    categories = getattr(dtype, "categories", None)
    return categories is not None and getattr(categories.dtype, "kind", None) in ("b", "i", "u", "f")


def _column(X, j):
    """Column j of X (a DataFrame or an array-like in memory) as a 1-D NumPy array of its own values."""
    if hasattr(X, "iloc"):
        column = X.iloc[:, j]
        if getattr(column.dtype, "categories", None) is not None:  # (its values, not its integer codes)
            return np.asarray(column.astype(object))
        return column.to_numpy()
    return np.asarray(X, dtype=object)[:, j] if not isinstance(X, np.ndarray) else X[:, j]


def _name(X, j):
    names = _column_names(X)
    return repr(names[j]) if names is not None else str(j)


def _holds_text(values, name=None):
    """Whether a column holds text (any string among its values: its checks say what else is wrong). ``name``: the
    column is taken as categorical for its dtype alone (``"from_dtype"``), and numbers written as text there (a file
    read with "?" for a missing value, say) are one ValueError naming it rather than a column of levels."""
    if not (values.dtype.kind in ("U", "S") or (values.dtype == object and any(
            isinstance(v, (str, bytes)) for v in values.tolist()))):
        return False
    if name is not None:
        distinct = set(v for v in values.tolist() if isinstance(v, (str, bytes)))  # (each level tried once)
        written = next((v for v in sorted(distinct, key=str) if _is_number_text(v)), None)
        if written is not None:
            raise ValueError(f"X column {name} holds numbers written as text ({written!r}): convert it to numbers "
                             "(e.g. pandas.to_numeric, filling missing values), or name it in categorical_features "
                             "if its values are category codes")
    return True


def _is_number_text(value):
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def learn_columns(X, mask):
    """The ``CategoricalColumns`` of X (a fit's rows as given) for ``mask``: each categorical column of text gets its
    levels (sorted distinct values). A column with missing values (None, NaN, empty text), mixed kinds of values or
    more than ``MAX_LEVELS`` levels is one ValueError naming it."""
    return encoded_rows(X, mask)[1]


def encoded_rows(X, categorical_features, dtype_name="float64"):
    """(X as ``encode`` gives it, its ``CategoricalColumns``) for a fit's rows X as given: the columns
    ``categorical_features`` chooses (``categorical_mask``; or a mask), the text ones' levels learned here
    (``learn_columns``' refusals), the others' values checked to stay apart in the model's type ``dtype_name``
    (``check_exact_codes``). X that is not a table of rows (the feature checks say why) has none."""
    n_features = row_width(X)
    if n_features is None:
        return X, CategoricalColumns(np.zeros(0, dtype=bool), {})
    mask = categorical_mask(X, categorical_features, n_features)
    check_exact_codes(X, CategoricalColumns(mask, {}), dtype_name)
    if not may_hold_text(X):  # (numbers only: nothing to read or convert, wherever the rows are)
        return X, CategoricalColumns(mask, {})
    text = {int(j): _column(X, int(j)) for j in np.flatnonzero(mask)}
    text = {j: (values, f"X column {_name(X, j)} (categorical)") for j, values in text.items() if _holds_text(values)}
    coded = {j: _levels_and_codes(values, what) for j, (values, what) in text.items()}
    columns = CategoricalColumns(np.asarray(mask, dtype=bool), {j: levels for j, (levels, _) in coded.items()})
    if not coded:
        return X, columns
    # (the codes put in place here: ``encode`` would check the same values again)
    out = X.copy() if hasattr(X, "iloc") else np.array(X, dtype=object)
    for j, (_, codes) in coded.items():
        if hasattr(out, "iloc"):
            out[out.columns[j]] = codes
        else:
            out[:, j] = codes
    return out, columns


def may_hold_text(X):
    """Whether rows X as given can hold text (a DataFrame, a list of rows, a NumPy array of objects or strings): the
    only rows whose columns are read here. Arrays of numbers (on disk, dask, another library's, on a device) are
    never read nor converted."""
    if hasattr(X, "iloc") or isinstance(X, (list, tuple)):
        return True
    return isinstance(X, np.ndarray) and X.dtype.kind in "OUS"


def row_width(X):
    """The feature count of rows X as given (2-D), or None."""
    shape = getattr(X, "shape", None)
    if shape is None:
        try:
            shape = np.shape(np.asarray(X, dtype=object))
        except (TypeError, ValueError):
            return None
    return int(shape[1]) if len(shape) == 2 else None


def _levels_and_codes(values, what):
    """A column of text's levels (its sorted distinct values, checked: ``learn_columns``) and its values' codes."""
    checked = L.check_labels(values, what=what, kind="level").astype(str)  # (no missing or blank values, one kind)
    found, codes = np.unique(checked, return_inverse=True)  # (text levels as NumPy text, as a model file holds them)
    if found.shape[0] > MAX_LEVELS:
        raise ValueError(f"{what} has {found.shape[0]:,} distinct values: more than {MAX_LEVELS:,} levels is an "
                         "identifier, not a category; drop the column or group its values")
    L.check_label_length(found, what=what, kind="level")
    _warn_if_identifier(found.shape[0], checked.shape[0], what)
    return found, codes.reshape(-1).astype(np.float64)


def _warn_if_identifier(levels, rows, what):
    """A UserWarning where a categorical column of a fit has more than ``IDENTIFIER_LEVELS`` levels and more than
    ``IDENTIFIER_SHARE`` of its rows: each level a row or two, which the kernel can learn only row by row and no
    new row shares; it costs the fit time and predicts nothing."""
    if levels > IDENTIFIER_LEVELS and levels > IDENTIFIER_SHARE * rows:
        warnings.warn(f"{what} has {levels:,} distinct values in {rows:,} rows: most likely an identifier, not a "
                      f"category (a level for every {rows / levels:.2g} rows, which no new row shares); it costs the "
                      "fit time and predicts nothing: drop the column, or group its values", UserWarning,
                      stacklevel=outside_stacklevel())


def _check_numeric_levels(values, what, count_levels=True):
    """A categorical column of numbers (in memory) names its missing values, and holds at most ``MAX_LEVELS`` levels,
    as a column of text does (``_levels_and_codes``): NaN was scikit-learn's "Input X contains NaN", no column named,
    and a column of 70,000 distinct codes (an identifier) trained, at 10^6 for two minutes."""
    missing = np.flatnonzero(np.isnan(values))
    if missing.size:
        raise ValueError(f"{what} holds NaN (a missing value) at row {int(missing[0])}"
                         f"{f' and {missing.size - 1:,} more' if missing.size > 1 else ''}: give missing values a "
                         "code of their own, or drop those rows")
    found = np.unique(values).shape[0] if count_levels else 0  # (a prediction's rows may hold any number of codes)
    if found > MAX_LEVELS:
        raise ValueError(f"{what} has {found:,} distinct values: more than {MAX_LEVELS:,} levels is an identifier, not "
                         "a category; drop the column or group its values")
    if count_levels:
        _warn_if_identifier(found, values.shape[0], what)


def check_exact_codes(X, columns, dtype_name, fit=True):
    """The categorical columns of numbers of X (in memory) hold values the model's type ``dtype_name`` keeps apart:
    float32 holds integers exactly up to 2^24 only, and two codes it rounds to one value are one level (the kernel
    reads equality); and none holds ``kernels.ANY_LEVEL``, an inducing point's "any level", which the kernel would
    read as such; nor NaN, nor (rows to ``fit``, not to predict: a batch may hold any number of codes) more than
    ``MAX_LEVELS`` levels (``_check_numeric_levels``). One ValueError naming the column otherwise (rows elsewhere are
    not read for it)."""
    if isinstance(X, (list, tuple)):  # (rows as lists: read as the feature checks read them)
        X = np.asarray(X, dtype=object)
        if X.ndim != 2:
            return  # (ragged rows: the feature checks say so)
    if not (hasattr(X, "iloc") or type(X) is np.ndarray):
        return
    target = np.dtype(dtype_name)
    for j in columns.columns:
        values = _column(X, j)
        if _holds_text(values):
            continue  # (text: its codes are 0 .. L - 1, at most MAX_LEVELS)
        try:
            values = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            continue  # (missing or odd values: the feature checks name them)
        if np.any(values == ANY_LEVEL):
            raise ValueError(f"X column {_name(X, j)} (categorical) holds {ANY_LEVEL!r}, the code of an inducing "
                             "point's 'any level' (agpc.kernels.ANY_LEVEL): give that level another code")
        _check_numeric_levels(values, f"X column {_name(X, j)} (categorical)", count_levels=fit)
        if dtype_name == "float64":
            continue
        rounded = values.astype(target).astype(np.float64)
        if not np.array_equal(rounded, values, equal_nan=True):
            first = values[np.flatnonzero(rounded != values)[0]]
            raise ValueError(f"X column {_name(X, j)} (categorical) has the value {float(first)!r}, which {dtype_name} "
                             f"cannot hold exactly (two codes would be one level there): use dtype='float64', or "
                             "smaller codes")


def encode(X, columns, n_features, *, unseen_refused=False):
    """X (as given: a DataFrame, an array or a list of rows) with each categorical column of text as its level codes
    (floats 0 .. L-1 in the order of ``columns.levels``; ``UNSEEN`` for a level the fit never saw): a DataFrame keeps
    its column names (the feature-name checks read them), anything else becomes a NumPy object array. A model
    without text levels takes X as it is (nothing to convert: a dask array, data on disk, device arrays); one with
    them compares a NumPy array's numbers with its levels as text (``_as_text``) and refuses rows it cannot read so.
    ``unseen_refused``: a level the fit never saw is one ValueError instead (rows trained on: ``partial_fit``)."""
    if not columns.levels or row_width(X) != n_features:
        return X  # (rows of another width: the feature checks say so, in scikit-learn's words)
    if not may_hold_text(X) and type(X) is not np.ndarray:  # (numbers that are not NumPy's, in memory)
        raise ValueError(f"X columns {sorted(columns.levels)} of this model are categories of text, which a "
                         f"{type(X).__name__} of numbers cannot hold: give the rows as a DataFrame (or a NumPy array "
                         "of objects) with those columns' text")
    if hasattr(X, "iloc"):
        out = X.copy()
        for j, levels in columns.levels.items():
            out[out.columns[j]] = _codes(_column(X, j), levels, f"X column {_name(X, j)} (categorical)",
                                         unseen_refused)
        return out
    rows = np.array(X, dtype=object)
    if rows.ndim != 2 or rows.shape[1] != n_features:
        return X  # (the feature checks say what is wrong with it)
    for j, levels in columns.levels.items():
        rows[:, j] = _codes(rows[:, j], levels, f"X column {j} (categorical)", unseen_refused)
    return rows


def _codes(values, levels, what, unseen_refused=False):
    """Level codes of ``values`` (floats; ``UNSEEN`` where a value is not among ``levels``, or with
    ``unseen_refused`` one ValueError), missing values refused."""
    text = _as_text(L.check_labels(values, what=what, kind="level"))
    position = np.clip(np.searchsorted(levels, text), 0, levels.shape[0] - 1)
    known = levels[position] == text
    if unseen_refused and not np.all(known):
        first = int(np.flatnonzero(~known)[0])
        raise ValueError(f"{what} has the level {str(text[first])!r} (row {first} of these rows), which the model's "
                         "first rows did not have: a stream learns a column's levels from its first call; give them "
                         "all there (or fit on all the rows)")
    if text.shape[0] and not np.any(known):  # (a column of other values: another file's, or numbers for text)
        warnings.warn(f"{what}: none of its {text.shape[0]:,} values is a level the model was fitted with (e.g. "
                      f"{str(text[0])!r}; its levels: {[str(v) for v in levels[:5]]}...): every row is predicted "
                      "as of a level never seen", UserWarning, stacklevel=outside_stacklevel())
    return np.where(known, position.astype(np.float64), UNSEEN)


def _as_text(values):
    """Values compared with text levels, as text: whole numbers as integers ("1", not "1.0": a column of text levels
    such as "1", "2" read back from a file as numbers), other numbers as Python writes them."""
    if values.dtype.kind == "f":
        return np.asarray([str(int(v)) if float(v).is_integer() else repr(float(v)) for v in values.tolist()])
    return values.astype(str)
