"""Prediction from a fitted model (``agpc.model.FittedModel``: kernel, likelihood, inducing points and q(u)): the
latent f at new rows and the class probabilities, for the binary, ordinal and multiclass model of every method.
``GPClassifier``'s ``predict_*`` methods check the rows (by ``agpc.inputs``, and scikit-learn's feature names), and
call these with the model value, never the estimator."""

from __future__ import annotations

import numpy as np

from . import backend as B
from . import inputs as I
from . import threads
from .inference import blocks, ep, multiclass_ep
from .kernels import within_reach

__all__ = ["placed_rows", "model_latent", "log_proba_matrix", "latent",
           "model_log_proba", "most_probable_labels", "to_caller"]


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
    time): per row for a binary model, (n, C) for a multiclass one (``Z`` of shape (C, m, d)). The rows are held
    within the kernel's reach (``kernels.within_reach``): rows on disk a block at a time, as they are read (rows of
    1e300 read from disk gave NaN with NumPy's overflow warnings, where the same rows in memory are predicted)."""
    predict = multiclass_ep.predict_latent if Z.ndim == 3 else ep.predict_latent
    I.warn_blas_threads(blas_threads)
    with threads.blas_threads(Xc.shape[0], Z.shape[-2], n_features=Z.shape[-1], threads=blas_threads), \
            B.block_memory_advice("GPClassifier prediction"):
        if not B.is_out_of_core(Xc):
            return predict(kernel, Z, posterior, within_reach(kernel, Z, Xc), block_rows=block_rows)
        parts = [predict(kernel, Z, posterior, within_reach(kernel, Z, rows), block_rows=block_rows)
                 for _, _, rows, _ in blocks.data_blocks(Xc, None, block_rows, Z[0, ...] if Z.ndim == 3 else Z)]
    xp = B.array_namespace(Z)
    return xp.concat([mean for mean, _ in parts]), xp.concat([var for _, var in parts])


def to_caller(values, in_xp, device):
    """Results in the caller's array type: NumPy for NumPy arrays, lists and data on disk (``in_xp`` None), else
    the input's namespace and device."""
    if in_xp is None:
        return B.to_numpy(values)
    return B.asarray_like(values, in_xp, device=device)
