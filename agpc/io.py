"""Saving and loading models as data: one ``.npz`` holding arrays and a JSON header, never serialised Python objects.

Loading never executes code and never trusts what it reads: every member's npy header is checked before any data
are read (``untrusted.read_npz``: no object arrays, no declared size beyond the bytes held, nor beyond what the
header and the schema allow: a zip bomb is refused before it is inflated), the header is JSON, and every field is
checked against the format's schema (types, shapes, finiteness, a lower triangular L_C with a positive diagonal,
unique classes, known kernels, the estimator's own parameters). A file that fails is one ``ValueError`` naming
the file and the field. A model file carries a format version: every earlier version keeps loading
(tests/data/model_v1), a newer one is refused naming both. Parameters that name where training writes
(``NOT_RESTORED``) are never restored from a file. Saving writes to a temporary file beside the target, flushes
it to disk and renames it, so a crash never leaves a half-written model where a good one was.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import tempfile
import warnings
import zipfile

import numpy as np

from . import backend as B
from .kernels import PER_DIMENSION, spec_parameter_table
from .untrusted import RefusedFile, describe, read_npz

FORMAT = "agpc-model"
# 1: the first format. 2: adds "feature_names_in" (the columns a DataFrame had at fit). A file of a version
# above VERSION is refused, naming both; every earlier version keeps loading (tests/data/model_v1).
VERSION = 2
_HEADER = "__agpc_header__"

__all__ = ["save_model", "load_model", "save_checkpoint", "load_checkpoint", "check_checkpoint_path",
           "sync_directory", "save_site_chunk", "load_site_chunk", "FORMAT", "VERSION", "CHECKPOINT_VERSION",
           "NOT_RESTORED"]


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
    """Write a fitted GPClassifier to ``path`` (the name is kept as given) or to a binary file object."""
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
        "feature_names_in": ([str(v) for v in model.feature_names_in_] if hasattr(model, "feature_names_in_")
                             else None),
        "log_marginal_likelihood": float(model.log_marginal_likelihood_),
        "n_iter": int(model.n_iter_),
        "fitted_jitter": float(getattr(model, "jitter_", model.jitter)),
        "likelihood": model.likelihood_,
        "history": {k: [float(v) for v in values] for k, values in model.history_.items()},
    }
    arrays[_HEADER] = np.asarray(json.dumps(header))
    _atomic_savez(path, arrays)


def _atomic_savez(path, arrays):
    """Write an npz beside ``path`` and rename it over ``path``: a crash leaves the old file untouched. A
    binary file object (``load`` reads them, as numpy.load does) is written in place: it has no name to
    rename over; its owner decides what a half-written file means."""
    if hasattr(path, "write"):
        if isinstance(path, io.TextIOBase):
            raise ValueError(f"cannot save to {describe(path)}: it is open in text mode; a model file is binary "
                             "(open it with mode 'wb')")
        np.savez(path, **arrays)
        return
    path = os.fspath(path)
    if os.path.isdir(path):  # before the temporary file: it would be created beside the directory
        raise ValueError(f"cannot save to {path}: it is a directory; name a file in it")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".agpc-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            # on disk before the rename: otherwise a power cut can leave the new name on empty blocks
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates the file readable by its owner only; a saved model gets the permissions any new
        # file would (0666 less the umask), so that others can load it where the umask allows
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    sync_directory(directory)


def sync_directory(directory):
    """Make the rename itself durable, where the OS lets a directory be opened and synced (not Windows)."""
    flags = getattr(os, "O_DIRECTORY", None)
    if flags is None:
        return
    try:
        fd = os.open(directory, os.O_RDONLY | flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (network, FUSE) refuse fsync on a directory: the rename stands
        pass
    finally:
        os.close(fd)


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
    return ValueError(f"{describe(path)} is not a valid agpc model file: {why}")


# The JSON header of a model or a checkpoint: its estimator parameters, kernel description and fit history (a
# few numbers an iteration) take kilobytes; 64 MiB of text (NumPy stores it 4 bytes a character) is no header
MAX_HEADER_BYTES = 1 << 26
# a class label is a number or a short name: a longer string in a model file is a way to take memory
MAX_LABEL_BYTES = 4096


def _read_archive(path, refuse, check_declared=None):
    """(header dict, {name: array}) of an archive written here: every member's npy header is checked before
    anything is read (untrusted.read_npz: no object arrays, no declared size beyond the bytes held); the JSON
    header is read first, within MAX_HEADER_BYTES, then ``check_declared(header, {name: (shape, dtype)})``
    may refuse (as a RefusedFile) members that the header's schema does not allow, before they are inflated."""
    def check_header(declared):
        if _HEADER not in declared:
            raise RefusedFile(path, "no agpc header (written by another program?)")
        shape, dtype = declared[_HEADER]
        if shape != () or dtype.kind != "U":
            raise RefusedFile(path, f"header: a {dtype} array of shape {shape}, not a JSON string")
        if dtype.itemsize > MAX_HEADER_BYTES:
            raise RefusedFile(path, f"member {_HEADER + '.npy'!r} declares a header of {dtype.itemsize:,} bytes; a "
                                    f"header takes {MAX_HEADER_BYTES:,} at most")

    try:
        text = read_npz(path, names=[_HEADER], check=check_header)[_HEADER]
        try:
            header = json.loads(str(text))
        # ValueError: also an integer of more digits than Python converts (4300); RecursionError: deep nesting
        except (ValueError, RecursionError) as exc:
            raise refuse(f"header: not JSON agpc reads ({type(exc).__name__})") from None
        checked = None if check_declared is None else (lambda declared: check_declared(header, declared))
        arrays = read_npz(path, check=checked)
    except RefusedFile as exc:
        raise refuse(exc.reason) from None
    except IsADirectoryError:
        raise refuse("it is a directory") from None
    arrays.pop(_HEADER)
    return header, arrays


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


# Parameters that name where training writes: a file never chooses them (loaded as None, the defaults). A
# model that re-fits after loading, or its clone, writes where its user says, not where the file said.
NOT_RESTORED = ("checkpoint_path", "checkpoint_every", "site_directory", "client")
# Gauss-Hermite nodes for SVI's binary logistic predictions (20 by default): more than this from a file is
# a way to make prediction take gigabytes, not a model
MAX_QUADRATURE = 1000


def _checked_params(stored, refuse):
    """The estimator parameters of a model file: the estimator's own (unknown names, e.g. from an older agpc
    that had a parameter this one has not, are dropped: they cannot matter to this agpc), plain JSON values,
    no paths; then checked by the estimator's own validation."""
    from .classifier import GPClassifier

    if not isinstance(stored, dict):
        raise refuse("params: not a mapping of parameter names to values")
    known = GPClassifier().get_params(deep=False)
    params = {}
    for name, value in stored.items():
        if name not in known or name in NOT_RESTORED or name == "kernel":
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = tuple(value)  # optimize=("kernel", ...): JSON has lists only
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            raise refuse(f"params.{name}: a {type(value).__name__}, not a plain value")
        params[name] = value
    model = GPClassifier(**params)
    try:
        # the backend named at training (e.g. cupy) need not exist where the model is loaded: load_model's
        # ``backend`` places the arrays; every other parameter is checked as fit checks it
        GPClassifier(**dict(params, backend="numpy"))._check_params()
    except (ValueError, TypeError) as exc:  # TypeError: a value of a type the check did not foresee
        raise refuse(f"params: {exc}") from None
    if not (isinstance(model.jitter, (int, float)) and math.isfinite(model.jitter) and model.jitter >= 0):
        raise refuse(f"params.jitter: {model.jitter!r} is not a non-negative number")
    if model.n_quadrature > MAX_QUADRATURE:  # prediction builds an n_quadrature^2 matrix for its nodes
        raise refuse(f"params.n_quadrature: {model.n_quadrature} nodes, a model file may ask for {MAX_QUADRATURE} "
                     "at most")
    return model


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
    """L_C = chol(I + A diag(nu) A^T) (seed 000 eq. 35's factor): lower triangular with a positive diagonal."""
    if np.any(np.triu(L_C, k=1) != 0):
        raise refuse("posterior_L_C: not lower triangular")
    if np.any(np.diagonal(L_C, axis1=-2, axis2=-1) <= 0):
        raise refuse("posterior_L_C: a diagonal entry is not positive (not a Cholesky factor)")


def _check_classes(classes, refuse):
    if classes.ndim != 1 or classes.dtype.kind not in "biufU":
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
    if not _is_int(header.get("n_iter", 0)) or header.get("n_iter", 0) < 0:
        raise refuse(f"n_iter: {header.get('n_iter')!r} is not a non-negative integer")
    if not _is_number(header.get("log_marginal_likelihood", float("nan"))):
        raise refuse("log_marginal_likelihood: not a number")
    history = header.get("history", {})
    if not isinstance(history, dict) or not all(
        isinstance(values, list) and all(_is_number(v) for v in values) for values in history.values()
    ):
        raise refuse("history: not a mapping of names to lists of numbers")
    names = header.get("feature_names_in") if version >= 2 else None
    if names is not None and not (isinstance(names, list) and len(names) == d and all(isinstance(v, str) for v in names)
                                  and len(set(names)) == d):
        raise refuse(f"feature_names_in: expected {d} distinct column names")
    return d, names


def _kernel_specs(header, n_classes, refuse):
    """The kernel description: one kernel spec (binary) or one per class (multiclass), naming only kernels and
    prior families of agpc's fixed tables (``kernels.spec_parameter_table`` checks them); returns the
    {name: Parameter} table of the parameters the file must hold."""
    specs = header.get("kernel")
    multiclass = n_classes > 2
    if multiclass != isinstance(specs, list) or (multiclass and len(specs) != n_classes):
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
        else:
            shape = ()
        params[name] = _float_array(arrays, key, shape, refuse, allow_neg_inf=table[name].may_be_zero)
    return params


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
    n_classes = len(specs) if isinstance(specs, list) else 2
    lead = (n_classes,) if n_classes > 2 else ()
    h_shape = declared["posterior_h"][0]
    if len(h_shape) != len(lead) + 1 or h_shape[:-1] != lead:
        raise RefusedFile(path, f"posterior_h: shape {h_shape}, expected {lead + (-1,)} (-1: the inducing points) for "
                                f"{n_classes} classes")
    m = h_shape[-1]
    allowed = {"posterior_h": lead + (m,), "classes": (n_classes,), "inducing_points": lead + (m, d),
               "posterior_L_C": lead + (m, m)}
    for name, (shape, dtype) in declared.items():
        if name == _HEADER:
            continue
        if name not in allowed and not name.startswith("kernel_"):
            raise RefusedFile(path, f"unexpected arrays {[name]}")
        most = math.prod(allowed.get(name, (d,)))
        if math.prod(shape) > most:
            raise RefusedFile(path, f"member {name + '.npy'!r} declares shape {shape} of {dtype}, more than the "
                                    f"{most:,} values the model's header and posterior_h allow")
        if name == "classes" and dtype.itemsize > MAX_LABEL_BYTES:
            raise RefusedFile(path, f"member 'classes.npy' declares labels of {dtype.itemsize:,} bytes each ({dtype}); "
                                    f"a label takes {MAX_LABEL_BYTES:,} at most")


def load_model(path, backend="numpy"):
    """Read a model written by :func:`save_model` (format version 1 or later up to ``VERSION``); arrays are
    placed in ``backend``'s namespace. Everything read is checked against the format's schema first; a file
    that does not satisfy it is one ``ValueError`` naming the file and the field."""
    from .classifier import GPClassifier
    from .inference.ep import Posterior, prior_cholesky
    from .kernels import ClassKernels, kernel_from_spec

    refuse = lambda why: _refuse(path, why)  # noqa: E731
    header, arrays = _read_archive(path, refuse, functools.partial(_check_declared_sizes, path))
    version = _check_version(header, refuse, FORMAT)
    if header.get("estimator") != GPClassifier.__name__:
        raise refuse(f"estimator: {header.get('estimator')!r}, this agpc loads {GPClassifier.__name__}")
    model = _checked_params(header.get("params", {}), refuse)
    d, feature_names = _check_header_fields(header, refuse, version)
    for name in ("inducing_points", "posterior_L_C", "posterior_h", "classes"):
        if name not in arrays:
            raise refuse(f"{name}: missing")
    classes = arrays["classes"]
    _check_classes(classes, refuse)
    n_classes = classes.shape[0]
    multiclass = n_classes > 2
    lead = (n_classes,) if multiclass else ()
    Z = arrays["inducing_points"]
    m = Z.shape[-2] if Z.ndim == len(lead) + 2 and Z.shape[-2] >= 1 else 1
    Z = _float_array(arrays, "inducing_points", lead + (m, d), refuse)
    L_C = _float_array(arrays, "posterior_L_C", lead + (m, m), refuse)
    _check_factor(L_C, refuse)
    h = _float_array(arrays, "posterior_h", lead + (m,), refuse)
    specs, kernel_table = _kernel_specs(header, n_classes, refuse)
    kernel_arrays = _kernel_arrays(header, arrays, kernel_table, d, refuse)
    unexpected = sorted(set(arrays) - {"inducing_points", "posterior_L_C", "posterior_h", "classes"}
                        - {f"kernel_{name}" for name in kernel_arrays})
    if unexpected:
        raise refuse(f"unexpected arrays {unexpected}")
    likelihood = header.get("likelihood", "probit")
    if likelihood not in (("probit", "robust-max") if multiclass else ("probit", "logistic")):
        raise refuse(f"likelihood: {likelihood!r} is not a likelihood of a {'multiclass' if multiclass else 'binary'} "
                     "model")

    xp = B.resolve_backend(backend)
    # The model computes in the type it was fitted in, which is the type of its stored arrays (files written
    # before ``dtype`` existed hold float64, and load as float64).
    dtype_name = "float32" if Z.dtype == np.float32 else "float64"
    model.set_params(dtype=dtype_name)
    to = lambda a: B.asarray_like(a, xp, dtype=getattr(xp, dtype_name))  # noqa: E731
    params = {name: to(value) for name, value in kernel_arrays.items()}
    if multiclass:
        kernel = ClassKernels(
            kernel_from_spec(spec, {name.split(":", 1)[1]: value for name, value in params.items()
                                    if name.startswith(f"{c}:")})
            for c, spec in enumerate(specs)
        )
    else:
        kernel = kernel_from_spec(specs, params)
    Zx, L_C, h = to(Z), to(L_C), to(h)
    # K(Z, Z) is factorised with the jitter the fit ended with (the guard may have raised it; files of format
    # version 1 do not hold it: the jitter parameter, raised to the type's floor as the fit did)
    jitter = header.get("fitted_jitter")
    if jitter is None:
        jitter = max(float(model.jitter), B.jitter_floor(Zx))
    elif not (_is_number(jitter) and math.isfinite(jitter) and jitter >= 0):
        raise refuse(f"fitted_jitter: {jitter!r} is not a non-negative number")
    try:
        if multiclass:
            posterior = tuple(
                Posterior(L_K=prior_cholesky(kernel[c], Zx[c, ...], jitter), L_C=L_C[c, ...],
                          h=h[c, ...])
                for c in range(n_classes)
            )
        else:
            posterior = Posterior(L_K=prior_cholesky(kernel, Zx, jitter), L_C=L_C, h=h)
    except B.CholeskyError as exc:
        raise refuse(f"inducing_points: with the kernel they give no covariance matrix ({exc})") from None
    model.kernel_ = kernel
    model.inducing_points_ = Zx
    model.posterior_ = posterior
    model.classes_ = classes
    model.n_features_in_ = d
    model.jitter_ = float(jitter)
    if feature_names is not None:
        model.feature_names_in_ = np.asarray(feature_names, dtype=object)  # as scikit-learn stores them
    model.log_marginal_likelihood_ = float(header.get("log_marginal_likelihood", float("nan")))
    model.n_iter_ = header.get("n_iter", 0)
    model.likelihood_ = likelihood
    model.history_ = {k: list(v) for k, v in header.get("history", {}).items()}
    _check_predicts(model, Z[0] if multiclass else Z, refuse)
    return model


def _check_predicts(model, probe, refuse):
    """Every field may pass its own check and the whole still not predict (finite values so large that the
    predictive's arithmetic overflows): the model must give finite probabilities summing to one at its own
    inducing points, taken as inputs (m rows: cheap), or the file is refused."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (this probe's own warnings, e.g. feature names, are not the user's)
        with np.errstate(all="ignore"):
            proba = B.to_numpy(model.predict_proba(np.asarray(probe, dtype=np.float64)))
    if not (np.all(np.isfinite(proba)) and np.allclose(proba.sum(axis=1), 1.0, atol=1e-4)):
        raise refuse("posterior_h, posterior_L_C: the model they describe does not give probabilities "
                     "(non-finite at its own inducing points)")


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


def _decode(node, arrays, convert, where="state"):
    """The tree ``_encode`` wrote, checked as it is rebuilt: every node one of the shapes ``_encode`` writes,
    every array named exists; a failure is a ValueError naming the node (``where``)."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"{where}: not a node of a checkpoint tree")
    (kind, value), = node.items()
    if kind == "dict" and isinstance(value, dict):
        return {k: _decode(v, arrays, convert, f"{where}.{k}") for k, v in value.items()}
    if kind in ("list", "tuple") and isinstance(value, list):
        items = [_decode(v, arrays, convert, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if kind == "list" else tuple(items)
    if kind == "array" and isinstance(value, str) and value in arrays:
        values = arrays[value]
        if values.dtype.kind == "f" and bool(np.any(np.isnan(values))):
            raise ValueError(f"{where}: holds NaN (a checkpoint is written from an accepted step only)")
        return convert(values)
    raise ValueError(f"{where}: not a node of a checkpoint tree ({kind!r})")


# 1: the first checkpoints. 2: the run's fingerprint holds a hash of the training data (``training``).
CHECKPOINT_VERSION = 2


def save_checkpoint(path, state):
    """Write a training state (nested dicts / lists / tuples of numbers, strings and arrays) atomically."""
    arrays = {}
    tree = _encode(state, arrays)
    arrays[_HEADER] = np.asarray(json.dumps({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                                             "state": tree}))
    _atomic_savez(path, arrays)


def load_checkpoint(path, convert):
    """Read a checkpoint written by ``save_checkpoint``; ``convert`` turns each stored NumPy array into the
    training's array type. The file is read as a model file is (``untrusted.read_npz``: headers first, no
    object arrays) and its tree checked node by node; what the state must hold is checked by the training
    loop (``training._restore``). A truncated, foreign or inconsistent file is one ValueError naming the
    file and the field."""
    def refuse(why):
        return ValueError(f"{describe(path)} is not a valid agpc checkpoint: {why}")

    header, arrays = _read_archive(path, refuse)
    if isinstance(header, dict) and header.get("format") == CHECKPOINT_FORMAT and header.get("version") == 1:
        raise refuse("version: written by an older agpc (checkpoint version 1, without a fingerprint of the data); "
                     f"this agpc resumes from version {CHECKPOINT_VERSION}: start the fit again")
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise refuse(f"format: the header does not name the {CHECKPOINT_FORMAT} format")
    version = header.get("version")
    if version != CHECKPOINT_VERSION:
        raise refuse(f"version: the file has checkpoint version {version!r}; this agpc reads version "
                     f"{CHECKPOINT_VERSION}")
    try:
        state = _decode(header.get("state"), arrays, convert)
    except RecursionError:
        raise refuse("state: nested too deeply") from None
    except ValueError as exc:
        raise refuse(str(exc)) from None
    if not isinstance(state, dict):
        raise refuse("state: not a mapping")
    return state


def check_checkpoint_path(path):
    """Fail before any training if a checkpoint cannot be written at ``path``: a directory, no such
    directory, or a directory this process cannot write to (a file is created there and removed)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"checkpoint_path {path} is a directory: name a file in it")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"checkpoint_path {path}: no directory {directory} to write it in")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ValueError(f"checkpoint_path {path}: cannot write in {directory} ({exc.strerror})") from None


# -- EP sites of a fit on a dask array: one file a chunk, written and read by the workers ---------------

def save_site_chunk(path, site_precision, site_shift):
    """One chunk's EP sites (run on the worker that holds them; atomic like every file written here)."""
    _atomic_savez(path, {"site_precision": np.asarray(site_precision), "site_shift": np.asarray(site_shift)})
    return int(np.asarray(site_precision).shape[0])


def load_site_chunk(path, rows):
    """(site_precision, site_shift) of one chunk, checked to hold ``rows`` finite sites (read as every file
    here is: ``untrusted.read_npz``)."""
    def refuse(why):
        return ValueError(f"{os.fspath(path)} is not a valid agpc site file: {why}")

    try:
        arrays = read_npz(path)
    except RefusedFile as exc:
        raise refuse(exc.reason) from None
    except OSError as exc:
        raise refuse(f"{type(exc).__name__}: {exc}") from None
    for name in ("site_precision", "site_shift"):
        values = arrays.get(name)
        if values is None:
            raise refuse(f"{name}: missing")
        if values.dtype.kind != "f" or values.shape != (rows,):
            raise refuse(f"{name}: {values.dtype} of shape {values.shape}; the chunk has {rows} rows")
        if not np.all(np.isfinite(values)):
            raise refuse(f"{name}: holds NaN or inf")
    return arrays["site_precision"], arrays["site_shift"]
