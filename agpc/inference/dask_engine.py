"""Batch EP / SEP / ADF over a dask.array of rows: the distributed scheme of Hernandez-Lobato & Hernandez-Lobato (2016),
sec. 2.3 (Fig. 1 right).

The driver holds the O(m^2) state (kernel, Z, q or the tied factor); each chunk of rows is one task that runs
the *same* per-row-block functions the single-machine path runs (``ep.site_sums_over_rows`` and ``ep.batch_sweep``,
or ``ep.binary_sweep`` for SEP / ADF):
kernel blocks, site updates, partial sums of S and c~, gradient adjoints and log Z terms. The chunks' small
results are added on the workers in a tree (``blocks.add_sweeps``) and only the sum comes to the driver, which
factorises, steps the hyper-parameters and sends (kernel, Z, q) with the next round of tasks. EP's sites are
dask arrays chunked like the rows and persisted on the workers: they are never gathered to the driver.

The passes plug into an engine (``passes=``), so damping, the guard rails, validation and early
stopping are the single-machine ones.

Minibatch training is data-parallel by default (``data_parallel``: rounds of several steps on each worker).
With ``local_steps=0`` it samples chunks on the driver instead: ``ChunkedRows`` hands the training loop one
chunk of rows at a time, and the loop lays its minibatches inside chunks and visits the chunks in random order
(``backend.row_chunk_bounds``), so an epoch moves each chunk to the driver once, and the minibatch steps run
there, one after another (a round trip to a worker per step would cost more than the step).
"""

from __future__ import annotations

import itertools
import operator
import os
import shutil
import tempfile
import weakref

from .. import checkpoints
from ..backend import array_namespace, row_chunk_bounds
from ..threads import task_blas_threads
from ..workers import HEAP_THRESHOLD
from . import blocks, ep, multiclass_ep, variational
from .posterior import posterior_from_sums, prior_cholesky
from .sites import cavity_of

__all__ = ["ChunkedRows", "DaskPasses", "WORKER_ENVIRON", "local_cluster", "persisted_blocks"]

# glibc in a dask worker: the nanny sets MALLOC_TRIM_THRESHOLD_, and setting it turns off glibc's adaptive
# mmap threshold, so every block temporary above 128 KiB is a fresh mmap whose pages fault in again each
# block. A 64 MiB mmap threshold puts the ~16 MB block temporaries back on the heap: measured at 400,000 rows,
# m = 200, one worker, the tasks' compute time of a batch EP pass fell from 14.5 s to 12.8 s (NumPy in
# process: 11-12 s). The nanny's trim threshold (64 KiB) then gives the top of the heap back to the system
# at almost every free, and the m x m temporaries of a minibatch step fault their pages in again: a SEP step
# (m = 200, 200 rows) took 7.1-7.4 ms with it and 5.3-5.7 ms with a 64 MiB trim threshold, as without either
# setting (the heap then keeps at most 64 MiB it no longer uses).
WORKER_ENVIRON = {"MALLOC_MMAP_THRESHOLD_": HEAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": HEAP_THRESHOLD}


def local_cluster(n_workers, **kwargs):
    """A LocalCluster of single-threaded worker processes with ``WORKER_ENVIRON``; ``kwargs`` go to LocalCluster."""
    import dask
    from distributed import LocalCluster

    settings = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in WORKER_ENVIRON.items()}
    with dask.config.set(settings):
        return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None, **kwargs)


def persisted_blocks(array):
    """The futures of a dask array's row chunks, in order, when the array is exactly data persisted on the cluster
    (its graph holds those futures' keys and nothing else: no task left to run on them), else None. Such chunks can
    be read by plain functions submitted on them, without a dask.array graph: a worker that has not yet run one
    imports dask.array to unpickle it, a fraction of a second a worker."""
    from distributed import futures_of

    futures = {f.key: f for f in futures_of(array)}
    keys = [k[0] if isinstance(k, list) and len(k) == 1 else k for k in array.__dask_keys__()]
    if len(futures) != len(keys) or not all(isinstance(k, tuple) and k in futures for k in keys):
        return None  # (checked before the graph is looked at: a lazy graph may be large)
    if set(dict(array.__dask_graph__())) != set(futures):
        return None
    return [futures[k] for k in keys]


def _tree(client, futures, combine):
    """Reduce futures pairwise on the workers; returns one future."""
    while len(futures) > 1:
        pairs = [client.submit(combine, futures[i], futures[i + 1]) for i in range(0, len(futures) - 1, 2)]
        futures = pairs + ([futures[-1]] if len(futures) % 2 else [])
    return futures[0]


def _compute_windowed(client, tasks):
    """``client.compute(tasks)`` a few at a time: at most twice the cluster's threads in flight, the next
    submitted as one finishes. All at once, the workers read chunks (from zarr, from site files) far ahead
    of the tasks that use them and hold them meanwhile: measured at 4 x 10^6 rows in 250,000-row chunks,
    six 16 MB chunks of X held per worker, growing with the number of chunks."""
    from distributed import wait

    window = max(2, 2 * sum(client.nthreads().values()))
    futures = []
    for task in tasks:
        running = [f for f in futures if not f.done()]
        if len(running) >= window:
            wait(running, return_when="FIRST_COMPLETED")
        futures.append(client.compute(task))
    return futures


def _model(Z):
    """The passes of the model whose inducing points are ``Z``: binary (``ep``), or multiclass
    (``multiclass_ep``: Z of shape (C, m, d), a ``ClassKernels``, sites (n, 2C))."""
    return multiclass_ep if Z.ndim == 3 else ep


def _site_shape(rows, Z):
    """The shape of ``rows`` rows' sites: one a row (binary), 2C a row (multiclass, ``multiclass_ep``)."""
    return (rows,) if Z.ndim == 2 else (rows, 2 * Z.shape[0])


def _task_threads(Z, X, block_rows):
    """A chunk's task runs under the BLAS thread rule for its rows, within its worker's budget."""
    return task_blas_threads(X.shape[0], Z.shape[-2], n_features=Z.shape[-1], block_rows=block_rows)


def _chunk_sums(kernel, Z, X, y, site_precision, site_shift, prior, block_rows, nonnegative=False, weights=None):
    """A chunk's sums of its sites (S, c~; per class for a multiclass model, whose ``prior`` is the classes'
    L_K^-1, the binary model's L_K). ``nonnegative``: as ``ep.site_sums_over_rows`` takes it (binary). ``weights``:
    the chunk's sample weights, q holding w_i copies of row i's site (power EP, as ``ep.evaluate``)."""
    if weights is not None:  # (a row's sites: one, or 2C for a multiclass model)
        w = weights if site_precision.ndim == 1 else weights[:, None]
        site_precision, site_shift = w * site_precision, w * site_shift
    with _task_threads(Z, X, block_rows):
        if Z.ndim == 3:
            return multiclass_ep.class_site_sums(kernel, Z, X, y, site_precision, site_shift, prior, block_rows)
        S, c_tilde, _ = ep.site_sums_over_rows(kernel, Z, X, site_precision, site_shift, prior, block_rows, False,
                                               nonnegative=nonnegative)
    return S, c_tilde


def _chunk_quadratic_sums(kernel, Z, X, y, xi, kind, L_K, block_rows, weights=None):
    with _task_threads(Z, X, block_rows):
        return variational.quadratic_site_sums(kernel, Z, X, y, xi, kind=kind, L_K=L_K, block_rows=block_rows,
                                               weights=weights)


def _chunk_quadratic_terms(kernel, Z, X, y, xi, prep, kind, want_grad, block_rows, weights=None):
    with _task_threads(Z, X, block_rows):
        return variational.quadratic_row_terms(kernel, Z, X, y, xi, prep, kind=kind, want_grad=want_grad,
                                               block_rows=block_rows, weights=weights)


def _chunk_initial_xi(kernel, Z, X, kind, block_rows):
    with _task_threads(Z, X, block_rows):
        return variational.initial_xi(kernel, Z, X, kind, block_rows)


def _without_quadratic_rows(terms):
    return {k: (None if k in variational.QUADRATIC_ROW_KEYS else v) for k, v in terms.items()}


def _chunk_sweep(kernel, Z, X, *args, batch=False, **kwargs):
    """A sweep on one chunk of rows (a task): ``ep.batch_sweep`` for batch EP (``batch``), ``ep.binary_sweep``
    for a cavity of SEP / ADF, ``multiclass_ep.class_sweep`` for either on a multiclass model."""
    sweep = multiclass_ep.class_sweep if Z.ndim == 3 else ep.batch_sweep if batch else ep.binary_sweep
    with _task_threads(Z, X, kwargs.get("block_rows")):
        return sweep(kernel, Z, X, *args, **kwargs)


class ChunkedRows:
    """Rows of a dask.array read on the driver one stored chunk at a time (the chunk last read is kept).

    It looks like an array on disk to the training loop (``shape``, ``dtype``, ``chunks``, row slices that
    return NumPy arrays), which lays minibatches inside chunks: each chunk then crosses the network once
    an epoch. Slices across chunk boundaries (the exact passes of minibatch EP) are assembled chunk by chunk.
    """

    def __init__(self, array, client):
        self.array = array
        self.client = client
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = array.ndim
        self.chunks = array.chunks
        self._bounds = row_chunk_bounds(array)
        self._kept = (None, None)  # (chunk index, its rows as a NumPy array)

    def _chunk(self, k):
        if self._kept[0] != k:
            self._kept = (None, None)  # release the old chunk before the new one arrives
            self._kept = (k, self.client.compute(self.array.blocks[k]).result())
        return self._kept[1]

    def sum(self, axis=None, dtype=None, out=None, **options):
        """The sum of all values, taken on the cluster (what ``numpy.sum`` calls: the total of rows' weights)."""
        if axis is not None or out is not None:
            raise TypeError("ChunkedRows sums all its values only")
        return float(self.client.compute(self.array.sum(dtype=dtype), sync=True))

    def __getitem__(self, index):
        rows = index[0] if isinstance(index, tuple) else index
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("ChunkedRows reads contiguous row slices only")
        lo, hi, _ = rows.indices(self.shape[0])
        parts = []
        for k, (start, stop) in enumerate(self._bounds):
            if stop > lo and start < hi:
                parts.append(self._chunk(k)[max(lo, start) - start:min(hi, stop) - start])
        rest = index[1:] if isinstance(index, tuple) else ()
        if not parts:
            parts = [self._chunk(0)[:0]]
        block = parts[0] if len(parts) == 1 else array_namespace(parts[0]).concat(parts)
        return block[(slice(None),) + tuple(rest)] if rest else block


class _SiteGeneration:
    """One generation of site files (a file a chunk, in one directory); the directory is removed when no
    array reading it is left (the arrays hold this object, see ``DaskPasses._file_sites``)."""

    def __init__(self, directory):
        self.directory = directory
        weakref.finalize(self, shutil.rmtree, directory, True)


def _sweep_to_files(kernel, Z, X, y, site_precision, site_shift, cavity, *, path, **options):
    """A chunk's sweep (``_chunk_sweep`` with ``options``) whose (damped) sites go to the file ``path``; returns only
    the small results."""
    out = _chunk_sweep(kernel, Z, X, y, site_precision, site_shift, cavity, **options)
    checkpoints.save_site_chunk(path, out["site_precision"], out["site_shift"])
    return blocks.without_rows(out)


class DaskPasses:
    """The passes over rows held in a dask.array, in the place of the ``ep`` / ``multiclass_ep`` / ``variational``
    module: an engine (``engines.EPEngine``, ``engines.QuadraticEngine``) runs its passes through it.

    ``client``: a ``distributed.Client``. The data must be chunked along rows only; sites follow the rows'
    chunks. Every pass submits one task per chunk for the sums, one per chunk for the sweep (which also
    damps the sites and measures their change), and two trees of additions: two round trips.

    ``site_directory``: None keeps batch EP's sites (two floats a row) persisted in the workers' memory.
    A directory that the driver and every worker can reach (on one machine: any; across hosts: a shared
    file system) keeps them there instead, a file a chunk: each chunk's task reads its old sites and writes
    the new ones, so worker memory does not grow with the number of rows, and a lost worker's chunks are
    recomputed from the files of the last pass. ``close()`` removes what the engine wrote there.
    """

    def __init__(self, client, row_chunks, site_directory=None):
        self.client = client
        self.row_chunks = tuple(int(c) for c in row_chunks)
        self.site_root = None
        self.site_shape = ()  # of a row's sites beyond the row (multiclass: (2C,)), set by ``zero_sites``
        if site_directory is not None:
            os.makedirs(site_directory, exist_ok=True)
            self.site_root = tempfile.mkdtemp(prefix="agpc-sites-", dir=os.fspath(site_directory))
        self._generations = itertools.count()
        self._weight_totals = {}  # (``total_weight``)

    def close(self):
        """Remove the site files (the fit is over: the model does not need its sites)."""
        if self.site_root is not None:
            shutil.rmtree(self.site_root, ignore_errors=True)

    # -- what Trainer needs besides the passes ---------------------------------------------------------

    @staticmethod
    def uniform_factor(Z):
        return _model(Z).uniform_factor(Z)

    @staticmethod
    def posterior_from_factor(kernel, Z, factor, *, jitter):
        return _model(Z).posterior_from_factor(kernel, Z, factor, jitter=jitter)

    def zero_sites(self, n, Z):
        import dask.array as da

        shape = _site_shape(n, Z)
        self.site_shape = shape[1:]  # (what site files of this model hold a row: read back by ``load_sites``)
        zeros = da.zeros(shape, chunks=(self.row_chunks,) + shape[1:], dtype=Z.dtype)
        if self.site_root is None:
            return self.client.persist(zeros)
        return zeros  # no lineage to speak of: computed where it is needed

    def _new_generation(self):
        directory = os.path.join(self.site_root, f"pass-{next(self._generations)}")
        os.makedirs(directory)
        return _SiteGeneration(directory), [os.path.join(directory, f"chunk-{k}.npz")
                                            for k in range(len(self.row_chunks))]

    def _file_sites(self, files, dtype, generation=None):
        """(site_precision, site_shift) as dask arrays read from ``files`` a chunk at a time when a task
        needs them (one read per chunk serves both); ``generation`` is kept alive by the arrays."""
        import dask
        import dask.array as da

        loads = [dask.delayed(checkpoints.load_site_chunk, pure=True)(f, r, *self.site_shape)
                 for f, r in zip(files, self.row_chunks)]
        arrays = tuple(
            da.concatenate([da.from_delayed(dask.delayed(operator.getitem, pure=True)(pair, i), shape=(r, *self.site_shape),
                                            dtype=dtype) for pair, r in zip(loads, self.row_chunks)])
            for i in (0, 1)
        )
        for a in arrays:
            a.agpc_site_files = generation
        return arrays

    # -- checkpoints: the sites stay on the workers, each writes its chunks beside the checkpoint -------

    def store_sites(self, path, step, site_precision, site_shift):
        """Write the sites one file a chunk into ``<path>.sites/step-<step>/`` (by the workers: they and the
        driver must share that directory). Sites in memory are read back from there, so that from now on a
        lost chunk is recomputed from its file, not from every pass since the start. Returns the sites and
        what the checkpoint records of them."""
        directory = checkpoints.site_step_directory(path, step)
        files = [os.path.join(directory, f"chunk-{k}.npz") for k in range(len(self.row_chunks))]
        self._write_files(files, site_precision, site_shift)
        record = {"site_files": files, "rows": list(self.row_chunks)}
        if self.site_root is not None:  # already in files of their own, which the checkpoint's clean-up leaves
            return site_precision, site_shift, record
        return (*self.load_sites(record, site_precision.dtype), record)

    def load_sites(self, record, dtype):
        """Sites from the files of ``store_sites``: persisted on the workers, or with a site directory
        copied into a generation of its own there (the checkpoint's files may be removed while they are
        still the state to go back to)."""
        if [int(r) for r in record["rows"]] != list(self.row_chunks):
            raise ValueError(
                f"the checkpoint's sites were written for row chunks {record['rows']}; this data has chunks "
                f"{list(self.row_chunks)}: resume with the same chunking"
            )
        sites = self._file_sites(record["site_files"], dtype)
        if self.site_root is None:
            return tuple(self.client.persist(list(sites)))
        generation, files = self._new_generation()
        self._write_files(files, *sites)
        return self._file_sites(files, dtype, generation)

    def _write_files(self, files, site_precision, site_shift):
        """Each chunk's sites written by a worker into its file (``checkpoints.save_site_chunk``, atomic)."""
        import dask

        _, _, nus, mus = self._blocks(None, None, site_precision, site_shift)
        self.client.gather(_compute_windowed(
            self.client, [dask.delayed(checkpoints.save_site_chunk)(f, nb, mb) for f, nb, mb in zip(files, nus, mus)]))

    @staticmethod
    def release_sites(record):
        """Remove the site files of earlier checkpoints (once the checkpoint naming ``record`` is in place)."""
        checkpoints.release_older_steps(os.path.dirname(record["site_files"][0]))

    def validation_scores(self, kernel, Z, post, X_val, y_val, **likelihood):
        return _model(Z).validation_scores(kernel, Z, post, X_val, y_val, **likelihood)

    # -- passes ---------------------------------------------------------------------------------------

    def _blocks(self, *arrays):
        """Per row chunk, the chunk of each array (delayed objects), lists aligned; None stays None."""
        out = []
        for a in arrays:
            if a is None:
                out.append([None] * len(self.row_chunks))
                continue
            parts = a.to_delayed()
            out.append([p[0] for p in parts] if a.ndim == 2 else list(parts))
        return out

    def _sweep(self, kernel, Z, X, y, site_precision, site_shift, post, *, want_grad, block_rows, want_sums, want_sites,
               batch, damping=None, nonnegative=False, weights=None, adf=False, likelihood=None):
        """One task a chunk running ``_chunk_sweep`` (``batch``: batch EP's sweep, which takes ``nonnegative`` for
        a binary model; ``weights``: the rows' sample weights, a dask array chunked as the rows); returns the tree-reduced small results, with the new (damped) sites (``want_sites``) as
        dask arrays: persisted on the workers, or read from the files the tasks wrote. ``adf``: ADF's row terms (the
        sweep's ``adf``); ``likelihood``: a binary model's (the sweep's; None: the probit)."""
        import dask

        client = self.client
        options = dict(want_grad=want_grad, block_rows=block_rows, batch=batch, want_sums=want_sums, damping=damping)
        if batch and Z.ndim == 2:
            options["nonnegative"] = nonnegative
        if adf:
            options["adf"] = True
        if likelihood is not None:
            options["likelihood"] = likelihood
        Xs, ys, nus, mus, ws = self._blocks(X, y, site_precision, site_shift, weights)
        weighted = [{} if wb is None else {"weights": wb} for wb in ws]
        to_files = want_sites and self.site_root is not None
        if to_files:
            generation, files = self._new_generation()
            tasks = [dask.delayed(_sweep_to_files)(kernel, Z, Xb, yb, nb, mb, post, path=f, **options, **wb)
                     for Xb, yb, nb, mb, f, wb in zip(Xs, ys, nus, mus, files, weighted)]
        else:
            tasks = [dask.delayed(_chunk_sweep)(kernel, Z, Xb, yb, nb, mb, post, want_sites=want_sites, **options, **wb)
                     for Xb, yb, nb, mb, wb in zip(Xs, ys, nus, mus, weighted)]
        futures = _compute_windowed(client, tasks)
        small = futures if to_files else [client.submit(blocks.without_rows, f) for f in futures]
        reduced = _tree(client, small, blocks.add_sweeps).result()
        if to_files:
            reduced["site_precision"], reduced["site_shift"] = self._file_sites(files, Z.dtype, generation)
        elif want_sites:
            columns = _site_shape(0, Z)[1:]
            reduced["site_precision"] = self._rows(futures, "site_precision", Z.dtype, columns)
            reduced["site_shift"] = self._rows(futures, "site_shift", Z.dtype, columns)
        return reduced

    def _rows(self, futures, name, dtype, columns=()):
        """A per-row output of the chunks' tasks (``futures``, one a chunk, each a dict; ``columns`` the
        shape of a row's) as a dask array chunked like the rows, persisted where the tasks ran: it never
        comes to the driver."""
        import dask.array as da

        client = self.client
        return client.persist(da.concatenate([
            da.from_delayed(client.submit(operator.getitem, f, name), shape=(r, *columns), dtype=dtype)
            for f, r in zip(futures, self.row_chunks)
        ]))

    def evaluate(self, kernel, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None,
                 want_sites=True, damping=None, checked=True, nonnegative_sites=False, site_sums=None,
                 want_next_sums=False, weights=None, likelihood=None):
        """``ep.evaluate`` (``multiclass_ep.evaluate`` for a multiclass model) with the two per-row stages run
        chunk by chunk on the workers (the second alone when ``site_sums`` are given). ``nonnegative_sites``,
        ``site_sums``, ``want_next_sums``, ``weights`` (a dask array chunked as the rows) and ``likelihood``: as
        ``ep.evaluate`` takes them (binary model only)."""
        import dask

        if Z.ndim == 3 and (site_sums is not None or want_next_sums):
            raise ValueError("site_sums and want_next_sums are for a binary model's passes")
        client = self.client
        if Z.ndim == 3:  # per class: L_K for q, L_K^-1 for the chunks' projections
            L_K, L_K_inv = multiclass_ep.prior_choleskys(kernel, Z, jitter, checked)
            prior = L_K_inv
        else:
            L_K = prior = prior_cholesky(kernel, Z, jitter, checked=checked)
        if site_sums is None:
            Xs, ys, nus, mus, ws = self._blocks(X, y, site_precision, site_shift, weights)
            sums = _compute_windowed(client, [dask.delayed(_chunk_sums)(kernel, Z, Xb, yb, nb, mb, prior, block_rows,
                                                                        nonnegative_sites, wb)
                                              for Xb, yb, nb, mb, wb in zip(Xs, ys, nus, mus, ws)])
            S, c_tilde = _tree(client, sums, blocks.tree_add).result()
        else:
            S, c_tilde = site_sums
        if Z.ndim == 3:
            post = multiclass_ep.posteriors_from_sums(L_K, L_K_inv, S, c_tilde, checked=checked)
        else:
            post = posterior_from_sums(L_K, S, c_tilde, checked=checked)
        sweep = self._sweep(kernel, Z, X, y, site_precision, site_shift, post, want_grad=want_grad,
                            block_rows=block_rows, want_sums=want_next_sums, want_sites=want_sites, damping=damping,
                            batch=True, nonnegative=nonnegative_sites, weights=weights, likelihood=likelihood)
        out = _model(Z).finish_evaluate(kernel, Z, post, sweep, want_grad)
        if want_next_sums:
            out["site_sums"] = ep.next_site_sums(sweep["sums"], (S, c_tilde), damping)
        return out

    def evaluate_factor(self, kernel, Z, X, y, factor, *, cavity, n_total, site_precision=None, site_shift=None,
                        jitter, want_grad=True, block_rows=None, weights=None, checked=True, likelihood=None):
        """``ep.evaluate_factor`` (SEP / ADF in batch mode; ``multiclass_ep``'s for a multiclass model) with the
        sweep run chunk by chunk; ``weights``: the rows' sample weights (a dask array chunked as the rows), the rows
        counted by them; ``likelihood``: a binary model's, as ``ep.evaluate_factor`` takes it; ``cavity``: a
        ``sites.Cavity`` or its name, as it takes it."""
        model = _model(Z)
        cavity = cavity_of(cavity)
        prep = model.factor_cavity(kernel, Z, factor, cavity=cavity, n_total=n_total, jitter=jitter, checked=checked)
        if not cavity.own_sites:
            site_precision = site_shift = self.zero_sites(X.shape[0], Z)
        sweep = self._sweep(kernel, Z, X, y, site_precision, site_shift, prep["cavity"], want_grad=want_grad,
                            block_rows=block_rows, want_sums=True, want_sites=False, batch=False, weights=weights,
                            adf=cavity.adf, likelihood=likelihood)
        return model.finish_factor(kernel, Z, prep, sweep, n_total / self.total_weight(weights, X.shape[0]), want_grad)

    def total_weight(self, weights, rows):
        """sum(weights) of rows on the cluster (``rows`` without weights), summed there once for each weights
        array (its dask name): a batch pass counts the rows by the same weights every time."""
        if weights is None:
            return rows
        if weights.name not in self._weight_totals:
            self._weight_totals[weights.name] = float(self.client.compute(weights.sum(), sync=True))
        return self._weight_totals[weights.name]

    # -- vi-JJ / vi-Taylor: the two passes of ``variational.quadratic_bound``, a task a chunk each --------

    def quadratic_bound(self, kernel, Z, X, y, xi, *, kind, jitter, want_grad=True, want_xi_grad=False,
                        block_rows=None, weights=None):
        """``variational.quadratic_bound`` with its two passes over the rows run a task a chunk: the chunks'
        sums (S, c~, sum const_i), added in a tree, fix q on the driver; then the chunks' terms (value,
        adjoints), added likewise. ``mean`` and ``var`` (per row) come back as dask arrays on the workers.
        ``weights``: the rows' sample weights (a dask array chunked as the rows), each chunk's bound weighted as
        ``variational.weighted_quadratic_sites`` weights it in memory."""
        import dask

        if want_xi_grad:
            raise ValueError("the gradient in xi (vi-jj-hybrid, vi-jj-full) is not computed on a dask array")
        client = self.client
        L_K = prior_cholesky(kernel, Z, jitter)
        Xs, ys, xis, ws = self._blocks(X, y, xi, weights)
        sums = _compute_windowed(client, [dask.delayed(_chunk_quadratic_sums)(kernel, Z, Xb, yb, xb, kind, L_K,
                                                                              block_rows, wb)
                                          for Xb, yb, xb, wb in zip(Xs, ys, xis, ws)])
        S, c_tilde, const_sum = _tree(client, sums, blocks.tree_add).result()
        prep = variational.quadratic_posterior(L_K, S, c_tilde)
        futures = _compute_windowed(client, [dask.delayed(_chunk_quadratic_terms)(kernel, Z, Xb, yb, xb, prep, kind,
                                                                                  want_grad, block_rows, wb)
                                             for Xb, yb, xb, wb in zip(Xs, ys, xis, ws)])
        small = [client.submit(_without_quadratic_rows, f) for f in futures]
        terms = _tree(client, small, variational.add_quadratic_terms).result()
        out = variational.finish_quadratic_bound(kernel, Z, prep, const_sum, terms, want_grad=want_grad)
        out["mean"], out["var"] = (self._rows(futures, name, Z.dtype) for name in ("mean", "var"))
        return out

    def initial_xi(self, kernel, Z, X, kind, block_rows=None):
        """``variational.initial_xi`` a chunk a task: xi (one a row) persisted on the workers."""
        import dask
        import dask.array as da

        (Xs,) = self._blocks(X)
        return self.client.persist(da.concatenate([
            da.from_delayed(dask.delayed(_chunk_initial_xi)(kernel, Z, Xb, kind, block_rows), shape=(r,),
                            dtype=Z.dtype)
            for Xb, r in zip(Xs, self.row_chunks)
        ]))

    def update_xi(self, mean, var, kind):
        """``variational.update_xi`` chunk by chunk on the workers (xi stays there, persisted)."""
        import dask.array as da

        return self.client.persist(da.map_blocks(variational.update_xi, mean, var, kind, dtype=mean.dtype))


