"""Saving and loading models as data: one ``.npz`` holding arrays and a JSON header, never serialised Python objects.

Loading never executes code: ``numpy.load(..., allow_pickle=False)`` reads only plain arrays (object arrays are refused), and the
header is JSON. A file that is not an agpc model, or whose contents are inconsistent, is refused with a
``ValueError`` that says what is wrong. Saving writes to a temporary file beside the target and renames
it, so a crash never leaves a half-written model where a good one was.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile

import numpy as np

from . import backend as B

FORMAT = "agpc-model"
VERSION = 1
_HEADER = "__agpc_header__"

__all__ = ["save_model", "load_model", "save_checkpoint", "load_checkpoint", "save_site_chunk", "load_site_chunk",
           "FORMAT", "VERSION"]


def _json_params(params):
    """get_params() values that JSON can hold; a kernel is described by the kernel fields instead."""
    out = {}
    for key, value in params.items():
        if key == "kernel":
            continue
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
            out[key] = list(value)
        elif isinstance(value, (np.integer, np.floating)):
            out[key] = value.item()
        # arrays (inducing=array), generators (random_state) and namespaces are not model parameters
        # needed to predict; they are dropped and the loaded estimator gets the defaults
    return out


def save_model(model, path):
    """Write a fitted GPClassifier to ``path`` (the name is kept as given)."""
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(model, "posterior_")
    # A multiclass model has one posterior and one kernel per class: stacked (C, m, m) / (C, m) arrays
    # and kernel parameters named "<class>:<name>".
    posts = model.posterior_ if isinstance(model.posterior_, tuple) else None
    classes = np.asarray(model.classes_)
    if classes.dtype.kind not in "biufU":
        classes = classes.astype(str)
    arrays = {
        "inducing_points": B.to_numpy(model.inducing_points_),
        "posterior_L_C": np.stack([B.to_numpy(p.L_C) for p in posts]) if posts else B.to_numpy(model.posterior_.L_C),
        "posterior_h": np.stack([B.to_numpy(p.h) for p in posts]) if posts else B.to_numpy(model.posterior_.h),
        "classes": classes,
    }
    for name, value in model.kernel_.params.items():
        arrays[f"kernel_{name}"] = B.to_numpy(value)
    kernels = getattr(model.kernel_, "kernels", None)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "estimator": type(model).__name__,
        "params": _json_params(model.get_params(deep=False)),
        "kernel": [k.spec() for k in kernels] if kernels else model.kernel_.spec(),
        "kernel_params": sorted(model.kernel_.params),
        "n_features_in": int(model.n_features_in_),
        "log_marginal_likelihood": float(model.log_marginal_likelihood_),
        "n_iter": int(model.n_iter_),
        "likelihood": model.likelihood_,
        "history": {k: [float(v) for v in values] for k, values in model.history_.items()},
    }
    arrays[_HEADER] = np.asarray(json.dumps(header))
    _atomic_savez(path, arrays)


def _atomic_savez(path, arrays):
    """Write an npz beside ``path`` and rename it over ``path``: a crash leaves the old file untouched."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".agpc-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        # mkstemp creates the file readable by its owner only; a saved model gets the permissions any new
        # file would (0666 less the umask), so that others can load it where the umask allows
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask():
    """The process umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _refuse(path, why):
    return ValueError(f"{path!s} is not a valid agpc model file: {why}")


def load_model(path, backend="numpy"):
    """Read a model written by :func:`save_model`; arrays are placed in ``backend``'s namespace."""
    from .classifier import GPClassifier
    from .inference.ep import Posterior, prior_cholesky
    from .kernels import ClassKernels, kernel_from_spec

    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise _refuse(path, f"cannot be read as an npz archive ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise _refuse(path, "it holds a bare array, not an agpc archive")
    with archive:
        try:
            names = set(archive.files)
            if _HEADER not in names:
                raise _refuse(path, "no agpc header (written by another program?)")
            header = json.loads(str(archive[_HEADER]))
            arrays = {name: archive[name] for name in names if name != _HEADER}
        except ValueError as exc:
            if "not a valid agpc" in str(exc):
                raise
            raise _refuse(path, f"unreadable contents ({exc})") from None
        except (OSError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as exc:
            raise _refuse(path, f"unreadable contents ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _refuse(path, "the header does not name the agpc model format")
    if header.get("version") != VERSION:
        raise _refuse(path, f"format version {header.get('version')!r}; this agpc reads version {VERSION}")
    required = ["inducing_points", "posterior_L_C", "posterior_h", "classes"]
    required += [f"kernel_{name}" for name in header.get("kernel_params", [])]
    missing = [name for name in required if name not in arrays]
    if missing:
        raise _refuse(path, f"missing arrays {missing}")
    Z = arrays["inducing_points"]
    n_classes = arrays["classes"].shape[0] if arrays["classes"].ndim == 1 else -1
    multiclass = n_classes > 2
    lead = (n_classes,) if multiclass else ()
    m = Z.shape[-2] if Z.ndim >= 2 else -1
    d = header.get("n_features_in")
    if (Z.shape != lead + (m, d) or arrays["posterior_L_C"].shape != lead + (m, m)
            or arrays["posterior_h"].shape != lead + (m,)):
        raise _refuse(path, "array shapes are inconsistent with each other")
    if multiclass != isinstance(header.get("kernel"), list) or (multiclass and len(header["kernel"]) != n_classes):
        raise _refuse(path, "the kernel description does not match the number of classes")
    for name in required:
        if name == "classes":
            continue
        values = np.asarray(arrays[name])
        if values.dtype.kind != "f":
            raise _refuse(path, f"array {name} is not floating point")
        bad = np.isnan(values) | np.isposinf(values)
        if not name.endswith("log_noise"):  # log noise may be -inf (no noise); nothing else may
            bad |= np.isneginf(values)
        if np.any(bad):
            raise _refuse(path, f"array {name} holds NaN or inf")
    if n_classes < 2:
        raise _refuse(path, "a classifier needs at least two classes")

    xp = B.resolve_backend(backend)
    params = {k: v for k, v in header.get("params", {}).items() if k in GPClassifier._get_param_names()}
    # The model computes in the type it was fitted in, which is the type of its stored arrays (files written
    # before ``dtype`` existed hold float64, and load as float64).
    dtype_name = "float32" if np.asarray(Z).dtype == np.float32 else "float64"
    params["dtype"] = dtype_name
    to = lambda a: B.asarray_like(a, xp, dtype=getattr(xp, dtype_name))  # noqa: E731
    params_arrays = {name: to(arrays[f"kernel_{name}"]) for name in header["kernel_params"]}
    if multiclass:
        try:
            kernel = ClassKernels(
                kernel_from_spec(spec, {name.split(":", 1)[1]: value for name, value in params_arrays.items()
                                        if name.startswith(f"{c}:")})
                for c, spec in enumerate(header["kernel"])
            )
        except (KeyError, IndexError, TypeError) as exc:
            raise _refuse(path, f"the per-class kernel parameters are incomplete ({exc})") from None
    else:
        kernel = kernel_from_spec(header["kernel"], params_arrays)
    if isinstance(params.get("optimize"), list):
        params["optimize"] = tuple(params["optimize"])
    model = GPClassifier(**params)
    Zx = to(Z)
    model.kernel_ = kernel
    model.inducing_points_ = Zx
    L_C, h = to(arrays["posterior_L_C"]), to(arrays["posterior_h"])
    jitter = max(float(model.jitter), B.jitter_floor(Zx))  # as the fit factorised Kmm (float32: a floor)
    if multiclass:
        model.posterior_ = tuple(
            Posterior(L_K=prior_cholesky(kernel[c], Zx[c, ...], jitter), L_C=L_C[c, ...], h=h[c, ...])
            for c in range(n_classes)
        )
    else:
        model.posterior_ = Posterior(L_K=prior_cholesky(kernel, Zx, jitter), L_C=L_C, h=h)
    model.classes_ = arrays["classes"]
    model.n_features_in_ = int(d)
    model.log_marginal_likelihood_ = float(header.get("log_marginal_likelihood", float("nan")))
    model.n_iter_ = int(header.get("n_iter", 0))
    model.likelihood_ = header.get("likelihood", "probit")
    if model.likelihood_ not in ("probit", "logistic", "robust-max"):
        raise _refuse(path, f"unknown likelihood {model.likelihood_!r}")
    model.history_ = {k: list(v) for k, v in header.get("history", {}).items()}
    return model


# -- training checkpoints: a nested tree of plain values and arrays ------------------------------------

CHECKPOINT_FORMAT = "agpc-checkpoint"


def _encode(value, arrays):
    # NumPy scalars (a float64 is also a Python float) are what 0-d arrays become after NumPy arithmetic:
    # they are stored as 0-d arrays, so that they come back as arrays of the training's namespace.
    if value is None or (isinstance(value, (bool, int, float, str)) and not isinstance(value, np.generic)):
        return value
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("checkpoint dictionaries need string keys")
        return {"dict": {k: _encode(v, arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode(v, arrays) for v in value]}
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # arrays, and NumPy scalars as 0-d arrays
        name = f"array_{len(arrays)}"
        arrays[name] = np.asarray(B.to_numpy(value) if B.is_array_api_obj(value) else value)
        return {"array": name}
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint")


def _decode(node, arrays, convert):
    if not isinstance(node, dict):
        return node
    if "dict" in node:
        return {k: _decode(v, arrays, convert) for k, v in node["dict"].items()}
    if "list" in node:
        return [_decode(v, arrays, convert) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, arrays, convert) for v in node["tuple"])
    if "array" in node:
        return convert(arrays[node["array"]])
    raise ValueError("unknown node")


def save_checkpoint(path, state):
    """Write a training state (nested dicts / lists / tuples of numbers, strings and arrays) atomically."""
    arrays = {}
    tree = _encode(state, arrays)
    arrays[_HEADER] = np.asarray(json.dumps({"format": CHECKPOINT_FORMAT, "version": VERSION, "state": tree}))
    _atomic_savez(path, arrays)


def load_checkpoint(path, convert):
    """Read a checkpoint written by ``save_checkpoint``; ``convert`` turns each stored NumPy array into the
    training's array type. A truncated or foreign file is refused with a ValueError."""
    def refuse(why):
        return ValueError(f"{os.fspath(path)} is not a valid agpc checkpoint: {why}")

    try:
        with np.load(path, allow_pickle=False) as archive:
            header = json.loads(str(archive[_HEADER]))
            arrays = {name: archive[name] for name in archive.files if name != _HEADER}
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as exc:
        raise refuse(f"cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise refuse("the header does not name the agpc checkpoint format")
    if header.get("version") != VERSION:
        raise refuse(f"format version {header.get('version')!r}; this agpc reads version {VERSION}")
    try:
        return _decode(header["state"], arrays, convert)
    except (KeyError, ValueError, TypeError) as exc:
        raise refuse(f"inconsistent contents ({exc})") from None


# -- EP sites of a fit on a dask array: one file a chunk, written and read by the workers ---------------

def save_site_chunk(path, site_precision, site_shift):
    """One chunk's EP sites (run on the worker that holds them; atomic like every file written here)."""
    _atomic_savez(path, {"site_precision": np.asarray(site_precision), "site_shift": np.asarray(site_shift)})
    return int(np.asarray(site_precision).shape[0])


def load_site_chunk(path, rows):
    """(site_precision, site_shift) of one chunk, checked to hold ``rows`` sites."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            nu, mu = archive["site_precision"], archive["site_shift"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{os.fspath(path)} is not a valid agpc site file: {type(exc).__name__}: {exc}") from None
    if nu.shape != (rows,) or mu.shape != (rows,):
        raise ValueError(f"{os.fspath(path)} holds {nu.shape[0]} sites; the chunk has {rows} rows")
    return nu, mu
