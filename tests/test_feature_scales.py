"""Features on awkward scales: a narrower dtype that would erase a column's variation is refused before the
conversion, and the default kernel, k-means and Rprop's first steps follow features on extreme scales
(their standard deviations are taken without overflow or underflow)."""

import warnings

import array_api_strict
import numpy as np
import pytest

from pathlib import Path

from agpc import GPClassifier
from agpc.backend import few_rows_set_spread, moments_without_extremes, scaled_std, to_numpy
from agpc.datasets import make_banana
from agpc.inducing import kmeans
from agpc.inference.contract import inducing_spread
from agpc.inference.engines import initial_steps
from agpc.kernels import RBF
from agpc.inputs import column_scales, outlier_scales, start_inducing_points, typical_rows


def _data(n=150):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    return X, X[:, 0] > 0


def _small(**kw):
    return GPClassifier(n_inducing=8, max_iter=5, random_state=0, **kw)


@pytest.mark.parametrize("as_input", [
    lambda X: X, lambda X: X.tolist(), lambda X: array_api_strict.asarray(X),
], ids=["numpy", "list", "array-api-strict"])
def test_float32_refuses_features_whose_spread_it_cannot_resolve(as_input):
    X, y = _data()
    X = X + 1e7  # float32's spacing at 1e7 is 1: the columns' spread of 1 would be round-off
    with pytest.raises(ValueError) as error:
        _small(dtype="float32").fit(as_input(X), y)
    message = str(error.value)
    assert "column 0" in message and "column 1" in message and "1e+07" in message
    assert "standardise" in message and "dtype='float64'" in message


def test_float32_refuses_on_disk_features_from_a_sample_of_rows(tmp_path):
    X, y = _data()
    on_disk = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=np.float64, shape=X.shape)
    on_disk[:] = X + 1e7
    on_disk.flush()
    with pytest.raises(ValueError, match="lose the variation"):
        _small(dtype="float32").fit(np.load(tmp_path / "X.npy", mmap_mode="r"), y)


def test_float32_names_only_the_columns_it_cannot_resolve():
    X, y = _data()
    X = np.column_stack([X, np.full(X.shape[0], 1e7), X[:, 1] + 1e9])  # a constant column loses nothing
    with pytest.raises(ValueError) as error:
        _small(dtype="float32").fit(X, y)
    assert "column 3" in str(error.value)
    assert "column 0" not in str(error.value) and "column 2" not in str(error.value)


def test_float32_fits_centred_features_and_float64_fits_the_offset_ones():
    X, y = _data()
    centred = _small(dtype="float32").fit(X, y).score(X, y)
    offset = _small(dtype="float64").fit(X + 1e7, y).score(X + 1e7, y)
    assert centred > 0.9 and offset > 0.9


def test_float32_refuses_values_too_large_for_it_without_a_runtime_warning():
    X, y = _data()
    with pytest.raises(ValueError, match="too large for float32"):
        _small(dtype="float32").fit(X * 1e39, y)


@pytest.mark.parametrize("scale", [1e-300, 1e-20, 1e154, 1e300])
def test_scaled_std_is_the_standard_deviation_without_overflow_or_underflow(scale):
    X, _ = _data()
    expected = np.std(X, axis=0) * scale  # std(s X) = s std(X), with std(X) computed on unit-scale data
    np.testing.assert_allclose(scaled_std(X * scale, axis=0), expected, rtol=1e-12)
    spread, magnitude = column_scales(X * scale)
    np.testing.assert_allclose(spread, expected, rtol=1e-12)
    np.testing.assert_allclose(magnitude, np.max(np.abs(X), axis=0) * scale, rtol=1e-15)


def test_scaled_std_of_a_constant_or_zero_column_is_zero():
    X = np.column_stack([np.zeros(5), np.full(5, 3.0)])
    np.testing.assert_array_equal(scaled_std(X, axis=0), [0.0, 0.0])


@pytest.mark.parametrize("dtype, scale", [("float64", 1e-300), ("float32", 1e-30), ("float32", 1e-20),
                                          ("float64", 1e154), ("float32", 1e20)])
def test_default_kernel_kmeans_and_first_steps_follow_the_scale_of_the_features(dtype, scale):
    X, _ = _data()
    unit = X.astype(dtype)
    scaled = (X * scale).astype(dtype)
    rtol = 1e3 * float(np.finfo(dtype).eps)
    kernel_unit, kernel_scaled = GPClassifier._default_kernel(unit), GPClassifier._default_kernel(scaled)
    np.testing.assert_allclose(np.exp(kernel_scaled.params["log_lengthscales"]) / scale,
                               np.exp(kernel_unit.params["log_lengthscales"]), rtol=rtol)
    Z_unit, Z_scaled = kmeans(unit, 8, random_state=0), kmeans(scaled, 8, random_state=0)
    np.testing.assert_allclose(Z_scaled / scale, Z_unit, rtol=rtol, atol=rtol)
    steps_unit = initial_steps(RBF().for_inputs(unit), Z_unit, ["Z"])["Z"]
    steps_scaled = initial_steps(RBF().for_inputs(scaled), Z_scaled, ["Z"])["Z"]
    np.testing.assert_allclose(steps_scaled / scale, steps_unit, rtol=rtol)


@pytest.mark.parametrize("dtype, scale", [("float64", 1e-300), ("float32", 1e-30), ("float64", 1e154), ("float64", 1e300),
                                          ("float32", 1e20)])
def test_ep_fits_features_on_extreme_scales_as_on_unit_ones(dtype, scale):
    X, y = _data()
    unit = _small(dtype=dtype).fit(X, y).score(X, y)
    scaled = _small(dtype=dtype).fit(X * scale, y).score(X * scale, y)
    assert unit > 0.9
    assert abs(scaled - unit) <= 0.02


@pytest.mark.parametrize("kernel", ["linear", "Matern52", "multiclass"])
def test_far_rows_read_from_disk_predict_as_the_same_rows_in_memory(tmp_path, kernel):
    """A hostile-input audit (2026-12-02): rows of 1e300 read from disk (a memmap, a zarr array) gave NaN
    probabilities with NumPy's overflow warnings (a linear kernel's, a Matern's), where the same rows in memory are
    held within the kernel's reach and predicted (``kernels.within_reach``, now for each block read from disk:
    ``kernels.RowsWithinReach``); ``agpc predict`` wrote NaN with exit status 0."""
    import agpc

    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = (X[:, 0] + 0.3 * X[:, 1] + 0.3 * rng.normal(size=200) > 0).astype(int)
    if kernel == "linear":  # (``ard="auto"`` takes the linear kernel on these rows)
        model = GPClassifier(max_iter=5, random_state=0).fit(X, y)
        assert type(model.kernel_).__name__ == "Linear"
    elif kernel == "Matern52":
        model = GPClassifier(kernel=agpc.Matern52(), n_inducing=8, max_iter=3, random_state=0).fit(X, y)
    else:
        model = GPClassifier(n_inducing=8, max_iter=3, random_state=0).fit(X, y + (X[:, 1] > 1))
    far = np.array([[1e300, -1e300], [1e200, 1e200], [-1e300, 3.0], [0.1, 0.2]])
    np.save(tmp_path / "far.npy", far)
    stored = zarr.open_array(str(tmp_path / "far.zarr"), mode="w", shape=far.shape, dtype="f8", chunks=(3, 2))
    stored[:] = far
    expected = model.predict_proba(far)
    assert np.all(np.isfinite(expected))
    for rows in (np.load(tmp_path / "far.npy", mmap_mode="r"), stored):
        np.testing.assert_allclose(model.predict_proba(rows), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method", ["ep", "svi", "vi-jj", "gfitc"])
def test_prediction_far_beyond_the_data_is_the_prior_without_overflow(method):
    """At X * 1e300 every kernel value is 0: the prediction is the prior's (latent mean 0), and the squared
    distances of such points, which overflowed ("overflow encountered in vecdot"), are not formed. Points
    within reach of the inducing points predict exactly as before."""
    from agpc import threads
    from agpc.inference import ep

    X, y = _data()
    model = _small(method=method).fit(X, y)
    mean, variance = model.predict_latent(X * 1e300)  # a RuntimeWarning here fails the test (pyproject)
    np.testing.assert_array_equal(mean, 0.0)
    np.testing.assert_allclose(variance, float(model.kernel_.amplitude) + float(model.kernel_.noise), rtol=1e-12)
    within = model.predict_latent(X)
    Z = model.inducing_points_
    # at the BLAS thread count the model's prediction chose (agpc.prediction): on OpenBLAS's Haswell kernel two
    # threads and one give products that differ in their last bits (1-67 ulp of the variance on an AMD EPYC)
    with threads.blas_threads(X.shape[0], Z.shape[-2], n_features=Z.shape[-1]):
        direct = ep.predict_latent(model.kernel_, Z, model.posterior_, X)
    np.testing.assert_array_equal(within[0], direct[0])
    np.testing.assert_array_equal(within[1], direct[1])


@pytest.mark.parametrize("value", [1.7e308, -1.7e308])
@pytest.mark.parametrize("method", ["ep", "svi"])
def test_a_row_at_the_largest_float_is_fitted_and_predicted_without_overflow(method, value):
    """The audit: one training row at 1.7e308 (k-means gives it an inducing point of its own) overflowed the
    prediction's reach, max(Z) + reach ("overflow encountered in add", NumPy's warning only). Now the rows, that one
    included, are predicted without a RuntimeWarning (pyproject makes one from agpc fail the test) and finite; the
    column's spread is that row's, so its lengthscale is too (the feature is read at that scale)."""
    X, y = _data()
    X[3, 1] = value
    model = _small(method=method).fit(X, y)
    assert np.max(np.abs(model.inducing_points_[:, 1])) > 0.5 * np.finfo(np.float64).max  # (the case: a point there)
    proba = model.predict_proba(X)
    assert np.all(np.isfinite(proba)) and model.score(np.delete(X, 3, axis=0), np.delete(y, 3)) > 0.8


def test_a_constant_column_of_any_value_changes_nothing():
    """A hostile-input audit (2026-12-02): a constant column of 1e23 beside banana's two failed the default fit with a
    CholeskyError on K(Z, Z) at every jitter. The kernel centres its inputs on the inducing points' mean, and the
    plain mean of 400 copies of 1e23 is one ulp off (1e23 + 1.7e7): every row then sat 1.7e7 from the centre, whose
    squares' round-off broke K. The default kernel now scales a constant column by its magnitude (the column adds
    nothing to a distance at any lengthscale), so the model is the same whatever its value."""
    from agpc.datasets import make_banana

    X, y = make_banana(400, random_state=0)
    probabilities = {}
    for value in (1.0, 1e23, 1e300, -3e250):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            model = GPClassifier(random_state=0, max_iter=10).fit(np.column_stack([X, np.full(400, value)]), y)
        probabilities[value] = model.predict_proba(np.column_stack([X, np.full(400, value)]))
    for value, p in probabilities.items():
        np.testing.assert_allclose(p, probabilities[1.0], rtol=1e-12, atol=1e-14, err_msg=f"constant {value}")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("namespace", ["numpy", "array_api_strict"])
def test_integer_features_whose_variation_the_float_type_cannot_hold_are_refused(dtype, namespace):
    """An estimator-API audit (2026-12-02): int64 features beyond 2^53 (an identifier, a time stamp in ns) were
    converted to float64 unchecked, and 2**60 + i (i < 128) became one number: a perfectly separable set fitted a
    chance-level model (accuracy 0.5), with nothing said; and the float32 check looked at the float64 copy, whose
    column was already constant. The spread is now taken of the integers themselves; columns it can hold fit."""
    xp = np if namespace == "numpy" else pytest.importorskip("array_api_strict")
    rows = np.arange(120)
    y = (rows >= 60).astype(int)
    X = (2 ** 60 + rows).reshape(-1, 1).astype(np.int64)
    with pytest.raises(ValueError, match=rf"X in {dtype} would lose the variation of its features \(column 0"):
        _small(dtype=dtype).fit(xp.asarray(X), xp.asarray(y))
    held = np.column_stack([rows - 60, 2 ** 20 + rows * 1000])  # (int64 the float type holds well enough)
    assert _small(dtype=dtype).fit(xp.asarray(held), xp.asarray(y)).score(xp.asarray(held), xp.asarray(y)) > 0.9


@pytest.mark.parametrize("params", [dict(method="svi"), dict(method="svi", batch_size=100),
                                    dict(method="sep", batch_size=100), dict(method="ep", batch_size=100),
                                    dict(method="adf", batch_size=100), dict(method="ep", optimizer="adam"),
                                    dict(method="vi-jj"), dict(method="vi-taylor")],
                         ids=["svi-adam", "svi-minibatch", "sep-adadelta", "ep-adadelta", "adf-adadelta", "ep-adam",
                              "vi-jj-lbfgsb", "vi-taylor-lbfgsb"])
@pytest.mark.parametrize("scale", [1e-3, 1e3, 1e-200])
def test_adam_adadelta_and_lbfgsb_move_the_inducing_points_in_the_features_scale(params, scale):
    """Adam's, Adadelta's and L-BFGS-B's steps of Z are in units of its spread (``optim.Adam.steps_in_units``,
    ``optim.lbfgsb_ascent``'s units): the same fit on features times 1e-3, 1e3 or 1e-200 as on the unit scale.
    Stepped in absolute terms, SVI's points on make_banana times 1e-3 left the data (21 times its range, test accuracy
    0.49 against 0.867), times 1e3 hardly moved, and vi-JJ / vi-Taylor on features times 1e-200 diverged at their
    first step (L-BFGS-B's first step, of unit length, put Z 1e200 lengthscales away)."""
    from agpc.datasets import make_banana

    X, y = make_banana(400, random_state=0)
    X_test, y_test = make_banana(400, random_state=1)

    def fit(s):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = GPClassifier(n_inducing=15, max_iter=40, random_state=0, **params).fit(X * s, y)
        return clf, clf.score(X_test * s, y_test)

    unit, unit_score = fit(1.0)
    scaled, scaled_score = fit(scale)
    assert unit_score > 0.8
    assert abs(scaled_score - unit_score) <= 0.01
    # the same path, in the features' units (the steps' round-off apart)
    np.testing.assert_allclose(scaled.inducing_points_ / scale, unit.inducing_points_, rtol=1e-6, atol=1e-6)


def test_kmeans_clusters_each_column_in_its_own_deviation():
    """k-means clusters in each column's standard deviation (the default kernel's metric at the start), so scaling
    one column scales the points' column and moves nothing else: on unscaled airline features, clustering in one
    scalar's units followed distance and departure time and left day-of-week's points at 0.17 of its deviation (and
    SVI's test NLL 0.015 worse once the points moved in units of their spread, the engine's unit of Z's steps)."""
    X, _ = _data(400)
    stretch = np.array([1e-3, 1e3])
    Z, Z_stretched = kmeans(X, 8, random_state=0), kmeans(X * stretch, 8, random_state=0)
    np.testing.assert_allclose(Z_stretched / stretch, Z, rtol=1e-10, atol=1e-12)
    constant = np.column_stack([X, np.full(len(X), 1e23)])  # (a constant column: its points at its value)
    assert np.all(kmeans(constant, 8, random_state=0)[:, -1] == 1e23)
    np.testing.assert_allclose(kmeans(constant, 8, random_state=0)[:, :2], Z, rtol=1e-10, atol=1e-12)


# -- a few extreme values: the default kernel, the inducing points and their steps follow the other rows ----------

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _banana_nll(X, y, Xte, yte, dtype="float64"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = GPClassifier(n_inducing=20, random_state=0, dtype=dtype).fit(X, y)
    p = np.asarray(model.predict_proba(Xte))[:, 1]
    return -np.mean(np.log(np.where(yte == model.classes_[1], p, 1.0 - p))), [str(w.message) for w in caught]


@pytest.mark.parametrize("value, dtype", [(1e4, "float64"), (1e8, "float64"), (1e6, "float32")])
def test_one_extreme_value_neither_drops_its_feature_nor_breaks_the_fit(value, dtype):
    """One value of 1e4 in a feature within +-3 set its deviation (~220 times the other rows'): the default
    lengthscale started there, the fit dropped the feature (banana's test NLL 0.30 -> 0.52) and said nothing; at 1e8
    the inducing point k-means put on that row centred K(Z, Z)'s distances far from the others and the fit
    diverged at its first step; in float32 at 1e6, a batch pass's blocks centred on their own mean (``kernels``'
    ``_centre``) lost K(Z, X) to round-off and the fit ended at chance. The other rows' spread sets the start now,
    and a warning names the column."""
    X, y = make_banana(1500, random_state=0)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    X, y, Xte, yte = X[:800], y[:800], X[800:], y[800:]
    clean, said = _banana_nll(X, y, Xte, yte)
    assert not any("extreme values" in message for message in said)
    X = X.copy()
    X[0, 0] = value
    nll, said = _banana_nll(X, y, Xte, yte, dtype)
    assert nll <= clean + 0.01, (nll, clean)
    warned = [message for message in said if "extreme values" in message]
    assert len(warned) == 1 and "column 0:" in warned[0] and "column 1" not in warned[0]


@pytest.mark.parametrize("namespace", ["numpy", "array-api-strict"])
@pytest.mark.parametrize("weighted", [False, True])
def test_moments_without_extremes_are_those_of_the_rows_less_the_extreme_ones(namespace, weighted):
    rng = np.random.default_rng(1)
    scales = np.array([1.0, 1e-200, 1e200])  # (computed without underflow or overflow; the reference on unit scale)
    X = rng.normal(size=(250, 3)) * scales
    X[[7, 90], 0] = [40.0, -55.0]  # 250 rows: two left out a column (the two farthest from its mean)
    counts = rng.integers(1, 4, size=250) if weighted else np.ones(250, dtype=np.int64)
    counts[7] = 40 if weighted else 1  # a heavy row: its weight counts as that many rows, some of them left out
    expected_mean, expected_std = [], []
    for j in range(3):  # weights count rows: the reference repeats each row by its count
        column = np.repeat(X[:, j] / scales[j], counts)
        farthest = np.argsort(-((column - np.mean(column)) ** 2), kind="stable")[:max(1, column.size // 100)]
        kept = np.delete(column, farthest)
        expected_mean.append(np.mean(kept) * scales[j])
        expected_std.append(np.std(kept) * scales[j])
    given = X if namespace == "numpy" else array_api_strict.asarray(X, device=array_api_strict.Device("device1"))
    weights = None if not weighted else (counts.astype(float) if namespace == "numpy" else array_api_strict.asarray(
        counts.astype(float), device=array_api_strict.Device("device1")))
    centre, spread = moments_without_extremes(given, weights)
    np.testing.assert_allclose(to_numpy(centre), expected_mean, rtol=1e-10, atol=0)
    np.testing.assert_allclose(to_numpy(spread), expected_std, rtol=1e-10)
    assert few_rows_set_spread(scaled_std(X, axis=0), to_numpy(spread)).tolist() == [False, False, False]
    X[7, 0] = 1e5
    assert few_rows_set_spread(scaled_std(X, axis=0), to_numpy(moments_without_extremes(X)[1])).tolist() == [
        True, False, False]


def test_the_outlier_warning_names_the_feature_and_fewer_than_ten_rows_never_set_it_off():
    pandas = pytest.importorskip("pandas")
    X, y = make_banana(400, random_state=0)
    X[0, 1] = 1e6
    with pytest.warns(UserWarning, match=r"column 1 \('beta'\): 4\.\d+e\+04 where its other rows' is 0\.\d+"):
        GPClassifier(n_inducing=10, max_iter=3, random_state=0).fit(pandas.DataFrame(X, columns=["alpha", "beta"]), y)
    # three normal draws set the rule off one time in twenty (one left out of three leaves a spread of nothing)
    assert not outlier_scales(np.array([[-1.2], [0.31], [0.32]])).dominated[0]
    assert not outlier_scales(np.array([[0.0], [1.0], [2.0], [1.0], [1e6]])).dominated[0]
    assert outlier_scales(np.concatenate([np.linspace(-1.0, 1.0, 9), [1e6]])[:, None]).dominated[0]


def test_a_record_repeated_over_many_rows_is_no_outlier():
    """A fit's start merges equal rows into one with their count (``inducing.start_rows``): a record of -999 on a
    third of the rows (a fill for missing values) was one row of the 1% left out, so it set the features' deviation
    "by a few rows": the warning said so and no inducing point went near those rows (their NLL 0.69 against 0.41).
    Weights count rows, as the row repeated."""
    X, y = make_banana(600, random_state=0)
    X[:200] = -999.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = GPClassifier(n_inducing=20, max_iter=5, random_state=0).fit(X, y)
    assert not any("extreme values" in str(w.message) for w in caught)
    assert np.min(np.asarray(model.inducing_points_)) < -900.0  # (points on the repeated record too)


def test_inducing_points_start_off_the_extreme_rows_and_step_in_the_others_spread():
    X, _ = make_banana(600, random_state=0)
    X[3] = [1e6, 0.0]
    typical = typical_rows(X)
    assert 3 not in typical and typical.shape[0] == 599
    Z = np.asarray(start_inducing_points(X, 20, "kmeans", [], random_state=0))
    assert np.max(np.abs(Z)) < 10.0
    Z[0] = [1e6, 0.0]  # a point on the outlier, as a user's array may have it
    unit = to_numpy(inducing_spread(Z))[0]
    np.testing.assert_allclose(unit, np.std(Z[1:], axis=0), rtol=0.3)
    assert to_numpy(initial_steps(RBF([1.0, 1.0]), Z, ["Z"])["Z"])[0, 0] < 0.1


def test_no_column_of_the_shared_data_sets_counts_as_set_by_a_few_rows():
    """The rule must not fire on real features: every column of the shared UCI sets and airline's first 200,000 rows
    (plane ages of 2008 among ones of 0-40: a deviation 12 times the rest's) is left as it was."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent here")
    for path in sorted(SHARED_DATA.glob("*.npz")):
        with np.load(path, allow_pickle=False) as data:
            X = np.asarray(data["X"][:200_000], dtype=np.float64)
        assert not np.any(outlier_scales(X).dominated), path.name
