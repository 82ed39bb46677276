"""The row blocks of a pass over the training rows: how many rows a block holds (its temporaries within a memory
share), how the blocks are read (data on disk a large read at a time, moved to the compute device a block at a time),
how a batch pass's blocks are shared among Python threads, and each thread's reused scratch arrays. What the blocks
compute is the passes' own (``agpc.inference.ep``, ``multiclass_ep``, ``gfitc``, ``variational``): nothing here knows
of sites or of q."""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for

from .. import threads
from ..backend import (
    array_device,
    array_namespace,
    blas_releasing_the_lock,
    is_out_of_core,
    note_block_rows,
    read_rows,
    row_slice,
    rows_within_memory,
    scratch,
    shares_host_threads,
)

__all__ = ["BLOCK_ELEMENTS", "CACHE_ELEMENTS", "BLOCK_MATRICES", "BLOCK_FEATURE_COPIES", "BLOCK_VECTORS",
           "SMALL_PASS_BYTES", "MIN_THREAD_ROWS", "block_bytes_per_row", "fewest_block_rows", "default_block_rows",
           "projections_fit", "row_blocks", "data_blocks", "map_blocks", "block_workers", "pass_layout", "BlockScratch", "tree_add",
           "accumulate", "without_rows", "add_sweeps"]


BLOCK_ELEMENTS = 1 << 21  # default block: ~16 MB of float64 per n x m temporary
CACHE_ELEMENTS = 1 << 26  # keep the projections of all blocks between the two passes up to ~512 MB

# Memory of a pass over a block of b rows, per row, in elements of the model's type: BLOCK_MATRICES n x m arrays
# per class, BLOCK_FEATURE_COPIES copies of the rows (n x d) and BLOCK_VECTORS n-vectors alive at once at the peak.
# Counted from ``block_pass`` with gradients, the heaviest pass: Knm, A and Q (``marginals``), then in
# ``data_adjoint`` the weighted Q, its solve and ``inner``, the stacked right-hand sides and their solve (two
# each), dKnm and the transients of the products after it; the kernel's ``_r2`` / ``_distance_grads`` hold the
# scaled, centred rows and their products with G; the cavities, moments and adjoint coefficients are vectors.
# Checked against tracemalloc's peak on NumPy per added row (tests/test_device_memory.py): 11 m + 6 d + 16
# measured for binary EP / SEP / GFITC, less for the variational passes (SVI 5 m, vi-JJ 8 m) and per class
# for multiclass EP (6 m: its classes' adjoints come one after the other).
BLOCK_MATRICES = 12
BLOCK_FEATURE_COPIES = 6
BLOCK_VECTORS = 32


def block_bytes_per_row(m, d, itemsize, classes=1):
    """Bytes a pass's temporaries take per row of a block (see ``BLOCK_MATRICES``): m inducing points, d
    features, ``itemsize`` bytes an element, ``classes`` latent functions (multiclass: one set of n x m
    temporaries each)."""
    return int(itemsize) * (classes * BLOCK_MATRICES * int(m) + BLOCK_FEATURE_COPIES * int(d) + BLOCK_VECTORS)


def _itemsize(Z):
    return array_namespace(Z).finfo(Z.dtype).bits // 8


# A pass whose temporaries for all its rows come to less than this does not ask the device for its free memory
# (a minibatch step: no driver call a step, nothing on the host between the kernels of a captured step).
SMALL_PASS_BYTES = 1 << 26


def fewest_block_rows(classes=1):
    """The fewest rows of a default block on the host (``default_block_rows``): 1024, 256 for several classes (their
    temporaries are C times larger). A fit's memory is at least one block of them (``agpc.size_rule``)."""
    return 1024 if classes == 1 else 256


def default_block_rows(Z, n=None):
    """Rows of a block when the caller gives none, for inducing points Z ((m, d), or (C, m, d) for C classes):
    ~16 MB per n x m temporary (``BLOCK_ELEMENTS`` / (m C), at least 1024 rows, 256 for several classes; the
    allocator then reuses the same memory block after block), and no more than the rows whose temporaries
    (``block_bytes_per_row``) fit in ``backend.DEVICE_MEMORY_FRACTION`` of the device's free memory (a GPU;
    on the host nothing changes). ``n``: the rows of the pass, when known; a pass of ``n`` rows whose
    temporaries total less than 64 MB is one block without a query of the device."""
    classes = Z.shape[0] if Z.ndim == 3 else 1
    m, d = Z.shape[-2], Z.shape[-1]
    rows = max(fewest_block_rows(classes), BLOCK_ELEMENTS // max(1, m * classes))
    per_row = block_bytes_per_row(m, d, _itemsize(Z), classes)
    if n is not None and n * per_row <= SMALL_PASS_BYTES:
        return rows
    fit = rows_within_memory(per_row, array_namespace(Z), array_device(Z))
    return rows if fit is None else min(rows, fit)


def projections_fit(n, Z, classes=1):
    """Whether every block's projections (A and Knm: 2 n m elements a class) may be kept between a pass's two
    stages: within ``CACHE_ELEMENTS`` and, on a device, within half of the memory share the blocks may use
    (the blocks, sized before the cache filled, keep the rest)."""
    m = Z.shape[-2]
    if 2 * classes * n * m > CACHE_ELEMENTS:
        return False
    fit = rows_within_memory(2 * classes * m * _itemsize(Z), array_namespace(Z), array_device(Z))
    return fit is None or n <= fit // 2


def row_blocks(n, block_rows, m=None):
    """Row ranges. By default blocks of ~16 MB per n x m temporary: the allocator then reuses the same
    memory block after block (fresh 100+ MB temporaries cost more in page faults than in arithmetic) and
    the working set stays in cache."""
    if not block_rows:
        block_rows = n if m is None else max(1024, BLOCK_ELEMENTS // max(1, m))
    step = max(1, int(block_rows))
    return [(start, min(n, start + step)) for start in range(0, n, step)]


_IO_ROWS = 65536  # rows read at a time from data on disk: one read, then compute blocks sliced from it


def data_blocks(X, y, block_rows, like):
    """(lo, hi, X rows, y rows or None) over all rows, in blocks of ``block_rows`` rows (None:
    ``default_block_rows(like, n)``), each moved to ``like``'s namespace and device as it comes.

    Data on disk, and host arrays streamed to a device (``backend.HostRows``), are read ``_IO_ROWS`` rows at a
    time onto the host (a zarr chunk is decoded once, not once per compute block) and only the compute
    blocks sliced from what was read go to the device, so the device holds one block of rows at a time."""
    n = X.shape[0]
    block_rows = block_rows or default_block_rows(like, n)
    blocks = row_blocks(n, block_rows)
    note_block_rows(blocks[0][1] - blocks[0][0] if blocks else block_rows)
    if not (is_out_of_core(X) or (y is not None and is_out_of_core(y))):
        for lo, hi in blocks:
            yield lo, hi, read_rows(X, lo, hi, like), (None if y is None else read_rows(y, lo, hi, like))
        return
    step = blocks[0][1] - blocks[0][0]
    io_rows = max(step, _IO_ROWS)
    for io_lo in range(0, n, io_rows):
        io_hi = min(n, io_lo + io_rows)
        # one read each, as stored (NumPy for data on disk or on the host; labels on the device stay there)
        X_io = row_slice(X, io_lo, io_hi)
        y_io = None if y is None else row_slice(y, io_lo, io_hi)
        for lo in range(io_lo, io_hi, step):
            hi = min(io_hi, lo + step)
            yield (lo, hi, read_rows(X_io, lo - io_lo, hi - io_lo, like),
                   None if y_io is None else read_rows(y_io, lo - io_lo, hi - io_lo, like))


def map_blocks(function, arguments, workers):
    """``(arguments, function(*arguments))`` for each tuple of ``arguments`` (an iterable: the blocks of a pass), in
    order. With ``workers`` > 1, that many calls run at once in Python threads, each BLAS call on one thread
    (``threads.one_blas_thread``), the next block read while they run; only NumPy arrays are spread so
    (``pass_workers``), their BLAS calls releasing the interpreter lock (``backend.blas_releasing_the_lock``). Each
    call runs in a copy of the caller's context, so that the backend's context variables (``reference_paths``,
    ``counting_fast_calls``, the block rows in use) hold on the threads too. The
    per-block results, and so every sum over blocks taken in order, are those of one thread. The threads are
    ``block_pool``'s, kept from pass to pass. The one-thread BLAS limit and the lock-free BLAS hold until the
    generator ends, and no block of it runs after: a caller closes it (``contextlib.closing``) so that they end with
    an error in its loop too, not when the traceback is freed."""
    if workers <= 1:
        for item in arguments:
            yield item, function(*item)
        return
    pending = deque()
    process = os.getpid()
    with threads.one_blas_thread(), blas_releasing_the_lock(), block_pool(workers) as (pool, marker):
        try:
            for item in arguments:
                pending.append((item, pool.submit(contextvars.copy_context().run, function, *item)))
                if len(pending) > workers:  # ``workers`` running and one more queued behind them
                    item, future = pending.popleft()
                    yield item, future.result()
            while pending:
                item, future = pending.popleft()
                yield item, future.result()
        finally:  # an error (or a consumer that stopped): queued blocks are not started, running ones end first
            for _, future in pending:
                future.cancel()
            # (not where they cannot end: in a forked child, whose copies of them never run, nor on a thread of this
            # pass's pool, where the collector may close a pass no one closed, its own block among them)
            if os.getpid() == process and getattr(_BLOCK_THREAD, "pool", None) is not marker:
                wait_for([future for _, future in pending])


# The thread pool of batch passes, kept from pass to pass: a pass of a fit's step took two new threads, and starting
# them (each waits until it first runs, on cores the pass's other threads keep busy) took 0-7% of the time of fits
# with n_jobs = 2 (interleaved, a fixed number of steps: benchmarks/results/block_threads_amd_epyc.md). One pool, of
# the last pass's size (a pass of another size ends it: idle threads are not kept for every size ever used), used by
# one pass at a time (``_KEPT_IN_USE``).
_KEPT = {"pool": None, "marker": None, "workers": 0}
_KEPT_IN_USE = threading.Lock()
_BLOCK_THREAD = threading.local()  # ``pool``: on a pool's threads, the pool's marker


def _mark_block_thread(marker):
    _BLOCK_THREAD.pool = marker


def _new_pool(workers, prefix):
    """(a ThreadPoolExecutor of ``workers`` threads, the marker its threads carry)."""
    marker = object()
    return ThreadPoolExecutor(workers, thread_name_prefix=prefix, initializer=_mark_block_thread,
                              initargs=(marker,)), marker


@contextlib.contextmanager
def block_pool(workers):
    """(a pool of ``workers`` Python threads for a pass's blocks, the marker its threads carry in
    ``_BLOCK_THREAD.pool``): the kept one where no other pass is using it, else
    (a pass started inside a block, whose pool is busy with the blocks that wait for it, or a pass of another
    Python thread) a pool of its own, ended with the pass. The blocks' scratch arrays (``BlockScratch``, a
    thread-local) live as long as the pass's ``BlockScratch`` object, not as long as the kept threads."""
    in_use = _KEPT_IN_USE  # (the lock this pass takes is the one it gives back, also across a fork)
    if not in_use.acquire(blocking=False):
        pool, marker = _new_pool(workers, "agpc-block-own")
        with pool:
            yield pool, marker
        return
    try:
        if _KEPT["pool"] is None or _KEPT["workers"] != workers:
            if _KEPT["pool"] is not None:
                _KEPT["pool"].shutdown(wait=False)  # (idle, unless the pass that used it was interrupted)
            pool, marker = _new_pool(workers, "agpc-block")
            _KEPT.update(pool=pool, marker=marker, workers=workers)
        yield _KEPT["pool"], _KEPT["marker"]
    finally:
        in_use.release()


def _forget_pools():
    """In a forked child: the parent's pool threads do not exist there (a pool would queue blocks no thread runs),
    and a pass of another parent thread may have held the pool when it forked."""
    global _KEPT_IN_USE
    _KEPT.update(pool=None, marker=None, workers=0)
    _KEPT_IN_USE = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def block_workers(like, block_count):
    """Python threads a pass over ``block_count`` blocks of ``like``'s namespace runs its blocks on: the BLAS
    threads the caller's scope allows (``threads.pass_workers``) for NumPy arrays, at most one a block; 1 for
    other libraries (a GPU runs its own parallelism)."""
    if block_count < 2 or not shares_host_threads(like):
        return 1
    return max(1, min(threads.pass_workers(), block_count))


MIN_THREAD_ROWS = 256  # rows a thread takes of a batch pass at least (fewer: handing them over costs more than they)


def pass_layout(like, n, block_rows=None):
    """(rows a block, Python threads) for a batch pass over n rows: ``block_rows`` (default ``default_block_rows``),
    or all n rows when fewer, shared among the threads (at most one a ``MIN_THREAD_ROWS`` rows), so that the
    blocks in flight at once hold about one such block's temporaries, as ``block_rows`` means on one thread; a pass
    of fewer rows than one block is so split in as many blocks as threads. With more than one thread the blocks
    are of equal rows (the last one fewer by less than a row a block) and, where that leaves them so, as many as a
    multiple of the threads, so that the threads take as many rows to within one block (small blocks over many
    rows: their count is then ceil(n / rows), which may not be a multiple; one block more or less a thread is a
    small share of its rows there)."""
    rows = max(1, min(n, int(block_rows) if block_rows else default_block_rows(like, n)))
    workers = block_workers(like, max(-(-n // rows), n // MIN_THREAD_ROWS))
    if workers == 1:
        return rows, workers
    # blocks of equal rows, as many as a multiple of the threads: satellite's multiclass pass, n = 5,792 in blocks
    # of 1,748, was four, the last of 548 rows, and one thread took 3,496 rows where the other took 2,296
    count = -(-n // max(1, -(-rows // workers)))
    count = workers * -(-count // workers)
    return max(1, -(-n // count)), workers


class BlockScratch(threading.local):
    """A thread's n x m arrays for the blocks of a batch pass (``backend.scratch``: NumPy; none elsewhere), reused
    block after block: a fresh n x m temporary costs its page faults, about as much as a pass over it. One set a
    thread."""

    def __init__(self):
        self.arrays = {}

    def __call__(self, name, shape, like):
        array = self.arrays.get(name)
        if array is None or tuple(array.shape) != tuple(shape):
            array = self.arrays[name] = scratch(shape, like)
        return array


# -- the blocks' results, added in order -------------------------------------------------------------------

def tree_add(x, y):
    """x + y for arrays and for dicts / tuples of them (None stays None)."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: tree_add(x[k], y[k]) for k in x}
    if isinstance(x, tuple):
        return tuple(tree_add(u, v) for u, v in zip(x, y))
    return x + y


def accumulate(out, block, *, want_sums, want_grad):
    """Add one block's reductions (log Z terms, sums, adjoints, gradients) into a sweep's running totals."""
    n_invalid = getattr(block, "n_invalid", None)  # (the multiclass pass counts its own)
    for key, value, wanted in (("terms", block.log_z_terms, True), ("n_invalid", n_invalid, n_invalid is not None),
                               ("sums", block.sums, want_sums),
                               ("dKmm_data", block.dKmm_data, want_grad), ("grads", block.grads, want_grad)):
        if wanted:
            out[key] = value if out[key] is None else tree_add(out[key], value)


_PER_ROW_KEYS = ("site_precision", "site_shift", "valid")


def without_rows(sweep):
    """A sweep's result without its per-row outputs (what a chunk sends to be reduced)."""
    return {k: (None if k in _PER_ROW_KEYS else v) for k, v in sweep.items()}


def add_sweeps(a, b):
    """Two chunks' sweep results added (sums, terms, adjoints, counts; the site-change maxima by maximum);
    per-row outputs are dropped: they stay with their chunk."""
    out = {k: (None if k in _PER_ROW_KEYS else tree_add(a[k], b[k])) for k in a if k != "site_change"}
    change = a.get("site_change")
    out["site_change"] = None if change is None else array_namespace(change).maximum(change, b["site_change"])
    return out
