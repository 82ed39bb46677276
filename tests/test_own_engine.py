"""A method with an engine of its own, registered from outside the library: the engine contract
(``agpc.inference.engines.Engine``) and the registry (``agpc.methods``) are enough for it to train, save, load and
resume from a checkpoint, with no change to the training loop, the engines or the estimator."""

import numpy as np
import pytest

from agpc import GPClassifier
from agpc import methods as M
from agpc.datasets import make_banana
from agpc.inference import engines, ep, variational
from helpers import interrupted_then_resumed


class MeanAscent(engines.Engine):
    """A toy engine: plain gradient ascent of SVI's bound (Izmailov & Kropotov (2017), eq. 11) in the whitened mean
    of q alone, q's covariance held at the prior's, the kernel and the inducing points fixed."""

    learning_rate = 0.005

    def __init__(self, name, kernel, Z, *, n_total, minibatch, options, passes=None):
        super().__init__(kernel, Z, names=["whitened_mean"], optimizer=None, n_total=n_total, minibatch=minibatch,
                         jitter=options.jitter, block_rows=options.block_rows)
        self.name = name
        self.state.update(whitened_mean=np.zeros(Z.shape[0]), whitened_chol=np.eye(Z.shape[0]))

    def _bound(self, X, y, want_grad):
        s = self.state
        return variational.svi_elbo(s["kernel"], s["Z"], X, y, s["whitened_mean"], s["whitened_chol"],
                                    jitter=self.jitter, n_total=self.n_total, want_grad=want_grad)

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        elbo, grads = self._bound(X[lo:hi], y[lo:hi], want_grad=True)
        return elbo, grads["whitened_mean"]

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        if stepping:
            self.state["whitened_mean"] = self.state["whitened_mean"] + self.learning_rate * work
        return engines.Outcome(change=None, stepped=stepping, record=True)

    def posterior(self, X, y, want_log_z=True):
        s = self.state
        post = variational.posterior_of(s["kernel"], s["Z"], s["whitened_mean"], s["whitened_chol"],
                                        jitter=self.jitter)
        return post, (float(self._bound(X, y, want_grad=False)[0]) if want_log_z and X is not None else None)

    def validation_scores(self, post, X_val, y_val):
        return ep.validation_scores(self.state["kernel"], self.state["Z"], post, X_val, y_val)

    def checkpoint_state(self, path, step):
        s = self.state
        return {"kernel": dict(s["kernel"].params), "Z": s["Z"], "damping": float(self.damping), "optimizer": None,
                "whitened_mean": s["whitened_mean"]}

    def restore_checkpoint(self, saved, path):
        s = self.state
        s["kernel"] = s["kernel"].with_params(saved["kernel"])
        s["Z"], s["whitened_mean"] = saved["Z"], saved["whitened_mean"]


@pytest.fixture
def mean_ascent():
    method = M.register_method(M.Method("mean-ascent", family="variational", engine=MeanAscent,
                                        capabilities={"validation_data", "checkpoints"}))
    yield method
    M.unregister_method(method.name)


def test_a_method_with_an_engine_of_its_own_trains_saves_loads_and_resumes(mean_ascent, tmp_path, monkeypatch):
    X, y = make_banana(200, random_state=3)
    params = dict(method=mean_ascent.name, n_inducing=6, max_iter=10, random_state=0)
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", 6, X, y)
    history = reference.history_["log_marginal_likelihood"]
    assert reference.n_iter_ == 10 and history[-1] > history[0]  # the bound climbed
    assert reference.score(X, y) > 0.7  # better than chance (about half the labels)
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"], history, rtol=1e-12)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-12, atol=1e-14)
    reference.save(tmp_path / "model.npz")
    loaded = GPClassifier.load(tmp_path / "model.npz")
    assert loaded.method == mean_ascent.name
    np.testing.assert_allclose(loaded.predict_proba(X), reference.predict_proba(X), rtol=1e-12, atol=1e-14)


def test_the_registry_refuses_an_engine_that_is_neither_a_name_nor_a_factory():
    with pytest.raises(ValueError, match="engine must be one of .* or an engine factory"):
        M.Method("broken", family="variational", engine=42)


class RowRecorder(MeanAscent):
    """MeanAscent with a per-row record of its own, under names no agpc module knows: each row's first feature and
    its negative, written as the loop visits the rows (in its shuffled order), declared as its per-row sites."""

    layout = engines.StateLayout(per_row=("seen", "seen_negated"), triangular=("whitened_chol",))

    def __init__(self, name, kernel, Z, *, n_total, minibatch, options, passes=None):
        super().__init__(name, kernel, Z, n_total=n_total, minibatch=minibatch, options=options)
        self.state.update(seen=np.zeros(n_total), seen_negated=np.zeros(n_total))

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        self.state["seen"][lo:hi] = self._rows[lo:hi, 0]
        self.state["seen_negated"][lo:hi] = -self._rows[lo:hi, 0]
        return super().apply(work, lo, hi, stepping=stepping, scalars=scalars)

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        self._rows = X
        return super().evaluate(X, y, lo, hi, stepping=stepping, weights=weights)


def test_the_loop_and_the_result_read_the_state_by_its_declared_layout():
    """``Engine.layout`` is how the loop, the result and the checkpoint rules know an engine's state: per-row entries
    under names of the engine's own come back in the caller's row order after shuffled minibatches (they were
    written in the loop's), as the fit's sites; a checkpoint whose declared triangular entry is not triangular is
    refused."""
    from agpc.checkpoint_rules import check_engine_state
    from agpc.inference import training
    from agpc.inference.engines import EngineOptions
    from agpc.kernels import RBF

    X, y = make_banana(60, random_state=1)
    X = np.column_stack([np.arange(60.0), X[:, 1]])  # the first feature: each row's index in the caller's order
    labels = np.where(y == 1, 1.0, -1.0)
    kernel = RBF(lengthscales=np.full(2, 20.0))
    engine = RowRecorder("rows", kernel, X[:5].copy(), n_total=60, minibatch=True, options=EngineOptions())
    assert engine.per_row_sites and engine.factor is None
    result = training.train(X, labels, engine, training.TrainSettings(batch_size=20, max_iter=2, random_state=0))
    np.testing.assert_array_equal(result.site_precision, np.arange(60.0))
    np.testing.assert_array_equal(result.site_shift, -np.arange(60.0))
    assert not np.array_equal(engine.state["seen"], np.arange(60.0))  # (the loop's order was another)

    saved = dict(engine.checkpoint_state(None, 0), whitened_chol=np.ones((5, 5)))
    refused = []
    with pytest.raises(ValueError, match="whitened_chol"):
        check_engine_state(saved, engine, {"n": 60}, "ckpt", lambda why: refused.append(why) or ValueError(why))
    with pytest.raises(TypeError, match="holds no tied site product"):
        engine.take_factor(None)


def test_an_engine_declaring_its_state_the_former_way_is_refused_when_its_class_is_made():
    """An engine of one's own written before ``StateLayout`` (``triangular_state``, ``checkpoint_flags``, ...) would
    have those declarations ignored and their checks silently not made: its class is refused, naming the fields."""
    with pytest.raises(TypeError, match=r"declares its state by \['checkpoint_flags', 'triangular_state'\].*"
                                        r"checkpoint_flags -> flags, triangular_state -> triangular"):
        type("Former", (MeanAscent,), {"triangular_state": ("whitened_chol",), "checkpoint_flags": ("done",)})
