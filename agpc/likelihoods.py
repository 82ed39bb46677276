"""Likelihoods and their Gaussian integrals.

Probit: p(y | f) = Phi(y f), y in {-1, +1} (seed 000, sec. 2.1). Integrated against N(f | a, v) with the
extra FITC variance s this gives Z = Phi(y a / sqrt(1 + s + v)) (seed 000, eqs. 16-17); the EP updates
need log Z and its first two derivatives with respect to the cavity mean a.
"""

from __future__ import annotations

from .backend import array_namespace, log_ndtr, log_normal_pdf

__all__ = ["probit_tilted", "probit_predictive_log"]


def probit_tilted(y, mean, variance):
    """log Z, alpha = d log Z / d mean and gamma = -d^2 log Z / d mean^2 for Phi(y f) N(f | mean, variance - 1).

    ``variance`` is the total b = 1 + s + v of seed 000 eq. 17 (the probit's own unit variance
    included). The ratio N(z)/Phi(z) is formed as exp(log N(z) - log Phi(z)) so that it stays finite
    deep in the tail (seed 000 eq. 20).
    """
    xp = array_namespace(y, mean, variance)
    sqrt_b = xp.sqrt(variance)
    z = y * mean / sqrt_b
    log_z = log_ndtr(z)
    ratio = xp.exp(log_normal_pdf(z) - log_z)
    alpha = y * ratio / sqrt_b
    gamma = alpha * alpha + alpha * mean / variance
    return log_z, alpha, gamma


def probit_predictive_log(mean, variance):
    """log p(y = +1) and log p(y = -1) for f ~ N(mean, variance) (seed 000 eq. 37)."""
    xp = array_namespace(mean, variance)
    z = mean / xp.sqrt(1.0 + variance)
    return log_ndtr(z), log_ndtr(-z)
