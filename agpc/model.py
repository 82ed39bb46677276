"""The fitted model as one value: (kernel, likelihood, inducing points, latent functions) and q(u), what prediction
and uncertainty read of a fitted ``GPClassifier`` (GPflow's ``SVGP(kernel, likelihood, inducing_variable)``, with
q(u) in EP's form, ``inference.posterior.Posterior``). The estimator builds it (``GPClassifier.fitted_model``); the
modules below the estimator take it, never the estimator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .likelihoods import fitted_likelihood

__all__ = ["FittedModel"]


@dataclass(frozen=True, eq=False)
class FittedModel:
    """A fitted GP classifier.

    ``kernel``: a kernel, or ``kernels.ClassKernels`` (one a class); ``likelihood``: a ``likelihoods.Likelihood``
    at the kernel (``Likelihood.at``: an ordinal one holds its cut points); ``inducing_points``: (m, d), or (C, m, d)
    with a latent GP a class; ``posterior``: q(u) (a tuple of them a class); ``classes``: the labels, in the order of
    the probabilities' columns. ``n_quadrature``, ``block_rows``, ``blas_threads``: the estimator's settings of
    prediction (Gauss-Hermite nodes of a predictive by quadrature, rows a block holds, BLAS threads)."""

    kernel: Any
    likelihood: Any
    inducing_points: Any
    posterior: Any
    classes: Any
    n_quadrature: int = 20
    block_rows: int | None = None
    blas_threads: Any = None

    @classmethod
    def of(cls, kernel, likelihood, inducing_points, posterior, classes, **settings):
        """The model of ``likelihood`` (an object, or its name as ``likelihood_`` and a model file give it), taken at
        the kernel (``likelihoods.fitted_likelihood``)."""
        likelihood = fitted_likelihood(likelihood, kernel, multiclass=inducing_points.ndim == 3)
        return cls(kernel, likelihood, inducing_points, posterior, classes, **settings)

    @property
    def n_latent(self):
        """Latent GPs: one a class for a multiclass model, else one (binary and ordinal)."""
        return self.inducing_points.shape[0] if self.inducing_points.ndim == 3 else 1
