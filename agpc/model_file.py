"""The model file format: a fitted estimator as data, one ``.npz`` holding arrays and a JSON header, never
serialised Python objects.

This is the format and its schema, just below the estimator: ``GPClassifier.save`` / ``load`` write and read
through it, and ``agpc.persistence`` (``save_model`` / ``load_model``, the documented entry points) is built
on it. It never sees the estimator: it writes and reads values, the estimator's class name, its parameters
(``get_params``) and a ``model.FittedState`` (everything a fitted model is beyond its parameters), and checks
parameters through an :class:`EstimatorSchema` (their names and defaults, and the estimator's own check). A
file's model is tried by the prediction code itself (``agpc.prediction`` on its ``model.FittedModel``).

Loading never executes code and never trusts what it reads: every member's npy header is checked before any
data are read (``checkpoints.read_archive``: no object arrays, no declared size beyond the bytes held, nor
beyond what the header and the schema allow: a zip bomb is refused before it is inflated), the header is
JSON, and every field is checked against the format's schema (types, shapes, finiteness, a lower triangular
L_C with a positive diagonal, unique classes, known kernels, the estimator's own parameters). A file that
fails is one ``ValueError`` naming the file and the field. A model file carries a format version: every
earlier version keeps loading (tests/data/model_v1), a newer one is refused naming both. Parameters that name
where training writes (``NOT_RESTORED``) are never restored from a file. Saving is atomic
(``checkpoints.atomic_savez``): a crash never leaves a half-written model where a good one was.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import backend as B
from . import prediction as P
from .checkpoint_rules import check_history, check_log_range
from .checkpoints import HEADER_KEY, atomic_savez, read_archive
from .inference.posterior import Posterior, prior_cholesky
from .inference.checkpointing import VALIDATION_KEYS
from .inference.training import HISTORY_KEYS, STOP_REASONS
from .inputs import check_features
from .kernels import (MAX_LISTED_LEVELS, ORDINAL_KERNEL, PER_DIMENSION, ClassKernels, Categorical,
                      categorical_columns, kernel_from_spec, spec_parameter_table)
from .likelihoods import LIKELIHOODS, registered_likelihood
from .methods import get_method
from .model import FIT_RECORD, FittedModel, FittedState
from .untrusted import RefusedFile, available_memory, check_file_argument, describe, shown
from .categories import MAX_LEVELS, CategoricalColumns
from .labels import FILE_LABEL_KINDS, MAX_LABEL_BYTES

FORMAT = "agpc-model"
# 1: the first format. 2: adds "feature_names_in" (the columns a DataFrame had at fit). 3: kernels of any
# parameter table (rational quadratic, sums, products) whose parameters may carry priors, and the parameter
# "kernel_prior" (the default priors): an agpc that reads version 2 would refuse such a kernel as unknown
# rather than say the file is newer. A file of a version above VERSION is refused, naming both; every earlier
# version keeps loading (tests/data/model_v1). 4: a standardisation of the features before the classifier ("scaler":
# a fitted StandardScaler's numbers; ``agpc.load_model`` gives the Pipeline back), which an agpc that reads version 3
# would refuse as unexpected arrays. A file says the least version that reads it: one without a scaler is version 3
# (``PLAIN_VERSION``), read by every agpc since 3. 5: a categorical kernel's lengthscales enter as 1 / l^2 (they
# entered as 1 / l before, in files no release wrote) and it may list levels: a file whose kernel reads categorical
# columns is version 5, and such a kernel in a file of an earlier version is refused (it would load with another
# meaning); ``CATEGORICAL_VERSION``.
VERSION = 5
PLAIN_VERSION = 3
SCALER_VERSION = 4
CATEGORICAL_VERSION = 5
# what a file may hold of a StandardScaler (those it has: ``mean_`` is None without centring nor scaling), each
# (n_features,), as the array "scaler_<name>"
SCALER_ARRAYS = ("mean", "var", "scale")
LEVELS_PREFIX = "categorical_levels_"  # + a feature index: the text levels of that categorical column, in code order
SCALER_FIELDS = ("with_mean", "with_std", "n_samples_seen", "arrays", "steps")
MAX_STEP_NAME = 100  # a pipeline step's name in a file: a short identifier
# a step name is a plain (ASCII) identifier: it reaches repr, get_params keys and terminals, so no control characters
STEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The least scale a file's scaler may hold: its variance, scale squared, must be a normal float64. Below it the
# variance has lost digits to underflow (1e-300 squared is 0), so a scale cannot be checked against it, and every
# input an ordinary number away from the mean is standardised to ~1e150 or more, where the kernel is 0 and the
# model answers its prior (0.5) whatever the input. (Above, var's own finiteness bounds scale by sqrt(max).)
MIN_SCALE = math.sqrt(np.finfo(np.float64).tiny)
# How far the pipeline's probabilities at the inducing points, mapped back to inputs through the scaler, may be
# from the classifier's at them. The float64 round trip z -> z scale + mean -> z loses about eps (|mean| / scale
# + |z|) of z: under 1e-6 for any mean within 1e9 standard deviations of 0 (data with nine significant digits of
# offset), while a mean that swallows the inducing points (1e308 + z scale == 1e308) moves the probabilities by
# their whole spread.
PIPELINE_ATOL = 1e-6
# The most iterations a file may say its model ran: what a NumPy int64 holds (the count is written to histories
# and summaries as one).
MAX_ITERATIONS = int(np.iinfo(np.int64).max)

__all__ = ["FORMAT", "VERSION", "PLAIN_VERSION", "SCALER_ARRAYS", "step_names_problem", "NOT_RESTORED",
           "VALUE_WHEN_ABSENT", "MAX_LABEL_BYTES",
           "FIT_RECORD", "FittedState", "EstimatorSchema", "write_model_file", "read_model_file", "read_model_parts",
           "unpickled_state"]

# Parameters that name where training writes: a file never chooses them (loaded as None, the defaults). A
# model that re-fits after loading, or its clone, writes where its user says, not where the file said.
NOT_RESTORED = ("checkpoint_path", "checkpoint_every", "site_directory", "client")
# Parameters added after models were first saved, and the value a file without them stands for: what those
# models were trained with (before kernel_prior, every model was fitted by maximum likelihood: None; before ard,
# every lengthscale was learned per feature: True; before early_stopping, no rows were held out: False; before
# categorical_features, no column was categorical: None).
VALUE_WHEN_ABSENT = {"kernel_prior": None, "ard": True, "early_stopping": False, "categorical_features": None}
FITTED_AS = ("kernel_prior", "ard", "early_stopping")  # those a fitted model echoes as ``<name>_``
# Parameters added since models were first pickled whose default is what an agpc without them did (or, for
# validation_fraction, what no model without it used): an older pickle is completed with it (else get_params, repr
# and clone of the unpickled estimator fail)
PARAMETERS_ADDED = {"class_weight": None, "classes": None, "validation_fraction": 0.1}

@dataclass(frozen=True)
class EstimatorSchema:
    """What a model file needs to know of the estimator it holds, as values: its class ``name`` (a file names it),
    its parameters' ``defaults`` (``get_params()`` of a default instance: the names it has, and what a file without
    one stands for) and ``check``, which refuses (ValueError or TypeError) parameters that ``fit`` would refuse."""

    name: str
    defaults: dict
    check: Callable[[dict], None]


# -- writing -----------------------------------------------------------------------------------------

def _json_params(params):
    """get_params() values that JSON can hold; a kernel is described by the kernel fields instead."""
    out = {}
    for key, value in params.items():
        if key == "kernel":
            continue
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
        elif isinstance(value, (tuple, list, np.ndarray)) and all(
                isinstance(v, (str, bool, np.bool_)) or (isinstance(v, numbers.Integral)) for v in list(value)):
            out[key] = [v.item() if isinstance(v, np.generic) else v for v in list(value)]  # (categorical_features)
        elif isinstance(value, (np.integer, np.floating, np.bool_)):
            out[key] = value.item()
        # arrays (inducing=array), dicts (class_weight=dict), generators (random_state) and namespaces are not
        # model parameters needed to predict; they are dropped and the loaded estimator gets the defaults
    return out


def write_model_file(path, estimator_name, params, state, scaler=None):
    """Write a fitted estimator to ``path`` (the name is kept as given, written atomically) or to a binary file
    object: its class name ``estimator_name``, its ``params`` (``get_params``: those JSON holds) and ``state``, its
    ``model.FittedState``.
    ``scaler``: the standardisation of the features before it, {"with_mean", "with_std", "n_samples_seen": bools
    and an int, "steps": the two step names, "feature_names": the pipeline's input columns or None, and
    the arrays of ``SCALER_ARRAYS`` it has} (``agpc.persistence`` takes them from a fitted StandardScaler)."""
    path = check_file_argument(path, "save_model", writing=True)
    # A multiclass model has one posterior and one kernel per class: stacked (C, m, m) / (C, m) arrays
    # and kernel parameters named "<class>:<name>".
    posts = state.posterior if isinstance(state.posterior, tuple) else None
    classes = np.asarray(state.classes)
    try:
        fitted_with = get_method(params["method"]).likelihood_for(params["likelihood"], classes.shape[0])
    except (ValueError, KeyError):  # (a likelihood registered where the file is loaded, not here: checked there)
        fitted_with = state.likelihood
    if isinstance(state.likelihood, str) and fitted_with != state.likelihood:  # (``load_model`` refuses such a file)
        raise ValueError(f"the model was fitted with the {state.likelihood!r} likelihood, and its parameters set since "
                         f"(method {params['method']!r}, likelihood {params['likelihood']!r}) fit {fitted_with!r}: "
                         "set them back, or fit again, before saving")
    if classes.dtype.kind not in FILE_LABEL_KINDS:
        classes = classes.astype(str)
    arrays = {
        "inducing_points": B.to_numpy(state.inducing_points),
        "posterior_L_C": np.stack([B.to_numpy(p.L_C) for p in posts]) if posts else B.to_numpy(state.posterior.L_C),
        "posterior_h": np.stack([B.to_numpy(p.h) for p in posts]) if posts else B.to_numpy(state.posterior.h),
        "classes": classes,
    }
    for name, value in state.kernel.params.items():
        arrays[f"kernel_{name}"] = B.to_numpy(value)
    categorical = state.categorical
    for j, levels in ({} if categorical is None else categorical.levels).items():
        arrays[f"{LEVELS_PREFIX}{int(j)}"] = np.asarray(levels).astype(str)
    kernels = getattr(state.kernel, "kernels", None)
    names = state.feature_names_in
    if scaler is not None:  # the pipeline's input columns are the scaler's (the classifier sees its output)
        names = scaler["feature_names"] if scaler["feature_names"] is not None else names
        arrays.update({f"scaler_{name}": np.asarray(scaler[name], dtype=np.float64) for name in SCALER_ARRAYS
                       if scaler.get(name) is not None})
    header = {
        "format": FORMAT,
        "version": (CATEGORICAL_VERSION if categorical_columns(state.kernel) else
                    PLAIN_VERSION if scaler is None else SCALER_VERSION),
        "estimator": estimator_name,
        "params": _json_params(params),
        "kernel": [k.spec() for k in kernels] if kernels else state.kernel.spec(),
        "kernel_params": sorted(state.kernel.params),
        "n_features_in": int(state.n_features_in),
        "feature_names_in": None if names is None else [str(v) for v in names],
        "log_marginal_likelihood": float(state.log_marginal_likelihood),
        "n_iter": int(state.n_iter),
        "fitted_jitter": float(state.jitter),
        "likelihood": state.likelihood,
        "history": {k: [float(v) for v in values] for k, values in state.history.items()},
        "fit_record": {name: value for name, value in (state.record or {}).items() if value is not None},
    }
    if categorical is not None and categorical.mask.any():  # (a file without categorical columns is as before)
        header["categorical_columns"] = [int(j) for j in categorical.columns]
    if scaler is not None:
        header["scaler"] = {"with_mean": bool(scaler["with_mean"]), "with_std": bool(scaler["with_std"]),
                            "n_samples_seen": int(scaler["n_samples_seen"]), "steps": [str(v) for v in scaler["steps"]],
                            "arrays": [name for name in SCALER_ARRAYS if scaler.get(name) is not None]}
    _check_kernels_load(header["kernel"])
    _check_kernel_values_load(header, arrays, classes.shape[0])
    arrays[HEADER_KEY] = np.asarray(json.dumps(header))
    atomic_savez(path, arrays)


def _check_kernels_load(specs):
    """Refuse to write a kernel description the loader would refuse (its bounds on what a file may describe: a Sum
    of 1,101 RBF terms fitted, saved, and ``load_model`` then refused its own file), read here as it will be read."""
    for spec in specs if isinstance(specs, list) else [specs]:
        try:
            spec_parameter_table(spec)
        except ValueError as error:
            raise ValueError(f"save_model: this model's kernel could not be loaded back from a model file ({error}); "
                             "nothing was written (a pickle keeps it, for this environment only)") from None


def _check_kernel_values_load(header, arrays, n_classes):
    """Refuse to write kernel parameters the loader would refuse: a log whose exp is inf (``_check_log_parameter``).
    A fit at Adam's learning rate 1e3 ended with a latent noise of exp(767), and its file was written and then
    refused by ``load_model`` (the hostile-input audit of 2026-12-04)."""
    def refuse(why):
        why = why.replace(": no fit gives it", "")  # (the loader's words of a file: here a fit did)
        return ValueError(f"save_model: this model's kernel could not be loaded back from a model file ({why}): its "
                          "parameters left float64's range in training (fit it again, with a smaller learning_rate); "
                          "nothing was written")

    _, table = _kernel_specs(header, n_classes, refuse)
    for name, parameter in table.items():
        if f"kernel_{name}" in arrays:
            _check_log_parameter(parameter, arrays[f"kernel_{name}"], f"kernel_{name}", refuse)


def _check_log_parameter(parameter, values, key, refuse):
    """A model file's kernel parameter stored as its log (every positive one) has logs whose exp is finite
    (``check_log_range``), what the model predicts with. An infinite amplitude or noise makes every covariance inf;
    an infinite lengthscale (a checkpoint may hold one: a feature ignored) overflows with NumPy's warning at every
    use of the kernel, and all of them make a kernel of one constant, a model that answers one probability whatever
    the input (the hostile-input audit of 2026-12-04: log lengthscales of 800). No fit that stays in float64's range
    writes one: once 1 / l^2 underflows (log l ~ 355-372) a lengthscale's gradient is 0 and the optimisers stop
    moving it (Rprop's irrelevant features stopped at 390); a step that leaves the range is refused at save."""
    if parameter.stored_as_log:
        check_log_range(values, f"{key} (the {parameter.name})", refuse)


def unpickled_state(state):
    """The ``__dict__`` of an estimator pickled by an agpc without a parameter of ``VALUE_WHEN_ABSENT``, completed
    as that model was trained (kernel_prior: no priors; a fitted one's ``kernel_prior_`` and the structure
    ``partial_fit`` checks too)."""
    state = dict(state)
    for name, value in PARAMETERS_ADDED.items():  # (their defaults are what an agpc without them did)
        state.setdefault(name, value)
    for name, value in VALUE_WHEN_ABSENT.items():
        state.setdefault(name, value)
        if "kernel_" in state and name in FITTED_AS:  # fitted: the attribute that says what it was fitted with
            state.setdefault(name + "_", value)
    if isinstance(state.get("_fitted_structure"), dict):
        state["_fitted_structure"] = {**VALUE_WHEN_ABSENT, **state["_fitted_structure"]}
    return state


# -- reading: every field checked against the schema ------------------------------------------------

def _refuse(path, why):
    return ValueError(f"{describe(path)} is not a valid agpc model file: {why}")


def _check_version(header, refuse, what):
    """The header names this format, in a version this agpc reads (1, the first, up to VERSION)."""
    if not isinstance(header, dict) or header.get("format") != what:
        raise refuse(f"format: the header does not name the {what} format")
    version = header.get("version")
    if not _is_int(version) or version < 1:
        raise refuse(f"version: {version!r} is not a format version")
    if version > VERSION:
        raise refuse(f"version: the file has format version {version}, written by a newer agpc; this agpc reads "
                     f"versions 1 to {VERSION}: upgrade agpc to read it")
    return version


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked_params(stored, schema, refuse):
    """The estimator parameters of a model file, all of them (``schema.defaults`` where the file has none): the
    estimator's own (unknown names, e.g. from an older agpc that had a parameter this one has not, are dropped: they
    cannot matter to this agpc), plain JSON values, no paths; then checked by the estimator's own validation
    (``schema.check``)."""
    if not isinstance(stored, dict):
        raise refuse("params: not a mapping of parameter names to values")
    known = schema.defaults
    params = {name: value for name, value in VALUE_WHEN_ABSENT.items() if name in known}
    for name, value in stored.items():
        if name not in known or name in NOT_RESTORED or name == "kernel":
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = tuple(value)  # optimize=("kernel", ...): JSON has lists only
        elif isinstance(value, list) and all(isinstance(v, int) for v in value):  # (bools too: a mask)
            value = list(value)  # categorical_features=[1, 3], or a mask
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            raise refuse(f"params.{name}: a {type(value).__name__}, not a plain value")
        params[name] = value
    params = {**known, **params}
    try:
        # the backend named at training (e.g. cupy) need not exist where the model is loaded: read_model_file's
        # ``backend`` places the arrays; every other parameter is checked as fit checks it
        schema.check(dict(params, backend="numpy"))
    except (ValueError, TypeError) as exc:  # TypeError: a value of a type the check did not foresee
        raise refuse(f"params: {exc}") from None
    jitter = params["jitter"]
    if not (isinstance(jitter, (int, float)) and math.isfinite(jitter) and jitter >= 0):
        raise refuse(f"params.jitter: {jitter!r} is not a non-negative number")
    return params


def _float_array(arrays, name, shape, refuse, allow_neg_inf=False):
    values = arrays[name]
    if values.dtype.kind != "f":
        raise refuse(f"{name}: dtype {values.dtype}, not floating point")
    if values.shape != shape:
        raise refuse(f"{name}: shape {values.shape}, expected {shape}")
    bad = np.isnan(values) | np.isposinf(values)
    if not allow_neg_inf:
        bad |= np.isneginf(values)
    if np.any(bad):
        raise refuse(f"{name}: holds NaN or inf")
    return values


def _check_factor(L_C, refuse):
    """L_C = chol(I + A diag(nu) A^T) (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 35's factor): lower triangular
    with a positive diagonal."""
    if np.any(np.triu(L_C, k=1) != 0):
        raise refuse("posterior_L_C: not lower triangular")
    if np.any(np.diagonal(L_C, axis1=-2, axis2=-1) <= 0):
        raise refuse("posterior_L_C: a diagonal entry is not positive (not a Cholesky factor)")


def _check_classes(classes, refuse):
    if classes.ndim != 1 or classes.dtype.kind not in FILE_LABEL_KINDS:
        raise refuse(f"classes: a {classes.dtype} array of shape {classes.shape}, expected a 1-D array of labels")
    if classes.dtype.kind == "f" and not np.all(np.isfinite(classes)):
        raise refuse("classes: holds NaN or inf")
    if np.unique(classes).shape[0] != classes.shape[0]:
        raise refuse("classes: a class is listed twice")
    if classes.shape[0] < 2:
        raise refuse("classes: a classifier needs at least two classes")


def _check_header_fields(header, refuse, version):
    d = header.get("n_features_in")
    if not _is_int(d) or d < 1:
        raise refuse(f"n_features_in: {d!r} is not a positive integer")
    if not _is_int(header.get("n_iter", 0)) or not 0 <= header.get("n_iter", 0) <= MAX_ITERATIONS:
        raise refuse(f"n_iter: {_shown(header.get('n_iter'))} is not a non-negative integer of 64 bits")
    if not _is_number(header.get("log_marginal_likelihood", float("nan"))):
        raise refuse("log_marginal_likelihood: not a number")
    # (finite, as every field; what fits record together, as many a record: agpc inspect reads them together)
    check_history(header.get("history", {}), refuse, HISTORY_KEYS, VALIDATION_KEYS, resumes=False)
    record = _checked_record(header.get("fit_record", {}), refuse)
    if record["n_warmup"] is not None and record["n_warmup"] > header.get("n_iter", 0):
        # the warm-up sweeps are counted in n_iter (training records min(warm-up, sweeps run)): more is no fit's
        raise refuse(f"fit_record.n_warmup: {record['n_warmup']} warm-up sweeps, more than the n_iter "
                     f"({header.get('n_iter', 0)}) they are part of")
    names = header.get("feature_names_in") if version >= 2 else None
    if names is not None and not (isinstance(names, list) and len(names) == d and all(isinstance(v, str) for v in names)
                                  and len(set(names)) == d):
        raise refuse(f"feature_names_in: expected {d} distinct column names")
    return d, names, record


def _checked_record(record, refuse):
    """The fit record (``FIT_RECORD``): names this agpc does not know (a newer one's) are dropped, as parameters
    are; each known one is checked (a row count, seconds, one of ``training.STOP_REASONS``)."""
    if not isinstance(record, dict):
        raise refuse("fit_record: not a mapping of names to values")
    rows, seconds, reason, ard, warmup, held_out, sub_rows, sub_iter = (record.get(name) for name in FIT_RECORD)
    if rows is not None and not (_is_int(rows) and rows >= 1):
        raise refuse(f"fit_record.n_samples_fit: {rows!r} is not a positive integer")
    if seconds is not None and not (_is_number(seconds) and math.isfinite(seconds) and seconds >= 0):
        raise refuse(f"fit_record.fit_time: {seconds!r} is not a non-negative number of seconds")
    if reason is not None and reason not in STOP_REASONS:
        raise refuse(f"fit_record.stop_reason: {reason!r} is not one of {list(STOP_REASONS)}")
    if ard is not None and not isinstance(ard, bool):
        raise refuse(f"fit_record.ard: {ard!r} is not true or false (lengthscales per feature or one shared scale)")
    if warmup is not None and not (_is_int(warmup) and warmup >= 0):
        raise refuse(f"fit_record.n_warmup: {warmup!r} is not a non-negative integer (the warm-up sweeps of n_iter)")
    if held_out is not None and not isinstance(held_out, bool):
        raise refuse(f"fit_record.early_stopping: {held_out!r} is not true or false (rows held out for early stopping)")
    for name, value in (("subsample_rows", sub_rows), ("subsample_iter", sub_iter)):
        if value is not None and not (_is_int(value) and value >= 0):
            raise refuse(f"fit_record.{name}: {value!r} is not a non-negative integer (the fit's start on a subsample)")
    if sub_rows is not None and rows is not None and sub_rows >= rows:
        raise refuse(f"fit_record.subsample_rows: {sub_rows} rows of a subsample, not fewer than the "
                     f"{rows} rows fitted")
    if sub_rows == 0 and sub_iter:
        raise refuse(f"fit_record.subsample_iter: {sub_iter} iterations on a subsample of 0 rows")
    return {name: record.get(name) for name in FIT_RECORD}


def _ordinal_classes(specs):
    """The number of classes an ordinal model's kernel description declares (``kernels.OrdinalKernel``), else None."""
    if isinstance(specs, dict) and specs.get("type") == ORDINAL_KERNEL and _is_int(specs.get("classes")):
        return specs["classes"]
    return None


LEVEL_LENGTHSCALES = Categorical.level_parameter.key  # (the end of a per-level categorical kernel's array name)


def _names_categorical(spec):
    """Whether a checked kernel description (``_kernel_specs``: its nesting bounded) names a Categorical kernel."""
    if isinstance(spec, dict):
        return spec.get("type") == Categorical.name or any(_names_categorical(v) for v in spec.values())
    return isinstance(spec, list) and any(_names_categorical(v) for v in spec)


def _kernel_specs(header, n_classes, refuse):
    """The kernel description: one kernel spec (binary or ordinal) or one per class (multiclass), naming only
    kernels and prior families of agpc's fixed tables (``kernels.spec_parameter_table`` checks them); returns the
    {name: Parameter} table of the parameters the file must hold."""
    specs = header.get("kernel")
    ordinal = _ordinal_classes(specs)
    multiclass = n_classes > 2 and ordinal is None
    if multiclass != isinstance(specs, list) or (multiclass and len(specs) != n_classes) or (
            ordinal is not None and ordinal != n_classes):
        raise refuse("kernel: the description does not match the number of classes")
    table = {}
    for c, spec in enumerate(specs if multiclass else [specs]):
        try:
            table.update({(f"{c}:" if multiclass else "") + key: parameter
                          for key, parameter in spec_parameter_table(spec).items()})
        except (ValueError, TypeError) as error:
            raise refuse(f"kernel: {error}") from None
    return specs, table


def _kernel_arrays(header, arrays, table, d, refuse):
    """{name: array} of the kernel parameters: exactly the names of the kernels' parameter ``table``, each of
    its shape (a per-dimension parameter: one value or d)."""
    expected = sorted(table)
    stored = header.get("kernel_params")
    if not (isinstance(stored, list) and all(isinstance(v, str) for v in stored) and sorted(stored) == expected):
        raise refuse(f"kernel_params: expected {expected}, got {header.get('kernel_params')!r}")
    params = {}
    for name in expected:
        key = f"kernel_{name}"
        if key not in arrays:
            raise refuse(f"{key}: missing")
        if table[name].shape == PER_DIMENSION:
            shape = arrays[key].shape if arrays[key].shape in ((1,), (d,)) else (d,)
        elif table[name].length is not None:  # (an ordinal model's cut gaps)
            shape = (table[name].length,)
        else:
            shape = ()
        params[name] = _float_array(arrays, key, shape, refuse, allow_neg_inf=table[name].may_be_zero)
        _check_log_parameter(table[name], params[name], key, refuse)
    return params


def _kernel_from_file(specs, params, multiclass):
    """The kernel (binary) or the ClassKernels (multiclass) of checked specs and parameter arrays."""
    if multiclass:
        return ClassKernels(
            kernel_from_spec(spec, {name.split(":", 1)[1]: value for name, value in params.items()
                                    if name.startswith(f"{c}:")})
            for c, spec in enumerate(specs)
        )
    return kernel_from_spec(specs, params)


def _check_declared_sizes(path, header, declared):
    """Before any array is inflated: no member larger than the schema lets the header and ``posterior_h``
    (m floats a class: the smallest array that fixes m) declare. The header gives the features d and the
    classes C (one kernel a class for more than two); then inducing points are (C,) m x d, L_C (C,) m x m,
    each kernel array at most d numbers. A compressed member that inflates beyond that (a zip bomb) is
    refused naming it; a header or posterior_h that does not fit the schema is left to the field checks that
    follow the reading (which name the field), as long as it is small."""
    # a file of another format or a newer version is refused as such, not for arrays this version lacks
    _check_version(header, lambda why: RefusedFile(path, why), FORMAT)
    d, specs = header.get("n_features_in"), header.get("kernel")
    if not (_is_int(d) and d >= 1) or "posterior_h" not in declared:
        return
    ordinal = _ordinal_classes(specs)
    n_classes = len(specs) if isinstance(specs, list) else (ordinal or 2)
    lead = (n_classes,) if isinstance(specs, list) and n_classes > 2 else ()
    h_shape = declared["posterior_h"][0]
    if len(h_shape) != len(lead) + 1 or h_shape[:-1] != lead:
        raise RefusedFile(path, f"posterior_h: shape {h_shape}, expected {lead + (-1,)} (-1: the inducing points) for "
                                f"{n_classes} classes")
    m = h_shape[-1]
    # loading factorises K(Z, Z) + jitter I a class and predicts at the inducing points: a few m x m matrices a
    # class beside the arrays read, which must fit in the memory available (the file's size bounds m already:
    # checkpoints.MAX_EXPANSION)
    needed = 4 * max(1, len(lead) and n_classes) * m * m * 8
    memory = available_memory()
    if memory is not None and needed > memory:
        raise RefusedFile(path, f"posterior_h declares {m:,} inducing points{' a class' if lead else ''}: loading "
                                f"the model takes about {needed:,} bytes, more than the {memory:,} bytes of memory "
                                "available")
    allowed = {"posterior_h": lead + (m,), "classes": (n_classes,), "inducing_points": lead + (m, d),
               "posterior_L_C": lead + (m, m), **{f"scaler_{name}": (d,) for name in SCALER_ARRAYS}}
    for name, (shape, dtype) in declared.items():
        if name == HEADER_KEY:
            continue
        if name.startswith(LEVELS_PREFIX):  # a categorical column's text levels: at most MAX_LEVELS labels
            if math.prod(shape) > MAX_LEVELS or dtype.itemsize > MAX_LABEL_BYTES:
                raise RefusedFile(path, f"member {name + '.npy'!r} declares shape {shape} of {dtype}: at most "
                                        f"{MAX_LEVELS:,} levels of {MAX_LABEL_BYTES:,} bytes")
            continue
        if name not in allowed and not name.startswith("kernel_"):
            raise RefusedFile(path, f"unexpected arrays {[name]}")
        # a kernel array: d numbers, K - 2 cut gaps, or a categorical kernel's per-level lengthscales (its exact
        # length, the levels its description lists, is checked with the fields)
        most = (MAX_LISTED_LEVELS if name.endswith(LEVEL_LENGTHSCALES) else
                math.prod(allowed.get(name, (max(d, n_classes),))))
        if math.prod(shape) > most:
            raise RefusedFile(path, f"member {name + '.npy'!r} declares shape {shape} of {dtype}, more than the "
                                    f"{most:,} values the model's header and posterior_h allow")
        if name == "classes" and dtype.itemsize > MAX_LABEL_BYTES:
            raise RefusedFile(path, f"member 'classes.npy' declares labels of {dtype.itemsize:,} bytes each ({dtype}); "
                                    f"a label takes {MAX_LABEL_BYTES:,} at most")


def read_model_file(path, schema, backend="numpy"):
    """(the parameters, the ``model.FittedState``) of a fitted estimator of ``schema`` (an :class:`EstimatorSchema`:
    the file must name its class) read from a model file written by :func:`write_model_file` (format version 1 or
    later up to ``VERSION``); arrays are placed in ``backend``'s namespace. Everything read is checked against the
    format's schema first; a file that does not satisfy it is one ``ValueError`` naming the file and the field. A
    file that holds a standardisation of the features is refused: the estimator alone would predict on unscaled
    features (``read_model_parts`` gives both)."""
    params, state, scaler = read_model_parts(path, schema, backend)
    if scaler is not None:
        raise _refuse(path, "it holds a standardisation of the features before the classifier (saved from a "
                            "Pipeline, or by 'agpc fit --standardize'): load it with agpc.load_model, which gives "
                            "the Pipeline, not with GPClassifier.load, which would predict on unscaled features")
    return params, state


def step_names_problem(steps):
    """Why ``steps`` (a Pipeline's two step names) cannot be a model file's, or None: each a plain identifier of
    at most ``MAX_STEP_NAME`` characters without '__' (scikit-learn's separator of nested parameters), the two
    distinct, neither one of Pipeline's own parameters (a step named 'memory' or 'verbose' shadows it:
    set_params and clone break). ``save_model`` refuses what ``load_model`` would."""
    from sklearn.pipeline import Pipeline  # (only for files with a scaler, which load as a Pipeline anyway)

    if not (isinstance(steps, list) and len(steps) == 2):
        return "expected a list of two step names"
    reserved = sorted(Pipeline([]).get_params(deep=False))
    for name in steps:
        if not isinstance(name, str):
            return f"a {type(name).__name__}, not a step name"
        shown = repr(name if len(name) <= MAX_STEP_NAME else name[:MAX_STEP_NAME] + "...")
        if not (len(name) <= MAX_STEP_NAME and STEP_NAME.fullmatch(name) and "__" not in name):
            return f"{shown} is not a plain identifier of 1 to {MAX_STEP_NAME} ASCII characters without '__'"
        if name in reserved:
            return f"{shown} is one of the Pipeline's own parameters {reserved}"
    if steps[0] == steps[1]:
        return f"the two steps are both named {steps[0]!r}"
    return None


def scaler_arrays(with_mean, with_std):
    """The arrays of ``SCALER_ARRAYS`` a fitted StandardScaler has: the mean when it centres or scales (scaling
    computes it), the variance and the scale when it scales."""
    return [name for name in SCALER_ARRAYS if with_std or (name == "mean" and with_mean)]


def _checked_scaler(header, arrays, d, refuse, version):
    """The standardisation a file of version 4 (or 5) holds (``write_model_file``'s ``scaler``), or None (earlier
    versions, or none in a file of version 5). Checked: the flags, and the arrays they call for ((d,) finite floats,
    variances non-negative, scales as scikit-learn computes them from the variances, at least ``MIN_SCALE``)."""
    spec = header.get("scaler")
    if version < SCALER_VERSION:  # (the version that reads this file would drop it, and predict on unscaled features)
        if "scaler" in header:
            raise refuse(f"scaler: format version {version} holds no scaler (version {SCALER_VERSION} added it)")
        return None
    if spec is None:  # the writer writes version 3 for a file without one (5, of a categorical kernel, may hold none)
        if version == SCALER_VERSION:
            raise refuse(f"scaler: missing; a file of format version {version} holds a scaler")
        return None
    if not isinstance(spec, dict) or set(spec) != set(SCALER_FIELDS):
        raise refuse(f"scaler: expected the fields {list(SCALER_FIELDS)}")
    if not all(isinstance(spec[name], bool) for name in ("with_mean", "with_std")):
        raise refuse("scaler: with_mean and with_std must be true or false")
    if not _is_int(spec["n_samples_seen"]) or spec["n_samples_seen"] < 1:
        raise refuse(f"scaler.n_samples_seen: {spec['n_samples_seen']!r} is not a positive integer")
    problem = step_names_problem(spec["steps"])
    if problem:
        raise refuse(f"scaler.steps: {problem}")
    held = spec["arrays"]
    if not (isinstance(held, list) and all(v in SCALER_ARRAYS for v in held) and len(set(held)) == len(held)):
        raise refuse(f"scaler.arrays: expected distinct names among {list(SCALER_ARRAYS)}")
    expected = scaler_arrays(spec["with_mean"], spec["with_std"])
    if sorted(held) != sorted(expected):  # (one missing: the transform would take None for an array)
        raise refuse(f"scaler.arrays: {held}, a StandardScaler with with_mean={spec['with_mean']}, "
                     f"with_std={spec['with_std']} has {expected}")
    out = {name: spec[name] for name in ("with_mean", "with_std", "n_samples_seen", "steps")}
    for name in SCALER_ARRAYS:
        key = f"scaler_{name}"
        if name not in held:
            out[name] = None
            continue
        if key not in arrays:
            raise refuse(f"{key}: missing")
        values = _float_array(arrays, key, (d,), refuse)
        if (name == "scale" and np.any(values <= 0)) or (name == "var" and np.any(values < 0)):
            raise refuse(f"{key}: holds {'a scale that is not positive' if name == 'scale' else 'a negative variance'}")
        out[name] = values.astype(np.float64)
    if spec["with_std"]:
        _check_scale(out, refuse)
    return out


def _check_scale(scaler, refuse):
    """The scale is what scikit-learn's StandardScaler computes from the variance: sqrt(var), but 1 where the
    feature is constant to round-off (its ``_is_constant_feature``: var <= n eps var + (n mean eps)^2, the error
    bound of the variance's computation), to round-off; and not below ``MIN_SCALE``."""
    mean, var, scale, n = scaler["mean"], scaler["var"], scaler["scale"], scaler["n_samples_seen"]
    if np.any(scale < MIN_SCALE):
        raise refuse(f"scaler_scale: a scale below {MIN_SCALE:.3g} (whose variance underflows: every input but the "
                     "mean would be standardised beyond where the model says anything)")
    eps = np.finfo(np.float64).eps
    with np.errstate(over="ignore"):  # (an overflowing bound: a mean so large that every feature is constant)
        constant = var <= n * eps * var + (n * mean * eps) ** 2
    expected = np.where(constant, 1.0, np.sqrt(var))
    wrong = np.flatnonzero(~np.isclose(scale, expected, rtol=4 * eps, atol=0))
    if wrong.size:
        i = wrong[0]
        raise refuse(f"scaler_scale: feature {i}'s scale {scale[i]:.17g} is not what scikit-learn's StandardScaler "
                     f"computes from scaler_var and scaler_mean ({expected[i]:.17g}: sqrt(var), or 1 for a feature "
                     "constant to round-off)")


def _check_pipeline_predicts(model, dtype, scaler, probe, proba, refuse):
    """The scaler and the classifier may each be sound and the two still not be a pipeline: the inducing points
    ``probe`` mapped back to inputs through the scaler (x = z scale + mean) must be finite, and the pipeline
    there ((x - mean) / scale, as StandardScaler.transform computes it, then the classifier) must predict what
    the classifier predicts at z (``proba``), to ``PIPELINE_ATOL``. A mean of 1e308 fails: 1e308 + z scale is
    1e308, so the pipeline sends every input to one standardised point (and ordinary inputs to ~-1e308, an
    overflow that would be blamed on them)."""
    mean = scaler["mean"] if scaler["with_mean"] else 0.0
    scale = scaler["scale"] if scaler["with_std"] else 1.0
    with np.errstate(all="ignore"):
        inputs = np.asarray(probe, dtype=np.float64) * scale + mean
        standardised = (inputs - mean) / scale
    # (inputs that overflow are refused before the classifier sees them: its own check would blame the input)
    got = _probe(model, dtype, standardised)[2] if np.all(np.isfinite(inputs)) else None
    if got is None or not (np.all(np.isfinite(got)) and np.allclose(got, proba, rtol=0, atol=PIPELINE_ATOL)):
        raise refuse("scaler: the pipeline, at the inducing points mapped back to inputs through the scaler, does "
                     "not predict what the classifier predicts at them (a mean or scale beyond what float64 "
                     "resolves)")


def read_model_parts(path, schema, backend="numpy"):
    """(the parameters, the ``model.FittedState``, the standardisation of the features before the estimator or
    None) of a model file: what ``read_model_file`` reads, and the scaler ``write_model_file`` wrote ({"with_mean",
    "with_std", "n_samples_seen", "steps", and the arrays of ``SCALER_ARRAYS``, None where absent}), checked. The
    feature names are then the scaler's, the pipeline's input (``feature_names``), not the estimator's."""
    path = check_file_argument(path, "load_model")
    refuse = functools.partial(_refuse, path)
    header, arrays = read_archive(path, refuse, functools.partial(_check_declared_sizes, path))
    version = _check_version(header, refuse, FORMAT)
    if header.get("estimator") != schema.name:
        raise refuse(f"estimator: {_shown(header.get('estimator'))}, this agpc loads {schema.name}")
    params = _checked_params(header.get("params", {}), schema, refuse)
    d, feature_names, record = _check_header_fields(header, refuse, version)
    if record["ard"] is None and not isinstance(params["ard"], str):  # a file from before the choice: as fitted
        record["ard"] = bool(params["ard"])
    classes, ordinal, multiclass, (Z, L_C, h) = _checked_model_arrays(header, arrays, d, refuse)
    n_classes = classes.shape[0]
    specs, kernel_table = _kernel_specs(header, n_classes, refuse)
    if version < CATEGORICAL_VERSION and _names_categorical(specs):
        raise refuse(f"kernel: a categorical kernel in a file of format version {version}, written before its "
                     f"lengthscales entered as 1 / l^2 (version {CATEGORICAL_VERSION}): it would predict otherwise "
                     "than it was fitted; fit the model again")
    kernel_arrays = _kernel_arrays(header, arrays, kernel_table, d, refuse)
    scaler = _checked_scaler(header, arrays, d, refuse, version)
    categorical = _checked_categorical(header, arrays, d, refuse)
    _refuse_unexpected(arrays, kernel_arrays, categorical, scaler, refuse)
    likelihood = _checked_likelihood(header, ordinal, multiclass, refuse)
    fitted_with = get_method(params["method"]).likelihood_for(params["likelihood"], n_classes)
    if "likelihood" in header and likelihood != fitted_with:  # (partial_fit would go on with the parameters')
        raise refuse(f"likelihood: {_shown(likelihood)}, but its parameters (method {params['method']!r}, likelihood "
                     f"{_shown(params['likelihood'])}) fit {fitted_with!r}")

    xp = B.resolve_backend(backend)
    # The model computes in the type it was fitted in, which is the type of its stored arrays (files written
    # before ``dtype`` existed hold float64, and load as float64).
    dtype_name = "float32" if Z.dtype == np.float32 else "float64"
    params["dtype"] = dtype_name
    to = lambda a: B.asarray_like(a, xp, dtype=getattr(xp, dtype_name))  # noqa: E731
    try:  # what only the kernel's own checks see (a prior listing another number of entries than features)
        kernel = _kernel_from_file(specs, {name: to(value) for name, value in kernel_arrays.items()}, multiclass)
    except (ValueError, TypeError) as exc:
        raise refuse(f"kernel: {exc}") from None
    _check_kernel_columns(specs, d, refuse)
    Zx, L_C, h = to(Z), to(L_C), to(h)
    jitter = _fitted_jitter(header, params["jitter"], kernel, Zx, multiclass, refuse)
    posterior = _posterior_from_file(kernel, Zx, L_C, h, jitter, n_classes if multiclass else None, refuse)
    state = FittedState(
        kernel=kernel, inducing_points=Zx, posterior=posterior, classes=classes, n_features_in=d,
        # as scikit-learn stores them
        feature_names_in=None if feature_names is None or scaler is not None else np.asarray(feature_names,
                                                                                              dtype=object),
        log_marginal_likelihood=float(header.get("log_marginal_likelihood", float("nan"))),
        n_iter=header.get("n_iter", 0), jitter=float(jitter), likelihood=likelihood,
        history={k: list(v) for k, v in header.get("history", {}).items()}, record=record, categorical=categorical,
    )
    model = _model_of(state, params)
    probe = Z[0] if multiclass else Z
    proba = _check_predicts(model, dtype_name, probe, refuse)
    if scaler is not None:
        _check_pipeline_predicts(model, dtype_name, scaler, probe, proba, refuse)
        scaler["feature_names"] = feature_names
    return params, state, scaler


def _check_kernel_columns(spec, width, refuse):
    """Every column a kernel description selects (a ``Categorical``'s, an ``OnColumns``') is one of the ``width``
    columns it reads: the model's features, or an ``OnColumns``' own selection for the kernel inside it."""
    if isinstance(spec, list):  # (a kernel a class)
        for one in spec:
            _check_kernel_columns(one, width, refuse)
        return
    if not isinstance(spec, dict):
        return
    columns = spec.get("columns")
    if isinstance(columns, list) and columns and max(columns) >= width:
        raise refuse(f"kernel: a {spec.get('type')} kernel reads column {max(columns)} of {width}")
    inner = [spec["kernel"]] if isinstance(spec.get("kernel"), dict) else []
    for part in inner:
        _check_kernel_columns(part, len(columns), refuse)
    for part in (spec.get("terms") or []) + ([spec["latent"]] if isinstance(spec.get("latent"), dict) else []):
        _check_kernel_columns(part, width, refuse)


def _refuse_unexpected(arrays, kernel_arrays, categorical, scaler, refuse):
    """A model file holds only the arrays of its model: the posterior's, the kernel's, the categorical levels and the
    scaler's it declares."""
    unexpected = sorted(set(arrays) - {"inducing_points", "posterior_L_C", "posterior_h", "classes"}
                        - {f"kernel_{name}" for name in kernel_arrays}
                        - {f"{LEVELS_PREFIX}{j}" for j in categorical.levels}
                        - {f"scaler_{name}" for name in SCALER_ARRAYS if scaler is not None
                           and scaler[name] is not None})
    if unexpected:
        raise refuse(f"unexpected arrays {unexpected}")


def _checked_categorical(header, arrays, d, refuse):
    """The file's ``categories.CategoricalColumns``: "categorical_columns" (distinct feature indices, absent in a
    file without them) and, for a column of text, its levels (``categorical_levels_<j>``: sorted distinct text, at
    most ``MAX_LEVELS``), which only a categorical column may have."""
    columns = header.get("categorical_columns", [])
    if not (isinstance(columns, list) and all(_is_int(j) and 0 <= j < d for j in columns)
            and len(set(columns)) == len(columns)):
        raise refuse(f"categorical_columns: {_shown(columns)} is not a list of distinct feature indices below {d}")
    mask = np.zeros(d, dtype=bool)
    mask[columns] = True
    levels = {}
    for name in (name for name in arrays if name.startswith(LEVELS_PREFIX)):
        j = name[len(LEVELS_PREFIX):]
        if not (j.isdigit() and int(j) < d and mask[int(j)] and str(int(j)) == j):
            raise refuse(f"{name}: the levels of a feature that is not one of categorical_columns")
        values = arrays[name]
        if values.ndim != 1 or values.dtype.kind != "U" or values.shape[0] < 1 or not np.all(
                values[1:] > values[:-1]):
            raise refuse(f"{name}: expected the sorted distinct text levels of a column (1-D), got a {values.dtype} "
                         f"array of shape {values.shape}")
        levels[int(j)] = values
    return CategoricalColumns(mask, levels)


def _model_of(state, params):
    """The ``model.FittedModel`` a file's state and parameters describe: what the loaded estimator predicts with
    (``GPClassifier.fitted_model``)."""
    return FittedModel.of(state.kernel, state.likelihood, state.inducing_points, state.posterior, state.classes,
                          params)


def _checked_model_arrays(header, arrays, d, refuse):
    """(classes, ordinal, multiclass, (Z, L_C, h)) of a model file's arrays, checked: the classes, whether the model
    is an ordinal one (its kernel holds cut points) or has a latent function a class, and the inducing points (m x d
    each), q's L_C (m x m, lower triangular with a positive diagonal) and h (m), one set a class for a multiclass
    model."""
    for name in ("inducing_points", "posterior_L_C", "posterior_h", "classes"):
        if name not in arrays:
            raise refuse(f"{name}: missing")
    classes = arrays["classes"]
    _check_classes(classes, refuse)
    ordinal = _ordinal_classes(header.get("kernel")) is not None
    multiclass = classes.shape[0] > 2 and not ordinal
    lead = (classes.shape[0],) if multiclass else ()
    Z = arrays["inducing_points"]
    m = Z.shape[-2] if Z.ndim == len(lead) + 2 and Z.shape[-2] >= 1 else 1
    Z = _float_array(arrays, "inducing_points", lead + (m, d), refuse)
    L_C = _float_array(arrays, "posterior_L_C", lead + (m, m), refuse)
    _check_factor(L_C, refuse)
    return classes, ordinal, multiclass, (Z, L_C, _float_array(arrays, "posterior_h", lead + (m,), refuse))


def _checked_likelihood(header, ordinal, multiclass, refuse):
    """The model file's likelihood, one a model of its kind has (binary: probit, logistic or one registered by
    ``likelihoods.register_likelihood``, looked up by its name: the file holds no code; multiclass: probit or
    robust-max; ordinal: ordinal)."""
    likelihood = header.get("likelihood", "probit")
    kind = "ordinal" if ordinal else "multiclass" if multiclass else "binary"
    if likelihood in {"ordinal": ("ordinal",), "multiclass": ("probit", "robust-max"),
                      "binary": ("probit", "logistic")}[kind]:
        return likelihood
    if kind == "binary" and isinstance(likelihood, str) and registered_likelihood(likelihood) is not None:
        return likelihood
    shown = _shown(likelihood)
    if kind == "binary" and isinstance(likelihood, str) and likelihood not in LIKELIHOODS:
        raise refuse(f"likelihood: {shown} is not a built-in likelihood and none of that name is registered "
                     "(agpc.likelihoods.register_likelihood it before loading the file)")
    raise refuse(f"likelihood: {shown} is not a likelihood of a {kind} model")


def _shown(value):
    """An untrusted value as a refusal shows it (``untrusted.shown``); a container by its type alone."""
    return shown(value) if isinstance(value, (str, int, float, bool, type(None))) else f"a {type(value).__name__}"


def _fitted_jitter(header, parameter, kernel, Z, multiclass, refuse):
    """The jitter K(Z, Z) is factorised with: the one the fit ended with (the guard may have raised it), checked;
    files of format version 1 do not hold it: the jitter parameter, raised to the type's floor as the fit did."""
    jitter = header.get("fitted_jitter")
    if jitter is None:
        return B.starting_jitter(parameter, Z)
    if not (_is_number(jitter) and math.isfinite(jitter) and jitter >= 0):
        raise refuse(f"fitted_jitter: {jitter!r} is not a non-negative number")
    _check_fitted_jitter(jitter, parameter, kernel, Z, multiclass, refuse)
    return jitter


def _posterior_from_file(kernel, Z, L_C, h, jitter, n_classes, refuse):
    """q from a model file's arrays at its kernel and jitter (``n_classes``: a multiclass model's, one q a class;
    None: one q); inducing points at which the kernel gives no covariance matrix are refused."""
    try:
        if n_classes is not None:
            return tuple(Posterior(L_K=prior_cholesky(kernel[c], Z[c, ...], jitter), L_C=L_C[c, ...], h=h[c, ...])
                         for c in range(n_classes))
        return Posterior(L_K=prior_cholesky(kernel, Z, jitter), L_C=L_C, h=h)
    except B.CholeskyError as exc:
        raise _no_covariance(exc, refuse) from None


def _no_covariance(why, refuse):
    """The refusal of a file's inducing points at which its kernel gives no covariance matrix (``why``)."""
    return refuse(f"inducing_points: with the kernel they give no covariance matrix ({why})")


def _check_fitted_jitter(jitter, parameter, kernel, Z, multiclass, refuse):
    """The jitter a fit ends with is its ``jitter`` ``parameter`` (at least the type's floor) plus what the guard
    added, a few steps of at most 1e-5 of K(Z, Z)'s mean diagonal each: never more than the parameter plus
    that diagonal. A larger one replaces the kernel's prior at the inducing points (1e300 makes a model that
    predicts 0.5 everywhere), so no fit wrote it."""
    kernels = [kernel[c] for c in range(Z.shape[0])] if multiclass else [kernel]
    points = [Z[c, ...] for c in range(Z.shape[0])] if multiclass else [Z]
    with np.errstate(all="ignore"):
        scale = max(float(np.mean(np.diagonal(B.to_numpy(k.K(z))))) for k, z in zip(kernels, points))
    if not math.isfinite(scale):  # (inducing points of 1e308 overflow the kernel's arithmetic: not the jitter's fault)
        raise _no_covariance("its variances at them are not finite", refuse)
    most = float(parameter) + B.jitter_floor(Z) + scale
    if not jitter <= most:
        raise refuse(f"fitted_jitter: {jitter:.3g} is more than the jitter parameter ({float(parameter):.3g}) plus "
                     f"the prior variance at the inducing points ({scale:.3g}): no fit raises it so far")


def _check_predicts(model, dtype, probe, refuse):
    """Every field may pass its own check and the whole still not predict (finite values so large that the
    predictive's arithmetic overflows, an L_C scaled by 1e-300 whose variances are infinite yet whose
    probabilities are 0.5): the model must give finite latent means and variances, and finite probabilities
    summing to one, at its own inducing points, taken as inputs (m rows: cheap), or the file is refused.
    Returns the probabilities."""
    mean, var, proba = _probe(model, dtype, probe)
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var >= 0)):
        raise refuse("posterior_h, posterior_L_C: the model they describe has no finite latent mean and variance at "
                     "its own inducing points (values so large or small that its arithmetic overflows)")
    if not (np.all(np.isfinite(proba)) and np.allclose(proba.sum(axis=1), 1.0, atol=1e-4)):
        raise refuse("posterior_h, posterior_L_C: the model they describe does not give probabilities "
                     "(non-finite at its own inducing points)")
    return proba


def _probe(model, dtype, rows):
    """(latent means, latent variances, probabilities) of ``model`` (a ``model.FittedModel`` computing in ``dtype``,
    its name) at ``rows``, in NumPy, computed as the loaded estimator's ``predict_latent`` / ``predict_proba`` compute
    them (``agpc.prediction``)."""
    rows = np.asarray(rows, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (this probe's own warnings, e.g. jitter, are not the user's)
        with np.errstate(all="ignore"):
            checked, in_xp = check_features(rows, dtype, expected=rows.shape[1], owner="the model file's model")
            Xc, _, _ = P.placed_rows(model, checked, in_xp)
            mean, var = (B.to_numpy(values) for values in P.model_latent(model, Xc))
            return mean, var, np.exp(B.to_numpy(P.log_proba_matrix(model, Xc)))
