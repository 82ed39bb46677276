"""agpc.allocator: a fit keeps the memory it frees for its next iteration (glibc's malloc thresholds raised once a
process, what is free given back when the last running fit ends), a setting of the environment's is raised for the
call and put back, and nothing else changes.

The page faults are counted (``resource.getrusage``), not timed: a fit whose freed n x m temporaries are reused
faults their pages in once, not every iteration. Each count comes from a fresh process, since the settings last for
the process that made them."""

import ctypes
import json
import os
import platform
import subprocess
import sys
import threading
import time

import pytest

from agpc import allocator

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
# what changes malloc's settings from outside: cleared for the counted processes and the fake's tests
_MALLOC_ENVIRONMENT = (allocator.OPT_OUT[0], "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES",
                       "LD_PRELOAD")

FIT = r"""
import json, resource
import numpy as np
from sklearn.datasets import make_classification
from threadpoolctl import threadpool_limits
from agpc import GPClassifier, allocator

X, y = make_classification(3000, 10, n_informative=5, random_state=0)


def fit():
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with threadpool_limits(1):
        model = GPClassifier(random_state=0, plateau=None, max_iter=8).fit(X, y)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, model


fit()  # (the first fit sets malloc, where it does: the second is counted)
faults, model = fit()
print(json.dumps({"faults": faults, "tuned": allocator.tuned(), "proba": model.predict_proba(X[:50]).tolist()}))
"""


def _fit_in_a_process(opt_out):
    env = {k: v for k, v in os.environ.items() if k not in _MALLOC_ENVIRONMENT}
    if opt_out:
        env[allocator.OPT_OUT[0]] = allocator.OPT_OUT[1]
    out = subprocess.run([sys.executable, "-c", FIT], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="agpc sets malloc only on Linux with glibc")
def test_a_fit_reuses_its_freed_memory_and_fits_the_same_model():
    """With malloc as agpc sets it, a fit of 8 iterations on 3,000 rows (m = 100: 2.4 MB n x m temporaries) faults
    in under a quarter of the pages it does with malloc as it is (measured: ~20 times fewer), and predicts the same
    probabilities to the bit (the same arithmetic on the same BLAS; a BLAS whose results depend on the alignment
    of its operands, as MKL's may, could differ in the last bits); ``AGPC_MALLOC=default`` leaves malloc as it is."""
    kept, plain = _fit_in_a_process(opt_out=False), _fit_in_a_process(opt_out=True)
    assert kept["tuned"] and not plain["tuned"]
    assert kept["faults"] < 0.25 * plain["faults"], (kept["faults"], plain["faults"])
    assert kept["proba"] == plain["proba"]


class _FakeLibc:
    """glibc's two functions, recorded; ``largest``: the largest mmap threshold it takes (None: any; 0: none);
    ``pause``: seconds each mallopt takes (a race between threads would show)."""

    def __init__(self, largest=None, pause=0.0):
        self.calls, self.largest, self.pause = [], largest, pause

    def mallopt(self, parameter, value):
        time.sleep(self.pause)
        self.calls.append(("mallopt", parameter, value))
        return int(parameter != -3 or self.largest is None or value <= self.largest)

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


def _fresh(monkeypatch, libc, startup=None):
    """A fresh process's allocator state, ``startup`` (or nothing) set by the environment it started with, ``libc``
    in place of glibc."""
    monkeypatch.setattr(allocator, "_state", {"fits": 0, "tasks": 0, "kept": None})
    monkeypatch.setattr(allocator, "_STARTUP", dict(startup or {}))
    for name in _MALLOC_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(allocator, "_glibc", lambda: libc)
    return libc


HEAP, TRIM = allocator.HEAP_THRESHOLD, allocator.FIT_TRIM_THRESHOLD
LARGEST_BEFORE_2_35 = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)


def test_the_thresholds_are_set_once_and_the_heap_trimmed_after_the_fit(monkeypatch):
    fake = _fresh(monkeypatch, _FakeLibc())
    with allocator.fit_scope():
        assert fake.calls == [("mallopt", -3, HEAP), ("mallopt", -1, TRIM)] and allocator.tuned()
    assert fake.calls[2:] == [("malloc_trim", 0)]
    with pytest.raises(RuntimeError):  # (a fit that fails gives its memory back too)
        with allocator.fit_scope():
            raise RuntimeError("the fit failed")
    assert fake.calls[3:] == [("malloc_trim", 0)]


def test_an_older_glibc_takes_its_largest_mmap_threshold_and_one_refusing_it_is_left_alone(monkeypatch):
    fake = _fresh(monkeypatch, _FakeLibc(largest=LARGEST_BEFORE_2_35))  # (glibc before 2.35)
    with allocator.fit_scope():
        pass
    assert fake.calls == [("mallopt", -3, HEAP), ("mallopt", -3, LARGEST_BEFORE_2_35), ("mallopt", -1, TRIM),
                          ("malloc_trim", 0)]
    fake = _fresh(monkeypatch, _FakeLibc(largest=0))  # (the trim threshold alone would fix the mmap one low)
    for _ in range(2):  # (refused once: not asked again)
        with allocator.fit_scope():
            pass
    assert [c[1] for c in fake.calls] == [-3, -3] and not allocator.tuned()


def test_fits_on_several_threads_set_the_thresholds_once_and_the_last_one_out_trims(monkeypatch):
    fake = _fresh(monkeypatch, _FakeLibc(pause=0.05))
    inside = threading.Barrier(4)

    def fit():
        with allocator.fit_scope():
            inside.wait(timeout=10)  # (all four fits running at once)

    threads = [threading.Thread(target=fit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [c[0] for c in fake.calls] == ["mallopt", "mallopt", "malloc_trim"]


def test_opted_out_or_tuned_through_glibc_tunables_leaves_malloc_alone(monkeypatch):
    fake = _fresh(monkeypatch, _FakeLibc())
    monkeypatch.setenv(*allocator.OPT_OUT)
    for _ in range(2):  # (read at the first fit: the second does not look again)
        with allocator.fit_scope():
            pass
    monkeypatch.delenv(allocator.OPT_OUT[0])
    with allocator.fit_scope():
        pass
    assert fake.calls == [] and not allocator.tuned()
    fake = _fresh(monkeypatch, _FakeLibc(), startup={"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=65536"})
    with allocator.fit_scope():
        pass
    assert fake.calls == [] and not allocator.tuned()
    _fresh(monkeypatch, None)  # not glibc
    with allocator.fit_scope():
        pass
    assert not allocator.tuned()


def test_a_threshold_the_environment_lowered_is_raised_for_the_call_and_put_back(monkeypatch):
    """dask's nanny's ``MALLOC_TRIM_THRESHOLD_=65536``: a fit (and a worker's task) runs with both thresholds at
    ``HEAP_THRESHOLD``, the environment's values (glibc's default for the other) back when the last scope ends;
    nothing is trimmed and nothing stays set."""
    fake = _fresh(monkeypatch, _FakeLibc(), startup={"MALLOC_TRIM_THRESHOLD_": "65536"})
    with allocator.fit_scope():
        with allocator.heap_thresholds():  # (a task inside the fit: the fit's setting stands)
            pass
        assert fake.calls == [("mallopt", -3, HEAP), ("mallopt", -1, TRIM)]
    assert fake.calls[2:] == [("mallopt", -1, 65536), ("mallopt", -3, 128 * 1024)] and not allocator.tuned()
    with allocator.heap_thresholds():  # (a worker's task: both at HEAP_THRESHOLD)
        pass
    assert fake.calls[4:6] == [("mallopt", -3, HEAP), ("mallopt", -1, HEAP)]
    fake = _fresh(monkeypatch, _FakeLibc(), startup={"MALLOC_TRIM_THRESHOLD_": str(HEAP)})
    with allocator.fit_scope():  # (the trim threshold set alone, at 64 MiB: the mmap one fixed at 128 KiB)
        pass
    assert fake.calls[:2] == [("mallopt", -3, HEAP), ("mallopt", -1, TRIM)]
    fake = _fresh(monkeypatch, _FakeLibc(), startup={name: str(2 * HEAP) for name in allocator._HEAP_VARIABLES})
    with allocator.fit_scope():  # (both set higher: left as they are)
        pass
    assert fake.calls == []


def test_thresholds_set_after_the_start_are_not_the_environments(monkeypatch):
    """glibc read its environment when the process started; dask's nanny writes ``MALLOC_TRIM_THRESHOLD_=65536``
    into the driver's ``os.environ`` later, for its workers: a fit of the driver keeps its memory as without it."""
    fake = _fresh(monkeypatch, _FakeLibc())
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with allocator.fit_scope():
        pass
    assert fake.calls == [("mallopt", -3, HEAP), ("mallopt", -1, TRIM), ("malloc_trim", 0)] and allocator.tuned()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/environ")
def test_the_startup_environment_is_the_process_own():
    """``/proc/self/environ``: what the process started with, not ``os.environ`` as changed since."""
    out = subprocess.run([sys.executable, "-c", "import os; os.environ['AGPC_LATER'] = '1'; "
                          "from agpc import allocator; print(allocator._STARTUP.get('AGPC_LATER'), "
                          "allocator._STARTUP.get('AGPC_AT_START'))"],
                         env={**os.environ, "AGPC_AT_START": "yes"}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "yes"]


@pytest.mark.skipif(not GLIBC, reason="the C library's own functions")
def test_glibc_is_found_with_its_two_functions_typed():
    libc = allocator._glibc()
    assert libc.mallopt.argtypes == [ctypes.c_int, ctypes.c_int] and libc.mallopt.restype is ctypes.c_int
    assert libc.malloc_trim.argtypes == [ctypes.c_size_t] and libc.malloc_trim(0) in (0, 1)
