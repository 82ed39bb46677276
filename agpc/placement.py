"""Where the rows of one fit are while it trains, chosen once by ``GPClassifier.fit`` for every kind of input, and
the clean-up of whatever was started to hold them (``Placement``, a context manager).

The places: this process (arrays in memory, data on disk read a block at a time, host rows moved to a device a block
at a time), passing the exact model's full-GP passes or nothing as the engine; worker processes on this machine
(``n_jobs``: the rows written once, shuffled, into ``workers.SharedRows`` the workers map, trained by the
data-parallel rounds of ``data_parallel.DataParallel``); and a dask cluster (batch passes of one task a chunk,
``dask_engine.DaskPasses``; data-parallel rounds on the chunks where they are; or, with ``local_steps=0``, the
chunks brought to this process in turn, ``dask_engine.ChunkedRows``). Each place gives the training loop the same
(X, y, engine, batch_size, block_rows), and whatever it started (worker processes, the rows' files, an engine's
state on the workers, a ``LocalCluster`` of its own) is ended however the fit ends.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, NamedTuple

from . import backend as B
from . import dask_inputs as D
from . import inputs as I
from . import size_rule, threads
from . import workers as W
from .batch_size import gpu_block_rows, rows_per_step
from .inference.dask_engine import ChunkedRows, DaskPasses
from .inference.data_parallel import DataParallel, RowsOnWorkers, refusal

__all__ = ["LOCAL_CHUNK_ROWS", "PlacedRows", "Placement", "n_jobs_for", "unused_place_settings", "in_process_cores",
           "useful_processes", "local_chunk_rows", "blas_scope"]

# Rows per chunk of a fit in local worker processes (``n_jobs``): the dask protocol's chunks (the 200,000-row check
# wraps its rows in chunks of 25,000), each chunk one tied factor of SEP / ADF and the unit a shard visits.
LOCAL_CHUNK_ROWS = 25_000


class PlacedRows(NamedTuple):
    """What the training loop takes of the rows in their place."""

    X: Any  # the rows, or what the loop sees of rows that stay elsewhere (``RowsOnWorkers``, ``ChunkedRows``)
    y: Any  # the encoded labels, likewise
    passes: Any  # where the engine's passes run: None (in this process), ``exact_ep`` (the exact model), ``DaskPasses``
    rounds: Any  # a ``DataParallel`` whose rounds are the steps (rows on workers), or None
    batch_size: Any  # rows a step (None: the full batch), or a data-parallel round's
    block_rows: Any  # rows a block of a pass (None: the plan's ``block_rows``)
    weights: Any = None  # the rows' weights as the loop takes them (where the rows are), or None


class Placement:
    """The place of one fit's rows (module docstring), for its ``plan.FitPlan`` and training data X of ``n_rows``
    rows and ``n_features`` features (``steps``: the ``plan.Steps`` they take). Used as a context manager, within
    the fit's BLAS thread scope (``blas_scope``): ``training_inputs`` checks the rows (starting a ``LocalCluster``
    for a dask array when there is no client), ``start`` starts local worker processes before the initial model is
    placed, ``rows`` gives the loop its rows after it; leaving the block ends all of them."""

    def __init__(self, plan, X, n_rows, n_features):
        self.plan, self.steps = plan, plan.steps(n_rows)  # (the rows a step takes, resolved once)
        self._n_features = n_features
        self._blas = contextlib.ExitStack()  # the fit's BLAS thread scope (``blas_scope``), entered with the place
        self.on_cluster = B.is_dask_array(X)
        self.n_jobs = 1  # the workers of the fit (the estimator's ``n_jobs_``): batch passes' threads, or ...
        self.processes = 1  # ... the processes of minibatch rounds on this machine
        self._owned_client = self._pool = self._runner = None  # what this place started, ended by ``__exit__``
        self._shared, self._futures = [], []
        self._weights = None  # the rows' weights (``training_weights``)

    def __enter__(self):
        self._blas.enter_context(blas_scope(self.plan, self.steps, self._n_features))
        return self

    def __exit__(self, *exc_info):
        # Everything is ended even when one close raises (the rest would leak: processes, a LocalCluster, files).
        # ExitStack ends them in the reverse order of the callbacks: the pool first, the client and its cluster, then
        # the thread scope.
        with contextlib.ExitStack() as ending:
            ending.callback(self._blas.close)  # (last: the workers end within the fit's thread scope)
            if self._owned_client is not None:
                ending.callback(self._owned_client.cluster.close)
                ending.callback(self._owned_client.close)
            ending.callback(self._futures.clear)  # (released while their client is open)
            for rows_file in self._shared:
                ending.callback(rows_file.close)
            if self._runner is not None:  # (the DaskPasses or DataParallel this place made)
                ending.callback(self._runner.close)
            if self._pool is not None:
                ending.callback(self._pool.close)

    def training_inputs(self, X, y, target_xp, classes=None):
        """The checked ``inputs.TrainingInputs`` of (X, y): ``inputs.training_inputs`` in this process,
        ``dask_inputs.training_inputs`` on the cluster of a dask array (its checks before the cluster is sought).
        ``classes``: the model's classes when y need not hold them all (an ordinal model's ranks)."""
        if not self.on_cluster:
            return I.training_inputs(self.plan, X, y, target_xp=target_xp, classes=classes)
        X, y, given = D.checked_arrays(self.plan, X, y, self.steps.minibatch)
        client, self._owned_client = D.cluster_client(self.plan.client)
        inputs = D.training_inputs(self.plan, X, y, given, client)
        self._futures = inputs.pending
        return inputs

    def choose_workers(self, inputs):
        """The workers the rows of ``inputs`` train on in this process (``n_jobs_for``: the estimator's ``n_jobs_``,
        kept as ``n_jobs``), or None for a dask array, whose workers are the cluster's."""
        if self.on_cluster:
            return None
        self.n_jobs = n_jobs_for(self.plan, self.steps, inputs.xp, self.plan.latents(len(inputs.classes)))
        return self.n_jobs

    def start(self):
        """Before the initial model: the worker processes beyond this one (``choose_workers``) started now (they
        import agpc while this process places the inducing points)."""
        if self.n_jobs > 1 and self.steps.minibatch:  # (batch passes: n_jobs threads, ``blas_scope``)
            self.processes = self.n_jobs
            self._pool = W.LocalWorkers(self.n_jobs, preload=("agpc.inference.data_parallel",))

    def training_weights(self, sample_weight, inputs, class_labels=None):
        """The rows' weights (``inputs.training_weights``; on a cluster ``dask_inputs.training_weights``: a dask array
        chunked as the rows, checked there), or None; kept for ``rows``, which places them beside the rows.
        ``class_labels``: the classes as the user names them when the labels travel as ranks (an ordinal model's)."""
        if self.on_cluster:
            self._weights = D.training_weights(self.plan, sample_weight, inputs, class_labels=class_labels)
        else:
            self._weights = I.training_weights(self.plan, sample_weight, inputs, class_labels=class_labels)
        return self._weights

    def rows(self, inputs, Z, rng, exact=None):
        """The ``PlacedRows`` the loop trains on, once the initial inducing points ``Z`` are placed. ``rng``: the
        training's generator, which draws the seed of data-parallel rounds (and then the order of the rows shared
        with local workers). ``exact``: the exact model's full-GP passes, the engine of rows in this process."""
        n = inputs.X.shape[0]
        for name, why in unused_place_settings(self.plan, self.on_cluster, self.steps.minibatch, self.processes > 1):
            warnings.warn(f"{name} is not used: {why}", UserWarning, stacklevel=B.outside_stacklevel())
        if self.on_cluster:
            return self._on_cluster(inputs, rng)
        if self.processes > 1:
            return self._in_local_workers(inputs, Z, rng)
        batch_size = rows_per_step(self.plan, n, inputs.xp, Z, len(inputs.classes))  # (a GPU's: sized for Z)
        return PlacedRows(inputs.X, inputs.y, exact, None, batch_size,
                          gpu_block_rows(self.plan, batch_size, inputs.xp), self._weights)

    def _in_local_workers(self, inputs, Z, rng):
        plan, X, n = self.plan, inputs.X, inputs.X.shape[0]
        seed = int(rng.integers(2**62))
        order = rng.permutation(n) if plan.shuffle and not B.is_out_of_core(X) else None
        weighted = self._weights is not None  # (the weights shared beside the rows, in the same order)
        self._shared = W.share_rows([X, inputs.y] + [B.to_numpy(self._weights)] * weighted,
                                    local_chunk_rows(n, self.n_jobs), order=order, dtypes=[Z.dtype] * (2 + weighted))
        self._runner = rounds = DataParallel(self._pool, *self._shared[:2], batch_size=self.steps.step_rows,
                                             local_steps=plan.local_steps, seed=seed,
                                             site_directory=plan.site_directory,
                                             weights=self._shared[2] if weighted else None)
        return PlacedRows(RowsOnWorkers(X.shape, Z.dtype), RowsOnWorkers((n,), Z.dtype), None, rounds,
                          rounds.rows_per_round, None, RowsOnWorkers((n,), Z.dtype) if weighted else None)

    def _on_cluster(self, inputs, rng):
        D.check_finite_chunks(inputs)
        plan, client, X, y = self.plan, inputs.client, inputs.X, inputs.y
        batch_size, minibatch = self.steps.step_rows, self.steps.minibatch
        if minibatch and plan.local_steps != 0:  # data-parallel rounds: the rows stay on the workers
            if inputs.blocks[0] is not None:  # (X persisted: the labels too, encoded, n floats on the workers)
                y = client.persist(y)
            self._runner = rounds = DataParallel(client, X, y, batch_size=batch_size, local_steps=plan.local_steps,
                                                 seed=int(rng.integers(2**62)), site_directory=plan.site_directory,
                                                 weights=self._weights)
            return PlacedRows(RowsOnWorkers(X.shape, X.dtype), RowsOnWorkers(y.shape, y.dtype), None, rounds,
                              rounds.rows_per_round, None, None if self._weights is None else RowsOnWorkers(
                                  y.shape, y.dtype))
        if minibatch:  # minibatches: chunks come to the driver in turn (SVI: a step per minibatch there)
            return PlacedRows(ChunkedRows(X, client), ChunkedRows(y, client), None, None, batch_size, None,
                              None if self._weights is None else ChunkedRows(self._weights, client))
        if not plan.spec.supports("dask_batch"):
            raise ValueError(f"{plan.method} on a dask array trains on minibatches (batch_size below the number "
                             "of rows): a full-batch step would bring every row to the driver")
        self._runner = passes = DaskPasses(client, X.chunks[0], site_directory=plan.site_directory)
        return PlacedRows(X, y, passes, None, batch_size, None, self._weights)


def unused_place_settings(plan, on_cluster, minibatch, local_rounds):
    """(the setting as given, why the fit does not read it) of each of the plan's settings of a place that is not
    this fit's (``Placement``): ``client``, the cluster of a dask array's fit; ``local_steps``, the steps of
    data-parallel rounds (a dask array's minibatches, or ``local_rounds``: minibatches in ``n_jobs`` worker
    processes), ``0`` a dask array's minibatches on the driver; ``site_directory``, where the sites of a dask array's
    batch passes, or of data-parallel rounds, are kept. ``minibatch``: whether the fit steps on minibatches."""
    here = ("this fit's rows train in this process (rows not in a dask.array, nor minibatches in n_jobs worker "
            "processes)")
    unused = []
    if plan.client is not None and not on_cluster:
        unused.append(("client", f"it is the cluster of a fit on a dask.array, and {here}"))
    if plan.local_steps is not None and not (local_rounds or (on_cluster and minibatch)):
        where = "this fit on a dask.array takes full-batch passes" if on_cluster else here
        unused.append((f"local_steps={plan.local_steps!r}", "it sets the steps of data-parallel rounds (minibatches "
                       f"of a dask.array, or in n_jobs worker processes), and {where}"))
    rounds_or_passes = local_rounds or (on_cluster and not (minibatch and plan.local_steps == 0))
    if plan.site_directory is not None and not rounds_or_passes:
        where = "this fit's minibatches come to this process (local_steps=0)" if on_cluster else here
        unused.append((f"site_directory={str(plan.site_directory)!r}", "it keeps the sites of batch passes on a "
                       f"dask.array, or of data-parallel rounds, in files, and {where}, its sites in memory"))
    return unused


def n_jobs_for(plan, steps, xp, n_classes):
    """The workers the plan's fit of its rows (``steps``) in this process uses (``n_jobs``; ``n_jobs_``). Minibatches
    of a method with data-parallel rounds, on NumPy data: that many processes (``useful_processes``). Minibatches
    those rounds cannot take (multiclass EP's, another library's arrays) train in this process: one, said in a
    warning when more were given (as scikit-learn's estimators say an n_jobs they cannot use; silent when it came
    from an enclosing ``joblib.parallel_config``); a batch-only method's refusal of minibatches is the error it
    gets (the ``batch_size`` it cannot take). Batch passes: that many threads over the row blocks, and the BLAS
    thread rule within that many cores (``in_process_cores``: the exact model's n x n algebra too), for NumPy data; on another
    library's arrays (a GPU, which runs its own parallelism) one, said in a warning when more were asked. Fewer
    than asked is said once in a warning."""
    count, _ = W.resolve_n_jobs(plan.n_jobs)
    if count == 1:
        return 1
    spec = plan.spec
    if not steps.minibatch:  # batch passes in this process: threads over the row blocks
        if not B.is_numpy_namespace(xp):
            if plan.n_jobs is not None:
                warnings.warn(f"n_jobs={plan.n_jobs}: a batch pass on {xp.__name__} arrays runs on their device, "
                              "which spreads the work itself: one worker (n_jobs_=1)", UserWarning,
                              stacklevel=B.outside_stacklevel())
            return 1
        used = in_process_cores(plan)
        if used < count:
            asked = count if plan.n_jobs is None else plan.n_jobs
            plural = "s" if used != 1 else ""
            warnings.warn(f"n_jobs={asked}: batch passes on {used} thread{plural} ({used} core{plural} this process "
                          "may use); n_jobs_ records it", UserWarning, stacklevel=B.outside_stacklevel())
        return used
    if not spec.supports("n_jobs"):  # (a batch-only method: its minibatches are refused whatever n_jobs)
        if plan.n_jobs is not None:
            raise ValueError(spec.refusal("n_jobs", f"method={plan.method!r} has no data-parallel rounds for its "
                                                    "minibatches"))
        return 1
    one = None
    if refusal(spec.engine_factory, spec.engine_name, n_classes) is not None:
        one = f"{refusal(spec.engine_factory, spec.engine_name, n_classes)}: its minibatches train in this process"
    elif not B.is_numpy_namespace(xp):
        one = (f"minibatches train in worker processes on NumPy data only, not on {xp.__name__} arrays (their "
               "device spreads a step's work itself): its minibatches train in this process")
    if one is None:
        return useful_processes(count, steps.n_rows, steps.step_rows, asked=plan.n_jobs)
    if plan.n_jobs is not None:
        warnings.warn(f"n_jobs={plan.n_jobs}: {one}, on one worker (n_jobs_=1)", UserWarning,
                      stacklevel=B.outside_stacklevel())
    return 1


def in_process_cores(plan):
    """The cores a fit in this process may use (``n_jobs``, scikit-learn's meaning, at most the cores this process
    may use): the BLAS thread rule's budget for the fit (``blas_scope``), and the threads of its batch passes."""
    return min(W.resolve_n_jobs(plan.n_jobs)[0], threads.available_cores())


def useful_processes(count, n, batch_size, asked=None):
    """``count`` worker processes capped by the cores this process may use (``threads.available_cores``: its CPU
    affinity and cgroup quota; more processes than cores only take turns, and each costs an interpreter and its
    imports) and by the rows: each process needs a minibatch (``batch_size`` rows) of its own to step on. Fewer
    than ``count`` is said in one UserWarning naming the bound (and ``asked``, the ``n_jobs`` given)."""
    cores = threads.available_cores()
    shares = max(1, n // int(batch_size))
    used = max(1, min(count, cores, shares))
    if used < count:
        bounds = [f"{cores} core{'s' if cores != 1 else ''} this process may use" if cores < count else None,
                  f"{n} rows of minibatches of {batch_size}, a minibatch a process" if shares < count else None]
        warnings.warn(f"n_jobs={count if asked is None else asked}: training in {used} process"
                      f"{'es' if used != 1 else ''} ({' and '.join(b for b in bounds if b)}); n_jobs_ records it",
                      UserWarning, stacklevel=B.outside_stacklevel())
    return used


def local_chunk_rows(n, n_workers):
    """Chunk sizes of n rows for ``n_workers`` local workers: about ``LOCAL_CHUNK_ROWS`` each, at least one a
    worker, as equal as the rows allow."""
    chunks = max(int(n_workers), round(n / LOCAL_CHUNK_ROWS))
    size, extra = divmod(n, chunks)
    return [size + (k < extra) for k in range(chunks)]


def blas_scope(plan, steps, n_features):
    """The BLAS thread scope (``agpc.threads.blas_threads``) for the plan's fit of its rows (``steps``) of
    ``n_features`` features, shaped by the work of its main phase: minibatch steps, or batch passes over all rows
    (the parameters are checked already); within its ``n_jobs`` cores (``in_process_cores``)."""
    n = steps.n_rows
    # (the classes are not known before the labels are checked: sized as for two, the size rule's exact case)
    m = max(1, len(plan.inducing)) if not isinstance(plan.inducing, str) else size_rule.model_size(
        plan.n_inducing, n, has_exact_pass=size_rule.exact_passes(plan, steps) is not None).n_inducing
    rows = n if steps.step_rows is None else min(n, int(steps.step_rows))  # (a batch-only method's explicit
    # batch_size is refused already)
    I.warn_blas_threads(plan.blas_threads)
    return threads.blas_threads(rows, m, n_features=n_features, threads=plan.blas_threads,
                                cores=in_process_cores(plan))
