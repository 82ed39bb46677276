"""The prior's part of the gradient, ``posterior.prior_kmm_adjoint``: -0.5 (K^-1 - B^-1 - beta beta^T)
(Hernandez-Lobato & Hernandez-Lobato (2016), eqs. 34-35). Where inverses are preferred (NumPy) K^-1 - B^-1 is formed
as K^-1 - G^T G, G = L_C^-1 L_K^-1, elsewhere as L_K^-T (I - C^-1) L_K^-1; both against K^-1 - (K + Knm^T diag(nu)
Knm)^-1 inverted in long double from the same float64 data, from a well-conditioned K to one of condition 4e9."""

import numpy as np
import pytest
from conftest import to_np, to_xp

from agpc import backend as B
from agpc.inference.posterior import posterior_from_sums, prior_cholesky, prior_kmm_adjoint
from agpc.kernels import RBF

CASES = [(0.3, 1.0, 1e-6), (3.0, 1.0, 1e-6), (3.0, 100.0, 1e-6), (10.0, 1.0, 1e-8)]  # lengthscale, site scale, jitter


def _inverse(M):
    """M^-1 by Gauss-Jordan elimination with partial pivoting, in long double."""
    n = M.shape[0]
    work = np.concatenate([M.astype(np.longdouble), np.eye(n, dtype=np.longdouble)], axis=1)
    for i in range(n):
        pivot = i + int(np.argmax(np.abs(work[i:, i])))
        work[[i, pivot]] = work[[pivot, i]]
        work[i] /= work[i, i]
        for j in range(n):
            if j != i:
                work[j] -= work[j, i] * work[i]
    return work[:, n:]


def _problem(lengthscale, site_scale, jitter, m=30, n=300):
    rng = np.random.default_rng(int(10 * lengthscale + site_scale))
    Z, X = rng.normal(size=(m, 2)), rng.normal(size=(n, 2))
    kernel = RBF(lengthscales=[lengthscale, lengthscale])
    nu, mu = site_scale * rng.random(n), rng.normal(size=n)
    return kernel, Z, X, nu, mu, jitter


def _posterior(kernel, Z, X, nu, mu, jitter, xp=np, device=None):
    Z, X, nu, mu = (to_xp(a, xp, device) for a in (Z, X, nu, mu))
    kernel = kernel.for_inputs(Z)
    L_K = prior_cholesky(kernel, Z, jitter)
    A = B.solve_triangular(L_K, kernel.K(X, Z).mT, lower=True)
    return posterior_from_sums(L_K, (A * nu[None, :]) @ A.mT, A @ mu)


def _long_double_reference(kernel, Z, X, nu, mu, jitter, post):
    """-0.5 (K^-1 - B^-1 - beta beta^T), K^-1 - B^-1 inverted in long double from the float64 K and Knm."""
    K = np.asarray(kernel.K(Z)) + jitter * np.eye(Z.shape[0])
    Knm = np.asarray(kernel.K(X, Z)).astype(np.longdouble)
    difference = _inverse(K) - _inverse(K.astype(np.longdouble) + (Knm.T * nu.astype(np.longdouble)) @ Knm)
    beta = to_np(post.beta)
    return 0.5 * (np.outer(beta, beta) - np.asarray(difference, dtype=np.float64))


@pytest.mark.parametrize("case", CASES)
def test_the_fast_form_is_as_accurate_as_the_general_one(case):
    """Against the long-double reference, the error of K^-1 - G^T G is at most that of L_K^-T (I - C^-1) L_K^-1
    (the form it replaces on NumPy) and a tenth more: both come from the float64 factors (3e-14 of the adjoint's size
    at cond(K) = 3e3, 4e-3 at 3e9), not from the last products; the two forms agree to far closer than either's
    error. The fast form is exactly symmetric."""
    kernel, Z, X, nu, mu, jitter = _problem(*case)
    post = _posterior(kernel, Z, X, nu, mu, jitter)
    reference = _long_double_reference(kernel, Z, X, nu, mu, jitter, post)
    fast = prior_kmm_adjoint(post)
    with B.reference_paths():
        general = prior_kmm_adjoint(_posterior(kernel, Z, X, nu, mu, jitter))
    scale = np.abs(reference).max()
    error_fast, error_general = (np.abs(a - reference).max() / scale for a in (fast, general))
    assert error_fast <= 1.1 * error_general + 1e-14
    assert np.abs(fast - general).max() / scale <= 0.01 * error_general + 1e-14
    np.testing.assert_array_equal(fast, fast.T)


def test_the_fast_form_is_one_triangular_product_and_two_lauum():
    kernel, Z, X, nu, mu, jitter = _problem(*CASES[1])
    post = _posterior(kernel, Z, X, nu, mu, jitter)
    post.L_K_inv, post.L_C_inv, post.beta  # (formed in a step before the gradient: not counted)
    with B.counting_fast_calls() as calls:
        prior_kmm_adjoint(post)
    assert dict(calls) == {"dtrmm": 1, "dlauum": 2}


def test_every_namespace_gives_numpys_adjoint(xp_device):
    xp, device = xp_device
    kernel, Z, X, nu, mu, jitter = _problem(*CASES[0])
    expected = prior_kmm_adjoint(_posterior(kernel, Z, X, nu, mu, jitter))
    got = prior_kmm_adjoint(_posterior(kernel, Z, X, nu, mu, jitter, xp, device))
    if device is not None:
        assert got.device == device
    np.testing.assert_allclose(to_np(got), expected, rtol=0, atol=1e-10 * np.abs(expected).max())
