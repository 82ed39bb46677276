"""What a training checkpoint may hold: the rules by which a resume checks a checkpoint before it uses it.

A checkpoint is accepted when it is a state the fit that wrote it could go on from, and refused otherwise with one
ValueError naming the file and the field (``refuse(why)`` builds it; ``agpc.inference.training`` restores). The
rules are those of the states an engine can reach, not of a fresh run:

- The training loop's record (``check_loop_state``): step counts, history, the random generator's state, the
  epoch's visiting order, the early-stopping record, each of its own type and range; the history has every entry
  the run records, as many numbers in each, and the step counts are those it recorded (the last record's count
  plus the steps taken since). A model file's history is checked by the same rule (``check_history``, which
  ``model_file`` uses), where entries an older agpc did not record may be shorter.
- Kernel parameters (``check_engine_state``): the run's parameter table, each stored value (a log) an array of
  the run's shape and floating type, and **any finite number**: a long fit may carry a log far from 0 (a latent
  noise stepped to exp(-752) underflows to 0 and stays a finite log), and such a checkpoint resumes. -inf is
  allowed only for a parameter that may be zero and is not learned (no latent noise: fixed, never stepped).
- The engine's other entries, generically, by the freshly built engine's state: an array there must come back as
  a floating array of the same shape and type, finite; an entry the engine began empty (the ``vi-*`` methods'
  xi) as finite values, one row each of the n rows; the engine's lower-triangular factors (its
  ``layout.triangular``, e.g. SVI's ``whitened_chol``) zero above the diagonal. A new engine state key is checked by
  these rules with no change here.
- The optimiser's snapshot laid out as this run's (the same containers; numbers where numbers are; arrays of the
  parameter's shape and the run's type under a parameter's name); its arrays may hold inf (Adam's second moment
  of an overflowing gradient), never NaN (refused for every array by ``agpc.checkpoints``).
- Entries that are no array of the state by the role the engine's ``layout`` (``contract.StateLayout``) gives them
  (``flags``, ``counts``, ``tied_factor``: EP's minibatch rebuild flag and tied factor, GFITC's settled flag
  and sweep count), and the record of site files that a fit on a dask array wrote beside the checkpoint; an
  engine's own record (``layout.extras``) is checked by the engine as it restores it.

- Sizes against the prior, once the state is restored (``agpc.inference.checkpointing``, which has the kernel): the
  inducing points' prior covariance factorises, and the tied factor and the sites are no larger than the rows'
  likelihood could make them, within a wide margin (``check_factor_scale``, ``check_site_scale``).

Below training, beside ``agpc.checkpoints`` (which reads the file and its tree): it imports nothing of agpc but
``backend``, and knows the engines only by the attributes they all have (``state``, ``optimizer``,
``has_damping``, ``names``, and the optional members of ``engines.Engine``).
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from .backend import array_namespace, to_numpy

__all__ = ["check_loop_state", "check_history", "check_engine_state", "check_saved_factor", "check_saved_anchor",
           "check_held_gradient", "check_row_starts", "check_factor_scale", "check_site_scale", "check_log_range",
           "LOG_RANGE", "array_shapes", "dtype_text", "is_array", "LOOP_FIELDS"]

# The training loop's part of a checkpoint, beside the engine's own: the type of each entry.
LOOP_FIELDS = {"fingerprint": dict, "engine": dict, "n_steps": int, "n_updates": int, "history": dict,
               "pending": list, "rng": dict, "order": list, "best": dict, "elapsed": (int, float)}


def is_array(value):
    return hasattr(value, "shape") and hasattr(value, "dtype")


def dtype_text(dtype):
    """A floating type by its name ("float32"), whichever library's dtype object it is."""
    return str(dtype).rsplit(".", 1)[-1]


def array_shapes(engine):
    """{key: shape} of the arrays of an engine's state (``Engine.state_arrays``: kernel parameters as
    "kernel.<name>")."""
    return {k: tuple(v.shape) for k, v in engine.state_arrays().items()}


def check_loop_state(saved, fingerprint, refuse, history_keys=(), validation_keys=()):
    """The loop's part of a checkpoint, field by field (the engine's part: ``check_engine_state``). ``history_keys``:
    the entries the loop records together (one value each a record, ``training.HISTORY_KEYS``); ``validation_keys``:
    those the validation hook records together, when the checkpoint has them."""
    for name, kind in LOOP_FIELDS.items():
        if name not in saved:
            raise refuse(f"{name}: missing")
        if not isinstance(saved[name], kind) or isinstance(saved[name], bool):
            raise refuse(f"{name}: a {type(saved[name]).__name__}, expected {getattr(kind, '__name__', 'a number')}")
    for name in ("n_steps", "n_updates"):
        if saved[name] < 0:
            raise refuse(f"{name}: negative")
    if not (math.isfinite(saved["elapsed"]) and saved["elapsed"] >= 0):
        raise refuse("elapsed: not a non-negative number of seconds")
    if not all(isinstance(p, list) and len(p) == 2 and all(_is_finite(v) for v in p) for p in saved["pending"]):
        raise refuse("pending: not a list of (log Z, invalid rows) pairs of finite numbers")
    check_history(saved["history"], refuse, history_keys, validation_keys)
    _check_counts(saved, refuse)
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < fingerprint["n_batches"]
               for i in saved["order"]):
        raise refuse(f"order: not a list of minibatch indices below {fingerprint['n_batches']}")
    _check_best(saved["best"], len(saved["history"].get("validation_nll", [])), refuse)


def _check_best(best, evaluations, refuse):
    """The early-stopping record: the best validation NLL and the reference an improvement is counted from, each
    finite or +inf (none yet), and the evaluations since the last improvement, at most the ``evaluations`` the
    history recorded. A NaN went on to a model whose file ``load_model`` refused; a count edited to 10^9 stopped
    the resumed fit at its first evaluation."""
    if not (isinstance(best.get("nll"), (int, float)) and isinstance(best.get("reference"), (int, float))
            and isinstance(best.get("since"), int)):
        raise refuse("best: not the early-stopping record (nll, reference, since)")
    for name in ("nll", "reference"):
        if not (_is_finite(best[name]) or best[name] == math.inf):
            raise refuse(f"best.{name}: {best[name]!r}, not a finite number or inf (no evaluation yet)")
    if isinstance(best["since"], bool) or not 0 <= best["since"] <= evaluations:
        raise refuse(f"best.since: {best['since']!r}, not a count of evaluations from 0 to the {evaluations} the "
                     "history recorded")


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value):
    return _is_number(value) and math.isfinite(value)


def check_history(history, refuse, loop_keys=(), validation_keys=(), resumes=True):
    """A training history (``history``, as read from a file; ``refuse(why)`` builds the error): a mapping of names
    to lists of finite numbers (NaN only as the damping of a method that has none), the entries recorded together as
    many a record. The validation hook's (``validation_keys``) are all there or none, each as long as the others: it
    records them together at each evaluation (a file with ``validation_nll`` and no ``validation_step`` crashed
    ``agpc inspect`` and a resume's next evaluation). The training loop's (``loop_keys``, ``log_marginal_likelihood``
    first: ``training.HISTORY_KEYS``): where the history ``resumes`` (a checkpoint's), every one of them, each as long
    as the others (a history without them crashed the resume in ``Trainer.record``); in a model file, none longer than
    the first, which every record adds to: a file of an older agpc lacks some (step counts before the one training
    loop, guard counts before the guard), and ``partial_fit`` continuing it starts them empty beside the longer ones
    (``streaming.trainer_from_fitted``)."""
    if not isinstance(history, dict) or not all(isinstance(values, list) for values in history.values()):
        raise refuse("history: not a mapping of names to lists")
    for key, values in history.items():
        if not all(_is_number(v) for v in values):
            raise refuse(f"history.{key}: not a list of numbers")
        if not all(math.isfinite(v) or (key == "damping" and math.isnan(v)) for v in values):
            raise refuse(f"history.{key}: holds NaN or inf, not finite numbers"
                         + (" (NaN only where the method has no damping)" if key == "damping" else ""))
    if resumes:
        _check_recorded_together(history, loop_keys, "the loop", refuse)
    elif loop_keys:
        first, most = loop_keys[0], len(history.get(loop_keys[0], []))
        longer = [key for key in loop_keys if len(history.get(key, [])) > most]
        if longer:
            raise refuse(f"history: {longer[0]} has {len(history[longer[0]])} entries, more than the {most} of "
                         f"{first}, which the loop records with it")
    if any(key in history for key in validation_keys):
        _check_recorded_together(history, validation_keys, "the validation hook", refuse)


def _check_recorded_together(history, keys, who, refuse):
    """The entries ``keys`` of a history, which ``who`` records together: every one there, as long as the others."""
    missing = [key for key in keys if key not in history]
    if missing:
        raise refuse(f"history: no {', '.join(repr(key) for key in missing)} ({who} records {', '.join(keys)} "
                     "together)")
    lengths = {key: len(history[key]) for key in keys}
    if len(set(lengths.values())) > 1:
        raise refuse(f"history: {', '.join(f'{key} has {length}' for key, length in lengths.items())} entries; "
                     "they are recorded together")


def _check_counts(saved, refuse):
    """The step counts are those the history recorded: ``n_steps`` is the last record's step count plus the steps
    taken since (``pending``), the record's step counts rise, and no more steps moved the hyper-parameters than were
    taken. A count edited to 1e18 was resumed as a finished fit of the old state."""
    steps, pending = saved["history"].get("n_steps"), len(saved["pending"])
    if steps is None:
        return
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in steps) or any(
            b <= a for a, b in zip([0] + steps, steps)):
        raise refuse("history.n_steps: not rising step counts")
    recorded = steps[-1] if steps else 0
    if saved["n_steps"] != recorded + pending:
        raise refuse(f"n_steps: {saved['n_steps']}, but the history recorded {recorded} steps and {pending} were "
                     "taken since")
    if saved["n_updates"] > saved["n_steps"]:
        raise refuse(f"n_updates: {saved['n_updates']} hyper-parameter steps in {saved['n_steps']} steps")


def check_factor_scale(whitened, bound, where, refuse):
    """A tied factor whitened by the prior (``whitened``: L_K^T P L_K on the host, (m, m)) against ``bound``
    (``agpc.inference.checkpointing`` says what it is: the precision the fit's rows could add to the prior's, times
    a wide margin). A hand-edited factor times 1e200 resumed silently (accuracy 0.862 -> 0.69)."""
    size = float(np.linalg.norm(np.asarray(whitened, dtype=np.float64), 2))
    if not size <= bound:
        raise refuse(f"{where}: the factor's precision is {size:.3g} times the prior's, beyond what the fit's rows "
                     f"could give it ({bound:.3g})")


def check_site_scale(sites, bound, where, refuse):
    """The rows' site precisions (on the host, each times its row's weight) against ``bound`` (what the fit's
    likelihood gives one row, times a wide margin)."""
    size = float(np.max(np.abs(np.asarray(sites, dtype=np.float64)), initial=0.0))
    if not size <= bound:
        raise refuse(f"{where}: a site precision of {size:.3g}, beyond what the fit's likelihood gives a row "
                     f"({bound:.3g})")


def _check_float_array(value, shape, dtype, where, refuse):
    """A floating array (of ``shape`` and ``dtype`` where given)."""
    if not is_array(value) or not array_namespace(value).isdtype(value.dtype, "real floating"):
        raise refuse(f"{where}: a {type(value).__name__}, expected a floating-point array")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise refuse(f"{where}: shape {tuple(value.shape)}, this run's is {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        raise refuse(f"{where}: {dtype_text(value.dtype)}, this run computes in {dtype_text(dtype)}")


def _check_finite(value, where, refuse):
    if not np.all(np.isfinite(to_numpy(value))):
        raise refuse(f"{where}: holds inf (the engine's state is finite after every step it keeps)")


def _check_lower_triangular(value, where, refuse):
    """Zero above the diagonal of each (..., k, k) matrix: the engine uses it as a Cholesky-type factor."""
    host = to_numpy(value)
    if host.ndim < 2 or host.shape[-1] != host.shape[-2] or np.any(np.triu(host, k=1) != 0):
        raise refuse(f"{where}: not lower triangular")


# The largest log a parameter stored as its log may hold where its exp multiplies or adds to the kernel's values
# (``check_log_range``): exp of it is float64's largest number.
LOG_RANGE = math.log(np.finfo(np.float64).max)


def check_log_range(values, where, refuse):
    """A kernel parameter whose exp multiplies or adds to the kernel's values (an amplitude, a latent noise, a linear
    kernel's slope variances and bias: ``kernels.scales_values``), stored as its log, must have logs whose exp is
    finite (at most ``LOG_RANGE``): an infinite one makes every covariance inf, no model. A checkpoint's log_noise of
    710 resumed to log Z and probabilities of NaN. (Not below: batch EP's sign-based steps drove a latent noise to
    exp(-752) and an absent ordinal class's cut gap to exp(-782), values a fit reaches and its files must keep; nor,
    in a checkpoint, a lengthscale's, whose inf is a feature ignored: a model file bounds every log parameter so,
    ``model_file``.)"""
    host = np.reshape(np.asarray(to_numpy(values), dtype=np.float64), (-1,))
    beyond = host[np.isfinite(host) & (host > LOG_RANGE)]
    if beyond.size:
        raise refuse(f"{where}: {float(beyond[0]):.6g}, whose exp is inf in float64: no fit gives it")


def _check_kernel_parameter(value, learned, may_be_zero, where, refuse, scales_values=False):
    """A stored (log) kernel parameter: any finite number (what the engine's steps can reach), and where its exp
    multiplies or adds to the kernel's values (``scales_values``) one whose exp is finite (``check_log_range``); -inf
    only where the parameter may be zero and is not learned (no latent noise, fixed at 0)."""
    host = np.reshape(to_numpy(value), (-1,)).tolist()
    allowed_zero = may_be_zero and not learned
    if not all(math.isfinite(v) or (allowed_zero and v == -math.inf) for v in host):
        raise refuse(f"{where}: {host} are not finite logs" + (" (or -inf: fixed at 0)" if allowed_zero else
                                                               (" (a learned parameter's log is finite)"
                                                                if may_be_zero else "")))
    if scales_values:
        check_log_range(value, where, refuse)


def _check_layout(fresh, saved, where, param_shapes, dtype, refuse):
    """``saved`` (an optimiser's snapshot from a file) laid out as ``fresh`` (this run's): the same containers,
    numbers where numbers are, arrays of the parameter's shape under a parameter's name."""
    if fresh is None or isinstance(fresh, bool):
        if saved is not fresh and not (isinstance(fresh, bool) and isinstance(saved, bool)):
            raise refuse(f"{where}: expected {fresh!r}")
    elif isinstance(fresh, (int, float)):
        if isinstance(saved, bool) or not isinstance(saved, type(fresh) if isinstance(fresh, int) else (int, float)) \
                or not math.isfinite(saved):
            raise refuse(f"{where}: expected a finite {type(fresh).__name__}")
    elif isinstance(fresh, (tuple, list)):
        if not isinstance(saved, (tuple, list)) or len(saved) != len(fresh):
            raise refuse(f"{where}: expected {len(fresh)} entries")
        for i, (f, v) in enumerate(zip(fresh, saved)):
            _check_layout(f, v, f"{where}[{i}]", param_shapes, dtype, refuse)
    elif isinstance(fresh, dict):
        if not isinstance(saved, dict) or not set(saved) <= set(param_shapes):
            raise refuse(f"{where}: expected a mapping of this run's parameters {sorted(param_shapes)}")
        for name, value in saved.items():
            shape = tuple(fresh[name].shape) if name in fresh and is_array(fresh[name]) else param_shapes[name]
            _check_float_array(value, shape, dtype, f"{where}.{name}", refuse)
    elif is_array(fresh):
        _check_float_array(saved, fresh.shape, dtype, where, refuse)


def _check_site_record(record, key, path, refuse):
    """Sites written by the workers (``DaskPasses.store_sites``): the files must be the ones such a checkpoint
    writes beside itself, ``<checkpoint>.sites/step-<k>/chunk-<i>.npz``: a file does not choose what we read."""
    if not (isinstance(record, dict) and set(record) == {"site_files", "rows"} and isinstance(record["rows"], list)
            and all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in record["rows"])
            and isinstance(record["site_files"], list) and len(record["site_files"]) == len(record["rows"])):
        raise refuse(f"engine.{key}: not a record of site files (site_files, rows)")
    root = os.path.abspath(os.fspath(path)) + ".sites"
    for i, name in enumerate(record["site_files"]):
        if not (isinstance(name, str) and re.fullmatch(r"step-\d+", os.path.basename(os.path.dirname(name)))
                and os.path.dirname(os.path.dirname(name)) == root and os.path.basename(name) == f"chunk-{i}.npz"):
            raise refuse(f"engine.{key}: site file {name!r} is not in {root}")


def check_engine_state(saved, engine, fingerprint, path, refuse):
    """The engine's part of a checkpoint against this run's freshly built ``engine`` (the module docstring's
    rules): the same kernel parameters, arrays of the same shapes and type, finite, triangular where the engine
    says so, the optimiser's snapshot laid out as this run's, per-row entries of n rows."""
    fresh = engine.state
    if not isinstance(saved, dict):
        raise refuse("engine: not a mapping")
    dtype = fresh["Z"].dtype
    params = fresh["kernel"].params
    table = fresh["kernel"].parameter_table()
    learned = set(engine.names)
    kernel = saved.get("kernel")
    if not isinstance(kernel, dict) or set(kernel) != set(params):
        raise refuse(f"engine.kernel: expected the parameters {sorted(params)}")
    for name, value in kernel.items():
        where = f"engine.kernel.{name}"
        _check_float_array(value, params[name].shape, dtype, where, refuse)
        _check_kernel_parameter(value, name in learned, table[name].may_be_zero, where, refuse,
                                scales_values=table[name].scales_values)
    damping = saved.get("damping")
    if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not (
        (engine.has_damping and 0 < damping <= 1) or (not engine.has_damping and math.isnan(damping))
    ):
        raise refuse(f"engine.damping: {damping!r}, expected " + ("a number in (0, 1]" if engine.has_damping else "NaN"))
    jitter = saved.get("jitter", engine.jitter)  # (the guard only raises it: at least the run's; absent before 89)
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not (
            math.isfinite(jitter) and jitter >= engine.jitter):
        raise refuse(f"engine.jitter: {jitter!r}, expected a finite number at least this run's jitter "
                     f"({engine.jitter:g}): the guard only raises it")
    # what an optimiser steps: kernel parameters, Z, and for SVI q itself (whitened_mean, whitened_chol); a checkpoint
    # of an older form may name a state entry as it was named then (the engine's ``layout.legacy``, old name
    # to new: the engine converts it as it restores)
    layout = engine.layout
    legacy = layout.legacy
    shapes = {name: tuple(value.shape) for name, value in params.items()}
    shapes.update({name: tuple(value.shape) for name, value in fresh.items() if is_array(value)})
    shapes.update({old: shapes[new] for old, new in legacy.items()})
    _check_layout(engine.optimizer.snapshot() if engine.optimizer is not None else None, saved.get("optimizer"),
                  "engine.optimizer", shapes, dtype, refuse)
    # and its values by the optimiser's own rules (``optim``: positive steps, rates of this run's range; an optimiser
    # of one's own without the method has only the layout checked)
    problem = getattr(engine.optimizer, "state_problem", lambda state: None)(saved.get("optimizer"))
    if problem is not None:
        raise refuse(f"engine.optimizer: {problem}")
    for key, value in saved.items():
        where = f"engine.{key}"
        if key in ("kernel", "damping", "jitter", "optimizer"):
            continue
        if key in layout.extras:  # the engine's own record: it checks it as it restores
            continue
        if key in legacy:  # an entry under its older name: checked by the rules of the entry it now is
            if legacy[key] in saved:
                raise refuse(f"{where}: {legacy[key]} is there as well (one form of the state, not both)")
            _check_float_array(value, shapes[key], dtype, where, refuse)
            _check_finite(value, where, refuse)
            if legacy[key] in layout.triangular:
                _check_lower_triangular(value, where, refuse)
            continue
        _check_engine_entry(saved, key, engine, fingerprint["n"], path, refuse)


def _check_engine_entry(saved, key, engine, n, path, refuse):
    """One entry of the engine's part of a checkpoint under its name in this run's state (or the engine's flags,
    counts and factors, or the record of site files), by ``check_engine_state``'s rules."""
    fresh, value, where, layout = engine.state, saved[key], f"engine.{key}", engine.layout
    dtype = fresh["Z"].dtype
    # (sites on the workers of a cluster: a record of their files under the precision's entry stands for both)
    precision, shift = layout.per_row or (None, None)
    if key not in fresh and key not in layout.flags + layout.counts:
        raise refuse(f"{where}: not part of this run's state")
    if key in layout.flags:
        if not isinstance(value, bool):
            raise refuse(f"{where}: not a boolean")
    elif key in layout.counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise refuse(f"{where}: not a count")
    elif key == precision and isinstance(value, dict):
        _check_site_record(value, key, path, refuse)
    elif key == layout.tied_factor:
        check_saved_factor(value, fresh["Z"], where, refuse)
    elif key == shift and isinstance(saved.get(precision), dict):
        return
    elif is_array(fresh[key]):
        _check_float_array(value, fresh[key].shape, dtype, where, refuse)
        _check_finite(value, where, refuse)
        if key in layout.triangular:
            _check_lower_triangular(value, where, refuse)
    elif value is not None:  # begun empty (the vi-* methods' xi): one value a row
        _check_float_array(value, None, dtype, where, refuse)
        if value.ndim < 1 or value.shape[0] != n:
            raise refuse(f"{where}: shape {tuple(value.shape)}, expected {n} rows")
        _check_finite(value, where, refuse)


def check_saved_factor(saved, Z, where, refuse):
    """(precision (m, m), shift (m,)) of a tied factor, or one such pair a class (Z of shape (C, m, d)): floating
    arrays of Z's type, finite."""
    if saved is None:
        return
    m = Z.shape[-2]
    pairs = saved if isinstance(saved, list) else [saved]
    if (len(Z.shape) == 3) != isinstance(saved, list) or (isinstance(saved, list) and len(saved) != Z.shape[0]):
        raise refuse(f"{where}: not one factor {'a class' if len(Z.shape) == 3 else ''}".rstrip())
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise refuse(f"{where}[{i}]: not a (precision, shift) pair")
        for part, shape, value in (("precision", (m, m), pair[0]), ("shift", (m,), pair[1])):
            _check_float_array(value, shape, Z.dtype, f"{where}[{i}].{part}", refuse)
            _check_finite(value, f"{where}[{i}].{part}", refuse)


def check_saved_anchor(saved, kernel, Z, where, refuse):
    """Minibatch EP's anchor as a checkpoint stores it (``engines.anchor_arrays``): None, or the kernel parameters,
    Z and the Cholesky factor(s) L_K of the running product's last exact rebuild, and its jitter: the parameters by
    this run's table (logs of their shapes and type, finite or -inf where a parameter may be zero), Z of this run's shape and type, L_K one (m, m) factor a
    class, lower triangular with a positive diagonal, finite; the jitter a positive number."""
    if saved is None:
        return
    if not isinstance(saved, dict) or set(saved) != {"kernel", "Z", "L_K", "jitter"}:
        raise refuse(f"{where}: not an anchor (kernel, Z, L_K, jitter)")
    params, table = kernel.params, kernel.parameter_table()
    if not isinstance(saved["kernel"], dict) or set(saved["kernel"]) != set(params):
        raise refuse(f"{where}.kernel: expected the parameters {sorted(params)}")
    for name, value in saved["kernel"].items():  # (a parameter fixed at 0 has the log -inf, as in the state's kernel)
        _check_float_array(value, params[name].shape, Z.dtype, f"{where}.kernel.{name}", refuse)
        _check_kernel_parameter(value, False, table[name].may_be_zero, f"{where}.kernel.{name}", refuse,
                                scales_values=table[name].scales_values)
    _check_float_array(saved["Z"], Z.shape, Z.dtype, f"{where}.Z", refuse)
    _check_finite(saved["Z"], f"{where}.Z", refuse)
    m = Z.shape[-2]
    _check_float_array(saved["L_K"], Z.shape[:-2] + (m, m), Z.dtype, f"{where}.L_K", refuse)
    _check_finite(saved["L_K"], f"{where}.L_K", refuse)
    _check_lower_triangular(saved["L_K"], f"{where}.L_K", refuse)
    if not np.all(np.diagonal(to_numpy(saved["L_K"]), axis1=-2, axis2=-1) > 0):
        raise refuse(f"{where}.L_K: not a Cholesky factor (a diagonal entry is not positive)")
    jitter = saved["jitter"]
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not (math.isfinite(jitter) and jitter > 0):
        raise refuse(f"{where}.jitter: {jitter!r}, expected a positive number")


def check_held_gradient(saved, Z, where, refuse):
    """Minibatch SEP's and ADF's gradient in Z held between two moves of the inducing points as a checkpoint stores
    it (``inference.tied_steps``): None, or the summed gradient (an array of Z's shape and type, finite)
    and the positive count of the steps it sums. A count past this version's period moves Z at the next step."""
    if saved is None:
        return
    if not isinstance(saved, dict) or set(saved) != {"gradient", "steps"}:
        raise refuse(f"{where}: not a held gradient (gradient, steps)")
    steps = saved["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise refuse(f"{where}.steps: {steps!r}, expected a positive integer")
    _check_float_array(saved["gradient"], Z.shape, Z.dtype, f"{where}.gradient", refuse)
    _check_finite(saved["gradient"], f"{where}.gradient", refuse)


def check_row_starts(saved, n, where, refuse):
    """A list of distinct row indices below ``n`` (the first rows of minibatches)."""
    if not (isinstance(saved, list) and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                                            for i in saved) and len(set(saved)) == len(saved)):
        raise refuse(f"{where}: not a list of distinct row indices below {n}")
