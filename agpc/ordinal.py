"""What the estimator does for ordered classes (``likelihood="ordinal"``, docs/ordinal.md): its parameter rules, its
labels as ranks in the classes' order, and the cut points a fit starts from. The model itself (the ordinal probit
likelihood of Chu & Ghahramani (2005), its cut points carried by ``agpc.kernels.OrdinalKernel``) lives in
``agpc.likelihoods`` and ``agpc.kernels``; the passes that train it are the binary ones."""

from __future__ import annotations

import math
import statistics

import numpy as np

from . import backend as B
from . import dask_inputs as D
from . import inputs as I
from . import labels as L
from .kernels import OrdinalKernel

__all__ = ["check_params", "ranked_inputs", "stream_labels", "latent_kernel", "start_kernel", "given_cut_points",
           "class_counts", "initial_cut_points"]


def check_params(plan):
    """An ``OrdinalKernel`` and ``classes=`` belong to an ordinal model only: one ValueError otherwise."""
    if getattr(plan.kernel, "cut_points", None) is not None and not plan.ordinal:
        raise ValueError("kernel: an OrdinalKernel (a latent kernel and cut points) is the kernel of "
                         f"likelihood='ordinal', not of likelihood={plan.likelihood!r}")
    if plan.classes is not None and not plan.ordinal:
        raise ValueError("classes= gives the order of ordered classes (likelihood='ordinal'); other models take "
                         f"their classes from y, got classes={plan.classes!r} with "
                         f"likelihood={plan.likelihood!r}")


def ranked_inputs(plan, place, X, y, target_xp, validation_data):
    """The ``inputs.TrainingInputs`` of (X, y) from ``place`` (an ``agpc.placement.Placement``), an ordinal model's
    labels as their ranks in the classes' order: returns (inputs, the classes in their order or None for another
    model, the ranks or y, validation_data with its labels as ranks). In memory the labels are ranked here
    (``inputs.ordinal_labels``); on a cluster by tasks on the workers, the order from the distinct labels computed
    there (``dask_inputs.training_inputs``); a label not among ``classes=`` is the same ValueError."""
    if not plan.ordinal:
        return place.training_inputs(X, y, target_xp), None, y, validation_data
    if place.on_cluster:
        inputs = place.training_inputs(X, y, target_xp)
        order, ranks = inputs.class_labels, inputs.y
        if plan.classes is None:
            I.refuse_text_order(np.asarray(order))
    else:
        ranks, order = I.ordinal_labels(plan, y)
        inputs = place.training_inputs(X, ranks, target_xp, classes=np.arange(len(order)))
    if validation_data is not None:
        validation_data = (validation_data[0], I.ordinal_labels(plan, validation_data[1], order)[0])
    return inputs, order, ranks, validation_data


def stream_labels(plan, y, classes, fitted_classes):
    """``partial_fit``'s labels: (y as ``inputs.training_inputs`` takes it, the classes to pass it, the classes in
    their order or None for another model). An ordinal model's first call fixes the order (its ``classes``
    argument or the plan's ``classes=``: both given and different is one ValueError; neither, the call's sorted
    distinct labels) and every call's labels become their ranks in it (a label not among them is refused).
    ``fitted_classes``: the classes of the model the call continues (None: the stream's first call)."""
    fitted = fitted_classes is not None
    if not plan.ordinal:
        return y, fitted_classes if fitted else classes, None
    order = fitted_classes
    if not fitted and classes is not None and plan.classes is not None and not (
            len(classes) == len(plan.classes) and np.array_equal(np.asarray(classes),
                                                                       np.asarray(plan.classes))):
        raise ValueError(f"partial_fit's classes={L.label_text(list(classes))} differ from the estimator's classes="
                         f"{L.label_text(list(plan.classes))}: the classes of an ordinal model are given once, in "
                         "their order")
    ranks, order = I.ordinal_labels(plan, y, order, given=classes)
    return ranks, np.arange(len(order)), order


def latent_kernel(kernel):
    """The latent kernel of an ``OrdinalKernel`` given as ``kernel=`` (its cut points are taken by
    ``start_kernel``), any other kernel as it is."""
    return kernel.covariance_kernel


def start_kernel(plan, kernel, ranks, n_classes, inputs, weights, start):
    """The initial latent ``kernel`` with an ordinal model's starting cut points: those of an ``OrdinalKernel``
    given as ``kernel=``, else from the weighted class counts of the ``ranks`` (``initial_cut_points``; rows on a
    cluster: counted there, from their encoded labels) and the prior's spread over ``start`` (the rows and counts a
    fit starts from, ``inputs.start_of``)."""
    if getattr(plan.kernel, "cut_points", None) is not None:  # (an OrdinalKernel given as kernel=)
        cut_points = given_cut_points(plan.kernel, n_classes)
    elif inputs.client is not None:
        cut_points = initial_cut_points(D.class_counts(inputs.client, ranks, n_classes, weights), kernel, *start)
    else:
        cut_points = initial_cut_points(class_counts(ranks, n_classes, weights), kernel, *start)
    return OrdinalKernel(kernel, cut_points).for_inputs(inputs.sample)


def given_cut_points(kernel, n_classes):
    """The cut points an ``OrdinalKernel`` given as ``kernel=`` starts the fit from: K - 1 of them for K classes."""
    cut_points = B.to_numpy(kernel.cut_points)
    if cut_points.shape[0] != n_classes - 1:
        raise ValueError(f"kernel: the OrdinalKernel has {cut_points.shape[0]} cut points, the model's {n_classes} "
                         f"classes need {n_classes - 1}")
    return cut_points


def class_counts(ranks, n_classes, weights=None):
    """The count of each class's rows (0 .. n_classes - 1) among ``ranks`` (host or device), summed ``weights``
    with weights."""
    return np.bincount(np.asarray(B.to_numpy(ranks), dtype=np.int64), minlength=n_classes,
                       weights=None if weights is None else B.to_numpy(weights))


def initial_cut_points(counts, kernel, sample, sample_counts=None):
    """Cut points to start an ordinal fit from: b_j = sqrt(1 + s^2) Phi^-1(P(y < j)), the cumulative class
    proportions of the training ``counts`` (``class_counts``: rows counted by their weights, so that a row of weight
    0 is a row removed; each count plus 1/2, so that a class absent from y still has an interval of its own and no
    cut point is infinite) through the probit, scaled by the spread of f + noise under the prior
    (s^2: the kernel's mean prior variance at the sample rows, each counted by ``sample_counts`` when given). With f
    at its prior mean 0 the model's class
    probabilities are then the training proportions, p(y < j) = Phi(b_j / sqrt(1 + s^2)) (Chu & Ghahramani (2005)'s
    predictive at f ~ N(0, s^2)), so the first steps learn the latent rather than undo a wrong bias."""
    counts = np.asarray(counts, dtype=np.float64) + 0.5
    cumulative = np.cumsum(counts)[:-1] / np.sum(counts)
    spread = math.sqrt(1.0 + float(np.average(B.to_numpy(kernel.Kdiag(sample)), weights=sample_counts)))
    normal = statistics.NormalDist()
    return np.asarray([spread * normal.inv_cdf(float(p)) for p in cumulative])
