"""The training inputs of a fit on a dask.array: the checks of ``agpc.inputs``, run on the cluster, and the same
``inputs.TrainingInputs`` as a fit on rows in this process, plus what the rows' place on the cluster needs (the
client, the persisted chunks, the checks still running there).

The rows stay on the cluster. One pass over the chunks brings to this process what the model is initialised from:
the sampled rows (``inputs.sample_row_indices``, the rows a fit in memory samples), the distinct labels and, for a
checkpointed fit, the fingerprint's rows. Rows persisted on the cluster are read by NumPy's own functions on their
chunks (``persisted_inputs``); whether each chunk is finite is then checked while this process places the inducing
points (``check_finite_chunks``). X is not persisted here: persist it first if it fits in the workers' memory
(faster passes); otherwise each pass reads it from where it lives (e.g. zarr)."""

from __future__ import annotations

import os
import sys

import numpy as np

from . import backend as B
from . import inputs as I
from . import labels as L
from . import validation as V
from .inference.dask_engine import local_cluster, persisted_blocks
from .inference.data_parallel import prepare_worker
from .methods import ORDINAL, methods_supporting

__all__ = ["checked_arrays", "cluster_client", "training_inputs", "persisted_inputs", "check_finite_chunks",
           "training_weights", "class_counts", "refuse_labels_by_rows"]


def checked_arrays(plan, X, y, minibatch):
    """X and y as dask arrays checked before any pass over them (the method trains on a dask array, on
    ``minibatch``es or not; X 2-D, real-valued, with rows; y 1-D with a label a row): X in the plan's
    ``dtype``, chunked by rows only, y chunked as X's rows. Returns (X, y, X as given, chunked by rows only)."""
    import dask.array as da

    spec = plan.spec
    if not spec.supports("dask"):
        raise ValueError(spec.refusal("dask", f"fit on a dask array trains the methods "
                                              f"{list(methods_supporting('dask'))}, not {plan.method!r}"))
    if plan.checkpoint_path is not None and not spec.supports("dask_checkpoints"):
        raise ValueError(spec.refusal("dask_checkpoints", f"checkpoints of {plan.method!r} on a dask array are "
                                                          "not supported: fit without checkpoint_path"))
    I.check_rows(X.shape)
    if minibatch and not spec.supports("minibatch"):
        # before any pass over the data (in memory the engine says the same when it is made)
        raise ValueError(spec.refusal("minibatch", f"method {plan.method!r} is batch-only: every step needs all "
                                                   "the rows (batch_size=None)"))
    if np.dtype(X.dtype).kind not in "biuf":
        raise ValueError(f"X must be real-valued, got dtype {X.dtype}")
    given = da.asarray(X).rechunk({1: -1})  # chunks by rows only
    y = da.asarray(y)
    L.check_target_shape(y.shape, X.shape[0])
    return given.astype(plan.dtype), y.rechunk((given.chunks[0],)), given


NO_MAIN_GUARD = ("fit on a dask array without a client starts a LocalCluster, whose worker processes import the "
                 "script that called fit again (Python's spawn start method): in a script, put the code that fits "
                 "under 'if __name__ == \"__main__\":', or pass client= (a distributed.Client)")


def _refuse_in_a_bootstrapping_worker():
    """A worker process of the LocalCluster a fit started imports the caller's script as ``__mp_main__`` (the spawn
    start method's "safe importing of main module"); a script without ``if __name__ == "__main__":`` fits again
    there and would start a cluster of its own, which multiprocessing refuses with pages of tracebacks a worker.
    There, the worker leaves at once with one line (``SystemExit``: no traceback) saying what to do, and the fit
    that started it fails with ``NO_MAIN_GUARD``."""
    # (while spawn runs the script, as runpy's "__mp_main__", it is not yet the process's "__main__")
    importing = sys.modules.get("__mp_main__")
    if importing is not None and importing is not sys.modules.get("__main__"):
        raise SystemExit(f"agpc: {NO_MAIN_GUARD}")


def cluster_client(client):
    """(the client a fit on a dask array computes with, the client to close when the fit ends or None): ``client``,
    else the current client, else one of a new ``LocalCluster`` (one single-threaded worker process a core)."""
    if client is not None:
        return client, None
    from distributed import Client, get_client

    try:
        return get_client(), None
    except ValueError:  # no client yet: a local cluster for this fit
        _refuse_in_a_bootstrapping_worker()
        try:
            cluster = local_cluster(os.cpu_count() or 1)
        except RuntimeError as exc:  # (distributed: "Nanny failed to start", after pages of its workers' tracebacks)
            raise RuntimeError(f"{NO_MAIN_GUARD} ({exc})") from None
        try:
            owned = Client(cluster)
        except BaseException:  # (the cluster would be left running)
            cluster.close()
            raise
        return owned, owned


def training_inputs(plan, X, y, given, client):
    """The ``inputs.TrainingInputs`` of checked dask arrays X and y (``checked_arrays``; ``given``: X in its own
    type, which the sample is read in to check that ``dtype`` keeps its columns' spread), their rows left on the
    cluster: X, the labels encoded lazily, the classes, the sampled rows in this process (NumPy), and the checks
    that run on while the inducing points are placed. Every worker starts importing agpc here, while this process
    places the inducing points (the first round would otherwise wait for the imports)."""
    import dask.array as da

    n, target = X.shape[0], plan.dtype
    rows = I.sample_row_indices(plan, n)
    fingerprinted = list(I.fingerprint_rows(X, y)) if plan.checkpoint_path is not None else []
    blocks = (persisted_blocks(X), persisted_blocks(y)) if not fingerprinted else (None, None)
    finite_chunks = []  # (persisted rows: whether each chunk is finite, checked while the inducing points are placed)
    try:
        if None not in blocks:
            sample, labels, finite_chunks = persisted_inputs(client, *blocks, B.row_chunk_bounds(X), rows)
            finite = np.isfinite(sample).all()
        else:
            finite, labels, sample, *fingerprinted = client.compute(
                [da.isfinite(X).all(), da.unique(y), given if rows is None else given[rows], *fingerprinted],
                sync=True)
            I.check_conversion_keeps_spread(sample, target, what="X" if rows is None else "X (a sample of its rows)")
            sample = sample.astype(target)
    except TypeError:  # (NumPy's unique of a chunk of labels of two kinds, in an object array)
        refuse_labels_by_rows(client, y, blocks[1])
        raise
    if not bool(finite):
        raise ValueError(f"Input X contains NaN or infinity (or values too large for {target})")
    # (rows persisted on the cluster: the rounds' tasks take their chunks as they are and the labels are encoded by
    # a task of this package's, so the workers need no dask.array)
    warming = [client.submit(prepare_worker, () if blocks[0] is not None else ("dask.array",), workers=[w],
                             pure=False) for w in client.nthreads()]
    try:
        distinct = L.check_labels(np.asarray(labels), what="y (its distinct values)")
    except ValueError:
        refuse_labels_by_rows(client, y, blocks[1])
        raise
    if plan.likelihood == ORDINAL:  # the labels travel as their ranks, as in memory (``inputs.ordinal_labels``)
        order = I.ordinal_labels(plan, distinct)[1]  # (a label not among ``classes=``: refused here)
        classes, encode, by = np.arange(order.shape[0]), L.encoded_ranks, order
    else:
        order = None
        classes = L.check_classes(plan, np.unique(distinct))
        encode, by = L.encode_labels, classes
    if fingerprinted:
        fingerprinted = (fingerprinted[0], encode(np.asarray(fingerprinted[1]), by).astype(X.dtype))
    y_encoded = y.map_blocks(encode, by, dtype=np.float64).astype(X.dtype)
    sample = np.asarray(sample)
    return I.TrainingInputs(X, y_encoded, classes, sample, B.array_namespace(sample), None, client=client,
                            blocks=blocks, pending=[finite_chunks, warming], fingerprint_rows=fingerprinted or None,
                            class_labels=order)


def refuse_labels_by_rows(client, y, y_blocks=None):
    """Where y's distinct labels were refused (``labels.check_labels``: a missing label, labels of two kinds), the
    error again naming the rows, as a fit in memory names them: each chunk's labels checked on the cluster
    (``labels.chunk_labels``) and across chunks (``labels.merged_labels``). Run only then: the tasks import agpc on
    the workers, which the distinct labels' NumPy tasks do not. Returns where every chunk passes (the caller's
    error stands)."""
    from dask import delayed

    bounds = B.row_chunk_bounds(y)
    if y_blocks is not None:
        futures = [client.submit(L.chunk_labels, block, lo, pure=False) for block, (lo, _) in zip(y_blocks, bounds)]
    else:
        futures = client.compute([delayed(L.chunk_labels)(chunk, lo)
                                  for chunk, (lo, _) in zip(y.to_delayed().ravel().tolist(), bounds)])
    # (in the rows' order: the first chunk's error is the one raised, as a fit in memory names the first rows)
    L.merged_labels([future.result() for future in futures], bounds)


def persisted_inputs(client, X_blocks, y_blocks, bounds, rows):
    """What a dask fit reads before it places the inducing points, of rows persisted on the cluster
    (``dask_engine.persisted_blocks``): X's rows ``rows`` (sorted; None: all of them), in order, and the distinct
    labels; and futures of whether each chunk of X is finite, left to run while this process places the inducing
    points. The tasks are NumPy's own functions on the chunks where they live: a worker imports nothing to run them,
    where the dask.array graph of the same checks made every worker that had not run one import dask.array first,
    with this process waiting."""
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


def check_finite_chunks(inputs):
    """The finiteness of every persisted chunk (``persisted_inputs``), checked while the inducing points were
    placed: refused as ``training_inputs`` refuses a non-finite sample."""
    finite_chunks, _ = inputs.pending
    if not all(inputs.client.gather(list(finite_chunks))):
        raise ValueError(f"Input X contains NaN or infinity (or values too large for {inputs.X.dtype})")



def training_weights(plan, sample_weight, inputs, class_labels=None):
    """``inputs.training_weights`` for rows on a cluster: ``sample_weight`` (a dask array, rechunked as the rows, or
    anything ``fit`` takes in memory, checked here) times ``class_weight``'s weight of each row's class, as a dask
    array chunked as the rows and persisted on the workers (never gathered to the driver); None when neither is
    given; ``class_labels``: the classes as the user names them when the labels travel as ranks (an ordinal
    model's, ``inputs.class_weights``). Checked as the labels are, lazily: one pass over the chunks counts what the checks need (the non-finite
    and the negative weights and the first of each, each class's rows and rows of positive weight), and the errors
    are those of ``inputs.training_weights``."""
    import dask.array as da

    if sample_weight is None and plan.class_weight is None:
        return None
    client, classes, n = inputs.client, inputs.classes, inputs.X.shape[0]
    row_chunks = inputs.X.chunks[0]
    if B.is_dask_array(sample_weight):
        weights = da.asarray(sample_weight)
        if np.dtype(weights.dtype).kind not in "biuf":
            raise ValueError(f"sample_weight must be numbers, one a row: got dtype {weights.dtype}")
        if tuple(weights.shape) != (n,):
            raise ValueError(f"sample_weight must have one weight a row, shape ({n},); got shape {weights.shape}")
        weights = weights.astype(np.float64).rechunk((row_chunks,))
    elif sample_weight is not None:  # (in memory: checked here as a fit in memory checks it, then sent)
        weights = da.from_array(V.check_sample_weight(sample_weight, n), chunks=(row_chunks,))
    else:
        weights = da.ones(n, chunks=(row_chunks,))
    class_index = inputs.y.map_blocks(I.row_classes, len(classes), dtype=np.intp)
    nonfinite, negative = ~da.isfinite(weights), weights < 0
    counts, positive, *bad = client.compute(
        [da.bincount(class_index, minlength=len(classes)),
         da.bincount(class_index, weights=(weights > 0).astype(np.float64), minlength=len(classes)),
         da.sum(nonfinite), da.argmax(nonfinite), da.sum(negative), da.argmax(negative)], sync=True)
    if bad[0] or bad[2]:  # (the first bad row's weight, for the message)
        first = client.compute(weights[int(bad[1] if bad[0] else bad[3])], sync=True)
        V.refuse_bad_weights(bad[0], int(bad[1]), first, bad[2], int(bad[3]), first, True, n)
    V.refuse_bad_weights(0, None, None, 0, None, None, bool(np.any(positive)), n)
    per_class = I.class_weights(plan, classes, counts, class_labels)
    if per_class is not None:
        weights = weights * class_index.map_blocks(_of_class, per_class, dtype=np.float64)
        positive = positive * (per_class > 0)
    # (persisted before its scale is read: computed, then persisted again as it was, its chunks had two graphs of
    # one key, which distributed logged as "Detected different run_spec")
    weights = client.persist(weights)
    largest, heaviest = client.compute([da.max(weights), da.argmax(weights)], sync=True)
    V.check_weight_scale(float(largest), int(heaviest), plan.dtype)
    if I.every_class_needs_weight(plan):
        V.check_positive_counts(positive, classes)
    I.refuse_unweighted_method(plan)
    return client.persist(weights.astype(inputs.X.dtype))


def class_counts(client, labels, n_classes, weights=None):
    """The count of each class's rows (summed ``weights`` with weights), computed on the cluster from the labels
    encoded on it (``TrainingInputs.y``): one bincount a chunk, K numbers back."""
    import dask.array as da

    class_index = labels.map_blocks(I.row_classes, n_classes, dtype=np.intp)
    return client.compute(da.bincount(class_index, weights=weights, minlength=n_classes), sync=True)


def _of_class(class_index, per_class):
    """A chunk's rows' class weights (a task)."""
    return per_class[class_index]
