"""Prediction from a fitted model's state: the latent f at new rows and the class probabilities, for the binary and
the multiclass model of every method, and lazily on dask arrays. ``GPClassifier``'s ``predict_*`` methods check
the rows (``checked_rows``, by ``agpc.inputs``) and call these with the fitted kernel, inducing points and
posterior."""

from __future__ import annotations

import copy

import numpy as np
from sklearn.utils.validation import check_is_fitted, validate_data

from . import backend as B
from . import inputs as I
from . import threads
from .inference import ep, multiclass_ep, multiclass_vi
from .likelihoods import ROBUST_MAX, likelihood_by_name

__all__ = ["KERNEL_REACH", "within_reach", "checked_rows", "model_latent", "log_proba_matrix", "latent", "log_proba",
           "model_log_proba", "model_likelihood", "most_probable_labels", "to_caller", "lazy"]

# A stationary kernel's profile is exactly 0 beyond this many lengthscales (RBF: exp(-r^2 / 2) underflows past
# r = 39; Matern 5/2: past r ~ 330).
KERNEL_REACH = 1e3


def within_reach(kernel, Z, Xc):
    """Xc with each coordinate held within ``KERNEL_REACH`` lengthscales of the inducing points' range. The
    kernel at a point beyond that is 0 to every inducing point, and still is at the clamped point, so the
    predictions do not change; the squared distances of the far point itself overflowed (X * 1e300:
    "overflow encountered in vecdot")."""
    kernels = [kernel[c] for c in range(Z.shape[0])] if Z.ndim == 3 else [kernel]
    if B.is_out_of_core(Xc):
        return Xc  # (rows on disk are predicted a block at a time, as they are read: not held here)
    growths = [(k.growth, k.growth_power) for k in kernels if k.growth is not None]
    if growths:
        return _within_radius(Xc, growths)
    if any(k.reach_lengthscales is None for k in kernels):
        return Xc
    xp = B.array_namespace(Xc)
    reach_limit = float(xp.finfo(Xc.dtype).max) / (4.0 * KERNEL_REACH)  # reach + |Z| stays finite
    lower = upper = None
    for c, k in enumerate(kernels):
        Zc = Z[c, ...] if Z.ndim == 3 else Z
        reach = KERNEL_REACH * xp.minimum(k.reach_lengthscales, reach_limit)
        low, high = xp.min(Zc, axis=0) - reach, xp.max(Zc, axis=0) + reach
        lower = low if lower is None else xp.minimum(lower, low)
        upper = high if upper is None else xp.maximum(upper, high)
    return xp.minimum(xp.maximum(Xc, lower), upper)


def _within_radius(Xc, growths):
    """Xc with each row longer than R shrunk to length R along its own direction, for kernels whose variance grows
    with |x| (``growths``: each kernel's ``Kernel.growth`` g and ``growth_power`` p, k(x, x) <= (g |x|^2 + c)^p: a
    linear term p = 1, a product of two p = 2), R the smallest of the kernels' radii where (g R^2)^p is the square
    root of the dtype's largest number (1e154 in float64, 2e19 in float32). The latent's mean and variance at t x
    grow as t^p and t^(2p), so the probit's Phi(mean / sqrt(1 + variance)) has converged to its limit along the ray
    long before R; the far row's own k(x, x) and the products of the predictive variance overflowed to inf and gave
    NaN (X * 1e160). Row lengths are taken scaled by each row's largest entry, so that they do not overflow either;
    no host sync."""
    xp = B.array_namespace(Xc)
    finfo = xp.finfo(Xc.dtype)
    limit = float(finfo.max) ** 0.5
    radius = None
    for growth, power in growths:
        # R = limit^(1 / 2p) / sqrt(g), a quotient of two numbers in the type's range for every normal g (limit / g
        # left it for g below 1 / limit, and at p = 2 the floor of 1 / limit that kept it in put R at limit^(1/2),
        # inside rows of features of scale past ~1e77 in float64, ~4e9 in float32); a growth of 0 or below the
        # smallest normal number puts R far past every row
        own = limit ** (1.0 / (2.0 * power)) / xp.sqrt(xp.maximum(growth, float(finfo.smallest_normal)))
        radius = own if radius is None else xp.minimum(radius, own)
    largest = xp.max(xp.abs(Xc), axis=1)
    safe = xp.where(largest > 0, largest, xp.ones_like(largest))
    length = safe * xp.sqrt(B.row_dot(Xc / safe[:, None], Xc / safe[:, None]))
    factor = xp.where(length > radius, radius / xp.where(length > 0, length, xp.ones_like(length)), 1.0)
    return Xc * factor[:, None]


def checked_rows(model, X):
    """(X checked for the fitted ``model``, in its namespace, type and device, or read a block at a time; the
    input's namespace, or None for NumPy arrays, lists and data on disk; the input's device). Data on disk and host
    rows too large for the device's free memory are predicted a block at a time; results are NumPy arrays."""
    check_is_fitted(model, "posterior_")
    dtype, expected, owner = I.dtype_name(model.dtype), model.n_features_in_, type(model).__name__
    if B.is_out_of_core(X):
        I.check_out_of_core(X, dtype, expected=expected, owner=owner)
        return X, None, None
    given = X
    X, in_xp = I.check_features(X, dtype, expected=expected, owner=owner)
    if in_xp is None:  # a DataFrame's names against the fitted ones (scikit-learn's warnings and errors)
        validate_data(model, given, skip_check_array=True, reset=False)
    xp = B.array_namespace(model.inducing_points_)
    device = B.array_device(model.inducing_points_)
    if in_xp is None and I.stays_on_host(X, xp, device):
        return B.HostRows(X), None, None
    # the fitted model's own type (a model loaded from a file keeps the type it was saved in)
    Xc = B.asarray_like(X, xp, device=device, dtype=model.inducing_points_.dtype)
    return Xc, in_xp, (B.array_device(X) if in_xp is not None else None)


def model_latent(model, Xc):
    """The latent's mean and variance at rows checked by ``checked_rows`` (``latent`` of the fitted state); a
    raised jitter is warned about at the caller of the public ``predict_*`` that called this."""
    with B.jitter_report("GPClassifier prediction", stacklevel=5):
        return latent(model.kernel_, model.inducing_points_, model.posterior_, Xc, blas_threads=model.blas_threads,
                      block_rows=getattr(model, "block_rows", None))  # (None in models pickled before it existed)


def log_proba_matrix(model, X):
    """(log p(classes_[c] | x) as an (n, C) array, the input's namespace, its device) of the fitted ``model``."""
    Xc, in_xp, device = checked_rows(model, X)
    mean, var = model_latent(model, Xc)
    return model_log_proba(model, mean, var), in_xp, device


def most_probable_labels(model, X):
    """The fitted ``model``'s most probable class of each row of X (in the caller's array type where it holds
    them: numbers). Two classes of a probit or logistic model: the sign of the latent mean (p(+1) > 1/2 exactly
    there), no probabilities formed."""
    if len(model.classes_) > 2 or not model_likelihood(model).sign_decides:
        log_p, in_xp, device = log_proba_matrix(model, X)
        index = B.to_numpy(B.array_namespace(log_p).argmax(log_p, axis=1))
    else:
        Xc, in_xp, device = checked_rows(model, X)
        mean, _ = model_latent(model, Xc)
        index = B.to_numpy(mean > 0).astype(np.intp)
    labels = model.classes_[index]
    numeric = in_xp is not None and labels.dtype.kind in "biuf"
    return B.asarray_like(labels, in_xp, device=device) if numeric else labels


def model_likelihood(model):
    """The likelihood of the fitted ``model``'s one latent GP (binary or ordinal; an ordinal one's cut points are its
    kernel's: ``Likelihood.at``), or None for a multiclass model (one latent GP a class)."""
    if getattr(model, "inducing_points_", None) is not None and model.inducing_points_.ndim == 3:
        return None
    return likelihood_by_name(model.likelihood_, multiclass=False).at(model.kernel_)


def model_log_proba(model, mean, var):
    """log p(classes_[c] | x), (n, C), of the fitted ``model`` from the latent's mean and variance: its likelihood's
    (``Likelihood.class_log_proba``), or the multiclass model's (``log_proba``)."""
    likelihood = model_likelihood(model)
    if likelihood is None:
        return log_proba(mean, var, model.likelihood_, model.n_quadrature, True)
    return likelihood.class_log_proba(mean, var, model.n_quadrature)


def latent(kernel, Z, posterior, Xc, *, block_rows=None, blas_threads=None):
    """Mean and variance of the latent f at the rows Xc (in the model's namespace and type, or read a block at a
    time): per row for a binary model, (n, C) for a multiclass one (``Z`` of shape (C, m, d))."""
    Xc = within_reach(kernel, Z, Xc)
    with threads.blas_threads(Xc.shape[0], Z.shape[-2], n_features=Z.shape[-1], threads=blas_threads), \
            B.block_memory_advice("GPClassifier prediction"):
        if Z.ndim == 3:
            return multiclass_ep.predict_latent(kernel, Z, posterior, Xc, block_rows=block_rows)
        return ep.predict_latent(kernel, Z, posterior, Xc, block_rows=block_rows)


def log_proba(mean, var, likelihood, n_quadrature, multiclass):
    """log p(class c | x) as an (n, C) array from the latent's mean and variance: the binary ``likelihood``'s
    (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 37 for the probit, Gauss-Hermite for the logistic); the
    multiclass model's (Villacampa-Calvo & Hernandez-Lobato 2017, eq. 11) by one-dimensional quadrature, or robust
    max."""
    if multiclass and likelihood == ROBUST_MAX.name:  # the variational baseline's likelihood
        return multiclass_vi.predictive_log_proba(mean, var)
    if multiclass:
        return multiclass_ep.predictive_log_proba(mean, var)
    return likelihood_by_name(likelihood, multiclass=False).class_log_proba(mean, var, n_quadrature)


def to_caller(values, in_xp, device):
    """Results in the caller's array type: NumPy for NumPy arrays, lists and data on disk (``in_xp`` None), else
    the input's namespace and device."""
    if in_xp is None:
        return B.to_numpy(values)
    return B.asarray_like(values, in_xp, device=device)


def lazy(model, method_name, X, columns, dtype):
    """A prediction on a dask.array: ``model``'s method ``method_name`` chunk by chunk, lazily (a dask array
    back); ``columns`` None: one value a row (labels of ``dtype``), else that many columns of ``dtype``."""
    model = copy.copy(model)
    model.client = None  # the tasks carry the fitted model, not the connection to the cluster
    bound = getattr(model, method_name)
    X = X.rechunk({1: -1})
    if columns is None:
        return X.map_blocks(bound, drop_axis=1, dtype=dtype)
    return X.map_blocks(bound, chunks=(X.chunks[0], (columns,)), dtype=dtype)
