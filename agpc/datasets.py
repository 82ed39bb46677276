"""Datasets: generators with a known Bayes classifier, and loaders of bundled data.

``make_banana`` draws a two-class, two-dimensional "banana" problem from known class densities
(Gaussian mixtures along two interleaved arcs), so ``banana_posterior`` gives the exact p(y = 1 | x)
and ``banana_bayes_error`` the error of the best possible classifier: a test can then state how close
a model comes to it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["make_banana", "banana_posterior", "banana_bayes_error", "load_breast_cancer"]

_ARC_POINTS = 12
_SPREAD = 0.35


def _arc_centres():
    t = np.linspace(0.0, math.pi, _ARC_POINTS)
    upper = np.stack([np.cos(t), np.sin(t) - 0.25], axis=1)  # class +1: an arch
    lower = np.stack([1.0 - np.cos(t), 0.25 - np.sin(t)], axis=1)  # class -1: an inverted arch, shifted
    return upper, lower


def make_banana(n_samples=1000, *, random_state=None, label_values=(-1, 1)):
    """Two interleaved arcs; returns X (n, 2) float64 and y (n,) with ``label_values`` (neg, pos).

    Classes are equally likely; each class density is an equal mixture of isotropic Gaussians with
    standard deviation 0.35 centred along its arc.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    rng = np.random.default_rng(random_state)
    upper, lower = _arc_centres()
    positive = rng.random(n_samples) < 0.5
    component = rng.integers(0, _ARC_POINTS, size=n_samples)
    centres = np.where(positive[:, None], upper[component], lower[component])
    X = centres + _SPREAD * rng.standard_normal((n_samples, 2))
    y = np.where(positive, label_values[1], label_values[0])
    return X, y


def banana_posterior(X):
    """Exact p(y = positive | x) of ``make_banana``'s generating process."""
    X = np.asarray(X, dtype=np.float64)
    upper, lower = _arc_centres()

    def log_density(centres):
        d2 = ((X[:, None, :] - centres[None, :, :]) ** 2).sum(-1)
        logs = -0.5 * d2 / _SPREAD**2
        top = logs.max(axis=1, keepdims=True)
        return (top + np.log(np.exp(logs - top).mean(axis=1, keepdims=True)))[:, 0]

    diff = log_density(lower) - log_density(upper)
    return 1.0 / (1.0 + np.exp(diff))


def banana_bayes_error(n_mc=400000, random_state=12345):
    """Monte Carlo estimate of the Bayes error E[min(p, 1 - p)] (standard error below 1e-3)."""
    X, _ = make_banana(n_mc, random_state=random_state)
    p = banana_posterior(X)
    return float(np.minimum(p, 1.0 - p).mean())


def load_breast_cancer():
    """scikit-learn's bundled Wisconsin diagnostic breast cancer data (569 x 30), labels 0/1."""
    from sklearn.datasets import load_breast_cancer as _load

    data = _load()
    return data.data, data.target
