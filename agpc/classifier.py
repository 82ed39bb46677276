"""GPClassifier: the scikit-learn style estimator."""

from __future__ import annotations

import copy
import math
import numbers
import time
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted, validate_data

from . import backend as B
from . import batch_size as batch_rows
from . import categories as C
from . import inputs as I
from . import inspection
from . import labels as L
from . import methods as M
from . import ordinal as O
from . import placement
from . import prediction as P
from . import allocator, size_rule, threads
from . import streaming as S
from . import uncertainty as U
from . import validation as V
from .batch_size import FULL_BATCH_MAX_ROWS
from .inducing import KMEANS_TIME_SHARE, with_any_levels
from .inference import training
from .kernels import (ANY_LEVEL, ClassKernels, Kernel, any_level_columns, categorical_columns, tied_parameters,
                      with_default_priors)
from .likelihoods import LIKELIHOODS, MAX_QUADRATURE, likelihood_by_name
from .model import FIT_RECORD, FittedModel, FittedState
from .model_file import EstimatorSchema, read_model_file, unpickled_state, write_model_file
from .plan import FitPlan

__all__ = ["GPClassifier"]

_OPTIMIZE_GROUPS = V.Subset("kernel", "inducing")  # what ``optimize`` may name
_COUNT = V.Interval(numbers.Integral, 1, None, "left")
# the settings prediction reads (``FittedModel``): checked when it reads them, as ``fit`` checks them, since a
# ``set_params`` after the fit may have changed them
_PREDICTION_SETTINGS = ("n_quadrature", "block_rows", "blas_threads")
_POSITIVE = V.Interval(numbers.Real, 0, None, "neither")
_NON_NEGATIVE = V.Interval(numbers.Real, 0, None, "left")


PREDICTION = "GPClassifier prediction"
"""What a JitterWarning of a ``predict_*`` call names; each public method holds the scope, so that the warning points
at its caller (``backend.jitter_report``'s default stacklevel), whichever path inside raised the jitter."""

# A fit that ran past MAX_TIME_OVERRUN[0] * max_time + MAX_TIME_OVERRUN[1] seconds says so (``_warn_of_time``):
# max_time bounds the steps and keeps room for the final pass, but neither the checks of the rows, the start (k-means
# stops at ``inducing.KMEANS_TIME_SHARE`` of it) nor the passes' timing at the start are cut short, which at m = 500
# on 2,048,097 rows took 4.5 s of a fit given 1 s (1.8 s of it k-means), while 20-s fits end at 19.1-19.8 s.
MAX_TIME_OVERRUN = (1.25, 0.5)

# A fitted model whose class probabilities differ by less than FLAT_SPREAD across up to FLAT_PROBE_ROWS of its training
# rows (its inducing points where the rows are not in memory) has learned nothing from the features, and a fit that
# ends so says it (``_warn_if_flat``). Measured (banana, 2,000 rows): SVI at learning_rate=10 (batch and minibatches)
# and minibatch EP at 1,000 ended at spreads of 0 to 1.2e-9, every probability 0.5000, with a finite log Z and no
# other warning; default fits of pure-noise labels (300-3,000 rows, 2-10 features, balanced and 9:1; EP, SVI, vi-jj)
# spread 0.05-1.0.
FLAT_SPREAD = 1e-6
FLAT_PROBE_ROWS = 1024


class GPClassifier(ClassifierMixin, BaseEstimator):
    """Gaussian process classifier with inducing points: EP, SEP, ADF, GFITC, SVI, vi-JJ and vi-Taylor, all
    trained by one loop (validation, early stopping, checkpoints and resume for every method).

    A probit likelihood and an inducing-point (FITC-style) prior whose inducing values are not marginalised
    (Hernandez-Lobato & Hernandez-Lobato, AISTATS 2016); more than two classes: one latent function per class.
    Training interleaves damped EP sweeps with steps on the kernel hyper-parameters and the inducing points; cost
    O(n m^2) a sweep. The methods, what each supports and the data-parallel rounds: docs/methods.md.

    Parameters
    ----------
    method : {"ep", "sep", "adf", "svi", "vi-jj", "vi-jj-hybrid", "vi-jj-full", "vi-taylor", "gfitc"}
        "ep": expectation propagation, two numbers stored a row. "sep": stochastic EP, one tied factor (m x m).
        "adf": assumed density filtering. "svi": the variational bound of Hensman et al. (2015). ``"vi-*"``: Izmailov &
        Kropotov (2017), analytic q and L-BFGS-B on the kernel. "gfitc": generalised FITC (Naish-Guzman & Holden
        2008), batch only. The registry, where further methods can be registered: ``agpc.methods``.
    n_inducing : "auto", "all" or int, default="auto"
        Number m of inducing points, at most the number of rows. "auto" (``agpc.size_rule``,
        docs/small_data_defaults.md): up to 700 rows, binary batch EP trains the exact model (the full GP: an
        inducing point at every row, held there), until log Z settles; otherwise 100 learned with the kernel.
        "all": the exact model.
    kernel : Kernel or None
        Initial kernel. ``None``: ARD RBF, lengthscale_j = std(X_j) sqrt(d), amplitude 1, latent noise 1e-3.
        Ordinal: also ``agpc.kernels.OrdinalKernel(latent, cut_points)``, to start from those cut points.
    backend : "auto", "numpy", "cupy" or an array namespace
        Where to compute ("auto": the input's own namespace and device). Results come back in the caller's type.
    max_iter : int, default=250
        Iterations (EP sweep + hyper-parameter step); epochs in minibatch mode; with ``optimize=False``, sweeps.
    damping : float in (0, 1] or None
        EP damping (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25). ``None``: 0.5 batch, 0.99 minibatch.
    batch_size : "auto", None or int
        Rows per minibatch. "auto": the full batch up to 20,000 rows (up to 200,000 for the default method's
        binary model of rows in memory on the CPU, which above 20,000 starts on a random 10,000 of them:
        ``subsample_rows_``), else 200 on the CPU and on a GPU the rows that keep it busy
        (``agpc.batch_size``, docs/gpu.md). ``None``: full batch.
    optimizer : None, "rprop", "adadelta" or "adam"
        Hyper-parameter steps. ``None``: "rprop" (the paper's) in batch mode, Adadelta in minibatch mode.
    learning_rate : float or None
        For "adadelta" (default 1.0) and "adam" (default 0.01). The inducing points step in units of their spread per
        feature (Rprop's first steps, Adam's, Adadelta's and the vi methods' L-BFGS-B steps), so the same rate serves
        features of any scale; the kernel's parameters step in their logs.
    max_time : float or None
        Seconds for the whole ``fit``: no step (nor final pass) is started that its measured cost would carry past.
        The start's k-means stops at a tenth of it; the checks of the rows and the start's timing of the passes are
        not cut short, and a fit that ran well past it says so in a warning (``MAX_TIME_OVERRUN``).
    shuffle : bool, default=True
        Visit minibatches in a new random order each epoch (and reorder in-memory rows once).
    eval_every : int or None, default=None
        With ``fit(..., validation_data=...)``: score the validation rows every this many steps into ``history_``
        (``None``: every iteration, or every epoch with minibatches). Scoring alone never stops training.
    n_iter_no_change : int or None, default=None
        With ``fit(..., validation_data=...)``: stop when the validation NLL has not improved by ``tol`` for this
        many scores in a row, and keep the state of the best one (``stop_reason_`` "early_stopping"). ``None``: no
        early stopping.
    inducing : "auto", "kmeans", "variance", "random" or array of shape (m, d), default="auto"
        Initial inducing points: "kmeans", k-means centres (at most 20,000 random rows); "variance", rows chosen one
        at a time where f is most uncertain given those before (Burt, Rasmussen & van der Wilk 2020); "random",
        random rows; "auto", "variance" where some columns are categorical (the points hold their levels there, so
        the start is the model's: ``inducing.variance_points``), else "kmeans". With categorical columns both read
        the rows in the default kernel's geometry (its lengthscales, and level indicators).
    likelihood : None, "probit", "logistic", "ordinal" or a registered likelihood's name
        EP methods: probit; "svi": either (default probit); ``vi-*``: logistic. "ordinal" (EP, SEP, ADF, SVI): ordered
        classes, one latent GP and learned cut points (Chu & Ghahramani 2005; docs/ordinal.md). A binary likelihood
        of one's own (``agpc.likelihoods.register_likelihood``) is trained by EP, SEP and ADF where it has EP's site
        terms, by SVI where it has a log density (docs/likelihoods.md).
    n_quadrature : int, default=20
        Gauss-Hermite nodes for SVI's expected log-likelihood and for the predictive of a likelihood of one's own (1
        to 1,000); the logistic predictive has its own rule, exact to about 1e-6 at every variance.
    optimize : True, False or a tuple of "kernel" / "inducing"
        What to learn. ``False`` runs EP to convergence on fixed hyper-parameters.
    dtype : {"float64", "float32"}, default="float64"
        The floating type the model computes in and holds (float32: docs/gpu.md).
    block_rows : int or None, default=None
        Rows per block of the passes over all rows and of prediction (``None``: about 16 MB per n x m temporary,
        ``agpc.inference.blocks.default_block_rows``); lower it after an ``agpc.backend.BlockMemoryError``.
    jitter : float, default=1e-6
        Added to the diagonal of K(Z, Z), at least ``agpc.backend.jitter_floor``; raised when a factorisation needs
        more (one ``agpc.JitterWarning``; ``jitter_`` is the one used). A ``jitter_`` above the fitted kernel's prior
        variance at the inducing points is said (UserWarning): K(Z, Z) is then mostly jitter.
    tol : float, default=1e-6
        With ``optimize=False``, stop when the largest relative site change falls below ``tol``.
    random_state : int, Generator or None
        Seeds the inducing-point initialisation and the minibatch order.
    verbose : bool
        Show a progress bar (tqdm) with log Z_q and, with validation data, the validation NLL.
    step_replay : bool, default=False (deprecated, no effect; ``True`` warns; it will be removed)
    client : distributed.Client or None
        For ``fit`` on a dask.array: the cluster. ``None``: the current client, else a ``LocalCluster`` for the fit.
    local_steps : int or None
        Steps each worker takes a data-parallel round (docs/methods.md): an int, reproducible rounds; ``None``, 64
        on average, shared out by speed; ``0`` (dask arrays), the steps on the driver, chunks brought to it in turn.
    n_jobs : int or None, default=None
        The cores a fit uses (scikit-learn's meaning: ``None`` is 1, or an enclosing ``joblib.parallel_config``'s;
        -1 every core). Batch passes (every method) spread their row blocks over this many threads, and the BLAS
        thread rule (``agpc.threads``) stays within it: the same model as ``n_jobs=1`` up to the order of the blocks'
        sums. Minibatch SEP / EP / ADF / SVI on NumPy data or data on disk train in this many local worker processes
        by data-parallel rounds: another model than ``n_jobs=1``. At most the cores this process may use (and a
        minibatch of rows a process); fewer than asked, or one on a GPU's arrays, is said in a warning (``n_jobs_``).
    checkpoint_path : path or None, default=None
        Where to write the training state, atomically (a file already there must be an agpc checkpoint, or empty);
        ``fit(X, y, resume=True)`` continues from it to the model of an uninterrupted run.
    checkpoint_every : int or None, default=None
        Write the checkpoint every this many steps (needs ``checkpoint_path``). ``None``: none is written, and
        ``checkpoint_path`` is only read by ``fit(..., resume=True)``.
    site_directory : path or None
        Batch EP on a dask.array: the sites in files under this directory (every worker must reach it).
    blas_threads : int or None, default=None
        BLAS threads during ``fit``, ``partial_fit`` and prediction. ``None``: chosen for the work
        (``agpc.threads``), a limit the caller set left alone.
    ard : "auto", True or False, default="auto"
        Lengthscales per feature (True), or one learned scale for all, the features keeping their starting ratios
        (False). "auto": the exact model of the default kernel on <= 500 rows (all its rows with categorical columns)
        learns one scale, then per feature (kept if they raise log Z by over a nat a parameter they free), a linear,
        a quadratic kernel (<= 400 rows; kept 1, 2 nats up).
    plateau : "auto" or None, default="auto"
        When training stops before ``max_iter`` (a cap): "auto", once log Z has stopped rising, by the rule of
        ``agpc.size_rule.fit_plateau`` for the exact model, the sparse model's batch steps and minibatch epochs
        (``stop_reason_ == "plateau"``; docs/usage.md, "When a fit stops"); ``None``, every iteration of ``max_iter``.
    early_stopping : bool or "auto", default=False
        Hold out ``validation_fraction`` of the rows (at random, every class kept in training) as ``fit``'s validation
        data and stop when their NLL has not improved for ``n_iter_no_change`` evaluations (3 where None: epochs on
        minibatches, iterations after the warm-up in batch steps), keeping the best state (scikit-learn's
        ``HistGradientBoostingClassifier`` convention), where ``fit`` is given no ``validation_data`` (with it,
        ``n_iter_no_change`` alone stops on it). The held-out NLL is unweighted, as ``validation_data``'s is.
        "auto": where the rows left take minibatches (above 20,000 on the CPU, 200,000 for the default method's
        binary model) and are in memory; True: whatever the size; False: never. The split is drawn from
        ``random_state`` (the same rows when it is None). Not the default: it made the 200,000-row airline
        fit in minibatches 7 times as fast at +0.0027 test NLL, but stopped a slowly learning table 0.014 worse
        (docs/small_data_defaults.md, "Early stopping on held-out rows").
    validation_fraction : float in (0, 1), default=0.1
        The share of the rows ``early_stopping`` holds out.
    categorical_features : "from_dtype", None, or array-like of int, str or bool, default="from_dtype"
        The categorical columns of X, in scikit-learn's values (``HistGradientBoostingClassifier``'s): "from_dtype",
        a DataFrame's category and text columns; a list of column indices (0 to n_features - 1) or names, each once,
        or a boolean mask; None, none.
        The default kernel then adds a categorical kernel over them to the RBF of the others (sum and product;
        ``agpc.kernels.Categorical``), and the inducing points keep a level of each. Text levels are learned at fit
        (``categorical_levels_``); a level ``fit`` never saw is its own level at predict, correlated with every level
        as two different levels are (docs/usage.md, "Categorical columns").
    kernel_prior : "auto" or None, default="auto"
        "auto": weak priors on the kernel's log lengthscales (centred on the default kernel's) and log amplitude (a
        linear kernel's slope variances and bias), MAP (docs/small_data_defaults.md). ``None``: its own priors only.
    class_weight : None, "balanced" or dict
        Weights of the classes, multiplied into ``fit``'s ``sample_weight`` (scikit-learn's meanings; docs/weights.md).
    classes : array-like or None, default=None
        ``likelihood="ordinal"``: the classes in their order, lowest first (``None``: the categories of y given as an
        ordered pandas Categorical, else y's sorted distinct labels; labels that are text are then refused, their
        order unknown); a label of y not among them is refused. ``classes_`` keeps this order.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The classes, in the order of ``predict_proba``'s columns (an ordinal model's: the order of ``classes``).
    n_features_in_ : int
        The number of features seen by ``fit``.
    feature_names_in_ : ndarray of str
        The column names of a DataFrame (or of the table ``agpc fit`` read); only when there were names.
    n_iter_ : int
        The iterations trained (epochs with minibatches): the entries of ``history_``, batch EP / SEP / ADF's
        warm-up sweeps included (``max_iter`` does not count them).
    n_warmup_ : int
        Of ``n_iter_``, the warm-up sweeps (batch EP / SEP / ADF: 10; else 0), so ``n_iter_ - n_warmup_`` is what
        ``max_iter`` counts.
    kernel_ : Kernel
        The learned kernel (``agpc.kernels.ClassKernels``, one a class, for more than two classes; for an ordinal
        model an ``agpc.kernels.OrdinalKernel`` holding the cut points, also given by ``cut_points_``).
    inducing_points_ : array of shape (m, d), or (C, m, d) for C classes
        The learned inducing points (the training rows for the exact model), in the array type of the fit.
    likelihood_ : str
        The likelihood trained ("probit", "logistic", "robust-max", "ordinal" or a registered one's name).
    log_marginal_likelihood_ : float
        The method's objective at the end of training: EP's log Z_q, or the evidence lower bound.
    history_ : dict of lists
        Per iteration or epoch: "log_marginal_likelihood", "time", "n_invalid_sites", "damping", "n_steps"; with
        validation data also "validation_step", "validation_nll", "validation_error".
    fit_time_ : float
        Seconds the last ``fit`` took (the span ``max_time`` bounds).
    init_time_ : float
        Seconds of that fit spent on the initial inducing points (k-means).
    stopped_by_time_ : bool
        Whether ``max_time`` ended training.
    stop_reason_ : str
        Why training stopped, one of ``agpc.inspection.STOP_REASONS``.
    is_categorical_ : ndarray of bool, shape (n_features,)
        Which features were taken as categorical (``categorical_features``).
    categorical_levels_ : dict
        {column index: the levels of that categorical column of text, in the order of their codes}; columns of
        numbers are used as they are and have none.
    early_stopping_ : bool
        Whether ``fit`` held out rows for early stopping (``early_stopping``); ``n_samples_fit_`` counts the others.
    n_samples_fit_ : int
        The rows fitted (or streamed through ``partial_fit``).
    n_jobs_ : int
        The workers the fit may use: its batch passes' threads, or its minibatch rounds' processes. Batch passes
        take the threads where they pay (``agpc.threads``): a pass over fewer than 20 m rows (m inducing points), and
        the exact model's n x n algebra below n ~ 800, run on one, a second costing more than it saves there.
    jitter_ : float
        The jitter on K(Z, Z)'s diagonal at the end of training (``jitter`` or more).
    kernel_prior_ : "auto" or None
        The ``kernel_prior`` the model was trained with.
    ard_ : bool
        Whether the fitted kernel has a lengthscale per feature (``ard="auto"`` decides on small data).
    subsample_rows_ : int or None
        The rows of the random subsample the fit trained on first (about 10,000), starting on all rows from the
        kernel and inducing points it reached (binary EP's batch fits of more than 20,000 rows that stop on their
        plateau: ``agpc.size_rule.subsample_start_rows``), or 0; None: not recorded (a fit resumed from a
        checkpoint, which does not say how its run started, or a model file written before 2026-12-01). ``n_iter_``
        and ``history_`` are the fit's on all rows; ``max_iter`` caps each of the two fits.
    subsample_iter_ : int or None
        The iterations of that first fit (warm-up sweeps included), or 0; None: not recorded.
    tf32_ : bool
        Whether float32 products of the fit ran in TF32 on the GPU (``agpc.backend.TF32Warning``).

    Examples
    --------
    Two classes of the built-in banana data, 200 rows (a small model, to keep the example quick):

    >>> from agpc import GPClassifier
    >>> from agpc.datasets import make_banana
    >>> X, y = make_banana(200, random_state=0)
    >>> clf = GPClassifier(n_inducing=20, max_iter=50, random_state=0).fit(X, y)
    >>> clf.classes_.tolist()
    [-1, 1]
    >>> proba = clf.predict_proba(X[:3])       # one column a class, each row summing to 1
    >>> proba.shape, bool(abs(proba.sum(axis=1) - 1).max() < 1e-9)
    ((3, 2), True)
    >>> bool(clf.score(X, y) > 0.8), clf.stop_reason_
    (True, 'max_iter')

    With nothing set (``GPClassifier()``), 200 rows of two classes take the exact model (an inducing point at
    every row) and a choice of kernel (``ard="auto"``): a few seconds. More in docs/usage.md.
    """

    # Every parameter and what it may be (``agpc.validation``): checked at the start of fit / partial_fit;
    # any one constraint of a list accepts. Cross-parameter rules follow in ``_check_params``.
    _parameter_constraints = {
        "method": [M.MethodName()],  # the registry (agpc.methods), read when the parameters are checked
        "n_inducing": [V.Options("auto", "all"), _COUNT],
        "kernel": [V.NONE, V.InstanceOf(Kernel, description="an agpc kernel (e.g. agpc.RBF)")],
        "backend": [V.NONE, V.Options("auto", "numpy", "cupy", ignore_case=True), V.ArrayNamespace()],
        "max_iter": [V.Interval(numbers.Integral, 0, None, "left")],
        "damping": [V.NONE, V.Interval(numbers.Real, 0, 1, "right")],
        "batch_size": [V.NONE, V.Options("auto"), _COUNT],
        "optimizer": [V.NONE, V.Options("rprop", "adadelta", "adam")],
        "learning_rate": [V.NONE, _POSITIVE], "max_time": [V.NONE, _POSITIVE],
        "shuffle": [V.Boolean()], "eval_every": [V.NONE, _COUNT], "n_iter_no_change": [V.NONE, _COUNT],
        "inducing": [V.Options("auto", "kmeans", "variance", "random"), V.ArrayLike()],
        "likelihood": [V.NONE, M.RegisteredLikelihood()],  # which method takes which: ``_check_params``
        "n_quadrature": [V.Interval(numbers.Integral, 1, MAX_QUADRATURE, "both")],
        "optimize": [V.NONE, V.Boolean(), _OPTIMIZE_GROUPS],
        "jitter": [_NON_NEGATIVE], "tol": [_NON_NEGATIVE],
        "random_state": [V.NONE, V.RandomState()],
        "verbose": [V.Boolean(), V.Interval(numbers.Integral, 0, None, "left")],
        "client": [V.NONE, V.HasMethods("compute", "submit", description="a distributed.Client")],
        "local_steps": [V.NONE, V.Interval(numbers.Integral, 0, None, "left")],
        "n_jobs": [V.NONE, V.Interval(numbers.Integral, None, -1, "right"), _COUNT],
        "checkpoint_path": [V.NONE, V.PATH], "checkpoint_every": [V.NONE, _COUNT],
        "site_directory": [V.NONE, V.PATH],
        "blas_threads": [V.NONE, V.Interval(numbers.Integral, 1, threads.MAX_BLAS_THREADS, "both")],
        "dtype": [V.FloatingType(*I.DTYPES)], "block_rows": [V.NONE, _COUNT],
        "step_replay": [V.Boolean()], "kernel_prior": [V.NONE, V.Options("auto")],
        "ard": [V.Options("auto"), V.Boolean()],
        "plateau": [V.NONE, V.Options("auto")],
        "early_stopping": [V.Options("auto"), V.Boolean()],
        "validation_fraction": [V.Interval(numbers.Real, 0, 1, "neither")],
        "categorical_features": [V.NONE, V.Options(C.FROM_DTYPE),
                                 V.InstanceOf(list, tuple, np.ndarray, description="a list of columns or a mask")],
        "class_weight": [V.NONE, V.Options("balanced"), V.InstanceOf(dict, description="a dict of class: weight")],
        "classes": [V.NONE, V.InstanceOf(list, tuple, np.ndarray, description="a list of the classes in their order")],
    }

    def __init__(self, method="ep", n_inducing="auto", kernel=None, backend="auto", max_iter=250, damping=None,
                 batch_size="auto", optimizer=None, learning_rate=None, max_time=None, shuffle=True, eval_every=None,
                 n_iter_no_change=None, inducing="auto", likelihood=None, n_quadrature=20, optimize=True,
                 jitter=1e-6, tol=1e-6, random_state=None, verbose=False, client=None, local_steps=None,
                 n_jobs=None, checkpoint_path=None, checkpoint_every=None, site_directory=None, blas_threads=None,
                 dtype="float64", block_rows=None, step_replay=False, kernel_prior="auto", class_weight=None,
                 classes=None, ard="auto", plateau="auto", early_stopping=False, validation_fraction=0.1,
                 categorical_features=C.FROM_DTYPE):
        parameters = dict(locals())  # every parameter stored as given, nothing else (scikit-learn's rule)
        del parameters["self"]
        vars(self).update(parameters)

    def _check_params(self):
        """Refuse parameters that ``fit`` would refuse (a deprecated one is warned about); returns (the groups
        ``optimize`` learns, the backend, the ``plan.FitPlan`` of the parameters)."""
        V.validate_params(self.get_params(deep=False), self._parameter_constraints, type(self).__name__)
        if self.checkpoint_every is not None and self.checkpoint_path is None:
            raise ValueError(I.NEEDS_CHECKPOINT_PATH)
        M.check_method_params(self.get_params(deep=False))
        given = None if isinstance(self.inducing, str) else np.shape(self.inducing)
        if given and isinstance(self.n_inducing, numbers.Integral) and given[0] != self.n_inducing:
            # (the points are the model's, as before; n_inducing was ignored unsaid: this stop's audit)
            warnings.warn(f"n_inducing={self.n_inducing!r} is not used: the {given[0]} points given as inducing are "
                          "the model's (leave n_inducing='auto' with points given)", UserWarning,
                          stacklevel=B.outside_stacklevel())
        plan = self._plan()
        O.check_params(plan)
        if self.step_replay:
            warnings.warn("step_replay is deprecated and has no effect (it will be removed): CuPy refuses cuBLAS and "
                          "cuSOLVER calls during CUDA-graph capture, so a training step cannot be replayed from a "
                          "graph; every step runs eagerly", FutureWarning, stacklevel=B.outside_stacklevel())
        return _OPTIMIZE_GROUPS.chosen(self.optimize), B.resolve_backend(self.backend), plan

    def _plan(self):
        """The ``plan.FitPlan`` of this estimator's parameters, which every helper of a fit reads in its place."""
        return FitPlan.of(type(self).__name__, self.get_params(deep=False))

    # -- fitting ---------------------------------------------------------------------------------

    def fit(self, X, y, sample_weight=None, validation_data=None, resume=False):
        """Fit the classifier on X (n_samples, n_features: NumPy, any array-API array, a dask.array trained on its
        cluster, or data on disk read a block at a time, a memmap or zarr array) and y (n_samples labels).
        ``sample_weight``: a non-negative weight a row (docs/weights.md). ``validation_data``: (X_val, y_val), scored
        every ``eval_every`` steps into ``history_`` ("validation_nll", "validation_error"), and with
        ``n_iter_no_change`` for early stopping. ``resume``: continue from ``checkpoint_path`` (same data, settings)."""
        started = time.perf_counter()  # max_time covers the whole fit, from here
        with V.attributes_kept_on_failure(self):  # (a fit refused or interrupted leaves the estimator as it was)
            return self._fit_checked(started, X, y, sample_weight, validation_data, resume)

    def _fit_checked(self, started, X, y, sample_weight, validation_data, resume):
        """``fit`` from its start, the estimator's attributes kept by the caller should it raise."""
        groups, target_xp, plan = self._check_params()  # before anything reads them (the BLAS scope reads the sizes)
        X, categorical = C.encoded_rows(X, self.categorical_features, plan.dtype)  # (text levels learned)
        y = L.label_column(y)  # (an array of labels of shape (n, 1): its column, with a warning)
        n_rows, n_features = I.rows_and_features(X, y)
        plan = plan.for_rows(X, y, n_rows, target_xp)  # (binary rows in memory: batch_size="auto" may take more)
        I.check_fit_paths(plan, X, y, resume)  # (a bad path must not cost the fit)
        if isinstance(validation_data, (tuple, list)) and len(validation_data) == 2:  # (else refused, as it is)
            validation_data = (C.encode(validation_data[0], categorical, n_features), validation_data[1])
        held = I.held_out(plan, X, y, sample_weight, n_rows, self.random_state) if validation_data is None else None
        self._holding_out = held is not None  # (``_train``'s patience; ``early_stopping_`` once the fit succeeded)
        if held is not None:  # (the held-out rows are the fit's validation data)
            X, y, sample_weight, validation_data, n_rows = held
        # (freed memory kept for the next iteration; the warnings from the user's line, below ``fit``'s own frame)
        with B.jitter_report("GPClassifier.fit", stacklevel=5), allocator.fit_scope():
            fitted = self._fit(plan, (n_rows, n_features), X, y, groups, target_xp, validation_data, resume, started,
                               sample_weight, categorical.columns)
        self.early_stopping_ = held is not None
        self.is_categorical_, self.categorical_levels_ = categorical.mask, categorical.levels
        return fitted

    def _fit(self, plan, shape, X, y, groups, target_xp, validation_data, resume, started, sample_weight=None,
             categorical=()):
        """The one fit path, for rows of every kind and place (``agpc.placement``), into the one training loop.
        ``shape``: (rows, features) of X (``inputs.rows_and_features``); ``categorical``: its categorical columns."""
        self.__dict__.pop("_trainer", None)
        with placement.Placement(plan, X, *shape) as place:
            steps = place.steps
            inputs, order, y, validation_data = O.ranked_inputs(plan, place, X, y, target_xp, validation_data)
            validate_data(self, X, skip_check_array=True, reset=True)  # (n_features_in_, feature_names_in_)
            n, classes = inputs.X.shape[0], inputs.classes
            L.check_class_share(classes if order is None else order, n)  # (before the model: y of one row a class)
            weights = place.training_weights(sample_weight, inputs, class_labels=order)
            rows_known = not (place.on_cluster or B.is_out_of_core(inputs.X))
            counted = I.rows_counted(weights, n) if rows_known else n  # (a row of weight 0 is not there)
            size = size_rule.fit_model_size(plan, steps, counted, len(classes), rows_known=rows_known)
            if not place.on_cluster:  # (before the model: a fit that cannot fit is refused at once, not minutes in)
                size_rule.check_fit_memory(plan, steps, size, inputs.X.shape[1],
                                           len(classes if order is None else order), inputs.xp, inputs.device)
            if size.at_rows:  # the exact model's inducing points are its rows: they stay there
                groups = tuple(group for group in groups if group != "inducing")
            n_jobs = place.choose_workers(inputs)
            if n_jobs is not None:  # (a cluster's workers are its own)
                self.n_jobs_ = n_jobs
            place.start()
            rng = B.host_rng(self.random_state)
            init_started = time.perf_counter()
            start = I.start_of(plan, inputs, weights)  # (the rows the start is read from, counted by their weights)
            kernel, Z = self._initial_model(start, size.n_inducing, rng, 2 if order is not None else len(classes),
                                            rows=inputs.X if size.at_rows else None, categorical=categorical,
                                            deadline=None if self.max_time is None else
                                            started + KMEANS_TIME_SHARE * self.max_time)
            if order is not None:
                kernel = O.start_kernel(plan, kernel, y, len(order), inputs, weights, start)
            self.init_time_ = time.perf_counter() - init_started
            validation = None
            if validation_data is not None:
                validation = I.validation_set(plan, validation_data, classes, inputs.X.shape[1], inputs.xp,
                                              inputs.device, client=inputs.client)
                validate_data(self, validation_data[0], skip_check_array=True, reset=False)  # (its names)
            data_hash = None if self.checkpoint_path is None else I.training_fingerprint(inputs, weights)
            self.tf32_ = I.note_tf32(plan, inputs.xp)
            placed = place.rows(inputs, Z, rng, exact=size_rule.exact_passes(plan, steps) if size.at_rows else None)
            minibatch = placed.batch_size is not None and placed.batch_size < n
            # (the parameters lengthscales per feature free, counted on the exact model's rows, which Z holds,
            # where ard="auto" may choose: a host copy of Z)
            freed = (tied_parameters(kernel, Z) if size.at_rows and Z.ndim == 2 and plan.ard == "auto"
                     and plan.kernel is None else inputs.X.shape[1] - 1)
            ard = size_rule.ard_plan(plan, size, inputs.X.shape[1], freed)
            kernel, Z, record, plateau = self._subsample_start(plan, placed, kernel, Z, classes, groups, rng, started,
                                                               size, counted, minibatch, resume, tied=ard is not True)
            all_rows = f"2/2: all {counted:,} rows" if record[0] else ""
            result, self.ard_ = size_rule.choose_inducing(
                lambda points, name, fits_after: size_rule.learn_lengthscales(
                    ard, freed, kernel,
                    lambda start, shared, first, stage, later: self._train(
                        plan, placed, start, points, classes, groups, rng, resume and first, validation, started,
                        data_hash, plateau, tied=shared, stage=", ".join(s for s in (name, stage) if s) or all_rows,
                        then=self._later_stages(later, fits_after)), then_fits=fits_after),
                Z, self._any_level_points(Z, kernel, size, resume or minibatch or n > FULL_BATCH_MAX_ROWS, rng),
                has_room=lambda: self.max_time is None or 2.0 * (time.perf_counter() - started) <= self.max_time)
            return self._fitted_from(result, classes if order is None else order, started, n, resumed=bool(resume),
                                     probe=inputs.X if rows_known else None, subsample=record)

    def _batch_size_for(self, n, xp=None, Z=None, n_classes=2, rows=None):
        """Rows a step of a fit on n rows (``agpc.batch_size.rows_per_step``); ``rows``: the (X, y) of the fit, which
        binary EP's bound on the host needs (``FitPlan.for_rows``; without them the bound of every other fit)."""
        target = None if self.backend in (None, "auto") else B.resolve_backend(self.backend)
        plan = self._plan() if rows is None else self._plan().for_rows(*rows, n, target)
        return batch_rows.rows_per_step(plan, n, xp, Z, n_classes)

    def _initial_model(self, start, m, rng, n_classes=2, rows=None, categorical=(), deadline=None):
        """Initial kernel and inducing points from ``start`` (the rows and their counts, ``inputs.start_of``; ``rows``:
        the training rows, held as the exact model's); one of each a class for more than two (Villacampa-Calvo &
        Hernandez-Lobato (2017): one latent function per class). ``categorical``: the categorical columns (the
        default kernel's categorical part; the inducing points keep a level of each: ``inputs.start_inducing_points``).
        ``deadline``: k-means's (``inducing.KMEANS_TIME_SHARE`` of ``max_time``).
        """
        sample, counts = start
        # an RBF over every column: the default kernel without categorical columns, and the priors' centres (the
        # continuous columns' as the default kernel's RBF has them)
        scales = I.start_scales(sample, counts, categorical)  # (the columns' spreads, once: one device sync)
        reference = (I.prior_reference(sample, counts, categorical, scales) if self.kernel is None or
                     self.kernel_prior == "auto" else None)
        if reference is not None:
            I.warn_outlier_columns(scales, getattr(self, "feature_names_in_", None))
        if self.kernel is not None:
            kernel = O.latent_kernel(self.kernel)
        elif categorical:
            kernel = self._default_kernel(sample, counts, categorical=categorical, start=scales)
        else:
            kernel = reference
        if self.kernel_prior == "auto":  # centred on the default kernel's lengthscales (docs/small_data_defaults.md)
            kernel = with_default_priors(kernel, reference)
        kernel = kernel.for_inputs(sample)
        if rows is not None:
            Z = B.array_namespace(rows).asarray(rows, copy=True)
        else:
            # (on levels in the categorical columns; points given as an array are the user's, levels included)
            Z = I.start_inducing_points(sample, m, self.inducing, sorted(set(categorical) | set(categorical_columns(
                kernel))), random_state=rng, weights=counts, deadline=deadline, start=scales)
        if self.kernel is not None or not isinstance(self.inducing, str):  # (a user's kernel, or points)
            I.check_kernel_values(kernel, Z, given="kernel" if self.kernel is not None else "inducing")
        if n_classes > 2:
            xp = B.array_namespace(Z)
            return ClassKernels([kernel] * n_classes), xp.stack([Z] * n_classes)
        return kernel, Z

    _default_kernel = staticmethod(I.default_kernel)  # the kernel ``kernel=None`` starts from

    def _any_level_points(self, Z, kernel, size, excluded, rng):
        """The other inducing points ``size_rule.choose_inducing`` weighs against Z (``inducing.with_any_levels``), or
        None: for a sparse model whose points this fit chose (``inducing`` a rule, not an array) on a kernel with
        per-level categorical columns (``kernels.any_level_columns``), fitted whole in batch passes (``excluded``: a
        resumed fit, or one on minibatches, whose last log Z of SEP, ADF or SVI is a running estimate that swings by
        more than the choice weighs; or one of more than ``batch_size.FULL_BATCH_MAX_ROWS`` rows, the choice's
        measured range, which binary EP's batch steps up to 200,000 rows would make two whole fits; no checkpoint
        file: two fits would write one)."""
        columns = any_level_columns(kernel)
        if (not columns or size.at_rows or excluded or self.checkpoint_path is not None
                or not isinstance(self.inducing, str)):
            return None
        return with_any_levels(Z, columns, rng, ANY_LEVEL)

    def _subsample_start(self, plan, placed, kernel, Z, classes, groups, rng, started, size, counted, minibatch,
                         resume, tied):
        """(kernel, Z, record, plateau): the start of the fit on all rows of ``placed`` (``counted`` by weight, a
        ``size`` model), from ``_fit_on_subsample`` where ``size_rule.subsample_start_rows`` says (else as given),
        the record (rows, iterations) of that fit (``subsample_rows_``, ``subsample_iter_``) and the fit on all rows'
        stop on its plateau (``size_rule.fit_plateau``)."""
        subsample = size_rule.subsample_start_rows(plan, counted, size, minibatch, self.plateau,
                                                   learns=bool(groups) and int(self.max_iter) > 0)
        # (None, None) for a resume, which continues a run from its checkpoint and does not know how that run started
        # (the checkpoint does not hold it); (0, 0) where there is none; else what the fit on the subsample ran
        record = (None, None) if resume else (0, 0) if subsample is None else None
        if record is None:
            kernel, Z, record = self._fit_on_subsample(plan, placed, kernel, Z, classes, groups, rng, started,
                                                       subsample, counted, tied)
        # A fit on all rows from a subsample's model stops on the short window, and so does a resume where the rule
        # applies (it continues such a run: unless that run's subsample fit failed, which a checkpoint does not say);
        # a subsample's fit that failed leaves the start and the window as they were.
        plateau = size_rule.fit_plateau(self.plateau, counted, size.at_rows, minibatch=minibatch,
                                        started_on_subsample=bool(record[0]) or (resume and subsample is not None),
                                        by_weight=I.rows_by_weight(placed.weights, counted))
        return kernel, Z, record, plateau

    def _fit_on_subsample(self, plan, placed, kernel, Z, classes, groups, rng, started, asked, total, tied):
        """(kernel, Z, (rows, iterations)) for the fit on all rows of ``placed`` to start from: those of a fit on about
        ``asked`` of them drawn at random (``size_rule.subsample_start_rows``, ``labels.stratified_rows``), from
        ``kernel`` and ``Z``, to its own plateau, with half of the time ``max_time`` has left, no validation and no
        checkpoint (the fit on all rows writes those), and its rows and iterations (warm-up sweeps included). A fit
        that fails numerically leaves the start as it was, and (0, 0): the fit on all rows is then the fit of all rows
        alone. ``total``: the rows of ``placed`` counted by weight (as the progress line and a warning say them)."""
        picked = L.stratified_rows(placed.y, asked, rng, weights=placed.weights)
        weights = None if placed.weights is None else placed.weights[picked]
        subset = placed._replace(X=placed.X[picked], y=placed.y[picked], weights=weights)
        rows = int(picked.size)
        plateau = size_rule.fit_plateau(self.plateau, I.rows_counted(weights, rows), False,
                                        by_weight=I.rows_by_weight(weights, rows))
        budget = None
        if self.max_time is not None:
            spent = time.perf_counter() - started
            budget = spent + 0.5 * max(0.0, self.max_time - spent)
        try:
            result = self._train(plan, subset, kernel, Z, classes, groups, rng, False, None, started, None, plateau,
                                 tied=tied, stage=f"1/2: a random {rows:,} of {total:,} rows",
                                 max_time=budget, checkpoints=False,
                                 # (its estimate adds the fit on all rows, whose iterations cost by their rows)
                                 then=(f"the fit on all {total:,} rows", placed.X.shape[0] / rows, self.max_time))
        except (B.CholeskyError, FloatingPointError) as failure:
            warnings.warn(f"the fit on a random {rows:,} of the {total:,} rows failed numerically ({failure}); "
                          "training on all rows from the start instead, as without the subsample",
                          RuntimeWarning, stacklevel=B.outside_stacklevel())
            return kernel, Z, (0, 0)
        return result.kernel, result.Z, (rows, int(result.n_iter))

    def _later_stages(self, later, fits_after=0):
        """The ``then`` of a stage that ``later`` more stages may follow (``size_rule.learn_lengthscales``' kernel
        choice, and ``fits_after`` whole fits from other inducing points, ``size_rule.choose_inducing``: the same rows
        and model size, each stage at most ``max_iter`` iterations at about this stage's pace), None for the last or
        only stage."""
        if not later:
            return None
        if not fits_after:
            return (f"the {later} later kernel stage{'s' if later != 1 else ''}", 1.0, self.max_time, later)
        what = ("the fit from the other inducing points" if later == 1 else
                f"the {later} later stages (of the kernel choice and the fit from the other inducing points)")
        return (what, 1.0, self.max_time, later)

    def _train(self, plan, placed, kernel, Z, classes, groups, rng, resume, validation, started, data_hash, plateau,
               tied=False, stage="", max_time="fit", checkpoints=True, then=None):
        """The one training loop (``training.train``) on the ``placement.PlacedRows`` with this estimator's
        settings for its method: its engine (its passes where ``placed`` runs them, or ``placed.rounds``'s round
        engine) and the loop's settings and hooks, built here and only here. ``max_time``: the seconds since
        ``started`` the loop may run ("fit": the estimator's ``max_time``); ``checkpoints``: whether it writes the
        estimator's (a start on a subsample does not); ``then``: the stage after it, for its progress line's
        estimate (``training.TrainSettings.then``)."""
        spec = plan.spec
        self.likelihood_ = plan.likelihood_name(len(classes))
        settings = training.TrainSettings(
            batch_size=placed.batch_size, max_iter=int(self.max_iter), tol=float(self.tol),
            max_time=self.max_time if max_time == "fit" else max_time,
            random_state=rng, shuffle=bool(self.shuffle), eval_every=self.eval_every,
            n_iter_no_change=self.n_iter_no_change if self.n_iter_no_change is not None or not getattr(
                self, "_holding_out", False) else I.EARLY_STOPPING_PATIENCE,
            progress=bool(self.verbose), checkpoint_path=self.checkpoint_path if checkpoints else None,
            checkpoint_every=self.checkpoint_every if checkpoints else None, resume=bool(resume), started=started,
            data_hash=data_hash,
            plateau=plateau, stage=stage, then=then,
        )
        options = training.EngineOptions(
            jitter=B.starting_jitter(self.jitter, Z), optimize=groups,
            block_rows=self.block_rows if placed.block_rows is None else placed.block_rows,
            damping=None if self.damping is None else float(self.damping), optimizer=self.optimizer,
            learning_rate=self.learning_rate,
            likelihood=plan.engine_likelihood(len(classes)),
            n_quadrature=int(self.n_quadrature), tol=float(self.tol), shared_lengthscales=tied,
        )
        settings, options = training.with_overrides(settings, options,
                                                    spec.training_settings(self.get_params(deep=False), len(classes)))
        n = placed.X.shape[0]
        built = spec.make_engine(kernel, Z, n_total=n, minibatch=settings.minibatch(n), options=options,
                                 passes=placed.passes, rounds=placed.rounds)
        self._likelihood = built.likelihood  # (the object the model is fitted with: ``_set_fitted``)
        return training.train(placed.X, placed.y, built, settings, training.standard_hooks(settings, validation),
                              sample_weight=placed.weights)

    def _fitted_from(self, result, classes, t0, n_rows, resumed=False, probe=None, subsample=(0, 0)):
        """Fitted attributes from a ``training.TrainResult`` of a fit on ``n_rows`` rows (``subsample``: the rows and
        iterations of its start on a subsample). ``probe``: its rows in memory, the model's namespace and device, for
        ``_warn_if_flat`` (None: the inducing points alone), which runs in the caller's scope: the fit's, its BLAS
        threads' included."""
        self.subsample_rows_, self.subsample_iter_ = subsample
        self._rows_seen = n_rows  # the rows the model stands for, should partial_fit continue it
        self.fit_time_ = time.perf_counter() - t0
        self.classes_ = classes
        self._set_fitted(result.kernel, result.Z, result.posterior, result.log_z, result.history, result.n_iter,
                         result.jitter, self._likelihood)
        self.stopped_by_time_, self.early_stopped_ = result.stopped_by_time, result.early_stopped
        self.stop_reason_, self.n_samples_fit_, self.n_warmup_ = result.stop_reason, n_rows, result.n_warmup
        training.warn_if_no_checkpoint(self.checkpoint_path, self.checkpoint_every, result, resumed,
                                       stacklevel=B.outside_stacklevel())
        training.warn_if_never_scored(self.eval_every, self.n_iter_no_change, result,
                                      stacklevel=B.outside_stacklevel())
        self._warn_of_time(result, resumed)
        if self.max_iter != 0 and not (result.stopped_by_time and result.n_iter == 0):  # (those are said already)
            self._warn_if_flat(probe)
        self._warn_if_jitter_swamps()
        return self

    def _warn_if_flat(self, X=None):
        """A ``GuardWarning`` where the fitted model gives every input the same class probabilities (``FLAT_SPREAD``,
        at up to ``FLAT_PROBE_ROWS`` of the training rows ``X`` spread over them, else of its inducing points, which
        may all lie together): a finite log Z and a guard with nothing to say do not show that a careless learning
        rate took the kernel where it is flat, and such a model predicts the class frequencies at best."""
        Z = self.inducing_points_
        xp = B.array_namespace(Z)
        rows = xp.reshape(Z, (-1, Z.shape[-1])) if X is None else X
        stride = max(1, -(-rows.shape[0] // FLAT_PROBE_ROWS))
        # (a stop within the axis: array_api_strict refuses one past its end)
        rows = rows[:min(rows.shape[0], stride * FLAT_PROBE_ROWS):stride, ...]
        with B.jitter_report(PREDICTION):
            p = xp.exp(P.log_proba_matrix(self.fitted_model(), rows))
        spread = float(xp.max(xp.max(p, axis=0) - xp.min(p, axis=0)))
        if math.isnan(spread):  # (multiclass minibatch EP at learning_rate=1e8 ended with a latent noise of exp(828))
            rate = "" if self.learning_rate is None else f"; learning_rate={self.learning_rate!r} is likely too large"
            B.warn_guard(f"{self.method}: the fitted model's class probabilities are NaN at its probe rows: its steps "
                         f"took the hyper-parameters out of the floating-point range (kernel_){rate}")
            return
        if not spread < FLAT_SPREAD:
            return
        history = self.history_.get("log_marginal_likelihood") or [float("nan")]
        where = "its inducing points" if X is None else f"{rows.shape[0]:,} of the training rows"
        said = (f"{self.method}: the fitted model gives every input the same class probabilities (they differ by "
                f"{spread:.1e} across {where}): it has learned nothing from the features; log Z went from "
                f"{history[0]:.6g} at the first iteration to {float(self.log_marginal_likelihood_):.6g}. ")
        if self.learning_rate is not None:
            said += (f"learning_rate={self.learning_rate!r} is likely too large: its steps took the kernel where it "
                     "is flat. Try a smaller one, or leave it None")
        else:
            said += ("If the features do carry signal, look at kernel_ (lengthscales far longer or shorter than the "
                     "inputs' spread, an amplitude near 0) and the inputs' scale")
        B.warn_guard(said)

    def _warn_if_jitter_swamps(self):
        """A UserWarning where the jitter of the fitted model exceeds its kernel's prior variance at its inducing points
        (the smallest of its latent GPs' means of K(Z, Z)'s diagonal, jitter not counted): K(Z, Z) is then mostly
        jitter, the inducing values nearly independent of each other. Measured (banana, 1,000 rows, 30 points, 2,000
        test rows): jitter 1e-6 to 10 gave test NLL 0.336-0.338, the fitted variance growing with it (ratios up to
        0.45); 1e3 gave 0.464 (ratio 21) and 1e6 0.693, every probability 0.500, none of it said."""
        Z = self.inducing_points_
        xp = B.array_namespace(Z)  # (K(Z, Z) itself: Kdiag adds the latent noise, which K(Z, Z) does not hold; one
        # scalar a latent GP to the host, not m of them)
        variance = min(float(xp.mean(xp.linalg.diagonal(kernel.K(Z_c)))) for kernel, Z_c in self.kernel_.latent_parts(Z))
        if not self.jitter_ > variance:
            return
        start = B.starting_jitter(self.jitter, Z)  # (float32's floor is no failed factorisation)
        raised = (f" (raised from {start:g} where a factorisation failed)" if self.jitter_ > start else
                  f" (float32's floor, above jitter={self.jitter:g})" if start > self.jitter else "")
        warnings.warn(f"jitter_={self.jitter_:g}{raised} exceeds the fitted kernel's prior variance at the inducing "
                      f"points ({variance:.3g}): K(Z, Z) is then mostly jitter and the model learns little from the "
                      "features; the jitter is for round-off (1e-6 by default; a factorisation that needs more raises "
                      "it itself)", UserWarning, stacklevel=B.outside_stacklevel())

    def _warn_of_time(self, result, resumed):
        """One warning where ``max_time`` ended the fit before its first iteration (a model of no step is the prior's,
        which predicts the same probability everywhere: never returned unsaid), or where the fit ran well past it
        (``MAX_TIME_OVERRUN``): its start and its last pass are not cut short."""
        if self.max_time is None:
            return
        over = self.fit_time_ > MAX_TIME_OVERRUN[0] * self.max_time + MAX_TIME_OVERRUN[1]
        took = (f"; the fit took {self.fit_time_:.1f} s, {self.init_time_:.1f} s of it choosing the inducing points "
                "(k-means stops at a tenth of max_time, after its first iteration), and max_time does not cut short "
                "the checks of the rows, the timing of the passes or the last pass") if over else ""
        if result.stopped_by_time and result.n_iter == 0 and not resumed:
            from sklearn.exceptions import ConvergenceWarning

            warnings.warn(f"max_time={self.max_time:g} s ended the fit before its first iteration: the model is its "
                          f"start (the prior, no row fitted); give more time{took}", ConvergenceWarning,
                          stacklevel=B.outside_stacklevel())
        elif over:
            warnings.warn(f"max_time={self.max_time:g} s was overrun{took}; give more time, or fewer inducing points",
                          UserWarning, stacklevel=B.outside_stacklevel())

    def _set_fitted(self, kernel, Z, posterior, log_z, history, n_iter, jitter, likelihood):
        # the likelihood object the model was fitted with (its engine's; a loaded model's, looked up once by its name):
        # replacing or unregistering a registered one's name later changes neither this model's predictions nor
        # what partial_fit trains; a pickle carries it, to be unpickled where its class imports. None: by its name
        # (``fitted_model``; an engine of one's own that does not say)
        self._likelihood = likelihood
        vars(self).update(tf32_=bool(getattr(self, "tf32_", False)),  # (set by inputs.note_tf32; loaded: False)
                          jitter_=jitter, kernel_prior_=self.kernel_prior, kernel_=kernel, inducing_points_=Z,
                          posterior_=posterior, log_marginal_likelihood_=log_z, history_=history, n_iter_=n_iter)
        # what partial_fit may continue (``streaming.check_continuable``)
        self._fitted_structure = S.structure(self._plan())

    def _streams(self):
        """Whether this estimator's method learns from a stream (``available_if``'s check of ``partial_fit``): an
        AttributeError saying which methods do where it does not (scikit-learn raises its own, "has no attribute
        'partial_fit'", from this one: ``hasattr`` stays False, and the traceback names the methods)."""
        if not M.supports(self.method, "partial_fit"):
            streaming = [name for name in M.method_names() if M.supports(name, "partial_fit")]
            raise AttributeError(f"partial_fit learns from a stream with method {' or '.join(map(repr, streaming))}: "
                                 f"method={self.method!r} trains by fit")
        return True

    @available_if(_streams)
    def partial_fit(self, X, y, classes=None, n_total=None, sample_weight=None):
        """Update the model with one more minibatch (a stream): one damped site update and one stochastic gradient
        step on these rows (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 6); "sep" and "adf" only. The first
        call sets the classes, kernel and inducing points; a fitted or loaded model continues (what may not change
        since, and ``n_total``, the rows the model stands for: docs/usage.md). ``sample_weight``: docs/weights.md."""
        groups, target_xp, plan = self._check_params()
        y = L.label_column(y)  # (an array of labels of shape (n, 1): its column, with a warning, as fit takes it)
        S.check_stream_params(plan, streaming=hasattr(self, "_trainer"))
        n_rows, n_features = I.rows_and_features(X, y)
        if hasattr(self, "posterior_") or hasattr(self, "_trainer"):  # the model's columns and levels
            categorical = self._categorical_columns()
            X = self._coded(X, n_features, unseen_refused=True)  # (rows trained on: no unseen level)
        else:
            X, categorical = C.encoded_rows(X, self.categorical_features)
        steps = plan.steps(n_rows)
        with placement.blas_scope(plan, steps, n_features), B.jitter_report("GPClassifier.partial_fit"), \
                S.unchanged_on_failure(self, getattr(self, "_trainer", None), n_rows):
            fitted = self._partial_fit(plan, steps, X, y, classes, n_total, groups, target_xp, sample_weight,
                                       categorical.columns)
        self.is_categorical_, self.categorical_levels_ = categorical.mask, dict(categorical.levels)
        return fitted

    def _partial_fit(self, plan, steps, X, y, classes, n_total, groups, target_xp, sample_weight, categorical=()):
        live = hasattr(self, "_trainer")
        fitted = live or hasattr(self, "posterior_")
        if fitted:  # before any change to the model: a refused call leaves it as it was
            S.check_continuable(plan, getattr(self, "_fitted_structure", None) or S.structure(plan), classes,
                                self.classes_)
            plan = plan.with_features(self.n_features_in_)  # (the rows must have the model's features)
        y, classes, order = O.stream_labels(plan, y, classes, self.classes_ if fitted else None)  # (ordinal: ranks)
        inputs = I.training_inputs(plan, X, y, target_xp=target_xp, classes=classes)
        validate_data(self, X, skip_check_array=True, reset=not fitted)  # (n_features_in_, feature_names_in_)
        Xc, y_pm, classes = inputs.X, inputs.y, inputs.classes
        weights = I.stream_weights(plan, sample_weight, inputs, order)  # (rows counted by weight: ``streaming.step``)
        rows = Xc.shape[0]
        I.check_n_total(n_total, rows)
        if not live:
            self.tf32_ = I.note_tf32(plan, inputs.xp)
        if not fitted:
            self.classes_ = classes if order is None else order
            rng = B.host_rng(self.random_state)
            m = size_rule.fit_model_size(plan, steps, rows, rows_known=False).n_inducing
            S.note_first_batch(plan, m, rows)
            start = I.start_of(plan, inputs, weights)
            kernel, Z = self._initial_model(start, m, rng, len(classes) if order is None else 2,
                                            categorical=categorical)
            if order is not None:  # (the cut points start from this call's class counts)
                kernel = O.start_kernel(plan, kernel, y, len(order), inputs, weights, start)
            self._rows_seen = 0
            self._trainer = S.stream_trainer(plan, kernel, Z, n_total or rows, groups,
                                             B.starting_jitter(self.jitter, Z), n_classes=len(self.classes_))
        elif not live:  # fit records its rows on the model, partial_fit in the history
            self._trainer, self._rows_seen = S.trainer_from_fitted(plan, self.fitted_state(), groups, n_total, rows,
                                                                   getattr(self, "_rows_seen", None),
                                                                   likelihood=getattr(self, "_likelihood", None))
        trainer = self._trainer
        self._rows_seen += S.rows_counted(trainer, rows, weights)
        trainer.n_total = n_total or self._rows_seen
        post, log_z = S.step(trainer, Xc, y_pm, self._rows_seen)
        state = trainer.state
        self.likelihood_ = plan.likelihood_name(len(self.classes_))
        self._set_fitted(state["kernel"], state["Z"], post, log_z, trainer.history, trainer.n_steps,
                         trainer.engine.jitter, trainer.engine.likelihood)
        # the history goes on from a fit's (or a loaded model's): its warm-up sweeps stay among n_iter_ (a stream of
        # partial_fit alone has none); None: a model file from before the count, which says so
        warmup = getattr(self, "n_warmup_", 0) if fitted else 0
        self.stop_reason_, self.n_samples_fit_, self.n_warmup_ = "partial_fit", self._rows_seen, warmup
        self.ard_ = not self._trainer.engine.shared_lengthscales
        return self

    # -- prediction (``agpc.prediction``) ---------------------------------------------------------

    def predict_latent(self, X):
        """Mean and variance of the latent f at X, with the kernel's latent noise (Hernandez-Lobato &
        Hernandez-Lobato (2016), eq. 36): each (n_samples,), or (n_samples, n_classes) for a multiclass model."""
        model, (Xc, in_xp, device) = self._model_and_rows(X)
        with B.jitter_report(PREDICTION):
            mean, var = P.model_latent(model, Xc)
        return P.to_caller(mean, in_xp, device), P.to_caller(var, in_xp, device)

    def predict_log_proba(self, X):
        """log p(y | x) for every class (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 37; Villacampa-Calvo &
        Hernandez-Lobato (2017), eq. 11), (n_samples, n_classes) in the order of ``classes_``; dask.array: lazy."""
        if B.is_dask_array(X):
            dtype = np.dtype(self._fitted_dtype())  # (NotFittedError first)
            return self._lazy("predict_log_proba", X, len(self.classes_), dtype)
        model, (Xc, in_xp, device) = self._model_and_rows(X)
        with B.jitter_report(PREDICTION):
            return P.to_caller(P.log_proba_matrix(model, Xc), in_xp, device)

    def predict_proba(self, X):
        """p(y | x) for every class, shape (n_samples, n_classes), columns in the order of ``classes_``;
        rows sum to one. A dask.array in gives a dask.array out (lazy, chunk by chunk)."""
        if B.is_dask_array(X):
            dtype = np.dtype(self._fitted_dtype())  # (NotFittedError first)
            return self._lazy("predict_proba", X, len(self.classes_), dtype)
        model, (Xc, in_xp, device) = self._model_and_rows(X)
        with B.jitter_report(PREDICTION):
            log_p = P.log_proba_matrix(model, Xc)
        return P.to_caller(B.array_namespace(log_p).exp(log_p), in_xp, device)

    def summary(self, max_features=20):
        """What the fitted model is and how its training went, as text (``agpc.inspection.model_summary``): the
        ``max_features`` most relevant features are listed."""
        return inspection.model_summary(self.report(), max_features)

    def report(self):
        """What the summary and ``agpc inspect``'s plot read of this fitted model (``agpc.inspection.ModelReport``).
        Raises NotFittedError before ``fit``."""
        return inspection.ModelReport(type(self).__name__, self.method, self._fitted_dtype(),
                                      getattr(self, "kernel_prior_", None), self.fitted_state())

    def predict_uncertainty(self, X, method="quadrature"):
        """Predictive entropy and its aleatoric and epistemic (BALD) parts per row, in nats: ``agpc.uncertainty``."""
        model, (Xc, in_xp, device) = self._model_and_rows(X)
        with B.jitter_report(PREDICTION):
            return U.model_uncertainty(model, Xc, in_xp, device, method)

    @property
    def cut_points_(self):
        """An ordinal model's cut points b_1 < ... < b_{K-1} (NumPy), from ``kernel_``."""
        check_is_fitted(self, "posterior_")
        if self.kernel_.cut_points is None:
            raise AttributeError("cut_points_: only an ordinal model (likelihood='ordinal') has cut points")
        return B.to_numpy(self.kernel_.cut_points)

    def decision_function(self, X):
        """Binary: the predictive log-odds log p(classes_[1] | x) - log p(classes_[0] | x), shape (n_samples,),
        which ranks rows as ``predict_proba`` does. Multiclass: the log-probabilities, (n_samples, n_classes)."""
        model, (Xc, in_xp, device) = self._model_and_rows(X)
        with B.jitter_report(PREDICTION):
            log_p = P.log_proba_matrix(model, Xc)
        if len(self.classes_) > 2:
            return P.to_caller(log_p, in_xp, device)
        return P.to_caller(log_p[:, 1] - log_p[:, 0], in_xp, device)

    def predict(self, X):
        """Most probable class label for each row (a lazy dask.array for a dask.array)."""
        if B.is_dask_array(X):
            check_is_fitted(self, "posterior_")
            return self._lazy("predict", X, None, np.asarray(self.classes_).dtype)
        model, rows = self._model_and_rows(X)
        with B.jitter_report(PREDICTION):
            return P.most_probable_labels(model, *rows)

    def fitted_model(self):
        """The fitted model as one value (``agpc.model.FittedModel``: kernel, likelihood, inducing points, q(u)),
        which prediction and uncertainty read. Raises NotFittedError before ``fit``."""
        check_is_fitted(self, "posterior_")
        settings = {name: getattr(self, name, None) for name in _PREDICTION_SETTINGS}
        V.validate_params(settings, {name: self._parameter_constraints[name] for name in settings}, type(self).__name__)
        # (a model pickled before it kept its likelihood object: by its name)
        likelihood = getattr(self, "_likelihood", None) or self.likelihood_
        return FittedModel.of(self.kernel_, likelihood, self.inducing_points_, self.posterior_, self.classes_,
                              vars(self))

    def _model_and_rows(self, X):
        """(``fitted_model()``, (X checked for it, in its namespace, type and device, or read a block at a time; the
        input's namespace, or None for NumPy arrays, lists and data on disk; the input's device)): data on disk is
        predicted a block at a time, and so are host rows too large for the device's free memory."""
        model = self.fitted_model()
        dtype, expected, owner = self._fitted_dtype(), self.n_features_in_, type(self).__name__
        X = self._coded(X, expected)
        if B.is_out_of_core(X):
            I.check_out_of_core(X, dtype, expected=expected, owner=owner)
            return model, (X, None, None)
        if hasattr(X, "columns"):  # (a DataFrame's names first: an extra or a missing column named, not counted)
            I.check_distinct_columns(X)
            validate_data(self, X, skip_check_array=True, reset=False)
        checked, in_xp = I.check_features(X, dtype, expected=expected, owner=owner)
        if in_xp is None and not hasattr(X, "columns"):  # (scikit-learn's warnings: names at fit, none now, ...)
            validate_data(self, X, skip_check_array=True, reset=False)
        return model, P.placed_rows(model, checked, in_xp)

    def _fitted_dtype(self):
        """"float32" or "float64": the type the model was fitted in, its inducing points' (a set_params(dtype=...)
        since the fit changes neither the model nor the type its rows are read in). NotFittedError before a fit."""
        check_is_fitted(self, "posterior_")
        Z = self.inducing_points_
        return "float32" if Z.dtype == B.array_namespace(Z).float32 else "float64"

    def _coded(self, X, n_features, unseen_refused=False):
        """X with its text columns as the fit coded them (``categories.encode``); a DataFrame's column names are
        checked against the fitted ones first (scikit-learn's words, not a column of the wrong values)."""
        if getattr(self, "categorical_levels_", None):
            if hasattr(X, "columns"):
                validate_data(self, X, skip_check_array=True, reset=False)
            width = C.row_width(X)
            if width is None and C.may_hold_text(X) and np.ndim(np.asarray(X, dtype=object)) == 1:
                raise ValueError("Expected a 2D array of rows, got a 1D one: reshape a single row with "
                                 "X.reshape(1, -1) (or give a DataFrame of one row)")
            I.check_feature_count(n_features if width is None else width, n_features, type(self).__name__)
        columns = self._categorical_columns()
        # the columns of codes (numbers at fit) checked as fit checks them: none the inducing points' "any level", each
        # exact in the model's type; a column of text levels compares what it is given with them as text (``encode``)
        codes = C.CategoricalColumns(columns.mask & ~np.isin(np.arange(columns.mask.size), list(columns.levels)), {})
        if codes.columns and C.row_width(X) == n_features:
            C.check_exact_codes(X, codes, self._fitted_dtype(), fit=False)
        return C.encode(X, columns, n_features, unseen_refused=unseen_refused)

    def _categorical_columns(self):
        """The fitted ``categories.CategoricalColumns`` (none for a model fitted before categorical columns)."""
        mask = getattr(self, "is_categorical_", None)
        return C.CategoricalColumns(np.zeros(self.n_features_in_, dtype=bool) if mask is None else mask,
                                    getattr(self, "categorical_levels_", {}))

    def _lazy(self, method_name, X, columns, dtype):
        """A prediction on a dask.array: this model's method ``method_name`` chunk by chunk, lazily (a dask array
        back); ``columns`` None: one value a row (labels of ``dtype``), else that many columns of ``dtype``."""
        if X.ndim != 2:  # (dask's own words about chunks, or NumPy's AxisError, from the map below)
            raise ValueError(f"Expected 2D array, got {X.ndim}D array instead (a dask array of shape {X.shape}): a "
                             "row a sample, one column a feature")
        I.check_feature_dtype(X)  # (objects stay: each chunk is checked as rows in memory, text levels coded)
        model = copy.copy(self)
        model.client = None  # the tasks carry the fitted model, not the connection to the cluster
        bound = getattr(model, method_name)
        X = X.rechunk({1: -1})
        if columns is None:
            return X.map_blocks(_predicted_chunk, bound, drop_axis=1, dtype=dtype)
        return X.map_blocks(_predicted_chunk, bound, chunks=(X.chunks[0], (columns,)), dtype=dtype)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy on (X, y), weighted by ``sample_weight`` when given."""
        with B.jitter_report(PREDICTION):
            predicted = B.to_numpy(self.predict(X))
        # (a column vector of labels, as fit takes it: compared as it was, it broadcast against the predictions to
        # an n x n table, whose mean was returned as the accuracy)
        y = I.host_labels(y, predicted.shape[0], type(self).__name__)
        I.check_label_kind(y, self.classes_)
        return float(np.average(predicted == y, weights=I.score_weights(sample_weight, len(y))))

    # -- persistence: all that a model file (agpc.model_file) uses of the estimator ----------------

    def __setstate__(self, state):
        """Unpickling: a model pickled before a parameter existed is restored as it was trained (``unpickled_state``)."""
        super().__setstate__(unpickled_state(state))

    def check_params(self):
        """Refuse (one ValueError naming the parameter) parameters that ``fit`` would refuse, without fitting."""
        self._check_params()

    def check_saved_params(self):
        """Before a save: refuse parameters ``load_model`` would refuse (set since the fit: ``file_schema``'s check),
        not what only this machine or session decides: the backend (a model fitted on CuPy is saved where CuPy
        cannot run), a likelihood registered where the file will be loaded but not here, the deprecation warning
        of a parameter."""
        params = dict(self.get_params(deep=False), backend="numpy")
        if isinstance(params["likelihood"], str) and params["likelihood"] not in LIKELIHOODS:
            params["likelihood"] = None  # (registered at load, or refused there by name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            type(self)(**params).check_params()

    def fitted_state(self):
        """What the fitted model is beyond its parameters: an ``agpc.model.FittedState`` (what
        prediction needs, and what the fit reported). Raises NotFittedError before ``fit``."""
        check_is_fitted(self, "posterior_")
        return FittedState(
            kernel=self.kernel_, inducing_points=self.inducing_points_, posterior=self.posterior_,
            classes=self.classes_, n_features_in=self.n_features_in_,
            feature_names_in=getattr(self, "feature_names_in_", None),
            log_marginal_likelihood=self.log_marginal_likelihood_, n_iter=self.n_iter_,
            jitter=getattr(self, "jitter_", self.jitter), likelihood=self.likelihood_, history=self.history_,
            record={name: getattr(self, name + "_", None) for name in FIT_RECORD},
            categorical=self._categorical_columns())

    def set_fitted_state(self, state):
        """Make this estimator the fitted model ``state`` describes (a ``FittedState`` of a model with these
        parameters: they are taken as those it was fitted with). Returns self."""
        self.classes_ = state.classes
        self.n_features_in_ = state.n_features_in
        if state.feature_names_in is not None:
            self.feature_names_in_ = state.feature_names_in
        else:
            self.__dict__.pop("feature_names_in_", None)
        self.likelihood_ = state.likelihood
        one_latent = state.inducing_points.ndim == 2  # (a binary or ordinal model: its likelihood is a named one)
        self._set_fitted(state.kernel, state.inducing_points, state.posterior, state.log_marginal_likelihood,
                         state.history, state.n_iter, state.jitter,
                         likelihood_by_name(state.likelihood, multiclass=False) if one_latent else None)
        vars(self).update({name + "_": (state.record or {}).get(name) for name in FIT_RECORD})  # None: not recorded
        categorical = state.categorical or C.CategoricalColumns(np.zeros(state.n_features_in, dtype=bool), {})
        self.is_categorical_, self.categorical_levels_ = categorical.mask, dict(categorical.levels)
        return self

    def save(self, path):
        """Save the fitted model as data (npz + JSON, plain data only) to ``path``, a file name (written
        atomically) or a binary file object. See :mod:`agpc.model_file`; ``agpc.save_model`` is the same (parameters
        set since the fit checked first, as ``fit`` checks them: ``load_model`` would refuse them)."""
        self.check_saved_params()
        write_model_file(path, type(self).__name__, self.get_params(deep=False), self.fitted_state())

    @classmethod
    def load(cls, path, backend="numpy"):
        """Load a model saved by :meth:`save` (a file name or a binary file object), its arrays in ``backend``.
        Every field is checked (:mod:`agpc.model_file`); a file is never executed. ``agpc.load_model`` is the same."""
        with B.jitter_report(f"{cls.__name__}.load"):  # (a jitter raised to factorise the file's K(Z, Z))
            params, state = read_model_file(path, cls.file_schema(), backend=backend)
            return cls(**params).set_fitted_state(state)

    @classmethod
    def file_schema(cls):
        """What a model file knows of this estimator (``model_file.EstimatorSchema``): its name, its parameters'
        defaults and the check ``fit`` makes of them."""
        return EstimatorSchema(cls.__name__, cls().get_params(deep=False),
                               lambda params: cls(**params).check_params())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = M.supports(self.method, "multiclass")
        tags.classifier_tags.poor_score = True
        return tags


def _predicted_chunk(block, predict, block_info=None):
    """A dask prediction's task: ``predict`` (a fitted model's bound method) on one chunk of rows. An error that
    names rows names them in the whole array, not in the chunk (an error of a later chunk said "row 7" of its own
    rows): the chunk's first row is said with it."""
    try:
        return predict(block)
    except ValueError as exc:
        first = (block_info or {}).get(0, {}).get("array-location", [(0, 0)])[0][0]
        if not first:
            raise
        raise ValueError(f"{exc} (in the chunk of rows from row {first} on: its rows are counted from there)") from None
