"""The core checks on the GPU's namespace (CuPy with CUDA; array_api_strict's non-default device as the
stand-in elsewhere, see conftest.py): backend dispatch against SciPy, EP gradients against finite differences,
fits that match NumPy with no n-sized array leaving the device.

Run with ``python -m pytest gpu_tests`` (the README's test command runs it too).
"""

import numpy as np
import pytest
import scipy.linalg
import scipy.special

from agpc import GPClassifier
from agpc import backend as B
from agpc.datasets import make_banana
from agpc.inference import ep, training
from agpc.kernels import RBF, Matern52


def test_special_functions_match_scipy(gpu):
    z = np.linspace(-40, 40, 2001)
    # atol at the denormals: deep in the upper tail log Phi(z) ~ -Phi(-z) underflows (SciPy gives -0.0 where the
    # standard-only series on the stand-in keeps -1e-312), as for ndtr below
    np.testing.assert_allclose(B.to_numpy(B.log_ndtr(gpu.put(z))), scipy.special.log_ndtr(z), rtol=1e-12,
                               atol=1e-300)
    np.testing.assert_allclose(B.to_numpy(B.ndtr(gpu.put(z))), scipy.special.ndtr(z), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(B.to_numpy(B.inverse_mills_ratio(gpu.put(z))),
                               np.sqrt(2.0 / np.pi) / scipy.special.erfcx(-z / np.sqrt(2.0)), rtol=1e-12, atol=1e-300)


def test_triangular_solve_and_cholesky_match_scipy(gpu):
    rng = np.random.default_rng(0)
    M = rng.normal(size=(9, 9))
    A = M @ M.T + 9 * np.eye(9)
    L = B.cholesky(gpu.put(A))
    assert gpu.on_device(L)
    np.testing.assert_allclose(B.to_numpy(L), np.linalg.cholesky(A), rtol=1e-12)
    rhs = rng.normal(size=(9, 4))
    got = B.solve_triangular(L, gpu.put(rhs), lower=True, trans=True)
    ref = scipy.linalg.solve_triangular(np.linalg.cholesky(A), rhs, lower=True, trans=1)
    np.testing.assert_allclose(B.to_numpy(got), ref, rtol=1e-11)
    with pytest.raises(B.CholeskyError, match="Cholesky of Kmm"):
        B.cholesky(gpu.put(np.diag([1.0, -3.0])), what="Kmm")  # CuPy does not raise: the check must


@pytest.mark.parametrize("kernel_cls", [RBF, Matern52])
def test_ep_gradient_matches_finite_differences(gpu, kernel_cls):
    rng = np.random.default_rng(1)
    X_np = rng.normal(size=(40, 2))
    y_np = np.where(np.sin(2 * X_np[:, 0]) + X_np[:, 1] > 0, 1.0, -1.0)
    X, y = gpu.put(X_np), gpu.put(y_np)
    Z = gpu.put(X_np[:6] + 0.1)
    kernel = kernel_cls(lengthscales=[0.8, 1.3], amplitude=1.5, noise=0.05).for_inputs(X)
    fit = training.fit(X, y, kernel, Z, jitter=1e-6, max_iter=3000, optimize=(), tol=1e-13)
    nu, mu = fit.site_precision, fit.site_shift
    grads = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-6)["grads"]
    assert gpu.on_device(grads["Z"])

    def log_z(k, ZZ):
        return float(ep.evaluate(k, ZZ, X, y, nu, mu, jitter=1e-6, want_grad=False)["log_z"])

    h = 1e-6
    base = B.to_numpy(kernel.params["log_lengthscales"])
    for j in range(2):
        plus, minus = base.copy(), base.copy()
        plus[j] += h
        minus[j] -= h
        kp = kernel.with_params({**kernel.params, "log_lengthscales": gpu.put(plus)})
        km = kernel.with_params({**kernel.params, "log_lengthscales": gpu.put(minus)})
        numeric = (log_z(kp, Z) - log_z(km, Z)) / (2 * h)
        assert abs(float(B.to_numpy(grads["log_lengthscales"])[j]) - numeric) < 1e-5 * max(1.0, abs(numeric))
    Z_np = B.to_numpy(Z)
    plus, minus = Z_np.copy(), Z_np.copy()
    plus[2, 1] += h
    minus[2, 1] -= h
    numeric = (log_z(kernel, gpu.put(plus)) - log_z(kernel, gpu.put(minus))) / (2 * h)
    assert abs(float(B.to_numpy(grads["Z"])[2, 1]) - numeric) < 1e-5 * max(1.0, abs(numeric))


def test_fit_matches_numpy_and_keeps_arrays_on_the_device(gpu, monkeypatch):
    X, y = make_banana(300, random_state=3)
    X_test, _ = make_banana(50, random_state=4)
    ref = GPClassifier(n_inducing=15, max_iter=30, random_state=0).fit(X, y)

    moved = []
    original = B.to_numpy

    def watching_to_numpy(x):
        if not isinstance(x, np.ndarray) and getattr(x, "size", 1) > 1:  # a device array going to the host
            moved.append(getattr(x, "shape", None))
        return original(x)

    monkeypatch.setattr(B, "to_numpy", watching_to_numpy)
    model = GPClassifier(n_inducing=15, max_iter=30, random_state=0).fit(gpu.put(X), gpu.put(y))
    # what comes back: the d feature spreads and magnitudes (default-kernel initialisation, (2, d):
    # ``inputs.column_scales``; with the spreads and means of the rows less their extremes, (4, d):
    # ``inputs.outlier_scales``) and each step's one summary of at most 6 scalars (log Z, failed cavities, the site
    # change; tests/test_step_budgets.py counts it: one transfer a step); never an n- or m-sized array (n = 300,
    # m = 15 here)
    assert all(shape is not None and (shape in ((2, X.shape[1]), (4, X.shape[1]))
                                      or (len(shape) == 1 and shape[0] in (X.shape[1], 6)))
               for shape in moved), moved
    monkeypatch.setattr(B, "to_numpy", original)

    assert gpu.on_device(model.inducing_points_)
    proba = model.predict_proba(gpu.put(X_test))
    assert gpu.on_device(proba)
    np.testing.assert_allclose(
        model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"], rtol=1e-8
    )
    np.testing.assert_allclose(B.to_numpy(proba), ref.predict_proba(X_test), rtol=1e-8, atol=1e-10)


@pytest.mark.cuda
def test_cupy_backend_on_numpy_input_returns_numpy():
    import cupy

    X, y = make_banana(200, random_state=0)
    model = GPClassifier(n_inducing=10, max_iter=10, backend="cupy", random_state=0).fit(X, y)
    assert isinstance(model.inducing_points_, cupy.ndarray)
    assert isinstance(model.predict_proba(X), np.ndarray)


@pytest.mark.parametrize("method", ["ep", "sep", "svi"])
def test_multiclass_fit_matches_numpy_on_the_device(gpu, method):
    """The multiclass models (Villacampa-Calvo & Hernandez-Lobato (2017) EP / SEP and the robust-max SVI baseline) on
    the device: labels encoded there, probabilities equal to NumPy's to 1e-8, every fitted array on the device."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = np.argmax(X @ rng.normal(size=(3, 4)) + 0.3 * rng.normal(size=(120, 4)), axis=1)
    X_test = rng.normal(size=(30, 3))
    ref = GPClassifier(method=method, n_inducing=8, max_iter=15, random_state=0).fit(X, y)
    model = GPClassifier(method=method, n_inducing=8, max_iter=15, random_state=0).fit(gpu.put(X), gpu.put(y))
    assert gpu.on_device(model.inducing_points_) and model.inducing_points_.shape == (4, 8, 3)
    proba = model.predict_proba(gpu.put(X_test))
    assert gpu.on_device(proba)
    np.testing.assert_allclose(B.to_numpy(proba), ref.predict_proba(X_test), rtol=1e-8, atol=1e-10)
