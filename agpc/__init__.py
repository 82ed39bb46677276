"""agpc: scalable Gaussian process classification by expectation propagation with inducing points.

The estimator is :class:`GPClassifier`; kernels are :class:`RBF` and :class:`Matern52`; generators and
loaders are in :mod:`agpc.datasets`; fitted models are saved and loaded as data by :func:`save_model` and
:func:`load_model` (:mod:`agpc.persistence`).
"""

from . import datasets
from .backend import CholeskyError, JitterWarning
from .classifier import GPClassifier
from .kernels import RBF, Matern52
from .persistence import load_model, save_model

__version__ = "0.1.0"

__all__ = ["GPClassifier", "RBF", "Matern52", "CholeskyError", "JitterWarning", "save_model", "load_model", "datasets",
           "__version__"]
