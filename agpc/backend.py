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
import ctypes
import functools
import importlib
import math
import os
import sys
import threading
import types
import warnings
from collections import Counter
from contextlib import contextmanager, suppress

import numpy as np
import scipy.linalg
import scipy.linalg.blas
import scipy.linalg.cython_blas
import scipy.linalg.lapack
import scipy.special
from threadpoolctl import ThreadpoolController
from array_api_compat import array_namespace as _compat_array_namespace
from array_api_compat import (
    device as array_device,
    is_array_api_obj,
    is_cupy_namespace,
    is_dask_array,
    is_numpy_namespace,
)
from array_api_compat import numpy as compat_numpy

__all__ = [
    "rows_at",
    "held_notes",
    "overflow_raises",
    "release_notes",
    "CholeskyError",
    "DeviceUnavailableError",
    "check_device",
    "factor_failure",
    "row_dot",
    "TF32Warning",
    "uses_tf32",
    "DeviceThroughput",
    "device_throughput",
    "JitterWarning",
    "GuardWarning",
    "warn_guard",
    "FloatingPointErrorsHeld",
    "floating_point_errors_held",
    "ModulesByName",
    "jitter_report",
    "outside_stacklevel",
    "note_jitter",
    "is_dask_array",
    "row_chunk_bounds",
    "array_namespace",
    "array_device",
    "resolve_backend",
    "solve_triangular",
    "capped_exp",
    "add_outer",
    "scaled_columns",
    "weighted_gram",
    "matmul",
    "scratch",
    "shares_host_threads",
    "lower_triangular_inverse",
    "inverts_by_halves",
    "TRIANGULAR_INVERSE_BLOCK",
    "triangular_matmul",
    "cholesky_inverse",
    "triangular_gram",
    "symmetric_congruence",
    "congruence_by_sygst",
    "CONGRUENCE_MIN_ORDER",
    "identity_plus",
    "prefers_inverses",
    "reference_paths",
    "counting_fast_calls",
    "blas_releasing_the_lock",
    "add_to_diagonal",
    "without_diagonal",
    "cholesky",
    "cholesky_or_nan",
    "cholesky_with_jitter",
    "jitter_ladder",
    "JITTER_TRIES",
    "machine_epsilon",
    "jitter_floor",
    "OUTLIER_SPREAD_RATIO",
    "EXTREME_ROW_SHARE",
    "moments_without_extremes",
    "few_rows_set_spread",
    "starting_jitter",
    "log_ndtr",
    "ndtr",
    "inverse_mills_ratio",
    "log_normal_pdf",
    "gauss_hermite",
    "gauss_legendre",
    "to_numpy",
    "to_host_vector",
    "asarray_like",
    "host_rng",
    "cluster_sums",
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


def __getattr__(name):
    """``GuardWarning``, made on first use (PEP 562): it is scikit-learn's ``ConvergenceWarning`` of the training
    guard, and scikit-learn is not loaded where agpc computes without it (a worker process, the CLI's start)."""
    if name != "GuardWarning":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from sklearn.exceptions import ConvergenceWarning

    doc = """The training guard did not take some steps (an improper q, a jump of log Z, cavities inconsistent with
    q) and repaired q, or halved damping and step sizes (``agpc.inference.guard``): the fit went on, but along
    another path than its settings asked for. The message says what happened and what to do; the history's
    ``guard_*`` entries count it per epoch or iteration. A ``sklearn.exceptions.ConvergenceWarning``."""
    cls = globals()["GuardWarning"] = type("GuardWarning", (ConvergenceWarning,), {"__doc__": doc,
                                                                                   "__module__": __name__})
    return cls


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # (agpc's own source files start with it)


def outside_stacklevel():
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller of this function name the first frame outside
    agpc: the user's line that called the public API, however deep the path that warns (``predict_proba``, ``score``
    through ``predict``, a ``fit``'s validation rows; Python 3.12's ``skip_file_prefixes`` does this, 3.10 does not
    have it). Every frame agpc's (its command line): the outermost."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


class FloatingPointErrorsHeld:
    """NumPy's overflow, division-by-zero and invalid-value warnings of a block of work, held (``errstate``'s "log"
    mode writes each here) until the caller knows whether the work counts: ``say`` warns each as NumPy would have,
    from the agpc line that raised it; dropping the object says nothing. A training step the guard refuses (``training
    .Trainer.step``) is one whose arithmetic went past the floats (a careless learning rate's: "overflow encountered in
    exp", "divide by zero encountered in log" at every refused step), and the guard's own warning says what it did."""

    MOST = 16  # (distinct messages kept: a refused step of many rows may write thousands)

    def __init__(self):
        self.said = {}  # message -> (file, line, module) of the innermost agpc frame

    def write(self, text):
        message = text.strip()
        message = message.removeprefix("Warning: ")
        if message in self.said or len(self.said) >= self.MOST:
            return
        frame = sys._getframe(1)
        while frame is not None and not os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
            frame = frame.f_back
        if frame is None:  # (NumPy called from outside agpc: said from here)
            frame = sys._getframe(0)
        self.said[message] = (frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "agpc"))

    def say(self):
        """Warn each held message (a RuntimeWarning from the agpc line that raised it, as NumPy's own would be)."""
        for message, (filename, lineno, module) in self.said.items():
            registry = sys.modules[module].__dict__.setdefault("__warningregistry__", {}) if module in sys.modules \
                else None
            warnings.warn_explicit(message, RuntimeWarning, filename, lineno, module=module, registry=registry)
        self.said = {}


@contextmanager
def floating_point_errors_held():
    """Inside (and in the threads of a pass, which run in a copy of this context), NumPy's floating-point errors that
    would warn are held in the ``FloatingPointErrorsHeld`` yielded; the caller says them or drops them. A mode the
    caller set otherwise (``numpy.seterr``: "raise", "ignore") stands."""
    held = FloatingPointErrorsHeld()
    modes = {kind: "log" for kind, mode in np.geterr().items() if kind != "under" and mode == "warn"}
    with np.errstate(**modes, call=held):
        yield held


def _guard_category():
    return globals().get("GuardWarning") or __getattr__("GuardWarning")


def warn_guard(message, stacklevel=2):
    """Warn with ``message`` as a ``GuardWarning``: inside a ``jitter_report`` scope (``fit``, ``partial_fit``) when
    that scope ends, from its caller's line, however deep the training loop that said it (a fit on all rows, or on a
    subsample first); outside one now, from the caller's caller by default."""
    said = _GUARD_SAID.get()
    if said is None:
        warnings.warn(message, _guard_category(), stacklevel=stacklevel + 1)
    else:
        said.append(message)


class JitterWarning(UserWarning):
    """A matrix had to be regularised with more jitter than configured for its Cholesky factorisation to
    succeed: the model is (slightly) not the one asked for. Filter it with
    ``warnings.simplefilter("ignore", agpc.JitterWarning)`` or make it an error to refuse such fits."""


# The jitter raises of the current ``jitter_report`` scope (None outside one): (what, from, to) triples.
_JITTER_RAISES = contextvars.ContextVar("agpc_jitter_raises", default=None)
# The guard's summaries (``warn_guard``) said inside the current ``jitter_report`` scope (None outside one).
_GUARD_SAID = contextvars.ContextVar("agpc_guard_said", default=None)


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
def held_notes():
    """The jitter raises (``note_jitter``) and the guard's summaries (``warn_guard``) made inside, held back for a
    stage whose model may be discarded (``size_rule.learn_lengthscales``' later kernels): the holder it yields goes to
    ``release_notes`` where the stage's model is the one returned, else its notes are dropped (a warning about the
    jitter of a model the fit does not return says what is not so of the one it returns). Outside a report (no
    ``jitter_report`` or ``jitter_raises_within``), nothing is held: the notes are said as they come, and the holder is
    None."""
    raises = _JITTER_RAISES.get()
    if raises is None:
        yield None
        return
    holder = types.SimpleNamespace(raises=[], said=[], outer=(raises, _GUARD_SAID.get()))
    tokens = _JITTER_RAISES.set(holder.raises), _GUARD_SAID.set(holder.said)
    try:
        yield holder
    finally:
        _JITTER_RAISES.reset(tokens[0])
        _GUARD_SAID.reset(tokens[1])


@contextmanager
def overflow_raises():
    """NumPy's overflow and invalid results raise ``FloatingPointError`` in the body (``numpy.errstate``; other
    namespaces report none), for a stage that fails as a whole where its numbers leave the type's range: a kernel
    ``size_rule.learn_lengthscales`` weighs is then not kept, where its overflow had been said as NumPy's
    RuntimeWarning about a model the fit does not return (a linear kernel over a constant column of 1e300,
    whose x^2 is inf)."""
    with np.errstate(over="raise", invalid="raise"):
        yield


def release_notes(holder):
    """Pass what ``held_notes`` held on to the scope around it (a guard summary is warned now where that scope
    collects jitter raises only: ``jitter_raises_within``); None: nothing was held."""
    if holder is None:
        return
    raises, said = holder.outer
    raises.extend(holder.raises)
    if said is not None:
        said.extend(holder.said)
    else:
        for message in holder.said:
            warnings.warn(message, _guard_category(), stacklevel=2)


@contextmanager
def jitter_report(task, stacklevel=4):
    """Collect the jitter raises (``note_jitter``) inside, and after it one ``JitterWarning`` for ``task``
    (e.g. "fit") saying, for each matrix, from what to what the jitter went and how often; then the guard's
    summaries said inside (``warn_guard``), each a ``GuardWarning``, in the order said. Nested scopes
    report into the outermost one. When the body raises, no jitter warning (the error says more), but the guard's
    summaries still: what the guard did happened, and an interrupt, or the error of a later stage (the fit on all
    rows after the one on a subsample), does not say it; a filter that makes them errors does not replace the error
    in flight. ``stacklevel`` as for ``warnings.warn``, counted from the ``with`` statement's frame plus one (the
    default points at the caller of the function holding the ``with``): the user's line, wherever inside the
    warning arose."""
    if _JITTER_RAISES.get() is not None:
        yield
        return
    raises, said = [], []
    tokens = _JITTER_RAISES.set(raises), _GUARD_SAID.set(said)
    try:
        yield
    except BaseException:
        with suppress(Warning):
            _say_guard(said, stacklevel)
        raise
    finally:
        _JITTER_RAISES.reset(tokens[0])
        _GUARD_SAID.reset(tokens[1])
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
    _say_guard(said, stacklevel)


def _say_guard(said, stacklevel):
    """The guard's summaries a ``jitter_report`` scope collected, each a ``GuardWarning`` (``stacklevel`` counted from
    that scope's ``with`` as there: this function's frame takes the place of the generator's own)."""
    for message in said:
        warnings.warn(message, _guard_category(), stacklevel=stacklevel + 1)


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


class DeviceUnavailableError(ValueError):
    """``backend="cupy"``, or CuPy arrays, on a machine where CuPy cannot compute: no CUDA device, a driver too old
    for CuPy's CUDA runtime, or a CUDA library CuPy needs (cuBLAS, cuSOLVER, NVRTC) missing. A ValueError: the
    request cannot be met on this machine; the message names what is missing."""


# Devices (CuPy device ids) on which every probe of ``check_device`` passed: each is probed once a process.
_READY_DEVICES = set()

_INSTALL_HINT = ("pip install 'agpc[gpu]' for a CUDA 12 driver or 'agpc[gpu-cuda13]' for CUDA 13 (both bring the "
                 "CUDA libraries; only the NVIDIA driver has to be on the machine), or conda env create -f "
                 "gpu_tests/environment-gpu.yml")


def _probe_cuda_libraries(cupy):
    """(what, callable) pairs: each runs the smallest piece of work that needs one library agpc calls through CuPy,
    and raises if that library cannot be loaded or used."""

    def wrappers():
        importlib.import_module("cupyx.scipy.linalg")  # loads cuBLAS / cuSOLVER (ImportError when not found)
        importlib.import_module("cupyx.scipy.special")

    def elementwise():
        cupy.cuda.nvrtc.getVersion()  # kernels CuPy has not compiled before need NVRTC, whatever its disk cache holds
        return cupy.ones((2,), dtype=cupy.float64) + 1.0

    def products():
        a = cupy.ones((2, 2), dtype=cupy.float64)
        return a @ a

    def factorisations():
        return cupy.linalg.cholesky(cupy.eye(2, dtype=cupy.float64))

    return (("CuPy's SciPy routines (cupyx.scipy.linalg and cupyx.scipy.special)", wrappers),
            ("NVRTC, which compiles CuPy's elementwise kernels", elementwise),
            ("cuBLAS, for matrix products", products),
            ("cuSOLVER, for Cholesky factorisations", factorisations))


# Said to a Python user and to a command-line user alike (the CLI prints the message as it is)
_ON_THE_CPU = "compute on the CPU: backend='numpy' (agpc fit --backend numpy)"


def _cuda_versions(cupy):
    """"CuPy 14.2.0 for CUDA runtime 12.9, driver for CUDA 12.2" (what a user compares to pick a driver or a CuPy
    wheel), each part that cannot be read left out."""
    def version(code):
        return f"{code // 1000}.{code % 1000 // 10}"

    parts = [f"CuPy {getattr(cupy, '__version__', '?')}"]
    try:
        parts[0] += f" for CUDA runtime {version(int(cupy.cuda.runtime.runtimeGetVersion()))}"
    except Exception:  # (as much as can be said: the version is for the message only)
        pass
    try:
        driver = int(cupy.cuda.runtime.driverGetVersion())
        parts.append(f"driver for CUDA {version(driver)}" if driver else "no NVIDIA driver")
    except Exception:
        pass
    return ", ".join(parts)


def check_device(xp=None):
    """Refuse, before any work, a CuPy namespace (``xp``; ``None`` means CuPy itself) that cannot compute here:
    raises ``DeviceUnavailableError`` naming what is missing (CuPy, a CUDA device, a driver new enough, a CUDA
    library) and how to install it. Other namespaces pass untouched.

    The probes are CuPy's own calls (``cupy.cuda.runtime.getDeviceCount``, then the smallest product, Cholesky
    factorisation and elementwise kernel, one synchronisation), once a process for each device: ``import cupy``
    succeeds without a driver, and a missing CUDA library shows only when a routine first needs it, which
    would otherwise be in the middle of a fit."""
    if xp is not None and not is_cupy_namespace(xp):
        return
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken installation
        raise DeviceUnavailableError(f"backend='cupy' needs CuPy, which cannot be imported "
                                     f"({type(exc).__name__}: {exc}): {_INSTALL_HINT}") from exc
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
        device = int(cupy.cuda.runtime.getDevice()) if count > 0 else None
    except Exception as exc:  # CUDARuntimeError: cudaErrorInsufficientDriver, cudaErrorNoDevice, ...
        raise DeviceUnavailableError(f"CuPy finds no usable CUDA device ({type(exc).__name__}: {exc}): the NVIDIA "
                                     f"driver is missing or older than CuPy's CUDA runtime ({_cuda_versions(cupy)}); "
                                     f"{_ON_THE_CPU}") from exc
    if count < 1:
        raise DeviceUnavailableError(f"CuPy finds no CUDA device on this machine ({_cuda_versions(cupy)}); "
                                     f"{_ON_THE_CPU}")
    if device in _READY_DEVICES:
        return
    for what, probe in _probe_cuda_libraries(cupy):
        try:
            probe()
            cupy.cuda.Device(device).synchronize()  # errors of the probe's kernels surface here, not later
        except Exception as exc:
            raise DeviceUnavailableError(f"CuPy cannot use {what} on CUDA device {device} "
                                         f"({type(exc).__name__}: {exc}): {_INSTALL_HINT}") from exc
    _READY_DEVICES.add(device)


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
            check_device()  # a DeviceUnavailableError naming what is missing, before any work
            import array_api_compat.cupy as xp

            return xp
        raise ValueError(
            f"unknown backend {backend!r}: use 'auto', 'numpy', 'cupy' or an array namespace module"
        )
    if hasattr(backend, "asarray") and hasattr(backend, "linalg") and hasattr(backend, "float64"):
        return backend
    raise ValueError(
        f"unknown backend {backend!r}: use 'auto', 'numpy', 'cupy' or an array namespace module"
    )


def array_namespace(*arrays, **options):
    """``array_api_compat.array_namespace``, answered at once for plain NumPy arrays (the common case, asked
    a hundred times a training step)."""
    if arrays and not options and all(type(x) is np.ndarray for x in arrays):
        return compat_numpy
    return _compat_array_namespace(*arrays, **options)


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


def rows_at(values, index):
    """The rows ``index`` (NumPy integers) of ``values`` as the caller gave them: a pandas object by position (its
    column names kept), an array-API array in its namespace and on its device, anything else through NumPy."""
    if values is None or np.ndim(values) == 0:  # (a scalar sample_weight: every row's)
        return values
    if hasattr(values, "iloc"):
        return values.iloc[index]
    if hasattr(values, "tocsr"):  # (sparse X: refused by the feature checks, as it is without a hold-out)
        return values[index]
    if is_array_api_obj(values) and not isinstance(values, np.ndarray):
        xp = array_namespace(values)
        return xp.take(values, asarray_like(index, xp, device=array_device(values)), axis=0)
    return np.asarray(values)[index]


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
    """Rows lo:hi of ``X`` (in memory or on disk) as a float array in ``like``'s namespace and device: a view of X
    where X is in memory of that namespace, device and type already (a fit's own copy of the rows, which the passes
    only read; a copy of each block was 3% of a default fit's wall time, on the driver thread), else a copy."""
    block = row_slice(X, lo, hi)
    mapped = isinstance(block, np.memmap)
    if mapped:
        block = np.asarray(block)
    xp = array_namespace(like)
    if is_array_api_obj(block) and array_namespace(block) is xp and block.dtype == like.dtype \
            and array_device(block) == array_device(like):
        # (a file's rows are read once, here, into memory: its bytes can change under a view)
        return xp.asarray(block, copy=True) if mapped else block
    return asarray_like(block, xp, device=array_device(like), dtype=like.dtype)  # (a copy: another type)


class HostRows:
    """Rows of an in-memory host (NumPy) array that stay on the host and reach the compute device a block at
    a time: X larger than the device's memory. It looks like data on disk to the passes and the training loop
    (``is_out_of_core``: shape, dtype, row slices that return NumPy arrays), so it takes their one block-reading
    path (``blocks.data_blocks``); it has no stored chunks (minibatches are laid over all rows)."""

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
# headroom for what the count of a block's temporaries (``blocks.block_bytes_per_row``, measured on NumPy) does not
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
    return None if free is None else rows_for_free_bytes(bytes_per_row, free, fraction)


def rows_for_free_bytes(bytes_per_row, free, fraction=DEVICE_MEMORY_FRACTION):
    """The most rows whose ``bytes_per_row`` fit in ``fraction`` of ``free`` bytes, at least 1 (pure: a benchmark
    asks it of a device it does not have)."""
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


# -- what a GPU computes per second, and the minibatch that keeps it busy (docs/gpu.md has the model) --------------

# Host time per array operation on CuPy: CuPy's Python dispatch plus CUDA's kernel launch, which the host pays for
# every operation however little the kernel does. An assumption until a GPU run measures it
# (gpu_tests/run_on_gpu.sh times a loop of one-element additions).
LAUNCH_SECONDS = 10e-6


class DeviceThroughput:
    """Peak rates of one device for one floating type: ``flops`` (flop/s of the vector units), ``bytes`` (memory
    bandwidth, bytes/s), and ``launch_seconds`` (host time per kernel, ``LAUNCH_SECONDS``)."""

    def __init__(self, name, flops, bytes_per_second, launch_seconds=LAUNCH_SECONDS):
        self.name, self.flops, self.bytes, self.launch_seconds = name, float(flops), float(bytes_per_second), \
            float(launch_seconds)

    def __repr__(self):
        return (f"DeviceThroughput({self.name!r}: {self.flops / 1e12:.3g} Tflop/s, {self.bytes / 1e12:.3g} TB/s, "
                f"{self.launch_seconds * 1e6:.3g} us a launch)")


def _float_name(dtype):
    """"float32" / "float64" for a dtype of NumPy or CuPy, a NumPy scalar type or a name."""
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype).rsplit(".", 1)[-1]


def _fp32_lanes_per_multiprocessor(major, minor):
    """FP32 units per streaming multiprocessor (NVIDIA's CUDA C++ Programming Guide, "Arithmetic Instructions"
    throughput table): 64 up to compute capability 8.0 (V100, T4, A100), 128 from 8.6 on (RTX 30xx / 40xx, H100,
    Blackwell)."""
    return 64 if (major, minor) < (8, 6) else 128


def device_throughput(xp, dtype, device=None):
    """The ``DeviceThroughput`` of the CUDA device (``device``: a CuPy device or id; default the current one) for
    ``dtype`` ("float32" or "float64"); None for a namespace that is not CuPy's. From CuPy's
    ``cupy.cuda.runtime.getDeviceProperties`` (``throughput_from_properties``)."""
    if not is_cupy_namespace(xp):
        return None
    import cupy

    device_id = getattr(device, "id", device)
    if not isinstance(device_id, int):  # None (or anything but a CuPy device or an id): the current device
        device_id = cupy.cuda.runtime.getDevice()
    return throughput_from_properties(cupy.cuda.runtime.getDeviceProperties(device_id), dtype)


def throughput_from_properties(props, dtype):
    """The ``DeviceThroughput`` for ``dtype`` of a device described by ``props`` (the keys of CuPy's
    ``getDeviceProperties`` this reads): FP32 rate = 2 flop (a fused multiply-add) x FP32 units per multiprocessor x
    ``multiProcessorCount`` x ``clockRate``; FP64 rate = that / ``singleToDoublePrecisionPerfRatio`` (2 on A100 /
    H100, 64 on consumer GPUs); bandwidth = 2 (double data rate) x ``memoryClockRate`` x ``memoryBusWidth`` / 8. An
    H100 SXM gives 67 Tflop/s FP32, 33 FP64 and 3.35 TB/s. (Pure: benchmarks ask what a GPU would choose on the
    CPU.)"""
    lanes = _fp32_lanes_per_multiprocessor(int(props["major"]), int(props["minor"]))
    fp32 = 2.0 * lanes * int(props["multiProcessorCount"]) * 1e3 * float(props["clockRate"])
    ratio = float(props.get("singleToDoublePrecisionPerfRatio") or 1.0)
    flops = fp32 if _float_name(dtype) == "float32" else fp32 / ratio
    bandwidth = 2.0 * 1e3 * float(props["memoryClockRate"]) * int(props["memoryBusWidth"]) / 8.0
    name = props.get("name", b"CUDA device")
    return DeviceThroughput(name.decode() if isinstance(name, bytes) else str(name), flops, bandwidth)


def launch_bound_rows(throughput, *, launches, block_launches, block_rows, flops_per_row, bytes_per_row, largest,
                      ratio=2.0, smallest=200):
    """The fewest rows a step must have so that its device work is at least ``ratio`` times the host time of its
    launches (arithmetic, not launch overhead, sets the step's time), within [``smallest``, ``largest``].

    A step of b rows launches ``launches`` kernels for its first row block and ``block_launches`` more for each
    further block of ``block_rows`` rows (host time: launches x ``throughput.launch_seconds``); its device work
    takes b x (``flops_per_row`` / flops + ``bytes_per_row`` / bandwidth) seconds (the model of docs/gpu.md).
    Rows are ``smallest`` times a power of two; when no size up to ``largest`` reaches the ratio, ``largest`` (more
    rows a step still spread the fixed launches over more rows)."""
    largest = max(int(smallest), int(largest))
    rows = int(smallest)
    while rows < largest:
        launch_time, work_time = step_time(throughput, rows, launches=launches, block_launches=block_launches,
                                           block_rows=block_rows, flops_per_row=flops_per_row,
                                           bytes_per_row=bytes_per_row)
        if work_time >= ratio * launch_time:
            return rows
        rows *= 2
    return largest


def step_time(throughput, rows, *, launches, block_launches, block_rows, flops_per_row, bytes_per_row):
    """(host seconds of the launches, device seconds of the work) of a step of ``rows`` rows in the launch model
    of docs/gpu.md (see ``launch_bound_rows``): the step is as slow as the larger of the two."""
    blocks = -(-int(rows) // max(1, int(block_rows)))
    launch_time = (launches + block_launches * (blocks - 1)) * throughput.launch_seconds
    return launch_time, rows * (flops_per_row / throughput.flops + bytes_per_row / throughput.bytes)


class TF32Warning(UserWarning):
    """float32 matrix products on the GPU run in TF32 (``CUPY_TF32=1``): inputs rounded to 10-bit mantissas
    (relative error ~5e-4 instead of float32's 6e-8) in every product the fit makes, so results differ from
    NumPy's float32 by far more than round-off. Unset ``CUPY_TF32`` before CuPy's first float32 product, or accept
    it: ``warnings.simplefilter("ignore", agpc.TF32Warning)``; make it an error to refuse such fits. The fitted
    model records it (``GPClassifier.tf32_``)."""


_CUPY_COMPUTE_TYPE_TF32 = 7


def uses_tf32(xp, dtype):
    """True when float32 products on namespace ``xp`` run in TF32: CuPy whose compute type for float32 is TF32.
    CuPy fixes it once a process (``cupy._core.get_compute_type``): at its first float32 product, from the
    environment variable ``CUPY_TF32`` (a positive integer, on a device of compute capability 8.0 or more), unless
    ``cupy._core.set_compute_type`` set it first; this asks CuPy, which fixes it now if nothing has yet (as the fit's
    first product would). float64 never uses TF32. A CuPy without ``get_compute_type``: the variable decides."""
    if not is_cupy_namespace(xp) or _float_name(dtype) != "float32":
        return False
    import cupy

    # No public accessor: cupy._core.get_compute_type is what CuPy's own products ask
    # (cupy/_core/_routines_linalg.pyx); TF32 is 7 in its enum of compute types (_routines_linalg.pxd)
    get_compute_type = getattr(getattr(cupy, "_core", None), "get_compute_type", None)
    if get_compute_type is not None:
        return int(get_compute_type(np.float32)) == _CUPY_COMPUTE_TYPE_TF32
    try:
        return int(os.environ.get("CUPY_TF32", "0")) > 0
    except ValueError:  # CuPy's own int() of it would fail at the first float32 product
        return False


def host_array(values, dtype=np.float64):
    """A NumPy array on the host from Python numbers (parameters are born here, then moved)."""
    return np.asarray(values, dtype=dtype)


def host_rng(random_state):
    """A NumPy ``Generator`` from a seed, a Generator or ``None``.

    Random choices (inducing-point initialisation, minibatch order) are drawn on the host and moved to
    the device as indices, so that the same seed and the same batch give the same model on every backend
    (``batch_size="auto"`` is another batch on a GPU from 204,800 rows on: ``agpc.batch_size``, docs/gpu.md).
    """
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    return np.random.default_rng(random_state)


def cluster_sums(labels, X, n_clusters, weights=None):
    """(sums, counts): the sum of the rows of X (n, d) of each cluster label in 0..n_clusters-1 (labels: n ints),
    shape (n_clusters, d), and how many rows each has; with ``weights`` (n,), each row counted by its weight (the
    weighted sums and the weights' totals). NumPy: ``bincount`` a column at a time (O(n d)); elsewhere a one-hot
    (n, n_clusters) matrix product, in standard operations (O(n k d), and an n x k temporary: at k-means's 20,000
    rows and m = 200, 0.43 s of CPU over 25 iterations against 0.01 s)."""
    xp = array_namespace(X)
    if is_numpy_namespace(xp):
        rows = X if weights is None else X * weights[:, None]
        counts = np.bincount(labels, weights=weights, minlength=n_clusters).astype(X.dtype)
        sums = np.stack([np.bincount(labels, weights=rows[:, j], minlength=n_clusters) for j in range(X.shape[1])],
                        axis=1).astype(X.dtype, copy=False)
        return sums, counts
    cluster_ids = xp.arange(n_clusters, device=array_device(X))
    onehot = xp.astype(labels[:, None] == cluster_ids[None, :], X.dtype)
    if weights is not None:
        onehot = onehot * weights[:, None]
    return onehot.mT @ X, xp.sum(onehot, axis=0)


# --------------------------------------------------------------------------------------------------
# linear algebra
#
# Every operation below is written once against the array API standard (the reference, which runs on any
# conforming library) and, where it pays, has a NumPy fast path: BLAS / LAPACK called directly through
# scipy.linalg.blas / lapack (the 2-D triangular products and solves and the rank-one update through cython_blas,
# which releases the interpreter lock: ``_unlocked_blas``), or results written into a caller's array (``out``,
# ``scratch``). No argument checks or copies of scipy.linalg's wrappers, triangular products (trmm) where the
# standard has only general ones, and C-ordered arrays handed to Fortran routines as their transposes (a C-ordered
# L is the Fortran-ordered L^T), so that no array changes memory order. The fast paths give the reference's
# results to round-off; ``reference_paths()`` turns them all off (tests, benchmarks).

_FAST_PATHS = contextvars.ContextVar("agpc_fast_paths", default=True)
_FAST_CALLS = contextvars.ContextVar("agpc_fast_calls", default=None)
_FAST_CALLS_LOCK = threading.Lock()
_RELEASE_LOCK = contextvars.ContextVar("agpc_blas_releasing_the_lock", default=False)
_FAST_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))
_ROUTINES = {}


@contextmanager
def reference_paths():
    """Inside, NumPy arrays take the array-API reference code of every operation that has a NumPy fast path
    (for comparing the two, in tests and benchmarks). Like ``counting_fast_calls``, a context variable: threads
    started inside see it when they run in a copy of the caller's context (``contextvars.copy_context``)."""
    token = _FAST_PATHS.set(False)
    try:
        yield
    finally:
        _FAST_PATHS.reset(token)


@contextmanager
def counting_fast_calls():
    """Count the BLAS / LAPACK calls of the NumPy fast paths made inside: yields a ``Counter`` of routine
    names ("dtrmm", "dpotrf", ...), filled as the calls are made."""
    calls = Counter()
    token = _FAST_CALLS.set(calls)
    try:
        yield calls
    finally:
        _FAST_CALLS.reset(token)


@contextmanager
def blas_releasing_the_lock():
    """Inside, the fast paths' 2-D triangular products and solves and their rank-one updates call BLAS with the
    interpreter lock released (``_unlocked_blas``), for Python threads that share array work (the blocks of a pass:
    ``agpc.inference.blocks.map_blocks``). Outside, SciPy's Python wrappers, which hold the lock but cost a little less
    (a SEP minibatch step at m = 200 took 2-3.5% longer through ctypes, interleaved)."""
    token = _RELEASE_LOCK.set(True)
    try:
        yield
    finally:
        _RELEASE_LOCK.reset(token)


def _fast(*arrays):
    """Whether these arrays take the NumPy fast paths: NumPy arrays of one type, float32 or float64, fast paths
    on (mixed types take the reference, which promotes them)."""
    dtype = arrays[0].dtype if type(arrays[0]) is np.ndarray else None
    return (dtype in _FAST_DTYPES and all(type(a) is np.ndarray and a.dtype == dtype for a in arrays)
            and _FAST_PATHS.get())


def prefers_inverses(x):
    """Whether applying an explicit triangular inverse beats a triangular solve for arrays like ``x``: on the
    NumPy fast path, where OpenBLAS's trsm runs at a third of trmm's speed on one thread (200 x 200 factor, 200
    right-hand sides: 400 us against 150, and trtri takes 220), so that an inverse used twice has paid."""
    return _fast(x)


def _routine(kind, name, dtype):
    """The BLAS ("blas") or LAPACK routine ``name`` ("trmm") for ``dtype``, counted when a count is on."""
    key = (kind, name, dtype)
    routine = _ROUTINES.get(key)
    if routine is None:
        getter = scipy.linalg.blas.get_blas_funcs if kind == "blas" else scipy.linalg.lapack.get_lapack_funcs
        routine = _ROUTINES[key] = getter(name, dtype=dtype)
    calls = _FAST_CALLS.get()
    if calls is not None:
        with _FAST_CALLS_LOCK:  # (the threads of a pass count into the caller's Counter)
            calls[routine.typecode + name] += 1
    return routine


def _fortran_view(M):
    """(F-ordered array, whether it holds M^T): M itself when Fortran-ordered, else the Fortran view M.T of a
    C-ordered M (else a Fortran copy)."""
    if M.flags.f_contiguous:
        return M, False
    if M.flags.c_contiguous:
        return M.T, True
    return np.asfortranarray(M), False


# SciPy's Python BLAS wrappers (scipy.linalg.blas, made by f2py) hold the interpreter lock for the whole call: their
# signature files declare no ``threadsafe``: during a 2000 x 3000 trmm of 190 ms another Python thread stood still for
# 145 ms at a stretch (through ctypes, 8 ms: the interpreter's switch interval under load). The blocks of a batch pass
# run on Python threads (``agpc.inference.blocks.map_blocks``), so one thread's trmm would stall the others. The same
# routines of SciPy's cython_blas (its BLAS for Cython code: Fortran interface, every argument by address), called
# through ctypes as C functions (``CFUNCTYPE``: ctypes releases the lock for the call), run with the lock released.
# Their addresses come from the module's table of C functions (``__pyx_capi__``, as Numba finds SciPy's LAPACK), whose
# capsule names spell each routine's C signature: a routine is used only when that signature is the one called here;
# otherwise, or when the table lacks it, the f2py wrapper does the same work holding the lock. NumPy's matmul also
# releases it but has no triangular product. One batch EP iteration (n = 10^5, two threads; median ratios of
# interleaved runs, two runs on a loaded machine) took, against this path, 1.13-1.30 (m = 200) and 1.27-1.32 (m = 500)
# times as long with the f2py wrappers, 1.24-1.30 / 1.16-1.24 with NumPy matmuls over the triangle's bands and
# 1.25-1.42 / 1.39-1.51 with the whole triangle. Only the threads of a pass take this path
# (``blas_releasing_the_lock``): on one thread the wrappers cost a little less.
_UNLOCKED_BLAS = {}
_UNLOCKED_SIGNATURES = {  # each argument's C type: c char *, i int *, f the routine's float type *
    "trmm": "cccciiffifi",
    "trsm": "cccciiffifi",
    "ger": "iiffififi",
}


def _capsule_signature(capsule, typecode):
    """The argument kinds (``_UNLOCKED_SIGNATURES``' letters) of a cython_blas capsule's C signature, from its name
    (``void (char *, int *, __pyx_t_..._d *, ...)``), or None when it names another kind of argument."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    name = get_name(capsule).decode()
    if not (name.startswith("void (") and name.endswith(")")):
        return None
    kinds = {"char *": "c", "int *": "i", f"__pyx_t_5scipy_6linalg_11cython_blas_{typecode} *": "f"}
    letters = [kinds.get(argument.strip()) for argument in name[len("void ("):-1].split(",")]
    return None if None in letters else "".join(letters)


def _unlocked_blas(name):
    """The ctypes function of cython_blas routine ``name`` ("dtrmm"; arguments by address; the interpreter lock
    released while it runs), or None when the table lacks it or its signature is not the expected one."""
    if name not in _UNLOCKED_BLAS:
        routine = None
        try:
            capsule = scipy.linalg.cython_blas.__pyx_capi__[name]
            expected = _UNLOCKED_SIGNATURES[name[1:]]
            if _capsule_signature(capsule, name[0]) == expected:
                get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
                get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
                get_name = ctypes.pythonapi.PyCapsule_GetName
                address = get_pointer(capsule, get_name(capsule))
                routine = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(expected)))(address)
        except (AttributeError, KeyError, ValueError, TypeError):
            routine = None
        _UNLOCKED_BLAS[name] = routine
    return _UNLOCKED_BLAS[name]


# alpha = 1 of the unlocked routines, by type (read-only, shared by every call and thread)
_ONE = {np.dtype(np.float64): ctypes.c_double(1.0), np.dtype(np.float32): ctypes.c_float(1.0)}


def _integer_addresses(*values):
    """(holder, addresses): Fortran integer arguments in one ctypes array and their addresses (the holder keeps them
    alive for the call)."""
    holder = (ctypes.c_int * len(values))(*values)
    start, size = ctypes.addressof(holder), ctypes.sizeof(ctypes.c_int)
    return holder, [start + size * i for i in range(len(values))]


def _triangular_blas(name, L, B, trans, right, overwrite):
    """op(L) @ B / B @ op(L) (``name`` "trmm") or op(L)^-1 @ B / B @ op(L)^-1 ("trsm") for lower-triangular L
    and a 2-D B, op the transpose when ``trans``, by one BLAS call (inside ``blas_releasing_the_lock``, with the
    interpreter lock released); the result has B's memory order. A vector B (left side only): "trmv" / "trsv"."""
    a, a_transposed = _fortran_view(L)  # a holds L (lower) or L^T (upper)
    if B.ndim == 1:
        vector_name = {"trmm": "trmv", "trsm": "trsv"}[name]
        return _routine("blas", vector_name, B.dtype)(a, B, lower=int(not a_transposed),
                                                       trans=int(trans != a_transposed), overwrite_x=int(overwrite))
    b, b_transposed = _fortran_view(B)
    if b_transposed:  # b holds B^T: compute X^T, in which op(L) becomes op(L)^T on the other side
        trans, right = not trans, not right
    side, lower, trans_a = int(right), int(not a_transposed), int(trans != a_transposed)
    routine = _routine("blas", name, B.dtype)
    unlocked = _unlocked_blas(routine.typecode + name) if _RELEASE_LOCK.get() else None
    if unlocked is None:
        out = routine(1.0, a, b, side=side, lower=lower, trans_a=trans_a, overwrite_b=int(overwrite))
    elif b.size == 0:  # (BLAS refuses a leading dimension of 0)
        out = np.array(b, order="F")
    else:
        out = b if overwrite and b.flags.writeable else np.array(b, order="F")  # (f2py's copy, when not overwrite)
        rows, cols = out.shape
        if a.shape != ((cols, cols) if side else (rows, rows)):  # (f2py checks this; raw BLAS would not)
            raise ValueError(f"{name}: a triangle of shape {L.shape} does not fit an operand of shape {B.shape}")
        integers, (m, n, lda, ldb) = _integer_addresses(rows, cols, a.shape[0], rows)
        unlocked(b"R" if side else b"L", b"L" if lower else b"U", b"T" if trans_a else b"N", b"N", m, n,
                 ctypes.addressof(_ONE[B.dtype]), a.ctypes.data, lda, out.ctypes.data, ldb)
    return out.T if b_transposed else out


def solve_triangular(L, B, *, lower=True, trans=False):
    """Solve ``op(L) X = B`` with ``L`` triangular; ``op`` is the transpose when ``trans``."""
    xp = array_namespace(L, B)
    if is_numpy_namespace(xp):
        if lower and _fast(L, B):
            return _triangular_blas("trsm", L, B, trans, False, False)
        return scipy.linalg.solve_triangular(
            L, B, lower=lower, trans=1 if trans else 0, check_finite=False
        )
    if is_cupy_namespace(xp):
        import cupyx.scipy.linalg

        return cupyx.scipy.linalg.solve_triangular(L, B, lower=lower, trans=1 if trans else 0)
    return _solve_triangular_generic(L, B, xp, trans)


def _solve_triangular_generic(L, B, xp, trans):
    """The array API's fallback for ``solve_triangular``: a dense solve, O(m^3 + m^2 k) like the triangular one,
    only slower. A vector right-hand side goes in as one column (the standard's solve broadcasts 1-D x2
    ambiguously)."""
    A = L.mT if trans else L
    if B.ndim == 1:
        return xp.linalg.solve(A, B[:, None])[:, 0]
    return xp.linalg.solve(A, B)


def shares_host_threads(x):
    """Whether Python threads can share array work on x's library: NumPy, whose operations (matmul, ufuncs,
    einsum, and the BLAS calls below) release the interpreter lock. Other libraries run their own parallelism (a
    GPU) or none."""
    return isinstance(x, np.ndarray)


def scratch(shape, like):
    """An uninitialised array of ``like``'s type to pass as ``out`` to the functions below and reuse, on NumPy;
    None elsewhere (they then return new arrays, the only way the standard has)."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=like.dtype)
    return None


def triangular_matmul(L, B, *, trans=False, right=False, overwrite=False, out=None):
    """op(L) @ B, or B @ op(L) when ``right``, for a lower-triangular L (zeros above the diagonal) and a
    matrix B (or a vector, on the left); op is the transpose when ``trans``. The reference is a general matrix
    product; the NumPy fast path one trmm (half the arithmetic, and for the tall-and-wide B of a block of rows
    faster than gemm), which releases the interpreter lock inside ``blas_releasing_the_lock``. ``overwrite``: B is the caller's
    temporary, and may be overwritten; ``out`` (from ``scratch``, B's shape and memory order): where the fast
    path writes the result. Callers use the return value."""
    if (B.ndim == 2 or not right) and _fast(L, B):
        if out is not None and _fast(B, out) and out.shape == B.shape:
            np.copyto(out, B)
            B, overwrite = out, True
        return _triangular_blas("trmm", L, B, trans, right, overwrite)
    op = L.mT if trans else L
    return B @ op if right else op @ B


def matmul(a, b, *, out=None):
    """a @ b, on the NumPy fast path written into ``out`` when given (``scratch``); elsewhere a new array."""
    if out is not None and _fast(a, b, out):
        return np.matmul(a, b, out=out)
    return a @ b


def scaled_columns(A, w, *, out=None):
    """A diag(w) for A (m, k), w (k,): on the NumPy fast path written into ``out`` when given."""
    if out is not None and _fast(A, w, out):
        return np.multiply(A, w[None, :], out=out)
    return A * w[None, :]


def weighted_gram(A, w, B=None, v=None):
    """A diag(w) A^T for A (m, k), w (k,): the weighted sum of the columns' outer products; with B (m, l), v (l,),
    minus B diag(v) B^T. On the NumPy fast path with every weight >= 0 (looked at there, where it costs no device
    synchronisation) each is the symmetric product W W^T of W = A diag(sqrt w), which NumPy runs as BLAS syrk, half
    the flops, and exactly symmetric (one OpenBLAS thread, k = 200: 0.78-0.91 of the general product's time at m =
    100-500, the two of a difference 0.75-0.77 of the one product of [A, B] at m = 200-500 and 1.05 at m = 100;
    benchmarks/results/step_m3_savings_amd_epyc.md). Elsewhere, or with a weight below 0 or NaN, the general product
    (of [A, B] by [A, B]^T with the weights [w, -v])."""
    pairs = ((A, w),) if B is None else ((A, w), (B, v))
    if _fast(*(a for pair in pairs for a in pair)) and all(bool(np.all(u >= 0.0)) for _, u in pairs):
        grams = [W @ W.T for W in (X * np.sqrt(u)[None, :] for X, u in pairs)]
        return grams[0] if B is None else grams[0] - grams[1]
    if B is not None:
        xp = array_namespace(A, B)
        A, w = xp.concat([A, B], axis=1), xp.concat([w, -v])
    return (A * w[None, :]) @ A.mT


def capped_exp(E, cap):
    """exp(minimum(E, cap)); on the NumPy fast path in E's memory (E is overwritten: pass a temporary), elsewhere
    new arrays. A kernel block's exponent is n x m: two fresh n x m arrays cost more than the arithmetic."""
    if _fast(E) and E.flags.writeable:
        np.minimum(E, cap, out=E)
        return np.exp(E, out=E)
    xp = array_namespace(E)
    return xp.exp(xp.minimum(E, cap))


def add_outer(M, u, v):
    """M + u v^T for M (k, l), u (k,), v (l,). On the NumPy fast path in M's memory (M is overwritten; callers
    use the return value): one BLAS rank-one update (ger), which releases the interpreter lock inside
    ``blas_releasing_the_lock``. Elsewhere a new array."""
    if _fast(M, u, v) and M.ndim == 2 and M.size and M.flags.c_contiguous and M.flags.writeable:
        u, v = np.ascontiguousarray(u), np.ascontiguousarray(v)
        ger = _routine("blas", "ger", M.dtype)
        unlocked = _unlocked_blas(ger.typecode + "ger") if _RELEASE_LOCK.get() else None
        if unlocked is None:
            ger(1.0, v, u, a=M.T, overwrite_a=1)  # M.T (Fortran-ordered) += v u^T
            return M
        k, l = M.shape
        if u.shape != (k,) or v.shape != (l,):  # (f2py checks this; raw BLAS would read past the vectors)
            raise ValueError(f"add_outer: vectors of shapes {u.shape}, {v.shape} for a matrix of shape {M.shape}")
        integers, (rows, cols, step, ld) = _integer_addresses(l, k, 1, l)
        unlocked(rows, cols, ctypes.addressof(_ONE[M.dtype]), v.ctypes.data, step, u.ctypes.data, step, M.ctypes.data,
                 ld)
        return M
    return M + u[:, None] * v[None, :]


def lower_triangular_inverse(L, *, halves=None, block=None):
    """L^-1 of a lower-triangular L (m, m) (zeros above the diagonal), or of each L[c] of a stack (C, m, m):
    a triangular solve against the identity (NumPy: one trtri, or by halves where ``inverts_by_halves``; a singular L
    gives NaN there). ``halves`` (NumPy) / ``block``: True or False in the rule's place, and the largest diagonal block
    in ``TRIANGULAR_INVERSE_BLOCK``'s (benchmarks/triangular_inverse.py measures them)."""
    xp = array_namespace(L)
    if L.ndim == 3:
        return xp.stack([lower_triangular_inverse(L[c, ...], halves=halves, block=block) for c in range(L.shape[0])])
    if _fast(L):
        a, a_transposed = _fortran_view(L)
        halves = inverts_by_halves(L) if halves is None else halves
        inverse = _triangular_inverse(a, not a_transposed, halves, TRIANGULAR_INVERSE_BLOCK if block is None else block)
        if inverse is None:  # an exact zero on the diagonal
            return np.full(L.shape, math.nan, dtype=L.dtype)
        return inverse.T if a_transposed else inverse
    eye = xp.eye(L.shape[0], dtype=L.dtype, device=array_device(L))
    return solve_triangular(L, eye, lower=True)


# Up to twice this order a triangular inverse is one LAPACK trtri; above it, while OpenBLAS runs on one thread
# (``inverts_by_halves``: a minibatch step's m x m algebra on one core, the blocks of a pass), the NumPy fast path
# halves the matrix (``_triangular_inverse``), down to blocks of at most this order. On one thread OpenBLAS's trtri
# took 1.3-2.0 times its potrf's time at m = 200-500 (the same m^3/3 arithmetic); the halving does not, and potri
# (trtri, then lauum) gains with it; on two threads the halving gained nothing. Measured by
# benchmarks/triangular_inverse.py (record: benchmarks/results/triangular_inverse.md), which the block and the
# threshold were read from. A minibatch step forms two inverses and one C^-1 (``cholesky_inverse``); a step that
# carries the tied factor to moved inducing points forms more (``posterior.moved_factor``).
TRIANGULAR_INVERSE_BLOCK = 64
_BLAS_POOLS = None  # (OpenBLAS's threadpoolctl controllers, whether every BLAS found is OpenBLAS), once looked up
_BLAS_POOLS_LOCK = threading.Lock()


def _openblas_pools():
    """``_BLAS_POOLS``, looked up once (under a lock: the blocks of a pass run on Python threads). A copy of what
    ``agpc.threads`` keeps, which this module may not import (the layers of pyproject.toml); libraries loaded later are
    not seen."""
    global _BLAS_POOLS
    with _BLAS_POOLS_LOCK:
        if _BLAS_POOLS is None:
            try:
                found = ThreadpoolController().select(user_api="blas").lib_controllers
            except Exception:  # (threadpoolctl cannot read the libraries: nothing is known of them)
                found = []
            pools = tuple(pool for pool in found if pool.internal_api == "openblas")
            _BLAS_POOLS = (pools, bool(pools) and len(pools) == len(found))
        return _BLAS_POOLS


def inverts_by_halves(L):
    """Whether the NumPy fast path inverts the triangle L (m, m) by halves: a NumPy array of order above twice
    ``TRIANGULAR_INVERSE_BLOCK``, where every BLAS library threadpoolctl found is OpenBLAS (the only one measured) and
    runs on one thread now (a few microseconds: one call into each library). Where none was found (a BLAS
    threadpoolctl does not know, such as Apple's Accelerate), LAPACK's routines as they are."""
    if not _fast(L) or L.shape[-1] <= 2 * TRIANGULAR_INVERSE_BLOCK:
        return False
    return _one_openblas_thread()


def _one_openblas_thread():
    """Whether every BLAS library threadpoolctl found is OpenBLAS (the only one measured) and runs on one thread now
    (a few microseconds: one call into each library); False where none was found."""
    pools, all_openblas = _openblas_pools()
    return all_openblas and all(pool.num_threads == 1 for pool in pools)


def _triangular_inverse(a, lower, halves, block):
    """The inverse of the Fortran-ordered triangular ``a`` (``lower`` or upper; zeros in its other triangle), or None
    where a diagonal entry is exactly zero. By one trtri, or with ``halves`` by halves down to diagonal blocks of at
    most ``block``: for a lower L = [[L11, 0], [L21, L22]], L^-1 = [[L11^-1, 0], [-L22^-1 L21 L11^-1, L22^-1]] (upper:
    [[U11^-1, -U11^-1 U12 U22^-1], [0, U22^-1]]), each diagonal block's inverse formed the same way."""
    m = a.shape[0]
    if m <= block or not halves:
        inverse, info = _routine("lapack", "trtri", a.dtype)(a, lower=int(lower))
        return None if info > 0 else inverse  # (info < 0, an illegal argument, cannot happen here)
    h = m // 2
    first = _triangular_inverse(a[:h, :h], lower, True, block)
    second = _triangular_inverse(a[h:, h:], lower, True, block)
    if first is None or second is None:
        return None
    out = np.zeros_like(a, order="F")
    out[:h, :h], out[h:, h:] = first, second

    def times(T, B, right):  # T @ B, or B @ T when ``right``, for T triangular like ``a`` (F-ordered)
        return _triangular_blas("trmm", T if lower else T.T, B, not lower, right, True)

    if lower:  # -L22^-1 (L21 L11^-1)
        product = times(second, times(first, np.array(a[h:, :h], order="F"), True), False)
        out[h:, :h] = np.negative(product, out=product)
    else:  # -U11^-1 (U12 U22^-1)
        product = times(first, times(second, np.array(a[:h, h:], order="F"), True), False)
        out[:h, h:] = np.negative(product, out=product)
    return out


def cholesky_inverse(L, *, halves=None):
    """(L L^T)^-1 (m x m, symmetric) from the lower Cholesky factor L (zeros above the diagonal): L^-T L^-1 by
    two triangular solves (NumPy: one potri, whose triangle is mirrored; where ``inverts_by_halves``, L^-1 by halves
    and L^-T L^-1 by one lauum instead, ``triangular_gram``, potri's own inverse being trtri's:
    ``TRIANGULAR_INVERSE_BLOCK``). ``halves``: as ``lower_triangular_inverse`` takes it."""
    if _fast(L):
        if inverts_by_halves(L) if halves is None else halves:
            return triangular_gram(lower_triangular_inverse(L, halves=True), overwrite=True)
        a, a_transposed = _fortran_view(L)
        triangle, info = _routine("lapack", "potri", L.dtype)(a, lower=int(not a_transposed))
        if info > 0:  # (info < 0, an illegal argument, cannot happen here)
            return np.full(L.shape, math.nan, dtype=L.dtype)
        return _mirrored(triangle.T if a_transposed else triangle)
    return solve_triangular(L, lower_triangular_inverse(L), lower=True, trans=True)


def triangular_gram(T, *, overwrite=False):
    """T^T T (m x m, symmetric) for a lower-triangular T (zeros above the diagonal): (L L^T)^-1 for T = L^-1. On the
    NumPy fast path one lauum (m^3 / 3 flops, its triangle mirrored; one OpenBLAS thread: 0.59-0.63 of a triangular
    product's time at m = 200-500, the same at m = 100; benchmarks/results/step_m3_savings_amd_epyc.md), elsewhere a
    triangular product. ``overwrite``: T is the caller's temporary (else it is left as it was)."""
    if _fast(T) and T.shape[0] > 0:
        a, a_transposed = _fortran_view(T)  # T (lower) or T^T (upper)
        # lauum: U U^T of an upper U, L^T L of a lower L; either is T^T T here (NaN in T is NaN in the result). f2py
        # would write into a read-only T too: it is overwritten only when it may be
        overwrite = overwrite and T.flags.writeable
        triangle, _ = _routine("lapack", "lauum", T.dtype)(a, lower=int(not a_transposed), overwrite_c=int(overwrite))
        return _mirrored(triangle.T if a_transposed else triangle)
    return triangular_matmul(T, T, trans=True)


# From this order on, where every BLAS is OpenBLAS on one thread (``congruence_by_sygst``), the NumPy fast path forms
# T^T P T by one LAPACK sygst; elsewhere two triangular products. AMD EPYC, Haswell kernel, interleaved, sygst's median
# time over theirs on one thread: 1.87 at m = 100, 1.20-1.33 at 200-256, 0.86-1.11 at 300-450 (jagged), 0.77-0.97 at
# 500, 0.75-0.94 at 650-1,000; on two threads, where the triangular products share the work better: 1.42-1.49 at
# m = 500, 0.90-1.34 at 650-800, 0.91-0.97 at 1,000 (benchmarks/results/step_m3_savings_amd_epyc.md, "A symmetric
# congruence by sygst"). agpc's rule runs a minibatch step on one thread below m = 407 or where its fit has one core
# (``n_jobs=None``), else on two (``agpc.threads``), and the m x m algebra between threaded passes on one below m ~ 800.
CONGRUENCE_MIN_ORDER = 500


def congruence_by_sygst(T):
    """Whether ``symmetric_congruence`` takes one sygst for T: a NumPy array of order ``CONGRUENCE_MIN_ORDER`` or more,
    every BLAS found OpenBLAS on one thread."""
    return _fast(T) and T.shape[0] >= CONGRUENCE_MIN_ORDER and _one_openblas_thread()


def symmetric_congruence(T, P, *, overwrite=False):
    """T^T P T (m x m) for a lower-triangular T (zeros above the diagonal) and a symmetric P: L^-T P L^-1 for
    T = L^-1, the m x m part of a gradient through K = L L^T. Two triangular products (2 m^3 flops; symmetric up to
    round-off), except on the NumPy fast path where ``congruence_by_sygst``: one LAPACK sygst, which uses P's
    symmetry (m^3 flops) and reads one triangle of P (which one depends on the memory orders: P must be symmetric),
    its result's triangle mirrored (exactly symmetric). ``overwrite``: P is the caller's temporary (else it is left
    as it was)."""
    if _fast(T, P) and congruence_by_sygst(T):
        b, b_transposed = _fortran_view(T)  # T (lower) or T^T (upper)
        a = P.T if P.flags.c_contiguous else P  # (P symmetric: its Fortran view is P)
        # sygst with itype 2 writes L^T A L for a lower L, U A U^T for an upper U, into that triangle of A: T^T P T
        # either way. f2py would write into a read-only P too: it is overwritten only when it may be
        overwrite = overwrite and P.flags.writeable
        out, _ = _routine("lapack", "sygst", T.dtype)(a, b, itype=2, lower=int(not b_transposed),
                                                       overwrite_a=int(overwrite))
        return _mirrored(out.T if b_transposed else out)
    return triangular_matmul(T, triangular_matmul(T, P, trans=True, overwrite=overwrite), right=True, overwrite=True)


def _mirrored(lower):
    """The symmetric matrix whose lower triangle LAPACK's lauum / potri / sygst wrote into ``lower`` (an array of their
    own, or a view of it: the other triangle holds anything), that triangle copied over the other in place: one pass
    with no new array, where the matrix plus its transpose, the other triangle cut first, took two and two (m = 500:
    0.35 ms against 0.67). C-ordered (a symmetric matrix is its transpose)."""
    np.copyto(lower, lower.T, where=_strictly_upper(lower.shape[0]))
    return lower if lower.flags.c_contiguous else lower.T


@functools.lru_cache(maxsize=8)
def _strictly_upper(m):
    """The mask of an m x m matrix's entries above the diagonal (read-only; the few orders a fit uses kept)."""
    mask = np.triu(np.ones((m, m), dtype=bool), 1)
    mask.flags.writeable = False
    return mask


def identity_plus(S, scale=1.0, identity=1.0):
    """identity * I + scale * S for a square S (a new array)."""
    if scale == 1.0:
        return add_to_diagonal(S, identity)
    return add_to_diagonal(scale * S, identity, overwrite=True)


def add_to_diagonal(A, values, *, overwrite=False):
    """A + diag(values) for a square A (``values`` a number or a vector): on NumPy a copy of A (or A itself, with
    ``overwrite``: a temporary the caller owns) with the diagonal added in place, one pass over A where the standard's
    ``A + values * eye`` makes three."""
    if _fast(A):
        out = A if overwrite else A.copy()
        out.flat[:: A.shape[0] + 1] += values  # the diagonal, in place, in either memory order
        return out
    xp = array_namespace(A)
    eye = xp.eye(A.shape[0], dtype=A.dtype, device=array_device(A))
    if getattr(values, "ndim", 0) == 1:
        return A + values[:, None] * eye
    return A + (eye if values == 1.0 else values * eye)


def without_diagonal(A, *, overwrite=False):
    """A square A with its diagonal set to 0: on NumPy a copy of A (or A itself, with ``overwrite``: a temporary the
    caller owns) with the diagonal written in place, one pass over m entries where the standard's A * (1 - eye)
    makes three over m^2."""
    if _fast(A):
        out = A if overwrite else A.copy()
        out.flat[:: A.shape[0] + 1] = 0.0  # the diagonal, in place, in either memory order
        return out
    xp = array_namespace(A)
    return A * (1.0 - xp.eye(A.shape[0], dtype=A.dtype, device=array_device(A)))


def factor_failure(L):
    """A 0-d array on L's device: 0.0 when every diagonal entry of the triangular factor ``L`` (m, m), or of every
    factor of a stack (..., m, m), is positive and finite, NaN otherwise. No host synchronisation: added to a value
    the caller reads anyway (a step's log Z), it leaves that value as it is (x + 0.0 == x) or makes it NaN.

    A Cholesky factor of a positive definite matrix has a positive diagonal; a library that does not raise when the
    factorisation fails leaves it otherwise: LAPACK's potrf stops at the first non-positive pivot and leaves that
    pivot on the diagonal (``info`` > 0), NaN input gives NaN, and cuSOLVER's potrf (CuPy, which reads its
    ``devInfo`` only under ``cupyx.errstate(linalg="raise")``, a synchronisation) documents nothing about a failed
    factor's content. A positive finite diagonal is necessary, not sufficient: it is the check that needs no
    synchronisation; ``gpu_tests/run_on_gpu.sh`` records what a failed factorisation returns on a real GPU."""
    xp = array_namespace(L)
    healthy = _healthy_diagonal(L, xp)
    return xp.where(healthy, 0.0 * xp.astype(healthy, L.dtype), math.nan)  # (0.0 * 1.0: no upload of a 0.0)


def _healthy_diagonal(L, xp):
    """0-d bool: every diagonal entry of L positive and finite (NaN fails both comparisons)."""
    diag = xp.linalg.diagonal(L)
    return xp.all((diag > 0.0) & (diag < math.inf))


def _cholesky_once(A, xp):
    try:
        L = xp.linalg.cholesky(A)
    except Exception:  # NumPy/strict raise LinAlgError; other libraries other types
        return None
    # CuPy (and some others) return instead of raising: check the diagonal (one host read: the checked path).
    if not bool(_healthy_diagonal(L, xp)):
        return None
    return L


def cholesky_or_nan(A, *, overwrite=False):
    """Lower Cholesky factor of A with no check on the host and no host synchronisation: where the factorisation
    fails the result is NaN, so that a failure travels on to the one scalar a training step brings to the host.
    NumPy (LAPACK's potrf, ``info`` > 0) and libraries built on it raise, which is turned into a NaN matrix here;
    CuPy returns whatever cuSOLVER left (it reads ``devInfo`` only under ``cupyx.errstate(linalg="raise")``, a
    synchronisation), so its factor is checked on the device (``factor_failure``: a positive, finite diagonal) and
    made NaN where the check fails: a few operations on the m diagonal entries and one on the factor.
    ``overwrite``: A is the caller's temporary (the NumPy fast path factorises it in place)."""
    if _fast(A):  # one potrf, on A's lower triangle as numpy.linalg.cholesky reads it, and no exception
        a, a_transposed = _fortran_view(A)
        factor, info = _routine("lapack", "potrf", A.dtype)(a, lower=int(not a_transposed), clean=1,
                                                             overwrite_a=int(overwrite))
        if info != 0:
            return np.full(A.shape, math.nan, dtype=A.dtype)
        return factor.T if a_transposed else factor
    xp = array_namespace(A)
    try:
        L = xp.linalg.cholesky(A)
    except Exception:  # NumPy/strict raise LinAlgError; other libraries other types
        return xp.full(A.shape, math.nan, dtype=A.dtype, device=array_device(A))
    if is_cupy_namespace(xp):
        return L + factor_failure(L)[..., None, None]
    return L


# The sum of products of two arrays along an axis, as one CuPy reduction kernel (``cupy.ReductionKernel``: the
# map, the sum and the write fused, nothing but the result written to memory); made on first use (import cupy only
# where CuPy computes), compiled by CuPy once a dtype.
_ROW_DOT_KERNEL = []


def _cupy_row_dot_kernel(cupy):
    if not _ROW_DOT_KERNEL:
        _ROW_DOT_KERNEL.append(cupy.ReductionKernel("T x, T y", "T z", "x * y", "a + b", "z = a", "0",
                                                    "agpc_row_dot"))
    return _ROW_DOT_KERNEL[0]


def row_dot(A, B, *, axis=-1):
    """sum(A * B, axis=axis) for real arrays (broadcasting as ``vecdot``) in one fused reduction, with no temporary
    the size of A: ``vecdot`` on NumPy (a generalised ufunc) and on other libraries, and on CuPy, which has no
    ``vecdot`` (array-api-compat's stand-in moves the axis, copies both operands for ``conj`` and contiguity and runs
    a batched (1 x m)(m x 1) product), one reduction kernel. Row norms of an (n, m) block: ``row_dot(A, A)``; column
    norms of an (m, n) one: ``row_dot(A, A, axis=-2)``, on the NumPy fast path an einsum, which streams both arrays
    once (NumPy's vecdot along the strided axis ran 2-2.6 times slower at m = 200-500)."""
    if axis in (0, -2) and A.ndim == 2 and _fast(A, B) and A.shape == B.shape:
        return np.einsum("ij,ij->j", A, B)
    xp = array_namespace(A, B)
    if is_cupy_namespace(xp):
        import cupy

        return _cupy_row_dot_kernel(cupy)(A, B, axis=axis)
    return xp.vecdot(A, B, axis=axis)


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


OUTLIER_SPREAD_RATIO = 30.0
"""A column whose standard deviation is more than this many times the spread of its rows less the extreme ones
(``moments_without_extremes``) has it set by those few rows (``few_rows_set_spread``), which the default kernel's
lengthscales and the inducing points' steps must not follow. On banana (2,000 standardised rows) one value of a
feature at 1e4 (deviation 226 times the rest's) started that lengthscale at ~300, the fit dropped the feature and its
test NLL went 0.295 -> 0.52; at 68 times it still fitted (0.300), at 23 as clean data. Among the shared data sets the
largest ratio is 3.0 (australian), 11.9 on airline's first 200,000 rows (plane ages of 2008 among ones of 0-40);
heavy tails on 20,000 rows: lognormal(sigma 3) 14, Pareto(1) 11, Cauchy 28."""

EXTREME_ROW_SHARE = 100  # one row in this many (at least one) is left out of ``moments_without_extremes``


def moments_without_extremes(X, weights=None):
    """Per column of X ((..., n, d), along its rows; any namespace, on X's device): the mean and the standard
    deviation of its rows less the farthest from the mean, 1 / ``EXTREME_ROW_SHARE`` of their weight (at least one
    row's), each (..., d); the deviation is 0 where only those vary. ``weights`` (n,), X's namespace: each row
    counted by its weight, as the row repeated (a heavy row is left out in part: the start's rows come with counts,
    ``inducing.start_rows``, and a record repeated over a third of the rows is no outlier). Computed on each column
    divided by its largest |x|, as ``scaled_std`` (no overflow at 1e300)."""
    xp = array_namespace(X)
    magnitude = xp.max(xp.abs(X), axis=-2, keepdims=True)
    magnitude = xp.where(magnitude > 0, magnitude, xp.ones_like(magnitude))
    S = X / magnitude
    w = xp.ones_like(S) if weights is None else xp.zeros_like(S) + xp.astype(weights, S.dtype)[:, None]
    total = xp.sum(w, axis=-2, keepdims=True)
    mean = xp.sum(w * S, axis=-2, keepdims=True) / total
    farthest = xp.argsort(-((S - mean) ** 2), axis=-2)  # (stable: ties keep the row order)
    S, w = xp.take_along_axis(S, farthest, axis=-2), xp.take_along_axis(w, farthest, axis=-2)
    beyond = xp.cumulative_sum(w, axis=-2) - w  # the weight of the rows farther out than each
    cut = xp.maximum(xp.floor(total / EXTREME_ROW_SHARE), xp.ones_like(total))  # (n // 100 rows, at least one)
    kept = w - xp.minimum(xp.maximum(cut - beyond, xp.zeros_like(w)), w)  # (not xp.clip: a host copy on CuPy)
    total = xp.sum(kept, axis=-2, keepdims=True)
    total = xp.where(total > 0, total, xp.ones_like(total))
    mean = xp.sum(kept * S, axis=-2, keepdims=True) / total
    spread = xp.sqrt(xp.sum(kept * (S - mean) ** 2, axis=-2, keepdims=True) / total) * magnitude
    return xp.squeeze(mean * magnitude, axis=-2), xp.squeeze(spread, axis=-2)


def few_rows_set_spread(std, bulk):
    """Where a column's standard deviation ``std`` is set by a few extreme rows: more than ``OUTLIER_SPREAD_RATIO``
    times ``bulk`` (``moments_without_extremes``), where the other rows vary at all (a column constant but for a few
    rows has nothing else to follow). Arrays of any namespace, elementwise."""
    return (bulk > 0) & (std > OUTLIER_SPREAD_RATIO * bulk)


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


def starting_jitter(jitter, Z):
    """The jitter a model with inducing points ``Z`` starts from: the estimator's ``jitter``, at least
    ``jitter_floor(Z)`` (a change only for float32)."""
    return max(float(jitter), jitter_floor(Z))


def cholesky(A, *, what="matrix", max_tries=6):
    """Lower Cholesky factor of a symmetric positive definite matrix.

    On failure, adds ``jitter * mean(diag(A))`` to the diagonal with jitter 1e-10, 1e-9, ... and tries
    again; after ``max_tries`` raises :class:`CholeskyError` naming ``what`` and the jitter tried. The
    ladder starts no lower than ten round-offs of A's type (10 eps: 1.2e-6 for float32, where a relative
    1e-10 would not change the diagonal at all; float64's 1e-10 is above 10 eps, so its ladder is as before).
    """
    return cholesky_with_jitter(A, what=what, max_tries=max_tries)[0]


# How many jitters a factorisation that fails tries before it raises (``jitter_ladder``).
JITTER_TRIES = 6


def jitter_ladder(A, tries=JITTER_TRIES):
    """The jitters ``cholesky_with_jitter`` adds to the diagonal of ``A`` in turn: from max(1e-10, 10 eps) to 10^5
    times that, relative to the mean |diagonal| of A (host floats; one reduction of A)."""
    xp = array_namespace(A)
    scale = float(xp.mean(xp.abs(xp.linalg.diagonal(A))))
    scale = scale if scale > 0 else 1.0
    first = max(1e-10, 10.0 * machine_epsilon(A))
    return [scale * 10.0 ** (k + math.log10(first)) for k in range(tries)]


def cholesky_with_jitter(A, *, what="matrix", max_tries=JITTER_TRIES, report=True):
    """``cholesky`` that also returns the jitter it had to add to the diagonal (0.0 when none). An added
    jitter is reported (``note_jitter``) unless ``report=False`` (a caller that only probes for it)."""
    xp = array_namespace(A)
    L = _cholesky_once(A, xp)
    if L is not None:
        return L, 0.0
    if not bool(xp.all(xp.isfinite(A))):
        raise CholeskyError(f"Cholesky of {what} failed: the matrix contains NaN or inf")
    m = A.shape[0]
    eye = xp.eye(m, dtype=A.dtype, device=array_device(A))
    tried = []
    for jitter in jitter_ladder(A, max_tries):
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


def _erfc_cf(x):
    """t(x) = x + (1/2)/(x + 1/(x + (3/2)/(x + ...))) for x >= 1.5, Laplace's continued fraction of
    erfc(x) = exp(-x^2) / (sqrt(pi) t(x)): 1 / (sqrt(pi) t) is erfcx(x) itself, with no exponential in it."""
    t = x
    for k in range(_CF_TERMS, 0, -1):
        t = x + (0.5 * k) / t
    return t


def _log_erfc_cf(x, xp):
    """log erfc(x) for x >= 1.5 from the continued fraction (``_erfc_cf``)."""
    return -x * x - _LOG_SQRT_PI - xp.log(_erfc_cf(x))


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


def _special(name, z):
    """SciPy's special function ``name`` at z on NumPy, CuPy's on CuPy, None on any other namespace."""
    xp = array_namespace(z)
    if is_numpy_namespace(xp):
        return getattr(scipy.special, name)(z)
    if is_cupy_namespace(xp):
        import cupyx.scipy.special

        return getattr(cupyx.scipy.special, name)(z)
    return None


def log_ndtr(z):
    """log Phi(z), the log of the standard normal CDF, accurate in both tails."""
    value = _special("log_ndtr", z)
    return _log_ndtr_generic(z, array_namespace(z)) if value is None else value


def ndtr(z):
    """Phi(z), the standard normal CDF."""
    value = _special("ndtr", z)
    return array_namespace(z).exp(log_ndtr(z)) if value is None else value


def inverse_mills_ratio(z):
    """lambda(z) = N(z) / Phi(z), to the float type's relative round-off in both tails: sqrt(2 / pi) / erfcx(-z /
    sqrt(2)) (SciPy's erfcx, CuPy's; ``_inverse_mills_generic`` elsewhere). Not exp(log N(z) - log Phi(z)): that
    exponent's round-off, eps |log Phi(z)| ~ eps z^2 / 2, is the ratio's relative error, and EP's probit gamma =
    lambda (lambda + z) / b cancels lambda + z ~ 1 / |z| down to it (z = -1e4: gamma 1.6 for 1; z = -1e5, 6,367)."""
    x = z * -_SQRT_HALF
    value = _special("erfcx", x)
    return _inverse_mills_generic(x, array_namespace(z)) if value is None else _SQRT_2_OVER_PI / value


def _inverse_mills_generic(x, xp):
    """The array API's ``inverse_mills_ratio`` at x = -z / sqrt(2): sqrt(2) t(x) (``_erfc_cf``) for x > 1.5, where
    sqrt(2 / pi) / erfcx(x) is exactly that; exp(log N - log Phi) nearer and above the mean, where |log Phi| < 3
    keeps that exponent's round-off at a few eps."""
    z = x * -math.sqrt(2.0)
    is_large = x > _SWITCH
    tail = math.sqrt(2.0) * _erfc_cf(xp.maximum(x, _SWITCH))
    near = xp.exp(log_normal_pdf(z) - _log_ndtr_generic(xp.where(is_large, 0.0, z), xp))
    return xp.where(is_large, tail, near)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


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


def gauss_legendre(n, like):
    """Nodes and weights of n-point Gauss-Legendre quadrature on [-1, 1] (NumPy's ``leggauss``), in ``like``'s
    namespace, type and device: the host computes them (an edge operation), the rule every namespace then uses."""
    nodes, weights = np.polynomial.legendre.leggauss(n)
    xp, device = array_namespace(like), array_device(like)
    return (asarray_like(nodes, xp, device=device, dtype=like.dtype),
            asarray_like(weights, xp, device=device, dtype=like.dtype))
