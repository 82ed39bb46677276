"""``n_jobs`` on every path a fit in this process takes (issue 43): minibatch rounds in worker processes
(tests/test_local_workers.py), batch passes over row blocks on ``n_jobs`` threads, and where a path cannot use more
than one worker, ``n_jobs_`` says so with one warning saying why. ``n_jobs=None`` is one core (scikit-learn's
meaning): the fit's BLAS thread rule gets one core, its batch passes one thread."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import warnings
from contextlib import closing

import numpy as np
import pytest
from sklearn.datasets import make_classification

from agpc import GPClassifier, threads
from agpc.inference import blocks
from helpers import binary_toy


@pytest.fixture
def two_idle_cores(monkeypatch):
    """Two cores this process may use, nothing else running on them (the thread rule looks at both), and no BLAS
    thread count set by the caller (an earlier test's process-wide setting would make the fit leave it alone)."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 0.0)
    monkeypatch.setattr(threads, "caller_set_blas_threads", lambda: False)


@pytest.fixture
def pass_threads(monkeypatch):
    """The thread counts of every batch pass's blocks (``blocks.map_blocks``'s workers)."""
    seen = []
    real = blocks.map_blocks

    def spy(function, arguments, workers):
        seen.append(workers)
        return real(function, arguments, workers)

    monkeypatch.setattr(blocks, "map_blocks", spy)
    return seen


def _rows(n=4000, d=6, seed=0):
    return make_classification(n, d, n_informative=3, random_state=seed)


def _fits_on_one_and_two_jobs(X, y, pass_threads):
    """(the fit with n_jobs=None, the fit with n_jobs=2), checked: their passes on one and on two threads, n_jobs_
    saying so, and the same model up to the order of the blocks' sums."""
    one = GPClassifier(n_inducing=50, max_iter=3, random_state=0).fit(X, y)
    assert one.n_jobs_ == 1 and set(pass_threads) == {1}
    pass_threads.clear()
    two = GPClassifier(n_inducing=50, max_iter=3, random_state=0, n_jobs=2).fit(X, y)
    assert two.n_jobs_ == 2 and set(pass_threads) == {2}
    np.testing.assert_allclose(two.predict_proba(X), one.predict_proba(X), rtol=1e-8, atol=1e-10)
    return one, two


def test_batch_ep_spreads_its_blocks_over_n_jobs_threads(two_idle_cores, pass_threads):
    """Batch EP with n_jobs=2 runs every pass's blocks on two threads, with one on one thread; the two fits give the
    same model up to the order of the blocks' sums (the blocks are split, not the arithmetic)."""
    X, y = _rows()
    one, two = _fits_on_one_and_two_jobs(X, y, pass_threads)
    assert abs(two.log_marginal_likelihood_ - one.log_marginal_likelihood_) < 1e-8 * abs(one.log_marginal_likelihood_)


def test_a_pass_smaller_than_a_block_is_split_among_the_threads(two_idle_cores):
    """``pass_layout``: a pass of fewer rows than one default block is split in as many blocks as threads, none
    below ``MIN_THREAD_ROWS`` rows; the threads are those of the BLAS scope (one outside any)."""
    Z = np.zeros((100, 4))
    with threads.blas_threads(4000, 100, n_features=4, cores=2):
        assert blocks.pass_layout(Z, 4000) == (2000, 2)
        assert blocks.pass_layout(Z, blocks.MIN_THREAD_ROWS + 1) == (blocks.MIN_THREAD_ROWS + 1, 1)
    with threads.blas_threads(4000, 100, n_features=4, cores=1):
        assert blocks.pass_layout(Z, 4000) == (4000, 1)


@pytest.mark.parametrize("workers", [2, 3])
def test_every_thread_of_a_pass_takes_as_many_rows(workers, monkeypatch):
    """``pass_layout`` with several threads: blocks of equal rows (the last fewer by less than one a block), as many
    as a multiple of the threads where that leaves them equal, so that the threads, taking the blocks in turn, take
    as many rows to within one block; none larger than the one-thread block shared among the threads (the memory the
    blocks in flight hold). Satellite's multiclass pass (5,792 rows, 6 classes, m = 100) was four blocks of 1,748,
    1,748, 1,748 and 548 rows on two threads: one thread took 3,496 rows, the other 2,296."""
    monkeypatch.setattr(blocks, "block_workers", lambda like, count: min(workers, count) if count > 1 else 1)
    satellite = np.zeros((6, 100, 36))
    assert blocks.pass_layout(satellite, 5792, blocks.default_block_rows(satellite, 5792)) == (
        {2: 1448, 3: 966}[workers], workers)
    for n, block_rows in [(5792, 3495), (5213, 3495), (45_000, 20_971), (18_000, None), (1_000_003, 4096),
                          (3000, 700), (2 * blocks.MIN_THREAD_ROWS * workers + 1, None), (50_000, 256),
                          (100_000, 300)]:
        rows, threads_taken = blocks.pass_layout(np.zeros((100, 20)), n, block_rows)
        assert threads_taken == workers
        sizes = [hi - lo for lo, hi in blocks.row_blocks(n, rows)]
        assert sum(sizes) == n and len(sizes) >= workers and max(sizes) - min(sizes) < len(sizes), sizes
        if rows * rows >= n:  # (blocks not small against the rows: as many as a multiple of the threads)
            assert len(sizes) % workers == 0, (n, block_rows, sizes)
        per_thread = [sum(sizes[t::workers]) for t in range(workers)]
        assert max(per_thread) - min(per_thread) <= rows, (n, block_rows, per_thread)
        one_thread = min(n, block_rows or blocks.default_block_rows(np.zeros((100, 20)), n))
        assert rows <= -(-one_thread // workers)


def _within(seconds, work):
    """``work()``'s value, or a test failure if it has not returned after ``seconds`` (a pass that deadlocks)."""
    result = []
    runner = threading.Thread(target=lambda: result.append(work()), daemon=True)
    runner.start()
    runner.join(seconds)
    if runner.is_alive():
        pytest.fail(f"did not return within {seconds} s")
    return result[0]


def test_passes_run_on_kept_threads_and_end_with_their_blocks():
    """``map_blocks``'s threads are kept from pass to pass (starting two a pass cost 0-7% of the time of fits with
    n_jobs = 2), one pool, of the last pass's size; a pass that finds it in use (started inside a block, whose pool
    is busy with the blocks that wait for it, or by another Python thread while a pass runs) runs on threads of its
    own; a pass that fails ends only when its running blocks have ended, its queued ones not started."""
    def the_thread(*_):
        time.sleep(0.01)
        return threading.current_thread()

    def run(workers=2, function=the_thread, items=6):
        with closing(blocks.map_blocks(function, [(i,) for i in range(items)], workers)) as results:
            return [value for _, value in results]

    first, second = run(), run()  # (the thread objects stay alive: their ids are not reused meanwhile)
    assert {id(t) for t in first} == {id(t) for t in second} and len({id(t) for t in first}) == 2
    three = run(workers=3)
    assert len({id(t) for t in three}) == 3 and not {id(t) for t in three} & {id(t) for t in first}
    for t in first:  # (the pool of two ended when the pass of three took its place)
        t.join(10)
    assert not any(t.is_alive() for t in first)
    nested = _within(30, lambda: run(function=lambda i: run(items=2), items=2))
    assert all(t.name.startswith("agpc-block-own") for inner in nested for t in inner)
    # a pass of another Python thread while one runs: a block of the running pass starts it and waits for it
    other = _within(30, lambda: run(function=lambda i: _within(20, run), items=2))
    assert all(t.name.startswith("agpc-block-own") for inner in other for t in inner)
    started, finished = [], []

    def fails_first(i):
        started.append(i)
        if i == 0:
            raise RuntimeError("block 0")
        time.sleep(0.2)
        finished.append(i)

    kept = {id(t) for t in run()}
    with pytest.raises(RuntimeError, match="block 0"):
        run(function=fails_first, items=8)
    assert sorted(finished) == sorted(i for i in started if i) and len(started) < 8
    assert {id(t) for t in run()} == kept  # (the failed pass gave the kept pool back)
    with closing(blocks.map_blocks(the_thread, [(i,) for i in range(6)], 2)) as results:
        next(results)  # (a consumer that stops early)
    assert {id(t) for t in run()} == kept


def test_a_forked_child_starts_pool_threads_of_its_own():
    """The kept threads do not exist in a forked child (``os.register_at_fork``): its passes start their own."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")

    def a_pass():
        with closing(blocks.map_blocks(lambda i: i * i, [(i,) for i in range(5)], 2)) as results:
            return [value for _, value in results]

    def kept_in_child():
        with closing(blocks.map_blocks(lambda i: threading.current_thread().name, [(i,) for i in range(4)],
                                       2)) as results:
            names = [value for _, value in results]
        os._exit(0 if a_pass() == [0, 1, 4, 9, 16] and all(n.startswith("agpc-block_") for n in names) else 3)

    assert a_pass() == [0, 1, 4, 9, 16]  # (the parent's pool exists)
    release = threading.Event()
    # a pass of another thread holds the kept pool while the process forks: the child's passes take a kept pool of
    # their own all the same (the parent's lock is not the child's)
    holder = threading.Thread(target=lambda: list(blocks.map_blocks(lambda i: release.wait(30), [(0,), (1,)], 2)))
    holder.start()
    try:
        for _ in range(500):
            if blocks._KEPT_IN_USE.locked():
                break
            time.sleep(0.01)
        child = multiprocessing.get_context("fork").Process(target=kept_in_child)
        child.start()
        child.join(60)
    finally:
        release.set()
        holder.join(30)
    if child.is_alive():
        child.kill()
        pytest.fail("a pass in a forked child hung on the parent's pool")
    assert child.exitcode == 0


@pytest.mark.parametrize("method", ["gfitc", "vi-jj", "sep"])
def test_batch_only_methods_take_n_jobs_as_the_cores_of_their_passes(two_idle_cores, method):
    """Methods without data-parallel rounds (GFITC, the vi-* methods) and SEP's batch fit take n_jobs=2: their
    batch passes run under a BLAS thread rule of two cores, and ``n_jobs_`` is 2 (it was a ValueError)."""
    X, y = _rows(600)
    counts = []
    real = threads._rule
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "_rule", lambda *a: counts.append(a[-1]) or real(*a))
        model = GPClassifier(method=method, n_inducing=10, max_iter=2, random_state=0, n_jobs=2).fit(X, y)
    assert model.n_jobs_ == 2 and counts and set(counts) == {2}


def test_more_jobs_than_cores_is_said_once_and_recorded(two_idle_cores):
    X, y = _rows(600)
    said = r"n_jobs=8: batch passes on 2 threads \(2 cores this process may use\)"
    with pytest.warns(UserWarning, match=said) as got:
        model = GPClassifier(n_inducing=10, max_iter=1, random_state=0, n_jobs=8).fit(X, y)
    assert model.n_jobs_ == 2 and sum("n_jobs=8" in str(w.message) for w in got) == 1
    assert [w.filename for w in got if "n_jobs=8" in str(w.message)] == [__file__]  # (the caller's fit)


def test_n_jobs_on_another_array_library_is_one_worker_with_a_warning(two_idle_cores):
    """A batch fit on arrays of another library (a GPU's, which spreads the work itself; here array_api_strict)
    cannot use more threads: ``n_jobs_`` is 1 and one warning says why."""
    strict = pytest.importorskip("array_api_strict")
    X, y = _rows(300)
    said = r"n_jobs=2: a batch pass on array_api_strict arrays runs on their device"
    with pytest.warns(UserWarning, match=said) as got:
        model = GPClassifier(n_inducing=10, max_iter=1, random_state=0, n_jobs=2, backend=strict).fit(X, y)
    assert model.n_jobs_ == 1
    assert [w.filename for w in got if "n_jobs=2" in str(w.message)] == [__file__]  # (the caller's fit)


def test_n_jobs_none_is_one_core_for_the_fit(two_idle_cores):
    """n_jobs=None (scikit-learn's default: one) gives the fit's BLAS thread rule one core, whatever the work."""
    budgets = []
    real = threads._rule
    X, y = _rows(4000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "_rule", lambda *a: budgets.append(a[-1]) or real(*a))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no warning: nothing was asked that the fit does not do)
            GPClassifier(n_inducing=50, max_iter=1, random_state=0).fit(X, y)
    assert budgets and set(budgets) == {1}


@pytest.mark.parametrize("method, classes", [("sep", 2), ("adf", 2), ("ep", 3), ("sep", 3), ("svi", 2), ("svi", 3),
                                             ("gfitc", 2), ("gfitc", 3), ("vi-jj", 2), ("vi-taylor", 2)])
def test_every_batch_sweep_spreads_its_blocks_over_n_jobs_threads(two_idle_cores, pass_threads, method, classes):
    """SEP / ADF's batch sweeps (``binary_sweep``), the multiclass sweeps (``class_sweep``), SVI's bound (binary and
    multiclass), GFITC's two passes and the vi-* methods' row terms run their blocks on n_jobs threads too, and give
    the model one thread gives on the same blocks (two of 1,500 rows: the threads take a block each), up to round-off:
    on other blocks the sums' order differs, which vi-*'s L-BFGS-B rounds carry to 1e-7 in three steps. (SVI, GFITC
    and vi-* ran their passes on two BLAS threads before 2026-12-04: numpy's and scipy's OpenBLAS, each with a thread
    spinning between its calls, made their n_jobs=2 fits of 20,000 airline rows 1.4-1.8 times as long as with one.)"""
    X, y = make_classification(3000, 6, n_informative=4, n_classes=classes, n_clusters_per_class=1, random_state=0)
    params = dict(method=method, n_inducing=100, max_iter=3, random_state=0, plateau=None)  # (enough work for two)
    one = GPClassifier(**params, block_rows=1500).fit(X, y)
    assert set(pass_threads) == {1}
    pass_threads.clear()
    two = GPClassifier(**params, n_jobs=2).fit(X, y)
    assert two.n_jobs_ == 2 and 2 in pass_threads
    np.testing.assert_allclose(two.predict_proba(X), one.predict_proba(X), rtol=1e-12, atol=1e-14)


def test_n_jobs_spreads_batch_passes_where_the_caller_set_one_blas_thread(monkeypatch, pass_threads):
    """An estimator-API audit (2026-12-02): with OMP_NUM_THREADS=1 set (or inside threadpool_limits(1)) agpc leaves
    the caller's BLAS count alone, and its batch passes took that count as their threads: n_jobs=2 ran every pass on
    one thread, n_jobs_ saying 2, nothing said. The passes take n_jobs threads (each on one BLAS thread, as the
    caller asked); the m x m algebra keeps the caller's count."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 0.0)
    from threadpoolctl import threadpool_limits

    X, y = _rows()
    with threadpool_limits(limits=1, user_api="blas"):
        if not threads.caller_set_blas_threads():
            pytest.skip("the BLAS default is one thread here: a limit of one is no caller's setting")
        _fits_on_one_and_two_jobs(X, y, pass_threads)


def test_row_blocks_cover_every_row_once():
    """``blocks.row_blocks``: the ranges concatenate to exactly range(n), whatever n and the block. A mutation audit
    (2026-12-03): ranges that dropped a last block of one row (n = k * block_rows + 1) passed every test but a crash
    at n = 1, while a fit on 41 rows in blocks of 10 trained on 40 and predicted 40 rows for 41."""
    for n in range(0, 61):
        for step in range(1, 13):
            ranges = blocks.row_blocks(n, step)
            assert [i for lo, hi in ranges for i in range(lo, hi)] == list(range(n))
            assert all(0 < hi - lo <= step for lo, hi in ranges)


def test_a_block_of_one_row_left_over_is_fitted_and_predicted():
    """n = block_rows + 1: the last block holds one row, which the fit trains on and prediction returns (the same
    model and probabilities as in one block)."""
    X, y = binary_toy(41, seed=3)
    settings = dict(n_inducing=8, max_iter=3, random_state=0)
    whole = GPClassifier(**settings).fit(X, y)
    blocked = GPClassifier(block_rows=10, **settings).fit(X, y)
    assert blocked.predict_proba(X).shape == (41, 2)
    np.testing.assert_allclose(blocked.predict_proba(X), whole.predict_proba(X), rtol=0, atol=1e-10)
