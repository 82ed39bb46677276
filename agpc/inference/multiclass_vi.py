"""The multiclass variational baseline of seed 001 sec. 3 (Hensman et al. 2015b): robust-max likelihood.

p(y | f) = 1 - epsilon if y = argmax_c f_c, epsilon / (C - 1) otherwise (seed 001 eq. 13, epsilon = 1e-3),
one GP per class with q(u_c) = N(mean_c, chol_c chol_c^T), and the bound of eq. 15

    ELBO = sum_i E_q log p(y_i | f_i) - sum_c KL(q(u_c) || p(u_c)),

where E_q log p(y_i | f_i) = log(eps / (C-1)) + (log(1 - eps) - log(eps / (C-1))) S_i and S_i = p(y_i is the
argmax) under the independent Gaussian marginals of f_i: the one-dimensional integral of seed 001 eq. 11,
by Gauss-Hermite. Each class's KL and data adjoints are the binary SVI ones (``variational.SVIBoundTerms``).
"""

from __future__ import annotations

import math

from ..backend import array_device, array_namespace, gauss_hermite, log_ndtr, log_normal_pdf
from . import ep
from .multiclass_ep import predictive_log_proba as argmax_log_proba
from .variational import SVIBoundTerms, data_scale

__all__ = ["EPSILON", "argmax_probability", "robust_max_expected", "svi_elbo_multiclass", "predictive_log_proba"]

EPSILON = 1e-3  # seed 001 sec. 3 (after Hensman et al. 2015b)


def argmax_probability(y, mean, var, n_quadrature=20):
    """S_i = p(f_{i y_i} > f_ij for all j != y_i) for independent f_ij ~ N(mean_ij, var_ij), and its
    derivatives in mean and var (b, C): the derivatives of the quadrature sum itself, so that finite
    differences of the computed bound agree with them.

    With f_t = m_y + sqrt(2 v_y) x_t, z_tj = (f_t - m_j) / s_j, P_t = prod_{j != y} Phi(z_tj), r = N/Phi:
      S = sum_t w_t P_t,  dS/dm_j = -sum_t w_t P_t r_tj / s_j,  dS/ds_j = -sum_t w_t P_t r_tj z_tj / s_j,
      dS/dm_y = sum_t w_t P_t sum_j r_tj / s_j,  dS/ds_y = sum_t w_t P_t sum_j r_tj sqrt(2) x_t / s_j.
    """
    xp = array_namespace(mean)
    C = mean.shape[1]
    onehot = y[:, None] == xp.arange(C, dtype=y.dtype, device=array_device(y))[None, :]
    nodes, weights = gauss_hermite(n_quadrature, xp, dtype=mean.dtype, device=array_device(mean))
    weights = weights / math.sqrt(math.pi)
    sd = xp.sqrt(var)
    m_y = xp.sum(xp.where(onehot, mean, 0.0), axis=1)
    s_y = xp.sum(xp.where(onehot, sd, 0.0), axis=1)
    scaled_nodes = math.sqrt(2.0) * nodes
    f = m_y[:, None] + s_y[:, None] * scaled_nodes[None, :]  # (b, T)
    z = (f[:, :, None] - mean[:, None, :]) / sd[:, None, :]  # (b, T, C)
    rival = ~onehot[:, None, :]
    log_phi = log_ndtr(z)
    log_prod = xp.sum(xp.where(rival, log_phi, 0.0), axis=2)  # (b, T)
    weighted = weights[None, :] * xp.exp(log_prod)  # w_t P_t
    ratio = xp.where(rival, xp.exp(log_normal_pdf(z) - log_phi), 0.0) / sd[:, None, :]  # r_tj / s_j
    S = xp.sum(weighted, axis=1)
    d_mean_rival = -xp.sum(weighted[:, :, None] * ratio, axis=1)
    d_sd_rival = -xp.sum(weighted[:, :, None] * ratio * z, axis=1)
    per_node = xp.sum(ratio, axis=2)  # sum_j r_tj / s_j
    d_m_y = xp.sum(weighted * per_node, axis=1)
    d_s_y = xp.sum(weighted * per_node * scaled_nodes[None, :], axis=1)
    d_mean = xp.where(onehot, d_m_y[:, None], d_mean_rival)
    d_sd = xp.where(onehot, d_s_y[:, None], d_sd_rival)
    return S, d_mean, d_sd / (2.0 * sd)


def robust_max_expected(y, mean, var, n_quadrature=20, epsilon=EPSILON):
    """E_q log p(y_i | f_i) for the robust max (eq. 13) and its derivatives in mean and var, (b,), (b, C)."""
    C = mean.shape[1]
    log_hit, log_miss = math.log1p(-epsilon), math.log(epsilon / (C - 1))
    S, d_mean, d_var = argmax_probability(y, mean, var, n_quadrature)
    gap = log_hit - log_miss
    return log_miss + gap * S, gap * d_mean, gap * d_var


def svi_elbo_multiclass(kernels, Z, X, y, mean, chol, *, n_quadrature=20, jitter=1e-6, n_total=None, want_grad=True,
                        block_rows=None, epsilon=EPSILON, weights=None):
    """Seed 001 eq. 15 on rows X (all, or a minibatch scaled to n_total), q(u_c) = N(mean[c], chol[c] chol[c]^T).
    ``weights``: per-row weights as in ``variational.svi_elbo``.

    ``Z`` (C, m, d), ``mean`` (C, m), ``chol`` (C, m, m), ``y`` class indices as floats. Returns (elbo,
    grads) with "<class>:<name>" kernel gradients and stacked "Z", "mean", "chol"."""
    xp = array_namespace(Z)
    C = Z.shape[0]
    scale = data_scale(X, n_total, weights)
    terms = [SVIBoundTerms(kernels[c], Z[c, ...], mean[c, ...], chol[c, ...], jitter) for c in range(C)]
    expected_total = None
    for lo, hi, Xb, yb in ep.data_blocks(X, y, block_rows, Z[0, ...]):
        pairs = [t.marginals(Xb) for t in terms]
        f_mean = xp.stack([p[0] for p in pairs], axis=1)
        f_var = xp.stack([p[1] for p in pairs], axis=1)
        expected, g_m, g_v = robust_max_expected(yb, f_mean, f_var, n_quadrature, epsilon)
        if weights is not None:
            w = weights[lo:hi]
            expected, g_m, g_v = w * expected, w[:, None] * g_m, w[:, None] * g_v
        total = xp.sum(expected)
        expected_total = total if expected_total is None else expected_total + total
        if want_grad:
            for c, t in enumerate(terms):
                t.add_adjoints(g_m[:, c], g_v[:, c])
    kl = terms[0].kl
    for t in terms[1:]:
        kl = kl + t.kl
    elbo = scale * expected_total - kl
    if not want_grad:
        return elbo, None
    grads = {}
    stacked = {"Z": [], "mean": [], "chol": []}
    for c, t in enumerate(terms):
        g = t.gradients(scale)
        for key in stacked:
            stacked[key].append(g.pop(key))
        grads.update({f"{c}:{name}": value for name, value in g.items()})
    grads.update({key: xp.stack(values) for key, values in stacked.items()})
    return elbo, grads


def predictive_log_proba(mean, var, epsilon=EPSILON):
    """log p(y = k | x) under the robust max: (1 - eps) S_k + eps / (C - 1) (1 - S_k), with S_k the
    probability that f_k is the largest (``multiclass_ep.predictive_log_proba``)."""
    xp = array_namespace(mean)
    C = mean.shape[1]
    S = xp.exp(argmax_log_proba(mean, var))
    return xp.log((1.0 - epsilon) * S + epsilon / (C - 1) * (1.0 - S))
