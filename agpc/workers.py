"""Worker processes: how agpc's tasks run in any worker process, the local worker processes behind
``GPClassifier(n_jobs=...)``, and the rows they share.

Three things live here.

* ``task_scope``: what a data-parallel shard's task (``inference.data_parallel.step_shard``) runs under, in a
  worker of any cluster (a LocalCluster's, ``dask worker``'s, a pool of ``LocalWorkers``), whatever the user
  set or did not set there: the BLAS thread rule for its minibatch steps within the worker's budget
  (``threads.task_blas_threads``: within the worker's BLAS threads, one in ``LocalWorkers``), and glibc's heap thresholds
  (``allocator.heap_thresholds``: raised where the environment lowered them, as dask's nanny does).
* ``LocalWorkers``: worker processes on this machine, started for a fit and ended with it, each running one
  task at a time. They offer the part of ``distributed.Client`` the data-parallel rounds use (``submit``,
  ``gather``, ``nthreads``), so the rounds are the same code on a cluster and here.
* ``SharedRows``: the rows, written once into a file that every worker maps read-only (``numpy.memmap``): the
  page cache holds them once for all processes. A file rather than ``multiprocessing.shared_memory``: workers
  of any start method open it by its path, a worker can remove it when the driver dies before doing so (no
  resource tracker to trust), and the same mapping reads data already on disk.

Why the workers are started as ``python -c`` programs (``subprocess``) and not by ``multiprocessing``: a
``spawn`` or ``forkserver`` child imports the caller's main script again (``multiprocessing``'s "safe
importing of main module"), so a user's script without ``if __name__ == "__main__":`` would run again in
every worker; ``fork`` copies a process whose other threads (BLAS pools, a dask client's event loop) may hold
locks. A ``python -c`` child imports agpc and nothing of the caller's; it costs the import (about a second),
which ``GPClassifier.fit`` overlaps with its own set-up (input checks, k-means).

No orphan processes: a worker ignores SIGINT (Ctrl-C ends the driver, whose ``close`` ends the workers: a stop
message to an idle worker, SIGTERM to one whose task is no longer wanted), and a worker whose driver is gone (killed:
its input closes without a stop, and a thread sees the worker's parent change) leaves, removing the shared rows'
directory on its way out.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import numbers
import os
import pickle  # (only over the pipes of the worker processes started here; files go through agpc.untrusted)
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections import deque

import cloudpickle
import numpy as np

from . import threads
from .allocator import HEAP_THRESHOLD, heap_thresholds

try:
    import resource  # (POSIX)
except ImportError:
    resource = None

__all__ = [
    "HEAP_THRESHOLD",
    "LocalWorkers",
    "RowBlock",
    "SharedRows",
    "heap_thresholds",
    "in_parallel_worker",
    "resolve_n_jobs",
    "share_rows",
    "task_scope",
]

@contextlib.contextmanager
def task_scope(rows, m, n_features=0):
    """What a data-parallel task runs under in any worker process: the BLAS thread rule for ``rows`` rows against
    m inducing points within the worker's budget (``threads.task_blas_threads``) and ``heap_thresholds``."""
    with threads.task_blas_threads(rows, m, n_features=n_features), heap_thresholds():
        yield


def minor_page_faults():
    """Minor page faults of this process so far (0 where ``resource`` is missing): a stable count of the heap
    settings' effect, which the data-parallel rounds record per task."""
    if resource is None:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# -- n_jobs -------------------------------------------------------------------------------------------

_in_local_worker = False  # set in a ``LocalWorkers`` process


def in_parallel_worker():
    """Why this code runs inside a parallel worker (a string), or None: a task of a dask worker, a joblib worker
    (scikit-learn's ``GridSearchCV(n_jobs=...)``, ``cross_val_score(n_jobs=...)``: joblib runs its tasks under a
    nested backend), a daemonic ``multiprocessing`` worker (a ``Pool``'s, a ``ProcessPoolExecutor``'s), or one of
    agpc's own local workers. A fit there trains in its own process: more processes would oversubscribe the
    cores the outer parallelism already shares out."""
    if _in_local_worker:
        return "an agpc local worker process"
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            distributed.get_worker()
            return "a dask worker's task"
        except ValueError:
            pass
    parallel = sys.modules.get("joblib.parallel")
    if parallel is not None:
        backend, _ = parallel.get_active_backend()
        if (getattr(backend, "nesting_level", 0) or 0) > 0:
            return "a joblib worker (e.g. GridSearchCV(n_jobs=...))"
    if multiprocessing.current_process().daemon:
        return "a daemonic multiprocessing worker"
    return None


def _joblib_n_jobs():
    """``n_jobs`` of an enclosing ``joblib.parallel_config`` (scikit-learn's meaning of None), or None."""
    parallel = sys.modules.get("joblib.parallel")
    if parallel is None:
        return None
    _, n_jobs = parallel.get_active_backend()
    return n_jobs if isinstance(n_jobs, numbers.Integral) and not isinstance(n_jobs, bool) and n_jobs != 0 else None


def resolve_n_jobs(n_jobs):
    """(worker processes, why) for ``n_jobs`` in scikit-learn's meaning: None is the ``n_jobs`` of an enclosing
    ``joblib.parallel_config`` if there is one, else 1; -1 is every core this process may use
    (``threads.available_cores``), -2 all but one, ...; a positive count is itself. Inside a parallel worker
    (``in_parallel_worker``) it is 1, with the reason."""
    nested = in_parallel_worker()
    if nested is not None:
        return 1, f"inside {nested}"
    requested = _joblib_n_jobs() if n_jobs is None else int(n_jobs)
    if requested is None:
        return 1, "n_jobs=None"
    if requested < 0:
        requested = max(1, threads.available_cores() + 1 + requested)
    return max(1, requested), None


# -- rows every local worker maps ---------------------------------------------------------------------

def _shared_directory(nbytes):
    """A new directory for ``nbytes`` of rows: in /dev/shm (memory) when it has room for twice that, else in
    the system's temporary directory."""
    candidates = ["/dev/shm"] if os.path.isdir("/dev/shm") else []
    for base in candidates:
        try:
            stats = os.statvfs(base)
        except OSError:
            continue
        if stats.f_bavail * stats.f_frsize >= 2 * nbytes:
            return tempfile.mkdtemp(prefix="agpc-rows-", dir=base)
    return tempfile.mkdtemp(prefix="agpc-rows-")


class RowBlock:
    """Rows lo:hi of a ``SharedRows`` file, as a task's argument: a ``LocalWorkers`` process hands the task a
    read-only view of its mapping instead (``resolve``)."""

    def __init__(self, path, shape, dtype, lo, hi):
        self.path, self.shape, self.dtype, self.lo, self.hi = path, tuple(shape), np.dtype(dtype).str, lo, hi

    def __reduce__(self):
        return RowBlock, (self.path, self.shape, self.dtype, self.lo, self.hi)

    def rows(self):
        mapped = _mappings.get(self.path)
        if mapped is None:
            mapped = _mappings[self.path] = np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r", shape=self.shape)
        return mapped[self.lo:self.hi]


_mappings = {}  # path -> the worker's memmap of it


class SharedRows:
    """Rows (or labels) in a file that local workers map read-only, cut into chunks of rows: ``shape``, ``dtype``
    and dask's ``chunks`` spelling (``backend.row_chunk_bounds`` reads it), and ``block(c)``, chunk c as a task
    argument. ``close()`` removes the file's directory."""

    def __init__(self, path, shape, dtype, chunk_rows, directory):
        self.path, self.shape, self.dtype, self.ndim = path, tuple(shape), np.dtype(dtype), len(shape)
        self.chunks = (tuple(int(r) for r in chunk_rows),) + tuple((s,) for s in self.shape[1:])
        self.directory = directory
        edges = np.concatenate([[0], np.cumsum(self.chunks[0])]).astype(int).tolist()
        self._bounds = list(zip(edges[:-1], edges[1:]))
        self._finalizer = weakref.finalize(self, shutil.rmtree, directory, True)

    def block(self, chunk):
        lo, hi = self._bounds[chunk]
        return RowBlock(self.path, self.shape, self.dtype, lo, hi)

    def close(self):
        self._finalizer()


def share_rows(arrays, chunk_rows, order=None, dtypes=None, block_bytes=16 * 1024 * 1024):
    """``SharedRows`` for each array of ``arrays`` (NumPy arrays, or data on disk that slices by rows), written
    in one directory a block of rows at a time, in ``dtypes`` (default each array's own), their rows in ``order``
    (a permutation of the rows; None: as stored), cut into chunks of ``chunk_rows`` rows (a list of sizes)."""
    n = int(arrays[0].shape[0])
    dtypes = [np.dtype(a.dtype) for a in arrays] if dtypes is None else [np.dtype(d) for d in dtypes]
    nbytes = sum(int(np.prod(a.shape, dtype=np.int64)) * d.itemsize for a, d in zip(arrays, dtypes))
    directory = _shared_directory(nbytes)
    shared = []
    try:
        for k, (array, dtype) in enumerate(zip(arrays, dtypes)):
            path = os.path.join(directory, f"rows-{k}.bin")
            shape = tuple(int(s) for s in array.shape)
            row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)
            step = max(1, block_bytes // row_bytes)
            out = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                out[lo:hi] = np.asarray(array[order[lo:hi]] if order is not None else array[lo:hi])
            out.flush()
            del out
            shared.append(SharedRows(path, shape, dtype, chunk_rows, directory))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return shared


def resolve(value):
    """A task's argument with every ``RowBlock`` inside dicts, lists and tuples replaced by its rows."""
    if isinstance(value, RowBlock):
        return value.rows()
    if isinstance(value, dict):
        return {k: resolve(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve(v) for v in value)
    return value


# -- local worker processes ------------------------------------------------------------------------------

# The program a worker runs: the driver's module search path first (so that it imports the same agpc), then the
# modules the pool was asked to preload (before the first task is read), then ``serve``. Nothing of the caller's
# main script is imported, and nothing of scikit-learn (``agpc`` loads its estimator when first asked for it).
_BOOT = """
import importlib, pickle, sys
sys.path[:], preload = pickle.load(sys.stdin.buffer)
for name in preload:
    importlib.import_module(name)
from agpc.workers import serve
serve()
"""
WATCH_SECONDS = 0.2  # how often a worker looks whether its parent is still alive
STOP_SECONDS = 5.0  # how long ``close`` waits for a worker to leave before ending it by force
MAX_RESTARTS = 3  # workers that die while running tasks are started again at most this many times a pool


def _remove_mapped_rows():
    """The driver is gone without removing the shared rows: this worker, one of their last users, does."""
    for path in list(_mappings):
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _watch_parent(parent):
    """End this worker (removing the shared rows it mapped) when its parent process is gone."""
    def watch():
        while True:
            time.sleep(WATCH_SECONDS)
            if os.getppid() != parent:
                _remove_mapped_rows()
                os._exit(1)

    threading.Thread(target=watch, name="agpc-parent-watch", daemon=True).start()


def _portable(error):
    """``error`` if it pickles, else a RuntimeError with its traceback (what the driver can be told)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return RuntimeError(f"a local worker's task failed:\n{text}")


def _write_message(stream, data):
    stream.write(len(data).to_bytes(8, "little"))
    stream.write(data)
    stream.flush()


def _read_message(stream):
    """The next message's bytes, or None at EOF (the other end closed, or the process is gone)."""
    header = stream.read(8)
    if len(header) < 8:
        return None
    size = int.from_bytes(header, "little")
    data = stream.read(size)
    return data if len(data) == size else None


def serve():
    """A worker's loop: read a pickled (function, args, kwargs) from stdin, run it, write ("done", value) or
    ("failed", error) to the original stdout; ends at an empty message (the driver's stop) or at EOF (the driver
    is gone: the shared rows it mapped are removed). The process's own stdout goes to stderr."""
    global _in_local_worker
    _in_local_worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it ends the workers
    inbox = sys.stdin.buffer
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # (a library's print must not corrupt the channel)
    _watch_parent(os.getppid())
    while True:
        data = _read_message(inbox)
        if data is None:  # the input closed without a stop: the driver is gone (killed, crashed)
            _remove_mapped_rows()
            break
        if not data:  # the driver's stop
            break
        try:
            function, args, kwargs = pickle.loads(data)
            reply = ("done", function(*resolve(args), **resolve(kwargs)))
        except BaseException as error:  # (the driver raises it; the worker serves on)
            reply = ("failed", _portable(error))
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            data = pickle.dumps(("failed", _portable(error)), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_message(outbox, data)
        except OSError:  # (BrokenPipeError: nobody reads the results any more, the driver is gone)
            _remove_mapped_rows()
            break
    # Leave at once: nothing is left to write (each result was flushed), and the interpreter's teardown of the
    # numerical modules would keep the driver's ``close`` waiting (measured: about a second under load).
    sys.stderr.flush()
    os._exit(0)


class WorkerLost(RuntimeError):
    """A local worker process ended while it had tasks to run (killed, or out of memory)."""


class _Task:
    """A task sent to a worker: its message (kept to send again if the worker is lost) and, once read, its
    outcome."""

    def __init__(self, worker, message):
        self.worker, self.message = worker, message
        self.done, self.value, self.error = False, None, None


class LocalWorkers:
    """``n_workers`` worker processes on this machine (``python -c`` children, see the module docstring; each
    imports the modules ``preload`` names before its first task), each running its tasks one at a time in the
    order they were sent: ``submit``, ``gather``, ``nthreads`` as
    ``distributed.Client`` has them (tasks are pinned with ``workers=[name]``). A worker that dies with tasks to
    run is started again and given them again (the same inputs: the same results), at most ``MAX_RESTARTS`` times.
    ``close()`` (also at garbage collection and at interpreter exit) ends every worker."""

    def __init__(self, n_workers, *, preload=()):
        if int(n_workers) < 1:
            raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
        self.names = [f"local-{k}" for k in range(int(n_workers))]
        self.preload = tuple(preload)
        # one BLAS thread in each worker's pools, as dask's nanny starts workers (a task's rule asks for no more:
        # ``task_scope``; no idle pool threads in every worker)
        self.environment = dict(os.environ, **{name: "1" for name in threads.THREAD_ENVIRONMENT})
        self._processes = {}
        self._pending = {name: deque() for name in self.names}  # tasks sent and not read back, in order
        self._next = 0
        self.restarts = 0
        self._finalizer = weakref.finalize(self, _end_processes, self._processes, self._pending)
        try:
            for name in self.names:
                self._start(name)
        except BaseException:
            self.close()
            raise

    def _start(self, name):
        process = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=self.environment, close_fds=True)
        self._processes[name] = process
        process.stdin.write(pickle.dumps((list(sys.path), self.preload), protocol=pickle.HIGHEST_PROTOCOL))
        process.stdin.flush()

    @property
    def pids(self):
        return [p.pid for p in self._processes.values()]

    def nthreads(self):
        return {name: 1 for name in self.names}

    def submit(self, function, *args, workers=None, allow_other_workers=True, pure=None, **kwargs):
        """Send ``function(*args, **kwargs)`` to the worker named in ``workers`` (else the next in turn); returns
        the task, whose value ``gather`` reads. ``RowBlock`` arguments reach the function as rows."""
        if workers:
            name = workers[0]
        else:
            name = self.names[self._next % len(self.names)]
            self._next += 1
        # (cloudpickle: a kernel class or function the caller defined in their main script travels by value)
        task = _Task(name, cloudpickle.dumps((function, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))
        self._pending[name].append(task)
        self._send(task)
        return task

    def _send(self, task):
        try:
            _write_message(self._processes[task.worker].stdin, task.message)
        except (BrokenPipeError, OSError, ValueError):
            pass  # the worker is gone: reading its results finds out and starts it again

    def gather(self, tasks):
        """The tasks' values, in order; a task's error is raised here."""
        values = []
        for task in tasks:
            while not task.done:
                self._read_one(task.worker)
            if task.error is not None:
                raise task.error
            values.append(task.value)
        return values

    def _read_one(self, name):
        try:
            data = _read_message(self._processes[name].stdout)
        except (OSError, ValueError):
            data = None
        if data is None:
            self._restart(name)
            return
        status, value = pickle.loads(data)
        task = self._pending[name].popleft()
        task.done = True
        if status == "done":
            task.value = value
        else:
            task.error = value if isinstance(value, BaseException) else RuntimeError(str(value))

    def _restart(self, name):
        """A worker died with tasks to run: start another under its name and send it those tasks again."""
        _end_process(self._processes[name])
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise WorkerLost(f"local worker processes died {self.restarts} times (the last one {name}, exit code "
                             f"{self._processes[name].returncode}): out of memory, or killed")
        self._start(name)
        for task in self._pending[name]:
            self._send(task)

    def run_everywhere(self, function, *args, **kwargs):
        """``function(*args, **kwargs)`` on every worker; their values in the order of ``names``."""
        return self.gather([self.submit(function, *args, workers=[name], **kwargs) for name in self.names])

    def close(self):
        """End every worker (``_end_processes``)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _end_process(process):
    for stream in (process.stdin, process.stdout):
        with contextlib.suppress(OSError, ValueError):
            stream.close()
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _end_processes(processes, pending):
    """End every worker: one with a task under way (the pool closes after an interrupt, an error or
    ``max_time``: the result is not wanted) at once (SIGTERM), the others by a stop message; any still there after
    ``STOP_SECONDS`` is killed."""
    for name, process in processes.items():
        if pending.get(name) and process.poll() is None:
            process.terminate()
        with contextlib.suppress(OSError, ValueError):
            _write_message(process.stdin, b"")  # stop
        with contextlib.suppress(OSError, ValueError):
            process.stdin.close()
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes.values():
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with contextlib.suppress(OSError, ValueError):
            process.stdout.close()
