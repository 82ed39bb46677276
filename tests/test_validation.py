"""Input checks: every parameter of GPClassifier against its table (``agpc.validation``), labels,
validation data."""

import math
import numbers
import pickle
import re
import warnings

import numpy as np
import pandas
import pytest

from agpc import RBF, GPClassifier
from agpc import labels as L
from agpc import validation as V
from agpc.datasets import make_banana
from helpers import forged_zarr


@pytest.fixture(scope="module")
def data():
    X, y = make_banana(40, random_state=1)
    return X, y


class _FakeClient:
    """Accepted as ``client`` (it has the methods a distributed.Client has); unused on in-memory data."""

    def compute(self, *args, **kwargs):
        raise AssertionError("not used for in-memory data")

    def submit(self, *args, **kwargs):
        raise AssertionError("not used for in-memory data")


class _NotAnything:
    """A value of a type no parameter takes."""


# parameter -> (values that pass, values that are refused). Every parameter of GPClassifier is here
# (test_every_parameter_has_a_rule_and_a_case), so that a new parameter needs a rule and a test.
CASES = {
    "method": (["ep", "sep"], ["laplace", "EP", 1, None]),
    "n_inducing": ([3, np.int64(4)], [0, -1, 2.0, True, "5", None]),
    "kernel": ([None, RBF(lengthscales=1.0)], ["rbf", RBF]),
    "backend": (["auto", "numpy", "NumPy", None], ["tensorflow", 1, _NotAnything()]),
    "max_iter": ([0, 2], [-1, 2.5, True, float("inf"), None]),
    "damping": ([None, 0.5, 1, 1.0], [0, 0.0, 1.5, -0.1, float("nan"), True, "0.5"]),
    "batch_size": (["auto", None, 10], [0, -5, 10.0, True, "all"]),
    "optimizer": ([None, "adam"], ["sgd", 1]),
    "learning_rate": ([None, 0.1, 1], [0, -1.0, float("nan"), float("inf"), True, "0.1"]),
    "max_time": ([None, 60, 1e3], [0, -1, float("nan"), float("inf"), False]),
    "shuffle": ([True, False, np.bool_(True)], [1, 0, "yes", None]),
    "eval_every": ([None, 1, 3], [0, -1, 1.5, True, float("nan")]),
    "n_iter_no_change": ([None, 1, 5], [0, -2, 2.0, False]),
    "inducing": (["kmeans", "random", np.zeros((3, 2)), [[0.0, 0.0], [1.0, 1.0]]],
                 ["grid", 3, None, np.zeros((0, 2)), np.zeros(3), [[0.0], [1.0, 1.0]]]),
    "likelihood": ([None, "probit", "ordinal"], ["cauchy", 1]),
    "n_quadrature": ([1, 20], [0, 20.0, True, None]),
    "optimize": ([True, False, None, "kernel", ("kernel", "inducing"), ["inducing"]],
                 [("kernel", "noise"), (), ("kernel", "kernel"), 1, "noise"]),
    "jitter": ([0, 0.0, 1e-6], [-1e-6, float("nan"), float("inf"), True, "1e-6", None]),
    "tol": ([0.0, 1e-3, 1], [-1.0, float("nan"), float("inf"), True, None]),
    "random_state": ([None, 0, 2**32 - 1, np.random.default_rng(0), np.random.RandomState(0)],
                     [-1, 2**32, 1.5, True, "0"]),
    "verbose": ([False, 0], [-1, 0.5, "yes", None]),
    "client": ([None, _FakeClient()], ["tcp://localhost:8786", 1]),
    "checkpoint_path": ([None], [1, True]),
    "checkpoint_every": ([None], [0, -1, 1.5, True]),
    "site_directory": ([None, "/tmp"], [1, False]),
    "local_steps": ([None, 0, 4], [-1, 1.5, True, "4"]),
    "n_jobs": ([None, 1, 2, -1], [0, 1.5, True, "2", -1.0]),
    "blas_threads": ([None, 1], [0, -1, 1.0, True, "2"]),
    "block_rows": ([None, 1, 4096], [0, -5, 100.0, True, "1024"]),
    "dtype": (["float64", "float32", np.float32], ["float16", "double precision", None, 32, np.int32, True]),
    "step_replay": ([False, True, np.bool_(True)], [1, 0, "yes", None]),
    "kernel_prior": (["auto", None], ["none", "AUTO", "ml", True, 1.0]),
    "ard": (["auto", True, False, np.bool_(False)], ["AUTO", "yes", 1, 0, None, 1.0]),
    "plateau": (["auto", None], ["none", "AUTO", True, 1e-3, (10, 1e-3)]),
    "early_stopping": (["auto", True, False, np.True_], ["AUTO", None, 1, "on"]),
    "validation_fraction": ([0.1, 0.5, 0.99], [0.0, 1.0, -0.1, float("nan"), True, "0.1"]),
    "categorical_features": (["from_dtype", None, [1], (0,), np.array([True, False])],
                             ["FROM_DTYPE", "all", 3, True]),
    "class_weight": ([None, "balanced", {1: 2.0}], ["Balanced", "auto", 1.0, [1.0, 2.0], True]),
    # (a list of classes gives an ordinal model's order: tests/test_ordinal.py)
    "classes": ([None], ["low,high", 3, {0: 1}, True]),
}


def test_every_parameter_has_a_rule_and_a_case():
    params = set(GPClassifier().get_params(deep=False))
    assert set(GPClassifier._parameter_constraints) == params
    assert set(CASES) == params


def _id(name, value):
    """The case's id: the same in every process (an object's repr without its address, so that pytest-xdist's
    workers collect the same tests)."""
    return re.sub(r" (object )?at 0x[0-9a-fA-F]+", "", f"{name}={value!r}")[:60]


def _good(name):
    return [pytest.param(name, v, id=_id(name, v)) for v in CASES[name][0]]


def _bad(name):
    return [pytest.param(name, v, id=_id(name, v)) for v in CASES[name][1]]


@pytest.mark.parametrize("name, value", [p for name in CASES for p in _good(name)])
def test_a_good_value_is_accepted(data, name, value):
    X, y = data
    params = {"n_inducing": 3, "max_iter": 1, "batch_size": None, "random_state": 0, name: value}
    if name == "method" and value == "sep":
        params["batch_size"] = 20
    model = GPClassifier(**params).fit(X, y)
    assert np.all(np.isfinite(model.predict_proba(X[:5])))


@pytest.mark.parametrize("name, value", [p for name in CASES for p in _bad(name)])
def test_a_bad_value_is_refused_naming_the_parameter(data, name, value):
    X, y = data
    model = GPClassifier(**{"n_inducing": 3, "max_iter": 1, name: value})
    with pytest.raises(ValueError, match=rf"GPClassifier: {name} must be .*, got "):
        model.fit(X, y)
    assert not hasattr(model, "classes_")  # refused before any work


@pytest.mark.parametrize("name, value", [("eval_every", 0), ("tol", math.nan)])
def test_partial_fit_checks_the_table_too(data, name, value):
    X, y = data
    with pytest.raises(ValueError, match=rf"GPClassifier: {name} must be"):
        GPClassifier(method="sep", n_inducing=3, **{name: value}).partial_fit(X, y)


def test_the_message_shows_an_array_by_its_shape_not_its_values():
    constraints = {"weights": [V.NONE]}
    with pytest.raises(ValueError, match=r"weights must be None, got ndarray of shape \(1000, 3\) and dtype float64"):
        V.validate_params({"weights": np.zeros((1000, 3))}, constraints, "Owner")


@pytest.mark.parametrize(
    "constraint, inside, outside",
    [
        (V.Interval(numbers.Real, 0, 1, "neither"), [0.5], [0, 1, math.nan]),
        (V.Interval(numbers.Real, 0, 1, "both"), [0, 1, 0.5], [-0.1, 1.1]),
        (V.Interval(numbers.Integral, None, 3, "right"), [-100, 3], [4, 2.0, True]),
        (V.Interval(numbers.Real, None, None, "neither"), [-1e300, 0], [math.inf, -math.inf]),
        # ints beyond the floats (the hostile-input audit of 2026-12-04: max_iter=10**400 was an OverflowError
        # naming no parameter)
        (V.Interval(numbers.Integral, 1, None, "left"), [10 ** 300], [10 ** 400, -(10 ** 400)]),
        (V.Interval(numbers.Real, 0, None, "left"), [1e300], [10 ** 400]),
    ],
)
def test_interval_bounds_and_types(constraint, inside, outside):
    assert all(constraint.accepts(v) for v in inside)
    assert not any(constraint.accepts(v) for v in outside)


@pytest.mark.parametrize("value", [10 ** 400, 10 ** 5000], ids=["10**400", "10**5000"])
def test_an_int_beyond_the_floats_is_refused_naming_the_parameter(data, value):
    """One ValueError naming the parameter (an int of more digits than Python writes is shown by its bits)."""
    X, y = data
    with pytest.raises(ValueError, match="max_iter must be an int in"):
        GPClassifier(max_iter=value).fit(X, y)


def test_the_table_pickles_with_the_estimator():
    """The constraints are class data: an estimator with them pickles (GridSearchCV, joblib)."""
    model = pickle.loads(pickle.dumps(GPClassifier(tol=1e-3)))
    assert model.get_params()["tol"] == 1e-3


# -- labels ---------------------------------------------------------------------------------------

def _labels_with(y, bad, row=7, dtype=object):
    labels = np.where(y > 0, "yes", "no").astype(dtype)
    labels[row] = bad
    return labels


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda y: np.array([1 if v > 0 else "no" for v in y], dtype=object), r"y mixes kinds of labels \(.*number.*str"),
        (lambda y: [1 if v > 0 else "no" for v in y], r"y mixes kinds of labels \(.*number.*str"),
        # (True == 1 in NumPy: the bools were merged into the class 1, unsaid)
        (lambda y: [True if v > 0 else -1 for v in y], r"y mixes kinds of labels \((number|bool) at row \d+, "
         r"(number|bool) at row \d+\): a bool is the number 1 or 0 to NumPy, so True and 1 would be taken as one"),
        (lambda y: _labels_with(y, None), r"y has missing labels \(None\) at row 7:"),
        (lambda y: _labels_with(y, float("nan")), r"y has missing labels \(NaN\) at row 7:"),
        (lambda y: np.where(np.arange(len(y)) == 7, np.nan, y), r"y has missing labels \(NaN\) at row 7:"),
        (lambda y: _labels_with(y, "", dtype=str), r"y has empty labels at row 7: an empty cell"),
        (lambda y: _labels_with(y, "  "), r"y has empty labels at row 7: an empty cell"),
    ],
    ids=["mixed-object-array", "mixed-list", "bools-among-numbers", "none", "nan-in-objects", "nan-in-floats", "empty-string", "blank"],
)
def test_bad_labels_are_refused_naming_the_problem(data, make, message):
    X, y = data
    with pytest.raises(ValueError, match=message):
        GPClassifier(n_inducing=3, max_iter=1).fit(X, make(y))


def test_missing_labels_on_disk_name_the_row_in_the_file(data, tmp_path):
    """Labels on disk are checked a chunk at a time, rows counted from the start of the file."""
    X, y = data
    labels = np.where(np.arange(len(y)) == 31, np.nan, y)
    np.save(tmp_path / "y.npy", labels)
    np.save(tmp_path / "X.npy", X)
    X_mm, y_mm = np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    with pytest.raises(ValueError, match=r"y has missing labels \(NaN\) at row 31:"):
        GPClassifier(n_inducing=3, max_iter=1).fit(X_mm, y_mm)


def test_a_column_of_labels_on_disk_is_taken_with_a_warning(data, tmp_path):
    """A memmapped y of shape (n, 1), beside X on disk or in memory, was refused as "y must be 1-D", where the same
    column in memory is taken with scikit-learn's DataConversionWarning: now the same warning and the same model."""
    from sklearn.exceptions import DataConversionWarning

    X, y = data
    np.save(tmp_path / "y.npy", y[:, None])
    np.save(tmp_path / "X.npy", X)
    X_mm, y_mm = np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    params = dict(n_inducing=3, max_iter=2, random_state=0)
    expected = GPClassifier(**params).fit(X, y).predict_proba(X)
    for rows in (X_mm, X):
        with pytest.warns(DataConversionWarning, match="column-vector y"):
            model = GPClassifier(**params).fit(rows, y_mm)
        np.testing.assert_allclose(model.predict_proba(X), expected, rtol=1e-10, atol=1e-12)
    stream = dict(method="sep", n_inducing=3, random_state=0)  # (partial_fit takes it too)
    expected = GPClassifier(**stream).partial_fit(X, y, classes=np.unique(y)).predict_proba(X)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        model = GPClassifier(**stream).partial_fit(X, y_mm, classes=np.unique(y))
    np.testing.assert_allclose(model.predict_proba(X), expected, rtol=1e-10, atol=1e-12)


def test_many_bad_rows_are_counted_not_all_listed():
    labels = np.array(["a", "b"] * 10 + [""] * 12)
    with pytest.raises(ValueError, match=r"rows 20, 21, 22, 23, 24, \.\.\. \(12 in all\)"):
        L.check_labels(labels)


def test_good_labels_pass_unchanged():
    for labels in (np.array([0, 1, 1]), np.array(["a", "b", "a"]), np.array([True, False, True]),
                   np.array(["a", "b"], dtype=object), [1, 2.5, 1]):
        np.testing.assert_array_equal(L.check_labels(labels), np.asarray(labels))


# -- validation data ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "make, message",
    [
        (lambda X, y: (X[:10], y[:9]), r"validation_data: X_val has 10 rows but y_val has shape \(9,\)"),
        (lambda X, y: (X[:10, :1], y[:10]), r"validation_data: X_val: X has 1 features, but GPClassifier is "
                                            r"expecting 2"),
        (lambda X, y: (np.where(np.arange(10)[:, None] == 2, np.inf, X[:10]), y[:10]),
         r"validation_data: X_val: Input X contains infinity"),
        (lambda X, y: (X[:10, 0], y[:10]), r"validation_data: X_val: Expected 2D array"),
        (lambda X, y: (X[:10], np.where(np.arange(10) == 4, 7, y[:10])),
         r"validation_data: y_val has labels \[7\] that are not among the training classes \[-1, 1\]"),
        (lambda X, y: (X[:10], np.array(["a"] * 10)), r"validation_data: y_val has labels \['a'\] that are not"),
        (lambda X, y: (X[:10], np.where(np.arange(10) == 4, np.nan, y[:10])),
         r"validation_data: y_val has missing labels \(NaN\) at row 4"),
        (lambda X, y: (X[:10],), r"validation_data must be a pair \(X_val, y_val\), got tuple of length 1"),
    ],
    ids=["length", "features", "inf", "1d", "unknown-label", "other-kind-of-label", "nan-label", "not-a-pair"],
)
def test_validation_data_is_checked_like_training_data(data, make, message):
    X, y = data
    with pytest.raises(ValueError, match=message):
        GPClassifier(n_inducing=3, max_iter=1).fit(X, y, validation_data=make(X, y))


def test_partial_fit_checks_the_classes_it_is_given(data):
    X, y = data
    with pytest.raises(ValueError, match=r"classes has missing labels \(None\) at row 2"):
        GPClassifier(method="sep", n_inducing=3).partial_fit(X, y, classes=np.array([-1, 1, None], dtype=object))
    # (the hostile-input audit of 2026-12-04: a class given twice was dropped unsaid, and 1.5, which fit refuses as a
    # regression target, was taken as a class)
    with pytest.raises(ValueError, match=r"classes lists \[1\] more than once: give each class once"):
        GPClassifier(method="sep", n_inducing=3).partial_fit(X, y, classes=[-1, 1, 1])
    with pytest.raises(ValueError, match=r"continuous.*\[1.5\]"):
        GPClassifier(method="sep", n_inducing=3).partial_fit(X, y, classes=[-1.0, 1.0, 1.5])
    # (a careless-input audit: True is 1 and False is 0 in NumPy, so classes=[-1, 1, True] was the classes [-1, 1], and
    # bool labels against classes=[0, 1] trained the class 1 on True; fit refuses bools among numbers as y)
    for classes in ([-1, 1, True], [0, False, 1], [True, 1.0]):
        with pytest.raises(ValueError, match=r"classes mixes kinds of labels \((number|bool) at row \d, (number|bool) at "
                                             r"row \d\): a bool is the number 1 or 0 to NumPy"):
            GPClassifier(method="sep", n_inducing=3).partial_fit(X, y, classes=classes)
    with pytest.raises(ValueError, match=r"y holds booleans \(\[False, True\]\) and classes integers \(\[0, 1\]\): "
                                         "give the classes as the labels of y are"):
        GPClassifier(method="sep", n_inducing=3).partial_fit(X, y > 0, classes=[0, 1])
    with pytest.raises(ValueError, match=r"y holds integers \(\[-1, 1\]\) and classes text \(\['-1', '1'\]\)"):
        GPClassifier(method="sep", n_inducing=3).partial_fit(X, y, classes=["-1", "1"])


def test_a_subset_parameter_names_what_it_chooses():
    """``optimize``'s values and the groups they choose: True all, False and None none, a name or a tuple itself."""
    groups = V.Subset("kernel", "inducing")
    cases = [(True, ("kernel", "inducing")), (False, ()), (None, ()), ("kernel", ("kernel",)),
             (("inducing", "kernel"), ("inducing", "kernel")), (["inducing"], ("inducing",))]
    for value, names in cases:
        assert groups.chosen(value) == names


def _forged_dtype_zarr(tmp_path):
    """A zarr array of 40 rows of float64 whose zarr.json was edited to say float32 (its chunks hold twice the
    bytes)."""
    store, _ = forged_zarr(tmp_path, 40, "data_type", "float32")
    return pytest.importorskip("zarr").open_array(str(store), mode="r")


_X40 = make_banana(40, random_state=0)[0]
UNCLEAR = {
    "a pandas categorical column": (lambda tmp: pandas.DataFrame({"a": _X40[:, 0], "b": pandas.Categorical(
        ["hi", "lo"] * 20)}), r"X column 'b' is categorical but not among categorical_features"),
    "a datetime column": (lambda tmp: pandas.DataFrame({"a": _X40[:, 0], "when": pandas.date_range("2020", periods=40)}),
                          r"X column 'when' holds dates or times \(datetime64"),
    "a text column": (lambda tmp: pandas.DataFrame({"a": _X40[:, 0], "b": ["hi", "lo"] * 20}),
                      r"X column 'b' holds text or other objects"),
    "a generator": (lambda tmp: (row for row in _X40.tolist()), r"X is a generator: give the rows as an array"),
    "a ragged list": (lambda tmp: _X40.tolist()[:39] + [[1.0]],
                      r"X is a list of rows of different lengths \(row 0 has 2 values, row 39 has 1\)"),
    "two columns of one name": (lambda tmp: pandas.DataFrame(_X40, columns=["a", "a"]),
                                r"X has columns of the same name: 'a' \(2 times\); give each column its own name"),
    "a zarr array with a forged dtype": (_forged_dtype_zarr, r"X cannot be read at rows 0\.\.39 \(cannot reshape array "
                                                             r"of size 80 into shape \(20,2\)\): its stored chunks do "
                                                             r"not hold the float32 values"),
}


@pytest.mark.parametrize("make, message", UNCLEAR.values(), ids=UNCLEAR.keys())
def test_unclear_third_party_errors_are_one_line_naming_the_problem(tmp_path, make, message):
    """A pandas categorical column ("could not convert string to float: 'hi'", the column not named), a datetime
    column (NumPy's DTypePromotionError), two columns of one name (narwhals' DuplicateError), a generator or a ragged list (float() / inhomogeneous-shape errors), a zarr
    array with a forged dtype ("cannot reshape array of size 640"): each is one ValueError in agpc's words.
    (Categorical and text columns are categorical features by default: refused here with none.)"""
    y = make_banana(40, random_state=0)[1]
    with pytest.raises(ValueError, match=message):
        GPClassifier(n_inducing=5, max_iter=1, categorical_features=None).fit(make(tmp_path), y)


def test_columns_that_convert_as_numbers_are_still_taken():
    """Categories that are numbers, booleans, pandas' nullable integers: features as before."""
    X, y = make_banana(40, random_state=0)
    frame = pandas.DataFrame({"a": X[:, 0], "b": pandas.Categorical([1.0, 2.0] * 20), "c": [True, False] * 20,
                              "d": pandas.array(list(range(40)), dtype="Int64")})
    assert GPClassifier(n_inducing=5, max_iter=1).fit(frame, y).n_features_in_ == 4


NUMPY_REPRS = {
    "class np.int64(-1) has none": (lambda X, y: (X, y, dict(sample_weight=np.where(y < 0, 0.0, 1.0))), {},
                                    "every class needs a row of positive weight (sample_weight times class_weight); "
                                    "class -1 has none"),
    "y has only one class (np.int64(0))": (lambda X, y: (X, np.zeros(len(y), dtype=np.int64), {}), {},
                                          "y has only one class (0): a classifier needs two classes"),
    "y has only one class (np.str_('a'))": (lambda X, y: (X, np.full(len(y), "a"), {}), {},
                                           "y has only one class ('a'): a classifier needs two classes"),
}


@pytest.mark.parametrize("make, settings, message", NUMPY_REPRS.values(), ids=NUMPY_REPRS.keys())
def test_messages_show_labels_as_written_not_numpys_reprs(make, settings, message):
    X, y = make_banana(30, random_state=0)
    X, y, fit_options = make(X, y.astype(np.int64))
    with pytest.raises(ValueError) as refused:
        GPClassifier(n_inducing=5, max_iter=1, **settings).fit(X, y, **fit_options)
    assert message in str(refused.value) and "np." not in str(refused.value)


@pytest.mark.parametrize("weights", [np.ones(30) + 0.5j, [1 + 0j] * 30, 2 + 1j], ids=["array", "list", "scalar"])
def test_complex_weights_are_refused(weights):
    """Complex weights were accepted with their imaginary part dropped (a ComplexWarning only)."""
    X, y = make_banana(30, random_state=0)
    with pytest.raises(ValueError, match=r"sample_weight must be real numbers, one a row: got complex weights"):
        GPClassifier(n_inducing=5, max_iter=1).fit(X, y, sample_weight=weights)


def test_classes_with_a_duplicate_names_it():
    """"classes must list at least two distinct labels" did not say which label was given twice."""
    X, y = make_banana(30, random_state=0)
    labels = np.where(y > 0, "b", "a")
    with pytest.raises(ValueError, match=r"classes lists 'b' 2 times, in \['a', 'b', 'c', 'b'\]: each class once"):
        GPClassifier(likelihood="ordinal", classes=["a", "b", "c", "b"], n_inducing=5, max_iter=1).fit(X, labels)


def test_gfitc_refuses_the_ordinal_likelihood_saying_what_trains_it():
    """The refusal first said that GFITC uses "the ordinal probit for ordered classes", which it refuses."""
    with pytest.raises(ValueError) as refused:
        GPClassifier(method="gfitc", likelihood="ordinal").check_params()
    message = str(refused.value)
    assert "method='gfitc' uses the probit likelihood" in message and "ordinal probit" not in message
    assert "(likelihood='ordinal') are trained by 'ep', 'sep', 'adf' or 'svi'" in message


def test_a_float32_model_refuses_a_value_beyond_float32_before_casting_it():
    """A row of 1e39 given to a float32 model: an "overflow encountered in cast" RuntimeWarning came before the clear
    error; now the error alone."""
    X, y = make_banana(30, random_state=0)
    model = GPClassifier(n_inducing=5, max_iter=1, dtype="float32").fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"Input X contains NaN or infinity \(or values too large for float32\)"):
            model.predict_proba(np.array([[1e39, 0.0]]))


def test_a_frame_with_a_repeated_column_name_is_refused_at_prediction_too():
    """A hostile-input audit (2026-12-02): a frame with two columns of one name raised narwhals' DuplicateError from
    inside scikit-learn's conversion. Prediction reads its frame as fit does: one ValueError in agpc's words."""
    X, y = make_banana(40, random_state=0)
    model = GPClassifier(n_inducing=5, max_iter=1).fit(pandas.DataFrame(X, columns=["a", "b"]), y)
    with pytest.raises(ValueError, match=r"X has columns of the same name: 'b' \(2 times\)"):
        model.predict_proba(pandas.DataFrame(X, columns=["b", "b"]))
    pa = pytest.importorskip("pyarrow")  # (a Table's ``columns`` are its columns; its names are ``column_names``)
    with pytest.raises(ValueError, match=r"X has columns of the same name: 'a' \(2 times\)"):
        model.predict_proba(pa.Table.from_arrays([pa.array(X[:, 0]), pa.array(X[:, 1])], names=["a", "a"]))


@pytest.mark.parametrize("kernel", [RBF(lengthscales=1e-300), RBF(lengthscales=[1e-160, 1.0]),
                                    RBF(amplitude=1e308) + RBF(amplitude=1e308)],
                         ids=["lengthscale 1e-300", "one lengthscale 1e-160", "amplitudes that overflow added"])
def test_a_kernel_whose_covariances_overflow_is_refused_before_training(data, kernel, no_training):
    """A hostile-input audit (2026-12-02): a user's kernel of lengthscales 1e-300 (the inputs scaled to 1e300, whose
    squared distances overflow) ended in a CholeskyError of K(Z, Z) at the first step, after NumPy's overflow
    warnings. Now one ValueError before any step, no warning; a lengthscale of 1e-100 (squares of 1e200) fits."""
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"kernel: its covariances of the inducing points are not finite in "
                                             r"float64 \(they overflow\)"):
            GPClassifier(kernel=kernel, n_inducing=5, max_iter=2).fit(X, y)


def test_inducing_points_that_overflow_the_default_kernel_are_refused_by_name(data, no_training):
    """An estimator-API audit (2026-12-02): inducing points 1e200 times the rows' scale, with the default kernel
    (whose lengthscales follow the rows), leaked NumPy's overflow warnings and then raised a CholeskyError of K(Z, Z)
    that named no parameter. Now one ValueError naming ``inducing``, before any step, no warning."""
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"inducing: the kernel's covariances of these inducing points are not "
                                             r"finite in float64"):
            GPClassifier(inducing=X[:5] * 1e200, n_inducing=5, max_iter=2).fit(X, y)


def test_a_tiny_lengthscale_that_does_not_overflow_still_fits(data):
    X, y = data
    model = GPClassifier(kernel=RBF(lengthscales=1e-100), n_inducing=5, max_iter=2, random_state=0).fit(X, y)
    assert np.all(np.isfinite(model.predict_proba(X)))


def _dated(X):
    return np.array((X * 1000).astype(int), dtype="datetime64[D]")


@pytest.mark.parametrize("make, message", [
    (_dated, r"X holds dates or times \(datetime64\[D\]\): features must be numbers"),
    (lambda X: np.array((X * 1000).astype(int), dtype="timedelta64[s]"), r"X holds dates or times \(timedelta64"),
    (lambda X: X + 1j, r"Complex data not supported: X is complex128"),
    # (a table of records is 1-D: refused as a 1-D X or by its dtype, whichever is looked at first)
    (lambda X: np.rec.fromarrays([X[:, 0], X[:, 1]]).view(np.ndarray), r"X has a structured dtype|Expected 2D"),
], ids=["datetime", "timedelta", "complex", "structured"])
@pytest.mark.parametrize("where", ["memory", "memmap", "zarr", "dask"])
def test_dates_complex_and_records_are_refused_on_every_path(data, tmp_path, make, message, where):
    """A hostile-input audit (2026-12-02): datetime64 and timedelta64 arrays were read as their ticks at fit and
    at predict (the same dates in another unit were other rows: 0.5 everywhere; NaT a number), and complex rows on
    disk lost their imaginary part with only NumPy's ComplexWarning. Each is refused at fit and at predict, as a
    DataFrame's date column and complex rows in memory were."""
    X, y = data
    bad = make(X)
    if where == "memmap":
        np.save(tmp_path / "X.npy", bad)
        bad = np.load(tmp_path / "X.npy", mmap_mode="r")
    elif where == "zarr":
        zarr = pytest.importorskip("zarr")
        if bad.dtype.kind in "mMV":
            pytest.skip(f"zarr does not store {bad.dtype}")
        stored = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=bad.shape, dtype=bad.dtype, chunks=(50, 2))
        stored[:] = bad
        bad = stored
    elif where == "dask":
        da = pytest.importorskip("dask.array")
        bad = da.from_array(bad, chunks=(50, 2)[:bad.ndim])
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match=message if where != "dask" else r"X holds dates|Complex|Expected 2D"):
        model.predict_proba(bad)
    if where != "dask":  # (a dask fit refuses them as "X must be real-valued": test_dask)
        with pytest.raises(ValueError, match=message):
            GPClassifier(n_inducing=3, max_iter=1).fit(bad, y)


def test_a_dask_array_that_is_not_a_table_is_refused_at_predict(data):
    """1-D and 3-D dask arrays got NumPy's AxisError or dask's own errors; a dask array of objects is predicted
    chunk by chunk as rows in memory are (a cell that is not a number named there)."""
    da = pytest.importorskip("dask.array")
    X, y = data
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match=r"Expected 2D array, got 1D array instead"):
        model.predict_proba(da.from_array(X[:, 0]))
    with pytest.raises(ValueError, match=r"Expected 2D array, got 3D array instead"):
        model.predict_proba(da.from_array(X[None]))
    np.testing.assert_array_equal(model.predict(da.from_array(X.astype(object), chunks=(50, 2))).compute(),
                                  model.predict(X))
    text = X.astype(object)
    text[7, 1] = "x"
    with pytest.raises(ValueError, match=r"X row 7, column 1 holds 'x', not a real number"):
        model.predict(da.from_array(text, chunks=(50, 2))).compute()
    text = X.astype(object)  # (in a later chunk: its row counted in the chunk, which is said)
    text[17, 1] = "x"
    with pytest.raises(ValueError, match=r"X row 7, column 1 holds 'x'.*\(in the chunk of rows from row 10 on: its "
                                         r"rows are counted from there\)"):
        model.predict(da.from_array(text, chunks=(10, 2))).compute()


def test_score_refuses_labels_of_another_kind_and_takes_weights_of_any_scale(data):
    """A hostile-input audit (2026-12-02): ``score(X, y.astype(str))`` on a model of numeric classes returned 0.0
    (no label matched), where scikit-learn's accuracy_score raises "Mix of label input types"; weights of 1e308
    summed to inf, and the accuracy was NaN with NumPy's warnings. An accuracy counts its weights by their ratios."""
    X, y = data
    model = GPClassifier(n_inducing=3, max_iter=2, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match=r"Mix of label input types \(string and number\): y holds strings, the "
                                         r"model's classes are numbers"):
        model.score(X, y.astype(str))
    text = GPClassifier(n_inducing=3, max_iter=2, random_state=0).fit(X, np.where(y > 0, "yes", "no"))
    with pytest.raises(ValueError, match=r"y holds numbers, the model's classes are strings \(\['no', 'yes'\]\)"):
        text.score(X, (y > 0).astype(int))
    weights = np.random.default_rng(0).uniform(0.5, 2.0, size=len(y))
    expected = model.score(X, y, sample_weight=weights)
    assert model.score(X, y, sample_weight=weights / 2.0 * 1e308) == pytest.approx(expected, rel=1e-12)
    assert text.score(X, np.where(y > 0, "yes", "no")) == model.score(X, y)


@pytest.mark.parametrize("setting, value, message", [
    ("n_quadrature", 2.5, r"n_quadrature must be an int in \[1, 1000\], got 2\.5"),
    ("n_quadrature", True, r"n_quadrature must be an int in \[1, 1000\], got True"),
    ("n_quadrature", "abc", r"n_quadrature must be an int in \[1, 1000\], got 'abc'"),
    ("n_quadrature", 3000, r"n_quadrature must be an int in \[1, 1000\], got 3000"),
    ("block_rows", 0, r"block_rows must be None or an int in \[1, inf\), got 0"),
    ("block_rows", 1.5, r"block_rows must be None or an int"),
])
def test_prediction_checks_the_settings_it_reads_as_fit_does(data, setting, value, message):
    """A hostile-input audit (2026-12-02): prediction read ``n_quadrature`` and ``block_rows`` as ``set_params`` left
    them since the fit, unchecked: 2.5 or True nodes silently changed the probabilities (int() of them), "abc" was
    Python's int() error, 3000 nodes took seconds a row (10^7 took the machine's memory), a block of 0 rows was
    taken. Each is refused as fit refuses it; ``n_quadrature`` has an upper bound, 1,000."""
    import pickle

    X, y = data
    model = GPClassifier(method="svi", likelihood="logistic", n_inducing=3, max_iter=1, random_state=0).fit(X, y)
    changed = pickle.loads(pickle.dumps(model)).set_params(**{setting: value})
    with pytest.raises(ValueError, match=message):
        changed.predict_proba(X[:3])
    with pytest.raises(ValueError, match=message):
        GPClassifier(method="svi", n_inducing=3, max_iter=1, **{setting: value}).fit(X, y)


def test_prediction_takes_rows_in_the_type_the_model_was_fitted_in(data):
    """``set_params(dtype="float32")`` after a float64 fit rounded the rows to float32 at predict (and refused 1e39
    as "too large for float32"); the model computes in its own type, float64."""
    import pickle

    X, y = data
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0).fit(X, y)
    changed = pickle.loads(pickle.dumps(model)).set_params(dtype="float32")
    rows = np.array([[1.0000001, 0.3], [1e39, 0.0]])
    np.testing.assert_array_equal(changed.predict_latent(rows)[0], model.predict_latent(rows)[0])


@pytest.mark.parametrize("rows, message", [
    ([[1 + 0j, 2.0]], r"X row 0, column 0 holds \(1\+0j\): float\(\) argument must be a string or a real number"),
    ([[0.5, 10 ** 400]], r"X row 0, column 1 holds 1000.*\.\.\. \(401 characters\), a number too large for a float"),
    (np.array([["0.1", "0.2"], ["0.3", "b"]]), r"X row 1, column 1 holds 'b', not a real number"),
    (np.array([[1.0, None]], dtype=object), r"X row 0, column 1 holds None, not a real number"),
], ids=["complex in a list", "10**400", "text array", "None in objects"])
def test_a_cell_that_is_not_a_number_is_named_by_its_row_and_column(data, rows, message):
    """A hostile-input audit (2026-12-02): such rows got Python's TypeError or OverflowError, or NumPy's "could not
    convert string to float", naming neither the row nor the column. Now one error naming both, at predict and at
    fit."""
    X, y = data
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0).fit(X, y)
    # (a complex number is Python's TypeError, as scikit-learn's estimator checks expect of a cell float() refuses)
    error = TypeError if isinstance(rows[0][0], complex) else ValueError
    with pytest.raises(error, match=message):
        model.predict(rows)
    table = [list(row) for row in np.asarray(rows, dtype=object)] * 10
    with pytest.raises(error, match=message):
        GPClassifier(n_inducing=3, max_iter=1, categorical_features=None).fit(
            np.array(table, dtype=object) if isinstance(rows, np.ndarray) else table, [0, 1] * (len(table) // 2))


def test_rows_on_disk_too_large_for_a_float32_model_are_refused_without_a_warning(data, tmp_path):
    """A hostile-input audit (2026-12-02): a memmap holding 1e39, predicted by a float32 model, leaked NumPy's
    "overflow encountered in cast" before the right error."""
    X, y = data
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0, dtype="float32").fit(X, y)
    np.save(tmp_path / "far.npy", np.array([[0.5, 0.5], [1e39, 0.0]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"Input X contains NaN or infinity \(rows 0\.\.1\)"):
            model.predict(np.load(tmp_path / "far.npy", mmap_mode="r"))


def test_a_dataframe_with_an_extra_or_a_missing_column_is_told_its_name(data):
    """A hostile-input audit (2026-12-02): a DataFrame with an extra or a missing column, given to a model fitted on
    a DataFrame, was told "X has 3 features, but GPClassifier is expecting 2" (the count checked first), where
    scikit-learn's check of the names says which column."""
    X, y = data
    frame = pandas.DataFrame(X, columns=["a", "b"])
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0).fit(frame, y)
    with pytest.raises(ValueError, match=r"Feature names unseen at fit time:\n- c"):
        model.predict(frame.assign(c=1.0))
    with pytest.raises(ValueError, match=r"Feature names seen at fit time, yet now missing:\n- b"):
        model.predict_proba(frame[["a"]])
    np.testing.assert_array_equal(model.predict(frame), model.predict(X))


def test_a_dtype_set_since_the_fit_changes_nothing_and_an_unfitted_dask_prediction_is_not_fitted(data):
    """The review of this stop's fixes (2026-12-02): after ``set_params(dtype=...)`` the categorical codes were still
    checked in the new type, a bogus dtype was a TypeError, and a dask prediction declared the new type while it
    computed in the model's; an unfitted model's dask prediction was an AttributeError (classes_)."""
    import pickle

    da = pytest.importorskip("dask.array")
    X, y = data
    model = GPClassifier(n_inducing=3, max_iter=1, random_state=0).fit(X, y)
    changed = pickle.loads(pickle.dumps(model)).set_params(dtype="bogus")
    np.testing.assert_array_equal(changed.predict_proba(X), model.predict_proba(X))
    lazy = changed.set_params(dtype="float32").predict_proba(da.from_array(X, chunks=(20, 2)))
    assert lazy.dtype == np.float64 and lazy.compute().dtype == np.float64
    from sklearn.exceptions import NotFittedError

    for method in ("predict", "predict_proba", "predict_log_proba"):
        with pytest.raises(NotFittedError):
            getattr(GPClassifier(), method)(da.from_array(X, chunks=(20, 2)))
