"""The loop follows the schedule an engine contributes (``agpc.inference.contract.Schedule``, ``Engine.schedule``):
its warm-up steps, its exact rebuilds (before a step when it asks, at each epoch's end, as the guard's repair, as the
final pass of q alone, timed by the time budget) and whether a batch run may end; it reads no engine's own flags.
An engine of its own, knowing nothing of EP, asks for each and is given it; the loop ignoring its schedule fails."""

import math

import numpy as np
import pytest

from agpc.inference import engines, hooks, training
from agpc.kernels import RBF

X = np.column_stack([np.linspace(-1.0, 1.0, 12), np.zeros(12)])
y = np.where(X[:, 0] > 0, 1.0, -1.0)


class Scheduled(engines.Schedule):
    """An engine's own schedule: rebuilds where the engine says its q drifted, a batch run ending only after
    ``settle_after`` steps that moved nothing since the last that moved the hyper-parameters."""

    def __init__(self, engine, warmup=0, epoch_rebuilds=False):
        super().__init__(warmup, epoch_rebuilds)
        self.engine = engine

    def rebuild_due(self):
        return self.engine.drifted

    def may_finish(self):
        return self.engine.quiet >= self.engine.settle_after


class Logged(engines.Engine):
    """A toy engine that logs what the loop asks of it: each step's rows and whether it stepped, each exact rebuild
    (whether it wanted log Z), each timed rebuild; its log Z is a constant, its rebuilds' log Z a count."""

    def __init__(self, *, n_total, minibatch, warmup=0, epoch_rebuilds=False, drifted=False, fail_at=None,
                 settle_after=0):
        Z = X[:3].copy()
        super().__init__(RBF(lengthscales=[1.0, 1.0]), Z, names=["w"], optimizer=None, n_total=n_total,
                         minibatch=minibatch, jitter=1e-6, block_rows=None)
        self.name = "logged"
        self.warmup, self.epoch_rebuilds, self.drifted, self.fail_at = warmup, epoch_rebuilds, drifted, fail_at
        self.events, self.quiet, self.rebuilds, self.settle_after = [], 0, 0, settle_after

    def schedule(self, settings, minibatch):
        return Scheduled(self, warmup=self.warmup, epoch_rebuilds=self.epoch_rebuilds)

    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        steps = sum(event[0] == "step" for event in self.events)
        if steps == self.fail_at:  # (once: the guard's repair puts it right)
            self.fail_at = None
            return math.nan, None
        return -1.0, None

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        self.events.append(("step", lo, hi, stepping))
        self.quiet = 0 if stepping else self.quiet + 1
        return engines.Outcome(change=None, stepped=stepping, record=True)

    def rebuild_factor(self, X, y, want_log_z=False):
        self.drifted = False
        self.rebuilds += 1
        self.events.append(("rebuild", want_log_z))
        return 10.0 * self.rebuilds if want_log_z else None

    def time_rebuild(self, X, y, rows):
        self.events.append(("timed", rows))

    def posterior(self, X, y, want_log_z=True):
        self.events.append(("final", want_log_z))
        return "q", (-1.0 if want_log_z else None)

    def validation_scores(self, post, X_val, y_val):
        return 0.0, 0.0

    def checkpoint_state(self, path, step):
        return {}

    def restore_checkpoint(self, saved, path):
        pass


def _steps(engine):
    return [event[3] for event in engine.events if event[0] == "step"]


def _train(engine, hooks_=(), **settings):
    return training.train(X, y, engine, training.TrainSettings(**settings), list(hooks_))


def test_a_batch_run_takes_the_warm_up_steps_the_schedule_asks_for():
    engine = Logged(n_total=12, minibatch=False, warmup=3)
    result = _train(engine, max_iter=2)
    assert _steps(engine) == [False, False, False, True, True]  # (no warm-up: [True, True])
    assert result.n_warmup == 3 and result.n_iter == 5


def test_a_batch_run_ends_only_once_the_schedule_lets_it():
    """Its hyper-parameter steps spent, the run goes on stepping nothing until ``may_finish`` (GFITC's settling)."""
    engine = Logged(n_total=12, minibatch=False, settle_after=2)
    _train(engine, max_iter=2)
    assert _steps(engine) == [True, True, False, False]  # (ended at its steps: [True, True])


def test_a_minibatch_run_makes_the_rebuilds_its_schedule_asks_for():
    """Before the first step (the engine drifted), at each epoch's end (their log Z the history's entries), timed by
    the time budget before any (the rebuild of q alone, on all 12 rows: a warm-up and two timings; an epoch's end,
    two passes, is taken to cost twice that); the final pass is the engine's."""
    engine = Logged(n_total=12, minibatch=True, epoch_rebuilds=True, drifted=True)
    result = _train(engine, [hooks.TimeBudget(1e6)], batch_size=4, max_iter=2, shuffle=False)
    assert engine.events == (
        [("timed", 12)] * 3 + [("rebuild", False)]
        + [("step", 0, 4, True), ("step", 4, 8, True), ("step", 8, 12, True), ("rebuild", True)]
        + [("step", 0, 4, True), ("step", 4, 8, True), ("step", 8, 12, True), ("rebuild", True)]
        + [("final", True)])
    assert result.history["log_marginal_likelihood"] == [20.0, 30.0]  # (the epochs' rebuilds, not the steps' -1)


def test_the_hooks_are_told_a_rebuild_of_q_alone_apart_from_an_epochs_end():
    """A rebuild of q alone (one due before a step, the guard's repair) goes over the rows with sites only
    (``EPEngine.rows_in_q``: in the first epoch a share of the rows); the time budget's estimate of an epoch's end
    (q and log Z over every row) must not take its time. The hooks hear "rebuild of q" for it, "rebuild" for an epoch's
    end."""
    told = []

    class Told(hooks.Hook):
        def measured(self, what, seconds):
            told.append(what)

    engine = Logged(n_total=12, minibatch=True, epoch_rebuilds=True, drifted=True)
    budget = hooks.TimeBudget(1e6)
    _train(engine, [budget, Told()], batch_size=4, max_iter=1, shuffle=False)
    assert told == ["rebuild of q"] + ["step"] * 3 + ["rebuild"]
    budget.measured("rebuild of q", 123.0)
    assert 123.0 not in (budget.seconds["rebuild"], budget.seconds["final"])


def test_without_rebuilds_in_its_schedule_a_minibatch_run_makes_none():
    engine = Logged(n_total=12, minibatch=True)
    result = _train(engine, [hooks.TimeBudget(1e6)], batch_size=4, max_iter=2, shuffle=False)
    assert not [event for event in engine.events if event[0] in ("rebuild", "timed")]
    assert result.history["log_marginal_likelihood"] == [-1.0, -1.0]


def test_the_guard_repairs_by_the_schedules_rebuild_and_the_final_pass_may_be_q_alone():
    """A step whose log Z is not finite is first repaired by an exact rebuild (then taken as it was); where the
    final pass's log Z does not fit, the rebuild of q alone is made, and log Z stays the history's."""

    class NoRoomForLogZ(hooks.Hook):
        def final_pass_fits(self, with_log_z=True):
            return not with_log_z

    engine = Logged(n_total=12, minibatch=True, epoch_rebuilds=True, fail_at=1)
    with pytest.warns(UserWarning, match="rebuil"):
        result = _train(engine, [NoRoomForLogZ()], batch_size=4, max_iter=1, shuffle=False)
    assert engine.events == [("step", 0, 4, True), ("rebuild", False), ("step", 4, 8, True),
                             ("step", 8, 12, True), ("rebuild", True), ("rebuild", False), ("final", False)]
    assert result.log_z == 20.0

    engine = Logged(n_total=12, minibatch=True)  # no rebuilds: no final pass, q stays the running one
    _train(engine, [NoRoomForLogZ()], batch_size=4, max_iter=1, shuffle=False)
    assert engine.events[-1] == ("final", False) and ("rebuild", False) not in engine.events


def test_an_engine_telling_the_loop_its_schedule_by_the_former_flags_is_refused():
    """``uses_warmup``, ``needs_rebuild`` and ``settled`` were flags the loop read; an engine of one's own setting
    them would now be ignored, so its class (or, set on an instance, its run) is refused, saying what answers each."""
    with pytest.raises(TypeError, match=r"by \['needs_rebuild', 'uses_warmup'\].*needs_rebuild -> "
                                        r"Schedule.rebuild_due\(\), uses_warmup -> Schedule\(warmup=...\)"):
        type("Former", (engines.Engine,), {"uses_warmup": True, "needs_rebuild": False})

    class Plain(Logged):
        schedule = engines.Engine.schedule  # (the default)

    engine = Plain(n_total=12, minibatch=False)
    engine.settled = False
    with pytest.raises(TypeError, match=r"Plain tells the loop its schedule by \['settled'\].*Schedule.may_finish"):
        _train(engine, max_iter=1)


@pytest.mark.parametrize("method, minibatch, warmup, epoch_rebuilds", [
    ("ep", False, 10, False), ("sep", False, 10, False), ("ep", True, 0, True), ("sep", True, 0, False),
    ("gfitc", False, 0, False), ("svi", True, 0, False)])
def test_the_built_in_engines_schedules(method, minibatch, warmup, epoch_rebuilds):
    """Batch EP / SEP / ADF: ``n_warmup`` warm-up sweeps; minibatch EP: exact rebuilds of its running site product,
    and one before a step when it started from given sites; GFITC: a run ends once its sites settled."""
    kernel = RBF(lengthscales=[1.0, 1.0])
    engine = engines.make_engine(method, kernel, X[:3].copy(), n_total=12, minibatch=minibatch)
    schedule = engine.schedule(training.TrainSettings(), minibatch)
    assert (schedule.warmup, schedule.epoch_rebuilds, schedule.rebuild_due()) == (warmup, epoch_rebuilds, False)
    if method == "ep" and minibatch:
        engine.start_from_sites(np.ones(12), np.zeros(12))
        assert schedule.rebuild_due()
    if method == "gfitc":
        assert not schedule.may_finish()
        engine.settled = True
        assert schedule.may_finish()
    else:
        assert schedule.may_finish()
