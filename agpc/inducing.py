"""Initial inducing points: k-means (Lloyd on a random subsample) or a random subset of rows.

Shared by every method that needs inducing points (EP, SEP, the variational methods). Written with the
array API: the distances and centroid updates run on the data's device; only the random row choice is
drawn on the host (so a seed gives the same points on every backend).
"""

from __future__ import annotations

from .backend import array_device, array_namespace, asarray_like, cluster_sums, host_rng

__all__ = ["initial_inducing_points", "kmeans"]


def _nearest(X, C):
    """Each row's nearest centre: argmin_c |c|^2 - 2 x.c, the squared distance less |x|^2, the same for every centre
    of a row (so not computed: of the 20,000 x m passes of the distances, only the product and one sum remain)."""
    xp = array_namespace(X, C)
    return xp.argmin(xp.sum(C * C, axis=1)[None, :] - 2.0 * (X @ C.mT), axis=1)


def kmeans(X, n_clusters, *, random_state=None, n_iter=25, max_rows=20000):
    """Lloyd's k-means on at most ``max_rows`` random rows, started from distinct random rows.

    An empty cluster keeps its previous centre. Returns the (n_clusters, d) centres.
    """
    xp = array_namespace(X)
    device = array_device(X)
    rng = host_rng(random_state)
    n = X.shape[0]
    if n > max_rows:
        rows = asarray_like(rng.choice(n, size=max_rows, replace=False), xp, device=device)
        X = xp.take(X, rows, axis=0)
        n = max_rows
    # Clustered in units of the largest |x| (one scalar: the clusters are those of X): the squared distances of
    # features on extreme scales (X * 1e-300, X * 1e154) would underflow to 0 or overflow to inf.
    scale = xp.max(xp.abs(X))
    scale = xp.where(scale > 0, scale, xp.ones_like(scale))
    X = X / scale
    start = asarray_like(rng.choice(n, size=n_clusters, replace=False), xp, device=device)
    centres = xp.take(X, start, axis=0)
    for _ in range(n_iter):
        sums, counts = cluster_sums(_nearest(X, centres), X, n_clusters)
        centres = xp.where(counts[:, None] > 0, sums / xp.maximum(counts, 1.0)[:, None], centres)
    return centres * scale


def initial_inducing_points(X, n_inducing, method="kmeans", *, random_state=None):
    """``method`` is "kmeans", "random" (distinct rows), or an (m, d) array of points to start from."""
    xp = array_namespace(X)
    device = array_device(X)
    if isinstance(method, str):
        if method == "kmeans":
            return kmeans(X, n_inducing, random_state=random_state)
        if method == "random":
            rows = host_rng(random_state).choice(X.shape[0], size=n_inducing, replace=False)
            return xp.take(X, asarray_like(rows, xp, device=device), axis=0)
        raise ValueError(f"unknown inducing-point initialisation {method!r}: use 'kmeans', 'random' or an array")
    Z = asarray_like(method, xp, device=device, dtype=X.dtype)
    if Z.ndim != 2 or Z.shape[1] != X.shape[1]:
        raise ValueError(f"inducing points must have shape (m, {X.shape[1]}), got {tuple(Z.shape)}")
    if not bool(xp.all(xp.isfinite(Z))):
        raise ValueError("inducing points contain NaN or inf")
    return xp.asarray(Z, copy=True)
