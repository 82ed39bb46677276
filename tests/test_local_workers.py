"""``GPClassifier(n_jobs=...)``: data-parallel rounds in local worker processes (``agpc.workers``), the rows shared
through one mapped file; never more processes inside a parallel worker; no process left behind on any exit path.

Each fit with ``n_jobs > 1`` starts its worker processes (about a second of imports each, overlapped with the fit's
own set-up), so the tests keep to few, small fits.
"""

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from joblib import parallel_config
from sklearn.model_selection import cross_validate

distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

from agpc import GPClassifier, GuardWarning, threads  # noqa: E402
from agpc import workers as W  # noqa: E402
from agpc.datasets import make_banana  # noqa: E402
from agpc.inference import training  # noqa: E402
from helpers import assert_same_model, local_client, nll_of, three_classes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GONE_SECONDS = 15  # how long a worker may take to leave after its driver ended (its watch looks every 0.2 s)


@pytest.fixture(scope="module")
def banana():
    X, y = make_banana(2000, random_state=1)
    X_test, y_test = make_banana(2000, random_state=2)
    return X, y, X_test, y_test


@pytest.fixture
def pools(monkeypatch):
    """Every ``LocalWorkers`` pool a fit starts (to look at its processes afterwards)."""
    started = []
    real = W.LocalWorkers.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(W.LocalWorkers, "__init__", init)
    return started


def _gone(pids, seconds=GONE_SECONDS):
    """True when none of ``pids`` is a live process within ``seconds`` (a zombie counts as gone)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for pid in pids:
            try:
                alive.append(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
            except psutil.NoSuchProcess:
                alive.append(False)
        if not any(alive):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


# -- fits ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, n, epochs, tolerance", [("sep", 2000, 4, 0.005), ("ep", 2000, 4, 0.005),
                                                           ("svi", 1000, 60, 0.01)])
def test_n_jobs_trains_in_worker_processes_near_the_single_process_fit(banana, pools, method, n, epochs, tolerance,
                                                                        tmp_path):
    """Two worker processes, four local steps a round, the same rows seen: the test NLL within ``tolerance`` of
    the single-process fit's (the tolerances and their reasons of the dask test, tests/test_data_parallel.py);
    the fit ran in the two processes (``n_jobs_``, and their processes are gone afterwards), whose rounds read
    local_steps and site_directory (neither said unused, as they are of a fit in this process)."""
    X, y, X_test, y_test = banana
    X, y = X[:n], y[:n]
    # (every epoch: the fits are compared after the same number of them)
    params = dict(method=method, n_inducing=15, batch_size=50, max_iter=epochs, random_state=0, plateau=None)
    single = GPClassifier(**params).fit(X, y)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".* is not used")
        parallel = GPClassifier(**params, n_jobs=2, local_steps=4, site_directory=tmp_path).fit(X, y)
    assert single.n_jobs_ == 1 and parallel.n_jobs_ == 2
    assert abs(nll_of(parallel, X_test, y_test) - nll_of(single, X_test, y_test)) < tolerance
    assert parallel.history_["n_steps"][-1] == epochs * -(-n // (2 * 4 * 50))  # rounds of 2 shards x 4 x 50 rows
    assert len(pools) == 1 and _gone(pools[0].pids, 0)


@pytest.mark.parametrize("method, optimizer, learning_rate", [("sep", "adam", 1e3), ("svi", "adadelta", 1e8)])
def test_rounds_at_a_careless_learning_rate_recover_as_one_process_does(method, optimizer, learning_rate):
    """The audit: at a learning rate that sends the first steps out of the floats, one process's guard goes back and
    halves its steps until they hold, while two local workers gave up ("diverged ... 31 failed steps in a row"): a
    round's update left a state that was no model, and each shard, starting there, halved its steps 30 times and
    raised. Now a shard whose guard gives up ends its round at its last good state, and a round in which no shard
    took a step is the driver guard's to go back from (log Z NaN): the fit ends with a model, as one process's does,
    and its guard says what it did."""
    X, y = make_banana(600, random_state=0)
    params = dict(method=method, batch_size=50, optimizer=optimizer, learning_rate=learning_rate, n_inducing=10,
                  max_iter=4, random_state=0)
    for n_jobs in (1, 2):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            model = GPClassifier(**params, n_jobs=n_jobs).fit(X, y)
        assert model.n_jobs_ == n_jobs
        assert np.all(np.isfinite(model.predict_proba(X)))
        guard = [str(w.message) for w in said if issubclass(w.category, GuardWarning)]
        assert any("halved" in text for text in guard), guard


def test_multiclass_sep_with_n_jobs_and_what_trains_in_this_process(pools):
    """Multiclass SEP in two worker processes ends near the single-process fit (within 0.02 nats, as on a dask
    cluster); multiclass EP's minibatches and those of an array library other than NumPy, which the rounds cannot
    take, train in this process: no worker starts, ``n_jobs_`` is 1 and one warning, pointing at the caller's
    ``fit``, says why (as scikit-learn says an n_jobs it cannot use). (The batch-only methods take n_jobs as their
    passes' threads: tests/test_n_jobs.py.)"""
    X, y = three_classes(1200, 0, boundaries="linear", noise=0.5)
    X_test, y_test = three_classes(2000, 1, boundaries="linear", noise=0.5)
    params = dict(method="sep", n_inducing=8, batch_size=50, max_iter=4, random_state=0)
    single = GPClassifier(**params).fit(X, y)
    parallel = GPClassifier(**params, n_jobs=2, local_steps=4).fit(X, y)
    assert parallel.n_jobs_ == 2 and parallel.predict_proba(X_test).shape == (2000, 3)
    assert abs(nll_of(parallel, X_test, y_test) - nll_of(single, X_test, y_test)) < 0.02
    started = len(pools)
    strict = pytest.importorskip("array_api_strict")
    for params, why in [(dict(method="ep"), "data-parallel multiclass training runs 'sep', 'adf' or 'svi'"),
                        (dict(method="sep", backend=strict),
                         "minibatches train in worker processes on NumPy data only, not on array_api_strict arrays")]:
        with pytest.warns(UserWarning, match="n_jobs") as said:
            model = GPClassifier(**params, batch_size=50, n_jobs=2, max_iter=1, n_inducing=8).fit(X, y)
        about = [w for w in said if "n_jobs" in str(w.message)]
        assert model.n_jobs_ == 1 and len(about) == 1 and about[0].filename == __file__, about
        assert str(about[0].message).startswith(f"n_jobs=2: {why}") and "on one worker (n_jobs_=1)" in str(
            about[0].message)
    assert len(pools) == started


def test_the_rows_are_one_file_every_worker_maps(banana, monkeypatch):
    """The rows go once into a file (two: X and the labels) that each worker maps read-only: a task sees a
    ``numpy.memmap`` of that very file, not a copy of its own; the file holds the rows in the fit's shuffled
    order, in the model's dtype; removing the rows removes the file."""
    X, y, _, _ = banana
    written = []
    real = W.share_rows

    def share(*args, **kwargs):
        written.append(real(*args, **kwargs))
        written.append([(p.name, p.stat().st_size) for p in Path(written[-1][0].directory).iterdir()])
        return written[-2]

    monkeypatch.setattr(W, "share_rows", share)
    GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, n_jobs=2, random_state=0,
                 dtype="float32").fit(X, y)
    shared, files = written
    assert sorted(files) == [("rows-0.bin", X.size * 4), ("rows-1.bin", y.size * 4)]
    assert not os.path.exists(shared[0].directory)  # removed at the end of the fit

    order = np.random.default_rng(0).permutation(len(X))
    X_rows, y_rows = W.share_rows([X, y.astype(float)], [1000, 1000], order=order)
    try:
        with W.LocalWorkers(2) as pool:
            seen = pool.gather([pool.submit(_mapped, X_rows.block(k), workers=[name])
                                for k, name in enumerate(pool.names)])
        for k, (kind, filename, first_row) in enumerate(seen):
            assert kind == "memmap" and filename == X_rows.path
            np.testing.assert_array_equal(first_row, X[order[1000 * k]])
    finally:
        X_rows.close()
    assert not os.path.exists(X_rows.directory)


def _mapped(rows):
    """(in a worker) What a task was handed for a ``RowBlock``: its type, the file it maps, its first row."""
    return type(rows).__name__, getattr(rows, "filename", None), np.array(rows[0])


def test_a_lost_local_worker_gives_the_same_model(banana, monkeypatch, pools):
    """A worker process killed (SIGKILL) while its task of the third round runs: the pool starts another, which
    runs the task again with the same inputs, and the fit (``local_steps`` given: reproducible rounds) ends at
    the undisturbed model, to rounding."""
    X, y, X_test, _ = banana
    params = dict(method="ep", n_inducing=10, batch_size=50, max_iter=2, random_state=0, n_jobs=2, local_steps=2)
    undisturbed = GPClassifier(**params).fit(X[:800], y[:800])
    real, calls = W.LocalWorkers.gather, {"n": 0}

    def gather(self, tasks):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(self.pids[0], signal.SIGKILL)
        return real(self, tasks)

    monkeypatch.setattr(W.LocalWorkers, "gather", gather)
    disturbed = GPClassifier(**params).fit(X[:800], y[:800])
    assert pools[-1].restarts == 1
    assert_same_model(disturbed, undisturbed, X_test)


# -- no process left behind ------------------------------------------------------------------------------

def test_no_worker_is_left_after_an_error_or_max_time(banana, monkeypatch, pools):
    """An exception in the training loop (here: the driver's third round) and a fit that ``max_time`` ends
    both leave no worker process and no shared rows behind."""
    X, y, _, _ = banana
    real, rounds = training.Trainer.step, {"n": 0}
    directories = []
    real_share = W.share_rows
    monkeypatch.setattr(W, "share_rows", lambda *a, **k: directories.append(real_share(*a, **k)) or directories[-1])

    def step(self, *args, **kwargs):
        rounds["n"] += 1
        if rounds["n"] == 3:
            raise RuntimeError("a failure in the middle of the fit")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(training.Trainer, "step", step)
    with pytest.raises(RuntimeError, match="a failure in the middle"):
        GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=5, n_jobs=2, local_steps=2).fit(X, y)
    monkeypatch.setattr(training.Trainer, "step", real)
    timed = GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=10**6, n_jobs=2, max_time=3.0,
                         plateau=None).fit(X, y)  # (no stop of its own before the budget)
    assert timed.stopped_by_time_ and timed.n_jobs_ == 2
    assert len(pools) == 2 and all(_gone(pool.pids, 0) for pool in pools)
    assert not any(os.path.exists(rows[0].directory) for rows in directories)


_DRIVER = textwrap.dedent("""
    import signal
    from agpc import GPClassifier, workers
    from agpc.datasets import make_banana
    from agpc.inference import training

    real_step, real_init, real_share = training.Trainer.step, workers.LocalWorkers.__init__, workers.share_rows

    def step(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        print("round", flush=True)
        return out

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        print("workers", *self.pids, flush=True)

    def share(*args, **kwargs):
        rows = real_share(*args, **kwargs)
        print("rows", rows[0].directory, flush=True)
        return rows

    training.Trainer.step, workers.LocalWorkers.__init__, workers.share_rows = step, init, share
    if __name__ == "__main__":
        # Ctrl-C raises KeyboardInterrupt, as in a terminal (a shell starts background jobs with SIGINT ignored,
        # and a child keeps that)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        X, y = make_banana(4000, random_state=0)
        GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=10**6, n_jobs=2, local_steps=2,
                     plateau=None).fit(X, y)  # (no stop of its own before the signal)
""")


@pytest.mark.parametrize("how", ["Ctrl-C", "SIGKILL"])
def test_no_worker_outlives_an_interrupted_or_killed_driver(tmp_path, how):
    """A driver fitting with ``n_jobs=2`` in its own process group, stopped mid-fit: by Ctrl-C (SIGINT to the
    whole group, as a terminal sends it: the workers ignore it, the driver's KeyboardInterrupt ends them), or
    killed outright (SIGKILL to the driver alone: each worker sees its parent gone and leaves, removing the
    shared rows). Either way no worker process and no rows' file remain."""
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, start_new_session=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.split()) for line in driver.stdout], daemon=True).start()
    seen = {}
    try:
        deadline = time.monotonic() + 180
        while seen.get("round", 0) < 2:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            seen[line[0]] = line[1:] if line[0] != "round" else seen.get("round", 0) + 1
        pids = [int(p) for p in seen["workers"]]
        if how == "Ctrl-C":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    if how == "Ctrl-C":
        assert "KeyboardInterrupt" in driver.stderr.read()
    assert _gone(pids)
    deadline = time.monotonic() + GONE_SECONDS
    while os.path.exists(seen["rows"][0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(seen["rows"][0])


# -- never more processes than the cores ------------------------------------------------------------------

def _n_jobs_used(X, y):
    """(a task) the processes a fit asking for two used."""
    return GPClassifier(method="sep", n_inducing=5, batch_size=50, max_iter=1, n_jobs=2, random_state=0).fit(X, y).n_jobs_


@pytest.mark.parametrize("backend", ["threading", "loky"])
def test_a_fit_inside_a_joblib_worker_runs_in_its_own_process(backend):
    """``cross_validate(..., n_jobs=2)`` (joblib, threads or loky's processes, as GridSearchCV runs its fits): each
    fit asked for ``n_jobs=2`` but runs in its own process, the cores being the outer parallelism's."""
    X, y = make_banana(600, random_state=3)
    model = GPClassifier(method="sep", n_inducing=5, batch_size=50, max_iter=1, n_jobs=2, random_state=0)
    with parallel_config(backend=backend):
        fitted = cross_validate(model, X, y, cv=2, n_jobs=2, return_estimator=True)["estimator"]
    assert [m.n_jobs_ for m in fitted] == [1, 1]


def test_a_fit_inside_a_dask_task_runs_in_its_own_process():
    X, y = make_banana(600, random_state=3)
    with local_client(1, processes=False) as client:
        assert client.submit(_n_jobs_used, X, y).result() == 1


def test_n_jobs_means_what_it_means_in_scikit_learn(monkeypatch):
    """None: 1, or an enclosing ``joblib.parallel_config``'s n_jobs; -1 every core this process may use, -2 all
    but one (at least one)."""
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    assert W.resolve_n_jobs(None) == (1, "n_jobs=None")
    with parallel_config(n_jobs=3):
        assert W.resolve_n_jobs(None) == (3, None)
    assert [W.resolve_n_jobs(k)[0] for k in (1, 4, -1, -2, -8, -20)] == [1, 4, 8, 7, 1, 1]


class _NotStarted(Exception):
    """Raised by a stand-in for ``LocalWorkers`` instead of starting processes."""


@pytest.mark.parametrize("cores, n_jobs, batch_size, used, bound", [
    (3, 10000, 20, 3, "3 cores this process may use"),  # 120 rows would give 6 processes a minibatch each
    (8, 12, 50, 2, "120 rows of minibatches of 50"),  # the rows: two minibatches, two processes
    (2, -1, 20, 2, None),  # every core, as many as there are: nothing to say
])
def test_n_jobs_is_capped_by_the_cores_and_the_rows(monkeypatch, cores, n_jobs, batch_size, used, bound):
    """``n_jobs=10000`` on 120 rows started one interpreter a job until the OS refused: the processes are at most
    the cores this process may use and a minibatch of rows each, said once in a warning, recorded in ``n_jobs_``."""
    started = []

    def start(self, count, *args, **kwargs):  # (counted, never started)
        started.append(count)
        raise _NotStarted

    monkeypatch.setattr(W.LocalWorkers, "__init__", start)
    monkeypatch.setattr(threads, "available_cores", lambda: cores)
    X, y = make_banana(120, random_state=0)
    model = GPClassifier(method="sep", batch_size=batch_size, n_inducing=10, max_iter=1, n_jobs=n_jobs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(_NotStarted):
            model.fit(X, y)
    said = [str(w.message) for w in caught if "n_jobs" in str(w.message)]
    assert started == [used] and not hasattr(model, "n_jobs_")  # (a fit that raised leaves the estimator as it was)
    if bound is None:
        assert said == []
    else:
        assert len(said) == 1 and f"training in {used} processes" in said[0] and bound in said[0]
        assert [w.filename for w in caught if "n_jobs" in str(w.message)] == [__file__]  # (the caller's fit)


def test_n_jobs_beyond_the_cores_trains_in_as_many_processes_as_cores(pools):
    """The cap on a real fit: as many processes as cores, the model trained, ``n_jobs_`` saying so."""
    X, y = make_banana(400, random_state=0)
    cores = threads.available_cores()
    with pytest.warns(UserWarning, match=f"training in {min(cores, 8)} process"):
        model = GPClassifier(method="sep", batch_size=50, n_inducing=5, max_iter=1, n_jobs=cores + 3,
                             random_state=0).fit(X, y)
    assert model.n_jobs_ == min(cores, 8) and [len(pool.names) for pool in pools] == [model.n_jobs_] * (cores > 1)
