"""Full-GP EP (``agpc.inference.exact_ep``, the exact model of ``n_inducing="all"`` / ``"auto"`` on small data): the
textbook reference (Rasmussen & Williams 2006, Alg. 3.5), finite differences of its gradient, the inducing-point EP it
is the m = n limit of, and its cost (one n x n factorisation a pass, one more inverse from it for the gradient)."""

import numpy as np
import pytest

from agpc import GPClassifier
from agpc.inference import ep, exact_ep, training
from agpc.kernels import RBF, Matern52
from conftest import central_differences, to_np, to_xp
from helpers import binary_toy
from reference_full_gp_ep import full_gp_ep, full_gp_predict, tilted_moments


def _check_gradients(kernel, grads, log_z, xp, device):
    """Every kernel parameter's entry of ``grads`` against central differences of ``log_z(kernel)``."""
    for name, value in kernel.params.items():
        numeric = central_differences(lambda p: log_z(kernel.with_params({**kernel.params, name: to_xp(p, xp, device)})),
                                      to_np(value))
        np.testing.assert_allclose(to_np(grads[name]), numeric, rtol=1e-5, atol=1e-6, err_msg=name)
        assert grads[name].device == value.device


def _assert_same_pass(exact, inducing, names):
    """The full-GP pass and the inducing-point pass on Z = X agree: log Z_q, the new sites, the gradients of
    ``names``."""
    assert abs(float(exact["log_z"]) - float(inducing["log_z"])) < 1e-6
    np.testing.assert_allclose(exact["site_precision"], inducing["site_precision"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(exact["site_shift"], inducing["site_shift"], rtol=1e-5, atol=1e-7)
    for name in names:
        np.testing.assert_allclose(exact["grads"][name], inducing["grads"][name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_equals_the_textbook_full_gp_ep():
    """No latent noise, K + jitter as the reference's prior: the reference's converged sites are a fixed point of the
    pass, its log Z_EP (R&W eq. 3.65) is the pass's log Z_q, and a classifier with the exact model predicts the
    reference's probabilities (R&W Alg. 3.6)."""
    rng = np.random.default_rng(7)
    n = 25
    X = np.sort(rng.uniform(-3, 3, size=(n, 1)), axis=0)
    y = np.where(np.sin(1.5 * X[:, 0]) + 0.4 * rng.normal(size=n) > 0, 1.0, -1.0)
    kernel = RBF(lengthscales=[0.9], amplitude=2.0, noise=0.0)
    jitter = 1e-10
    K = np.asarray(kernel.for_inputs(X).K(X)) + jitter * np.eye(n)
    ref = full_gp_ep(K, y, tol=1e-13)
    out = exact_ep.evaluate(kernel.for_inputs(X), X, X, y, ref["tau_tilde"], ref["nu_tilde"], jitter=jitter)
    assert abs(float(out["log_z"]) - ref["log_z"]) < 1e-10
    np.testing.assert_allclose(out["site_precision"], ref["tau_tilde"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out["site_shift"], ref["nu_tilde"], rtol=1e-9, atol=1e-12)
    model = GPClassifier(kernel=kernel, n_inducing="all", optimize=False, jitter=jitter, max_iter=5000,
                         tol=1e-13).fit(X, y)
    assert abs(model.log_marginal_likelihood_ - ref["log_z"]) < 1e-8
    X_test = np.linspace(-4, 4, 17)[:, None]
    K_cross = np.asarray(kernel.for_inputs(X).K(X, X_test))
    _, _, prob = full_gp_predict(K, y, ref, K_cross, np.full(len(X_test), 2.0))
    np.testing.assert_allclose(model.predict_proba(X_test)[:, 1], prob, atol=1e-7)


@pytest.mark.parametrize("kernel_cls", [RBF, Matern52])
def test_gradient_matches_finite_differences_at_the_fixed_point(kernel_cls, xp_device):
    """Eq. 4 with the cavities fixed (the pass's ``grads``) is the derivative of log Z_q at an EP fixed point, sites
    held: central differences for every kernel parameter, latent noise included; NumPy and array_api_strict on both
    devices."""
    xp, device = xp_device
    X_np, y_np = binary_toy(30)
    X, y = to_xp(X_np, xp, device), to_xp(y_np, xp, device)
    kernel = kernel_cls(lengthscales=[0.8, 1.3], amplitude=1.5, noise=0.05).for_inputs(X)
    fit = training.fit(X, y, kernel, X, passes=exact_ep, jitter=1e-6, max_iter=3000, optimize=(), tol=1e-13)
    assert fit.converged
    nu, mu = fit.site_precision, fit.site_shift
    grads = exact_ep.evaluate(kernel, X, X, y, nu, mu, jitter=1e-6)["grads"]
    assert "Z" not in grads  # the exact model's inducing points are its rows: nothing to learn there

    _check_gradients(kernel, grads, lambda k: float(exact_ep.evaluate(k, X, X, y, nu, mu, jitter=1e-6,
                                                                    want_grad=False)["log_z"]), xp, device)


def test_is_the_limit_of_inducing_point_ep_at_the_rows():
    """On Z = X, ``ep.evaluate`` is the same model with sites along K^-1 k_i instead of e_i: at a small jitter the two
    passes give the same log Z_q, site updates, marginals and gradients, at sites that are not a fixed point."""
    X, y = binary_toy(40, seed=3)
    kernel = RBF(lengthscales=[0.7, 1.1], amplitude=1.3, noise=0.02).for_inputs(X)
    rng = np.random.default_rng(0)
    nu, mu = rng.uniform(0.0, 0.8, 40), rng.normal(0.0, 0.5, 40)
    jitter = 1e-9
    exact = exact_ep.evaluate(kernel, X, X, y, nu, mu, jitter=jitter, damping=0.5)
    inducing = ep.evaluate(kernel, X, X, y, nu, mu, jitter=jitter, damping=0.5)
    _assert_same_pass(exact, inducing, kernel.params)
    np.testing.assert_allclose(to_np(exact["site_change"]), to_np(inducing["site_change"]), rtol=1e-5)
    final = exact_ep.evaluate(kernel, X, X, y, nu, mu, jitter=jitter, want_grad=False, want_sites=False)
    mean, var = ep.predict_latent(kernel, X, final["posterior"], X)
    ref_mean, ref_var = ep.predict_latent(kernel, X, ep.evaluate(kernel, X, X, y, nu, mu, jitter=jitter,
                                                                 want_grad=False)["posterior"], X)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(var, ref_var, rtol=1e-5, atol=1e-7)


def _site_share(kernel, X, nu, jitter):
    """nu_i Sigma_ii = 1 - (B^-1)_ii of each row, by NumPy (the rows whose marginal needs a column of L^-1 D^1/2 K)."""
    K = np.asarray(kernel.K(X)) + jitter * np.eye(len(nu))
    root = np.sqrt(nu)
    return 1.0 - np.diag(np.linalg.inv(np.eye(len(nu)) + root[:, None] * K * root[None, :]))


def test_one_factorisation_and_one_inverse_a_pass(monkeypatch):
    """What full-GP EP should cost: a pass factorises B = I + D^1/2 K D^1/2 once (no K(Z, Z) factor, no m x m
    posterior from n x m sums) and inverts it from the same factor once, for the marginals and the gradient; it solves
    with n right-hand sides never, only with one a row whose site holds a small share of its posterior precision (no
    site yet: every row); a final pass builds q's inducing-point form for prediction (K's factor here, C's in
    ep.posterior_from_sums)."""
    X, y = binary_toy(20)
    kernel = RBF(lengthscales=[0.7, 1.1], amplitude=1.3, noise=0.02).for_inputs(X)
    calls = {"cholesky": 0, "solve_columns": 0, "inverse": 0}
    for name, key in (("cholesky_or_nan", "cholesky"), ("cholesky", "cholesky"), ("cholesky_inverse", "inverse")):
        real = getattr(exact_ep, name)
        monkeypatch.setattr(exact_ep, name, lambda *a, _real=real, _key=key, **k: (calls.__setitem__(
            _key, calls[_key] + 1), _real(*a, **k))[1])
    real_solve = exact_ep.solve_triangular

    def counting_solve(L, B, **options):
        calls["solve_columns"] += B.shape[1] if B.ndim == 2 else 0
        return real_solve(L, B, **options)

    monkeypatch.setattr(exact_ep, "solve_triangular", counting_solve)
    nu, mu = np.full(20, 0.3), np.zeros(20)
    nu[[3, 11]] = 0.0  # two rows without a site
    assert np.sum(_site_share(kernel, X, nu, 1e-6) < exact_ep.SMALL_SITE_SHARE) == 2
    exact_ep.evaluate(kernel, X, X, y, nu, mu, jitter=1e-6, checked=False)
    assert calls == {"cholesky": 1, "solve_columns": 2, "inverse": 1}
    calls.update(cholesky=0, solve_columns=0, inverse=0)
    exact_ep.evaluate(kernel, X, X, y, nu, mu, jitter=1e-6, want_grad=False)
    assert calls == {"cholesky": 1, "solve_columns": 2, "inverse": 1}
    calls.update(cholesky=0, solve_columns=0, inverse=0)
    exact_ep.evaluate(kernel, X, X, y, nu, mu, jitter=1e-6, want_grad=False, want_sites=False)
    assert calls == {"cholesky": 2, "solve_columns": 2, "inverse": 1}  # B and K here; C in ep.posterior_from_sums
    calls.update(cholesky=0, solve_columns=0, inverse=0)
    exact_ep.evaluate(kernel, X, X, y, np.zeros(20), mu, jitter=1e-6)  # no site yet: Alg. 3.5's solve, every row
    assert calls == {"cholesky": 1, "solve_columns": 20, "inverse": 1}


def test_site_updates_equal_the_textbook_for_sites_of_every_size():
    """The marginals read from B^-1 lose nothing where a site holds a tiny share of its row's precision (nu_i
    Sigma_ii = 1 - (B^-1)_ii near 0, where (1 - (B^-1)_ii) / nu_i would cancel): one parallel, undamped update of
    sites from 0 to 1e3 equals R&W's (eqs. 3.56-3.59) from Sigma = K - V^T V, V = L^-1 S^1/2 K (Alg. 3.5), in NumPy."""
    X, y = binary_toy(30, seed=4)
    kernel = RBF(lengthscales=[0.8, 1.2], amplitude=1.7, noise=0.0).for_inputs(X)
    jitter = 1e-8
    rng = np.random.default_rng(5)
    tau = np.concatenate([[0.0, 1e-14, 1e-12, 1e-9, 1e-6, 1e-4, 1e3], rng.uniform(0.0, 2.0, 23)])
    nu_tilde = rng.normal(0.0, 0.5, 30) * np.sqrt(tau)
    K = np.asarray(kernel.K(X)) + jitter * np.eye(30)
    root = np.sqrt(tau)
    L = np.linalg.cholesky(np.eye(30) + root[:, None] * K * root[None, :])
    V = np.linalg.solve(L, root[:, None] * K)
    Sigma = K - V.T @ V
    mean = Sigma @ nu_tilde
    s2 = np.diag(Sigma)
    tau_cav, nu_cav = 1.0 / s2 - tau, mean / s2 - nu_tilde
    _, mu_hat, var_hat = tilted_moments(y, nu_cav / tau_cav, 1.0 / tau_cav)
    out = exact_ep.evaluate(kernel, X, X, y, tau, nu_tilde, jitter=jitter, want_grad=False)
    np.testing.assert_allclose(out["site_precision"], 1.0 / var_hat - tau_cav, rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(out["site_shift"], mu_hat / var_hat - nu_cav, rtol=1e-9, atol=1e-14)


def test_new_site_precisions_are_never_negative(monkeypatch):
    """As the sparse batch pass's: where round-off deep in a tail would leave gamma just below 0, the new precision is
    0, not a negative number whose square root the next pass would take (NaN, a reverted step)."""
    X, y = binary_toy(30)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.5)
    moments = ep.PROBIT.tilted_moments

    def tail_roundoff(y, a, b):
        log_z, alpha, gamma = moments(y, a, b)
        return log_z, alpha, np.where(np.arange(gamma.shape[0]) % 7 == 0, -1e-12, gamma)

    monkeypatch.setattr(ep.PROBIT, "tilted_moments", tail_roundoff)
    zeros = np.zeros(X.shape[0])
    out = exact_ep.evaluate(kernel, X, X, y, zeros + 0.5, zeros, jitter=1e-6)
    new = to_np(out["site_precision"])
    assert np.all(new >= 0.0) and np.all(new[::7] == 0.0)


def test_refuses_inducing_points_other_than_the_rows():
    X, y = binary_toy(20)
    kernel = RBF(lengthscales=[1.0, 1.0]).for_inputs(X)
    with pytest.raises(ValueError, match="inducing points to be the 20 training rows"):
        exact_ep.evaluate(kernel, X[:5], X, y, np.zeros(20), np.zeros(20), jitter=1e-6)


def _three_quantile_classes(n=24, seed=2):
    X, _ = binary_toy(n, seed)
    score = X[:, 0] + np.sin(2 * X[:, 1])
    return X, np.digitize(score, np.quantile(score, [1 / 3, 2 / 3])).astype(np.float64)


def test_multiclass_is_the_limit_of_inducing_point_multiclass_ep_at_the_rows():
    """Three classes, every class's inducing points the rows: the same pairs' updates, log Z_q (Villacampa-Calvo &
    Hernandez-Lobato 2017, eq. 9), gradients (eq. 10) and predictions as ``multiclass_ep`` on Z = X."""
    from agpc.inference import multiclass_ep
    from agpc.kernels import ClassKernels

    X, y = _three_quantile_classes()
    kernels = ClassKernels([RBF(lengthscales=[0.6 + 0.2 * c, 1.1], amplitude=1.0 + 0.3 * c, noise=0.02).for_inputs(X)
                            for c in range(3)])
    Z = np.stack([X] * 3)
    rng = np.random.default_rng(1)
    nu = rng.uniform(0.0, 0.4, (24, 6))
    mu = rng.normal(0.0, 0.3, (24, 6))
    label = y.astype(int)
    nu[np.arange(24), label] = mu[np.arange(24), label] = 0.0  # (the storage's unused entries)
    nu[np.arange(24), 3 + label] = mu[np.arange(24), 3 + label] = 0.0
    jitter = 1e-9
    exact = exact_ep.evaluate(kernels, Z, X, y, nu, mu, jitter=jitter, damping=0.5)
    inducing = multiclass_ep.evaluate(kernels, Z, X, y, nu, mu, jitter=jitter, damping=0.5)
    _assert_same_pass(exact, inducing, exact["grads"])
    posts = exact_ep.evaluate(kernels, Z, X, y, nu, mu, jitter=jitter, want_grad=False, want_sites=False)["posterior"]
    mean, var = multiclass_ep.predict_latent(kernels, Z, posts, X)
    ref_mean, ref_var = multiclass_ep.predict_latent(kernels, Z, inducing["posterior"], X)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(var, ref_var, rtol=1e-5, atol=1e-7)


def test_multiclass_gradient_matches_finite_differences_at_the_fixed_point(xp_device):
    from agpc.kernels import ClassKernels

    # the fixed point found on NumPy (to 1e-13: ~20 s of sweeps on array_api_strict), its sites moved to the namespace
    # whose gradient and log Z are checked: a sweep is exact_ep.evaluate, which runs there below
    xp, device = xp_device
    X_np, y_np = _three_quantile_classes(18)
    X, y = to_xp(X_np, xp, device), to_xp(y_np, xp, device)

    def class_kernels(inputs):
        return ClassKernels([RBF(lengthscales=[0.7, 1.2], amplitude=1.0 + 0.5 * c, noise=0.03).for_inputs(inputs)
                             for c in range(3)])

    kernels = class_kernels(X)
    Z = xp.stack([X] * 3)
    fit = training.fit(X_np, y_np, class_kernels(X_np), np.stack([X_np] * 3), passes=exact_ep, jitter=1e-6,
                       max_iter=3000, optimize=(), tol=1e-13)
    assert fit.converged
    nu, mu = (to_xp(to_np(sites), xp, device) for sites in (fit.site_precision, fit.site_shift))
    grads = exact_ep.evaluate(kernels, Z, X, y, nu, mu, jitter=1e-6)["grads"]

    _check_gradients(kernels, grads, lambda k: float(exact_ep.evaluate(k, Z, X, y, nu, mu, jitter=1e-6,
                                                                      want_grad=False)["log_z"]), xp, device)
