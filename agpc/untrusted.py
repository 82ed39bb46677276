"""Reading arrays from files that may be hostile: npy, npz, zarr stores and Parquet.

A data file or a model file comes from anywhere, so reading one must never run code nor let a few bytes
decide how much memory is taken. Every reader here looks at what a file declares before reading any data:

- npy / npz: the array header (``numpy.lib.format``) is read first. Object dtypes (which only pickle can
  fill) are refused, never ``allow_pickle``; the bytes the header's shape and dtype declare are compared
  with the bytes the file (or the zip member) holds, so a header declaring petabytes is one ``ValueError``,
  not a ``MemoryError``.
- zarr: every metadata document of the store is checked before zarr opens it: no pickle codec, no object
  dtype other than the variable-length strings (``vlen-utf8`` / ``vlen-bytes``) zarr uses for labels.
  Arrays stay on disk; reading a chunk that cannot be decoded is one ``ValueError`` naming the store and
  the array (zarr 3 raises from inside its asyncio loop otherwise, with a traceback of thirty lines). An
  array declaring more bytes than the memory available without storing every chunk is refused (missing
  chunks are fill values made up in memory), and an array read whole must fit in the memory available.
- Parquet: needs pyarrow >= 14.0.1 (14.0.0 and older unpickle extension types, CVE-2023-47248); the schema
  is read first, and only numeric, boolean and string columns are read (no extension types).

Every refusal is a :class:`RefusedFile` (a ``ValueError``) whose message names the file and the problem.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import lzma
import math
import os
import re
import stat
import tokenize
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npy_format

__all__ = ["RefusedFile", "check_file_argument", "describe", "check_regular_file", "read_npy", "read_npz", "open_zarr",
           "read_parquet_columns",
           "available_memory", "MIN_PYARROW", "check_zarr_array", "zarr_directory", "printable", "shown"]

# dtypes a data or model file may hold: booleans, integers, floats, strings (labels, the model's header)
_PLAIN_KINDS = "biufUS"
# deflate, the compression numpy's savez_compressed uses, expands at most about 1032 to 1
_DEFLATE_MAX_RATIO = 1032
_MAX_METADATA_BYTES = 1 << 20  # a zarr metadata document is a few hundred bytes; more is not metadata
# A zarr store may declare at most this many times the bytes of its chunks (above _DECLARED_UNCHECKED, below
# which no store costs much to read): honest numbers compress a few to one, data of few distinct values tens.
_MAX_DECLARED_PER_STORED = 1000
_DECLARED_UNCHECKED = 256 << 20
MIN_PYARROW = (14, 0, 1)


class RefusedFile(ValueError):
    """A file that is refused before (or instead of) reading its data; ``reason`` without the path."""

    def __init__(self, path, reason):
        self.path = describe(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def check_file_argument(source, what, writing=False):
    """A model file's ``path`` argument: a file name (str, bytes, os.PathLike) or a binary file object (one with
    ``read``, or ``write`` when ``writing``), else one ValueError saying what was given (None was os.stat's
    TypeError; a file's bytes given as its name, a message of the whole file's bytes). Returns it, a name in bytes
    as text (``os.fsdecode``: the zip reader took bytes for a file object)."""
    if writing and hasattr(source, "write"):
        if hasattr(source, "writable") and not source.writable():  # (io.UnsupportedOperation: write)
            raise ValueError(f"{what}: {describe(source)} is not open for writing (open it with mode 'wb')")
        return source
    if not writing and hasattr(source, "read"):
        if isinstance(source, io.TextIOBase):  # (zipfile then said the model file was "not a zip file")
            raise ValueError(f"{what}: {describe(source)} is open in text mode; a model file is binary (open it "
                             "with mode 'rb')")
        return source
    if isinstance(source, bytes) and b"\0" in source:
        raise ValueError(f"{what}: a bytes object of {len(source):,} bytes holding NUL is no file name (a file's "
                         "contents? wrap them in io.BytesIO)")
    if not isinstance(source, (str, bytes, os.PathLike)):
        kind = "binary file object" + (" open for writing" if writing else "")
        raise ValueError(f"{what}: a file name or a {kind}, got {type(source).__name__}")
    return os.fsdecode(source) if isinstance(source, bytes) else source


def describe(source):
    """A path as text; an open file by its name (``GPClassifier.load`` takes file objects, as numpy.load does)."""
    if hasattr(source, "read"):
        return str(getattr(source, "name", f"<{type(source).__name__}>"))
    return os.fspath(source)


def _size(source):
    if hasattr(source, "read"):
        return source.seek(0, os.SEEK_END)  # zipfile seeks where it needs
    check_regular_file(source)
    return os.path.getsize(source)


# Characters that change what a terminal shows rather than show themselves: the control characters (C0 with tab and
# newline, DEL, C1: ESC starts the sequences that set a terminal's colours or title, BEL rings), Unicode's line and
# paragraph separators (U+2028, U+2029: str.splitlines and log tools that follow it start a new line there, where a
# forged "agpc: error:" line could begin), its direction overrides and isolates (which reorder the text around
# them), and its zero-width characters (U+200B-U+200D, U+2060, the byte order mark U+FEFF: "no column 'a'" of a file
# whose columns were shown as "a, b" held U+FEFF before the a, invisible; a careless-input audit).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]")


def printable(text, limit=None):
    """``text`` (anything, as ``str`` gives it) with every character that would act on a terminal instead of
    showing (``_UNPRINTABLE``) written as Python writes it in a string literal (``\x1b``, ``\n``, ``\u202e``):
    names and labels from a file or a DataFrame are printed through it; the model keeps them exactly. ``limit``:
    at most that many characters of it shown, then the length it had (a model file's names have no bound)."""
    text = str(text)
    kept, cut = _cut(text, limit)
    return _UNPRINTABLE.sub(lambda match: repr(match.group())[1:-1], kept) + cut


def _cut(text, limit):
    """(the first ``limit`` characters of ``text``, what says it was cut: its length), or (text, "")."""
    if limit is None or len(text) <= limit:
        return text, ""
    return text[:limit], f"... ({len(text):,} characters)"


def shown(value, limit=80):
    """An untrusted value as a message shows it: its repr (which writes what would act on a terminal as escapes),
    cut at ``limit`` characters, with the length it had (a forged description may be megabytes)."""
    return "".join(_cut(repr(value), limit))


def check_regular_file(path):
    """Refuse a path that exists and is neither a regular file nor a directory (the caller says what a
    directory is): a FIFO would block the read until a writer came, a device (/dev/zero) never end it. A
    missing path is left to the caller's open."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise RefusedFile(path, "not a regular file (a FIFO, a device, a socket?): agpc reads files")


def _what(name):
    return "the array" if name is None else f"array {name!r}"


def check_dtype(dtype, path, name=None):
    """Refuse dtypes that need pickle (object) or that no agpc file holds (structured, datetime, complex)."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise RefusedFile(path, f"{_what(name)} has dtype object (Python objects, which only pickle can read): "
                                "refused, store numbers or strings")
    if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None:
        raise RefusedFile(path, f"{_what(name)} has dtype {dtype}: only numbers, booleans and strings are read")


def _npy_header(fh, path, name, available):
    """(shape, fortran_order, dtype) from an npy header, checked against the ``available`` bytes of the file."""
    start = fh.tell()
    try:
        version = npy_format.read_magic(fh)
        if version == (1, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran_order, dtype = npy_format.read_array_header_2_0(fh)
        else:  # 3.0 differs only by UTF-8 field names, i.e. structured dtypes, which are refused anyway
            raise RefusedFile(path, f"{_what(name)} is in npy format version {version[0]}.{version[1]}; "
                                    "versions 1.0 and 2.0 are read")
    # numpy parses the header as a Python literal: a damaged one can also raise from its tokenizer
    except (ValueError, EOFError, SyntaxError, tokenize.TokenError) as exc:
        if isinstance(exc, RefusedFile):
            raise
        raise RefusedFile(path, f"{_what(name)} has no valid npy header ({type(exc).__name__})") from None
    check_dtype(dtype, path, name)
    declared = math.prod(shape) * dtype.itemsize  # Python integers: no overflow however large the shape
    held = available - (fh.tell() - start)
    if declared > held:
        raise RefusedFile(path, f"{_what(name)} declares shape {shape} of {dtype} ({declared:,} bytes) but the file "
                                f"holds {max(held, 0):,} bytes after its header (truncated or forged)")
    return shape, fortran_order, dtype


def read_npy(path):
    """The array of an ``.npy`` file, its header checked first (see the module docstring)."""
    check_regular_file(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        _npy_header(fh, path, None, size)
        fh.seek(0)
        try:
            return npy_format.read_array(fh, allow_pickle=False)
        except (ValueError, EOFError) as exc:
            raise RefusedFile(path, f"unreadable array ({exc})") from None


def _member_size(info, archive_size, path):
    """The uncompressed size a zip member declares, refused when no honest archive of this size has it."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise RefusedFile(path, f"member {info.filename!r} uses zip compression method {info.compress_type}; "
                                "numpy writes stored or deflated members")
    if info.compress_size > archive_size or (
        info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size
    ) or info.file_size > _DEFLATE_MAX_RATIO * info.compress_size + 1024:
        raise RefusedFile(path, f"member {info.filename!r} declares {info.file_size:,} bytes from "
                                f"{info.compress_size:,} stored ones (forged sizes)")
    return info.file_size


def read_npz(path, names=None, check=None, max_expansion=None):
    """{name: array} of an ``.npz`` archive: every member's header is checked before any member is read.
    ``names``: read only these members (their headers, and every other member's, are checked all the same).
    ``check({name: (shape, dtype)})``, called with what every member declares before any data is inflated,
    lets a reader that knows the file's schema refuse a member larger than the schema allows (a zip bomb
    whose declared size the archive can hold, up to deflate's ratio). ``max_expansion`` (ratio, floor): the
    members may declare at most ``ratio`` times the archive's bytes, or ``floor`` bytes (a format written
    uncompressed: its cost to read is bounded by its size). The members read must fit in the memory available."""
    try:
        archive_size = _size(path)
        with zipfile.ZipFile(path) as archive:
            members = [info for info in archive.infolist() if info.filename.endswith(".npy")]
            _refuse_repeated_members(members, path)
            declared = {}
            for info in members:
                size = _member_size(info, archive_size, path)
                with archive.open(info) as fh:
                    shape, _, dtype = _npy_header(fh, path, info.filename[:-4], size)
                declared[info.filename[:-4]] = (shape, dtype)
            _check_declared_total(path, declared, archive_size, max_expansion)
            if check is not None:
                check(declared)
            if names is not None:
                members = [info for info in members if info.filename[:-4] in names]
            wanted = sum(math.prod(declared[info.filename[:-4]][0]) * declared[info.filename[:-4]][1].itemsize
                         for info in members)
            memory = available_memory()
            if memory is not None and wanted > memory:
                raise RefusedFile(path, f"its arrays take {wanted:,} bytes in memory, more than the {memory:,} bytes "
                                        "available")
            arrays = {}
            for info in members:
                with archive.open(info) as fh:
                    arrays[info.filename[:-4]] = npy_format.read_array(fh, allow_pickle=False)
            return arrays
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise  # about the path, not the contents: the caller reports these as they are
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, NotImplementedError) as exc:
        # (OSError: a damaged archive can send zipfile seeking before the start of the file, EINVAL;
        # NotImplementedError: a damaged byte can declare a zip version or compression zipfile does not read)
        if isinstance(exc, RefusedFile):
            raise
        raise RefusedFile(path, f"not a readable npz archive ({type(exc).__name__}: {exc})") from None


def _refuse_repeated_members(members, path):
    """A member name the archive holds twice: numpy and zipfile read the last copy, but every copy is inflated,
    so a first copy's declared size escaped the bounds on what is read (a 278 KB model file with a 200 MB
    deflated first copy loaded, the 4-times-its-size rule passed on the last copy; hostile-input audit)."""
    counts = collections.Counter(info.filename for info in members)
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if repeated:
        raise RefusedFile(path, f"the archive holds member {repeated[0]!r} {counts[repeated[0]]} times "
                                "(a forged archive: numpy writes each array once)")


def _check_declared_total(path, declared, archive_size, max_expansion):
    if max_expansion is None:
        return
    ratio, floor = max_expansion
    total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in declared.values())
    if total > max(ratio * archive_size, floor):
        largest = max(declared, key=lambda name: math.prod(declared[name][0]) * declared[name][1].itemsize)
        raise RefusedFile(path, f"its arrays declare {total:,} bytes ({largest + '.npy'!r} the most) in a file of "
                                f"{archive_size:,} bytes: more than {ratio} times its size (this format is written "
                                "uncompressed; a file that inflates so far is a way to take memory and time)")


# -- zarr ----------------------------------------------------------------------------------------------

# .zattrs (user attributes) is not read: zarr decodes nothing with it, and its keys are anybody's
_ZARR_METADATA = (".zarray", ".zgroup", ".zmetadata", "zarr.json")
_STRING_CODECS = ("vlen-utf8", "vlen-bytes")


def _metadata_dicts(node):
    """Every mapping in a zarr metadata document, at any depth (sharding nests codecs, consolidated metadata
    holds every array's document), user attributes left out."""
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key != "attributes" and not key.endswith(".zattrs"):
                yield from _metadata_dicts(value)
    elif isinstance(node, list):
        for value in node:
            yield from _metadata_dicts(value)


def _codec_ids(node):
    """Every codec id / name in a metadata document."""
    for mapping in _metadata_dicts(node):
        for key in ("id", "name"):
            if isinstance(mapping.get(key), str):
                yield mapping[key]


def _object_dtypes(node):
    """The v2 array documents (a "dtype" beside "zarr_format") of a metadata document."""
    return [mapping for mapping in _metadata_dicts(node) if "dtype" in mapping and "zarr_format" in mapping]


def _chunk_shapes(node):
    """Every chunk shape a metadata document declares (v2 "chunks", v3 and sharding "chunk_shape")."""
    for mapping in _metadata_dicts(node):
        for key in ("chunks", "chunk_shape"):
            if key in mapping:
                yield mapping[key]


def _is_object_dtype(dtype):
    if isinstance(dtype, str):
        return dtype.lstrip("|<>=") == "O"
    if isinstance(dtype, list):  # structured: [[field, dtype(, shape)], ...]
        return any(isinstance(f, list) and len(f) > 1 and _is_object_dtype(f[1]) for f in dtype)
    return False


def _check_zarr_document(document, path, file):
    for shape in _chunk_shapes(document):
        if not (isinstance(shape, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                for v in shape)):
            raise RefusedFile(path, f"{file} declares chunks of shape {shape!r}: not positive integers")
    for codec in _codec_ids(document):
        if "pickle" in codec.lower():
            raise RefusedFile(path, f"{file} uses the pickle codec ({codec!r}), which runs code when read: refused")
    for array in _object_dtypes(document):
        if _is_object_dtype(array["dtype"]):
            codecs = list(_codec_ids({"filters": array.get("filters"), "compressor": array.get("compressor")}))
            if not any(c in _STRING_CODECS for c in codecs):
                raise RefusedFile(path, f"{file} declares an array of dtype object (codecs {codecs}): only numbers, "
                                        "booleans and strings are read")


def _metadata_text(where, path, relative):
    """The text of a zarr metadata file, which must be a regular file (a FIFO would block zarr's read until a
    writer came, a link to /dev/zero fill memory) of at most ``_MAX_METADATA_BYTES``, read no further."""
    try:
        info = os.stat(where)
    except OSError as exc:  # a dangling link, a loop of links
        raise RefusedFile(path, f"{relative} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise RefusedFile(path, f"{relative} is not a regular file (a FIFO, a device, a directory?): zarr metadata is "
                                "a small JSON file")
    if info.st_size > _MAX_METADATA_BYTES:
        raise RefusedFile(path, f"{relative} is {info.st_size:,} bytes, too large for zarr metadata")
    with open(where, "rb") as fh:
        data = fh.read(_MAX_METADATA_BYTES + 1)  # (a file that grew since it was looked at)
    if len(data) > _MAX_METADATA_BYTES:
        raise RefusedFile(path, f"{relative} is more than {_MAX_METADATA_BYTES:,} bytes, too large for zarr metadata")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RefusedFile(path, f"{relative} is not JSON (UnicodeDecodeError)") from None


def check_zarr_store(path):
    """Check every metadata document of a zarr store on disk, before zarr reads any of them. Groups are
    walked; an array's directory is not listed (its chunks can be millions of files)."""
    root = os.fspath(path)
    if os.path.isdir(root) and not any(os.path.lexists(os.path.join(root, file)) for file in _ZARR_METADATA):
        # (zarr's own words were "GroupNotFoundError: No group found in store StorePath(LocalStore, ...)")
        raise RefusedFile(path, "a directory without zarr metadata (zarr.json, or .zgroup / .zarray): agpc reads a "
                                "directory as a zarr store; give a data file (CSV, Parquet, .npy, .npz) or a zarr "
                                "store's directory")
    seen = set()

    def visit(directory):
        real = os.path.realpath(directory)  # zarr follows symbolic links, and so does this walk, once
        if real in seen:
            return
        seen.add(real)
        is_array = False
        for file in (*_ZARR_METADATA, ".zattrs"):
            where = os.path.join(directory, file)
            if not os.path.lexists(where):
                continue
            text = _metadata_text(where, path, os.path.relpath(where, root))
            if file == ".zattrs":  # read by zarr, not by agpc: only its kind and size matter
                continue
            try:
                document = json.loads(text)
            except (ValueError, RecursionError) as exc:
                raise RefusedFile(path, f"{os.path.relpath(where, root)} is not JSON ({type(exc).__name__})") from None
            relative = os.path.relpath(where, root)
            _check_zarr_document(document, path, relative)
            is_array |= file == ".zarray" or (isinstance(document, dict) and document.get("node_type") == "array")
        if is_array:
            return
        with os.scandir(directory) as entries:
            children = [entry.path for entry in entries if entry.is_dir()]
        for child in children:
            visit(child)

    visit(root)


def available_memory():
    """Bytes of memory this process could take now (Linux: MemAvailable), or None where it is unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _stored_chunk_files(directory):
    """How many chunk (or shard) files an array's directory holds: every file under it but metadata."""
    return sum(1 for _, _, files in os.walk(directory) for file in files
               if file not in _ZARR_METADATA and file != ".zattrs")


class ZarrRows:
    """A zarr array as agpc reads it (shape, dtype, chunks, slicing, ``oindex``): a chunk that cannot be
    decoded is one ``ValueError`` naming the store and the array instead of zarr's asyncio traceback.

    A chunk missing from the store reads as the array's fill value: a few hundred bytes of metadata can
    declare terabytes of fill. Missing chunks are not refused as such (zarr 3 does not write a chunk equal to
    the fill value: a block of labels that are all 0 is missing from an honest store), but memory is: an
    array that declares more bytes than the memory available and does not store every chunk is refused when
    opened (what it stores does not fill what it declares: a forged shape; its chunks are counted only then,
    a walk of its directory), and any array read whole must fit in the memory available."""

    def __init__(self, array, path, name, directory):
        self._array, self._path, self._name = array, os.fspath(path), name
        if array.dtype.kind != "T":  # numpy's variable-length strings: zarr 3's labels, checked in the metadata
            check_dtype(array.dtype, path, name)
        self.shape, self.dtype, self.chunks, self.ndim = array.shape, array.dtype, array.chunks, array.ndim
        self.nbytes = _declared_bytes(array)
        _check_chunks_stored(array, path, name, directory)

    def _check_fits_in_memory(self):
        memory = available_memory()
        if memory is not None and self.nbytes > memory:
            raise RefusedFile(self._path, f"{_what(self._name)} of shape {self.shape} takes {self.nbytes:,} bytes in "
                                          f"memory, more than the {memory:,} bytes available")

    def __len__(self):
        return self.shape[0]

    def _read(self, reader, key):
        try:
            return reader[key]
        # what zarr and its codecs raise on a chunk they cannot decode (numcodecs' blosc / zstd: RuntimeError)
        except (RuntimeError, ValueError, TypeError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            raise RefusedFile(self._path, f"{_what(self._name)} cannot be read ({type(exc).__name__}: "
                                          f"{' '.join(str(exc).split())})") from None

    def __getitem__(self, key):
        # the whole array must fit in memory; blocks of rows are sized by their reader
        if key is Ellipsis or (isinstance(key, slice) and key == slice(None)):
            self._check_fits_in_memory()
        return self._read(self._array, key)

    def __array__(self, dtype=None, copy=None):
        values = np.asarray(self[...])
        return values if dtype is None else values.astype(dtype)

    @property
    def oindex(self):
        outer = self

        class _Outer:
            def __getitem__(self, key):
                return outer._read(outer._array.oindex, key)

        return _Outer()


def _declared_bytes(array):
    """The bytes an array's shape and dtype declare (Python integers: no overflow)."""
    return math.prod(array.shape) * np.dtype(array.dtype).itemsize


def _check_chunks_stored(array, path, name, directory):
    """An array that declares more bytes than the memory available must store every chunk (``ZarrRows``)."""
    memory = available_memory()
    declared = _declared_bytes(array)
    if memory is not None and declared > memory:
        grid = getattr(array, "shards", None) or array.chunks  # a sharded array stores one file a shard
        total = math.prod(-(-size // chunk) for size, chunk in zip(array.shape, grid))
        stored = _stored_chunk_files(directory)
        if stored < total:
            raise RefusedFile(path, f"{_what(name)} declares shape {tuple(array.shape)} of {array.dtype} "
                                    f"({declared:,} bytes, more than the {memory:,} bytes of memory available) "
                                    f"but stores {stored:,} of its {total:,} chunks: the rest would be fill values "
                                    "made up in memory (a forged shape?)")


def zarr_directory(array):
    """The directory of a zarr array on a local store (zarr 3 ``LocalStore``, zarr 2 ``DirectoryStore``), or None
    (an array in memory, a remote store, anything else)."""
    store = getattr(array, "store", None)
    root = getattr(store, "root", None) or getattr(store, "path", None)
    if not isinstance(root, (str, os.PathLike)) or not os.path.isdir(root):
        return None
    inside = getattr(array, "path", "") or ""
    return os.path.join(os.fspath(root), inside) if inside else os.fspath(root)


def check_zarr_array(array):
    """The checks ``open_zarr`` makes of a store's shapes against its bytes, for a zarr array the caller opened
    (``GPClassifier.fit`` on a zarr array): refused as a ``RefusedFile`` naming its directory when it declares more
    than it stores can back (``_check_chunks_stored``, ``_check_declared_against_stored``), before any chunk is
    read. Anything that is not a zarr array on a local store passes (a memmap's shape is its file's size)."""
    directory = zarr_directory(array)
    if directory is None or not hasattr(array, "chunks"):
        return
    _check_chunks_stored(array, directory, None, directory)
    _check_declared_against_stored(directory, {None: array})


def open_zarr(path):
    """A zarr store, its metadata checked first: ``{name: ZarrRows}`` for a group, a ``ZarrRows`` for an array."""
    import zarr

    check_zarr_store(path)
    try:
        node = zarr.open(os.fspath(path), mode="r")
        if isinstance(node, zarr.Group):
            arrays = {name: ZarrRows(node[name], path, name, os.path.join(path, name)) for name in node.array_keys()}
        else:
            arrays = ZarrRows(node, path, None, path)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        if isinstance(exc, RefusedFile):
            raise
        raise RefusedFile(path, f"not a readable zarr store ({type(exc).__name__}: {' '.join(str(exc).split())})") \
            from None
    _check_declared_against_stored(path, arrays if isinstance(arrays, dict) else {None: arrays})
    return arrays


def _stored_bytes(directory):
    """The bytes of every file under a store's directory but its metadata (chunks, shards)."""
    total = 0
    for folder, _, files in os.walk(directory):
        for file in files:
            if file not in _ZARR_METADATA and file != ".zattrs":
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(folder, file)).st_size
    return total


def _check_declared_against_stored(path, arrays):
    """The shapes a store declares must be backed by the bytes it stores: a store declaring more than
    ``_MAX_DECLARED_PER_STORED`` times the bytes of its chunks (and more than ``_DECLARED_UNCHECKED``) is refused
    before any data are read. Missing chunks (fill values) and chunks of constant values (which compress
    thousands to one) are what a forged shape is made of; honest data, fill chunks of sorted labels included,
    declare a few times what they store. Its chunk files are walked only then."""
    declared = sum(_declared_bytes(array) for array in arrays.values())
    if declared <= _DECLARED_UNCHECKED:
        return
    stored = _stored_bytes(os.fspath(path))
    if declared > _MAX_DECLARED_PER_STORED * stored:
        shapes = ", ".join(f"{_what(name)} {array.shape} of {array.dtype}" for name, array in arrays.items())
        raise RefusedFile(path, f"declares {declared:,} bytes ({shapes}) but stores {stored:,} bytes of chunks: "
                                f"more than {_MAX_DECLARED_PER_STORED} to 1, missing or constant chunks made up in "
                                "memory (a forged shape?)")


# -- Parquet -------------------------------------------------------------------------------------------

def _version_tuple(text):
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(v or 0) for v in match.groups()) if match else (0, 0, 0)


def _plain_column_type(pa, field):
    kind = field.type
    if isinstance(kind, pa.ExtensionType) or (field.metadata and b"ARROW:extension:name" in field.metadata):
        return False
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind))


# What a Parquet column's row takes in memory at least: 8 bytes in pyarrow's table and 8 in the float64 copy the
# reader's caller makes of it (strings take more). A 2.7-MB file (zstd, 40 row groups of zeros) declared 200
# million rows and took 5.9 GB before pyarrow's malloc failed (an audit, 2026-12-03): its rows are counted first.
PARQUET_BYTES_PER_VALUE = 16


def _check_parquet_fits_in_memory(pa, pq, path, wanted):
    """Refuse a Parquet file whose declared rows (its footer's count) of the ``wanted`` columns would take more
    memory than is available (``PARQUET_BYTES_PER_VALUE`` a value), before any of them is read."""
    try:
        rows = int(pq.read_metadata(path).num_rows)
    except (pa.ArrowException, OSError):  # (a damaged footer: read_table below names what is wrong)
        return
    memory = available_memory()
    need = rows * max(1, len(wanted)) * PARQUET_BYTES_PER_VALUE
    if memory is not None and need > memory:
        raise RefusedFile(path, f"it declares {rows:,} rows of {len(wanted)} columns, at least {need:,} bytes in "
                                f"memory, more than the {memory:,} bytes available")


def read_parquet_columns(path, select=None):
    """(column names, columns as NumPy arrays) of a Parquet file; the schema is checked before any data.
    ``select(names)``, given the schema's column names, returns the names of the columns to read: the others are
    neither checked nor read (a column of another type that the reader does not use, e.g. a timestamp, is
    ignored as a CSV's unused columns are)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if _version_tuple(pa.__version__) < MIN_PYARROW:
        raise ImportError(f"reading Parquet needs pyarrow >= {'.'.join(map(str, MIN_PYARROW))} (older versions can run "
                          f"code from a Parquet file); this is pyarrow {pa.__version__}: pip install -U pyarrow")
    check_regular_file(path)
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise RefusedFile(path, f"not a readable Parquet file ({' '.join(str(exc).split())})") from None
    wanted = list(schema.names) if select is None else list(select(list(schema.names)))
    # pyarrow reads a file whose columns share a name only through its internals' error (FieldRef ... in
    # __fragment_index): a column is known by its name, so a name used twice is refused first, in one line
    repeated = sorted({name for name in wanted if schema.names.count(name) > 1})
    if repeated:
        counts = ", ".join(f"{name!r} ({schema.names.count(name)} times)" for name in repeated)
        raise RefusedFile(path, f"the file names more than one column {counts}: every column needs a name of its own")
    refused = [f"{field.name} ({field.type})" for field in schema
               if field.name in wanted and not _plain_column_type(pa, field)]
    if refused:
        raise RefusedFile(path, f"columns of types agpc does not read (numbers, booleans and strings only): "
                                f"{', '.join(refused)}")
    _check_parquet_fits_in_memory(pa, pq, path, wanted)
    try:
        table = pq.read_table(path, columns=wanted)
    except MemoryError as exc:  # (pyarrow's ArrowMemoryError too: a compressed file's rows exceeding the machine)
        raise RefusedFile(path, f"its columns do not fit in memory ({' '.join(str(exc).split())})") from None
    except (pa.ArrowException, OSError) as exc:
        raise RefusedFile(path, f"not a readable Parquet file ({' '.join(str(exc).split())})") from None
    # (a column with nulls as Python objects, each null None: a number column's to_numpy made them NaN, and a null
    # label was then said to be "missing value, nan")
    return list(table.column_names), [np.asarray(column.to_pylist(), dtype=object) if column.null_count
                                      else column.to_numpy() for column in table.columns]
