"""Checkpoints of a training run: the run's fingerprint, writing the whole state of the loop and its engine, and
restoring it after every field was checked (``agpc.checkpoint_rules``), so that a run interrupted and resumed ends
at the same model as one that is not (same seed, same data).

A checkpoint holds the loop's record (step counts, history, the random generator's state, the epoch's visiting
order, the early-stopping record, the seconds spent) and the engine's ``checkpoint_state``. A resume refuses a
checkpoint of another run: other data (``data_fingerprint``), another method, layout of minibatches, model size,
parameters learned or priors.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
import warnings

from ..backend import (CholeskyError, array_device, array_namespace, asarray_like, cholesky_with_jitter,
                       identity_plus, is_array_api_obj, is_dask_array, to_host_vector, to_numpy)
from ..checkpoint_rules import (array_shapes, check_engine_state, check_factor_scale, check_loop_state,
                                check_site_scale, dtype_text, is_array)
from ..checkpoints import load_checkpoint, save_checkpoint
from ..likelihoods import registered_likelihood
from ..optim import written_by
from .guard import GUARD_KEYS

__all__ = ["FINGERPRINT_ROWS", "VALIDATION_KEYS", "PRIOR_SCALE_MARGIN", "fingerprint_stride", "data_fingerprint",
           "run_fingerprint", "write_checkpoint", "restore", "restored_state_checked"]

FINGERPRINT_ROWS = 1000
VALIDATION_KEYS = ("validation_step", "validation_nll", "validation_error")  # what ``hooks.Validation`` records
# How far beyond what its rows' likelihood could add to the prior a resumed state's tied factor or sites may be
# (``_check_prior_scale``). Not a tight bound: the running factor of a minibatch fit holds sites taken at earlier
# kernels, and honest fits measured up to 30 times the bound's base (SEP with Adam at a learning rate of 0.1);
# a hand edit that makes a state absurd (the tied factor times 1e200) is orders of magnitude past it.
PRIOR_SCALE_MARGIN = 1e8


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


def run_fingerprint(engine, n, n_batches, data_hash):
    """What a checkpoint must have been written by for this run to resume it."""
    kernel, Z = engine.kernel, engine.Z
    return {"n": int(n), "method": engine.name, "n_batches": n_batches, "Z_shape": [int(v) for v in Z.shape],
            "per_row_sites": engine.per_row_sites, "params": list(engine.names), "data": data_hash,
            # full-GP passes read Z as the rows themselves, site i as row i's: a sparse run's checkpoint whose
            # Z has n points (in another order) must not resume under them
            "full_gp": engine.full_gp,
            # the objective's priors: a resume under other priors (kernel_prior changed) would climb
            # another objective from the saved state
            "priors": {key: parameter.prior.spec() for key, parameter in kernel.parameter_table().items()
                       if parameter.prior is not None},
            # the likelihood: resuming another one's state would make a model of neither (a registered one by its
            # name and repr: its parameters, where its repr shows them)
            "likelihood": likelihood_text(engine.likelihood),
            # the kernel's form (its types, terms and columns, not its values): a resume under another kernel of the
            # same parameter names (kernel=Matern52() after a default RBF) read the RBF's state as the Matern's
            "kernel": kernel_form(kernel),
            # tied lengthscales (ard=False) climb along another path: said only when tied, so that a checkpoint
            # written before the tie existed (per feature) still resumes
            **({"shared_lengthscales": True} if engine.shared_lengthscales else {}),
            **_step_settings(engine)}


def _step_settings(engine):
    """The damping and jitter a run was built with (its engine's, before any the guard changed): the state a resume
    reads was stepped under them. A resume under another damping kept the checkpoint's silently (while get_params
    said the new one), and one under another jitter made a model of neither run (the hostile-input audit of
    2026-12-04); a checkpoint written before they were part of the fingerprint is taken to hold this run's."""
    damping = float(getattr(engine, "nominal_damping", math.nan))
    return {"damping": None if math.isnan(damping) else damping,
            "jitter": float(getattr(engine, "requested_jitter", engine.jitter))}


def kernel_form(kernel):
    """A kernel's form as a run's fingerprint holds it: its ``spec()`` (types, terms, columns, levels; no parameter
    values), one a class for a multiclass model's kernels."""
    kernels = getattr(kernel, "kernels", None)
    if kernels is not None and not hasattr(kernel, "spec"):  # (``ClassKernels``: one a class)
        return [kernel_form(each) for each in kernels]
    try:
        return _without_priors(kernel.spec())
    except Exception:  # (a user's kernel whose spec() is not written: known by its class's name)
        return {"type": type(kernel).__name__}


def _without_priors(spec):
    """A kernel spec without its priors (the fingerprint's "priors" holds them, as data-derived)."""
    if isinstance(spec, dict):
        return {key: _without_priors(value) for key, value in spec.items() if key != "priors"}
    if isinstance(spec, list):
        return [_without_priors(value) for value in spec]
    return spec


def likelihood_text(likelihood):
    """How a run's fingerprint names the likelihood it trains: a built-in one by its name, one of the user's own
    (``likelihoods.register_likelihood``) by its name and repr; None for an engine that does not say."""
    if likelihood is None:
        return None
    return likelihood.name if registered_likelihood(likelihood.name) is None else f"{likelihood.name}: {likelihood!r}"


def write_checkpoint(trainer, rng, order, best, path, fingerprint, kept=None, ended=None):
    """Everything the loop needs to go on exactly as if it had not stopped; ``kept``: the states the hooks keep to go
    back to (``training.Run.kept``), each as the engine writes it (``Engine.checkpoint_kept``; left out where it
    cannot: the resumed run then says it does not have that state where it would go back to it); ``ended``: where the
    run ended at this step, its stop reason (of ``ENDED``), its two flags, the log Z of the state it returns and whether
    the plateau stop put its best state back there (``went_back``)
    (``hooks.Checkpoints``), else None."""
    engine_state = trainer.engine.checkpoint_state(path, trainer.n_steps)
    kept_states = {}
    for name, entry in (kept or {}).items():
        saved = trainer.engine.checkpoint_kept(entry["state"], path, trainer.n_steps)
        if saved is not None:
            kept_states[name] = {"at": int(entry["at"]), "engine": saved}
    save_checkpoint(path, {
        "fingerprint": fingerprint, "engine": engine_state,
        "n_steps": trainer.n_steps, "n_updates": trainer.n_updates, "history": trainer.history,
        "pending": [list(p) for p in trainer._pending],
        "rng": rng.bit_generator.state, "order": [int(i) for i in order],
        "best": dict(best), "kept": kept_states, "ended": ended,
        "elapsed": time.perf_counter() - trainer.t0,
    })
    trainer.engine.checkpoint_written(engine_state)


def restore(trainer, rng, path, fingerprint, has_validation):
    """Put a checkpoint's state into a freshly built trainer; returns (order, best, kept, ended): the early-stopping
    record, the states the hooks kept (``training.Run.kept``, each in ``Engine.keep``'s form, with the ``checkpoint``
    it was read from) and the stop reason of a run that had ended at the checkpoint's step (None: it had not).
    Everything read is checked first: a field of the wrong type or shape is one ValueError naming the file and the
    field."""
    if path is None:
        raise ValueError("resume=True needs checkpoint_path")

    def refuse(why):
        return ValueError(f"{path} is not a valid agpc checkpoint: {why}")

    xp, device = trainer.xp, array_device(trainer.engine.Z)
    saved = load_checkpoint(path, lambda a: asarray_like(a, xp, device=device))
    _check_fingerprint(saved, trainer, path, fingerprint)
    _check_optimizer(saved, trainer.engine, path)
    # what the fresh run records; a checkpoint written before the guard (issue 39) has no guard counts, which the
    # resumed run starts at zero for its earlier entries (``Trainer.record``)
    history = saved.get("history") if isinstance(saved, dict) else None
    before_guard = isinstance(history, dict) and not any(key in history for key in GUARD_KEYS)
    recorded = [key for key in trainer.history
                if key not in VALIDATION_KEYS and not (before_guard and key in GUARD_KEYS)]
    check_loop_state(saved, fingerprint, refuse, history_keys=recorded, validation_keys=VALIDATION_KEYS)
    check_engine_state(saved["engine"], trainer.engine, fingerprint, path, refuse)
    ended = _checked_ended(saved.get("ended"), refuse)
    kept_saved = _checked_kept(saved, trainer.engine, path, fingerprint, refuse)
    kept = {}
    for name, (at, engine_state, refuse_kept) in kept_saved.items():  # (each through the engine, which then holds it)
        _restore_engine(trainer, engine_state, path, refuse_kept)
        _check_prior_scale(trainer.engine, fingerprint["n"], refuse_kept)
        kept[name] = {"state": trainer.engine.keep(), "at": at, "checkpoint": path}
    _restore_rng(rng, saved, refuse)
    _restore_engine(trainer, saved["engine"], path, refuse)
    _check_prior_scale(trainer.engine, fingerprint["n"], refuse)
    trainer.n_steps = saved["n_steps"]
    trainer.n_updates = saved["n_updates"]
    trainer.history = saved["history"]
    trainer._pending = [tuple(p) for p in saved["pending"]]
    trainer.t0 = time.perf_counter() - saved["elapsed"]
    trainer.good = None
    best = {key: saved["best"][key] for key in ("nll", "reference", "since")}
    if has_validation and trainer.history.get("validation_nll") is None:
        raise ValueError(f"checkpoint {path} has no validation history but this run has validation data")
    return list(saved["order"]), best, kept, ended


# The stop reasons a run ends on at a step, which its checkpoint of that step records (``training.STOP_REASONS``).
ENDED = ("plateau", "converged", "early_stopping")


def _checked_ended(ended, refuse):
    """A checkpoint's record of the run's end at its step (``write_checkpoint``), checked: None (a checkpoint from
    before it was recorded: the run had not ended, as it was read then), or a stop reason of ``ENDED``, the run's two
    flags (early stopping's set where the reason is its, else the other), a finite log Z and whether the plateau stop
    put its best state back there (``went_back``: only with its reason; absent from a checkpoint of before, False)."""
    if ended is None:
        return None
    fields = {"reason", "early_stopped", "converged", "log_z"}
    if not (isinstance(ended, dict) and set(ended) in (fields, fields | {"went_back"})
            and isinstance(ended["reason"], str) and ended["reason"] in ENDED):
        raise refuse(f"ended: {ended!r}, not None or the record of a run's end (a reason of {', '.join(ENDED)})")
    flags = (ended["early_stopped"], ended["converged"])
    if not all(isinstance(flag, bool) for flag in flags) or not flags[ended["reason"] != "early_stopping"]:
        raise refuse(f"ended: flags early_stopped={ended['early_stopped']!r}, converged={ended['converged']!r} do not "
                     f"fit the reason {ended['reason']!r}")
    if not (isinstance(ended["log_z"], float) and math.isfinite(ended["log_z"])):
        raise refuse(f"ended.log_z: {ended['log_z']!r}, not a finite number")
    went_back = ended.get("went_back", False)
    if not isinstance(went_back, bool) or (went_back and ended["reason"] != "plateau"):
        raise refuse(f"ended.went_back: {went_back!r}, not a boolean true only where the plateau stop ended the run")
    return dict(ended, went_back=went_back)


# The states a run's hooks keep to go back to (``training.Run.kept``), by the hook's name: early stopping's best
# validation NLL and the plateau stop's best log Z (``hooks.Validation``, ``hooks.Plateau``).
KEPT_STATES = ("validation", "plateau")


def _checked_kept(saved, engine, path, fingerprint, refuse):
    """The kept states of a checkpoint ({name: (at, engine state, its refusal)}), each checked as the engine's state
    is (``check_engine_state``) and against the history: early stopping's at the first of the lowest validation NLLs
    (where the uninterrupted run kept it), the plateau's at a record of log Z. A checkpoint from before kept states
    has none."""
    kept = saved.get("kept", {})
    if not isinstance(kept, dict) or not set(kept) <= set(KEPT_STATES):
        raise refuse(f"kept: not a mapping of {' / '.join(KEPT_STATES)} to kept states")
    out = {}
    for name, entry in kept.items():
        def refuse_kept(why, name=name):
            return refuse(f"kept.{name}.{why}" if why.startswith("engine") else f"kept.{name}: {why}")

        if not isinstance(entry, dict) or set(entry) != {"at", "engine"}:
            raise refuse_kept("not a record of (at, engine)")
        records = saved["history"].get("validation_nll" if name == "validation" else "log_marginal_likelihood") or []
        if name == "validation":  # (``check_loop_state``: finite numbers)
            expected = {1 + min(range(len(records)), key=lambda k: (records[k], k))} if records else set()
        else:
            expected = range(1, len(records) + 1)
        at = entry["at"]
        if isinstance(at, bool) or not isinstance(at, int) or at not in expected:
            raise refuse_kept(f"at: {at!r}, not the record the run kept this state at")
        check_engine_state(entry["engine"], engine, fingerprint, path, refuse_kept)
        out[name] = (at, entry["engine"], refuse_kept)
    return out


def _check_optimizer(saved, engine, path):
    """Refuse, by name, a checkpoint of a run that stepped with another built-in optimiser (its state read as this
    run's optimiser's was "engine.optimizer: expected 3 entries", as if the file were damaged)."""
    state = saved["engine"].get("optimizer") if isinstance(saved.get("engine"), dict) else None
    written, this = written_by(state), getattr(engine.optimizer, "name", None)
    if written is not None and this is not None and written != this:
        raise ValueError(f"checkpoint {path} was written by a fit stepping with optimizer={written!r}, but this fit "
                         f"steps with {this!r}: resume with optimizer={written!r}, or fit afresh without resume")


@contextlib.contextmanager
def restored_state_checked(path, trainer, resumed):
    """Around a run's steps: where the run ``resumed`` from the checkpoint at ``path`` and a CholeskyError or a
    FloatingPointError ends it before any step since the resume was taken (``trainer.good``, which ``restore``
    empties, is None: the guard has no earlier state to go back to), one ValueError naming the file. ``restore``
    checks each field, not whether the state they make up can be stepped from: a checkpoint whose site precisions
    were made negative, or its site means 1e300 times larger, raised a bare CholeskyError, or the guard's "diverged
    at the first step", naming no file. (A run that is not interrupted goes back one step where a state fails, and a
    resumed one cannot: so the error does not say the file was changed, only that its state cannot go on.)"""
    try:
        yield
    except (CholeskyError, FloatingPointError) as exc:
        if not resumed or trainer.good is not None:
            raise
        raise ValueError(
            f"{path}: training cannot go on from the state this checkpoint holds: the first step from it failed "
            f"({type(exc).__name__}: {exc}). A run that is not interrupted goes back to its step before when that "
            "happens, which a resumed run does not have, and a checkpoint whose values were changed can hold such a "
            "state too: fit without resume=True to start afresh") from exc


def _written_for(saved, engine):
    """The fingerprint a checkpoint was written for, in this version's form."""
    written_for = saved.get("fingerprint")
    if isinstance(written_for, dict):  # a checkpoint from before priors were part of the fingerprint had none
        written_for = {"priors": {}, "full_gp": False, **written_for}  # (nor the full GP's passes, which came later)
        # nor one from before the likelihood was: it is taken to be this run's, as it was resumed then; nor before
        # the kernel's form was
        written_for.setdefault("likelihood", likelihood_text(engine.likelihood))
        written_for.setdefault("kernel", kernel_form(engine.kernel))
        for key, value in _step_settings(engine).items():  # nor the damping and jitter
            written_for.setdefault(key, value)
        legacy = engine.layout.legacy
        if legacy and isinstance(written_for.get("params"), list):  # the parameters by the names of an older form
            written_for["params"] = [legacy.get(name, name) if isinstance(name, str) else name
                                     for name in written_for["params"]]
    return written_for


def _check_fingerprint(saved, trainer, path, fingerprint):
    """Refuse a checkpoint of another run: another type first, then other data, then any other difference."""
    written_for = _written_for(saved, trainer.engine)
    # The data's hash is of its rows in the run's type, so a resume in another dtype would read as other data:
    # said first, by the type the checkpoint's arrays are in.
    saved_Z = saved["engine"].get("Z") if isinstance(saved.get("engine"), dict) else None
    run_dtype = trainer.engine.Z.dtype
    if is_array(saved_Z) and saved_Z.dtype != run_dtype:
        raise ValueError(
            f"checkpoint {path} was written by a fit computing in {dtype_text(saved_Z.dtype)}, but this fit "
            f"computes in {dtype_text(run_dtype)}: resume with dtype='{dtype_text(saved_Z.dtype)}', or fit "
            "afresh without resume"
        )
    # other data of the same shape (the default priors are centred on the data, so they may differ with it)
    data_derived = ("data", "priors", "kernel")  # (the kernel's categorical levels are the data's)
    if isinstance(written_for, dict) and written_for.get("data") != fingerprint["data"] and (
        {k: v for k, v in written_for.items() if k not in data_derived}
        == {k: v for k, v in fingerprint.items() if k not in data_derived}
    ):
        raise ValueError(
            f"checkpoint {path} was written for different training data: the same number of rows and features, "
            f"but other rows, labels or sample weights (data fingerprint {written_for.get('data')}, this data {fingerprint['data']})"
        )
    if written_for != fingerprint:
        if not isinstance(written_for, dict):
            raise ValueError(f"checkpoint {path} was written by a different training run (it records no run's settings)")
        differs = sorted(key for key in set(written_for) | set(fingerprint)
                         if written_for.get(key) != fingerprint.get(key))
        # (the minibatches of an epoch change with batch_size, and with what trains in data-parallel rounds: a
        # resume under another n_jobs was told of batch_size and dask only)
        hint = ("; they change with batch_size, and with n_jobs and a dask array's local_steps (data-parallel "
                "rounds count their minibatches otherwise): resume with the values the checkpoint was written with "
                "(a fit on a dask array checkpointed before its rounds were stepped on the driver: local_steps=0)"
                if differs == ["n_batches"] else "")
        said = "; ".join(f"{FINGERPRINT_SETTINGS.get(key, key)}: {_short(written_for.get(key))} there, "
                         f"{_short(fingerprint.get(key))} here" for key in differs)
        raise ValueError(f"checkpoint {path} was written by a different training run: {said}{hint}")


def _check_prior_scale(engine, n, refuse):
    """The restored state against its prior: the inducing points' prior covariance must factorise at the restored
    kernel (a log amplitude of 1e300, a finite log, raised a bare CholeskyError at the first step, naming no
    file), and the tied factor (SEP, ADF, minibatch EP) and the rows' sites (EP) must be of a size its rows could
    give them. EP's site on a row adds to q's precision along one direction at most 1 / (the likelihood's noise
    variance): 1 for the probit of two classes and the ordinal model (their probit noise), 1 / (2 x the latent noise)
    for the multiclass likelihood (the difference of two latent values, Villacampa-Calvo & Hernandez-Lobato (2017),
    eq. 6), C - 1 such sites a row; whitened by the prior, a row's direction has length at most sqrt(K(x, x)). So the
    whitened factor's largest eigenvalue is at most W (C - 1) max K(x, x) / noise variance, W the rows' total weight;
    K(x, x) is read at the inducing points (a stationary kernel's is the same everywhere). Each is checked within
    ``PRIOR_SCALE_MARGIN`` of its bound; a failure is one ValueError naming the file (``refuse``)."""
    kernel, Z, factor = engine.kernel, engine.Z, engine.factor
    latents = kernel.latent_parts(Z)  # (kernel, inducing points) of each latent GP
    parts = getattr(factor, "factors", None) or ((factor,) if factor is not None else (None,) * len(latents))
    weights = getattr(engine, "sample_weight", None)  # (rows counted by weight; on a cluster: the rows' count)
    total = float(to_numpy(weights).sum()) if is_array_api_obj(weights) and not is_dask_array(weights) else float(n)
    sites_per_row = max(1, len(latents) - 1)
    largest_site = 0.0
    for k, ((each, Zc), part) in enumerate(zip(latents, parts)):
        where = "engine.kernel" if len(latents) == 1 else f"engine.kernel (class {k})"
        try:
            with warnings.catch_warnings():  # (a log beyond the type's range overflows: the refusal below says so)
                warnings.simplefilter("ignore", RuntimeWarning)
                L_K, _ = cholesky_with_jitter(identity_plus(each.K(Zc), identity=engine.jitter), report=False,
                                              what="the inducing points' prior covariance")
        except CholeskyError as exc:
            raise refuse(f"{where}: {exc} at the restored kernel's parameters") from None
        noise = float(to_numpy(each.noise)) if len(latents) > 1 else 0.5  # (probit noise: variance 1 = 2 x 0.5)
        if noise <= 0:  # (no latent noise: the multiclass likelihood is a step, its sites unbounded)
            return
        per_row = 1.0 / (2.0 * noise)
        largest_site = max(largest_site, per_row)
        if part is not None:
            prior_variance = float(array_namespace(Zc).max(each.Kdiag(Zc)))
            bound = PRIOR_SCALE_MARGIN * total * sites_per_row * prior_variance * per_row
            check_factor_scale(to_numpy(part.whitened(L_K)[0]), bound, "engine.factor", refuse)
    nu = engine.row_site_precision  # (one copy of each row's site, whatever its weight; on a cluster: not gathered)
    if nu is not None and is_array_api_obj(nu) and not is_dask_array(nu):
        check_site_scale(to_numpy(nu), PRIOR_SCALE_MARGIN * largest_site, "engine.nu", refuse)


# What a run's fingerprint holds, by the settings a user changes to change it (the resume's refusal names them).
FINGERPRINT_SETTINGS = {"n": "rows", "method": "method", "n_batches": "minibatches an epoch (batch_size)",
                        "Z_shape": "inducing points (n_inducing, inducing)", "per_row_sites": "sites a row (method)",
                        "params": "what is learned (optimize)", "data": "training data (rows, labels, weights)",
                        "full_gp": "the exact model (n_inducing)", "priors": "priors (kernel_prior, the kernel's)",
                        "shared_lengthscales": "one shared lengthscale scale (ard)", "likelihood": "likelihood",
                        "kernel": "kernel", "damping": "damping", "jitter": "jitter"}


def _short(value, limit=60):
    """A setting's value as the refusal shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _restore_rng(rng, saved, refuse):
    """The random generator's state from a checked checkpoint."""
    try:
        rng.bit_generator.state = saved["rng"]
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # (a state of 2**200: too large a C integer)
        raise refuse(f"rng: not the state of this run's generator ({type(exc).__name__}: {exc})") from None


def _restore_engine(trainer, engine_state, path, refuse):
    """The engine's state from a checked checkpoint's ``engine_state``; its arrays must come back in the shapes of
    this run's."""
    fresh = array_shapes(trainer.engine)
    try:
        trainer.engine.restore_checkpoint(engine_state, path)
    # what restoring raises on a missing entry or a value of the wrong kind: the field is named
    except (KeyError, TypeError, IndexError) as exc:  # (a ValueError here says what is wrong already)
        raise refuse(f"engine: {type(exc).__name__}: {exc}") from None
    restored = array_shapes(trainer.engine)
    for key, shape in fresh.items():
        if restored.get(key) != shape:
            raise refuse(f"engine.{key}: shape {restored.get(key)}, this run's is {shape}")
