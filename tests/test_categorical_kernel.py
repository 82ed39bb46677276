"""The categorical kernel, the kernel of some columns and the mixed form of the two (issue 45): the closed form by
hand, the correlation of levels and of a level unseen at fit, inducing points never moved in a categorical column
or in a column a kernel does not read, descriptions that round-trip and hostile ones refused, relevance per column.
(Finite differences, array_api_strict on two devices, fits and save / load: the kernel contract,
tests/test_kernels.py.)"""

import json
import warnings
import math
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone

import agpc
from agpc import persistence as model_files
from agpc.inspection import column_relevance, feature_relevance
from agpc import inputs as training_inputs
from agpc.kernels import (
    ANY_LEVEL,
    DEFAULT_PRIOR_SCALE,
    MAX_COLUMNS,
    MAX_LISTED_LEVELS,
    RBF,
    Categorical,
    Linear,
    OnColumns,
    OrdinalKernel,
    Sum,
    any_level_columns,
    kernel_from_spec,
    mixed_kernel,
    with_default_priors,
)
from agpc.priors import Gamma, LogNormal
from conftest import to_np
from test_kernels import coded_problem


def test_the_closed_form_on_a_small_example_by_hand():
    kernel = Categorical([0, 2], lengthscales=[0.5, 2.0], amplitude=2.0)
    X = np.array([[0.0, 5.0, 1.0], [0.0, 1.0, 2.0]])
    Z = np.array([[0.0, 3.0, 1.0], [1.0, 0.0, 1.0]])
    # x1 / z1: both columns equal; x1 / z2: column 0 differs (1 / 0.5^2); x2 / z1: column 2 differs (1 / 2^2);
    # x2 / z2: both differ (column 1 is not read: its values are all different)
    expected = 2.0 * np.exp(-np.array([[0.0, 4.0], [0.25, 4.25]]))
    np.testing.assert_allclose(np.asarray(kernel.for_inputs(X).K(X, Z)), expected, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(kernel.K(X)), 2.0 * np.exp(-np.array([[0.0, 0.25], [0.25, 0.0]])),
                               rtol=1e-15)
    np.testing.assert_allclose(np.asarray(kernel.Kdiag(X)), [2.0, 2.0])


@pytest.mark.parametrize("lengthscale", [0.1, 1.0, 7.5])
def test_two_levels_are_correlated_exp_minus_one_over_l_squared_and_an_unseen_level_is_its_own(lengthscale):
    """Levels 0, 1, 2 and the code of a level unseen at fit (-1): each correlated exp(-1 / l^2) with every other, 1
    with itself, whatever the codes' order or distance."""
    kernel = Categorical([0], lengthscales=lengthscale, amplitude=3.0)
    levels = np.array([[0.0], [1.0], [2.0], [-1.0], [1e6]])
    correlation = np.asarray(kernel.K(levels)) / 3.0
    expected = np.full((5, 5), math.exp(-1.0 / lengthscale ** 2))
    np.fill_diagonal(expected, 1.0)
    # (exp(-w) carries w's rounding times w: 1e-16 relative in w = 100 at l = 0.1 is 1e-14 relative in the value)
    np.testing.assert_allclose(correlation, expected, rtol=1e-16 * max(10.0, 10.0 / lengthscale ** 2))
    assert np.min(np.linalg.eigvalsh(correlation)) > -1e-12


def test_the_lengthscale_runs_from_irrelevant_to_independent_levels():
    levels = np.array([[0.0], [1.0]])
    assert float(Categorical([0], lengthscales=1e6).K(levels)[0, 1]) == pytest.approx(1.0, abs=1e-5)
    assert float(Categorical([0], lengthscales=1e-2).K(levels)[0, 1]) < 1e-40


def gradient_inputs(seed=0, n=9, m=5):
    rng = np.random.default_rng(seed)
    X, Z = rng.normal(size=(n, 5)), rng.normal(size=(m, 5))
    X[:, [1, 3]] = rng.integers(0, 3, size=(n, 2))
    Z[:, [1, 3]] = rng.integers(0, 3, size=(m, 2))
    return X, Z, rng.normal(size=(m, m)), rng.normal(size=(n, m)), rng.normal(size=n)


@pytest.mark.parametrize("make, unmoved", [
    (lambda: Categorical([1, 3], lengthscales=[0.7, 1.9], noise=0.1), [0, 1, 2, 3, 4]),
    (lambda: OnColumns(RBF([0.8, 1.4]), [2, 0]), [1, 3, 4]),   # taken by index
    (lambda: OnColumns(Linear([0.5, 2.0]), [2, 3]), [0, 1, 4]),  # a slice
    (lambda: mixed_kernel(OnColumns(RBF([0.8, 1.4, 1.1]), [0, 2, 4]), Categorical([1, 3])), [1, 3]),
])
def test_the_inducing_points_gradient_is_exactly_zero_where_they_must_not_move(make, unmoved):
    X, Z, W_mm, W_nm, w = gradient_inputs()
    kernel = make().for_inputs(X)
    dZ = np.asarray(kernel.grads(W_mm, W_nm, w, X, Z)["Z"])
    assert dZ.shape == Z.shape
    assert np.all(dZ[:, unmoved] == 0.0)
    moved = [j for j in range(5) if j not in unmoved]
    assert not moved or np.all(dZ[:, moved] != 0.0)


def test_gradients_are_the_same_given_the_blocks_or_overwriting_the_adjoint():
    X, Z, W_mm, W_nm, w = gradient_inputs(1)
    kernel = Categorical([1, 3], lengthscales=[0.7, 1.9], amplitude=1.4, noise=0.1).for_inputs(X)
    plain = kernel.grads(W_mm, W_nm, w, X, Z)
    given = kernel.grads(W_mm, W_nm, w, X, Z, Knm=kernel.K(X, Z), Kmm=kernel.K(Z))
    overwritten = kernel.grads(W_mm, W_nm.copy(), w, X, Z, overwrite=True)
    for key, value in plain.items():
        np.testing.assert_allclose(given[key], value, rtol=1e-14, err_msg=key)
        np.testing.assert_allclose(overwritten[key], value, rtol=1e-14, err_msg=key)
    none = kernel.grads(None, None, None, X, Z)
    assert set(none) == set(plain) and all(np.all(np.asarray(v) == 0.0) for v in none.values())


def test_on_columns_is_the_kernel_of_the_columns_it_reads():
    X, Z, *_ = gradient_inputs(2)
    rbf = RBF([0.8, 1.4], amplitude=1.5, noise=0.2)
    for columns in ([2, 0], [3, 4]):
        kernel = OnColumns(rbf, columns).for_inputs(X)
        inner = rbf.for_inputs(X[:, columns])
        np.testing.assert_array_equal(np.asarray(kernel.K(X, Z)), np.asarray(inner.K(X[:, columns], Z[:, columns])))
        np.testing.assert_array_equal(np.asarray(kernel.Kdiag(X)), np.asarray(inner.Kdiag(X[:, columns])))
        assert kernel.parameter_table()["log_lengthscales"].length == 2
        assert float(kernel.noise) == pytest.approx(0.2)
    assert OnColumns(Linear(), [1]).growth is not None and OnColumns(RBF(), [1]).growth is None


def test_a_mixed_kernel_is_the_sum_of_both_and_their_product_with_parameters_of_their_own():
    continuous, categorical = OnColumns(RBF([0.8]), [0]), Categorical([1], lengthscales=0.6, noise=0.05)
    kernel = mixed_kernel(continuous, categorical)
    assert isinstance(kernel, Sum) and len(kernel.terms) == 3
    assert float(kernel.noise) == pytest.approx(0.05)  # the two kernels' noises, counted once
    assert sorted(key for key in kernel.params if key.endswith("noise")) == ["log_noise"]
    assert kernel.terms[2].terms[0] is not kernel.terms[0]  # the product's factors are copies
    X = np.array([[0.3, 1.0], [-0.2, 2.0], [1.1, 1.0]])
    c, k = np.asarray(continuous.K(X)), np.asarray(categorical.K(X))
    np.testing.assert_allclose(np.asarray(kernel.K(X)), c + k + c * k, rtol=1e-14)
    with pytest.raises(TypeError, match="combines agpc kernels"):
        mixed_kernel(RBF(), "Categorical")


def test_construction_checks_its_columns_and_lengthscales():
    with pytest.raises(ValueError, match="2 columns but 3 lengthscales"):
        Categorical([0, 1], lengthscales=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="column 4 is out of range for data of 3 features"):
        Categorical([0, 4]).for_inputs(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="column 3 is out of range for data of 3 features"):
        OnColumns(RBF(), [3]).for_inputs(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="one latent GP"):
        OnColumns(OrdinalKernel(RBF(), [0.0, 1.0]), [0])
    with pytest.raises(TypeError, match="one latent GP"):
        OnColumns("RBF", [0])
    np.testing.assert_array_equal(Categorical(np.array([2, 0])).columns, (2, 0))  # NumPy integers are indices


@pytest.mark.parametrize("columns", [[], [-1], [1.5], ["1"], [True], [0, 0], [1 << 31], list(range(MAX_COLUMNS + 1)),
                                     "01", 3, {"0": 1}, np.array(2), [[0]]])
def test_malformed_columns_are_one_value_error(columns):
    with pytest.raises(ValueError, match="Categorical: "):
        Categorical(columns)
    with pytest.raises(ValueError, match="OnColumns: "):
        OnColumns(RBF(), columns)


def test_specs_round_trip():
    kernels = [
        Categorical([3, 1], lengthscales=[0.5, 2.0], amplitude=1.5, noise=0.1,
                    priors={"lengthscales": LogNormal([0.0, 1.0], 1.0), "amplitude": Gamma(2.0, 1.0)}),
        OnColumns(RBF([0.7, 1.2], priors={"lengthscales": Gamma(2.0, 1.0)}) + Linear([0.3, 0.4]), [0, 2]),
        mixed_kernel(OnColumns(RBF([0.7, 1.2]), [0, 2]), Categorical([1, 3]), noise=0.01,
                     priors={"noise": Gamma(1.5, 4.0)}),
    ]
    X = np.array([[0.1, 1.0, -0.3, 2.0], [0.4, 0.0, 0.2, 2.0], [-1.0, 2.0, 0.9, -1.0]])
    for kernel in kernels:
        fitted = kernel.for_inputs(X)
        spec = json.loads(json.dumps(fitted.spec()))  # (what a model file holds)
        rebuilt = kernel_from_spec(spec, fitted.params)
        assert rebuilt.spec() == fitted.spec() and repr(rebuilt) == repr(fitted)
        assert rebuilt.parameter_table() == fitted.parameter_table()
        np.testing.assert_array_equal(np.asarray(rebuilt.K(X)), np.asarray(fitted.K(X)))
    assert kernels[0].spec() == {"type": "Categorical", "columns": [3, 1], "priors": {
        "lengthscales": LogNormal([0.0, 1.0], 1.0).spec(), "amplitude": Gamma(2.0, 1.0).spec()}}
    assert kernels[1].spec()["columns"] == [0, 2] and kernels[1].spec()["kernel"]["type"] == "Sum"


@pytest.mark.parametrize("spec", [
    {"type": "Categorical"},                                     # no columns
    {"type": "Categorical", "columns": [-1]},
    {"type": "Categorical", "columns": [0.0]},
    {"type": "Categorical", "columns": [True]},
    {"type": "Categorical", "columns": [1, 1]},
    {"type": "Categorical", "columns": []},
    {"type": "Categorical", "columns": list(range(MAX_COLUMNS + 1))},
    {"type": "Categorical", "columns": "0"},
    {"type": "Categorical", "columns": {"0": 0}},
    {"type": "Categorical", "columns": [0], "terms": []},
    {"type": "Categorical", "columns": [0], "priors": {"alpha": {"family": "Gamma", "shape": 1.0, "rate": 1.0}}},
    {"type": "Categorical", "columns": [0], "priors": {"lengthscales": {"family": "os.system"}}},
    {"type": "OnColumns", "columns": [0]},                       # no kernel
    {"type": "OnColumns", "kernel": {"type": "RBF"}},            # no columns
    {"type": "OnColumns", "columns": [0], "kernel": {"type": "RBF"}, "priors": {}},
    {"type": "OnColumns", "columns": [-2], "kernel": {"type": "RBF"}},
    {"type": "OnColumns", "columns": 0, "kernel": {"type": "RBF"}},
    {"type": "OnColumns", "columns": [0], "kernel": {"type": "builtins.eval"}},
    {"type": "OnColumns", "columns": [0], "kernel": {"type": "Ordinal", "latent": {"type": "RBF"}, "classes": 3}},
    {"type": "OnColumns", "columns": [0], "kernel": "RBF"},
    {"type": "Sum", "terms": [{"type": "RBF"}, {"type": "Categorical", "columns": [0, -1]}]},
])
def test_malformed_specs_are_refused(spec):
    with pytest.raises(ValueError):
        kernel_from_spec(spec, {})


def test_deeply_nested_on_columns_are_refused():
    spec = {"type": "RBF"}
    for _ in range(20):
        spec = {"type": "OnColumns", "columns": [0], "kernel": spec}
    with pytest.raises(ValueError, match="nested deeper than the 8 a model file may describe"):
        kernel_from_spec(spec, {})


def fitted_mixed(**options):
    X, y = coded_problem([0, 2])
    kernel = mixed_kernel(OnColumns(RBF([0.9]), [1]), Categorical([0, 2]), noise=0.01)
    return agpc.GPClassifier(kernel=kernel, n_inducing=8, max_iter=6, random_state=0, inducing="random",
                             **options).fit(X, y), X


def saved_file(model, tmp_path):
    """(path, {member: array}, the header's member, the header) of ``model`` saved in tmp_path (crafted files are
    made from them)."""
    path = tmp_path / "model.npz"
    model_files.save_model(model, path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    (header_name,) = [name for name, value in arrays.items() if value.dtype.kind == "U"]
    return path, arrays, header_name, json.loads(str(arrays[header_name]))


def test_a_model_file_whose_columns_do_not_match_its_arrays_is_refused(tmp_path):
    """The file's description says which columns, its arrays hold one lengthscale a column: a description of three
    columns beside arrays of two is refused before any kernel is built."""
    model, _ = fitted_mixed()
    path, arrays, header_name, header = saved_file(model, tmp_path)
    assert header["kernel"]["terms"][1]["columns"] == [0, 2]
    header["kernel"]["terms"][1]["columns"] = [0, 1, 2]
    arrays[header_name] = np.asarray(json.dumps(header))
    crafted = tmp_path / "crafted.npz"
    np.savez(crafted, **arrays)
    with pytest.raises(ValueError, match="kernel"):
        model_files.load_model(crafted)


def test_a_far_or_unseen_code_stays_unseen_through_the_clamp_of_far_rows():
    """Prediction clamps far inputs to the kernel's reach (``kernels.within_reach``): a code far beyond the
    inducing points' is moved, but to another code none of them has, so it predicts as any unseen level does."""
    model, X = fitted_mixed()
    rows = X[:3].copy()
    unseen, far = rows.copy(), rows.copy()
    unseen[:, 0], far[:, 0] = -7.0, 1e250
    np.testing.assert_allclose(model.predict_proba(far), model.predict_proba(unseen), rtol=1e-12)
    assert np.all(np.isfinite(model.predict_proba(X[:3] * 1e300)))


def test_one_shared_scale_keeps_the_categorical_lengthscales_ratios():
    """ard=False moves each kernel's lengthscales by one common factor: the categorical kernel's too (its
    lengthscales are ``kernels.PER_FEATURE_SCALES``' ``log_lengthscales``)."""
    X, y = coded_problem([0, 2])
    kernel = Categorical([0, 2], lengthscales=[0.5, 2.0], noise=0.01)
    model = agpc.GPClassifier(kernel=kernel, n_inducing=8, max_iter=8, random_state=0, inducing="random",
                              ard=False).fit(X, y)
    learned = np.exp(to_np(model.kernel_.params["log_lengthscales"]))
    assert learned[1] / learned[0] == pytest.approx(4.0, rel=1e-9)
    assert not np.allclose(learned, [0.5, 2.0])


def test_default_priors_of_the_mixed_form():
    """The continuous term's lengthscale priors are centred on the reference's of its columns; a categorical
    kernel's on the default's 1; every amplitude's on 1."""
    reference = RBF(lengthscales=[2.0, 3.0, 5.0])
    kernel = with_default_priors(mixed_kernel(OnColumns(RBF(), [2, 0]), Categorical([1])), reference)
    priors = kernel.priors
    for prefix in ("0.", "2.0."):
        assert priors[prefix + "log_lengthscales"] == LogNormal([math.log(5.0), math.log(2.0)], DEFAULT_PRIOR_SCALE)
    for prefix in ("1.", "2.1."):
        assert priors[prefix + "log_lengthscales"] == LogNormal(0.0, DEFAULT_PRIOR_SCALE)
    assert all(priors[p + "log_amplitude"] == LogNormal(0.0, DEFAULT_PRIOR_SCALE) for p in ("0.", "1.", "2.0."))
    kernel.for_inputs(np.zeros((2, 3)))  # (the priors' entries match the parameters')
    with pytest.raises(ValueError, match="column 3 is out of range for data of 3 features"):
        with_default_priors(OnColumns(RBF(), [3]), reference)


def test_clone_get_and_set_params():
    kernel = mixed_kernel(OnColumns(RBF(0.5, noise=0.1), [0, 2]), Categorical([1], lengthscales=2.0))
    params = kernel.get_params()
    assert params["k1__columns"] == [0, 2] and params["k2__columns"] == [1]
    copy = clone(kernel)
    assert repr(copy) == repr(kernel) and float(copy.noise) == pytest.approx(0.1)
    copy.set_params(k1__kernel__lengthscales=3.0, k2__lengthscales=0.25)
    assert "lengthscales=[3.0]" in repr(copy.terms[0]) and "lengthscales=[0.25]" in repr(copy.terms[1])
    assert repr(kernel) != repr(copy) and float(copy.noise) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="columns must list"):
        Categorical([1]).set_params(columns=[])


def test_relevance_per_column():
    """A categorical column's rate is 1 / l^2 (log k falls by it to another level; the mean of its levels' in the
    per-level form), a continuous one's 1 / (2 l^2), the largest over the terms reading a column; a column no term
    reads has none."""
    relevance, why = feature_relevance(Categorical([1, 3], lengthscales=[1.0, 2.0]), 5)
    assert why is None
    np.testing.assert_allclose(relevance, [0.0, 0.8, 0.0, 0.2, 0.0])
    per_level = Categorical([1, 3], levels=[[0, 1], [0, 1, 2]], level_lengthscales=[1.0, 0.5, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(column_relevance(per_level, 4)[0], [0.0, 2.5, 0.0, 1.0])  # (1 + 4) / 2 and 1
    kernel = mixed_kernel(OnColumns(RBF([1.0]), [0]), Categorical([1], lengthscales=2 ** -0.5))
    kernel = kernel.with_params({**kernel.params, "2.0.log_lengthscales": np.log([0.5])})  # the product's RBF: 0.5
    rate, lengthscale = column_relevance(kernel, 3)
    np.testing.assert_allclose(rate, [2.0, 2.0, 0.0])  # 1 / (2 0.5^2) and 1 / (1 / sqrt 2)^2
    np.testing.assert_allclose(lengthscale, [0.5, 2 ** -0.5, np.inf])
    np.testing.assert_allclose(feature_relevance(kernel, 3)[0], [0.5, 0.5, 0.0])
    shared = RBF(2.0) + Categorical([1], lengthscales=0.125 ** 0.5)  # one lengthscale, for features of a number
    # not known
    assert feature_relevance(shared)[0] is None and "no lengthscale per column" in feature_relevance(shared)[1]
    np.testing.assert_allclose(feature_relevance(shared, 2)[0], [0.125 / 8.125, 8.0 / 8.125])  # (column 1: the larger)


def test_the_summary_of_a_mixed_model_has_relevance_per_column():
    model, _ = fitted_mixed()
    text = model.summary()
    assert "1 / lengthscale^2 of a categorical one" in text
    rows = text.split("feature relevance:")[1].splitlines()[2:5]
    assert sorted(row.split()[0] for row in rows) == ["x0", "x1", "x2"]
    relevance, _ = feature_relevance(model.kernel_, 3)
    np.testing.assert_allclose(relevance.sum(), 1.0)


# -- the per-level form ------------------------------------------------------------------------------------------------

def test_the_per_level_form_by_hand_and_its_unlisted_values():
    """Levels a != b of a column fall (1 / l_a^2 + 1 / l_b^2) / 2; a value the column does not list (-1 unseen, 7)
    takes the column's lengthscale; equal values, listed or not, are correlated 1."""
    kernel = Categorical([0], lengthscales=2.0, levels=[[0, 1, 2]], level_lengthscales=[0.5, 1.0, 4.0])
    values = np.array([[0.0], [1.0], [2.0], [-1.0], [7.0]])
    w = [4.0, 1.0, 1.0 / 16.0, 0.25, 0.25]  # 1 / l^2 of each value (the last two: the column's)
    expected = np.array([[1.0 if a == b else math.exp(-(w[a] + w[b]) / 2.0) for b in range(5)] for a in range(5)])
    np.testing.assert_allclose(np.asarray(kernel.K(values)), expected, rtol=1e-14)
    assert np.min(np.linalg.eigvalsh(np.asarray(kernel.K(values)))) > 0.0


def test_the_per_level_form_with_equal_lengthscales_is_the_exchangeable_one():
    rng = np.random.default_rng(0)
    X, Z = rng.integers(-1, 4, size=(12, 3)).astype(float), rng.integers(-1, 4, size=(5, 3)).astype(float)
    exchangeable = Categorical([0, 2], lengthscales=[0.7, 1.9])
    per_level = Categorical([0, 2], lengthscales=[0.7, 1.9], levels=[[0, 1], [1, 2, 3]],
                            level_lengthscales=[0.7, 0.7, 1.9, 1.9, 1.9])
    np.testing.assert_allclose(np.asarray(per_level.K(X, Z)), np.asarray(exchangeable.K(X, Z)), rtol=1e-14)


def test_levels_are_checked_at_construction():
    with pytest.raises(ValueError, match="one list a column"):
        Categorical([0, 1], levels=[[0, 1]])
    with pytest.raises(ValueError, match="finite number"):
        Categorical([0], levels=[[0.0, float("nan")]])
    with pytest.raises(ValueError, match="finite number"):
        Categorical([0], levels=[["a", "b"]])
    with pytest.raises(ValueError, match="more than once"):
        Categorical([0], levels=[[1, 1.0]])
    with pytest.raises(ValueError, match="at least one level"):
        Categorical([0], levels=[[]])
    with pytest.raises(ValueError, match="3 levels but 2 level_lengthscales"):
        Categorical([0], levels=[[0, 1, 2]], level_lengthscales=[1.0, 2.0])
    assert Categorical([0], levels=[[2, 0, 1]]).levels == ((0.0, 1.0, 2.0),)  # (sorted)


@pytest.mark.parametrize("levels", [
    "01", [[0, 1]] * 2, [[0, "1"]], [[0, None]], [[[0]]], [[0, 1e400]], [{"0": 0}],
    [list(range(MAX_LISTED_LEVELS + 1))],
])
def test_malformed_levels_in_a_description_are_refused(levels):
    with pytest.raises(ValueError):
        kernel_from_spec({"type": "Categorical", "columns": [0], "levels": levels}, {})


def test_per_level_specs_round_trip_and_a_file_of_the_wrong_number_of_level_lengthscales_is_refused():
    kernel = Categorical([2, 0], lengthscales=[0.5, 2.0], levels=[[0, 1], [-3.5, 4, 9]],
                         level_lengthscales=[0.3, 0.4, 0.5, 0.6, 0.7],
                         priors={"level_lengthscales": LogNormal(0.1, 1.0)})
    X = np.array([[0.0, 5.0, 1.0], [9.0, 1.0, 2.0], [-3.5, 0.0, 0.0]])
    fitted = kernel.for_inputs(X)
    spec = json.loads(json.dumps(fitted.spec()))
    assert spec["levels"] == [[0.0, 1.0], [-3.5, 4.0, 9.0]]
    rebuilt = kernel_from_spec(spec, fitted.params)
    assert repr(rebuilt) == repr(fitted) and rebuilt.parameter_table() == fitted.parameter_table()
    np.testing.assert_array_equal(np.asarray(rebuilt.K(X)), np.asarray(fitted.K(X)))
    with pytest.raises(ValueError):
        kernel_from_spec({**spec, "levels": [[0.0, 1.0], [-3.5, 4.0]]}, fitted.params)  # (4 levels, 5 values)


def decided_by_one_level(n=240, seed=0):
    """Rows of two categorical columns of four levels each: the class is whether column 0 takes level 2 (the
    other three alike), with 5% of the labels flipped; column 1 is noise."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 4, size=(n, 2)).astype(float)
    y = (X[:, 0] == 2).astype(int)
    flip = rng.random(n) < 0.05
    return X, np.where(flip, 1 - y, y)


def test_the_default_kernel_lists_the_levels_and_learns_the_level_that_decides():
    """The default kernel over categorical columns is the per-level form with the start's levels and lengthscales
    sqrt(k); fitted where the class is set by one level of a column, that level's lengthscale is the shortest of
    its column, and the exchangeable form cannot do as well (its log Z is lower)."""
    X, y = decided_by_one_level()
    start = training_inputs.default_kernel(X, None, [0, 1])
    assert start.levels == ((0.0, 1.0, 2.0, 3.0),) * 2
    np.testing.assert_allclose(to_np(start.lengthscales), [math.sqrt(2.0)] * 2)
    model = agpc.GPClassifier(categorical_features=[0, 1], random_state=0).fit(X, y)
    scales = np.exp(to_np(model.kernel_.params["log_level_lengthscales"]))
    assert np.argmin(scales[:4]) == 2 and scales[2] < 0.5 * np.min(np.delete(scales[:4], 2))
    exchangeable = agpc.GPClassifier(kernel=Categorical([0, 1], noise=1e-3), categorical_features=[0, 1],
                                     random_state=0).fit(X, y)
    assert model.log_marginal_likelihood_ > exchangeable.log_marginal_likelihood_ + 1.0


def test_the_default_kernel_lists_the_most_frequent_levels_of_a_column_of_many():
    rng = np.random.default_rng(1)
    many = training_inputs.DEFAULT_LISTED_LEVELS + 10
    X = np.stack([np.repeat(np.arange(many), np.arange(many) + 1), np.zeros(many * (many + 1) // 2)], axis=1)
    X = X[rng.permutation(X.shape[0])]
    levels = training_inputs.listed_levels(X, [0, 1])
    assert levels[0] == [float(v) for v in range(10, many)] and levels[1] == [0.0]  # (the most frequent, sorted)
    weights = np.where(X[:, 0] < 10, 1000.0, 1.0)  # (counted by the rows' weights)
    assert levels != training_inputs.listed_levels(X, [0, 1], weights)


def test_default_priors_are_centred_on_the_default_lengthscale():
    kernel = with_default_priors(Categorical([0, 1, 2, 3], levels=[[0, 1]] * 4), RBF(lengthscales=[1.0] * 4))
    for key in ("log_lengthscales", "log_level_lengthscales"):
        assert kernel.priors[key] == LogNormal(math.log(2.0), DEFAULT_PRIOR_SCALE)


def test_one_shared_scale_keeps_the_level_lengthscales_ratios():
    X, y = decided_by_one_level(n=80)
    kernel = Categorical([0, 1], levels=[[0, 1, 2, 3]] * 2, level_lengthscales=[1.0, 2.0, 3.0, 4.0] * 2, noise=0.01)
    model = agpc.GPClassifier(kernel=kernel, n_inducing=8, max_iter=8, random_state=0, inducing="random",
                              ard=False).fit(X, y)
    learned = np.exp(to_np(model.kernel_.params["log_level_lengthscales"]))
    np.testing.assert_allclose(learned / learned[0], [1.0, 2.0, 3.0, 4.0] * 2, rtol=1e-9)
    assert not np.allclose(learned, [1.0, 2.0, 3.0, 4.0] * 2)


# -- what a review found (each a bug of the first per-level form) ---------------------------------------------------

def test_level_lengthscales_follow_their_levels_given_in_any_order():
    """Levels given unsorted keep the lengthscale given beside them (held sorted); repr shows them as given."""
    kernel = Categorical([0], levels=[[3.0, 1.0]], level_lengthscales=[0.1, 10.0])
    values = np.array([[1.0], [3.0], [7.0]])  # level 1 (l = 10), level 3 (l = 0.1), unlisted 7 (l = 1)
    K = np.asarray(kernel.K(values))
    np.testing.assert_allclose(K[0, 2], math.exp(-(0.01 + 1.0) / 2.0), rtol=1e-14)
    np.testing.assert_allclose(K[1, 2], math.exp(-(100.0 + 1.0) / 2.0), rtol=1e-12)
    assert "levels=[[3.0, 1.0]]" in repr(kernel) and "level_lengthscales=[0.1, 10.0]" in repr(kernel)
    np.testing.assert_array_equal(np.asarray(clone(kernel).K(values)), K)


def test_a_level_too_large_for_a_float_is_one_value_error():
    with pytest.raises(ValueError, match="a level is a finite number"):
        Categorical([0], levels=[[10 ** 400]])
    with pytest.raises(ValueError, match="a level is a finite number"):
        kernel_from_spec({"type": "Categorical", "columns": [0], "levels": [[0, 10 ** 400]]}, {})


def test_levels_are_constructor_parameters_of_both_forms():
    exchangeable = Categorical([0])
    params = exchangeable.get_params()
    assert params["levels"] is None and params["level_lengthscales"] == 1.0
    exchangeable.set_params(levels=[[0, 1]], level_lengthscales=[0.5, 2.0])
    assert exchangeable.levels == ((0.0, 1.0),) and "log_level_lengthscales" in exchangeable.params
    exchangeable.set_params(levels=None, level_lengthscales=1.0)
    assert exchangeable.levels is None and "log_level_lengthscales" not in exchangeable.params
    with pytest.raises(ValueError, match="give levels too"):
        Categorical([0], level_lengthscales=[0.5, 2.0])


def test_levels_given_as_a_tuple_of_lists_are_reported_as_they_were_given():
    levels = ([0.0, 1.0],)
    kernel = Categorical([0], levels=levels, level_lengthscales=[0.5, 2.0])
    levels[0].append(3.0)
    assert kernel.get_params()["levels"] == [[0.0, 1.0]]
    assert clone(kernel).levels == ((0.0, 1.0),)


def test_far_inputs_are_not_clamped_in_categorical_columns():
    """The clamp of far inputs (``kernels.within_reach``) leaves the columns a categorical kernel reads: a code
    far from the inducing points' keeps its own level (and lengthscale); a continuous column is clamped as before."""
    from agpc.kernels import within_reach

    kernel = mixed_kernel(OnColumns(RBF([1.0]), [1]), Categorical([0], levels=[[-9999.0, 1.0, 2.0]]))
    Z = np.array([[1.0, 0.0], [2.0, 0.5]])
    X = np.array([[-9999.0, 1e300], [-5000.0, 0.1]])
    clamped = np.asarray(within_reach(kernel.for_inputs(Z), Z, X))
    np.testing.assert_array_equal(clamped[:, 0], X[:, 0])
    assert clamped[0, 1] == pytest.approx(0.5 + 1e3) and clamped[1, 1] == 0.1


def test_gradients_gathered_in_chunks_of_levels_are_the_same(monkeypatch):
    """The level gradients are gathered LEVEL_CHUNK levels at a time (bounded memory): chunks of 2 give the sums
    one chunk gives."""
    from agpc import kernels as agpc_kernels

    X, Z, W_mm, W_nm, w = gradient_inputs(seed=3)
    kernel = Categorical([1, 3], levels=[[0, 1, 2], [0, 2]], level_lengthscales=[0.5, 1.5, 2.5, 0.7, 3.0]).for_inputs(X)
    whole = kernel.grads(W_mm, W_nm, w, X, Z)["log_level_lengthscales"]
    monkeypatch.setattr(agpc_kernels, "LEVEL_CHUNK", 2)
    chunked = kernel.with_params(kernel.params).grads(W_mm, W_nm, w, X, Z)["log_level_lengthscales"]
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(whole), rtol=1e-13, atol=1e-15)


def test_model_files_of_categorical_kernels_are_version_5_and_older_ones_are_refused(tmp_path):
    """A categorical kernel's lengthscales entered as 1 / l before format version 5: a file of an earlier version
    holding one is refused (it would predict otherwise); files without one keep their version."""
    from agpc import model_file

    model, X = fitted_mixed()
    path, arrays, header_name, header = saved_file(model, tmp_path)
    assert header["version"] == model_file.CATEGORICAL_VERSION == 5
    np.testing.assert_array_equal(model_files.load_model(path).predict_proba(X), model.predict_proba(X))
    for version in (3, 4):
        arrays[header_name] = np.asarray(json.dumps({**header, "version": version}))
        older = tmp_path / f"v{version}.npz"
        np.savez(older, **arrays)
        with pytest.raises(ValueError, match="categorical kernel in a file of format version"):
            model_files.load_model(older)
    plain = agpc.GPClassifier(n_inducing=4, max_iter=2, random_state=0).fit(X[:, [1]], model.predict(X))
    model_files.save_model(plain, tmp_path / "plain.npz")
    with np.load(tmp_path / "plain.npz", allow_pickle=False) as archive:
        assert json.loads(str(archive[header_name]))["version"] == model_file.PLAIN_VERSION


# -- inducing points of "any level" -------------------------------------------------------------------------------------

def any_level_reference(columns, levels, lengthscales, level_lengthscales, amplitude):
    """The per-level form with ``ANY_LEVEL`` codes by its definition: the mean of the kernel over the column's
    listed levels at each "any level" end (both ends: over pairs of them), pair by pair."""
    per_level = iter(level_lengthscales)
    scales = [{level: next(per_level) for level in column} for column in levels]

    def factor(column, own, a, b):
        if a == b:
            return 1.0
        weight = lambda v: 1.0 / column.get(v, own) ** 2  # noqa: E731
        return math.exp(-(weight(a) + weight(b)) / 2.0)

    def k(X, Z):
        out = np.empty((X.shape[0], Z.shape[0]))
        for r, x in enumerate(X):
            for c, z in enumerate(Z):
                value = amplitude
                for j, column, own in zip(columns, scales, lengthscales):
                    A = list(column) if x[j] == ANY_LEVEL else [x[j]]
                    B = list(column) if z[j] == ANY_LEVEL else [z[j]]
                    value *= np.mean([[factor(column, own, a, b) for b in B] for a in A])
                out[r, c] = value
        return out
    return k


def any_level_problem(seed=0, n=9, m=6):
    rng = np.random.default_rng(seed)
    X, Z = coded_rows(rng, n), coded_rows(rng, m)
    Z[:, :2][rng.random((m, 2)) < 0.5] = ANY_LEVEL  # (columns 0 and 1 of Z; the first point takes none)
    Z[0, :2] = [0.0, 2.0]
    X[0, :2] = ANY_LEVEL  # (K(X, Z) of an "any level" row too: a pair of two)
    return X, Z, rng


def coded_rows(rng, n):
    X = rng.normal(size=(n, 3))
    X[:, :2] = rng.integers(-1, 3, size=(n, 2))
    return X


ANY_KERNEL = dict(lengthscales=[0.8, 1.7], amplitude=1.3, noise=0.1, levels=[[0, 1, 2], [0, 2]],
                  level_lengthscales=[0.5, 2.0, 1.1, 0.7, 3.0])


def test_any_level_points_are_the_mean_over_the_listed_levels():
    X, Z, _ = any_level_problem()
    kernel = Categorical([0, 1], **ANY_KERNEL).for_inputs(X)
    reference = any_level_reference([0, 1], ANY_KERNEL["levels"], [0.8, 1.7], ANY_KERNEL["level_lengthscales"], 1.3)
    np.testing.assert_allclose(np.asarray(kernel.K(X, Z)), reference(X, Z), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(kernel.K(Z)), reference(Z, Z), rtol=1e-13)
    assert np.min(np.linalg.eigvalsh(np.asarray(kernel.K(Z)))) > -1e-12


@pytest.mark.parametrize("device", [None, "strict"])
def test_any_level_gradients_by_finite_differences(device):
    """Every parameter's gradient with "any level" codes in Z and in X (K(Z, Z)'s pairs of two among them), against
    central differences; array_api_strict gives NumPy's."""
    from conftest import central_differences

    X, Z, rng = any_level_problem(seed=2)
    W_mm, W_nm, w = rng.normal(size=(6, 6)), rng.normal(size=(9, 6)), rng.normal(size=9)
    kernel = Categorical([0, 1], **ANY_KERNEL).for_inputs(X)

    def objective(k):
        return float(np.sum(W_mm * np.asarray(k.K(Z))) + np.sum(W_nm * np.asarray(k.K(X, Z)))
                     + np.sum(w * np.asarray(k.Kdiag(X))))
    grads = kernel.grads(W_mm, W_nm, w, X, Z)
    for key, stored in kernel.params.items():
        numeric = central_differences(lambda u: objective(kernel.with_params({**kernel.params, key: u})), stored)
        np.testing.assert_allclose(np.asarray(grads[key]), numeric, rtol=1e-6, atol=1e-8, err_msg=key)
    assert np.all(np.asarray(grads["Z"]) == 0.0)
    if device:
        import array_api_strict as xs

        on = {name: xs.asarray(value) for name, value in (("X", X), ("Z", Z), ("W_mm", W_mm), ("W_nm", W_nm),
                                                             ("w", w))}
        strict = kernel.for_inputs(on["X"]).grads(on["W_mm"], on["W_nm"], on["w"], on["X"], on["Z"])
        for key, value in grads.items():
            np.testing.assert_allclose(to_np(strict[key]), np.asarray(value), rtol=1e-12, atol=1e-14, err_msg=key)


def test_with_any_levels_draws_a_share_of_the_categorical_coordinates():
    from agpc.inducing import ANY_LEVEL_FRACTION, with_any_levels

    rng = np.random.default_rng(0)
    Z = rng.normal(size=(400, 4))
    out = with_any_levels(Z, [1, 3], 5, ANY_LEVEL)
    chosen = out == ANY_LEVEL
    assert not chosen[:, [0, 2]].any() and np.array_equal(out[~chosen], Z[~chosen])
    assert abs(chosen[:, [1, 3]].mean() - ANY_LEVEL_FRACTION) < 0.05
    np.testing.assert_array_equal(with_any_levels(Z, [1, 3], 5, ANY_LEVEL), out)  # (the seed's)
    stacked = with_any_levels(np.stack([Z, Z + 1.0]), [1, 3], 5, ANY_LEVEL)  # (one a class: the same pattern)
    np.testing.assert_array_equal(stacked[0] == ANY_LEVEL, chosen)
    np.testing.assert_array_equal(stacked[1] == ANY_LEVEL, chosen)
    assert any_level_columns(mixed_kernel(OnColumns(RBF(), [0]), Categorical([1, 2], levels=[[0], [1]])
                                          + Categorical([2]))) == [1]


def test_choose_inducing_keeps_the_higher_log_z():
    from types import SimpleNamespace

    from agpc.size_rule import INDUCING_CHOICE, choose_inducing

    def learner(results):
        seen = []

        def learn(points, name, fits_after):
            seen.append((points, name, fits_after))
            return results[points], True
        return learn, seen

    fit = lambda log_z, reason="plateau", timed=False: SimpleNamespace(  # noqa: E731
        log_z=log_z, stop_reason=reason, stopped_by_time=timed)
    learn, seen = learner({"rows": fit(-10.0), "any": fit(-5.0)})
    assert choose_inducing(learn, "rows", "any")[0].log_z == -5.0
    assert seen == [("rows", INDUCING_CHOICE[0], 1), ("any", INDUCING_CHOICE[1], 0)]  # (the first knows one follows)
    learn, _ = learner({"rows": fit(-10.0), "any": fit(-12.0)})
    assert choose_inducing(learn, "rows", "any")[0].log_z == -10.0
    learn, seen = learner({"rows": fit(-10.0)})
    assert choose_inducing(learn, "rows", None)[0].log_z == -10.0 and seen == [("rows", "", 0)]
    for reason in ("max_time", "early_stopping"):  # (the first is kept as it is: no second fit)
        learn, seen = learner({"rows": fit(-10.0, reason, reason == "max_time"), "any": fit(0.0)})
        assert choose_inducing(learn, "rows", "any")[0].stop_reason == reason and len(seen) == 1


def test_a_fit_on_tic_tac_toe_chooses_points_of_any_level(tmp_path):
    """tic-tac-toe's class (x has three in a row) is set by three cells at a time: the default fit weighs points of
    any level against points on rows and keeps the higher log Z, here points of any level (by some 70 nats on 400
    of its rows); a fit with a checkpoint file, or on minibatches, makes no choice (its points are on rows). The PMLB file the
    categorical benchmark ships (benchmarks/data/pmlb/README.md)."""
    import gzip

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "pmlb" / "tic_tac_toe" / "tic_tac_toe.tsv.gz"
    with gzip.open(path, "rt") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        table = np.loadtxt(fh, delimiter="\t", ndmin=2)
    target = header.index("target")
    rows = np.random.default_rng(0).permutation(table.shape[0])[:400]
    X, y = np.delete(table[rows], target, axis=1), table[rows, target].astype(int)
    options = dict(categorical_features=list(range(9)), n_inducing=30, random_state=0, max_iter=60)
    chosen = agpc.GPClassifier(**options).fit(X, y)
    on_rows = agpc.GPClassifier(**options, checkpoint_path=tmp_path / "fit.ckpt").fit(X, y)
    assert np.any(np.asarray(chosen.inducing_points_) == ANY_LEVEL)
    assert not np.any(np.asarray(on_rows.inducing_points_) == ANY_LEVEL)
    # (minibatches make no choice: SEP's, ADF's and SVI's last log Z is a running estimate)
    on_minibatches = agpc.GPClassifier(**{**options, "max_iter": 2}, batch_size=100).fit(X, y)
    assert not np.any(np.asarray(on_minibatches.inducing_points_) == ANY_LEVEL)
    assert chosen.log_marginal_likelihood_ > on_rows.log_marginal_likelihood_ + 10.0


def test_with_any_levels_makes_no_point_a_copy_of_another():
    """Three columns of three levels: points made "any level" in most columns would often repeat one another; a
    point that would is left on its row's levels (a copy adds nothing and makes K(Z, Z) singular)."""
    from agpc.inducing import with_any_levels

    rng = np.random.default_rng(1)
    Z = np.unique(rng.integers(0, 3, size=(60, 3)).astype(float), axis=0)[:20]
    out = with_any_levels(Z, [0, 1, 2], 0, ANY_LEVEL)
    assert np.unique(out, axis=0).shape[0] == out.shape[0] == 20
    assert np.any(out == ANY_LEVEL)
    kept = ~np.any(out == ANY_LEVEL, axis=1)
    np.testing.assert_array_equal(out[kept], Z[kept])


def test_choose_inducing_makes_no_second_fit_without_room_for_it():
    from types import SimpleNamespace

    from agpc.size_rule import choose_inducing

    seen = []

    def learn(points, name, fits_after):
        seen.append(points)
        return SimpleNamespace(log_z={"rows": -10.0, "any": 0.0}[points], stop_reason="plateau",
                               stopped_by_time=False), True
    assert choose_inducing(learn, "rows", "any", has_room=lambda: False)[0].log_z == -10.0 and seen == ["rows"]


def test_a_second_training_on_data_parallel_rounds_removes_the_first_ones_site_files(tmp_path):
    from types import SimpleNamespace

    from agpc.inference.data_parallel import DataParallel

    rounds = SimpleNamespace(site_directory=tmp_path, site_root=None)
    DataParallel.make_site_root(rounds)
    first = rounds.site_root
    DataParallel.make_site_root(rounds)
    assert rounds.site_root != first and [p.name for p in tmp_path.iterdir()] == [Path(rounds.site_root).name]


def test_any_level_points_only_where_no_other_term_reads_the_column():
    assert any_level_columns(RBF() + Categorical([1], levels=[[0, 1]])) == []  # (an RBF of every column)
    assert any_level_columns(OnColumns(Linear(), [0]) + Categorical([1], levels=[[0, 1]])) == [1]
    assert any_level_columns(OnColumns(RBF(), [1]) + Categorical([1], levels=[[0, 1]])) == []
    assert any_level_columns(Categorical([1])) == []  # (the exchangeable form has no "any level")


def test_an_unlisted_value_against_an_any_level_point_keeps_finite_gradients_at_a_tiny_column_lengthscale():
    """h(a) = v_a S for a value the column does not list underflows to 0 at a short column lengthscale: its log and
    the gradient's v / h (1 / S) are taken without forming it."""
    kernel = Categorical([0], lengthscales=0.02, levels=[[0, 1, 2]])
    X, Z = np.array([[5.0], [1.0], [0.0]]), np.array([[ANY_LEVEL], [1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        K = np.asarray(kernel.K(X, Z))
        grads = kernel.grads(np.ones((2, 2)), np.ones((3, 2)), None, X, Z)
    assert K[0, 0] == 0.0 and np.all(np.isfinite(K))
    assert all(np.all(np.isfinite(np.asarray(value))) for value in grads.values())


def test_a_categorical_column_holding_the_any_level_code_is_refused():
    X = np.array([[0.0, 1.0], [1.0, ANY_LEVEL], [2.0, 0.0], [1.0, 1.0]] * 5)
    with pytest.raises(ValueError, match="X column 1 .categorical. holds .* 'any level'"):
        agpc.GPClassifier(categorical_features=[1], max_iter=2).fit(X, np.arange(20) % 2)


@pytest.mark.parametrize("any_level", [False, True])
@pytest.mark.parametrize("device", [None, "strict"])
def test_columns_taken_by_the_one_hot_product_give_the_definition_and_its_gradients(monkeypatch, device, any_level):
    """Columns whose values are all listed levels are taken by products of one-hot matrices (``_one_hot``), the
    others (an unlisted value, more than ONE_HOT_MAX_LEVELS levels) one at a time: both together give the kernel of its
    definition pair by pair, "any level" codes among them, and the gradients of central differences; equal rows of
    levels are correlated exactly the amplitude; array_api_strict gives NumPy's."""
    from agpc import kernels as agpc_kernels
    from conftest import central_differences

    monkeypatch.setattr(agpc_kernels, "ONE_HOT_MAX_LEVELS", 3)
    rng = np.random.default_rng(7)
    levels = [[0, 1, 2], [0, 2], [0, 1, 2, 3]]
    given = dict(lengthscales=[0.8, 1.7, 1.2], amplitude=1.3, noise=0.1, levels=levels,
                 level_lengthscales=[0.5, 2.0, 1.1, 0.7, 3.0, 0.9, 1.4, 0.6, 2.2])
    X, Z = rng.integers(0, 3, size=(9, 3)).astype(float), rng.integers(0, 3, size=(6, 3)).astype(float)
    X[:, 1], Z[:, 1] = 2.0 * rng.integers(0, 2, size=9), 2.0 * rng.integers(0, 2, size=6)
    X[4, 1] = 5.0  # column 1: one unlisted value among the rows; column 2: 4 levels, past the chunk of 3
    if any_level:  # "any level" codes in the columns taken by the product: pairs of one and of two
        Z[[1, 3], 0], Z[2, 1], X[0, 0] = ANY_LEVEL, ANY_LEVEL, ANY_LEVEL
    kernel = Categorical([0, 1, 2], **given).for_inputs(X)
    assert kernel._one_hot(X, Z).taken == [0] and kernel._one_hot(Z, Z).taken == [0, 1]
    assert (kernel._one_hot(X, Z).any_A is None) == (not any_level)
    reference = any_level_reference([0, 1, 2], levels, given["lengthscales"], given["level_lengthscales"], 1.3)
    np.testing.assert_allclose(np.asarray(kernel.K(X, Z)), reference(X, Z), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(kernel.K(Z)), reference(Z, Z), rtol=1e-13)
    if not any_level:
        assert np.all(np.diag(np.asarray(kernel.K(X))) == np.float64(1.3))
    W_mm, W_nm, w = rng.normal(size=(6, 6)), rng.normal(size=(9, 6)), rng.normal(size=9)

    def objective(k):
        return float(np.sum(W_mm * np.asarray(k.K(Z))) + np.sum(W_nm * np.asarray(k.K(X, Z))))
    grads = kernel.grads(W_mm, W_nm, w, X, Z)
    for key in ("log_lengthscales", "log_level_lengthscales"):
        numeric = central_differences(lambda u: objective(kernel.with_params({**kernel.params, key: u})),
                                      kernel.params[key])
        np.testing.assert_allclose(np.asarray(grads[key]), numeric, rtol=1e-6, atol=1e-8, err_msg=key)
    if device:
        import array_api_strict as xs

        on = [xs.asarray(a) for a in (X, Z, W_mm, W_nm, w)]
        strict = kernel.for_inputs(on[0])
        np.testing.assert_allclose(to_np(strict.K(on[0], on[1])), reference(X, Z), rtol=1e-13)
        for key, value in strict.grads(on[2], on[3], on[4], on[0], on[1]).items():
            np.testing.assert_allclose(to_np(value), np.asarray(grads[key]), rtol=1e-12, atol=1e-14, err_msg=key)


def test_tied_parameters_counts_what_lengthscales_per_feature_free_on_the_rows():
    from agpc.kernels import tied_parameters

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5))
    X[:, 1], X[:, 3] = rng.integers(0, 4, size=40), rng.integers(0, 3, size=40)
    assert tied_parameters(RBF([1.0] * 5).for_inputs(X), X) == 4
    assert tied_parameters(Categorical([1, 3]), X) == 1  # (exchangeable: a scale a column)
    # per level: the weights the rows read, the listed levels they hold (4 + 2; level 9 is listed but absent) and
    # column 3's own lengthscale (its value 2 is not listed), less one a parameter tied (levels, columns' own)
    per_level = Categorical([1, 3], levels=[[0, 1, 2, 3, 9], [0, 1]])
    assert tied_parameters(per_level, X) == (4 + 2 + 1) - 2
    # a column of two values reads its two weights only as their sum; one of one value reads none
    binary = np.column_stack([rng.integers(0, 2, size=(40, 3)), np.zeros(40)])
    assert tied_parameters(training_inputs.default_kernel(binary, categorical=[0, 1, 2, 3]), binary) == 3 - 1
    # the default mixed kernel: an RBF of the 3 continuous columns and the categorical kernel, each in its sum and its
    # product: 2 (3 - 1) + 2 ((4 + 3) - 1)
    mixed = training_inputs.default_kernel(X, categorical=[1, 3])
    assert tied_parameters(mixed, X) == 2 * 2 + 2 * 6
    # a kernel of some columns counts its own columns' rows
    assert tied_parameters(OnColumns(Categorical([0], levels=[[0, 1, 2, 3]]), [1]), X) == 3


def test_the_exact_model_of_categorical_columns_chooses_its_lengthscales_above_the_row_limit(monkeypatch):
    """Past ``ARD_CHOICE_MAX_ROWS`` the exact model of a continuous table learns a lengthscale per feature, and that
    of a table with categorical columns weighs one shared scale against them, charging what they free."""
    from agpc import size_rule
    from agpc.kernels import tied_parameters

    seen = []
    learn = size_rule.learn_lengthscales
    monkeypatch.setattr(size_rule, "learn_lengthscales", lambda plan, freed, *rest, **named: (
        seen.append((plan, freed)), learn(plan, freed, *rest, **named))[1])
    rng = np.random.default_rng(1)
    n = size_rule.ARD_CHOICE_MAX_ROWS + 40
    X = rng.normal(size=(n, 3))
    X[:, 2] = rng.integers(0, 5, size=n)
    y = (X[:, 0] + (X[:, 2] == 1) > 0.5).astype(int)
    options = dict(max_iter=3, random_state=0)
    agpc.GPClassifier(categorical_features=None, **options).fit(X, y)
    model = agpc.GPClassifier(categorical_features=[2], **options).fit(X, y)
    start = training_inputs.default_kernel(X, categorical=[2])
    assert seen == [(True, 2), (size_rule.CHOOSE_TO_LINEAR, tied_parameters(start, X))]
    assert seen[1][1] == 2 * 1 + 2 * 4 and isinstance(model.ard_, bool)


@pytest.mark.parametrize("any_level", [False, True])
def test_level_gradients_of_the_product_keep_the_small_terms_of_short_lengthscales_in_float32(any_level):
    """A level of short lengthscale (0.25: pairs that differ there carry K ~ e^-8 of the pairs that do not): its
    gradient by the products in float32 is float64's a column at a time, to float32's precision, sign included."""
    rng = np.random.default_rng(3)
    n, m = 400, 50
    X, Z = rng.integers(0, 3, size=(n, 2)).astype(float), rng.integers(0, 3, size=(m, 2)).astype(float)
    if any_level:
        Z[::5, 1] = ANY_LEVEL
    kernel = Categorical([0, 1], levels=[[0, 1, 2], [0, 1, 2]], level_lengthscales=[0.25, 1.0, 2.0, 1.5, 0.8, 1.2])
    W_mm, W_nm = rng.normal(size=(m, m)), rng.normal(size=(n, m))
    reference = kernel.for_inputs(X).with_params(kernel.for_inputs(X).params)
    reference._one_hot = lambda A, B: None  # (float64, a column at a time: the pairs that differ summed alone)
    expected = reference.grads(W_mm, W_nm, None, X, Z)["log_level_lengthscales"]
    f32 = [a.astype(np.float32) for a in (X, Z, W_mm, W_nm)]
    single = kernel.for_inputs(f32[0])
    assert single._one_hot(f32[0], f32[1]).taken == [0, 1]
    got = single.grads(f32[2], f32[3], None, f32[0], f32[1])["log_level_lengthscales"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6 * np.max(np.abs(expected)))


def test_a_level_weight_past_the_float_range_is_left_to_the_columns_own_path():
    """A level lengthscale so short that 1 / l^2 is inf (0 x inf in the products would be NaN): that column is
    computed a column at a time, K is the definition's (0 between that level and another) and the gradients finite."""
    kernel = Categorical([0, 1], levels=[[0, 1], [0, 1]], level_lengthscales=[1e-200, 1.0, 1.0, 2.0])
    X = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    with np.errstate(over="ignore"):  # (1 / l^2 = inf is the case)
        assert kernel._one_hot(X, X).taken == [1]
        K = np.asarray(kernel.K(X))
        grads = kernel.grads(np.ones((3, 3)), np.ones((3, 3)), None, X, X)
    assert np.all(np.isfinite(K)) and K[0, 1] == 0.0 and K[1, 2] == pytest.approx(math.exp(-(1.0 + 0.25) / 2.0))
    # that level's gradient is the limit of w e^(-w / 2), 0, not 0 x inf
    assert np.all(np.isfinite(grads["log_level_lengthscales"])) and grads["log_level_lengthscales"][0] == 0.0


def test_the_products_read_the_columns_a_chunk_within_the_room_at_a_time(monkeypatch):
    """The gate reads the columns' indicators a chunk at a time, each chunk within the levels there is room for
    (its n x L temporaries bounded as the products' are), in order: a column past the room left is skipped and a
    later smaller one taken; a column with a value it does not list is not taken and leaves the room as it was."""
    few, small = list(range(16)), [0.0, 1.0, 2.0]
    kernel = Categorical([0, 1, 2, 3], levels=[few, few, small, small])
    X = np.zeros((4, 4))
    X[0, 2] = 7.0  # (not a level column 2 lists)
    Z = np.zeros((10, 4))  # (room for max(2 x 10, 16) = 20 levels)
    chunks = []
    read = Categorical._one_hot_columns

    def spy(self, A, B, chunk, table):
        chunks.append(sum(table[i][0].shape[0] for i in chunk))
        return read(self, A, B, chunk, table)

    monkeypatch.setattr(Categorical, "_one_hot_columns", spy)
    assert kernel._one_hot(X, Z).taken == [0, 3]
    assert chunks == [16, 3, 3]


def test_the_gate_runs_on_a_second_device_with_older_array_api_strict(monkeypatch):
    """array_api_strict before 2.6 makes ``cumulative_sum(..., include_initial=True)``'s leading zeros on the default
    device (a concat across devices then fails): the gate makes its own zeros on the rows' device, and its taken
    columns and K on device1 are NumPy's, with that older behaviour put in place."""
    import array_api_strict as strict

    running_sum = strict.cumulative_sum

    def older(x, /, *, axis=None, dtype=None, include_initial=False):
        out = running_sum(x, axis=axis, dtype=dtype)
        if not include_initial:
            return out
        return strict.concat([strict.zeros((x.shape[0], 1), dtype=out.dtype), out], axis=1)  # (default device)

    monkeypatch.setattr(strict, "cumulative_sum", older)
    kernel = Categorical([0, 1], levels=[[0.0, 1.0, 2.0], [0.0, 1.0]])
    X = np.array([[0.0, 1.0], [2.0, 0.0], [1.0, 1.0], [ANY_LEVEL, 0.0]])
    Z = np.array([[1.0, 0.0], [2.0, ANY_LEVEL]])
    device = strict.Device("device1")
    Xs, Zs = (strict.asarray(a, device=device) for a in (X, Z))
    strict_kernel = kernel.for_inputs(Xs)
    assert strict_kernel._one_hot(Xs, Zs).taken == kernel._one_hot(X, Z).taken == [0, 1]
    K = strict_kernel.K(Xs, Zs)
    assert K.device == device
    np.testing.assert_allclose(to_np(K), kernel.K(X, Z), rtol=1e-12)


def test_the_any_level_code_is_not_a_level_a_column_can_list():
    with pytest.raises(ValueError, match="ANY_LEVEL"):
        Categorical([0], levels=[[ANY_LEVEL, 0, 1]])


def test_the_products_take_columns_while_their_levels_fit_beside_k():
    """A column of more than ONE_HOT_MAX_LEVELS levels, and columns past max(2 m, ONE_HOT_MAX_LEVELS) levels in all,
    are left to a column at a time (the products' temporaries are about 5 L a row)."""
    from agpc.kernels import ONE_HOT_MAX_LEVELS

    many, few = list(range(ONE_HOT_MAX_LEVELS + 1)), list(range(ONE_HOT_MAX_LEVELS))
    kernel = Categorical([0, 1, 2, 3], levels=[many, few, few, few])
    X = np.zeros((4, 4))
    assert kernel._one_hot(X, X).taken == [1]  # (room for max(2 x 4, 16) = 16 levels: the first column of 16)
    Z = np.zeros((20, 4))
    assert kernel._one_hot(X, Z).taken == [1, 2]  # (40 levels: two columns of 16)
