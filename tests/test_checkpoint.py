"""Checkpoints: an interrupted and resumed fit ends at the uninterrupted model; a bad file is refused and a
crash while writing leaves the previous checkpoint intact."""

import os

import numpy as np
import pytest

from agpc import GPClassifier
from agpc.datasets import make_banana
from agpc.inference import training


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


def interrupted_then_resumed(monkeypatch, params, path, stop_at, X, y):
    """Fit with checkpoints every 4 steps, interrupted after ``stop_at`` steps; then resume=True to the end."""
    undo = _interrupt_after(monkeypatch, stop_at)
    with pytest.raises(Interrupt):
        GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(X, y)
    undo()
    assert os.path.exists(path)
    return GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(X, y, resume=True)


@pytest.mark.parametrize("method, batch_size, max_iter, stop_at", [
    ("ep", None, 20, 17),       # batch EP (10 warm-up sweeps + 20): interrupted mid-run
    ("sep", 100, 3, 11),        # minibatch SEP, 6 minibatches an epoch: interrupted mid-epoch
    ("ep", 100, 3, 13),         # minibatch EP: sites, factor and the epoch's visiting order restored
])
def test_interrupted_and_resumed_fit_equals_uninterrupted(tmp_path, monkeypatch, method, batch_size, max_iter, stop_at):
    X, y = make_banana(600, random_state=5)
    params = dict(method=method, n_inducing=8, batch_size=batch_size, max_iter=max_iter, random_state=0)
    reference = GPClassifier(**params).fit(X, y)
    resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", stop_at, X, y)
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"], reference.history_["log_marginal_likelihood"],
                               rtol=1e-12)
    np.testing.assert_allclose(resumed.inducing_points_, reference.inducing_points_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-10, atol=1e-14)


def test_truncated_checkpoint_is_refused_and_a_crash_while_writing_keeps_the_previous_one(tmp_path, monkeypatch):
    X, y = make_banana(300, random_state=6)
    path = tmp_path / "run.ckpt"
    params = dict(n_inducing=6, max_iter=8, random_state=0, checkpoint_path=path, checkpoint_every=5)
    GPClassifier(**params).fit(X, y)  # checkpoints at steps 5, 10, 15
    good = path.read_bytes()

    # a crash in the middle of writing the next checkpoint: the file on disk is still the last good one
    real_savez = np.savez

    def crash(fh, **arrays):
        fh.write(b"partial")
        raise OSError("disk full (test)")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        GPClassifier(**params).fit(X, y)
    monkeypatch.setattr(np, "savez", real_savez)
    assert path.read_bytes() == good
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temporary left behind

    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="not a valid agpc checkpoint"):
        GPClassifier(**dict(params, checkpoint_path=truncated)).fit(X, y, resume=True)
    with pytest.raises(ValueError, match="different training run"):
        GPClassifier(**dict(params, n_inducing=7)).fit(X, y, resume=True)
    with pytest.raises(ValueError, match="need checkpoint_path"):
        GPClassifier(n_inducing=6, checkpoint_every=3).fit(X, y)
