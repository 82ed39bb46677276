"""Independent textbook reference: full-GP ordinal regression by EP (ordinal probit likelihood).

The model is that of Chu & Ghahramani, "Gaussian processes for ordinal regression" (JMLR 6, 2005), with the noise
variance fixed to one:

    p(y = k | f) = Phi(b_{k+1} - f) - Phi(b_k - f),   k = 0, ..., K - 1,

written here with zero-based classes: the cut points given are b_1 < ... < b_{K-1}, and b_0 = -inf, b_K = +inf, so
class k lies between the k-th and the (k+1)-th boundary (Chu & Ghahramani 2005, eq. 3 with sigma = 1 and their
classes 1..r shifted to 0..r-1). The prior is f ~ N(0, K).

EP follows the structure of Rasmussen & Williams, "Gaussian Processes for Machine Learning" (MIT Press, 2006),
section 3.6, with the ordinal tilted moments of Chu & Ghahramani (2005), section 3.2 (the EP variant of the paper):

* Algorithm 3.5: sequential site updates in natural order, cavity from the current marginal (eq. 3.56), site from
  the tilted moments (eq. 3.59), rank-one update of the posterior covariance (eq. 3.70), and the posterior rebuilt
  from scratch through the Cholesky factor of B = I + S~^1/2 K S~^1/2 after every sweep;
* eq. 3.65, the EP approximation of the log marginal likelihood, written here in its direct form (the log
  determinant and the quadratic form of K + S~^-1 through B) with the ordinal tilted normalisers.

The ordinal probit likelihood is log-concave in f (a Gaussian convolved with the indicator of an interval), so the
tilted variance never exceeds the cavity variance and every site precision stays non-negative (Chu & Ghahramani
2005, section 3.2): B's Cholesky factor always exists.

Deliberately simple: plain NumPy / SciPy, explicit n x n matrices, meant for n up to about 60. Nothing here comes
from agpc.
"""

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.special import log_ndtr

__all__ = ["ordinal_full_gp_ep", "ordinal_full_gp_latent", "ordinal_predictive_proba", "ordinal_tilted_moments"]

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def _boundaries(y, cut_points):
    """(lower, upper) boundary of each label: b_y and b_{y+1} with b_0 = -inf and b_K = +inf."""
    cut_points = np.asarray(cut_points, dtype=float).ravel()
    if cut_points.size and not np.all(np.diff(cut_points) > 0):
        raise ValueError("cut_points must be strictly increasing")
    edges = np.concatenate([[-np.inf], cut_points, [np.inf]])
    y = np.asarray(y)
    if not np.all((y == np.round(y)) & (y >= 0) & (y <= cut_points.size)):
        raise ValueError(f"labels must be integers in 0..{cut_points.size}")
    y = y.astype(int)
    return edges[y], edges[y + 1]


def _log_interval(z_upper, z_lower):
    """log(Phi(z_upper) - Phi(z_lower)) for z_lower < z_upper, without cancellation.

    Phi(u) - Phi(l) = Phi(-l) - Phi(-u), so the difference is taken in the tail the interval lies farther from:
    log Phi(u) + log(1 - exp(log Phi(l) - log Phi(u))) when l + u <= 0, else the same with (-l, -u).
    """
    z_upper, z_lower = np.broadcast_arrays(np.asarray(z_upper, dtype=float), np.asarray(z_lower, dtype=float))
    flip = (z_lower + z_upper) > 0  # interval mostly above zero: use the upper tails
    hi = np.where(flip, -z_lower, z_upper)
    lo = np.where(flip, -z_upper, z_lower)
    log_hi, log_lo = log_ndtr(hi), log_ndtr(lo)
    with np.errstate(divide="ignore"):
        return log_hi + np.log(-np.expm1(log_lo - log_hi))


def _normal_pdf_over(z, log_denominator):
    """N(z) / exp(log_denominator), and 0 where z is infinite."""
    z = np.asarray(z, dtype=float)
    finite = np.isfinite(z)
    zf = np.where(finite, z, 0.0)
    return np.where(finite, np.exp(-0.5 * zf * zf - _LOG_SQRT_2PI - log_denominator), 0.0)


def ordinal_tilted_moments(y, cavity_mean, cavity_var, cut_points):
    """(log Z, mean, variance) of the tilted distribution p(y | f) N(f | cavity_mean, cavity_var), elementwise.

    Chu & Ghahramani (2005), section 3.2 (their sigma = 1), with s = sqrt(1 + v), z_1 = (b_{y+1} - m) / s and
    z_2 = (b_y - m) / s:

        Z        = Phi(z_1) - Phi(z_2)
        mean     = m + v (N(z_2) - N(z_1)) / (s Z)
        variance = v - v^2 / (1 + v) [ (z_1 N(z_1) - z_2 N(z_2)) / Z + ((N(z_1) - N(z_2)) / Z)^2 ]

    (the first two derivatives of log Z in m, as in R&W eq. 3.58 for the binary case), where z N(z) = 0 at an
    infinite boundary.
    """
    m = np.asarray(cavity_mean, dtype=float)
    v = np.asarray(cavity_var, dtype=float)
    if np.any(v <= 0) or not np.all(np.isfinite(v)):
        raise ValueError("cavity_var must be positive and finite")
    lower, upper = _boundaries(y, cut_points)
    s = np.sqrt(1.0 + v)
    z_1 = (upper - m) / s
    z_2 = (lower - m) / s
    log_z = _log_interval(z_1, z_2)
    r_1 = _normal_pdf_over(z_1, log_z)  # N(z_1) / Z
    r_2 = _normal_pdf_over(z_2, log_z)  # N(z_2) / Z
    zr_1 = np.where(np.isfinite(z_1), z_1, 0.0) * r_1
    zr_2 = np.where(np.isfinite(z_2), z_2, 0.0) * r_2
    mean = m + v * (r_2 - r_1) / s
    var = v - v * v / (1.0 + v) * ((zr_1 - zr_2) + (r_1 - r_2) ** 2)
    return log_z, mean, var


def ordinal_predictive_proba(mean, var, cut_points):
    """(n, K) class probabilities of the ordinal probit model for a latent N(mean, var), in closed form:

        p(y = k) = int p(y = k | f) N(f | mean, var) df = Phi((b_{k+1} - mean) / s) - Phi((b_k - mean) / s),

    s = sqrt(1 + var) (Chu & Ghahramani 2005, section 3.3)."""
    mean = np.atleast_1d(np.asarray(mean, dtype=float))
    var = np.atleast_1d(np.asarray(var, dtype=float))
    cut_points = np.asarray(cut_points, dtype=float).ravel()
    n_classes = cut_points.size + 1
    labels = np.arange(n_classes)[None, :]
    log_p, _, _ = ordinal_tilted_moments(np.broadcast_to(labels, (mean.size, n_classes)), mean[:, None],
                                         var[:, None], cut_points)
    return np.exp(log_p)


def _posterior_from_sites(K, site_precision, site_shift):
    """Sigma = (K^-1 + S~)^-1 = K - K S~^1/2 B^-1 S~^1/2 K and mu = Sigma nu~ with B = I + S~^1/2 K S~^1/2 = L L^T
    (R&W Algorithm 3.5, after the inner loop). Returns (mu, Sigma, L)."""
    root = np.sqrt(site_precision)
    B = np.eye(K.shape[0]) + root[:, None] * K * root[None, :]
    L = cholesky(B, lower=True)
    V = solve_triangular(L, root[:, None] * K, lower=True)
    Sigma = K - V.T @ V
    return Sigma @ site_shift, Sigma, L


def _log_z_ep(y, cut_points, site_precision, site_shift, mu, Sigma, L):
    """R&W eq. 3.65 with the ordinal tilted normalisers Z^_i:

        log Z_EP = -1/2 log|K + S~^-1| - 1/2 mu~^T (K + S~^-1)^-1 mu~ + sum_i log Z^_i
                   + 1/2 sum_i log(s2_-i + 1/tau~_i) + sum_i (mu_-i - mu~_i)^2 / (2 (s2_-i + 1/tau~_i))

    (the n/2 log 2 pi of the site normalisers and of N(mu~ | 0, K + S~^-1) cancel), with K + S~^-1 = S~^-1/2 B
    S~^-1/2, so log|K + S~^-1| = 2 sum log L_ii - sum log tau~_i and, with w = S~^1/2 mu~ = nu~ / sqrt(tau~),
    mu~^T (K + S~^-1)^-1 mu~ = w^T B^-1 w. Needs every tau~_i > 0 (true after one sweep)."""
    variance = np.diag(Sigma)
    cavity_precision = 1.0 / variance - site_precision
    cavity_mean = (mu / variance - site_shift) / cavity_precision
    cavity_var = 1.0 / cavity_precision
    log_zhat, _, _ = ordinal_tilted_moments(y, cavity_mean, cavity_var, cut_points)
    site_mean = site_shift / site_precision
    w = site_shift / np.sqrt(site_precision)
    log_det = 2.0 * np.sum(np.log(np.diag(L))) - np.sum(np.log(site_precision))
    quad = w @ cho_solve((L, True), w)
    spread = cavity_var + 1.0 / site_precision
    return float(-0.5 * log_det - 0.5 * quad + np.sum(log_zhat) + 0.5 * np.sum(np.log(spread))
                 + np.sum((cavity_mean - site_mean) ** 2 / (2.0 * spread)))


def ordinal_full_gp_ep(K, y, cut_points, *, max_sweeps=200, tol=1e-10):
    """Full-GP EP for the ordinal probit model with prior N(0, K).

    K: (n, n) prior covariance; y: (n,) integers in 0..len(cut_points); cut_points: increasing, length K_classes - 1.
    Sweeps (R&W Algorithm 3.5) until the largest change of a site precision or precision-times-mean is below
    ``tol``. Returns a dict: "site_precision", "site_mean" (site i is N(f_i | site_mean_i, 1 / site_precision_i),
    unnormalised), "posterior_mean", "posterior_cov", "log_z" (R&W eq. 3.65), "n_sweeps", "converged".
    """
    K = np.asarray(K, dtype=float)
    y = np.asarray(y).ravel()
    n = y.shape[0]
    if K.shape != (n, n):
        raise ValueError("K must be (n, n) with n = len(y)")
    _boundaries(y, cut_points)  # checks the labels and the cut points

    site_precision = np.zeros(n)  # tau~
    site_shift = np.zeros(n)  # nu~ = tau~ mu~
    Sigma = K.copy()
    mu = np.zeros(n)
    converged = False
    n_sweeps = 0
    while n_sweeps < max_sweeps:
        n_sweeps += 1
        precision_before, shift_before = site_precision.copy(), site_shift.copy()
        for i in range(n):
            # cavity (R&W eq. 3.56)
            cavity_precision = 1.0 / Sigma[i, i] - site_precision[i]
            cavity_shift = mu[i] / Sigma[i, i] - site_shift[i]
            _, tilted_mean, tilted_var = ordinal_tilted_moments(y[i], cavity_shift / cavity_precision,
                                                                1.0 / cavity_precision, cut_points)
            # site update (R&W eq. 3.59)
            step = 1.0 / tilted_var - cavity_precision - site_precision[i]
            site_precision[i] += step
            site_shift[i] = tilted_mean / tilted_var - cavity_shift
            # rank-one update of Sigma (R&W eq. 3.70)
            column = Sigma[:, i].copy()
            Sigma -= (step / (1.0 + step * column[i])) * np.outer(column, column)
            mu = Sigma @ site_shift
        mu, Sigma, _ = _posterior_from_sites(K, site_precision, site_shift)
        change = max(np.max(np.abs(site_precision - precision_before)), np.max(np.abs(site_shift - shift_before)))
        if change < tol:
            converged = True
            break
    mu, Sigma, L = _posterior_from_sites(K, site_precision, site_shift)
    return {
        "site_precision": site_precision,
        "site_mean": site_shift / site_precision,
        "posterior_mean": mu,
        "posterior_cov": Sigma,
        "log_z": _log_z_ep(y, cut_points, site_precision, site_shift, mu, Sigma, L),
        "n_sweeps": n_sweeps,
        "converged": converged,
    }


def ordinal_full_gp_latent(K, result, K_cross, k_star_diag):
    """Latent predictive mean and variance at test inputs (R&W Algorithm 3.6, whose latent part does not depend on
    the likelihood): mean = k*^T (K + S~^-1)^-1 mu~, var = k** - k*^T (K + S~^-1)^-1 k*. K_cross: (n, n_star);
    k_star_diag: (n_star,). Feed them to ``ordinal_predictive_proba`` for the class probabilities."""
    K = np.asarray(K, dtype=float)
    K_cross = np.asarray(K_cross, dtype=float)
    site_precision = np.asarray(result["site_precision"], dtype=float)
    site_mean = np.asarray(result["site_mean"], dtype=float)
    root = np.sqrt(site_precision)
    L = cholesky(np.eye(K.shape[0]) + root[:, None] * K * root[None, :], lower=True)
    # (K + S~^-1)^-1 = S~^1/2 B^-1 S~^1/2
    mean = K_cross.T @ (root * cho_solve((L, True), root * site_mean))
    v = solve_triangular(L, root[:, None] * K_cross, lower=True)
    return mean, np.asarray(k_star_diag, dtype=float) - np.sum(v * v, axis=0)
