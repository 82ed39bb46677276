"""What the estimator does for ordered classes (``likelihood="ordinal"``, docs/ordinal.md): its parameter rules, its
labels as ranks in the classes' order, and the cut points a fit starts from. The model itself (the ordinal probit
likelihood of Chu & Ghahramani (2005), its cut points carried by ``agpc.kernels.OrdinalKernel``) lives in
``agpc.likelihoods`` and ``agpc.kernels``; the passes that train it are the binary ones."""

from __future__ import annotations

import math
import statistics

import numpy as np

from . import backend as B
from . import inputs as I
from . import methods as M
from .kernels import OrdinalKernel

__all__ = ["check_params", "labels_as_ranks", "latent_kernel", "start_kernel", "given_cut_points",
           "initial_cut_points"]


def check_params(estimator):
    """An ``OrdinalKernel`` and ``classes=`` belong to an ordinal model only: one ValueError otherwise."""
    if isinstance(estimator.kernel, OrdinalKernel) and estimator.likelihood != M.ORDINAL:
        raise ValueError("kernel: an OrdinalKernel (a latent kernel and cut points) is the kernel of "
                         f"likelihood='ordinal', not of likelihood={estimator.likelihood!r}")
    if estimator.classes is not None and estimator.likelihood != M.ORDINAL:
        raise ValueError("classes= gives the order of ordered classes (likelihood='ordinal'); other models take "
                         f"their classes from y, got classes={estimator.classes!r} with "
                         f"likelihood={estimator.likelihood!r}")


def labels_as_ranks(estimator, X, y, validation_data):
    """An ordinal model's (classes in their order, y and validation_data with their labels as ranks); (None, y,
    validation_data) for another model. Dask arrays are refused (``methods.refuse_ordinal``)."""
    if estimator.likelihood != M.ORDINAL:
        return None, y, validation_data
    if B.is_dask_array(X) or B.is_dask_array(y):
        M.refuse_ordinal("dask")
    ranks, order = I.ordinal_labels(estimator, y)
    if validation_data is not None:
        validation_data = (validation_data[0], I.ordinal_labels(estimator, validation_data[1], order)[0])
    return order, ranks, validation_data


def latent_kernel(kernel):
    """The latent kernel of an ``OrdinalKernel`` given as ``kernel=`` (its cut points are taken by
    ``start_kernel``), any other kernel as it is."""
    return kernel.latent if isinstance(kernel, OrdinalKernel) else kernel


def start_kernel(estimator, kernel, ranks, n_classes, sample, weights):
    """The initial latent ``kernel`` with an ordinal model's starting cut points: those of an ``OrdinalKernel``
    given as ``kernel=``, else from the weighted class counts (``initial_cut_points``)."""
    if isinstance(estimator.kernel, OrdinalKernel):
        start = given_cut_points(estimator.kernel, n_classes)
    else:
        start = initial_cut_points(ranks, n_classes, kernel, sample, None if weights is None else B.to_numpy(weights))
    return OrdinalKernel(kernel, start).for_inputs(sample)


def given_cut_points(kernel, n_classes):
    """The cut points an ``OrdinalKernel`` given as ``kernel=`` starts the fit from: K - 1 of them for K classes."""
    cut_points = B.to_numpy(kernel.cut_points)
    if cut_points.shape[0] != n_classes - 1:
        raise ValueError(f"kernel: the OrdinalKernel has {cut_points.shape[0]} cut points, the model's {n_classes} "
                         f"classes need {n_classes - 1}")
    return cut_points


def initial_cut_points(ranks, n_classes, kernel, sample, weights=None):
    """Cut points to start an ordinal fit from: b_j = sqrt(1 + s^2) Phi^-1(P(y < j)), the cumulative class
    proportions of the training ranks (rows counted by their ``weights``, so that a row of weight 0 is a row
    removed; each count plus 1/2, so that a class absent from y still has an interval of its own and no cut point
    is infinite) through the probit, scaled by the spread of f + noise under the prior
    (s^2: the kernel's mean prior variance at the sample rows). With f at its prior mean 0 the model's class
    probabilities are then the training proportions, p(y < j) = Phi(b_j / sqrt(1 + s^2)) (Chu & Ghahramani (2005)'s
    predictive at f ~ N(0, s^2)), so the first steps learn the latent rather than undo a wrong bias."""
    counts = np.bincount(np.asarray(ranks, dtype=np.int64), weights=weights, minlength=n_classes) + 0.5
    cumulative = np.cumsum(counts)[:-1] / np.sum(counts)
    spread = math.sqrt(1.0 + float(np.mean(B.to_numpy(kernel.Kdiag(sample)))))
    normal = statistics.NormalDist()
    return np.asarray([spread * normal.inv_cdf(float(p)) for p in cumulative])
