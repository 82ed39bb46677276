"""agpc: scalable Gaussian process classification by expectation propagation with inducing points.

The estimator is :class:`GPClassifier`; kernels are :class:`RBF`, :class:`Matern52`,
:class:`RationalQuadratic` and their sums and products (:class:`Sum`, :class:`Product`: ``k1 + k2``,
``k1 * k2``); priors on kernel parameters are in :mod:`agpc.priors`; generators and loaders are in
:mod:`agpc.datasets`.
"""

from . import datasets, priors
from .backend import CholeskyError, JitterWarning
from .classifier import GPClassifier
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
    "datasets",
    "priors",
    "__version__",
]
