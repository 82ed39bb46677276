"""Array namespaces and the few numerical operations the array API standard lacks.

This is the only module that knows which array library it is talking to. Everything else calls
``array_namespace(x)`` once and then uses the standard; what the standard does not have (triangular
solves, a Cholesky that escalates jitter, the log of the normal CDF, Gauss-Hermite nodes, random
numbers, moving data between libraries) lives here, dispatched per library with a generic fallback
written in standard operations only, so that it runs on ``array_api_strict`` and therefore on any
conforming library.
"""

from __future__ import annotations

import contextvars
import importlib
import math
import types
import warnings
from contextlib import contextmanager

import numpy as np
import scipy.linalg
import scipy.special
from array_api_compat import (
    array_namespace,
    device as array_device,
    is_array_api_obj,
    is_cupy_namespace,
    is_dask_array,
    is_numpy_namespace,
)
from array_api_compat import numpy as compat_numpy

__all__ = [
    "CholeskyError",
    "JitterWarning",
    "ModulesByName",
    "jitter_report",
    "note_jitter",
    "is_dask_array",
    "row_chunk_bounds",
    "array_namespace",
    "array_device",
    "resolve_backend",
    "solve_triangular",
    "lower_triangular_inverse",
    "cholesky_inverse",
    "add_to_diagonal",
    "cholesky",
    "cholesky_or_nan",
    "cholesky_with_jitter",
    "machine_epsilon",
    "jitter_floor",
    "log_ndtr",
    "ndtr",
    "log_normal_pdf",
    "gauss_hermite",
    "to_numpy",
    "to_host_vector",
    "asarray_like",
    "host_rng",
    "host_array",
    "is_out_of_core",
    "read_rows",
    "row_slice",
    "HostRows",
    "DEVICE_MEMORY_FRACTION",
    "device_free_bytes",
    "rows_within_memory",
    "BlockMemoryError",
    "note_block_rows",
    "block_memory_advice",
]


class CholeskyError(np.linalg.LinAlgError):
    """A Cholesky factorisation failed even after adding jitter to the diagonal."""


class JitterWarning(UserWarning):
    """A matrix had to be regularised with more jitter than configured for its Cholesky factorisation to
    succeed: the model is (slightly) not the one asked for. Filter it with
    ``warnings.simplefilter("ignore", agpc.JitterWarning)`` or make it an error to refuse such fits."""


# The jitter raises of the current ``jitter_report`` scope (None outside one): (what, from, to) triples.
_JITTER_RAISES = contextvars.ContextVar("agpc_jitter_raises", default=None)


def note_jitter(what, before, after):
    """Report that the jitter on the diagonal of ``what`` had to go from ``before`` to ``after``: collected
    by the enclosing ``jitter_report`` (one warning for a whole fit), or a ``JitterWarning`` now."""
    raises = _JITTER_RAISES.get()
    if raises is None:
        warnings.warn(f"jitter raised: {what} from {before:.1e} to {after:.1e}", JitterWarning, stacklevel=3)
    else:
        raises.append((what, float(before), float(after)))


@contextmanager
def jitter_raises_within():
    """The jitter raises (``note_jitter``: (what, from, to) triples) made inside, as a list, for a caller that
    must know them (the jitter a final factor was built with); they are passed on to the enclosing
    ``jitter_report`` on exit, or, outside one, warned about as ``note_jitter`` does."""
    outer = _JITTER_RAISES.get()
    raises = []
    token = _JITTER_RAISES.set(raises)
    try:
        yield raises
    finally:
        _JITTER_RAISES.reset(token)
        if outer is not None:
            outer.extend(raises)
        else:
            for what, before, after in raises:
                warnings.warn(f"jitter raised: {what} from {before:.1e} to {after:.1e}", JitterWarning, stacklevel=3)


@contextmanager
def jitter_report(task, stacklevel=4):
    """Collect the jitter raises (``note_jitter``) inside, and after it one ``JitterWarning`` for ``task``
    (e.g. "fit") saying, for each matrix, from what to what the jitter went and how often. Nested scopes
    report into the outermost one; no warning when the body raises (the error says more). ``stacklevel``
    as for ``warnings.warn``, counted from the ``with`` statement's frame plus one (the default points at
    the caller of the function holding the ``with``)."""
    if _JITTER_RAISES.get() is not None:
        yield
        return
    raises = []
    token = _JITTER_RAISES.set(raises)
    try:
        yield
    finally:
        _JITTER_RAISES.reset(token)
    if raises:
        by_matrix = {}
        for what, before, after in raises:
            low, high, count = by_matrix.get(what, (before, after, 0))
            by_matrix[what] = (min(low, before), max(high, after), count + 1)
        parts = [f"{what} from {low:.1e} to {high:.1e} ({count} time{'s' if count > 1 else ''})"
                 for what, (low, high, count) in by_matrix.items()]
        warnings.warn(
            f"{task}: jitter had to be raised for the Cholesky factorisations to succeed: " + "; ".join(parts)
            + " (inducing points too close together, or features on very different scales?)",
            JitterWarning, stacklevel=stacklevel,
        )


# --------------------------------------------------------------------------------------------------
# namespaces


class ModulesByName:
    """Pickling (and ``copy.deepcopy``) for objects that keep modules as attributes (an array namespace, the
    module of an engine's passes): modules do not pickle, so they travel by their import name and are
    imported again on unpickling (``array_api_compat.numpy`` comes back as the same module object)."""

    def __getstate__(self):
        return {k: (_ModuleName(v.__name__) if isinstance(v, types.ModuleType) else v) for k, v in vars(self).items()}

    def __setstate__(self, state):
        self.__dict__.update({k: (importlib.import_module(v.name) if isinstance(v, _ModuleName) else v)
                              for k, v in state.items()})


class _ModuleName:
    """A module in a pickle: its import name."""

    def __init__(self, name):
        self.name = name


def resolve_backend(backend):
    """Turn ``backend`` into an array namespace.

    ``"numpy"`` and ``"cupy"`` name the array-api-compat wrapped libraries; an array namespace object
    (a module such as ``array_api_strict``) is returned as given; ``None`` and ``"auto"`` return
    ``None``, meaning "the namespace of the input data".
    """
    if backend is None or (isinstance(backend, str) and backend == "auto"):
        return None
    if isinstance(backend, str):
        name = backend.lower()
        if name == "numpy":
            return compat_numpy
        if name == "cupy":
            try:
                import cupy  # noqa: F401
                import array_api_compat.cupy as xp
            except Exception as exc:  # ImportError, or CUDA runtime missing
                raise ValueError(
                    "backend='cupy' needs CuPy and a CUDA device; install agpc[gpu] "
                    f"(cupy could not be imported: {exc})"
                ) from exc
            return xp
        raise ValueError(
            f"unknown backend {backend!r}: use 'auto', 'numpy', 'cupy' or an array namespace module"
        )
    if hasattr(backend, "asarray") and hasattr(backend, "linalg") and hasattr(backend, "float64"):
        return backend
    raise ValueError(
        f"unknown backend {backend!r}: use 'auto', 'numpy', 'cupy' or an array namespace module"
    )


def _is_strict(xp):
    return getattr(xp, "__name__", "").startswith("array_api_strict")


def to_numpy(x):
    """Copy an array of any supported library to a NumPy array on the host (an edge operation)."""
    if isinstance(x, np.ndarray):
        return x
    if not is_array_api_obj(x):
        return np.asarray(x)
    xp = array_namespace(x)
    if is_numpy_namespace(xp):
        return np.asarray(x)
    if is_cupy_namespace(xp):
        return x.get()
    if _is_strict(xp):
        # array_api_strict refuses to hand arrays on its non-default devices to NumPy; move first.
        x = x.to_device(xp.Device("CPU_DEVICE"))
    return np.asarray(x)


def to_host_vector(x):
    """A small array of any supported library as a flat NumPy float64 vector: one device-to-host transfer
    (what a training step brings to the host)."""
    return np.reshape(np.asarray(to_numpy(x), dtype=np.float64), (-1,))


def asarray_like(x, xp, device=None, dtype=None):
    """Bring ``x`` (any library, or a NumPy/host value) into namespace ``xp`` on ``device``."""
    if is_array_api_obj(x):
        src = array_namespace(x)
        if src is xp or getattr(src, "__name__", None) == getattr(xp, "__name__", 0):
            out = x if dtype is None else xp.astype(x, dtype)
            if device is not None and array_device(out) != device:
                out = xp.asarray(out, device=device) if not _is_strict(xp) else out.to_device(device)
            return out
        x = to_numpy(x)
    if dtype is None:
        return xp.asarray(x, device=device)
    return xp.asarray(x, dtype=dtype, device=device)


def is_out_of_core(X):
    """Data read a block at a time: a NumPy memmap, or an array-like with shape, dtype and slicing that
    is not an in-memory array (zarr, h5py, ...). Lists, DataFrames and sparse matrices are not."""
    if isinstance(X, np.memmap):
        return True
    if is_array_api_obj(X) or isinstance(X, (list, tuple)) or hasattr(X, "iloc"):
        return False
    import scipy.sparse

    if scipy.sparse.issparse(X):
        return False
    return hasattr(X, "shape") and hasattr(X, "dtype") and hasattr(X, "__getitem__")


def row_slice(X, lo, hi):
    """X[lo:hi, ...] spelled with one index per axis (array_api_strict insists), for arrays and array-likes."""
    return X[(slice(lo, hi),) + (slice(None),) * (len(X.shape) - 1)]


def row_chunk_bounds(X):
    """(start, stop) of each stored chunk of rows of an array on disk or on a cluster (zarr, h5py, a dask
    array's chunks), or one (0, n) for data without chunks. Minibatches are laid inside these so that a
    minibatch reads one chunk, and an epoch reads each chunk once."""
    n = int(X.shape[0])
    chunks = getattr(X, "chunks", None)
    if not chunks:
        return [(0, n)]
    rows = chunks[0]
    if isinstance(rows, tuple):  # dask: the size of every chunk
        edges = [0]
        for size in rows:
            edges.append(edges[-1] + int(size))
        return list(zip(edges[:-1], edges[1:]))
    rows = int(rows)  # zarr / h5py: one chunk shape
    return [(lo, min(n, lo + rows)) for lo in range(0, n, rows)]


def read_rows(X, lo, hi, like):
    """Rows lo:hi of ``X`` (in memory or on disk) as a float array in ``like``'s namespace and device."""
    block = row_slice(X, lo, hi)
    if isinstance(block, np.memmap):
        block = np.asarray(block)
    xp = array_namespace(like)
    return asarray_like(block, xp, device=array_device(like), dtype=like.dtype)


class HostRows:
    """Rows of an in-memory host (NumPy) array that stay on the host and reach the compute device a block at
    a time: X larger than the device's memory. It looks like data on disk to the passes and the training loop
    (``is_out_of_core``: shape, dtype, row slices that return NumPy arrays), so it takes their one block-reading
    path (``ep.data_blocks``); it has no stored chunks (minibatches are laid over all rows)."""

    def __init__(self, array):
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = array.ndim

    def __getitem__(self, index):
        return self.array[index]


# --------------------------------------------------------------------------------------------------
# device memory

# Share of the device's free memory a pass's row blocks (and its cached projections) may take: the rest is
# headroom for what the count of a block's temporaries (``ep.block_bytes_per_row``, measured on NumPy) does not
# see -- a library's own workspaces (cuBLAS, cuSOLVER), copies it makes that NumPy does not, the allocator's
# rounding of block sizes -- and for other users of the device.
DEVICE_MEMORY_FRACTION = 0.5


class BlockMemoryError(MemoryError):
    """A pass over row blocks ran out of (device) memory: the message names the pass, the rows a block had
    and how to lower it (``GPClassifier(block_rows=...)``). The library's own error is its ``__cause__``."""


def device_free_bytes(xp, device=None):
    """Bytes that arrays of namespace ``xp`` can still get on ``device``; None when the device sets no limit
    of its own (NumPy and other host libraries: the operating system's memory, not counted here).

    CuPy: the free memory of the device (``cupy.cuda.runtime.memGetInfo``) plus the bytes CuPy's default
    memory pool holds but does not use (reused before the pool asks the device for more); under a pool
    limit (``MemoryPool.set_limit``), no more than what the limit leaves."""
    if not is_cupy_namespace(xp):
        return None
    import cupy

    with cupy.cuda.Device(device if isinstance(device, int) else getattr(device, "id", None)):
        free, _total = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        available = int(free) + int(pool.free_bytes())
        limit = int(pool.get_limit())
        if limit:
            available = min(available, limit - int(pool.used_bytes()))
    return max(0, available)


def rows_within_memory(bytes_per_row, xp, device=None, fraction=DEVICE_MEMORY_FRACTION):
    """The most rows whose ``bytes_per_row`` fit in ``fraction`` of the free memory of ``device``
    (``device_free_bytes``), at least 1; None when the device sets no limit."""
    free = device_free_bytes(xp, device)
    if free is None:
        return None
    return max(1, int(fraction * free) // max(1, int(bytes_per_row)))


# The rows of the blocks the innermost pass over row blocks cut (``note_block_rows``), for the message of an
# enclosing ``block_memory_advice``.
_BLOCK_ROWS_IN_USE = contextvars.ContextVar("agpc_block_rows_in_use", default=None)


def note_block_rows(rows):
    """Say that a pass now walks row blocks of ``rows`` rows (read by ``block_memory_advice``)."""
    _BLOCK_ROWS_IN_USE.set(int(rows))


@contextmanager
def block_memory_advice(what):
    """Running out of memory inside (CuPy's ``cupy.cuda.memory.OutOfMemoryError`` is a ``MemoryError``, as is
    the host's) becomes one ``BlockMemoryError`` naming ``what`` (the pass), the rows of the blocks it was
    walking and how to lower them. A MemoryError, not a ValueError: nothing about the input is wrong, the
    same call fits with smaller blocks or on a larger device, and code that catches MemoryError still does."""
    token = _BLOCK_ROWS_IN_USE.set(None)
    try:
        yield
    except BlockMemoryError:
        raise
    except MemoryError as error:
        rows = _BLOCK_ROWS_IN_USE.get()
        if rows is None:
            where = "before its first block of rows (the m x m algebra, or the data moved to the device at once)"
            advice = "use fewer inducing points, or keep X on the host (a NumPy array: it then moves a block at a time)"
        else:
            where = f"with row blocks of {rows} rows"
            advice = (f"lower the block size: GPClassifier(block_rows={max(1, rows // 4)}) (block_rows= for "
                      f"agpc.inference.training.train), or free memory on the device")
        raise BlockMemoryError(
            f"{what} ran out of memory {where}: {advice} ({type(error).__name__}: {error})") from error
    finally:
        _BLOCK_ROWS_IN_USE.reset(token)


def host_array(values, dtype=np.float64):
    """A NumPy array on the host from Python numbers (parameters are born here, then moved)."""
    return np.asarray(values, dtype=dtype)


def host_rng(random_state):
    """A NumPy ``Generator`` from a seed, a Generator or ``None``.

    Random choices (inducing-point initialisation, minibatch order) are drawn on the host and moved to
    the device as indices, so that the same seed gives the same model on every backend.
    """
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    return np.random.default_rng(random_state)


# --------------------------------------------------------------------------------------------------
# linear algebra


def solve_triangular(L, B, *, lower=True, trans=False):
    """Solve ``op(L) X = B`` with ``L`` triangular; ``op`` is the transpose when ``trans``."""
    xp = array_namespace(L, B)
    if is_numpy_namespace(xp):
        return scipy.linalg.solve_triangular(
            L, B, lower=lower, trans=1 if trans else 0, check_finite=False
        )
    if is_cupy_namespace(xp):
        import cupyx.scipy.linalg

        return cupyx.scipy.linalg.solve_triangular(L, B, lower=lower, trans=1 if trans else 0)
    # Generic fallback: a dense solve. O(m^3 + m^2 k) like the triangular one, only slower. A vector
    # right-hand side goes in as one column (the standard's solve broadcasts 1-D x2 ambiguously).
    A = L.mT if trans else L
    if B.ndim == 1:
        return xp.linalg.solve(A, B[:, None])[:, 0]
    return xp.linalg.solve(A, B)


def lower_triangular_inverse(L):
    """L^-1 of a lower-triangular L (m, m), or of each L[c] of a stack (C, m, m), by a triangular solve
    against the identity."""
    xp = array_namespace(L)
    if L.ndim == 3:
        return xp.stack([lower_triangular_inverse(L[c, ...]) for c in range(L.shape[0])])
    eye = xp.eye(L.shape[0], dtype=L.dtype, device=array_device(L))
    return solve_triangular(L, eye, lower=True)


def cholesky_inverse(L):
    """A^-1 from the lower Cholesky factor L of A (m, m): LAPACK's potri on NumPy (the triangular inverse and
    L^-T L^-1 in one, about 2 m^3 / 3 flops against 7 m^3 / 3 for an inverse and a general product), else
    L^-T L^-1 from ``lower_triangular_inverse``. Symmetric to the last bit."""
    xp = array_namespace(L)
    if is_numpy_namespace(xp):
        inverse, info = scipy.linalg.lapack.dpotri(L, lower=1) if L.dtype == np.float64 else \
            scipy.linalg.lapack.spotri(L, lower=1)
        if info != 0:  # a zero (or NaN) on L's diagonal: the NaN a failed factorisation travels as
            return np.full(L.shape, np.nan, dtype=L.dtype)
        return inverse + np.tril(inverse, -1).T  # (potri fills the lower triangle; L's upper one is zero)
    L_inv = lower_triangular_inverse(L)
    return L_inv.mT @ L_inv


def add_to_diagonal(A, values, *, overwrite=False):
    """A + diag(values) for a square A (``values`` a number or a vector): on NumPy a copy of A (or A itself, with
    ``overwrite``: a temporary the caller owns) with the diagonal added in place, one pass over A where the standard's
    ``A + values * eye`` makes three."""
    xp = array_namespace(A)
    if is_numpy_namespace(xp):
        out = A if overwrite else A.copy()
        out.flat[:: A.shape[0] + 1] += values
        return out
    eye = xp.eye(A.shape[0], dtype=A.dtype, device=array_device(A))
    return A + (values[:, None] if getattr(values, "ndim", 0) == 1 else values) * eye


def _cholesky_once(A, xp):
    try:
        L = xp.linalg.cholesky(A)
    except Exception:  # NumPy/strict raise LinAlgError; other libraries other types
        return None
    # CuPy (and some others) return NaN instead of raising: check the diagonal.
    diag = xp.linalg.diagonal(L)
    if not bool(xp.all(xp.isfinite(diag))) or not bool(xp.all(diag > 0)):
        return None
    return L


def cholesky_or_nan(A):
    """Lower Cholesky factor of A with no check and no host synchronisation: where the factorisation
    fails the result is NaN (CuPy returns NaN itself; NumPy and others raise, which is turned into a
    NaN matrix here), so a failure travels on to the one scalar a training step brings to the host."""
    xp = array_namespace(A)
    try:
        return xp.linalg.cholesky(A)
    except Exception:  # NumPy/strict raise LinAlgError; other libraries other types
        return xp.full(A.shape, math.nan, dtype=A.dtype, device=array_device(A))


def machine_epsilon(x):
    """The spacing of ``x``'s floating type at 1 (2.2e-16 for float64, 1.2e-7 for float32), a host float: the
    unit in which round-off tolerances are set (``finfo`` is metadata, no array operation)."""
    return float(array_namespace(x).finfo(x.dtype).eps)


def scaled_std(X, *, axis, keepdims=False):
    """``xp.std(X, axis=axis)`` computed without overflow or underflow: X divided by its largest |x| along
    ``axis`` first, so the squares lie in [0, 1] (``xp.std`` of X * 1e-300 underflows to 0, of X * 1e154
    overflows to inf). On X's device, no host copy; 0 for a constant or all-zero slice."""
    xp = array_namespace(X)
    magnitude = xp.max(xp.abs(X), axis=axis, keepdims=True)
    magnitude = xp.where(magnitude > 0, magnitude, xp.ones_like(magnitude))
    std = xp.std(X / magnitude, axis=axis, keepdims=True) * magnitude
    return std if keepdims else xp.squeeze(std, axis=axis)


_JITTER_FLOOR_ROUNDOFFS = 100.0  # per inducing point; see jitter_floor


def jitter_floor(Z):
    """The smallest jitter (added to the diagonal of Kmm, in units of the kernel amplitude) a model with
    inducing points ``Z`` ((m, d), or (C, m, d)) is given: 100 m eps of Z's type. A Cholesky factorisation
    of an m x m matrix has a backward error of order m eps ||A|| (Golub & Van Loan, Matrix Computations,
    Thm. 4.2.6, 4th ed.) and ||Kmm|| grows to m amplitude when inducing points crowd together, so a smallest
    eigenvalue below about m eps times that leaves the factor to round-off. float64: 2e-12 at m = 100, far
    below any jitter set in practice (1e-6 by default), so nothing changes; float32: 1.2e-3 at m = 100. Measured
    on banana at m = 100 in float32 with the default 1e-6: SEP and EP fits hit a Kmm that does not factorise
    again and again (the guard raised the jitter eight times, 1e-6 to 3.2e-6, with a warning each), and SVI
    diverged at jitter up to 1e-4."""
    m = Z.shape[-2]
    return _JITTER_FLOOR_ROUNDOFFS * m * machine_epsilon(Z)


def cholesky(A, *, what="matrix", max_tries=6):
    """Lower Cholesky factor of a symmetric positive definite matrix.

    On failure, adds ``jitter * mean(diag(A))`` to the diagonal with jitter 1e-10, 1e-9, ... and tries
    again; after ``max_tries`` raises :class:`CholeskyError` naming ``what`` and the jitter tried. The
    ladder starts no lower than ten round-offs of A's type (10 eps: 1.2e-6 for float32, where a relative
    1e-10 would not change the diagonal at all; float64's 1e-10 is above 10 eps, so its ladder is as before).
    """
    return cholesky_with_jitter(A, what=what, max_tries=max_tries)[0]


def cholesky_with_jitter(A, *, what="matrix", max_tries=6, report=True):
    """``cholesky`` that also returns the jitter it had to add to the diagonal (0.0 when none). An added
    jitter is reported (``note_jitter``) unless ``report=False`` (a caller that only probes for it)."""
    xp = array_namespace(A)
    L = _cholesky_once(A, xp)
    if L is not None:
        return L, 0.0
    if not bool(xp.all(xp.isfinite(A))):
        raise CholeskyError(f"Cholesky of {what} failed: the matrix contains NaN or inf")
    m = A.shape[0]
    scale = float(xp.mean(xp.abs(xp.linalg.diagonal(A))))
    scale = scale if scale > 0 else 1.0
    eye = xp.eye(m, dtype=A.dtype, device=array_device(A))
    tried = []
    first = max(1e-10, 10.0 * machine_epsilon(A))
    for k in range(max_tries):
        jitter = scale * 10.0 ** (k + math.log10(first))
        tried.append(jitter)
        L = _cholesky_once(A + jitter * eye, xp)
        if L is not None:
            if report:
                note_jitter(f"{what}: extra jitter in its factorisation", 0.0, jitter)
            return L, jitter
    raise CholeskyError(
        f"Cholesky of {what} ({m}x{m}) failed: not positive definite even with jitter "
        f"{', '.join(f'{j:.1e}' for j in tried)} added to the diagonal"
    )


# --------------------------------------------------------------------------------------------------
# special functions

_LOG_SQRT_PI = 0.5 * math.log(math.pi)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SERIES_TERMS = 40  # positive-term erf series, enough for |x| <= 1.5 to 1e-17 relative
_CF_TERMS = 100  # Laplace continued fraction for erfc, enough for x >= 1.5 to 1e-15 relative
_SWITCH = 1.5


def _erf_series(x, xp):
    """erf(x) = 2x/sqrt(pi) exp(-x^2) sum_n (2x^2)^n / (2n+1)!!  (all terms positive: no cancellation)."""
    two_x2 = 2.0 * x * x
    term = xp.ones_like(x)
    total = xp.ones_like(x)
    for n in range(1, _SERIES_TERMS):
        term = term * two_x2 / (2.0 * n + 1.0)
        total = total + term
    return (2.0 / math.sqrt(math.pi)) * x * xp.exp(-x * x) * total


def _log_erfc_cf(x, xp):
    """log erfc(x) for x >= 1.5 from erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))."""
    t = x
    for k in range(_CF_TERMS, 0, -1):
        t = x + (0.5 * k) / t
    return -x * x - _LOG_SQRT_PI - xp.log(t)


def _log_ndtr_generic(z, xp):
    """log Phi(z) = log(erfc(x) / 2) with x = -z / sqrt(2), from the two pieces above.

    z <= 0 (x >= 0): log erfc(x) directly, the continued fraction in the far tail.
    z > 0 (x < 0): Phi(z) = 1 - erfc(|x|)/2, so log Phi = log1p(-erfc(|x|)/2), accurate where Phi ~ 1.
    """
    x = -z / math.sqrt(2.0)
    ax = xp.abs(x)
    is_large = ax > _SWITCH
    erfc_small = 1.0 - _erf_series(xp.minimum(ax, _SWITCH), xp)  # erfc(|x|) for |x| <= 1.5
    log_erfc_large = _log_erfc_cf(xp.maximum(ax, _SWITCH), xp)  # log erfc(|x|) for |x| >= 1.5
    log_erfc_abs = xp.where(is_large, log_erfc_large, xp.log(erfc_small))
    erfc_abs = xp.where(is_large, xp.exp(log_erfc_large), erfc_small)
    return xp.where(x >= 0, math.log(0.5) + log_erfc_abs, xp.log1p(-0.5 * erfc_abs))


def log_ndtr(z):
    """log Phi(z), the log of the standard normal CDF, accurate in both tails."""
    xp = array_namespace(z)
    if is_numpy_namespace(xp):
        return scipy.special.log_ndtr(z)
    if is_cupy_namespace(xp):
        import cupyx.scipy.special

        return cupyx.scipy.special.log_ndtr(z)
    return _log_ndtr_generic(z, xp)


def ndtr(z):
    """Phi(z), the standard normal CDF."""
    xp = array_namespace(z)
    if is_numpy_namespace(xp):
        return scipy.special.ndtr(z)
    if is_cupy_namespace(xp):
        import cupyx.scipy.special

        return cupyx.scipy.special.ndtr(z)
    return xp.exp(log_ndtr(z))


def log_normal_pdf(z):
    """log N(z | 0, 1)."""
    return -0.5 * z * z - _LOG_SQRT_2PI


def gauss_hermite(n, xp, *, dtype=None, device=None):
    """Nodes and weights of n-point Gauss-Hermite quadrature: sum_k w_k f(x_k) ~ int exp(-x^2) f(x) dx.

    Golub-Welsch: the nodes are the eigenvalues of the symmetric tridiagonal Jacobi matrix of the
    (physicists') Hermite polynomials, off-diagonal sqrt(k/2); the weights are sqrt(pi) times the
    squared first components of the eigenvectors. Written with ``eigh`` only, so every namespace has it.
    """
    if n < 1:
        raise ValueError(f"Gauss-Hermite needs at least one node, got {n}")
    dtype = xp.float64 if dtype is None else dtype
    # Computed once per (n, namespace, dtype, device): a training step asks for the same nodes every time, and
    # building them is an upload and an eigendecomposition.
    key = (n, getattr(xp, "__name__", id(xp)), str(dtype), str(device))
    cached = _GAUSS_HERMITE_CACHE.get(key)
    if cached is not None and cached[0] is xp:
        return cached[1]
    offdiag = [math.sqrt(k / 2.0) for k in range(1, n)]
    rows = [[0.0] * n for _ in range(n)]
    for k, value in enumerate(offdiag):
        rows[k][k + 1] = value
        rows[k + 1][k] = value
    jacobi = xp.asarray(rows, dtype=dtype, device=device)
    nodes, vectors = xp.linalg.eigh(jacobi)
    weights = math.sqrt(math.pi) * vectors[0, :] ** 2
    _GAUSS_HERMITE_CACHE[key] = (xp, (nodes, weights))
    return nodes, weights


_GAUSS_HERMITE_CACHE = {}
