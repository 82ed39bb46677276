"""How many BLAS threads agpc uses for the work it is about to do, and a scope that applies it.

Why: a minibatch step is a few hundred small operations on m x m matrices (m ~ 200) and n x m blocks of a
few hundred rows. A multi-threaded BLAS loses on such shapes: every call wakes, synchronises and parks its
threads, and a thread that spins meanwhile takes the core the Python thread needs: a SEP step at m = 200 runs
several times faster with one thread than with OpenBLAS's default. A batch EP pass, on the contrary, is dominated
by products of n x m blocks of ~10^4 rows, which threads speed up. And on a machine whose cores are busy with
other processes, a multi-threaded call waits for a thread that is not running, so a pass that two threads speed
up on an idle machine runs several times slower with them than with one while other jobs hold the cores
(``benchmarks/threads.py`` measures both on the machine at hand).

The rule (``choose_blas_threads``), per BLAS call of the work at hand:

* Work dominated by m x m algebra (fewer than ``ROWS_PER_INDUCING`` x m rows between two factorisations of q,
  as in a minibatch step): one thread for small m, two from m^3 = ``TWO_THREAD_FACTOR_FLOPS`` (m ~ 400), and one
  thread per ``FACTOR_FLOPS_PER_THREAD`` of m^3 beyond (three from m ~ 930).
* Work dominated by n x m products (a batch pass): one thread per ``GEMM_FLOPS_PER_THREAD`` of one block's
  product, rows x m x (m + d): all the cores for the library's default blocks at m >= 50. Where the pass spreads its
  blocks over Python threads (``pass_workers``; every built-in method's batch passes, the engine's
  ``threaded_passes``), that count is the pass's threads, each block's BLAS calls on one, and the BLAS library runs
  the m x m algebra between the passes at its own count (``_split``). (Passes left on the BLAS library's threads
  lost: numpy's and scipy's OpenBLAS, both loaded, each keep a thread spinning between their calls, and SVI's
  n_jobs=2 fits of 20,000 rows on 2 cores took 1.65 times as long as on one.)
* Never more threads than the cores this process may use (affinity and cgroup quota) less the cores other
  processes kept busy since agpc last looked (``/proc/stat``, Linux; elsewhere nothing is subtracted); in a fit,
  never more than its ``n_jobs`` (scikit-learn's meaning: one by default; the scope's ``cores``).

Classes do not enter: the multiclass model runs the binary algebra class by class, so each BLAS call has
the binary shape.

Whose choice wins (``blas_threads``), outermost scope first:

1. An explicit count (``GPClassifier(blas_threads=k)``) is used for everything inside the scope.
2. Otherwise, a limit the caller already set is left alone: an environment variable that sets the BLAS
   thread count (``THREAD_ENVIRONMENT``) set when agpc was imported (the library read it when it loaded;
   one set later changes nothing in a loaded library, and dask's LocalCluster sets them in the driver's
   environment for its workers, so they are read once, at import), or a BLAS library whose current thread
   count differs from its default (e.g. an enclosing ``threadpoolctl.threadpool_limits(1)``).
   A library's default is its thread count the first time agpc looked at it (when ``agpc`` was imported,
   or when the library was loaded, if later): a limit set at run time *before* importing agpc cannot be
   told from a default, and neither can a limit equal to the default; pass ``blas_threads`` then.
3. Otherwise the rule above, for each scope's own shape (a fit's steps, its final pass, a prediction).

The scope sets no environment variable, changes only BLAS pools (``user_api="blas"``), and puts back every
library's thread count when it ends, also on an exception. The count is process-wide (OpenBLAS's pool is),
so two fits running at once in two Python threads share it.

Cost: ``threadpoolctl.threadpool_limits`` inspects the loaded libraries on every call (about a millisecond, more
on a loaded machine), more than a tenth of a minibatch step; a ``ThreadpoolController`` built once and its
``limit(...)`` cost tens of microseconds (``benchmarks/threads.py``). So the controller is built once and rebuilt only when Python modules have been
imported since (which may have loaded another BLAS), and only at an outermost scope.

Tasks in worker processes use ``task_blas_threads``: the same rule, within the worker's own budget, its BLAS thread
count as the worker was started (dask's nanny sets one BLAS thread per worker thread unless configured) shared among
the tasks it runs at once; a data-parallel shard's minibatch steps run under it in a worker of any cluster.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import sys
import threading
import time

import numpy
import scipy.linalg  # noqa: F401  (loads scipy's own BLAS, so that the controller sees it from the start)
from threadpoolctl import ThreadpoolController

__all__ = [
    "FACTOR_FLOPS_PER_THREAD",
    "GEMM_FLOPS_PER_THREAD",
    "ROWS_PER_INDUCING",
    "THREAD_ENVIRONMENT",
    "TWO_THREAD_FACTOR_FLOPS",
    "available_cores",
    "blas_threads",
    "busy_cores_elsewhere",
    "caller_set_blas_threads",
    "MAX_BLAS_THREADS",
    "check_blas_threads",
    "explicit_beyond_cores",
    "in_scope",
    "choose_blas_threads",
    "task_blas_threads",
    "with_blas_threads",
    "pass_workers",
    "one_blas_thread",
]

# Fewer rows than this many per inducing point between two factorisations: the m x m algebra dominates.
# Measured at m = 200 on the 2-core machine: a SEP step of 200, 1,000 or 4,000 rows ran 6.0x, 3.4x and 1.9x
# slower with two threads than with one (48 / 8.0, 58 / 17, 121 / 63 ms), while a batch pass of 10^5 rows
# took 0.94 s with two and 1.2 s with one (the machine idle; other jobs ran during part of the step
# measurements, which widens the gap but does not close it: 1.9x at 4,000 rows is the trend).
ROWS_PER_INDUCING = 20
# m x m algebra on two threads from m ~ 400. Since NumPy's own OpenBLAS stays on one thread beside SciPy's (``_limit``:
# two pools spinning on two threads each had made a SEP step at m = 500 2.5 times slower), minibatch fits on all the
# airline rows (2-core AMD EPYC, OpenBLAS SkylakeX kernel, ms a step on one thread / two, fits alternated: SEP's by the
# fit's wall time a step, three each; EP's and SVI's by the median step, two each) took at m = 500 SEP 45.0-46.2 /
# 34.8-43.2, EP 32.7 / 28.3-30.7, SVI 27.0-27.7 / 20.6-21.3; at m = 400 SEP 28.1-31.3 / 26.4-29.3; at m = 200 and 300 two
# threads were as often slower as faster (SEP m = 200: 6.9-8.1 against 5.7-9.4, six fits each; m = 300: 14.8-15.7
# against 11.1-16.7), though a step alone, repeated, ran 0.83-0.87 of one
# thread's time on two at m = 200 (``benchmarks/threads.py``; docs/results.md, "Minibatch steps on two BLAS threads").
# m^3 >= 2^26 is m >= 407.
TWO_THREAD_FACTOR_FLOPS = 1 << 26
# More than two threads on m x m algebra (not measured since: no machine here had more than two cores): one per
# 2^28 of m^3, as measured before, when a SEP step at m = 1000 took 560 ms on one thread and 496 ms on two.
FACTOR_FLOPS_PER_THREAD = 1 << 28
# n x m blocks: a thread per ~4 Mflop of one block's product (~0.1 ms of one core), so that the library's
# default blocks (2^21 elements, ~10^4 rows at m = 200) keep 64 cores busy.
GEMM_FLOPS_PER_THREAD = 1 << 22
# Variables through which a caller sets the BLAS thread count before the library loads (OpenBLAS reads the
# first three, MKL MKL_NUM_THREADS and OMP_NUM_THREADS, BLIS BLIS_NUM_THREADS, Accelerate the last).
THREAD_ENVIRONMENT = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                      "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


MAX_BLAS_THREADS = 1024
"""The most BLAS threads a caller may ask for: a thread count goes to the BLAS as a C int (2**64 from a forged model
file stopped prediction with ctypes' OverflowError), and OpenBLAS holds at most its build's MAX_CPU_NUMBER anyway."""


def check_blas_threads(value, name="blas_threads"):
    """``value`` if it is None (automatic) or an integer from 1 to ``MAX_BLAS_THREADS``, else a ValueError naming
    ``name``."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1
            or value > MAX_BLAS_THREADS):
        raise ValueError(f"{name} must be None (automatic) or an integer from 1 to {MAX_BLAS_THREADS}, got "
                         f"{value!r}")
    return int(value)


def in_scope():
    """Whether this thread runs inside a scope of its own already (``blas_threads``): a nested scope keeps the
    outermost one's decision, which has said whatever it had to say."""
    return _owner == threading.get_ident()


def explicit_beyond_cores(value):
    """What an explicit ``blas_threads`` above the cores this process may use becomes, in a sentence for the caller's
    warning (None where it is within them): the scopes use at most those cores (``blas_threads``). More BLAS threads
    than cores take turns: ``blas_threads=3`` on a 2-core machine made a 300-row fit take 86 s against 0.3 s."""
    cores = available_cores()
    if value is None or value <= cores:
        return None
    return (f"blas_threads={value} is more than the {cores} core{'s' if cores != 1 else ''} this process may use: "
            f"{cores} BLAS thread{'s' if cores != 1 else ''} are used (more threads than cores take turns, "
            "which slows the BLAS many times over)")


def _cgroup_cores():
    """Cores allowed by a cgroup v2 CPU quota (a container's --cpus), or None when there is none."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def available_cores():
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cores()
    return max(1, min(cores, quota) if quota else cores)


class _CpuMeter:
    """Cores kept busy by other processes between two looks: the busy time of the cores this process may
    run on (their lines of /proc/stat) less this process's own CPU time (all its threads), over the wall
    time between the looks."""

    def __init__(self):
        self.last = self._sample()
        self.estimate = None

    @staticmethod
    def _sample():
        try:
            allowed = {f"cpu{k}" for k in os.sched_getaffinity(0)}
            with open("/proc/stat") as f:
                lines = [line.split() for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
        except (OSError, AttributeError):
            return None
        busy = 0
        for fields in lines:
            if fields[0] in allowed:
                values = [int(v) for v in fields[1:]]
                busy += sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # all but idle, iowait
        own = os.times()
        return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system

    def busy_elsewhere(self, min_interval=0.05):
        now = self._sample()
        if now is None or self.last is None:
            return 0.0
        if now[0] - self.last[0] < min_interval:  # too short to say (the clock ticks at 100 Hz)
            if self.estimate is not None:  # the last look's answer still stands
                return self.estimate
            time.sleep(min_interval - (now[0] - self.last[0]))  # the first look: wait a little, once
            now = self._sample()
        wall = now[0] - self.last[0]
        others = (now[1] - self.last[1]) - (now[2] - self.last[2])
        self.last = now
        self.estimate = max(0.0, others / wall)
        return self.estimate


_meter = _CpuMeter()


def busy_cores_elsewhere():
    """Cores other processes kept busy (on average) since the last call (Linux; 0 elsewhere)."""
    return _meter.busy_elsewhere()


def _free_cores(budget=None):
    """The cores to use at most now: ``available_cores()`` (or ``budget``) less those busy elsewhere."""
    cores = available_cores() if budget is None else min(budget, available_cores())
    return max(1, round(cores - busy_cores_elsewhere()))


def choose_blas_threads(rows, m, *, n_features=0, block_rows=None, cores=None, beside_passes=False):
    """BLAS threads for work on ``rows`` rows against m inducing points (see the module docstring).

    ``rows``: rows between two factorisations of q (a minibatch step: the minibatch; a batch pass: all n).
    ``block_rows``: rows in one n x m block (default ``rows``). ``n_features``: input dimension d.
    ``cores``: cores to use at most (default ``available_cores()`` less ``busy_cores_elsewhere()``, the
    latter looked at only when more than one thread would be chosen). ``beside_passes``: m x m algebra between passes
    whose row blocks run on Python threads (``_split``): not two threads from ``TWO_THREAD_FACTOR_FLOPS``, only one
    per ``FACTOR_FLOPS_PER_THREAD``."""
    rows, m = max(1, int(rows)), max(1, int(m))
    block_rows = rows if block_rows is None else max(1, min(rows, int(block_rows)))
    if rows < ROWS_PER_INDUCING * m:
        two = 2 if m ** 3 >= TWO_THREAD_FACTOR_FLOPS and not beside_passes else 1
        wanted = max(m ** 3 // FACTOR_FLOPS_PER_THREAD, two)
    else:
        wanted = block_rows * m * (m + int(n_features)) // GEMM_FLOPS_PER_THREAD
    wanted = max(1, int(wanted))
    if wanted == 1:
        return 1
    return max(1, min(wanted, int(_free_cores() if cores is None else cores)))


# -- the BLAS libraries and what their defaults were -----------------------------------------------------

_controller = None
_modules_seen = -1
_defaults = {}  # library file -> its thread count when agpc first saw it


def _libraries(refresh):
    """The BLAS libraries' controllers (a cached ``ThreadpoolController``, rebuilt when ``refresh`` and
    modules were imported since it was built); records each new library's default thread count."""
    global _controller, _modules_seen
    if _controller is None or (refresh and len(sys.modules) != _modules_seen):
        _modules_seen = len(sys.modules)
        _controller = ThreadpoolController().select(user_api="blas")
        for lib in _controller.lib_controllers:
            _defaults.setdefault(lib.filepath, lib.num_threads)
    return _controller


_NUMPY_HOME = os.path.dirname(os.path.abspath(numpy.__file__))


def _numpy_private(filepath):
    """Whether a BLAS library is NumPy's own copy, shipped inside its wheel (numpy.libs beside the package on Linux and
    Windows, numpy/.dylibs on macOS), which no other library calls."""
    path = os.path.abspath(filepath)
    return os.path.basename(os.path.dirname(path)) == "numpy.libs" or path.startswith(_NUMPY_HOME + os.sep)


@contextlib.contextmanager
def _limit(controller, count):
    """The BLAS libraries of ``controller`` on ``count`` threads for the body, put back after; but where NumPy's own
    copy sits beside another library (pip's wheels of NumPy and SciPy: two OpenBLAS) and ``count`` > 1, NumPy's on one.
    Each OpenBLAS keeps a thread spinning a while after its calls, so two of them on two threads each fight for the
    cores: on 2 cores, a mix of NumPy's products and SciPy's triangular ones (agpc's fast paths, ``backend``) took
    36.8 ms on two threads each against 26.6 ms on one, and 22.4 ms with SciPy's alone on two; the exact model's fit
    of 1,500 rows with n_jobs=2, 10.5 s against 8.7 s with one, and 5.7 s so."""
    own = [lib.filepath for lib in controller.lib_controllers if _numpy_private(lib.filepath)]
    if count <= 1 or not own or len(own) == len(controller.lib_controllers):
        with controller.limit(limits=count, user_api="blas"):
            yield
        return
    others = [lib.filepath for lib in controller.lib_controllers if lib.filepath not in own]
    with controller.select(filepath=own).limit(limits=1), controller.select(filepath=others).limit(limits=count):
        yield


# The thread variables set when agpc was imported, i.e. when the BLAS libraries it uses had loaded and read them.
_environment_at_import = {name: os.environ[name] for name in THREAD_ENVIRONMENT if os.environ.get(name)}


def caller_set_blas_threads():
    """True when the caller has set the BLAS thread count: an environment variable of ``THREAD_ENVIRONMENT``
    was set when agpc was imported, or a BLAS library runs with a count other than its default."""
    if _environment_at_import:
        return True
    return any(lib.num_threads != _defaults.get(lib.filepath, lib.num_threads)
               for lib in _libraries(refresh=True).lib_controllers)


# The BLAS thread count is process-wide, so one Python thread at a time owns it: the thread whose scope is
# outermost. Its scopes set and restore the count, last in first out; scopes that other threads open
# meanwhile (e.g. dask's threaded scheduler predicting blocks in parallel) change nothing, so that no
# restore can put back a count another scope set. Tasks of a worker that runs several at once in threads are the
# exception: while the owner is such a task, other tasks' scopes join it (``_task_users``), and the count the
# first task set is put back only when the last task has left, so that no task runs on at the worker's own count.
_lock = threading.Lock()
_owner = None  # the thread identifier of the outermost scope's thread
_owner_in_task = False  # whether the owner's outermost scope is a task's (``task_blas_threads``)
# the owner's open scopes: (mode, count, budget: the most cores the rule may use, None: the free ones (in the caller's
# mode the cores its passes may take), the threads of a pass over row blocks in the scope: None, the BLAS count)
_stack = []
_task_users = 0  # task scopes open in this process's threads while tasks own the count
_task_limit = None  # (count, the open limit that set it for the tasks: closed when the last leaves)


def _leave_task():
    global _task_users, _task_limit
    with _lock:
        _task_users -= 1
        if _task_users == 0 and _task_limit is not None:
            _task_limit[1].close()  # (puts the count back)
            _task_limit = None


def _worker_threads():
    """Tasks a dask worker runs at once (its threads), 1 outside a dask worker."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return 1
    try:
        return max(1, int(getattr(distributed.get_worker(), "nthreads", 1)))
    except (ValueError, TypeError):
        return 1


@contextlib.contextmanager
def _scope(rows, m, n_features, block_rows, threads, in_task, cores=None, threaded_passes=False):
    global _owner, _owner_in_task, _task_users, _task_limit
    me = threading.get_ident()
    with _lock:
        outermost = _owner is None
        if outermost:
            _owner, _owner_in_task = me, in_task
        mine = _owner == me
        task_user = in_task and (outermost or (not mine and _owner_in_task))
        if task_user:
            _task_users += 1
    try:
        if not mine:
            yield None
            return
        try:
            budget = passes = None
            if not outermost:  # the outermost scope decided whose choice wins; choose again for this shape
                mode, count, budget, _ = _stack[0]
                if mode == "rule":
                    count, passes = _split(_rule(rows, m, n_features, block_rows, budget), rows, m, n_features,
                                           budget, threaded_passes)
                elif mode == "caller":
                    passes = _caller_passes(budget, rows, m, threaded_passes)
            elif in_task:  # a Dask worker's budget: its BLAS threads shared among the tasks it runs at once
                mode, count, budget = _task_choice(rows, m, n_features, block_rows)
            elif threads is not None:
                mode, count = "explicit", min(threads, available_cores())  # (``explicit_beyond_cores``)
            elif caller_set_blas_threads():
                # the caller's BLAS count stands; an n_jobs above 1 (``cores``) still spreads a pass's blocks over
                # that many Python threads, each on one BLAS thread (as under the rule: with OMP_NUM_THREADS=1 set,
                # n_jobs=2 ran every pass on one thread, n_jobs_ saying 2)
                mode, count, budget = "caller", None, cores
                passes = _caller_passes(cores, rows, m, threaded_passes)
            else:
                mode, budget = "rule", cores
                count, passes = _split(_rule(rows, m, n_features, block_rows, cores), rows, m, n_features, cores,
                                       threaded_passes)
            _stack.append((mode, count, budget, passes))
            try:
                if count is None or (outermost and in_task):  # (a task's count is set: ``_task_limit``)
                    yield count
                else:
                    with _limit(_libraries(refresh=outermost), count):
                        yield count
            finally:
                _stack.pop()
        finally:
            if outermost:
                with _lock:
                    _owner = None
    finally:
        if task_user:
            _leave_task()


def _task_choice(rows, m, n_features, block_rows):
    """(mode, count, budget) of a task's outermost scope (``task_blas_threads``): the rule within the worker's BLAS
    threads shared among the tasks it runs at once, the count the first running task set (``_task_limit``)."""
    global _task_limit
    libraries = _libraries(refresh=True).lib_controllers
    budget = max(1, max([lib.num_threads for lib in libraries], default=1) // _worker_threads())
    with _lock:
        if _task_limit is None:  # (else tasks still running set it: theirs stands)
            count = _rule(rows, m, n_features, block_rows, budget)
            limit = contextlib.ExitStack()
            limit.enter_context(_limit(_libraries(refresh=False), count))
            _task_limit = (count, limit)
        return "rule", _task_limit[0], budget


def _caller_passes(cores, rows, m, threaded_passes):
    """The threads of a pass over row blocks where the caller set the BLAS count (``caller_set_blas_threads``):
    ``cores`` (an estimator's ``n_jobs``) for a pass over many rows, as under the rule (``_split``), else None (the
    BLAS count)."""
    if threaded_passes and cores is not None and cores > 1 and rows >= ROWS_PER_INDUCING * m:
        return cores
    return None


def _split(count, rows, m, n_features, budget, threaded_passes):
    """(BLAS threads, threads of a pass over row blocks or None) under the rule, ``count`` being the rule's count for
    the work. A pass over many rows (``rows`` >= ``ROWS_PER_INDUCING`` m) whose blocks run on Python threads
    (``threaded_passes``: ``blocks.map_blocks``, each block's BLAS calls on one thread) takes ``count`` such threads,
    and the m x m algebra between its passes runs at its own count (``beside_passes``: one thread for m below ~800,
    where a minibatch step takes two from m ~ 400): a BLAS thread spinning after its calls takes the core a pass's
    thread needs. A two-thread BLAS there cost more than it saved (a default fit of 4,400 ordinal rows took 9.4 s with
    n_jobs=2 against 7.4 s with one, and 40 iterations on 18,000 airline rows 5.9 s against 4.4 s with the m x m
    algebra on one thread); with NumPy's own OpenBLAS on one thread (``_limit``) still: 40 batch EP iterations on
    20,000 airline-like rows with n_jobs=2 took 5.6-5.8 s against 3.5-3.8 s at m = 200, 19.3-20.9 s against
    16.9-17.2 s at m = 500."""
    if not threaded_passes or count <= 1 or rows < ROWS_PER_INDUCING * m:
        return count, None
    return _rule(m, m, n_features, None, budget, beside_passes=True), count


def _rule(rows, m, n_features, block_rows, budget, beside_passes=False):
    """``choose_blas_threads`` within ``budget`` cores (None: the free ones), less those busy elsewhere."""
    count = choose_blas_threads(rows, m, n_features=n_features, block_rows=block_rows, cores=budget,
                                beside_passes=beside_passes)
    if budget is not None and count > 1:  # the busy cores are looked at only when they could matter
        count = min(count, _free_cores(budget))
    return count


def blas_threads(rows, m, *, n_features=0, block_rows=None, threads=None, cores=None, threaded_passes=False):
    """A context manager running its body with the BLAS thread count for this work (``choose_blas_threads``
    with the same arguments); yields the count set, or None when nothing was changed (the caller's setting
    is left alone, or another Python thread's scope holds the count). ``threads``: an explicit count.
    ``cores``: under the rule, the most cores it may use, in this scope and those nested in it (an estimator's
    ``n_jobs``; None: the free ones). ``threaded_passes``: the work's passes over rows spread their blocks over
    Python threads (``pass_workers``); under the rule the BLAS count is then the m x m algebra's (``_split``).

    Nested scopes keep the outermost one's decision of whose choice wins (explicit, the caller's, or the
    rule) and, under the rule, choose again for their own shape. See the module docstring."""
    return _scope(rows, m, n_features, block_rows, check_blas_threads(threads), in_task=False,
                  cores=None if cores is None else max(1, int(cores)), threaded_passes=threaded_passes)


def task_blas_threads(rows, m, *, n_features=0, block_rows=None):
    """``blas_threads`` inside a worker's task (a dask worker's, a local worker's): the rule within the worker's
    budget, the largest BLAS thread count its libraries have shared among the tasks the worker runs at once (its
    threads). Environment variables there are the worker's configuration (dask's nanny sets one thread, a user's
    may set more), not a caller's limit to leave alone. Tasks that run at once in one worker's threads share the
    count the first one set, which is put back when the last one ends. A task run in the driver's own scope (a
    synchronous scheduler, a threaded cluster) follows the driver's scope."""
    return _scope(rows, m, n_features, block_rows, None, in_task=True)


def with_blas_threads(work):
    """Decorator: run the function inside ``blas_threads(**work(*args, **kwargs))``, ``work`` giving the
    shape of what the call will do (``rows``, ``m`` and optionally ``n_features``, ``block_rows``)."""
    def decorate(function):
        @functools.wraps(function)
        def scoped(*args, **kwargs):
            with blas_threads(**work(*args, **kwargs)):
                return function(*args, **kwargs)
        return scoped
    return decorate


_libraries(refresh=True)  # the first look, at import: each library's default is what it has now


# -- a pass over row blocks spread over Python threads --------------------------------------------------

def pass_workers():
    """Python threads a pass over row blocks may spread its blocks over: the innermost scope's pass threads where
    the rule chose them (``_split``), else the BLAS thread count in force now, when this thread holds agpc's BLAS
    scope or none is open (1 when another thread's scope holds the count). Each
    thread then runs its blocks' BLAS calls on one thread (``one_blas_thread``): the elementwise work of the
    blocks (the kernel's exponentials, the sites' updates, the gradient's products with the kernel block),
    which a multi-threaded BLAS leaves on one core, is then spread too."""
    with _lock:
        owner = _owner
    if owner is not None and owner != threading.get_ident():
        return 1
    if owner is not None and _stack and _stack[-1][3] is not None:
        return _stack[-1][3]
    return max([lib.num_threads for lib in _libraries(refresh=False).lib_controllers], default=1)


@contextlib.contextmanager
def one_blas_thread():
    """Every BLAS library on one thread for the body, the counts put back after (see ``pass_workers``)."""
    with _libraries(refresh=False).limit(limits=1, user_api="blas"):
        yield
