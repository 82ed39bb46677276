"""The one training loop, for every method (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.3; Hernandez-Lobato et
al. (2015); Izmailov & Kropotov (2017), Alg. 1).

Every method is an engine (``engines``) with one step and no loop of its own; ``Trainer`` wraps an engine's
steps in the divergence guard (a non-finite log Z or a failed Cholesky puts back the state before the last
good step and halves damping and step sizes), and ``train`` drives it: the batch or minibatch schedule, the
time budget, the history, validation and early stopping, checkpoints and resume, the progress bar.

Batch mode: one step on all rows, repeated (EP / SEP / ADF: one parallel damped update of all sites, then
one step on the hyper-parameters, after ``n_warmup`` sweeps without; GFITC: damped EP sweeps, and a step on
the hyper-parameters whenever the sites have settled; SVI: one gradient step; ``vi-*``: one outer iteration).
``max_iter`` counts the steps on the hyper-parameters. Minibatch mode (Hernandez-Lobato & Hernandez-Lobato (2016), eq.
6): a step per minibatch, the data part of the gradient scaled by n / |M|; ``max_iter`` then counts epochs.
"""

from __future__ import annotations

import hashlib
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..backend import (CholeskyError, ModulesByName, array_device, array_namespace, asarray_like, block_memory_advice,
                       cholesky_with_jitter, host_rng, is_out_of_core, jitter_raises_within, note_jitter, read_rows,
                       row_chunk_bounds, row_slice, to_host_vector)
from ..checkpoint_rules import (array_shapes, check_engine_state, check_loop_state, check_saved_factor, dtype_text,
                                is_array)
from ..checkpoints import load_checkpoint, save_checkpoint
from ..kernels import ClassKernels
from ..threads import with_blas_threads
from .engines import ALL_METHODS, EP_METHODS, make_engine
from . import exact_ep
from .ep import PRIOR_FACTOR_NAME

__all__ = ["train", "Trainer", "TrainResult", "METHODS", "ALL_METHODS", "minibatch_layout", "data_fingerprint",
           "fingerprint_stride", "FINGERPRINT_ROWS", "check_saved_factor"]

METHODS = EP_METHODS  # the methods that learn from a stream (``partial_fit``) and run on a cluster: EP, SEP, ADF
HISTORY_KEYS = ("log_marginal_likelihood", "time", "n_invalid_sites", "damping", "n_steps")
_MAX_FAILURES = 30


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
    state: dict = field(default_factory=dict)  # the engine's final state (SVI: "whitened_mean", "whitened_chol"; vi-*: "xi")
    jitter: float = None  # on the diagonal of Kmm at the end: the configured one, or what the guard raised it to
    checkpoints_written: int = 0  # by this run (0 when checkpoint_every exceeds its steps: the caller says so)


def _work(trainer, X=None, y=None, lo=0, hi=None, **_):
    """The shape of a call's work for the BLAS thread rule (``agpc.threads``): a minibatch step's rows
    lo:hi, or a pass over all rows of X, or (no X) the m x m algebra alone."""
    Z = trainer.state["Z"]
    m = Z.shape[-2]
    rows = m if X is None else (hi - lo) if (trainer.minibatch and hi is not None) else X.shape[0]
    return {"rows": rows, "m": m, "n_features": Z.shape[-1], "block_rows": trainer.engine.block_rows}


class Trainer(ModulesByName):
    """The state of a training run and one guarded step of it; ``train`` and ``partial_fit`` drive it.

    ``method`` picks the engine (``engines.make_engine``, which takes the method's options); ``engine`` is
    where the EP methods' passes run (a ``dask_engine.DaskEngine`` for rows on a cluster), or a callable
    that builds the engine in ``make_engine``'s place (data-parallel rounds: ``data_parallel.DataParallel``). A step
    evaluates the rows it is given at the current state and commits the engine's update. A non-finite log Z or a
    failed Cholesky puts back the state before the last good step and halves damping and step sizes, again
    on each failure in a row (or, when the inducing points' prior covariance no longer factorises, raises the
    jitter, reported as a ``JitterWarning``). Trainers pickle (``partial_fit`` models keep one).
    """

    def __init__(self, kernel, Z, *, method, n_total, minibatch, engine=None, **options):
        if callable(engine):  # a factory with ``make_engine``'s signature (``data_parallel.DataParallel``)
            self.engine = engine(method, kernel, Z, n_total=n_total, minibatch=minibatch, **options)
        else:
            self.engine = make_engine(method, kernel, Z, n_total=n_total, minibatch=minibatch, passes=engine,
                                      **options)
        self.xp = array_namespace(Z)
        self.method = method
        self.minibatch = minibatch
        self.history = {key: [] for key in HISTORY_KEYS}
        self.t0 = time.perf_counter()
        self.good = None
        self.n_rebuilds = 0
        self.failures = 0  # failed steps since the last good one, and what the guard did about them:
        self.halvings = 0  # reverts that halved damping and step sizes
        self.jitter_raises = 0  # raises of the jitter of Kmm
        self.n_steps = 0  # steps taken (failed ones not counted)
        self.n_updates = 0  # of them, steps that moved the hyper-parameters
        self.last = None  # the last step's ``engines.Outcome``
        self._pending = []  # (log Z estimate, invalid rows) of the steps since the last record

    # the engine's state, seen from the loop and from ``partial_fit``
    state = property(lambda self: self.engine.state, lambda self, value: setattr(self.engine, "state", value))
    damping = property(lambda self: self.engine.damping)
    names = property(lambda self: self.engine.names)
    optimizer = property(lambda self: self.engine.optimizer)
    per_row_sites = property(lambda self: self.engine.per_row_sites)
    needs_rebuild = property(lambda self: getattr(self.engine, "needs_rebuild", False))

    @property
    def n_total(self):
        return self.engine.n_total

    @n_total.setter
    def n_total(self, value):
        self.engine.n_total = value

    @with_blas_threads(_work)
    def step(self, X, y, lo, hi, *, stepping, weights=None):
        """Evaluate rows lo:hi of (X, y) (all of them in batch mode), commit the update, maybe step the
        hyper-parameters. ``weights``: one weight per row of lo:hi (a padded minibatch: 0 on the padding),
        for the engines whose passes apply them (SVI, minibatch EP / SEP / ADF; the others refuse them).

        Returns (took the step, relative change of the sites / factor / xi or None, log Z estimate).

        One device-to-host transfer a step: the engine's ``evaluate`` gives log Z, or a small vector whose
        first entry is log Z and whose others are what its ``apply`` needs on the host (the EP family: the
        count of failed cavities, the site change in batch mode); a failed Cholesky arrives as a NaN in it."""
        try:
            with block_memory_advice(f"the {self.method} training step"):
                summary, work = self.engine.evaluate(X, y, lo, hi, stepping=stepping, weights=weights)
                scalars = _host_scalars(summary)
        except CholeskyError:  # engines that check their factorisations on the host raise instead
            scalars = [math.nan]
        log_z = float(scalars[0])
        if not math.isfinite(log_z):
            self._recover()
            return False, float("inf"), log_z
        self.failures = self.halvings = self.jitter_raises = 0
        self.good = self.engine.snapshot()  # what a revert puts back
        with block_memory_advice(f"the {self.method} training step"):
            self.last = self.engine.apply(work, lo, hi, stepping=stepping, scalars=scalars)
        self.n_steps += 1
        self.n_updates += int(self.last.stepped)
        self._pending.append((log_z, self.last.n_invalid))
        return True, self.last.change, log_z

    def _recover(self):
        """The guard's path, after a step whose log Z was not finite: if the prior covariance of the inducing
        points no longer factorises at the configured jitter, raise the jitter (reported by
        ``backend.note_jitter``: one ``JitterWarning`` a fit, saying from what to what) and try again;
        otherwise put back the state before the last good step and halve the damping and the step sizes.
        Gives up with a FloatingPointError that says what was tried: after ``_MAX_FAILURES`` failures in a row,
        or at once when there is no good state to go back to (the very first step) or nothing to halve."""
        self.failures += 1
        engine = self.engine
        needed = _jitter_needed(engine.state["kernel"], engine.state["Z"], engine.jitter)
        if needed > engine.jitter and self.failures <= _MAX_FAILURES:
            note_jitter(f"{PRIOR_FACTOR_NAME}: the model's jitter", engine.jitter, needed)
            engine.jitter = needed
            self.jitter_raises += 1
            return
        tried = self._tried()
        if self.good is None:
            raise FloatingPointError(
                f"{self.method} diverged: log Z is not finite at the first step (of this run or since its resume), "
                f"before any good state to go back to ({tried}); try standardised inputs, a larger jitter or fewer inducing points"
            )
        if self.failures > _MAX_FAILURES:
            raise FloatingPointError(
                f"{self.method} diverged: log Z is not finite and stayed so after {self.failures} failed steps in "
                f"a row ({tried}); try a smaller damping or learning rate, or standardised inputs"
            )
        engine.restore(self.good)  # (which puts back the good step's damping and step sizes too)
        # Halvings compound over failures in a row: the k-th retry runs at 2^-k of the good step's damping and
        # step sizes (halving only once after each revert would retry the same step with the same settings).
        for _ in range(self.halvings + 1):
            if not engine.shrink():
                raise FloatingPointError(
                    f"{self.method} diverged: log Z is not finite, and the method has no damping or step size to "
                    f"halve ({tried}); try standardised inputs or a larger jitter"
                )
        self.halvings += 1

    def _tried(self):
        """What the guard did since the last good step, for the divergence message."""
        what = [f"damping and step sizes halved {self.halvings} time{'s' if self.halvings != 1 else ''}"
                if self.halvings else "nothing halved"]
        what.append(f"jitter raised {self.jitter_raises} time{'s' if self.jitter_raises != 1 else ''} to "
                    f"{self.engine.jitter:.1e}" if self.jitter_raises else f"jitter {self.engine.jitter:.1e}")
        return ", ".join(what)

    def record(self):
        """Close a history entry: minibatch mode, the mean log Z estimate of the steps since the last one (an
        epoch); batch mode, the last step's."""
        if not self._pending:
            return
        values = [v for v, _ in self._pending]
        invalid = [k for _, k in self._pending]
        h = self.history
        h["log_marginal_likelihood"].append(sum(values) / len(values) if self.minibatch else values[-1])
        h["n_invalid_sites"].append(sum(invalid) if self.minibatch else invalid[-1])
        h["time"].append(time.perf_counter() - self.t0)
        h["damping"].append(self.damping)
        h["n_steps"].append(self.n_steps)
        self._pending = []

    @with_blas_threads(_work)
    def rebuild_factor(self, X, y):
        """Minibatch EP: the exact product of all sites at the current hyper-parameters (``EPEngine``)."""
        self.n_rebuilds += 1
        with block_memory_advice(f"{self.method}'s exact rebuild of the site product"):
            self.engine.rebuild_factor(X, y)

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


def train(
    X,
    y,
    kernel,
    Z,
    *,
    method="ep",
    batch_size=None,
    jitter=1e-6,
    max_iter=250,
    damping=None,
    optimize=("kernel", "inducing"),
    optimizer=None,
    learning_rate=None,
    tol=1e-6,
    max_time=None,
    n_warmup=10,
    block_rows=None,
    random_state=None,
    shuffle=True,
    site_precision=None,
    site_shift=None,
    callback=None,
    validation=None,
    eval_every=None,
    n_iter_no_change=None,
    progress=False,
    engine=None,
    checkpoint_path=None,
    checkpoint_every=None,
    resume=False,
    data_hash=None,
    likelihood=None,
    n_quadrature=20,
    max_ep_sweeps=100,
    started=None,
):
    """Fit ``method`` (one of ``ALL_METHODS``): the likelihood approximation and the hyper-parameters; see the
    module docstring.

    ``damping`` (EP family, GFITC) defaults to 0.5 in batch mode and 0.99 in minibatch mode (Hernandez-Lobato &
    Hernandez-Lobato (2016), sec. A.4). ``n_warmup``: batch EP / SEP / ADF sweeps before the first hyper-parameter step.
    With nothing to optimise, batch steps run until the largest relative change of the sites (factor, xi) is below
    ``tol`` (at most ``max_iter`` of them). GFITC's sites have settled before each hyper-parameter step when that
    change is below ``tol`` (or after ``max_ep_sweeps`` sweeps), and once more at the end. ``max_time``
    (seconds) bounds the whole call from ``started`` (a ``time.perf_counter()`` reading; default: the start of
    this call; ``GPClassifier.fit`` passes its own start, so that input checks and the initialisation of the
    inducing points count): no step is started that the measured length of a step, plus the final pass that
    rebuilds q from all sites (EP; measured from the exact rebuilds of the site product or the steps), would
    carry past it. ``shuffle=False`` visits minibatches in storage order (a stream). ``likelihood`` and
    ``n_quadrature``: SVI's (binary: "probit" or "logistic").

    ``validation=(X_val, y_val)`` (labels as the engine takes them: {-1, +1}, or class indices) is scored every
    ``eval_every`` steps (default: every iteration in batch mode, every epoch in minibatch mode) into
    ``history`` ("validation_step", "validation_nll", "validation_error"). With ``n_iter_no_change``, training
    stops when the validation NLL has not improved by ``tol`` for that many evaluations, and the best state is
    kept. ``progress=True`` shows a tqdm bar (one per epoch in minibatch mode) with log Z and the validation NLL.

    ``checkpoint_path`` with ``checkpoint_every`` (steps) writes the whole training state there (atomically:
    a crash while writing leaves the previous checkpoint as it was); ``resume=True`` starts from it, and a
    run that is interrupted and resumed ends at the same model as one that is not (same seed, same data).
    ``data_hash`` (``data_fingerprint`` of X and y) goes into the run's fingerprint: a resume on other data
    is refused.
    """
    # Compute where the model lives (Z); X and y may be in memory or on disk (read a block at a time).
    xp = array_namespace(Z)
    n = X.shape[0]
    device = array_device(Z)
    out_of_core = is_out_of_core(X) or is_out_of_core(y)
    minibatch = batch_size is not None and batch_size < n
    rng = host_rng(random_state)
    permutation = None
    if minibatch and shuffle and not out_of_core:
        # Minibatches are contiguous slices of one random reordering of the rows (so that sites update by
        # slice, which the array API supports, and sorted data still give mixed minibatches); the order
        # in which the slices are visited is drawn again every epoch. Data on disk are not reordered
        # (that would read them all): their slices are visited in random order, so rows stored sorted
        # should be shuffled on disk first.
        permutation = asarray_like(rng.permutation(n), xp, device=device)
        X = xp.take(X, permutation, axis=0)
        y = xp.take(y, permutation, axis=0)
        if site_precision is not None:
            site_precision = xp.take(site_precision, permutation, axis=0)
            site_shift = xp.take(site_shift, permutation, axis=0)
    options = dict(jitter=jitter, optimize=optimize, block_rows=block_rows)
    if method in EP_METHODS + ("gfitc",):
        options.update(damping=damping, site_precision=site_precision, site_shift=site_shift)
    if method in EP_METHODS + ("svi",):
        options.update(optimizer=optimizer, learning_rate=learning_rate)
    if method == "svi":
        options.update(likelihood=likelihood, n_quadrature=n_quadrature)
    if method == "gfitc":
        options.update(optimizer=optimizer, tol_ep=tol, max_ep_sweeps=max_ep_sweeps)
    if method not in ALL_METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {ALL_METHODS}")
    trainer = Trainer(kernel, Z, method=method, n_total=n, minibatch=minibatch, engine=engine, **options)
    engine = trainer.engine
    has_params = engine.has_params
    warmup = n_warmup if (engine.uses_warmup and has_params and not minibatch) else 0
    if minibatch:
        batches, chunk_batches = minibatch_layout(X, batch_size, out_of_core)
    else:
        batches = [(0, n)]

    def finished():
        if minibatch:
            return trainer.n_steps >= max_iter * len(batches)
        if has_params:  # GFITC: and its sites settled at the last hyper-parameters
            return trainer.n_updates >= max_iter and engine.settled
        return trainer.n_steps >= max_iter

    if eval_every is None and minibatch:
        eval_every = len(batches)
    best = {"nll": float("inf"), "reference": float("inf"), "state": None, "since": 0}
    if validation is not None:
        for key in ("validation_step", "validation_nll", "validation_error"):
            trainer.history[key] = []
    bar = None

    def new_bar():
        # batch mode: one bar over the iterations; minibatch mode: one bar per epoch
        if not progress:
            return None
        if minibatch:
            epoch = trainer.n_steps // len(batches) + 1
            return tqdm(total=len(batches), unit="batch", desc=f"agpc {method} epoch {epoch}/{max_iter}")
        return tqdm(total=max_iter + warmup, unit="iter", desc=f"agpc {method}")
    order = []
    checkpoints_written = 0
    fingerprint = {"n": int(n), "method": method, "n_batches": len(batches), "Z_shape": [int(v) for v in Z.shape],
                   "per_row_sites": engine.per_row_sites, "params": list(engine.names), "data": data_hash,
                   # full-GP passes read Z as the rows themselves, site i as row i's: a sparse run's checkpoint whose
                   # Z has n points (in another order) must not resume under them
                   "full_gp": getattr(engine, "passes", None) is exact_ep,
                   # the objective's priors: a resume under other priors (kernel_prior changed) would climb
                   # another objective from the saved state
                   "priors": {key: parameter.prior.spec() for key, parameter in kernel.parameter_table().items()
                              if parameter.prior is not None}}
    if resume:
        order, best = _restore(trainer, rng, checkpoint_path, fingerprint, validation is not None)
    converged = stopped_by_time = early_stopped = False
    budget = _TimeBudget(max_time, time.perf_counter() if started is None else started, batch=not minibatch)
    if resume:  # the budget covers the interrupted run's training time too
        budget.spent_before(time.perf_counter() - trainer.t0)
    if max_time is not None and minibatch and trainer.per_row_sites:
        budget.measure_rebuild(trainer, X, y)
    while not finished():
        rebuild_due = (not order and minibatch and trainer.per_row_sites and trainer.n_steps > 0) or (
            bool(order) and trainer.needs_rebuild)
        if budget.exhausted(rebuild_due):
            stopped_by_time = True
            break
        if not order:
            order = _epoch_order(rng, chunk_batches, shuffle) if minibatch else [0]
            if bar is None or minibatch:
                if bar is not None:
                    bar.close()
                bar = new_bar()
        if rebuild_due:
            with budget.timing("rebuild"):
                trainer.rebuild_factor(X, y)
        lo, hi = batches[order[0]]
        stepping = has_params and (minibatch or (trainer.n_steps >= warmup and trainer.n_updates < max_iter))
        with budget.timing("step"):
            took, change, log_z = trainer.step(X, y, lo, hi, stepping=stepping)
        if not took:
            continue
        order.pop(0)
        recorded = (not order) if minibatch else trainer.last.record  # minibatch: once an epoch
        if recorded:
            trainer.record()
        if callback is not None:
            callback(trainer.n_steps, log_z)
        postfix = {"log_Zq": f"{log_z:.4g}"}
        if validation is not None and ((trainer.n_steps % eval_every == 0) if eval_every else recorded):
            nll, error = validation_scores(trainer, X, y, validation)
            h = trainer.history
            h["validation_step"].append(trainer.n_steps)
            h["validation_nll"].append(nll)
            h["validation_error"].append(error)
            postfix["val_nll"] = f"{nll:.4f}"
            if nll < best["nll"]:  # keep the best state seen...
                best.update(nll=nll, state=engine.keep() if n_iter_no_change is not None else None)
            if nll < best["reference"] - tol:  # ...but count only improvements larger than tol
                best.update(reference=nll, since=0)
            else:
                best["since"] += 1
            if n_iter_no_change is not None and best["since"] >= n_iter_no_change:
                if best["state"] is not None:  # (not kept across a resume: the current state stays)
                    engine.put_back(best["state"])
                early_stopped = True
        if bar is not None and (minibatch or recorded):
            bar.update(1)
            bar.set_postfix(postfix, refresh=False)
        if checkpoint_every and trainer.n_steps % int(checkpoint_every) == 0:
            _write_checkpoint(trainer, rng, order, best, checkpoint_path, fingerprint)
            checkpoints_written += 1
        if early_stopped:
            break
        if not has_params and not minibatch and change is not None and change < tol:
            converged = True
            break
    if bar is not None:
        bar.close()
    if minibatch:  # an epoch cut short (batch mode records its iterations as they end)
        trainer.record()
    # Minibatch mode under a time budget: the exact final pass over all rows (minibatch EP's rebuild of q
    # from every site, SVI's bound on all rows) only if it fits; otherwise q is the running one, as during
    # training, and log Z the last epoch's estimate.
    # The final model's prior factor may need more jitter than the engine's (vi-* and GFITC factor Kmm with
    # ``backend.cholesky``, which adds to the diagonal itself): jitter_ must be what that factor was built with,
    # or a saved model re-factorises at the smaller jitter and warns again on load.
    with jitter_raises_within() as raises:
        posterior, final_log_z = trainer.posterior(X, y, want_log_z=not minibatch or budget.final_pass_fits())
    extra = max((after for what, before, after in raises if what.startswith(PRIOR_FACTOR_NAME) and before == 0.0), default=0.0)
    state = dict(engine.state)
    if permutation is not None and trainer.per_row_sites:  # back to the caller's row order
        inverse = xp.argsort(permutation)
        state["nu"] = xp.take(state["nu"], inverse, axis=0)
        state["mu"] = xp.take(state["mu"], inverse, axis=0)
    return TrainResult(
        kernel=state["kernel"],
        Z=state["Z"],
        posterior=posterior,
        log_z=final_log_z,
        n_iter=len(trainer.history["log_marginal_likelihood"]),
        site_precision=state.get("nu"),
        site_shift=state.get("mu"),
        factor=state.get("factor"),
        history=trainer.history,
        converged=converged,
        stopped_by_time=stopped_by_time,
        early_stopped=early_stopped,
        checkpoints_written=checkpoints_written,
        state=state,
        jitter=engine.jitter + extra,
    )


def _host_scalars(summary):
    """A step's scalars as Python floats, brought to the host in one transfer (log Z first)."""
    if isinstance(summary, (int, float)):
        return [float(summary)]
    return [float(v) for v in to_host_vector(summary)]


def _jitter_needed(kernel, Z, jitter):
    """The jitter with which the prior covariance of the inducing points factorises: ``jitter`` itself
    when it does, a larger value found by ``backend.cholesky``'s escalation otherwise (host-side checks:
    run only on the guard's path). Raises CholeskyError when no jitter helps."""
    multiclass = isinstance(kernel, ClassKernels)
    kernels = kernel.kernels if multiclass else (kernel,)
    Zs = [Z[c, ...] for c in range(Z.shape[0])] if multiclass else [Z]
    needed = jitter
    for k, Zc in zip(kernels, Zs):
        xp = array_namespace(Zc)
        Kmm = k.K(Zc) + jitter * xp.eye(Zc.shape[0], dtype=Zc.dtype, device=array_device(Zc))
        _, added = cholesky_with_jitter(Kmm, what=PRIOR_FACTOR_NAME, report=False)
        needed = max(needed, jitter + added)
    return needed


class _TimeBudget:
    """``max_time`` for the whole fit: measures how long a step and an exact rebuild of the site product
    take, and says when the next step (with a rebuild when one is due) would no longer fit. Batch mode keeps
    room for its final pass (about one step: q rebuilt from all rows). Minibatch mode keeps none: its final
    pass over all rows (minibatch EP's exact rebuild, SVI's bound on all rows) is made only when it fits
    (``final_pass_fits``; estimated as twice a measured rebuild, before the first one a rebuild of the first
    rows scaled to all), and q otherwise stays the running one, which training itself used."""

    def __init__(self, max_time, started, *, batch):
        self.deadline = None if max_time is None else started + float(max_time)
        self.batch = batch
        self.seconds = {"step": None, "rebuild": None}

    def measure_rebuild(self, trainer, X, y, rows=8192):
        """Minibatch EP before its first exact rebuild: time one on the first ``rows`` rows and scale it to
        all of them."""
        n = X.shape[0]
        rows = min(n, rows)
        engine = trainer.engine
        s = engine.state
        t = time.perf_counter()
        engine.passes.exact_factor(s["kernel"], s["Z"], row_slice(X, 0, rows), s["nu"][:rows], s["mu"][:rows],
                                   jitter=engine.jitter, block_rows=engine.block_rows, y=row_slice(y, 0, rows))
        self.seconds["rebuild"] = (time.perf_counter() - t) * n / rows

    def spent_before(self, seconds):
        if self.deadline is not None:
            self.deadline -= seconds

    @contextmanager
    def timing(self, what):
        t = time.perf_counter()
        yield
        self.seconds[what] = time.perf_counter() - t

    def exhausted(self, rebuild_due):
        if self.deadline is None:
            return False
        step, rebuild = self.seconds["step"], self.seconds["rebuild"]
        upcoming = (step or 0.0) + ((rebuild or 0.0) if rebuild_due else 0.0)
        final = (step or 0.0) if self.batch else 0.0
        return time.perf_counter() + upcoming + final > self.deadline

    def final_pass_fits(self):
        if self.deadline is None:
            return True
        rebuild = self.seconds["rebuild"]
        return rebuild is not None and time.perf_counter() + 2.0 * rebuild <= self.deadline


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


FINGERPRINT_ROWS = 1000


def fingerprint_stride(n):
    """The stride of the rows a data fingerprint reads: at most ``FINGERPRINT_ROWS`` rows, spread over all n
    (fixed positions, so an array on disk or on a cluster is read at those rows only)."""
    return max(1, -(-int(n) // FINGERPRINT_ROWS))


def data_fingerprint(n, d, rows, labels, classes):
    """A hash of the training data for a checkpoint's run fingerprint: n, d, the classes and the rows and
    (encoded) labels at ``fingerprint_stride`` positions. Resuming on other data of the same shape would
    silently mix two fits; this catches it (a change only between the sampled rows goes unseen)."""
    digest = hashlib.sha256(f"{int(n)} {int(d)} {[str(c) for c in classes]}".encode())
    for values in (rows, labels):
        digest.update(to_host_vector(values).tobytes())
    return digest.hexdigest()[:32]


def _write_checkpoint(trainer, rng, order, best, path, fingerprint):
    """Everything the loop needs to go on exactly as if it had not stopped."""
    engine_state = trainer.engine.checkpoint_state(path, trainer.n_steps)
    save_checkpoint(path, {
        "fingerprint": fingerprint, "engine": engine_state,
        "n_steps": trainer.n_steps, "n_updates": trainer.n_updates, "history": trainer.history,
        "pending": [list(p) for p in trainer._pending],
        "rng": rng.bit_generator.state, "order": [int(i) for i in order],
        "best": {k: v for k, v in best.items() if k != "state"},
        "elapsed": time.perf_counter() - trainer.t0,
    })
    written = getattr(trainer.engine, "checkpoint_written", None)
    if written is not None:
        written(engine_state)


def _restore(trainer, rng, path, fingerprint, has_validation):
    """Put a checkpoint's state into a freshly built trainer; returns (order, best). Everything read is
    checked first: a field of the wrong type or shape is one ValueError naming the file and the field."""
    if path is None:
        raise ValueError("resume=True needs checkpoint_path")

    def refuse(why):
        return ValueError(f"{path} is not a valid agpc checkpoint: {why}")

    xp, device = trainer.xp, array_device(trainer.state["Z"])
    saved = load_checkpoint(path, lambda a: asarray_like(a, xp, device=device))
    written_for = saved.get("fingerprint")
    if isinstance(written_for, dict):  # a checkpoint from before priors were part of the fingerprint had none
        written_for = {"priors": {}, "full_gp": False, **written_for}  # (nor the full GP's passes, which came later)
        legacy = getattr(trainer.engine, "legacy_checkpoint_keys", {})
        if legacy and isinstance(written_for.get("params"), list):  # the parameters by the names of an older form
            written_for["params"] = [legacy.get(name, name) if isinstance(name, str) else name
                                     for name in written_for["params"]]
    # The data's hash is of its rows in the run's type, so a resume in another dtype would read as other data:
    # said first, by the type the checkpoint's arrays are in.
    saved_Z = saved["engine"].get("Z") if isinstance(saved.get("engine"), dict) else None
    run_dtype = trainer.state["Z"].dtype
    if is_array(saved_Z) and saved_Z.dtype != run_dtype:
        raise ValueError(
            f"checkpoint {path} was written by a fit computing in {dtype_text(saved_Z.dtype)}, but this fit "
            f"computes in {dtype_text(run_dtype)}: resume with dtype='{dtype_text(saved_Z.dtype)}', or fit "
            "afresh without resume"
        )
    # other data of the same shape (the default priors are centred on the data, so they may differ with it)
    data_derived = ("data", "priors")
    if isinstance(written_for, dict) and written_for.get("data") != fingerprint["data"] and (
        {k: v for k, v in written_for.items() if k not in data_derived}
        == {k: v for k, v in fingerprint.items() if k not in data_derived}
    ):
        raise ValueError(
            f"checkpoint {path} was written for different training data: the same number of rows and features, "
            f"but other rows or labels (data fingerprint {written_for.get('data')}, this data {fingerprint['data']})"
        )
    if written_for != fingerprint:
        differs = sorted(set(written_for) | set(fingerprint)) if not isinstance(written_for, dict) else sorted(
            key for key in set(written_for) | set(fingerprint) if written_for.get(key) != fingerprint.get(key))
        hint = ("; a fit on a dask array with checkpoint_path stepped on the driver (local_steps=0) by default "
                "before data-parallel rounds were checkpointed: pass local_steps=0 to resume such a checkpoint"
                if differs == ["n_batches"] else "")
        raise ValueError(
            f"checkpoint {path} was written by a different training run (differing in {', '.join(differs)}: "
            f"{written_for}); this run is {fingerprint}{hint}"
        )
    check_loop_state(saved, fingerprint, refuse)
    check_engine_state(saved["engine"], trainer.engine, fingerprint, path, refuse)
    fresh = array_shapes(trainer.engine.state)
    try:
        rng.bit_generator.state = saved["rng"]
    except (KeyError, TypeError, ValueError) as exc:
        raise refuse(f"rng: not the state of this run's generator ({type(exc).__name__}: {exc})") from None
    try:
        trainer.engine.restore_checkpoint(saved["engine"], path)
    # what restoring raises on a missing entry or a value of the wrong kind: the field is named
    except (KeyError, TypeError, IndexError) as exc:  # (a ValueError here says what is wrong already)
        raise refuse(f"engine: {type(exc).__name__}: {exc}") from None
    restored = array_shapes(trainer.engine.state)
    for key, shape in fresh.items():
        if restored.get(key) != shape:
            raise refuse(f"engine.{key}: shape {restored.get(key)}, this run's is {shape}")
    trainer.n_steps = saved["n_steps"]
    trainer.n_updates = saved["n_updates"]
    trainer.history = saved["history"]
    trainer._pending = [tuple(p) for p in saved["pending"]]
    trainer.t0 = time.perf_counter() - saved["elapsed"]
    trainer.good = None
    best = dict(saved["best"], state=None)
    if has_validation and trainer.history.get("validation_nll") is None:
        raise ValueError(f"checkpoint {path} has no validation history but this run has validation data")
    return list(saved["order"]), best


def validation_scores(trainer, X, y, validation):
    """Test NLL and error of the current state on (X_val, y_val) (labels as the engine takes them): what
    ``train`` records at each validation step (benchmarks/airline.py wraps it to time the scoring)."""
    X_val, y_val = validation
    with block_memory_advice(f"{trainer.method}'s scoring of the validation data"):
        post, _ = trainer.engine.posterior(X, y, want_log_z=False)
        y_val = read_rows(y_val, 0, y_val.shape[0], trainer.state["Z"])
        return trainer.engine.validation_scores(post, X_val, y_val)
