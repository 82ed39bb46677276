"""glibc's heap thresholds for agpc's work, set in one place (Linux with glibc; elsewhere nothing is changed).

Why. A fit's iterations form the same large temporaries again and again (a batch pass's n x m blocks, up to
``blocks.default_block_rows``' 16 MB each; a minibatch step's m x m and b x m arrays) and free them. glibc serves a
request above its mmap threshold by a fresh ``mmap`` and unmaps it when freed, and gives a freed top of the heap
above its trim threshold back to the kernel; either way the next iteration's arrays fault their pages in again, each
zeroed by the kernel. By default both thresholds adapt (the mmap one rises to the largest block freed, up to 32 MiB,
the trim one to twice that), which does not stop a pass that frees several such blocks at once from trimming them.
Measured (``benchmarks/allocator.py``, record benchmarks/results/allocator.md): 20 iterations of default fits on
4,500-20,000 rows took 0.67-0.96 of their time with the memory kept (median 0.74), with 2-16% of the page faults and
the same models; whole default fits 0.82-0.98 on one core (one run each: docs/results.md, "Freed memory kept").

Two scopes, one owner of the setting:

* ``fit_scope``, around ``GPClassifier.fit``. Where the environment set neither threshold, at the first fit of the
  process the mmap threshold goes to ``HEAP_THRESHOLD`` (glibc before 2.35 takes at most 32 MiB on 64-bit: then
  that) and, once that is taken, the trim threshold to ``FIT_TRIM_THRESHOLD``; when the last fit running ends,
  ``malloc_trim(0)`` gives what is free back to the kernel, so the process does not keep a fit's peak after it.
  The thresholds stay set after the fit (glibc cannot report or restore its adaptive ones, which any setting ends):
  until the next fit ends, the process keeps freed blocks below 64 MiB and up to 256 MiB of free heap top an arena.
  ``AGPC_MALLOC=default`` in the environment (read at the first fit), or ``GLIBC_TUNABLES`` naming a malloc
  setting, leaves malloc as it is. Where the environment set a threshold (``MALLOC_TRIM_THRESHOLD_`` /
  ``MALLOC_MMAP_THRESHOLD_``, as the process started: ``/proc/self/environ``), a fit runs under ``heap_thresholds``
  instead, its trim threshold at ``FIT_TRIM_THRESHOLD``.
* ``heap_thresholds``, around a data-parallel task in any worker process (``workers.task_scope``) and a fit in a
  process whose environment set a threshold: dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536``
  (distributed's ``distributed.nanny.pre-spawn-environ``), which ends glibc's adaptive mmap threshold, so every m x
  m temporary of a step (320 KB at m = 200) was a fresh mmap: thousands of minor page faults a SEP step against a
  handful, and half as much CPU again a step (``benchmarks/dask_scaling.py --check``). The scope raises the
  thresholds to ``HEAP_THRESHOLD`` when one in effect is lower (the trim one set alone fixes the mmap one at 128
  KiB), and puts the environment's values back when the last scope of the process ends: the setting is the user's
  again after every call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import threading

__all__ = ["HEAP_THRESHOLD", "FIT_TRIM_THRESHOLD", "OPT_OUT", "fit_scope", "heap_thresholds", "tuned"]

HEAP_THRESHOLD = 64 * 1024 * 1024
"""glibc's mmap and trim thresholds while agpc keeps freed memory: a batch block's n x m temporaries (16 MB by
default) and a step's m x m and b x m ones go on the heap, and at most this much unused heap top is kept."""
FIT_TRIM_THRESHOLD = 256 * 1024 * 1024
"""glibc's trim threshold while a fit keeps its freed memory: a pass over 45,000 rows frees several 16 MB blocks at
once, and a trim threshold of ``HEAP_THRESHOLD`` may give them back (a default fit of clf-50000x20 on one core, one
run each: 28.0 s at 64 MiB, 20.7 and 23.7 s at this one, 26.9 s with malloc as it is; on two cores 14.7 against 14.2
and 14.6 s: docs/results.md, "Freed memory kept")."""
OPT_OUT = ("AGPC_MALLOC", "default")
"""The environment variable and value that leave malloc's settings as they are at fits."""

_HEAP_VARIABLES = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}  # mallopt's M_TRIM / M_MMAP_THRESHOLD
_GLIBC_DEFAULT_THRESHOLD = 128 * 1024  # both thresholds' glibc default (the mmap one fixed once either is set)
_lock = threading.Lock()
# "fits" / "tasks": the scopes of each kind running in this process; "kept": fit_scope's handle once it set the
# thresholds, False where it leaves malloc alone, None before the first fit looked
_state = {"fits": 0, "tasks": 0, "kept": None}


def _glibc():
    """The C library's handle where it is glibc on Linux, with ``mallopt`` and ``malloc_trim`` typed, else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def _set_thresholds(libc, value, trim=None):
    """The mmap threshold at ``value`` (at most what this glibc takes: before 2.35, 32 MiB on 64-bit, 512 KiB on
    32-bit), then the trim one at ``trim`` (None: ``value``), only once the mmap one was taken (setting it alone would
    fix the mmap threshold at 128 KiB). Whether both were set."""
    mmap = _HEAP_VARIABLES["MALLOC_MMAP_THRESHOLD_"]
    largest_before_2_35 = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)  # (glibc's DEFAULT_MMAP_THRESHOLD_MAX)
    if not (libc.mallopt(mmap, value) or libc.mallopt(mmap, min(value, largest_before_2_35))):
        return False
    return bool(libc.mallopt(_HEAP_VARIABLES["MALLOC_TRIM_THRESHOLD_"], value if trim is None else trim))


def _startup_environment():
    """The variables of this process's environment at its start, which glibc read then: ``/proc/self/environ``
    (``os.environ`` changes later, and dask's nanny writes its workers' ``MALLOC_TRIM_THRESHOLD_`` into the
    driver's ``os.environ`` when it starts them), else ``os.environ`` as agpc found it at import."""
    try:
        with open("/proc/self/environ", "rb") as file:
            pairs = [entry.split(b"=", 1) for entry in file.read().split(b"\0") if b"=" in entry]
        return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}
    except OSError:
        return dict(os.environ)


_STARTUP = _startup_environment()  # (read once, at import: as agpc.threads reads the BLAS variables)


def _environment_thresholds():
    """The heap thresholds this process's environment set at its start (glibc read them then), by variable."""
    values = {}
    for name in _HEAP_VARIABLES:
        try:
            values[name] = int(_STARTUP[name])
        except (KeyError, ValueError):
            continue
    return values


def _lowered(set_by_environment):
    """Whether a threshold in effect is below ``HEAP_THRESHOLD``: one the environment set, or glibc's default for
    the other (which setting either fixes: the trim threshold set alone leaves the mmap one at 128 KiB)."""
    return bool(set_by_environment) and min(set_by_environment.get(name, _GLIBC_DEFAULT_THRESHOLD)
                                            for name in _HEAP_VARIABLES) < HEAP_THRESHOLD


@contextlib.contextmanager
def heap_thresholds(trim=None):
    """Run the body with glibc's mmap threshold at ``HEAP_THRESHOLD`` and its trim threshold at ``trim`` (None: the
    same) where the environment set either and one in effect is lower (``_lowered``); the environment's values
    (glibc's default for one it did not set) are put back when the last such scope of the process ends. Nothing is
    changed where the environment set neither (``fit_scope`` then keeps the memory of fits; a worker's tasks leave
    glibc's adaptive thresholds at work) or off glibc."""
    set_by_environment = _environment_thresholds()
    libc = _glibc() if _lowered(set_by_environment) else None
    if libc is None:
        yield
        return
    with _lock:
        _state["tasks"] += 1
        if _state["tasks"] == 1:
            _set_thresholds(libc, HEAP_THRESHOLD, trim)
    try:
        yield
    finally:
        with _lock:
            _state["tasks"] -= 1
            if _state["tasks"] == 0:
                for name, parameter in _HEAP_VARIABLES.items():
                    libc.mallopt(parameter, set_by_environment.get(name, _GLIBC_DEFAULT_THRESHOLD))


def _leaves_malloc_alone():
    """Whether fits leave malloc as it is: opted out (at the first fit), or malloc tuned through ``GLIBC_TUNABLES``
    (at the process's start)."""
    return os.environ.get(OPT_OUT[0]) == OPT_OUT[1] or "glibc.malloc." in _STARTUP.get("GLIBC_TUNABLES", "")


def _first_fit():
    """fit_scope's handle, the thresholds set at the first call (under the lock: fits may start on several
    threads), or None where it leaves malloc alone (opted out, tuned otherwise, not glibc, or refused)."""
    with _lock:
        if _state["kept"] is None:
            libc = None if _leaves_malloc_alone() else _glibc()
            kept = libc is not None and _set_thresholds(libc, HEAP_THRESHOLD, FIT_TRIM_THRESHOLD)
            _state["kept"] = libc if kept else False
        return _state["kept"] or None


def tuned():
    """Whether fits of this process keep their freed memory (False before its first fit)."""
    return bool(_state["kept"])


@contextlib.contextmanager
def fit_scope():
    """Around a fit: where the environment set a threshold, ``heap_thresholds``; else the thresholds raised (once a
    process) and, when the last fit running ends, what is free given back to the kernel."""
    if _environment_thresholds():
        with heap_thresholds(trim=FIT_TRIM_THRESHOLD):
            yield
        return
    libc = _first_fit()
    if libc is None:
        yield
        return
    with _lock:
        _state["fits"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["fits"] -= 1
            if _state["fits"] == 0:
                libc.malloc_trim(0)
