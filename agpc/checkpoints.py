"""Checkpoint files, and the atomic, fsync'd writes and the checked reads that every agpc file goes through.

Below training (``agpc.inference.training`` writes and reads checkpoints here; the dask and data-parallel
engines write their per-chunk EP site files here), so it imports nothing of agpc but ``backend`` and
``untrusted``. The model file format (``agpc.model_file``) is written and read with the same two helpers.

An agpc file is an ``.npz``: arrays, plus one JSON string under ``HEADER_KEY`` saying what the file is. Writing
(``atomic_savez``) goes to a temporary file beside the target, flushed to disk and renamed over it, so a crash
never leaves a half-written file where a good one was. Reading (``read_archive``) never executes code and
never trusts what it reads: every member's npy header is checked before any data are read
(``untrusted.read_npz``: no object arrays, no declared size beyond the bytes held), and the JSON header is
read first, within ``MAX_HEADER_BYTES``.

A checkpoint holds a nested tree of plain values and arrays (the training loop's state); its format carries
a version, and a file of another version is refused naming both. A failure is one ``ValueError`` naming the
file and the field.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile

import numpy as np

from . import backend as B
from .untrusted import RefusedFile, describe, read_npz

# the name of the npz member holding a file's JSON header (what the file is, and everything not an array)
HEADER_KEY = "__agpc_header__"

__all__ = ["HEADER_KEY", "MAX_HEADER_BYTES", "atomic_savez", "sync_directory", "process_umask", "read_archive",
           "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "save_checkpoint", "load_checkpoint", "check_checkpoint_path",
           "save_site_chunk", "load_site_chunk", "site_step_directory", "release_older_steps"]


# -- atomic writes -----------------------------------------------------------------------------------

def atomic_savez(path, arrays):
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
        os.chmod(tmp, 0o666 & ~process_umask())
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


def process_umask():
    """The process umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


# -- checked reads -----------------------------------------------------------------------------------

# The JSON header of a model or a checkpoint: its estimator parameters, kernel description and fit history (a
# few numbers an iteration) take kilobytes; 64 MiB of text (NumPy stores it 4 bytes a character) is no header
MAX_HEADER_BYTES = 1 << 26


def read_archive(path, refuse, check_declared=None):
    """(header dict, {name: array}) of an archive written here: every member's npy header is checked before
    anything is read (untrusted.read_npz: no object arrays, no declared size beyond the bytes held); the JSON
    header is read first, within MAX_HEADER_BYTES, then ``check_declared(header, {name: (shape, dtype)})``
    may refuse (as a RefusedFile) members that the header's schema does not allow, before they are inflated."""
    def check_header(declared):
        if HEADER_KEY not in declared:
            raise RefusedFile(path, "no agpc header (written by another program?)")
        shape, dtype = declared[HEADER_KEY]
        if shape != () or dtype.kind != "U":
            raise RefusedFile(path, f"header: a {dtype} array of shape {shape}, not a JSON string")
        if dtype.itemsize > MAX_HEADER_BYTES:
            raise RefusedFile(path, f"member {HEADER_KEY + '.npy'!r} declares a header of {dtype.itemsize:,} bytes; a "
                                    f"header takes {MAX_HEADER_BYTES:,} at most")

    try:
        text = read_npz(path, names=[HEADER_KEY], check=check_header)[HEADER_KEY]
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
    arrays.pop(HEADER_KEY)
    return header, arrays


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
    arrays[HEADER_KEY] = np.asarray(json.dumps({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
                                                "state": tree}))
    atomic_savez(path, arrays)


def load_checkpoint(path, convert):
    """Read a checkpoint written by ``save_checkpoint``; ``convert`` turns each stored NumPy array into the
    training's array type. The file is read as a model file is (``untrusted.read_npz``: headers first, no
    object arrays) and its tree checked node by node; what the state must hold is checked by the training
    loop (``training._restore``). A truncated, foreign or inconsistent file is one ValueError naming the
    file and the field."""
    def refuse(why):
        return ValueError(f"{describe(path)} is not a valid agpc checkpoint: {why}")

    header, arrays = read_archive(path, refuse)
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
    atomic_savez(path, {"site_precision": np.asarray(site_precision), "site_shift": np.asarray(site_shift)})
    return int(np.asarray(site_precision).shape[0])


def load_site_chunk(path, rows, columns=None):
    """(site_precision, site_shift) of one chunk, checked to hold ``rows`` finite sites, ``columns`` a row
    when given (multiclass EP: 2C), else one (read as every file here is: ``untrusted.read_npz``)."""
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
        shape = (rows,) if columns is None else (rows, columns)
        if values.dtype.kind != "f" or values.shape != shape:
            raise refuse(f"{name}: {values.dtype} of shape {values.shape}; the chunk's sites have shape {shape}")
        if not np.all(np.isfinite(values)):
            raise refuse(f"{name}: holds NaN or inf")
    return arrays["site_precision"], arrays["site_shift"]


def site_step_directory(path, step):
    """Where the site files of the checkpoint ``path`` written at ``step`` go: ``<path>.sites/step-<step>/``
    (made if missing). The workers write there, so it must be on a filesystem they share with the driver."""
    directory = os.path.join(os.path.abspath(os.fspath(path)) + ".sites", f"step-{int(step)}")
    os.makedirs(directory, exist_ok=True)
    return directory


def release_older_steps(directory):
    """Remove the site files of earlier checkpoints: every ``step-*`` beside ``directory`` but itself (once the
    checkpoint naming ``directory`` is in place)."""
    parent = os.path.dirname(directory)
    for name in os.listdir(parent):
        if name.startswith("step-") and os.path.join(parent, name) != directory:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
