"""agpc: scalable Gaussian process classification by expectation propagation with inducing points.

The estimator is :class:`GPClassifier`; kernels are :class:`RBF` and :class:`Matern52`; generators and
loaders are in :mod:`agpc.datasets`.
"""

from . import datasets
from .backend import CholeskyError, JitterWarning
from .classifier import GPClassifier
from .kernels import RBF, Matern52

__version__ = "0.1.0"

__all__ = ["GPClassifier", "RBF", "Matern52", "CholeskyError", "JitterWarning", "datasets", "__version__"]
