"""Prediction from a fitted model (``agpc.model.FittedModel``: kernel, likelihood, inducing points and q(u)): the
latent f at new rows and the class probabilities, for the binary, ordinal and multiclass model of every method.
``GPClassifier``'s ``predict_*`` methods check the rows (by ``agpc.inputs``, and scikit-learn's feature names), and
call these with the model value, never the estimator."""

from __future__ import annotations

import numpy as np

from . import backend as B
from . import inputs as I
from . import threads
from .inference import ep, multiclass_ep
from .kernels import categorical_columns

__all__ = ["KERNEL_REACH", "within_reach", "placed_rows", "model_latent", "log_proba_matrix", "latent",
           "model_log_proba", "most_probable_labels", "to_caller"]

# A stationary kernel's profile is exactly 0 beyond this many lengthscales (RBF: exp(-r^2 / 2) underflows past
# r = 39; Matern 5/2: past r ~ 330).
KERNEL_REACH = 1e3


def within_reach(kernel, Z, Xc):
    """Xc with each coordinate held within ``KERNEL_REACH`` lengthscales of the inducing points' range. The
    kernel at a point beyond that is 0 to every inducing point, and still is at the clamped point, so the
    predictions do not change; the squared distances of the far point itself overflowed (X * 1e300:
    "overflow encountered in vecdot"). Columns a categorical kernel reads (``kernels.categorical_columns``) are
    not clamped."""
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
    clamped = xp.minimum(xp.maximum(Xc, lower), upper)
    categorical = categorical_columns(kernel)
    if not categorical:
        return clamped
    # codes are compared for equality only, which cannot overflow: a categorical column is left as it is (a clamp
    # could move a code onto a level, or a listed level of the per-level form off its own lengthscale)
    is_categorical = xp.any(xp.arange(Xc.shape[1], device=B.array_device(Xc))[:, None] == B.asarray_like(
        np.asarray(categorical, dtype=np.int64), xp, device=B.array_device(Xc))[None, :], axis=1)
    return xp.where(is_categorical[None, :], Xc, clamped)


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


def placed_rows(model, X, in_xp):
    """(rows checked for the fitted ``model`` (a ``model.FittedModel``) by its estimator, in the model's namespace,
    type and device, or read a block at a time; ``in_xp``, the input's namespace, or None for NumPy arrays, lists
    and data on disk; the input's device). Host rows too large for the device's free memory are predicted a block
    at a time; results are NumPy arrays."""
    xp = B.array_namespace(model.inducing_points)
    device = B.array_device(model.inducing_points)
    if in_xp is None and I.stays_on_host(X, xp, device):
        return B.HostRows(X), None, None
    # the fitted model's own type (a model loaded from a file keeps the type it was saved in)
    Xc = B.asarray_like(X, xp, device=device, dtype=model.inducing_points.dtype)
    return Xc, in_xp, (B.array_device(X) if in_xp is not None else None)


def model_latent(model, Xc):
    """The latent's mean and variance at rows placed by ``placed_rows`` (``latent`` of the fitted ``model``); a
    raised jitter is warned about two callers up (the caller of ``log_proba_matrix``, or of a function of one's own
    around this), unless a scope around it reports it (the estimator's ``predict_*``: at their callers)."""
    with B.jitter_report("GPClassifier prediction", stacklevel=5):
        return latent(model.kernel, model.inducing_points, model.posterior, Xc, blas_threads=model.blas_threads,
                      block_rows=model.block_rows)


def log_proba_matrix(model, Xc):
    """log p(classes[c] | x) as an (n, C) array of the fitted ``model`` at rows placed by ``placed_rows``."""
    mean, var = model_latent(model, Xc)
    return model_log_proba(model, mean, var)


def most_probable_labels(model, Xc, in_xp, device):
    """The fitted ``model``'s most probable class of each row of Xc (in the caller's array type where it holds
    them: numbers). A likelihood whose most probable class is the sign of the latent mean (``sign_decides``: the
    binary probit and logistic): that sign, no probabilities formed."""
    if model.likelihood.sign_decides:
        mean, _ = model_latent(model, Xc)
        index = B.to_numpy(mean > 0).astype(np.intp)
    else:
        log_p = log_proba_matrix(model, Xc)
        index = B.to_numpy(B.array_namespace(log_p).argmax(log_p, axis=1))
    labels = model.classes[index]
    numeric = in_xp is not None and labels.dtype.kind in "biuf"
    return B.asarray_like(labels, in_xp, device=device) if numeric else labels


def model_log_proba(model, mean, var):
    """log p(classes[c] | x), (n, C), of the fitted ``model`` from the latent's mean and variance: its likelihood's
    predictive (``Likelihood.class_log_proba``: Hernandez-Lobato & Hernandez-Lobato (2016), eq. 37 for the probit,
    Villacampa-Calvo & Hernandez-Lobato (2017), eq. 11 for the multiclass model, ...)."""
    return model.likelihood.class_log_proba(mean, var, model.n_quadrature)


def latent(kernel, Z, posterior, Xc, *, block_rows=None, blas_threads=None):
    """Mean and variance of the latent f at the rows Xc (in the model's namespace and type, or read a block at a
    time): per row for a binary model, (n, C) for a multiclass one (``Z`` of shape (C, m, d))."""
    Xc = within_reach(kernel, Z, Xc)
    with threads.blas_threads(Xc.shape[0], Z.shape[-2], n_features=Z.shape[-1], threads=blas_threads), \
            B.block_memory_advice("GPClassifier prediction"):
        if Z.ndim == 3:
            return multiclass_ep.predict_latent(kernel, Z, posterior, Xc, block_rows=block_rows)
        return ep.predict_latent(kernel, Z, posterior, Xc, block_rows=block_rows)


def to_caller(values, in_xp, device):
    """Results in the caller's array type: NumPy for NumPy arrays, lists and data on disk (``in_xp`` None), else
    the input's namespace and device."""
    if in_xp is None:
        return B.to_numpy(values)
    return B.asarray_like(values, in_xp, device=device)
