"""Independent textbook reference: full-GP binary classification by EP (probit).

Straight from Rasmussen & Williams, "Gaussian Processes for Machine Learning"
(MIT Press, 2006), Section 3.6:

* Algorithm 3.5 -- sequential EP with site parameters tau_tilde (site
  precisions) and nu_tilde (site precision-times-mean), rank-one posterior
  updates inside a sweep, and a from-scratch recomputation of the posterior
  through the Cholesky factor of B = I + S~^1/2 K S~^1/2 after each sweep;
* eq. 3.65 (written in the numerically stable form of eqs. 3.73/3.74) for the
  EP approximation log Z_EP to the log marginal likelihood;
* Algorithm 3.6 -- predictive mean / variance of f* and the probit
  class probability pi* = Phi(mean / sqrt(1 + var)).

Likelihood: p(y_i | f_i) = Phi(y_i f_i), y_i in {-1, +1}; zero prior mean.
Only NumPy and SciPy are used.  This module is deliberately self-contained.
"""

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular
from scipy.special import log_ndtr

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)

__all__ = ["full_gp_ep", "full_gp_predict", "tilted_moments"]


def _ratio_pdf_cdf(z):
    """N(z) / Phi(z), evaluated as exp(log N(z) - log Phi(z)) (no underflow).

    log N(z) = -z^2/2 - log sqrt(2 pi) (the standard normal log-density, written
    out instead of scipy.stats.norm.logpdf only to avoid its per-call overhead).
    """
    z = np.asarray(z, dtype=float)
    return np.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_ndtr(z))


def tilted_moments(y, mu_cav, var_cav):
    """Moments of the tilted distribution Phi(y f) N(f | mu_cav, var_cav).

    R&W eq. 3.58:
        z_i      = y_i mu_-i / sqrt(1 + s2_-i)
        Zhat_i   = Phi(z_i)
        muhat_i  = mu_-i + y_i s2_-i N(z_i) / (Phi(z_i) sqrt(1 + s2_-i))
        s2hat_i  = s2_-i - s2_-i^2 N(z_i) / ((1 + s2_-i) Phi(z_i))
                          * (z_i + N(z_i) / Phi(z_i))
    Returns (log Zhat, muhat, s2hat).  Works elementwise on arrays.
    """
    y = np.asarray(y, dtype=float)
    mu_cav = np.asarray(mu_cav, dtype=float)
    var_cav = np.asarray(var_cav, dtype=float)
    denom = np.sqrt(1.0 + var_cav)
    z = y * mu_cav / denom
    r = _ratio_pdf_cdf(z)  # N(z)/Phi(z)
    log_zhat = log_ndtr(z)
    mu_hat = mu_cav + y * var_cav * r / denom
    var_hat = var_cav - var_cav ** 2 * r / (1.0 + var_cav) * (z + r)
    return log_zhat, mu_hat, var_hat


def _posterior_from_sites(K, tau_tilde, nu_tilde):
    """Posterior N(mu, Sigma) with Sigma = (K^-1 + S~)^-1, mu = Sigma nu~.

    As in Algorithm 3.5 (lines after the inner loop):
        L     = cholesky(I + S~^1/2 K S~^1/2)
        V     = L \\ S~^1/2 K    (printed as "L^T \\ S~^1/2 K" in the book,
                                   which is right only for an upper factor
                                   B = L^T L; with the lower factor
                                   B = L L^T used here V = L \\ S~^1/2 K,
                                   so that V^T V = K S~^1/2 B^-1 S~^1/2 K)
        Sigma = K - V^T V
        mu    = Sigma nu~
    Requires tau_tilde >= 0 (always true for the probit likelihood).
    Returns (mu, Sigma, L) with L lower triangular, B = L L^T.
    """
    n = K.shape[0]
    sW = np.sqrt(tau_tilde)
    B = np.eye(n) + sW[:, None] * K * sW[None, :]
    L = cholesky(B, lower=True)
    V = solve_triangular(L, sW[:, None] * K, lower=True)
    Sigma = K - V.T @ V
    mu = Sigma @ nu_tilde
    return mu, Sigma, L


def _log_z_ep(K, y, tau_tilde, nu_tilde, mu, Sigma, L):
    """R&W eq. 3.65, evaluated via eqs. 3.73 / 3.74, at the given sites.

    eq. 3.65:
      log Z_EP = -1/2 log|K + Sigma~| - 1/2 mu~^T (K + Sigma~)^-1 mu~
                 + sum_i log Phi( y_i mu_-i / sqrt(1 + s2_-i) )
                 + 1/2 sum_i log( s2_-i + s2~_i )
                 + sum_i (mu_-i - mu~_i)^2 / ( 2 (s2_-i + s2~_i) )
    (the +-n/2 log 2pi of the site normalisers Z~_i, eq. 3.59, and of the
    Gaussian N(mu~ | 0, K + Sigma~) cancel).

    Rewritten without dividing by tau~ (mu~_i = nu~_i/tau~_i, s2~_i = 1/tau~_i,
    T = diag(tau_-i), cavity nu_-i = tau_-i mu_-i):

    (a) log-det terms (eq. 3.73).  |K + Sigma~| = |B| / prod_i tau~_i, so
        -1/2 log|K+Sigma~| + 1/2 sum log(s2_-i + s2~_i)
          = -sum_i log L_ii + 1/2 sum_i log tau~_i
            + 1/2 sum_i log((tau_-i + tau~_i) / (tau_-i tau~_i))
          = 1/2 sum_i log(1 + tau~_i / tau_-i) - sum_i log L_ii

    (b) quadratic terms (eq. 3.74).  (K + Sigma~)^-1 = S~ - S~ Sigma S~, so
        mu~^T (K+Sigma~)^-1 mu~ = sum_i nu~_i^2 / tau~_i - nu~^T Sigma nu~;
        and per site
        (mu_-i - mu~_i)^2 / (s2_-i + s2~_i)
          = (nu_-i tau~_i - nu~_i tau_-i)^2 / (tau_-i tau~_i (tau_-i + tau~_i))
          = nu_-i^2 tau~_i / (tau_-i (tau_-i + tau~_i))
            - 2 nu_-i nu~_i / (tau_-i + tau~_i)
            + nu~_i^2 tau_-i / (tau~_i (tau_-i + tau~_i)).
        The nu~_i^2/tau~_i pieces combine into -nu~_i^2 / (tau_-i + tau~_i),
        giving (eq. 3.74)
          1/2 nu~^T (Sigma - (T + S~)^-1) nu~
          + 1/2 mu_-^T T (T + S~)^-1 (S~ mu_- - 2 nu~),
        where Sigma = K - K S~^1/2 B^-1 S~^1/2 K.

    (c) plus sum_i log Zhat_i = sum_i log Phi(z_i) (eq. 3.58).
    """
    s2 = np.diag(Sigma)
    tau_cav = 1.0 / s2 - tau_tilde                 # tau_-i
    nu_cav = mu / s2 - nu_tilde                    # nu_-i
    mu_cav = nu_cav / tau_cav
    var_cav = 1.0 / tau_cav
    log_zhat, _, _ = tilted_moments(y, mu_cav, var_cav)

    tau_sum = tau_cav + tau_tilde                  # = 1 / s2_i
    # (a) eq. 3.73
    term_logdet = 0.5 * np.sum(np.log1p(tau_tilde / tau_cav)) - np.sum(np.log(np.diag(L)))
    # (b) eq. 3.74, first part: 1/2 nu~^T (Sigma - (T + S~)^-1) nu~
    term_quad1 = 0.5 * (nu_tilde @ Sigma @ nu_tilde) - 0.5 * np.sum(nu_tilde ** 2 / tau_sum)
    # (b) eq. 3.74, second part: 1/2 mu_-^T T (T+S~)^-1 (S~ mu_- - 2 nu~)
    term_quad2 = 0.5 * np.sum(mu_cav * tau_cav / tau_sum * (tau_tilde * mu_cav - 2.0 * nu_tilde))
    # (c)
    term_zhat = np.sum(log_zhat)
    return float(term_zhat + term_logdet + term_quad1 + term_quad2)


def full_gp_ep(K, y, tol=1e-12, max_sweeps=2000):
    """K: (n, n) prior covariance (already including any jitter/noise you are given), y: (n,) in {-1, +1}.
    Runs sequential EP sweeps (recompute the posterior from scratch by Cholesky after every sweep, as R&W do)
    until max |change of tau_tilde, nu_tilde| < tol. Returns a dict with keys
    'tau_tilde', 'nu_tilde' (site precisions and precision-times-means, shape (n,)),
    'mu', 'Sigma' (posterior mean (n,), covariance (n, n)), 'log_z' (float, R&W eq. 3.65), 'n_sweeps'."""
    K = np.asarray(K, dtype=float)
    y = np.asarray(y, dtype=float).ravel()
    n = y.shape[0]
    if K.shape != (n, n):
        raise ValueError("K must be (n, n) with n = len(y)")
    if not np.all(np.abs(y) == 1.0):
        raise ValueError("labels must be in {-1, +1}")

    # Algorithm 3.5, line 2: nu~ = 0, tau~ = 0, Sigma = K, mu = 0
    tau_tilde = np.zeros(n)
    nu_tilde = np.zeros(n)
    Sigma = K.copy()
    mu = np.zeros(n)

    n_sweeps = 0
    converged = False
    while n_sweeps < max_sweeps:
        n_sweeps += 1
        tau_old = tau_tilde.copy()
        nu_old = nu_tilde.copy()
        for i in range(n):  # natural order 0..n-1
            s2_i = Sigma[i, i]
            # cavity (eq. 3.56): tau_-i = s2_i^-1 - tau~_i, nu_-i = s2_i^-1 mu_i - nu~_i
            tau_cav = 1.0 / s2_i - tau_tilde[i]
            nu_cav = mu[i] / s2_i - nu_tilde[i]
            mu_cav = nu_cav / tau_cav
            var_cav = 1.0 / tau_cav
            # tilted moments (eq. 3.58)
            _, mu_hat, var_hat = tilted_moments(y[i], mu_cav, var_cav)
            # site update (eq. 3.59)
            d_tau = 1.0 / var_hat - tau_cav - tau_tilde[i]
            tau_tilde[i] += d_tau
            nu_tilde[i] = mu_hat / var_hat - nu_cav
            # rank-one update (eq. 3.70):
            # Sigma := Sigma - ((d_tau)^-1 + Sigma_ii)^-1 s_i s_i^T
            #        = Sigma - d_tau / (1 + d_tau Sigma_ii) s_i s_i^T
            s_i = Sigma[:, i].copy()
            Sigma -= (d_tau / (1.0 + d_tau * s_i[i])) * np.outer(s_i, s_i)
            mu = Sigma @ nu_tilde
        # recompute posterior from scratch (end of sweep in Algorithm 3.5)
        mu, Sigma, L = _posterior_from_sites(K, tau_tilde, nu_tilde)
        delta = max(np.max(np.abs(tau_tilde - tau_old)), np.max(np.abs(nu_tilde - nu_old)))
        if delta < tol:
            converged = True
            break

    mu, Sigma, L = _posterior_from_sites(K, tau_tilde, nu_tilde)
    log_z = _log_z_ep(K, y, tau_tilde, nu_tilde, mu, Sigma, L)
    return {
        "tau_tilde": tau_tilde,
        "nu_tilde": nu_tilde,
        "mu": mu,
        "Sigma": Sigma,
        "log_z": log_z,
        "n_sweeps": n_sweeps,
        "converged": converged,
    }


def full_gp_predict(K, y, result, K_cross, k_star_diag):
    """K_cross: (n, n_star) covariance between training and test inputs; k_star_diag: (n_star,) prior variances.
    Returns (mean, var, prob) per R&W Algorithm 3.6."""
    K = np.asarray(K, dtype=float)
    K_cross = np.asarray(K_cross, dtype=float)
    k_star_diag = np.asarray(k_star_diag, dtype=float)
    tau_tilde = np.asarray(result["tau_tilde"], dtype=float)
    nu_tilde = np.asarray(result["nu_tilde"], dtype=float)
    n = K.shape[0]
    # Algorithm 3.6:
    #   L    := cholesky(I + S~^1/2 K S~^1/2)
    #   z    := S~^1/2 L^T \ (L \ (S~^1/2 K nu~))
    #   f*   := k(x*)^T (nu~ - z)
    #   v    := L \ (S~^1/2 k(x*))
    #   V[f*]:= k(x*, x*) - v^T v
    #   pi*  := Phi(f* / sqrt(1 + V[f*]))
    sW = np.sqrt(tau_tilde)
    B = np.eye(n) + sW[:, None] * K * sW[None, :]
    L = cholesky(B, lower=True)
    z = sW * cho_solve((L, True), sW * (K @ nu_tilde))
    mean = K_cross.T @ (nu_tilde - z)
    v = solve_triangular(L, sW[:, None] * K_cross, lower=True)
    var = k_star_diag - np.sum(v * v, axis=0)
    prob = np.exp(log_ndtr(mean / np.sqrt(1.0 + var)))
    return mean, var, prob
