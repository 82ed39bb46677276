"""agpc: scalable Gaussian process classification by expectation propagation with inducing points.

The estimator is :class:`GPClassifier`; kernels are :class:`RBF`, :class:`Matern52`,
:class:`RationalQuadratic` and their sums and products (:class:`Sum`, :class:`Product`: ``k1 + k2``,
``k1 * k2``); priors on kernel parameters are in :mod:`agpc.priors`; generators and loaders are in
:mod:`agpc.datasets`.
Fitted models are saved and loaded as data by :func:`save_model` and :func:`load_model`
(:mod:`agpc.persistence`).
"""

from . import datasets, priors
from .backend import CholeskyError, DeviceUnavailableError, JitterWarning, TF32Warning
from .classifier import GPClassifier
from .kernels import RBF, Matern52, Product, RationalQuadratic, Sum
from .persistence import load_model, save_model

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
    "DeviceUnavailableError",
    "TF32Warning",
    "save_model",
    "load_model",
    "datasets",
    "priors",
    "__version__",
]
