"""Checkpoint files, and the atomic, fsync'd writes and the checked reads that every agpc file goes through.

Below training (``agpc.inference.training`` writes and reads checkpoints here; the dask and data-parallel
engines write their per-chunk EP site files here), so it imports nothing of agpc but ``backend`` and
``untrusted``. The model file format (``agpc.model_file``) is written and read with the same two helpers.

An agpc file is an ``.npz``: arrays, plus one JSON string under ``HEADER_KEY`` saying what the file is. Every
file agpc writes (model files, checkpoints, site files, the command line's outputs) goes through
``atomic_write``: to a temporary file beside the target, flushed to disk and renamed over it, so a crash never
leaves a half-written file where a good one was; and only to a regular file (``check_output_path``: an existing
target that is a device, a FIFO or a path under /proc, /sys or /dev is refused, never replaced). Reading
(``read_archive``) never executes code and never trusts what it reads: every member's npy header is checked
before any data are read (``untrusted.read_npz``: no object arrays, no declared size beyond the bytes held, nor
beyond ``MAX_EXPANSION`` times the file's size: agpc writes its files uncompressed), and the JSON header is read
first, within ``MAX_HEADER_BYTES``.

A checkpoint holds a nested tree of plain values and arrays (the training loop's state); its format carries
a version, and a file of another version is refused naming both. A failure is one ``ValueError`` naming the
file and the field.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import socket
import stat
import sys

import numpy as np

from . import backend as B
from .untrusted import RefusedFile, describe, printable, read_npz

try:
    import fcntl
except ImportError:  # (not on Windows: no inode flags to read there)
    fcntl = None

# the name of the npz member holding a file's JSON header (what the file is, and everything not an array)
HEADER_KEY = "__agpc_header__"

__all__ = ["HEADER_KEY", "MAX_HEADER_BYTES", "MAX_EXPANSION", "UNCHECKED_BYTES", "atomic_write", "atomic_savez",
           "check_output_path", "check_writable", "sync_directory", "process_umask", "read_archive",
           "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "save_checkpoint", "load_checkpoint", "check_checkpoint_path",
           "check_resume_path", "check_site_directory", "save_site_chunk", "load_site_chunk", "site_step_directory",
           "release_older_steps"]


# -- writes: only to regular files, atomically -------------------------------------------------------

# Where no output of agpc belongs: the kernel's files (/proc, /sys) and device nodes (/dev). A path there is
# refused whether or not it exists, and whether it is named or reached through a symbolic link.
_SYSTEM_DIRECTORIES = ("/proc", "/sys", "/dev")
# A temporary file is named after its target (a hash: the name stays short whatever the target's) and its
# writer (host and process): ".agpc-<target>-<host>-<pid>-<n>.tmp". It is removed on every exit Python sees.
# One left by a writer that was killed (SIGKILL, a power cut) is removed by the next process that writes in
# that directory on the same host, at its first write there, once the writer's process is gone: repeated kills
# do not pile them up, and a directory of many files (a fit's site files) is listed once a process, not once a
# file. A live writer's file, or another host's (a shared file system), is never touched.
_TEMPORARY = re.compile(r"\.agpc-[0-9a-f]{10}-([0-9a-f]{4})-(\d+)-\d+\.tmp\Z")
_temporary_numbers = itertools.count()
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:4]
_cleaned_directories = set()  # where this process has removed the temporary files of killed writers


def _system_directory_of(path):
    """The system directory (``_SYSTEM_DIRECTORIES``) ``path`` is in, or None. /dev/shm is not one: it is a
    file system of regular files in memory, where outputs are written on purpose."""
    if path == "/dev/shm" or path.startswith("/dev/shm/"):
        return None
    return next((root for root in _SYSTEM_DIRECTORIES if path == root or path.startswith(root + "/")), None)


def _kind_of_file(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _outside_system_directories(text, what):
    """The real path of ``text``, refused (ValueError) when it, or any link on the way to it, is under one of
    ``_SYSTEM_DIRECTORIES``."""
    hop = os.path.abspath(text)
    for _ in range(40):  # the kernel's own limit of links followed in one lookup
        if _system_directory_of(hop):
            raise ValueError(f"{what}: {hop} is under {_system_directory_of(hop)}; agpc writes only regular files")
        if not os.path.islink(hop):
            break
        hop = os.path.abspath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
    target = os.path.realpath(text)
    if _system_directory_of(target):
        raise ValueError(f"{what}: it leads to {target}, under {_system_directory_of(target)}; agpc writes only "
                         "regular files")
    return target


def check_output_path(path, what=None, inputs=()):
    """The file an output named ``path`` is written to, checked before anything is written: agpc writes only
    regular files, so an existing target must be a regular file or a symbolic link to one (which is
    followed: the link stays, its target is replaced); device nodes, FIFOs, sockets, directories and any path
    under /proc, /sys or /dev (named, or reached through a link) are refused, as is one of ``inputs`` (the
    command's input files, the training data: the output would replace them). ``what`` names the output in
    the message (default "cannot write <path>"). One ValueError."""
    text = os.fspath(path)
    what = what or f"cannot write {text}"
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text:
        raise ValueError(f"{what}: an empty path names no file")
    if "\0" in text:  # (the system's own words were "embedded null byte")
        raise ValueError(f"{printable(what)}: a path holds no NUL character (\\x00)")
    if text.endswith(tuple({"/", os.sep})) and not os.path.isdir(text):  # (a directory is refused below, by name)
        raise ValueError(f"{what}: it ends with {text[-1]!r}, a directory's name, and no such directory exists; name "
                         "a file")
    target = _outside_system_directories(text, what)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # e.g. a loop of links, a path through a regular file
        raise ValueError(f"{what}: {exc.strerror}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ValueError(f"{what}: it is a directory; name a file in it")
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"{what}: it is {_kind_of_file(mode)}; agpc writes only regular files")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise ValueError(f"{what}: no directory {directory} to write it in")
    for given in inputs:
        given = os.fspath(given)
        if os.path.realpath(given) == target or (
            mode is not None and os.path.exists(given) and os.path.samefile(given, target)  # hard links too
        ):
            raise ValueError(f"{what}: it is the input file {given}, which the output would replace; write "
                             "elsewhere")
        if os.path.isdir(given) and target.startswith(os.path.join(os.path.realpath(given), "")):
            raise ValueError(f"{what}: it is inside the input {given} (a zarr store?); write elsewhere")
    return target


def _temporary_path(target):
    name = hashlib.sha256(os.path.basename(target).encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return os.path.join(os.path.dirname(target), f".agpc-{name}-{_HOST}-{os.getpid()}-{next(_temporary_numbers)}.tmp")


def _process_is_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # (PermissionError: it exists, and is another user's)
        return False
    return False


def _remove_stale_temporaries(directory):
    """Once a process per directory: remove the temporary files that writers on this host left when they were
    killed, those whose process is gone. Only where a process can be asked whether it exists (POSIX)."""
    if os.name != "posix" or directory in _cleaned_directories:
        return
    _cleaned_directories.add(directory)
    try:
        entries = [entry.name for entry in os.scandir(directory) if entry.name.startswith(".agpc-")]
    except OSError:
        return
    for entry in entries:
        match = _TEMPORARY.match(entry)
        if match and match.group(1) == _HOST and int(match.group(2)) != os.getpid() and \
                _process_is_gone(int(match.group(2))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def check_writable(path, what=None, inputs=()):
    """Fail before any long computation if an output cannot be written at ``path``: the checks of
    ``check_output_path``, then a temporary file is created beside the target and removed (a read-only
    directory or file system, no permission). Returns the target file."""
    target = check_output_path(path, what, inputs)
    tmp = _temporary_path(target)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(tmp)
    except OSError as exc:
        raise ValueError(f"{what or f'cannot write {os.fspath(path)}'}: cannot write in {os.path.dirname(target)} "
                         f"({exc.strerror})") from None
    problem = _unreplaceable(target)
    if problem:
        raise ValueError(f"{what or f'cannot write {os.fspath(path)}'}: the file there cannot be replaced ({problem});"
                         " name another path")
    return target


# Linux's inode flags (linux/fs.h): FS_IOC_GETFLAGS, and the flags under which a file cannot be renamed over
_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20


def _unreplaceable(target):
    """Why an existing ``target`` cannot be replaced by a file renamed over it, though its directory takes new
    files (``check_writable``), or None: another user's file in a sticky directory (/tmp) that is not this
    user's, or a file marked immutable or append-only (Linux's chattr +i / +a). A fit found either only at its
    first checkpoint, after the steps before it, with the system's "Operation not permitted"."""
    try:
        file, directory = os.stat(target), os.stat(os.path.dirname(target))
    except OSError:
        return None
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid not in (None, 0) and directory.st_mode & stat.S_ISVTX and uid not in (file.st_uid, directory.st_uid):
        return (f"it is another user's, in {os.path.dirname(target)}, where only a file's owner may replace it: a "
                "sticky directory, as /tmp")
    if fcntl is None:
        return None
    try:
        with open(target, "rb") as handle:
            flags = fcntl.ioctl(handle.fileno(), _FS_IOC_GETFLAGS, bytes(8))
    except OSError:  # (not Linux, a file system without the flags, or a file this user cannot read)
        return None
    flags = int.from_bytes(flags[:4], sys.byteorder)
    if flags & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
        return f"it is marked {'immutable' if flags & _FS_IMMUTABLE_FL else 'append-only'}, as lsattr shows"
    return None


@contextlib.contextmanager
def atomic_write(path, mode="wb", what=None, inputs=()):
    """A file object on a temporary file beside ``path``'s target (``check_output_path``), flushed to disk and
    renamed over the target when the block succeeds, removed when it does not (any exception, an interrupt):
    a crash never leaves a half-written file where a good one was. Text modes write UTF-8 with newlines as
    given. The new file gets the permissions any new file would (0666 less the umask)."""
    target = check_output_path(path, what, inputs)
    tmp = _temporary_path(target)
    _remove_stale_temporaries(os.path.dirname(target))
    text = {} if "b" in mode else {"newline": "", "encoding": "utf-8"}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, mode.replace("x", "w"), **text) as fh:
            yield fh
            # on disk before the rename: otherwise a power cut can leave the new name on empty blocks
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:  # an interrupt too: no temporary is left behind on any exit Python sees
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            # (a full disk while writing: the system's "[Errno 28] No space left on device" named no file)
            where = f"writing {target} (a file there is unchanged)"
            if exc.errno is None or exc.strerror is None:
                raise type(exc)(f"{exc}: {where}") from None
            raise type(exc)(exc.errno, f"{exc.strerror}: {where}") from None
        raise
    sync_directory(os.path.dirname(target))


def atomic_savez(path, arrays):
    """Write an npz atomically (``atomic_write``): a crash leaves the old file untouched. A binary file object
    (``load`` reads them, as numpy.load does) is written in place: it has no name to rename over; its owner
    decides what a half-written file means."""
    if hasattr(path, "write"):
        if isinstance(path, io.TextIOBase):
            raise ValueError(f"cannot save to {describe(path)}: it is open in text mode; a model file is binary "
                             "(open it with mode 'wb')")
        np.savez(path, **arrays)
        return
    with atomic_write(path, "wb", what=f"cannot save to {os.fspath(path)}") as fh:
        np.savez(fh, **arrays)


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
# agpc writes its files uncompressed (np.savez), so what a file costs to read is bounded by its size: its arrays
# may declare at most MAX_EXPANSION times the file's bytes (a file compressed afterwards, floats two to one),
# or UNCHECKED_BYTES, below which nothing costs much. A 63 KB model file declaring a 60 MB header, or an m =
# 3000 posterior of zeros in 92 KB (712 MB and 7 s to load), is refused before anything is inflated.
MAX_EXPANSION = 4
UNCHECKED_BYTES = 16 << 20


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
        bound = (MAX_EXPANSION, UNCHECKED_BYTES)
        text = read_npz(path, names=[HEADER_KEY], check=check_header, max_expansion=bound)[HEADER_KEY]
        try:
            header = json.loads(str(text))
        # ValueError: also an integer of more digits than Python converts (4300); RecursionError: deep nesting
        except (ValueError, RecursionError) as exc:
            raise refuse(f"header: not JSON agpc reads ({type(exc).__name__})") from None
        checked = None if check_declared is None else (lambda declared: check_declared(header, declared))
        arrays = read_npz(path, check=checked, max_expansion=bound)
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


def check_checkpoint_path(path, inputs=(), resume=False):
    """Fail before any training if a checkpoint cannot be written at ``path`` (``check_writable``: an empty
    path, a directory, no such directory, a device, a FIFO, a system path, a directory this process cannot
    write to) or would replace one of ``inputs`` (the training data's files), or a file there that is not a
    checkpoint (a model file, a text file: the fit replaced them unasked; an empty file is nothing to keep). With
    ``resume`` the file there is the checkpoint to go on from: the resume reads and checks it (``load_checkpoint``)."""
    what = f"checkpoint_path {os.fspath(path)!s}"
    target = check_writable(path, what=what, inputs=inputs)
    if not resume and os.path.isfile(target) and os.path.getsize(target) > 0:
        kind = _agpc_file_kind(target)
        if kind != CHECKPOINT_FORMAT:
            found = "an agpc model file" if kind == "agpc-model" else "a file that is not an agpc checkpoint"
            raise ValueError(f"{what}: it is {found}, which the fit's checkpoints would replace; name another path "
                             "(or remove the file)")
    return target


def _agpc_file_kind(path):
    """The "format" an agpc file's header names ("agpc-checkpoint", "agpc-model"), or None for any other file; only
    the header is read (``read_archive``'s checks)."""
    try:
        header = json.loads(str(read_npz(path, names=[HEADER_KEY], max_expansion=(MAX_EXPANSION, UNCHECKED_BYTES))
                                [HEADER_KEY]))
    except (RefusedFile, OSError, KeyError, ValueError, RecursionError):
        return None
    return header.get("format") if isinstance(header, dict) else None


def check_site_directory(path):
    """Fail before any training if the sites cannot be written under ``site_directory``: a path under /proc,
    /sys or /dev, or an existing file that is not a directory, or a directory this process cannot write in (a
    directory that does not exist yet is made by the fit)."""
    what = f"site_directory {os.fspath(path)}"
    directory = _outside_system_directories(os.fspath(path), what)
    if os.path.exists(directory):
        if not os.path.isdir(directory):
            raise ValueError(f"{what}: not a directory")
        check_writable(os.path.join(directory, "sites"), what=what)


def check_resume_path(path):
    """Fail before any training if ``resume=True`` has no checkpoint to read at ``path``: none written yet
    (a fit with ``checkpoint_every`` writes one), or not a file."""
    text = os.fspath(path)
    if os.path.isdir(text):
        raise ValueError(f"resume=True: checkpoint_path {text} is a directory, not a checkpoint file")
    if not os.path.exists(text):
        raise ValueError(f"resume=True: no checkpoint at {text} yet (a fit with checkpoint_every writes one); fit "
                         "without resume=True to start")


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
        arrays = read_npz(path, max_expansion=(MAX_EXPANSION, UNCHECKED_BYTES))
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
