"""Batch EP / SEP / ADF on a dask.array over a LocalCluster of two worker processes (Hernandez-Lobato & Hernandez-Lobato
(2016), sec. 2.3): the same per-chunk functions as the single-machine path, so the same numbers."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from agpc import GPClassifier, inputs  # noqa: E402
from agpc.datasets import make_banana  # noqa: E402
from agpc.inference import dask_engine, training, variational  # noqa: E402
from agpc.inference.dask_engine import DaskPasses  # noqa: E402
from agpc.kernels import RBF  # noqa: E402
from helpers import assert_same_model, interrupted_then_resumed, local_client, three_classes  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with local_client(2) as c:
        yield c


@pytest.fixture
def own_client():
    """A 2-worker cluster for one test that kills a worker. On the shared cluster the test had to wait for the
    nanny's restart before the next test, and on a loaded machine the restarted worker sometimes took over 60 s
    to register (WorkerStartTimeoutError), failing a test whose fit had completed."""
    with local_client(2) as c:
        yield c


@pytest.fixture(scope="module")
def data():
    X, y = make_banana(600, random_state=1)
    X_test, _ = make_banana(100, random_state=2)
    return X, y, X_test


@pytest.mark.parametrize("method", ["ep", "sep", "adf"])
def test_dask_fit_equals_numpy_fit(client, data, method):
    """Three chunks of 200 rows: the log Z_q history, the inducing points and the predictions equal the
    NumPy path's to 1e-8 with the same seed; ``predict_proba`` on a dask array is a lazy dask array."""
    X, y, X_test = data
    ref = GPClassifier(method=method, n_inducing=10, max_iter=15, random_state=0).fit(X, y)
    model = GPClassifier(method=method, n_inducing=10, max_iter=15, random_state=0, client=client).fit(
        da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    )
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-8)
    np.testing.assert_allclose(model.inducing_points_, ref.inducing_points_, rtol=1e-8, atol=1e-10)
    lazy = model.predict_proba(da.from_array(X_test, chunks=(30, 2)))
    assert isinstance(lazy, da.Array) and lazy.chunks[0] == (30, 30, 30, 10)
    np.testing.assert_allclose(lazy.compute(), ref.predict_proba(X_test), rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(model.predict(da.from_array(X_test, chunks=(30, 2))).compute(), ref.predict(X_test))


def test_ep_sites_in_files_give_the_same_model(client, data, monkeypatch, tmp_path):
    """``site_directory``: batch EP's sites live in files, a file a chunk, written and read by the chunks'
    tasks. Same numbers as the NumPy path; at most three passes' files exist at a time (the state, the
    state to go back to, the pass being written); none are left after the fit."""
    X, y, X_test = data
    generations = []
    real = dask_engine._tree

    def spy(client_, futures, combine):
        out = real(client_, futures, combine)
        out.result()
        (root,) = os.listdir(tmp_path)
        generations.append({g: len(os.listdir(tmp_path / root / g)) for g in os.listdir(tmp_path / root)})
        return out

    monkeypatch.setattr(dask_engine, "_tree", spy)
    ref = GPClassifier(method="ep", n_inducing=10, max_iter=15, random_state=0).fit(X, y)
    model = GPClassifier(method="ep", n_inducing=10, max_iter=15, random_state=0, client=client,
                         site_directory=tmp_path).fit(da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200))
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-8)
    np.testing.assert_allclose(model.predict_proba(X_test), ref.predict_proba(X_test), rtol=1e-8, atol=1e-12)
    assert max(len(g) for g in generations) == 3 and "pass-24" in generations[-1]  # 25 sweeps written
    assert {count for g in generations for count in g.values()} == {3}  # a file a chunk
    assert os.listdir(tmp_path) == []


def test_ep_sites_stay_on_the_workers(client, data, monkeypatch):
    """EP's per-row sites are dask arrays persisted on the workers; the driver gathers only the chunks'
    reduced (O(m^2)) results: nothing of n rows comes back during fit."""
    X, y, _ = data
    gathered = []
    real = dask_engine._tree

    def spy(client_, futures, combine):
        out = real(client_, futures, combine)
        gathered.append(out)
        return out

    monkeypatch.setattr(dask_engine, "_tree", spy)
    GPClassifier(method="ep", n_inducing=10, max_iter=3, random_state=0, client=client).fit(
        da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    )
    for future in gathered:
        value = future.result()
        arrays = value.values() if isinstance(value, dict) else value
        for a in arrays:
            if hasattr(a, "shape"):
                assert 600 not in a.shape


def test_dask_input_errors_are_clear(client, data):
    X, y, _ = data
    Xd = da.from_array(X, chunks=(200, 2))
    yd = da.from_array(y, chunks=200)
    with pytest.raises(ValueError, match="vi-jj-hybrid.*one xi per row with L-BFGS-B on the driver"):
        GPClassifier(method="vi-jj-hybrid", client=client).fit(Xd, yd)
    with pytest.raises(ValueError, match="checkpoints of 'vi-taylor' on a dask array are not supported yet"):
        GPClassifier(method="vi-taylor", client=client, checkpoint_path="x.ckpt", checkpoint_every=1).fit(Xd, yd)
    with pytest.raises(ValueError, match="method 'vi-jj' is batch-only"):  # not "data-parallel training runs ..."
        GPClassifier(method="vi-jj", batch_size=100, client=client).fit(Xd, yd)
    with pytest.raises(ValueError, match="svi on a dask array trains on minibatches"):
        GPClassifier(method="svi", batch_size=None, client=client).fit(Xd, yd)
    bad = X.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        GPClassifier(client=client).fit(da.from_array(bad, chunks=(200, 2)), da.from_array(y, chunks=200))
    fractional = y.astype(np.float64)
    fractional[-1] = 0.5  # (in the last chunk: it was taken as a third class, silently)
    with pytest.raises(ValueError, match=r"y holds labels that are not whole numbers \(\[0\.5\]\)"):
        GPClassifier(client=client).fit(Xd, da.from_array(fractional, chunks=200))


@pytest.mark.parametrize("persisted", [False, True])
def test_dask_label_errors_name_the_rows_as_in_memory(client, data, persisted):
    """A NaN label on a cluster was named by its place among the distinct labels, and labels of two kinds in an
    object array raised NumPy's bare TypeError; now the rows, as a fit in memory names them (chunks of 200 rows)."""
    X, y, _ = data
    Xd = da.from_array(X, chunks=(200, 2))

    def fit(labels):
        yd = da.from_array(labels, chunks=200)
        Xs, ys = client.persist([Xd, yd]) if persisted else (Xd, yd)
        GPClassifier(n_inducing=5, max_iter=1, client=client).fit(Xs, ys)

    with pytest.raises(ValueError, match=r"y has missing labels \(NaN\) at row 517:"):
        fit(np.where(np.arange(len(y)) == 517, np.nan, y))
    with pytest.raises(ValueError, match=r"y has missing labels \(None\) at row 3:"):
        fit(np.array([None if i == 3 else int(v) for i, v in enumerate(y)], dtype=object))
    with pytest.raises(ValueError, match=r"y mixes kinds of labels \(number at row 200, str at row 201\)"):
        fit(np.array([("no" if i % 2 else 1) if i >= 200 else int(v) for i, v in enumerate(y)], dtype=object))
    with pytest.raises(ValueError, match=r"y mixes kinds of labels \(number in rows 0\.\.199, str in rows "
                                         r"200\.\.399\)"):
        fit(np.array([int(v) if i < 200 else str(v) for i, v in enumerate(y)], dtype=object))


def test_a_column_of_labels_on_a_cluster_or_a_device_is_taken_with_a_warning(client, data):
    """y of shape (n, 1) on a cluster or in another array-API library was refused as "y must be 1-D", where the
    same column in NumPy is taken with scikit-learn's DataConversionWarning: now the same warning and the model of
    the 1-D labels."""
    from sklearn.exceptions import DataConversionWarning

    xp = pytest.importorskip("array_api_strict")
    X, y, _ = data
    Xd = da.from_array(X, chunks=(200, 2))
    model = dict(n_inducing=5, max_iter=2, random_state=0)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        column = GPClassifier(**model, client=client).fit(Xd, da.from_array(y[:, None], chunks=(200, 1)))
    flat = GPClassifier(**model, client=client).fit(Xd, da.from_array(y, chunks=200))
    np.testing.assert_allclose(column.predict_proba(X[:50]), flat.predict_proba(X[:50]), rtol=1e-12, atol=1e-12)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        column = GPClassifier(**model).fit(xp.asarray(X), xp.asarray(y[:, None]))
    flat = GPClassifier(**model).fit(xp.asarray(X), xp.asarray(y))
    np.testing.assert_allclose(np.asarray(column.predict_proba(X[:50])), np.asarray(flat.predict_proba(X[:50])),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["sep", "ep", "svi"])
def test_minibatch_on_dask_samples_chunks_like_data_on_disk(client, data, method, tmp_path):
    """``local_steps=0``: minibatch steps on the driver, which samples chunks: minibatches lie inside the dask
    chunks, an epoch visits the chunks in random order (each moved to the driver once). Same seed, same
    chunks: the same model as the single-machine path reading the rows from a zarr array chunked alike (SVI
    included: on disk it reads a minibatch at a time too)."""
    X, y, X_test = data
    params = dict(method=method, n_inducing=10, batch_size=50, max_iter=3, random_state=0)
    _assert_driver_steps_equal_zarr_chunks(client, params, X, y, X_test, 200, tmp_path)


def _assert_driver_steps_equal_zarr_chunks(client, params, X, y, X_test, chunk_rows, tmp_path):
    """``local_steps=0`` on a dask array chunked by ``chunk_rows`` fits the same model as the single-machine
    path on a zarr array chunked alike (same seed): the same curve and predictions to 1e-10."""
    zarr = pytest.importorskip("zarr")
    Xz = zarr.open(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(chunk_rows, X.shape[1]), dtype="f8")
    yz = zarr.open(str(tmp_path / "y.zarr"), mode="w", shape=y.shape, chunks=(chunk_rows,), dtype=y.dtype)
    Xz[:], yz[:] = X, y
    ref = GPClassifier(**params).fit(Xz, yz)
    model = GPClassifier(**params, client=client, local_steps=0).fit(
        da.from_array(X, chunks=(chunk_rows, X.shape[1])), da.from_array(y, chunks=chunk_rows))
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-10)
    np.testing.assert_allclose(model.predict_proba(X_test), ref.predict_proba(X_test), rtol=1e-10, atol=1e-14)


def test_chunk_order_of_an_epoch():
    chunks = [range(0, 4), range(4, 6), range(6, 9)]
    order = training._epoch_order(np.random.default_rng(0), chunks, shuffle=True)
    assert sorted(order) == list(range(9))
    runs = [next(i for i, c in enumerate(chunks) if b in c) for b in order]
    assert [k for j, k in enumerate(runs) if j == 0 or runs[j - 1] != k] == sorted(set(runs), key=runs.index)
    assert len(set(runs)) == 3  # each chunk's minibatches are visited together, once
    assert training._epoch_order(np.random.default_rng(0), chunks, shuffle=False) == list(range(9))


def _kill_a_worker_during_pass(monkeypatch, client, at_pass):
    """Kill one worker process (SIGKILL) right after a pass's tasks are submitted, once."""
    real = dask_engine._tree
    calls = {"n": 0, "killed": None}

    def tree(client_, futures, combine):
        calls["n"] += 1
        if calls["n"] == at_pass:
            address = sorted(client.scheduler_info()["workers"])[0]
            pid = client.run(os.getpid, workers=[address])[address]
            os.kill(pid, signal.SIGKILL)
            calls["killed"] = address
        return real(client_, futures, combine)

    monkeypatch.setattr(dask_engine, "_tree", tree)
    return calls


@pytest.mark.parametrize("method, in_files", [("ep", False), ("sep", False), ("ep", True)])
def test_a_worker_lost_mid_fit_gives_the_same_model(own_client, data, monkeypatch, tmp_path, method, in_files):
    """A worker process killed in the middle of a pass: the fit completes (the nanny restarts the worker, the
    scheduler recomputes the lost chunks and persisted sites from their lineage, or with ``site_directory``
    from the last pass's files) and the model equals an undisturbed run's."""
    X, y, X_test = data
    client = own_client  # a cluster of its own: the killed worker's restart is not waited for
    params = dict(method=method, n_inducing=10, max_iter=8, random_state=0, client=client,
                  site_directory=tmp_path if in_files else None)
    Xd, yd = da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    undisturbed = GPClassifier(**params).fit(Xd, yd)
    calls = _kill_a_worker_during_pass(monkeypatch, client, at_pass=10)  # EP: 2 passes a step, SEP: 1
    disturbed = GPClassifier(**params).fit(Xd, yd)
    assert calls["killed"] is not None
    assert_same_model(disturbed, undisturbed, X_test)


@pytest.mark.parametrize("method, batch_size, stop_at, in_files", [("ep", None, 12, False), ("sep", 50, 17, False),
                                                                    ("ep", None, 12, True)])
def test_dask_fit_resumes_from_a_checkpoint(client, data, monkeypatch, tmp_path, method, batch_size, stop_at,
                                            in_files):
    """Interrupt + resume=True on a dask array ends at the uninterrupted model. Batch EP's sites are written
    by the workers one file a chunk beside the checkpoint (never gathered); earlier checkpoints' files go.
    With ``site_directory`` the same, and the interrupted fit's pass files are gone too."""
    X, y, X_test = data
    Xd, yd = da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    params = dict(method=method, n_inducing=10, max_iter=3 if batch_size is None else 2, batch_size=batch_size,
                  random_state=0, client=client, site_directory=tmp_path / "sites" if in_files else None,
                  local_steps=0)  # (minibatches: checkpoints are those of the steps on the driver)
    path = tmp_path / "run.ckpt"
    # (batch EP: 13 steps, 10 of them warm-up sweeps: interrupted after step 12, past the warm-up)
    reference, resumed = interrupted_then_resumed(monkeypatch, params, path, stop_at, Xd, yd)
    if method == "ep":  # 13 steps, checkpoints every 4: only the files of the last one (step 12) are kept
        assert os.listdir(str(path) + ".sites") == ["step-12"]
        assert len(os.listdir(str(path) + ".sites/step-12")) == 3
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"],
                               reference.history_["log_marginal_likelihood"], rtol=1e-12)
    np.testing.assert_allclose(resumed.predict_proba(X_test), reference.predict_proba(X_test), rtol=1e-12)
    if in_files:
        assert os.listdir(tmp_path / "sites") == []
    if method == "ep":
        with pytest.raises(ValueError, match="same chunking"):
            GPClassifier(**params, checkpoint_path=path).fit(
                da.from_array(X, chunks=(300, 2)), da.from_array(y, chunks=300), resume=True)
        with pytest.raises(ValueError, match="different training data"):  # same shape, other rows
            GPClassifier(**params, checkpoint_path=path).fit(
                da.from_array(X[::-1], chunks=(200, 2)), da.from_array(y[::-1], chunks=200), resume=True)


@pytest.mark.parametrize("kind", ["jj", "taylor"])
def test_quadratic_bound_on_chunks_equals_in_memory(client, data, kind):
    """vi-JJ / vi-Taylor's bound (Izmailov & Kropotov (2017), eqs. 14, 19) with its two passes a task a chunk: the
    chunks' sums of the quadratic terms give the in-memory value, gradients and q to 1e-10; m_i and S_i stay dask
    arrays."""
    X, y, _ = data
    y = y.astype(float)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    Z = X[:8] + 0.05
    xi = np.random.default_rng(0).uniform(0.1, 2.0, X.shape[0])
    chunks = (250, 200, 150)
    engine = DaskPasses(client, chunks)
    on_chunks = engine.quadratic_bound(kernel, Z, da.from_array(X, chunks=(chunks, 2)), da.from_array(y, chunks=(chunks,)),
                                       da.from_array(xi, chunks=(chunks,)), kind=kind, jitter=1e-6, block_rows=90)
    in_memory = variational.quadratic_bound(kernel, Z, X, y, xi, kind=kind, jitter=1e-6)
    np.testing.assert_allclose(float(on_chunks["value"]), float(in_memory["value"]), rtol=1e-10)
    for name, value in in_memory["grads"].items():
        np.testing.assert_allclose(on_chunks["grads"][name], value, rtol=1e-10, atol=1e-12, err_msg=name)
    for name in ("mean", "var"):
        assert isinstance(on_chunks[name], da.Array) and on_chunks[name].chunks == (chunks,)
        np.testing.assert_allclose(on_chunks[name].compute(), in_memory[name], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(on_chunks["posterior"].h, in_memory["posterior"].h, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method, optimize", [("vi-jj", ("kernel", "inducing")), ("vi-taylor", ("kernel", "inducing")),
                                              ("vi-jj", False)])
def test_vi_fit_on_a_dask_array_equals_the_in_memory_fit(client, data, method, optimize):
    """vi-JJ and vi-Taylor on a dask array (xi on the workers, the driver stepping the kernel and Z with L-BFGS-B
    on the summed bound): the in-memory fit's curve, inducing points and predictions to 1e-10 with the same seed.
    With nothing to optimise, the stop on xi's change is the in-memory fit's too."""
    X, y, X_test = data
    params = dict(method=method, n_inducing=10, max_iter=3, random_state=0, optimize=optimize)
    in_memory = GPClassifier(**params).fit(X, y)
    on_dask = GPClassifier(**params, client=client).fit(da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200))
    np.testing.assert_allclose(on_dask.history_["log_marginal_likelihood"],
                               in_memory.history_["log_marginal_likelihood"], rtol=1e-10)
    np.testing.assert_allclose(on_dask.inducing_points_, in_memory.inducing_points_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(on_dask.predict_proba(X_test), in_memory.predict_proba(X_test), rtol=1e-10)


@pytest.mark.parametrize("method, in_files", [("ep", False), ("ep", True), ("sep", False), ("adf", False)])
def test_multiclass_batch_passes_on_a_dask_array_equal_the_in_memory_fit(client, method, in_files, tmp_path):
    """Multiclass EP / SEP / ADF (Villacampa-Calvo & Hernandez-Lobato 2017) in batch passes on a dask array: a task a
    chunk for the classes' sums (``multiclass_ep.class_site_sums``) and for the sweep (``class_sweep``), added in a
    tree; EP's (n, 2C) sites stay on the workers (in memory, or a file a chunk with ``site_directory``). The in-memory
    fit's curve, inducing points and predictions to 1e-10 with the same seed."""
    X, y = three_classes(450, 0, boundaries="linear", noise=0.5)
    X_test, _ = three_classes(100, 1, boundaries="linear", noise=0.5)
    params = dict(method=method, n_inducing=6, max_iter=3, random_state=0, batch_size=None)
    in_memory = GPClassifier(**params).fit(X, y)
    on_dask = GPClassifier(**params, client=client, site_directory=tmp_path / "sites" if in_files else None).fit(
        da.from_array(X, chunks=(150, 2)), da.from_array(y, chunks=150))
    np.testing.assert_allclose(on_dask.history_["log_marginal_likelihood"],
                               in_memory.history_["log_marginal_likelihood"], rtol=1e-10)
    np.testing.assert_allclose(on_dask.inducing_points_, in_memory.inducing_points_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(on_dask.predict_proba(X_test), in_memory.predict_proba(X_test), rtol=1e-10,
                               atol=1e-14)
    if in_files:
        assert os.listdir(tmp_path / "sites") == []


@pytest.mark.parametrize("method", ["sep", "ep"])
def test_multiclass_minibatch_on_the_driver_samples_chunks_like_data_on_disk(client, method, tmp_path):
    """Multiclass minibatch SEP / EP with ``local_steps=0`` (steps on the driver, chunks brought there in
    turn): the same model as the single-machine path reading the rows from a zarr array chunked alike."""
    X, y = three_classes(450, 0, boundaries="linear", noise=0.5)
    X_test, _ = three_classes(100, 1, boundaries="linear", noise=0.5)
    params = dict(method=method, n_inducing=6, batch_size=50, max_iter=2, random_state=0)
    _assert_driver_steps_equal_zarr_chunks(client, params, X, y, X_test, 150, tmp_path)


def test_multiclass_ep_on_a_dask_array_resumes_from_a_checkpoint(client, monkeypatch, tmp_path):
    """Multiclass batch EP's (n, 2C) sites written by the workers a file a chunk beside the checkpoint and read
    back on resume: the uninterrupted model."""

    X, y = three_classes(450, 0, boundaries="linear", noise=0.5)
    Xd, yd = da.from_array(X, chunks=(150, 2)), da.from_array(y, chunks=150)
    params = dict(method="ep", n_inducing=6, max_iter=3, random_state=0, batch_size=None, client=client)
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", 12, Xd, yd)
    assert os.listdir(str(tmp_path / "run.ckpt") + ".sites") == ["step-12"]
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"],
                               reference.history_["log_marginal_likelihood"], rtol=1e-12)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-12)


@pytest.mark.parametrize("batch_size", [pytest.param(None, id="max_time covers a batch fit on a dask array"),
                                        pytest.param(100, id="max_time covers data-parallel rounds")])
def test_max_time_on_a_dask_array_covers_the_whole_fit(client, data, monkeypatch, batch_size):
    """Issue 25: ``max_time`` bounds the whole fit, from ``fit``'s start, on a dask array too (the dask path once
    passed no start to the training loop, whose budget then began after the input checks and the initialisation of
    the inducing points). A clock that jumps by 100 s inside that initialisation: with max_time=50 the fit stops
    before its first step, and ``init_time_`` (not set on a dask array before) and ``fit_time_`` count the 100 s."""
    X, y, _ = data
    real_clock, jump = time.perf_counter, {"seconds": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + jump["seconds"])
    real_init = GPClassifier._initial_model

    def slow_initialisation(self, *args, **kwargs):
        out = real_init(self, *args, **kwargs)
        jump["seconds"] += 100.0
        return out

    monkeypatch.setattr(GPClassifier, "_initial_model", slow_initialisation)
    Xd, yd = da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    model = GPClassifier(method="sep", n_inducing=5, batch_size=batch_size, max_iter=20, max_time=50.0,
                         random_state=0, client=client).fit(Xd, yd)
    assert model.stopped_by_time_ and model.n_iter_ == 0
    assert model.init_time_ >= 100.0 and model.fit_time_ >= 100.0


def _refusal(fit):
    with pytest.raises(ValueError) as refused:
        fit()
    return str(refused.value)


def test_a_dask_array_is_checked_as_an_array_api_array_is(client, data):
    """The one fit path applies ``agpc.inputs``' checks to a dask array too (the dask path had checks of its own):
    each bad input gets the very message it gets as an array_api_strict array (the checks of arrays that are not
    NumPy's), raised before any training."""
    xp = pytest.importorskip("array_api_strict")
    X, y, _ = data
    nan = X.copy()
    nan[7, 1] = np.nan
    cases = {"3-D X": (X[:, :, None], y), "no rows": (X[:0], y[:0]), "NaN": (nan, y), "y too short": (X, y[:-1]), "2-D y": (X, np.stack([y, y], axis=1)), "one class": (X, 0 * y),
             "a label float32 cannot tell": (X + 1e7, y)}
    for name, (bad_X, bad_y) in cases.items():
        dtype = "float32" if name.startswith("a label float32") else "float64"
        as_array_api = _refusal(lambda: GPClassifier(n_inducing=5, dtype=dtype).fit(xp.asarray(bad_X),
                                                                                     xp.asarray(bad_y)))
        chunks = (200,) + bad_X.shape[1:]
        on_dask = _refusal(lambda: GPClassifier(n_inducing=5, dtype=dtype, client=client).fit(
            da.from_array(bad_X, chunks=chunks), da.from_array(bad_y, chunks=(200,) + bad_y.shape[1:])))
        assert on_dask == as_array_api, name
    assert _refusal(lambda: GPClassifier(client=client).fit(da.from_array(X + 1j, chunks=(200, 2)), da.from_array(
        y, chunks=200))) == "X must be real-valued, got dtype complex128"  # (array_api_strict names its own dtype)


def test_a_sampled_initialisation_on_a_dask_array_equals_the_in_memory_fit(client, data, monkeypatch):
    """More rows than ``inputs.INIT_SAMPLE``: the kernel and the inducing points start from a sample of the rows,
    drawn by one function for every kind of input (``inputs.sample_row_indices``), so a dask fit is the in-memory
    fit (the dask path drew the sample from the training's own generator, which k-means then went on with)."""
    monkeypatch.setattr(inputs, "INIT_SAMPLE", 150)
    X, y, _ = data
    ref = GPClassifier(n_inducing=10, max_iter=5, random_state=3).fit(X, y)
    model = GPClassifier(n_inducing=10, max_iter=5, random_state=3, client=client).fit(
        da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200))
    np.testing.assert_allclose(model.inducing_points_, ref.inducing_points_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-8)


@pytest.mark.parametrize("batch_size", [None, 100])
def test_the_parameters_of_a_dask_fit_are_checked_once(client, data, monkeypatch, batch_size):
    """One fit path: a fit on a dask array (batch passes, data-parallel rounds) checks the parameters once."""
    X, y, _ = data
    real, calls = GPClassifier._check_params, []
    monkeypatch.setattr(GPClassifier, "_check_params", lambda self: calls.append(1) or real(self))
    GPClassifier(method="sep", n_inducing=5, max_iter=1, batch_size=batch_size, local_steps=1, random_state=0,
                 client=client).fit(da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200))
    assert len(calls) == 1


def test_a_script_without_a_main_guard_is_told_what_to_do_in_one_line(tmp_path):
    """A dask fit in a script without ``if __name__ == "__main__":`` started a LocalCluster whose worker processes
    ran the script again, each failing to start a cluster of its own: "Nanny failed to start" after 514 lines of
    tracebacks. Now each worker leaves with one line and the fit's error says what to do."""
    script = tmp_path / "no_guard.py"
    script.write_text(textwrap.dedent("""
        import dask.array as da
        from agpc import GPClassifier
        from agpc.datasets import make_banana
        X, y = make_banana(100, random_state=0)
        GPClassifier(n_inducing=5, max_iter=1).fit(da.from_array(X, chunks=50), da.from_array(y, chunks=50))
    """))
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=300)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(lines) < 60, run.stderr
    assert lines[-1].startswith("RuntimeError: fit on a dask array without a client starts a LocalCluster")
    assert """put the code that fits under 'if __name__ == "__main__":'""" in lines[-1]
