"""agpc: scalable Gaussian process classification by expectation propagation with inducing points.

The estimator is :class:`GPClassifier`; kernels are :class:`RBF`, :class:`Matern52`,
:class:`RationalQuadratic`, :class:`Linear` and their sums and products (:class:`Sum`, :class:`Product`: ``k1 + k2``,
``k1 * k2``), :class:`Categorical` for categorical columns, :class:`OnColumns` for a kernel of some columns and
:func:`mixed_kernel` for both kinds of columns; priors on kernel parameters are in :mod:`agpc.priors`; generators
and loaders are in :mod:`agpc.datasets`.
Fitted models are saved and loaded as data by :func:`save_model` and :func:`load_model`
(:mod:`agpc.persistence`).
"""

import importlib

__version__ = "0.1.0"

# Each public name and the module that holds it (None: the name is a module), imported when it is first used
# (PEP 562): ``import agpc`` loads nothing else, so that the ``agpc`` command runs its own code (``agpc.__main__``)
# before NumPy, SciPy and scikit-learn are loaded, a second or two in which a Ctrl-C must be its one line too.
_PUBLIC = {
    "GPClassifier": "classifier",
    "RBF": "kernels",
    "Matern52": "kernels",
    "RationalQuadratic": "kernels",
    "Linear": "kernels",
    "Sum": "kernels",
    "Product": "kernels",
    "Categorical": "kernels",
    "OnColumns": "kernels",
    "mixed_kernel": "kernels",
    "CholeskyError": "backend",
    "JitterWarning": "backend",
    "GuardWarning": "backend",
    "DeviceUnavailableError": "backend",
    "TF32Warning": "backend",
    "save_model": "persistence",
    "load_model": "persistence",
    "datasets": None,
    "priors": None,
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_PUBLIC[name] or name}")
    value = module if _PUBLIC[name] is None else getattr(module, name)
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
