"""Data-parallel minibatch SEP, EP and SVI on a dask.array (issue 18; ``agpc.inference.data_parallel``)."""

import contextlib
import re
import os
import signal
import types
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_info

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from agpc import GPClassifier, dask_inputs, inputs  # noqa: E402
from agpc.backend import host_rng  # noqa: E402
from agpc.datasets import make_banana  # noqa: E402
from agpc.inference import data_parallel, engines, ep, training  # noqa: E402
from agpc.inference.dask_engine import local_cluster, persisted_blocks  # noqa: E402
from agpc.inference.engines import EngineOptions, EPEngine, make_engine  # noqa: E402
from agpc.kernels import RBF  # noqa: E402
from helpers import assert_same_model, jitter_within_reach, local_client, nll_of, three_classes  # noqa: E402

JITTER = 1e-6


@pytest.fixture(scope="module")
def client():
    """Two workers in this process (threads): fast to start; the tests that need processes make their own."""
    with local_client(2, processes=False) as c:
        yield c


@contextlib.contextmanager
def _process_cluster():
    """Two single-threaded worker processes, as ``GPClassifier`` starts them (a cluster per test that kills
    a worker: the nanny's restart is not waited for)."""
    with local_cluster(2) as cluster, distributed.Client(cluster) as c:
        yield c


def test_a_chunk_factor_cavity_is_seps_when_the_factors_are_in_proportion():
    """Distributed SEP (Li et al. 2015 sec. 4): with chunk factors F_c = (n_c / n) F, the cavity of a chunk's
    row, q / F_c^(1 / n_c), is SEP's q / F^(1 / n), so a chunk's pass (its factor, the others' product,
    ``factor_rows`` = n_c) gives SEP's log Z_q estimate, gradient and site change on the same rows."""
    rng = np.random.default_rng(0)
    X, y = make_banana(90, random_state=3)
    y = y.astype(float)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    Z = X[:6] + 0.05
    nu, mu = rng.uniform(0.0, 0.3, 90), rng.normal(0.0, 0.2, 90)
    F = ep.exact_factor(kernel, Z, X, nu, mu, jitter=JITTER)
    rows = np.arange(30, 60)  # the chunk of rows 30:60 (n_c = 30)
    F_chunk = ep.Factor(F.precision * (30 / 90), F.shift * (30 / 90))
    others = F.combine(1.0, F_chunk, -1.0)
    common = dict(cavity="sep", n_total=90, jitter=JITTER)
    sep = ep.evaluate_factor(kernel, Z, X[rows], y[rows], F, **common)
    shard = ep.evaluate_factor(kernel, Z, X[rows], y[rows], F_chunk, others=others, factor_rows=30, **common)
    np.testing.assert_allclose(float(shard["log_z"]), float(sep["log_z"]), rtol=1e-10)
    for name, value in sep["grads"].items():
        np.testing.assert_allclose(shard["grads"][name], value, rtol=1e-8, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(shard["site_delta"].precision, sep["site_delta"].precision, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(shard["site_delta"].shift, sep["site_delta"].shift, rtol=1e-8, atol=1e-12)


class _GradientAscent:
    """theta + rate * gradient: a step linear in the gradient, so that a round's combination of the shards'
    steps can be checked against the combination of their gradients."""

    def __init__(self, rate):
        self.rate = rate

    def step(self, params, grads):
        return {k: v + self.rate * grads[k] for k, v in params.items()}

    def scale_steps(self, factor):
        self.rate *= factor

    def snapshot(self):
        return self.rate

    def restore(self, rate):
        self.rate = rate


def _one_round(client, X, y, chunks, method, kernel, Z, seed, **options):
    plan = data_parallel.DataParallel(client, da.from_array(X, chunks=(chunks, 2)), da.from_array(y, chunks=(chunks,)),
                                      batch_size=40, local_steps=1, seed=seed)
    engine = plan(method, kernel, Z, n_total=X.shape[0], minibatch=True, jitter=JITTER, optimize=("kernel", "inducing"),
                  block_rows=None, **options)
    _, work = engine.evaluate(None, None, 0, plan.rows_per_round, stepping=True)
    engine.apply(work, 0, plan.rows_per_round, stepping=True)
    plan.close()
    return plan, engine


def _first_minibatch(seed, shard, shard_chunks, starts, sizes):
    """By hand, from the documented keys of the streams: the shard's first chunk and its first 40 rows."""
    first = shard_chunks[int(np.random.default_rng([seed, 1, shard, 0]).permutation(len(shard_chunks))[0])]
    order = np.random.default_rng([seed, 0, first, 0]).permutation(sizes[first])
    return first, starts[first] + order[:40]


def test_one_sep_round_steps_on_the_row_weighted_sum_of_the_shards_gradients(client):
    """One round, one local step per shard, a step linear in the gradient: the parameters move by
    rate x sum_k (r_k / r) g_k, g_k shard k's full-data gradient estimate on its minibatch and r_k the rows it
    stepped (40 each here: the average over the round's minibatches); each shard's first chunk gets its factor
    rho x (the minibatch's sites), the other chunks keep theirs, and q's factor is their sum."""
    X, y = make_banana(600, random_state=4)
    y = y.astype(float)
    sizes, starts = [200, 150, 150, 100], [0, 200, 350, 500]  # shards {0, 2} (350 rows) and {1, 3} (250 rows)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    Z = X[:6] + 0.05
    plan, engine = _one_round(client, X, y, tuple(sizes), "sep", kernel, Z, seed=7,
                              optimizer=_GradientAscent(1e-4), damping=0.99)
    uniform = ep.uniform_factor(Z)
    expected = {k: np.asarray(v, dtype=float).copy() for k, v in kernel.params.items()}
    expected["Z"] = Z.copy()
    factors = {}
    for shard, shard_chunks in enumerate([[0, 2], [1, 3]]):
        chunk, batch = _first_minibatch(7, shard, shard_chunks, starts, sizes)
        out = ep.evaluate_factor(kernel, Z, X[batch], y[batch], uniform, cavity="sep", n_total=600, jitter=JITTER,
                                 others=uniform, factor_rows=sizes[chunk])
        for name in expected:
            expected[name] = expected[name] + 1e-4 * (40 / 80) * np.asarray(out["grads"][name])
        factors[chunk] = out["site_delta"].combine(0.99, uniform, 0.0)
    state = engine.state
    for name, value in state["kernel"].params.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-10, atol=1e-13, err_msg=name)
    np.testing.assert_allclose(state["Z"], expected["Z"], rtol=1e-10, atol=1e-13)
    for chunk in range(4):
        want = factors.get(chunk, uniform)
        np.testing.assert_allclose(engine.factors[chunk].precision, want.precision, rtol=1e-10, atol=1e-13)
    total = factors[min(factors)].combine(1.0, factors[max(factors)], 1.0)
    np.testing.assert_allclose(state["factor"].precision, total.precision, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(state["factor"].shift, total.shift, rtol=1e-10, atol=1e-13)


def test_one_svi_round_is_the_row_weighted_average_of_the_shards_steps(client):
    """SVI, Adam: after one round q(u) (mean, chol), the kernel and Z are the average of what one single-process
    step of each shard's minibatch gives (the steps themselves by ``make_engine``), weighted by the rows each
    stepped: 40 and 40, although the shards hold 350 and 250 rows."""
    X, y = make_banana(600, random_state=4)
    y = y.astype(float)
    sizes, starts = [200, 150, 150, 100], [0, 200, 350, 500]
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    Z = X[:6] + 0.05
    plan, engine = _one_round(client, X, y, tuple(sizes), "svi", kernel, Z, seed=3, optimizer=None,
                              learning_rate=None, likelihood="probit", n_quadrature=20)
    ends, weights, optimisers = [], [], []
    for shard, shard_chunks in enumerate([[0, 2], [1, 3]]):
        _, batch = _first_minibatch(3, shard, shard_chunks, starts, sizes)
        alone = make_engine("svi", kernel, Z, n_total=600, minibatch=True, jitter=JITTER)
        summary, work = alone.evaluate(X[batch], y[batch], 0, 40, stepping=True)
        alone.apply(work, 0, 40, stepping=True)
        ends.append(alone.state)
        weights.append(len(batch) / 80)
        optimisers.append(alone.optimizer.snapshot())
    state = engine.state
    for name in ("whitened_mean", "whitened_chol", "Z"):
        want = weights[0] * ends[0][name] + weights[1] * ends[1][name]
        np.testing.assert_allclose(state[name], want, rtol=1e-10, atol=1e-13, err_msg=name)
    for name, value in state["kernel"].params.items():
        want = weights[0] * ends[0]["kernel"].params[name] + weights[1] * ends[1]["kernel"].params[name]
        np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-13, err_msg=name)
    # Adam's moments too (the next round's steps follow from them): the average, not one shard's (a break that
    # took shard 0's optimiser state left every check above passing)
    _, t, m, v = engine.optimizer.snapshot()
    assert t == optimisers[0][1] == optimisers[1][1]
    for got, index in ((m, 2), (v, 3)):
        assert sorted(got) == sorted(optimisers[0][index])
        assert any(not np.allclose(optimisers[0][index][name], optimisers[1][index][name]) for name in got)
        for name, value in got.items():
            want = weights[0] * optimisers[0][index][name] + weights[1] * optimisers[1][index][name]
            np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-14, err_msg=name)


def test_the_measured_speeds_follow_every_round():
    """A shard's speed is an average that halves the weight of older rounds each round (``DataParallel.measure``):
    a worker whose core becomes busy is given fewer steps from the next rounds on. A break that kept the first
    round's speeds passed every test of the balanced rounds (which look at one or two rounds)."""
    plan = types.SimpleNamespace(speeds=[None, None])
    for seconds in ([1.0, 2.0], [2.0, 1.0], [4.0, 1.0]):
        data_parallel.DataParallel.measure(plan, [10, 10], [{"step_seconds": t} for t in seconds])
    assert plan.speeds == [0.5 * (0.5 * (10.0 + 5.0) + 2.5), 0.5 * (0.5 * (5.0 + 10.0) + 10.0)]  # [5, 8.75]
    assert data_parallel.balanced_steps(64, plan.speeds)[1] > data_parallel.balanced_steps(64, [10.0, 5.0])[1]


def test_a_chunk_is_visited_in_a_new_order_of_its_rows_each_time():
    """``chunk_permutation``: the order of a chunk's rows is keyed by the seed, the chunk and the visit, so that each
    visit (an epoch of the chunk) steps on new minibatches, and every worker visiting it draws the same order. A
    break giving the same order on every visit passed the round tests (which take one round)."""
    orders = [data_parallel.chunk_permutation(7, 2, visit, 500) for visit in range(4)]
    assert all(sorted(order.tolist()) == list(range(500)) for order in orders)
    assert len({tuple(order[:40].tolist()) for order in orders}) == 4  # (each visit's first minibatch its own)
    np.testing.assert_array_equal(data_parallel.chunk_permutation(7, 2, 1, 500), orders[1])
    assert not np.array_equal(data_parallel.chunk_permutation(7, 3, 1, 500), orders[1])
    assert not np.array_equal(data_parallel.chunk_permutation(8, 2, 1, 500), orders[1])


def test_balanced_steps_share_a_round_in_proportion_to_speed():
    """A round's steps: one for every shard, the rest in proportion to the speeds (largest remainders first),
    summing to the round's; equal speeds give equal shares."""
    assert data_parallel.balanced_steps(128, [1.0, 1.0]) == [64, 64]
    assert data_parallel.balanced_steps(128, [3.0, 1.0]) == [96, 32]
    assert data_parallel.balanced_steps(8, [3.0, 1.0]) == [6, 2]  # 1 + 4.5 -> 5 (+1, ties to the lower), 1 + 1.5
    assert data_parallel.balanced_steps(10, [100.0, 1.0, 1.0]) == [8, 1, 1]
    assert data_parallel.balanced_steps(2, [5.0, 1.0]) == [1, 1]
    for total, speeds in [(129, [2.0, 1.0, 0.5]), (7, [1.0, 2.0]), (64, [0.0, 0.0])]:
        steps = data_parallel.balanced_steps(total, speeds)
        assert sum(steps) == total and min(steps) >= 1


_SLOWED = {"factor": 1.0, "results": []}  # (module state: the worker threads unpickle the function by reference)


def _slowed_step_shard(spec, segments, data):
    out = _REAL_STEP_SHARD(spec, segments, data)
    shard = 1 if any(c % 2 for c, *_ in segments) else 0  # (shards [0, 2] and [1, 3])
    factor = _SLOWED["factor"] if shard == 1 else 1.0
    out = dict(out, seconds=out["seconds"] * factor, step_seconds=out["step_seconds"] * factor)
    _SLOWED["results"].append((shard, segments, out))
    return out


_REAL_STEP_SHARD = data_parallel.step_shard


def _slowed(monkeypatch, factor):
    """``step_shard`` as the rounds submit it, its shards' results recorded, and shard 1 reporting ``factor``
    times its seconds: a worker whose core is shared with other work."""
    monkeypatch.setitem(_SLOWED, "factor", factor)
    monkeypatch.setitem(_SLOWED, "results", [])
    monkeypatch.setattr(data_parallel, "step_shard", _slowed_step_shard)
    return _SLOWED["results"]


def test_a_slow_worker_gets_fewer_steps_and_the_round_averages_by_rows_stepped(client, monkeypatch):
    """Balanced rounds (local_steps=None): the second round shares its steps by the speeds the first showed, so
    a worker ten times slower gets about a tenth of them and the round does not wait for it; the round's
    state (SVI: q(u), kernel, Z) is the average of the shards' end states weighted by the rows each stepped."""
    X, y = make_banana(1200, random_state=4)
    y = y.astype(float)
    results = _slowed(monkeypatch, 10.0)
    plan = data_parallel.DataParallel(client, da.from_array(X, chunks=(300, 2)), da.from_array(y, chunks=(300,)),
                                      batch_size=20, seed=3)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    engine = plan("svi", kernel, X[:6] + 0.05, n_total=1200, minibatch=True, jitter=JITTER,
                  optimize=("kernel", "inducing"), block_rows=None, optimizer=None, learning_rate=None,
                  likelihood="probit", n_quadrature=20)
    for _ in range(2):
        _, work = engine.evaluate(None, None, 0, 16 * 2 * 20, stepping=True)  # 16 steps a shard on average
        engine.apply(work, 0, 16 * 2 * 20, stepping=True)
    assert plan.rounds[0]["steps"] == [16, 16]
    fast, slow = plan.rounds[1]["steps"]
    # 1 + 30 / 11 = 3.7 steps for the slow worker at equal real speeds; the machine's own noise may move the real
    # speeds, not by a factor of two
    assert fast + slow == 32 and slow <= 7, plan.rounds[1]["steps"]
    last = sorted(results[-2:], key=lambda r: r[0])
    rows = [sum(min(300, (first + count) * 20) - first * 20 for _, _, first, count in segments)
            for _, segments, _ in last]
    assert rows == [20 * fast, 20 * slow]
    for name in ("whitened_mean", "whitened_chol"):
        want = sum(r / sum(rows) * out["state"][name] for r, (_, _, out) in zip(rows, last))
        np.testing.assert_allclose(engine.state[name], want, rtol=1e-10, atol=1e-13, err_msg=name)
    want = sum(r / sum(rows) * out["Z"] for r, (_, _, out) in zip(rows, last))
    np.testing.assert_allclose(engine.state["Z"], want, rtol=1e-10, atol=1e-13)


def test_rounds_of_a_fixed_local_steps_do_not_follow_speeds(client):
    """``local_steps`` given: every shard takes that many steps each round whatever their speeds (the rounds,
    and so the model, are reproducible); without it the steps follow the speeds."""
    X, y = make_banana(800, random_state=4)
    Xd, yd = da.from_array(X, chunks=(200, 2)), da.from_array(y.astype(float), chunks=200)
    fixed = data_parallel.DataParallel(client, Xd, yd, batch_size=20, local_steps=4)
    balanced = data_parallel.DataParallel(client, Xd, yd, batch_size=20)
    for plan in (fixed, balanced):
        assert plan.steps_per_shard(8) == [4, 4]  # (no speeds measured yet: equal shares)
        plan.speeds = [3.0, 1.0]
    assert fixed.steps_per_shard(8) == [4, 4] and balanced.steps_per_shard(8) == [6, 2]


def test_what_a_round_moves_does_not_grow_with_the_rows(client):
    """Only m x m factors and parameter vectors travel: four times the rows in as many chunks, the same
    bytes each way."""
    costs = []
    for n in (400, 1600):
        X, y = make_banana(n, random_state=5)
        y = y.astype(float)
        kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
        plan, _ = _one_round(client, X, y, n // 4, "sep", kernel, X[:6] + 0.05, seed=1, optimizer=None,
                             learning_rate=None, damping=None)
        costs.append((plan.rounds[0]["bytes_sent"], plan.rounds[0]["bytes_received"]))
    assert costs[0] == costs[1]


_BLAS_SEEN = []  # (in a worker process) the BLAS thread count at each minibatch step of a shard


def _record_blas_threads_of_steps():
    """In a worker: record the BLAS thread count while each step evaluates (inside the step's own scope)."""
    real_init = training.Trainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        evaluate = self.engine.evaluate

        def recorded(*a, **k):
            _BLAS_SEEN.append(max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"))
            return evaluate(*a, **k)

        self.engine.evaluate = recorded

    training.Trainer.__init__ = init


def _blas_threads_seen():
    return sorted(set(_BLAS_SEEN)), max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_workers_of_a_users_own_cluster_keep_the_thread_rule_and_the_heap(monkeypatch):
    """A user's own LocalCluster, two worker processes started by dask's nanny with nothing of agpc's: the
    nanny's MALLOC_TRIM_THRESHOLD_=65536 (distributed's default) and, as a user's configuration may have it,
    OPENBLAS_NUM_THREADS=2. A shard's minibatch steps run at one BLAS thread (the rule, within the worker's
    budget of 2) and the worker has its 2 again after the round; the steps' m x m temporaries stay on the heap.
    Minor page faults a step, measured when the test was written: about 600 over a task of four steps (the heap
    growing to its size once a task: the environment's thresholds come back after it), about 5,700 with the
    nanny's setting left alone (each step maps its 320 KB matrices afresh)."""
    import dask

    X, y = make_banana(1600, random_state=8)
    environ = {"MALLOC_TRIM_THRESHOLD_": 65536, "OPENBLAS_NUM_THREADS": 2, "OMP_NUM_THREADS": 2,
               "MKL_NUM_THREADS": 2}
    for name, value in environ.items():  # (the nanny takes a variable this process has over its configuration,
        monkeypatch.setenv(name, str(value))  # and an earlier LocalCluster of this process set them to its own)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with cluster, distributed.Client(cluster) as client:
        client.run(_record_blas_threads_of_steps)
        plan = data_parallel.DataParallel(client, da.from_array(X, chunks=(400, 2)),
                                          da.from_array(y.astype(float), chunks=400), batch_size=200, local_steps=4)
        kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
        engine = plan("sep", kernel, X[::8] + 0.01, n_total=1600, minibatch=True, jitter=JITTER,  # m = 200
                      optimize=("kernel", "inducing"), block_rows=None)
        _, work = engine.evaluate(None, None, 0, plan.rows_per_round, stepping=True)
        engine.apply(work, 0, plan.rows_per_round, stepping=True)
        seen = client.run(_blas_threads_seen)
    assert [counts for counts, _ in seen.values()] == [[1], [1]]  # every step of both shards, one thread
    assert [after for _, after in seen.values()] == [2, 2]
    faults = [f / steps for f, steps in zip(plan.rounds[0]["page_faults"], plan.rounds[0]["steps"])]
    assert max(faults) < 1500, faults


@pytest.fixture(scope="module")
def banana():
    X, y = make_banana(2000, random_state=1)
    X_test, y_test = make_banana(2000, random_state=2)
    return X, y, X_test, y_test


@pytest.mark.parametrize("method, n, epochs, tolerance", [("sep", 2000, 4, 0.005), ("ep", 2000, 4, 0.005),
                                                           ("svi", 1000, 60, 0.01)])
def test_a_data_parallel_fit_ends_near_the_single_process_fit(client, banana, method, n, epochs, tolerance):
    """Two shards, four local steps a round, the same rows seen: the test NLL within ``tolerance`` of the
    single-process fit's. SEP and EP: 0.005 nats, issue 18's target (the single-process fits of three seeds
    spread over 0.002 here). SVI: Adam's constant steps leave more noise, the single-process fits of three
    seeds spread over 0.008 at 30 epochs, so 0.01 is the closest claim this size can test; and averaging
    the shards' steps moves q(u) about half as far per row seen as one process does, so early on it lags
    (measured when the test was written: 0.007-0.012 behind after 15 epochs, level from 30 on; with q stepped in
    whitened coordinates the lag lasts longer: 0.002-0.017 behind at 30 epochs over seeds 0-2 of a 1,000-row banana,
    0.000-0.002 at 60)."""
    X, y, X_test, y_test = banana
    X, y = X[:n], y[:n]
    # (every epoch: the fits are compared after the same number of them)
    params = dict(method=method, n_inducing=15, batch_size=50, max_iter=epochs, random_state=0, plateau=None)
    single = GPClassifier(**params).fit(X, y)
    parallel = GPClassifier(**params, client=client, local_steps=4).fit(da.from_array(X, chunks=(n // 8, 2)),
                                                                         da.from_array(y, chunks=n // 8))
    assert abs(nll_of(parallel, X_test, y_test) - nll_of(single, X_test, y_test)) < tolerance
    # max_iter epochs of rounds of 2 shards x 4 steps x 50 rows
    assert parallel.history_["n_steps"][-1] == epochs * -(-n // (2 * 4 * 50))


@pytest.mark.parametrize("method", ["sep", "ep"])
def test_a_worker_lost_mid_fit_gives_the_same_model(banana, monkeypatch, method):
    """A worker process killed during a round: its shard's task runs again on the other worker with the same
    inputs (the driver's state, the chunk's keyed streams; EP: the chunk's site file of the last round) and
    the fit ends at the undisturbed model, to rounding (1e-12)."""
    X, y, X_test, _ = banana
    X, y = X[:800], y[:800]
    with _process_cluster() as client:
        params = dict(method=method, n_inducing=10, batch_size=50, max_iter=2, random_state=0, client=client,
                      local_steps=2)
        Xd, yd = da.from_array(X, chunks=(100, 2)), da.from_array(y, chunks=100)
        undisturbed = GPClassifier(**params).fit(Xd, yd)
        real, calls = client.gather, {"n": 0, "killed": None}

        def gather(futures, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3 and isinstance(futures, list) and calls["killed"] is None:
                address = sorted(client.scheduler_info()["workers"])[0]
                pid = client.run(os.getpid, workers=[address])[address]
                os.kill(pid, signal.SIGKILL)
                calls["killed"] = address
            return real(futures, *args, **kwargs)

        monkeypatch.setattr(client, "gather", gather)
        disturbed = GPClassifier(**params).fit(Xd, yd)
    assert calls["killed"] is not None
    assert_same_model(disturbed, undisturbed, X_test)


def test_data_parallel_settings_are_checked(client, banana):
    X, y, _, _ = banana
    Xd, yd = da.from_array(X[:400], chunks=(100, 2)), da.from_array(y[:400], chunks=100)
    with pytest.raises(ValueError, match="local_steps must be None or an int in \\[0, inf\\)"):
        GPClassifier(method="sep", batch_size=50, local_steps=-1, client=client).fit(Xd, yd)


def test_ep_site_files_are_removed_after_the_fit(client, banana, tmp_path):
    X, y, _, _ = banana
    Xd, yd = da.from_array(X[:400], chunks=(100, 2)), da.from_array(y[:400], chunks=100)
    GPClassifier(method="ep", n_inducing=8, batch_size=50, max_iter=1, local_steps=2, client=client,
                 site_directory=tmp_path, random_state=0).fit(Xd, yd)
    assert os.listdir(tmp_path) == []


def test_a_dask_fit_says_only_the_place_settings_it_does_not_read(client, banana, tmp_path):
    """client, local_steps and site_directory are said unused for a fit in memory (tests/test_classifier.py); on a
    dask array each is read where its docstring says: the rounds (client, local_steps, site_directory), batch EP's
    passes (client, site_directory) and minibatches on the driver (client, local_steps=0) say nothing. What the
    place does not read is said: local_steps of batch passes, site_directory of minibatches on the driver."""
    X, y, _, _ = banana
    Xd, yd = da.from_array(X[:400], chunks=(100, 2)), da.from_array(y[:400], chunks=100)
    quick = dict(method="ep", n_inducing=8, max_iter=1, random_state=0, client=client)
    for params, unused in [(dict(batch_size=50, local_steps=2, site_directory=tmp_path), []),
                           (dict(batch_size=None, site_directory=tmp_path), []),
                           (dict(batch_size=50, local_steps=0), []),
                           (dict(batch_size=None, local_steps=2), ["local_steps=2"]),
                           (dict(batch_size=50, local_steps=0, site_directory="sites"), ["site_directory='sites'"])]:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            GPClassifier(**quick, **params).fit(Xd, yd)
        assert [str(w.message).split(" is not used: ")[0] for w in said if "is not used" in str(w.message)] == unused


def test_validation_data_on_a_dask_array(client, banana):
    """``validation_data`` (in memory or a dask array, brought to the driver) on a dask fit: batch EP's
    validation history equals the in-memory fit's; data-parallel SEP scores once an epoch and stops early."""
    X, y, X_test, y_test = banana
    X, y = X[:600], y[:600]
    validation = (X_test[:300], y_test[:300])
    params = dict(method="ep", n_inducing=8, max_iter=3, random_state=0)
    ref = GPClassifier(**params).fit(X, y, validation_data=validation)
    model = GPClassifier(**params, client=client).fit(da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200),
                                                      validation_data=tuple(da.from_array(v) for v in validation))
    for key in ("validation_step", "validation_nll", "validation_error"):
        np.testing.assert_allclose(model.history_[key], ref.history_[key], rtol=1e-8, err_msg=key)
    stopped = GPClassifier(method="sep", n_inducing=8, batch_size=50, max_iter=40, local_steps=2, tol=0.5,
                           n_iter_no_change=2, random_state=0, client=client).fit(
        da.from_array(X, chunks=(150, 2)), da.from_array(y, chunks=150), validation_data=validation)
    assert stopped.early_stopped_ and len(stopped.history_["validation_nll"]) == 3  # tol 0.5: no improvement counts


def test_multiclass_sep_on_a_dask_array_ends_near_the_single_process_fit(client):
    """Multiclass SEP (one tied factor per class and chunk), two shards: the test NLL within 0.02 nats of the
    single-process fit's after the same rows (the single-process fits of three seeds spread over 0.03 here,
    4 epochs of 1,200 rows); data-parallel multiclass EP is refused with a clear message (batch passes of
    multiclass EP on a dask array: tests/test_dask.py)."""
    X, y = three_classes(1200, 0, boundaries="linear", noise=0.5)
    X_test, y_test = three_classes(2000, 1, boundaries="linear", noise=0.5)
    params = dict(method="sep", n_inducing=8, batch_size=50, max_iter=4, random_state=0)
    single = GPClassifier(**params).fit(X, y)
    Xd, yd = da.from_array(X, chunks=(150, 2)), da.from_array(y, chunks=150)
    parallel = GPClassifier(**params, client=client, local_steps=4).fit(Xd, yd)
    assert parallel.predict_proba(X_test).shape == (2000, 3)
    assert abs(nll_of(parallel, X_test, y_test) - nll_of(single, X_test, y_test)) < 0.02
    with pytest.raises(ValueError, match="data-parallel multiclass training runs 'sep', 'adf' or 'svi'"):
        GPClassifier(method="ep", batch_size=50, client=client).fit(Xd, yd)


def test_a_reverted_step_in_a_shard_keeps_eps_sites_consistent(monkeypatch, tmp_path):
    """EP in a shard's round holds the sites of the minibatch it steps; when the guard reverts (a NaN log Z
    on the third step that an exact rebuild of the chunk's product, the guard's first remedy, does not remove), the
    step before is undone in the chunk's sites too: the round ends where the single-process loop does on the same
    minibatches (its sites in the chunk's own row order)."""
    X, y = make_banana(120, random_state=6)
    y = y.astype(float)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    Z = X[:6] + 0.05
    options = EngineOptions(jitter=JITTER, optimize=("kernel", "inducing"), site_rows=0)
    real, calls = ep.evaluate_factor, {"n": 0}

    def third_fails(*args, **kwargs):
        calls["n"] += 1
        out = real(*args, **kwargs)
        return dict(out, log_z=out["log_z"] * np.nan) if calls["n"] in (3, 4) else out

    monkeypatch.setattr(ep, "evaluate_factor", third_fails)
    template = EPEngine("ep", kernel, Z, n_total=120, minibatch=True, options=options)
    spec = {"factory": EPEngine, "method": "ep", "options": options, "kernel": kernel, "Z": Z, "n_total": 120, "seed": 5, "batch_size": 40,
            "optimizer": template.optimizer.snapshot(), "damping": template.damping, "total": ep.uniform_factor(Z),
            "state": {}, "factors": {0: ep.uniform_factor(Z)}, "site_files": {0: None},
            "site_directory": str(tmp_path), "generation": 1}
    out = data_parallel.step_shard(spec, [(0, 0, 0, 3)], {0: (X, y)})
    calls["n"] = 0
    order = data_parallel.chunk_permutation(5, 0, 0, 120)
    alone = training.Trainer(engines.make_engine("ep", kernel, Z, n_total=120, minibatch=True, jitter=JITTER))
    steps = [(0, 40), (40, 80), (80, 120)]
    while steps:
        if alone.step(X[order], y[order], *steps[0], stepping=True,
                      repair=lambda: alone.rebuild_factor(X[order], y[order]))[0]:
            steps.pop(0)
    assert calls["n"] == 5  # three steps, the one repaired and retried, and its retry after the revert
    nu, mu = np.load(out["site_files"][0])["site_precision"], np.load(out["site_files"][0])["site_shift"]
    np.testing.assert_allclose(nu[order], alone.state["nu"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(mu[order], alone.state["mu"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out["factors"][0].precision, alone.state["factor"].precision, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(out["Z"], alone.state["Z"], rtol=1e-12)


def test_shards_follow_persisted_chunks_and_share_them_out(client):
    """X persisted on the workers: each worker's shard is its share of the chunks, those it holds first, and its
    tasks are pinned to it. ``da.from_array(X).persist()`` puts every chunk on one worker (they all slice the
    array's one original key): the chunks are shared out all the same, so that both workers train."""
    X, y = make_banana(800, random_state=7)
    Xd = client.persist(da.from_array(X, chunks=(100, 2)))
    plan = data_parallel.DataParallel(client, Xd, da.from_array(y.astype(float), chunks=100), batch_size=50)
    holders = client.who_has(distributed.futures_of(Xd))
    assert len(plan.shards) == 2 and sorted(len(chunks) for chunks in plan.shards) == [4, 4]
    assert sorted(c for chunks in plan.shards for c in chunks) == list(range(8))
    for worker, chunks in zip(plan.shard_workers, plan.shards):
        held = [c for c in range(8) if worker in holders[(Xd.name, c, 0)]]
        assert set(held[:4]) <= set(chunks)  # its own chunks first


def test_shards_of_holders():
    """Each worker's share (C // W, one more for the first C mod W, the larger shares to those holding more), its
    own chunks first, the rest handed to those short of their share in chunk order."""
    share = data_parallel.shards_of_holders
    assert share(["a", "b", "a", "b"], ["a", "b"]) == ([[0, 2], [1, 3]], ["a", "b"])  # spread: as held
    assert share(["a"] * 8, ["a", "b"]) == ([[0, 1, 2, 3], [4, 5, 6, 7]], ["a", "b"])  # on one worker
    assert share(["b", "b", "b", "a", "b"], ["a", "b"]) == ([[3, 4], [0, 1, 2]], ["a", "b"])
    assert share(["a", "a", "c"], ["a", "b", "c"]) == ([[0], [1], [2]], ["a", "b", "c"])
    assert share(["a", "a"], ["a", "b", "c"]) == ([[0], [1]], ["a", "b"])  # fewer chunks than workers


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("method, where", [("sep", "dask"), ("ep", "dask"), ("svi", "dask"), ("sep", "n_jobs")])
def test_data_parallel_fit_resumes_from_a_checkpoint(client, banana, monkeypatch, tmp_path, method, where):
    """Checkpoints of data-parallel rounds (a round is a step of the loop): interrupted after round 7 (the last
    checkpoint at round 4, every 4), resume=True ends at the uninterrupted model to 1e-12 (the same rounds
    replayed from the same state: parameters, optimiser, each chunk's factor, visit count and the shards'
    cursors; EP's site files copied beside the checkpoint, the files of earlier checkpoints removed). On a dask
    cluster and in local worker processes (``n_jobs``: the rows shared again in the same shuffled order). A
    resume with other shards (another chunking, or another number of workers) is refused, naming them."""
    X, y, X_test, _ = banana
    path = tmp_path / "run.ckpt"
    params = dict(method=method, n_inducing=8, batch_size=50, max_iter=3, local_steps=2, random_state=0,
                  site_directory=tmp_path / "sites")
    if where == "dask":
        data = da.from_array(X[:800], chunks=(100, 2)), da.from_array(y[:800], chunks=100)
        params["client"] = client
    else:
        data = X[:800], y[:800]
        params["n_jobs"] = 2
    reference = GPClassifier(**params).fit(*data)
    real, rounds = training.Trainer.step, {"n": 0}

    def step(self, *args, **kwargs):  # counts the driver's rounds (a shard's own steps run a Trainer too)
        if hasattr(self.engine, "plan"):
            rounds["n"] += 1
            if rounds["n"] > 7:
                raise _Interrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(training.Trainer, "step", step)
    with pytest.raises(_Interrupt):
        GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(*data)
    monkeypatch.setattr(training.Trainer, "step", real)
    if method == "ep":
        assert os.listdir(str(path) + ".sites") == ["step-4"]
    resumed = GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(*data, resume=True)
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"],
                               reference.history_["log_marginal_likelihood"], rtol=1e-12)
    np.testing.assert_allclose(resumed.inducing_points_, reference.inducing_points_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(resumed.predict_proba(X_test), reference.predict_proba(X_test), rtol=1e-12)
    if where == "n_jobs":  # (a hostile-input audit, 2026-12-02: the refusal spoke of batch_size and dask only)
        with pytest.raises(ValueError, match=r"minibatches an epoch \(batch_size\): 4 there, 16 here; they change "
                                             r"with batch_size, and with n_jobs"):
            GPClassifier(**dict(params, n_jobs=1), checkpoint_path=path, checkpoint_every=4).fit(*data, resume=True)
    if method == "sep" and where == "dask":  # the same rows in chunks of 200: shards [[0, 2], [1, 3]]
        with pytest.raises(ValueError, match="shards \\(chunks per worker\\) \\[\\[0, 2, 4, 6\\], \\[1, 3, 5, 7\\]\\]"):
            GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(
                da.from_array(X[:800], chunks=(200, 2)), da.from_array(y[:800], chunks=200), resume=True)


def test_a_data_parallel_checkpoint_record_is_checked_before_it_is_used(client, tmp_path):
    """The rounds' record in a checkpoint is read from a file: a site file outside the checkpoint's own
    directory, a cursor naming another shard's chunk or a factor of the wrong shape is one ValueError naming
    the field, before anything is restored."""
    X, y = make_banana(400, random_state=4)
    plan = data_parallel.DataParallel(client, da.from_array(X, chunks=(100, 2)),
                                      da.from_array(y.astype(float), chunks=100), batch_size=50, local_steps=1)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    engine = plan("ep", kernel, X[:6] + 0.05, n_total=400, minibatch=True, jitter=JITTER,
                  optimize=("kernel", "inducing"), block_rows=None)
    path = tmp_path / "run.ckpt"
    saved = engine.checkpoint_state(path, 4)
    record = saved["data_parallel"]
    m_by_m = (np.eye(6), np.zeros(6))
    bad = {"site_files": dict(record, site_files=[str(tmp_path / "elsewhere.npz")] + [None] * 3),
           "cursors[0]": dict(record, cursors=[[0, [1], 0], [0, [], 0]]),
           "factors[2]": dict(record, factors=[m_by_m, m_by_m, (np.eye(5), np.zeros(5)), m_by_m])}
    for field, broken in bad.items():
        with pytest.raises(ValueError, match=f"not a valid agpc checkpoint: engine.data_parallel.{re.escape(field)}"):
            engine.restore_checkpoint(dict(saved, data_parallel=broken), path)
    plan.close()


_IMPORTED = "sorted(name for name in ('dask.array', 'sklearn') if name in __import__('sys').modules)"


def test_a_users_cluster_reads_persisted_rows_with_nothing_to_import(monkeypatch):
    """A user's own LocalCluster whose workers have imported nothing of agpc's, the rows persisted on it. The pass
    before the inducing points are placed (the sample, the labels, the finiteness of every chunk) runs NumPy's own
    functions on the chunks: when it is over the workers have imported neither dask.array (its graph of the same
    checks imported it, ~0.25 s a worker with the driver waiting) nor scikit-learn; and after the fit they have
    still not imported scikit-learn (the labels' encoding task imported it with ``agpc.inputs``: the first round
    waited 0.7 s for it). (``eval``: a builtin, so that asking imports nothing of this module on the workers.)"""
    X, y = make_banana(1200, random_state=5)
    seen = []
    real = dask_inputs.persisted_inputs

    def persisted_inputs(client, *args):
        sample, labels, finite = real(client, *args)
        distributed.wait(finite)
        seen.append(client.run(eval, _IMPORTED))
        return sample, labels, finite

    monkeypatch.setattr(dask_inputs, "persisted_inputs", persisted_inputs)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with cluster, distributed.Client(cluster) as client:
        Xd = client.persist(da.from_array(X, chunks=(300, 2)))
        yd = client.persist(da.from_array(y, chunks=300))
        GPClassifier(method="sep", n_inducing=10, batch_size=100, max_iter=1, local_steps=2).fit(Xd, yd)
        after = client.run(eval, _IMPORTED)
    assert len(seen) == 1 and list(seen[0].values()) == [[], []]
    assert list(after.values()) == [[], []]


def test_persisted_rows_give_the_sample_labels_and_checks_of_the_dask_array(client, monkeypatch):
    """Rows persisted on the cluster (``dask_engine.persisted_blocks``: the array's graph is nothing but its
    chunks' futures) are read without a dask.array graph: the same sampled rows and labels as X[rows] and
    da.unique; a NaN in a row the sample skipped is still refused (once the inducing points are placed), and a
    NaN in the sample before. An array with a task left to run on its chunks is not taken for persisted."""
    X, y = make_banana(900, random_state=6)
    Xd, yd = client.persist(da.from_array(X, chunks=(200, 2))), client.persist(da.from_array(y, chunks=200))
    assert persisted_blocks(Xd + 1) is None and persisted_blocks(da.from_array(X, chunks=(200, 2))) is None
    blocks = persisted_blocks(Xd), persisted_blocks(yd)
    assert [b.key for b in blocks[0]] == [k[0] for k in Xd.__dask_keys__()]
    rows = np.sort(np.random.default_rng(0).choice(900, size=150, replace=False))
    sample, labels, finite = dask_inputs.persisted_inputs(client, *blocks, [(k * 200, min(900, k * 200 + 200))
                                                                             for k in range(5)], rows)
    np.testing.assert_array_equal(sample, X[rows])
    np.testing.assert_array_equal(labels, np.unique(y))
    assert client.gather(finite) == [True] * 5
    monkeypatch.setattr(inputs, "INIT_SAMPLE", 150)
    placed = []
    real = GPClassifier._initial_model
    monkeypatch.setattr(GPClassifier, "_initial_model", lambda self, *a, **k: placed.append(1) or real(self, *a, **k))
    fit_rows = np.sort(host_rng(0).choice(900, size=150, replace=False))  # (the fit's first draw, random_state=0)
    for row, late in ((int(np.setdiff1d(np.arange(900), fit_rows)[0]), True), (int(fit_rows[0]), False)):
        bad = X.copy()
        bad[row, 1] = np.nan
        placed.clear()
        with pytest.raises(ValueError, match="NaN"):
            GPClassifier(method="sep", n_inducing=10, batch_size=100, max_iter=1, local_steps=1, random_state=0,
                         client=client).fit(client.persist(da.from_array(bad, chunks=(200, 2))), yd)
        assert placed == ([1] if late else [])


def test_rounds_on_persisted_rows_run_one_task_a_shard(client):
    """Rows persisted on the cluster: a round's tasks take the chunks' own futures, so a round is one task a shard
    and nothing else, also in the rounds that start a chunk (read through a dask graph, each chunk took a task that
    copied its X and a chain of tasks for its labels, and dask.array imported on every worker)."""
    X, y = make_banana(800, random_state=9)
    Xd = client.persist(da.from_array(X, chunks=(200, 2)))
    yd = client.persist(da.from_array(np.where(y == 1, 1.0, -1.0), chunks=200))
    distributed.wait([Xd, yd])
    plan = data_parallel.DataParallel(client, Xd, yd, batch_size=50, local_steps=2)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    engine = plan("sep", kernel, X[:6] + 0.05, n_total=800, minibatch=True, jitter=JITTER,
                  optimize=("kernel", "inducing"), block_rows=None)
    tasks = []
    for _ in range(3):  # (chunks of 4 minibatches, 2 steps a round: a new chunk every other round)
        with distributed.get_task_stream(client) as stream:
            _, work = engine.evaluate(None, None, 0, plan.rows_per_round, stepping=True)
        engine.apply(work, 0, plan.rows_per_round, stepping=True)
        tasks.append(sorted(str(task["key"]).split("-")[0] for task in stream.data))
    assert tasks == [["step_shard", "step_shard"]] * 3


def test_a_shards_guard_weighs_a_jitter_raise_against_the_rounds_start(client):
    """SEP on a dask array, Adam at learning_rate=1e3 (the careless audit's setting, tests/test_long_runs.py): a
    shard's guard begins each segment at the round's start, which it set as its good state without the kernel a
    jitter raise is weighed against, so a shard's raise was unbounded and the fit ended at jitter_ 6.2e70, every
    probability 0.5 (seed 2). Now the round's start is that kernel too (``Trainer.hold_as_good``). (``local_steps``
    given: equal shares, not the measured speeds', so that the steps, at a rate this careless, are the same in
    every run.)"""
    X, y = make_banana(600, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GPClassifier(method="sep", batch_size=50, optimizer="adam", learning_rate=1e3, n_inducing=10,
                             max_iter=4, random_state=2, client=client, local_steps=6).fit(da.from_array(X, chunks=200),
                                                                             da.from_array(y, chunks=200))
    assert np.all(np.isfinite(model.predict_proba(X)))
    assert jitter_within_reach(model)
