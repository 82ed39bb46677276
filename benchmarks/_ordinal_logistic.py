"""Ordinal logistic regression: the proportional-odds (cumulative-logit) model, a baseline for ordered classes.

McCullagh (1980), "Regression models for ordinal data" (JRSS B 42), eq. 2.1 with the logistic link:

    P(y <= k | x) = sigma(theta_k - w^T x),   k = 0, ..., K - 2,   theta_0 < ... < theta_{K-2},

so p(y = k | x) = sigma(theta_k - eta) - sigma(theta_{k-1} - eta), eta = w^T x, theta_{-1} = -inf, theta_{K-1} = +inf.
Fitted by L-BFGS (scipy.optimize) on the exact mean negative log-likelihood plus (alpha / 2) ||w||^2 (the cut points
are not penalised), with the cut points written as theta_0 and log increments, theta_k = theta_0 + sum_{j<=k}
exp(delta_j), so that they stay ordered without constraints.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit


def cut_points_of(params, n_features):
    """The ordered cut points theta of the packed parameters [w, theta_0, delta_1, ..., delta_{K-2}]."""
    free = params[n_features:]
    return free[0] + np.concatenate([[0.0], np.cumsum(np.exp(free[1:]))])


def _interval_terms(cut_points, eta, y):
    """a = theta_y - eta (upper) and c = theta_{y-1} - eta (lower) of each row, infinite at the end classes."""
    edges = np.concatenate([[-np.inf], cut_points, [np.inf]])
    return edges[y + 1] - eta, edges[y] - eta


def log_interval(a, c):
    """log(sigma(a) - sigma(c)) for c < a, as log sigma(a) + log sigma(-c) + log(1 - exp(c - a)) (exact, since
    sigma(a) - sigma(c) = sigma(a) sigma(-c) (1 - e^(c - a)); no cancellation in either tail)."""
    return log_expit(a) + log_expit(-c) + np.log(-np.expm1(c - a))


def objective(params, X, y, alpha):
    """(mean negative log-likelihood + alpha / 2 ||w||^2, its gradient) at the packed parameters."""
    n, d = X.shape
    w = params[:d]
    theta = cut_points_of(params, d)
    a, c = _interval_terms(theta, X @ w, y)
    value = -np.mean(log_interval(a, c)) + 0.5 * alpha * (w @ w)
    # d log p / da = sigma(-a) + 1 / expm1(a - c);  d log p / dc = -sigma(c) - 1 / expm1(a - c)  (both 0 where the
    # boundary is infinite)
    with np.errstate(divide="ignore"):
        tie = 1.0 / np.expm1(a - c)
    d_upper = expit(-a) + tie
    d_lower = -expit(c) - tie
    # eta enters both with a minus sign
    grad_w = X.T @ (d_upper + d_lower) / n + alpha * w
    n_cuts = theta.size
    grad_theta = -(np.bincount(y, weights=d_upper, minlength=n_cuts + 1)[:n_cuts]
                   + np.bincount(y, weights=d_lower, minlength=n_cuts + 1)[1:]) / n
    # theta_k = theta_0 + sum_{j=1..k} exp(delta_j): d/d theta_0 = sum_k, d/d delta_j = exp(delta_j) sum_{k>=j}
    tail_sums = np.cumsum(grad_theta[::-1])[::-1]
    grad_free = np.concatenate([[tail_sums[0]], np.exp(params[d + 1:]) * tail_sums[1:]])
    return value, np.concatenate([grad_w, grad_free])


class OrdinalLogisticRegression:
    """The proportional-odds model with a light L2 penalty on the weights (``alpha``), scikit-learn's fit /
    predict_proba / predict. Labels are taken as ranks: ``classes_`` sorted, the first the lowest."""

    def __init__(self, alpha=1e-4, max_iter=1000):
        self.alpha = alpha
        self.max_iter = max_iter

    def fit(self, X, y):
        X = np.asarray(X, dtype=np.float64)
        self.classes_, ranks = np.unique(np.asarray(y), return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError("OrdinalLogisticRegression needs at least two classes")
        n_cuts = self.classes_.size - 1
        # start: w = 0 and the cut points at the logits of the empirical cumulative frequencies
        cumulative = np.cumsum(np.bincount(ranks, minlength=n_cuts + 1))[:-1] / ranks.size
        theta = np.log(cumulative) - np.log1p(-cumulative)
        start = np.concatenate([np.zeros(X.shape[1]), [theta[0]], np.log(np.diff(theta))])
        result = minimize(objective, start, args=(X, ranks, self.alpha), jac=True, method="L-BFGS-B",
                          options=dict(maxiter=self.max_iter))
        self.coef_ = result.x[:X.shape[1]]
        self.cut_points_ = cut_points_of(result.x, X.shape[1])
        self.n_iter_ = result.nit
        return self

    def predict_proba(self, X):
        """(n, K) probabilities, each sigma(theta_k - eta) - sigma(theta_{k-1} - eta) taken through its log (tail rows
        keep their small probabilities instead of a difference rounded to zero)."""
        eta = np.asarray(X, dtype=np.float64) @ self.coef_
        labels = np.arange(self.classes_.size)[None, :]
        upper, lower = _interval_terms(self.cut_points_, eta[:, None], labels)
        return np.exp(log_interval(upper, lower))

    def predict(self, X):
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
