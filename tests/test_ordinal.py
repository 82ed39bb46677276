"""Ordinal classification (Chu & Ghahramani 2005): the ordinal probit likelihood's EP moments and derivatives, the
gradients of log Z_q (EP, SEP, ADF) and of the SVI bound in the cut points and the kernel's parameters, the case of
two classes, the full-GP limit against an independent textbook EP, recovery of known cut points, and the estimator's
paths (save / load, checkpoints, refusals, array_api_strict)."""

import io

import array_api_strict
import numpy as np
import pytest
from scipy import integrate, stats

from agpc import GPClassifier
from agpc.inference import ep, variational
from agpc.kernels import RBF, OrdinalKernel
from agpc.likelihoods import PROBIT, Ordinal
from agpc.uncertainty import ordinal_expected_entropy
from helpers import interrupted_then_resumed

CUTS = np.array([-1.0, 0.2, 1.1])


def ordinal_data(n, seed, cuts=CUTS, d=1):
    """Rows and class indices drawn from the ordinal model: f = 2 sin(x_0), y = #{j: b_j < f + e}, e ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, size=(n, d))
    return X, np.searchsorted(cuts, 2.0 * np.sin(X[:, 0]) + rng.normal(size=n))


def _kernel(X, cuts=CUTS):
    return OrdinalKernel(RBF(lengthscales=[1.0] * X.shape[1], amplitude=2.0, noise=1e-3), cuts).for_inputs(X)


def _numeric_grads(value_at, kernel, keys, step=1e-6):
    """Central differences of ``value_at(kernel)`` in every entry of the kernel's parameters ``keys``."""
    out = {}
    for key in keys:
        base = np.array(kernel.params[key], dtype=float)
        grad = np.zeros(base.size)
        for i in range(base.size):
            for sign in (1.0, -1.0):
                moved = base.copy().ravel()
                moved[i] += sign * step
                params = dict(kernel.params, **{key: moved.reshape(base.shape)})
                grad[i] += sign * float(value_at(kernel.with_params(params))) / (2.0 * step)
        out[key] = grad
    return out


# -- the likelihood ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a, total_var", [(0.3, 2.5), (-4.0, 1.2), (6.0, 1.5), (0.0, 40.0)])
def test_tilted_moments_match_quadrature(a, total_var):
    """log Z, the tilted mean a + v alpha and variance v - v^2 gamma (v = b - 1, the cavity's variance) of every
    class, against scipy.integrate.quad of Phi(b_hi - f) - Phi(b_lo - f) times N(f | a, v)."""
    likelihood = Ordinal(CUTS)
    bounds = np.concatenate([[-np.inf], CUTS, [np.inf]])
    v = total_var - 1.0
    for k in range(len(CUTS) + 1):
        terms = likelihood.site_terms(np.array([float(k)]), np.array([a]), np.array([total_var]))

        def moment(power):
            integrand = lambda f: f**power * (stats.norm.cdf(bounds[k + 1] - f) - stats.norm.cdf(bounds[k] - f)) \
                * stats.norm.pdf(f, a, np.sqrt(v))  # noqa: E731
            return integrate.quad(integrand, a - 40 * np.sqrt(v), a + 40 * np.sqrt(v), epsabs=0, epsrel=1e-11,
                                  limit=200)[0]

        z0 = moment(0)
        mean = moment(1) / z0
        var = moment(2) / z0 - mean**2
        np.testing.assert_allclose(terms.log_z[0], np.log(z0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(a + v * terms.alpha[0], mean, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(v - v * v * terms.gamma[0], var, rtol=1e-6, atol=1e-9)


def test_site_terms_derivatives_by_finite_differences():
    """alpha, gamma, kappa and the cut-point slopes are the derivatives of log Z in a, a twice, b and the cuts."""
    likelihood = Ordinal(CUTS)
    y = np.array([0.0, 1.0, 2.0, 3.0, 1.0])
    a = np.array([0.4, -2.0, 1.0, 3.0, 7.0])
    b = np.array([1.5, 3.0, 1.1, 2.0, 1.3])
    t = likelihood.site_terms(y, a, b)
    h = 1e-6
    log_z = lambda a_, b_, cuts=CUTS: Ordinal(cuts).site_terms(y, a_, b_).log_z  # noqa: E731
    np.testing.assert_allclose(t.alpha, (log_z(a + h, b) - log_z(a - h, b)) / (2 * h), rtol=1e-6, atol=1e-9)
    alpha = lambda a_: Ordinal(CUTS).site_terms(y, a_, b).alpha  # noqa: E731
    np.testing.assert_allclose(t.gamma, -(alpha(a + h) - alpha(a - h)) / (2 * h), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(t.kappa, -2 * (log_z(a, b + h) - log_z(a, b - h)) / (2 * h), rtol=1e-6, atol=1e-9)
    for j in range(len(CUTS)):
        moved = lambda s: CUTS + s * h * (np.arange(len(CUTS)) == j)  # noqa: E731
        numeric = (log_z(a, b, moved(1.0)) - log_z(a, b, moved(-1.0))) / (2 * h)
        analytic = likelihood.cut_point_gradient(t.cut_slopes, np.ones_like(a))[j]
        np.testing.assert_allclose(analytic, numeric.sum(), rtol=1e-6, atol=1e-9)


def test_far_tail_stays_finite():
    """An interval deep in either tail (both CDFs round to 0 or to 1) keeps finite log Z and moments."""
    terms = Ordinal(CUTS).site_terms(np.array([0.0, 3.0, 1.0, 2.0]), np.array([60.0, -60.0, 60.0, -60.0]),
                                     np.array([1.0, 1.0, 1.0, 1.0]))
    for values in (terms.log_z, terms.alpha, terms.gamma, terms.kappa):
        assert np.all(np.isfinite(values))
    assert np.all(terms.gamma > 0)


# -- gradients of the objectives -----------------------------------------------------------------------------

def _converged_batch_ep(kernel, Z, X, y):
    nu = mu = np.zeros(X.shape[0])
    for _ in range(300):
        out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=1e-8, damping=0.5, want_grad=False)
        nu, mu = out["site_precision"], out["site_shift"]
    return nu, mu


def test_batch_ep_log_z_gradient_by_finite_differences():
    """At an EP fixed point, d log Z_q / d theta for every kernel parameter and the cut points (first and log
    gaps) equals the central difference of log Z_q at those sites (eq. 4 holds there)."""
    X, y = ordinal_data(40, 0, d=2)
    kernel, Z = _kernel(X), X[:6].copy()
    nu, mu = _converged_batch_ep(kernel, Z, X, y.astype(float))
    out = ep.evaluate(kernel, Z, X, y.astype(float), nu, mu, jitter=1e-8)
    numeric = _numeric_grads(lambda k: ep.evaluate(k, Z, X, y.astype(float), nu, mu, jitter=1e-8)["log_z"],
                             kernel, list(kernel.params))
    assert {"first_cut_point", "log_cut_gaps"} <= set(out["grads"])
    for key, value in numeric.items():
        np.testing.assert_allclose(np.ravel(out["grads"][key]), value, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("method", ["ep", "sep", "adf"])
def test_factor_passes_cut_point_gradient_by_finite_differences(method):
    """Minibatch EP, SEP and ADF (``evaluate_factor``): the cavity does not depend on the cut points, so the
    gradient of the log Z_q estimate in them is exact at any sites and factor."""
    X, y = ordinal_data(30, 1, d=2)
    kernel, Z = _kernel(X), X[:5].copy()
    rng = np.random.default_rng(2)
    factor = ep.Factor(np.eye(5) * 0.3, rng.normal(size=5) * 0.1)
    sites = dict(site_precision=rng.uniform(0.05, 0.3, 30), site_shift=rng.normal(size=30) * 0.1) \
        if method == "ep" else {}

    def log_z(k, want_grad=False):
        return ep.evaluate_factor(k, Z, X, y.astype(float), factor, method=method, n_total=90, jitter=1e-8,
                                  want_grad=want_grad, **sites)

    out = log_z(kernel, want_grad=True)
    numeric = _numeric_grads(lambda k: log_z(k)["log_z"], kernel, ["first_cut_point", "log_cut_gaps"])
    for key, value in numeric.items():
        np.testing.assert_allclose(np.ravel(out["grads"][key]), value, rtol=1e-5, atol=1e-7, err_msg=key)


def test_svi_elbo_gradient_by_finite_differences():
    """The SVI bound (Gauss-Hermite expected log density): its gradient in every kernel parameter and the cut
    points, at a q that is not the optimum, with weights."""
    X, y = ordinal_data(30, 3, d=2)
    kernel, Z = _kernel(X), X[:5].copy()
    rng = np.random.default_rng(4)
    mean, chol = rng.normal(size=5) * 0.3, np.tril(rng.normal(size=(5, 5)) * 0.1) + 0.8 * np.eye(5)
    weights = rng.uniform(0.5, 2.0, size=30)

    def elbo(k, want_grad=False):
        return variational.svi_elbo(k, Z, X, y.astype(float), mean, chol, likelihood="ordinal", want_grad=want_grad,
                                    weights=weights)

    value, grads = elbo(kernel, want_grad=True)
    numeric = _numeric_grads(lambda k: elbo(k)[0], kernel, list(kernel.params))
    for key, numbers in numeric.items():
        np.testing.assert_allclose(np.ravel(grads[key]), numbers, rtol=1e-5, atol=1e-7, err_msg=key)


# -- two classes: the binary probit with a shifted latent ----------------------------------------------------

def test_two_classes_is_the_probit_with_a_shifted_latent():
    """p(y = 1 | f) = 1 - Phi(b_1 - f) = Phi(f - b_1): the ordinal site at cavity mean a is the probit's at a - b_1
    (log Z, alpha, gamma equal; kappa = alpha (a - b_1) / b; d log Z / d b_1 = -alpha), and with b_1 = 0 batch EP
    gives the binary model's log Z_q, sites, kernel gradient and predictive (the latent's prior mean cannot shift
    in the binary model, so only b_1 = 0 compares whole models)."""
    rng = np.random.default_rng(5)
    y_pm = np.where(rng.random(20) < 0.5, -1.0, 1.0)
    a, b = rng.normal(size=20) * 2, 1.0 + rng.uniform(0.1, 3.0, size=20)
    cut = 0.7
    ordinal = Ordinal(np.array([cut])).site_terms(y_pm, a, b)
    log_z, alpha, gamma = PROBIT.tilted_moments(y_pm, a - cut, b)
    np.testing.assert_allclose(ordinal.log_z, log_z, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(ordinal.alpha, alpha, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ordinal.gamma, gamma, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(ordinal.kappa, alpha * (a - cut) / b, rtol=1e-11, atol=1e-14)
    upper, lower, _ = ordinal.cut_slopes
    np.testing.assert_allclose(upper + lower, -alpha, rtol=1e-12, atol=1e-14)

    X, y = ordinal_data(50, 6, cuts=np.array([0.0]), d=2)
    y_pm = np.where(y == 1, 1.0, -1.0)
    latent = RBF(lengthscales=[1.0, 1.0], amplitude=2.0, noise=1e-3).for_inputs(X)
    kernel = OrdinalKernel(latent, [0.0]).for_inputs(X)
    Z = X[:7].copy()
    nu, mu = _converged_batch_ep(kernel, Z, X, y_pm)
    got = ep.evaluate(kernel, Z, X, y_pm, nu, mu, jitter=1e-8)
    want = ep.evaluate(latent, Z, X, y_pm, nu, mu, jitter=1e-8)
    np.testing.assert_allclose(float(got["log_z"]), float(want["log_z"]), rtol=1e-12)
    np.testing.assert_allclose(got["site_precision"], want["site_precision"], rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(got["site_shift"], want["site_shift"], rtol=1e-10, atol=1e-13)
    for key in latent.params:
        np.testing.assert_allclose(got["grads"][key], want["grads"][key], rtol=1e-9, atol=1e-12)
    mean, var = ep.predict_latent(latent, Z, want["posterior"], X)
    log_pos, log_neg = PROBIT.predictive_log_proba(mean, var)
    np.testing.assert_allclose(Ordinal(np.array([0.0])).class_log_proba(mean, var),
                               np.stack([log_neg, log_pos], axis=1), rtol=1e-12, atol=1e-14)
