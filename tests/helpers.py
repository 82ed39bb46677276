"""Helpers shared by the test modules: toy data sets, "the same model" for a disturbed fit, the test NLL, CSV
writers, a zarr store with a forged zarr.json, a local dask cluster, a fit interrupted and resumed from its checkpoint. Test modules import them by name
(``from helpers import three_classes``), never from one another."""

import contextlib
import json

import numpy as np
import pytest
from hypothesis import strategies as st

from agpc import GPClassifier, checkpoints
from agpc.datasets import make_banana
from agpc.inference import training
from agpc.likelihoods import negative_log_likelihood
from agpc.plan import FitPlan


# Any JSON value, nested a little: what a crafted model file's header may hold where agpc expects something else.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)


def binary_toy(n=50, seed=1, d=2):
    """n rows of d standard normal features; labels in {-1, +1} across the curved boundary
    sin(2 x_1) + x_2 = 0, with noise of scale 0.3 on the score."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(np.sin(2 * X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def jitter_within_reach(model):
    """Whether a binary model's ``jitter_`` is at most what its fitted K(Z, Z) would take (the guard's reach, a rung
    past ``backend.jitter_ladder``'s top) or the jitter it was configured with: K(Z, Z) is the kernel's, not mostly
    jitter (a raise the guard made for a state that left the kernel's scale, and kept, is not)."""
    from agpc.backend import JITTER_TRIES, jitter_ladder

    K = np.asarray(model.kernel_.K(np.asarray(model.inducing_points_)))
    return model.jitter_ <= max(model.jitter, jitter_ladder(K, JITTER_TRIES + 1)[-1])


def plan_of(estimator):
    """The ``agpc.plan.FitPlan`` a fit of ``estimator`` reads."""
    return FitPlan.of(type(estimator).__name__, estimator.get_params(deep=False))


def three_classes(n=60, seed=0, *, d=2, boundaries="curved", noise=0.3, rng=None):
    """n rows of d standard normal features and labels 0, 1, 2: the argmax of three scores plus normal noise of
    scale ``noise``. "curved" scores (x_1, x_2 - x_1, sin(2 x_2)), "linear" ones (x_1, x_2, -x_1 - x_2). ``rng``
    (a NumPy Generator, which then goes on to the caller's next draws) instead of ``seed``."""
    rng = np.random.default_rng(seed) if rng is None else rng
    X = rng.normal(size=(n, d))
    if boundaries == "linear":
        scores = np.stack([X[:, 0], X[:, 1], -X[:, 0] - X[:, 1]], axis=1)
    else:
        scores = np.stack([X[:, 0], -X[:, 0] + X[:, 1], np.sin(2 * X[:, 1])], axis=1)
    return X, np.argmax(scores + noise * rng.normal(size=scores.shape), axis=1)


def nll_of(model, X, y):
    """The test NLL of a fitted classifier on (X, y), by the library's one NLL function, in float64 (whatever
    the model's dtype)."""
    proba = np.asarray(model.predict_proba(X), dtype=np.float64)
    return float(negative_log_likelihood(np.log(proba), np.searchsorted(model.classes_, y)))


def assert_same_model(disturbed, undisturbed, X_test):
    """A fit a lost worker disturbed ends at the undisturbed model: the same curve, inducing points and
    predictions, to round-off (the chunks' tasks re-run elsewhere on the same data and streams)."""
    np.testing.assert_allclose(disturbed.history_["log_marginal_likelihood"],
                               undisturbed.history_["log_marginal_likelihood"], rtol=1e-12)
    np.testing.assert_allclose(disturbed.inducing_points_, undisturbed.inducing_points_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(disturbed.predict_proba(X_test), undisturbed.predict_proba(X_test), rtol=1e-12)


def write_csv(path, X, y, names=("x1", "x2", "label")):
    """A CSV with a header row: the feature columns at full precision, then the labels as written."""
    with open(path, "w") as fh:
        fh.write(",".join(names) + "\n")
        for row, label in zip(X.tolist(), np.asarray(y).tolist()):
            fh.write(",".join(repr(v) for v in row) + f",{label}\n")
    return path


def write_table(path, columns):
    """A CSV of named columns (values written as given)."""
    names = list(columns)
    with open(path, "w") as fh:
        fh.write(",".join(names) + "\n")
        for row in zip(*(np.asarray(columns[n]).tolist() for n in names)):
            fh.write(",".join(repr(v) if isinstance(v, float) else str(v) for v in row) + "\n")
    return path


@contextlib.contextmanager
def local_client(n_workers=2, processes=True, threads_per_worker=1, **options):
    """A client of a new ``distributed.LocalCluster`` (no dashboard), both closed on leaving; its scheduler's
    address is ``client.scheduler.address``."""
    import distributed

    with distributed.LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=processes,
                                  dashboard_address=None, **options) as cluster, distributed.Client(cluster) as client:
        yield client


class Interrupt(Exception):
    pass


def _interrupt_after(monkeypatch, steps):
    real = training.Trainer.step
    calls = {"n": 0}

    def step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > steps:
            raise Interrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(training.Trainer, "step", step)
    return lambda: monkeypatch.setattr(training.Trainer, "step", real)


def _steps_taken(monkeypatch):
    """The step count before each step a fit takes (failed steps, which the guard puts back, left out)."""
    real = training.Trainer.step
    taken = []

    def step(self, *args, **kwargs):
        before = self.n_steps
        out = real(self, *args, **kwargs)
        if out[0]:
            taken.append(before)
        return out

    monkeypatch.setattr(training.Trainer, "step", step)
    return taken, lambda: monkeypatch.setattr(training.Trainer, "step", real)


def interrupted_then_resumed(monkeypatch, params, path, stop_at, X, y, every=4):
    """(uninterrupted fit, resumed fit): a fit with checkpoints every ``every`` steps, interrupted after ``stop_at``
    steps, then resume=True to the end. It checks that the resume resumed (a fit that ignored the checkpoint and
    started again from scratch would give the same model under the same seed, and pass): the checkpoint holds the
    last multiple of ``every`` steps before the interruption, with steps on the hyper-parameters among them (batch EP,
    SEP and ADF: past the warm-up sweeps), and the resumed fit starts at that step and takes only the steps that
    remain. The callers check that it ends at the uninterrupted model."""
    taken, undo = _steps_taken(monkeypatch)
    reference = GPClassifier(**params).fit(X, y)
    undo()
    interrupted_with_checkpoints(monkeypatch, params, path, stop_at, X, y, every)
    saved = checkpoints.load_checkpoint(path, np.asarray)
    assert saved["n_steps"] == stop_at // every * every < len(taken), (saved["n_steps"], len(taken))
    assert saved["n_updates"] >= 1, "interrupted before any step on the hyper-parameters: their state is not resumed"
    resumed_steps, undo = _steps_taken(monkeypatch)
    resumed = GPClassifier(**params, checkpoint_path=path, checkpoint_every=every).fit(X, y, resume=True)
    undo()
    assert resumed_steps == list(range(saved["n_steps"], len(taken))), (
        f"the resumed fit took steps {resumed_steps[:3]}...{resumed_steps[-1:]}, the checkpoint was written at step "
        f"{saved['n_steps']} of {len(taken)}")
    return reference, resumed


def interrupted_with_checkpoints(monkeypatch, params, path, stop_at, X, y, every=4):
    """A fit of ``params`` with checkpoints at ``path`` every ``every`` steps, interrupted after ``stop_at`` steps."""
    undo = _interrupt_after(monkeypatch, stop_at)
    with pytest.raises(Interrupt):
        GPClassifier(**params, checkpoint_path=path, checkpoint_every=every).fit(X, y)
    undo()


def forged_zarr(tmp_path, rows, field, value):
    """A zarr array of ``rows`` banana rows (float64, chunks of 20) at tmp_path / "forged.zarr" whose zarr.json then
    says ``field``: ``value`` (a forged shape or type); returns (store path, X as written)."""
    zarr = pytest.importorskip("zarr")
    X, _ = make_banana(rows, random_state=0)
    store = tmp_path / "forged.zarr"
    array = zarr.open_array(str(store), mode="w", shape=X.shape, chunks=(20, 2), dtype="f8")
    array[:] = X
    document = json.loads((store / "zarr.json").read_text())
    document[field] = value
    (store / "zarr.json").write_text(json.dumps(document))
    return store, X


def long_double_inverse(M):
    """M^-1 by Gauss-Jordan elimination with partial pivoting, in long double."""
    n = M.shape[0]
    work = np.concatenate([M.astype(np.longdouble), np.eye(n, dtype=np.longdouble)], axis=1)
    for i in range(n):
        pivot = i + int(np.argmax(np.abs(work[i:, i])))
        work[[i, pivot]] = work[[pivot, i]]
        work[i] /= work[i, i]
        for j in range(n):
            if j != i:
                work[j] -= work[j, i] * work[i]
    return work[:, n:]
