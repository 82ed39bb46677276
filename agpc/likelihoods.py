"""Likelihoods: what EP, the variational methods and prediction need of each, and the Gauss-Hermite setup.

- :class:`Probit` p(y | f) = Phi(y f), y in {-1, +1} (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.1):
  EP's tilted moments in closed form (their eqs. 16-17, 20), the expected log density by quadrature (SVI),
  the predictive in closed form (their eq. 37).
- :class:`Logistic` p(y | f) = sigma(y f): the expected log density and the predictive by quadrature (SVI;
  the vi-JJ / vi-Taylor bounds of Izmailov & Kropotov (2017) are bounds of this likelihood, in variational).
- :class:`RobustMax` p(y | f) = 1 - epsilon if y = argmax_c f_c, epsilon / (C - 1) otherwise
  (Villacampa-Calvo & Hernandez-Lobato (2017), eq. 13, after Hensman et al. (2015b)): the multiclass
  variational model's expected log density (their eq. 15's term, eq. 11 by quadrature), the bound with the
  sparse conditional inside the log, the larger of the two row by row, and the predictive.
- :class:`Ordinal` p(y = k | f) = Phi(b_k - f) - Phi(b_{k-1} - f), b_0 = -inf < b_1 < ... < b_K = +inf
  (Chu & Ghahramani (2005), "Gaussian processes for ordinal regression", JMLR 6, with unit noise): EP's tilted
  moments in closed form (as for the probit), the derivatives in the cut points, the expected log density by
  quadrature (SVI) and the predictive in closed form.

Every expectation under a Gaussian goes through :class:`NormalQuadrature` (E_{N(f | m, s^2)} g(f) ~
sum_k w_k g(m + sqrt(2) s x_k) with Gauss-Hermite nodes x_k and weights w_k / sqrt(pi)).
``LIKELIHOODS`` names them (model files and the estimator store the name, never code); a likelihood of one's own
joins them by :func:`register_likelihood` (docs/likelihoods.md): a binary one with EP's ``site_terms`` is then
trained by the EP methods, one with a ``log_density`` by SVI, and prediction, uncertainty and the model file take it
by its name.
:func:`negative_log_likelihood` is the test NLL that every score of agpc reports.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import NamedTuple

from .backend import (array_device, array_namespace, asarray_like, gauss_hermite, gauss_legendre, inverse_mills_ratio,
                      log_ndtr, log_normal_pdf, to_numpy)

__all__ = [
    "MAX_QUADRATURE",
    "NormalQuadrature",
    "Likelihood",
    "Probit",
    "Logistic",
    "RobustMax",
    "Ordinal",
    "SiteTerms",
    "interval_log_probability",
    "PROBIT",
    "LOGISTIC",
    "ROBUST_MAX",
    "LIKELIHOODS",
    "ORDINAL_LIKELIHOOD",
    "MULTICLASS_PROBIT",
    "MulticlassProbit",
    "fitted_likelihood",
    "register_likelihood",
    "registered_likelihood",
    "unregister_likelihood",
    "likelihood_by_name",
    "probit_for",
    "argmax_log_proba",
    "negative_log_likelihood",
    "softplus",
    "sigmoid",
    "legendre_expectation",
    "LEGENDRE_NODES",
]

# The most Gauss-Hermite nodes ``GPClassifier(n_quadrature=...)`` takes (fit, prediction, model files; a model file
# took up to this many before the parameter was bounded): the papers use 20; the nodes' n x n Jacobi matrix
# (``backend.gauss_hermite``) of 10^7 nodes took the machine's memory, and 3,000 took seconds a row
MAX_QUADRATURE = 1000
GAUSSIAN_REACH = 12.0  # sd: the normal's mass beyond is 4e-33
LEGENDRE_NODES = 192  # the largest interval (80 wide, logistic) is then exact to round-off (tests/test_uncertainty)
HOULSBY_C = math.sqrt(math.pi * math.log(2.0) / 2.0)  # Houlsby et al. (2011), sec. 3


class NormalQuadrature:
    """n-point Gauss-Hermite quadrature for expectations under normal distributions, in ``like``'s namespace,
    type and device: E_{N(f | mean, sd^2)} g(f) ~ sum_k weights_k g(points(mean, sd)_k)."""

    def __init__(self, n, like):
        self.xp = array_namespace(like)
        self.nodes, self.raw_weights = gauss_hermite(n, self.xp, dtype=like.dtype, device=array_device(like))

    @cached_property
    def weights(self):
        """w_k / sqrt(pi): the weights of a standard normal expectation (they sum to one)."""
        return self.raw_weights / math.sqrt(math.pi)

    @cached_property
    def log_weights(self):
        """log of ``weights``: an outer weight that underflowed to 0 (past about 150 nodes in float64, 70 in float32)
        taken as the smallest normal number's, whose terms a sum cannot tell from 0 (its log was -inf, with NumPy's
        "divide by zero")."""
        xp = self.xp
        return xp.log(xp.maximum(self.weights, xp.finfo(self.weights.dtype).smallest_normal))

    def points(self, mean, sd):
        """f_k = mean + sqrt(2) sd x_k, a trailing axis of nodes after mean's (and sd's) axes."""
        return mean[..., None] + math.sqrt(2.0) * sd[..., None] * self.nodes


def softplus(x, xp):
    """log(1 + exp(x)) without overflow."""
    return xp.maximum(x, 0.0) + xp.log1p(xp.exp(-xp.abs(x)))


def sigmoid(x, xp):
    """1 / (1 + exp(-x)) without overflow."""
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def legendre_expectation(mean, var, lowest, highest, entropy_at, n_nodes=LEGENDRE_NODES):
    """E_{N(f | mean, var)} h(f) by Gauss-Legendre quadrature on [max(mean - 12 sd, lowest), min(mean + 12 sd,
    highest)], h = ``entropy_at`` (nodes (n, T) -> (n, T)), which is below round-off outside [lowest, highest]:
    ``Likelihood.expected_entropy``'s."""
    xp = array_namespace(mean)
    nodes, weights = gauss_legendre(n_nodes, mean)
    sd = xp.sqrt(var)
    low = xp.maximum(mean - GAUSSIAN_REACH * sd, lowest)
    high = xp.minimum(mean + GAUSSIAN_REACH * sd, highest)
    half = xp.maximum(high - low, 0.0)[:, None] / 2.0  # an empty interval: the entropy is 0 where q(f) has mass
    f = (low[:, None] + half) + half * nodes[None, :]
    density = xp.exp(log_normal_pdf((f - mean[:, None]) / sd[:, None])) / sd[:, None]
    return xp.sum(half * weights[None, :] * density * entropy_at(f), axis=1)


def _log_sum_exp(terms, xp):
    """log sum_k exp(terms[..., k]) over the last axis, by its largest term."""
    top = xp.max(terms, axis=-1)
    return top + xp.log(xp.sum(xp.exp(terms - top[..., None]), axis=-1))


def negative_log_likelihood(log_proba, class_index):
    """The mean negative log predictive probability of the true classes, -(1/n) sum_i log p(y_i | x_i): the test
    NLL that validation, early stopping and the ``agpc`` command report (scikit-learn's ``log_loss`` on the same
    probabilities, without its clipping).

    ``log_proba`` is (n, C), log p(class | x) in the order of the classes; ``class_index`` (n,) holds each row's
    true class as an integer index into those columns. Returns a 0-d array of ``log_proba``'s namespace (the
    caller takes ``float`` of it when it wants a number on the host)."""
    xp = array_namespace(log_proba)
    classes = xp.arange(log_proba.shape[1], dtype=class_index.dtype, device=array_device(class_index))
    is_true_class = class_index[:, None] == classes[None, :]
    return -xp.mean(xp.sum(xp.where(is_true_class, log_proba, 0.0), axis=1))


class SiteTerms(NamedTuple):
    """What an EP site update takes of a likelihood at a cavity N(f | a, b - 1) (b: the total variance, the
    likelihood's own unit noise included), per row: log Z_i, alpha = d log Z_i / da, gamma = -d^2 log Z_i / da^2,
    and kappa = -2 d log Z_i / db with ``cut_slopes`` (d log Z_i / d b_upper, d log Z_i / d b_lower) of an ordinal
    row's two cut points. The probit leaves kappa None (it is alpha a / b, formed from alpha as the binary passes
    always did) and has no cut points."""

    log_z: object
    alpha: object
    gamma: object
    kappa: object = None
    cut_slopes: object = None


class Likelihood:
    """What a likelihood offers the inference code, prediction and uncertainty (GPflow's split of a likelihood from
    the model it is part of, on agpc's own base class). Binary likelihoods take y in {-1, +1} and define
    ``log_density(y, f)`` (value and d/df); the expected log density (SVI), the predictive and the class
    probabilities by quadrature are then shared. ``site_terms`` (EP's tilted moments) is what the EP methods take of
    it: a likelihood that defines it is trained by them (``has_site_terms``)."""

    name = "likelihood"
    multiclass = False
    # |f| beyond which the entropy of p(y | f) is below round-off (``expected_entropy`` integrates no further);
    # infinite for a likelihood whose p(y | f) stays away from 0 and 1
    entropy_reach = math.inf
    # Houlsby et al. (2011)'s closed form of ``expected_entropy``, where the likelihood has one (the probit's)
    houlsby_expected_entropy = None
    # whether the most probable class is the sign of the latent mean, as for a likelihood p(y | f) = g(y f) with g
    # increasing and g(t) + g(-t) = 1 under a Gaussian q(f) (``prediction.most_probable_labels`` then forms no
    # probabilities); False: the probabilities decide
    sign_decides = False

    def log_density(self, y, f):
        raise NotImplementedError

    def class_log_densities(self, f):
        """(log p(y = +1 | f), log p(y = -1 | f)) at latent values ``f`` (any shape)."""
        ones = array_namespace(f).ones_like(f)
        return self.log_density(ones, f)[0], self.log_density(-ones, f)[0]

    def conditional_entropy(self, f):
        """H[p(y | f)] at latent values ``f`` (any shape), from ``class_log_densities``."""
        xp = array_namespace(f)
        log_p, log_q = self.class_log_densities(f)
        return -(xp.exp(log_p) * log_p + xp.exp(log_q) * log_q)

    def entropy_range(self):
        """(lowest, highest) f outside which ``conditional_entropy`` is below round-off (``entropy_reach``)."""
        return -self.entropy_reach, self.entropy_reach

    def expected_entropy(self, mean, var, n_nodes=LEGENDRE_NODES):
        """E_{N(f | mean, var)} H[p(y | f)] per row (the aleatoric part of the predictive entropy, ``agpc.uncertainty``)
        by Gauss-Legendre quadrature over ``entropy_range`` (``legendre_expectation``): 9 for the probit, 40 for the
        logistic; a likelihood whose entropy never vanishes (reach infinite) integrates over 12 sd of q(f)."""
        return legendre_expectation(mean, var, *self.entropy_range(), self.conditional_entropy, n_nodes)

    def site_terms(self, y, mean, variance):
        """``SiteTerms`` of the tilted distribution p(y | f) N(f | mean, variance - 1) (``variance``: the total b of
        Hernandez-Lobato & Hernandez-Lobato (2016), eq. 17, the likelihood's own unit noise included), per row."""
        raise NotImplementedError(f"the {self.name!r} likelihood has no EP site terms")

    @property
    def has_site_terms(self):
        """Whether the EP methods can train it: it defines ``site_terms``."""
        return type(self).site_terms is not Likelihood.site_terms

    @property
    def has_log_density(self):
        """Whether SVI can train it: it defines ``log_density``."""
        return type(self).log_density is not Likelihood.log_density

    def at(self, kernel):
        """The likelihood as a model with ``kernel`` has it: itself, unless its parameters are the kernel's (the
        ordinal's cut points, ``Ordinal.at``). A kernel that carries cut points is an ordinal model's: with another
        likelihood its cut points would be trained as nothing, silently; one ValueError instead."""
        if getattr(kernel, "cut_points", None) is not None:
            raise ValueError(f"the kernel carries ordinal cut points: it is an ordinal model's, not a {self.name!r} "
                             "one's (pass likelihood=agpc.likelihoods.ORDINAL_LIKELIHOOD)")
        return self

    def expected_log_density(self, y, mean, var, n_quadrature=20):
        """E_{N(f | mean, var)} log p(y | f) by Gauss-Hermite, and its derivatives in mean and var.

        With f_k = mean + sqrt(2 var) x_k: E = sum_k w_k / sqrt(pi) log p(y | f_k). The derivatives are those
        of this quadrature sum (so that finite differences of the computed bound agree with them exactly).
        """
        xp = array_namespace(y, mean, var)
        quadrature = NormalQuadrature(n_quadrature, mean)
        weights = quadrature.weights
        sd = xp.sqrt(var)
        value, slope = self.log_density(y[:, None], quadrature.points(mean, sd))
        expected = xp.sum(value * weights[None, :], axis=1)
        d_mean = xp.sum(slope * weights[None, :], axis=1)
        d_sd = xp.sum(slope * (math.sqrt(2.0) * quadrature.nodes * weights)[None, :], axis=1)
        return expected, d_mean, d_sd / (2.0 * sd)

    def predictive_log_proba(self, mean, var, n_quadrature=20):
        """log p(y = +1 | x) and log p(y = -1 | x) for f ~ N(mean, var): by Gauss-Hermite, in log space (log
        sum_k w_k p(+-1 | f_k) by log-sum-exp: with a large amplitude every sigma(-f_k) of the logistic underflows to
        0, and the log of the plain sum was -inf), each sign on its own (not as 1 - p: the small tail stays exact),
        then both less the log of their sum: the weights sum to 1 only to round-off, and a confident row's log p came
        to +4.4e-16, a probability of 1.0000000000000004 (an estimator-API audit, 2026-12-02)."""
        xp = array_namespace(mean, var)
        quadrature = NormalQuadrature(n_quadrature, mean)
        f = quadrature.points(mean, xp.sqrt(var))
        log_weights = quadrature.log_weights[None, :]
        log_pos, log_neg = self.class_log_densities(f)
        log_pos, log_neg = _log_sum_exp(log_pos + log_weights, xp), _log_sum_exp(log_neg + log_weights, xp)
        total = xp.logaddexp(log_pos, log_neg)
        return log_pos - total, log_neg - total

    def class_log_proba(self, mean, var, n_quadrature=20):
        """log p(class k | x), (n, K), the classes in their order (binary: -1 then +1)."""
        log_pos, log_neg = self.predictive_log_proba(mean, var, n_quadrature)
        return array_namespace(mean).stack([log_neg, log_pos], axis=1)

    def class_index(self, y):
        """The rows' class indices (int64) from the labels as the passes carry them (binary: -1 / +1)."""
        xp = array_namespace(y)
        return xp.astype(y > 0.0, xp.int64)

    def __repr__(self):
        return f"{type(self).__name__}()"


class Probit(Likelihood):
    """p(y | f) = Phi(y f)."""

    name = "probit"
    entropy_reach = 9.0  # Phi(-9) ~ 1e-19
    sign_decides = True

    def log_density(self, y, f):
        xp = array_namespace(y, f)
        t = y * f
        value = log_ndtr(t)
        return value, y * xp.exp(log_normal_pdf(t) - value)

    def class_log_densities(self, f):
        return log_ndtr(f), log_ndtr(-f)

    def tilted_moments(self, y, mean, variance):
        """log Z, alpha = d log Z / d mean and gamma = -d^2 log Z / d mean^2 for Phi(y f) N(f | mean, variance - 1).

        ``variance`` is the total b = 1 + s + v of Hernandez-Lobato & Hernandez-Lobato (2016), eq. 17 (the
        probit's own unit variance included). The ratio N(z)/Phi(z) of their eq. 20 is ``inverse_mills_ratio``,
        finite deep in the tail and exact to round-off there, where gamma = ratio (ratio + z) / b cancels ratio + z
        ~ 1 / |z|: exp(log N(z) - log Phi(z)) made gamma 1.6 for 1 at z = -1e4.
        """
        xp = array_namespace(y, mean, variance)
        sqrt_b = xp.sqrt(variance)
        z = y * mean / sqrt_b
        log_z = log_ndtr(z)
        ratio = inverse_mills_ratio(z)
        alpha = y * ratio / sqrt_b
        gamma = alpha * alpha + alpha * mean / variance
        return log_z, alpha, gamma

    def site_terms(self, y, mean, variance):
        """``tilted_moments`` as a ``SiteTerms`` (what the EP passes take of any likelihood)."""
        return SiteTerms(*self.tilted_moments(y, mean, variance))

    def predictive_log_proba(self, mean, var, n_quadrature=None):
        """Closed form (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 37): no quadrature."""
        xp = array_namespace(mean, var)
        z = mean / xp.sqrt(1.0 + var)
        return log_ndtr(z), log_ndtr(-z)

    def houlsby_expected_entropy(self, mean, var):
        """Houlsby et al. (2011), sec. 3's closed form of ``expected_entropy``, in nats: with h(Phi(x)) ~ exp(-x^2 /
        (pi ln 2)) (bits), E_{N(f | mean, var)} H ~ ln 2 C / sqrt(var + C^2) exp(-mean^2 / (2 (var + C^2))), C^2 =
        pi ln 2 / 2. An approximation (the quadrature is exact)."""
        xp = array_namespace(mean)
        spread = var + HOULSBY_C ** 2
        return math.log(2.0) * HOULSBY_C / xp.sqrt(spread) * xp.exp(-mean * mean / (2.0 * spread))


class Logistic(Likelihood):
    """p(y | f) = sigma(y f)."""

    name = "logistic"
    entropy_reach = 40.0  # 40 e^-40 ~ 2e-16
    sign_decides = True

    def log_density(self, y, f):
        xp = array_namespace(y, f)
        t = y * f
        return -softplus(-t, xp), y * sigmoid(-t, xp)

    def class_log_densities(self, f):
        xp = array_namespace(f)
        return -softplus(-f, xp), -softplus(f, xp)

    def predictive_log_proba(self, mean, var, n_quadrature=None):
        """log p(y = +1 | x) and log p(y = -1 | x) for f ~ N(mean, var) by ``logistic_predictive_log_proba``'s
        Gauss-Legendre panels, within about 1e-6 at every variance (``n_quadrature``, Gauss-Hermite's, is not
        used: with 20 nodes p was 0.006 off at var = 30 and 0.09 at var = 1,000)."""
        return logistic_predictive_log_proba(mean, var)


# Nodes of each of the logistic predictive's two Gauss-Legendre panels (``logistic_predictive_log_proba``): against a
# reference by SciPy's adaptive quadrature over means -1,000 to 50 and variances 1e-4 to 1e4, p was within 1.7e-6
# at 64 nodes (3.4e-8 at 96, 2e-10 at 128), log p within 2e-2 for p ~ 1e-217 (mean -1,000, var 1,000) and 2e-6
# elsewhere. Gauss-Hermite's 20 nodes had left p 0.006 off at var = 30, 0.03 at 100 and 0.09 at 1,000 (a prediction
# audit, 2026-12-03: a vi-jj fit of amplitude 60 predicted 0.30 where the predictive is 0.31), exact below var = 1.
# The panels cost some 10 times Gauss-Hermite's 20 nodes (0.5 s for 100,000 rows on one core), taken a block of
# PANEL_BLOCK_ROWS rows at a time (their n x 128 temporaries: 64 MB a block).
LOGISTIC_PANEL_NODES = 64
PANEL_BLOCK_ROWS = 1 << 16


def logistic_predictive_log_proba(mean, var, n_nodes=LOGISTIC_PANEL_NODES):
    """(log p(y = +1), log p(y = -1)) for f ~ N(mean, var) under the logistic, p(+1) = E sigma(f).

    The smaller of the two, q = E sigma(f) for f ~ N(a, var) with a = -|mean| (by symmetry, sigma(-f) = 1 -
    sigma(f)), is integrated in log space by Gauss-Legendre on two panels split at f = 0, where sigma bends (its
    poles, at i pi (2k + 1), all sit over that end of both panels, so the rule converges fast however wide they
    are): [a - 12 sd, min(0, a + var + 12 sd)] and [0, a + 12 sd] where that is not empty. The first panel reaches
    a + var + 12 sd because sigma(f) ~ e^f deep in the left tail shifts the integrand's mass there to N(a + var,
    var) (mean -1,000, var 1,000: log q off by 196 with the panel ending at a + 12 sd). The larger is log(1 - q),
    so the two sum to one to round-off, and a tiny q keeps its own precision. A zero variance is sigma(mean)."""
    xp = array_namespace(mean, var)
    nodes, weights = gauss_legendre(n_nodes, mean)
    n = mean.shape[0]
    log_q = xp.concat([_logistic_log_q(mean[lo:min(n, lo + PANEL_BLOCK_ROWS)], var[lo:min(n, lo + PANEL_BLOCK_ROWS)],
                                       nodes, xp.log(weights), xp) for lo in range(0, n, PANEL_BLOCK_ROWS)]
                      ) if n > PANEL_BLOCK_ROWS else _logistic_log_q(mean, var, nodes, xp.log(weights), xp)
    log_rest = xp.log1p(-xp.exp(log_q))
    below = mean <= 0.0
    return xp.where(below, log_q, log_rest), xp.where(below, log_rest, log_q)


def _logistic_log_q(mean, var, nodes, log_weights, xp):
    """log E sigma(f), f ~ N(-|mean|, var), by ``logistic_predictive_log_proba``'s panels."""
    a = -xp.abs(mean)
    has_spread = var > 0.0
    v = xp.where(has_spread, var, 1.0)  # (a point mass is sigma(mean) itself, below)
    sd = xp.sqrt(v)
    panels = [(a - GAUSSIAN_REACH * sd, xp.minimum(a + v + GAUSSIAN_REACH * sd, 0.0)),
              (xp.zeros_like(a), a + GAUSSIAN_REACH * sd)]
    terms = []
    for start, end in panels:
        half = (end - start) / 2.0
        f = (start + half)[:, None] + half[:, None] * nodes[None, :]
        z = ((start + half - a) / sd)[:, None] + (half / sd)[:, None] * nodes[None, :]  # (f - a) / sd
        log_scale = xp.log(xp.maximum(half, xp.finfo(half.dtype).smallest_normal) / sd) - 0.5 * math.log(2.0 * math.pi)
        term = log_scale[:, None] + log_weights[None, :] - 0.5 * z * z - softplus(-f, xp)
        terms.append(xp.where((half > 0.0)[:, None], term, -xp.inf))  # (the second panel is empty where a < -12 sd)
    return xp.where(has_spread, _log_sum_exp(xp.concat(terms, axis=1), xp), -softplus(-a, xp))


# The multiclass predictive (eq. 11) integrates, for each class k, N(f | m_k, v_k) times the probits of its rivals,
# whose steps are as narrow as the rivals' sd. Gauss-Hermite centred on class k (64 nodes until 2026-12) missed the
# step of a rival whose variance was 100-10,000 times smaller: p off by up to 0.04 (SciPy's adaptive quadrature the
# reference). Instead every class's integral runs over one shared grid: Gauss-Legendre panels between the points
# m_c + b sd_c of every class c (b in ARGMAX_BREAKS), so that each panel lies inside one stretch of every class's
# own scale, where its density and its probit are smooth. Measured against SciPy on 150 random rows (2-8 classes,
# variances e^-9 to e^9, means up to 100 apart) and 100 of similar variances (within e^+-1.2): p within 8e-8 at 7
# points x 6 nodes (4e-6 at 4 nodes, 7e-7 at 5); raw sums within 2e-7 of one. Its cost, C normal cdfs at 6 (7 C - 1) points a row, is that of 64 nodes for each of C^2
# pairs; rows go ARGMAX_BLOCK_VALUES / (42 C^2) at a time (the (rows, C, 42 C) temporaries: 32 MB).
ARGMAX_BREAKS = (-7.0, -4.0, -2.0, 0.0, 2.0, 4.0, 7.0)
ARGMAX_PANEL_NODES = 6
ARGMAX_BLOCK_VALUES = 1 << 22


def argmax_log_proba(mean, var, normalise=True):
    """log p(f_k is the largest) for independent Gaussian f_c ~ N(mean_c, var_c), (n, C): the predictive of
    Villacampa-Calvo & Hernandez-Lobato (2017), eq. 11,

        p(y = k) = int N(f | m_k, v_k) prod_{j != k} Phi((f - m_j) / sqrt(v_j)) df,

    for every k on one grid of Gauss-Legendre panels split at each class's mean and mean +- (2, 4, 7) sd
    (ARGMAX_BREAKS; the mass beyond them, below 3e-12 a class, is left out). An sd below sqrt(eps) (1 + |mean|) of its type (1.5e-8 in
    float64: a point mass, whose panels would round to nothing) is taken as that. The exact values sum to one; with
    ``normalise`` the quadrature's (small) departure from that is divided out."""
    xp = array_namespace(mean, var)
    n, C = mean.shape
    nodes, weights = gauss_legendre(ARGMAX_PANEL_NODES, mean)
    breaks = asarray_like(ARGMAX_BREAKS, xp, device=array_device(mean), dtype=mean.dtype)
    rows = max(1, ARGMAX_BLOCK_VALUES // (C * C * len(ARGMAX_BREAKS) * ARGMAX_PANEL_NODES))
    log_p = xp.concat([_argmax_log_p(mean[lo:min(n, lo + rows)], var[lo:min(n, lo + rows)], breaks, nodes,
                                     xp.log(weights), xp) for lo in range(0, n, rows)], axis=0
                      ) if n > rows else _argmax_log_p(mean, var, breaks, nodes, xp.log(weights), xp)
    if normalise:
        log_p = log_p - _log_sum_exp(log_p, xp)[:, None]
    return log_p


def _argmax_log_p(mean, var, breaks, nodes, log_weights, xp):
    """``argmax_log_proba`` unnormalised, for one block of rows: the integrand of class k at each grid point f is
    N(f | m_k, v_k) prod_c Phi(z_c) / Phi(z_k) (in logs: the sum over all classes less k's own)."""
    n, C = mean.shape
    sd = xp.maximum(xp.sqrt(var), math.sqrt(float(xp.finfo(mean.dtype).eps)) * (1.0 + xp.abs(mean)))
    points = xp.sort(xp.reshape(mean[:, :, None] + sd[:, :, None] * breaks[None, None, :], (n, -1)), axis=1)
    start, half = points[:, :-1], (points[:, 1:] - points[:, :-1]) / 2.0
    f = xp.reshape((start + half)[:, :, None] + half[:, :, None] * nodes[None, None, :], (n, -1))
    log_w = xp.reshape(xp.log(xp.maximum(half, xp.finfo(half.dtype).smallest_normal))[:, :, None]
                       + log_weights[None, None, :], (n, -1))  # (a panel between equal points weighs nothing)
    z = (f[:, None, :] - mean[:, :, None]) / sd[:, :, None]  # (n, C, grid)
    log_phi = log_ndtr(z)
    shared = xp.sum(log_phi, axis=1) + log_w  # (n, grid): what every class's integrand has at a point
    # log N(f | m_k, v_k) = -z^2 / 2 - log sd_k - log(2 pi) / 2, the last two the same at every point of the grid
    return _log_sum_exp(shared[:, None, :] - log_phi - 0.5 * z * z, xp) - xp.log(sd) - 0.5 * math.log(2.0 * math.pi)


class RobustMax(Likelihood):
    """p(y | f) = 1 - epsilon if y = argmax_c f_c, epsilon / (C - 1) otherwise; y a class index."""

    name = "robust-max"
    multiclass = True
    EPSILON = 1e-3  # Villacampa-Calvo & Hernandez-Lobato (2017), sec. 3 (after Hensman et al. 2015b)

    def __init__(self, epsilon=EPSILON):
        if not 0.0 < epsilon < 1.0:
            raise ValueError(f"robust-max epsilon must be in (0, 1), got {epsilon!r}")
        self.epsilon = float(epsilon)

    def expected_entropy(self, mean, var, n_nodes=None):
        """H[y | f], the same for every f: -(1 - eps) log(1 - eps) - eps log(eps / (C - 1)), per row of the (n, C)
        latent ``mean``."""
        n_classes = mean.shape[1]
        value = -(1.0 - self.epsilon) * math.log1p(-self.epsilon) - self.epsilon * math.log(
            self.epsilon / (n_classes - 1))
        return array_namespace(mean).full(mean.shape[:1], value, dtype=mean.dtype, device=array_device(mean))

    def argmax_probability(self, y, mean, var, n_quadrature=20):
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
        quadrature = NormalQuadrature(n_quadrature, mean)
        weights = quadrature.weights
        sd = xp.sqrt(var)
        m_y = xp.sum(xp.where(onehot, mean, 0.0), axis=1)
        s_y = xp.sum(xp.where(onehot, sd, 0.0), axis=1)
        scaled_nodes = math.sqrt(2.0) * quadrature.nodes
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

    def expected_log_density(self, y, mean, var, n_quadrature=20):
        """E_q log p(y_i | f_i) = log(eps / (C-1)) + (log(1 - eps) - log(eps / (C-1))) S_i (Villacampa-Calvo &
        Hernandez-Lobato (2017), eq. 15's data term) and its derivatives in mean and var, (b,), (b, C)."""
        C = mean.shape[1]
        log_hit, log_miss = math.log1p(-self.epsilon), math.log(self.epsilon / (C - 1))
        S, d_mean, d_var = self.argmax_probability(y, mean, var, n_quadrature)
        gap = log_hit - log_miss
        return log_miss + gap * S, gap * d_mean, gap * d_var

    def conditional_log_density_bound(self, y, mean, var, residual, n_quadrature=20):
        """A lower bound on E_q(u) log p(y_i | u) when f_i | u ~ N(g_i, diag s_i) (the conditional, FITC's
        independent rows) and q(g_i) = N(mean_i, diag var_i) (independent classes), and its derivatives in mean,
        var and residual s, each (b, C): the robust max's data term with the conditional's variance inside the log.

        p(y | u) = eps' + gap P(f_y > f_k for all k != y | u), eps' = eps / (C - 1), gap = 1 - eps - eps'. The
        events f_y > f_k share f_y and each is increasing in it, so (Chebyshev's association inequality)
        P(all) >= prod_k Phi(d_k / r_k), d_k = g_y - g_k, r_k^2 = s_y + s_k: Villacampa-Calvo & Hernandez-Lobato
        (2017)'s eq. 6 product of probits, a bound here. log(eps' + gap exp(T)) is increasing and convex in T,
        so by Jensen over q

            E_q log p(y | u) >= log(eps' + gap exp(sum_k E_q log Phi(d_k / r_k))),

        with d_k ~ N(mean_y - mean_k, var_y + var_k) under q: C - 1 one-dimensional Gauss-Hermite integrals
        (E_{N(d | mu, sd^2)} log Phi(d / r) ~ sum_t w_t log Phi((mu + sqrt(2) sd x_t) / r)). The derivatives are
        those of the quadrature sums. Unlike ``expected_log_density`` (Jensen over f | u too, linear in
        P(f_y is the largest)), the bound is not raised by making every row's argmax certain: a row whose
        class is unlikely costs log Phi of its margin, as in EP's model (docs/methods/svi.md). It is loose
        where q is broad against the conditional (q at the prior, s small): there every row sits at the floor
        log eps' and gives no gradient; ``log_density_bound`` takes the larger of the two bounds."""
        xp = array_namespace(mean)
        C = mean.shape[1]
        onehot = y[:, None] == xp.arange(C, dtype=y.dtype, device=array_device(y))[None, :]
        log_miss = math.log(self.epsilon / (C - 1))
        log_gap = math.log((1.0 - self.epsilon) - self.epsilon / (C - 1))
        quadrature = NormalQuadrature(n_quadrature, mean)
        weights = quadrature.weights
        scaled_nodes = math.sqrt(2.0) * quadrature.nodes

        def of_true_class(a):
            return xp.sum(xp.where(onehot, a, 0.0), axis=1)[:, None]

        rival = ~onehot
        one = xp.ones_like(mean)
        margin = of_true_class(mean) - mean  # (b, C): mu_d of each pair (0 in the true class's column)
        sd = xp.sqrt(xp.where(rival, of_true_class(var) + var, one))  # sd_d
        scale = xp.sqrt(xp.where(rival, of_true_class(residual) + residual, one))  # r
        z = (margin[:, :, None] + sd[:, :, None] * scaled_nodes) / scale[:, :, None]  # (b, C, T)
        log_phi = log_ndtr(z)
        ratio = xp.exp(log_normal_pdf(z) - log_phi)  # N(z) / Phi(z)
        pair = xp.where(rival, xp.sum(log_phi * weights, axis=2), 0.0)  # E_q log Phi(d_k / r_k)
        d_margin = xp.where(rival, xp.sum(ratio * weights, axis=2) / scale, 0.0)
        d_var = xp.where(rival, xp.sum(ratio * (scaled_nodes * weights), axis=2) / (2.0 * sd * scale), 0.0)
        d_residual = xp.where(rival, -xp.sum(ratio * z * weights, axis=2) / (2.0 * scale * scale), 0.0)
        total = xp.sum(pair, axis=1)  # T
        # log(eps' + gap exp(T)) and its slope rho = gap exp(T) / (eps' + gap exp(T)), without overflow
        hit = log_gap + total
        value = xp.maximum(hit, log_miss) + xp.log1p(xp.exp(-xp.abs(hit - log_miss)))
        rho = sigmoid(hit - log_miss, xp)[:, None]

        def spread(d):  # a pair's derivative reaches the rival's column and, summed over the pairs, the true class's
            return rho * xp.where(onehot, xp.sum(d, axis=1)[:, None], d)

        d_mean = rho * xp.where(onehot, xp.sum(d_margin, axis=1)[:, None], -d_margin)
        return value, d_mean, spread(d_var), spread(d_residual)

    def log_density_bound(self, y, mean, var, residual, n_quadrature=20):
        """Row by row the larger of two lower bounds on E_q(u) log p(y_i | u) (f_i | u ~ N(g_i, diag s_i), q(g_i) =
        N(mean_i, diag var_i)), and its derivatives in mean, var and residual s, each (b, C): the conditional bound
        (``conditional_log_density_bound``) and Villacampa-Calvo & Hernandez-Lobato (2017)'s eq. 15 term
        E_q(f_i) log p(y_i | f_i) = E_q(u) E_{f_i | u} log p(y_i | f_i) (``expected_log_density`` at the total
        variance var + s; Jensen over f_i | u). Each is a lower bound, so their maximum is one. Eq. 15's is the
        larger where q is broad against the conditional (the start, q at the prior), the conditional one where q
        has settled; a row's derivatives are those of the larger (at a tie, the conditional one's)."""
        value, d_mean, d_var, d_residual = self.conditional_log_density_bound(y, mean, var, residual, n_quadrature)
        xp = array_namespace(mean)
        jensen, j_mean, j_var = self.expected_log_density(y, mean, var + residual, n_quadrature)
        pick = jensen > value
        column = pick[:, None]
        return (xp.where(pick, jensen, value), xp.where(column, j_mean, d_mean), xp.where(column, j_var, d_var),
                xp.where(column, j_var, d_residual))

    def class_log_proba(self, mean, var, n_quadrature=None):
        """``predictive_log_proba`` on its own grid (``argmax_log_proba``: ``n_quadrature`` is a binary model's)."""
        return self.predictive_log_proba(mean, var)

    def predictive_log_proba(self, mean, var, n_quadrature=None):
        """log p(y = k | x), (n, C): (1 - eps) S_k + eps / (C - 1) (1 - S_k), with S_k the probability that f_k is
        the largest (``argmax_log_proba``, on its own grid: ``n_quadrature`` is a binary model's)."""
        xp = array_namespace(mean)
        C = mean.shape[1]
        S = xp.exp(argmax_log_proba(mean, var))
        return xp.log((1.0 - self.epsilon) * S + self.epsilon / (C - 1) * (1.0 - S))

    def __repr__(self):
        return f"RobustMax(epsilon={self.epsilon!r})"


def _log1m_exp(x, xp):
    """log(1 - exp(x)) for x <= 0, accurate on both sides of -log 2 (Maechler 2012, "Accurately computing
    log(1 - exp(-|a|))"). At x = 0 (an empty interval: an absent ordinal class whose cut gap the fit's steps drove
    to exp(-782), below float64's range) the log of 0 is taken as the log of the type's smallest normal number, about
    -708 in float64: a probability of 0 to every digit, where NumPy's log(0) warned of a division by zero."""
    near = x > -math.log(2.0)
    tiny = float(xp.finfo(x.dtype).smallest_normal)
    return xp.where(near, xp.log(xp.maximum(-xp.expm1(xp.where(near, x, -1.0)), tiny)),
                    xp.log1p(-xp.exp(xp.where(near, -1.0, x))))


def interval_log_probability(lower, upper, mean, variance):
    """log P(lower < f + e < upper) for f ~ N(mean, variance - 1), e ~ N(0, 1), i.e. log(Phi(z_hi) - Phi(z_lo))
    with z = (cut - mean) / sqrt(variance), and (z_lo, z_hi). The difference is taken where it keeps its digits:
    as Phi(z_hi) (1 - Phi(z_lo) / Phi(z_hi)) below the median, as Phi(-z_lo) (1 - Phi(-z_hi) / Phi(-z_lo)) above
    it (an interval deep in the upper tail, where both CDFs round to 1). Infinite cut points are the outer
    classes' (b_0 = -inf, b_K = +inf)."""
    xp = array_namespace(mean)
    sqrt_b = xp.sqrt(variance)
    z_lo, z_hi = (lower - mean) / sqrt_b, (upper - mean) / sqrt_b
    below = z_lo <= 0.0
    log_hi, log_lo = log_ndtr(z_hi), log_ndtr(z_lo)
    log_lo_tail, log_hi_tail = log_ndtr(-z_lo), log_ndtr(-z_hi)
    direct = log_hi + _log1m_exp(xp.where(below, log_lo - log_hi, -1.0), xp)
    complement = log_lo_tail + _log1m_exp(xp.where(below, -1.0, log_hi_tail - log_lo_tail), xp)
    return xp.where(below, direct, complement), z_lo, z_hi


# Deeper in the tail than this (w < -MILLS_TAIL_FROM), lambda(w) + w of the inverse Mills ratio is the Laplace continued
# fraction 1 / (x + 2 / (x + 3 / (x + ...))), x = -w, to ``MILLS_TAIL_TERMS`` terms: against 5,000 terms, 12 are exact
# to float64's last digit from x = 10 (1.3e-15 there), where exp(log N - log Phi) - x still keeps 13-15 of its digits;
# at x = 7e4 it had kept 7 (and gamma, r times it, lost the rest to the cancellation of alpha^2 + kappa).
MILLS_TAIL_FROM = 10.0
MILLS_TAIL_TERMS = 12


def _mills_tail(w, r, xp, one_sided):
    """(lambda(w), lambda(w) + w) for the inverse Mills ratio lambda(w) = N(w) / Phi(w), ``r`` its value as
    exp(log N(w) - log Phi(w)) (0 where the cut point is infinite: then both are 0): by the continued fraction beyond
    ``MILLS_TAIL_FROM`` (lambda = x + c, lambda + w = c), else r and r + w. Only where the interval is ``one_sided``
    (an outer class): an interior class's r is N(w) / (Phi(z_hi) - Phi(z_lo)), not lambda(w), and is kept as given
    (taking lambda there gave a class of width 0.3 sd, 10 sd from its row, gamma -0.33 for 0.09 and alpha's sign
    flipped on a narrower one)."""
    deep = (w < -MILLS_TAIL_FROM) & one_sided
    x = xp.where(deep, -w, MILLS_TAIL_FROM)
    t = x
    for k in range(MILLS_TAIL_TERMS, 1, -1):
        t = x + k / t
    c = 1.0 / t
    return xp.where(deep, x + c, r), xp.where(deep, c, xp.where(r > 0.0, r + w, 0.0))


class Ordinal(Likelihood):
    """p(y = k | f) = Phi(b_{k+1} - f) - Phi(b_k - f) for classes k = 0, ..., K-1 in their order, cut points
    b_1 < ... < b_{K-1} (``cut_points``, an array) and b_0 = -inf, b_K = +inf: the ordinal probit likelihood of
    Chu & Ghahramani (2005), with the noise variance fixed at 1 (as the probit's: the kernel's amplitude
    sets the scale). Labels ``y`` are class indices 0..K-1 (floats, as the passes carry labels), except for K = 2,
    where they are the binary encoding -1 / +1 (class 0 / class 1)."""

    name = "ordinal"
    entropy_reach = 9.0  # beyond the outer cut points, as the probit's

    def __init__(self, cut_points=None):
        # None: the registered ``ORDINAL_LIKELIHOOD``, whose cut points a model's kernel holds
        self.cut_points = cut_points

    def entropy_range(self):
        """Within ``entropy_reach`` of the outer cut points."""
        cuts = [float(c) for c in to_numpy(self.cut_points)]
        return cuts[0] - self.entropy_reach, cuts[-1] + self.entropy_reach

    def conditional_entropy(self, f):
        """-sum_k p(y = k | f) log p(y = k | f) over the K intervals of the cut points."""
        xp = array_namespace(f)
        bounds = [-math.inf, *(float(c) for c in to_numpy(self.cut_points)), math.inf]
        ones = xp.ones_like(f)
        h = xp.zeros_like(f)
        for lower, upper in zip(bounds[:-1], bounds[1:]):
            log_p = interval_log_probability(lower * ones, upper * ones, f, ones)[0]
            h = h - xp.where(log_p > -math.inf, xp.exp(log_p) * log_p, 0.0)
        return h

    def at(self, kernel):
        """The ordinal likelihood at ``kernel``'s cut points (``kernels.OrdinalKernel`` carries them, so that the
        hyper-parameter step, the checkpoints and the model file treat them as they treat the kernel's parameters)."""
        return Ordinal(kernel.cut_points)

    @property
    def n_classes(self):
        return self.cut_points.shape[0] + 1

    def class_index(self, y):
        """The rows' class indices (int64) from the labels as the passes carry them."""
        xp = array_namespace(y)
        index = (y > 0.0) if self.n_classes == 2 else y
        return xp.astype(index, xp.int64)

    def bounds(self, y):
        """(b_k, b_{k+1}) of each row's class k, and the class index: the interval its f + e falls in."""
        xp = array_namespace(self.cut_points)
        index = self.class_index(y)
        infinite = xp.full((1,), xp.inf, dtype=self.cut_points.dtype, device=array_device(self.cut_points))
        padded = xp.concat([-infinite, self.cut_points, infinite])
        flat = xp.reshape(index, (-1,))  # (``take`` takes 1-D indices)
        lower = xp.reshape(xp.take(padded, flat, axis=0), index.shape)
        upper = xp.reshape(xp.take(padded, flat + 1, axis=0), index.shape)
        return lower, upper, index

    def _ratios(self, y, mean, variance):
        xp = array_namespace(mean)
        lower, upper, index = self.bounds(y)
        log_z, z_lo, z_hi = interval_log_probability(lower, upper, mean, variance)
        sqrt_b = xp.sqrt(variance)
        # N(z)/Z as exp(log N(z) - log Z): finite in the tails; an infinite cut point's term is 0 (z N(z) too)
        def ratio(z):
            finite = xp.isfinite(z)
            z = xp.where(finite, z, 0.0)
            return z, xp.exp(xp.where(finite, log_normal_pdf(z) - log_z, -xp.inf))

        open_below, open_above = ~xp.isfinite(z_lo), ~xp.isfinite(z_hi)  # (the outer classes: one cut point)
        z_lo, r_lo = ratio(z_lo)
        z_hi, r_hi = ratio(z_hi)
        # an outer class's interval has one cut point: its r is the inverse Mills ratio lambda(w) = N(w) / Phi(w) of
        # w = z_hi (the lowest class) or -z_lo (the highest), and -d^2 log Z / da^2 is lambda (lambda + w) / b_tot,
        # whose lambda + w ``_mills_tail`` forms without cancellation deep in the tail
        r_hi, gap_hi = _mills_tail(z_hi, r_hi, xp, open_below)
        r_lo, gap_lo = _mills_tail(-z_lo, r_lo, xp, open_above)
        one_sided = (open_below, gap_hi, open_above, gap_lo)
        return log_z, sqrt_b, r_lo, r_hi, z_lo * r_lo, z_hi * r_hi, index, one_sided

    def site_terms(self, y, mean, variance):
        """log Z = log(Phi(z_hi) - Phi(z_lo)), z = (b - a) / sqrt(b_tot), for the cavity N(f | a, b_tot - 1) and its
        derivatives (Chu & Ghahramani (2005)'s EP: the tilted moments, and the derivatives in the cut points for the
        gradient). With r = N(z) / Z:

            alpha = (r_lo - r_hi) / sqrt(b_tot),   kappa = -2 d log Z / d b_tot = (z_hi r_hi - z_lo r_lo) / b_tot,
            gamma = -d^2 log Z / da^2 = alpha^2 + kappa,
            d log Z / d b_upper = r_hi / sqrt(b_tot),   d log Z / d b_lower = -r_lo / sqrt(b_tot).

        The probit's Phi(y a / sqrt(b)) is the case K = 2 with b_1 = 0: kappa = alpha a / b, as there."""
        log_z, sqrt_b, r_lo, r_hi, zr_lo, zr_hi, index, one_sided = self._ratios(y, mean, variance)
        alpha = (r_lo - r_hi) / sqrt_b
        kappa = (zr_hi - zr_lo) / variance
        # an outer class: gamma = r (r + w) / b_tot (``_ratios``), where alpha^2 + kappa cancelled to the digits of
        # r, which exp(log N - log Z) holds to |log Z| eps: cut points 1e5 from the data made gamma 2185 where it is
        # 0.5, 1 - v gamma negative, and ADF's log Z NaN at the first step
        open_below, gap_hi, open_above, gap_lo = one_sided
        xp = array_namespace(mean)
        gamma = xp.where(open_below, r_hi * gap_hi / variance,
                         xp.where(open_above, r_lo * gap_lo / variance, alpha * alpha + kappa))
        return SiteTerms(log_z, alpha, gamma, kappa, (r_hi / sqrt_b, -r_lo / sqrt_b, index))

    def cut_point_gradient(self, slopes, row_scale):
        """sum_i row_scale_i d log Z_i / d b_j for j = 1..K-1 (K-1,), from ``SiteTerms.cut_slopes`` (or
        ``expected_cut_slopes``): row i's class k has its upper cut b_{k+1} and its lower cut b_k."""
        xp = array_namespace(self.cut_points)
        upper_slope, lower_slope, index = slopes
        cuts = xp.arange(1, self.n_classes, dtype=index.dtype, device=array_device(index))
        upper = xp.where((index + 1)[:, None] == cuts[None, :], (row_scale * upper_slope)[:, None], 0.0)
        lower = xp.where(index[:, None] == cuts[None, :], (row_scale * lower_slope)[:, None], 0.0)
        return xp.sum(upper + lower, axis=0)

    def log_density(self, y, f):
        """log p(y | f) and its derivative in f (unit noise: the interval's log probability at variance 1)."""
        terms = self.site_terms(y, f, array_namespace(f).ones_like(f))
        return terms.log_z, terms.alpha

    def expected_log_density_with_cuts(self, y, mean, var, n_quadrature=20):
        """``expected_log_density`` and the expected cut-point slopes E_q d log p(y | f) / d b (upper, lower, class
        index), each the derivative of the same Gauss-Hermite sum."""
        xp = array_namespace(y, mean, var)
        quadrature = NormalQuadrature(n_quadrature, mean)
        weights = quadrature.weights
        sd = xp.sqrt(var)
        f = quadrature.points(mean, sd)
        terms = self.site_terms(xp.broadcast_to(y[:, None], f.shape), f, xp.ones_like(f))
        expected = xp.sum(terms.log_z * weights[None, :], axis=1)
        d_mean = xp.sum(terms.alpha * weights[None, :], axis=1)
        d_sd = xp.sum(terms.alpha * (math.sqrt(2.0) * quadrature.nodes * weights)[None, :], axis=1)
        upper, lower, _ = terms.cut_slopes
        slopes = (xp.sum(upper * weights[None, :], axis=1), xp.sum(lower * weights[None, :], axis=1),
                  self.class_index(y))
        return expected, d_mean, d_sd / (2.0 * sd), slopes

    def expected_log_density(self, y, mean, var, n_quadrature=20):
        return self.expected_log_density_with_cuts(y, mean, var, n_quadrature)[:3]

    def class_log_proba(self, mean, var, n_quadrature=None):
        """log p(y = k | x), (n, K), for f ~ N(mean, var): Chu & Ghahramani (2005)'s predictive, closed form,
        log(Phi((b_{k+1} - mean) / sqrt(1 + var)) - Phi((b_k - mean) / sqrt(1 + var)))."""
        xp = array_namespace(mean)
        columns = []
        for k in range(self.n_classes):
            label = asarray_like(float(k) if self.n_classes > 2 else (2.0 * k - 1.0), xp, device=array_device(mean),
                                 dtype=mean.dtype)
            lower, upper, _ = self.bounds(xp.broadcast_to(label, mean.shape))
            columns.append(interval_log_probability(lower, upper, mean, 1.0 + var)[0])
        return xp.stack(columns, axis=1)

    def __repr__(self):
        return f"Ordinal(cut_points={self.cut_points!r})"


class MulticlassProbit(Likelihood):
    """y = argmax_c f_c, each f_c with its latent noise: Villacampa-Calvo & Hernandez-Lobato (2017), eq. 1, whose
    factors on pairs of classes are probits against EP's cavities (their eq. 6: ``inference.multiclass_ep``), with
    the predictive of their eq. 11 (``argmax_log_proba``). A multiclass EP model's likelihood, named "probit" in
    models and files as the binary probit it extends; not in ``LIKELIHOODS``, which names the binary one so."""

    name = "probit"
    multiclass = True

    def pair_terms(self, margin, variance):
        """``SiteTerms`` of one pair (i, k)'s factor Theta(f_iy - f_ik) against its two cavities: the probit
        Phi(margin / sqrt(variance)) of Villacampa-Calvo & Hernandez-Lobato (2017), eq. 6, with margin = a_y - a_k and
        variance the sum of the two cavities' (their latent noise included)."""
        return PROBIT.site_terms(array_namespace(margin).ones_like(margin), margin, variance)

    def class_log_proba(self, mean, var, n_quadrature=None):
        """log p(y = k | x), (n, C), on ``argmax_log_proba``'s grid (``n_quadrature`` is a binary model's)."""
        return argmax_log_proba(mean, var)

    def expected_entropy(self, mean, var, n_nodes=None):
        """0 per row of the (n, C) latent ``mean``: y = argmax_c f_c is certain given f."""
        return array_namespace(mean).zeros(mean.shape[:1], dtype=mean.dtype, device=array_device(mean))


PROBIT, LOGISTIC, ROBUST_MAX = Probit(), Logistic(), RobustMax()
MULTICLASS_PROBIT = MulticlassProbit()
ORDINAL_LIKELIHOOD = Ordinal()  # its cut points are those of the model's kernel: ``Ordinal.at``
_BUILT_IN = {lik.name: lik for lik in (PROBIT, LOGISTIC, ROBUST_MAX, ORDINAL_LIKELIHOOD)}
LIKELIHOODS = dict(_BUILT_IN)
"""The likelihoods by name: the built-in ones and those added by ``register_likelihood``."""


def probit_for(kernel):
    """The probit likelihood of a model with ``kernel`` (the EP family's and GFITC's when none is given), by the
    latent GPs the kernel declares (``kernels.Kernel.n_latent``): the multiclass probit for one a class
    (Villacampa-Calvo & Hernandez-Lobato 2017, eq. 6), else the binary probit."""
    return MULTICLASS_PROBIT if kernel.n_latent > 1 else PROBIT


def register_likelihood(likelihood, *, replace=False):
    """Add ``likelihood`` (an instance of a ``Likelihood`` subclass, binary, with a ``name`` of its own) to the
    likelihoods agpc knows by name: ``GPClassifier(likelihood=likelihood.name)`` is then accepted by the methods that
    can train it (the EP methods where it has ``site_terms``, SVI where it has a ``log_density``:
    ``agpc.methods.Method.registered_likelihoods``), and prediction, ``predict_uncertainty``, checkpoints and the
    model file take it by that name (a model file stores the name only: it must be registered again before such a
    file is loaded). A name already registered is refused unless ``replace`` (never a built-in one). Returns it."""
    if not isinstance(likelihood, Likelihood):
        raise TypeError(f"register_likelihood takes an agpc.likelihoods.Likelihood, got {type(likelihood).__name__}")
    name = getattr(likelihood, "name", None)
    if not isinstance(name, str) or not name or name == Likelihood.name or not name.isprintable():
        raise ValueError(f"a registered likelihood needs a printable name of its own, got {name!r}")
    if name in _BUILT_IN:
        raise ValueError(f"likelihood {name!r} is built in and cannot be replaced")
    if name in LIKELIHOODS and not replace:
        raise ValueError(f"likelihood {name!r} is registered already (pass replace=True to replace it)")
    if likelihood.multiclass:
        raise ValueError(f"likelihood {name!r}: only binary likelihoods can be registered (multiclass models have "
                         "their own: the multiclass probit of EP, the robust max of SVI)")
    built_in = next((type(lik) for lik in _BUILT_IN.values() if isinstance(likelihood, type(lik))), None)
    if built_in is not None:  # it would inherit closed forms (predictive, entropy, sign rule) of another model
        raise ValueError(f"likelihood {name!r} is a {built_in.__name__}: it would predict with {built_in.__name__}'s "
                         "closed forms whatever it trains; subclass agpc.likelihoods.Likelihood itself")
    if not likelihood.has_log_density:
        raise ValueError(f"likelihood {name!r} defines no log_density: prediction and uncertainty take its "
                         "predictive from it (and SVI trains by it; EP methods take site_terms besides)")
    LIKELIHOODS[name] = likelihood
    return likelihood


def registered_likelihood(name):
    """The likelihood ``register_likelihood`` added as ``name``, or None (a built-in name, or one not registered)."""
    if not isinstance(name, str) or name in _BUILT_IN:
        return None
    return LIKELIHOODS.get(name)


def unregister_likelihood(name):
    """Remove the likelihood registered as ``name`` (not a built-in one)."""
    if name in _BUILT_IN:
        raise ValueError(f"likelihood {name!r} is built in and cannot be unregistered")
    likelihood_by_name(name)
    del LIKELIHOODS[name]


def fitted_likelihood(name, kernel, *, multiclass):
    """The likelihood object of a fitted model whose likelihood is ``name`` (an object, or its name: its
    ``likelihood_``, a model file's): with a latent GP a class, the multiclass probit (EP, GFITC) or the robust max
    (SVI); else the binary or ordinal one, at ``kernel`` (``Likelihood.at``)."""
    if not multiclass:
        return likelihood_by_name(name, multiclass=False).at(kernel)
    if isinstance(name, Likelihood) and name.multiclass:  # (a fitted model's own, unpickled: a copy of the built-in)
        return name
    for likelihood in (MULTICLASS_PROBIT, ROBUST_MAX):
        if likelihood.name == name:
            return likelihood
    raise ValueError(f"unknown likelihood {name!r} of a multiclass model: use {MULTICLASS_PROBIT.name!r} or "
                     f"{ROBUST_MAX.name!r}")


def likelihood_by_name(name, *, multiclass=None):
    """The likelihood called ``name`` (a :class:`Likelihood` passes through: an engine's options carry the object, so
    that a process that did not register it trains it too); ``multiclass`` True / False refuses one of the other kind.
    One ValueError naming the choices otherwise."""
    choices = tuple(n for n, lik in LIKELIHOODS.items() if multiclass is None or lik.multiclass == multiclass)
    if isinstance(name, Likelihood):
        if multiclass is not None and name.multiclass != multiclass:
            raise ValueError(f"likelihood {name.name!r} is {'' if name.multiclass else 'not '}multiclass: use one of "
                             f"{choices}")
        return name
    likelihood = LIKELIHOODS.get(name) if isinstance(name, str) else None
    if likelihood is None or likelihood.name not in choices:
        raise ValueError(f"unknown likelihood {name!r}: use one of {choices}")
    return likelihood
