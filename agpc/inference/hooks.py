"""The parts of a training run besides its steps, each a ``Hook`` the loop (``training.train``) calls at fixed
points: the time budget (``TimeBudget``), validation with early stopping (``Validation``), checkpoints and resume
(``Checkpoints``), the progress bar (``Progress``), the stop on a plateau of log Z (``Plateau``). ``standard_hooks`` builds those a run's settings ask for.

A hook sees the run (``training.Run``: the trainer, the rows in the loop's order, the random generator, the
epoch's remaining minibatches, the early-stopping record) and may stop it (``before_step``, or ``run.early_stopped``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from tqdm.auto import tqdm

from .checkpointing import restore, run_fingerprint, write_checkpoint

__all__ = ["Hook", "TimeBudget", "Validation", "Checkpoints", "Progress", "Plateau", "standard_hooks"]

VALIDATION_KEYS = ("validation_step", "validation_nll", "validation_error")


class Hook:
    """A part of the loop besides stepping; every call's default does nothing."""

    def start(self, run):
        """The run is set up (the trainer fresh, nothing stepped)."""

    def before_step(self, run, rebuild_due):
        """Whether to stop before the next step (with an exact rebuild of the site product before or after it when
        ``rebuild_due``: minibatch EP's, at an epoch's end or when its engine asks)."""
        return False

    def new_epoch(self, run):
        """A new epoch (batch mode: iteration) begins."""

    def measured(self, what, seconds):
        """A "step" (its retries included) or a "rebuild" took ``seconds``."""

    def after_step(self, run, log_z, recorded):
        """A step was taken; ``recorded``: it closed an entry of the history."""

    def final_pass_fits(self):
        """Whether the final pass over all rows may run (minibatch mode; batch mode always makes it)."""
        return True

    def finish(self, run):
        """The loop is over (before the final pass)."""


class TimeBudget(Hook):
    """``max_time`` seconds for the whole fit from ``started`` (a ``time.perf_counter()`` reading; default: the
    start of the run; a resumed run's earlier training time counts): measures how long a step and an exact rebuild
    of the site product take, and stops before a step (with a rebuild when one is due) that would no longer fit.
    Batch mode keeps room for its final pass (about one step: q rebuilt from all rows). Minibatch mode keeps none:
    its final pass over all rows (minibatch EP's exact rebuild, SVI's bound on all rows) is made only when it fits
    (``final_pass_fits``; estimated as twice a measured rebuild, before the first one a rebuild of the first rows
    scaled to all), and q otherwise stays the running one, which training itself used."""

    def __init__(self, max_time, started=None, *, batch=True):
        self.max_time, self.started, self.batch = max_time, started, batch
        self.deadline = None if started is None else started + float(max_time)
        self.seconds = {"step": None, "rebuild": None}

    def start(self, run, rows=8192):
        started = time.perf_counter() if self.started is None else self.started
        self.deadline = started + float(self.max_time)
        self.batch = not run.minibatch
        trainer = run.trainer
        if run.resumed:  # the budget covers the interrupted run's training time too
            self.deadline -= time.perf_counter() - trainer.t0
        if run.minibatch and trainer.per_row_sites:  # before the first exact rebuild: one on the first rows
            n = run.X.shape[0]
            rows = min(n, rows)
            t = time.perf_counter()
            trainer.engine.time_rebuild(run.X, run.y, rows)
            self.seconds["rebuild"] = (time.perf_counter() - t) * n / rows

    @contextmanager
    def timing(self, what):
        t = time.perf_counter()
        yield
        self.measured(what, time.perf_counter() - t)

    def measured(self, what, seconds):
        self.seconds[what] = seconds

    def exhausted(self, rebuild_due):
        step, rebuild = self.seconds["step"], self.seconds["rebuild"]
        upcoming = (step or 0.0) + ((rebuild or 0.0) if rebuild_due else 0.0)
        final = (step or 0.0) if self.batch else 0.0
        return time.perf_counter() + upcoming + final > self.deadline

    def before_step(self, run, rebuild_due):
        if self.exhausted(rebuild_due):
            run.stopped_by_time, run.stop_reason = True, "max_time"
            return True
        return False

    def final_pass_fits(self):
        rebuild = self.seconds["rebuild"]
        return rebuild is not None and time.perf_counter() + 2.0 * rebuild <= self.deadline


class Validation(Hook):
    """``data=(X_val, y_val)`` (labels as the engine takes them: {-1, +1}, or class indices) scored every
    ``eval_every`` steps (default: every iteration in batch mode, every epoch in minibatch mode) into the history
    ("validation_step", "validation_nll", "validation_error"). With ``n_iter_no_change``, training stops when the
    validation NLL has not improved by ``tol`` for that many evaluations, and the best state is kept."""

    def __init__(self, data, eval_every=None, n_iter_no_change=None, tol=1e-6):
        self.data, self.eval_every, self.n_iter_no_change, self.tol = data, eval_every, n_iter_no_change, tol

    def start(self, run):
        if self.eval_every is None and run.minibatch:
            self.eval_every = len(run.batches)
        for key in VALIDATION_KEYS:
            run.trainer.history[key] = []

    def after_step(self, run, log_z, recorded):
        trainer, best = run.trainer, run.best
        if not ((trainer.n_steps % self.eval_every == 0) if self.eval_every else recorded):
            return
        nll, error = trainer.validation_scores(run.X, run.y, self.data)
        for key, value in zip(VALIDATION_KEYS, (trainer.n_steps, nll, error)):
            trainer.history[key].append(value)
        run.postfix["val_nll"] = f"{nll:.4f}"
        if nll < best["nll"]:  # keep the best state seen...
            best.update(nll=nll, state=trainer.engine.keep() if self.n_iter_no_change is not None else None)
        if nll < best["reference"] - self.tol:  # ...but count only improvements larger than tol
            best.update(reference=nll, since=0)
        else:
            best["since"] += 1
        if self.n_iter_no_change is not None and best["since"] >= self.n_iter_no_change:
            if best["state"] is not None:  # (not kept across a resume: the current state stays)
                trainer.engine.put_back(best["state"])
            run.early_stopped, run.stop_reason = True, "early_stopping"


class Checkpoints(Hook):
    """Every ``every`` steps the whole training state goes to ``path`` (atomically: a crash while writing leaves
    the previous checkpoint as it was); ``resume`` starts from it (``checkpointing.restore``), and a run that is
    interrupted and resumed ends at the same model as one that is not (same seed, same data). ``data_hash``
    (``checkpointing.data_fingerprint`` of X and y) goes into the run's fingerprint: a resume on other data is
    refused."""

    def __init__(self, path, every=None, resume=False, data_hash=None):
        self.path, self.every, self.resume, self.data_hash = path, every, resume, data_hash
        self.fingerprint = None

    def start(self, run):
        self.fingerprint = run_fingerprint(run.trainer.engine, run.X.shape[0], len(run.batches), self.data_hash)
        if self.resume:
            has_validation = "validation_nll" in run.trainer.history  # (the validation hook started first)
            run.order, run.best = restore(run.trainer, run.rng, self.path, self.fingerprint, has_validation)
            run.resumed = True

    def after_step(self, run, log_z, recorded):
        if self.every and run.trainer.n_steps % int(self.every) == 0:
            write_checkpoint(run.trainer, run.rng, run.order, run.best, self.path, self.fingerprint)
            run.checkpoints_written += 1


class Progress(Hook):
    """A tqdm bar (batch mode: one over the iterations; minibatch mode: one per epoch) with log Z and, when
    validated, the validation NLL."""

    def __init__(self):
        self.bar = None

    def new_epoch(self, run):
        if self.bar is not None and not run.minibatch:
            return
        self.finish(run)
        trainer, max_iter = run.trainer, run.settings.max_iter
        if run.minibatch:
            epoch = trainer.n_steps // len(run.batches) + 1
            self.bar = tqdm(total=len(run.batches), unit="batch", desc=f"agpc {trainer.method} epoch {epoch}/{max_iter}")
        else:
            self.bar = tqdm(total=max_iter + run.warmup, unit="iter", desc=f"agpc {trainer.method}")

    def after_step(self, run, log_z, recorded):
        if run.minibatch or recorded:
            self.bar.update(1)
            self.bar.set_postfix({"log_Zq": f"{log_z:.4g}", **run.postfix}, refresh=False)

    def finish(self, run):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Plateau(Hook):
    """Batch mode with hyper-parameters to learn: the run has converged once log Z has risen by less than ``rise`` over
    the last ``steps`` steps after the warm-up (``agpc.size_rule.exact_plateau``: the exact model's stop; the
    sparse models run their ``max_iter`` steps)."""

    def __init__(self, steps, rise):
        self.steps, self.rise = int(steps), float(rise)

    def after_step(self, run, log_z, recorded):
        trainer = run.trainer
        if run.minibatch or not trainer.engine.has_params or trainer.n_steps <= run.warmup + self.steps:
            return
        history = trainer.history["log_marginal_likelihood"]
        if len(history) > self.steps and history[-1] - history[-1 - self.steps] < self.rise:
            run.converged, run.stop_reason = True, "plateau"


def standard_hooks(settings, validation=None):
    """The hooks ``settings`` (a ``training.TrainSettings``) ask for, in the order the loop calls them: validation
    (which starts first: a resume checks the checkpoint has its history), checkpoints (which write after the
    validation record is updated), the time budget (which starts after a resume: the time spent before counts),
    the progress bar, the stop on a plateau."""
    hooks = []
    if validation is not None:
        hooks.append(Validation(validation, settings.eval_every, settings.n_iter_no_change, settings.tol))
    if settings.resume or settings.checkpoint_every:
        hooks.append(Checkpoints(settings.checkpoint_path, settings.checkpoint_every, settings.resume,
                                 settings.data_hash))
    if settings.max_time is not None:
        hooks.append(TimeBudget(settings.max_time, settings.started))
    if settings.progress:
        hooks.append(Progress())
    if settings.plateau is not None:
        hooks.append(Plateau(*settings.plateau))
    return hooks
