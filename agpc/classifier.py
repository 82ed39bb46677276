"""GPClassifier: the scikit-learn style estimator."""

from __future__ import annotations

import math
import numbers
import time

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import backend as B
from .inducing import initial_inducing_points
from .inference import ep, training
from .kernels import RBF, Stationary

__all__ = ["GPClassifier"]

_METHODS = training.METHODS
_FULL_BATCH_MAX_ROWS = 20000  # batch_size="auto": full batch up to here, minibatches of 200 above
_OPTIMIZE_GROUPS = ("kernel", "inducing")


def _is_foreign_array(X):
    """An array-API array of a library other than NumPy (CuPy, array_api_strict, ...)."""
    return B.is_array_api_obj(X) and not isinstance(X, np.ndarray) and not B.is_numpy_namespace(B.array_namespace(X))


class GPClassifier(ClassifierMixin, BaseEstimator):
    """Gaussian process classifier with inducing points, trained by expectation propagation (EP, SEP, ADF).

    Binary classification with a probit likelihood and an inducing-point (FITC-style) prior whose
    inducing values are not marginalised (Hernandez-Lobato & Hernandez-Lobato, AISTATS 2016). Training
    interleaves parallel damped EP sweeps with steps on the kernel hyper-parameters and the inducing
    points; cost O(n m^2) a sweep, memory O(n m) in blocks plus two floats a row.

    Parameters
    ----------
    method : {"ep", "sep", "adf"}
        "ep": expectation propagation, two numbers stored per row. "sep": stochastic EP, one tied
        likelihood factor (m x m), memory O(m^2) whatever n. "adf": assumed density filtering (the
        cavity is q itself); cheapest, usually a little worse.
    n_inducing : int, default=100
        Number m of inducing points; must not exceed the number of training rows.
    kernel : Stationary or None
        Kernel with initial hyper-parameters. ``None``: ARD RBF with lengthscale_j = std(X_j) sqrt(d),
        amplitude 1 and latent noise 1e-3.
    backend : "auto", "numpy", "cupy" or an array namespace
        Where to compute. "auto" computes in the input's own namespace and device (NumPy for lists and
        NumPy arrays, CuPy for CuPy arrays, ...). Results come back in the caller's array type.
    max_iter : int, default=250
        Iterations of (EP sweep + hyper-parameter step). With ``optimize=False``, the most sweeps.
    damping : float in (0, 1] or None
        EP damping (seed 000 eq. 25): new = damping * update + (1 - damping) * old. ``None``: 0.5 in
        batch mode, 0.99 in minibatch mode, as the paper.
    batch_size : "auto", None or int
        Rows per minibatch. "auto": the full batch for n <= 20,000, else 200. ``None``: full batch.
        In minibatch mode ``max_iter`` counts epochs and the hyper-parameters follow stochastic gradients.
    optimizer : None, "rprop", "adadelta" or "adam"
        Hyper-parameter steps. ``None``: the paper's per-parameter adaptive steps ("rprop") in batch mode,
        Adadelta (rho 0.9, eps 1e-5) in minibatch mode.
    learning_rate : float or None
        For "adadelta" (default 1.0) and "adam" (default 0.01).
    max_time : float or None
        Stop cleanly at the end of the step that crosses this many seconds; the model is usable.
    inducing : "kmeans", "random" or array of shape (m, d)
        Initial inducing points.
    optimize : True, False or a tuple of "kernel" / "inducing"
        What to learn; the rest stays fixed. ``False`` runs EP to convergence on fixed hyper-parameters.
    jitter : float, default=1e-6
        Added to the diagonal of K(Z, Z).
    tol : float, default=1e-6
        With ``optimize=False``, stop when the largest relative site change falls below ``tol``.
    random_state : int, Generator or None
        Seeds the inducing-point initialisation.
    verbose : bool
        Print log Z_q while training.

    Attributes
    ----------
    classes_ : ndarray of shape (2,)
    kernel_ : Stationary, the learned kernel
    inducing_points_ : array (m, d), the learned inducing points
    log_marginal_likelihood_ : float, log Z_q at the end of training
    history_ : dict of lists, per iteration: "log_marginal_likelihood", "time", "n_invalid_sites", "damping"
    n_iter_ : int
    n_features_in_ : int
    """

    def __init__(
        self,
        method="ep",
        n_inducing=100,
        kernel=None,
        backend="auto",
        max_iter=250,
        damping=None,
        batch_size="auto",
        optimizer=None,
        learning_rate=None,
        max_time=None,
        inducing="kmeans",
        optimize=True,
        jitter=1e-6,
        tol=1e-6,
        random_state=None,
        verbose=False,
    ):
        self.method = method
        self.n_inducing = n_inducing
        self.kernel = kernel
        self.backend = backend
        self.max_iter = max_iter
        self.damping = damping
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.max_time = max_time
        self.inducing = inducing
        self.optimize = optimize
        self.jitter = jitter
        self.tol = tol
        self.random_state = random_state
        self.verbose = verbose

    # -- validation ------------------------------------------------------------------------------

    def _check_params(self):
        if self.method not in _METHODS:
            raise ValueError(f"unknown method {self.method!r}: available methods are {list(_METHODS)}")
        if not isinstance(self.n_inducing, numbers.Integral) or self.n_inducing < 1:
            raise ValueError(f"n_inducing must be a positive integer, got {self.n_inducing!r}")
        if not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 0:
            raise ValueError(f"max_iter must be a non-negative integer, got {self.max_iter!r}")
        if self.damping is not None and not (isinstance(self.damping, numbers.Real) and 0.0 < self.damping <= 1.0):
            raise ValueError(f"damping must be in (0, 1] or None, got {self.damping!r}")
        if not (self.batch_size is None or self.batch_size == "auto" or (
            isinstance(self.batch_size, numbers.Integral) and self.batch_size >= 1
        )):
            raise ValueError(f"batch_size must be 'auto', None or a positive integer, got {self.batch_size!r}")
        if self.optimizer not in (None, "rprop", "adadelta", "adam"):
            raise ValueError(f"unknown optimizer {self.optimizer!r}: use None, 'rprop', 'adadelta' or 'adam'")
        if self.learning_rate is not None and not (isinstance(self.learning_rate, numbers.Real) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.max_time is not None and not (isinstance(self.max_time, numbers.Real) and self.max_time > 0):
            raise ValueError(f"max_time must be a positive number of seconds, got {self.max_time!r}")
        if not (isinstance(self.jitter, numbers.Real) and self.jitter >= 0 and math.isfinite(self.jitter)):
            raise ValueError(f"jitter must be a non-negative number, got {self.jitter!r}")
        if self.kernel is not None and not isinstance(self.kernel, Stationary):
            raise ValueError(f"kernel must be an agpc kernel (e.g. agpc.RBF), got {type(self.kernel).__name__}")
        if self.optimize is True:
            groups = _OPTIMIZE_GROUPS
        elif self.optimize is False or self.optimize is None:
            groups = ()
        else:
            groups = tuple([self.optimize] if isinstance(self.optimize, str) else self.optimize)
            unknown = [g for g in groups if g not in _OPTIMIZE_GROUPS]
            if unknown:
                raise ValueError(f"optimize names unknown groups {unknown}: use True, False or a subset of {_OPTIMIZE_GROUPS}")
        return groups, B.resolve_backend(self.backend)

    def _validate_X(self, X, *, reset):
        """Returns (X as an array of the input's namespace, float64, checked; input namespace or None)."""
        if _is_foreign_array(X):
            xp = B.array_namespace(X)
            if X.ndim != 2:
                raise ValueError(
                    f"Expected 2D array, got {X.ndim}D array instead: reshape your data to (n_samples, n_features)"
                )
            if X.shape[0] < 1:
                raise ValueError("Found array with 0 sample(s) while a minimum of 1 is required")
            if not xp.isdtype(X.dtype, ("real floating", "integral", "bool")):
                raise ValueError(f"X must be real-valued, got dtype {X.dtype}")
            X = xp.astype(X, xp.float64)
            if not bool(xp.all(xp.isfinite(X))):
                raise ValueError("Input X contains NaN or infinity")
            if reset:
                self.n_features_in_ = X.shape[1]
            elif X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input"
                )
            return X, xp
        X = validate_data(self, X, reset=reset, dtype=np.float64, ensure_all_finite=True)
        return X, None

    # -- fitting ---------------------------------------------------------------------------------

    def fit(self, X, y):
        """Fit the classifier.

        Parameters
        ----------
        X : array of shape (n_samples, n_features), NumPy or any array-API array
        y : array of shape (n_samples,), two distinct labels of any type

        Returns
        -------
        self
        """
        groups, target_xp = self._check_params()
        foreign = _is_foreign_array(X)
        if foreign:
            X, in_xp = self._validate_X(X, reset=True)
            y_host = B.to_numpy(y) if B.is_array_api_obj(y) else np.asarray(y)
        else:
            X, y_host = validate_data(self, X, y, dtype=np.float64, ensure_all_finite=True, y_numeric=False)
            in_xp = None
        y_host = np.asarray(y_host)
        if y_host.ndim != 1:
            if y_host.ndim == 2 and y_host.shape[1] == 1:
                y_host = y_host[:, 0]
            else:
                raise ValueError(f"y must be 1-D (n_samples,), got shape {y_host.shape}")
        if y_host.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y_host.shape[0]}: they must match")
        check_classification_targets(y_host)
        classes = np.unique(y_host)
        if classes.shape[0] < 2:
            raise ValueError(
                f"y has only one class ({classes[0]!r}): a classifier needs two classes to learn"
            )
        if classes.shape[0] > 2:
            raise ValueError(
                f"Only binary classification is supported. The type of the target is multiclass: y has "
                f"{classes.shape[0]} classes but method={self.method!r} is a binary classifier"
            )
        n = X.shape[0]
        explicit = not isinstance(self.inducing, str)
        m = len(self.inducing) if explicit else self.n_inducing  # an array of points sets m itself
        if m > n:
            what = f"{m} initial inducing points" if explicit else f"n_inducing={m}"
            raise ValueError(
                f"{what} exceeds the number of training rows ({n}): use at most one inducing point per row"
            )

        xp = target_xp or in_xp or B.resolve_backend("numpy")
        device = B.array_device(X) if (in_xp is not None and target_xp is None) else None
        Xc = B.asarray_like(X, xp, device=device, dtype=xp.float64)
        device = B.array_device(Xc)
        y_pm = B.asarray_like(np.where(y_host == classes[1], 1.0, -1.0), xp, device=device, dtype=xp.float64)

        kernel = self.kernel if self.kernel is not None else self._default_kernel(Xc)
        kernel = kernel.for_inputs(Xc)
        rng = B.host_rng(self.random_state)
        Z = initial_inducing_points(Xc, m, self.inducing, random_state=rng)

        callback = None
        if self.verbose:
            def callback(it, log_z):
                if it % 10 == 0:
                    print(f"[agpc] iteration {it:4d}  log Z_q = {log_z:.6f}")

        if self.batch_size == "auto":
            batch_size = None if n <= _FULL_BATCH_MAX_ROWS else 200
        else:
            batch_size = self.batch_size
        t0 = time.perf_counter()
        result = training.train(
            Xc,
            y_pm,
            kernel,
            Z,
            method=self.method,
            batch_size=batch_size,
            jitter=float(self.jitter),
            max_iter=int(self.max_iter),
            damping=None if self.damping is None else float(self.damping),
            optimize=groups,
            optimizer=self.optimizer,
            learning_rate=self.learning_rate,
            tol=float(self.tol),
            max_time=self.max_time,
            random_state=rng,
            callback=callback,
        )
        self.fit_time_ = time.perf_counter() - t0
        self.classes_ = classes
        self.kernel_ = result.kernel
        self.inducing_points_ = result.Z
        self.posterior_ = result.posterior
        self.log_marginal_likelihood_ = result.log_z
        self.history_ = result.history
        self.n_iter_ = result.n_iter
        self.stopped_by_time_ = result.stopped_by_time
        return self

    @staticmethod
    def _default_kernel(X):
        xp = B.array_namespace(X)
        d = X.shape[1]
        std = B.to_numpy(xp.std(X, axis=0)) if X.shape[0] > 1 else np.ones(d)
        std = np.where(std > 0, std, 1.0)
        return RBF(lengthscales=list(std * math.sqrt(d)), amplitude=1.0, noise=1e-3)

    # -- prediction ------------------------------------------------------------------------------

    def _prepare(self, X):
        check_is_fitted(self, "posterior_")
        X, in_xp = self._validate_X(X, reset=False)
        xp = B.array_namespace(self.inducing_points_)
        Xc = B.asarray_like(X, xp, device=B.array_device(self.inducing_points_), dtype=xp.float64)
        return Xc, in_xp, (B.array_device(X) if in_xp is not None else None)

    @staticmethod
    def _back(values, in_xp, device):
        """Return results in the caller's array type."""
        if in_xp is None:
            return B.to_numpy(values)
        return B.asarray_like(values, in_xp, device=device)

    def predict_latent(self, X):
        """Mean and variance of the latent f at X (seed 000 eq. 36), each of shape (n_samples,).

        The variance includes the kernel's latent noise (the model's f at a data point).
        """
        Xc, in_xp, device = self._prepare(X)
        mean, var = ep.predict_latent(self.kernel_, self.inducing_points_, self.posterior_, Xc)
        return self._back(mean, in_xp, device), self._back(var, in_xp, device)

    def predict_log_proba(self, X):
        """log p(y | x) for both classes (seed 000 eq. 37), shape (n_samples, 2), columns as ``classes_``."""
        from .likelihoods import probit_predictive_log

        Xc, in_xp, device = self._prepare(X)
        mean, var = ep.predict_latent(self.kernel_, self.inducing_points_, self.posterior_, Xc)
        log_pos, log_neg = probit_predictive_log(mean, var)
        xp = B.array_namespace(mean)
        return self._back(xp.stack([log_neg, log_pos], axis=1), in_xp, device)

    def predict_proba(self, X):
        """p(y | x) for both classes, shape (n_samples, 2), columns in the order of ``classes_``."""
        from .likelihoods import probit_predictive_log

        Xc, in_xp, device = self._prepare(X)
        mean, var = ep.predict_latent(self.kernel_, self.inducing_points_, self.posterior_, Xc)
        xp = B.array_namespace(mean)
        log_pos, log_neg = probit_predictive_log(mean, var)
        return self._back(xp.stack([xp.exp(log_neg), xp.exp(log_pos)], axis=1), in_xp, device)

    def decision_function(self, X):
        """Probit score mean / sqrt(1 + variance) = Phi^-1(p(classes_[1] | x)), shape (n_samples,).

        Positive favours ``classes_[1]``; unlike the latent mean alone it ranks rows exactly as
        ``predict_proba`` does, since the predictive variance differs from row to row.
        """
        Xc, in_xp, device = self._prepare(X)
        mean, var = ep.predict_latent(self.kernel_, self.inducing_points_, self.posterior_, Xc)
        xp = B.array_namespace(mean)
        return self._back(mean / xp.sqrt(1.0 + var), in_xp, device)

    def predict(self, X):
        """Most probable class label for each row."""
        Xc, in_xp, device = self._prepare(X)
        mean, _ = ep.predict_latent(self.kernel_, self.inducing_points_, self.posterior_, Xc)
        positive = B.to_numpy(mean > 0)
        labels = self.classes_[positive.astype(np.intp)]
        if in_xp is None or labels.dtype.kind not in "biuf":
            return labels
        return B.asarray_like(labels, in_xp, device=device)

    def score(self, X, y):
        """Mean accuracy on (X, y)."""
        predicted = B.to_numpy(self.predict(X))
        y = B.to_numpy(y) if B.is_array_api_obj(y) else np.asarray(y)
        return float(np.mean(predicted == y))

    # -- persistence -----------------------------------------------------------------------------

    def save(self, path):
        """Save the fitted model as data (npz + JSON, plain data only). See :mod:`agpc.io`."""
        from .io import save_model

        save_model(self, path)

    @classmethod
    def load(cls, path, backend="numpy"):
        """Load a model saved by :meth:`save`; arrays go to ``backend`` (default NumPy)."""
        from .io import load_model

        return load_model(path, backend=backend)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        tags.classifier_tags.poor_score = True
        return tags
