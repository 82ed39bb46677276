"""agpc: scalable Gaussian process classification by expectation propagation with inducing points.

The estimator is :class:`GPClassifier`; kernels are :class:`RBF`, :class:`Matern52`,
:class:`RationalQuadratic` and their sums and products (:class:`Sum`, :class:`Product`: ``k1 + k2``,
``k1 * k2``); priors on kernel parameters are in :mod:`agpc.priors`; generators and loaders are in
:mod:`agpc.datasets`.
Fitted models are saved and loaded as data by :func:`save_model` and :func:`load_model`
(:mod:`agpc.persistence`).
"""

import importlib

from . import priors
from .backend import CholeskyError, JitterWarning
from .kernels import RBF, Matern52, Product, RationalQuadratic, Sum

__version__ = "0.1.0"

__all__ = [
    "GPClassifier",
    "RBF",
    "Matern52",
    "RationalQuadratic",
    "Sum",
    "Product",
    "CholeskyError",
    "JitterWarning",
    "save_model",
    "load_model",
    "datasets",
    "priors",
    "__version__",
]

# Loaded when first asked for: the estimator and the data sets bring in scikit-learn, which a worker process that
# only runs agpc's tasks (a dask worker's data-parallel rounds, ``n_jobs`` workers) does not use. Measured on the
# 2-core machine under load: importing the inference modules took 1.3 s without them and 3.2 s with them, paid by
# every worker process before its first task.
_ON_FIRST_USE = {"GPClassifier": ("classifier", "GPClassifier"), "save_model": ("persistence", "save_model"),
                 "load_model": ("persistence", "load_model"), "datasets": ("datasets", None)}


def __getattr__(name):
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module 'agpc' has no attribute {name!r}")
    module, attribute = _ON_FIRST_USE[name]
    loaded = importlib.import_module(f"{__name__}.{module}")
    value = loaded if attribute is None else getattr(loaded, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
