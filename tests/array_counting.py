"""A counting array namespace: what one training step costs in array operations, O(m^3) operations and
host synchronisations, and where each one comes from.

``CountingNamespace(base, m=..., rows=...)`` wraps an array API namespace (``array_api_strict`` by
default, so that anything outside the standard still fails; ``array_api_compat.numpy`` for speed). Its
arrays are proxies whose ``__array_namespace__`` returns the counting namespace, so
``array_api_compat.array_namespace(x)`` hands it to agpc and agpc's code runs on it unchanged. (agpc's
``backend`` does not know it: it takes its generic, standard-only paths, e.g. ``log_ndtr`` as an erf
series and ``solve_triangular`` as a dense ``linalg.solve``.)

While a ``Tally`` is active (``with ns.counting() as tally:``, or ``ns.start()`` / ``ns.stop()``), every
call is recorded as events of these kinds, each with the Python call stack it came from:

``op``              every array operation: namespace functions (``linalg`` included), operators,
                    indexing and item assignment, ``.mT`` / ``.T``, ``to_device``. (``shape``, ``dtype``,
                    ``ndim``, ``size`` and ``device`` are metadata, not operations.)
``m3``              O(m^3) operations: ``cholesky``, ``inv``, ``eigh`` and the other factorisations of a
                    k x k matrix with k >= m; ``solve`` with at least m right-hand sides; ``matmul``
                    whose three dimensions are all >= m.
``rows_m2``         the same operations with a row dimension (a size in ``rows``, e.g. the minibatch
                    size b) in place of one m: (b x m) @ (m x m), (m x b) @ (b x m), solves with b
                    right-hand sides. Keep b != m so that the two kinds can be told apart.
``few_rhs_solve``   ``solve`` of a k x k system (k >= m) with fewer than m right-hand sides: O(m^3) as a
                    general solve, O(m^2) as the triangular solve it stands for in agpc's generic
                    ``solve_triangular``.
``host``            a device-to-host conversion: ``__float__``, ``__bool__``, ``__int__``, ``__index__``,
                    ``__complex__``, ``__format__``, ``.item()``, ``__array__``, ``__dlpack__``, and
                    ``to_device`` to the host device. The event's ``shapes`` hold the converted array's
                    shape: what the transfer moves (an n-sized array leaving the device shows there).
``data_dependent``  an output shape that depends on the data (a host synchronisation on a GPU):
                    boolean-mask indexing and assignment, ``nonzero``, ``unique_*``, ``repeat`` with an
                    array of repeats; and, with ``cupy_syncs=True`` (the default), the two boolean-mask
                    steps of ``clip`` as array-api-compat implements it for CuPy
                    (``array_api_compat/common/_aliases.py``).
``upload``          an array made from host data (``asarray`` of a Python or NumPy value): a
                    host-to-device copy, not a synchronisation of the device's work.

``tally.counts()`` gives the number of each (``syncs`` = ``host`` + ``data_dependent``);
``tally.by_site(kind)`` and ``tally.by_operation(kind)`` say where they come from; ``check_budget``
fails with that breakdown when a count is over its budget. ``repr`` and ``str`` are not counted: they
are for people (debuggers and pytest's failure reports call them).

This module depends only on NumPy, array_api_strict and the standard library, so that ``gpu_tests`` can
import it too (with ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from collections import Counter
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

__all__ = ["CountingNamespace", "CountingArray", "Tally", "Event", "KINDS", "check_budget"]

KINDS = ("op", "m3", "rows_m2", "few_rhs_solve", "host", "data_dependent", "upload")

# Factorisations and other O(k^3) functions of a (..., k, k) matrix (their first argument).
_CUBIC_IN_FIRST = frozenset(
    "linalg." + name
    for name in ("cholesky", "inv", "eigh", "eigvalsh", "eig", "eigvals", "qr", "svd", "svdvals", "det", "slogdet",
                 "pinv", "matrix_rank", "matrix_power")
)
_MATMULS = frozenset(("matmul", "linalg.matmul", "__matmul__", "__imatmul__"))
_DATA_DEPENDENT = frozenset(("nonzero", "unique_all", "unique_counts", "unique_inverse", "unique_values"))
# Callables of a namespace that take or describe dtypes and shapes: not array operations.
_METADATA = frozenset(("finfo", "iinfo", "isdtype", "result_type", "can_cast", "broadcast_shapes",
                       "__array_namespace_info__", "get_array_api_strict_flags", "set_array_api_strict_flags",
                       "reset_array_api_strict_flags"))

_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift")
_COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
_UNARY = ("__neg__", "__pos__", "__abs__", "__invert__")

_THIS_FILE = os.path.abspath(__file__)
_STACK_LIMIT = 1000  # the whole stack in practice: a fold (Tally.folded) compares the frames outside a call
_ids = itertools.count()


class Event(NamedTuple):
    kind: str
    name: str  # the operation ("matmul", "linalg.cholesky", "__float__", "__getitem__[bool]", ...)
    frames: tuple  # ((filename, line, function), ...), innermost first, this module's frames left out
    shapes: tuple  # shapes of the array operands


def _caller_frames():
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < _STACK_LIMIT:
        code = frame.f_code
        if os.path.abspath(code.co_filename) != _THIS_FILE:
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(frames)


_ANCHORS = ("agpc", "tests", "gpu_tests", "benchmarks")


def _short_path(filename):
    """agpc/inference/ep.py, tests/test_x.py, or the bare file name for anything else: the path from the anchor
    folder nearest the file, so that folders above the checkout do not count (a clone of the repository is a
    folder named agpc: its tests/test_x.py is tests/test_x.py, not agpc/tests/test_x.py)."""
    parts = filename.replace(os.sep, "/").split("/")
    for at in range(len(parts) - 2, -1, -1):
        if parts[at] in _ANCHORS:
            return "/".join(parts[at:])
    return parts[-1]


def _format_frame(frame):
    filename, line, function = frame
    return f"{_short_path(filename)}:{line} {function}"


class Tally:
    """The events recorded while counting, and breakdowns of them."""

    def __init__(self):
        self.events = []

    def count(self, kind):
        if kind == "syncs":
            return self.count("host") + self.count("data_dependent")
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: use one of {KINDS + ('syncs',)}")
        return sum(1 for event in self.events if event.kind == kind)

    def counts(self):
        """{kind: number of events} for every kind, and ``syncs`` = host + data_dependent."""
        tally = Counter(event.kind for event in self.events)
        out = {kind: tally.get(kind, 0) for kind in KINDS}
        out["syncs"] = out["host"] + out["data_dependent"]
        return out

    def _of_kind(self, kind):
        kinds = ("host", "data_dependent") if kind == "syncs" else (kind,)
        return [event for event in self.events if event.kind in kinds]

    def by_operation(self, kind="op"):
        """Counter of operation names among the events of ``kind``."""
        return Counter(event.name for event in self._of_kind(kind))

    def by_site(self, kind="op", *, depth=1, skip=()):
        """Counter of call sites ("agpc/inference/ep.py:123 project") among the events of ``kind``.

        ``skip``: path prefixes (as shown, e.g. "agpc/backend.py") whose frames are passed over, so that
        the operations inside a helper are charged to its caller. ``depth`` > 1 joins that many frames,
        innermost first, with " < "."""
        sites = Counter()
        for event in self._of_kind(kind):
            frames = [f for f in event.frames if not _short_path(f[0]).startswith(tuple(skip))]
            sites[" < ".join(_format_frame(f) for f in frames[:depth]) or "?"] += 1
        return sites

    def folded(self, functions):
        """A copy in which the operations issued inside one call of any of ``functions`` (Python function
        names, e.g. ``"_log_ndtr_generic"``, agpc.backend's standard-only log Phi) count as one operation,
        named after the function: what a library with that function built in would issue. Other kinds
        are kept as they are. (One call is told from the next by an operation in between, or by a
        different calling line: two calls from the same line with nothing in between count as one.)"""
        functions = frozenset(functions)
        out = Tally()
        last = None
        for event in self.events:
            outermost = None
            for index, frame in enumerate(event.frames):
                if frame[2] in functions:
                    outermost = index
            if event.kind != "op" or outermost is None:
                out.events.append(event)
                last = None if event.kind == "op" else last
                continue
            filename, _, function = event.frames[outermost]
            key = (filename, function, event.frames[outermost + 1:])
            if key != last:
                out.events.append(Event("op", function, event.frames[outermost:], event.shapes))
                last = key
        return out

    def report(self, *, top=8, skip=()):
        """A text table: the counts, then for each kind present its top operations and call sites."""
        counts = self.counts()
        lines = ["  ".join(f"{kind}={counts[kind]}" for kind in (*KINDS, "syncs"))]
        for kind in KINDS:
            if not counts[kind]:
                continue
            lines.append(f"-- {kind}: {counts[kind]}")
            top_operations = self.by_operation(kind).most_common(top)
            lines.append("   by operation: " + ", ".join(f"{name} {n}" for name, n in top_operations))
            for site, n in self.by_site(kind, skip=skip).most_common(top):
                lines.append(f"   {n:5d}  {site}")
        return "\n".join(lines)


def check_budget(tally, budget, label="step"):
    """Raise AssertionError, with the top call sites of each offending kind, when a count of ``tally``
    is above its limit in ``budget`` ({kind or "syncs": largest allowed count})."""
    counts = tally.counts()
    unknown = sorted(set(budget) - set(counts))
    if unknown:
        raise ValueError(f"unknown budget kinds {unknown}: use {sorted(counts)}")
    over = {kind: limit for kind, limit in budget.items() if counts[kind] > limit}
    if not over:
        return
    lines = [f"{label} is over its budget: " + ", ".join(f"{k} {counts[k]} > {limit}" for k, limit in over.items())]
    for kind in over:
        lines.append(f"-- {kind}, by call site:")
        lines += [f"   {n:5d}  {site}" for site, n in tally.by_site(kind).most_common(12)]
    raise AssertionError("\n".join(lines))


def _unwrap(value):
    if isinstance(value, CountingArray):
        return value._array
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _has_array(value):
    if isinstance(value, (tuple, list)):
        return any(_has_array(v) for v in value)
    return isinstance(value, CountingArray)


def _array_shapes(values):
    shapes = []
    for value in values:
        if isinstance(value, CountingArray):
            shapes.append(tuple(value.shape))
        elif isinstance(value, (tuple, list)):
            shapes += _array_shapes(value)
    return tuple(shapes)


class CountingNamespace:
    """An array API namespace over ``base`` that records what is done with its arrays (module docstring).

    ``m``: the number of inducing points (None: no O(m^3) classification); ``rows``: the row-block sizes
    (minibatch, EP row blocks) that mark O(rows m^2) operations, all different from m. ``cupy_syncs``:
    count the host synchronisations that ``clip`` costs on array-api-compat's CuPy namespace.
    ``data_dependent="raise"`` refuses data-dependent shapes after counting them (as a CUDA graph
    capture would)."""

    def __init__(self, base=None, *, m=None, rows=(), cupy_syncs=True, data_dependent="count"):
        if base is None:
            import array_api_strict as base
        rows = frozenset(int(r) for r in ((rows,) if isinstance(rows, int) else rows))
        if m is not None and m in rows:
            raise ValueError(f"rows {sorted(rows)} include m = {m}: row products could not be told from O(m^3) ones")
        if data_dependent not in ("count", "raise"):
            raise ValueError(f"data_dependent must be 'count' or 'raise', got {data_dependent!r}")
        self.__name__ = f"array_counting_{next(_ids)}"  # array_api_compat tells namespaces apart by name
        self.base = base
        self.m = m
        self.rows = rows
        self.cupy_syncs = cupy_syncs
        self.refuse_data_dependent = data_dependent == "raise"
        self.tally = None
        probe = base.asarray(0.0)
        self._base_array_types = (type(probe),) + ((np.generic,) if isinstance(probe, np.ndarray) else ())
        self._is_strict = getattr(base, "__name__", "").startswith("array_api_strict")
        self.host_device = base.Device("CPU_DEVICE") if self._is_strict else "cpu"
        self.linalg = _SubNamespace(self, base.linalg, "linalg.")
        if hasattr(base, "fft"):
            self.fft = _SubNamespace(self, base.fft, "fft.")

    def __repr__(self):
        return f"<counting namespace {self.__name__} over {getattr(self.base, '__name__', self.base)}>"

    # -- counting ------------------------------------------------------------------------------

    def start(self):
        """Start a new tally (recording from now on) and return it."""
        self.tally = Tally()
        return self.tally

    def stop(self):
        """Stop recording; returns the tally that was active."""
        tally, self.tally = self.tally, None
        return tally

    @contextmanager
    def counting(self):
        tally = self.start()
        try:
            yield tally
        finally:
            self.tally = None

    def _record(self, kind, name, shapes=(), frames=None):
        if self.tally is not None:
            self.tally.events.append(Event(kind, name, frames if frames is not None else _caller_frames(), shapes))

    def _record_op(self, name, args, kwargs):
        """Record one array operation and what it is besides (O(m^3), row product, data-dependent)."""
        if self.tally is None:
            return
        frames = _caller_frames()
        shapes = _array_shapes(args) + _array_shapes(tuple(kwargs.values()))
        events = self.tally.events
        events.append(Event("op", name, frames, shapes))
        cubic = self._cubic_kind(name, args, kwargs)
        if cubic is not None:
            events.append(Event(cubic, name, frames, shapes))
        for dependent in self._data_dependent(name, args, kwargs):
            events.append(Event("data_dependent", dependent, frames, shapes))
            if self.refuse_data_dependent:
                raise RuntimeError(f"{dependent}: an output shape that depends on the data (refused)")
        if name == "asarray" and args and not _has_array(args[0]):
            events.append(Event("upload", name, frames, shapes))

    def _host(self, name, array):
        """A device-to-host conversion of ``array`` (its shape recorded: what a transfer moves)."""
        self._record("host", name, (tuple(array.shape),))

    def _size_kind(self, dims):
        """The kind of a product with these dimensions: rows_m2 when some are row sizes and the others
        >= m, m3 when all are >= m, None when one is neither (a small product)."""
        if any(d < self.m and d not in self.rows for d in dims):
            return None
        return "rows_m2" if any(d in self.rows for d in dims) else "m3"

    def _cubic_kind(self, name, args, kwargs):
        if self.m is None:
            return None
        if name in _CUBIC_IN_FIRST:
            shape = args[0].shape if args and isinstance(args[0], CountingArray) else ()
            return "m3" if len(shape) >= 2 and shape[-1] >= self.m else None
        if name == "linalg.solve":
            A, B = args[0], args[1] if len(args) > 1 else kwargs.get("x2")
            k = A.shape[-1]
            if k < self.m:
                return None
            columns = B.shape[-1] if B.ndim >= 2 else 1
            if columns in self.rows:
                return "rows_m2"
            return "m3" if columns >= self.m else "few_rhs_solve"
        if name in _MATMULS or name == "__rmatmul__":
            a, b = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
            if not (isinstance(a, CountingArray) and isinstance(b, CountingArray)) or a.ndim < 2 or b.ndim < 2:
                return None
            return self._size_kind((a.shape[-2], a.shape[-1], b.shape[-1]))
        return None

    def _data_dependent(self, name, args, kwargs):
        if name in _DATA_DEPENDENT:
            return (name,)
        if name in ("__getitem__", "__setitem__"):
            key = args[1]
            keys = key if isinstance(key, tuple) else (key,)
            if any(isinstance(k, CountingArray) and self.base.isdtype(k.dtype, "bool") for k in keys):
                return (name + "[bool]",)
        if name == "repeat":
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, CountingArray):
                return ("repeat[array]",)
        if name == "clip" and self.cupy_syncs:
            # array_api_compat's clip for CuPy: out[ia] = a[ia] per bound given, a boolean-mask read and write
            bounds = sum(1 for v in args[1:] + tuple(kwargs.values()) if v is not None)
            return ("clip[cupy: boolean-mask read]", "clip[cupy: boolean-mask write]") * bounds
        return ()

    # -- arrays --------------------------------------------------------------------------------

    def _wrap(self, value):
        if isinstance(value, self._base_array_types):
            return CountingArray(value if not isinstance(value, np.generic) else np.asarray(value), self)
        if isinstance(value, tuple):
            items = [self._wrap(v) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        if isinstance(value, list):
            return [self._wrap(v) for v in value]
        return value

    def _call(self, name, function, args, kwargs):
        self._record_op(name, args, kwargs)
        return self._wrap(function(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

    def _on_host(self, array, dtype=None, copy=None):
        """A NumPy copy of a base array (array_api_strict hands only its CPU device's arrays to NumPy; CuPy
        refuses implicit conversion, its ``get`` is the copy)."""
        if self._is_strict and array.device != self.host_device:
            array = array.to_device(self.host_device)
        elif not isinstance(array, np.ndarray) and hasattr(array, "get"):
            array = array.get()
        out = np.asarray(array, dtype=dtype)
        return out.copy() if copy else out

    def __getattr__(self, name):
        # Only reached for names not set in __init__: the base namespace's functions, dtypes, constants.
        if name == "base":  # not set yet: no recursion through self.base
            raise AttributeError(name)
        value = getattr(self.base, name)
        if name in _METADATA:
            out = _passthrough(value)
        elif callable(value) and not isinstance(value, type):
            out = _counted(self, name, value)
        else:
            return value  # dtypes, constants, classes (Device): not cached, nothing to wrap
        setattr(self, name, out)
        return out


class _SubNamespace:
    """``linalg`` / ``fft`` of a counting namespace: the same recording, names prefixed."""

    def __init__(self, namespace, base, prefix):
        self._namespace, self._base, self._prefix = namespace, base, prefix

    def __getattr__(self, name):
        value = getattr(self._base, name)
        if name in _METADATA:
            out = _passthrough(value)
        elif callable(value) and not isinstance(value, type):
            out = _counted(self._namespace, self._prefix + name, value)
        else:
            return value
        setattr(self, name, out)
        return out


def _counted(namespace, name, function):
    def counted(*args, **kwargs):
        return namespace._call(name, function, args, kwargs)

    counted.__name__ = counted.__qualname__ = name
    counted.__doc__ = function.__doc__
    return counted


def _passthrough(function):
    def passthrough(*args, **kwargs):
        return function(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})

    passthrough.__doc__ = function.__doc__
    return passthrough


class CountingArray:
    """A proxy for one array of the base namespace; see the module docstring for what it records."""

    __slots__ = ("_array", "_namespace")
    __hash__ = None
    __array_ufunc__ = None  # NumPy arrays on the left defer to us: a host array meeting a device one is an error

    def __init__(self, array, namespace):
        self._array = array
        self._namespace = namespace

    def __array_namespace__(self, api_version=None):
        return self._namespace

    def _op(self, name, *args, **kwargs):
        namespace = self._namespace
        namespace._record_op(name, (self,) + args, kwargs)
        result = getattr(self._array, name)(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        return result if result is NotImplemented else namespace._wrap(result)

    # -- metadata (not operations) ---------------------------------------------------------------

    shape = property(lambda self: self._array.shape)
    dtype = property(lambda self: self._array.dtype)
    ndim = property(lambda self: self._array.ndim)
    size = property(lambda self: self._array.size)
    device = property(lambda self: self._array.device)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    def __repr__(self):
        return f"CountingArray({self._array!r})"

    __str__ = __repr__

    # -- operations ------------------------------------------------------------------------------

    @property
    def mT(self):
        self._namespace._record_op(".mT", (self,), {})
        return self._namespace._wrap(self._array.mT)

    @property
    def T(self):
        self._namespace._record_op(".T", (self,), {})
        return self._namespace._wrap(self._array.T)

    def __getitem__(self, key):
        return self._op("__getitem__", key)

    def __setitem__(self, key, value):
        self._namespace._record_op("__setitem__", (self, key, value), {})
        self._array[_unwrap(key)] = _unwrap(value)

    def __iter__(self):
        iter(self._array)  # let the base refuse what it refuses (array_api_strict: any iteration)
        return (self[i, ...] for i in range(self.shape[0]))

    def to_device(self, device, /, stream=None):
        if device == self._namespace.host_device:
            self._namespace._host("to_device", self)
        kwargs = {} if stream is None else {"stream": stream}
        return self._op("to_device", device, **kwargs)

    # -- conversions to the host -----------------------------------------------------------------

    def __float__(self):
        self._namespace._host("__float__", self)
        return float(self._array)

    def __int__(self):
        self._namespace._host("__int__", self)
        return int(self._array)

    def __bool__(self):
        self._namespace._host("__bool__", self)
        return bool(self._array)

    def __index__(self):
        self._namespace._host("__index__", self)
        return operator.index(self._array)

    def __complex__(self):
        self._namespace._host("__complex__", self)
        return complex(self._array)

    def __format__(self, spec):
        self._namespace._host("__format__", self)
        return format(self._namespace._on_host(self._array), spec)

    def item(self):
        """Not in the standard: counted, then done by the base (array_api_strict has no ``item``)."""
        self._namespace._host("item", self)
        return self._array.item()

    def __array__(self, dtype=None, copy=None):
        self._namespace._host("__array__", self)
        return self._namespace._on_host(self._array, dtype=dtype, copy=copy)

    def __dlpack__(self, **kwargs):
        self._namespace._host("__dlpack__", self)
        return self._array.__dlpack__(**kwargs)


def _make_operator(name):
    def method(self, *args):
        return self._op(name, *args)

    method.__name__ = method.__qualname__ = name
    return method


def _make_inplace(name):
    def method(self, other):
        self._namespace._record_op(name, (self, other), {})
        result = getattr(self._array, name)(_unwrap(other))
        if result is NotImplemented:
            return NotImplemented
        self._array = result
        return self

    method.__name__ = method.__qualname__ = name
    return method


for _name in _BINARY:
    setattr(CountingArray, f"__{_name}__", _make_operator(f"__{_name}__"))
    setattr(CountingArray, f"__r{_name}__", _make_operator(f"__r{_name}__"))
    setattr(CountingArray, f"__i{_name}__", _make_inplace(f"__i{_name}__"))
for _name in _COMPARISONS + _UNARY:
    setattr(CountingArray, _name, _make_operator(_name))
del _name
