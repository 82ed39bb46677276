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
from typing import NamedTuple

import numpy as np

from . import labels as L

__all__ = ["FROM_DTYPE", "UNSEEN", "MAX_LEVELS", "CategoricalColumns", "categorical_mask", "learn_columns",
           "encoded_rows", "encode", "is_text_column"]

FROM_DTYPE = "from_dtype"
UNSEEN = -1.0  # the code of a text level the fit never saw (a number no level has)
# More distinct text values than this in one column is an identifier, not a category (and a model file holds each
# level): refused, naming the column.
MAX_LEVELS = 1 << 16


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
            mask[:] = [is_text_column(dtype) for _, dtype in dtypes.items()]
        return mask
    given = list(categorical_features)
    if given and all(isinstance(v, (bool, np.bool_)) for v in given):
        if len(given) != n_features:
            raise ValueError(f"categorical_features: a boolean mask needs one entry a feature ({n_features}), got "
                             f"{len(given)}")
        return np.asarray(given, dtype=bool)
    names = _column_names(X)
    for value in given:
        if isinstance(value, str):
            if names is None:
                raise ValueError(f"categorical_features names a column ({value!r}) but X has no column names: give "
                                 "indices, or X as a DataFrame")
            if value not in names:
                raise ValueError(f"categorical_features: X has no column {value!r} (its columns: {names[:10]}...)")
            mask[names.index(value)] = True
        elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
            if not -n_features <= int(value) < n_features:
                raise ValueError(f"categorical_features: column {int(value)} is out of range for X of {n_features} "
                                 "features")
            mask[int(value)] = True
        else:
            raise ValueError(f"categorical_features: {value!r} is neither a column index nor a column name")
    return mask


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


def _holds_text(values):
    """Whether a column holds text (any string among its values: its checks say what else is wrong)."""
    return values.dtype.kind in ("U", "S") or (values.dtype == object and any(
        isinstance(v, (str, bytes)) for v in values.tolist()))


def learn_columns(X, mask):
    """The ``CategoricalColumns`` of X (a fit's rows as given) for ``mask``: each categorical column of text gets its
    levels (sorted distinct values). A column with missing values (None, NaN, empty text), mixed kinds of values or
    more than ``MAX_LEVELS`` levels is one ValueError naming it."""
    return encoded_rows(X, mask)[1]


def encoded_rows(X, categorical_features):
    """(X as ``encode`` gives it, its ``CategoricalColumns``) for a fit's rows X as given: the columns
    ``categorical_features`` chooses (``categorical_mask``; or a mask), the text ones' levels learned here
    (``learn_columns``' refusals). X that is not a table of rows (the feature checks say why) has none."""
    n_features = _width(X)
    if n_features is None:
        return X, CategoricalColumns(np.zeros(0, dtype=bool), {})
    mask = (np.asarray(categorical_features, dtype=bool) if isinstance(categorical_features, np.ndarray)
            and categorical_features.dtype == bool else categorical_mask(X, categorical_features, n_features))
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


def _width(X):
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
    checked = L.check_labels(values, what=what).astype(str)  # (no missing or blank values, one kind of value)
    found, codes = np.unique(checked, return_inverse=True)  # (text levels as NumPy text, as a model file holds them)
    if found.shape[0] > MAX_LEVELS:
        raise ValueError(f"{what} has {found.shape[0]:,} distinct values: more than {MAX_LEVELS:,} levels is an "
                         "identifier, not a category; drop the column or group its values")
    L.check_label_length(found)
    return found, codes.reshape(-1).astype(np.float64)


def encode(X, columns, n_features, *, unseen_refused=False):
    """X (as given: a DataFrame, an array or a list of rows) with each categorical column of text as its level codes
    (floats 0 .. L-1 in the order of ``columns.levels``; ``UNSEEN`` for a level the fit never saw): a DataFrame keeps
    its column names (the feature-name checks read them), anything else becomes a NumPy object or float array. X
    without text columns is returned as it is (nothing to convert: a dask array, data on disk, device arrays).
    ``unseen_refused``: a level the fit never saw is one ValueError instead (rows trained on: ``partial_fit``)."""
    if not columns.levels:
        return X
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
    text = L.check_labels(values, what=what).astype(str)  # (numbers where text was learned: compared as text)
    position = np.clip(np.searchsorted(levels, text), 0, levels.shape[0] - 1)
    known = levels[position] == text
    if unseen_refused and not np.all(known):
        first = int(np.flatnonzero(~known)[0])
        raise ValueError(f"{what} has the level {text[first]!r} (row {first}), which the model's first rows did not "
                         "have: a stream learns a column's levels from its first call; give them all there (or fit "
                         "on all the rows)")
    return np.where(known, position.astype(np.float64), UNSEEN)
