"""Count host synchronisations on CuPy by intercepting CuPy's own paths to the host.

``counting_syncs(cupy)`` replaces, for the duration of a ``with`` block, each of ``SYNC_PATHS`` on the given
``cupy`` module (the real one on a GPU, ``cupy_mock.MockCupy``'s elsewhere) with a wrapper that records the call
(name and agpc's call stack) and then does what the original does, and puts the originals back afterwards:

- ``cupy.ndarray``: ``get``, ``__float__``, ``__int__``, ``__bool__``, ``__index__``, ``__complex__``, ``item``,
  ``tolist`` (every device-to-host copy of an array; ``ndarray`` is a Python subclass of CuPy's Cython
  ``_ndarray_base``, so its attributes can be replaced, and CuPy's own Cython calls of ``self.get()`` reach the
  replacement too);
- ``cupy.asnumpy``;
- ``cupy.cuda.Stream.synchronize``, ``cupy.cuda.Event.synchronize``.

A call made inside another intercepted call (``float(x)`` calls ``x.get()``) is not counted again: one event is
one synchronisation. Not interceptable from Python: ``cupy.cuda.Device.synchronize`` (a Cython ``cdef class``
method; ``cupyx.allow_synchronize(False)`` sees it) and synchronous copies inside CuPy's compiled code that do not go
through ``get``. gpu_tests/run_on_gpu.sh re-checks on a real GPU that each path is seen exactly once.

This is the CUDA counterpart of the counting namespace (tests/array_counting.py), which sees the same conversions on
the stand-in because it wraps the arrays themselves.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from array_counting import _caller_frames, _format_frame

__all__ = ["SYNC_PATHS", "SyncCount", "counting_syncs"]

# (owner inside the cupy module, attribute): the paths from a device to the host that are counted
SYNC_PATHS = (("ndarray", "get"), ("ndarray", "__float__"), ("ndarray", "__int__"), ("ndarray", "__bool__"),
              ("ndarray", "__index__"), ("ndarray", "__complex__"), ("ndarray", "item"), ("ndarray", "tolist"),
              ("", "asnumpy"), ("cuda.Stream", "synchronize"), ("cuda.Event", "synchronize"))


class SyncCount:
    """The synchronisations seen: ``events`` of (path, call stack), ``shapes`` (of the array each one moved to the
    host, () for a stream or event), ``count``, ``report()``."""

    def __init__(self):
        self.events = []
        self.shapes = []

    @property
    def count(self):
        return len(self.events)

    def report(self, top=10):
        lines = []
        for path, frames in self.events[:top]:
            where = next((_format_frame(f) for f in frames if "/agpc/" in f[0].replace("\\", "/")), "?")
            lines.append(f"{path} at {where}")
        return "\n".join(lines)


def _owner(cupy, dotted):
    owner = cupy
    for part in filter(None, dotted.split(".")):
        owner = getattr(owner, part)
    return owner


@contextmanager
def counting_syncs(cupy):
    """Yield a ``SyncCount`` of the synchronisations made through ``SYNC_PATHS`` of ``cupy`` inside the block."""
    count = SyncCount()
    depth = threading.local()
    saved = []

    def wrap(path, original):
        def intercepted(*args, **kwargs):
            outer = getattr(depth, "value", 0)
            if outer == 0:
                count.events.append((path, _caller_frames()))
                count.shapes.append(tuple(getattr(args[0], "shape", ())) if args else ())
            depth.value = outer + 1
            try:
                return original(*args, **kwargs)
            finally:
                depth.value = outer

        intercepted.__name__ = getattr(original, "__name__", path)
        return intercepted

    try:
        for dotted, name in SYNC_PATHS:
            owner = _owner(cupy, dotted)
            if not hasattr(owner, name):  # (CuPy's ndarray has no __index__: int() of it goes through __int__)
                continue
            original = getattr(owner, name)
            own = name in vars(owner)
            path = f"{'cupy.' + dotted if dotted else 'cupy'}.{name}"
            saved.append((owner, name, original if own else None))
            setattr(owner, name, wrap(path, original))
        yield count
    finally:
        for owner, name, original in reversed(saved):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
