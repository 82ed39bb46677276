"""Self-checks of the textbook full-GP ordinal EP reference (tests/reference_ordinal_ep.py).

Each check compares against something outside the reference's EP code: adaptive quadrature of the tilted
distribution, the exact marginal likelihood (closed form for n = 1, a two-dimensional integral for n = 2), the
binary textbook reference (tests/reference_full_gp_ep.py) for two classes, and the definition of an EP fixed point.
"""

import math

import numpy as np
import pytest
from reference_full_gp_ep import full_gp_ep, tilted_moments
from reference_ordinal_ep import (
    ordinal_full_gp_ep, ordinal_full_gp_latent, ordinal_predictive_proba, ordinal_tilted_moments,
)
from scipy import integrate
from scipy.stats import multivariate_normal, norm

CUTS = np.array([-1.2, -0.3, 0.4, 1.5])  # 5 classes


def tilted_by_quadrature(label, m, v, cut_points):
    """(Z, mean, variance) of p(y = label | f) N(f | m, v) by adaptive quadrature (scalar math functions: fast)."""
    sd = math.sqrt(v)
    edges = [-math.inf, *cut_points, math.inf]
    lower, upper = edges[label], edges[label + 1]

    def density(f):
        interval = 0.5 * (math.erfc(-(upper - f) / math.sqrt(2.0)) - math.erfc(-(lower - f) / math.sqrt(2.0)))
        return math.exp(-0.5 * ((f - m) / sd) ** 2) / (sd * math.sqrt(2.0 * math.pi)) * interval

    lo, hi = m - 12 * sd, m + 12 * sd
    kw = dict(epsabs=0.0, epsrel=1e-11, limit=200, points=[c for c in cut_points if lo < c < hi] or None)
    Z = integrate.quad(density, lo, hi, **kw)[0]
    mean = integrate.quad(lambda f: f * density(f), lo, hi, **kw)[0] / Z
    var = integrate.quad(lambda f: (f - mean) ** 2 * density(f), lo, hi, **kw)[0] / Z
    return Z, mean, var


def rbf(X, amp=1.5, ell=0.8):
    return amp * np.exp(-0.5 * (X[:, None] - X[None, :]) ** 2 / ell ** 2) + 1e-8 * np.eye(len(X))


def ordinal_problem(seed, n, cut_points=CUTS):
    """Inputs on a line, labels drawn from the model with a smooth latent."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-3.0, 3.0, n))
    latent = 1.5 * np.sin(X) + rng.standard_normal(n)
    return rbf(X), np.searchsorted(cut_points, latent).astype(int), X


# ---------------------------------------------------------------- tilted moments and probabilities -----

@pytest.mark.parametrize("label", range(5))
@pytest.mark.parametrize("m, v", [(0.0, 1.0), (-2.0, 0.3), (1.7, 4.0), (0.2, 0.02), (-0.5, 25.0)])
def test_tilted_moments_match_quadrature(label, m, v):
    Z, mean, var = tilted_by_quadrature(label, m, v, CUTS)
    log_z, mean_ref, var_ref = ordinal_tilted_moments(label, m, v, CUTS)
    assert log_z == pytest.approx(math.log(Z), abs=1e-9)
    assert mean_ref == pytest.approx(mean, abs=1e-8)
    assert var_ref == pytest.approx(var, rel=1e-8)
    assert 0.0 < var_ref < v  # log-concave likelihood: the site precision is non-negative


def test_tilted_moments_far_in_the_tails_stay_finite():
    """A cavity far from its class's interval: the closed form's difference of two tiny Phi's is taken in logs."""
    log_z, mean, var = ordinal_tilted_moments(np.array([0, 4, 2, 2]), np.array([40.0, -40.0, 30.0, -30.0]),
                                              np.full(4, 0.5), CUTS)
    assert np.all(np.isfinite(log_z)) and np.all(np.isfinite(mean)) and np.all((var > 0) & (var < 0.5))
    # the class-0 likelihood at f = 40 is about Phi(-1.2 - f): log Z ~ log Phi((-1.2 - 40) / sqrt(1.5))
    assert log_z[0] == pytest.approx(norm.logcdf((-1.2 - 40.0) / math.sqrt(1.5)), rel=1e-10)
    assert mean[1] > -40.0 and mean[0] < 40.0  # pulled towards the interval


def test_predictive_proba_closed_form_against_quadrature():
    mean, var = np.array([-1.0, 0.0, 2.5]), np.array([0.5, 2.0, 0.1])
    proba = ordinal_predictive_proba(mean, var, CUTS)
    assert proba.shape == (3, 5)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    for i in range(3):
        for k in range(5):
            assert proba[i, k] == pytest.approx(tilted_by_quadrature(k, mean[i], var[i], CUTS)[0], abs=1e-10)


def test_bad_labels_and_cut_points_are_refused():
    K = np.eye(2)
    with pytest.raises(ValueError, match="strictly increasing"):
        ordinal_full_gp_ep(K, [0, 1], [0.5, 0.1])
    with pytest.raises(ValueError, match="labels"):
        ordinal_full_gp_ep(K, [0, 3], [0.0, 1.0])


# ---------------------------------------------------------------- two classes: the binary reference -----

@pytest.mark.parametrize("seed", [0, 1])
def test_two_classes_with_a_zero_cut_point_equal_the_binary_reference(seed):
    """With K = 2 and b_1 = 0, p(y = 1 | f) = 1 - Phi(-f) = Phi(f) and p(y = 0 | f) = Phi(-f): the binary probit
    model with labels 2 y - 1. Same sites, posterior and log Z_EP (the binary reference writes eq. 3.65 in the
    form of R&W eqs. 3.73 / 3.74, this one in its direct form)."""
    K, _, X = ordinal_problem(seed, 25)
    y = (np.sin(2 * X) + 0.3 * np.random.default_rng(seed).standard_normal(25) > 0).astype(int)
    ordinal = ordinal_full_gp_ep(K, y, [0.0], tol=1e-12, max_sweeps=500)
    binary = full_gp_ep(K, 2.0 * y - 1.0, tol=1e-12)
    assert ordinal["converged"] and binary["converged"]
    np.testing.assert_allclose(ordinal["site_precision"], binary["tau_tilde"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ordinal["site_precision"] * ordinal["site_mean"], binary["nu_tilde"], atol=1e-10)
    np.testing.assert_allclose(ordinal["posterior_mean"], binary["mu"], atol=1e-10)
    np.testing.assert_allclose(ordinal["posterior_cov"], binary["Sigma"], atol=1e-10)
    assert ordinal["log_z"] == pytest.approx(binary["log_z"], abs=1e-9)


@pytest.mark.parametrize("b_1", [-0.8, 0.0, 1.3])
def test_two_classes_tilted_moments_are_the_binary_ones_on_the_shifted_latent(b_1):
    """For any b_1, p(y | f) = Phi(t (f - b_1)), t = 2 y - 1: the binary probit on g = f - b_1. The tilted
    distribution in f is the binary one in g moved by b_1 (log Z and variance equal, mean shifted). The full EP
    matches the binary reference only at b_1 = 0 (test above): for b_1 != 0 the latent g has prior mean -b_1, which
    the zero-mean binary reference cannot take."""
    labels = np.array([0, 1, 0, 1, 1])
    m, v = np.array([-2.0, -0.5, 0.3, 1.1, 4.0]), np.array([0.2, 1.0, 3.0, 0.05, 9.0])
    log_z, mean, var = ordinal_tilted_moments(labels, m, v, [b_1])
    log_z_bin, mean_bin, var_bin = tilted_moments(2.0 * labels - 1.0, m - b_1, v)
    np.testing.assert_allclose(log_z, log_z_bin, atol=1e-13)
    np.testing.assert_allclose(mean, mean_bin + b_1, atol=1e-13)
    np.testing.assert_allclose(var, var_bin, rtol=1e-12)


# ---------------------------------------------------------------- log Z against the exact marginal likelihood -----

@pytest.mark.parametrize("k", [0.05, 1.0, 9.0])
@pytest.mark.parametrize("label", [0, 2, 4])
def test_single_point_is_exact(k, label):
    """n = 1: the one site makes q equal to the tilted distribution, so EP is exact: log Z_EP = log p(y) =
    log(Phi(b_{y+1} / sqrt(1 + k)) - Phi(b_y / sqrt(1 + k))) and the posterior moments are the exact ones (by
    quadrature)."""
    res = ordinal_full_gp_ep(np.array([[k]]), [label], CUTS)
    edges = [-math.inf, *CUTS, math.inf]
    s = math.sqrt(1.0 + k)
    exact = norm.cdf(edges[label + 1] / s) - norm.cdf(edges[label] / s)
    assert res["log_z"] == pytest.approx(math.log(exact), abs=1e-10)
    Z, mean, var = tilted_by_quadrature(label, 0.0, k, CUTS)
    assert res["posterior_mean"][0] == pytest.approx(mean, abs=1e-8)
    assert res["posterior_cov"][0, 0] == pytest.approx(var, rel=1e-8)


def exact_log_evidence_2d(K, y, cut_points):
    """log p(y_1, y_2) = log int int N(f | 0, K) p(y_1 | f_1) p(y_2 | f_2) df by scipy's dblquad, and the same as a
    bivariate normal rectangle probability (f + noise ~ N(0, K + I) in the box of the two classes)."""
    (l11, _), (l21, l22) = np.linalg.cholesky(K)
    edges = np.array([-np.inf, *cut_points, np.inf])
    (lo1, hi1), (lo2, hi2) = ((edges[k], edges[k + 1]) for k in y)

    def phi(x):  # scalar math.erfc: scipy.stats' per-call overhead would make dblquad take seconds
        return 0.5 * math.erfc(-x / math.sqrt(2.0))

    def integrand(u2, u1):  # f = L u, u ~ N(0, I): a smooth integrand on a fixed box
        f1, f2 = l11 * u1, l21 * u1 + l22 * u2
        return (math.exp(-0.5 * (u1 * u1 + u2 * u2)) / (2.0 * math.pi) * (phi(hi1 - f1) - phi(lo1 - f1))
                * (phi(hi2 - f2) - phi(lo2 - f2)))

    by_quadrature = integrate.dblquad(integrand, -9, 9, -9, 9, epsabs=1e-12, epsrel=1e-9)[0]
    cov = K + np.eye(2)
    lo = np.maximum(edges[np.asarray(y)], -40.0)
    hi = np.minimum(edges[np.asarray(y) + 1], 40.0)
    box = multivariate_normal.cdf(hi, np.zeros(2), cov, lower_limit=lo, abseps=1e-12, releps=1e-12)
    return math.log(by_quadrature), math.log(box)


def test_two_independent_points_are_exact():
    """n = 2 with a diagonal K: the posterior factorises into two n = 1 problems, so EP is exact again."""
    K = np.diag([0.7, 2.5])
    y = [1, 4]
    by_quadrature, _ = exact_log_evidence_2d(K, y, CUTS)
    assert ordinal_full_gp_ep(K, y, CUTS)["log_z"] == pytest.approx(by_quadrature, abs=1e-8)


@pytest.mark.parametrize("rho, y", [(0.5, [1, 2]), (0.9, [0, 3]), (0.95, [2, 2]), (-0.6, [4, 0])])
def test_two_correlated_points_close_to_exact(rho, y):
    """n = 2, correlated: EP is an approximation. The two exact evaluations agree to about 1e-15 (asserted: 1e-9);
    log Z_EP lies within 1e-3 of them. Measured gaps: 2e-11 (rho 0.5, classes 1 and 2: narrow intervals, a nearly
    Gaussian likelihood), 1.2e-5 (0.9; 0, 3), 2e-9 (0.95; 2, 2), 3.4e-4 (-0.6; the two end classes)."""
    K = np.array([[1.5, rho * math.sqrt(1.5 * 2.0)], [rho * math.sqrt(1.5 * 2.0), 2.0]])
    by_quadrature, by_box = exact_log_evidence_2d(K, y, CUTS)
    assert by_quadrature == pytest.approx(by_box, abs=1e-9)
    log_z = ordinal_full_gp_ep(K, y, CUTS)["log_z"]
    assert abs(log_z - by_quadrature) < 1e-3


# ---------------------------------------------------------------- the EP fixed point -----

@pytest.fixture(scope="module", params=[(0, 30), (1, 50)], ids=lambda p: f"seed{p[0]}-n{p[1]}")
def fitted(request):
    seed, n = request.param
    K, y, X = ordinal_problem(seed, n)
    return K, y, X, ordinal_full_gp_ep(K, y, CUTS)


def test_fixed_point_every_site_matches_its_tilted_moments(fitted):
    """At convergence each marginal q(f_i) equals the moments of p(y_i | f_i) q_-i(f_i), with the cavity
    q_-i = q(f_i) / site_i (R&W eqs. 3.56-3.59), and the posterior is the Gaussian product of prior and sites."""
    K, y, _, res = fitted
    assert res["converged"]
    tau, site_mean = res["site_precision"], res["site_mean"]
    mu, Sigma = res["posterior_mean"], res["posterior_cov"]
    np.testing.assert_allclose(Sigma, np.linalg.inv(np.linalg.inv(K) + np.diag(tau)), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(mu, Sigma @ (tau * site_mean), atol=1e-9)
    variance = np.diag(Sigma)
    cavity_precision = 1.0 / variance - tau
    cavity_mean = (mu / variance - tau * site_mean) / cavity_precision
    _, tilted_mean, tilted_var = ordinal_tilted_moments(y, cavity_mean, 1.0 / cavity_precision, CUTS)
    np.testing.assert_allclose(tilted_mean, mu, atol=1e-9)
    np.testing.assert_allclose(tilted_var, variance, rtol=1e-9)
    assert np.all(tau > 0)


def test_log_z_is_the_direct_form_of_eq_3_65(fitted):
    """log Z_EP against eq. 3.65 evaluated with dense inverses: -1/2 log|K + S~^-1| - 1/2 mu~^T (K + S~^-1)^-1 mu~
    + sum log Z^_i + 1/2 sum log(s2_-i + s2~_i) + sum (mu_-i - mu~_i)^2 / (2 (s2_-i + s2~_i))."""
    K, y, _, res = fitted
    tau, site_mean = res["site_precision"], res["site_mean"]
    variance = np.diag(res["posterior_cov"])
    cavity_var = 1.0 / (1.0 / variance - tau)
    cavity_mean = cavity_var * (res["posterior_mean"] / variance - tau * site_mean)
    log_zhat, _, _ = ordinal_tilted_moments(y, cavity_mean, cavity_var, CUTS)
    C = K + np.diag(1.0 / tau)
    spread = cavity_var + 1.0 / tau
    direct = (-0.5 * np.linalg.slogdet(C)[1] - 0.5 * site_mean @ np.linalg.solve(C, site_mean) + log_zhat.sum()
              + 0.5 * np.log(spread).sum() + np.sum((cavity_mean - site_mean) ** 2 / (2 * spread)))
    assert res["log_z"] == pytest.approx(direct, abs=1e-7)


def test_reversed_labels_mirror_the_posterior(fitted):
    """y -> K - 1 - y with cut points b -> -reversed(b) is the same model for -f: the posterior mean flips sign,
    the covariance and log Z_EP are unchanged."""
    K, y, _, res = fitted
    mirrored = ordinal_full_gp_ep(K, CUTS.size - y, -CUTS[::-1])
    np.testing.assert_allclose(mirrored["posterior_mean"], -res["posterior_mean"], atol=1e-9)
    np.testing.assert_allclose(mirrored["posterior_cov"], res["posterior_cov"], atol=1e-9)
    assert mirrored["log_z"] == pytest.approx(res["log_z"], abs=1e-9)


def test_latent_prediction_at_training_inputs_is_the_posterior_marginal(fitted):
    K, _, _, res = fitted
    mean, var = ordinal_full_gp_latent(K, res, K, np.diag(K))
    np.testing.assert_allclose(mean, res["posterior_mean"], atol=1e-8)
    np.testing.assert_allclose(var, np.diag(res["posterior_cov"]), atol=1e-8)
    proba = ordinal_predictive_proba(mean, var, CUTS)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
