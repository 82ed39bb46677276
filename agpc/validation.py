"""Checks of what users pass in: the estimator's parameters (against a declarative table) and sample weights.

Each parameter has a list of constraints (``Interval``, ``Options``, ``InstanceOf``, ...); a value is
accepted when any one of them accepts it, and refused with one ValueError that names the parameter, shows
the value and says what is allowed. This is scikit-learn's ``_parameter_constraints`` idea, written here
because ``sklearn.utils._param_validation`` is private; the table lives next to the estimator
(``GPClassifier._parameter_constraints``) so that a new parameter is one more entry.

Booleans are never taken for numbers (``True`` is not an ``int`` here, unlike in Python), and numbers
must be finite unless an interval reaches infinity on purpose (``tol=nan`` is refused: every comparison
with NaN is false, so it would silently switch a test off).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import warnings

import numpy as np

from .backend import outside_stacklevel, to_numpy
from .labels import label_text


__all__ = [
    "warn_light_weights",
    "Interval",
    "Options",
    "InstanceOf",
    "Boolean",
    "ArrayNamespace",
    "ArrayLike",
    "HasMethods",
    "Path",
    "Subset",
    "RandomState",
    "FloatingType",
    "validate_params",
    "check_sample_weight",
    "largest_weight",
    "check_weight_scale",
    "check_positive_per_class",
    "check_positive_counts",
    "refuse_bad_weights",
]


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


class Interval:
    """A number of ``kind`` (``numbers.Integral`` or ``numbers.Real``) between ``left`` and ``right``
    (``None``: unbounded), closed on the sides ``closed`` names ("left", "right", "both" or "neither").
    Real values must be finite (not NaN, not infinite)."""

    def __init__(self, kind, left, right, closed):
        if kind not in (numbers.Integral, numbers.Real):
            raise TypeError(f"Interval kind must be numbers.Integral or numbers.Real, got {kind!r}")
        if closed not in ("left", "right", "both", "neither"):
            raise ValueError(f"closed must be 'left', 'right', 'both' or 'neither', got {closed!r}")
        self.kind, self.left, self.right, self.closed = kind, left, right, closed

    def accepts(self, value):
        if _is_bool(value) or not isinstance(value, self.kind):
            return False
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an int beyond the floats (10**400): float() of it, here or later, cannot hold it
            return False
        if not finite:
            return False
        if self.left is not None:
            if value < self.left or (value == self.left and self.closed not in ("left", "both")):
                return False
        if self.right is not None:
            if value > self.right or (value == self.right and self.closed not in ("right", "both")):
                return False
        return True

    def __str__(self):
        what = "an int" if self.kind is numbers.Integral else "a finite number"
        lo = "-inf" if self.left is None else f"{self.left:g}"
        hi = "inf" if self.right is None else f"{self.right:g}"
        lb = "[" if self.left is not None and self.closed in ("left", "both") else "("
        rb = "]" if self.right is not None and self.closed in ("right", "both") else ")"
        return f"{what} in {lb}{lo}, {hi}{rb}"


class Options:
    """One of the given values (strings, or None); ``ignore_case`` compares strings in lower case."""

    def __init__(self, *values, ignore_case=False):
        self.values = values
        self.ignore_case = ignore_case

    def accepts(self, value):
        if not isinstance(value, str):
            return False  # (an array compared with == would be ambiguous; a number is never an option here)
        if self.ignore_case:
            return value.lower() in [v.lower() for v in self.values]
        return value in self.values

    def __str__(self):
        return "one of " + ", ".join(repr(v) for v in self.values)


class InstanceOf:
    """An instance of one of ``types`` (``description`` says what it is in the error message)."""

    def __init__(self, *types, description=None):
        self.types = types
        self.description = description or " or ".join(t.__name__ for t in types)

    def accepts(self, value):
        return isinstance(value, self.types) and not (_is_bool(value) and bool not in self.types)

    def __str__(self):
        return self.description


class _NoneValue:
    def accepts(self, value):
        return value is None

    def __str__(self):
        return "None"


class Boolean:
    """True or False (a Python or NumPy bool; not 0 / 1)."""

    def accepts(self, value):
        return _is_bool(value)

    def __str__(self):
        return "a bool"


class ArrayNamespace:
    """An array-API namespace module (``array_api_strict``, ``array_api_compat.numpy``, ...)."""

    def accepts(self, value):
        return not isinstance(value, str) and all(hasattr(value, a) for a in ("asarray", "linalg", "float64"))

    def __str__(self):
        return "an array namespace module"


class ArrayLike:
    """A matrix with at least one row: an array (anything with a ``shape``) or a nested list / tuple of
    numbers. Its column count and values are checked where the data it must match are known."""

    def accepts(self, value):
        if hasattr(value, "shape"):
            shape = tuple(value.shape)
        elif isinstance(value, (list, tuple)):
            try:
                shape = np.shape(value)
            except ValueError:  # ragged
                return False
        else:
            return False
        return len(shape) == 2 and shape[0] >= 1

    def __str__(self):
        return "an array of shape (m, n_features) with m >= 1"


class HasMethods:
    """An object with the given methods (duck typing, e.g. a ``distributed.Client``)."""

    def __init__(self, *methods, description=None):
        self.methods = methods
        self.description = description or "an object with methods " + ", ".join(methods)

    def accepts(self, value):
        return all(callable(getattr(value, m, None)) for m in self.methods)

    def __str__(self):
        return self.description


class Subset:
    """A string among ``values`` or a non-empty tuple / list of distinct ones."""

    def __init__(self, *values):
        self.values = values

    def accepts(self, value):
        if isinstance(value, str):
            return value in self.values
        if not isinstance(value, (tuple, list)) or not value:
            return False
        return all(isinstance(v, str) and v in self.values for v in value) and len(set(value)) == len(value)

    def __str__(self):
        return f"a name or a tuple of distinct names among {self.values}"

    def chosen(self, value):
        """The names an accepted ``value`` chooses, as a tuple: True all of ``values``, False or None none."""
        if value is True:
            return self.values
        if value is False or value is None:
            return ()
        return tuple([value] if isinstance(value, str) else value)


class RandomState:
    """A seed (an int in [0, 2**32)), a ``numpy.random.Generator`` or ``RandomState``."""

    _SEED = Interval(numbers.Integral, 0, 2**32 - 1, "both")

    def accepts(self, value):
        return self._SEED.accepts(value) or isinstance(value, (np.random.Generator, np.random.RandomState))

    def __str__(self):
        return "a seed (an int in [0, 2**32 - 1]), a numpy.random.Generator or RandomState"


class FloatingType:
    """One of the floating types ``names`` (e.g. "float64", "float32"), or a NumPy spelling of one
    (``numpy.float32``, ``numpy.dtype("f4")``, "f4")."""

    def __init__(self, *names):
        self.names = names

    def accepts(self, value):
        return self.name_of(value) in self.names

    @staticmethod
    def name_of(value):
        if value is None or _is_bool(value):
            return None
        try:
            return np.dtype(value).name
        except TypeError:
            return None

    def __str__(self):
        return " or ".join(repr(n) for n in self.names) + " (or a NumPy spelling of one)"


class Path:
    """A path to a file or a directory: a non-empty str or ``os.PathLike`` (the empty string names nothing:
    ``open("")`` fails, and only after the work whose result was to be written there)."""

    def accepts(self, value):
        if not isinstance(value, (str, os.PathLike)):
            return False
        try:
            return os.fspath(value) not in ("", b"")
        except TypeError:  # an os.PathLike whose __fspath__ returns neither str nor bytes
            return False

    def __str__(self):
        return "a path (a non-empty str or os.PathLike)"


NONE = _NoneValue()
PATH = Path()


def validate_params(params, constraints, owner):
    """Check every entry of ``params`` (a dict name -> value) that ``constraints`` names (name -> list of
    constraints, any of which may accept the value); the first refused value raises a ValueError naming
    ``owner``'s parameter, its value and what is allowed. (That the table covers every parameter is
    checked by the tests, not here: a subclass's extra parameter is its own business.)"""
    for name, value in params.items():
        allowed = constraints.get(name)
        if allowed is None:
            continue
        if any(c.accepts(value) for c in allowed):
            continue
        options = [str(c) for c in allowed]
        text = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
        raise ValueError(f"{owner}: {name} must be {text}, got {_short_repr(value)}")


def _short_repr(value, limit=80):
    """The value as the message shows it: its repr, cut short for large objects (an array's type and shape)."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type):  # (np.int32 has both)
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    try:
        text = repr(value)
    except ValueError:  # (an int of more than sys.get_int_max_str_digits() digits has no repr)
        return f"an int of {value.bit_length():,} bits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rows_of(count, n_rows):
    """How many of the rows a refused weight's problem is on, as its message says it ("1 row of 200")."""
    return f"{count:,} row{'s' if count != 1 else ''} of {n_rows:,}"


def check_sample_weight(sample_weight, n_rows):
    """``sample_weight`` as (n_rows,) float64 on the host: one finite, non-negative weight a row (a scalar gives
    every row that weight, scikit-learn's meaning); anything else is one ValueError naming the problem."""
    if np.isscalar(sample_weight) and not isinstance(sample_weight, (str, bytes)):
        sample_weight = np.full(n_rows, sample_weight)
    try:  # (complex weights are kept complex here: NumPy's conversion drops the imaginary part, warning only)
        given = to_numpy(sample_weight) if hasattr(sample_weight, "__array_namespace__") else sample_weight
        weights = None if np.asarray(given).dtype.kind == "c" else np.asarray(given, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"sample_weight must be numbers, one a row: {error}") from None
    if weights is None:
        raise ValueError(f"sample_weight must be real numbers, one a row: got complex weights "
                         f"({np.asarray(given).dtype})")
    if weights.shape != (n_rows,):
        raise ValueError(f"sample_weight must have one weight a row, shape ({n_rows},); got shape {weights.shape}")
    refuse_bad_weights(*_first_bad(~np.isfinite(weights), weights), *_first_bad(weights < 0, weights),
                       n_rows == 0 or bool(np.any(weights > 0)), n_rows)
    return weights


def _first_bad(bad, weights):
    """(count of the rows ``bad`` marks, the first such row, its weight), or (0, None, None)."""
    rows = np.flatnonzero(bad)
    return (rows.size, int(rows[0]), weights[rows[0]]) if rows.size else (0, None, None)


def refuse_bad_weights(nonfinite, nonfinite_row, nonfinite_value, negative, negative_row, negative_value, any_positive,
                       n_rows):
    """The one ValueError of bad weights, from what was counted of them (in memory or chunk by chunk on a cluster):
    the non-finite and the negative rows (their count, the first one and its weight), whether any is positive, and
    the rows there are (``n_rows``: the message says "1 row of 200", where it said "(1 rows)")."""
    if nonfinite:
        raise ValueError(f"sample_weight must be finite: {nonfinite_value} at row {nonfinite_row} "
                         f"({_rows_of(nonfinite, n_rows)})")
    if negative:
        raise ValueError(f"sample_weight must be non-negative: {negative_value} at row {negative_row} "
                         f"({_rows_of(negative, n_rows)})")
    if not any_positive:
        raise ValueError("sample_weight: every weight is zero (at least one row of each class needs a positive weight)")


def largest_weight(dtype_name):
    """The largest weight a fit computing in ``dtype_name`` takes: 1 / sqrt(eps), 2^26 = 67,108,864 in float64 and
    2,896 in float32. A weight counts its row that many times, and a row counted w times shrinks its part of the
    posterior's variance about w-fold: past 1 / sqrt(eps) the sums and factorisations of a fit keep fewer than half the
    type's digits (the exact model's log Z turned positive at 1e15 in float64, 1e6 in float32), and from there on
    they overflow (log Z -8.3e301 at 1e300, NaN gradients at 1e150), each while a model was still returned."""
    return float(np.finfo(dtype_name).eps) ** -0.5


def check_weight_scale(largest, row, dtype_name):
    """Refuse (one ValueError) weights whose ``largest`` (at ``row``; the weights the fit trains with, class weights
    included) is beyond ``largest_weight`` of the fit's type."""
    limit = largest_weight(dtype_name)
    if largest > limit:
        raise ValueError(f"sample_weight (times class_weight): {largest:g} at row {row}, more than a fit in "
                         f"{dtype_name} carries ({limit:,.0f}, 1 / sqrt(eps)): a weight counts its row that many "
                         "times" + ("; fit in float64 (dtype='float64'), which carries weights up to "
                                    f"{largest_weight('float64'):,.0f}" if dtype_name != "float64" else "")
                         + "; or scale the weights down (their ratios kept; which changes the model: the weighted "
                         "data then hold fewer rows)")


def warn_light_weights(total, n_rows, n_classes):
    """A UserWarning where a fit's weights (class weights included) sum to ``total``, fewer rows than it has classes:
    a weight counts its row that many times, so weights scaled to sum to 1 (a common normalisation) or underflowing
    ones leave the model less than one row's evidence a class, and it stays near its prior (banana, 1,000 rows of
    weight 1 / 1,000: probabilities 0.47-0.52 where the unweighted model is confident), which looked like any other
    fit. Not refused: a weight of a row's fraction is a meaning the user may want."""
    if total < n_classes:
        warnings.warn(f"sample_weight (times class_weight) sums to {total:.3g} over {n_rows:,} rows, less than one "
                      f"row's weight for each of the {n_classes} classes: a weight counts its row that many times "
                      "(docs/weights.md), so the model learns from almost nothing and stays near its prior; to keep "
                      "only the weights' ratios, scale them to sum to the rows (w * len(w) / w.sum())", UserWarning,
                      stacklevel=outside_stacklevel())


def check_positive_per_class(weights, class_index, classes):
    """Every class needs at least one row of positive weight (else it is not in the weighted data at all)."""
    check_positive_counts(np.bincount(class_index, weights=(weights > 0).astype(np.float64), minlength=len(classes)),
                          classes)


def check_positive_counts(positive, classes):
    """``check_positive_per_class`` from each class's count of rows of positive weight."""
    missing = [classes[c] for c in np.flatnonzero(np.asarray(positive) == 0)]
    if missing:
        raise ValueError(f"every class needs a row of positive weight (sample_weight times class_weight); class "
                         f"{label_text(missing[0])} has none")


@contextlib.contextmanager
def attributes_kept_on_failure(owner):
    """Around a call that changes the estimator ``owner`` (``fit``, ``partial_fit``): where anything in the block
    raises (a refused input, an interrupt), its attributes are put back as they were before the call. A refit
    refused after its feature names were reset (a sample weight refused, say) left the old model under the new names,
    and it then predicted on a DataFrame of the refused fit's column order, its columns swapped (accuracy 0.87 ->
    0.34), with nothing said."""
    attributes = dict(owner.__dict__)
    try:
        yield
    except BaseException:
        owner.__dict__.clear()
        owner.__dict__.update(attributes)
        raise
