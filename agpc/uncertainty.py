"""Predictive uncertainty and its split (``GPClassifier.predict_uncertainty``).

For a row x with latent marginal q(f) = N(mean, var) (``prediction.latent``), in nats:

- ``total``: the predictive entropy H[y | x, D] of ``predict_proba``;
- ``aleatoric``: the expected entropy E_{q(f)} H[y | f], what no more data would remove;
- ``epistemic``: their difference, the mutual information I[y; f | x, D] between the label and the latent, the
  BALD score of Houlsby et al. (2011), "Bayesian Active Learning for Classification and Preference Learning",
  eq. 2: large where the model would learn most from the label.

Binary models (probit or logistic): the expected entropy is a one-dimensional integral over q(f), taken by
Gauss-Legendre quadrature on [mean - 12 sd, mean + 12 sd] cut to where the entropy of p(y | f) is above round-off
(|f| <= 9 for the probit, 40 for the logistic). Gauss-Hermite under q(f) itself misses the entropy's bump (width
about 1 around f = 0) when sd is large, its nodes falling on either side of it. ``method="houlsby"`` gives instead
Houlsby et al. (2011)'s closed form for the probit (sec. 3, h(Phi(x)) ~ exp(-x^2 / (pi ln 2)) in bits), an
approximation: within 1.9e-3 nats of the quadrature (mean in [-10, 10], var in [1e-6, 1e6]), which is up to
16% of the epistemic part where that is above 0.01.

Ordinal models (Chu & Ghahramani 2005, one latent f and cut points b_1 < ... < b_{K-1}): the expected entropy is
the same one-dimensional integral of H[p(y | f)], p(y = k | f) = Phi(b_{k+1} - f) - Phi(b_k - f), by the same
Gauss-Legendre rule on [max(mean - 12 sd, b_1 - 9), min(mean + 12 sd, b_{K-1} + 9)] (beyond the outer cut points
by 9 the entropy is below round-off, as the probit's beyond |f| = 9).

Multiclass models: ``total`` from ``predict_proba``. The multiclass EP model's label is the argmax of the latent
(Villacampa-Calvo & Hernandez-Lobato (2017), eq. 1, its noise in the latent): H[y | f] = 0 and all of the
uncertainty is epistemic. The robust max (multiclass SVI, their eq. 13): p(y | f) is 1 - eps for the argmax and
eps / (C - 1) for each other class whatever f is, so E_f H[y | f] = -(1 - eps) log(1 - eps) - eps log(eps / (C - 1)),
the same constant at every row.

Every figure is by quadrature, never by sampling: a row's values do not depend on the other rows predicted with it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import backend as B
from . import prediction as P
from .likelihoods import PROBIT, ROBUST_MAX, interval_log_probability, likelihood_by_name

__all__ = ["Uncertainty", "METHODS", "entropy", "binary_expected_entropy", "ordinal_expected_entropy",
           "houlsby_expected_entropy",
           "robust_max_entropy", "uncertainty", "model_uncertainty"]

METHODS = ("quadrature", "houlsby")

GAUSSIAN_REACH = 12.0  # sd: the normal's mass beyond is 4e-33
LEGENDRE_NODES = 192  # the largest interval (80 wide, logistic) is then exact to round-off (tests/test_uncertainty)
HOULSBY_C = math.sqrt(math.pi * math.log(2.0) / 2.0)  # Houlsby et al. (2011), sec. 3


class Uncertainty(NamedTuple):
    """Per row, in nats: total = aleatoric + epistemic (predictive entropy = expected entropy + mutual
    information)."""

    total: object
    aleatoric: object
    epistemic: object


def entropy(log_proba):
    """-sum_c p_c log p_c of each row of (n, C) log-probabilities (0 log 0 = 0)."""
    xp = B.array_namespace(log_proba)
    p = xp.exp(log_proba)
    return -xp.sum(xp.where(p > 0.0, p * log_proba, 0.0), axis=1)


def _legendre_expectation(mean, var, lowest, highest, entropy_at, n_nodes):
    """E_{N(f | mean, var)} h(f) by Gauss-Legendre quadrature on [max(mean - 12 sd, lowest), min(mean + 12 sd,
    highest)], h = ``entropy_at`` (nodes (n, T) -> (n, T)), which is below round-off outside [lowest, highest]."""
    xp = B.array_namespace(mean)
    nodes, weights = np.polynomial.legendre.leggauss(n_nodes)
    nodes = B.asarray_like(nodes, xp, device=B.array_device(mean), dtype=mean.dtype)
    weights = B.asarray_like(weights, xp, device=B.array_device(mean), dtype=mean.dtype)
    sd = xp.sqrt(var)
    low = xp.maximum(mean - GAUSSIAN_REACH * sd, lowest)
    high = xp.minimum(mean + GAUSSIAN_REACH * sd, highest)
    half = xp.maximum(high - low, 0.0)[:, None] / 2.0  # an empty interval: the entropy is 0 where q(f) has mass
    f = (low[:, None] + half) + half * nodes[None, :]
    density = xp.exp(B.log_normal_pdf((f - mean[:, None]) / sd[:, None])) / sd[:, None]
    return xp.sum(half * weights[None, :] * density * entropy_at(f), axis=1)


def binary_expected_entropy(mean, var, likelihood, n_nodes=LEGENDRE_NODES):
    """E_{N(f | mean, var)} H[p(y | f)] for the binary ``likelihood`` (a name or a ``likelihoods.Likelihood``), per
    row, by Gauss-Legendre quadrature on [max(mean - 12 sd, -R), min(mean + 12 sd, R)] (R: the likelihood's
    ``entropy_reach``, beyond which the entropy is below round-off: 9 for the probit, 40 for the logistic)."""
    xp = B.array_namespace(mean)
    likelihood = likelihood_by_name(likelihood, multiclass=False)

    def entropy_at(f):
        log_p, log_q = likelihood.class_log_densities(f)
        return -(xp.exp(log_p) * log_p + xp.exp(log_q) * log_q)

    reach = likelihood.entropy_reach
    return _legendre_expectation(mean, var, -reach, reach, entropy_at, n_nodes)


def ordinal_expected_entropy(mean, var, cut_points, n_nodes=LEGENDRE_NODES):
    """E_{N(f | mean, var)} H[p(y | f)] of the ordinal probit with ``cut_points`` (K - 1, increasing), per row, by
    Gauss-Legendre quadrature on [max(mean - 12 sd, b_1 - 9), min(mean + 12 sd, b_{K-1} + 9)]."""
    xp = B.array_namespace(mean)
    cuts = [float(c) for c in B.to_numpy(cut_points)]
    bounds = [-math.inf, *cuts, math.inf]
    reach = PROBIT.entropy_reach

    def entropy_at(f):
        ones = xp.ones_like(f)
        h = xp.zeros_like(f)
        for lower, upper in zip(bounds[:-1], bounds[1:]):
            log_p = interval_log_probability(lower * ones, upper * ones, f, ones)[0]
            h = h - xp.where(log_p > -math.inf, xp.exp(log_p) * log_p, 0.0)
        return h

    return _legendre_expectation(mean, var, cuts[0] - reach, cuts[-1] + reach, entropy_at, n_nodes)


def houlsby_expected_entropy(mean, var):
    """Houlsby et al. (2011), sec. 3's closed form for the probit, in nats: with h(Phi(x)) ~ exp(-x^2 / (pi ln 2))
    (bits), E_{N(f | mean, var)} H ~ ln 2 C / sqrt(var + C^2) exp(-mean^2 / (2 (var + C^2))), C^2 = pi ln 2 / 2.
    An approximation (the quadrature is exact)."""
    xp = B.array_namespace(mean)
    spread = var + HOULSBY_C ** 2
    return math.log(2.0) * HOULSBY_C / xp.sqrt(spread) * xp.exp(-mean * mean / (2.0 * spread))


def robust_max_entropy(n_classes, epsilon=ROBUST_MAX.epsilon):
    """H[y | f] of the robust max, the same for every f: -(1 - eps) log(1 - eps) - eps log(eps / (C - 1))."""
    return -(1.0 - epsilon) * math.log1p(-epsilon) - epsilon * math.log(epsilon / (n_classes - 1))


def uncertainty(mean, var, log_proba, likelihood, method="quadrature", cut_points=None):
    """``Uncertainty`` from the latent's mean and variance and the predictive log-probabilities (n, C) of a model
    of ``likelihood`` (a ``likelihoods.Likelihood`` or its name; binary and ordinal: ``mean`` and ``var`` per row;
    multiclass: (n, C)); an ordinal model's ``cut_points``."""
    if method not in METHODS:
        raise ValueError(f"unknown uncertainty method {method!r}: use one of {METHODS}")
    xp = B.array_namespace(log_proba)
    likelihood_object, likelihood = likelihood, getattr(likelihood, "name", likelihood)
    if likelihood == "ordinal":
        if method == "houlsby":
            raise ValueError("method='houlsby' is Houlsby et al. (2011)'s closed form for the binary probit; this "
                             "model is 'ordinal': use method='quadrature'")
        total = entropy(log_proba)
        aleatoric = xp.minimum(ordinal_expected_entropy(mean, var, cut_points), total)
        return Uncertainty(total, aleatoric, total - aleatoric)
    multiclass = log_proba.shape[1] > 2
    if method == "houlsby" and (multiclass or likelihood != "probit"):
        raise ValueError("method='houlsby' is Houlsby et al. (2011)'s closed form for the binary probit; this model "
                         f"is {'multiclass' if multiclass else likelihood!r}: use method='quadrature'")
    total = entropy(log_proba)
    if multiclass:  # the argmax (multiclass EP): 0; the robust max: a constant (module docstring)
        per_row = robust_max_entropy(log_proba.shape[1]) if likelihood == "robust-max" else 0.0
        expected = xp.full(total.shape, per_row, dtype=total.dtype, device=B.array_device(total))
    elif method == "houlsby":
        expected = houlsby_expected_entropy(mean, var)
    else:
        expected = binary_expected_entropy(mean, var, likelihood_object)
    # I[y; f] = H[y] - E H[y | f] >= 0 (the entropy is concave); round-off could give -1e-17 where both are tiny
    aleatoric = xp.minimum(expected, total)
    return Uncertainty(total, aleatoric, total - aleatoric)


def model_uncertainty(model, Xc, in_xp, device, method="quadrature"):
    """``Uncertainty`` of the fitted ``model`` (a ``model.FittedModel``) at rows placed by
    ``prediction.placed_rows``, in the caller's array type (``prediction.to_caller``)."""
    mean, var = P.model_latent(model, Xc)
    log_p = P.model_log_proba(model, mean, var)
    likelihood = model.likelihood
    result = uncertainty(mean, var, log_p, likelihood, method, cut_points=getattr(likelihood, "cut_points", None))
    return Uncertainty(*(P.to_caller(values, in_xp, device) for values in result))
