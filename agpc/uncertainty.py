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
Each likelihood computes its own expected entropy (``likelihoods.Likelihood.expected_entropy``; the probit's closed
form, ``houlsby_expected_entropy``): this module never branches on a likelihood's name, so a registered likelihood's
uncertainty is its own.
"""

from __future__ import annotations

from typing import NamedTuple

from . import backend as B
from . import prediction as P
from .likelihoods import Ordinal, fitted_likelihood, likelihood_by_name

__all__ = ["Uncertainty", "METHODS", "entropy", "uncertainty", "model_uncertainty"]

METHODS = ("quadrature", "houlsby")


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


def _likelihood_object(likelihood, multiclass, cut_points):
    """The ``likelihoods.Likelihood`` of ``likelihood`` (one, or its name; an ordinal one at ``cut_points``)."""
    if multiclass:  # (multiclass EP's is named "probit", as the binary one: ``fitted_likelihood`` tells them apart)
        return fitted_likelihood(likelihood, None, multiclass=True)
    likelihood = likelihood_by_name(likelihood, multiclass=False)
    return Ordinal(cut_points) if isinstance(likelihood, Ordinal) and cut_points is not None else likelihood


def uncertainty(mean, var, log_proba, likelihood, method="quadrature", cut_points=None):
    """``Uncertainty`` from the latent's mean and variance and the predictive log-probabilities (n, C) of a model
    of ``likelihood`` (a ``likelihoods.Likelihood`` or its name; binary and ordinal: ``mean`` and ``var`` per row;
    multiclass: (n, C)); an ordinal model's ``cut_points`` (where ``likelihood`` does not hold them)."""
    if method not in METHODS:
        raise ValueError(f"unknown uncertainty method {method!r}: use one of {METHODS}")
    xp = B.array_namespace(log_proba)
    multiclass = log_proba.shape[1] > 2 and mean.ndim == 2
    likelihood = _likelihood_object(likelihood, multiclass, cut_points)
    closed_form = None if multiclass else likelihood.houlsby_expected_entropy
    if method == "houlsby" and closed_form is None:
        raise ValueError("method='houlsby' is Houlsby et al. (2011)'s closed form for the binary probit; this model "
                         f"is {'multiclass' if multiclass else repr(likelihood.name)}: use method='quadrature'")
    total = entropy(log_proba)
    expected = closed_form(mean, var) if method == "houlsby" else likelihood.expected_entropy(mean, var)
    # I[y; f] = H[y] - E H[y | f] >= 0 (the entropy is concave); round-off could give -1e-17 where both are tiny
    aleatoric = xp.minimum(expected, total)
    return Uncertainty(total, aleatoric, total - aleatoric)


def model_uncertainty(model, Xc, in_xp, device, method="quadrature"):
    """``Uncertainty`` of the fitted ``model`` (a ``model.FittedModel``) at rows placed by
    ``prediction.placed_rows``, in the caller's array type (``prediction.to_caller``)."""
    mean, var = P.model_latent(model, Xc)
    log_p = P.model_log_proba(model, mean, var)
    result = uncertainty(mean, var, log_p, model.likelihood, method)
    return Uncertainty(*(P.to_caller(values, in_xp, device) for values in result))
