"""The one training loop, for every method (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.3; Hernandez-Lobato et
al. (2015); Izmailov & Kropotov (2017), Alg. 1).

Every method is an engine (``engines``) with one step and no loop of its own; ``Trainer`` wraps an engine's
steps in the divergence guard (a non-finite log Z or a failed Cholesky puts back the state before the last
good step and halves damping and step sizes), and ``train`` drives it: the batch or minibatch schedule and the
history. The rest of a run are its hooks (``hooks``): the time budget, validation and early stopping, checkpoints
and resume (``checkpointing``), the progress bar.

Batch mode: one step on all rows, repeated (EP / SEP / ADF: one parallel damped update of all sites, then
one step on the hyper-parameters, after ``n_warmup`` sweeps without; GFITC: damped EP sweeps, and a step on
the hyper-parameters whenever the sites have settled; SVI: one gradient step; ``vi-*``: one outer iteration).
``max_iter`` counts the steps on the hyper-parameters. Minibatch mode (Hernandez-Lobato & Hernandez-Lobato (2016), eq.
6): a step per minibatch, the data part of the gradient scaled by n / |M|; ``max_iter`` then counts epochs.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..backend import (JITTER_TRIES, CholeskyError, ModulesByName, array_device, array_namespace, asarray_like,
                       block_memory_advice, cholesky_with_jitter, floating_point_errors_held, host_rng, is_out_of_core,
                       jitter_ladder, jitter_raises_within, note_jitter, read_rows, row_chunk_bounds, to_host_vector,
                       warn_guard)
from ..checkpoint_rules import check_saved_anchor, check_saved_factor
from ..kernels import within_reach
from ..threads import with_blas_threads
from .checkpointing import FINGERPRINT_ROWS, data_fingerprint, fingerprint_stride, restored_state_checked
from .engines import ALL_METHODS, Engine, EngineOptions, Schedule, forwarding, make_engine
from .posterior import PRIOR_FACTOR_NAME
from .guard import GUARD_KEYS, REASONS, Guard
from .hooks import standard_hooks
from .settings import TrainSettings, setting_names, with_overrides

__all__ = ["train", "fit", "warn_if_no_checkpoint", "warn_if_never_scored", "HISTORY_KEYS", "Trainer", "TrainResult",
           "TrainSettings", "EngineOptions", "Run", "with_overrides", "setting_names", "standard_hooks", "ALL_METHODS",
           "MAX_FAILURES", "minibatch_layout", "data_fingerprint", "fingerprint_stride", "FINGERPRINT_ROWS",
           "check_saved_factor", "check_saved_anchor", "STOP_REASONS"]

HISTORY_KEYS = ("log_marginal_likelihood", "time", "n_invalid_sites", "damping", "n_steps") + GUARD_KEYS
# Why a run stopped (``TrainResult.stop_reason``): its step budget ran out; the sites settled below ``tol`` (nothing to
# optimise); ``hooks.Plateau`` saw log Z stop rising; ``hooks.TimeBudget``'s time ran out; ``hooks.Validation``'s
# early stopping. A stream (``partial_fit``) has no stop of its own.
STOP_REASONS = ("max_iter", "converged", "plateau", "max_time", "early_stopping", "partial_fit")
MAX_FAILURES = 30  # failed steps in a row after which the guard gives up


@dataclass
class TrainResult:
    kernel: object
    Z: object
    posterior: object
    log_z: float
    n_iter: int
    site_precision: object = None  # EP and GFITC (in training row order)
    site_shift: object = None
    factor: object = None  # SEP / ADF (and minibatch EP): the likelihood factor in u-space
    history: dict = field(default_factory=dict)
    converged: bool = False
    stopped_by_time: bool = False
    early_stopped: bool = False
    # the engine's final state (SVI: "whitened_mean", "whitened_chol"; vi-*: "xi")
    state: dict = field(default_factory=dict)
    jitter: float = None  # on the diagonal of Kmm at the end: the configured one, or what the guard raised it to
    checkpoints_written: int = 0  # by this run (0 when checkpoint_every exceeds its steps: the caller says so)
    stop_reason: str = "max_iter"  # of STOP_REASONS
    # of the n_iter history entries, the warm-up steps (``Schedule.warmup``: batch EP / SEP / ADF's sweeps; max_iter
    # counts the rest)
    n_warmup: int = 0


def _work(trainer, X=None, y=None, lo=0, hi=None, **_):
    """The shape of a call's work for the BLAS thread rule (``agpc.threads``): a minibatch step's rows
    lo:hi, or a pass over all rows of X, or (no X) the m x m algebra alone."""
    Z = trainer.engine.Z
    m = Z.shape[-2]
    rows = m if X is None else (hi - lo) if (trainer.minibatch and hi is not None) else X.shape[0]
    return {"rows": rows, "m": m, "n_features": Z.shape[-1], "block_rows": trainer.engine.block_rows,
            "threaded_passes": getattr(trainer.engine, "threaded_passes", False)}


class Trainer(ModulesByName, forwarding("engine", "damping", "names", "optimizer", "objective",
                                         settable=("state", "n_total"))):
    """The state of a training run and one guarded step of it; ``train`` and ``partial_fit`` drive it.

    ``engine``: an ``engines.Engine`` (a built-in one: ``engines.make_engine``; a registered method's:
    ``Method.make_engine``). ``minibatch``: the loop's schedule (default: the engine's). A step evaluates the rows it
    is given at the current state and commits the engine's update. A non-finite log Z or a failed Cholesky puts back
    the state before the last good step and halves damping and step sizes, again on each failure in a row (or, when the
    inducing points' prior covariance no longer factorises, raises the jitter, reported as a ``JitterWarning``);
    ``step_until_taken`` retries until a step is taken. The engine's state and settings are seen as the trainer's
    (``engines.forwarding``). Trainers pickle (``partial_fit`` models keep one).
    """

    def __init__(self, engine, *, minibatch=None):
        if not isinstance(engine, Engine):
            raise TypeError(f"Trainer drives an engine (agpc.inference.engines.Engine; a built-in one: "
                            f"engines.make_engine), not a {type(engine).__name__}")
        self.engine = engine
        # the loop's schedule (the engine's own steps may be minibatch steps in a loop of batch steps: rounds of
        # data-parallel minibatch steps on rows fewer than a round takes)
        self.minibatch = engine.minibatch if minibatch is None else minibatch
        self.xp = array_namespace(engine.Z)
        self.method = engine.name or type(engine).__name__
        self.history = {key: [] for key in HISTORY_KEYS}
        self.t0 = time.perf_counter()
        self.good = None
        self.good_prior = None
        self.n_rebuilds = 0
        self.failures = 0  # failed steps since the last good one, and what the guard did about them:
        self.halvings = 0  # reverts that halved damping and step sizes
        self.jitter_raises = 0  # raises of the jitter of Kmm
        self.n_steps = 0  # steps taken (failed ones not counted)
        self.n_updates = 0  # of them, steps that moved the hyper-parameters
        self.last = None  # the last step's ``engines.Outcome``
        self.guard = Guard()  # the checks of every step and the record of what was done about failures
        self.reverted = False  # the last step not taken was reverted (not repaired, nor retried as it was)
        self.epoch_log_z = None  # log Z at the exact rebuild ending the epoch being recorded (``rebuild_factor``)
        self._pending = []  # (log Z estimate, invalid rows) of the steps since the last record
        # NumPy's floating-point warnings of the last taken step's update, said once the state it made is judged
        # (the next step taken from it, or the final pass), dropped where a revert undoes it
        self.held_update = None

    # What a step changes of the trainer besides the engine's state: what ``mark`` keeps.
    _COUNTS = ("good", "last", "failures", "halvings", "jitter_raises", "n_steps", "n_updates", "reverted",
               "epoch_log_z", "n_rebuilds")

    def mark(self):
        """What ``back_to`` puts back: the engine's state, damping and step sizes (``Engine.snapshot``), its jitter,
        rows and sample weights, and the trainer's counts, history, pending records and guard (``partial_fit``: a
        call that fails leaves the stream as it was)."""
        engine = self.engine
        return (engine.snapshot(), engine.jitter, engine.n_total, engine.sample_weight,
                {key: getattr(self, key) for key in self._COUNTS}, list(self._pending),
                {key: len(values) for key, values in self.history.items()}, copy.deepcopy(self.guard))

    def back_to(self, mark):
        """The trainer as it was at ``mark()``."""
        snapshot, jitter, n_total, weights, counts, pending, lengths, guard = mark
        engine = self.engine
        engine.restore(snapshot)
        engine.jitter, engine.n_total, engine.sample_weight = jitter, n_total, weights
        for key, value in counts.items():
            setattr(self, key, value)
        self._pending, self.guard = pending, guard
        for key in list(self.history):
            if key in lengths:
                del self.history[key][lengths[key]:]
            else:  # (an entry begun since the mark)
                del self.history[key]

    def settle_factor(self, X, y, most, damping, *, while_rising=True):
        """Passes over all the rows (X, y) at the current hyper-parameters, each a damped update of the tied factor
        (its ``damping`` for these passes), ``most`` of them, or (``while_rising``) fewer where the log Z a pass is
        evaluated at falls: a batch fit's warm-up sweeps (``TrainSettings.n_warmup``), for a stream's step on a batch
        that is most of the rows it stands for (``streaming.step``). They are not steps: the counts and records are as
        before them, and the engine's damping too. Returns the passes taken."""
        engine = self.engine
        counts, pending = (self.n_steps, self.n_updates), len(self._pending)
        held = engine.damping, engine.nominal_damping
        engine.damping = engine.nominal_damping = damping  # (``grow`` would raise it to the stream's)
        best, taken = -math.inf, 0
        try:
            for _ in range(most):
                _, log_z = self.step_until_taken(X, y, 0, X.shape[0], stepping=False)
                taken += 1
                if while_rising and not log_z > best:
                    break
                best = log_z
        finally:
            engine.damping, engine.nominal_damping = held
            self.n_steps, self.n_updates = counts
            del self._pending[pending:]
        return taken

    def step_until_taken(self, X, y, lo, hi, *, stepping, weights=None, after_revert=None, repair=None):
        """``step`` again until one is taken (the one retry rule of every caller): each failure the guard has
        reverted (``after_revert()`` is then called, for a caller that keeps state beside the engine's); the guard
        gives up with a FloatingPointError after ``MAX_FAILURES`` failures in a row. ``repair``: what the guard
        calls first, once, to put q right (``guard``; minibatch EP: an exact rebuild of its site product).
        Returns (change, log Z)."""
        for _ in range(MAX_FAILURES + 1):
            took, change, log_z = self.step(X, y, lo, hi, stepping=stepping, weights=weights, repair=repair)
            if took:
                return change, log_z
            if after_revert is not None and self.reverted:
                after_revert()
        raise FloatingPointError(f"{self.method}: no step taken after {MAX_FAILURES + 1} attempts")

    @with_blas_threads(_work)
    def log_z_here(self, X, y, lo, hi):
        """log Z of a step from the current state on rows lo:hi, evaluated and not committed (NaN where a factorisation
        failed): what the guard judges a resumed run's first step by (``checkpointing.restored_state_checked``), for a
        resumed run that takes none (``hooks.Resume``: it had ended at its checkpoint's step)."""
        with floating_point_errors_held():
            try:
                summary, _ = self.engine.evaluate(X, y, lo, hi, stepping=False)
                return float(_host_scalars(summary)[0])
            except CholeskyError:
                return math.nan

    @with_blas_threads(_work)
    def step(self, X, y, lo, hi, *, stepping, weights=None, repair=None):
        """Evaluate rows lo:hi of (X, y) (all of them in batch mode), commit the update, maybe step the
        hyper-parameters. ``weights``: one weight per row of lo:hi (a padded minibatch: 0 on the padding),
        for the engines whose passes apply them (SVI, minibatch EP / SEP / ADF; the others refuse them).
        ``repair``: the guard's first remedy (``step_until_taken``).

        Returns (took the step, relative change of the sites / factor / xi or None, log Z estimate). A step the
        guard does not take (``guard``) was either repaired or reverted (``reverted``) before this returns.

        One device-to-host transfer a step: the engine's ``evaluate`` gives log Z, or a small vector whose
        first entry is log Z and whose others are what its ``apply`` needs on the host (the EP family: the
        count of failed cavities, the site change in batch mode); a failed Cholesky arrives as a NaN in it. NumPy's
        floating-point warnings of the evaluation are said only where the step is taken (a refused one's overflows
        are the guard's to say: ``backend.FloatingPointErrorsHeld``)."""
        with floating_point_errors_held() as held:
            try:
                with block_memory_advice(f"the {self.method} training step"):
                    summary, work = self.engine.evaluate(X, y, lo, hi, stepping=stepping, weights=weights)
                    scalars = _host_scalars(summary)
            except CholeskyError:  # engines that check their factorisations on the host raise instead
                scalars = [math.nan]
        log_z = float(scalars[0])
        rows = (hi - lo) if self.engine.minibatch else (X.shape[0] if X is not None else 0)
        engine = self.engine
        problem = self.guard.problem(log_z, scalars[1] if len(scalars) > 1 else 0.0, rows, repair is not None,
                                     float(engine.n_total), engine.optimizer is not None or engine.has_damping)
        if problem is not None:
            self._recover(problem, repair)
            if self.reverted:  # (the state the last update made is gone, and what it said with it)
                self.held_update = None
            return False, float("inf"), log_z
        self.say_held(held)
        self.failures = self.halvings = self.jitter_raises = 0
        self.reverted = False
        self.hold_as_good()
        with block_memory_advice(f"the {self.method} training step"), floating_point_errors_held() as update:
            self.last = self.engine.apply(work, lo, hi, stepping=stepping, scalars=scalars)
        self.held_update = update
        self.n_steps += 1
        self.n_updates += int(self.last.stepped)
        self._pending.append((log_z, self.last.n_invalid))
        if self.last.guard:  # (the inner steps' guards: a data-parallel round's shards)
            self.guard.add(self.last.guard)
        if self.guard.taken(log_z) and self.engine.grow():
            self.guard.note("guard_restored")
        return True, self.last.change, log_z

    def hold_as_good(self):
        """The engine's current state is the one a revert puts back (``good``), and its kernel and inducing points what
        a jitter raise is weighed against (``good_prior``: references, no array operation; ``_jitter_reach``)."""
        self.good = self.engine.snapshot()
        self.good_prior = (self.engine.kernel, self.engine.Z)

    def say_held(self, held=None):
        """Say the floating-point warnings held of the last update (``held_update``) and ``held``: their state is
        judged good."""
        for each in (self.held_update, held):
            if each is not None:
                each.say()
        self.held_update = None

    def _recover(self, problem, repair=None):
        """The guard's path (``guard``), after a step it did not take because of ``problem`` (a key of
        ``guard.REASONS``): a ``repair`` first (once since the last good step: the step is then tried again as it
        was); else, for a log Z that is not finite, where the prior covariance of the inducing points no longer
        factorises at the configured jitter, raise the jitter (reported by ``backend.note_jitter``: one
        ``JitterWarning`` a fit, saying from what to what) and try again; otherwise put back the state before the
        last good step and halve the damping and the step sizes. Gives up with a FloatingPointError that says
        what was tried: after ``MAX_FAILURES`` failures in a row, or at once when there is no good state to go
        back to (the very first step) or nothing to halve."""
        self.failures += 1
        self.reverted = False
        engine, guard = self.engine, self.guard
        guard.rejected(problem)
        if repair is not None and not guard.repaired and self.failures <= MAX_FAILURES:
            guard.repaired = True
            if _done_or_no_model(repair):
                guard.note("guard_rebuilds")
                return
            # (else the state is no model, Kmm of NaN: a step of a huge learning rate took the kernel out of the
            # floats, which no rebuild of q makes one; the revert below may. Minibatch EP at learning_rate=1e8 raised
            # the rebuild's CholeskyError out of fit)
        if problem == "improper":
            try:
                with floating_point_errors_held():  # (a kernel out of the floats overflows: the guard says what it does)
                    needed = _jitter_needed(engine.kernel, engine.Z, engine.jitter)
            except CholeskyError:  # (Kmm of NaN or inf: the hyper-parameters left the floats, as a step of a huge
                needed = engine.jitter  # learning rate takes them; no jitter helps, a revert and a smaller step may)
            # (a raise beyond what the good state's K(Z, Z) would take is a step that left the kernel's scale, not one
            # that needs more round-off room: Adam at learning_rate=1e3 took the amplitude to 1e77 and the jitter to
            # 6e70, kept when the amplitude came back, and the fit ended flat at probability 0.5)
            if engine.jitter < needed <= _jitter_reach(self.good_prior) and self.failures <= MAX_FAILURES:
                note_jitter(f"{PRIOR_FACTOR_NAME}: the model's jitter", engine.jitter, needed)
                engine.jitter = needed
                self.jitter_raises += 1
                guard.note("jitter")
                return
        what = "log Z is not finite" if problem == "improper" else f"{REASONS[problem]}"
        tried = self._tried()
        if self.good is None:
            raise FloatingPointError(
                f"{self.method} diverged: {what} at the first step (of this run or since its resume), "
                f"before any good state to go back to ({tried}); try standardised inputs, a larger jitter or fewer "
                "inducing points"
            )
        if self.failures > MAX_FAILURES:
            raise FloatingPointError(
                f"{self.method} diverged: {what}, and stayed so after {self.failures} failed steps in "
                f"a row ({tried}); try a smaller damping or learning rate, or standardised inputs"
            )
        engine.restore(self.good)  # (which puts back the good step's damping and step sizes too)
        self.reverted = True
        # Halvings compound over failures in a row: the k-th retry runs at 2^-k of the good step's damping and
        # step sizes (halving only once after each revert would retry the same step with the same settings).
        for _ in range(self.halvings + 1):
            if not engine.shrink():
                raise FloatingPointError(
                    f"{self.method} diverged: {what}, and the method has no damping or step size to "
                    f"halve ({tried}); try standardised inputs or a larger jitter"
                )
        self.halvings += 1
        guard.note("guard_halvings")

    def _tried(self):
        """What the guard did since the last good step, for the divergence message."""
        what = [f"damping and step sizes halved {self.halvings} time{'s' if self.halvings != 1 else ''}"
                if self.halvings else "nothing halved"]
        what.append(f"jitter raised {self.jitter_raises} time{'s' if self.jitter_raises != 1 else ''} to "
                    f"{self.engine.jitter:.1e}" if self.jitter_raises else f"jitter {self.engine.jitter:.1e}")
        return ", ".join(what)

    def record(self):
        """Close a history entry: minibatch mode, the mean log Z estimate of the steps since the last one (an
        epoch), or the exact log Z of the rebuild at the epoch's end where the schedule makes one (``rebuild_factor``;
        minibatch EP's log Z_q: the steps' estimates of its first epoch, each of rows that have no site yet while q
        holds those already visited, are no estimate of the evidence); batch mode, the last step's."""
        if not self._pending:
            return
        values = [v for v, _ in self._pending]
        invalid = [k for _, k in self._pending]
        h = self.history
        if self.epoch_log_z is not None:  # the exact log Z at the epoch's end (minibatch EP's log Z_q)
            values, self.epoch_log_z = [self.epoch_log_z], None
        h["log_marginal_likelihood"].append(sum(values) / len(values) if self.minibatch else values[-1])
        h["n_invalid_sites"].append(sum(invalid) if self.minibatch else invalid[-1])
        h["time"].append(time.perf_counter() - self.t0)
        h["damping"].append(self.damping)
        h["n_steps"].append(self.n_steps)
        for key, count in zip(GUARD_KEYS, self.guard.flush()):
            h.setdefault(key, [0] * (len(h["n_steps"]) - 1)).append(count)  # (a checkpoint from before the guard)
        self._pending = []

    @with_blas_threads(_work)
    def rebuild_factor(self, X, y, want_log_z=False):
        """The engine's running q made exact (``Engine.rebuild_factor``; minibatch EP: the product of all sites at
        the current hyper-parameters); ``want_log_z`` (an epoch's end): with log Z at it, exact, which the epoch's
        history entry then holds."""
        self.n_rebuilds += 1
        with block_memory_advice(f"{self.method}'s exact rebuild of the site product"):
            log_z = self.engine.rebuild_factor(X, y, want_log_z=want_log_z)
        if log_z is not None:
            self.epoch_log_z = log_z

    def rebuild_or_revert(self, X, y, want_log_z=False):
        """``rebuild_factor`` of the loop's own rebuilds (an epoch's end, one the engine asks for before a step), where
        the last step left a state that is no model (Kmm of NaN: a step of a huge learning rate took the kernel out
        of the floats; multiclass minibatch EP at learning_rate=1e8 raised the rebuild's CholeskyError out of fit):
        the guard puts the state before that step back and halves its steps (``_recover``), and q is rebuilt there.
        The guard gives up as it does on a step (a FloatingPointError saying what it tried)."""
        done = _done_or_no_model(lambda: self.rebuild_factor(X, y, want_log_z=want_log_z))
        if not done or (want_log_z and not math.isfinite(self.epoch_log_z)):  # (a pass of NaN: no model either)
            self._recover("improper")
            self.rebuild_factor(X, y, want_log_z=want_log_z)

    def validation_scores(self, X, y, validation):
        """Test NLL and error of the current state on ``validation`` = (X_val, y_val) (labels as the engine takes
        them): what the validation hook records at each validation step."""
        X_val, y_val = validation
        with block_memory_advice(f"{self.method}'s scoring of the validation data"):
            post, _ = self.engine.posterior(X, y, want_log_z=False)
            y_val = read_rows(y_val, 0, y_val.shape[0], self.engine.Z)
            # (rows far outside the kernel's reach scored as prediction scores them: validation rows of 1e300 overflowed
            # their squared distances, with NumPy's warnings, where the clamped rows give the same kernel, 0)
            return self.engine.validation_scores(post, within_reach(self.engine.kernel, self.engine.Z, X_val), y_val)

    @with_blas_threads(_work)
    def posterior(self, X=None, y=None, want_log_z=True):
        """q at the current state and its log Z (the engine's final pass, or the history's last estimate;
        ``want_log_z=False``: no pass over the rows where the engine can do without one)."""
        with block_memory_advice(f"{self.method}'s final pass over all rows"):
            post, log_z = self.engine.posterior(X, y, want_log_z=want_log_z)
        if log_z is None:
            values = self.history["log_marginal_likelihood"]
            log_z = values[-1] if values else float("nan")
        return post, log_z


@dataclass
class Run:
    """What the loop and its hooks share of a run in progress (rows in the order the loop visits them)."""

    trainer: Trainer
    X: object
    y: object
    rng: object
    settings: TrainSettings
    batches: list  # the minibatches as row ranges (batch mode: one, all rows)
    chunk_batches: list  # for each stored chunk, the range of its minibatches
    permutation: object = None  # the rows' order (None: the caller's)
    schedule: Schedule = field(default_factory=Schedule)  # the engine's (``Engine.schedule``), which the loop follows
    order: list = field(default_factory=list)  # the minibatches of this epoch still to step
    best: dict = field(default_factory=lambda: {"nll": math.inf, "reference": math.inf, "since": 0})
    # States the hooks keep to go back to, by the hook's name ("validation": early stopping's best; "plateau": the
    # plateau stop's best log Z), each {"state": ``Engine.keep``'s, "at": the record it was kept at}: a checkpoint
    # holds them, so that a resumed run goes back to the state the uninterrupted one goes back to.
    kept: dict = field(default_factory=dict)
    postfix: dict = field(default_factory=dict)  # what the progress bar shows beside log Z
    resumed: bool = False
    stopped_by_time: bool = False
    early_stopped: bool = False
    converged: bool = False  # (a hook may say so: ``hooks.Plateau``)
    # the plateau stop put its best state back where the run ended (``hooks.Plateau``): a checkpoint written there
    # says so, and the run resumed from it says it again, as the uninterrupted run did (``hooks.Resume``)
    went_back: bool = False
    checkpoints_written: int = 0
    stop_reason: str = "max_iter"  # of STOP_REASONS: set where the run is stopped

    @property
    def minibatch(self):
        return self.trainer.minibatch

    @property
    def warmup(self):
        """The batch steps before the first hyper-parameter step (``Schedule.warmup``)."""
        return self.schedule.warmup

    def finished(self):
        """Whether the run is over: ``max_iter`` epochs (minibatch mode), hyper-parameter steps and the schedule lets
        it end (batch mode; ``Schedule.may_finish``: GFITC's settled sites), or steps (no hyper-parameters to step);
        or it ended before (a resumed run whose checkpoint was written where it ended: ``hooks.Resume``)."""
        trainer, max_iter = self.trainer, self.settings.max_iter
        if self.converged or self.early_stopped:
            return True
        if self.minibatch:
            return trainer.n_steps >= max_iter * len(self.batches)
        if trainer.engine.has_params:
            return trainer.n_updates >= max_iter and self.schedule.may_finish()
        return trainer.n_steps >= max_iter


def _done_or_no_model(rebuild):
    """Whether ``rebuild()`` (an exact rebuild of q) went through; False where the state it rebuilds from is no model
    (a factorisation of NaN). The floating-point warnings of a rebuild that failed are dropped (what the guard does
    then is its own to say, as for a step it does not take); those of one that went through are said."""
    with floating_point_errors_held() as held:
        try:
            rebuild()
        except (CholeskyError, FloatingPointError):
            return False
    held.say()
    return True


def train(X, y, engine, settings, hooks=(), sample_weight=None):
    """Fit ``engine`` (an ``engines.Engine`` built for these rows) to (X, y): the likelihood approximation and the
    hyper-parameters, by the schedule of ``settings``; see the module docstring. ``hooks`` (``hooks.Hook``s, as
    ``hooks.standard_hooks`` builds them): the time budget, validation and early stopping, checkpoints, the
    progress bar. With nothing to optimise, batch steps run until the largest relative change of the sites
    (factor, xi) is below ``settings.tol`` (at most ``max_iter`` of them). ``sample_weight``: one weight a row
    (an array of the engine's namespace), which the engine takes or refuses (``Engine.take_sample_weight``).
    Returns a ``TrainResult``."""
    run = _start(X, y, engine, settings, hooks, sample_weight)
    with restored_state_checked(settings.checkpoint_path, run.trainer, run.resumed):
        return _steps(run, hooks)


def _steps(run, hooks):
    """``train``'s loop over the steps of a started ``run``, then its final pass (``_final_pass``)."""
    trainer, minibatch, schedule, engine, settings = (run.trainer, run.minibatch, run.schedule, run.trainer.engine,
                                                      run.settings)
    # The engine's schedule may make its running q exact at the end of every epoch (minibatch EP: its site product,
    # so that each row is visited once between rebuilds (``ep.Anchor``) and an epoch's validation scores q as the
    # sites make it at the current hyper-parameters, the model a fit returns), and whenever it asks (``rebuild_due``).

    def repair():  # the guard's first remedy where there are exact rebuilds: q rebuilt exactly
        with _timed(hooks, "rebuild of q"):
            trainer.rebuild_factor(run.X, run.y)

    while not run.finished():
        epoch_ends = schedule.epoch_rebuilds and (len(run.order) == 1 or (not run.order and len(run.batches) == 1))
        rebuild_first = schedule.rebuild_due()
        if any(hook.before_step(run, rebuild_first or epoch_ends) for hook in hooks):
            break
        if not run.order:
            run.order = _epoch_order(run.rng, run.chunk_batches, settings.shuffle) if minibatch else [0]
            for hook in hooks:
                hook.new_epoch(run)
        if rebuild_first:
            with _timed(hooks, "rebuild of q"):
                trainer.rebuild_or_revert(run.X, run.y)
        lo, hi = run.batches[run.order[0]]
        stepping = engine.has_params and (
            minibatch or (trainer.n_steps >= run.warmup and trainer.n_updates < settings.max_iter))
        with _timed(hooks, "step"):
            change, log_z = trainer.step_until_taken(run.X, run.y, lo, hi, stepping=stepping,
                                                     repair=repair if schedule.epoch_rebuilds else None)
        run.order.pop(0)
        if epoch_ends:
            with _timed(hooks, "rebuild"):
                trainer.rebuild_or_revert(run.X, run.y, want_log_z=True)
        recorded = (not run.order) if minibatch else trainer.last.record  # minibatch: once an epoch
        if recorded:
            trainer.record()
        run.postfix = {}
        if not engine.has_params and not minibatch and change is not None and change < settings.tol:
            run.converged, run.stop_reason = True, "converged"  # (before the hooks: a checkpoint says it ended)
        for hook in hooks:
            hook.after_step(run, log_z, recorded)
        if run.early_stopped or run.converged:
            break
    for hook in hooks:
        hook.finish(run)
    if minibatch:  # an epoch cut short (batch mode records its iterations as they end)
        trainer.record()
    said = trainer.guard.summary(trainer.method)
    if said is not None:
        warn_guard(said, stacklevel=3)  # (outside a fit's scope: train's caller)
    return _final_pass(run, hooks)


def _final_pass(run, hooks):
    """``train``'s end: the final pass over all rows that fits in the time left (``final_pass_kind``), the hooks told
    which, and the ``TrainResult``."""
    exact = final_pass_kind(run, hooks)
    for hook in hooks:
        hook.final_pass(run, exact)
    if exact == "q":  # q rebuilt exactly (minibatch EP: from all its sites), log Z stays the running estimate
        run.trainer.rebuild_factor(run.X, run.y, want_log_z=False)
    return _result(run, want_log_z=exact == "q and log Z")


def final_pass_kind(run, hooks):
    """What the final pass over all rows can be in the time left (``Hook.final_pass_fits``): "q and log Z" (batch
    mode always), "q" alone (the exact rebuild of a schedule that has them, ``Schedule.epoch_rebuilds``: minibatch
    EP's, one pass of the two), or None (q stays the running one, which training used)."""
    if not run.minibatch or all(hook.final_pass_fits() for hook in hooks):
        return "q and log Z"
    if run.schedule.epoch_rebuilds and all(hook.final_pass_fits(with_log_z=False) for hook in hooks):
        return "q"
    return None


def warn_if_no_checkpoint(checkpoint_path, checkpoint_every, result, resumed, stacklevel=2):
    """A ``UserWarning`` when a fit asked for checkpoints (``checkpoint_every``) but its ``result`` wrote none: it
    ended before its first. A resumed fit that ends before its next one leaves the one it resumed from: no warning."""
    if checkpoint_every is not None and result.checkpoints_written == 0 and not resumed:
        warnings.warn(f"no checkpoint was written to {str(checkpoint_path)!r}: the fit ended before its first "
                      f"checkpoint (checkpoint_every={checkpoint_every} steps is more than it took)", UserWarning,
                      stacklevel=stacklevel + 1)


def warn_if_never_scored(eval_every, n_iter_no_change, result, stacklevel=2):
    """A ``UserWarning`` naming the validation settings a fit's ``result`` shows it never used: ``eval_every`` and
    ``n_iter_no_change`` of a fit without validation rows (no ``validation_data``, no rows held out by
    ``early_stopping``), or ``eval_every`` of one that ended before its first score (more steps than the fit took:
    the history holds no score, and nothing could stop on one)."""
    history = result.history
    if "validation_nll" not in history:  # (the validation hook never started: ``hooks.Validation``)
        unused = [f"{name}={value!r}" for name, value in (("eval_every", eval_every),
                                                          ("n_iter_no_change", n_iter_no_change)) if value is not None]
        why = ("the fit had no validation rows to score (fit(..., validation_data=(X_val, y_val)), or "
               "early_stopping=True to hold some out)")
    else:
        steps = history["n_steps"][-1] if history.get("n_steps") else 0
        if eval_every is None or history["validation_nll"] or steps >= eval_every:
            return
        unused = [f"eval_every={eval_every!r}"]
        # (eval_every counts the loop's steps: a minibatch fit's are its minibatches, not its epochs)
        why = (f"the fit ended after {steps} steps (stop_reason_ {result.stop_reason!r}), before its first "
               "validation score, so history_ holds none; eval_every counts steps: iterations, warm-up sweeps "
               "included, or minibatches, max_iter epochs of them")
    if unused:
        warnings.warn(f"{' and '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used: {why}", UserWarning,
                      stacklevel=stacklevel + 1)


def _start(X, y, engine, settings, hooks, sample_weight=None):
    """The run: the rows in the order the loop visits them, the trainer, the minibatches; the hooks started."""
    xp, n = array_namespace(engine.Z), X.shape[0]
    out_of_core = is_out_of_core(X) or is_out_of_core(y)
    minibatch = settings.minibatch(n)
    rng = host_rng(settings.random_state)
    permutation = None
    if minibatch and settings.shuffle and not out_of_core:
        # Minibatches are contiguous slices of one random reordering of the rows (so that sites update by
        # slice, which the array API supports, and sorted data still give mixed minibatches); the order
        # in which the slices are visited is drawn again every epoch. Data on disk are not reordered
        # (that would read them all): their slices are visited in random order, so rows stored sorted
        # should be shuffled on disk first.
        permutation = asarray_like(rng.permutation(n), xp, device=array_device(engine.Z))
        X = xp.take(X, permutation, axis=0)
        y = xp.take(y, permutation, axis=0)
        if sample_weight is not None:
            sample_weight = xp.take(sample_weight, permutation, axis=0)
    engine.take_sample_weight(sample_weight)
    trainer = Trainer(engine, minibatch=minibatch)
    batches, chunk_batches = minibatch_layout(X, settings.batch_size, out_of_core) if minibatch else ([(0, n)], [])
    run = Run(trainer, X, y, rng, settings, batches, chunk_batches, permutation=permutation,
              schedule=engine.schedule(settings, minibatch))
    for hook in hooks:
        hook.start(run)
    return run


@contextmanager
def _timed(hooks, what):
    """Tell the hooks how long the block took (``what``: "step", "rebuild" or "rebuild of q")."""
    t = time.perf_counter()
    yield
    seconds = time.perf_counter() - t
    for hook in hooks:
        hook.measured(what, seconds)


def _result(run, want_log_z):
    """The final pass (``want_log_z=False``: minibatch mode under a time budget whose exact pass over all rows
    does not fit: q stays the running one, as during training, and log Z is the last epoch's estimate) and the
    ``TrainResult``, the engine's state in the caller's row order."""
    trainer, engine = run.trainer, run.trainer.engine
    # The final model's prior factor may need more jitter than the engine's (vi-* and GFITC factor Kmm with
    # ``backend.cholesky``, which adds to the diagonal itself): jitter_ must be what that factor was built with,
    # or a saved model re-factorises at the smaller jitter and warns again on load.
    with jitter_raises_within() as raises:
        posterior, final_log_z = _final_posterior(trainer, run, want_log_z)
    extra = max((after for what, before, after in raises if what.startswith(PRIOR_FACTOR_NAME) and before == 0.0),
                default=0.0)
    parts = engine.fitted_parts(run.permutation)
    return TrainResult(
        kernel=parts.kernel, Z=parts.Z, posterior=posterior, log_z=final_log_z,
        n_iter=len(trainer.history["log_marginal_likelihood"]), site_precision=parts.site_precision,
        site_shift=parts.site_shift, factor=parts.factor, history=trainer.history, converged=run.converged,
        stopped_by_time=run.stopped_by_time, early_stopped=run.early_stopped,
        checkpoints_written=run.checkpoints_written, state=parts.state, jitter=engine.jitter + extra,
        stop_reason=run.stop_reason, n_warmup=min(run.warmup, len(trainer.history["log_marginal_likelihood"])),
    )


def _final_posterior(trainer, run, want_log_z):
    """(q, log Z) of the engine's final state for ``_result``. The guard judged each step by the log Z of the state
    it started from, so the last step taken is never judged: where it left the model improper (a failed Cholesky
    factor, a log Z that is not finite or one that jumped as ``guard.Guard.problem`` judges a step's: SVI at
    learning_rate=1e3 took its hyper-parameters past the floats, and the fit ended in a CholeskyError, at 1e300 with
    log Z -inf and constant predictions), the state before it, which the guard took (``Trainer.good``), is the
    model, said in a ``GuardWarning``. NumPy's floating-point warnings of the pass are said only where its state is
    the model."""
    try:
        with floating_point_errors_held() as held:
            posterior, log_z = trainer.posterior(run.X, run.y, want_log_z=want_log_z)
        # (a jump as the guard judges a step's: a finite log Z orders of magnitude from the steps' is no more the
        # model than a NaN; seen at -1.9e90 on 2,000 rows whose steps were at -1.4e7, 80% of the rows then wrong,
        # under a change to the kernel priors, not kept, that left them finite where theta underflowed)
        # (and a hyper-parameter stepped to NaN, as ``optim.bounded_step`` marks one stepped past the floats: q and
        # log Z need not see it, as SEP's tied factor does not see the latent noise's, and its predictions are NaN)
        if (not want_log_z or trainer.guard.problem(float(log_z), n_total=float(trainer.engine.n_total)) is None) \
                and not _nan_parameter(trainer.engine):
            trainer.say_held(held)
            return posterior, log_z
    except CholeskyError:
        if trainer.good is None:
            raise
    if trainer.good is None:
        return posterior, log_z
    trainer.engine.restore(trainer.good)
    warn_guard(f"{trainer.method}: the last step left the model improper (log Z not finite, a jump of it, or a "
               "Cholesky factor failed): the model returned is the one before it; try a smaller learning_rate or "
               "damping",
               stacklevel=4)
    return trainer.posterior(run.X, run.y, want_log_z=want_log_z)


def fit(X, y, kernel, Z, *, method="ep", passes=None, validation=None, sample_weight=None, **settings):
    """``train`` with the built-in engine of ``method`` (one of ``ALL_METHODS``) at (kernel, Z) and the standard
    hooks: ``settings`` by name, the fields of ``TrainSettings`` and ``engines.EngineOptions`` (``tol`` is both);
    ``passes``: where the engine's passes run (``exact_ep``, a ``dask_engine.DaskPasses``); ``validation``:
    (X_val, y_val), labels as the engine takes them; ``sample_weight``: ``train``'s."""
    loop, options = with_overrides(TrainSettings(), EngineOptions(), settings)
    engine = make_engine(method, kernel, Z, n_total=X.shape[0], minibatch=loop.minibatch(X.shape[0]), passes=passes,
                         **vars(options))
    return train(X, y, engine, loop, standard_hooks(loop, validation), sample_weight=sample_weight)


def _nan_parameter(engine):
    """Whether a hyper-parameter of ``engine`` (its kernel's or the inducing points) is NaN: one host read, of the
    final state (``_final_posterior``)."""
    xp = array_namespace(engine.Z)
    found = xp.any(xp.isnan(engine.Z))
    for value in engine.kernel.params.values():
        found = xp.logical_or(found, xp.any(xp.isnan(value)))
    return bool(found)


def _host_scalars(summary):
    """A step's scalars as Python floats, brought to the host in one transfer (log Z first)."""
    if isinstance(summary, (int, float)):
        return [float(summary)]
    return [float(v) for v in to_host_vector(summary)]


def _jitter_reach(prior):
    """The most the guard raises the jitter to: ten times the largest jitter ``backend.cholesky_with_jitter`` would add
    to the prior covariance of the inducing points of ``prior`` (kernel, Z: the last good state's; the ladder one rung
    further, room for a step that grew the kernel's scale up to tenfold), inf where there is none yet (a host-side
    check of the guard's path)."""
    if prior is None:
        return math.inf
    kernel, Z = prior
    return max(jitter_ladder(k.K(Zc), JITTER_TRIES + 1)[-1] for k, Zc in kernel.latent_parts(Z))


def _jitter_needed(kernel, Z, jitter):
    """The jitter with which the prior covariance of the inducing points factorises: ``jitter`` itself
    when it does, a larger value found by ``backend.cholesky``'s escalation otherwise (host-side checks:
    run only on the guard's path). Raises CholeskyError when no jitter helps."""
    needed = jitter
    for k, Zc in kernel.latent_parts(Z):
        xp = array_namespace(Zc)
        Kmm = k.K(Zc) + jitter * xp.eye(Zc.shape[0], dtype=Zc.dtype, device=array_device(Zc))
        _, added = cholesky_with_jitter(Kmm, what=PRIOR_FACTOR_NAME, report=False)
        needed = max(needed, jitter + added)
    return needed


def minibatch_layout(X, batch_size, out_of_core):
    """(batches, chunk_batches): the minibatches as row ranges, and for each stored chunk the range of its
    minibatches. Data on disk or on a cluster: minibatches lie inside the stored chunks of rows, and an
    epoch (``_epoch_order``) visits the chunks in random order and the minibatches of each chunk in random
    order, so that each chunk is read once an epoch (in memory: one chunk, the whole data)."""
    n = X.shape[0]
    chunks = row_chunk_bounds(X) if out_of_core else [(0, n)]
    batches, chunk_batches = [], []
    for start, stop in chunks:
        first = len(batches)
        batches += [(lo, min(stop, lo + int(batch_size))) for lo in range(start, stop, int(batch_size))]
        chunk_batches.append(range(first, len(batches)))
    return batches, chunk_batches


def _epoch_order(rng, chunk_batches, shuffle):
    """The minibatches of one epoch: chunks in random order, each chunk's minibatches in random order."""
    if not shuffle:
        return [i for batches in chunk_batches for i in batches]
    if len(chunk_batches) == 1:
        return [int(i) for i in rng.permutation(len(chunk_batches[0]))]
    order = []
    for chunk in rng.permutation(len(chunk_batches)):
        batches = chunk_batches[int(chunk)]
        order += [batches[int(i)] for i in rng.permutation(len(batches))]
    return order
