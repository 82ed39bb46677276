"""The parts of a training run besides its steps, each a ``Hook`` the loop (``training.train``) calls at fixed
points: the time budget (``TimeBudget``), validation with early stopping (``Validation``), checkpoints and resume
(``Checkpoints``), the progress bar (``Progress``), the stop on a plateau of log Z (``Plateau``). ``standard_hooks``
builds those a run's settings ask for.

A hook sees the run (``training.Run``: the trainer, the rows in the loop's order, the random generator, the
epoch's remaining minibatches, the early-stopping record) and may stop it (``before_step``, or ``run.early_stopped``).
"""

from __future__ import annotations

import math
import os
import sys
import time
import weakref
from collections import deque
from contextlib import contextmanager

from tqdm.auto import tqdm

from ..backend import CholeskyError, floating_point_errors_held, warn_guard
from ..kernels import log_prior_and_grads
from .checkpointing import VALIDATION_KEYS, restore, run_fingerprint, write_checkpoint

__all__ = ["Hook", "TimeBudget", "Validation", "Checkpoints", "Progress", "Plateau", "standard_hooks",
           "VALIDATION_KEYS", "close_progress_bars"]

_open_bars = weakref.WeakSet()  # the bars of runs in progress (``close_progress_bars``)

# Seconds between a text bar's redraws where standard error is not a terminal (a log file, a batch system's output,
# a pipe): there each redraw is appended, a carriage return and the whole line, never overwritten. At tqdm's 0.1 s
# a 13-s fit of 8,000 CSV rows wrote 110 redraws (16 kB) on one line, and a 6-minute fit writes thousands; every 30 s
# a log keeps a reading of the run twice a minute, and a bar's first and last drawing as before.
LOG_REDRAW_SECONDS = 30.0


def _redraw_seconds(stream):
    """tqdm's ``mininterval`` for a bar on ``stream``: its own 0.1 s on a terminal and for a notebook's widget
    (``tqdm.auto`` draws one in Jupyter, whose standard error is no terminal but is redrawn in place),
    ``LOG_REDRAW_SECONDS`` for a text bar anywhere else; None (pass none) where the user set ``TQDM_MININTERVAL``
    in the environment, which tqdm then takes."""
    if "TQDM_MININTERVAL" in os.environ:
        return None
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return 0.1
    isatty = getattr(stream, "isatty", None)
    try:
        interactive = bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # (a closed or detached stream)
        interactive = False
    return 0.1 if interactive else LOG_REDRAW_SECONDS


def close_progress_bars():
    """Close every progress bar still open: a run that an exception ended (Ctrl-C, an error) never reaches its
    ``finish``, and its bar, left mid-line, was drawn again when it was collected, after whatever was printed in
    between (``agpc``'s one-line error, "agpc: interrupted", landed on the bar's line). Closed, a bar ends its line
    and is drawn no more."""
    for bar in list(_open_bars):
        bar.close()


class Hook:
    """A part of the loop besides stepping; every call's default does nothing."""

    def start(self, run):
        """The run is set up (the trainer fresh, nothing stepped)."""

    def before_step(self, run, rebuild_due):
        """Whether to stop before the next step (with an exact rebuild of q before or after it when ``rebuild_due``:
        at an epoch's end or where the engine's schedule asks, ``training.Run.schedule``; minibatch EP's)."""
        return False

    def new_epoch(self, run):
        """A new epoch (batch mode: iteration) begins."""

    def measured(self, what, seconds):
        """A "step" (its retries included), a "rebuild" (an epoch's end: q and log Z) or a "rebuild of q" alone (over
        the rows with sites: ``EPEngine.rows_in_q``) took ``seconds``."""

    def after_step(self, run, log_z, recorded):
        """A step was taken; ``recorded``: it closed an entry of the history."""

    def final_pass_fits(self, with_log_z=True):
        """Whether the final pass over all rows may run (minibatch mode; batch mode always makes it):
        ``with_log_z=False``, the exact rebuild of q alone where the schedule has them (``Schedule.epoch_rebuilds``:
        minibatch EP's, one pass; log Z stays the running estimate)."""
        return True

    def finish(self, run):
        """The loop is over (before the final pass)."""

    def final_pass(self, run, exact):
        """The final pass begins: ``exact`` ("q and log Z", or "q" alone), over all rows (None: q stays the running
        one: ``final_pass_fits``)."""


# Minibatch EP under a time budget keeps room for a final exact rebuild of q from all its sites at the learned
# hyper-parameters (one pass over the rows, ~6 s on 2,048,097 rows at m = 200; log Z_q's row terms would take a
# second and stay the running estimate), FINAL_RESERVE times its estimated cost (``_rebuild_estimate``): the running
# site product a stop mid-epoch would otherwise return holds its sites along the projections of the last rebuild,
# and predicts far worse once the kernel has moved (50,000 airline rows, m = 200: test NLL 0.6675 / 0.6468 / 0.6354
# after 2 / 4 / 6 s, against 0.6316 / 0.6251 / 0.6241 from the exact pass, 0.5 s). On all 2,048,097 rows (m = 200,
# batches of 200), keeping room for the two-pass rebuild (~14 s) / keeping none: 0.6237 / 0.6287 at 30 s, 0.6218 /
# 0.6295 at 45 s; 0.6293 with it at 24 s (about 5 s of training) against 0.6390 without it at 20 s. The same pass
# ran 1.1-1.9x its estimate in a process just after a 60-s, 2-thread GPflow run (13.6 s otherwise, 22.7-25.9 s
# there, while the steps kept their speed), hence the factor. Room is kept only where the budget is RESERVE_MIN_SHARE
# times the reservation (forced at 20 s, it left no step: the prior's 0.6931). Where room was kept, the rebuild
# is made while FINAL_MARGIN estimates from now are within the deadline (0: while any time is left; the loop's last
# bookkeeping after the stop may have eaten into the room, and the running q is far worse); log Z's second pass
# too where both passes fit twice over. The rebuild goes over the rows with sites alone (``EPEngine.rows_in_q``): in
# the first epoch the rows visited so far, a minibatch more each step, so the room kept grows with them
# (``TimeBudget._final_seconds``). On all the airline rows a 30-s fit on an AMD EPYC had kept some 16-18 s for that
# pass over every row, which took 13.2-13.3 s, to add the sites of the 190,000-250,000 rows it had visited.
FINAL_RESERVE = 1.5
FINAL_MARGIN = 0.0
RESERVE_MIN_SHARE = 1.25


def _rebuild_estimate(engine, X, y, rows):
    """Seconds of minibatch EP's exact rebuild of q over all of X, from its work on the first rows: once on ``rows``
    to warm up (the first call pays for allocations and the BLAS threads' start), then the faster of two timings on
    four times as many, scaled to all rows. It errs long, which the reservation wants: on the full airline data
    (2,048,097 rows, m = 200, a pass of 13.6-14.0 s) the scaled warm timings came to 16-19 s, where one cold timing
    of 8,192 rows came to 39 s and the first warm one in a process that had just run another (the GPflow peer) to
    28 s, which kept a 60-s fit from keeping room for its pass. (A line through timings of two sizes came to 9.4-14.4
    s: too noisy to reserve by.)"""
    n = X.shape[0]
    engine.time_rebuild(X, y, min(n, rows))
    sample, best = min(n, 4 * rows), float("inf")
    for _ in range(2):
        t = time.perf_counter()
        engine.time_rebuild(X, y, sample)
        best = min(best, time.perf_counter() - t)
    return best * n / sample


# An epoch's end rebuilds q and then adds log Z_q's row terms: two passes over every row, the second no dearer than
# the first, so its estimate (needed until the first epoch's end has been timed) is twice the rebuild of q's. Timed
# on the first 300,000 airline rows, the two came to 1.6-1.95 times q's alone at m = 200 (21,000 to 262,144 rows) and
# 1.5-1.8 times at m = 500 (1.75 over 1,000,000 rows); timing them as well had cost as much again as q's estimate,
# 1.6-2.0 s of the 3.4 s a minibatch EP fit with a time budget spent estimating before its first step at m = 500.
REBUILD_PASSES = 2.0


class TimeBudget(Hook):
    """``max_time`` seconds for the whole fit from ``started`` (a ``time.perf_counter()`` reading; default: the
    start of the run; a resumed run's earlier training time counts): measures how long a step and an exact rebuild
    of q take, and stops before a step (with a rebuild when one is due) that would no longer fit. Batch mode keeps
    room for its final pass (about one step: q rebuilt from all rows). A minibatch fit whose schedule has exact
    rebuilds (``Schedule.epoch_rebuilds``: minibatch EP, q from all its sites) keeps room for one (``FINAL_RESERVE``
    times its cost estimated on the first rows, scaled to the rows with sites: ``_final_seconds``), where the budget
    allows; other minibatch fits keep none (SVI's and SEP / ADF's q is what they trained; their final pass only adds
    the bound or log Z on all rows).
    A final pass over all rows is made only when it fits (``final_pass_fits``: q and log Z, or the exact rebuild of
    q alone), and q otherwise stays the running one, which training itself used.
    """

    def __init__(self, max_time, started=None, *, batch=True):
        self.max_time, self.started, self.batch = max_time, started, batch
        self.deadline = None if started is None else started + float(max_time)
        # a step, an epoch's exact rebuild (q and log Z), and the final rebuild of q alone (minibatch EP's)
        self.seconds = {"step": None, "rebuild": None, "final": None}
        # seconds of the last steps, the step's estimate their max: the engine's ``step_time_window`` of them (minibatch
        # SEP / ADF move Z, and carry their factor, on one step in 8, ``tied_steps``: about 1.6 times the others at
        # m = 500 and more at m = 1,000, which the last step alone would let start past the end), else the last one
        self.recent_steps = deque(maxlen=1)
        self.reserve_final = False  # room for the exact final rebuild of q (``FINAL_RESERVE``)
        self.trainer, self.final_rows = None, None  # what scales that rebuild to the rows it goes over (``start``)

    def start(self, run, rows=8192):
        started = time.perf_counter() if self.started is None else self.started
        self.deadline = started + float(self.max_time)
        self.batch = not run.minibatch
        self.recent_steps = deque(maxlen=int(getattr(getattr(run.trainer, "engine", None), "step_time_window", 1)))
        trainer = run.trainer
        if run.resumed:  # the budget covers the interrupted run's training time too
            self.deadline -= time.perf_counter() - trainer.t0
        if run.minibatch and run.schedule.epoch_rebuilds:  # before the first exact rebuild: one on the first rows
            self.seconds["final"] = _rebuild_estimate(trainer.engine, run.X, run.y, rows)
            self.seconds["rebuild"] = REBUILD_PASSES * self.seconds["final"]
            counted = trainer.engine.rows_in_q(run.X)
            n = run.X.shape[0]
            self.trainer = trainer
            self.final_rows = None if counted is None else (
                counted, trainer.n_steps, max(hi - lo for lo, hi in run.batches), n, min(n, 4 * rows), run.X)
            self.reserve_final = self.deadline - time.perf_counter() >= (
                RESERVE_MIN_SHARE * FINAL_RESERVE * self._final_seconds())

    def _final_seconds(self, ahead=1):
        """The estimate of the exact rebuild of q alone ``ahead`` steps from now: over all rows, or where the engine
        rebuilds q from its rows with sites alone (``rows_in_q``: minibatch EP, whose rows gain theirs a minibatch a
        step in the first epoch), over the rows it takes once those steps leave rows with sites (every row past the
        copy's bounds, ``sites.GATHER_MAX_SHARE``), as many as it was timed on at least."""
        final = self.seconds["final"]
        if final is None or self.final_rows is None:
            return final
        counted, steps, per_step, n, timed, X = self.final_rows
        with_sites = min(n, counted + (self.trainer.n_steps - steps + ahead) * per_step)
        return final * max(timed, self.trainer.engine.rows_in_q(X, with_sites=with_sites)) / n

    @contextmanager
    def timing(self, what):
        t = time.perf_counter()
        yield
        self.measured(what, time.perf_counter() - t)

    def measured(self, what, seconds):
        if what == "step":
            self.recent_steps.append(seconds)
            seconds = max(self.recent_steps)
        self.seconds[what] = seconds

    def exhausted(self, rebuild_due):
        step, rebuild = self.seconds["step"], self.seconds["rebuild"]
        upcoming = (step or 0.0) + ((rebuild or 0.0) if rebuild_due else 0.0)
        final = (step or 0.0) if self.batch else FINAL_RESERVE * self._final_seconds() if self.reserve_final else 0.0
        return time.perf_counter() + upcoming + final > self.deadline

    def before_step(self, run, rebuild_due):
        if self.exhausted(rebuild_due):
            run.stopped_by_time, run.stop_reason = True, "max_time"
            return True
        return False

    def final_pass_fits(self, with_log_z=True):
        if with_log_z:  # both passes, where twice their estimate is left
            rebuild, margin = self.seconds["rebuild"], 2.0
        else:  # q alone: in the room kept for it, or where what is left holds it twice
            rebuild, margin = self._final_seconds(ahead=0), FINAL_MARGIN if self.reserve_final else 2.0
        return rebuild is not None and time.perf_counter() + margin * rebuild <= self.deadline


class Validation(Hook):
    """``data=(X_val, y_val)`` (labels as the engine takes them: {-1, +1}, or class indices) scored every
    ``eval_every`` steps (default: every iteration in batch mode, every epoch in minibatch mode) into the history
    ("validation_step", "validation_nll", "validation_error"). With ``n_iter_no_change``, training stops when the
    validation NLL has not improved by ``tol`` for that many evaluations after the warm-up, and the best state is
    kept. The warm-up's sweeps (batch EP / SEP / ADF: the sites settling at the initial hyper-parameters,
    ``run.warmup``) are scored and may be the best state, but count no evaluation without improvement: their NLL
    moves by the sites' settling alone, and a patience counted there would stop a 200,000-row batch fit in its sixth
    sweep (a review's replay of the recorded curve: 0.6441 against 0.6110 test NLL)."""

    def __init__(self, data, eval_every=None, n_iter_no_change=None, tol=1e-6):
        self.data, self.eval_every, self.n_iter_no_change, self.tol = data, eval_every, n_iter_no_change, tol
        self.skipped = 0  # scores due whose state was no model (``after_step``), said at ``finish``

    def start(self, run):
        if self.eval_every is None and run.minibatch:
            self.eval_every = len(run.batches)
        self.skipped = 0
        for key in VALIDATION_KEYS:
            run.trainer.history[key] = []

    def after_step(self, run, log_z, recorded):
        trainer, best = run.trainer, run.best
        if not ((trainer.n_steps % self.eval_every == 0) if self.eval_every else recorded):
            return
        with floating_point_errors_held() as held:
            try:
                nll, error = trainer.validation_scores(run.X, run.y, self.data)
            except (CholeskyError, FloatingPointError):
                # The step left a state that is no model (a step of a huge learning rate: Kmm of NaN); the guard's
                # next evaluation puts the state before it back (``Trainer.step``), or the loop does after a last
                # step: it is not scored, nor are its overflows said (the guard says what it does). Before, batch EP
                # at learning_rate=1e3 with validation data crashed here with a CholeskyError, where the fit without
                # them went on.
                self.skipped += 1
                return
        if math.isnan(nll):  # (probabilities of NaN, log Z finite: a latent noise stepped past the floats' range)
            self.skipped += 1
            return
        held.say()
        for key, value in zip(VALIDATION_KEYS, (trainer.n_steps, nll, error)):
            trainer.history[key].append(value)
        run.postfix["val_nll"] = f"{nll:.4f}"
        if nll < best["nll"]:  # keep the best state seen...
            best.update(nll=nll)
            if self.n_iter_no_change is not None:
                run.kept["validation"] = {"state": trainer.engine.keep(), "at": len(trainer.history["validation_nll"])}
        if nll < best["reference"] - self.tol:  # ...but count only improvements larger than tol
            best.update(reference=nll, since=0)
        elif trainer.n_steps > run.warmup:  # (after the warm-up: the class docstring)
            best["since"] += 1
        if self.n_iter_no_change is not None and best["since"] >= self.n_iter_no_change:
            kept = run.kept.get("validation")
            if kept is not None:
                trainer.engine.put_back(kept["state"])
                _check_kept_state(kept, "early stopping's best state", trainer.history["validation_nll"][kept["at"] - 1],
                                  "validation NLL", lambda: trainer.validation_scores(run.X, run.y, self.data)[0])
            elif best["nll"] < nll:  # (a checkpoint that could not hold it: ``Engine.checkpoint_kept``)
                warn_guard(f"{trainer.method}: early stopping: the best validation NLL, {best['nll']:.6g}, came before "
                           f"the resume, whose checkpoint does not hold that state: the model is the last one (NLL "
                           f"{nll:.6g})", stacklevel=4)
            run.early_stopped, run.stop_reason = True, "early_stopping"

    def finish(self, run):
        """Say the scores that were due and not recorded: their state was no model (``after_step``). Silent, a fit
        whose every epoch ended so (SVI of three classes at learning_rate=10: the guard refused a step of each
        minibatch, the state at each epoch's end had NaN probabilities) returned a ``history_`` without one
        validation score, its ``n_iter_no_change`` never counting, and no word of why."""
        if not self.skipped:
            return
        recorded = len(run.trainer.history["validation_nll"])
        warn_guard(f"{run.trainer.method}: {self.skipped} of {self.skipped + recorded} validation scores were not "
                   "recorded: the state at those steps gave no finite probabilities (a Cholesky factor failed, or a "
                   "NaN), so history_['validation_nll'] lacks them and early stopping did not count them; lower "
                   "learning_rate or damping", stacklevel=4)


class Resume(Hook):
    """The run starts from the checkpoint at ``path`` (``checkpointing.restore``, which checks it field by field);
    ``data_hash`` (``checkpointing.data_fingerprint`` of X and y) goes into the run's fingerprint: a resume on other
    data is refused. Early among the hooks (``standard_hooks``: after validation, whose history the checkpoint must
    have), so that the time budget, the progress bar and the plateau stop start from the resumed run. A checkpoint
    written at the step where the run ended (``Checkpoints``: a plateau, settled sites, early stopping) ends the
    resumed run there too: its ``finish`` hooks and final pass, no step (a plateau-stopped SVI fit resumed from its
    last checkpoint had trained 24 iterations more, its probabilities 0.20 from the uninterrupted fit's)."""

    def __init__(self, path, data_hash=None):
        self.path, self.data_hash = path, data_hash

    def start(self, run):
        fingerprint = run_fingerprint(run.trainer.engine, run.X.shape[0], len(run.batches), self.data_hash)
        has_validation = "validation_nll" in run.trainer.history  # (the validation hook started first)
        run.order, run.best, run.kept, ended = restore(run.trainer, run.rng, self.path, fingerprint, has_validation)
        run.resumed = True
        if ended is not None:
            self._end(run, ended)

    def _end(self, run, ended):
        """The resumed run ends as the run that wrote the checkpoint had (``Checkpoints``: ``ended``), where this run's
        settings could have ended it so, and where the state it returns, taking no step, gives the log Z recorded of
        it (a step's, evaluated and not committed: ``Trainer.log_z_here``); the state's edits that the first step's
        check would not see (``restored_state_checked``) are the model here (a review, 2026-12-04: lengthscales e
        times longer, 0.52 from the fit's)."""
        settings, engine = run.settings, run.trainer.engine
        could = {"plateau": settings.plateau is not None and engine.has_params,
                 "early_stopping": settings.n_iter_no_change is not None and "validation_nll" in run.trainer.history,
                 "converged": not engine.has_params and not run.minibatch}
        if not could[ended["reason"]] or (ended["early_stopped"] and not could["early_stopping"]):
            raise ValueError(f"{self.path} is not a valid agpc checkpoint: ended: {ended['reason']!r}, which this "
                             "run's settings do not stop on")
        run.stop_reason, run.early_stopped, run.converged = ended["reason"], ended["early_stopped"], ended["converged"]
        run.went_back = ended["went_back"]  # (``Plateau.start`` says it again)
        value, same = _scored_again(lambda: run.trainer.log_z_here(run.X, run.y, *run.batches[0]), ended["log_z"])
        if not same:
            raise ValueError(f"{self.path}: the fit had ended at the step this checkpoint was written "
                             f"({ended['reason']}), and the state it holds gives a log Z of {value:.10g} where the fit "
                             f"recorded {ended['log_z']:.10g}: the file was changed since it was written; fit without "
                             "resume=True to start afresh")


class Checkpoints(Hook):
    """Every ``every`` steps the whole training state goes to ``path`` (atomically: a crash while writing leaves
    the previous checkpoint as it was), so that a run interrupted and resumed (``Resume``) ends at the same model as
    one that is not (same seed, same data). Written after every other hook has updated the run (last in
    ``standard_hooks``): the states the hooks keep (``Run.kept``: the plateau stop's best, which it takes after the
    step) and whether the run ended at this step are the step's own."""

    def __init__(self, path, every, data_hash=None):
        self.path, self.every, self.data_hash = path, every, data_hash
        self.fingerprint = None

    def start(self, run):
        self.fingerprint = run_fingerprint(run.trainer.engine, run.X.shape[0], len(run.batches), self.data_hash)

    def after_step(self, run, log_z, recorded):
        if self.every and run.trainer.n_steps % int(self.every) == 0:
            ended = None
            if run.converged or run.early_stopped:  # (the log Z of the state it returns, which ``Resume`` checks;
                # a state without a finite one is not written as an end: the resumed run steps from it, as before)
                log_z = run.trainer.log_z_here(run.X, run.y, *run.batches[0])
                ended = {"reason": run.stop_reason, "early_stopped": run.early_stopped, "converged": run.converged,
                         "log_z": log_z, "went_back": run.went_back} if math.isfinite(log_z) else None
            write_checkpoint(run.trainer, run.rng, run.order, run.best, self.path, self.fingerprint, run.kept, ended)
            run.checkpoints_written += 1


# What a stage that ended before its bar filled ended on (a ``training.STOP_REASONS``), as its bar says so.
ENDED_BECAUSE = {"converged": "the sites settled (tol)", "plateau": "log Z stopped rising (plateau)",
                 "max_time": "max_time ran out", "early_stopping": "the validation NLL stopped improving",
                 "max_iter": "max_iter reached"}


def duration(seconds):
    """``seconds`` as a person reads a duration: "48 s", "6 min 41 s", "2 h 05 min"; "<0.01 s" below a hundredth
    (a progress line has no use for more, and two significant digits of 1e-05 read as an exponent)."""
    seconds = max(0.0, float(seconds))
    if 0 < seconds < 0.01:
        return "<0.01 s"
    if seconds < 9.5:
        return f"{seconds:.2g} s"
    if round(seconds) < 60:  # (rounded first: 59.6 s is "1 min 00 s", as 60.4 s is, not "60 s")
        return f"{round(seconds)} s"
    minutes, s = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _say(line):
    """A line on the progress bars' stream (standard error), above a bar that is open."""
    tqdm.write(line, file=sys.stderr)


class Progress(Hook):
    """What a run shows while it trains (``verbose``), on standard error: at its start, one line of what it will do
    at most (rows, steps, the cap in ``max_iter``'s unit, ``max_time``); once its first steps are timed, one line
    estimating what the whole run costs at most; then a named bar a stage: batch EP / SEP / ADF's "warm-up sweeps"
    (not counted by ``max_iter``) and "training" (``max_iter`` iterations), minibatch mode's one "training" bar over
    every step of every epoch, so that its time left is the whole run's (capped by ``max_time``). A bar whose stage
    ended early (a plateau, settled sites, the time budget, early stopping) is closed at its count with the reason.
    Beside it: the last recorded entry of the history (``Engine.objective``: batch mode, the iteration's; minibatch
    mode, the last whole epoch's, not a minibatch's noisy value) and, when validated, the validation NLL.
    ``stage``: the name of this run among a fit's several (``size_rule.learn_lengthscales``); ``then``: the stage
    that follows it, (name, the cost of its iterations in this run's, the fit's ``max_time``), whose cost at most the
    estimate adds (a fit's start on a subsample, whose line had said only its own 9 s where the fit on all rows after it
    took 12 s more and could take 45)."""

    BATCH_TIMED = 3  # batch iterations timed (after the warm-up) before the estimate of the whole run
    MINIBATCH_TIMED = 100  # minibatch steps timed before it, at most (else the first epoch, its rebuild included)

    def __init__(self, stage="", then=None):
        self.stage, self.then = stage, then
        self.bar = self.phase = None
        self.postfix = {}
        self.started = self.deadline = None
        self.estimated = False

    def _name(self, run):
        return f"agpc {run.trainer.method}" + (f" [{self.stage}]" if self.stage else "")

    def start(self, run):
        settings, trainer = run.settings, run.trainer
        self.started = time.perf_counter()
        if settings.max_time is not None:
            self.deadline = (self.started if settings.started is None else settings.started) + float(settings.max_time)
            if run.resumed:  # (as ``TimeBudget``: the interrupted run's training time counts)
                self.deadline -= time.perf_counter() - trainer.t0
        _say(f"{self._name(run)}: {self._plan(run)}")

    def _plan(self, run):
        """What the run will do at most, in the units of its options."""
        settings, n = run.settings, run.X.shape[0]
        if run.finished():  # max_iter 0 (or a resumed run that had ended): not a warm-up sweep, not a step runs
            warmup = " (no warm-up sweeps either)" if run.trainer.n_steps < run.warmup else ""
            cap = "max_iter 0" if settings.max_iter == 0 else f"max_iter {settings.max_iter:,} reached"
            if run.converged or run.early_stopped:  # (``Resume``)
                cap = f"it had ended ({ENDED_BECAUSE.get(run.stop_reason, run.stop_reason)}) when its checkpoint was written"
            plan = f"{n:,} rows; {cap}: no training steps{warmup}, only the final pass"
        elif settings.max_iter == 0 and not run.minibatch:  # GFITC: its sites settle, at the starting kernel
            plan = (f"{n:,} rows, batch steps on all rows; max_iter 0: EP sweeps until the sites settle, no step on "
                    "the hyper-parameters")
        elif run.minibatch:
            steps = len(run.batches)
            plan = (f"{n:,} rows in minibatches of {int(settings.batch_size):,} ({steps:,} steps an epoch); at most "
                    f"{settings.max_iter:,} epochs (max_iter) = {settings.max_iter * steps:,} steps")
            if settings.plateau is not None and run.trainer.engine.has_params:
                plan += ", fewer once log Z stops rising"
        else:
            warmup = f"{run.warmup} warm-up sweeps, then " if run.warmup else ""
            plan = f"{n:,} rows, batch steps on all rows; {warmup}at most {settings.max_iter:,} iterations (max_iter)"
            if settings.plateau is not None or not run.trainer.engine.has_params:
                plan += ", fewer once it settles"  # (log Z stops rising; with nothing to learn, the sites settle)
        if settings.max_time is not None:
            plan += f"; max_time {duration(settings.max_time)}"
        # (max_iter 0 has no iterations to estimate the cost of)
        return plan + ("" if settings.max_iter == 0 or run.finished() else "; a time estimate follows the first steps")

    def new_epoch(self, run):
        if self.bar is None:
            self._open(run, "warm-up sweeps" if run.trainer.n_steps < run.warmup else "training")
        elif run.minibatch:
            self.bar.set_description_str(self._description(run), refresh=False)

    def _description(self, run):
        if run.minibatch:
            epoch = run.trainer.n_steps // len(run.batches) + 1
            return f"{self._name(run)} training, epoch {epoch}/{run.settings.max_iter}"
        return f"{self._name(run)} {self.phase}"

    def _open(self, run, phase):
        trainer, max_iter = run.trainer, run.settings.max_iter
        self.phase, self.postfix = phase, {}
        if run.minibatch:
            total, done, unit = max_iter * len(run.batches), trainer.n_steps, "step"
        elif phase == "warm-up sweeps":
            total, done, unit = run.warmup, trainer.n_steps, "sweep"
        else:
            total, done, unit = max_iter, len(trainer.history["log_marginal_likelihood"]) - run.warmup, "iter"
        # the time left is ``_left``'s, in the postfix: tqdm's own would ignore max_time
        fmt = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"
        redraw = _redraw_seconds(sys.stderr)
        self.bar = tqdm(total=total, initial=max(0, done), unit=unit, file=sys.stderr, dynamic_ncols=True,
                        desc=self._description(run), bar_format=fmt if phase == "training" else None,
                        **({} if redraw is None else {"mininterval": redraw}))
        self.done_at_open, self.opened = self.bar.n, time.perf_counter()
        _open_bars.add(self.bar)

    def after_step(self, run, log_z, recorded):
        if not (run.minibatch or recorded):
            return
        self.bar.update(1)
        postfix = {}
        values = run.trainer.history["log_marginal_likelihood"]
        if values:
            postfix[run.trainer.objective] = f"{values[-1]:.6g}"
        postfix.update(run.postfix)
        if self.phase == "training":
            left = self._left()
            if left is not None:
                postfix["left"] = left
        self.bar.set_postfix(postfix, refresh=False)
        self.postfix = postfix
        if not self.estimated and self._timed_enough(run):
            self._estimate(run)
        if self.phase == "warm-up sweeps" and run.trainer.n_steps >= run.warmup:
            self._close(run, ended=None)
            self._open(run, "training")

    def _pace(self):
        """(seconds a unit of the bar, seconds its stage has left at most) at its pace since it opened (wall time:
        GFITC's sweeps between iterations, minibatch EP's rebuilds, validation, checkpoints included)."""
        per_unit = (time.perf_counter() - self.opened) / (self.bar.n - self.done_at_open)
        return per_unit, per_unit * (self.bar.total - self.bar.n)

    def _left(self):
        """The time the stage has left at most, estimated from its pace so far (and at most ``max_time``'s)."""
        if self.bar.n <= self.done_at_open:
            return None
        left = self._pace()[1]
        now = time.perf_counter()
        capped = self.deadline is not None and self.deadline - now < left
        return f"~{duration(min(left, self.deadline - now) if capped else left)}" + (" (max_time)" if capped else "")

    def _timed_enough(self, run):
        if self.phase != "training":
            return False
        done = self.bar.n - self.done_at_open
        if run.minibatch:  # an epoch: its steps, and the exact rebuild at its end where there is one
            return done >= min(len(run.batches), self.MINIBATCH_TIMED)
        return done >= self.BATCH_TIMED

    def _estimate(self, run):
        """One line: what the whole run costs at most, extrapolated from its training stage's pace so far."""
        self.estimated = True
        max_iter, now = run.settings.max_iter, time.perf_counter()
        per_unit, left = self._pace()  # (per_unit: an iteration, or a minibatch step)
        untimed = ""
        if run.minibatch:
            what, cap = f"{per_unit * len(run.batches):.3g} s an epoch", f"{max_iter:,} epochs"
            if run.schedule.epoch_rebuilds and self.bar.n < len(run.batches):
                untimed = ", plus an exact rebuild an epoch (not yet timed)"
        else:
            what, cap = f"{per_unit:.3g} s an iteration", f"{max_iter:,} iterations"
        if self.stage:  # (a fit of several stages: each may take as long)
            cap = f"this stage's {cap}"
        total = now - self.started + left
        line = f"{self._name(run)}: estimate from the first steps ({what}): at most ~{duration(total)} for {cap}"
        line += untimed
        if self.deadline is not None and now + left > self.deadline:
            line += f"; max_time ends it in ~{duration(self.deadline - now)}"
        if self.then is not None:
            line += self._then(run, now, left, per_unit)
        _say(line)

    def _then(self, run, now, left, per_unit):
        """The estimate's part for the stages that follow (``then``: their name, the cost of their iterations in units
        of this stage's, max_time, and how many there are, one if not given): each at most this stage's iterations (its
        warm-up sweeps counted as iterations) at this stage's pace times their factor, and the whole fit's at most (and
        ``max_time``'s)."""
        name, times, max_time, *count = self.then
        stages = count[0] if count else 1
        fit_started = self.started if run.settings.started is None else run.settings.started
        each = times * per_unit * (run.warmup + run.settings.max_iter)
        most = stages * each
        whole = now - fit_started + left + most
        pace = f", its iterations ~{times:.2g} times as long" if times != 1.0 else ""
        per_stage = f", each at most ~{duration(each)}" if stages > 1 else ""
        text = (f"; then {name}{pace}{per_stage}: at most ~{duration(most)} more, the whole fit at most "
                f"~{duration(whole)}")
        if max_time is not None and whole > max_time:
            text += f" (max_time ends it at ~{duration(max_time)})"
        return text

    def _close(self, run, ended):
        """Close the bar; ``ended``: a stop reason (``ENDED_BECAUSE``) when the stage ended before the bar filled."""
        if self.bar is None:
            return
        postfix = {key: value for key, value in self.postfix.items() if key != "left"}  # (nothing is left)
        if ended is not None and self.bar.n < self.bar.total:
            # the stage is over: its bar ends full, saying where and why it stopped, not part-way
            postfix["stopped"] = f"at {self.bar.n:,} of {self.bar.total:,}: {ENDED_BECAUSE.get(ended, ended)}"
            self.bar.total = self.bar.n
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.close()
        self.bar = None

    def final_pass(self, run, exact):
        if exact:
            what = "q" if exact == "q" else f"q and its {run.trainer.objective}"
            _say(f"{self._name(run)}: final pass over all {run.X.shape[0]:,} rows ({what} at the "
                 f"{'starting' if run.settings.max_iter == 0 else 'learned'} hyper-parameters)")

    def finish(self, run):
        self._close(run, ended=run.stop_reason)


class Plateau(Hook):
    """The stop on a plateau of log Z, for runs with hyper-parameters to learn: converged at the first recorded
    iteration where log Z has risen by less than ``rise`` over the last ``steps`` recorded iterations (batch mode:
    steps, counted after the warm-up; minibatch mode: epochs, the history's once-an-epoch records). Chosen in
    ``agpc.size_rule`` (``fit_plateau``: the exact model's stop, and the default fit's).

    In batch mode, where log Z is exact and the steps climb it (``Engine.log_z_climbed``), a fall is not a plateau: a
    window whose last log Z is more than ``rise`` below the window's best is a drop, and the run goes on (SVI's
    default fit of banana's 5,300 rows, rising by 40 nats an iteration, stopped at its 61st on one overshoot of Adam,
    log Z -2,526 where the run went on to -1,291 by its 157th). It stops, as on a plateau, when ``drop_patience``
    windows have passed without a new best; and where it so stops more than ``rise`` below its best state (by the
    objective the steps climb: log Z plus the kernel's log prior, ``contract.with_log_prior``), that state is put
    back and said in a GuardWarning (SVI at learning_rate=0.1 on 2,000 banana rows stopped at -975 nats, its best
    -769). A run that ``max_iter`` (or anything else) ends keeps its last state: the fit those iterations give."""

    drop_patience = 4  # windows without a new best log Z after which a batch run that keeps dropping stops

    def __init__(self, steps, rise):
        self.steps, self.rise = int(steps), float(rise)
        self.best = None  # judged drops: (log Z, history length); its state is the run's ``kept["plateau"]``

    def start(self, run):
        """A resumed run's best record is read back from its history, its state from the checkpoint (``run.kept``;
        where the checkpoint does not hold it, the stop keeps the last state and says so: ``_go_back``)."""
        self.best = None
        if run.resumed and self._judges_drops(run):
            history = run.trainer.history
            after = [i for i, steps in enumerate(history["n_steps"]) if steps - run.warmup > 0]
            if after:
                i = max(after, key=lambda k: (history["log_marginal_likelihood"][k], -k))
                self.best = (history["log_marginal_likelihood"][i], i + 1)
            if self.best is None or run.kept.get("plateau", {}).get("at") != self.best[1]:
                run.kept.pop("plateau", None)  # (not the state of the best record)
        if run.went_back and self.best is not None:  # (resumed where it had ended so: its state is that best one)
            self._say_went_back(run.trainer, self.best, run.trainer.history["log_marginal_likelihood"][-1])

    @staticmethod
    def _judges_drops(run):
        engine = run.trainer.engine
        return not run.minibatch and not engine.minibatch and engine.log_z_climbed

    def after_step(self, run, log_z, recorded):
        trainer = run.trainer
        if not recorded or not trainer.engine.has_params:
            return
        history = trainer.history["log_marginal_likelihood"]
        past = len(history) if run.minibatch else trainer.n_steps - run.warmup  # (batch: after the warm-up)
        drops = self._judges_drops(run)
        if drops and past > 0 and (self.best is None or history[-1] > self.best[0]):
            # (batch mode: the entry is the log Z of the state the step started from, which the trainer kept)
            self.best = (history[-1], len(history))
            run.kept.pop("plateau", None)
            if trainer.good is not None:
                run.kept["plateau"] = {"state": trainer.good["state"], "at": len(history)}
        if past <= self.steps or len(history) <= self.steps:
            return
        window = history[-1 - self.steps:]
        flat = window[-1] - window[0] < self.rise
        if drops:
            stalled = len(history) - self.best[1] >= self.drop_patience * self.steps
            flat = (flat and max(window) - window[-1] <= self.rise) or stalled
        if flat:
            run.converged, run.stop_reason = True, "plateau"
            self._go_back(run)

    def _go_back(self, run):
        """At the plateau stop, the best state put back where the run stopped more than ``rise`` below it (at the
        step, not after the loop: the checkpoint of the step then holds the model the run returns, ``Resume``)."""
        best, trainer = self.best, run.trainer
        if best is None:  # (max_iter's fit, or anything else's, is its last state: not called)
            return
        last = trainer.history["log_marginal_likelihood"][-1]
        if best[0] - last <= self.rise:
            return
        kept = run.kept.get("plateau")
        if kept is None:  # (recorded before a resume whose checkpoint could not hold it: ``Engine.checkpoint_kept``)
            warn_guard(f"{trainer.method}: log Z fell from its best, {best[0]:.6g} at iteration {best[1]}, to {last:.6g} "
                       "at the end; that state came before the resume, whose checkpoint does not hold it: the model is "
                       "the last state", stacklevel=5)
            return
        if "checkpoint" in kept:  # (read from a file: checked before its kernel's prior is weighed)
            last_state = trainer.engine.keep()
            trainer.engine.put_back(kept["state"])
            _check_kept_state(kept, "the plateau stop's best state", best[0], "log Z",
                              lambda: trainer.posterior(run.X, run.y)[1])
            trainer.engine.put_back(last_state)
        climbed = [value + _log_prior(trainer.engine.kernel_of(state)) for value, state in ((best[0], kept["state"]),
                                                                                            (last, trainer.good["state"]))]
        if climbed[0] - climbed[1] <= self.rise:  # (the kernel's prior gained what log Z lost)
            return
        trainer.engine.put_back(kept["state"])
        trainer.good = trainer.engine.snapshot()
        run.went_back = True
        self._say_went_back(trainer, best, last)

    @staticmethod
    def _say_went_back(trainer, best, last):
        """The GuardWarning of a run whose plateau stop put its ``best`` (log Z, iteration) state back, ``last``
        being the log Z it had fallen to."""
        rate = getattr(trainer.engine.optimizer, "learning_rate", None)
        advice = f"; learning_rate={rate:g} overshoots: a smaller one climbs steadily" if rate is not None else ""
        warn_guard(f"{trainer.method}: log Z fell from its best, {best[0]:.6g} at iteration {best[1]}, to {last:.6g} at "
                   f"the end: the model returned is the one at iteration {best[1]}{advice}", stacklevel=6)


def _scored_again(score, recorded):
    """(``score()``, whether it is the ``recorded`` value within rounding, rel. 1e-6): a state read back from a checkpoint
    scored again as the run scored it (``_check_kept_state``, ``Resume``); a failed factorisation scores NaN."""
    try:
        value = float(score())
    except (CholeskyError, FloatingPointError):
        value = math.nan
    return value, math.isclose(value, recorded, rel_tol=1e-6, abs_tol=1e-9)


def _check_kept_state(kept, what, recorded, measure, score):
    """A kept state read back from a checkpoint (``kept["checkpoint"]``: ``checkpointing.restore``), just put back as
    the model, must give the ``measure`` the run recorded of it (``score()`` computes it again). The file's checks let
    through values no fit reaches where only a step tells them (sites made negative, shifts 1e300 times their size),
    which the run's own state's first step does (``checkpointing.restored_state_checked``); a kept state takes no
    step, so its own score tells them (a review, 2026-12-04: such kept states were returned as the model, or failed
    in the final pass naming no file). A failure is one ValueError naming the file."""
    if "checkpoint" not in kept:
        return
    value, same = _scored_again(score, recorded)
    if not same:
        raise ValueError(f"{kept['checkpoint']}: {what}, as the checkpoint holds it, gives a {measure} of {value:.10g} "
                         f"where the run recorded {recorded:.10g} for it: the file was changed since it was written; "
                         "fit without resume=True to start afresh")


def _log_prior(kernel):
    """The kernel's log prior density as a float (0 for a kernel without priors)."""
    value = log_prior_and_grads(kernel)[0]
    return 0.0 if value is None else float(value)


def standard_hooks(settings, validation=None):
    """The hooks ``settings`` (a ``training.TrainSettings``) ask for, in the order the loop calls them: validation
    (which starts first: a resume checks the checkpoint has its history), the resume, the time budget (which starts
    after a resume: the time spent before counts), the progress bar, the stop on a plateau, and checkpoints last (which
    write what every other hook updated at the step: ``Checkpoints``)."""
    hooks = []
    if validation is not None:
        hooks.append(Validation(validation, settings.eval_every, settings.n_iter_no_change, settings.tol))
    if settings.resume:
        hooks.append(Resume(settings.checkpoint_path, settings.data_hash))
    if settings.max_time is not None:
        hooks.append(TimeBudget(settings.max_time, settings.started))
    if settings.progress:
        hooks.append(Progress(settings.stage, settings.then))
    if settings.plateau is not None:
        hooks.append(Plateau(*settings.plateau))
    if settings.checkpoint_every:
        hooks.append(Checkpoints(settings.checkpoint_path, settings.checkpoint_every, settings.data_hash))
    return hooks
