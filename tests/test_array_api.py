"""The same fit on NumPy and on array_api_strict (default device and device1) gives the same numbers.

array_api_strict refuses anything outside the standard and arrays on different devices, so a fit that
runs there, with every output on the input's device, is the CPU stand-in for the CuPy path.
"""

import array_api_strict
import numpy as np
import pytest

from agpc import GPClassifier
from agpc.datasets import make_banana


def _is_strict(value):
    return type(value).__module__.startswith("array_api_strict")


@pytest.fixture(scope="module")
def data():
    X, y = make_banana(150, random_state=3)
    X_test, _ = make_banana(40, random_state=4)
    return X, y.astype(np.float64), X_test


@pytest.fixture(scope="module")
def numpy_fit(data):
    X, y, X_test = data
    model = GPClassifier(n_inducing=10, max_iter=25, random_state=0).fit(X, y)
    return model, model.predict_proba(X_test), model.predict_latent(X_test)


@pytest.mark.parametrize("device", [None, array_api_strict.Device("device1")], ids=["default", "device1"])
def test_strict_fit_equals_numpy_fit(data, numpy_fit, device):
    X, y, X_test = data
    ref_model, ref_proba, (ref_mean, ref_var) = numpy_fit
    xs = array_api_strict
    Xs = xs.asarray(X, device=device)
    ys = xs.asarray(y, device=device)
    Xts = xs.asarray(X_test, device=device)
    model = GPClassifier(n_inducing=10, max_iter=25, random_state=0).fit(Xs, ys)

    # every fitted array lives on the input's device, in the input's namespace
    assert model.inducing_points_.device == Xs.device
    for value in model.kernel_.params.values():
        assert value.device == Xs.device
    proba = model.predict_proba(Xts)
    mean, var = model.predict_latent(Xts)
    labels = model.predict(Xts)
    for out in (proba, mean, var, labels):
        assert _is_strict(out) and out.device == Xs.device

    np.testing.assert_allclose(
        model.history_["log_marginal_likelihood"], ref_model.history_["log_marginal_likelihood"], rtol=1e-8
    )
    assert abs(model.log_marginal_likelihood_ - ref_model.log_marginal_likelihood_) < 1e-8 * abs(
        ref_model.log_marginal_likelihood_
    )
    to_np = lambda a: np.asarray(a.to_device(xs.Device("CPU_DEVICE")))  # noqa: E731
    np.testing.assert_allclose(to_np(model.inducing_points_), np.asarray(ref_model.inducing_points_), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(to_np(proba), ref_proba, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(to_np(mean), ref_mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(to_np(var), ref_var, rtol=1e-8, atol=1e-10)


def test_numpy_backend_on_strict_input_returns_strict(data, numpy_fit):
    """backend="numpy" computes in NumPy but hands results back in the caller's array type."""
    X, y, X_test = data
    _, ref_proba, _ = numpy_fit
    xs = array_api_strict
    model = GPClassifier(n_inducing=10, max_iter=25, random_state=0, backend="numpy").fit(xs.asarray(X), xs.asarray(y))
    assert isinstance(model.inducing_points_, np.ndarray)
    proba = model.predict_proba(xs.asarray(X_test))
    assert _is_strict(proba)
    np.testing.assert_allclose(np.asarray(proba), ref_proba, rtol=1e-8, atol=1e-10)


def test_strict_backend_on_numpy_input_returns_numpy(data, numpy_fit):
    X, y, X_test = data
    _, ref_proba, _ = numpy_fit
    model = GPClassifier(n_inducing=10, max_iter=25, random_state=0, backend=array_api_strict).fit(X, y)
    assert _is_strict(model.inducing_points_)
    proba = model.predict_proba(X_test)
    assert isinstance(proba, np.ndarray)
    np.testing.assert_allclose(proba, ref_proba, rtol=1e-8, atol=1e-10)


def test_device_labels_are_checked_on_the_device():
    xs = array_api_strict
    device = xs.Device("device1")
    X = xs.asarray(np.random.default_rng(0).normal(size=(30, 2)), device=device)
    with pytest.raises(ValueError, match="binary only"):
        GPClassifier(method="vi-taylor", n_inducing=5).fit(X, xs.asarray(np.arange(30) % 3, device=device))
    with pytest.raises(ValueError, match="X has 30 rows but y has 29"):
        GPClassifier(n_inducing=5).fit(X, xs.asarray(np.arange(29) % 2, device=device))
    with pytest.raises(ValueError, match="only one class"):
        GPClassifier(n_inducing=5).fit(X, xs.asarray(np.ones(30), device=device))


@pytest.mark.parametrize("method", ["ep", "sep", "svi"])
def test_multiclass_strict_device1_fit_equals_numpy_fit(method):
    """The multiclass model on array_api_strict's device1 (labels encoded on the device) gives NumPy's
    history, inducing points and probabilities to 1e-8, every output on the input's device."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    y = np.argmax(np.stack([X[:, 0], X[:, 1], -X[:, 0] - X[:, 1]], axis=1) + 0.3 * rng.normal(size=(90, 3)), axis=1)
    X_test = rng.normal(size=(20, 2))
    ref = GPClassifier(method=method, n_inducing=6, max_iter=15, random_state=0).fit(X, y)
    xs = array_api_strict
    device = xs.Device("device1")
    model = GPClassifier(method=method, n_inducing=6, max_iter=15, random_state=0).fit(
        xs.asarray(X, device=device), xs.asarray(y, device=device)
    )
    proba = model.predict_proba(xs.asarray(X_test, device=device))
    labels = model.predict(xs.asarray(X_test, device=device))
    for out in (proba, labels, model.inducing_points_):
        assert _is_strict(out) and out.device == device
    to_np = lambda a: np.asarray(a.to_device(xs.Device("CPU_DEVICE")))  # noqa: E731
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-8)
    np.testing.assert_allclose(to_np(model.inducing_points_), ref.inducing_points_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(to_np(proba), ref.predict_proba(X_test), rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(to_np(labels), ref.predict(X_test))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_predict_proba_on_an_array_api_array_with_nan_or_inf_is_refused(bad):
    """The mutation audit of 2026-12-04: an array-API X (array_api_strict) given to predict_proba with a NaN or an
    infinity is refused in one ValueError saying so, as a NumPy one is, not answered with NaN probabilities."""
    X, y = make_banana(100, random_state=0)
    model = GPClassifier(n_inducing=5, max_iter=3, random_state=0).fit(X, y)
    X_bad = X[:10].copy()
    X_bad[5, 1] = bad
    with pytest.raises(ValueError, match="contains NaN or infinity"):
        model.predict_proba(array_api_strict.asarray(X_bad))
