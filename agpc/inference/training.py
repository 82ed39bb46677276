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
from dataclasses import dataclass, field

from ..backend import CholeskyError, array_device, array_namespace, host_rng
from ..optim import OPTIMIZERS, Rprop
from . import ep

__all__ = ["train", "TrainResult", "METHODS"]

METHODS = ("ep", "sep", "adf")


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


def _parameter_names(kernel, optimize):
    names = []
    if "kernel" in optimize:
        names += [k for k in kernel.params if k != "log_noise" or math.isfinite(float(kernel.params[k]))]
    if "inducing" in optimize:
        names.append("Z")
    return names


def _initial_steps(kernel, Z, names):
    """First Rprop steps: 0.01 in log space for kernel parameters, 1% of the spread of Z per dimension."""
    xp = array_namespace(Z)
    steps = {}
    for name in names:
        if name == "Z":
            if Z.shape[0] > 1:
                spread = xp.std(Z, axis=0)
            else:
                spread = xp.ones(Z.shape[1], dtype=Z.dtype, device=array_device(Z))
            spread = xp.where(spread > 0, spread, xp.ones_like(spread))
            steps[name] = 0.01 * (xp.zeros_like(Z) + spread[None, :])
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
    return float(xp.max(xp.abs(new - old))) / (1.0 + float(xp.max(xp.abs(old))))


def _step(optimizer, names, kernel, Z, grads):
    params = dict(kernel.params)
    params["Z"] = Z
    updated = optimizer.step({k: params[k] for k in names}, {k: grads[k] for k in names})
    params.update(updated)
    Z = params.pop("Z")
    return kernel.with_params(params), Z


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
    site_precision=None,
    site_shift=None,
    callback=None,
):
    """Fit the likelihood approximation and the hyper-parameters; see the module docstring.

    ``damping`` defaults to 0.5 in batch mode and 0.99 in minibatch mode (seed 000 sec. A.4). With
    nothing to optimise, batch sweeps run until the largest relative change of the sites (or factor) is
    below ``tol``. ``max_time`` (seconds) stops at the end of the step that crosses it. Guard rails: a
    non-finite log Z_q or a failed Cholesky puts back the last good state and halves the damping and the
    step sizes (as the authors' code does).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {METHODS}")
    xp = array_namespace(X)
    n = X.shape[0]
    device = array_device(X)
    minibatch = batch_size is not None and batch_size < n
    if damping is None:
        damping = 0.99 if minibatch else 0.5
    optimize = tuple(optimize)
    names = _parameter_names(kernel, optimize)
    optimizer = _make_optimizer(optimizer, learning_rate, kernel, Z, names, minibatch) if names else None
    per_row_sites = method == "ep"
    if per_row_sites and site_precision is None:
        site_precision = xp.zeros((n,), dtype=X.dtype, device=device)
        site_shift = xp.zeros((n,), dtype=X.dtype, device=device)
    factor = ep.Factor.uniform(Z.shape[0], X) if (minibatch or not per_row_sites) else None

    history = {"log_marginal_likelihood": [], "time": [], "n_invalid_sites": [], "damping": []}
    t0 = time.perf_counter()
    rng = host_rng(random_state)
    permutation = None
    if minibatch:
        # Minibatches are contiguous slices of one random reordering of the rows (so that sites update by
        # slice, which the array API supports, and sorted data still give mixed minibatches); the order
        # in which the slices are visited is drawn again every epoch.
        from ..backend import asarray_like

        permutation = asarray_like(rng.permutation(n), xp, device=device)
        X = xp.take(X, permutation, axis=0)
        y = xp.take(y, permutation, axis=0)
        if per_row_sites:
            site_precision = xp.take(site_precision, permutation, axis=0)
            site_shift = xp.take(site_shift, permutation, axis=0)
    state = {"kernel": kernel, "Z": Z, "nu": site_precision, "mu": site_shift, "factor": factor}
    good = None
    failures = 0
    converged = False
    stopped_by_time = False

    def snapshot():
        return (dict(state), optimizer.snapshot() if optimizer is not None else None, damping)

    def record(log_z_value, valid):
        history["log_marginal_likelihood"].append(log_z_value)
        history["time"].append(time.perf_counter() - t0)
        history["n_invalid_sites"].append(int(xp.sum(xp.astype(~valid, xp.int64))))
        history["damping"].append(damping)

    if minibatch:
        batches = [(lo, min(n, lo + int(batch_size))) for lo in range(0, n, int(batch_size))]
        total_steps = max_iter * len(batches)
    else:
        batches = [(0, n)]
        total_steps = max_iter + (n_warmup if names else 0)
    order = []
    step_count = 0
    epoch_log_z = []
    while step_count < total_steps:
        if not order:
            order = list(rng.permutation(len(batches))) if minibatch else [0]
            if minibatch and per_row_sites and step_count > 0:
                # Minibatch EP swaps a row's old site out of the factor along its *current* projection,
                # while the factor holds it along the projection of its last visit; the residue of those
                # swaps would pile up epoch after epoch. One exact rebuild from all the sites per epoch
                # (a pass of the same O(n m^2) order as the epoch itself) clears it.
                state["factor"] = ep.exact_factor(
                    state["kernel"], state["Z"], X, state["nu"], state["mu"], jitter=jitter, block_rows=block_rows
                )
        lo, hi = batches[order[0]]
        stepping = bool(names) and (minibatch or step_count >= n_warmup)
        kernel, Z = state["kernel"], state["Z"]
        try:
            if not minibatch and per_row_sites:
                result = ep.evaluate(
                    kernel, Z, X, y, state["nu"], state["mu"], jitter=jitter, want_grad=stepping, block_rows=block_rows
                )
            else:
                result = ep.evaluate_factor(
                    kernel, Z, X[lo:hi, :], y[lo:hi], state["factor"], method=method, n_total=n,
                    site_precision=state["nu"][lo:hi] if per_row_sites else None,
                    site_shift=state["mu"][lo:hi] if per_row_sites else None,
                    jitter=jitter, want_grad=stepping, block_rows=block_rows,
                )
            log_z_value = float(result["log_z"])
        except CholeskyError:
            log_z_value = float("nan")
        if not math.isfinite(log_z_value):
            failures += 1
            if good is None or failures > 30:
                raise FloatingPointError(
                    "EP diverged: log Z_q is not finite and halving the damping and step sizes did not help "
                    f"(after {failures} attempts); try a smaller damping or standardised inputs"
                )
            saved, opt_state, damping = good
            state = dict(saved)
            if optimizer is not None:
                optimizer.restore(opt_state)
                optimizer.scale_steps(0.5)
            damping *= 0.5
            continue
        failures = 0
        good = snapshot()
        order.pop(0)
        step_count += 1

        # site / factor update (seed 000 eq. 25 damping)
        change = 0.0
        if per_row_sites and not minibatch:
            new_nu = damping * result["site_precision"] + (1.0 - damping) * state["nu"]
            new_mu = damping * result["site_shift"] + (1.0 - damping) * state["mu"]
            change = _relative_change(new_nu, state["nu"], xp) + _relative_change(new_mu, state["mu"], xp)
            state["nu"], state["mu"] = new_nu, new_mu
        elif per_row_sites:  # minibatch EP: swap the rows' old sites for the damped new ones
            rows_nu = damping * result["site_precision"] + (1.0 - damping) * state["nu"][lo:hi]
            rows_mu = damping * result["site_shift"] + (1.0 - damping) * state["mu"][lo:hi]
            state["nu"] = xp.concat([state["nu"][:lo], rows_nu, state["nu"][hi:]])
            state["mu"] = xp.concat([state["mu"][:lo], rows_mu, state["mu"][hi:]])
            delta = result["new_sites"].combine(1.0, result["old_sites"], -1.0)
            state["factor"] = state["factor"].combine(1.0, delta, damping)
        else:  # SEP / ADF: the rows' share (rows / n) of the factor is replaced by their new sites
            share = (hi - lo) / n
            old = state["factor"]
            state["factor"] = old.combine(1.0 - damping * share, result["new_sites"], damping)
            change = _relative_change(state["factor"].precision, old.precision, xp) + _relative_change(
                state["factor"].shift, old.shift, xp
            )

        if minibatch:
            epoch_log_z.append(log_z_value)
            if not order:  # end of an epoch: record the mean minibatch estimate
                record(sum(epoch_log_z) / len(epoch_log_z), result["valid"])
                epoch_log_z = []
        else:
            record(log_z_value, result["valid"])
        if callback is not None:
            callback(step_count, log_z_value)

        if stepping:
            state["kernel"], state["Z"] = _step(optimizer, names, kernel, Z, result["grads"])
        elif not names and not minibatch and change < tol:
            converged = True
            break
        if max_time is not None and time.perf_counter() - t0 >= max_time:
            stopped_by_time = True
            break

    kernel, Z = state["kernel"], state["Z"]
    if per_row_sites:
        final_factor = ep.exact_factor(kernel, Z, X, state["nu"], state["mu"], jitter=jitter, block_rows=block_rows)
    else:
        final_factor = state["factor"]
    if per_row_sites and not minibatch:
        final = ep.evaluate(kernel, Z, X, y, state["nu"], state["mu"], jitter=jitter, want_grad=False, block_rows=block_rows)
        posterior, final_log_z = final["posterior"], float(final["log_z"])
    else:
        posterior = ep.posterior_from_factor(kernel, Z, final_factor, jitter=jitter)
        final_log_z = history["log_marginal_likelihood"][-1] if history["log_marginal_likelihood"] else float("nan")
        if not minibatch:
            final = ep.evaluate_factor(kernel, Z, X, y, final_factor, method=method, n_total=n, jitter=jitter,
                                       want_grad=False, block_rows=block_rows)
            final_log_z = float(final["log_z"])
    n_done = len(history["log_marginal_likelihood"])
    if permutation is not None and per_row_sites:  # back to the caller's row order
        inverse = xp.argsort(permutation)
        state["nu"] = xp.take(state["nu"], inverse, axis=0)
        state["mu"] = xp.take(state["mu"], inverse, axis=0)
    return TrainResult(
        kernel=kernel,
        Z=Z,
        posterior=posterior,
        log_z=final_log_z,
        n_iter=n_done,
        site_precision=state["nu"],
        site_shift=state["mu"],
        factor=final_factor,
        history=history,
        converged=converged,
        stopped_by_time=stopped_by_time,
    )
