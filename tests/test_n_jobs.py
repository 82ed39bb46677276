"""``n_jobs`` on every path a fit in this process takes (issue 43): minibatch rounds in worker processes
(tests/test_local_workers.py), batch passes over row blocks on ``n_jobs`` threads, and where a path cannot use more
than one worker, ``n_jobs_`` says so with one warning saying why. ``n_jobs=None`` is one core (scikit-learn's
meaning): the fit's BLAS thread rule gets one core, its batch passes one thread."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification

from agpc import GPClassifier, threads
from agpc.inference import blocks


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


def test_batch_ep_spreads_its_blocks_over_n_jobs_threads(two_idle_cores, pass_threads):
    """Batch EP with n_jobs=2 runs every pass's blocks on two threads, with one on one thread; the two fits give the
    same model up to the order of the blocks' sums (the blocks are split, not the arithmetic)."""
    X, y = _rows()
    one = GPClassifier(n_inducing=50, max_iter=3, random_state=0).fit(X, y)
    assert one.n_jobs_ == 1 and set(pass_threads) == {1}
    pass_threads.clear()
    two = GPClassifier(n_inducing=50, max_iter=3, random_state=0, n_jobs=2).fit(X, y)
    assert two.n_jobs_ == 2 and set(pass_threads) == {2}
    np.testing.assert_allclose(two.predict_proba(X), one.predict_proba(X), rtol=1e-8, atol=1e-10)
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
    with pytest.warns(UserWarning, match=r"n_jobs=8: batch passes on 2 threads \(2 cores this process may use\)") as got:
        model = GPClassifier(n_inducing=10, max_iter=1, random_state=0, n_jobs=8).fit(X, y)
    assert model.n_jobs_ == 2 and sum("n_jobs=8" in str(w.message) for w in got) == 1


def test_n_jobs_on_another_array_library_is_one_worker_with_a_warning(two_idle_cores):
    """A batch fit on arrays of another library (a GPU's, which spreads the work itself; here array_api_strict)
    cannot use more threads: ``n_jobs_`` is 1 and one warning says why."""
    strict = pytest.importorskip("array_api_strict")
    X, y = _rows(300)
    with pytest.warns(UserWarning, match=r"n_jobs=2: a batch pass on array_api_strict arrays runs on their device"):
        model = GPClassifier(n_inducing=10, max_iter=1, random_state=0, n_jobs=2, backend=strict).fit(X, y)
    assert model.n_jobs_ == 1


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


@pytest.mark.parametrize("method, classes", [("sep", 2), ("adf", 2), ("ep", 3), ("sep", 3)])
def test_every_batch_sweep_spreads_its_blocks_over_n_jobs_threads(two_idle_cores, pass_threads, method, classes):
    """SEP / ADF's batch sweeps (``binary_sweep``) and the multiclass sweeps (``class_sweep``) run their blocks on
    n_jobs threads too, and give the model one thread gives up to the order of the blocks' sums."""
    X, y = make_classification(3000, 6, n_informative=4, n_classes=classes, n_clusters_per_class=1, random_state=0)
    params = dict(method=method, n_inducing=100, max_iter=3, random_state=0, plateau=None)  # (enough work for two)
    one = GPClassifier(**params).fit(X, y)
    assert set(pass_threads) == {1}
    pass_threads.clear()
    two = GPClassifier(**params, n_jobs=2).fit(X, y)
    assert two.n_jobs_ == 2 and 2 in pass_threads
    np.testing.assert_allclose(two.predict_proba(X), one.predict_proba(X), rtol=1e-7, atol=1e-9)
