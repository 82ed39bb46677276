"""A minibatch step with no host synchronisation but its one summary (issue 17, item 3).

A training step (``training.Trainer.step``) is the engine's ``evaluate`` (the pass over the minibatch and the
gradient: device work only, ending in a small summary vector), one transfer of that summary to the host, and
the engine's ``apply`` (the site / factor update and the optimiser's step, given the summary's scalars).

- On any machine (the stand-in namespace; CuPy too): ``evaluate`` and ``apply`` make no host conversion and
  no data-dependent shape (counted by tests/array_counting.py), and the split step is ``Trainer.step``.
- On CuPy (a real one with CUDA, the mocked one of tests/cupy_mock.py elsewhere): a whole ``Trainer.step`` makes
  exactly one synchronisation, counted on CuPy's own paths to the host (tests/cupy_syncs.py: ``ndarray.get``,
  ``float()``, ``bool()``, ``item()``, ``asnumpy``, ``Stream.synchronize``, ``Event.synchronize``); one ``float()``
  more in the step fails the count. (``cupyx.allow_synchronize(False)``, deprecated since CuPy 10, raises only where
  CuPy declares a synchronisation, in ``ndarray.get`` and ``Device.synchronize``: gpu_tests/run_on_gpu.sh records
  what it catches; the count here does not depend on it.)
"""

import contextlib

import numpy as np
import pytest
from cupy_mock import MockCupy
from cupy_syncs import SYNC_PATHS, counting_syncs

from agpc import backend as B
from agpc.inference import engines, training
from agpc.kernels import RBF

N_ROWS, N_FEATURES, N_INDUCING, BATCH = 90, 3, 24, 30
JITTER = 1e-6
METHODS = ("sep", "ep", "adf", "svi")


def step_problem(put, n_rows=N_ROWS, n_inducing=N_INDUCING):
    """(X, y, kernel, Z) of a small seeded problem placed by ``put``: the minibatch steps of these tests and
    of test_step_replay run on it."""
    rng = np.random.default_rng(0)
    X_host = rng.normal(size=(n_rows, N_FEATURES))
    y_host = np.sign(X_host @ np.array([1.0, -0.5, 0.3]) + 0.3 * rng.normal(size=n_rows))
    X, y = put(X_host), put(y_host)
    kernel = RBF(lengthscales=[1.0] * N_FEATURES, amplitude=1.0, noise=0.01).for_inputs(X)
    return X, y, kernel, X[:n_inducing, ...]


def warmed_up_trainer(put, method):
    """A minibatch trainer after one full step on rows 0:BATCH (the optimiser's state exists, every kernel
    the step launches has been compiled). Returns (trainer, X, y)."""
    X, y, kernel, Z = step_problem(put)
    trainer = training.Trainer(engines.make_engine(method, kernel, Z, n_total=N_ROWS, minibatch=True, jitter=JITTER))
    trainer.step(X, y, 0, BATCH, stepping=True)
    return trainer, X, y


def split_step(trainer, X, y, lo, hi, *, around_device_work):
    """``Trainer.step`` by hand: ``evaluate`` and ``apply`` each inside the context ``around_device_work()``
    returns, the summary's one transfer between them. Returns the summary's scalars."""
    engine = trainer.engine
    with around_device_work():
        summary, work = engine.evaluate(X, y, lo, hi, stepping=True)
    scalars = [float(v) for v in B.to_host_vector(summary)]  # the step's one host synchronisation
    with around_device_work():
        engine.apply(work, lo, hi, stepping=True, scalars=scalars)
    return scalars


@pytest.mark.parametrize("method", METHODS)
def test_step_halves_make_no_host_synchronisation(gpu, method):
    """On the device namespace (the stand-in here): ``evaluate`` and ``apply`` convert nothing to the host and
    make no data-dependent shape; the one transfer between them is the step's; the split step is the step."""
    counting = gpu.counting()
    trainer, X, y = warmed_up_trainer(lambda value: gpu.put_counted(counting, value), method)
    tallies = []

    @contextlib.contextmanager
    def counted():
        with counting.counting() as tally:
            tallies.append(tally)
            yield

    scalars = split_step(trainer, X, y, BATCH, 2 * BATCH, around_device_work=counted)
    assert len(tallies) == 2 and all(t.events for t in tallies), "the counting namespace saw no operation"
    for half, tally in zip(("evaluate", "apply"), tallies):
        counts = tally.counts()
        assert counts["syncs"] == 0, f"{half}: {counts}\n{tally.report(top=5)}"

    reference, X_ref, y_ref = warmed_up_trainer(lambda value: gpu.put_counted(gpu.counting(), value), method)
    _, _, log_z = reference.step(X_ref, y_ref, BATCH, 2 * BATCH, stepping=True)
    assert scalars[0] == log_z and np.isfinite(log_z)
    np.testing.assert_array_equal(B.to_numpy(trainer.state["Z"]), B.to_numpy(reference.state["Z"]))


def _one_sync_per_step(cupy, trainer, X, y, steps=2):
    """Take ``steps`` minibatch steps of ``trainer`` counting CuPy's synchronisations; fail unless each step made
    exactly one (its summary's transfer). Returns the count. The steps take the batches after the warm-up's, each
    once, as an epoch does: minibatch EP rebuilds its site product exactly (a checked Cholesky) when a batch comes
    round again before the epoch's end (``ep.Anchor``), which test_fit_on_device counts once an epoch."""
    assert (steps + 1) * BATCH <= N_ROWS
    with counting_syncs(cupy) as syncs:
        for k in range(steps):
            lo = (k + 1) * BATCH
            took, _, _ = trainer.step(X, y, lo, lo + BATCH, stepping=True)
            assert took
    assert syncs.count == steps, f"{syncs.count} synchronisations in {steps} steps:\n{syncs.report()}"
    return syncs


def test_the_counted_paths_are_the_ones_a_step_could_use():
    counted = {f"{owner}.{name}" if owner else name for owner, name in SYNC_PATHS}
    assert {"ndarray.get", "ndarray.__float__", "ndarray.__bool__", "ndarray.item", "asnumpy",
            "cuda.Stream.synchronize", "cuda.Event.synchronize"} <= counted


@pytest.mark.parametrize("method", METHODS)
def test_a_step_on_cupy_makes_one_synchronisation(monkeypatch, method):
    mock = MockCupy(monkeypatch)
    trainer, X, y = warmed_up_trainer(mock.put, method)
    syncs = _one_sync_per_step(mock.cupy, trainer, X, y)
    assert {path for path, _ in syncs.events} == {"cupy.ndarray.get"}  # the summary, through backend.to_host_vector


def test_one_float_more_in_a_step_fails_the_count(monkeypatch):
    """The count's negative test: a ``float()`` of a device value injected into the step (here into the engine's
    ``apply``, where a host read would stall the GPU) makes two synchronisations a step, and the check fails."""
    mock = MockCupy(monkeypatch)
    trainer, X, y = warmed_up_trainer(mock.put, "sep")
    engine_apply = trainer.engine.apply

    def apply_with_a_read(work, lo, hi, **options):
        float(trainer.state["Z"][0, 0])
        return engine_apply(work, lo, hi, **options)

    monkeypatch.setattr(trainer.engine, "apply", apply_with_a_read)
    with pytest.raises(AssertionError, match="4 synchronisations in 2 steps"):
        _one_sync_per_step(mock.cupy, trainer, X, y)
    with counting_syncs(mock.cupy) as syncs:
        trainer.step(X, y, BATCH, 2 * BATCH, stepping=True)
    assert "cupy.ndarray.__float__" in syncs.report()


def test_counting_leaves_cupy_as_it_was(monkeypatch):
    mock = MockCupy(monkeypatch)
    before = {(owner, name): vars(getattr(mock.cupy, owner.split(".")[0]) if owner else mock.cupy).get(name)
              for owner, name in SYNC_PATHS if "." not in owner}
    x = mock.put(np.ones(3))
    with counting_syncs(mock.cupy) as syncs:
        x.get()
        mock.cupy.asnumpy(x)
        float(x[0, ...] if x.ndim > 1 else x[0])
        mock.cupy.cuda.Stream().synchronize()
        mock.cupy.cuda.Event().synchronize()
    assert syncs.count == 5
    after = {(owner, name): vars(getattr(mock.cupy, owner.split(".")[0]) if owner else mock.cupy).get(name)
             for owner, name in SYNC_PATHS if "." not in owner}
    assert before == after
    with counting_syncs(mock.cupy) as none:
        pass
    x.get()
    assert none.count == 0


@pytest.mark.cuda
@pytest.mark.parametrize("method", METHODS)
def test_a_step_on_a_gpu_makes_one_synchronisation(method):
    import array_api_compat.cupy as xp
    import cupy

    trainer, X, y = warmed_up_trainer(lambda value: xp.asarray(np.asarray(value)), method)
    _one_sync_per_step(cupy, trainer, X, y)


@pytest.mark.cuda
def test_one_float_more_in_a_step_fails_the_count_on_a_gpu(monkeypatch):
    import array_api_compat.cupy as xp
    import cupy

    trainer, X, y = warmed_up_trainer(lambda value: xp.asarray(np.asarray(value)), "sep")
    engine_apply = trainer.engine.apply
    monkeypatch.setattr(trainer.engine, "apply",
                        lambda work, lo, hi, **options: (float(trainer.state["Z"][0, 0]),
                                                         engine_apply(work, lo, hi, **options))[1])
    with pytest.raises(AssertionError, match="synchronisations in 3 steps"):
        _one_sync_per_step(cupy, trainer, X, y)
