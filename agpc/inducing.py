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
import time
import warnings

import numpy as np  # (the weights, and the random choices, are on the host; the rows stay on X's device)

from .backend import (array_device, array_namespace, asarray_like, cluster_sums, host_rng, outside_stacklevel, scaled_std,
                      to_numpy)

__all__ = ["initial_inducing_points", "kmeans", "start_rows", "kmeans_with_levels", "variance_points", "encoded_rows",
           "with_any_levels", "ANY_LEVEL_FRACTION"]


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
    of a row (so not computed: of the 20,000 x m passes of the distances, only the product and one sum remain; the
    factor -2 is on C's m x d entries, not the product's n x m, exactly: a power of two)."""
    xp = array_namespace(X, C)
    return xp.argmin(xp.sum(C * C, axis=1)[None, :] + X @ (-2.0 * C).mT, axis=1)


KMEANS_BLOCK_ELEMENTS = 1 << 18
"""Entries of one block's row-to-centre distances in k-means's search for each row's nearest centre (2 MiB in
float64: rows = this / centres), sized to stay near the core: the search of 20,000 rows at m = 200 took 18 ms an
iteration whole, 5 ms in blocks of 1,024 to 2,048 rows and 19 ms in blocks of 8,192; at m = 500, 12 ms in blocks of
512 to 1,024 rows, 46 ms in blocks of 4,096 (one BLAS thread, airline's 8 columns). Spread over two Python threads,
the blocks took 3.3 ms at m = 200 against 4.3 ms on the BLAS library's two: not worth a pool."""


def _block_rows(n_clusters):
    return max(64, KMEANS_BLOCK_ELEMENTS // max(1, n_clusters))


def _nearest_in_blocks(X, C):
    """``_nearest`` of X's rows in blocks of ``KMEANS_BLOCK_ELEMENTS`` distances."""
    xp = array_namespace(X, C)
    n, size = X.shape[0], _block_rows(C.shape[0])
    if n <= size:
        return _nearest(X, C)
    return xp.concat([_nearest(X[lo:min(n, lo + size), ...], C) for lo in range(0, n, size)])


KMEANS_ROWS = 20000
"""The most rows k-means clusters (drawn at random beyond that)."""


KMEANS_TIME_SHARE = 0.1
"""The share of a fit's ``max_time`` its k-means may take: Lloyd's iterations stop there (``kmeans``'s ``deadline``;
one at least). 25 iterations at m = 500 took 1.8 s, and a fit given 1 s took 4.5 s, k-means the most of it."""


def kmeans(X, n_clusters, *, random_state=None, n_iter=25, max_rows=KMEANS_ROWS, weights=None, deadline=None):
    """Lloyd's k-means on at most ``max_rows`` random rows, started from distinct random rows. ``weights`` (host,
    (n,), positive: ``start_rows``'s): each row counts by its weight, in the start (drawn in proportion to it) and in
    the centres (weighted means). ``deadline``: a ``time.perf_counter()`` reading past which no further iteration
    begins (after the first; on a GPU the clock sees the iterations queued, not run, and bounds little).

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
    # Clustered in each column's standard deviation from a row of X: the metric of the default kernel at the start
    # (its lengthscales sqrt(d) times the deviations), and the clusters of standardised features whatever the
    # columns' units. (In units of one scalar, k-means on unscaled airline features followed distance and departure
    # time, left day-of-week's points at 0.17 of its deviation, and once the points moved in the columns' units, SVI's
    # test NLL was 0.015 worse than from the points of the standardised rows.) The deviations and the offset keep
    # the squared distances of features on extreme scales (X * 1e-300, X * 1e154) within the floats, and a constant
    # column of 1e23 at 0.
    origin = X[0:1, ...]
    scale = scaled_std(X, axis=0, keepdims=True) if n > 1 else xp.ones_like(origin)
    scale = xp.where(scale > 0, scale, xp.ones_like(scale))
    X = X / scale - origin / scale
    start = asarray_like(_start_rows(rng, n, n_clusters, weights), xp, device=device)
    centres = xp.take(X, start, axis=0)
    row_weights = None if weights is None else asarray_like(weights, xp, device=device, dtype=X.dtype)
    for iteration in range(n_iter):
        if iteration and deadline is not None and time.perf_counter() > deadline:
            break
        sums, counts = cluster_sums(_nearest_in_blocks(X, centres), X, n_clusters, weights=row_weights)
        if weights is None:
            centres = xp.where(counts[:, None] > 0, sums / xp.maximum(counts, 1.0)[:, None], centres)
        else:  # (weights may be below 1: a cluster's total weight is what it is divided by)
            centres = xp.where(counts[:, None] > 0, sums / xp.where(counts > 0, counts, 1.0)[:, None], centres)
    return centres * scale + origin  # (within the rows' range: no overflow)


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


def initial_inducing_points(X, n_inducing, method="kmeans", *, random_state=None, weights=None, deadline=None):
    """``method`` is "kmeans", "random" (distinct rows), or an (m, d) array of points to start from. ``weights``:
    ``start_rows``'s (X its rows), which "kmeans" and "random" count the rows by; ``deadline``: ``kmeans``'s."""
    xp = array_namespace(X)
    device = array_device(X)
    if isinstance(method, str):
        if method == "kmeans":
            return kmeans(X, n_inducing, random_state=random_state, weights=weights, deadline=deadline)
        if method == "random":
            rows = _start_rows(host_rng(random_state), X.shape[0], n_inducing, weights)
            return xp.take(X, asarray_like(rows, xp, device=device), axis=0)
        raise ValueError(f"unknown inducing-point initialisation {method!r}: use 'kmeans', 'random' or an array")
    dtype = getattr(method, "dtype", None)
    if dtype is None:  # (a list)
        method = np.asarray(method)
        dtype = method.dtype
    # complex points lost their imaginary part with NumPy's ComplexWarning; text that is not numbers raised NumPy's
    # "could not convert" (numbers written as text are taken, as before)
    if isinstance(dtype, np.dtype) and dtype.kind in "cMmV":
        raise ValueError(f"inducing points must be real numbers, got an array of {dtype}")
    if isinstance(dtype, np.dtype) and dtype.kind in "SUO":  # (an object array of text: the same, the audit's)
        try:
            method = np.asarray(method, dtype=np.float64)
        except (ValueError, TypeError):
            raise ValueError(f"inducing points must be real numbers, got an array of {dtype} holding values that are "
                             "not numbers") from None
    Z = asarray_like(method, xp, device=device, dtype=X.dtype)
    if Z.ndim != 2 or Z.shape[1] != X.shape[1]:
        raise ValueError(f"inducing points must have shape (m, {X.shape[1]}), got {tuple(Z.shape)}")
    if not bool(xp.all(xp.isfinite(Z))):
        raise ValueError("inducing points contain NaN or inf")
    _warn_of_copies(Z)
    return xp.asarray(Z, copy=True)


def _warn_of_copies(Z):
    """One warning where a user's inducing points repeat one another: copies of a point have the same gradients, so
    they move together and stay copies, and the model has the capacity of its distinct points only (20 copies of one
    row fitted at chance, without a word: the hostile-input audit of 2026-12-04)."""
    distinct = np.unique(to_numpy(Z), axis=0).shape[0]
    if distinct < Z.shape[0]:
        warnings.warn(f"inducing: {Z.shape[0]} points given, {distinct} of them distinct: copies of a point move "
                      f"together and add nothing, so the model has {distinct} inducing point"
                      f"{'s' if distinct != 1 else ''} in effect (give distinct points)", UserWarning,
                      stacklevel=outside_stacklevel())


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
"""The most level indicators the start kernel's geometry (``encoded_rows``) holds (each categorical column's first
listed levels share them; a value past them is taken as no listed level)."""
ENCODED_ELEMENTS = 1 << 22
"""The most entries of the encoded rows the choice of inducing points reads (rows drawn at random beyond that: 32
MiB in float64; k-means's time grows with them: 16 columns of 64 levels, 20,000 rows, 8 s for 20 points at 1 << 24)."""
VARIANCE_ELEMENTS = 1 << 22
"""The most entries of ``variance_points``'s Cholesky rows (points x rows; rows drawn at random beyond that)."""


def _rows_within(X, weights, rng, count):
    """(X, weights) of at most ``count`` rows of X, drawn by ``rng`` where there are more (in their order)."""
    if X.shape[0] <= count:
        return X, weights
    xp = array_namespace(X)
    chosen = np.sort(rng.choice(X.shape[0], size=count, replace=False))
    return (xp.take(X, asarray_like(chosen, xp, device=array_device(X)), axis=0),
            None if weights is None else weights[chosen])


def encoded_rows(X, columns, levels, scales):
    """The rows X in the geometry of the default kernel at its start: [x_j / s_j for the columns j not in
    ``columns``, e_j(x_j) / sqrt(k) for the k categorical ``columns``], s = ``scales`` (host, (d,): the default
    RBF's lengthscales, sqrt(d_c) times each continuous column's deviation; the categorical entries unread), e_j the
    one-hot indicators of the column's ``levels`` (one list a column: ``inputs.listed_levels``; a value not listed
    has none; at most ``ENCODED_WIDTH`` in all, each column's first). Half the squared distance of two encoded rows
    is the exponent of the default kernel's product term at its start: the RBF's |x - z|^2 / (2 l^2), and the
    categorical kernel's 1 / k for each column that differs (``kernels.Categorical``, whose per-level form is the
    RBF of the indicators). Returns (encoded rows, the number of leading continuous columns)."""
    xp, device = array_namespace(X), array_device(X)

    def on_device(values, dtype=X.dtype):  # (host values, onto the rows' device)
        return asarray_like(np.asarray(values), xp, device=device, dtype=dtype)

    columns = [int(j) for j in columns]
    others = [j for j in range(X.shape[1]) if j not in set(columns)]
    parts = [xp.take(X, on_device(others, xp.int64), axis=1) / on_device(np.asarray(scales)[others])] if others else []
    if columns:
        keep = max(1, ENCODED_WIDTH // len(columns))
        owner = np.concatenate([np.full(min(len(listed), keep), j) for j, listed in zip(columns, levels)])
        listed = np.concatenate([np.asarray(listed[:keep], dtype=np.float64) for listed in levels])
        indicators = xp.take(X, on_device(owner, xp.int64), axis=1) == on_device(listed)[None, :]
        parts.append(xp.astype(indicators, X.dtype) / math.sqrt(len(columns)))
    return xp.concat(parts, axis=1), len(others)


def _encoded_width(X, columns, levels):
    keep = max(1, ENCODED_WIDTH // max(len(columns), 1))
    return X.shape[1] - len(columns) + sum(min(len(listed), keep) for listed in levels)


def kmeans_with_levels(X, n_clusters, columns, levels, scales, *, random_state=None, weights=None, deadline=None):
    """``inducing="kmeans"`` for rows with categorical ``columns``: Lloyd's k-means (``kmeans``) of the rows in the
    default kernel's geometry at its start (``encoded_rows``), then each point the centre's continuous coordinates
    and its nearest row's levels (a level every one: the kernel compares values for equality only and its gradient
    there is zero, issue 45's "the categorical coordinates of Z take level values and are not moved"). Clustered by
    the codes as numbers (codes 2 and 3 closer than 2 and 8, a column of ten levels weighing more than one of two),
    car's points left its test NLL 0.0028 +- 0.0011 above the one-hot columns' fit over 10 splits, and -0.0005 +-
    0.0012 so (docs/results.md, "Categorical columns")."""
    xp = array_namespace(X)
    rng = host_rng(random_state)
    rows = max(n_clusters, min(KMEANS_ROWS, ENCODED_ELEMENTS // _encoded_width(X, columns, levels)))
    X, weights = _rows_within(X, weights, rng, rows)
    encoded, continuous = encoded_rows(X, columns, levels, scales)
    middle = xp.mean(encoded, axis=0)  # (centred: the distances' expanded form cancels far from 0, in float32 most)
    centres = kmeans(encoded - middle, n_clusters, random_state=rng, max_rows=encoded.shape[0], weights=weights,
                     deadline=deadline)
    Z = xp.take(X, _nearest(centres, encoded - middle), axis=0)
    centres = centres + middle
    if not continuous:
        return Z
    others = [j for j in range(X.shape[1]) if j not in set(int(c) for c in columns)]
    position = np.zeros(X.shape[1], dtype=np.int64)  # (column j of X: its place among the continuous ones)
    position[others] = np.arange(continuous)
    divisors = asarray_like(np.asarray(scales)[others], xp, device=array_device(X), dtype=X.dtype)
    placed = xp.take(centres[:, :continuous] * divisors, asarray_like(position, xp, device=array_device(X)), axis=1)
    is_other = np.zeros(X.shape[1], dtype=bool)
    is_other[others] = True
    return xp.where(asarray_like(is_other, xp, device=array_device(X))[None, :], placed, Z)


def variance_points(X, n_points, columns, levels, scales, *, random_state=None):
    """``inducing="variance"``: rows of X chosen one at a time, each the row where f is most uncertain given f at
    the rows chosen before, under the RBF exp(-|e - e'|^2 / 2) of the rows in the default kernel's geometry at its
    start (``encoded_rows``): the greedy conditional-variance choice of Burt, Rasmussen & van der Wilk (2020, JMLR,
    "Convergence of sparse variational inference in Gaussian processes regression"), a pivoted Cholesky
    factorisation of K(X, X) (``_variance_order``). It covers every region the kernel tells apart among the rows it
    reads, however few rows are there, where k-means puts its points where the rows are dense. With categorical
    columns the points hold their levels (the kernel's gradient there is zero), so the choice is the model's: on
    mushroom, small groups of rows no k-means point was near were predicted at the prior (p = 0.54 for rows whose
    neighbours one level away were all of their class; docs/results.md, "Categorical columns").

    Rows are counted once whatever their weight (the choice reads where rows are, not how many). The choice is
    deterministic given the rows and their order; ``random_state`` draws the rows read beyond ``VARIANCE_ELEMENTS``
    / ``n_points`` (or ``ENCODED_ELEMENTS`` encoded entries) and the points past the kernel's numerical rank. Its
    cost is O(rows x n_points x (n_points + width)) in ``n_points`` matrix-vector steps, a host sync each: on one
    BLAS thread, rows of 22 columns of 5 levels and one continuous column, 0.4 s for 100 points of 20,000 rows, 1.0 s
    for 1,000 points of the 4,194 rows then read (fewer than 5 a point: past a few thousand points the choice is
    close to random rows)."""
    xp = array_namespace(X)
    rng = host_rng(random_state)
    rows = max(n_points, min(KMEANS_ROWS, VARIANCE_ELEMENTS // n_points,
                             ENCODED_ELEMENTS // _encoded_width(X, columns, levels)))
    X, _ = _rows_within(X, None, rng, rows)
    encoded, _ = encoded_rows(X, columns, levels, scales)
    order = _variance_order(encoded - xp.mean(encoded, axis=0), n_points, rng)
    return xp.take(X, asarray_like(order, xp, device=array_device(X)), axis=0)


VARIANCE_FLOOR_EPS = 1000.0
"""The conditional variance below which a row counts as known, in units of its type's epsilon (float64 2e-13,
float32 1e-4: the rounding the residual's m updates accumulate, so float32 does not pivot on its noise)."""


def _variance_order(E, count, rng):
    """The greedy conditional-variance choice of ``count`` rows of E (host indices): a pivoted Cholesky of the RBF
    exp(-|e - e'|^2 / 2) of the rows, L (picked, n), each step the row of largest residual variance
    diag(K - L^T L) (the first: row 0, all being 1). The distances are expanded, |e|^2 + |e'|^2 - 2 e.e' (one
    matrix-vector product a step; summed from the differences, a step took 6 to 15 times as long), on rows the
    caller has centred: uncentred, a column far from 0 cancelled (float32 rows at 1e4: distances 22 off). Once
    every row is known to ``VARIANCE_FLOOR_EPS`` (the kernel's numerical rank is spent: a continuous part of one or
    two columns), or all are taken, the rest are drawn by ``rng`` from the rows not taken, then from all (the jitter
    of K(Z, Z) carries a repeated point): filled in the rows' order, they piled up where the rows' order begins."""
    xp = array_namespace(E)
    n = E.shape[0]
    floor = VARIANCE_FLOOR_EPS * float(xp.finfo(E.dtype).eps)
    order = []
    if count < n:  # (else every row is taken: no factorisation)
        squares = xp.sum(E * E, axis=1)
        residual = xp.ones((n,), dtype=E.dtype, device=array_device(E))
        L = xp.zeros((count, n), dtype=E.dtype, device=array_device(E))
        for i in range(count):
            j = int(xp.argmax(residual))
            if float(residual[j]) <= floor:
                break
            order.append(j)
            distances = squares + squares[j] - 2.0 * (E @ E[j, :])
            k = xp.exp(-0.5 * xp.where(distances > 0.0, distances, xp.zeros_like(distances)))
            row = (k - L[:i, :].mT @ L[:i, j]) / xp.sqrt(residual[j])
            L[i, :] = row
            residual = residual - row * row
            residual = xp.where(residual > 0.0, residual, xp.zeros_like(residual))
            residual[j] = 0.0  # (known exactly: not taken again)
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), np.asarray(order, dtype=np.int64))  # (sorted, as before)
    fill = count - len(order)
    if not fill:  # (the generator is drawn from only where it chooses)
        return np.asarray(order, dtype=np.int64)
    drawn = rng.permutation(rest)[:fill]
    again = rng.choice(n, size=max(0, fill - drawn.shape[0]), replace=True)
    return np.concatenate([np.asarray(order, dtype=np.int64), drawn, again]).astype(np.int64)
