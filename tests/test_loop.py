"""The one training loop drives every method: the same history keys, validation and early stopping,
checkpoints and resume, time budget and guard rails, whatever the engine."""

import time
import warnings

import numpy as np
import pytest

from agpc import RBF, CholeskyError, GPClassifier, JitterWarning
from agpc import backend as agpc_backend
from agpc.datasets import make_banana
from agpc.inference import engines, hooks, multiclass_vi, training
from helpers import binary_toy, interrupted_then_resumed, three_classes

COMMON_KEYS = {"log_marginal_likelihood", "time", "n_invalid_sites", "damping", "n_steps", "guard_rejected",
               "guard_rebuilds", "guard_halvings", "guard_restored"}
VALIDATION_KEYS = {"validation_step", "validation_nll", "validation_error"}

# (method, batch_size, max_iter, step at which the first fit is interrupted): every method, batch and
# minibatch where the method has both, with a checkpoint every 4 steps before the interruption
EVERY_METHOD = [
    ("adf", None, 4, 13),  # batch ADF / SEP: 10 warm-up sweeps, then 4 steps on the hyper-parameters: the
    ("sep", None, 4, 13),  # checkpoint at step 12 holds two of them (the optimiser's state is resumed)
    ("adf", 50, 2, 5),
    ("svi", None, 12, 9),
    ("svi", 50, 2, 5),
    ("vi-jj", None, 6, 5),
    ("vi-jj-hybrid", None, 6, 5),
    ("vi-jj-full", None, 6, 5),
    ("vi-taylor", None, 6, 5),
    ("gfitc", None, 3, 21),  # GFITC's sites settle for 11 sweeps before its first step on the hyper-parameters
]


def _binary(n=200, seed=5):
    return make_banana(n, random_state=seed)


@pytest.mark.parametrize("method, batch_size, max_iter, stop_at", EVERY_METHOD)
def test_every_method_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch, method, batch_size, max_iter, stop_at):
    """Interrupted after ``stop_at`` steps (a checkpoint every 4 steps), then resumed: the same history, the
    same inducing points and the same predictions as a fit that was never interrupted (the EP, SEP and
    minibatch cases are in test_checkpoint.py)."""
    X, y = _binary()
    params = dict(method=method, n_inducing=6, batch_size=batch_size, max_iter=max_iter, random_state=0, tol=1e-3)
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt", stop_at, X, y)
    assert reference.n_iter_ == len(reference.history_["log_marginal_likelihood"]) >= 1
    for key in COMMON_KEYS - {"time"}:
        np.testing.assert_allclose(resumed.history_[key], reference.history_[key], rtol=1e-12, err_msg=key)
    np.testing.assert_allclose(resumed.inducing_points_, reference.inducing_points_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-10, atol=1e-14)
    assert resumed.log_marginal_likelihood_ == pytest.approx(reference.log_marginal_likelihood_, rel=1e-12)


@pytest.mark.parametrize("method", ["sep", "svi", "gfitc"])
def test_multiclass_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch, method):
    X, y = three_classes(150, 0, noise=0.0)
    # (multiclass parallel EP converges slowly: GFITC's sites settle to a looser tol, to keep the test short)
    # interrupted after two steps on the hyper-parameters: batch SEP's come after 10 warm-up sweeps (4 of them),
    # GFITC's after its sites settle (15 sweeps here)
    params = dict(method=method, n_inducing=5, max_iter={"svi": 8, "sep": 4}.get(method, 3), random_state=0,
                  tol=1e-2 if method == "gfitc" else 1e-3)
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "run.ckpt",
                                                  {"sep": 13, "gfitc": 21}.get(method, 5), X, y)
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
        # the first score, then 3 without improvement; batch EP's and ADF's warm-up sweeps count none
        # (``hooks.Validation``): their 10 scores, then 3
        assert len(nll) == max(model.n_warmup_, 1) + 3
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
    X, y = three_classes(150, 0, noise=0.0)
    X_val, y_val = three_classes(90, 4, noise=0.0)
    model = GPClassifier(method=method, n_inducing=5, max_iter=3, random_state=0, tol=1e-3,
                         optimize=method != "gfitc").fit(X, y, validation_data=(X_val, y_val))
    assert set(model.history_) == COMMON_KEYS | VALIDATION_KEYS
    proba = model.predict_proba(X_val)
    own_nll = -np.mean(np.log(proba[np.arange(len(y_val)), y_val]))
    assert own_nll == pytest.approx(model.history_["validation_nll"][-1], rel=1e-8)


@pytest.mark.parametrize("method, noise, max_iter", [
    # batch EP's sign-based steps grow while the gradient keeps its sign: 200 steps took a noise the data do not
    # need from 1e-3 to exp(-19.4) (to exp(-752) at 1,000 steps on 800 rows), below the floor
    pytest.param("ep", 1e-3, 200, id="the latent noise runs off under batch EP's steps"),
    # a noise that starts below the floor is lifted to it by the first step of each optimiser
    pytest.param("sep", 1e-9, 1, id="Rprop lifts a noise below the floor"),
    pytest.param("svi", 1e-9, 1, id="Adam lifts a noise below the floor"),
    pytest.param("vi-jj", 1e-9, 1, id="L-BFGS-B lifts a noise below the floor"),
])
def test_the_latent_noise_is_learned_at_or_above_its_floor(method, noise, max_iter):
    """Issue 25, item 1: the latent noise is bounded below (``LATENT_NOISE_FLOOR``, docs/design.md) for every
    optimiser, so that it cannot run off to where exp underflows (the checkpoints of such a fit were refused)."""
    from agpc.kernels import LATENT_NOISE_FLOOR

    X, y = _binary(100, seed=0)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=noise)
    # (every step: the run-off is what a long run does after log Z has stopped rising)
    model = GPClassifier(method=method, kernel=kernel, n_inducing=5, max_iter=max_iter, random_state=0,
                         plateau=None).fit(X, y)
    assert float(model.kernel_.noise) >= LATENT_NOISE_FLOOR * (1 - 1e-12), float(model.kernel_.noise)
    if noise > LATENT_NOISE_FLOOR:  # (the run-off cases: held at the floor, where the unbounded steps went below)
        assert float(model.kernel_.noise) == pytest.approx(LATENT_NOISE_FLOOR, rel=1e-12)


def test_a_bounded_entry_held_at_its_floor_neither_moves_nor_grows_its_step():
    """``optim.bounded_step``: while the gradient pushes an entry below its bound, Rprop holds it there with its step
    unchanged (a step grown meanwhile would throw it far up once the gradient turns); other entries step as before."""
    from agpc.optim import Rprop, bounded_step

    rprop = Rprop({"noise": np.array(0.5), "free": np.array(0.5)})
    params = {"noise": np.array(-1.0), "free": np.array(0.0)}
    for _ in range(5):
        params = bounded_step(rprop, params, {"noise": np.array(-3.0), "free": np.array(-3.0)}, {"noise": -1.0})
        assert float(params["noise"]) == -1.0
    assert float(rprop.steps["noise"]) == 0.5 and float(rprop.steps["free"]) > 0.5
    params = bounded_step(rprop, params, {"noise": np.array(2.0), "free": np.array(-3.0)}, {"noise": -1.0})
    assert float(params["noise"]) == -0.5  # up by the step it had, once the gradient turns


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_value_scale_stepped_past_the_floats_is_nan(dtype):
    """``optim.bounded_step``: an entry named in ``finite_exp`` (a log whose exp scales the kernel's values) stepped
    beyond the largest log of its dtype is NaN, which the guard goes back from (its exp, inf, made a flat model the
    guard took: tests/test_long_runs.py); at the largest log and below it, and entries not named, step as before."""
    from agpc.optim import Adam, bounded_step

    top = np.log(np.finfo(dtype).max)
    params = {"log_amplitude": np.array([top - 5.0, top - 5.0], dtype=dtype), "free": np.array(top - 5.0, dtype=dtype)}
    adam = Adam(learning_rate=10.0)
    grads = {"log_amplitude": np.array([1.0, -1.0], dtype=dtype), "free": np.array(1.0, dtype=dtype)}
    out = bounded_step(adam, params, grads, {}, ("log_amplitude",))
    assert np.isnan(out["log_amplitude"][0]) and out["log_amplitude"][1] == pytest.approx(top - 15.0)
    assert out["free"] == pytest.approx(top + 5.0)  # (not named: a lengthscale's inf is a feature ignored)
    assert out["log_amplitude"].dtype == dtype


@pytest.mark.parametrize("method", ["ep", "sep", "adf"])
def test_rprop_grows_faster_only_in_the_sparse_models_binary_batch_fits(method):
    """``engines.SPARSE_BATCH_GROWTH`` (10% a step, where the seed's Rprop grows 2%): the sparse model's binary batch
    fits take it; the exact model, multiclass fits and GFITC keep the seed's 2% (their defaults were measured with
    it); minibatch fits step with Adadelta. The step after k agreeing signs is the first step times the growth^k."""
    import inspect

    from agpc.inference import exact_ep
    from agpc.kernels import ClassKernels
    from agpc.optim import Adadelta, Rprop

    seed_growth = inspect.signature(Rprop).parameters["increase"].default
    assert seed_growth == 1.02 and engines.SPARSE_BATCH_GROWTH == 1.1
    X, _ = _binary(60)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=1e-3).for_inputs(X)
    options = engines.EngineOptions()

    def engine(kernel, Z, **kw):
        return engines.EPEngine(method, kernel, Z, n_total=60, options=options, **kw)

    def growth_of(optimizer):
        """The factor a step grows by when the gradient keeps its sign (a parameter "a" of first step 0.01)."""
        assert isinstance(optimizer, Rprop)
        optimizer.steps, optimizer.previous_sign = {"a": np.array(0.01)}, {}
        params = optimizer.step({"a": np.array(0.0)}, {"a": np.array(1.0)})
        optimizer.step(params, {"a": np.array(1.0)})
        return float(optimizer.steps["a"]) / 0.01

    assert growth_of(engine(kernel, X[:5], minibatch=False).optimizer) == pytest.approx(1.1, rel=1e-12)
    three = ClassKernels([kernel] * 3)
    assert growth_of(engine(three, np.stack([X[:5]] * 3), minibatch=False).optimizer) == pytest.approx(1.02, rel=1e-12)
    assert isinstance(engine(kernel, X[:5], minibatch=True).optimizer, Adadelta)
    if method == "ep":
        exact = engine(kernel, X, minibatch=False, passes=exact_ep).optimizer
        assert growth_of(exact) == pytest.approx(1.02, rel=1e-12)


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

    X, y = three_classes(40, 0, noise=0.0)
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


def test_time_budget_keeps_room_for_the_final_pass_in_batch_mode_only(monkeypatch):
    """max_time bounds the whole fit: no step starts that its measured length (and, in batch mode, the final
    pass of about one step) would carry past the deadline; minibatch mode makes its exact final pass over all
    rows only when its measured cost fits, and never when it has not been measured (SVI's bound)."""
    clock = {"now": 100.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    batch = hooks.TimeBudget(10.0, started=100.0, batch=True)
    minibatch = hooks.TimeBudget(10.0, started=100.0, batch=False)
    assert not batch.exhausted(False) and not minibatch.exhausted(False)  # nothing measured yet
    for budget in (batch, minibatch):
        clock["now"] = 100.0
        with budget.timing("step"):
            clock["now"] += 3.0  # a step of 3 s, ending at 103
    assert not batch.exhausted(False)  # 103 + 3 (step) + 3 (final pass) <= 110
    clock["now"] = 105.0
    assert batch.exhausted(False) and not minibatch.exhausted(False)  # 105 + 3 + 3 > 110, 105 + 3 <= 110
    assert not minibatch.final_pass_fits()  # no rebuild measured
    minibatch.seconds["rebuild"] = 2.5
    assert minibatch.exhausted(True) and not minibatch.exhausted(False)  # 105 + 3 + 2.5 (a rebuild due) > 110
    assert minibatch.final_pass_fits()  # 105 + 2 x 2.5 <= 110
    clock["now"] = 106.0
    assert not minibatch.final_pass_fits()  # 106 + 5 > 110


def test_minibatch_ep_keeps_room_for_its_exact_final_pass(monkeypatch):
    """Minibatch EP's model under a time budget is q rebuilt exactly from all its sites at the learned
    hyper-parameters, not the running product, which holds its sites along the last rebuild's projections and
    predicted far worse (hooks.FINAL_RESERVE): no step starts that would leave less than FINAL_RESERVE estimated
    rebuilds of q, that rebuild is made when FINAL_MARGIN of them fit, and log Z's second pass too only where both
    passes fit twice over; without the reservation the rebuild of q needs two of its estimates."""
    clock = {"now": 100.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    budget = hooks.TimeBudget(20.0, started=100.0, batch=False)
    step, final, rebuild = 1.0, 2.0, 4.0  # a step, q alone, q and log Z
    budget.seconds.update(step=step, final=final, rebuild=rebuild)
    budget.reserve_final = True  # (what ``start`` decides from its timed rebuild)
    last_start = 120.0 - step - hooks.FINAL_RESERVE * final  # the last moment a step may start
    clock["now"] = last_start - 0.1
    assert not budget.exhausted(False)
    clock["now"] = last_start + 0.1
    assert budget.exhausted(False) and budget.final_pass_fits(with_log_z=False)  # the room kept holds the pass
    assert budget.final_pass_fits() == (clock["now"] + 2 * rebuild <= 120.0)
    clock["now"] = 120.0 - hooks.FINAL_MARGIN * final + 0.1
    assert not budget.final_pass_fits(with_log_z=False) and not budget.final_pass_fits()
    clock["now"] = 120.0 - 2 * rebuild - 0.1  # both passes where twice their estimate is left
    assert budget.final_pass_fits()
    budget.reserve_final = False  # other minibatch fits: no room kept, a pass made where twice its estimate is left
    clock["now"] = last_start + 0.1
    assert not budget.exhausted(False)
    clock["now"] = 120.0 - 2 * final + 0.1
    assert not budget.final_pass_fits(with_log_z=False)
    clock["now"] = 120.0 - 2 * final - 0.1
    assert budget.final_pass_fits(with_log_z=False) and not budget.final_pass_fits()


def test_the_rebuild_estimate_leaves_out_the_cold_first_timing(monkeypatch):
    """hooks._rebuild_estimate: one warm-up on the first rows (not counted), then the faster of two timings of four
    times as many scaled to all rows. The first timing in a process ran 1.7x the warm ones (28 s against 16-19 s
    scaled, full airline), enough to keep a 60-s fit from reserving its pass."""
    clock = {"now": 0.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    calls = []

    class Engine:
        def time_rebuild(self, X, y, rows):
            slow = 3.0 if len(calls) < 2 else 1.0  # the warm-up and the first timing run cold
            calls.append(rows)
            clock["now"] += slow * 1e-5 * rows

    X = np.zeros((1_000_000, 1))
    estimate = hooks._rebuild_estimate(Engine(), X, None, 1000)
    assert calls == [1000, 4000, 4000]
    assert estimate == pytest.approx(1e-5 * 4000 * 1_000_000 / 4000)
    calls.clear()
    assert hooks._rebuild_estimate(Engine(), X[:3000], None, 1000) == pytest.approx(1e-5 * 3000)  # all n rows
    assert calls == [1000, 3000, 3000]


def test_the_timed_rebuild_of_q_is_the_work_of_the_final_rebuild():
    """EPEngine.time_rebuild runs the product of the sites (one pass; what the final rebuild of a time-stopped fit
    does) on the first rows, and nothing else: counted through the passes."""
    X, y = binary_toy(400, seed=5)
    kernel = RBF(lengthscales=[1.0, 1.0]).for_inputs(X)
    engine = engines.make_engine("ep", kernel, X[:10].copy(), n_total=400, minibatch=True, jitter=1e-6)
    seen = []
    for name in ("exact_factor", "evaluate"):
        real = getattr(engine.passes, name)
        setattr(engine.passes, name, lambda *a, _real=real, _name=name, **k: (seen.append((_name, a[2].shape[0])),
                                                                               _real(*a, **k))[1])
    engine.time_rebuild(X, y.astype(float), 120)
    assert seen == [("exact_factor", 120)]


@pytest.mark.parametrize("log_z_fits", [True, False])
def test_a_time_stopped_minibatch_ep_fit_returns_its_exact_final_pass(log_z_fits):
    """End to end: a minibatch EP fit stopped by max_time mid-epoch returns q rebuilt exactly from its sites: the
    fitted posterior is the one an exact pass at the returned kernel and Z gives, not the running product. Where
    log Z_q's second pass does not fit (its estimate made huge here; else none), q alone is rebuilt and log Z is the
    running estimate of the history."""
    X, y = binary_toy(4000, seed=3)
    seen = {}
    real_start, real_kind = hooks.TimeBudget.start, training.final_pass_kind

    def start(self, run, rows=8192):
        real_start(self, run, rows)
        seen.update(reserved=self.reserve_final, run=run)

    def before_step(self, run, rebuild_due):  # the clock's stop made at step 30 of the first epoch's 200: a stop
        if run.trainer.n_steps < 30:  # by time alone once fell, on a loaded CI worker, before any step or just after
            return False  # an epoch's rebuild, where the running q is the exact one and nothing is tested
        run.stopped_by_time, run.stop_reason = True, "max_time"
        return True

    def kind(run, hooks_):
        budget = next(hook for hook in hooks_ if isinstance(hook, hooks.TimeBudget))  # (the choice made here, not
        budget.seconds["rebuild"] = 0.0 if log_z_fits else 1e6  # by a loaded machine's timings: a last step that
        budget.deadline = max(budget.deadline, time.perf_counter() + 60.0)  # overran its estimate on a busy CI
        # worker once left no time at all; the room kept for this pass is test_minibatch_ep_keeps_room_... above)
        engine = run.trainer.engine
        seen["running"] = engine.passes.posterior_from_factor(engine.state["kernel"], engine.state["Z"],
                                                              engine.state["factor"], jitter=engine.jitter)
        seen["kind"] = real_kind(run, hooks_)
        return seen["kind"]

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(hooks.TimeBudget, "start", start)
    monkeypatch.setattr(hooks.TimeBudget, "before_step", before_step)
    monkeypatch.setattr(training, "final_pass_kind", kind)
    try:
        fit = training.fit(X, y, RBF(lengthscales=[1.0, 1.0]).for_inputs(X), X[:20].copy(), method="ep",
                           batch_size=20, max_iter=50, max_time=60.0, jitter=1e-6)
    finally:
        monkeypatch.undo()
    assert seen["reserved"] and fit.stopped_by_time
    assert seen["kind"] == ("q and log Z" if log_z_fits else "q")
    engine = seen["run"].trainer.engine
    final = engine._exact_pass(seen["run"].X, seen["run"].y)  # (a pass of its own, no cache)
    np.testing.assert_allclose(fit.posterior.h, final["posterior"].h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fit.posterior.L_C, final["posterior"].L_C, rtol=1e-10, atol=1e-12)
    assert np.max(np.abs(np.asarray(seen["running"].h) - np.asarray(final["posterior"].h))) > 1e-6  # (a real choice)
    if log_z_fits:
        assert fit.log_z == pytest.approx(float(final["log_z"]), rel=1e-10)
    else:
        assert fit.log_z == fit.history["log_marginal_likelihood"][-1] != pytest.approx(float(final["log_z"]))


def test_a_step_takes_row_weights_padding_weighs_nothing():
    """SVI's step on a minibatch padded with rows of weight 0 moves q(u), the kernel and Z exactly as the step
    on the minibatch alone; the batch passes, which do not apply weights, refuse them."""
    from agpc.kernels import RBF

    X, y = _binary(60)
    y = y.astype(float)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z = X[:5].copy()
    padded_X = np.concatenate([X[:20], X[40:50]])
    padded_y = np.concatenate([y[:20], y[40:50]])
    weights = np.r_[np.ones(20), np.zeros(10)]
    plain = training.Trainer(engines.make_engine("svi", kernel, Z, n_total=60, minibatch=True))
    padded = training.Trainer(engines.make_engine("svi", kernel, Z, n_total=60, minibatch=True))
    for _ in range(2):
        _, _, log_z = plain.step(X, y, 0, 20, stepping=True)
        _, _, padded_log_z = padded.step(padded_X, padded_y, 0, 30, stepping=True, weights=weights)
        assert padded_log_z == pytest.approx(log_z, rel=1e-12)
    for key in ("Z", "whitened_mean", "whitened_chol"):
        np.testing.assert_allclose(padded.state[key], plain.state[key], rtol=1e-12, atol=1e-14, err_msg=key)
    for method in ("ep", "vi-jj", "gfitc"):  # batch passes (EP / SEP / ADF minibatches take weights)
        trainer = training.Trainer(engines.make_engine(method, kernel, Z, n_total=60, minibatch=False))
        with pytest.raises(ValueError, match="per-row weights"):
            trainer.step(X, y, 0, 60, stepping=True, weights=np.ones(60))


def _failing_from_now_on(trainer):
    """Every later evaluation fails as a failed Cholesky does (the guard's path), whatever the state."""
    def evaluate(*args, **kwargs):
        raise CholeskyError("forced failure")

    trainer.engine.evaluate = evaluate


def test_the_divergence_message_says_what_was_tried_after_a_good_step():
    """After a good step the guard reverts and halves damping and step sizes on each failure; when it gives
    up, the message counts the halvings it really made (checked against the damping it left)."""
    X, y = _binary(60)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    trainer = training.Trainer(engines.make_engine("sep", kernel, X[:5].copy(), n_total=60, minibatch=True,
                                                   jitter=1e-6))
    took, _, _ = trainer.step(X, y, 0, 20, stepping=True)
    assert took
    damping = trainer.damping
    _failing_from_now_on(trainer)
    with pytest.raises(FloatingPointError) as error:
        for _ in range(100):
            trainer.step(X, y, 0, 20, stepping=True)
    halvings = round(np.log2(damping / trainer.damping))
    assert halvings > 0
    message = str(error.value)
    assert f"after {trainer.failures} failed steps in a row" in message
    assert f"damping and step sizes halved {halvings} times" in message and "jitter 1.0e-06" in message


def test_the_divergence_message_at_the_first_step_says_nothing_was_halved():
    """A failure before any good step has no state to go back to: the guard stops at once and does not claim
    a halving it never made (it used to say "halving did not help (after 1 attempts)")."""
    X, y = _binary(60)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    trainer = training.Trainer(engines.make_engine("ep", kernel, X[:5].copy(), n_total=60, minibatch=False,
                                                   jitter=1e-6))
    damping = trainer.damping
    _failing_from_now_on(trainer)
    with pytest.raises(FloatingPointError, match=r"ep diverged: log Z is not finite at the first step .*"
                                                 r"\(nothing halved, jitter 1.0e-06\)"):
        trainer.step(X, y, 0, 60, stepping=False)
    assert trainer.damping == damping


@pytest.mark.parametrize("method", ["ep", "sep"])
def test_a_fit_that_raised_the_jitter_warns_once_saying_from_what_to_what(method, monkeypatch):
    """Duplicated inducing points with jitter 0: the guard raises the jitter of Kmm, and further
    factorisations may escalate their own; the fit ends with one JitterWarning (a UserWarning, so users can
    filter it) naming Kmm and the jitter it went to, the one the fitted model kept."""
    import warnings

    X, y = _binary(80)
    Z = np.concatenate([X[:4], X[:4]])
    # the dtype's jitter floor (100 m eps) makes this Kmm factorise: without it, it is the guard's case
    monkeypatch.setattr(agpc_backend, "jitter_floor", lambda Z: 0.0)
    model = GPClassifier(method=method, inducing=Z, jitter=0.0, max_iter=3, batch_size=None, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    jitter_warnings = [w for w in caught if issubclass(w.category, JitterWarning)]
    assert len(jitter_warnings) == 1 and issubclass(JitterWarning, UserWarning)
    message = str(jitter_warnings[0].message)
    assert message.startswith("GPClassifier.fit: jitter had to be raised")
    assert "Kmm (covariance of the inducing points): the model's jitter from 0.0e+00 to " in message
    assert jitter_warnings[0].filename == __file__  # it points at the caller's line
    assert f"the model's jitter from 0.0e+00 to {model.jitter_:.1e}" in message  # the jitter the model kept
    assert np.all(np.isfinite(model.predict_proba(X)))


@pytest.mark.parametrize("method", ["ep", "sep", "svi", "vi-jj", "vi-taylor", "gfitc"])
def test_jitter_is_the_one_the_final_prior_factor_was_built_with(method, monkeypatch, tmp_path):
    """Duplicated inducing points with jitter 0, every method: ``jitter_`` is the jitter on the diagonal of
    the fitted model's factor of Kmm (vi-* and GFITC factor Kmm with ``backend.cholesky``, which adds its own
    jitter: jitter_ said 0 where the factor had 1e-2), and a saved model loads and predicts the same without
    raising it again."""
    import warnings

    X, y = _binary(80)
    Z = np.concatenate([X[:4], X[:4]])
    monkeypatch.setattr(agpc_backend, "jitter_floor", lambda Z: 0.0)
    model = GPClassifier(method=method, inducing=Z, jitter=0.0, max_iter=3, batch_size=None, random_state=0,
                         kernel=RBF(lengthscales=[1.0, 1.0], amplitude=1e8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    assert [w for w in caught if issubclass(w.category, JitterWarning)]  # the case: the jitter was raised
    L_K = model.posterior_.L_K
    Kmm = model.kernel_.K(model.inducing_points_)
    amplitude = float(model.kernel_.amplitude)
    # L_K L_K^T = Kmm + jitter_ I, up to the round-off of a factorisation (m eps ||Kmm||, ||Kmm|| <= m amplitude)
    m = Kmm.shape[0]
    tolerance = 10 * m * m * np.finfo(np.float64).eps * amplitude
    np.testing.assert_allclose(L_K @ L_K.T, Kmm + model.jitter_ * np.eye(m), rtol=0, atol=tolerance)
    probabilities = model.predict_proba(X)
    model.save(tmp_path / "model.agpc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = GPClassifier.load(tmp_path / "model.agpc")
        np.testing.assert_array_equal(loaded.predict_proba(X), probabilities)
    assert not [w for w in caught if issubclass(w.category, JitterWarning)]
    assert loaded.jitter_ == model.jitter_


def test_a_fit_with_nothing_to_learn_has_no_warm_up_sweeps():
    """The mutation audit of 2026-12-04: batch EP's warm-up sweeps come before the first hyper-parameter step; with
    ``optimize=False`` there is none, each sweep is an iteration: ``max_iter`` sweeps, none of them warm-up."""
    X, y = make_banana(300, random_state=0)
    model = GPClassifier(n_inducing=10, optimize=False, max_iter=5, tol=0.0, random_state=0, plateau=None).fit(X, y)
    assert (model.n_iter_, model.n_warmup_) == (5, 0)
    assert len(model.history_["log_marginal_likelihood"]) == 5


@pytest.mark.parametrize("method", ["sep", "svi"])
def test_a_minibatch_epochs_history_log_z_is_the_mean_of_its_steps(monkeypatch, method):
    """The mutation audit of 2026-12-04: in minibatch mode a history entry (an epoch) records the mean of the log Z
    estimates of its steps, each of one minibatch, not the last step's alone."""
    from agpc.inference import guard
    taken, real = [], guard.Guard.taken

    def recording(self, log_z):
        taken.append(float(log_z))
        return real(self, log_z)

    monkeypatch.setattr(guard.Guard, "taken", recording)
    X, y = make_banana(600, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GPClassifier(method=method, n_inducing=10, max_iter=3, random_state=0, batch_size=50).fit(X, y)
    history = model.history_
    assert len(taken) == history["n_steps"][-1] == 36  # (12 minibatches an epoch, every step taken)
    starts = [0] + list(history["n_steps"][:-1])
    expected = [np.mean(taken[lo:hi]) for lo, hi in zip(starts, history["n_steps"])]
    np.testing.assert_allclose(history["log_marginal_likelihood"], expected, rtol=1e-12)
    assert not np.allclose(expected, [taken[hi - 1] for hi in history["n_steps"]])
