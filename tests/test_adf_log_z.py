"""ADF's log Z_q (Hernandez-Lobato et al. (2015), cavity = q): what it estimates and whose gradient the fit follows.

With the cavity q itself, EP's row term log Z_i + g(cavity) - g(q) (Hernandez-Lobato & Hernandez-Lobato (2016), eq.
26) read as log Z_i + 0 left out each row's removal term g(q) - g(q t_i) = -log E_q[t_i] of its new site t_i; the sum
of what was left out, ~ sum_i mu_i^2 / (2 nu_i), grows with the sites' precision, so that ADF's "log Z_q" came out
positive (a log marginal likelihood of labels cannot be) and, on a multiclass model, grew without bound as training
sharpened the sites (issue 39: waveform, -1,386 -> +5,808 in 100 batch iterations). ``sites.adf_removal_terms`` puts
the term back (binary and multiclass)."""

import numpy as np
import pytest
from scipy.special import log_ndtr

from agpc.datasets import make_banana
from agpc.inference import multiclass_ep, training
from agpc.kernels import RBF, ClassKernels
from helpers import three_classes

JITTER = 1e-6


def _binary():
    X, y = make_banana(60, random_state=0)
    return X, y, RBF([0.8, 0.8], 2.0, 0.01).for_inputs(X), X[:6]


def _multiclass():
    X, y = three_classes(90, seed=0)
    rng = np.random.default_rng(0)
    Z = np.stack([X[rng.choice(90, 5, replace=False)] for _ in range(3)])
    return X, y.astype(float), ClassKernels([RBF([1.0, 1.0], 1.0, 0.01).for_inputs(X) for _ in range(3)]), Z


@pytest.mark.parametrize("problem", [_binary, _multiclass])
def test_adf_log_z_at_its_fixed_point_is_eps(problem):
    """At fixed hyper-parameters, ADF's log Z_q at its fixed point is negative and within 2% of EP's at EP's.

    Measured when the test was written: binary -30.56 against EP's -30.57 (the old estimate: -14.50); multiclass
    -61.23 against -61.54 (the old estimate: +11.29). 100 ADF iterations (ADF's factor settles slowly along the
    directions the multiclass likelihood leaves flat, where the old estimate moved by nats an iteration)."""
    X, y, kernel, Z = problem()
    common = dict(jitter=JITTER, optimize=(), tol=1e-8)
    ep_fit = training.fit(X, y, kernel, Z, method="ep", max_iter=300, **common)
    adf_fit = training.fit(X, y, kernel, Z, method="adf", max_iter=100, **common)
    assert ep_fit.log_z < 0
    assert adf_fit.log_z < 0, adf_fit.log_z
    assert abs(adf_fit.log_z - ep_fit.log_z) < 0.02 * abs(ep_fit.log_z), (adf_fit.log_z, ep_fit.log_z)


def _log_e_site(nu, mu, d, e):
    """log E_{N(g; e, d)} exp(-nu g^2 / 2 + mu g)."""
    return -0.5 * np.log1p(nu * d) + (mu * mu * d + 2.0 * mu * e - nu * e * e) / (2.0 * (1.0 + nu * d))


def test_multiclass_adf_gradient_is_the_gradient_of_its_log_z_with_the_sites_held():
    """The hyper-parameter gradient of multiclass ADF (eq. 4 with the cavity q fixed) is the derivative of the log Z_q
    it reports, with the factor and every pair's new site held in u-space: written here in plain NumPy, g(q) - g(prior)
    + sum over pairs of [log Z_ik(q) - log E_q[t_ik]], the site parts t_ik along upsilon_ic at the starting kernel.
    The old estimate (the same without -log E_q[t_ik]) was not what the gradient climbed: its derivative differed by
    up to 40% (e.g. d / d log amplitude of class 1: -0.83 against the gradient's -1.41)."""
    X, y, kernel, Z = _multiclass()
    X, y = X[:40], y[:40]
    C, m, n = 3, Z.shape[1], 40
    onehot = y[:, None] == np.arange(C)
    factor = multiclass_ep.uniform_factor(Z)
    for _ in range(15):  # some way towards ADF's fixed point (the identity holds at any factor)
        out = multiclass_ep.evaluate_factor(kernel, Z, X, y, factor, cavity="adf", n_total=n, jitter=JITTER,
                                            want_grad=False)
        factor = factor.combine(0.5, out["site_delta"], 0.5)
    out = multiclass_ep.evaluate_factor(kernel, Z, X, y, factor, cavity="adf", n_total=n, jitter=JITTER)

    def moments(kern):
        """Per class: q's mean and covariance, K, the rows' upsilon and FITC variance s."""
        parts = []
        for c in range(C):
            K = kern[c].K(Z[c]) + JITTER * np.eye(m)
            cov = np.linalg.inv(np.linalg.inv(K) + factor.factors[c].precision)
            Knm = kern[c].K(X, Z[c])
            U = np.linalg.solve(K, Knm.T).T
            parts.append((cov @ factor.factors[c].shift, cov, K, U, kern[c].Kdiag(X) - np.sum(U * Knm, axis=1)))
        return parts

    def along(parts, U=None):
        """(e, d) of every row and class: q's marginal along upsilon_ic (``U``: the starting kernel's)."""
        U = [p[3] for p in parts] if U is None else U
        e = np.stack([U[c] @ parts[c][0] for c in range(C)], axis=1)
        d = np.stack([np.einsum("ij,jk,ik->i", U[c], parts[c][1], U[c]) for c in range(C)], axis=1)
        return e, d

    def own(v):
        return np.sum(np.where(onehot, v, 0.0), axis=1, keepdims=True)

    start = moments(kernel)
    U0 = [p[3] for p in start]
    e, d = along(start)
    s = np.stack([p[4] for p in start], axis=1)
    b = own(s) + s + own(d) + d
    z = (own(e) - e) / np.sqrt(b)
    alpha = np.exp(-0.5 * z * z - 0.5 * np.log(2 * np.pi) - log_ndtr(z)) / np.sqrt(b)
    gamma = alpha * alpha + alpha * z / np.sqrt(b)
    sites = [(gamma / (1 - own(d) * gamma), (alpha + own(e) * gamma) / (1 - own(d) * gamma)),  # the pairs' y parts
             (gamma / (1 - d * gamma), (-alpha + e * gamma) / (1 - d * gamma))]  # their k parts

    def log_z(kern):
        parts = moments(kern)
        gain = sum(0.5 * p[0] @ np.linalg.solve(p[1], p[0]) + 0.5 * np.linalg.slogdet(p[1])[1]
                   - 0.5 * np.linalg.slogdet(p[2])[1] for p in parts)
        e_now, d_now = along(parts)
        s_now = np.stack([p[4] for p in parts], axis=1)
        pairs = log_ndtr((own(e_now) - e_now) / np.sqrt(own(s_now) + s_now + own(d_now) + d_now))
        e0, d0 = along(parts, U0)
        mass = _log_e_site(*sites[0], own(d0), own(e0)) + _log_e_site(*sites[1], d0, e0)
        return gain + np.sum(np.where(onehot, 0.0, pairs - mass))

    assert float(out["log_z"]) == pytest.approx(log_z(kernel), rel=1e-9)
    step = 1e-5
    for key, index in (("0:log_amplitude", ()), ("1:log_amplitude", ()), ("2:log_lengthscales", (1,)),
                       ("0:log_noise", ())):
        values = []
        for sign in (1.0, -1.0):
            params = dict(kernel.params)
            params[key] = np.array(params[key], dtype=float, copy=True)
            params[key][index] += sign * step
            values.append(log_z(kernel.with_params(params)))
        numeric = (values[0] - values[1]) / (2 * step)
        assert float(out["grads"][key][index]) == pytest.approx(numeric, rel=1e-5, abs=1e-7), key
