"""A real cluster: ``dask scheduler`` and two ``dask worker`` processes started from the command line on this
machine (loopback only), trained on through ``GPClassifier(client=...)``; a worker killed mid-fit (issue 18 item 3).

Unlike a LocalCluster, nothing here shares the driver's process or its nanny: the workers are separate programs
that import agpc themselves, and a killed worker (started without a nanny) stays dead, so its shard's round has
to finish on the other one.
"""

import concurrent.futures
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from agpc import GPClassifier  # noqa: E402
from agpc.datasets import make_banana  # noqa: E402
from agpc.inference.dask_engine import WORKER_ENVIRON  # noqa: E402
from helpers import assert_same_model  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
START_TIMEOUT = 120  # seconds for the scheduler and the workers to come up (a loaded 2-core machine is slow)
FIT_TIMEOUT = 180  # seconds for one fit: past it the test fails instead of hanging


def _environment():
    """The workers import this checkout's agpc, with one BLAS thread (as agpc's own LocalCluster starts them)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    env.update({k: str(v) for k, v in WORKER_ENVIRON.items()})
    return env


def _stop(process):
    """End one process this test started (by its own handle), politely and then by force."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class CommandLineCluster:
    """``dask scheduler`` on 127.0.0.1 (a free port chosen by the system, read back from its scheduler file)
    and ``dask worker`` processes, each single-threaded, without a nanny or a dashboard."""

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        self.env = _environment()
        self.processes = []
        self.workers = []
        scheduler_file = self.directory / "scheduler.json"
        self.scheduler = self._start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                      "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file)],
                                     "scheduler")
        deadline = time.monotonic() + START_TIMEOUT
        while not scheduler_file.exists():
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start: {self._log('scheduler')}")
            time.sleep(0.1)
        time.sleep(0.1)  # (the file is written whole, but give a reader no torn JSON)
        self.address = json.loads(scheduler_file.read_text())["address"]
        assert self.address.startswith("tcp://127.0.0.1:")

    def _start(self, command, name):
        log = open(self.directory / f"{name}.log", "w")
        process = subprocess.Popen(command, cwd=self.directory, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        log.close()
        self.processes.append(process)
        return process

    def _log(self, name):
        return (self.directory / f"{name}.log").read_text()[-2000:]

    def add_worker(self):
        name = f"worker-{len(self.workers)}"
        self.workers.append(self._start(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny",
             "--no-dashboard", "--host", "127.0.0.1", "--name", name, "--memory-limit", "0",
             "--death-timeout", "60"], name))

    def close(self):
        for process in reversed(self.processes):
            _stop(process)


@pytest.fixture(scope="module")
def command_line_cluster(tmp_path_factory):
    """The scheduler, its workers and a client for this module; every process is ended whatever the tests do."""
    cluster = CommandLineCluster(tmp_path_factory.mktemp("cluster"))
    client = None
    try:
        client = distributed.Client(cluster.address, timeout=START_TIMEOUT)
        yield cluster, client
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=10)
        cluster.close()


@pytest.fixture
def cluster(command_line_cluster):
    """Two live workers (a worker an earlier test killed is replaced by a new process)."""
    cluster, client = command_line_cluster
    live = [w for w in cluster.workers if w.poll() is None]
    for _ in range(2 - len(live)):
        cluster.add_worker()
    client.wait_for_workers(2, timeout=START_TIMEOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while len(client.nthreads()) != 2:  # (a killed worker leaves the scheduler's list when its connection drops)
        assert time.monotonic() < deadline, f"the scheduler sees workers {sorted(client.nthreads())}"
        time.sleep(0.1)
    return cluster, client


def _fit_within(params, Xd, yd):
    """``fit`` in a thread, failed after ``FIT_TIMEOUT`` seconds (the fixture then ends the processes)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(GPClassifier(**params).fit, Xd, yd).result(timeout=FIT_TIMEOUT)


@pytest.mark.parametrize("method", ["sep", "ep"])
def test_a_worker_killed_mid_fit_on_a_command_line_cluster_gives_the_same_model(cluster, monkeypatch, method):
    """Data-parallel minibatch SEP / EP on a scheduler and two workers started from the command line. A fit
    undisturbed, then the same fit with one worker process SIGKILLed while its third round's tasks are in
    flight (the round's ``gather``), a worker checked to hold one of them then (running it or holding its result:
    issue 25, a kill of any live worker did not show that a task was lost): its shard's task, and the chunks it had read, are computed again on the
    other worker, which finishes the fit alone. Both fits end at the same model, to 1e-12 relative: the
    task re-run gets the same inputs (the driver's state, the chunk's keyed random streams, EP's site file of
    the last round) and runs on this machine's BLAS with one thread, so the same operations in the same order;
    what remains is round-off, not a statistical tolerance."""
    cl, client = cluster
    X, y = make_banana(800, random_state=0)
    X_test, _ = make_banana(200, random_state=1)
    params = dict(method=method, n_inducing=10, batch_size=50, max_iter=1, random_state=0, client=client,
                  local_steps=1)  # eight rounds of two shards x one step x 50 rows
    Xd, yd = da.from_array(X, chunks=(100, 2)), da.from_array(y, chunks=100)
    undisturbed = _fit_within(params, Xd, yd)

    real, rounds = client.gather, {"n": 0, "killed": None, "held": None}

    def gather(futures, *args, **kwargs):
        # a round's gather: the futures of its shards' tasks (``data_parallel.step_shard``), all submitted
        if isinstance(futures, list) and futures and all(str(f.key).startswith("step_shard") for f in futures):
            rounds["n"] += 1
            if rounds["n"] == 3:
                # the victim is a worker that holds one of the round's tasks, running it or holding its result
                # (nothing is gathered yet), so that its loss makes the round compute that task again elsewhere;
                # a task may still wait for its chunks to load: polled until one is on a worker
                keys, deadline, held = {f.key for f in futures}, time.monotonic() + FIT_TIMEOUT, {}
                while not held and time.monotonic() < deadline:
                    held = {address: "holding its result" for addresses in client.who_has(futures).values()
                            for address in addresses}
                    held.update({address: "running" for address, tasks in client.processing().items()
                                 if keys & set(tasks)})
                    time.sleep(0.01)
                assert held, f"no worker took a task of round 3 within {FIT_TIMEOUT} s"
                names = {address: info.get("name") for address, info in client.scheduler_info()["workers"].items()}
                address = next(iter(held))
                victim = next(w for k, w in enumerate(cl.workers) if names.get(address) == f"worker-{k}")
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait(timeout=30)
                rounds["killed"], rounds["held"] = victim.pid, held[address]
        return real(futures, *args, **kwargs)

    monkeypatch.setattr(client, "gather", gather)
    disturbed = _fit_within(params, Xd, yd)
    assert rounds["killed"] is not None and rounds["n"] > 3  # killed mid-fit, and the fit went on
    assert rounds["held"] in ("running", "holding its result")  # ...while it held a task of the round
    assert len(client.nthreads()) == 1  # the killed worker stayed dead: the rest ran on the other one
    assert_same_model(disturbed, undisturbed, X_test)
    np.testing.assert_array_equal(disturbed.history_["n_steps"], undisturbed.history_["n_steps"])
