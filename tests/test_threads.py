"""The BLAS thread rule (agpc.threads): what it chooses, whose choice wins, and that it cleans up.

Most tests run against a fake BLAS library (``FakeBlas``) on a mocked machine, so that they check the
choices for a 64-core machine on any machine and never depend on the real BLAS's state; a few check the
real libraries (restored after a fit, an enclosing ``threadpool_limits`` detected).
"""

import os
import threading
import warnings

import numpy as np
import pytest

from agpc import GPClassifier, threads
from agpc.datasets import make_banana
from agpc.inference import blocks, ep

CORES = 64


class FakeBlas:
    """One BLAS library as threadpoolctl's controllers show it: a thread count, set and read."""

    filepath = "/fake/libopenblas.so"
    user_api = "blas"

    def __init__(self, default):
        self.num_threads = default
        self.set_calls = []

    def set_num_threads(self, count):
        self.set_calls.append(count)
        self.num_threads = count


class FakeController:
    """What ``agpc.threads`` uses of a ``threadpoolctl.ThreadpoolController``: its libraries and ``limit``,
    which sets every library's count and puts the old one back at the end (as threadpoolctl does)."""

    def __init__(self, libraries):
        self.lib_controllers = libraries

    def select(self, *, filepath):
        return FakeController([lib for lib in self.lib_controllers if lib.filepath in filepath])

    def limit(self, *, limits, user_api="blas"):
        assert user_api == "blas"
        controller = self

        class Limiter:
            def __enter__(self):
                self.before = [lib.num_threads for lib in controller.lib_controllers]
                for lib in controller.lib_controllers:
                    lib.set_num_threads(limits)
                return self

            def __exit__(self, *exc):
                for lib, count in zip(controller.lib_controllers, self.before):
                    lib.set_num_threads(count)

        return Limiter()


@pytest.fixture
def machine(monkeypatch):
    """A 64-core machine, idle, with one BLAS library at its default of 64 threads and no thread variable
    in the environment when agpc was imported."""
    blas = FakeBlas(CORES)
    controller = FakeController([blas])
    monkeypatch.setattr(threads, "_libraries", lambda refresh: controller)
    monkeypatch.setattr(threads, "available_cores", lambda: CORES)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 0.0)
    monkeypatch.setitem(threads._defaults, blas.filepath, CORES)
    monkeypatch.setattr(threads, "_environment_at_import", {})  # no thread variable when the BLAS loaded
    return blas


def _record_threads(monkeypatch, blas, name):
    """Wrap ``ep.<name>`` (what a training step calls) to record the library's count at each call."""
    seen = []
    original = getattr(ep, name)

    def recording(*args, **kwargs):
        seen.append(blas.num_threads)
        return original(*args, **kwargs)

    monkeypatch.setattr(ep, name, recording)
    return seen


def _data(n=400):
    X, y = make_banana(n, random_state=0)
    return X, y


# -- the rule -------------------------------------------------------------------------------------------


def test_minibatch_step_on_64_cores_uses_one_or_two_threads(machine):
    """A SEP step of 200 rows is m x m work: one thread at m = 200, two from m ~ 400 (minibatch fits on two cores
    measured faster on two at m = 500, not at 200-300), whatever the cores; more only where m^3 is large (m = 1,000:
    three)."""
    assert threads.choose_blas_threads(200, 200, n_features=8) == 1
    with threads.blas_threads(200, 200, n_features=8) as count:
        assert count == 1 and machine.num_threads == 1
    assert threads.choose_blas_threads(200, 406) == 1 and threads.choose_blas_threads(200, 407) == 2
    with threads.blas_threads(200, 500, n_features=8) as count:
        assert count == 2 and machine.num_threads == 2
    assert machine.num_threads == CORES
    assert threads.choose_blas_threads(200, 1000) == 3
    assert threads.choose_blas_threads(200, 500, cores=1) == 1


def test_m_by_m_algebra_between_threaded_passes_stays_on_one_thread(machine):
    """Between the passes of a batch fit whose row blocks run on Python threads, the m x m algebra keeps one BLAS
    thread up to m ~ 800 (a second one, spinning after its calls, took a pass thread's core: 40 batch EP iterations
    at m = 200 and n_jobs = 2 took 5.6 s against 3.5 s); the pass itself takes every core as its threads."""
    assert threads.choose_blas_threads(500, 500, beside_passes=True) == 1
    assert threads.choose_blas_threads(500, 1000, beside_passes=True) == 3
    with threads.blas_threads(10**5, 500, n_features=8, threaded_passes=True) as count:
        assert count == 1 and machine.num_threads == 1 and threads.pass_workers() == CORES


def test_large_batch_pass_on_64_cores_uses_every_core(machine):
    """A batch EP pass over 10^6 rows, m = 200, in the library's default blocks (2^21 elements): all cores."""
    block_rows = (1 << 21) // 200
    assert threads.choose_blas_threads(10**6, 200, n_features=8, block_rows=block_rows) == CORES
    with threads.blas_threads(10**6, 200, n_features=8, block_rows=block_rows) as count:
        assert count == CORES and machine.num_threads == CORES


def test_rule_never_exceeds_free_cores(machine, monkeypatch):
    """Cores busy with other processes are not asked for: a threaded call would wait for them."""
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: CORES - 3.2)
    assert threads.choose_blas_threads(10**6, 200, n_features=8) == 3
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: float(CORES))
    assert threads.choose_blas_threads(10**6, 200, n_features=8) == 1


def test_rule_grows_with_the_work(machine):
    """More rows per block, or a larger m, never means fewer threads; large m threads even a minibatch."""
    by_rows = [threads.choose_blas_threads(10**6, 200, block_rows=b) for b in (1000, 4000, 16000, 64000)]
    assert by_rows == sorted(by_rows) and by_rows[0] < by_rows[-1]
    by_m = [threads.choose_blas_threads(200, m) for m in (100, 500, 1000, 2000, 4000)]
    assert by_m == sorted(by_m) and by_m[0] == 1 and by_m[-1] > 1


def test_busy_cores_elsewhere_is_a_number_of_cores():
    busy = threads.busy_cores_elsewhere()
    assert 0.0 <= busy <= os.cpu_count() + 0.5  # (a tick of rounding at most)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, threads.MAX_BLAS_THREADS + 1, 2**64])
def test_bad_blas_threads_is_refused(bad):
    X, y = _data(50)
    with pytest.raises(ValueError, match="blas_threads"):
        GPClassifier(n_inducing=5, max_iter=1, blas_threads=bad).fit(X, y)


def test_blas_threads_is_a_parameter():
    assert GPClassifier().get_params()["blas_threads"] is None
    assert GPClassifier(blas_threads=3).get_params()["blas_threads"] == 3


# -- in a fit -------------------------------------------------------------------------------------------


def test_fit_chooses_per_phase_on_64_cores(machine, monkeypatch):
    """Minibatch SEP: every step at one thread. Batch EP over enough rows: its passes' blocks on all the cores with
    n_jobs=-1 (Python threads, as many as blocks of ``MIN_THREAD_ROWS``), on one with n_jobs=None (scikit-learn's
    one). Afterwards the library is back at its default."""
    X, y = _data(400)
    steps = _record_threads(monkeypatch, machine, "evaluate_factor")
    GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=2, random_state=0).fit(X, y)
    assert steps and set(steps) == {1}
    assert machine.num_threads == CORES
    monkeypatch.setattr(threads, "GEMM_FLOPS_PER_THREAD", 1)  # 400 rows x 10 inducing points count as large
    monkeypatch.setattr(blocks, "MIN_THREAD_ROWS", 100)  # ... and make four threads' worth of blocks
    passes = _record_threads(monkeypatch, machine, "evaluate")
    pass_threads = []
    monkeypatch.setattr(blocks, "map_blocks", lambda f, a, workers, real=blocks.map_blocks: pass_threads.append(workers)
                        or real(f, a, workers))
    GPClassifier(method="ep", n_inducing=10, batch_size=None, max_iter=3, random_state=0, n_jobs=-1).fit(X, y)
    # the passes' blocks on as many cores as they have blocks of MIN_THREAD_ROWS, the m x m algebra between them on
    # one BLAS thread
    assert passes and set(passes) == {1} and set(pass_threads) == {4}
    assert machine.num_threads == CORES
    passes.clear()
    pass_threads.clear()
    GPClassifier(method="ep", n_inducing=10, batch_size=None, max_iter=3, random_state=0).fit(X, y)
    assert passes and set(passes) == {1} and set(pass_threads) == {1}
    assert machine.num_threads == CORES


# rows of the work -> the count a fake rule gives it: each phase of a minibatch EP fit on 200 rows in minibatches
# of 50 gets its own, the scope around the fit (one row) another, and the m x m algebra (10 inducing points) between
# the passes of a phase over all rows another (``threads._split``: those passes' blocks on 5 Python threads)
PHASE_ROWS = {"step": 50, "rebuild_factor": 200, "posterior": 200}
FAKE_RULE = {50: 3, 200: 5, 1: 7, 10: 2}


@pytest.mark.parametrize("phase", list(PHASE_ROWS), ids=lambda phase: f"the {phase} phase chooses its own threads")
def test_each_phase_of_a_fit_chooses_its_own_thread_count(machine, monkeypatch, phase):
    """Issue 25: a phase's thread scope (``Trainer.step``, ``rebuild_factor``, ``posterior``) chooses for its own
    shape, not the enclosing scope's: the rule is replaced by one that gives each shape a count of its own (3 for a
    minibatch of 50 rows, 5 for a pass over all 200, 7 for the enclosing scope), and the engine's work in each phase
    must run at its phase's count. With the phase's scope removed it runs at the enclosing 7 (what
    GPClassifier's own fit scope hid: there the fit's main phase and its steps have the same shape). A phase over
    all 200 rows (20 a point of m = 10) spreads its passes' blocks over its count of Python threads and runs the
    BLAS library at the m x m algebra's count (``threads._split``)."""
    from agpc import RBF
    from agpc.inference import engines, training

    monkeypatch.setattr(threads, "choose_blas_threads", lambda rows, m, **_: FAKE_RULE[int(rows)])
    engine_method = {"step": "evaluate", "rebuild_factor": "rebuild_factor", "posterior": "posterior"}[phase]
    seen = []
    original = getattr(engines.EPEngine, engine_method)

    def recording(self, *args, **kwargs):
        seen.append((machine.num_threads, threads.pass_workers()))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(engines.EPEngine, engine_method, recording)
    X, y = _data(200)
    y = np.where(y > 0, 1.0, -1.0)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=1e-3).for_inputs(X)
    with threads.blas_threads(1, 10) as enclosing:
        assert enclosing == 7 and machine.num_threads == 7
        training.fit(X, y, kernel, X[:10].copy(), method="ep", batch_size=PHASE_ROWS["step"], max_iter=2,
                       random_state=0)
    rows = PHASE_ROWS[phase]
    expected = (FAKE_RULE[10], FAKE_RULE[rows]) if rows >= threads.ROWS_PER_INDUCING * 10 else (FAKE_RULE[rows],) * 2
    assert seen and set(seen) == {expected}, (phase, seen)
    assert machine.num_threads == CORES


def test_caller_setting_restored_after_an_exception(machine, monkeypatch):
    def failing(*args, **kwargs):
        assert machine.num_threads == 1  # the step ran under the rule...
        raise RuntimeError("a step failed")

    monkeypatch.setattr(ep, "evaluate_factor", failing)
    X, y = _data(200)
    with pytest.raises(RuntimeError, match="a step failed"):
        GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, random_state=0).fit(X, y)
    assert machine.num_threads == CORES  # ...and the caller's count came back


def test_explicit_parameter_is_used_everywhere(machine, monkeypatch):
    X, y = _data(200)
    steps = _record_threads(monkeypatch, machine, "evaluate_factor")
    GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, blas_threads=7, random_state=0).fit(X, y)
    assert steps and set(steps) == {7}
    assert machine.num_threads == CORES


def test_an_explicit_count_above_the_cores_uses_the_cores_and_says_so(machine, monkeypatch):
    """More BLAS threads than cores take turns (the audit's blas_threads=3 on 2 cores: a 300-row fit 86 s against
    0.3 s): an explicit count is capped at the cores this process may use, in the fit and in prediction, each saying
    so in one UserWarning on the user's line; a count within them is used as it is, unsaid."""
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    X, y = _data(200)
    steps = _record_threads(monkeypatch, machine, "evaluate_factor")
    clf = GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, blas_threads=7, random_state=0)
    with pytest.warns(UserWarning, match=r"blas_threads=7 is more than the 4 cores .*: 4 BLAS threads") as caught:
        clf.fit(X, y)
    assert steps and set(steps) == {4}
    assert [w.filename for w in caught if "blas_threads" in str(w.message)] == [__file__]
    seen = []
    original = ep.predict_latent
    monkeypatch.setattr(ep, "predict_latent", lambda *a, **k: seen.append(machine.num_threads) or original(*a, **k))
    with pytest.warns(UserWarning, match="blas_threads=7 is more than the 4 cores") as caught:
        clf.predict_proba(X)
    assert seen == [4] and [w.filename for w in caught if "blas_threads" in str(w.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, blas_threads=4, random_state=0).fit(X, y)
    assert set(steps) == {4} and machine.num_threads == CORES


def test_a_scope_in_another_thread_does_not_silence_the_explicit_count_warning(machine, monkeypatch):
    """The warning of a count above the cores is said by this thread's outermost scope (``threads.in_scope``: this
    thread's, not any thread's; a mutation audit found "any thread's" passing): a fit while another thread holds a
    scope still says it."""
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    X, y = _data(200)
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with threads.blas_threads(10, 10):
            inside.set()
            leave.wait(30)

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert inside.wait(30)
        with pytest.warns(UserWarning, match="blas_threads=7 is more than the 4 cores"):
            GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, blas_threads=7,
                         random_state=0).fit(X, y)
    finally:
        leave.set()
        other.join(30)


def test_numpys_own_blas_stays_on_one_thread_beside_another(machine, monkeypatch):
    """pip's NumPy and SciPy each ship an OpenBLAS; each keeps a thread spinning a while after its calls, so both on
    several threads fight for the cores (n_jobs=2 made the exact model's fit of 1,500 rows 1.2 times as long as one
    job, its predictions 1.15 times). A count above one goes to the other library (SciPy's, which agpc's fast paths
    call), NumPy's own copy stays on one thread, and both come back after; a library NumPy shares (conda's, a
    system's) takes the count as before (``machine``'s, above)."""
    own = FakeBlas(CORES)
    numpy_home = os.path.dirname(os.path.abspath(np.__file__))
    own.filepath = os.path.join(os.path.dirname(numpy_home), "numpy.libs", "libscipy_openblas64_-x.so")
    monkeypatch.setattr(threads, "_libraries", lambda refresh: FakeController([own, machine]))
    monkeypatch.setitem(threads._defaults, own.filepath, CORES)
    X, y = _data(200)
    seen = []
    original = ep.evaluate_factor
    monkeypatch.setattr(ep, "evaluate_factor", lambda *a, **k: seen.append((own.num_threads, machine.num_threads))
                        or original(*a, **k))
    GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, blas_threads=7, random_state=0).fit(X, y)
    assert seen and set(seen) == {(1, 7)}
    assert (own.num_threads, machine.num_threads) == (CORES, CORES)
    with threads.blas_threads(10, 10, threads=1):  # (one thread: every library)
        assert (own.num_threads, machine.num_threads) == (1, 1)
    assert threads._numpy_private(os.path.join(numpy_home, ".dylibs", "libopenblas.0.dylib"))
    assert not threads._numpy_private(machine.filepath)


def test_enclosing_limit_is_left_alone(machine, monkeypatch):
    """A count other than the library's default is the caller's choice: no step changes it."""
    X, y = _data(200)
    steps = _record_threads(monkeypatch, machine, "evaluate_factor")
    with FakeController([machine]).limit(limits=5, user_api="blas"):
        GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, random_state=0).fit(X, y)
        assert machine.num_threads == 5
    assert steps and set(steps) == {5}
    assert machine.set_calls == [5, CORES]  # the caller's own limit and its end: agpc set nothing


def test_environment_variable_is_left_alone(machine, monkeypatch):
    """OPENBLAS_NUM_THREADS set when agpc was imported (and the library loaded) is the caller's choice too."""
    monkeypatch.setattr(threads, "_environment_at_import", {"OPENBLAS_NUM_THREADS": "64"})
    X, y = _data(200)
    steps = _record_threads(monkeypatch, machine, "evaluate_factor")
    GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, random_state=0).fit(X, y)
    assert steps and set(steps) == {CORES}
    assert machine.set_calls == []


def test_variable_set_after_import_does_not_switch_the_rule_off(machine, monkeypatch):
    """dask's LocalCluster writes OPENBLAS_NUM_THREADS=1 (and friends) into the driver's environment for its
    workers; the driver's loaded BLAS never reads it, so the rule goes on choosing for the driver's steps."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert not threads.caller_set_blas_threads()
    with threads.blas_threads(200, 200) as count:
        assert count == 1 and machine.num_threads == 1


def test_no_environment_variable_is_changed(machine, monkeypatch):
    X, y = _data(200)
    before = dict(os.environ)
    during = []
    original = ep.evaluate_factor
    monkeypatch.setattr(ep, "evaluate_factor", lambda *a, **k: during.append(dict(os.environ)) or original(*a, **k))
    model = GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, random_state=0).fit(X, y)
    model.predict_proba(X)
    assert during and all(env == before for env in during)
    assert dict(os.environ) == before


def test_prediction_uses_the_rule(machine, monkeypatch):
    X, y = _data(200)
    model = GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, random_state=0).fit(X, y)
    monkeypatch.setattr(threads, "GEMM_FLOPS_PER_THREAD", 1)
    seen = _record_threads(monkeypatch, machine, "predict_latent")
    model.predict_proba(X)
    assert seen == [CORES]
    assert machine.num_threads == CORES


def test_scope_in_another_python_thread_changes_nothing(machine):
    """The count is process-wide: while one thread's scope holds it, another thread's scope leaves it."""
    results = []
    with threads.blas_threads(200, 200) as count:
        assert count == 1
        other = threading.Thread(target=lambda: results.append(_enter_and_read(machine)))
        other.start()
        other.join()
        assert machine.num_threads == 1
    assert results == [(None, 1)]
    assert machine.num_threads == CORES


def _enter_and_read(blas):
    with threads.blas_threads(10**6, 200) as count:
        return count, blas.num_threads


def test_dask_task_follows_the_rule_within_its_worker_budget(machine, monkeypatch):
    """In a worker, the BLAS count it was started with is its budget (dask's nanny sets OPENBLAS_NUM_THREADS
    and friends to one thread per worker thread): a task never goes above it, and below it follows the rule.
    The variables there are the worker's configuration, not a caller's limit: the rule still applies."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    monkeypatch.setattr(machine, "num_threads", 8)
    with threads.task_blas_threads(10**6, 200, n_features=8) as count:  # a large chunk: the whole budget
        assert count == 8 and machine.num_threads == 8
    with threads.task_blas_threads(200, 200, n_features=8) as count:  # a small one: one thread
        assert count == 1 and machine.num_threads == 1
    assert machine.num_threads == 8
    monkeypatch.setattr(machine, "num_threads", 1)  # dask's default: one BLAS thread per worker thread
    with threads.task_blas_threads(10**6, 200, n_features=8) as count:
        assert count == 1


def test_tasks_running_at_once_in_one_worker_keep_the_rule_until_the_last_ends(machine, monkeypatch):
    """A worker that runs two tasks at once in two threads (``dask worker --nthreads 2``): the second task joins
    the first's count (one thread for a minibatch step), and the worker's own count (8) comes back only when the
    last task ends, not when the first does while the second still steps."""
    monkeypatch.setattr(machine, "num_threads", 8)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with threads.task_blas_threads(200, 200) as count:
            seen["first"] = (count, machine.num_threads)
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with threads.task_blas_threads(200, 200):
            second_in.set()
            first_out.wait(10)
            seen["second, after the first ended"] = machine.num_threads

    workers = [threading.Thread(target=first), threading.Thread(target=second)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert seen == {"first": (1, 1), "second, after the first ended": 1}
    assert machine.num_threads == 8


def test_a_task_shares_the_workers_budget_with_the_tasks_it_runs_beside(machine, monkeypatch):
    """In a dask worker of 4 threads whose BLAS has 8, a task's budget is 8 / 4 = 2 threads, even for a batch
    pass that would take all 8: four such tasks at once use the 8 the worker was given."""
    distributed = pytest.importorskip("distributed")

    class Worker:
        nthreads = 4

    monkeypatch.setattr(distributed, "get_worker", lambda: Worker())
    monkeypatch.setattr(machine, "num_threads", 8)
    with threads.task_blas_threads(10**6, 200, n_features=8) as count:
        assert count == 2 and machine.num_threads == 2
    assert machine.num_threads == 8


def test_controller_is_built_once_not_per_step(monkeypatch):
    """threadpool_limits would inspect the loaded libraries at every step (~1 ms here); the module builds a
    ThreadpoolController at most once per fit (when modules were imported since the last)."""
    import threadpoolctl

    built = []
    original = threadpoolctl.ThreadpoolController

    class Counting(original):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", Counting)
    X, y = _data(400)
    model = GPClassifier(method="sep", n_inducing=10, batch_size=20, max_iter=2, random_state=0).fit(X, y)
    assert model.n_iter_ == 2  # 40 steps
    assert len(built) <= 1


# -- the real libraries ---------------------------------------------------------------------------------


def _real_counts():
    from threadpoolctl import threadpool_info

    return [(i["filepath"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]


def test_real_libraries_restored_after_fit():
    X, y = _data(400)
    before = _real_counts()
    GPClassifier(method="sep", n_inducing=10, batch_size=50, max_iter=1, random_state=0).fit(X, y)
    GPClassifier(method="ep", n_inducing=10, batch_size=None, max_iter=2, random_state=0).fit(X, y)
    assert _real_counts() == before


def test_real_enclosing_threadpool_limits_detected():
    from threadpoolctl import threadpool_limits

    if threads._environment_at_import:
        pytest.skip("a BLAS thread variable was set at import: every count is the caller's already")
    defaults = {path: count for path, count in _real_counts()}
    if not defaults or all(count == 1 for count in defaults.values()):
        pytest.skip("the BLAS runs one thread by default here: a limit of 1 cannot be told from it")
    assert not threads.caller_set_blas_threads()
    with threadpool_limits(limits=1, user_api="blas"):
        assert threads.caller_set_blas_threads()
        with threads.blas_threads(10**6, 200) as count:
            assert count is None
            assert all(c == 1 for _, c in _real_counts())
