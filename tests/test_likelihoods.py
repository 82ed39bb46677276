"""Likelihood objects: every derivative against central finite differences, expectations against an independent
quadrature (scipy.integrate.quad), predictives that are probabilities, on NumPy and array_api_strict."""

import math

import warnings

import numpy as np
import pytest

from agpc import likelihoods as L
from conftest import central_differences, to_np, to_xp

BINARY = [L.PROBIT, L.LOGISTIC]


def binary_case(xp, device):
    rng = np.random.default_rng(0)
    y = np.where(rng.random(6) < 0.5, -1.0, 1.0)
    mean = rng.normal(scale=2.0, size=6)
    var = rng.uniform(0.1, 3.0, size=6)
    return y, mean, var, (to_xp(v, xp, device) for v in (y, mean, var))


@pytest.mark.parametrize("likelihood", BINARY, ids=lambda lik: lik.name)
def test_log_density_slope_and_expected_log_density_derivatives(likelihood, xp_device):
    xp, device = xp_device
    y, mean, var, (y_x, mean_x, var_x) = binary_case(xp, device)
    value, slope = likelihood.log_density(y_x, mean_x)
    numeric = central_differences(lambda f: to_np(xp.sum(likelihood.log_density(y_x, to_xp(f, xp, device))[0])), mean)
    np.testing.assert_allclose(to_np(slope), numeric, rtol=1e-6, atol=1e-8)
    expected, d_mean, d_var = likelihood.expected_log_density(y_x, mean_x, var_x, 20)
    assert expected.device == mean_x.device
    total = lambda m, v: float(xp.sum(likelihood.expected_log_density(  # noqa: E731
        y_x, to_xp(m, xp, device), to_xp(v, xp, device), 20)[0]))
    np.testing.assert_allclose(to_np(d_mean), central_differences(lambda m: total(m, var), mean), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(to_np(d_var), central_differences(lambda v: total(mean, v), var), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("likelihood", BINARY, ids=lambda lik: lik.name)
def test_expectations_against_adaptive_quadrature(likelihood):
    integrate = pytest.importorskip("scipy.integrate")
    y, mean, var, (y_x, mean_x, var_x) = binary_case(np, None)
    expected = np.asarray(likelihood.expected_log_density(y_x, mean_x, var_x, 60)[0])
    log_pos, _ = (np.asarray(v) for v in likelihood.predictive_log_proba(mean_x, var_x, 60))
    for i in range(len(y)):
        def density(f):
            return math.exp(-0.5 * (f - mean[i]) ** 2 / var[i]) / math.sqrt(2 * math.pi * var[i])

        def log_p(label, f):
            return float(likelihood.log_density(np.array(label), np.array(f))[0])

        reference = integrate.quad(lambda f: density(f) * log_p(y[i], f), -np.inf, np.inf)[0]
        assert expected[i] == pytest.approx(reference, rel=1e-7, abs=1e-9)
        positive = integrate.quad(lambda f: density(f) * math.exp(log_p(1.0, f)), -np.inf, np.inf)[0]
        assert math.exp(log_pos[i]) == pytest.approx(positive, rel=1e-7, abs=1e-9)


def test_the_logistic_predictive_is_exact_at_large_variances(xp_device):
    """A prediction audit (2026-12-03): Gauss-Hermite's 20 nodes left the logistic predictive p(+1) 0.006 off at
    var = 30, 0.03 at 100 and 0.09 at 1,000, pulled toward 0.5 (a vi-jj fit of amplitude 60 predicted 0.30 for
    0.31), with no word. Its two Gauss-Legendre panels against SciPy's adaptive quadrature of sigma(f) N(f | m,
    var), broken at 0 and m, on NumPy and on array_api_strict (float64, and float32 to its precision)."""
    from scipy import integrate, special, stats

    means = np.array([-8.0, -3.0, -0.5, 0.0, 1.0, 4.0, 10.0])
    variances = np.array([0.01, 1.0, 30.0, 100.0, 1000.0, 1e4])
    m, v = (a.ravel() for a in np.meshgrid(means, variances))

    def reference(mean, var):
        sd = math.sqrt(var)
        low, high = mean - 40 * sd, mean + 40 * sd
        return integrate.quad(lambda f: special.expit(f) * stats.norm.pdf(f, mean, sd), low, high,
                              points=sorted({0.0, mean}), limit=500, epsabs=1e-14, epsrel=1e-12)[0]

    expected = np.array([reference(a, b) for a, b in zip(m, v)])
    xp, device = xp_device
    for dtype, tolerance in [(np.float64, 1e-5), (np.float32, 1e-4)]:
        mean, var = xp.asarray(m.astype(dtype), device=device), xp.asarray(v.astype(dtype), device=device)
        log_pos, log_neg = L.LOGISTIC.predictive_log_proba(mean, var)
        assert log_pos.dtype == mean.dtype and log_pos.device == mean.device
        np.testing.assert_allclose(np.exp(to_np(log_pos)), expected, atol=tolerance)
        np.testing.assert_allclose(np.exp(to_np(log_neg)), 1.0 - expected, atol=tolerance)
    gauss_hermite = np.exp(np.asarray(L.Likelihood.predictive_log_proba(L.LOGISTIC, m, v, 20)[0]))
    assert np.max(np.abs(gauss_hermite - expected)) > 0.05  # (what the panels replace)


@pytest.mark.parametrize("likelihood", BINARY, ids=lambda lik: lik.name)
def test_binary_predictive_is_a_distribution(likelihood, xp_device):
    xp, device = xp_device
    _, _, _, (_, mean_x, var_x) = binary_case(xp, device)
    log_pos, log_neg = likelihood.predictive_log_proba(mean_x, var_x, 20)
    np.testing.assert_allclose(np.exp(to_np(log_pos)) + np.exp(to_np(log_neg)), 1.0, rtol=1e-10)


def test_probit_tilted_moments_are_derivatives_of_log_z(xp_device):
    """alpha = d log Z / d mean, gamma = -d^2 log Z / d mean^2 (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 17)."""
    xp, device = xp_device
    y, mean, var, (y_x, mean_x, _) = binary_case(xp, device)
    b = to_xp(1.0 + var, xp, device)
    log_z, alpha, gamma = L.PROBIT.tilted_moments(y_x, mean_x, b)

    def log_z_at(m):
        return to_np(L.PROBIT.tilted_moments(y_x, to_xp(m, xp, device), b)[0])

    def alpha_at(m):
        return to_np(L.PROBIT.tilted_moments(y_x, to_xp(m, xp, device), b)[1])

    h = 1e-6
    np.testing.assert_allclose(to_np(alpha), (log_z_at(mean + h) - log_z_at(mean - h)) / (2 * h), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(to_np(gamma), -(alpha_at(mean + h) - alpha_at(mean - h)) / (2 * h), rtol=1e-5, atol=1e-8)


def test_robust_max_expected_log_density_derivatives(xp_device):
    xp, device = xp_device
    rng = np.random.default_rng(2)
    b, C = 5, 3
    y = rng.integers(0, C, size=b).astype(float)
    mean, var = rng.normal(size=(b, C)), rng.uniform(0.2, 2.0, size=(b, C))
    lik = L.RobustMax(0.01)
    y_x, mean_x, var_x = (to_xp(v, xp, device) for v in (y, mean, var))
    expected, d_mean, d_var = lik.expected_log_density(y_x, mean_x, var_x, 20)
    total = lambda m, v: float(xp.sum(lik.expected_log_density(  # noqa: E731
        y_x, to_xp(m, xp, device), to_xp(v, xp, device), 20)[0]))
    np.testing.assert_allclose(to_np(d_mean), central_differences(lambda m: total(m, var), mean), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(to_np(d_var), central_differences(lambda v: total(mean, v), var), rtol=1e-6, atol=1e-9)
    probs = np.exp(to_np(lik.predictive_log_proba(mean_x, var_x)))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-8)
    assert np.all(probs >= 0.01 / (C - 1) * (1 - 1e-12))


def _conditional_case(b=4, C=3, seed=2):
    """Rows of every kind: a far-out true class (its pairs' log Phi near 0), a far-out rival (log Phi large and
    negative), small and large q-variances and residuals."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, size=b).astype(float)
    mean = rng.normal(size=(b, C))
    mean[0] *= 8.0
    mean[1, int(y[1])] -= 6.0
    var, residual = rng.uniform(0.05, 2.0, size=(b, C)), rng.uniform(0.01, 1.0, size=(b, C))
    return y, mean, var, residual


def test_robust_max_conditional_bound_derivatives(xp_device):
    """``conditional_log_density_bound``: its derivatives in every class's mean, q-variance and residual against
    central differences of the bound (the quadrature sum's own derivatives), on rows of every kind."""
    xp, device = xp_device
    y, mean, var, residual = _conditional_case()
    lik = L.RobustMax(0.01)
    y_x = to_xp(y, xp, device)
    _, d_mean, d_var, d_res = lik.conditional_log_density_bound(
        y_x, *(to_xp(v, xp, device) for v in (mean, var, residual)), 20)

    def total(m, v, s):
        return float(xp.sum(lik.conditional_log_density_bound(
            y_x, to_xp(m, xp, device), to_xp(v, xp, device), to_xp(s, xp, device), 20)[0]))

    np.testing.assert_allclose(to_np(d_mean), central_differences(lambda m: total(m, var, residual), mean),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(to_np(d_var), central_differences(lambda v: total(mean, v, residual), var),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(to_np(d_res), central_differences(lambda s: total(mean, var, s), residual),
                               rtol=1e-6, atol=1e-9)


def _both_branches_case():
    """Rows 0-2: q broad against a small conditional (q at the prior, inducing points near the row), where eq. 15's
    term is the larger bound by 0.5-0.8 nats; rows 3-5: q narrow, the conditional bound the larger by 1.7-2.6."""
    rng = np.random.default_rng(4)
    y = np.array([0.0, 1.0, 2.0, 0.0, 1.0, 2.0])
    broad = (np.arange(6) < 3)[:, None]
    mean = rng.normal(size=(6, 3))
    var = np.where(broad, rng.uniform(2.0, 4.0, (6, 3)), rng.uniform(0.02, 0.1, (6, 3)))
    residual = np.where(broad, rng.uniform(0.005, 0.02, (6, 3)), rng.uniform(0.5, 1.0, (6, 3)))
    return y, mean, var, residual


def test_robust_max_log_density_bound_is_the_larger_bound_with_its_derivatives(xp_device):
    """``log_density_bound``: row by row the larger of the conditional bound and eq. 15's term (both branches
    present, each by a margin no finite-difference step crosses), and its derivatives in every class's mean,
    q-variance and residual against central differences (eq. 15's variance derivative reaches both parts)."""
    xp, device = xp_device
    y, mean, var, residual = _both_branches_case()
    lik = L.RobustMax(0.01)
    y_x = to_xp(y, xp, device)
    args = [to_xp(v, xp, device) for v in (mean, var, residual)]
    value, d_mean, d_var, d_res = (to_np(v) for v in lik.log_density_bound(y_x, *args, 20))
    conditional = to_np(lik.conditional_log_density_bound(y_x, *args, 20)[0])
    jensen = to_np(lik.expected_log_density(y_x, args[0], args[1] + args[2], 20)[0])
    np.testing.assert_array_equal(value, np.maximum(conditional, jensen))
    assert np.all((jensen - conditional)[:3] > 0.5) and np.all((conditional - jensen)[3:] > 1.0)

    def total(m, v, s):
        return float(xp.sum(lik.log_density_bound(
            y_x, to_xp(m, xp, device), to_xp(v, xp, device), to_xp(s, xp, device), 20)[0]))

    np.testing.assert_allclose(d_mean, central_differences(lambda m: total(m, var, residual), mean),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d_var, central_differences(lambda v: total(mean, v, residual), var),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d_res, central_differences(lambda s: total(mean, var, s), residual),
                               rtol=1e-6, atol=1e-9)


def test_robust_max_bounds_at_the_prior_with_ten_classes():
    """q at the prior (mean 0, variance 1) against a small conditional (s = 0.01), ten classes: the conditional
    bound of every row sits at the floor log(eps / 9) with derivatives below 1e-90 (the start of a fit, where
    multiclass SVI with that bound alone left a digit class as label noise, docs/methods/svi.md), while the larger
    of the two bounds is eq. 15's term, log(eps/9) + gap / 10, with derivatives of order one."""
    C, eps = 10, L.RobustMax.EPSILON
    y = np.arange(5, dtype=float)
    mean, var, residual = np.zeros((5, C)), np.ones((5, C)), np.full((5, C), 0.01)
    value, *slopes = L.ROBUST_MAX.conditional_log_density_bound(y, mean, var, residual)
    np.testing.assert_allclose(value, math.log(eps / 9), rtol=1e-12)
    assert max(np.abs(d).max() for d in slopes) < 1e-90
    value, d_mean, d_var, _ = L.ROBUST_MAX.log_density_bound(y, mean, var, residual)
    gap = math.log1p(-eps) - math.log(eps / 9)
    np.testing.assert_allclose(value, math.log(eps / 9) + gap / C, rtol=1e-4)  # (S = 1/10 by 20 nodes)
    assert np.abs(d_mean).max() > 0.5 and np.abs(d_var).max() > 0.1


def test_robust_max_conditional_bound_is_a_bound_and_exact_where_it_should_be():
    """The conditional bound, and the larger of it and eq. 15's term, are below E_q(u) log p(y | u) =
    E_g log(eps' + gap P(f_y is the largest | g)), f | g ~ N(g, diag s), g ~ N(mean, diag var): the reference by
    Monte Carlo over g (fixed seed) and an independent 40-node quadrature over f_y for the inner probability, to
    within 4 standard errors. With two classes and q's variance 0 both inequalities of the conditional bound are
    equalities (one pair; nothing to average): log(eps + (1 - 2 eps) Phi((g_y - g_k) / sqrt(s_y + s_k))) exactly."""
    from scipy.special import ndtr

    eps = 0.01
    lik = L.RobustMax(eps)
    rng = np.random.default_rng(5)
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    weights = weights / weights.sum()
    for y, mean, var, residual in (_conditional_case(b=6, C=4), _both_branches_case()):
        value = lik.conditional_log_density_bound(y, mean, var, residual, 20)[0]
        larger = lik.log_density_bound(y, mean, var, residual, 20)[0]
        C = mean.shape[1]
        for i in range(y.shape[0]):
            k = int(y[i])
            g = mean[i] + np.sqrt(var[i]) * rng.normal(size=(4000, C))
            f_y = g[:, k, None] + np.sqrt(residual[i, k]) * nodes[None, :]
            inner = np.ones_like(f_y)
            for j in range(C):
                if j != k:
                    inner *= ndtr((f_y - g[:, j, None]) / np.sqrt(residual[i, j]))
            log_p = np.log(eps / (C - 1) + (1 - eps - eps / (C - 1)) * (inner @ weights))
            reference = log_p.mean() + 4 * log_p.std() / np.sqrt(log_p.shape[0]) + 1e-12
            assert value[i] <= larger[i] <= reference, (C, i)
    y2, mean2, residual2 = np.array([0.0, 1.0, 1.0]), np.array([[0.3, -1.0], [2.0, -0.5], [0.0, 4.0]]), \
        np.array([[0.2, 0.7], [1.0, 0.1], [0.5, 0.5]])
    exact = np.log(eps + (1 - 2 * eps) * ndtr(
        (mean2[[0, 1, 2], [0, 1, 1]] - mean2[[0, 1, 2], [1, 0, 0]]) / np.sqrt(residual2.sum(axis=1))))
    value2 = lik.conditional_log_density_bound(y2, mean2, np.full_like(mean2, 1e-30), residual2, 20)[0]
    np.testing.assert_allclose(value2, exact, rtol=1e-12)


def test_likelihood_by_name():
    assert L.likelihood_by_name("logistic") is L.LOGISTIC
    assert L.likelihood_by_name(L.PROBIT, multiclass=False) is L.PROBIT
    with pytest.raises(ValueError, match="unknown likelihood 'robust-max'"):
        L.likelihood_by_name("robust-max", multiclass=False)
    with pytest.raises(ValueError, match="unknown likelihood 'agpc.os'"):
        L.likelihood_by_name("agpc.os")
    with pytest.raises(ValueError, match="epsilon"):
        L.RobustMax(1.5)


@pytest.mark.parametrize("n_classes", [2, 4])
def test_the_one_nll_is_scikit_learns_log_loss(n_classes, xp_device):
    """``negative_log_likelihood`` (what validation, early stopping and the command report) against scikit-learn's
    log_loss on the same probabilities, with the result in the input's namespace and on its device."""
    from sklearn.metrics import log_loss

    xp, device = xp_device
    rng = np.random.default_rng(n_classes)
    proba = rng.dirichlet(np.ones(n_classes), size=40)
    truth = rng.integers(0, n_classes, size=40)
    truth[:n_classes] = np.arange(n_classes)  # every class present, as log_loss infers the classes from the labels
    log_proba = to_xp(np.log(proba), xp, device)
    nll = L.negative_log_likelihood(log_proba, xp.asarray(truth, device=device))
    assert nll.shape == () and nll.device == log_proba.device
    assert float(nll) == pytest.approx(log_loss(truth, proba), rel=1e-12)


@pytest.mark.parametrize("dtype, nodes", [(np.float64, 300), (np.float32, 100)])
def test_many_quadrature_nodes_predict_without_a_log_of_zero(dtype, nodes):
    """Past about 150 Gauss-Hermite nodes in float64 (70 in float32) the outer weights underflow to 0, and the
    logistic predictive's log of them was NumPy's "divide by zero" at every prediction (a hostile-input audit and
    the review of its fixes, 2026-12-02); such a weight's term is one no sum can tell from 0."""
    from agpc.likelihoods import LOGISTIC

    mean, var = np.array([-2.0, 0.0, 3.0], dtype=dtype), np.array([0.5, 1.0, 4.0], dtype=dtype)
    from scipy import integrate, special, stats

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_pos, log_neg = LOGISTIC.predictive_log_proba(mean, var, n_quadrature=nodes)
    # (an independent reference: SciPy's adaptive quadrature of sigma(f) N(f | mean, var))
    reference = [integrate.quad(lambda f, m=m, s=s: special.expit(f) * stats.norm.pdf(f, m, s), -np.inf, np.inf,
                                epsabs=1e-13, epsrel=1e-12)[0] for m, s in zip(mean.astype(float), np.sqrt(var.astype(float)))]
    np.testing.assert_allclose(np.exp(log_pos) + np.exp(log_neg), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.exp(log_pos), reference, rtol=1e-5 if dtype == np.float32 else 1e-9)


@pytest.mark.parametrize("likelihood", BINARY, ids=lambda lik: lik.name)
def test_a_confident_row_s_log_probability_is_never_above_zero(likelihood):
    """An estimator-API audit (2026-12-02): the quadrature's weights sum to 1 only to round-off, so a confident
    row's log p(+1) came to +4.4e-16 (a probability of 1.0000000000000004, vi-jj's predict_proba). The two signs'
    probabilities are normalised, their small tails kept to their own precision."""
    mean = np.array([-1e6, -40.0, -3.0, 0.0, 3.0, 40.0, 1e6])
    var = np.array([1e-6, 1.0, 0.5, 2.0, 0.5, 1.0, 1e-6])
    for nodes in (5, 20, 60):
        log_pos, log_neg = (np.asarray(v) for v in likelihood.predictive_log_proba(mean, var, nodes))
        assert np.all(log_pos <= 0.0) and np.all(log_neg <= 0.0)
        assert np.all(np.exp(log_pos) + np.exp(log_neg) <= 1.0 + 2e-16)
        assert np.all(np.isfinite(log_pos[1:-1])) and log_pos[2] < -1.0 and log_neg[-3] < -1.0


def _mills_gap_reference(x, terms=8):
    """lambda(w) + w at w = -x (x >= 30) from the asymptotic series of the Mills ratio, R(x) = (1/x) sum_k (-1)^k
    (2k - 1)!! / x^(2k), in exact rational arithmetic: 1 / R - x, then rounded once. (Independent of the continued
    fraction agpc evaluates; at x >= 30 its first omitted term is below 1e-30 of the sum.)"""
    from fractions import Fraction

    x = Fraction(x)
    total, term = Fraction(0), Fraction(1)
    for k in range(terms):
        total += term
        term = -term * (2 * k + 1) / (x * x)
    return float(1 / (total / x) - x)


@pytest.mark.parametrize("depth", [30.0, 40.0, 1e3, 7e4])
def test_ordinal_outer_classes_keep_gamma_deep_in_the_tail(depth):
    """-d^2 log Z / da^2 of an outer ordinal class is lambda (lambda + w) / b (w = z of its one cut point, lambda the
    inverse Mills ratio); alpha^2 + kappa had cancelled it to the digits of lambda, which exp(log N - log Z) holds to
    |log Z| eps: at w = -7e4 (cut points 1e5 from the data, the audit) gamma was 2185 where it is ~0.5, 1 - v gamma
    negative, and ADF gave up at its first step. Checked against the Mills ratio's asymptotic series, for the lowest
    class below its cut and the highest above its own, and against alpha^2 + kappa where that keeps its digits."""
    cuts = np.array([-1.0, 0.0, 1.0])
    likelihood = L.Ordinal(cuts)
    variance = 2.0
    mean = np.array([-1.0 + depth * math.sqrt(variance), 1.0 - depth * math.sqrt(variance), 0.3, -0.2])
    y = np.array([0.0, 3.0, 0.0, 3.0])  # rows deep in the wrong tail, then two near the data
    terms = likelihood.site_terms(y, mean, np.full(4, variance))
    lam_gap = _mills_gap_reference(depth)
    lam = depth + lam_gap
    for row in (0, 1):
        np.testing.assert_allclose(terms.gamma[row], lam * lam_gap / variance, rtol=1e-12)
        np.testing.assert_allclose(abs(terms.alpha[row]), lam / math.sqrt(variance), rtol=1e-12)
        assert 0.0 < 1.0 - (variance - 1.0) * terms.gamma[row] < 1.0
    direct = terms.alpha[2:] ** 2 + terms.kappa[2:]  # (near the data the two forms agree to round-off)
    np.testing.assert_allclose(terms.gamma[2:], direct, rtol=1e-13)


@pytest.mark.parametrize("depth", [30.0, 1e3, 1e4])
def test_probit_keeps_gamma_deep_in_the_tail(depth, xp_device):
    """The probit's gamma = lambda (lambda + z) / b (lambda = N(z) / Phi(z)) at z = -depth, both label signs, against
    the Mills ratio's asymptotic series in exact arithmetic. lambda + z ~ 1 / depth cancels lambda's relative error
    times depth^2: with lambda from ``inverse_mills_ratio`` (erfcx; the continued fraction on array_api_strict) the
    error is that of its round-off, eps depth^2 (the rtol below), where exp(log N - log Phi), whose exponent errs by
    eps |log Phi| ~ eps depth^2 / 2, had made gamma 1.6 for 1 at depth 1e4 and 1 + 1e-5 at 1e3."""
    xp, device = xp_device
    variance = 2.5
    mean = np.array([-depth, depth]) * math.sqrt(variance)
    y = np.array([1.0, -1.0])  # both rows deep in the wrong tail
    terms = L.PROBIT.site_terms(*(to_xp(a, xp, device) for a in (y, mean, np.full(2, variance))))
    lam_gap = _mills_gap_reference(depth)
    lam = depth + lam_gap
    rtol = max(1e-13, 8.0 * np.finfo(np.float64).eps * depth ** 2)
    np.testing.assert_allclose(to_np(terms.gamma), lam * lam_gap / variance, rtol=rtol)
    np.testing.assert_allclose(to_np(terms.alpha), y * lam / math.sqrt(variance), rtol=1e-13)
    assert np.all(0.0 < 1.0 - (variance - 1.0) * to_np(terms.gamma))


@pytest.mark.parametrize("variance", [2.0, 11.0, 101.0])
def test_ordinal_interior_class_far_outside_its_interval(variance, xp_device):
    """An interior class's row more than 10 sd from its interval (above it and below it): its ratios are N(z) / (Phi(z_hi)
    - Phi(z_lo)), not the one-sided class's inverse Mills ratio, which ``_mills_tail`` had put in their place beyond
    10 sd (b = 11: gamma -0.33 where it is 0.090). Against five-point differences in the mean of log Z written
    independently (SciPy's log_ndtr of the nearer cut and log1p of the farther one's share)."""
    import scipy.special

    xp, device = xp_device
    cuts = np.array([-1.0, 0.0, 1.0])
    sd = math.sqrt(variance)
    means = np.array([10.5 * sd, 15.0 * sd, 30.0 * sd, -1.0 - 10.5 * sd, -1.0 - 30.0 * sd])
    y = np.ones(means.size)  # class 1, the interval (-1, 0)

    def log_z(a):
        z_lo, z_hi = (-1.0 - a) / sd, (0.0 - a) / sd
        near, far = np.where(a > 0, z_hi, -z_lo), np.where(a > 0, z_lo, -z_hi)  # log(Phi(near) - Phi(far))
        return scipy.special.log_ndtr(near) + np.log1p(-np.exp(scipy.special.log_ndtr(far) - scipy.special.log_ndtr(near)))

    h = 0.01 * sd
    f = [log_z(means + k * h) for k in (-2, -1, 0, 1, 2)]
    alpha = (f[0] - 8 * f[1] + 8 * f[3] - f[4]) / (12 * h)
    gamma = -(-f[0] + 16 * f[1] - 30 * f[2] + 16 * f[3] - f[4]) / (12 * h * h)
    terms = L.Ordinal(to_xp(cuts, xp, device)).site_terms(*(to_xp(a, xp, device)
                                                            for a in (y, means, np.full(means.size, variance))))
    np.testing.assert_allclose(to_np(terms.log_z), f[2], rtol=1e-12)
    np.testing.assert_allclose(to_np(terms.alpha), alpha, rtol=1e-7)
    np.testing.assert_allclose(to_np(terms.gamma), gamma, rtol=1e-4)
    assert np.all(0.0 < 1.0 - (variance - 1.0) * to_np(terms.gamma))


def test_adf_fits_ordinal_cut_points_far_from_the_data():
    """The audit: ADF with the ordinal cut points started at [-1e5, 0, 1e5] gave up at its first step (log Z NaN from
    log(1 - v gamma) of a gamma that cancellation made 2185); EP and SEP fitted, scoring 0.31-0.59, their sites built
    of that gamma. With gamma kept, each method fits those rows as from cut points near them."""
    from agpc import RBF, GPClassifier
    from agpc.kernels import OrdinalKernel

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-1.0, 0.0, 1.0])
    for method in ("adf", "sep", "ep"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            model = GPClassifier(method=method, likelihood="ordinal", kernel=OrdinalKernel(RBF(), [-1e5, 0.0, 1e5]),
                                 n_inducing=10, max_iter=5, random_state=0).fit(X, y)
        assert model.score(X, y) > 0.8, method


@pytest.mark.parametrize("epsilon", [0.0, 1.0, -0.1])
def test_robust_max_epsilon_outside_the_open_unit_interval_is_refused(epsilon):
    """The mutation audit of 2026-12-04: robust-max's epsilon must be in (0, 1); at 0 its wrong classes have
    probability 0 (log 0 in its expected entropy and predictive log-probabilities), so it is refused."""
    with pytest.raises(ValueError, match=r"robust-max epsilon must be in \(0, 1\)"):
        L.RobustMax(epsilon=epsilon)
    assert L.RobustMax(epsilon=1e-3).epsilon == 1e-3
