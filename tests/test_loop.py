"""The one training loop drives every method: the same history keys, validation and early stopping,
checkpoints and resume, time budget and guard rails, whatever the engine (issue 14, part 1)."""

import numpy as np
import pytest

from agpc import GPClassifier
from agpc.datasets import make_banana
from agpc.inference import engines, multiclass_vi, training
from test_checkpoint import interrupted_then_resumed

COMMON_KEYS = {"log_marginal_likelihood", "time", "n_invalid_sites", "damping", "n_steps"}
VALIDATION_KEYS = {"validation_step", "validation_nll", "validation_error"}

# (method, batch_size, max_iter, step at which the first fit is interrupted): every method, batch and
# minibatch where the method has both, with a checkpoint every 4 steps before the interruption
EVERY_METHOD = [
    ("adf", None, 4, 9),
    ("sep", None, 4, 7),
    ("svi", None, 12, 9),
    ("svi", 50, 2, 5),
    ("vi-jj", None, 6, 5),
    ("vi-jj-hybrid", None, 6, 5),
    ("vi-jj-full", None, 6, 5),
    ("vi-taylor", None, 6, 5),
    ("gfitc", None, 3, 9),
]


def _binary(n=200, seed=5):
    return make_banana(n, random_state=seed)


def _three_classes(n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.argmax(np.stack([X[:, 0], -X[:, 0] + X[:, 1], np.sin(2 * X[:, 1])], axis=1), axis=1)
    return X, y


@pytest.mark.parametrize("method, batch_size, max_iter, stop_at", EVERY_METHOD)
def test_every_method_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch, method, batch_size, max_iter, stop_at):
    """Interrupted after ``stop_at`` steps (a checkpoint every 4 steps), then resumed: the same history, the
    same inducing points and the same predictions as a fit that was never interrupted (the EP, SEP and
    minibatch cases are in test_checkpoint.py)."""
    X, y = _binary()
    params = dict(method=method, n_inducing=6, batch_size=batch_size, max_iter=max_iter, random_state=0, tol=1e-3)
    reference = GPClassifier(**params).fit(X, y)
    assert reference.n_iter_ == len(reference.history_["log_marginal_likelihood"]) >= 1
    resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", stop_at, X, y)
    for key in COMMON_KEYS - {"time"}:
        np.testing.assert_allclose(resumed.history_[key], reference.history_[key], rtol=1e-12, err_msg=key)
    np.testing.assert_allclose(resumed.inducing_points_, reference.inducing_points_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-10, atol=1e-14)
    assert resumed.log_marginal_likelihood_ == pytest.approx(reference.log_marginal_likelihood_, rel=1e-12)


@pytest.mark.parametrize("method", ["sep", "svi", "gfitc"])
def test_multiclass_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch, method):
    X, y = _three_classes()
    params = dict(method=method, n_inducing=5, max_iter=8 if method == "svi" else 3, random_state=0, tol=1e-3)
    reference = GPClassifier(**params).fit(X, y)
    resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", 5, X, y)
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"], reference.history_["log_marginal_likelihood"],
                               rtol=1e-12)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("method, batch_size", [("ep", None), ("sep", 50), ("adf", None), ("svi", None), ("svi", 50),
                                                ("vi-jj", None), ("vi-taylor", None), ("gfitc", None)])
def test_every_method_scores_validation_data_and_stops_early_at_its_best_state(method, batch_size):
    """Validation data are scored into ``history_`` for every method; with a ``tol`` no change can beat,
    training stops after ``n_iter_no_change`` evaluations and keeps the best state seen: the fitted model's
    NLL on the validation rows is the smallest one in the history."""
    X, y = _binary()
    X_val, y_val = _binary(150, seed=9)
    model = GPClassifier(method=method, n_inducing=6, batch_size=batch_size, max_iter=50, random_state=0,
                         n_iter_no_change=3, tol=1e3 if method != "gfitc" else 1e-3,
                         eval_every=2 if method == "gfitc" else None).fit(X, y, validation_data=(X_val, y_val))
    assert set(model.history_) == COMMON_KEYS | VALIDATION_KEYS
    nll = model.history_["validation_nll"]
    assert model.early_stopped_
    if method != "gfitc":  # gfitc: improvements of more than tol reset the count, so it may score more often
        assert len(nll) == 4
    proba = model.predict_proba(X_val)
    own_nll = -np.mean(np.log(proba[np.arange(len(y_val)), np.searchsorted(model.classes_, y_val)]))
    assert own_nll == pytest.approx(min(nll), rel=1e-8)
    error = np.mean(model.predict(X_val) != y_val)
    assert error == pytest.approx(model.history_["validation_error"][int(np.argmin(nll))], abs=1e-12)


@pytest.mark.parametrize("method", ["sep", "svi", "gfitc"])
def test_multiclass_validation_scores_are_the_models_own(method):
    """The last validation score is the fitted model's own NLL (GFITC on fixed hyper-parameters: scored
    after every sweep, the last one the sweep that converged; with steps on the hyper-parameters its sites
    settle again after the last scored step)."""
    X, y = _three_classes()
    X_val, y_val = _three_classes(90, seed=4)
    model = GPClassifier(method=method, n_inducing=5, max_iter=3, random_state=0, tol=1e-3,
                         optimize=method != "gfitc").fit(X, y, validation_data=(X_val, y_val))
    assert set(model.history_) == COMMON_KEYS | VALIDATION_KEYS
    proba = model.predict_proba(X_val)
    own_nll = -np.mean(np.log(proba[np.arange(len(y_val)), y_val]))
    assert own_nll == pytest.approx(model.history_["validation_nll"][-1], rel=1e-8)


@pytest.mark.parametrize("method", ["ep", "sep", "svi", "vi-jj", "gfitc"])
def test_time_budget_stops_every_method(method, monkeypatch):
    """``max_time`` ends the fit after the step that crosses it, for every engine: a clock that jumps by a
    second a read makes the first step cross a one-second budget."""
    X, y = _binary(100)
    clock = iter(np.arange(1e6))
    monkeypatch.setattr(training.time, "perf_counter", lambda: float(next(clock)))
    model = GPClassifier(method=method, n_inducing=5, max_iter=50, max_time=1.0, random_state=0).fit(X, y)
    assert model.stopped_by_time_
    assert model.n_iter_ <= 1  # GFITC: none (its first steps are EP sweeps; it records its steps on the kernel)


def test_svi_reverts_and_halves_its_learning_rate_on_a_non_finite_bound(monkeypatch):
    """SVI has the loop's guard rails too: a NaN bound puts back the state before the last good step and
    halves Adam's learning rate; training then goes on to max_iter steps."""
    from agpc.inference import variational

    X, y = _binary(100)
    real = variational.svi_elbo
    calls = {"n": 0}

    def nan_on_the_fifth_call(*args, **kwargs):
        calls["n"] += 1
        value, grads = real(*args, **kwargs)
        return (value * np.nan if calls["n"] == 5 else value), grads

    monkeypatch.setattr(variational, "svi_elbo", nan_on_the_fifth_call)
    model = GPClassifier(method="svi", n_inducing=5, max_iter=8, random_state=0).fit(X, y)
    assert model.n_iter_ == 8 and np.all(np.isfinite(model.history_["log_marginal_likelihood"]))
    assert model.history_["n_steps"][-1] == 8


def test_batch_only_methods_refuse_minibatches():
    X, y = _binary(100)
    for method in ("vi-jj", "gfitc"):
        with pytest.raises(ValueError, match="batch-only"):
            GPClassifier(method=method, n_inducing=5, batch_size=20).fit(X, y)
    assert GPClassifier(method="vi-taylor", n_inducing=5, max_iter=1, batch_size="auto").fit(X, y).n_iter_ == 1
    with pytest.raises(ValueError, match="unknown method"):
        engines.make_engine("vi-xx", None, np.zeros((3, 2)), n_total=10, minibatch=False)


def test_multiclass_svi_bound_takes_row_weights():
    """Padding rows of weight 0 leave the multiclass bound and its gradients those of the rows without them."""
    from agpc.kernels import RBF, ClassKernels

    X, y = _three_classes(40)
    y = y.astype(float)
    rng = np.random.default_rng(1)
    kernels = ClassKernels([RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)] * 3)
    Z = np.stack([X[:4] + 0.1 * c for c in range(3)])
    mean = 0.2 * rng.normal(size=(3, 4))
    chol = np.stack([np.tril(0.1 * rng.normal(size=(4, 4))) + np.eye(4) for _ in range(3)])
    weights = np.r_[np.ones(30), np.zeros(10)]
    value, grads = multiclass_vi.svi_elbo_multiclass(kernels, Z, X, y, mean, chol, n_total=90, weights=weights)
    ref_value, ref_grads = multiclass_vi.svi_elbo_multiclass(kernels, Z, X[:30], y[:30], mean, chol, n_total=90)
    assert float(value) == pytest.approx(float(ref_value), rel=1e-12)
    for name in ref_grads:
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12, err_msg=name)
