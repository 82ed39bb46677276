"""Variational methods (Izmailov & Kropotov 2017): gradients, bound relations, analytic optima, limits and
quadrature."""

import warnings

import array_api_strict
import numpy as np
import pytest
import scipy.special

from agpc import RBF, GPClassifier
from agpc import backend as B
from agpc.datasets import banana_bayes_error, make_banana
from agpc.inference import variational as V
from agpc.kernels import Matern52
from conftest import central_differences, check_parameter_gradients, to_np, to_xp
from reference_full_gp_ep import full_gp_ep, full_gp_predict

JITTER = 1e-6


def _problem(n=40, m=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    mean = 0.3 * rng.normal(size=m)
    chol = np.tril(0.2 * rng.normal(size=(m, m))) + 0.8 * np.eye(m)
    return X, y, X[:m] + 0.1, mean, chol


@pytest.mark.parametrize("likelihood", ["probit", "logistic"])
def test_svi_elbo_gradients_match_finite_differences(likelihood, xp_device):
    """Every gradient of eq. 11: kernel parameters, Z (at fixed whitened q), the whitened mean and Cholesky factor."""
    xp, device = xp_device
    X_np, y_np, Z_np, mean_np, chol_np = _problem()
    X, y, Z = to_xp(X_np, xp, device), to_xp(y_np, xp, device), to_xp(Z_np, xp, device)
    mean, chol = to_xp(mean_np, xp, device), to_xp(chol_np, xp, device)
    kernel = RBF(lengthscales=[0.9, 1.2], amplitude=1.5, noise=0.05).for_inputs(X)

    def elbo(k=kernel, ZZ=Z, mu=mean, L=chol):
        return float(V.svi_elbo(k, ZZ, X, y, mu, L, likelihood=likelihood, n_total=100, want_grad=False)[0])

    _, grads = V.svi_elbo(kernel, Z, X, y, mean, chol, likelihood=likelihood, n_total=100)
    check_parameter_gradients(kernel, grads, Z, lambda k, ZZ: elbo(k=k, ZZ=ZZ), xp, device, rtol=1e-6, atol=1e-6)
    numeric = central_differences(lambda v: elbo(mu=to_xp(v, xp, device)), mean_np)
    np.testing.assert_allclose(to_np(grads["whitened_mean"]), numeric, rtol=1e-6, atol=1e-6)
    numeric = central_differences(lambda v: elbo(L=to_xp(np.tril(v), xp, device)), chol_np)
    np.testing.assert_allclose(to_np(grads["whitened_chol"]), np.tril(numeric), rtol=1e-6, atol=1e-6)


def test_svi_elbo_gradients_do_not_depend_on_the_row_blocks(xp_device, monkeypatch):
    """The data term's m x m sums (``SVIBoundTerms``: S = A G A^T, and d L_w's S L_w once a step for blocks of at
    least m / 2 rows, each narrower block's (A G) (L_w^T A)^T on its own) give the gradients of one block of all rows
    whatever the layout: all narrow (blocks of 4 rows, m = 10), wide and narrow mixed (12, 12, 12, 4) and all wide
    (7); the one block's are held to finite differences above. On NumPy, dKmm's congruence by sygst gives them too."""
    xp, device = xp_device
    X_np, y_np, _, _, _ = _problem(n=40)
    rng = np.random.default_rng(3)
    Z_np = X_np[:10] + 0.1
    mean_np = 0.3 * rng.normal(size=10)
    chol_np = np.tril(0.2 * rng.normal(size=(10, 10))) + 0.8 * np.eye(10)
    X, y, Z = to_xp(X_np, xp, device), to_xp(y_np, xp, device), to_xp(Z_np, xp, device)
    mean, chol = to_xp(mean_np, xp, device), to_xp(chol_np, xp, device)
    kernel = RBF(lengthscales=[0.9, 1.2], amplitude=1.5, noise=0.05).for_inputs(X)

    def elbo(block_rows):
        return V.svi_elbo(kernel, Z, X, y, mean, chol, n_total=100, block_rows=block_rows)

    value, whole = elbo(40)
    if xp is not array_api_strict:  # (dKmm's congruence by one sygst, as at large m on one thread: the same gradients)
        monkeypatch.setattr(B, "congruence_by_sygst", lambda T: True)
        with B.counting_fast_calls() as calls:
            _, by_sygst = elbo(40)
        assert calls["dsygst"] == 1
        for key in whole:
            np.testing.assert_allclose(by_sygst[key], whole[key], rtol=1e-9, atol=1e-12, err_msg=key)
    for block_rows in (4, 12, 7):
        value_b, grads = elbo(block_rows)
        np.testing.assert_allclose(float(value_b), float(value), rtol=1e-12)
        for key in whole:
            np.testing.assert_allclose(to_np(grads[key]), to_np(whole[key]), rtol=1e-9, atol=1e-12,
                                       err_msg=f"{block_rows} {key}")


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_quadratic_bound_gradients_match_finite_differences(kind, xp_device):
    xp, device = xp_device
    X_np, y_np, Z_np, _, _ = _problem()
    X, y, Z = to_xp(X_np, xp, device), to_xp(y_np, xp, device), to_xp(Z_np, xp, device)
    xi_np = np.abs(np.random.default_rng(1).normal(size=len(y_np))) + 0.1
    xi = to_xp(xi_np, xp, device)
    kernel = Matern52(lengthscales=[0.9, 1.2], amplitude=1.5, noise=0.05).for_inputs(X)

    def value(k=kernel, ZZ=Z, x=xi):
        return float(V.quadratic_bound(k, ZZ, X, y, x, kind=kind, want_grad=False)["value"])

    out = V.quadratic_bound(kernel, Z, X, y, xi, kind=kind, want_xi_grad=(kind == "jj"))
    check_parameter_gradients(kernel, out["grads"], Z, lambda k, ZZ: value(k=k, ZZ=ZZ), xp, device, rtol=1e-6, atol=1e-7)
    if kind == "jj":  # the xi gradient used by vi-JJ-hybrid and -full
        numeric = central_differences(lambda v: value(x=to_xp(v, xp, device)), xi_np)
        np.testing.assert_allclose(to_np(out["xi_grad"]), numeric, rtol=1e-6, atol=1e-7)


def _uncollapsed_bound(kernel, Z, X, y, xi, mean, Sigma, kind):
    """J(mu, Sigma, xi) of Izmailov & Kropotov (2017), sec. 4 written out directly (NumPy): sum_i E_q[quadratic in f_i]
    - KL."""
    K = np.asarray(kernel.K(Z)) + JITTER * np.eye(len(Z))
    Knm = np.asarray(kernel.K(X, Z))
    Kinv = np.linalg.inv(K)
    m = Knm @ Kinv @ mean
    S = np.asarray(kernel.Kdiag(X)) - np.einsum("ij,jk,ik->i", Knm, Kinv, Knm) + np.einsum(
        "ij,jk,ik->i", Knm @ Kinv, Sigma, Knm @ Kinv
    )
    if kind == "jj":
        lam = np.tanh(xi / 2) / (4 * xi)
        expected = np.log(scipy.special.expit(xi)) + (y * m - xi) / 2 - lam * (m**2 + S - xi**2)
    else:
        s = scipy.special.expit(y * xi)
        phi, psi = y * (1 - s), 0.5 * s * (1 - s)
        expected = np.log(scipy.special.expit(y * xi)) + phi * (m - xi) - psi * ((m - xi) ** 2 + S)
    kl = 0.5 * (np.trace(Kinv @ Sigma) + mean @ Kinv @ mean - len(Z) + np.linalg.slogdet(K)[1] - np.linalg.slogdet(Sigma)[1])
    return expected.sum() - kl


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_analytic_q_is_the_optimum_of_the_uncollapsed_bound(kind):
    """Eqs. 12-13 / 17-18: at the analytic (mu, Sigma) the bound's gradient in mu and Sigma is zero, and
    the collapsed value (eqs. 14 / 19 plus the xi terms) equals the uncollapsed bound there."""
    X, y, Z, _, _ = _problem(n=30, m=5, seed=3)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.3, noise=0.05).for_inputs(X)
    xi = np.abs(np.random.default_rng(2).normal(size=len(y))) + 0.2
    out = V.quadratic_bound(kernel, Z, X, y, xi, kind=kind, want_grad=False)
    mean, Sigma = (np.asarray(a) for a in out["posterior"].mean_and_cov())
    J = lambda mu, S: _uncollapsed_bound(kernel, Z, X, y, xi, mu, S, kind)  # noqa: E731
    assert abs(J(mean, Sigma) - float(out["value"])) < 1e-8 * max(1.0, abs(float(out["value"])))
    g_mean = central_differences(lambda v: J(v, Sigma), mean, h=1e-5)
    sym = lambda E: (E + E.T) / 2  # noqa: E731
    g_sigma = central_differences(lambda v: J(mean, Sigma + sym(v - Sigma)), Sigma, h=1e-5)
    # scale: the same gradients one step away from the optimum
    g_away = central_differences(lambda v: J(v, Sigma), mean + 0.3, h=1e-5)
    assert np.max(np.abs(g_mean)) < 1e-6 * max(1.0, np.max(np.abs(g_away)))
    assert np.max(np.abs(g_sigma)) < 1e-5


def test_jj_bound_lies_below_the_quadrature_elbo():
    """log sigma(t) >= its JJ quadratic for every t, so for the same q the JJ bound is below eq. 11
    (computed with 100 Gauss-Hermite nodes); equality would need xi^2 = f^2 everywhere."""
    X, y, Z, _, _ = _problem(n=50, m=6, seed=4)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.3, noise=0.05).for_inputs(X)
    rng = np.random.default_rng(5)
    for xi in (np.full(len(y), 0.5), np.abs(rng.normal(size=len(y))) * 2 + 0.1):
        out = V.quadratic_bound(kernel, Z, X, y, xi, kind="jj", want_grad=False)
        mean, Sigma = (np.asarray(a) for a in out["posterior"].mean_and_cov())
        whitened = V.whitened_from_unwhitened(kernel, Z, mean, np.linalg.cholesky(Sigma), jitter=JITTER)
        elbo, _ = V.svi_elbo(kernel, Z, X, y, *whitened, likelihood="logistic", n_quadrature=100, want_grad=False)
        assert float(out["value"]) <= float(elbo) + 1e-9


def test_quadrature_converges_at_twenty_nodes():
    """Expected log-likelihoods with 20 and 100 nodes agree to 1e-8 on moderate inputs: |m| <= 3 and
    var <= 1 (measured: 2e-10 for the probit there; at var up to 2 the gap grows to 5e-8, so 20 nodes
    are a default, not a guarantee, for very uncertain latents -- raise n_quadrature there)."""
    rng = np.random.default_rng(0)
    mean = rng.uniform(-3, 3, 200)
    var = rng.uniform(0.01, 1.0, 200)
    y = np.where(rng.random(200) < 0.5, -1.0, 1.0)
    for likelihood in ("probit", "logistic"):
        e20, _, _ = V.expected_log_likelihood(y, mean, var, likelihood, 20)
        e100, _, _ = V.expected_log_likelihood(y, mean, var, likelihood, 100)
        np.testing.assert_allclose(e20, e100, atol=1e-8, rtol=0)


def test_svi_with_inducing_points_at_the_data_approaches_the_full_gp():
    """Z = X, no latent noise, probit, kernel fixed: the optimum of eq. 11 is the full-GP variational
    posterior. It is found here with L-BFGS on (mean, chol) -- the test is about the bound's optimum, not
    about an optimiser -- and compared with the textbook full-GP EP: VI and EP are different
    approximations, so we require predictive means within 2% of the EP means' range and probabilities
    within 0.01 (measured: 0.1% and 8e-4), and the bound below EP's log Z + 0.1."""
    import scipy.optimize

    from agpc.inference.ep import predict_latent

    rng = np.random.default_rng(7)
    n = 15
    X = np.sort(rng.uniform(-3, 3, size=(n, 1)), axis=0)
    y = np.where(np.sin(1.5 * X[:, 0]) > 0, 1.0, -1.0)
    k = RBF(lengthscales=[0.9], amplitude=2.0, noise=0.0).for_inputs(X)
    tril = np.tril_indices(n)

    K = np.asarray(k.K(X)) + JITTER * np.eye(n)

    def unpack(v):  # q held whitened: (m_w, L_w)
        L_w = np.zeros((n, n))
        L_w[tril] = v[n:]
        return v[:n], L_w

    def negative_elbo(v):
        value, g = V.svi_elbo(k, X, X, y, *unpack(v), likelihood="probit", jitter=JITTER)
        return -float(value), -np.concatenate([g["whitened_mean"], g["whitened_chol"][tril]])

    start = np.concatenate([np.zeros(n), np.eye(n)[tril]])
    fit = scipy.optimize.minimize(negative_elbo, start, jac=True, method="L-BFGS-B",
                                  options={"maxiter": 20000, "maxfun": 40000, "gtol": 1e-10, "ftol": 1e-15})
    posterior = V.posterior_from_whitened(k, X, *unpack(fit.x), jitter=JITTER)
    X_test = np.linspace(-3.5, 3.5, 29)[:, None]
    mean_vi, var_vi = (np.asarray(a) for a in predict_latent(k, X, posterior, X_test))
    ref = full_gp_ep(K, y)
    mean_ep, _, prob_ep = full_gp_predict(K, y, ref, np.asarray(k.K(X, X_test)), np.full(len(X_test), 2.0))
    assert np.max(np.abs(mean_vi - mean_ep)) < 0.02 * np.ptp(mean_ep)
    prob_vi = scipy.special.ndtr(mean_vi / np.sqrt(1 + var_vi))
    assert np.max(np.abs(prob_vi - prob_ep)) < 0.01
    assert -fit.fun < ref["log_z"] + 0.1


@pytest.mark.parametrize("method", ["svi", "vi-jj", "vi-jj-hybrid", "vi-jj-full", "vi-taylor"])
def test_variational_estimators_learn_banana(method):
    X, y = make_banana(500, random_state=0)
    X_test, y_test = make_banana(3000, random_state=1)
    max_iter = 300 if method == "svi" else 15
    model = GPClassifier(method=method, n_inducing=20, max_iter=max_iter, random_state=0).fit(X, y)
    assert model.likelihood_ == ("probit" if method == "svi" else "logistic")
    error = 1 - model.score(X_test, y_test)
    assert error < banana_bayes_error() + 0.04, error
    proba = model.predict_proba(X_test)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-10)


def test_logistic_model_round_trips_through_a_file(tmp_path):
    X, y = make_banana(300, random_state=0)
    model = GPClassifier(method="vi-taylor", n_inducing=10, max_iter=5, random_state=0).fit(X, y)
    model.save(tmp_path / "m.agpc")
    loaded = GPClassifier.load(tmp_path / "m.agpc")
    assert loaded.likelihood_ == "logistic"
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-12)


def test_likelihood_choices_are_checked():
    X, y = make_banana(100, random_state=0)
    with pytest.raises(ValueError, match="built on the logistic likelihood"):
        GPClassifier(method="vi-jj", likelihood="probit", n_inducing=5).fit(X, y)
    with pytest.raises(ValueError, match="uses the probit likelihood"):
        GPClassifier(method="ep", likelihood="logistic", n_inducing=5).fit(X, y)


def test_svi_elbo_weights_padding_and_gradients(xp_device):
    """Per-row weights: a minibatch padded with rows of weight 0 gives the bound and gradients of the
    minibatch without them (scaled to n_total by the rows it stands for), and with any weights every
    gradient matches finite differences of the weighted bound."""
    xp, device = xp_device
    X_np, y_np, Z_np, mean_np, chol_np = _problem()
    X, y, Z = to_xp(X_np, xp, device), to_xp(y_np, xp, device), to_xp(Z_np, xp, device)
    mean, chol = to_xp(mean_np, xp, device), to_xp(chol_np, xp, device)
    kernel = RBF(lengthscales=[0.9, 1.2], amplitude=1.5, noise=0.05).for_inputs(X)
    padding = np.r_[np.ones(30), np.zeros(10)]
    value, grads = V.svi_elbo(kernel, Z, X, y, mean, chol, n_total=100, weights=to_xp(padding, xp, device))
    ref_value, ref_grads = V.svi_elbo(kernel, Z, X[:30, ...], y[:30], mean, chol, n_total=100)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-12)
    for name in ref_grads:
        np.testing.assert_allclose(to_np(grads[name]), to_np(ref_grads[name]), rtol=1e-10, atol=1e-12, err_msg=name)

    weights = to_xp(np.random.default_rng(3).uniform(0.2, 2.0, size=40), xp, device)

    def elbo(k=kernel, ZZ=Z, mu=mean, L=chol):
        return float(V.svi_elbo(k, ZZ, X, y, mu, L, n_total=100, weights=weights, want_grad=False)[0])

    _, grads = V.svi_elbo(kernel, Z, X, y, mean, chol, n_total=100, weights=weights)
    check_parameter_gradients(kernel, grads, Z, lambda k, ZZ: elbo(k=k, ZZ=ZZ), xp, device, rtol=1e-6, atol=1e-6)
    numeric = central_differences(lambda v: elbo(mu=to_xp(v, xp, device)), mean_np)
    np.testing.assert_allclose(to_np(grads["whitened_mean"]), numeric, rtol=1e-6, atol=1e-6)
    numeric = central_differences(lambda v: elbo(L=to_xp(np.tril(v), xp, device)), chol_np)
    np.testing.assert_allclose(to_np(grads["whitened_chol"]), np.tril(numeric), rtol=1e-6, atol=1e-6)


def test_jj_xi_of_a_variance_a_rounding_error_below_zero_is_the_mean_not_nan():
    """xi^2 = m^2 + S (Izmailov & Kropotov (2017), eq. 15) with S a variance: a slightly negative S from rounding is
    clamped at 0 (xi = |m|) instead of giving sqrt of a negative number."""
    mean = np.array([0.0, 0.3, -2.0, 1.0])
    var = np.array([-1e-12, -1e-9, 0.5, 0.0])
    xi = V.update_xi(mean, var, "jj")
    np.testing.assert_array_equal(xi, np.sqrt(mean**2 + np.maximum(var, 0.0)))
    assert np.all(np.isfinite(V.jj_lambda(xi)))


def test_vi_jj_with_duplicated_inducing_points_and_no_jitter_fits_and_predicts():
    """Duplicated inducing points with jitter 0 (an ill-conditioned K_uu): vi-JJ's xi used to become NaN
    (sqrt of a variance rounded below zero), the step diverged with nothing to halve; and the predictive
    variance's Schur complement K_** - K_*u K_uu^-1 K_u* came out negative. Both are clamped where the
    formulas allow (Izmailov & Kropotov (2017), eq. 15, Hernandez-Lobato & Hernandez-Lobato (2016), eq. 36): the fit
    ends, the variances are not negative and the probabilities are finite and sum to one."""
    X, y = make_banana(400, random_state=2)
    Z = np.concatenate([X[:4], X[:4]])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # the JitterWarning (tested in test_loop)
        model = GPClassifier(method="vi-jj", inducing=Z, jitter=0.0, max_iter=10, random_state=0).fit(X, y)
    _, var = model.predict_latent(X)
    assert np.all(var >= 0)
    proba = model.predict_proba(X)
    assert np.all(np.isfinite(proba))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)


def test_logistic_predictive_log_proba_keeps_tails_that_underflow_in_probability():
    """With a large amplitude (1e8) the latent mean is ~1e4 and sigma(-f) underflows at every node: the log of
    the summed probabilities was -inf with "divide by zero encountered in log". Reference, independent of agpc's
    Gauss-Legendre panels: for mean m <= 0, E sigma(f) = Phi(m / sd) + int_0^inf sigma(-s) [N(s | -m, var) -
    N(s | m, var)] ds (sigma less the step at 0, folded onto s > 0), both terms positive, the integral by SciPy's
    adaptive quadrature scaled by its largest integrand; for m > 0 by symmetry, log(1 - p(-m))."""
    from scipy import integrate
    from scipy.special import log_expit, log_ndtr
    from scipy.stats import norm

    from agpc.inference.variational import predictive_log_proba

    def small_side(m, v):  # log E sigma(f), f ~ N(m, v), m <= 0
        sd = np.sqrt(v)
        end = max(80.0, -m + 40 * sd)

        def log_integrand(s):
            return log_expit(-s) + norm.logpdf(s, -m, sd) + np.log1p(-np.exp(2 * s * m / v))

        grid = np.linspace(1e-9, end, 400_001)
        top = log_integrand(grid).max()
        value = integrate.quad(lambda s: np.exp(log_integrand(s) - top) if s > 0 else 0.0, 0.0, end,
                               points=[min(-m + v, end / 2), 1.0], limit=2000, epsabs=0, epsrel=1e-13)[0]
        return np.logaddexp(log_ndtr(m / sd), top + np.log(value))

    def reference(m, v):
        return small_side(m, v) if m <= 0 else np.log1p(-np.exp(small_side(-m, v)))

    mean = np.array([-1e4, -50.0, 0.3, 50.0, 1e4])
    var = np.array([1e8, 1.0, 2.0, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_pos, log_neg = predictive_log_proba(mean, var, "logistic", n_quadrature=20)
    near_zero = 8 * np.finfo(np.float64).eps  # (near log 1 = 0 the error is absolute)
    np.testing.assert_allclose(log_pos, [reference(m, v) for m, v in zip(mean, var)], rtol=1e-8, atol=near_zero)
    np.testing.assert_allclose(log_neg, [reference(-m, v) for m, v in zip(mean, var)], rtol=1e-8, atol=near_zero)
    assert np.all(np.isfinite(log_pos)) and np.all(np.isfinite(log_neg))


def test_the_jj_lambda_slope_is_its_derivative_on_both_sides_of_the_small_argument_switch():
    """A mutation audit (2026-12-02): jj_lambda_prime's branch for |xi| < 1e-4 (the series -xi / 48) with its sign
    flipped passed every test. Against central differences of jj_lambda, on both sides of the switch and of 0."""
    xi = np.array([-2e-4, -1.01e-4, -9.9e-5, -5e-5, -1e-5, 1e-5, 5e-5, 9.9e-5, 1.01e-4, 2e-4, 0.3, -2.0])
    step = 1e-6
    numeric = (V.jj_lambda(xi + step) - V.jj_lambda(xi - step)) / (2.0 * step)
    np.testing.assert_allclose(V.jj_lambda_prime(xi), numeric, rtol=1e-4, atol=1e-12)
    assert np.all(np.sign(V.jj_lambda_prime(xi)) == -np.sign(xi))  # (lambda falls away from 0 on both sides)


def test_the_svi_kl_is_the_gaussian_kl_to_the_whitened_prior():
    """A mutation audit (2026-12-02): the KL of ``SVIBoundTerms`` off by a constant (0.5 nats) passed every test (its
    gradients do not see it). KL(N(m, L L^T) || N(0, I)) in closed form, and 0 at q = the prior."""
    X, _ = make_banana(40, random_state=1)
    Z = X[:6]
    kernel = RBF(lengthscales=[1.0, 1.0]).for_inputs(X)
    rng = np.random.default_rng(3)
    mean = rng.normal(size=6)
    chol = np.tril(rng.normal(scale=0.3, size=(6, 6)), -1) + np.diag(rng.uniform(0.4, 1.5, 6))
    S = chol @ chol.T
    expected = 0.5 * (np.trace(S) + mean @ mean - 6 - np.linalg.slogdet(S)[1])
    np.testing.assert_allclose(float(V.SVIBoundTerms(kernel, Z, mean, chol, 1e-6).kl), expected, rtol=1e-12)
    assert float(V.SVIBoundTerms(kernel, Z, np.zeros(6), np.eye(6), 1e-6).kl) == 0.0
