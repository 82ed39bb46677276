"""Initial inducing points: k-means (Lloyd on a random subsample) or a random subset of rows; and the rows, with
their weights, that a fit's start is read from (``start_rows``).

Shared by every method that needs inducing points (EP, SEP, the variational methods). Written with the
array API: the distances and centroid updates run on the data's device; only the random row choice is
drawn on the host (so a seed gives the same points on every backend).

Weights (``fit``'s ``sample_weight``) count rows: a row of weight 0 is not there, a row of weight 2 is the row twice
(docs/weights.md). The start reads the rows so: ``start_rows`` drops the rows of weight 0 and, as soon as a row
counts other than once (a weight other than 1, or the same row given twice), merges equal rows into one of their
total weight and puts the rows in an order of their own values. Then the data with a row repeated, or with the row
given its count as a weight, in any order, start from the same rows and weights, hence the same inducing points,
lengthscales and priors (scikit-learn's ``check_sample_weight_equivalence_on_dense_data``). Rows that each count
once, in the caller's order, start as they always did.
"""

from __future__ import annotations

import math

import numpy as np  # (the weights, and the random choices, are on the host; the rows stay on X's device)

from .backend import array_device, array_namespace, asarray_like, cluster_sums, host_rng, to_numpy

__all__ = ["initial_inducing_points", "kmeans", "start_rows", "kmeans_with_levels", "with_any_levels",
           "ANY_LEVEL_FRACTION"]


def start_rows(X, weights=None):
    """(rows, weights) the start of a fit on X (n, d) with ``weights`` (n,) on the host, or None) is read from:
    X itself and None when every row counts once (no weights, or all 1, and no row given twice: the start as it
    always was); otherwise the distinct rows of positive weight, each with its total weight (host, float64), in an
    order of their values (sorted by a fixed projection, equal rows merged): the module docstring."""
    xp = array_namespace(X)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if w is not None and np.all(w == 1.0):
        w = None
    if w is not None:
        keep = np.flatnonzero(w > 0)
        X, w = xp.take(X, asarray_like(keep, xp, device=array_device(X)), axis=0), w[keep]
        w = None if np.all(w == 1.0) else w  # (rows removed, the others once each: in the caller's order)
    if X.shape[0] < 2:
        return X, w
    direction = asarray_like(np.random.default_rng(0).normal(size=X.shape[1]), xp, device=array_device(X),
                             dtype=X.dtype)  # (fixed: a row's key depends on its values only)
    scale = xp.max(xp.abs(X))
    key = xp.sum((X / xp.where(scale > 0, scale, xp.ones_like(scale))) * direction, axis=1)
    order = xp.argsort(key, stable=True)
    ordered = xp.take(X, order, axis=0)
    repeated = xp.all(ordered[1:, ...] == ordered[:-1, ...], axis=1)
    if w is None and not bool(xp.any(repeated)):
        return X, None
    first = np.concatenate([[True], ~np.asarray(to_numpy(repeated), dtype=bool)])
    group = np.cumsum(first) - 1
    counts = np.ones(X.shape[0]) if w is None else w[np.asarray(to_numpy(order), dtype=np.intp)]
    totals = np.bincount(group, weights=counts)
    return xp.take(ordered, asarray_like(np.flatnonzero(first), xp, device=array_device(X)), axis=0), totals


def _nearest(X, C):
    """Each row's nearest centre: argmin_c |c|^2 - 2 x.c, the squared distance less |x|^2, the same for every centre
    of a row (so not computed: of the 20,000 x m passes of the distances, only the product and one sum remain)."""
    xp = array_namespace(X, C)
    return xp.argmin(xp.sum(C * C, axis=1)[None, :] - 2.0 * (X @ C.mT), axis=1)


KMEANS_ROWS = 20000
"""The most rows k-means clusters (drawn at random beyond that)."""


def kmeans(X, n_clusters, *, random_state=None, n_iter=25, max_rows=KMEANS_ROWS, weights=None):
    """Lloyd's k-means on at most ``max_rows`` random rows, started from distinct random rows. ``weights`` (host,
    (n,), positive: ``start_rows``'s): each row counts by its weight, in the start (drawn in proportion to it) and in
    the centres (weighted means).

    An empty cluster keeps its previous centre. Returns the (n_clusters, d) centres.
    """
    xp = array_namespace(X)
    device = array_device(X)
    rng = host_rng(random_state)
    n = X.shape[0]
    if n > max_rows:
        chosen = rng.choice(n, size=max_rows, replace=False)
        rows = asarray_like(chosen, xp, device=device)
        X = xp.take(X, rows, axis=0)
        weights = None if weights is None else weights[chosen]
        n = max_rows
    # Clustered in units of the largest |x| (one scalar: the clusters are those of X): the squared distances of
    # features on extreme scales (X * 1e-300, X * 1e154) would underflow to 0 or overflow to inf.
    scale = xp.max(xp.abs(X))
    scale = xp.where(scale > 0, scale, xp.ones_like(scale))
    X = X / scale
    start = asarray_like(_start_rows(rng, n, n_clusters, weights), xp, device=device)
    centres = xp.take(X, start, axis=0)
    row_weights = None if weights is None else asarray_like(weights, xp, device=device, dtype=X.dtype)
    for _ in range(n_iter):
        sums, counts = cluster_sums(_nearest(X, centres), X, n_clusters, weights=row_weights)
        if weights is None:
            centres = xp.where(counts[:, None] > 0, sums / xp.maximum(counts, 1.0)[:, None], centres)
        else:  # (weights may be below 1: a cluster's total weight is what it is divided by)
            centres = xp.where(counts[:, None] > 0, sums / xp.where(counts > 0, counts, 1.0)[:, None], centres)
    return centres * scale


def _start_rows(rng, n, count, weights=None):
    """``count`` distinct rows of n drawn by ``rng`` (with ``weights``: in proportion to them; more than the n
    rows: all of them and the rest drawn again, which the jitter of K(Z, Z) then carries)."""
    if weights is None:
        return rng.choice(n, size=count, replace=False)
    p = weights / weights.sum()
    distinct = rng.choice(n, size=min(count, n), replace=False, p=p)
    if count <= n:
        return distinct
    return np.concatenate([distinct, rng.choice(n, size=count - n, p=p)])


def initial_inducing_points(X, n_inducing, method="kmeans", *, random_state=None, weights=None):
    """``method`` is "kmeans", "random" (distinct rows), or an (m, d) array of points to start from. ``weights``:
    ``start_rows``'s (X its rows), which "kmeans" and "random" count the rows by."""
    xp = array_namespace(X)
    device = array_device(X)
    if isinstance(method, str):
        if method == "kmeans":
            return kmeans(X, n_inducing, random_state=random_state, weights=weights)
        if method == "random":
            rows = _start_rows(host_rng(random_state), X.shape[0], n_inducing, weights)
            return xp.take(X, asarray_like(rows, xp, device=device), axis=0)
        raise ValueError(f"unknown inducing-point initialisation {method!r}: use 'kmeans', 'random' or an array")
    Z = asarray_like(method, xp, device=device, dtype=X.dtype)
    if Z.ndim != 2 or Z.shape[1] != X.shape[1]:
        raise ValueError(f"inducing points must have shape (m, {X.shape[1]}), got {tuple(Z.shape)}")
    if not bool(xp.all(xp.isfinite(Z))):
        raise ValueError("inducing points contain NaN or inf")
    return xp.asarray(Z, copy=True)


ANY_LEVEL_FRACTION = 0.7
"""The share of an inducing point's categorical coordinates that ``with_any_levels`` makes "any level"."""


def with_any_levels(Z, columns, random_state, code, fraction=ANY_LEVEL_FRACTION):
    """Z ((m, d), or (C, m, d) one a class) with each of the coordinates of ``columns`` of each point set to ``code``
    (``kernels.ANY_LEVEL``: the point is then f averaged over the column's levels) with probability ``fraction``,
    drawn on the host from ``random_state`` (one draw a point and column, the same for every class; a point that
    would then equal another keeps its row's levels): points that pin a few columns' levels and leave the others
    open, which a function of a few columns at a time (tic-tac-toe's lines of three) needs and points on rows do
    not give (docs/results.md, "Categorical columns")."""
    xp = array_namespace(Z)
    m, d = Z.shape[-2], Z.shape[-1]
    chosen = np.zeros((m, d), dtype=bool)
    chosen[:, list(columns)] = host_rng(random_state).random((m, len(columns))) < fraction
    # a point made equal to another (few columns of few levels) is left on its row: a copy adds nothing to the
    # model, and makes K(Z, Z) singular
    points = np.asarray(to_numpy(Z if Z.ndim == 2 else Z[0, ...]), dtype=np.float64)
    _, first = np.unique(np.where(chosen, -np.inf, points), axis=0, return_index=True)
    copies = np.setdiff1d(np.arange(m), first)
    chosen[copies, :] = False
    return xp.where(asarray_like(chosen, xp, device=array_device(Z)), xp.asarray(code, dtype=Z.dtype,
                                                                                 device=array_device(Z)), Z)


ENCODED_WIDTH = 4096
"""The most level indicators ``kmeans_with_levels`` clusters rows by (each categorical column's first listed levels
share them; a value past them is clustered as no listed level)."""
ENCODED_ELEMENTS = 1 << 24
"""The most entries of the encoded rows ``kmeans_with_levels`` clusters (rows drawn to fit: 128 MiB in float64)."""


def kmeans_with_levels(X, n_clusters, columns, levels, scales, *, random_state=None, weights=None):
    """Inducing points for rows with categorical ``columns``: Lloyd's k-means (``kmeans``) in the geometry of the
    default kernel at its start, then each centre's categorical coordinates the levels of its nearest row.

    The rows are clustered as the vectors [x_j / s_j for the other columns j, e_j(x_j) / sqrt(k) for the k
    categorical ones], s = ``scales`` (host, (d,): the default RBF's lengthscales, sqrt(d_c) times each continuous
    column's deviation; the categorical entries unread), e_j the one-hot indicators of the column's ``levels`` (one
    list a column: the listed levels, ``inputs.listed_levels``; a value not listed has none). Half the squared
    distance of two such vectors is then the exponent of the default kernel's product term at its start (the RBF's
    |x - z|^2 / (2 l^2) and the categorical kernel's 1 / k for each column that differs, ``kernels.Categorical``,
    whose per-level form is the RBF of the indicators): the clusters are those of the kernel. Clustered by their
    codes instead, as a continuous column's values (codes 2 and 3 closer than 2 and 8, a column of ten levels
    weighing more than one of two), and moved to the nearest row by those codes, car's points (6 columns of 3-4
    levels) reached test NLL 0.0028 +- 0.0011 above the one-hot columns' fit over 10 splits, against +0.0001 +- 0.0013
    so (docs/results.md, "Categorical columns").

    The categorical coordinates of each point are its nearest row's (a level every one, as the kernel compares
    values for equality only and its gradient there is zero: issue 45's "the categorical coordinates of Z take level
    values and are not moved"), the others the centre's. At most ``ENCODED_WIDTH`` indicators (each column's first
    levels beyond that) and ``ENCODED_ELEMENTS`` entries (rows drawn at random beyond that) bound the memory."""
    xp, device = array_namespace(X), array_device(X)

    def on_device(values, dtype=X.dtype):  # (host values, onto the rows' device)
        return asarray_like(np.asarray(values), xp, device=device, dtype=dtype)

    rng = host_rng(random_state)
    columns = [int(j) for j in columns]
    others = [j for j in range(X.shape[1]) if j not in set(columns)]
    keep = max(1, ENCODED_WIDTH // len(columns))
    owner = np.concatenate([np.full(min(len(listed), keep), j) for j, listed in zip(columns, levels)])
    listed = np.concatenate([np.asarray(listed[:keep], dtype=np.float64) for listed in levels])
    width = len(others) + owner.shape[0]
    n = X.shape[0]
    rows = max(n_clusters, min(KMEANS_ROWS, ENCODED_ELEMENTS // max(width, 1)))
    if n > rows:  # (drawn here, so that the encoded rows are no more than these)
        chosen = np.sort(rng.choice(n, size=rows, replace=False))
        X = xp.take(X, on_device(chosen, xp.int64), axis=0)
        weights = None if weights is None else weights[chosen]
    divisors = on_device(np.asarray(scales, dtype=np.float64)[others])
    indicators = xp.astype(xp.take(X, on_device(owner, xp.int64), axis=1) == on_device(listed)[None, :], X.dtype)
    parts = [xp.take(X, on_device(others, xp.int64), axis=1) / divisors] if others else []
    encoded = xp.concat(parts + [indicators / math.sqrt(len(columns))], axis=1)
    centres = kmeans(encoded, n_clusters, random_state=rng, max_rows=encoded.shape[0], weights=weights)
    Z = xp.take(X, _nearest(centres, encoded), axis=0)
    if not others:
        return Z
    position = np.zeros(X.shape[1], dtype=np.int64)  # (column j of X: its place among ``others``)
    position[others] = np.arange(len(others))
    placed = xp.take(centres[:, :len(others)] * divisors, on_device(position, xp.int64), axis=1)
    is_other = np.zeros(X.shape[1], dtype=bool)
    is_other[others] = True
    return xp.where(on_device(is_other, xp.bool)[None, :], placed, Z)
