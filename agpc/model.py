"""The fitted model as one value: (kernel, likelihood, inducing points, latent functions) and q(u), what prediction
and uncertainty read of a fitted ``GPClassifier`` (GPflow's ``SVGP(kernel, likelihood, inducing_variable)``, with
q(u) in EP's form, ``inference.posterior.Posterior``). The estimator builds it (``GPClassifier.fitted_model``); the
modules below the estimator take it, never the estimator.

``FittedState`` is that model as the estimator keeps it and a model file holds it (arrays, the likelihood by name) with
what its fit reported (``GPClassifier.fitted_state`` / ``set_fitted_state``, ``agpc.model_file``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .likelihoods import fitted_likelihood

__all__ = ["FittedModel", "FittedState", "FIT_RECORD"]

# What a fit reported beyond its history, kept in a model file's "fit_record" (a file without it, or without one of
# them, was written before they were recorded: the loaded model's attribute is None, "not recorded"). The estimator
# holds each as the attribute of its name and a trailing underscore (``stop_reason_``).
FIT_RECORD = ("n_samples_fit", "fit_time", "stop_reason", "ard", "n_warmup", "early_stopping", "subsample_rows",
              "subsample_iter")


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
    def of(cls, kernel, likelihood, inducing_points, posterior, classes, params):
        """The model of ``likelihood`` (an object, or its name as ``likelihood_`` and a model file give it), taken at
        the kernel (``likelihoods.fitted_likelihood``), with the settings of prediction of ``params``, the
        estimator's parameters by name (its ``vars``, or a model file's; ``block_rows`` absent from models pickled
        before it: None)."""
        likelihood = fitted_likelihood(likelihood, kernel, multiclass=inducing_points.ndim == 3)
        return cls(kernel, likelihood, inducing_points, posterior, classes, n_quadrature=int(params["n_quadrature"]),
                   block_rows=params.get("block_rows"), blas_threads=params.get("blas_threads"))

    @property
    def n_latent(self):
        """Latent GPs: one a class for a multiclass model, else one (binary and ordinal)."""
        return self.inducing_points.shape[0] if self.inducing_points.ndim == 3 else 1


@dataclass
class FittedState:
    """What a fitted model is beyond its parameters (``get_params``): what prediction needs, and what the fit
    reported. Arrays are in the model's namespace (``GPClassifier.fitted_state`` / ``set_fitted_state``).

    A multiclass model (more than two classes) has one latent function a class (Villacampa-Calvo &
    Hernandez-Lobato, 2017): ``kernel`` is a ``ClassKernels``, ``inducing_points`` is (C, m, d) and
    ``posterior`` a tuple of C ``Posterior``; a binary model has one kernel, (m, d) points, one ``Posterior``.
    """

    kernel: Any  # a kernel of agpc.kernels, or a ClassKernels (one a class)
    inducing_points: Any
    posterior: Any  # agpc.inference.posterior.Posterior, or a tuple of them (one a class)
    classes: Any  # a NumPy array of the labels, in the order of the columns of predict_proba
    n_features_in: int
    feature_names_in: Any  # the column names seen at fit (an array of str), or None
    log_marginal_likelihood: float
    n_iter: int
    jitter: float  # on the diagonal of K(Z, Z) at the end of the fit
    # "probit", "logistic", "robust-max", "ordinal" (classes in their order; the cut points the kernel's) or the name
    # of a registered likelihood (``likelihoods.register_likelihood``)
    likelihood: str
    history: dict  # name -> list of numbers, one an evaluation
    record: dict = None  # of FIT_RECORD: the rows fitted, the seconds the fit took, why it stopped (None: unknown)
    categorical: Any = None  # a ``categories.CategoricalColumns`` (None: no categorical columns)
