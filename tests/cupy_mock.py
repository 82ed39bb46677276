"""A mocked CuPy, for what the GPU path does on a machine without one (CI has no GPU).

``MockCupy`` puts stand-ins for ``cupy``, ``cupyx`` (``scipy.linalg``, ``scipy.special``, ``profiler``) and
``array_api_compat.cupy`` into ``sys.modules`` (through pytest's ``monkeypatch``, undone after the test). Its array
namespace, ``mock.xp``, is a counting namespace (``array_counting.CountingNamespace`` over NumPy) named
``array_api_compat.cupy``: agpc takes its CuPy paths on it (``is_cupy_namespace``), and every operation, host
conversion and CuPy routine it calls is counted. Its arrays are instances of ``mock.ndarray`` (``cupy.ndarray``
here): ``get()`` copies to the host as CuPy's does.

What is mocked, and how (the real behaviour is CuPy 14.2's; what only a GPU can decide is re-checked by
gpu_tests/run_on_gpu.sh):
- ``cupy.cuda.runtime``: ``getDeviceCount``, ``getDevice``, ``getDeviceProperties`` (an H100 SXM's by default),
  ``memGetInfo``, ``CUDARuntimeError``; ``fail={"runtime": exc}`` makes the device queries raise ``exc``;
- the CUDA libraries: ``fail={"cublas": exc}`` (products), ``{"cusolver": exc}`` (``linalg.cholesky``),
  ``{"nvrtc": exc}`` (``cupy.cuda.nvrtc.getVersion``), ``{"import": exc}`` (``import cupyx.scipy.linalg``);
- ``linalg.cholesky`` never raises, as CuPy's (cuSOLVER's status is read only under ``cupyx.errstate``): a failed
  factorisation returns what LAPACK's potrf leaves (the factor up to the failing pivot, that pivot on the
  diagonal), or ``cholesky_result`` when set (a function of the matrix: finite garbage, NaN, ...);
- ``cupy.ReductionKernel``: evaluates the map and post-map expressions as Python (the ones agpc writes are valid
  Python: ``x * y``, ``z = a``) and a reduction of ``a + b``; each call is one counted operation; arguments of two
  dtypes for its one type ``T`` are refused, as CuPy refuses them;
- ``vecdot``: array-api-compat's generic one (CuPy 14 has none), counted operation by operation;
- ``cupyx.scipy.linalg.solve_triangular``: SciPy's, one operation, after CuPy's own checks of the shapes (a stack's
  batch shape repeated exactly by the right-hand side: no broadcasting); it refuses two dtypes, which CuPy would
  silently cast to the triangle's (``_check_solve_triangular``);
- ``cupyx.scipy.special.log_ndtr`` / ``ndtr`` / ``erfcx``: SciPy's, one operation each;
- ``cupyx.profiler.benchmark``: CuPy's signature; like CuPy it reads ``func.__name__`` when no ``name`` is given;
  times on the host;
- stream capture: between ``Stream.begin_capture`` and ``end_capture`` a product, a triangular solve or a Cholesky
  factorisation raises NotImplementedError("calling cuBLAS / cuSOLVER API during stream capture is currently
  unsupported"), as CuPy 14's ``cublas.setStream`` / ``cusolver.setStream`` do; elementwise work is captured;
- ``cupy.asnumpy``, ``cupy.asarray``, ``cupy.cuda.Stream`` / ``Event`` (``synchronize``), ``cupy.cuda.Device``,
  ``cupy.cuda.get_current_stream``, ``cupy.get_default_memory_pool``, ``cupyx.errstate`` and
  ``cupyx.allow_synchronize`` (both doing nothing);
- ``cupy._core.get_compute_type`` / ``set_compute_type``: the compute type of a dtype fixed at its first product (from
  ``CUPY_TF32`` for float32, TF32 from compute capability 8.0 on) unless set before, as CuPy's.
"""

from __future__ import annotations

import os
import sys
import time
import types
import warnings
from contextlib import contextmanager

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import scipy.special

import array_api_compat
import array_api_compat.numpy as compat_numpy
from array_api_compat.common import _aliases as compat_aliases
from array_counting import CountingArray, CountingNamespace, _unwrap

from agpc import backend

__all__ = ["MockCupy", "H100_PROPERTIES", "A100_PROPERTIES", "RTX4090_PROPERTIES", "CUDARuntimeError"]

# cupy.cuda.runtime.getDeviceProperties(0) of three devices, the keys agpc reads (clocks in kHz, bus width in bits)
H100_PROPERTIES = {"name": b"NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multiProcessorCount": 132,
                   "clockRate": 1980000, "memoryClockRate": 2619000, "memoryBusWidth": 5120,
                   "singleToDoublePrecisionPerfRatio": 2, "totalGlobalMem": 85_045_460_992}
A100_PROPERTIES = {"name": b"NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0, "multiProcessorCount": 108,
                   "clockRate": 1410000, "memoryClockRate": 1593000, "memoryBusWidth": 5120,
                   "singleToDoublePrecisionPerfRatio": 2, "totalGlobalMem": 85_100_000_000}
RTX4090_PROPERTIES = {"name": b"NVIDIA GeForce RTX 4090", "major": 8, "minor": 9, "multiProcessorCount": 128,
                      "clockRate": 2520000, "memoryClockRate": 10501000, "memoryBusWidth": 384,
                      "singleToDoublePrecisionPerfRatio": 64, "totalGlobalMem": 25_300_000_000}


class CUDARuntimeError(RuntimeError):
    """Stands for ``cupy_backends.cuda.api.runtime.CUDARuntimeError``."""


class _MockNamespace(CountingNamespace):
    """A counting namespace whose arrays are the mock's ``cupy.ndarray``."""

    def __init__(self, array_type, **options):
        super().__init__(compat_numpy, **options)
        self.__name__ = "array_api_compat.cupy"
        self._array_type = array_type

    def _wrap(self, value):
        out = super()._wrap(value)
        if type(out) is CountingArray:
            return self._array_type(out._array, self)
        return out


class MockCupy:
    """Install with ``MockCupy(monkeypatch, ...)``; see the module docstring."""

    def __init__(self, monkeypatch, *, device_count=1, properties=None, free_bytes=40 * 2**30, fail=None,
                 cholesky_result=None, **counting_options):
        self.fail = dict(fail or {})
        self.device_count = device_count
        self.properties = dict(H100_PROPERTIES if properties is None else properties)
        self.free_bytes = free_bytes
        self.cholesky_result = cholesky_result
        self.synchronizations = 0  # Stream / Event / Device synchronize calls
        self.capturing = False  # a Stream between begin_capture and end_capture
        self.library_calls = []  # (library, routine) of the mocked CUDA library calls
        # a new array class each time: array-api-compat caches its namespace lookups by class
        self.ndarray = type("ndarray", (CountingArray,), {"get": _get, "tolist": lambda a: a.get().tolist(),
                                                          "__module__": "cupy"})
        self.xp = _MockNamespace(self.ndarray, **counting_options)
        self._patch_linalg()
        self.cupy = self._cupy_module()
        self.cupyx = self._cupyx_modules()
        for name, module in {"cupy": self.cupy, "cupy._core": self.cupy._core,
                             "cupy._core._routines_linalg": self.cupy._core._routines_linalg,
                             "cupy.cuda": self.cupy.cuda, "cupy.cuda.runtime": self.cupy.cuda.runtime,
                             "cupy.cuda.nvrtc": self.cupy.cuda.nvrtc, "cupy.linalg": self.cupy.linalg,
                             **self.cupyx, "array_api_compat.cupy": self.xp}.items():
            monkeypatch.setitem(sys.modules, name, module)
        if "import" in self.fail:  # ``import cupyx.scipy.linalg`` raises it, as a missing cuBLAS makes it do
            monkeypatch.delitem(sys.modules, "cupyx.scipy.linalg", raising=False)
            monkeypatch.setattr(sys, "meta_path", [_RefusedImport("cupyx.scipy.linalg", self.fail["import"])]
                                + sys.meta_path)
        monkeypatch.setattr(array_api_compat, "cupy", self.xp, raising=False)
        # agpc.backend's caches of what CuPy it met: each mock starts afresh
        monkeypatch.setattr(backend, "_READY_DEVICES", set(), raising=False)
        monkeypatch.setattr(backend, "_ROW_DOT_KERNEL", [], raising=False)

    # -- arrays ----------------------------------------------------------------------------------

    def put(self, value, dtype=None):
        """A NumPy value onto the mocked device."""
        return self.xp.asarray(np.asarray(value, dtype=dtype))

    def _raise_if(self, what):
        if what in self.fail:
            raise self.fail[what]

    def _refuse_during_capture(self, library):
        """CuPy 14's ``cublas.setStream`` / ``cusolver.setStream`` while the stream is capturing."""
        if self.capturing:
            raise NotImplementedError(f"calling {library} API during stream capture is currently unsupported")

    # -- the mocked libraries --------------------------------------------------------------------

    def _patch_linalg(self):
        mock = self

        def cholesky(A):
            mock._raise_if("cusolver")
            mock._refuse_during_capture("cuSOLVER")
            mock.library_calls.append(("cusolver", "potrf"))
            a = np.asarray(_unwrap(A))
            if a.ndim > 2:
                return np.stack([cholesky(a[i]) for i in range(a.shape[0])])
            if mock.cholesky_result is not None:
                return np.tril(mock.cholesky_result(a))
            # LAPACK's potrf: stops at the first non-positive pivot and leaves it there (info > 0)
            potrf = scipy.linalg.lapack.dpotrf if a.dtype == np.float64 else scipy.linalg.lapack.spotrf
            L, _info = potrf(a, lower=1, clean=1)
            return np.tril(L)

        linalg = self.xp.linalg
        linalg.cholesky = lambda A: self.xp._call("linalg.cholesky", cholesky, (A,), {})
        matmul = self.xp.matmul

        def product(a, b):
            mock.cupy._core.get_compute_type(_unwrap(a).dtype)  # (CuPy fixes its compute type at a dtype's first product)
            mock._raise_if("cublas")
            mock._refuse_during_capture("cuBLAS")
            mock.library_calls.append(("cublas", "gemm"))
            return matmul(a, b)

        self.xp.matmul = product
        # CuPy 14 has no vecdot: array-api-compat's CuPy namespace runs its generic one (moveaxis, broadcast, conj,
        # a batched (1 x m)(m x 1) product), and so does the mock
        generic_vecdot = (lambda x1, x2, /, *, axis=-1:
                          compat_aliases.vecdot(x1, x2, xp=self.xp, axis=axis))  # noqa: E731
        self.xp.vecdot = self.xp.linalg.vecdot = generic_vecdot
        self.ndarray.__matmul__ = lambda a, b: product(a, b)
        self.ndarray.__rmatmul__ = lambda a, b: product(b, a)

    def _cupy_module(self):
        mock = self
        cupy = types.ModuleType("cupy")
        cupy.__version__ = "14.2.0 (mock)"
        cupy.ndarray = self.ndarray
        cupy.float32, cupy.float64 = np.float32, np.float64

        def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
            return a.get()

        cupy.asnumpy = asnumpy
        cupy.ones = lambda shape, dtype=float: self.put(np.ones(shape, dtype=dtype))
        cupy.eye = lambda n, dtype=float: self.put(np.eye(n, dtype=dtype))
        cupy.linalg = types.ModuleType("cupy.linalg")
        cupy.linalg.cholesky = self.xp.linalg.cholesky
        cupy.ReductionKernel = self._reduction_kernel_class()

        runtime = types.ModuleType("cupy.cuda.runtime")
        runtime.CUDARuntimeError = CUDARuntimeError

        def device_count():
            mock._raise_if("runtime")
            return mock.device_count

        def device_properties(device):
            mock._raise_if("runtime")
            return dict(mock.properties)

        runtime.getDeviceCount = device_count
        runtime.getDevice = lambda: 0
        runtime.runtimeGetVersion = lambda: 12090
        runtime.driverGetVersion = lambda: 12090
        runtime.getDeviceProperties = device_properties
        def memory():
            mock._raise_if("runtime")
            return mock.free_bytes, mock.properties.get("totalGlobalMem", 2 * mock.free_bytes)

        runtime.memGetInfo = memory

        nvrtc = types.ModuleType("cupy.cuda.nvrtc")

        def nvrtc_version():
            mock._raise_if("nvrtc")
            return (12, 9)

        nvrtc.getVersion = nvrtc_version

        class Synchronizing:
            def synchronize(self):
                mock.synchronizations += 1

        class Device(Synchronizing):
            def __init__(self, device=None):
                self.id = 0 if device is None else int(getattr(device, "id", device))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class Graph:
            def launch(self, stream=None):
                return None

        class Stream(Synchronizing):
            def __init__(self, non_blocking=False):
                self.non_blocking = non_blocking

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def begin_capture(self, mode=None):
                mock.capturing = True

            def end_capture(self):
                mock.capturing = False
                return Graph()

        class Event(Synchronizing):
            def record(self, stream=None):
                return None

        class Pool:
            def free_bytes(self):
                return 0

            def used_bytes(self):
                return 0

            def get_limit(self):
                return 0

        pool = Pool()
        cupy.get_default_memory_pool = lambda: pool
        cupy._core = types.ModuleType("cupy._core")
        cupy._core._routines_linalg = self._compute_types()
        cupy._core.get_compute_type = cupy._core._routines_linalg.get_compute_type
        cupy._core.set_compute_type = cupy._core._routines_linalg.set_compute_type
        cupy.cuda = types.ModuleType("cupy.cuda")
        cupy.cuda.runtime, cupy.cuda.nvrtc = runtime, nvrtc
        cupy.cuda.Device, cupy.cuda.Stream, cupy.cuda.Event = Device, Stream, Event
        current = Stream()
        cupy.cuda.get_current_stream = lambda: current
        cupy.asarray = lambda a, dtype=None: self.put(a.get() if hasattr(a, "get") else a, dtype=dtype)
        return cupy

    def _compute_types(self):
        """``cupy._core._routines_linalg``'s compute types: fixed once, at the first ``get_compute_type`` of a dtype
        (CuPy asks at each product), from ``CUPY_TF32`` for float32 (TF32 only from compute capability 8.0), unless
        ``set_compute_type`` set it before."""
        mock = self
        routines = types.ModuleType("cupy._core._routines_linalg")
        routines.COMPUTE_TYPE_TBD, routines.COMPUTE_TYPE_DEFAULT, routines.COMPUTE_TYPE_TF32 = 0, 1, 7  # (its .pxd)
        chosen = {}

        def set_compute_type(dtype, compute_type):
            if compute_type == routines.COMPUTE_TYPE_TF32 and mock.properties["major"] < 8:
                warnings.warn("COMPUTE_TYPE_BF16 and COMPUTE_TYPE_TF32 are only available on GPUs with compute "
                              "capability 8.0 or higher. COMPUTE_TYPE_DEFAULT will be used instead.")  # (CuPy's)
                compute_type = routines.COMPUTE_TYPE_DEFAULT
            chosen[np.dtype(dtype).char] = compute_type

        def get_compute_type(dtype):
            char = np.dtype(dtype).char
            if chosen.get(char, routines.COMPUTE_TYPE_TBD) == routines.COMPUTE_TYPE_TBD:
                tf32 = char in "fF" and int(os.environ.get("CUPY_TF32", "0")) > 0
                set_compute_type(dtype, routines.COMPUTE_TYPE_TF32 if tf32 else routines.COMPUTE_TYPE_DEFAULT)
            return chosen.get(char, routines.COMPUTE_TYPE_TBD)

        routines.set_compute_type, routines.get_compute_type = set_compute_type, get_compute_type
        return routines

    def _reduction_kernel_class(self):
        mock = self

        class ReductionKernel:
            """``cupy.ReductionKernel(in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name)``."""

            def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name="reduce"):
                if reduce_expr.replace(" ", "") != "a+b":
                    raise NotImplementedError(f"the mocked ReductionKernel sums only, not {reduce_expr!r}")
                self.inputs = [p.split()[-1] for p in in_params.split(",")]
                self.output = out_params.split()[-1]
                self.map_expr, self.post_map_expr, self.identity, self.name = map_expr, post_map_expr, identity, name

            def __call__(self, *args, axis=None, keepdims=False):
                return mock.xp._call(f"ReductionKernel[{self.name}]", self._evaluate, args,
                                     {"axis": axis, "keepdims": keepdims})

            def _evaluate(self, *arrays, axis=None, keepdims=False):
                # "T x, T y": one type T for both, which CuPy decides from the arguments and refuses to when they
                # differ (TypeError "Type is mismatched", cupy/_core/_kernel.pyx _decide_params_type); no casting
                dtypes = {np.asarray(a).dtype for a in arrays}
                if len(dtypes) > 1:
                    raise TypeError(f"Type is mismatched. {self.name} {sorted(map(str, dtypes))} (the mocked "
                                    "ReductionKernel refuses arguments of two dtypes for one type T, as CuPy does)")
                mapped = eval(self.map_expr, {}, dict(zip(self.inputs, np.broadcast_arrays(*arrays))))  # noqa: S307
                a = np.sum(mapped, axis=axis, keepdims=keepdims) + float(self.identity)
                scope = {"a": a}
                exec(self.post_map_expr, {}, scope)  # noqa: S102
                return np.asarray(scope[self.output])

        return ReductionKernel

    def _cupyx_modules(self):
        mock = self
        cupyx = types.ModuleType("cupyx")
        scipy_ = types.ModuleType("cupyx.scipy")
        linalg = types.ModuleType("cupyx.scipy.linalg")
        special = types.ModuleType("cupyx.scipy.special")
        profiler = types.ModuleType("cupyx.profiler")

        def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, check_finite=False):
            _check_solve_triangular(a, b)
            mock._raise_if("cublas")
            mock._refuse_during_capture("cuBLAS")
            mock.library_calls.append(("cublas", "trsm"))
            def solve(A, B):
                if A.ndim > 2:  # CuPy's trsmBatched: one solve a matrix of the stack
                    return np.stack([solve(A[i], B[i]) for i in range(A.shape[0])])
                return scipy.linalg.solve_triangular(A, B, trans=trans, lower=lower, check_finite=False)

            return mock.xp._call("cupyx.scipy.linalg.solve_triangular", solve, (a, b), {})

        linalg.solve_triangular = solve_triangular
        special.log_ndtr = lambda z: mock.xp._call("cupyx.scipy.special.log_ndtr", scipy.special.log_ndtr, (z,), {})
        special.ndtr = lambda z: mock.xp._call("cupyx.scipy.special.ndtr", scipy.special.ndtr, (z,), {})
        special.erfcx = lambda z: mock.xp._call("cupyx.scipy.special.erfcx", scipy.special.erfcx, (z,), {})

        class Result:
            def __init__(self, name, cpu_times, gpu_times):
                self.name, self.cpu_times, self.gpu_times = name, np.asarray(cpu_times), np.asarray([gpu_times])

        def benchmark(func, args=(), kwargs={}, n_repeat=10000, *, name=None, n_warmup=10, max_duration=np.inf,  # noqa: B006
                      devices=None):
            if name is None:
                name = func.__name__  # as CuPy does (cupyx/profiler/_time.py)
            for _ in range(n_warmup):
                func(*args, **kwargs)
            times = []
            for _ in range(n_repeat):
                started = time.perf_counter()
                func(*args, **kwargs)
                times.append(time.perf_counter() - started)
            return Result(name, times, times)

        profiler.benchmark = benchmark

        @contextmanager
        def errstate(linalg=None):
            yield  # (a failed factorisation raises only under linalg="raise" on a real GPU: probe_cupy.py asks)

        @contextmanager
        def allow_synchronize(allow):
            yield  # (CuPy's raises DeviceSynchronized where it declares a synchronisation: probe_cupy.py asks)

        cupyx.errstate, cupyx.allow_synchronize = errstate, allow_synchronize
        cupyx.scipy, scipy_.special, cupyx.profiler = scipy_, special, profiler
        scipy_.__path__ = []  # a package: its submodules are looked up (``_RefusedImport`` for a failing one)
        modules = {"cupyx": cupyx, "cupyx.scipy": scipy_, "cupyx.scipy.special": special, "cupyx.profiler": profiler}
        if "import" not in self.fail:
            scipy_.linalg = linalg
            modules["cupyx.scipy.linalg"] = linalg
        return modules


def _check_solve_triangular(a, b):
    """What ``cupyx.scipy.linalg.solve_triangular`` (CuPy 14.2) refuses, and what it would do silently that agpc must
    never ask of it. CuPy checks: a square (m, m) ``a`` with ``len(b) == m`` (b 1-D or 2-D), or a stack (..., m, m)
    whose batch shape b repeats exactly (no broadcasting, unlike SciPy, which takes no stack at all). It casts b to
    a's dtype without a word (a float64 b against a float32 a loses its precision), where SciPy promotes both: the
    mock refuses two dtypes instead, so that a fit that mixes them fails here rather than computes less on a GPU."""
    a, b = np.asarray(_unwrap(a)), np.asarray(_unwrap(b))
    if a.ndim == 2:
        if a.shape[0] != a.shape[1]:
            raise ValueError("expected square matrix")
        if b.ndim not in (1, 2) or len(a) != len(b):
            raise ValueError("incompatible dimensions")
    elif a.ndim > 2:
        if a.shape[-1] != a.shape[-2]:
            raise ValueError("expected a batch of square matrices")
        if a.shape[:-2] != b.shape[:a.ndim - 2]:
            raise ValueError("incompatible batch count")
        if b.ndim < a.ndim - 1 or a.shape[-2] != b.shape[a.ndim - 2]:
            raise ValueError("incompatible dimensions")
    else:
        raise ValueError("expected one square matrix or a batch of square matrices")
    if a.dtype != b.dtype:
        raise TypeError(f"solve_triangular of a {a.dtype} triangle and a {b.dtype} right-hand side: CuPy would cast "
                        f"the right-hand side to {a.dtype} silently (the mock refuses it)")


class _RefusedImport:
    """A meta-path finder that refuses one module with the given error (a CUDA library CuPy cannot find)."""

    def __init__(self, name, error):
        self.name, self.error = name, error

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            raise self.error
        return None


def _get(self, stream=None, order="C", out=None, blocking=True):
    """``cupy.ndarray.get``: a host copy (one device-to-host transfer)."""
    self._namespace._host("get", self)
    return np.array(self._array)
