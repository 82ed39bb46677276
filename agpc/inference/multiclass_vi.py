"""The multiclass variational model of Villacampa-Calvo & Hernandez-Lobato (2017), sec. 3 (Hensman et al. 2015b):
robust-max likelihood.

p(y | f) = 1 - epsilon if y = argmax_c f_c, epsilon / (C - 1) otherwise (Villacampa-Calvo & Hernandez-Lobato (2017), eq.
13, epsilon = 1e-3), one GP per class with q(u_c) held whitened (``variational``: u_c = L_K,c v_c, q(v_c) =
N(m_w,c, L_w,c L_w,c^T)), and the bound

    ELBO = sum_i (a lower bound on E_q(u) log p(y_i | u)) - sum_c KL(q(u_c) || p(u_c)),

with f_i | u the sparse conditional of multiclass EP's model (independent rows and classes, variance s_ic). The
row's term (``svi_elbo_multiclass``'s ``bound``) is by default the larger of two lower bounds: eq. 15's
E_q(f_i) log p(y_i | f_i) = log(eps / (C-1)) + (log(1 - eps) - log(eps / (C-1))) S_i, S_i = p(y_i is the argmax)
under the independent Gaussian marginals of f_i (eq. 11's one-dimensional integral, by Gauss-Hermite), and the
bound with f_i | u inside the log (``RobustMax.conditional_log_density_bound``). Eq. 15 alone is linear in S_i and
its optimum makes every argmax certain: on noisy labels the predictions grew more over-confident every epoch
(issue 39, docs/methods/svi.md). Each class's KL and data adjoints are the binary SVI ones
(``variational.SVIBoundTerms``, with separate adjoints for q's share of the variance and the conditional's).
"""

from __future__ import annotations

from contextlib import closing

from ..backend import array_namespace
from ..likelihoods import ROBUST_MAX, RobustMax
from . import blocks
from .variational import SVIBoundTerms, data_scale

__all__ = ["BOUNDS", "EPSILON", "argmax_probability", "robust_max_expected", "svi_elbo_multiclass",
           "predictive_log_proba"]

EPSILON = RobustMax.EPSILON


def argmax_probability(y, mean, var, n_quadrature=20):
    """S_i = p(f_{i y_i} is the largest) and its derivatives (``likelihoods.RobustMax.argmax_probability``)."""
    return ROBUST_MAX.argmax_probability(y, mean, var, n_quadrature)


def robust_max_expected(y, mean, var, n_quadrature=20, epsilon=EPSILON):
    """E_q log p(y_i | f_i) for the robust max (eq. 13) and its derivatives in mean and var, (b,), (b, C)."""
    return _robust_max(epsilon).expected_log_density(y, mean, var, n_quadrature)


def _robust_max(epsilon):
    return ROBUST_MAX if epsilon == ROBUST_MAX.epsilon else RobustMax(epsilon)


BOUNDS = ("max", "conditional", "jensen")


def svi_elbo_multiclass(kernels, Z, X, y, whitened_mean, whitened_chol, *, n_quadrature=20, jitter=1e-6, n_total=None,
                        want_grad=True, block_rows=None, epsilon=EPSILON, weights=None, bound="max"):
    """The robust-max bound on rows X (all, or a minibatch scaled to n_total), q(v_c) = N(whitened_mean[c],
    whitened_chol[c] whitened_chol[c]^T). ``weights``: per-row weights as in ``variational.svi_elbo``.

    ``bound``, the data term of a row, each a lower bound on E_q(u) log p(y_i | u) in the sparse (FITC) model of
    multiclass EP with the robust max on top (docs/methods/svi.md):

    - "jensen": Villacampa-Calvo & Hernandez-Lobato (2017), eq. 15, E_q(f_i) log p(y_i | f_i), Jensen over f_i | u
      as well as over q: linear in p(y_i is the argmax), its optimum makes every argmax certain, and the
      predictions grow over-confident on noisy labels, epoch after epoch (issue 39);
    - "conditional": ``RobustMax.conditional_log_density_bound``, f_i | u inside the log: calibrated, but at the
      floor log eps' (no gradient) for the rows where q is broad against the conditional, as at the start;
    - "max" (default): ``RobustMax.log_density_bound``, the larger of the two, row by row.

    ``Z`` (C, m, d), ``whitened_mean`` (C, m), ``whitened_chol`` (C, m, m), ``y`` class indices as floats. Returns
    (elbo, grads) with "<class>:<name>" kernel gradients and stacked "Z", "whitened_mean", "whitened_chol"."""
    if bound not in BOUNDS:
        raise ValueError(f"unknown multiclass SVI bound {bound!r}: use one of {BOUNDS}")
    xp = array_namespace(Z)
    C = Z.shape[0]
    likelihood = _robust_max(epsilon)
    scale = data_scale(X, n_total, weights)
    terms = [SVIBoundTerms(kernels[c], Z[c, ...], whitened_mean[c, ...], whitened_chol[c, ...], jitter)
             for c in range(C)]
    expected_total = None
    # (blocks sized for all C classes: each holds (b, C) marginals and (b, T, C) quadrature arrays; sized for one
    # class, 8,000 rows of 800 classes were one block, and a step peaked at 10 GB)
    block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)  # (``default_block_rows`` counts the classes)

    def block_terms(lo, hi, Xb, yb):
        """A block's expected log-likelihood and each class's share of the adjoints (on a pass's thread)."""
        parts, expected, g_m, g_v, g_s = _block_bound(likelihood, bound, terms, Xb, yb, n_quadrature)
        if weights is not None:
            w = weights[lo:hi]
            expected, g_m, g_v = w * expected, w[:, None] * g_m, w[:, None] * g_v
            g_s = None if g_s is None else w[:, None] * g_s
        shares = [t.block_adjoints(part, g_m[:, c], g_v[:, c], None if g_s is None else g_s[:, c])
                  for c, (t, part) in enumerate(zip(terms, parts))] if want_grad else None
        return xp.sum(expected), shares

    expected_total = None
    pieces = blocks.data_blocks(X, y, block_rows, Z[0, ...])
    with closing(blocks.map_blocks(block_terms, pieces, workers)) as results:  # (ended on an error too: map_blocks)
        for _, (total, shares) in results:  # (added in the rows' order, whatever thread ran the block)
            expected_total = total if expected_total is None else expected_total + total
            for t, share in zip(terms, shares or ()):
                t.add(share)
    kl = terms[0].kl
    for t in terms[1:]:
        kl = kl + t.kl
    elbo = scale * expected_total - kl
    if not want_grad:
        return elbo, None
    grads = {}
    stacked = {"Z": [], "whitened_mean": [], "whitened_chol": []}
    for c, t in enumerate(terms):
        g = t.gradients(scale)
        for key in stacked:
            stacked[key].append(g.pop(key))
        grads.update({f"{c}:{name}": value for name, value in g.items()})
    grads.update({key: xp.stack(values) for key, values in stacked.items()})
    return elbo, grads


def _block_bound(likelihood, bound, terms, Xb, yb, n_quadrature):
    """``svi_elbo_multiclass``'s data terms of a block of rows Xb under ``bound``: (each class's block for its
    ``block_adjoints``, the terms (b,) from each class's marginals of q (``terms``: the classes' ``SVIBoundTerms``),
    and their derivatives in the classes' means and variances of f_i and, not "jensen" (else None), in the
    conditional's variances s_ic, each (b, C))."""
    xp = array_namespace(Xb)
    if bound == "jensen":
        triples = [t.marginals(Xb) for t in terms]
        f_mean = xp.stack([p[1] for p in triples], axis=1)
        f_var = xp.stack([p[2] for p in triples], axis=1)
        expected, g_m, g_v = likelihood.expected_log_density(yb, f_mean, f_var, n_quadrature)
        return [p[0] for p in triples], expected, g_m, g_v, None
    pairs = [t.marginal_parts(Xb) for t in terms]
    f_mean, f_var, residual = (xp.stack([p[1][j] for p in pairs], axis=1) for j in range(3))
    row_bound = likelihood.log_density_bound if bound == "max" else likelihood.conditional_log_density_bound
    return ([p[0] for p in pairs], *row_bound(yb, f_mean, f_var, residual, n_quadrature))


def predictive_log_proba(mean, var, epsilon=EPSILON):
    """log p(y = k | x) under the robust max (``likelihoods.RobustMax.predictive_log_proba``)."""
    return _robust_max(epsilon).predictive_log_proba(mean, var)
