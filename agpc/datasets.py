"""Datasets: generators with a known Bayes classifier, and loaders of bundled data.

``make_banana`` draws a two-class, two-dimensional "banana" problem from known class densities
(Gaussian mixtures along two interleaved arcs), so ``banana_posterior`` gives the exact p(y = 1 | x)
and ``banana_bayes_error`` the error of the best possible classifier: a test can then state how close
a model comes to it.
"""

from __future__ import annotations

import math
import os

import numpy as np
import sklearn.datasets
from scipy.special import ndtr

__all__ = [
    "airline_like_bayes_error",
    "make_banana",
    "banana_posterior",
    "banana_bayes_error",
    "load_breast_cancer",
    "split_standardised",
    "make_airline_like",
    "airline_like_posterior",
    "AIRLINE_FEATURES",
]

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


def split_standardised(X, y, train_fraction=0.9, random_state=0):
    """A random train/test split with features standardised on the training part (the papers' protocol).

    Returns X_train, y_train, X_test, y_test; constant features keep a unit scale.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    order = np.random.default_rng(random_state).permutation(len(y))
    split = int(train_fraction * len(y))
    train, test = order[:split], order[split:]
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    std[std == 0] = 1.0
    return (X[train] - mean) / std, y[train], (X[test] - mean) / std, y[test]


def load_breast_cancer():
    """scikit-learn's bundled Wisconsin diagnostic breast cancer data (569 x 30), labels 0/1."""
    data = sklearn.datasets.load_breast_cancer()
    return data.data, data.target


# --------------------------------------------------------------------------------------------------
# A synthetic stand-in for the airline-delay task of Hernandez-Lobato & Hernandez-Lobato (2016) (sec. 4.6): 8 features
# shaped like the real ones, a smooth non-linear latent function and probit label noise, generated in fixed blocks so
# that any number of rows can be written to disk while holding one block in memory.

AIRLINE_FEATURES = (
    "aircraft_age", "distance", "airtime", "dep_time", "arr_time", "day_of_week", "day_of_month", "month",
)
_AIRLINE_BLOCK = 65536  # rows drawn per random stream: the data do not depend on the write chunk size
_AIRLINE_NOISE = 0.6  # probit noise scale: Bayes error about 15% (see airline_like_bayes_error)


def _airline_raw(rng, n):
    """Raw features: years, miles, minutes, hours of the day, calendar integers (Jan-Apr)."""
    age = rng.gamma(shape=2.5, scale=4.5, size=n).clip(0, 45)
    distance = np.exp(rng.normal(6.5, 0.6, size=n)).clip(60, 4900)
    airtime = (distance / 7.8 + 18 + rng.normal(0, 6, size=n)).clip(15, None)
    # departures cluster in a morning and an evening bank
    bank = rng.random(n) < 0.55
    dep = np.where(bank, rng.normal(9.0, 2.2, size=n), rng.normal(17.5, 2.5, size=n)) % 24
    arr = (dep + (airtime + 25 + rng.normal(0, 10, size=n)) / 60.0) % 24
    dow = rng.integers(1, 8, size=n).astype(np.float64)
    dom = rng.integers(1, 29, size=n).astype(np.float64)
    month = rng.integers(1, 5, size=n).astype(np.float64)
    return np.stack([age, distance, airtime, dep, arr, dow, dom, month], axis=1)


_AIRLINE_SCALE = None


def _airline_standardisation():
    """Means and standard deviations of the raw features, from a fixed reference draw."""
    global _AIRLINE_SCALE
    if _AIRLINE_SCALE is None:
        raw = _airline_raw(np.random.default_rng(20080401), 200000)
        _AIRLINE_SCALE = (raw.mean(axis=0), raw.std(axis=0))
    return _AIRLINE_SCALE


def _airline_latent(X):
    """A smooth non-linear function of the standardised features (delays build up through the day,
    peak on Fridays and in busy months, and grow with short turnarounds on long, old-aircraft routes)."""
    age, dist, air, dep, arr, dow, dom, month = (X[:, j] for j in range(8))
    return (
        1.2 * np.sin(1.6 * dep + 0.4)
        + 0.7 * np.sin(1.8 * arr + 0.3) * np.tanh(1.5 * dist)
        + 0.6 * np.cos(1.6 * dow - 1.0)
        + 0.5 * np.sin(1.2 * month + 0.5) * np.tanh(2.0 * dist)
        + 0.5 * np.tanh(2.0 * (age - 0.5)) * np.tanh(2.0 * air)
        - 0.35 * np.cos(1.2 * dom)
        - 0.1
    )


def airline_like_posterior(X):
    """Exact p(y = +1 | x) of ``make_airline_like``: Phi(f(x) / noise)."""
    return ndtr(_airline_latent(np.asarray(X, dtype=np.float64)) / _AIRLINE_NOISE)


def airline_like_bayes_error(n_mc=400000, random_state=1):
    """Monte Carlo estimate of the generator's Bayes error E[min(p, 1 - p)]."""
    X, _ = make_airline_like(n_mc, random_state=random_state)
    p = airline_like_posterior(X)
    return float(np.minimum(p, 1.0 - p).mean())


def _airline_block(seed_sequence, n):
    rng = np.random.default_rng(seed_sequence)
    mean, std = _airline_standardisation()
    X = (_airline_raw(rng, n) - mean) / std
    f = _airline_latent(X)
    y = np.where(f + _AIRLINE_NOISE * rng.standard_normal(n) > 0, 1, -1).astype(np.int8)
    return X, y


def make_airline_like(n_samples, *, random_state=None, path=None, format="npy", chunk_size=1_048_576):
    """Synthetic airline-delay data: 8 standardised features (``AIRLINE_FEATURES``), labels +1 (delayed) /
    -1, from a smooth non-linear latent function plus probit noise (Bayes error about 15%).

    Without ``path`` returns (X float64 (n, 8), y int8 (n,)) in memory. With ``path`` (a folder) writes
    ``X.npy`` and ``y.npy`` (``format="npy"``) or a zarr store ``data.zarr`` with arrays X and y
    (``format="zarr"``), a chunk of ``chunk_size`` rows at a time, and returns the arrays opened from disk
    (read-only memmaps, or zarr arrays). The rows depend only on ``n_samples`` and ``random_state``.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    if format not in ("npy", "zarr"):
        raise ValueError(f"format must be 'npy' or 'zarr', got {format!r}")
    n_blocks = -(-n_samples // _AIRLINE_BLOCK)
    seeds = np.random.SeedSequence(random_state).spawn(n_blocks)
    sizes = [min(_AIRLINE_BLOCK, n_samples - k * _AIRLINE_BLOCK) for k in range(n_blocks)]
    if path is None:
        blocks = [_airline_block(seed, size) for seed, size in zip(seeds, sizes)]
        return np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks])
    os.makedirs(path, exist_ok=True)
    if format == "npy":
        X_out = np.lib.format.open_memmap(os.path.join(path, "X.npy"), mode="w+", dtype=np.float64, shape=(n_samples, 8))
        y_out = np.lib.format.open_memmap(os.path.join(path, "y.npy"), mode="w+", dtype=np.int8, shape=(n_samples,))
    else:
        try:
            import zarr
        except ImportError as exc:
            raise ImportError("format='zarr' needs the zarr package: pip install zarr") from exc
        root = zarr.open_group(os.path.join(path, "data.zarr"), mode="w")
        rows_per_chunk = max(_AIRLINE_BLOCK, (chunk_size // _AIRLINE_BLOCK) * _AIRLINE_BLOCK)
        X_out = root.create_array("X", shape=(n_samples, 8), chunks=(rows_per_chunk, 8), dtype="float64")
        y_out = root.create_array("y", shape=(n_samples,), chunks=(rows_per_chunk,), dtype="int8")
    per_write = max(1, chunk_size // _AIRLINE_BLOCK)
    for first in range(0, n_blocks, per_write):
        blocks = [_airline_block(seeds[k], sizes[k]) for k in range(first, min(n_blocks, first + per_write))]
        lo = first * _AIRLINE_BLOCK
        hi = lo + sum(b[0].shape[0] for b in blocks)
        X_out[lo:hi] = np.concatenate([b[0] for b in blocks])
        y_out[lo:hi] = np.concatenate([b[1] for b in blocks])
    if format == "npy":
        X_out.flush()
        y_out.flush()
        del X_out, y_out
        return (np.load(os.path.join(path, "X.npy"), mmap_mode="r"), np.load(os.path.join(path, "y.npy"), mmap_mode="r"))
    root = zarr.open_group(os.path.join(path, "data.zarr"), mode="r")
    return root["X"], root["y"]
