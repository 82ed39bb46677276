"""Kernel gradients against central finite differences, for every parameter and every entry of Z."""

import numpy as np
import pytest

from agpc.kernels import RBF, Matern52, kernel_from_spec
from conftest import check_parameter_gradients, to_xp

KERNELS = [RBF, Matern52]


def _objective(kernel, X, Z, W_mm, W_nm, w_diag, xp):
    """A scalar L = <W_mm, K(Z,Z)> + <W_nm, K(X,Z)> + <w, Kdiag(X)>, so dL/dK* = W*."""
    return float(
        xp.sum(W_mm * kernel.K(Z)) + xp.sum(W_nm * kernel.K(X, Z)) + xp.sum(w_diag * kernel.Kdiag(X))
    )


@pytest.mark.parametrize("kernel_cls", KERNELS)
def test_kernel_grads_match_finite_differences(kernel_cls, xp_device):
    xp, device = xp_device
    rng = np.random.default_rng(3)
    n, m, d = 9, 5, 3
    X = to_xp(rng.normal(size=(n, d)), xp, device)
    Z = to_xp(rng.normal(size=(m, d)), xp, device)
    W_mm = to_xp(rng.normal(size=(m, m)), xp, device)  # deliberately not symmetric
    W_nm = to_xp(rng.normal(size=(n, m)), xp, device)
    w_diag = to_xp(rng.normal(size=n), xp, device)
    kernel = kernel_cls(lengthscales=[0.7, 1.3, 2.1], amplitude=1.7, noise=0.2).for_inputs(X)
    grads = kernel.grads(W_mm, W_nm, w_diag, X, Z)
    check_parameter_gradients(
        kernel, grads, Z, lambda k, ZZ: _objective(k, X, ZZ, W_mm, W_nm, w_diag, xp), xp, device, rtol=1e-6, atol=1e-7
    )
    assert grads["Z"].device == X.device


@pytest.mark.parametrize("kernel_cls", KERNELS)
def test_kernel_values(kernel_cls):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 2))
    kernel = kernel_cls(lengthscales=[0.5, 2.0], amplitude=3.0, noise=0.25).for_inputs(X)
    K = np.asarray(kernel.K(X))
    np.testing.assert_allclose(K, K.T, atol=1e-14)
    np.testing.assert_allclose(np.diag(K), 3.0, rtol=1e-12)  # no noise in cross-covariances
    np.testing.assert_allclose(np.asarray(kernel.Kdiag(X)), 3.25, rtol=1e-12)  # noise at the data points
    assert np.min(np.linalg.eigvalsh(K)) > -1e-10
    # explicit formula for one pair
    r = np.sqrt(np.sum(((X[0] - X[1]) / np.array([0.5, 2.0])) ** 2))
    expected = np.exp(-0.5 * r**2) if kernel_cls is RBF else (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)
    assert np.isclose(K[0, 1], 3.0 * expected, rtol=1e-12)


def test_kernel_rejects_bad_parameters_and_shapes():
    with pytest.raises(ValueError, match="lengthscales must be positive"):
        RBF(lengthscales=[1.0, -2.0])
    with pytest.raises(ValueError, match="amplitude"):
        RBF(amplitude=0.0)
    with pytest.raises(ValueError, match="noise"):
        RBF(noise=-1.0)
    with pytest.raises(ValueError, match="3 lengthscales but the data have 2 features"):
        RBF(lengthscales=[1.0, 1.0, 1.0]).for_inputs(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_from_spec({"type": "Nope"}, {})


def test_scalar_lengthscale_broadcasts_to_ard():
    kernel = RBF(lengthscales=2.0).for_inputs(np.zeros((3, 4)))
    np.testing.assert_allclose(np.asarray(kernel.lengthscales), [2.0] * 4)
