"""The prior's part of the gradient, ``posterior.prior_kmm_adjoint``: -0.5 (K^-1 - B^-1 - beta beta^T)
(Hernandez-Lobato & Hernandez-Lobato (2016), eqs. 34-35), against K^-1 - (K + Knm^T diag(nu) Knm)^-1 inverted in
long double from the same float64 kernel matrices: within the forward error of an inverse formed in float64,
m eps cond(K) max|K^-1|, for informative sites and for weak ones (their shifts scaled with their precisions, as EP's
are), on the NumPy fast path (q's C^-1 by potri, or one lauum of L_C^-1 where that is formed) and on the array-API
path; every namespace gives NumPy's adjoint, and q's cached inverses are left as they were. The bound is loose (40 to
1e5 times the errors measured) but below 5% of the adjoint in every case, so a wrong adjoint fails."""

import contextlib

import numpy as np
import pytest
from conftest import to_np, to_xp
from helpers import long_double_inverse

from agpc import backend as B
from agpc.inference.posterior import posterior_from_sums, prior_cholesky, prior_kmm_adjoint
from agpc.kernels import RBF

CASES = [  # lengthscale, site scale, jitter, shifts scaled with the precisions
    (0.3, 1.0, 1e-6, False), (3.0, 1.0, 1e-6, False), (3.0, 100.0, 1e-6, False), (0.3, 1e-2, 1e-6, True),
    (0.3, 1e-8, 1e-6, True)]


def _problem(lengthscale, site_scale, jitter, scaled_shifts, m=30, n=300):
    rng = np.random.default_rng(int(10 * lengthscale) + 7)
    Z, X = rng.normal(size=(m, 2)), rng.normal(size=(n, 2))
    kernel = RBF(lengthscales=[lengthscale, lengthscale])
    nu = site_scale * rng.random(n)
    mu = nu * rng.normal(size=n) if scaled_shifts else rng.normal(size=n)
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
    difference = long_double_inverse(K) - long_double_inverse(K.astype(np.longdouble) + (Knm.T * nu.astype(np.longdouble)) @ Knm)
    beta = to_np(post.beta)
    return 0.5 * (np.outer(beta, beta) - np.asarray(difference, dtype=np.float64))


def _forward_error(kernel, Z, jitter):
    """m eps cond(K) max|K^-1|: the size of the error of an inverse of K formed in float64."""
    K = np.asarray(kernel.K(Z)) + jitter * np.eye(Z.shape[0])
    return Z.shape[0] * np.finfo(np.float64).eps * np.linalg.cond(K) * np.abs(np.linalg.inv(K)).max()


@pytest.mark.parametrize("sygst", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_the_adjoint_is_within_an_inverses_forward_error(case, sygst, monkeypatch):
    """Each path: the fast one with q's inverses formed or not, the reference; ``sygst``: the fast path's congruence
    L_K^-T (I - C^-1) L_K^-1 by one sygst (``backend.symmetric_congruence``, taken at any order and thread count
    here)."""
    if sygst:
        monkeypatch.setattr(B, "congruence_by_sygst", lambda T: True)
    kernel, Z, X, nu, mu, jitter = _problem(*case)
    reference = _long_double_reference(kernel, Z, X, nu, mu, jitter, _posterior(kernel, Z, X, nu, mu, jitter))
    bound = _forward_error(kernel, Z, jitter)
    assert bound <= 0.05 * np.abs(reference).max()  # (so that a wrong adjoint cannot pass)
    for path, inverses_formed in ((contextlib.nullcontext, False), (contextlib.nullcontext, True),
                                  (B.reference_paths, False)):
        with path():
            post = _posterior(kernel, Z, X, nu, mu, jitter)
            if inverses_formed:  # (as in EP's and ADF's steps: C^-1 then a lauum of L_C^-1, not potri)
                post.L_K_inv, post.L_C_inv
            got = prior_kmm_adjoint(post)
        assert np.abs(to_np(got) - reference).max() <= bound, (path.__name__, inverses_formed)


@pytest.mark.parametrize("sygst", [False, True])
def test_qs_cached_inverses_are_left_as_they_were(sygst, monkeypatch):
    """On the fast path, with q's inverses formed (a minibatch EP step forms them before the gradient): C^-1 one
    lauum of L_C^-1, the two triangular products with L_K^-1 (or, where ``backend.congruence_by_sygst``, one sygst),
    and neither inverse written into."""
    if sygst:
        monkeypatch.setattr(B, "congruence_by_sygst", lambda T: True)
    kernel, Z, X, nu, mu, jitter = _problem(*CASES[1])
    post = _posterior(kernel, Z, X, nu, mu, jitter)
    L_K_inv, L_C_inv = post.L_K_inv.copy(), post.L_C_inv.copy()
    post.beta
    with B.counting_fast_calls() as calls:
        prior_kmm_adjoint(post)
    assert dict(calls) == ({"dlauum": 1, "dsygst": 1} if sygst else {"dlauum": 1, "dtrmm": 2})
    np.testing.assert_array_equal(post.L_K_inv, L_K_inv)
    np.testing.assert_array_equal(post.L_C_inv, L_C_inv)


def test_every_namespace_gives_numpys_adjoint(xp_device):
    xp, device = xp_device
    kernel, Z, X, nu, mu, jitter = _problem(*CASES[0])
    expected = prior_kmm_adjoint(_posterior(kernel, Z, X, nu, mu, jitter))
    got = prior_kmm_adjoint(_posterior(kernel, Z, X, nu, mu, jitter, xp, device))
    if device is not None:
        assert got.device == device
    np.testing.assert_allclose(to_np(got), expected, rtol=0, atol=1e-10 * np.abs(expected).max())
