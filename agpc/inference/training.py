"""The training loop shared by EP, SEP and ADF (seed 000 sec. 2.3; seed 002).

Batch mode: one parallel damped update of all sites, then one step on the hyper-parameters, repeated.
Minibatch mode (eq. 6): per minibatch, refine its sites, rebuild q, and step on the stochastic gradient
(the data part scaled by n / |M|); ``max_iter`` then counts epochs.

The methods differ only in how the cavity is formed and where a new site goes (see ``ep.evaluate_factor``):
EP keeps two numbers a row; SEP and ADF keep one m x m factor. Batch EP rebuilds q exactly from all its
sites at the current hyper-parameters each pass; minibatch EP keeps the product of its sites as a u-space
factor and swaps a minibatch's old sites for their new ones.
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..backend import (CholeskyError, array_device, array_namespace, asarray_like, cholesky_with_jitter, host_rng, is_out_of_core,
                       read_rows, row_chunk_bounds, row_slice, to_numpy)
from ..kernels import ClassKernels
from ..optim import OPTIMIZERS, Rprop
from . import ep, multiclass_ep

__all__ = ["train", "Trainer", "TrainResult", "METHODS"]

METHODS = ("ep", "sep", "adf")
_REBUILD_INVALID_FRACTION = 0.05  # minibatch EP: rebuild the site product when more cavities than this fail


@dataclass
class TrainResult:
    kernel: object
    Z: object
    posterior: object
    log_z: float
    n_iter: int
    site_precision: object = None  # EP only (in training row order)
    site_shift: object = None
    factor: object = None  # SEP / ADF (and minibatch EP): the likelihood factor in u-space
    history: dict = field(default_factory=dict)
    converged: bool = False
    stopped_by_time: bool = False
    early_stopped: bool = False


def _parameter_names(kernel, optimize):
    names = []
    if "kernel" in optimize:
        names += [k for k in kernel.params if not k.endswith("log_noise") or math.isfinite(float(kernel.params[k]))]
    if "inducing" in optimize:
        names.append("Z")
    return names


def _initial_steps(kernel, Z, names):
    """First Rprop steps: 0.01 in log space for kernel parameters, 1% of the spread of Z per dimension."""
    xp = array_namespace(Z)
    steps = {}
    for name in names:
        if name == "Z":
            # per input dimension (and per class for a multiclass model's (C, m, d) inducing points)
            if Z.shape[-2] > 1:
                spread = xp.std(Z, axis=-2, keepdims=True)
            else:
                spread = xp.ones_like(Z)
            spread = xp.where(spread > 0, spread, xp.ones_like(spread))
            steps[name] = 0.01 * (xp.zeros_like(Z) + spread)
        else:
            steps[name] = xp.zeros_like(kernel.params[name]) + 0.01
    return steps


def _make_optimizer(optimizer, learning_rate, kernel, Z, names, minibatch):
    if optimizer is None:
        optimizer = "adadelta" if minibatch else "rprop"
    if isinstance(optimizer, str):
        if optimizer == "rprop":
            return Rprop(initial_steps=_initial_steps(kernel, Z, names))
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}: use 'rprop', 'adadelta' or 'adam'")
        cls = OPTIMIZERS[optimizer]
        return cls() if learning_rate is None else cls(learning_rate=learning_rate)
    return optimizer


def _relative_change(new, old, xp):
    """max|new - old| / (1 + max|old|), left on the device (0-d)."""
    return xp.max(xp.abs(new - old)) / (1.0 + xp.max(xp.abs(old)))


def _jitter_needed(engine, kernel, Z, jitter):
    """The jitter with which the prior covariance of the inducing points factorises: ``jitter`` itself
    when it does, a larger value found by ``backend.cholesky``'s escalation otherwise (host-side checks:
    run only on the guard's path). Raises CholeskyError when no jitter helps."""
    kernels = kernel.kernels if isinstance(kernel, ClassKernels) else (kernel,)
    Zs = [Z[c, ...] for c in range(Z.shape[0])] if isinstance(kernel, ClassKernels) else [Z]
    needed = jitter
    for k, Zc in zip(kernels, Zs):
        xp = array_namespace(Zc)
        Kmm = k.K(Zc) + jitter * xp.eye(Zc.shape[0], dtype=Zc.dtype, device=array_device(Zc))
        _, added = cholesky_with_jitter(Kmm, what="Kmm (covariance of the inducing points)")
        needed = max(needed, jitter + added)
    return needed


def _step(optimizer, names, kernel, Z, grads):
    params = dict(kernel.params)
    params["Z"] = Z
    updated = optimizer.step({k: params[k] for k in names}, {k: grads[k] for k in names})
    params.update(updated)
    Z = params.pop("Z")
    return kernel.with_params(params), Z


class Trainer:
    """The state of a training run and one step of it; ``train`` and ``partial_fit`` drive it.

    A step evaluates the rows it is given at the current (hyper-parameters, sites), damps the sites
    (seed 000 eq. 25) and, when ``stepping``, moves the hyper-parameters. A non-finite log Z_q or a
    failed Cholesky puts back the state before the last good step and halves damping and step sizes.
    """

    def __init__(self, kernel, Z, *, method, n_total, minibatch, jitter=1e-6, damping=None,
                 optimize=("kernel", "inducing"), optimizer=None, learning_rate=None, block_rows=None,
                 site_precision=None, site_shift=None, engine=None):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}: use one of {METHODS}")
        xp = array_namespace(Z)
        self.xp = xp
        self.method = method
        self.n_total = n_total
        self.minibatch = minibatch
        self.jitter = jitter
        self.block_rows = block_rows
        self.damping = (0.99 if minibatch else 0.5) if damping is None else damping
        self.names = _parameter_names(kernel, tuple(optimize))
        self.optimizer = (
            _make_optimizer(optimizer, learning_rate, kernel, Z, self.names, minibatch) if self.names else None
        )
        # The binary engine (ep) or the multiclass one (one kernel and one set of inducing points per
        # class): the same passes, the same loop.
        # ``engine`` replaces it for data held elsewhere (``dask_engine.DaskEngine``: rows on a cluster).
        self.engine = engine or (multiclass_ep if isinstance(kernel, ClassKernels) else ep)
        self.per_row_sites = method == "ep"
        if self.per_row_sites and site_precision is None:
            site_precision = self.engine.zero_sites(n_total, Z)
            site_shift = self.engine.zero_sites(n_total, Z)
        elif self.per_row_sites and minibatch:  # updated in place below: never write into the caller's arrays
            site_precision = xp.asarray(site_precision, copy=True)
            site_shift = xp.asarray(site_shift, copy=True)
        factor = self.engine.uniform_factor(Z) if (minibatch or not self.per_row_sites) else None
        self.state = {"kernel": kernel, "Z": Z, "nu": site_precision, "mu": site_shift, "factor": factor}
        self.history = {"log_marginal_likelihood": [], "time": [], "n_invalid_sites": [], "damping": []}
        self.t0 = time.perf_counter()
        self.good = None
        self.needs_rebuild = False
        self.n_rebuilds = 0
        self.failures = 0
        self.n_steps = 0
        self._pending = []  # minibatch estimates since the last record

    # -- one step --------------------------------------------------------------------------------

    def step(self, X, y, lo, hi, *, stepping, weights=None):
        """Evaluate rows lo:hi of (X, y) (all of them for batch EP), update, maybe step.

        ``weights`` (rows lo:hi): per-row weights of the rows' log Z_i, gradients and site changes (0 for
        the padding of a minibatch). One device-to-host transfer a step: log Z_q with the count of failed
        cavities (and, in batch mode, the site change) in one small vector; a failed Cholesky arrives there
        as a NaN log Z_q, and only then is anything else examined (``_recover``).

        Returns (took_step, relative change of the sites or factor, log Z_q estimate)."""
        xp, state = self.xp, self.state
        kernel, Z = state["kernel"], state["Z"]
        batch_ep = not self.minibatch and self.per_row_sites
        try:
            if batch_ep:
                # the sweep damps the sites itself (seed 000 eq. 25), block by block
                result = self.engine.evaluate(kernel, Z, X, y, state["nu"], state["mu"], jitter=self.jitter,
                                              want_grad=stepping, block_rows=self.block_rows, damping=self.damping,
                                              checked=False)
            else:
                result = self.engine.evaluate_factor(
                    kernel, Z, row_slice(X, lo, hi), row_slice(y, lo, hi), state["factor"], method=self.method,
                    n_total=self.n_total,
                    site_precision=state["nu"][lo:hi] if self.per_row_sites else None,
                    site_shift=state["mu"][lo:hi] if self.per_row_sites else None,
                    jitter=self.jitter, want_grad=stepping, block_rows=self.block_rows, weights=weights,
                    checked=False,
                )
        except CholeskyError:  # engines that check their factorisations on the host (multiclass) raise instead
            self._recover(X, y)
            return False, float("inf"), float("nan")
        rho = self.damping
        new_factor = None
        if not self.per_row_sites:  # SEP / ADF: the rows' share (rows / n) of the factor is replaced by their sites
            share = (hi - lo if weights is None else xp.sum(weights)) / self.n_total
            new_factor = state["factor"].combine(1.0 - rho * share, result["site_delta"], rho)
        summary = self._host_summary(result, new_factor)
        log_z, n_invalid = float(summary[0]), float(summary[1])
        if not math.isfinite(log_z):
            self._recover(X, y)
            return False, float("inf"), log_z
        self.failures = 0
        # (state, optimiser, damping, undo of an in-place site update): what a revert puts back
        self.good = [dict(state), self.optimizer.snapshot() if self.optimizer is not None else None, self.damping, None]
        self.n_steps += 1
        change = 0.0
        if batch_ep:  # the sites came back damped by rho
            change = ep.relative_site_change(summary[2:6])
            state["nu"], state["mu"] = result["site_precision"], result["site_shift"]
        elif self.per_row_sites:  # minibatch EP: swap the rows' old sites for the damped new ones
            # In place: the site store is the one n-sized thing minibatch EP holds (2 floats a row);
            # a copy per step would double it. The rows' old values are kept to undo the step.
            old_nu = xp.asarray(state["nu"][lo:hi], copy=True)
            old_mu = xp.asarray(state["mu"][lo:hi], copy=True)
            state["nu"][lo:hi] = rho * result["site_precision"] + (1.0 - rho) * old_nu
            state["mu"][lo:hi] = rho * result["site_shift"] + (1.0 - rho) * old_mu
            self.good[3] = (lo, hi, old_nu, old_mu)
            # A row's old site is swapped out along its current projection, but the factor holds it along
            # the projection of its last visit: the residue grows as the hyper-parameters move, and shows
            # as cavities that are no longer proper. Many of them: rebuild the factor exactly (one pass).
            if n_invalid > _REBUILD_INVALID_FRACTION * (hi - lo):
                self.needs_rebuild = True
            state["factor"] = state["factor"].combine(1.0, result["site_delta"], rho)
        else:
            if not self.minibatch:
                change = float(summary[2]) + float(summary[3])
            state["factor"] = new_factor
        self._pending.append((log_z, n_invalid))
        if stepping:
            state["kernel"], state["Z"] = _step(self.optimizer, self.names, kernel, Z, result["grads"])
        return True, change, log_z

    def _host_summary(self, result, new_factor):
        """The step's scalars in one transfer: log Z_q, failed cavities, and what batch mode stops on."""
        xp = self.xp
        like = self.state["Z"]
        parts = [result["log_z"], result["n_invalid"]]
        if not self.minibatch and self.per_row_sites:
            parts += [result["site_change"][k] for k in range(4)]
        elif not self.minibatch:
            old = self.state["factor"]
            parts += [_relative_change(new_factor.precision, old.precision, xp),
                      _relative_change(new_factor.shift, old.shift, xp)]
        values = [xp.asarray(v, dtype=like.dtype, device=array_device(like)) for v in parts]
        return to_numpy(xp.stack(values))

    def _recover(self, X, y):
        """The guard's path, after a step whose log Z_q was not finite: if the prior covariance of the
        inducing points no longer factorises at the configured jitter, raise the jitter (once, with a
        warning) and try again; otherwise put back the state before the last good step and halve the
        damping and the step sizes."""
        self.failures += 1
        if self.good is None or self.failures > 30:
            raise FloatingPointError(
                "EP diverged: log Z_q is not finite and halving the damping and step sizes did not help "
                f"(after {self.failures} attempts); try a smaller damping or standardised inputs"
            )
        needed = _jitter_needed(self.engine, self.state["kernel"], self.state["Z"], self.jitter)
        if needed > self.jitter:
            warnings.warn(
                f"the inducing points' prior covariance is not positive definite with jitter {self.jitter:.1e}; "
                f"continuing with jitter {needed:.1e} (inducing points too close together?)",
                RuntimeWarning, stacklevel=3,
            )
            self.jitter = needed
            return
        saved, opt_state, self.damping, undo = self.good
        if undo is not None:  # minibatch EP updated the rows' sites in place: write the old ones back
            lo_, hi_, old_nu, old_mu = undo
            saved["nu"][lo_:hi_] = old_nu
            saved["mu"][lo_:hi_] = old_mu
        self.state = dict(saved)
        if self.optimizer is not None:
            self.optimizer.restore(opt_state)
            self.optimizer.scale_steps(0.5)
        self.damping *= 0.5

    def record(self):
        """Close a history entry: the mean log Z_q estimate of the steps since the last one."""
        if not self._pending:
            return
        self.history["log_marginal_likelihood"].append(sum(v for v, _ in self._pending) / len(self._pending))
        self.history["n_invalid_sites"].append(sum(k for _, k in self._pending))
        self.history["time"].append(time.perf_counter() - self.t0)
        self.history["damping"].append(self.damping)
        self._pending = []

    def rebuild_factor(self, X, y):
        """Minibatch EP: recompute the product of all sites at the current hyper-parameters.

        A row's old site is swapped out along its *current* projection while the factor holds it along
        the projection of its last visit; without an exact rebuild once an epoch the residue piles up."""
        s = self.state
        self.needs_rebuild = False
        self.n_rebuilds += 1
        s["factor"] = self.engine.exact_factor(s["kernel"], s["Z"], X, s["nu"], s["mu"], jitter=self.jitter,
                                               block_rows=self.block_rows, y=y)

    # -- the end ---------------------------------------------------------------------------------

    def posterior(self, X=None, y=None):
        """q at the current state (for EP: rebuilt exactly from all sites, one pass over X) and its log Z_q."""
        s = self.state
        kernel, Z = s["kernel"], s["Z"]
        if self.per_row_sites and X is not None:
            final = self.engine.evaluate(kernel, Z, X, y, s["nu"], s["mu"], jitter=self.jitter, want_grad=False,
                                block_rows=self.block_rows, want_sites=False)
            return final["posterior"], float(final["log_z"])
        post = self.engine.posterior_from_factor(kernel, Z, s["factor"], jitter=self.jitter)
        if X is not None and not self.minibatch:
            final = self.engine.evaluate_factor(kernel, Z, X, y, s["factor"], method=self.method, n_total=self.n_total,
                                       jitter=self.jitter, want_grad=False, block_rows=self.block_rows)
            return post, float(final["log_z"])
        values = self.history["log_marginal_likelihood"]
        return post, (values[-1] if values else float("nan"))


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
    started=None,
):
    """Fit the likelihood approximation and the hyper-parameters; see the module docstring.

    ``damping`` defaults to 0.5 in batch mode and 0.99 in minibatch mode (seed 000 sec. A.4). With
    nothing to optimise, batch sweeps run until the largest relative change of the sites (or factor) is
    below ``tol``. ``max_time`` (seconds) bounds the whole call from ``started`` (a ``time.perf_counter()``
    reading; default: the start of this call; ``GPClassifier.fit`` passes its own start, so that input
    checks and the initialisation of the inducing points count): no step is started that the measured
    length of a step, plus the final pass that rebuilds q from all sites (EP; measured from the exact
    rebuilds of the site product or the steps), would carry past it. ``shuffle=False`` visits minibatches
    in storage order (a stream).

    ``validation=(X_val, y_val)`` (labels in {-1, +1}) is scored every ``eval_every`` steps (default: every
    iteration in batch mode, every epoch in minibatch mode) into ``history`` ("validation_step",
    "validation_nll", "validation_error"). With ``n_iter_no_change``, training stops when the validation
    NLL has not improved by ``tol`` for that many evaluations, and the best state is kept.
    ``progress=True`` shows a tqdm bar (one per epoch in minibatch mode) with log Z_q and the validation NLL.

    ``checkpoint_path`` with ``checkpoint_every`` (steps) writes the whole training state there (atomically:
    a crash while writing leaves the previous checkpoint as it was); ``resume=True`` starts from it, and a
    run that is interrupted and resumed ends at the same model as one that is not (same seed, same data).
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
    trainer = Trainer(
        kernel, Z, method=method, n_total=n, minibatch=minibatch, jitter=jitter, damping=damping,
        optimize=optimize, optimizer=optimizer, learning_rate=learning_rate, block_rows=block_rows,
        site_precision=site_precision, site_shift=site_shift, engine=engine,
    )
    has_params = bool(trainer.names)
    if minibatch:
        batches, chunk_batches = minibatch_layout(X, batch_size, out_of_core)
        total_steps = max_iter * len(batches)
    else:
        batches = [(0, n)]
        total_steps = max_iter + (n_warmup if has_params else 0)
    if eval_every is None:
        eval_every = len(batches) if minibatch else 1
    best = {"nll": float("inf"), "reference": float("inf"), "state": None, "since": 0}
    if validation is not None:
        for key in ("validation_step", "validation_nll", "validation_error"):
            trainer.history[key] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

    def new_bar():
        # batch mode: one bar over the iterations; minibatch mode: one bar per epoch
        if not progress:
            return None
        if minibatch:
            epoch = trainer.n_steps // len(batches) + 1
            return tqdm(total=len(batches), unit="batch", desc=f"agpc {method} epoch {epoch}/{max_iter}")
        return tqdm(total=total_steps, unit="iter", desc=f"agpc {method}")
    order = []
    fingerprint = {"n": int(n), "method": method, "n_batches": len(batches), "Z_shape": [int(v) for v in Z.shape],
                   "per_row_sites": trainer.per_row_sites, "params": list(trainer.names)}
    if resume:
        order, best = _restore(trainer, rng, checkpoint_path, fingerprint, validation is not None)
    converged = stopped_by_time = early_stopped = False
    budget = _TimeBudget(max_time, time.perf_counter() if started is None else started,
                         final_pass=trainer.per_row_sites or not minibatch, n_batches=len(batches))
    if resume:  # the budget covers the interrupted run's training time too
        budget.spent_before(time.perf_counter() - trainer.t0)
    if max_time is not None and minibatch and trainer.per_row_sites:
        budget.measure_rebuild(trainer, X, y)
    while trainer.n_steps < total_steps:
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
        stepping = has_params and (minibatch or trainer.n_steps >= n_warmup)
        with budget.timing("step"):
            took, change, log_z = trainer.step(X, y, lo, hi, stepping=stepping)
        if not took:
            continue
        order.pop(0)
        if not minibatch or not order:  # batch: every iteration; minibatch: once an epoch
            trainer.record()
        if callback is not None:
            callback(trainer.n_steps, log_z)
        postfix = {"log_Zq": f"{log_z:.4g}"}
        if validation is not None and trainer.n_steps % eval_every == 0:
            nll, error = _validation_scores(trainer, X, y, validation)
            h = trainer.history
            h["validation_step"].append(trainer.n_steps)
            h["validation_nll"].append(nll)
            h["validation_error"].append(error)
            postfix["val_nll"] = f"{nll:.4f}"
            if nll < best["nll"]:  # keep the best state seen...
                best.update(nll=nll, state=_snapshot(trainer) if n_iter_no_change is not None else None)
            if nll < best["reference"] - tol:  # ...but count only improvements larger than tol
                best.update(reference=nll, since=0)
            else:
                best["since"] += 1
            if n_iter_no_change is not None and best["since"] >= n_iter_no_change:
                if best["state"] is not None:  # (not kept across a resume: the current state stays)
                    trainer.state = dict(best["state"])
                early_stopped = True
        if bar is not None:
            bar.update(1)
            bar.set_postfix(postfix, refresh=False)
        if checkpoint_every and trainer.n_steps % int(checkpoint_every) == 0:
            _write_checkpoint(trainer, rng, order, best, checkpoint_path, fingerprint)
        if early_stopped:
            break
        if not has_params and not minibatch and change < tol:
            converged = True
            break
    if bar is not None:
        bar.close()
    trainer.record()
    posterior, final_log_z = trainer.posterior(X, y)
    state = trainer.state
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
        site_precision=state["nu"],
        site_shift=state["mu"],
        factor=state["factor"],
        history=trainer.history,
        converged=converged,
        stopped_by_time=stopped_by_time,
        early_stopped=early_stopped,
    )


class _TimeBudget:
    """``max_time`` for the whole fit: measures how long a step and an exact rebuild of the site product
    take, and says when the next step (with a rebuild when one is due) plus the final pass would no longer
    fit. The final pass rebuilds q from all rows (EP, and SEP / ADF in batch mode): it costs about one
    rebuild of the site product plus a sweep without gradient, estimated as twice a measured rebuild
    (minibatch EP: before the first one, a rebuild of the first rows, scaled), or as one batch step."""

    def __init__(self, max_time, started, *, final_pass, n_batches):
        self.deadline = None if max_time is None else started + float(max_time)
        self.final_pass = final_pass
        self.n_batches = n_batches
        self.seconds = {"step": None, "rebuild": None}

    def measure_rebuild(self, trainer, X, y, rows=8192):
        """Minibatch EP before its first exact rebuild: time one on the first ``rows`` rows and scale it to
        all of them (the final pass is twice that)."""
        n = X.shape[0]
        rows = min(n, rows)
        s = trainer.state
        t = time.perf_counter()
        trainer.engine.exact_factor(s["kernel"], s["Z"], row_slice(X, 0, rows), s["nu"][:rows], s["mu"][:rows],
                                    jitter=trainer.jitter, block_rows=trainer.block_rows, y=row_slice(y, 0, rows))
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
        final = 0.0
        if self.final_pass:
            if rebuild is not None:
                final = 2.0 * rebuild
            elif step is not None and self.n_batches == 1:
                final = step
        return time.perf_counter() + upcoming + final > self.deadline


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


def _write_checkpoint(trainer, rng, order, best, path, fingerprint):
    """Everything the loop needs to go on exactly as if it had not stopped."""
    from ..io import save_checkpoint

    s = trainer.state
    sites = (s["nu"], s["mu"])
    store = getattr(trainer.engine, "store_sites", None)
    if store is not None and s["nu"] is not None:  # sites on a cluster: written by the workers, chunk by chunk
        s["nu"], s["mu"], record = store(path, trainer.n_steps, s["nu"], s["mu"])
        sites = (record, None)
    factor = s["factor"]
    if factor is not None:
        parts = getattr(factor, "factors", None)
        factor = [(f.precision, f.shift) for f in parts] if parts is not None else (factor.precision, factor.shift)
    save_checkpoint(path, {
        "fingerprint": fingerprint,
        "kernel": dict(s["kernel"].params), "Z": s["Z"], "nu": sites[0], "mu": sites[1], "factor": factor,
        "damping": float(trainer.damping), "n_steps": trainer.n_steps, "history": trainer.history,
        "pending": [list(p) for p in trainer._pending],
        "optimizer": trainer.optimizer.snapshot() if trainer.optimizer is not None else None,
        "rng": rng.bit_generator.state, "order": [int(i) for i in order], "needs_rebuild": trainer.needs_rebuild,
        "best": {k: v for k, v in best.items() if k != "state"},
        "elapsed": time.perf_counter() - trainer.t0,
    })
    if store is not None and s["nu"] is not None:
        trainer.engine.release_sites(sites[0])


def _restore(trainer, rng, path, fingerprint, has_validation):
    """Put a checkpoint's state into a freshly built trainer; returns (order, best)."""
    from ..io import load_checkpoint

    if path is None:
        raise ValueError("resume=True needs checkpoint_path")
    xp, device = trainer.xp, array_device(trainer.state["Z"])
    saved = load_checkpoint(path, lambda a: asarray_like(a, xp, device=device))
    if saved.get("fingerprint") != fingerprint:
        raise ValueError(
            f"checkpoint {path} was written by a different training run ({saved.get('fingerprint')}); this run is "
            f"{fingerprint}"
        )
    s = trainer.state
    s["kernel"] = s["kernel"].with_params(saved["kernel"])
    s["Z"], s["nu"], s["mu"] = saved["Z"], saved["nu"], saved["mu"]
    if isinstance(saved["nu"], dict):  # sites written chunk by chunk by a fit on a dask array
        load = getattr(trainer.engine, "load_sites", None)
        if load is None:
            raise ValueError(f"checkpoint {path} was written by a fit on a dask array: resume it on a dask array")
        s["nu"], s["mu"] = load(saved["nu"], s["Z"].dtype)
    factor = saved["factor"]
    if isinstance(factor, list):
        factor = multiclass_ep.MultiFactor(tuple(ep.Factor(p, c) for p, c in factor))
    elif factor is not None:
        factor = ep.Factor(*factor)
    s["factor"] = factor
    trainer.damping = saved["damping"]
    trainer.n_steps = saved["n_steps"]
    trainer.history = saved["history"]
    trainer._pending = [tuple(p) for p in saved["pending"]]
    if trainer.optimizer is not None:
        trainer.optimizer.restore(saved["optimizer"])
    rng.bit_generator.state = saved["rng"]
    trainer.needs_rebuild = bool(saved["needs_rebuild"])
    trainer.t0 = time.perf_counter() - saved["elapsed"]
    trainer.good = None
    best = dict(saved["best"], state=None)
    if has_validation and trainer.history.get("validation_nll") is None:
        raise ValueError(f"checkpoint {path} has no validation history but this run has validation data")
    return list(saved["order"]), best


def _snapshot(trainer):
    """The trainer's state, safe from later steps: minibatch EP updates its sites in place, so they are
    copied (early stopping in that mode holds the sites twice)."""
    state = dict(trainer.state)
    if trainer.per_row_sites and trainer.minibatch:
        state["nu"] = trainer.xp.asarray(state["nu"], copy=True)
        state["mu"] = trainer.xp.asarray(state["mu"], copy=True)
    return state


def _validation_scores(trainer, X, y, validation):
    """Test NLL and error of the current state on (X_val, y_val) (labels as the engine takes them)."""
    X_val, y_val = validation
    s = trainer.state
    if trainer.per_row_sites and not trainer.minibatch:
        post, _ = trainer.posterior(X, y)
    else:
        post = trainer.engine.posterior_from_factor(s["kernel"], s["Z"], s["factor"], jitter=trainer.jitter)
    y_val = read_rows(y_val, 0, y_val.shape[0], s["Z"])
    return trainer.engine.validation_scores(s["kernel"], s["Z"], post, X_val, y_val)
