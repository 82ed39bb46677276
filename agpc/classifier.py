"""GPClassifier: the scikit-learn style estimator."""

from __future__ import annotations

import math
import numbers
import os
import time
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from . import backend as B
from . import inputs as I
from . import methods as M
from . import prediction as P
from . import size_rule
from . import streaming as S
from . import threads
from . import validation as V
from . import workers as W
from .checkpoints import check_checkpoint_path, check_resume_path, check_site_directory
from .inducing import initial_inducing_points
from .inference import ep, training
from .inference.dask_engine import ChunkedRows, DaskEngine, local_cluster, persisted_blocks
from .inference.data_parallel import DataParallel, RowsOnWorkers, prepare_worker, refusal
from .kernels import RBF, ClassKernels, Kernel, with_default_priors
from .model_file import VALUE_WHEN_ABSENT, FittedState, read_model_file, write_model_file

__all__ = ["GPClassifier"]

_FULL_BATCH_MAX_ROWS = 20000  # batch_size="auto": full batch up to here, minibatches of 200 above (on a GPU: below)

# What one binary minibatch step asks of a GPU, counted on CuPy's paths (tests/step_cost.py; docs/gpu.md): kernel
# launches for its first row block and for each further one, flops per row per m^2 and elements moved per row per m
# (m >= 200). gpu_tests/test_gpu_batch.py holds them to a counted step of each method.
_EP_STEP = {"launches": 380, "block_launches": 175, "flops_per_row_m2": 13.7, "elements_per_row_m": 64.0}
GPU_STEP_MODEL = {"sep": _EP_STEP, "ep": _EP_STEP, "adf": _EP_STEP,
                  "svi": {"launches": 320, "block_launches": 130, "flops_per_row_m2": 10.2, "elements_per_row_m": 46.0}}
_GPU_STEPS_PER_EPOCH = 8  # the GPU's minibatch is at most n / 8 rows: the hyper-parameters move 8 times an epoch


_OPTIMIZE_GROUPS = ("kernel", "inducing")


class GPClassifier(ClassifierMixin, BaseEstimator):
    """Gaussian process classifier with inducing points: EP, SEP, ADF, GFITC, SVI, vi-JJ and vi-Taylor, all
    trained by one loop (validation, early stopping, checkpoints and resume for every method).

    Binary classification with a probit likelihood and an inducing-point (FITC-style) prior whose
    inducing values are not marginalised (Hernandez-Lobato & Hernandez-Lobato, AISTATS 2016). Training
    interleaves parallel damped EP sweeps with steps on the kernel hyper-parameters and the inducing
    points; cost O(n m^2) a sweep, memory O(n m) in blocks plus two floats a row.

    Parameters
    ----------
    method : {"ep", "sep", "adf", "svi", "vi-jj", "vi-jj-hybrid", "vi-jj-full", "vi-taylor", "gfitc"}
        "ep": expectation propagation, two numbers stored per row. "sep": stochastic EP, one tied
        likelihood factor (m x m), memory O(m^2) whatever n. "adf": assumed density filtering (the
        cavity is q itself); cheapest, usually a little worse. "svi": the variational bound of Hensman
        et al. (2015) by stochastic gradients (Adam at 0.01 by default; the paper tunes Adadelta's rate). "vi-jj",
        "vi-jj-hybrid", "vi-jj-full", "vi-taylor": Izmailov & Kropotov (2017): analytic q, L-BFGS-B on the kernel
        (``max_iter`` outer iterations of 3 analytic updates and at most 5 evaluations), no learning rate.
        "gfitc": the generalised FITC baseline (Naish-Guzman & Holden 2008): EP on the FITC prior run to
        convergence (largest relative site change below ``tol``) before each of ``max_iter`` steps; batch only.
        What each supports: ``agpc.methods`` (the registry, where further methods can be registered).
    n_inducing : "auto", "all" or int, default="auto"
        Number m of inducing points; must not exceed the number of training rows. "auto" sizes the model by the data
        (``agpc.size_rule``, docs/small_data_defaults.md): up to 400 training rows, the exact model -- an inducing
        point at every row, held there (the full GP), trained by EP's full-GP passes (``agpc.inference.exact_ep``:
        one n x n factorisation a step) -- for binary ``method="ep"`` in batch mode; otherwise 100 inducing points
        (or every row, when there are fewer) learned with the kernel, as before the rule (more rows, more than two
        classes, every other method, minibatches, streams, dask arrays and data on disk, which are read a chunk at a
        time). "all": the exact model whatever the size (at most 5,000 rows in memory: it holds n x n matrices; multiclass EP trains it by the full-GP passes too, the other
        methods by their own passes on m = n).
    kernel : Kernel or None
        Kernel with initial hyper-parameters. ``None``: ARD RBF with lengthscale_j = std(X_j) sqrt(d),
        amplitude 1 and latent noise 1e-3.
    backend : "auto", "numpy", "cupy" or an array namespace
        Where to compute. "auto" computes in the input's own namespace and device (NumPy for lists and
        NumPy arrays, CuPy for CuPy arrays, ...). Results come back in the caller's array type.
    max_iter : int, default=250
        Iterations of (EP sweep + hyper-parameter step). With ``optimize=False``, the most sweeps.
    damping : float in (0, 1] or None
        EP damping (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25): new = damping * update + (1 - damping) * old.
        ``None``: 0.5 in batch mode, 0.99 in minibatch mode, as the paper.
    batch_size : "auto", None or int
        Rows per minibatch. "auto": the full batch for n <= 20,000, else 200 on the CPU; on a GPU, binary models take
        the fewest rows whose arithmetic outweighs twice the launch overhead of the step's few hundred kernels, from
        the device's throughput (docs/gpu.md: about 200,000 rows at m = 200 and 26,000 at m = 1,000 on an H100 in
        float64), at most n / 8 and what fits in half the device's free memory, in one row block. ``None``: full
        batch.
        In minibatch mode ``max_iter`` counts epochs and the hyper-parameters follow stochastic gradients.
    optimizer : None, "rprop", "adadelta" or "adam"
        Hyper-parameter steps. ``None``: the paper's per-parameter adaptive steps ("rprop") in batch mode,
        Adadelta (rho 0.9, eps 1e-5) in minibatch mode.
    learning_rate : float or None
        For "adadelta" (default 1.0) and "adam" (default 0.01).
    max_time : float or None
        Seconds for the whole ``fit``: input checks, the initialisation of the inducing points (k-means,
        ``init_time_``), the steps and the final pass. No step is started that its measured length would
        carry past it (in batch mode, plus the final pass that rebuilds q from all rows: about one more
        step). In minibatch mode the final exact pass over all rows (minibatch EP's rebuild of q from every
        site, SVI's bound on all rows) is made only when its measured cost fits in what is left; otherwise
        the model keeps the running q that training used. The same for every method (one training loop).
    shuffle : bool, default=True
        Visit minibatches in a new random order each epoch (and reorder in-memory rows once).
    eval_every : int or None
        With ``fit(..., validation_data=...)``: score every this many steps (default: every iteration in
        batch mode, every epoch in minibatch mode).
    n_iter_no_change : int or None
        Early stopping: stop when the validation NLL has not improved by ``tol`` for this many
        evaluations, keeping the best state.
    inducing : "kmeans", "random" or array of shape (m, d)
        Initial inducing points.
    likelihood : None, "probit" or "logistic"
        The EP methods use the probit. "svi" takes either (default probit); the vi-* methods are built on
        the logistic (default, and the only choice for the Jaakkola-Jordan bound).
    n_quadrature : int, default=20
        Gauss-Hermite nodes for SVI's expected log-likelihood and logistic predictions (the multiclass
        predictive uses its own 64, see ``likelihoods.PREDICTIVE_NODES``).
    optimize : True, False or a tuple of "kernel" / "inducing"
        What to learn; the rest stays fixed. ``False`` runs EP to convergence on fixed hyper-parameters.
    dtype : {"float64", "float32"}, default="float64"
        The floating type of every array the model computes with and holds (data converted once on the way
        in; kernels, sites, posterior, optimiser state, predictions). float32 halves memory and is many times
        faster on consumer GPUs; fitted models differ from float64 ones by round-off (test NLL within 0.005
        on the benchmark data sets, ``tests/test_float32.py``).
    block_rows : int or None, default=None
        Rows per block of the passes over all rows (batch EP, GFITC, multiclass, the variational methods, the
        final pass, prediction): their n x m temporaries are a block's (a batch EP pass on several threads
        shares a block's rows among them). ``None``: about 16 MB per n x m
        temporary, and on a GPU no more than fit in half of the device's free memory at the pass's bytes per
        row (``agpc.inference.ep.default_block_rows``). Lower it when a fit or a prediction stops with
        ``agpc.backend.BlockMemoryError`` (a MemoryError naming the block rows it ran out of memory with). On a
        GPU, training data on the host (NumPy) larger than that half of free memory stay on the host and move to
        the device a block at a time (as data on disk do: minibatches are then visited in random order
        rather than the rows reordered).
    jitter : float, default=1e-6
        Added to the diagonal of K(Z, Z). When a factorisation needs more (inducing points that coincide,
        features on very different scales), the jitter is raised and the fit (or prediction) ends with one
        ``agpc.JitterWarning`` (a UserWarning) saying which jitter went from what to what. It is never below
        100 m eps of ``dtype`` (``agpc.backend.jitter_floor``: 1.8e-12 at m = 100 in float64, far below the
        default; 1.2e-3 in float32), under which a factorisation of K(Z, Z) is left to round-off; that floor is
        a rule, not a rescue, and is not warned about. ``jitter_`` is the jitter the fitted model used.
    tol : float, default=1e-6
        With ``optimize=False``, stop when the largest relative site change falls below ``tol``.
    random_state : int, Generator or None
        Seeds the inducing-point initialisation.
    verbose : bool
        Show a progress bar (tqdm) with log Z_q and, with validation data, the validation NLL.
    step_replay : bool, default=False
        Deprecated, no effect; it will be removed. It asked for each minibatch step to be captured into a CUDA
        graph and replayed, which CuPy cannot do for a step that calls cuBLAS or cuSOLVER (it refuses both during
        stream capture), so every step ran eagerly anyway. ``True`` warns (FutureWarning) and fits as ``False``.
    client : distributed.Client or None
        For ``fit`` on a dask.array: the cluster to train on. ``None``: the current client if there is
        one, else a ``LocalCluster`` with one single-threaded worker process per core, started and closed
        by ``fit``.
    local_steps : int or None
        Minibatch training on a dask.array (and with ``n_jobs > 1``) is data-parallel
        (``agpc.inference.data_parallel``): each worker takes minibatch steps on the chunks it holds in rounds,
        the driver combines (SEP: one tied factor per chunk, Li et al. 2015 sec. 4; EP: each chunk keeps its sites;
        SVI: averaged steps). An int: every worker takes this many steps a round, and the rounds are reproducible
        (the same seed gives the same model, also when a worker is lost). ``None``: workers take
        ``data_parallel.DEFAULT_LOCAL_STEPS`` (64) steps a round on average, shared out in proportion to the speed
        each showed in the rounds before, so that a worker whose core is busy with other work does not hold the
        round up; two fits with the same seed may then differ by the timing. Data-parallel rounds are checkpointed
        as any fit (the rounds' record and, for EP, the chunks' site files). ``0`` (dask arrays): the minibatch
        steps run on the driver, the chunks brought to it in turn: one worker's worth of speed, but the very model
        of a single-process fit on the same chunks (same seed); multiclass EP on minibatches needs it.
    n_jobs : int or None, default=None
        Minibatch SEP / EP / ADF / SVI on in-memory NumPy data (or data on disk): train data-parallel in this many
        worker processes on this machine, through the same rounds as on a dask cluster (``local_steps`` as
        there; each worker steps a shard of the rows, SEP / ADF keep one tied factor per chunk of about 25,000
        rows). The rows are written once, shuffled, into a file every worker maps read-only
        (``agpc.workers.SharedRows``), not copied per worker. scikit-learn's meaning: ``None`` is 1 (or the
        ``n_jobs`` of an enclosing ``joblib.parallel_config``), -1 every core this process may use, -2 all but
        one. A data-parallel fit is a model of its own (per-chunk factors, averaged steps): the same seed gives
        another model than ``n_jobs=1``, which is why the default stays 1. Inside a parallel worker (a
        ``GridSearchCV(n_jobs=...)`` worker, a dask task) the fit runs in its own process (``n_jobs_`` says how
        many it used). Batch fits and ``partial_fit`` run in this process (batch passes use the cores through BLAS
        threads). Methods without data-parallel rounds (``agpc.methods``, capability "n_jobs") and multiclass EP
        refuse ``n_jobs > 1``.
    checkpoint_path, checkpoint_every : path and int, or None
        Every method: every ``checkpoint_every`` steps, write the whole training state (hyper-parameters,
        inducing points, sites, factor or q(u), optimiser state, step, RNG state, history) to ``checkpoint_path``,
        atomically. ``fit(X, y, resume=True)`` continues from it and ends at the same model as an
        uninterrupted run. Early stopping's best state is not kept across a resume. On a dask array, batch
        EP's sites are written by the workers into ``<checkpoint_path>.sites/`` (a directory they must share
        with the driver), one file a chunk. The path is checked when ``fit`` starts: writable, and a regular file
        if it exists (not a device, a FIFO, a path under /proc, /sys or /dev, nor the file a memmap or zarr array
        of the training data reads from); ``resume=True`` needs a checkpoint there.
    site_directory : path or None
        Batch EP on a dask.array: keep the sites (two floats a row) in files under this directory, a file
        a chunk, instead of in the workers' memory. Worker memory then stays flat as the rows grow, at the
        cost of reading and writing 16 bytes a row each pass; a lost worker's chunks restart from the last
        pass's files. The driver and every worker must reach the directory (across hosts: a shared file
        system). A subdirectory is made for the fit and removed at its end.
    blas_threads : int or None, default=None
        Threads of the BLAS library (OpenBLAS, MKL, ...) during ``fit``, ``partial_fit`` and prediction.
        ``None``: chosen for the work at hand (``agpc.threads``): one thread for minibatch steps, whose
        small m x m operations a multi-threaded BLAS slows down (46 ms a step with two threads against
        9.9 ms with one, m = 200 on 2 cores), the free cores for batch passes over large row blocks; and a
        limit the caller already set (an environment variable such as ``OPENBLAS_NUM_THREADS``, or an
        enclosing ``threadpoolctl.threadpool_limits``) is left alone. An integer: that many threads for
        everything. Either way no environment variable is set and the caller's setting is restored
        afterwards. On a dask array, the workers' tasks follow the same rule within each worker's budget.
    kernel_prior : "auto" or None, default="auto"
        Weak priors on the kernel's hyper-parameters, so that every method that learns them climbs log Z (or the
        ELBO) plus their log prior density (MAP) instead of log Z alone (type-II maximum likelihood, which
        over-fits on a few hundred rows: docs/small_data_defaults.md). "auto": log lengthscale_j ~
        Normal(log(sqrt(d) s_j), sd sqrt(3)) and log amplitude ~ Normal(0, sd sqrt(3)), nothing on the latent
        noise; the same for every class of a multiclass model and every term of a sum or product kernel; a prior
        the kernel's own parameters carry (``RBF(priors={...})``) is kept instead. ``s_j`` is the standard
        deviation of feature j in the rows the kernel is initialised from (``fit``: all rows, or a sample of
        a large set; ``partial_fit``: the first batch, so a stream and a fit on the same rows centre their
        priors a little differently and end at slightly different models unless ``kernel_prior=None``): the
        classifier does not standardise the inputs, so the prior is placed on the lengthscales in the units of
        the data the kernel sees, centred where the default kernel starts (sqrt(d) s_j); on standardised
        features that is the dimension-scaled prior of Hvarfner, Hellsten & Nardi (2024), and rescaling a
        feature rescales its prior with it. ``None``: no priors but the kernel's own (type-II maximum
        likelihood, as before this parameter existed).

    Attributes
    ----------
    classes_ : ndarray of shape (2,)
    kernel_ : Kernel, the learned kernel
    inducing_points_ : array (m, d), the learned inducing points
    log_marginal_likelihood_ : float, log Z_q at the end of training
    history_ : dict of lists, per iteration (batch) or epoch (minibatch), the same keys for every method:
        "log_marginal_likelihood", "time", "n_invalid_sites", "damping" (NaN where the method has none),
        "n_steps"; with validation data "validation_step", "validation_nll", "validation_error"
    n_iter_ : int
    n_features_in_ : int
    fit_time_ : float, seconds of the whole ``fit`` (what ``max_time`` bounds)
    init_time_ : float, of which choosing the initial inducing points (k-means) took this many seconds
    stopped_by_time_ : bool, training stopped because of ``max_time``
    n_jobs_ : int, the processes a fit on in-memory data (or data on disk) trained in (1: this one; more: worker
        processes, ``n_jobs``)
    jitter_ : float, the jitter on the diagonal of K(Z, Z) of the fitted model: ``jitter``, or what training had
        to raise it to (a ``JitterWarning`` says so)
    kernel_prior_ : "auto" or None, the ``kernel_prior`` the model was trained with (None for a model file written
        before the parameter existed: those models were trained by maximum likelihood)
    tf32_ : bool, float32 matrix products of the fit ran in TF32 on the GPU (``CUPY_TF32=1``; an
        ``agpc.backend.TF32Warning`` said so)
    """

    # Every parameter and what it may be (``agpc.validation``): checked at the start of fit / partial_fit;
    # any one constraint of a list accepts. Cross-parameter rules follow in ``_check_params``.
    _parameter_constraints = {
        "method": [M.MethodName()],  # the registry (agpc.methods), read when the parameters are checked
        "n_inducing": [V.Options("auto", "all"), V.Interval(numbers.Integral, 1, None, "left")],
        "kernel": [V.NONE, V.InstanceOf(Kernel, description="an agpc kernel (e.g. agpc.RBF)")],
        "backend": [V.NONE, V.Options("auto", "numpy", "cupy", ignore_case=True), V.ArrayNamespace()],
        "max_iter": [V.Interval(numbers.Integral, 0, None, "left")],
        "damping": [V.NONE, V.Interval(numbers.Real, 0, 1, "right")],
        "batch_size": [V.NONE, V.Options("auto"), V.Interval(numbers.Integral, 1, None, "left")],
        "optimizer": [V.NONE, V.Options("rprop", "adadelta", "adam")],
        "learning_rate": [V.NONE, V.Interval(numbers.Real, 0, None, "neither")],
        "max_time": [V.NONE, V.Interval(numbers.Real, 0, None, "neither")],
        "shuffle": [V.Boolean()],
        "eval_every": [V.NONE, V.Interval(numbers.Integral, 1, None, "left")],
        "n_iter_no_change": [V.NONE, V.Interval(numbers.Integral, 1, None, "left")],
        "inducing": [V.Options("kmeans", "random"), V.ArrayLike()],
        "likelihood": [V.NONE, M.RegisteredLikelihood()],  # which method takes which: ``_check_params``
        "n_quadrature": [V.Interval(numbers.Integral, 1, None, "left")],
        "optimize": [V.NONE, V.Boolean(), V.Subset(*_OPTIMIZE_GROUPS)],
        "jitter": [V.Interval(numbers.Real, 0, None, "left")],
        "tol": [V.Interval(numbers.Real, 0, None, "left")],
        "random_state": [V.NONE, V.RandomState()],
        "verbose": [V.Boolean(), V.Interval(numbers.Integral, 0, None, "left")],
        "client": [V.NONE, V.HasMethods("compute", "submit", description="a distributed.Client")],
        "local_steps": [V.NONE, V.Interval(numbers.Integral, 0, None, "left")],
        "n_jobs": [V.NONE, V.Interval(numbers.Integral, None, -1, "right"),
                   V.Interval(numbers.Integral, 1, None, "left")],
        "checkpoint_path": [V.NONE, V.PATH],
        "checkpoint_every": [V.NONE, V.Interval(numbers.Integral, 1, None, "left")],
        "site_directory": [V.NONE, V.PATH],
        "blas_threads": [V.NONE, V.Interval(numbers.Integral, 1, None, "left")],
        "dtype": [V.FloatingType(*I.DTYPES)],
        "block_rows": [V.NONE, V.Interval(numbers.Integral, 1, None, "left")],
        "step_replay": [V.Boolean()],
        "kernel_prior": [V.NONE, V.Options("auto")],
    }

    def __init__(
        self,
        method="ep",
        n_inducing="auto",
        kernel=None,
        backend="auto",
        max_iter=250,
        damping=None,
        batch_size="auto",
        optimizer=None,
        learning_rate=None,
        max_time=None,
        shuffle=True,
        eval_every=None,
        n_iter_no_change=None,
        inducing="kmeans",
        likelihood=None,
        n_quadrature=20,
        optimize=True,
        jitter=1e-6,
        tol=1e-6,
        random_state=None,
        verbose=False,
        client=None,
        local_steps=None,
        n_jobs=None,
        checkpoint_path=None,
        checkpoint_every=None,
        site_directory=None,
        blas_threads=None,
        dtype="float64",
        block_rows=None,
        step_replay=False,
        kernel_prior="auto",
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
        self.shuffle = shuffle
        self.eval_every = eval_every
        self.n_iter_no_change = n_iter_no_change
        self.inducing = inducing
        self.likelihood = likelihood
        self.n_quadrature = n_quadrature
        self.optimize = optimize
        self.jitter = jitter
        self.tol = tol
        self.random_state = random_state
        self.verbose = verbose
        self.client = client
        self.local_steps = local_steps
        self.n_jobs = n_jobs
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.site_directory = site_directory
        self.blas_threads = blas_threads
        self.dtype = dtype
        self.block_rows = block_rows
        self.step_replay = step_replay
        self.kernel_prior = kernel_prior

    # -- validation ------------------------------------------------------------------------------

    def _check_params(self):
        V.validate_params(self.get_params(deep=False), self._parameter_constraints, type(self).__name__)
        if self.checkpoint_every is not None and self.checkpoint_path is None:
            raise ValueError("checkpoint_every and resume=True need checkpoint_path (where checkpoints are written and read)")
        spec = M.get_method(self.method)
        if self.n_jobs not in (None, 1) and not spec.supports("n_jobs"):
            raise ValueError(spec.refusal("n_jobs", f"n_jobs > 1 trains the methods "
                                                    f"{list(M.methods_supporting('n_jobs'))} in worker processes, not "
                                                    f"{self.method!r}: use n_jobs=1"))
        if spec.check_params is not None:  # the method's own rules between parameters
            spec.check_params(self.get_params(deep=False))
        if self.likelihood is not None and self.likelihood not in spec.likelihoods:
            takes = " or ".join(repr(name) for name in spec.likelihoods)
            raise ValueError(f"method={self.method!r} {spec.likelihood_reason or 'takes ' + takes}: likelihood must be "
                             f"{takes} or None, got {self.likelihood!r}")
        if self.optimize is True:
            groups = _OPTIMIZE_GROUPS
        elif self.optimize is False or self.optimize is None:
            groups = ()
        else:
            groups = tuple([self.optimize] if isinstance(self.optimize, str) else self.optimize)
        return groups, B.resolve_backend(self.backend)

    # -- fitting ---------------------------------------------------------------------------------

    def _model_size(self, n, n_classes=2, rows_known=True):
        """The inducing points of a fit on ``n`` rows (``agpc.size_rule``): how many, and whether they are the
        training rows themselves, held there (the exact model). An array of initial points sets m itself."""
        explicit = not isinstance(self.inducing, str)
        if explicit:
            size = size_rule.ModelSize(len(self.inducing), False)
        else:
            size = size_rule.model_size(self.n_inducing, n, rows_known=rows_known, n_classes=n_classes,
                                        has_exact_pass=self._exact_passes(n) is not None)
        if size.n_inducing > n:
            what = f"{size.n_inducing} initial inducing points" if explicit else f"n_inducing={size.n_inducing}"
            raise ValueError(f"{what} exceeds the number of training rows ({n}): use at most one inducing point per row")
        return size

    def _n_inducing_for(self, n, rows_known=True):
        return self._model_size(n, rows_known=rows_known).n_inducing

    def _exact_passes(self, n):
        """The method's full-GP passes for the exact model of ``n`` rows (``Method.exact_passes``, any number of
        classes), where its fit runs batch passes over them; else None."""
        if self._batch_size_for(n) is not None and self._batch_size_for(n) < n:
            return None
        return M.get_method(self.method).exact_passes

    def _initial_model(self, sample, m, rng, n_classes=2, rows=None):
        """Initial kernel and inducing points; with more than two classes, one copy of each per class
        (Villacampa-Calvo & Hernandez-Lobato (2017): one latent function per class, each with its own hyper-parameters
        and inducing points). ``rows``: the training rows, to be the inducing points themselves (the exact model)."""
        kernel = self.kernel if self.kernel is not None else self._default_kernel(sample)
        if self.kernel_prior == "auto":  # centred on the default kernel's lengthscales (docs/small_data_defaults.md)
            kernel = with_default_priors(kernel, kernel if self.kernel is None else self._default_kernel(sample))
        kernel = kernel.for_inputs(sample)
        if rows is not None:
            Z = B.array_namespace(rows).asarray(rows, copy=True)
        else:
            Z = initial_inducing_points(sample, m, self.inducing, random_state=rng)
        if n_classes > 2:
            xp = B.array_namespace(Z)
            return ClassKernels([kernel] * n_classes), xp.stack([Z] * n_classes)
        return kernel, Z

    def _set_fitted(self, kernel, Z, posterior, log_z, history, n_iter, jitter):
        self.tf32_ = bool(getattr(self, "tf32_", False))  # (set by _note_tf32 before training; a loaded model: False)
        self.jitter_ = jitter
        self.kernel_prior_ = self.kernel_prior
        self.kernel_ = kernel
        self.inducing_points_ = Z
        self.posterior_ = posterior
        self.log_marginal_likelihood_ = log_z
        self.history_ = history
        self.n_iter_ = n_iter
        self._fitted_structure = S.structure(self)  # what partial_fit may continue (``streaming.check_continuable``)

    def _blas_scope(self, X):
        """The BLAS thread scope (``agpc.threads.blas_threads``) for a fit on ``X``, shaped by the work of its
        main phase: minibatch steps, or batch passes over all rows (the parameters are checked already)."""
        shape = getattr(X, "shape", None)
        if shape is None:  # lists and array-likes (the scope only needs the shape; X is validated inside)
            try:
                shape = np.asarray(X).shape
            except (TypeError, ValueError):
                shape = ()
        n = int(shape[0]) if len(shape) else 1
        d = int(shape[1]) if len(shape) > 1 else 1
        # (the classes are not known before the labels are checked: sized as for two, the size rule's exact case)
        m = max(1, len(self.inducing)) if not isinstance(self.inducing, str) else size_rule.model_size(
            self.n_inducing, n, has_exact_pass=self._exact_passes(n) is not None).n_inducing
        batch_size = self._batch_size_for(n)  # (a batch-only method's explicit batch_size is refused already)
        rows = n if batch_size is None else min(n, int(batch_size))
        return threads.blas_threads(rows, m, n_features=d, threads=self.blas_threads)

    def fit(self, X, y, validation_data=None, resume=False):
        """Fit the classifier.

        Parameters
        ----------
        X : array of shape (n_samples, n_features)
            NumPy, any array-API array, or data on disk read a block at a time (a NumPy memmap, a zarr
            array): then neither X nor the labels are ever held in memory whole.
        y : array of shape (n_samples,), two distinct labels of any type
        validation_data : (X_val, y_val) or None
            Scored every ``eval_every`` steps into ``history_`` ("validation_nll", "validation_error");
            with ``n_iter_no_change``, training stops early and keeps the best state.
        resume : bool
            Continue from ``checkpoint_path`` (written by an earlier ``fit`` of the same data and settings).

        Returns
        -------
        self
        """
        started = time.perf_counter()  # max_time covers the whole fit, from here
        self._check_params()  # before anything reads them (the BLAS scope reads n_inducing and batch_size)
        I.check_known_shapes(X, y)  # (the BLAS scope counts the rows)
        self._warn_step_replay()
        with self._blas_scope(X), B.jitter_report("GPClassifier.fit"):
            return self._fit(X, y, validation_data, resume, started)

    def _fit(self, X, y, validation_data, resume, started):
        groups, target_xp = self._check_params()
        if resume and self.checkpoint_path is None:
            raise ValueError("checkpoint_every and resume=True need checkpoint_path (where checkpoints are written and read)")
        if resume:
            check_resume_path(self.checkpoint_path)
        if self.checkpoint_every is not None:  # before any work: a bad path must not cost the fit
            check_checkpoint_path(self.checkpoint_path, inputs=I.data_files(X, y))
        elif self.checkpoint_path is not None and not resume:  # a path alone writes nothing (a resume reads it)
            warnings.warn(f"checkpoint_path={str(self.checkpoint_path)!r} is set without checkpoint_every: no "
                          "checkpoint will be written (set checkpoint_every, a number of steps)", UserWarning,
                          stacklevel=3)
        if self.site_directory is not None:
            check_site_directory(self.site_directory)
        if B.is_dask_array(X):
            return self._fit_dask(X, y, groups, resume, validation_data, started)
        self.__dict__.pop("_trainer", None)
        Xc, y_pm, classes, sample, xp, device = I.training_inputs(self, X, y, reset=True, target_xp=target_xp)
        n = Xc.shape[0]
        size = self._model_size(n, len(classes), rows_known=not B.is_out_of_core(Xc))
        if size.at_rows:  # the exact model's inducing points are its rows: they stay there
            groups = tuple(group for group in groups if group != "inducing")
        self.n_jobs_ = self._n_jobs_for(xp, n, len(classes))
        if self.n_jobs_ > 1:
            return self._fit_local_workers(Xc, y_pm, classes, sample, size, groups, resume, validation_data, started)
        rng = B.host_rng(self.random_state)
        init_started = time.perf_counter()
        kernel, Z = self._initial_model(sample, size.n_inducing, rng, len(classes), rows=Xc if size.at_rows else None)
        exact = self._exact_passes(n) if size.at_rows else None
        self.init_time_ = time.perf_counter() - init_started
        validation = None if validation_data is None else I.validation_set(self, validation_data, classes, xp, device)
        t0 = started
        data_hash = None
        if self.checkpoint_path is not None:  # the run's fingerprint holds the data's: resume on them only
            stride = training.fingerprint_stride(n)
            data_hash = training.data_fingerprint(n, Xc.shape[1], Xc[0:n:stride, :], y_pm[0:n:stride], classes)
        self._note_tf32(xp)
        batch_size = self._batch_size_for(n, xp, Z, len(classes))
        result = self._train(Xc, y_pm, kernel, Z, classes, groups, batch_size, rng, resume,
                             validation=validation, started=started, data_hash=data_hash,
                             block_rows=self._gpu_block_rows(n, xp, batch_size), engine=exact)
        return self._fitted_from(result, classes, t0, n, resumed=bool(resume))

    def _n_jobs_for(self, xp, n, n_classes):
        """The processes a fit of n rows trains in (``n_jobs``): more than one only for minibatches of a method with
        data-parallel rounds, on NumPy data; an ``n_jobs > 1`` the fit cannot use is refused when it was given, and
        gives 1 when it came from an enclosing ``joblib.parallel_config``."""
        count, _ = W.resolve_n_jobs(self.n_jobs)
        batch_size = self._batch_size_for(n)
        spec = M.get_method(self.method)  # (a method without rounds and n_jobs given: refused by _check_params)
        if count == 1 or not spec.supports("n_jobs") or batch_size is None or batch_size >= n:
            return 1  # (batch passes use the cores through BLAS threads)
        why = None
        if refusal(spec.engine, n_classes) is not None:
            why = f"{refusal(spec.engine, n_classes)}: train multiclass {self.method!r} with n_jobs=1"
        elif not B.is_numpy_namespace(xp):
            why = (f"n_jobs > 1 trains NumPy data in worker processes on this machine, not {xp.__name__} arrays: "
                   "use n_jobs=1 (or backend='numpy')")
        if why is None:
            return count
        if self.n_jobs is not None:
            raise ValueError(why)
        return 1

    def _fit_local_workers(self, X, y, classes, sample, size, groups, resume, validation_data, started):
        """``_fit`` in ``n_jobs_`` local worker processes: the same data-parallel rounds as on a dask cluster
        (``data_parallel.DataParallel`` on a ``workers.LocalWorkers`` pool), the rows written once, shuffled, into
        ``workers.SharedRows`` the workers map. The workers start first and import agpc while this process places
        the inducing points; every worker is ended, and the rows' file removed, however the fit ends."""
        pool = W.LocalWorkers(self.n_jobs_, preload=("agpc.inference.data_parallel",))
        shared = []
        engine = None
        try:
            n = X.shape[0]
            rng = B.host_rng(self.random_state)
            init_started = time.perf_counter()
            kernel, Z = self._initial_model(sample, size.n_inducing, rng, len(classes), rows=X if size.at_rows else None)
            self.init_time_ = time.perf_counter() - init_started
            xp = B.array_namespace(Z)
            validation = None if validation_data is None else I.validation_set(self, validation_data, classes, xp,
                                                                                 None)
            data_hash = None
            if self.checkpoint_path is not None:  # as ``_fit``'s, of the rows in the caller's order
                stride = training.fingerprint_stride(n)
                data_hash = training.data_fingerprint(n, X.shape[1], B.to_numpy(X[0:n:stride, :]),
                                                      B.to_numpy(y[0:n:stride]), classes)
            seed = int(rng.integers(2**62))
            order = rng.permutation(n) if self.shuffle and not B.is_out_of_core(X) else None
            shared = W.share_rows([X, y], _local_chunk_rows(n, self.n_jobs_), order=order, dtypes=[Z.dtype, Z.dtype])
            engine = DataParallel(pool, *shared, batch_size=self._batch_size_for(n), local_steps=self.local_steps,
                                  seed=seed, site_directory=self.site_directory)
            rows = RowsOnWorkers(X.shape, Z.dtype), RowsOnWorkers((n,), Z.dtype)
            result = self._train(*rows, kernel, Z, classes, groups, engine.rows_per_round, rng, resume,
                                 validation=validation, engine=engine, started=started, data_hash=data_hash)
        finally:
            pool.close()
            if engine is not None:
                engine.close()
            for rows_file in shared:
                rows_file.close()
        return self._fitted_from(result, classes, started, n, resumed=bool(resume))

    def _train(self, X, y, kernel, Z, classes, groups, batch_size, rng, resume, validation=None, engine=None,
               started=None, data_hash=None, block_rows=None):
        """The one training loop (``training.train``) with this estimator's settings for its method: its engine
        (``engine``: where the passes run, ``exact_ep`` or a ``DaskPasses``, or a ``DataParallel`` whose rounds
        are the steps) and the loop's settings and hooks, built here and only here."""
        spec = M.get_method(self.method)
        self.likelihood_ = spec.likelihood_for(self.likelihood, len(classes))
        settings = training.TrainSettings(
            batch_size=batch_size, max_iter=int(self.max_iter), tol=float(self.tol), max_time=self.max_time,
            random_state=rng, shuffle=bool(self.shuffle), eval_every=self.eval_every,
            n_iter_no_change=self.n_iter_no_change, progress=bool(self.verbose), checkpoint_path=self.checkpoint_path,
            checkpoint_every=self.checkpoint_every, resume=bool(resume), started=started, data_hash=data_hash,
        )
        options = training.EngineOptions(
            jitter=self._jitter_for(Z), optimize=groups, block_rows=self.block_rows if block_rows is None else block_rows,
            damping=None if self.damping is None else float(self.damping), optimizer=self.optimizer,
            learning_rate=self.learning_rate, likelihood=None if len(classes) > 2 else self.likelihood_,
            n_quadrature=int(self.n_quadrature), tol=float(self.tol),
        )
        settings, options = training.with_overrides(settings, options,
                                                    spec.training_settings(self.get_params(deep=False), len(classes)))
        n = X.shape[0]
        if isinstance(engine, DataParallel):
            built = engine.round_engine(spec.engine_factory, spec.engine_name, kernel, Z, n_total=n, options=options)
        else:
            built = spec.make_engine(kernel, Z, n_total=n, minibatch=settings.minibatch(n), options=options,
                                     passes=engine)
        return training.train(X, y, built, settings, training.standard_hooks(settings, validation))

    def _jitter_for(self, Z):
        """``jitter``, raised to ``backend.jitter_floor`` for the model's type and number of inducing points
        (a change only for float32, where 1e-6 is below what round-off lets a Cholesky factor resolve)."""
        return max(float(self.jitter), B.jitter_floor(Z))

    def _batch_size_for(self, n, xp=None, Z=None, n_classes=2):
        """Rows a step: ``batch_size``, or for "auto" the full batch up to 20,000 rows, else 200, or on a GPU
        (``xp`` and the initial inducing points ``Z`` given, a binary model) ``_gpu_batch_rows``."""
        if self.batch_size == "auto":
            if n <= _FULL_BATCH_MAX_ROWS or not M.supports(self.method, "minibatch"):
                return None
            rows = self._gpu_batch_rows(n, xp, Z) if (xp is not None and Z is not None and n_classes == 2) else None
            return 200 if rows is None else rows
        return self.batch_size

    def _gpu_batch_rows(self, n, xp, Z):
        """The GPU's minibatch for n rows (None off a GPU): ``backend.launch_bound_rows`` with ``GPU_STEP_MODEL``
        and the device's throughput for the model's type, at most n / 8 rows and what fits in one row block
        (``ep.block_bytes_per_row``) in ``backend.DEVICE_MEMORY_FRACTION`` of the free memory (docs/gpu.md)."""
        throughput = B.device_throughput(xp, Z.dtype, B.array_device(Z))
        if throughput is None:
            return None
        m, d, itemsize = Z.shape[-2], Z.shape[-1], xp.finfo(Z.dtype).bits // 8
        largest = n // _GPU_STEPS_PER_EPOCH
        fit = B.rows_within_memory(ep.block_bytes_per_row(m, d, itemsize), xp, B.array_device(Z))
        if fit is not None:
            largest = min(largest, fit)
        model = GPU_STEP_MODEL.get(self.method, _EP_STEP)
        return B.launch_bound_rows(
            throughput, launches=model["launches"], block_launches=model["block_launches"], block_rows=largest,
            flops_per_row=model["flops_per_row_m2"] * m * m, bytes_per_row=model["elements_per_row_m"] * m * itemsize,
            largest=largest)

    def _gpu_block_rows(self, n, xp, batch_size):
        """Row blocks of a GPU minibatch chosen by "auto": the whole minibatch (it was sized to fit in memory), so
        that a step launches its kernels once; None (the estimator's ``block_rows``) otherwise."""
        if (self.batch_size != "auto" or self.block_rows is not None or batch_size is None
                or B.device_throughput(xp, xp.float64) is None):
            return None
        return batch_size

    def _warn_step_replay(self):
        if self.step_replay:
            warnings.warn("step_replay is deprecated and has no effect (it will be removed): CuPy refuses cuBLAS and "
                          "cuSOLVER calls during CUDA-graph capture, so a training step cannot be replayed from a "
                          "graph; every step runs eagerly", FutureWarning, stacklevel=3)

    def _note_tf32(self, xp):
        """``tf32_``: whether the float32 products of this fit run in TF32 (``backend.uses_tf32``), said once a fit
        by a ``backend.TF32Warning``."""
        self.tf32_ = B.uses_tf32(xp, I.dtype_name(self.dtype))
        if self.tf32_:
            warnings.warn("float32 products on the GPU run in TF32 (CUPY_TF32 is set): about 3 significant digits "
                          "per product instead of 7, so this fit differs from NumPy's float32 by far more than "
                          "round-off; unset CUPY_TF32 before CuPy's first float32 product for float32 accuracy",
                          B.TF32Warning, stacklevel=4)

    def _fitted_from(self, result, classes, t0, n_rows, resumed=False):
        """Fitted attributes from a ``training.TrainResult`` of a fit on ``n_rows`` rows."""
        self._rows_seen = n_rows  # the rows the model stands for, should partial_fit continue it
        self.fit_time_ = time.perf_counter() - t0
        self.classes_ = classes
        self._set_fitted(result.kernel, result.Z, result.posterior, result.log_z, result.history, result.n_iter,
                         result.jitter)
        self.stopped_by_time_ = result.stopped_by_time
        self.early_stopped_ = result.early_stopped
        if self.checkpoint_every is not None and result.checkpoints_written == 0 and not resumed:
            # (a resumed fit that ends before its next checkpoint leaves the one it resumed from)
            warnings.warn(f"no checkpoint was written to {str(self.checkpoint_path)!r}: the fit ended before its "
                          f"first checkpoint (checkpoint_every={self.checkpoint_every} steps is more than it took)", UserWarning, stacklevel=4)
        return self

    def _fit_dask(self, X, y, groups, resume, validation_data=None, started=None):
        """The methods that train on a dask array (``agpc.methods``: EP / SEP / ADF / SVI, vi-JJ and vi-Taylor in
        batch passes) on a dask.array of rows. Batch: one task per chunk each pass (``DaskEngine``), EP's
        sites persisted on the workers. Minibatch: data-parallel rounds (``data_parallel.DataParallel``), or with
        ``local_steps=0`` chunks visited in random order, one at a time on the driver (``ChunkedRows``). X is not
        persisted here: persist it first if it fits in the workers' memory (faster passes); otherwise each pass reads it
        from where it lives (e.g. zarr)."""
        import dask.array as da

        self.tf32_ = False  # (the workers compute on NumPy)
        spec = M.get_method(self.method)
        if not spec.supports("dask"):
            raise ValueError(spec.refusal("dask", f"fit on a dask array trains the methods "
                                                  f"{list(M.methods_supporting('dask'))}, not {self.method!r}"))
        if self.checkpoint_path is not None and not spec.supports("dask_checkpoints"):
            raise ValueError(spec.refusal("dask_checkpoints", f"checkpoints of {self.method!r} on a dask array are "
                                                              "not supported: fit without checkpoint_path"))
        if X.ndim != 2:
            raise ValueError(f"Expected 2D array, got {X.ndim}D array instead")
        batch_size = self._batch_size_for(X.shape[0])
        if batch_size is not None and batch_size < X.shape[0] and not spec.supports("minibatch"):
            # before any pass over the data (in memory the engine says the same when it is made)
            raise ValueError(spec.refusal("minibatch", f"method {self.method!r} is batch-only: every step needs all "
                                                       "the rows (batch_size=None)"))
        X = da.asarray(X).astype(I.dtype_name(self.dtype)).rechunk({1: -1})  # chunks by rows only
        y = da.asarray(y)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has shape {tuple(y.shape)}: y must be 1-D and match")
        y = y.rechunk((X.chunks[0],))
        owned = engine = None
        client = self.client
        if client is None:
            from distributed import Client, get_client

            try:
                client = get_client()
            except ValueError:  # no client yet: a local cluster for this fit
                client = owned = Client(local_cluster(os.cpu_count() or 1))
        try:
            n = X.shape[0]
            rng = B.host_rng(self.random_state)
            # the initial sample (as the in-memory path: all rows up to INIT_SAMPLE, no draw: same seed, same model),
            # the checks and the fingerprint's rows in one pass over the chunks
            rows = None if n <= I.INIT_SAMPLE else np.sort(rng.choice(n, size=I.INIT_SAMPLE, replace=False))
            stride = training.fingerprint_stride(n)
            sampled = [X[::stride], y[::stride]] if self.checkpoint_path is not None else []
            blocks = (persisted_blocks(X), persisted_blocks(y)) if not sampled else (None, None)
            finite_chunks, sample_rows = [], []  # (persisted rows: whether each chunk is finite, while k-means runs)
            if None not in blocks:
                sample, labels, finite_chunks = _persisted_inputs(client, *blocks, B.row_chunk_bounds(X), rows)
                finite = np.isfinite(sample).all()
            else:
                finite, labels, sample, *sample_rows = client.compute(
                    [da.isfinite(X).all(), da.unique(y), X if rows is None else X[rows], *sampled], sync=True)
            if not bool(finite):
                raise ValueError("Input X contains NaN or infinity")
            # every worker imports agpc now, while this process places the inducing points (before the checks' pass,
            # the pass would wait for the imports on single-threaded workers)
            # (rows persisted on the cluster: the rounds' tasks take their chunks as they are, and the labels are
            # encoded once, below, by a task of this package's: the workers then need no dask.array)
            warming = [client.submit(prepare_worker, () if blocks[0] is not None else ("dask.array",), workers=[w],
                                     pure=False) for w in client.nthreads()]
            classes = I.check_classes(self, np.unique(V.check_labels(np.asarray(labels), what="y (its distinct values)")))
            data_hash = None if not sample_rows else training.data_fingerprint(
                n, X.shape[1], sample_rows[0], V.encode_labels(np.asarray(sample_rows[1]), classes), classes)
            y_pm = y.map_blocks(V.encode_labels, classes, dtype=np.float64).astype(X.dtype)
            self.n_features_in_ = X.shape[1]
            m = self._n_inducing_for(n, rows_known=False)
            init_started = time.perf_counter()
            kernel, Z = self._initial_model(np.asarray(sample), m, rng, len(classes))
            self.init_time_ = time.perf_counter() - init_started
            if not all(client.gather(finite_chunks)):
                raise ValueError("Input X contains NaN or infinity")
            if validation_data is not None:  # scored on the driver: brought there whole (keep it small)
                validation_data = tuple(client.compute(list(validation_data), sync=True)
                                        if any(B.is_dask_array(v) for v in validation_data) else validation_data)
            validation = None if validation_data is None else I.validation_set(
                self, validation_data, classes, B.array_namespace(Z), None)
            batch_size = self._batch_size_for(n)
            minibatch = batch_size is not None and batch_size < n
            if minibatch and self.local_steps != 0:  # data-parallel rounds: the rows stay on the workers
                if blocks[0] is not None:  # (X persisted: the labels too, encoded, n floats on the workers)
                    y_pm = client.persist(y_pm)
                engine = DataParallel(client, X, y_pm, batch_size=batch_size, local_steps=self.local_steps,
                                      seed=int(rng.integers(2**62)), site_directory=self.site_directory)
                X, y_pm = RowsOnWorkers(X.shape, X.dtype), RowsOnWorkers(y_pm.shape, y_pm.dtype)
                batch_size = engine.rows_per_round
            elif minibatch:  # minibatches: chunks come to the driver in turn
                X, y_pm = ChunkedRows(X, client), ChunkedRows(y_pm, client)
            elif not spec.supports("dask_batch"):
                raise ValueError(f"{self.method} on a dask array trains on minibatches (batch_size below the number of rows): "
                                 "a full-batch step would bring every row to the driver")
            else:
                engine = DaskEngine(client, X.chunks[0], site_directory=self.site_directory)
            t0 = time.perf_counter() if started is None else started  # max_time and fit_time_: the whole fit
            # SVI: a step per minibatch on the driver, chunks visited as for SEP
            result = self._train(X, y_pm, kernel, Z, classes, groups, batch_size, rng, resume, validation=validation,
                                 engine=engine, started=t0, data_hash=data_hash)
            del warming
        finally:
            if engine is not None:
                engine.close()
            if owned is not None:
                cluster = owned.cluster
                owned.close()
                cluster.close()
        return self._fitted_from(result, classes, t0, n, resumed=bool(resume))

    @available_if(lambda self: M.supports(self.method, "partial_fit"))
    def partial_fit(self, X, y, classes=None, n_total=None):
        """Update the model with one more minibatch (a stream): one damped site update and one
        stochastic gradient step on these rows (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 6).

        Only the tied-factor methods ("sep", "adf") can learn from a stream, so the method exists only for
        them: EP keeps a site for every row and needs to see the rows again. The first call sets the classes (from
        ``classes`` or from this batch), the kernel and the inducing points (from this batch).

        On a fitted model (by ``partial_fit``, ``fit`` or ``load``) it continues, as scikit-learn's
        ``partial_fit`` does: from q, the kernel, the inducing points and the step count (``n_iter_`` goes
        on). A model fitted by ``fit`` or loaded from a file starts a new stream trainer from its fitted
        state: SEP's tied factor read back from q, the optimiser's moments (Adam, Adadelta) fresh, as a model
        file does not hold them, and damping as configured (a stream model saved and loaded thus continues
        a little differently from the one kept in memory). A file of a model fitted by ``fit`` does not
        hold its number of rows: the first call after loading it asks for ``n_total``. Refused with one ValueError, the
        model left as it was: a model of another method (per-row EP, GFITC, SVI, ``vi-*``), ``classes`` other than
        ``classes_``, and ``method``, ``dtype``, ``n_inducing``, ``kernel``, ``likelihood`` or ``kernel_prior`` changed since the fit
        (call ``fit`` to start again). ``n_total`` is the number of
        rows the model stands for (SEP's cavity q / f^(1/n)), a positive integer at least this batch's rows;
        by default the rows seen so far. It may be below the rows seen: a data set streamed for several
        epochs stands for its own size. ``checkpoint_path`` / ``checkpoint_every`` do not apply (a stream model
        is saved with :meth:`save`, or pickled, between calls): set, they are warned about once.
        """
        self._check_params()
        self._warn_step_replay()
        if (self.checkpoint_path is not None or self.checkpoint_every is not None) and not hasattr(self, "_trainer"):
            warnings.warn("partial_fit writes no checkpoints (checkpoint_path / checkpoint_every apply to fit); save "
                          "a stream model with save() or pickle it between calls", UserWarning, stacklevel=2)
        with self._blas_scope(X), B.jitter_report("GPClassifier.partial_fit"):
            return self._partial_fit(X, y, classes, n_total)

    def _partial_fit(self, X, y, classes, n_total):
        groups, target_xp = self._check_params()
        live = hasattr(self, "_trainer")
        fitted = live or hasattr(self, "posterior_")
        if fitted:  # before any change to the model: a refused call leaves it as it was
            S.check_continuable(self, getattr(self, "_fitted_structure", None) or S.structure(self), classes)
        Xc, y_pm, classes, sample, xp, device = I.training_inputs(
            self, X, y, reset=not fitted, target_xp=target_xp, classes=self.classes_ if fitted else classes
        )
        rows = Xc.shape[0]
        I.check_n_total(n_total, rows)
        if not live:
            self._note_tf32(xp)
        if not fitted:
            self.classes_ = classes
            rng = B.host_rng(self.random_state)
            kernel, Z = self._initial_model(sample, self._n_inducing_for(rows, rows_known=False), rng, len(classes))
            self._rows_seen = 0
            self._trainer = S.stream_trainer(self, kernel, Z, n_total or rows, groups, self._jitter_for(Z))
        elif not live:  # fit records its rows on the model, partial_fit in the history
            self._trainer, self._rows_seen = S.trainer_from_fitted(self, groups, n_total, rows,
                                                                   getattr(self, "_rows_seen", None))
        trainer = self._trainer
        self._rows_seen += rows
        trainer.n_total = n_total or self._rows_seen
        post, log_z = S.step(trainer, Xc, y_pm, self._rows_seen)
        state = trainer.state
        self.likelihood_ = M.get_method(self.method).likelihood_for(self.likelihood, len(self.classes_))
        self._set_fitted(state["kernel"], state["Z"], post, log_z, trainer.history, trainer.n_steps,
                         trainer.engine.jitter)
        return self

    @staticmethod
    def _default_kernel(X):
        """RBF with lengthscales sqrt(d) times each column's standard deviation (1 for a constant column).
        The deviations are taken without overflow or underflow (``validation.column_scales``), so that the
        lengthscales follow features on any scale (X * 1e-300 or X * 1e154 in float64): ``xp.std`` gave 0 or
        inf there, a chance-level model or an error about infinite lengthscales."""
        d = X.shape[1]
        std, _ = V.column_scales(X)
        std = np.where(std > 0, std, 1.0)
        lengthscales = std * math.sqrt(d)
        limits = B.array_namespace(X).finfo(X.dtype)
        tiny, huge = float(limits.smallest_normal), float(limits.max)
        if not np.all((lengthscales >= tiny) & (lengthscales <= huge)):
            bad = np.flatnonzero(~((lengthscales >= tiny) & (lengthscales <= huge)))
            raise ValueError(
                f"features {bad.tolist()} have standard deviations {std[bad].tolist()}: the default kernel's "
                f"lengthscales (sqrt(d) = {math.sqrt(d):.3g} times them) are not representable in {X.dtype}; "
                "standardise the features (e.g. sklearn's StandardScaler)"
            )
        return RBF(lengthscales=list(lengthscales), amplitude=1.0, noise=1e-3)

    # -- prediction ------------------------------------------------------------------------------

    def _prepare(self, X):
        check_is_fitted(self, "posterior_")
        if B.is_out_of_core(X):  # predicted a block at a time; results are NumPy arrays
            I.check_out_of_core(self, X, reset=False)
            return X, None, None
        X, in_xp = I.check_features(self, X, reset=False)
        xp = B.array_namespace(self.inducing_points_)
        device = B.array_device(self.inducing_points_)
        if in_xp is None and I.stays_on_host(X, xp, device):  # predicted a block at a time, as data on disk
            return B.HostRows(X), None, None
        # the fitted model's own type (a model loaded from a file keeps the type it was saved in)
        Xc = B.asarray_like(X, xp, device=device, dtype=self.inducing_points_.dtype)
        return Xc, in_xp, (B.array_device(X) if in_xp is not None else None)

    @property
    def _multiclass(self):
        check_is_fitted(self, "posterior_")
        return len(self.classes_) > 2

    def _latent(self, Xc):
        """The latent's mean and variance at checked rows (``agpc.prediction.latent``); a raised jitter is warned
        about at the caller of the public ``predict_*`` that called this."""
        with B.jitter_report("GPClassifier prediction", stacklevel=5):
            return P.latent(self.kernel_, self.inducing_points_, self.posterior_, Xc, blas_threads=self.blas_threads,
                            block_rows=getattr(self, "block_rows", None))  # (None in models pickled before it existed)

    def predict_latent(self, X):
        """Mean and variance of the latent f at X (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 36): each of shape
        (n_samples,) for a binary model, (n_samples, n_classes) for a multiclass one (column c: the GP of
        ``classes_[c]``).

        The variance includes the kernel's latent noise (the model's f at a data point).
        """
        Xc, in_xp, device = self._prepare(X)
        mean, var = self._latent(Xc)
        return P.to_caller(mean, in_xp, device), P.to_caller(var, in_xp, device)

    def _log_proba_matrix(self, X):
        """(log p(classes_[c] | x) as an (n, C) array, input namespace, device)."""
        Xc, in_xp, device = self._prepare(X)
        mean, var = self._latent(Xc)
        return P.log_proba(mean, var, self.likelihood_, self.n_quadrature, self._multiclass), in_xp, device

    def predict_log_proba(self, X):
        """log p(y | x) for every class (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 37; Gauss-Hermite for the
        logistic likelihood and for the multiclass model, Villacampa-Calvo & Hernandez-Lobato (2017), eq. 11), shape
        (n_samples, n_classes), columns in the order of ``classes_``. A dask.array in gives a dask.array out (lazy,
        chunk by chunk)."""
        if B.is_dask_array(X):
            return P.lazy(self, "predict_log_proba", X, len(self.classes_), np.dtype(I.dtype_name(self.dtype)))
        log_p, in_xp, device = self._log_proba_matrix(X)
        return P.to_caller(log_p, in_xp, device)

    def predict_proba(self, X):
        """p(y | x) for every class, shape (n_samples, n_classes), columns in the order of ``classes_``;
        rows sum to one. A dask.array in gives a dask.array out (lazy, chunk by chunk)."""
        if B.is_dask_array(X):
            return P.lazy(self, "predict_proba", X, len(self.classes_), np.dtype(I.dtype_name(self.dtype)))
        log_p, in_xp, device = self._log_proba_matrix(X)
        return P.to_caller(B.array_namespace(log_p).exp(log_p), in_xp, device)

    def decision_function(self, X):
        """Binary: the predictive log-odds log p(classes_[1] | x) - log p(classes_[0] | x), shape
        (n_samples,); positive favours ``classes_[1]``. It ranks rows exactly as ``predict_proba`` does (the
        latent mean alone does not, since the predictive variance differs from row to row).
        Multiclass: the log-probabilities, shape (n_samples, n_classes)."""
        log_p, in_xp, device = self._log_proba_matrix(X)
        if self._multiclass:
            return P.to_caller(log_p, in_xp, device)
        return P.to_caller(log_p[:, 1] - log_p[:, 0], in_xp, device)

    def predict(self, X):
        """Most probable class label for each row (a lazy dask.array for a dask.array)."""
        if B.is_dask_array(X):
            return P.lazy(self, "predict", X, None, np.asarray(self.classes_).dtype)
        if self._multiclass:
            log_p, in_xp, device = self._log_proba_matrix(X)
            index = B.to_numpy(B.array_namespace(log_p).argmax(log_p, axis=1))
        else:
            Xc, in_xp, device = self._prepare(X)
            mean, _ = self._latent(Xc)
            index = B.to_numpy(mean > 0).astype(np.intp)
        labels = self.classes_[index]
        if in_xp is None or labels.dtype.kind not in "biuf":
            return labels
        return B.asarray_like(labels, in_xp, device=device)

    def score(self, X, y):
        """Mean accuracy on (X, y)."""
        predicted = B.to_numpy(self.predict(X))
        y = B.to_numpy(y) if B.is_array_api_obj(y) else np.asarray(y)
        return float(np.mean(predicted == y))

    # -- persistence -----------------------------------------------------------------------------
    # A model file (agpc.model_file) holds the parameters and the fitted state; these public methods are all
    # the format uses of the estimator (agpc.persistence.save_model / load_model are the documented entry points).

    def __setstate__(self, state):
        """Unpickling: a model pickled by an agpc without a parameter of ``model_file.VALUE_WHEN_ABSENT`` was
        trained as that value says (kernel_prior: no priors), so it predicts, continues a stream and refits as it
        would have."""
        state = dict(state)
        for name, value in VALUE_WHEN_ABSENT.items():
            state.setdefault(name, value)
            if "kernel_" in state:  # fitted
                state.setdefault(name + "_", value)
        if isinstance(state.get("_fitted_structure"), dict):
            state["_fitted_structure"] = {**VALUE_WHEN_ABSENT, **state["_fitted_structure"]}
        super().__setstate__(state)

    def check_params(self):
        """Refuse (one ValueError naming the parameter) parameters that ``fit`` would refuse, without fitting:
        the parameter table (``agpc.validation``) and the rules between parameters."""
        self._check_params()

    def fitted_state(self):
        """What the fitted model is beyond its parameters: an ``agpc.model_file.FittedState`` (what
        prediction needs, and what the fit reported). Raises NotFittedError before ``fit``."""
        check_is_fitted(self, "posterior_")
        return FittedState(
            kernel=self.kernel_, inducing_points=self.inducing_points_, posterior=self.posterior_,
            classes=self.classes_, n_features_in=self.n_features_in_,
            feature_names_in=getattr(self, "feature_names_in_", None),
            log_marginal_likelihood=self.log_marginal_likelihood_, n_iter=self.n_iter_,
            jitter=getattr(self, "jitter_", self.jitter), likelihood=self.likelihood_, history=self.history_,
        )

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
        self._set_fitted(state.kernel, state.inducing_points, state.posterior, state.log_marginal_likelihood,
                         state.history, state.n_iter, state.jitter)
        return self

    def save(self, path):
        """Save the fitted model as data (npz + JSON, plain data only) to ``path``, a file name (written
        atomically) or a binary file object. See :mod:`agpc.model_file`; ``agpc.save_model`` is the same."""
        write_model_file(path, self)

    @classmethod
    def load(cls, path, backend="numpy"):
        """Load a model saved by :meth:`save` from a file name or a binary file object; arrays go to
        ``backend`` (default NumPy). Every field is checked (:mod:`agpc.model_file`); a file is never executed.
        ``agpc.load_model`` is the same."""
        return read_model_file(path, cls, backend=backend)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = M.supports(self.method, "multiclass")
        tags.classifier_tags.poor_score = True
        return tags


# Rows per chunk of a fit in local worker processes (``n_jobs``): the dask protocol's chunks (the 200,000-row check
# wraps its rows in chunks of 25,000), each chunk one tied factor of SEP / ADF and the unit a shard visits.
_LOCAL_CHUNK_ROWS = 25_000


def _persisted_inputs(client, X_blocks, y_blocks, bounds, rows):
    """What a dask fit reads before it places the inducing points, of rows persisted on the cluster
    (``dask_engine.persisted_blocks``): X's rows ``rows`` (sorted; None: all of them), in order, and the distinct
    labels; and futures of whether each chunk of X is finite, left to run while this process places the inducing
    points. The tasks are NumPy's own functions on the chunks where they live: a worker imports nothing to run them,
    where the dask.array graph of the same checks made every worker that had not run one import dask.array first
    (about 0.25 s on the 2-core machine), with this process waiting."""
    parts = []
    for (lo, hi), block in zip(bounds, X_blocks):
        local = None if rows is None else rows[(rows >= lo) & (rows < hi)] - lo
        if local is None:
            parts.append(block)
        elif local.size:
            parts.append(client.submit(np.take, block, local, axis=0, pure=False))
    distinct = [client.submit(np.unique, block, pure=False) for block in y_blocks]
    sample, distinct = client.gather([parts, distinct])
    finite = [client.submit(np.all, client.submit(np.isfinite, block, pure=False), pure=False) for block in X_blocks]
    return np.concatenate(sample), np.unique(np.concatenate(distinct)), finite


def _local_chunk_rows(n, n_workers):
    """Chunk sizes of n rows for ``n_workers`` local workers: about ``_LOCAL_CHUNK_ROWS`` each, at least one a
    worker, as equal as the rows allow."""
    chunks = max(int(n_workers), round(n / _LOCAL_CHUNK_ROWS))
    size, extra = divmod(n, chunks)
    return [size + (k < extra) for k in range(chunks)]


def __getattr__(name):
    """``classifier.METHODS``, the method names before the registry: ``agpc.methods.method_names()`` now."""
    if name == "METHODS":
        warnings.warn("agpc.classifier.METHODS is deprecated: use agpc.methods.method_names()", DeprecationWarning,
                      stacklevel=2)
        return M.method_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
