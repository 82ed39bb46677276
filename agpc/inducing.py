"""Initial inducing points: k-means (Lloyd on a random subsample) or a random subset of rows.

Shared by every method that needs inducing points (EP, SEP, the variational methods). Written with the
array API: the distances and centroid updates run on the data's device; only the random row choice is
drawn on the host (so a seed gives the same points on every backend).
"""

from __future__ import annotations

from .backend import array_device, array_namespace, asarray_like, host_rng

__all__ = ["initial_inducing_points", "kmeans"]


def _sq_distances(X, C):
    xp = array_namespace(X, C)
    d2 = xp.sum(X * X, axis=1)[:, None] + xp.sum(C * C, axis=1)[None, :] - 2.0 * (X @ C.mT)
    # maximum, not clip: array-api-compat's clip for CuPy is a host copy and two boolean masks (a sync per k-means
    # iteration); maximum is one elementwise kernel
    return xp.maximum(d2, 0.0)


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
    start = asarray_like(rng.choice(n, size=n_clusters, replace=False), xp, device=device)
    centres = xp.take(X, start, axis=0)
    cluster_ids = xp.arange(n_clusters, device=device)
    for _ in range(n_iter):
        labels = xp.argmin(_sq_distances(X, centres), axis=1)
        onehot = xp.astype(labels[:, None] == cluster_ids[None, :], X.dtype)
        counts = xp.sum(onehot, axis=0)
        sums = onehot.mT @ X
        centres = xp.where(counts[:, None] > 0, sums / xp.maximum(counts, 1.0)[:, None], centres)
    return centres


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
