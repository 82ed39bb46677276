"""The hooks of the training loop (``agpc.inference.hooks``), each on its own: validation with early stopping,
checkpoints, the time budget, the progress bar, the stop on a plateau of log Z; and the one retry rule (``Trainer.step_until_taken``)."""

import json
import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import tqdm.std

from agpc import RBF, CholeskyError, GPClassifier, GuardWarning
from agpc.datasets import make_banana
from agpc import checkpoints, optim
from agpc.inference import engines, hooks, tied_steps, training
from helpers import interrupted_then_resumed, interrupted_with_checkpoints


class _ScriptedTrainer:
    """A trainer whose validation scores are given in advance, and whose engine's state is a step count."""

    def __init__(self, nlls):
        self.nlls = list(nlls)
        self.n_steps = 0
        self.history = {}
        self.engine = SimpleNamespace(state={"step": 0}, keep=lambda: {"step": self.n_steps},
                                      put_back=lambda kept: self.engine.state.update(kept))

    def validation_scores(self, X, y, validation):
        return self.nlls.pop(0), 0.5


def _run(trainer, minibatch=False, n_batches=1):
    return SimpleNamespace(trainer=trainer, X=None, y=None, minibatch=minibatch, batches=[None] * n_batches,
                           best={"nll": np.inf, "reference": np.inf, "since": 0}, kept={}, postfix={},
                           early_stopped=False, stopped_by_time=False, converged=False, went_back=False, resumed=False,
                           warmup=0,
                           schedule=engines.Schedule(), settings=SimpleNamespace(max_iter=2),
                           finished=lambda: False)  # (steps to take)


def test_validation_stops_after_n_iter_no_change_evaluations_without_an_improvement_above_tol():
    """Scores every eval_every steps into the history; an improvement of less than tol does not count, and after
    n_iter_no_change evaluations without one the best state seen is put back."""
    trainer = _ScriptedTrainer([1.0, 0.9, 0.895, 0.95, 0.96])
    hook = hooks.Validation(("X_val", "y_val"), eval_every=2, n_iter_no_change=3, tol=0.01)
    run = _run(trainer)
    hook.start(run)
    for step in range(1, 11):
        trainer.n_steps = step
        run.postfix = {}
        hook.after_step(run, -1.0, recorded=True)
        if run.early_stopped:
            break
    assert trainer.n_steps == 10 and run.early_stopped
    assert trainer.history["validation_step"] == [2, 4, 6, 8, 10]
    assert trainer.history["validation_nll"] == [1.0, 0.9, 0.895, 0.95, 0.96]
    assert trainer.engine.state == {"step": 6}  # the best (0.895, though not better than 0.9 by tol)
    assert run.postfix == {"val_nll": "0.9600"}
    assert run.kept["validation"] == {"state": {"step": 6}, "at": 3}  # (what a checkpoint holds: ``Run.kept``)


@pytest.mark.parametrize("kept", [True, False])
def test_a_resumed_run_stops_at_the_best_state_its_checkpoint_kept_or_says_it_has_none(kept):
    """Resumed after its best evaluation (0.895, the 3rd), a run puts back the state the checkpoint kept of it
    (``run.kept``, read by ``checkpointing.restore``), as the uninterrupted run does; where the checkpoint holds none
    (sites on a cluster's workers, data-parallel rounds: ``Engine.checkpoint_kept``), it keeps the last state and says
    so. (Found 2026-12-04: a batch EP fit resumed after its best evaluation returned its last state, probabilities
    0.036 from the uninterrupted fit's, with no word.)"""
    trainer = _ScriptedTrainer([0.95, 0.96, 0.97])
    trainer.method, trainer.history = "ep", {"validation_step": [2, 4, 6], "validation_nll": [1.0, 0.9, 0.895],
                                             "validation_error": [0.5] * 3}
    hook = hooks.Validation(("X_val", "y_val"), eval_every=2, n_iter_no_change=3, tol=0.01)
    run = _run(trainer)
    run.best.update(nll=0.895, reference=0.9, since=1)
    if kept:
        run.kept["validation"] = {"state": {"step": 6}, "at": 3}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for step in range(8, 13, 2):
            trainer.n_steps = step
            hook.after_step(run, -1.0, recorded=True)
            if run.early_stopped:
                break
    assert run.early_stopped and trainer.n_steps == 10
    assert trainer.engine.state == ({"step": 6} if kept else {"step": 0})
    messages = [str(w.message) for w in said]
    assert messages == ([] if kept else [
        "ep: early stopping: the best validation NLL, 0.895, came before the resume, whose checkpoint does not hold "
        "that state: the model is the last one (NLL 0.96)"])


def test_validation_counts_no_patience_in_the_warm_up_sweeps():
    """Batch EP's warm-up sweeps (the sites settling at the first hyper-parameters) are scored and may hold the best
    state, but an NLL that rises through them stops nothing: the evaluations without improvement count from the
    first hyper-parameter step on (``run.warmup`` sweeps before it)."""
    nll = [0.70, 0.71, 0.72, 0.73, 0.74, 0.75, 0.69, 0.76, 0.77, 0.78]  # sweeps 1-4, then steps
    trainer = _ScriptedTrainer(nll)
    hook = hooks.Validation(("X_val", "y_val"), eval_every=1, n_iter_no_change=3)
    run = _run(trainer)
    run.warmup = 4
    hook.start(run)
    for step in range(1, len(nll) + 1):
        trainer.n_steps = step
        hook.after_step(run, -1.0, recorded=True)
        if run.early_stopped:
            break
    # sweeps 2-4 count nothing (counted, the patience of 3 would stop at sweep 4); steps 5 and 6 miss, step 7
    # improves (0.69), steps 8, 9 and 10 miss: the stop there, and the best state, step 7's, put back
    assert trainer.n_steps == 10 and run.early_stopped
    assert trainer.engine.state == {"step": 7}


@pytest.mark.parametrize("minibatch, has_params", [(False, True), (True, True), (False, False)])
def test_plateau_stops_once_log_z_rose_less_than_its_rise_over_its_window(minibatch, has_params):
    """Converged at the first recorded iteration past a whole window where log Z rose by less than ``rise`` over the
    last ``steps`` records, never before: batch mode counts steps after the warm-up, minibatch mode its epochs (one
    record an epoch; the steps between records are not looked at). Runs with nothing to learn (which stop on the
    change of their sites) are left alone."""
    curve = [-100.0 + 10 * (1 - 0.5 ** k) for k in range(40)]  # rises by 10 / 2^(k+1) at record k + 1
    trainer = SimpleNamespace(n_steps=0, history={"log_marginal_likelihood": []}, good=None,
                              engine=SimpleNamespace(has_params=has_params, minibatch=minibatch, log_z_climbed=True))
    run = _run(trainer, minibatch=minibatch)
    run.warmup = 0 if minibatch else 3
    steps_a_record = 5 if minibatch else 1
    hook = hooks.Plateau(steps=4, rise=0.05)
    for value in curve:
        for step in range(steps_a_record):
            trainer.n_steps += 1
            recorded = step == steps_a_record - 1
            if recorded:
                trainer.history["log_marginal_likelihood"].append(value)
            hook.after_step(run, value, recorded=recorded)
            assert not run.converged or recorded
        if run.converged:
            break
    if not has_params:
        assert not run.converged and trainer.n_steps == len(curve)
        return
    history = trainer.history["log_marginal_likelihood"]
    assert run.converged and run.stop_reason == "plateau"
    assert history[-1] - history[-5] < 0.05 <= history[-2] - history[-6]  # the first window below the rise
    assert len(history) > run.warmup + 4


def test_validation_without_eval_every_scores_each_epoch_in_minibatch_mode():
    trainer = _ScriptedTrainer([1.0, 0.9])
    hook = hooks.Validation(("X_val", "y_val"))
    run = _run(trainer, minibatch=True, n_batches=4)
    hook.start(run)
    for step in range(1, 9):
        trainer.n_steps = step
        hook.after_step(run, -1.0, recorded=False)
    assert trainer.history["validation_step"] == [4, 8] and not run.early_stopped


def test_an_eval_every_the_fit_never_reaches_or_has_nothing_to_score_is_said():
    """eval_every past the steps a fit takes (10,000 with max_iter=3; 13 of a minibatch fit's 12 steps: it counts
    minibatches, 6 an epoch here, not epochs), or given with no validation rows (n_iter_no_change too), was ignored
    without a word: the history held no score and nothing could stop on one. Now one UserWarning a fit names it
    and why; an eval_every the fit reaches (10 of 12 minibatch steps, above max_iter=2 epochs) says nothing."""
    X, y = make_banana(300, random_state=0)
    validation = make_banana(100, random_state=1)
    quick = dict(n_inducing=6, random_state=0)
    minibatch = dict(method="sep", batch_size=50, max_iter=2, **quick)
    for params, data, match in [
            (dict(eval_every=10_000, max_iter=3, **quick), validation, r"eval_every=10000 is not used: the fit ended "
             r"after 13 steps \(stop_reason_ 'max_iter'\), before its first validation score"),
            (dict(eval_every=13, **minibatch), validation, r"eval_every=13 is not used: the fit ended after 12 steps"),
            (dict(eval_every=3, n_iter_no_change=2, max_iter=3, **quick), None,
             r"eval_every=3 and n_iter_no_change=2 are not used: the fit had no validation rows to score")]:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            model = GPClassifier(**params).fit(X, y, validation_data=data)
        unused = [str(w.message) for w in said if "not used" in str(w.message)]
        assert len(unused) == 1 and re.match(match, unused[0]), unused
        assert not model.history_.get("validation_nll")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not used")
        model = GPClassifier(eval_every=10, **minibatch).fit(X, y, validation_data=validation)
    assert model.history_["validation_step"] == [10]


def test_validation_scores_whose_state_was_no_model_are_said():
    """A score due where the state gives no finite probabilities is skipped (``Validation.after_step``); skipped
    without a word, SVI of three classes at learning_rate=10 (the guard refusing a step of every minibatch, the
    state at every epoch's end with NaN probabilities) returned a history_ without one validation score and no
    warning about it (audit hE, 2026-12-04). Now a GuardWarning says how many were not recorded; the unit hook too."""
    from sklearn.datasets import make_classification
    X, y = make_classification(800, n_features=6, n_informative=4, n_classes=3, random_state=0)
    X = (X - X.mean(0)) / X.std(0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = GPClassifier(method="svi", n_inducing=20, max_iter=4, plateau=None, random_state=0, batch_size=200,
                             learning_rate=10.0).fit(X[:600], y[:600], validation_data=(X[600:], y[600:]))
    skipped = [str(w.message) for w in said if issubclass(w.category, GuardWarning) and "validation scores" in
               str(w.message)]
    assert len(skipped) == 1, [str(w.message) for w in said]
    assert re.match(rf"svi: {4 - len(model.history_['validation_nll'])} of 4 validation scores were not recorded",
                    skipped[0]), skipped
    trainer = _ScriptedTrainer([float("nan"), 0.9])
    trainer.method = "ep"
    hook = hooks.Validation(("X_val", "y_val"), eval_every=1)
    run = _run(trainer, minibatch=False)
    hook.start(run)
    for step in (1, 2):
        trainer.n_steps = step
        hook.after_step(run, -1.0, recorded=True)
    with pytest.warns(GuardWarning, match=r"1 of 2 validation scores were not recorded"):
        hook.finish(run)
    assert trainer.history["validation_step"] == [2]

def test_checkpoints_are_written_every_few_steps_and_a_resume_needs_a_path(monkeypatch, tmp_path):
    X, y = make_banana(120, random_state=1)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    written = []
    monkeypatch.setattr(hooks, "write_checkpoint",
                        lambda trainer, rng, order, best, path, fingerprint, kept, ended: written.append(
                            (trainer.n_steps, path)))
    fit = training.fit(X, y.astype(float) * 2 - 1, kernel, X[:5].copy(), method="sep", batch_size=40, max_iter=3,
                       checkpoint_path=tmp_path / "run.ckpt", checkpoint_every=4, random_state=0)
    assert [step for step, _ in written] == [4, 8] and fit.checkpoints_written == 2
    engine = training.make_engine("sep", kernel, X[:5].copy(), n_total=120, minibatch=False)
    with pytest.raises(ValueError, match="resume=True needs checkpoint_path"):
        training.train(X, y, engine, training.TrainSettings(resume=True), [hooks.Resume(None)])


def test_the_time_budget_stops_before_a_step_that_would_not_fit(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    budget = hooks.TimeBudget(10.0, started=100.0)
    budget.measured("step", 4.0)
    run = _run(None)
    clock["now"] = 101.0
    assert not budget.before_step(run, False) and not run.stopped_by_time  # 101 + 4 + 4 (final pass) <= 110
    clock["now"] = 103.0
    assert budget.before_step(run, False) and run.stopped_by_time


def test_the_time_budget_expects_the_slowest_of_the_engines_window_of_steps(monkeypatch):
    """Minibatch SEP / ADF move Z (and carry their factor) on one step in 8, about 1.6 times as long as the others at
    m = 500: where the engine says so (``step_time_window``, ``tied_steps``), the budget expects the next step to
    take as long as the slowest of that many last steps, so that the slow one does not start past the end after a
    run of fast ones. Any other engine's estimate is its last step."""
    clock = {"now": 100.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    for window in (8, 1):
        budget = hooks.TimeBudget(10.0, started=100.0, batch=False)  # (minibatch: no final pass kept)
        run = _run(SimpleNamespace(engine=SimpleNamespace(step_time_window=window)), minibatch=True)
        clock["now"] = 100.0
        budget.start(run)
        budget.measured("step", 2.0)
        for _ in range(7):
            budget.measured("step", 1.0)
        clock["now"] = 108.5
        assert budget.before_step(run, False) == (window == 8)  # 108.5 + 2 > 110; 108.5 + 1 <= 110
        budget.measured("step", 1.0)  # (the slow step leaves the window of 8)
        run = _run(run.trainer, minibatch=True)
        assert not budget.before_step(run, False)


def test_a_held_z_sets_the_engines_step_time_window():
    """The window is the period where Z is held (minibatch SEP under Adadelta), 1 where it is not (Adam, batch, a
    stream)."""
    X, y = make_banana(60, random_state=0)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)

    def window(**settings):
        minibatch = settings.pop("minibatch", True)
        engine = training.make_engine("sep", kernel, X[:5].copy(), n_total=60, minibatch=minibatch, **settings)
        return engine.step_time_window

    assert window() == tied_steps.TIED_INDUCING_EVERY > 1
    assert window(optimizer="adam") == window(minibatch=False) == 1


def test_the_time_budget_of_a_resumed_run_counts_its_earlier_time(monkeypatch):
    """max_time bounds the whole fit, a resumed one's too: ``start`` takes the training time the checkpoint recorded
    (the trainer's t0 set that far back by the resume) from the budget. A break that ignored it passed the hook test
    above, which never calls ``start``."""
    clock = {"now": 100.0}
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: clock["now"])
    for resumed, deadline in ((False, 110.0), (True, 104.0)):
        run = _run(SimpleNamespace(t0=94.0), minibatch=False)  # (6 s trained before the resume)
        run.resumed = resumed
        budget = hooks.TimeBudget(10.0, started=100.0)
        budget.start(run)
        assert budget.deadline == deadline
        budget.measured("step", 1.0)
        clock["now"] = 102.5
        assert budget.before_step(run, False) == resumed  # 102.5 + 1 + 1 (final pass) > 104, <= 110
        clock["now"] = 100.0


def test_the_progress_bar_counts_every_step_of_every_epoch_and_shows_the_last_epochs_log_z(capsys):
    """Minibatch mode: one "training" bar over every step of every epoch (its time left is the whole run's), named
    with the epoch; beside it the last recorded epoch's log Z (none during the first), not a minibatch's value; the
    estimate once the first epoch is timed."""
    trainer = SimpleNamespace(n_steps=0, method="sep", history={"log_marginal_likelihood": []},
                              objective="log Z_q (EP estimate)")
    run = _run(trainer, minibatch=True, n_batches=3)
    run.X, run.settings = np.zeros((6, 1)), SimpleNamespace(max_iter=2, max_time=None, started=None, batch_size=2,
                                                            plateau=None)
    bar = hooks.Progress()
    bar.start(run)
    assert capsys.readouterr().err == ("agpc sep: 6 rows in minibatches of 2 (3 steps an epoch); at most 2 epochs "
                                       "(max_iter) = 6 steps; a time estimate follows the first steps\n")
    bar.new_epoch(run)
    first = bar.bar
    assert first.total == 3 * run.settings.max_iter and first.desc == "agpc sep training, epoch 1/2"
    for step in range(1, 3):
        trainer.n_steps = step
        run.postfix = {"val_nll": "0.5000"}
        bar.after_step(run, -12.5, recorded=False)
    assert first.n == 2 and "log Z" not in first.postfix and "val_nll=0.5000" in first.postfix
    assert "estimate" not in capsys.readouterr().err
    trainer.n_steps = 3
    trainer.history["log_marginal_likelihood"].append(-20.25)
    bar.after_step(run, -12.5, recorded=True)
    assert "log Z_q (EP estimate)=-20.25" in first.postfix
    assert "agpc sep: estimate from the first steps (" in capsys.readouterr().err
    bar.new_epoch(run)  # the same bar, on to the next epoch
    assert bar.bar is first and first.desc == "agpc sep training, epoch 2/2"
    run.stop_reason = "max_time"
    bar.finish(run)  # ended part-way: closed at its count, saying why
    assert bar.bar is None and first.total == first.n == 3
    assert "stopped=at 3 of 6: max_time ran out" in first.postfix


def test_durations_read_as_a_person_says_them():
    assert [hooks.duration(s) for s in (4.25, 48, 401, 7500)] == ["4.2 s", "48 s", "6 min 41 s", "2 h 05 min"]
    # no exponent for a tiny time ("1e-05 s"), and a time that rounds to a minute says a minute ("60 s" was said for
    # 59.6 s and "1 min 00 s" for 60.4 s)
    assert [hooks.duration(s) for s in (0, 1e-5, 1e-9, 0.05, 0.5, 59.6, 60.4, 3599.7)] == [
        "0 s", "<0.01 s", "<0.01 s", "0.05 s", "0.5 s", "1 min 00 s", "1 min 00 s", "1 h 00 min"]


@pytest.mark.parametrize("method, plan", [
    ("ep", "80 rows; max_iter 0: no training steps (no warm-up sweeps either), only the final pass"),
    ("sep", "80 rows; max_iter 0: no training steps (no warm-up sweeps either), only the final pass"),
    ("gfitc", "80 rows, batch steps on all rows; max_iter 0: EP sweeps until the sites settle, no step on the "
              "hyper-parameters"),
])
def test_the_plan_of_a_fit_with_max_iter_0_says_what_it_will_do(capsys, method, plan):
    """max_iter=0: batch EP / SEP run no warm-up sweep and no iteration (the plan said "10 warm-up sweeps, then at
    most 0 iterations"); GFITC settles its sites at the starting hyper-parameters. The final pass is at those."""
    X, y = make_banana(80, random_state=2)
    model = GPClassifier(method=method, n_inducing=5, max_iter=0, max_time=1e-9 if method == "ep" else None,
                         verbose=True).fit(X, y)
    lines = _last_renders(capsys.readouterr().err)
    assert lines[0] == f"agpc {method}: {plan}" + ("; max_time <0.01 s" if method == "ep" else "")
    assert lines[-1].startswith(f"agpc {method}: final pass over all 80 rows") and "at the starting hyper" in lines[-1]
    if method != "gfitc":
        assert model.n_iter_ == 0 and len(lines) == 2


def test_step_until_taken_retries_until_the_guard_gives_up():
    """The one retry rule: a failed step is retried (the caller told after each revert), at most until the guard
    gives up after MAX_FAILURES failures in a row."""
    X, y = make_banana(60, random_state=5)
    y = y.astype(float) * 2 - 1
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    trainer = training.Trainer(engines.make_engine("sep", kernel, X[:5].copy(), n_total=60, minibatch=True,
                                                   jitter=1e-6))
    change, log_z = trainer.step_until_taken(X, y, 0, 20, stepping=True)
    assert trainer.n_steps == 1 and np.isfinite(log_z)

    def fail(*args, **kwargs):
        raise CholeskyError("forced failure")

    trainer.engine.evaluate = fail
    reverts = []
    with pytest.raises(FloatingPointError, match="after 31 failed steps in a row"):
        trainer.step_until_taken(X, y, 0, 20, stepping=True, after_revert=lambda: reverts.append(1))
    assert len(reverts) == training.MAX_FAILURES and trainer.n_steps == 1


def test_the_progress_bar_goes_to_standard_error(capsys):
    """docs/usage.md: the bar of verbose=True is on standard error; standard output stays the caller's (a break that
    sent it to stdout would mix it into 'agpc fit ... > summary.txt')."""
    X, y = make_banana(80, random_state=2)
    GPClassifier(n_inducing=5, max_iter=3, verbose=True).fit(X, y)
    printed = capsys.readouterr()
    assert printed.out == "" and "agpc ep" in printed.err and "log Z_q (EP estimate)=" in printed.err


class _Stream:
    """A standard error that says whether it is a terminal (or cannot say: a closed stream raises)."""

    def __init__(self, tty):
        self.tty, self.text = tty, []

    def isatty(self):
        if self.tty is None:
            raise ValueError("I/O operation on closed file")
        return self.tty

    def write(self, text):
        self.text.append(text)

    def flush(self):
        pass


@pytest.mark.parametrize("tty, seconds", [(True, 0.1), (False, hooks.LOG_REDRAW_SECONDS), (None, hooks.LOG_REDRAW_SECONDS)])
def test_a_bar_on_a_log_redraws_every_half_minute_and_on_a_terminal_as_tqdm_does(monkeypatch, tty, seconds):
    """Where standard error is not a terminal (a log file, a batch system's output) every redraw of a bar is appended
    to it: a 13-s CSV fit wrote 110 of them on one line. There the bar redraws at most every LOG_REDRAW_SECONDS; on a
    terminal every 0.1 s, tqdm's own; its first and last drawing either way."""
    stream = _Stream(tty)
    monkeypatch.setattr(hooks.sys, "stderr", stream)
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    clock = iter(range(10**6))  # tqdm's clock: a second a reading, so that each step is a second after the last
    monkeypatch.setattr(tqdm.std, "time", lambda: float(next(clock)))
    trainer = SimpleNamespace(n_steps=0, method="ep", history={"log_marginal_likelihood": []}, objective="log Z")
    run = _run(trainer, minibatch=True, n_batches=3)
    run.X, run.settings = np.zeros((6, 1)), SimpleNamespace(max_iter=2, max_time=None, started=None, batch_size=2,
                                                            plateau=None)
    bar = hooks.Progress()
    bar.start(run)
    bar.new_epoch(run)
    assert bar.bar.mininterval == seconds
    for step in range(1, 7):
        trainer.n_steps = step
        bar.after_step(run, -1.0, recorded=False)
    run.stop_reason = "max_iter"
    bar.finish(run)
    drawn = {int(count) for count in re.findall(r" (\d)/6 ", "".join(stream.text))}
    # the first drawing and the last, and on a log only those and the one below the estimate's line (a line said
    # above a bar redraws it: after the first epoch's 3 steps); on a terminal every step, a second apart
    assert drawn == ({0, 3, 6} if seconds == hooks.LOG_REDRAW_SECONDS else set(range(7)))


def test_a_notebooks_bar_redraws_as_tqdm_does(monkeypatch):
    """In Jupyter ``tqdm.auto`` draws a widget, redrawn in place, on a standard error that is no terminal: its bar
    keeps tqdm's 0.1 s (30 s would leave the widget still for half a minute)."""
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    widget = type("tqdm_notebook", (hooks.tqdm,), {"__module__": "tqdm.notebook"})
    monkeypatch.setattr(hooks, "tqdm", type("tqdm_auto", (widget,), {}))
    assert hooks._redraw_seconds(_Stream(False)) == 0.1


def test_a_users_tqdm_mininterval_is_kept(monkeypatch):
    """tqdm takes TQDM_MININTERVAL (read from the environment Python started with) where no interval is passed: a
    user's setting wins over both of agpc's, which then pass none."""
    monkeypatch.setenv("TQDM_MININTERVAL", "5")
    assert hooks._redraw_seconds(_Stream(False)) is None and hooks._redraw_seconds(_Stream(True)) is None


def _last_renders(err):
    """The last drawing of each line written to standard error (a bar redraws its line after a carriage return)."""
    return [line.split("\r")[-1].strip() for line in err.split("\n") if line.strip()]


def test_a_batch_fit_names_its_stages_and_says_its_plan_and_estimate_first(capsys):
    """Batch EP: a line of what the run will do at most (counted as max_iter counts), an estimate of what it costs
    once its first iterations are timed, a bar for the warm-up sweeps and one for the max_iter iterations, a line for
    the final pass; n_iter_ counts the warm-up sweeps too, n_warmup_ says how many."""
    X, y = make_banana(80, random_state=2)
    model = GPClassifier(n_inducing=5, max_iter=4, verbose=True).fit(X, y)
    lines = _last_renders(capsys.readouterr().err)
    warmup = training.TrainSettings().n_warmup
    assert lines[0] == (f"agpc ep: 80 rows, batch steps on all rows; {warmup} warm-up sweeps, then at most 4 iterations "
                        "(max_iter), fewer once it settles; a time estimate follows the first steps")
    assert lines[1].startswith(f"agpc ep warm-up sweeps: 100%") and f" {warmup}/{warmup} " in lines[1]
    assert lines[2].startswith("agpc ep: estimate from the first steps (") and lines[2].endswith(" for 4 iterations")
    assert lines[3].startswith("agpc ep training: 100%") and " 4/4 " in lines[3] and "stopped" not in lines[3]
    assert lines[4] == "agpc ep: final pass over all 80 rows (q and its log Z_q (EP estimate) at the learned hyper-parameters)"
    assert len(lines) == 5
    assert (model.n_iter_, model.n_warmup_) == (4 + warmup, warmup)


def test_a_stage_that_stops_early_ends_its_bar_at_its_count_with_the_reason(capsys):
    """The exact model's kernel choice: one named run a stage; a stage that settles before max_iter closes its bar
    full at the count it reached, saying where and why it stopped (not left at 37 %)."""
    X, y = make_banana(60, random_state=3)
    GPClassifier(max_iter=250, verbose=True, random_state=0).fit(X, y)
    lines = _last_renders(capsys.readouterr().err)
    bars = [line for line in lines if "] training: " in line]
    assert [bar.split(":")[0] for bar in bars] == [f"agpc ep [kernel choice {i}/4" for i in range(1, 5)]
    for bar in bars:
        done, total = (int(v) for v in re.search(r"\| (\d+)/(\d+) \[", bar).groups())
        assert "] training: 100%" in bar and done == total
        assert f"stopped=at {done} of 250: log Z stopped rising (plateau)" in bar
    assert "kernel choice 2/4: a lengthscale per feature]: estimate from the first steps" in "\n".join(lines)


def test_a_minibatch_fit_estimates_its_epochs_and_its_bar_shows_the_last_epochs_log_z(capsys):
    X, y = make_banana(80, random_state=2)
    model = GPClassifier(method="sep", n_inducing=5, batch_size=20, max_iter=2, verbose=True).fit(X, y)
    lines = _last_renders(capsys.readouterr().err)
    assert lines[0] == ("agpc sep: 80 rows in minibatches of 20 (4 steps an epoch); at most 2 epochs (max_iter) = 8 "
                        "steps, fewer once log Z stops rising; a time estimate follows the first steps")
    assert lines[1].startswith("agpc sep: estimate from the first steps (") and lines[1].endswith(" for 2 epochs")
    assert lines[2].startswith("agpc sep training, epoch 2/2: 100%") and " 8/8 " in lines[2]
    assert f"log Z_q (EP estimate)={model.history_['log_marginal_likelihood'][-1]:.6g}" in lines[2]
    assert model.n_warmup_ == 0 and model.n_iter_ == 2


@pytest.mark.parametrize("method, label", [("ep", "log Z_q (EP estimate)"), ("adf", "log Z_q (EP estimate)"),
                                           ("gfitc", "log Z_EP (EP estimate)"), ("svi", "ELBO"),
                                           ("vi-jj-hybrid", "variational bound")])
def test_the_bar_names_what_each_engine_climbs(capsys, method, label):
    """The bar's log Z is named by the engine (``Engine.objective``), not by a match on the method's name: EP's
    estimate of the evidence, GFITC's, SVI's lower bound, the vi-* bounds."""
    X, y = make_banana(60, random_state=3)
    GPClassifier(method=method, n_inducing=5, max_iter=2, verbose=True).fit(X, y)
    assert f"{label}=" in capsys.readouterr().err


def _plateau_run(history, n_steps, warmup, minibatch=False, climbed=True):
    trainer = SimpleNamespace(history={"log_marginal_likelihood": history}, n_steps=n_steps, good=None,
                              engine=SimpleNamespace(has_params=True, minibatch=minibatch, log_z_climbed=climbed))
    return SimpleNamespace(trainer=trainer, minibatch=minibatch, warmup=warmup, converged=False, stop_reason=None,
                           early_stopped=False, went_back=False, kept={})


def test_the_plateau_window_starts_after_the_warm_up():
    """``hooks.Plateau`` (steps = 3): a batch fit stops once log Z rose by less than ``rise`` over 3 steps after the
    warm-up, compared with a record after it too: not at the third step (whose window would start at the last warm-up
    sweep's record), at the fourth. Minibatch mode counts epochs, every record. A mutation audit (2026-12-02): the
    window's bound taken as >= passed every test."""
    flat = [-100.0, -9.0, -9.0, -9.0, -9.0]  # (two warm-up records, then three steps)
    run = _plateau_run(flat, n_steps=5, warmup=2)
    hooks.Plateau(3, 1.0).after_step(run, -9.0, True)
    assert not run.converged
    run = _plateau_run(flat + [-9.0], n_steps=6, warmup=2)
    hooks.Plateau(3, 1.0).after_step(run, -9.0, True)
    assert run.converged and run.stop_reason == "plateau"
    run = _plateau_run(flat[1:], n_steps=0, warmup=0, minibatch=True)  # (4 epochs' records)
    hooks.Plateau(3, 1.0).after_step(run, -9.0, True)
    assert run.converged


def _feed(hook, run, curve):
    """Record ``curve`` one batch step a value; the record at which the hook said converged (None: it did not)."""
    for value in curve:
        run.trainer.n_steps += 1
        run.trainer.history["log_marginal_likelihood"].append(value)
        at = len(run.trainer.history["log_marginal_likelihood"])
        run.trainer.good = {"state": {"at": at, "kernel": RBF(lengthscales=[1.0], amplitude=1.0)}}  # (no prior)
        hook.after_step(run, value, True)
        if run.converged:
            return len(run.trainer.history["log_marginal_likelihood"])
    return None


@pytest.mark.parametrize("minibatch, climbed", [(False, True), (False, False), (True, True)])
def test_a_drop_of_batch_log_z_is_not_a_plateau(minibatch, climbed):
    """A batch fit whose steps climb its exact log Z (``Engine.log_z_climbed``) is not stopped by one fall of it: SVI's
    default fit of banana's 5,300 rows, rising by 40 nats an iteration, stopped at its 61st on one overshoot of Adam.
    It goes on, and stops when the curve is flat again. ADF's steps do not climb its log Z, and minibatch epochs'
    log Z is an estimate: both stop at the fall, as before."""
    rising = [-400.0 + 10 * k for k in range(12)]  # -400 ... -290
    curve = rising + [-330.0] + [-280.0 + 5 * k for k in range(6)] + [-255.0] * 8
    run = _plateau_run([], n_steps=0, warmup=0, minibatch=minibatch, climbed=climbed)
    stopped = _feed(hooks.Plateau(4, 1.0), run, curve)
    if minibatch or not climbed:
        assert stopped == 13  # (the record of the fall)
    else:  # flat from the 19th record (-255.0) on: its window of 4 steps is flat at the 23rd
        assert stopped == 23 and run.stop_reason == "plateau"


def test_a_batch_fit_that_keeps_dropping_stops_after_windows_without_a_new_best():
    """An oscillating log Z (a learning rate too large) never has a flat window: the run stops once
    ``Plateau.drop_patience`` windows have passed since its best record, and its finish puts that state back."""
    curve = [-400.0 + 50 * k for k in range(5)] + [-250.0, -260.0, -270.0] * 20  # best: -200 at the 5th record
    run = _plateau_run([], n_steps=0, warmup=0)
    hook = hooks.Plateau(4, 1.0)
    restored = _putting_back(run)
    with pytest.warns(GuardWarning, match=r"log Z fell from its best, -200 at iteration 5, to -2[567]0 at the end"):
        assert _feed(hook, run, curve) == 5 + hooks.Plateau.drop_patience * 4
    assert [state["at"] for state in restored] == [5] and run.trainer.good["state"]["at"] == 5


def _putting_back(run):
    """The states ``finish`` puts back (``Engine.put_back``), into a list; the engine's snapshot is of the last."""
    restored = []
    engine = run.trainer.engine
    engine.put_back, engine.optimizer, run.trainer.method = restored.append, None, "svi"  # (Rprop: no learning rate)
    engine.snapshot, engine.kernel_of = (lambda: {"state": restored[-1]}), (lambda state: state["kernel"])
    return restored


def test_a_batch_fit_that_ends_below_its_best_returns_its_best_state():
    """SVI at learning_rate=0.1 on 2,000 banana rows: Adam overshot, and the fit stopped at 66 iterations at a log Z
    of -974.5, its best -768.8 at the 65th, with no word. The best state is the model now (its final pass gives the
    recorded best log Z again), said in a GuardWarning. (Since Adam steps Z in units of its spread, from k-means
    points of the columns' deviations, 0.1 climbs to -700.1 without falling back; 0.5 overshoots: -923.1 at the end,
    its best -874.4 at the 70th iteration.)"""
    X, y = make_banana(2000, random_state=0)
    with pytest.warns(GuardWarning, match="svi: log Z fell from its best.*learning_rate=0.5 overshoots"):
        model = GPClassifier(method="svi", n_inducing=10, max_iter=200, random_state=0, learning_rate=0.5).fit(X, y)
    history = np.asarray(model.history_["log_marginal_likelihood"])
    assert history[-1] < history.max() - 3e-4 * len(y)
    np.testing.assert_allclose(model.log_marginal_likelihood_, history.max(), rtol=1e-9)


@pytest.mark.parametrize("kept_at", [None, 5, 4])
def test_a_resumed_batch_fit_reads_its_best_record_back_and_its_state_from_the_checkpoint(kept_at):
    """A run resumed after its best record reads that record back from its history, so it stops where the
    uninterrupted run stops, and its state from the checkpoint (``run.kept``, which ``checkpointing.restore`` read):
    it puts that back as the uninterrupted run does. Where the checkpoint does not hold it (an engine whose sites are
    on a cluster's workers, a checkpoint from before kept states) or holds another record's state, it says that the
    best state came before the resume instead of putting back a state it does not have (a review, 2026-12-04: resumed,
    it forgot its best and returned log Z -779.3 where the uninterrupted run returned -768.8, silently)."""
    curve = [-400.0 + 50 * k for k in range(5)] + [-250.0, -260.0, -270.0] * 20  # best: -200 at the 5th record
    run = _plateau_run(curve[:8], n_steps=8, warmup=0)
    run.resumed, run.trainer.history["n_steps"] = True, list(range(1, 9))
    if kept_at is not None:
        run.kept["plateau"] = {"state": {"at": kept_at, "kernel": RBF(lengthscales=[1.0], amplitude=1.0)}, "at": kept_at}
    hook = hooks.Plateau(4, 1.0)
    hook.start(run)
    restored = _putting_back(run)
    said = (r"best, -200 at iteration 5, to -2[567]0 at the end: the model returned" if kept_at == 5 else
            r"best, -200 at iteration 5, .*came before the resume.*the last state")
    with pytest.warns(GuardWarning, match=said):
        assert _feed(hook, run, curve[8:]) == 5 + hooks.Plateau.drop_patience * 4  # (as uninterrupted)
    assert [state["at"] for state in restored] == ([5] if kept_at == 5 else [])


_OVERSHOOTING_SVI = dict(method="svi", n_inducing=10, max_iter=200, random_state=0, learning_rate=0.5)


@pytest.mark.parametrize("stop_at, every", [(78, 4), (71, 35)])
def test_a_batch_fit_resumed_after_its_best_state_goes_back_to_it(tmp_path, monkeypatch, stop_at, every):
    """The plateau stop's best state is in the checkpoint (``Run.kept``): SVI at learning_rate=0.5 on 2,000 banana rows
    has its best log Z at the 70th iteration and stops at the 90th (``test_a_batch_fit_that_ends_below_its_best_returns
    _its_best_state``); interrupted after 78 steps (its checkpoint at the 76th), the resumed fit puts back the 70th
    state as the uninterrupted one does: the same model. So too from a checkpoint written at the best step itself (the
    70th: a review found the checkpoint written before the plateau hook had kept that step's state, 0.37 off). (Written
    at learning_rate=0.1, best at the 65th: since Adam steps Z in units of its spread, 0.1 no longer overshoots.)"""
    X, y = make_banana(2000, random_state=0)
    with pytest.warns(GuardWarning, match="svi: log Z fell from its best, .* at iteration 70"):
        reference, resumed = interrupted_then_resumed(monkeypatch, _OVERSHOOTING_SVI, tmp_path / "ckpt", stop_at, X, y,
                                                      every=every)
    # (the resume was from step 76 or 70, as the helper checked; the resumed fit wrote its last checkpoint after)
    assert checkpoints.load_checkpoint(tmp_path / "ckpt", np.asarray)["kept"]["plateau"]["at"] == 70
    assert reference.n_iter_ == resumed.n_iter_ == 90
    np.testing.assert_array_equal(resumed.predict_proba(X[:300]), reference.predict_proba(X[:300]))
    assert resumed.log_marginal_likelihood_ == reference.log_marginal_likelihood_


def test_a_fit_resumed_from_the_checkpoint_of_the_step_it_stopped_at_ends_there(tmp_path, monkeypatch):
    """A checkpoint written at the step where the run ended says so (``ended``), and the resumed run ends there: no
    step, the same model. Before, the plateau-stopped SVI fit above resumed from its last checkpoint trained 24
    iterations more (0.20 off), and an early-stopped fit went on from the best state it had put back. The resumed
    fit says what the guard did as the fit did: the plateau's best state put back (``went_back``; a review found the
    resumed fit silent)."""
    X, y = make_banana(2000, random_state=0)
    early = dict(n_inducing=30, max_iter=200, random_state=0, early_stopping=True, n_iter_no_change=5, plateau=None)
    for params, stopped in ((_OVERSHOOTING_SVI, "plateau"), (early, "early_stopping")):
        path = tmp_path / f"{stopped}.ckpt"
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", GuardWarning)
            reference = GPClassifier(**params, checkpoint_path=path, checkpoint_every=1).fit(X, y)
        saved = checkpoints.load_checkpoint(path, np.asarray)
        assert saved["ended"]["reason"] == reference.stop_reason_ == stopped
        assert saved["ended"]["went_back"] == (stopped == "plateau")
        steps = []
        monkeypatch.setattr(training.Trainer, "step", lambda *args, **kwargs: steps.append(1))
        with warnings.catch_warnings(record=True) as said_again:
            warnings.simplefilter("always", GuardWarning)
            resumed = GPClassifier(**params, checkpoint_path=path, checkpoint_every=1).fit(X, y, resume=True)
        monkeypatch.undo()
        assert steps == [] and resumed.stop_reason_ == stopped and resumed.n_iter_ == reference.n_iter_
        np.testing.assert_array_equal(resumed.predict_proba(X[:300]), reference.predict_proba(X[:300]))
        guard = [[str(w.message) for w in record if issubclass(w.category, GuardWarning)]
                 for record in (said, said_again)]
        assert guard[0] == guard[1] and any("log Z fell from its best" in m for m in guard[0]) == (stopped == "plateau")


@pytest.mark.parametrize("edit", ["shifts times 1e300", "lengthscales times e"])
def test_an_ended_checkpoint_whose_state_is_not_the_fits_is_refused(tmp_path, edit):
    """A resumed fit that had ended takes no step, so the state its checkpoint holds is the model: the first step's
    check (``restored_state_checked``) is made by evaluating one, uncommitted (``Trainer.log_z_here``), against the log
    Z the fit recorded of it there (``ended``): the early-stopped EP fit's checkpoint with its site shifts 1e300 times
    larger, or its lengthscales e times longer, is one ValueError naming the file (a review, 2026-12-04: they
    resumed to models 0.50 and 0.52 from the fit's, with no word)."""
    X, y = make_banana(1000, random_state=0)
    params = dict(n_inducing=30, max_iter=200, random_state=0, early_stopping=True, n_iter_no_change=5, plateau=None,
                  checkpoint_path=tmp_path / "ckpt", checkpoint_every=1)
    GPClassifier(**params).fit(X, y)
    if edit == "shifts times 1e300":
        _edit_checkpoint(tmp_path / "ckpt", lambda state: state["engine"]["dict"]["mu"], lambda mu: mu * 1e300)
    else:
        _edit_checkpoint(tmp_path / "ckpt", lambda state: state["engine"]["dict"]["kernel"]["dict"]["log_lengthscales"],
                         lambda value: value + 1.0)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "ckpt")) + r": the fit had ended at the step this "
                                         r"checkpoint was written \(early_stopping\), and the state it holds gives a "
                                         r"log Z of .* where the fit recorded"):
        GPClassifier(**params).fit(X, y, resume=True)


def test_an_ended_checkpoint_says_both_stops_and_only_the_runs_own(tmp_path):
    """Early stopping and the plateau stop at the same step: the stop reason is the plateau's, and the resumed fit
    says early stopping too, as the fit did (a review found ``early_stopped_`` False after the resume). A checkpoint
    whose ``ended`` names a stop this run's settings do not make (the plateau's, with ``plateau=None``) is refused:
    edited, it had returned a fit of 20 iterations of 50 as stopped on its plateau."""
    X, y = make_banana(600, random_state=19)  # (a fit whose two stops fall on one step; before k-means clustered in
    # the columns' deviations: seed 30, n_inducing=10, n_iter_no_change=2)
    params = dict(n_inducing=8, max_iter=200, random_state=19, early_stopping=True, n_iter_no_change=1,
                  checkpoint_every=1)
    path = tmp_path / "both.ckpt"
    reference = GPClassifier(**params, checkpoint_path=path).fit(X, y)
    assert reference.stop_reason_ == "plateau" and reference.early_stopped_
    resumed = GPClassifier(**params, checkpoint_path=path).fit(X, y, resume=True)
    assert resumed.stop_reason_ == "plateau" and resumed.early_stopped_ and resumed.n_iter_ == reference.n_iter_
    np.testing.assert_array_equal(resumed.predict_proba(X), reference.predict_proba(X))
    with pytest.raises(ValueError, match=re.escape(str(path)) + " is not a valid agpc checkpoint: ended: 'plateau', "
                                         "which this run's settings do not stop on"):
        GPClassifier(**{**params, "plateau": None}, checkpoint_path=path).fit(X, y, resume=True)


def _edit_checkpoint(path, node_of, change):
    """Rewrite the array of the checkpoint at ``path`` that ``node_of`` finds in its header's state tree (a node
    {"array": name}) as ``change`` of it."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    name = node_of(json.loads(str(arrays[checkpoints.HEADER_KEY]))["state"]["dict"])["array"]
    arrays[name] = change(arrays[name])
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def test_a_kept_state_edited_in_the_file_is_refused_where_it_is_put_back(tmp_path, monkeypatch):
    """The file's checks let through a kept state no fit reaches where only its score tells (here its lengthscales
    e times longer, a finite value of the right shape); where the resumed run puts it back, its log Z must be the one
    the run recorded of it: one ValueError naming the file, not a model 0.37 from the uninterrupted one (a review,
    2026-12-04)."""
    X, y = make_banana(2000, random_state=0)
    path = tmp_path / "ckpt"
    interrupted_with_checkpoints(monkeypatch, _OVERSHOOTING_SVI, path, 78, X, y)  # (its checkpoint at the 76th step)
    _edit_checkpoint(path, lambda state: state["kept"]["dict"]["plateau"]["dict"]["engine"]["dict"]["kernel"]["dict"][
        "log_lengthscales"], lambda value: value + 1.0)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": the plateau stop's best state, as the checkpoint "
                                         "holds it, gives a log Z of .* where the run recorded -874.35"):
        GPClassifier(**_OVERSHOOTING_SVI, checkpoint_path=path, checkpoint_every=4).fit(X, y, resume=True)


_KEPT_CASES = {"ep": dict(), "multiclass ep": dict(classes=3), "ordinal": dict(classes=3, likelihood="ordinal"),
               "exact": dict(n_inducing="all"), "gfitc": dict(method="gfitc"), "svi": dict(method="svi")}


@pytest.mark.parametrize("case", list(_KEPT_CASES))
def test_the_state_a_batch_plateau_keeps_is_the_state_of_its_record(monkeypatch, case):
    """The state ``hooks.Plateau`` puts back is the trainer's snapshot taken when a record was made: for every engine
    whose drops it judges, the final pass over that state gives the recorded log Z again (vi-* record the state after
    their step, not the one kept: they are not judged, ``QuadraticEngine.log_z_climbed``; a review found the restored
    vi-jj state one iteration before its record)."""
    options = dict(_KEPT_CASES[case])
    classes = options.pop("classes", 2)
    X, y = make_banana(120, random_state=2)
    labels = y if classes == 2 else np.digitize(X[:, 0], [-0.5, 0.5])
    kept = {}

    class Probe(hooks.Plateau):
        def after_step(self, run, log_z, recorded):
            super().after_step(run, log_z, recorded)
            history = run.trainer.history["log_marginal_likelihood"]
            if recorded and self._judges_drops(run) and len(history) == 8:
                kept.update(value=history[-1], snapshot=run.trainer.good)

        def finish(self, run):
            run.trainer.engine.restore(kept["snapshot"])

    monkeypatch.setattr(hooks, "Plateau", Probe)
    model = GPClassifier(**{"n_inducing": 8, "max_iter": 12, "random_state": 0, **options}).fit(X, labels)
    np.testing.assert_allclose(model.log_marginal_likelihood_, kept["value"], rtol=1e-10)
    assert not engines.QuadraticEngine.log_z_climbed


@pytest.mark.parametrize("make", [lambda: optim.Adam(learning_rate=0.01), lambda: optim.Adadelta(learning_rate=1.0)])
def test_the_guard_grows_a_halved_learning_rate_back_to_its_start_and_no_further(make):
    """``grow_steps`` (the guard's restoration after good steps): the learning rate grows by the factor up to the one
    the optimiser was built with, then says it did not grow. A mutation audit (2026-12-02): growth without that cap
    passed every test."""
    optimizer = make()
    start = optimizer.learning_rate
    optimizer.scale_steps(0.5)
    assert optimizer.grow_steps(1.5) and optimizer.learning_rate == pytest.approx(0.75 * start)
    assert optimizer.grow_steps(1.5) and optimizer.learning_rate == start
    assert not optimizer.grow_steps(1.5) and optimizer.learning_rate == start


@pytest.mark.parametrize("method, batch_size", [("ep", None), ("sep", 40), ("svi", 40)])
def test_a_time_budget_that_ends_the_fit_before_its_first_iteration_is_said(method, batch_size):
    """A hostile-input audit (2026-12-02): max_time=1e-9 returned (and agpc fit saved) a model of no iteration, the
    prior's 0.5 everywhere, with no word: a ConvergenceWarning says so. A budget that leaves room for one says
    nothing."""
    from sklearn.exceptions import ConvergenceWarning

    X, y = make_banana(120, random_state=2)
    options = dict(method=method, n_inducing=5, batch_size=batch_size, random_state=0)
    with pytest.warns(ConvergenceWarning, match=r"max_time=1e-09 s ended the fit before its first iteration: the "
                                                r"model is its start \(the prior, no row fitted\)"):
        model = GPClassifier(max_time=1e-9, **options).fit(X, y)
    assert model.n_iter_ == 0 and model.stop_reason_ == "max_time"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        assert GPClassifier(max_time=60.0, max_iter=2, **options).fit(X, y).n_iter_ >= 1


def test_kmeans_stops_at_its_deadline_after_its_first_iteration():
    """``inducing.kmeans``'s ``deadline`` (a fit's ``KMEANS_TIME_SHARE`` of max_time): one passed already leaves the
    first Lloyd iteration alone, the centres those of ``n_iter=1``; one far ahead changes nothing."""
    from agpc import inducing

    X, _ = make_banana(3000, random_state=3)
    one = inducing.kmeans(X, 20, random_state=0, n_iter=1)
    np.testing.assert_array_equal(inducing.kmeans(X, 20, random_state=0, deadline=0.0), one)
    full = inducing.kmeans(X, 20, random_state=0)
    assert not np.array_equal(full, one)
    np.testing.assert_array_equal(inducing.kmeans(X, 20, random_state=0, deadline=float("inf")), full)


def test_a_fit_with_max_time_gives_its_kmeans_a_tenth_of_it_and_says_when_it_ran_well_past(monkeypatch):
    """An audit (2026-12-03): at m = 500 on all the airline rows, max_time=1 took 4.5 s (k-means 1.8 s of it) and
    said nothing of it. k-means is given its deadline (``KMEANS_TIME_SHARE`` of max_time from the fit's start), and a
    fit past ``MAX_TIME_OVERRUN`` says how long it took, in the warning of a fit of no step or one of its own (here a
    final pass that takes 1.5 s); a fit within its budget says nothing."""
    import time

    from sklearn.exceptions import ConvergenceWarning

    from agpc import classifier, inducing

    X, y = make_banana(200, random_state=2)
    real_kmeans, real_posterior, seen = inducing.kmeans, engines.EPEngine.posterior, []

    def slow_kmeans(*args, deadline=None, **kwargs):
        seen.append(deadline - time.perf_counter())
        time.sleep(1.5)
        return real_kmeans(*args, deadline=deadline, **kwargs)

    def slow_posterior(self, *args, **kwargs):
        time.sleep(1.5)
        return real_posterior(self, *args, **kwargs)

    options = dict(method="ep", n_inducing=5, batch_size=40, random_state=0)
    monkeypatch.setattr(inducing, "kmeans", slow_kmeans)
    with pytest.warns(ConvergenceWarning, match=r"max_time=0\.5 s ended the fit before its first iteration: .*; the "
                                                r"fit took [0-9.]+ s, [0-9.]+ s of it choosing the inducing points"
                      ) as caught:
        GPClassifier(max_time=0.5, **options).fit(X, y)
    choosing = next(re.search(r"([0-9.]+) s of it choosing", str(w.message)) for w in caught
                    if "s of it choosing" in str(w.message))  # (the matched warning, whatever else was recorded)
    assert float(choosing.group(1)) >= 1.5  # (the 1.5-s sleep and k-means; a loaded worker adds to it)
    assert 0.0 < seen[0] <= inducing.KMEANS_TIME_SHARE * 0.5
    monkeypatch.setattr(hooks, "_rebuild_estimate", lambda *args, **kwargs: 0.0)  # (the first step's room: not
    # three timed rebuilds of a loaded worker, which could take the whole second before any step)
    monkeypatch.setattr(inducing, "kmeans", real_kmeans)
    monkeypatch.setattr(engines.EPEngine, "posterior", slow_posterior)
    with pytest.warns(UserWarning, match=r"max_time=1 s was overrun; the fit took [0-9.]+ s, [0-9.]+ s of it choosing"):
        model = GPClassifier(max_time=1.0, **options).fit(X, y)
    assert model.n_iter_ >= 1 and model.fit_time_ > classifier.MAX_TIME_OVERRUN[0] * 1.0 + classifier.MAX_TIME_OVERRUN[1]
    monkeypatch.setattr(engines.EPEngine, "posterior", real_posterior)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = GPClassifier(max_time=60.0, max_iter=2, **options).fit(X, y)
    assert model.fit_time_ < classifier.MAX_TIME_OVERRUN[0] * 60.0


def test_the_guard_grows_halved_damping_back_to_its_start_and_no_further():
    """``Engine.grow`` doubles halved damping up to the engine's own, never past it: a data-parallel round averages
    its shards' damping into values that are no power of two of it (0.99 and 0.495: 0.7425, which doubled is 1.485,
    a damping above 1). A mutation audit (2026-12-03): growth without the cap passed every test."""
    X, _ = make_banana(50, random_state=0)
    engine = engines.make_engine("ep", RBF(lengthscales=[1.0, 1.0]).for_inputs(X), X[:5].copy(), n_total=50,
                                 minibatch=False, jitter=1e-6)
    nominal = engine.nominal_damping
    assert 0.0 < nominal <= 1.0
    engine.damping = 0.75 * nominal
    assert engine.grow() and engine.damping == nominal
    assert not engine.grow() and engine.damping == nominal
    engine.damping = 0.3 * nominal
    assert engine.grow() and engine.damping == pytest.approx(0.6 * nominal)


def test_a_run_that_ended_within_rise_of_its_best_is_left_as_it_is():
    """The mutation audit of 2026-12-04: at the plateau stop the best state is put back (or, not held, warned
    about) only where the run ended more than ``rise`` below it; 0.5 nats below with rise 1.0 is left alone."""
    def go_back(last):
        plateau = hooks.Plateau(steps=5, rise=1.0)
        plateau.best = (-100.0, 3)
        history = {"log_marginal_likelihood": [-101.0, -100.2, -100.0, last]}
        run = SimpleNamespace(trainer=SimpleNamespace(history=history, method="ep"), kept={}, went_back=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plateau._go_back(run)
        return [str(w.message) for w in caught], run.went_back

    assert go_back(-100.5) == ([], False)
    said, went_back = go_back(-101.5)  # (beyond rise: the best state, not held here, is warned about)
    assert not went_back and len(said) == 1 and "log Z fell from its best" in said[0]


def test_a_short_max_time_is_not_said_overrun_within_its_fixed_allowance():
    """The mutation audit of 2026-12-04: a fit says ``max_time`` was overrun only past 1.25 max_time + 0.5 s
    (``classifier.MAX_TIME_OVERRUN``: the checks, the start and the last pass are not cut short), so a fit of
    ``max_time=0.1`` that took 0.3 s is not warned about, and one that took 0.7 s is."""
    from agpc.classifier import MAX_TIME_OVERRUN
    assert MAX_TIME_OVERRUN[0] * 0.1 + MAX_TIME_OVERRUN[1] < 0.7 and MAX_TIME_OVERRUN[0] + MAX_TIME_OVERRUN[1] < 1.8

    def said(fit_time, max_time=0.1):
        model = GPClassifier(max_time=max_time)
        model.fit_time_, model.init_time_ = fit_time, 0.01
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model._warn_of_time(SimpleNamespace(stopped_by_time=True, n_iter=5), False)
        return [str(w.message) for w in caught]

    assert said(0.3) == [] and said(0.6) == []
    assert len(said(0.7)) == 1 and "max_time=0.1 s was overrun" in said(0.7)[0]
    assert said(1.7, max_time=1.0) == [] and len(said(1.8, max_time=1.0)) == 1
