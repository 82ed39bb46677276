"""Readers bound the work a small file can cause: a model file costs at most a few times its size to load (it
is written uncompressed; a header or a posterior that inflates far beyond the file is refused before it is
read); zarr metadata must be small regular files (no FIFO hang, no /dev/zero); a zarr store's declared shapes
must be backed by the bytes it stores; a FIFO is never opened as a data or model file; a forged jitter or a
posterior too small for its arithmetic is refused at load; a directory given as a model says so; and a
Parquet file's columns that predict does not use are ignored whatever their type."""

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy_format

from agpc import GPClassifier, checkpoints, model_file, untrusted
from agpc.cli import main
from agpc.datasets import make_banana
from helpers import forged_zarr

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs and /dev/zero are POSIX")


def write_model(path, header, arrays, compressed=False):
    with open(path, "wb") as fh:  # (a file object: np.savez would add ".npz" to the name)
        (np.savez_compressed if compressed else np.savez)(
            fh, **arrays, **{checkpoints.HEADER_KEY: np.asarray(json.dumps(header))})
    return path


# -- model files: the cost of a load is bounded by the file's size -------------------------------------------

def test_a_self_consistent_m_3000_model_in_a_small_file_is_refused_before_inflating(saved, tmp_path, members_read):
    """m = 3000 (an identity L_C, zero h) deflated to about 100 KB took 712 MB and 7 s to load."""
    _, header, arrays = saved
    m = 3000
    forged = dict(arrays, inducing_points=np.random.default_rng(0).normal(size=(m, 2)),
                  posterior_L_C=np.eye(m), posterior_h=np.zeros(m))
    path = write_model(tmp_path / "m3000.agpc", header, forged, compressed=True)
    assert path.stat().st_size < 200_000
    with pytest.raises(ValueError, match=r"its arrays declare .* more than 4 times its size") as info:
        GPClassifier.load(path)
    assert str(path) in str(info.value)
    assert members_read == []  # refused from the declared sizes: nothing inflated, not even the header


def _header_member(archive, header, characters):
    """Write the JSON header as an npy member of ``characters`` characters (NumPy pads text with NULs, which
    it strips when read), deflated, streamed: 4 bytes a character declared, a few KB stored."""
    dtype = np.dtype(f"<U{characters}")
    text = json.dumps(header).encode("utf-32-le")
    with archive.open(checkpoints.HEADER_KEY + ".npy", "w", force_zip64=True) as fh:
        npy_format.write_array_header_1_0(fh, {"descr": dtype.str, "fortran_order": False, "shape": ()})
        fh.write(text)
        padding, block = dtype.itemsize - len(text), b"\0" * (1 << 20)
        while padding > 0:
            fh.write(block[:padding])
            padding -= len(block)


def test_a_member_held_twice_is_refused_before_either_copy_is_inflated(saved, tmp_path, members_read):
    """numpy reads a repeated member's last copy but inflated every copy: a first copy of 200 MB of zeros deflated
    in a 280 KB model file loaded, the 4-times-its-size bound passed on the small last copy."""
    path, _, _ = saved
    big = io.BytesIO()
    npy_format.write_array(big, np.zeros((25_000_000, 1)))
    forged = tmp_path / "twice.agpc"
    with zipfile.ZipFile(path) as honest, zipfile.ZipFile(forged, "w") as archive:
        archive.writestr("inducing_points.npy", big.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
        with pytest.warns(UserWarning, match="Duplicate name"):  # (zipfile's own, as it writes the forgery)
            for name in honest.namelist():
                archive.writestr(name, honest.read(name))
    assert forged.stat().st_size < 400_000
    with pytest.raises(ValueError, match=r"holds member 'inducing_points.npy' 2 times \(a forged archive"):
        GPClassifier.load(forged)
    assert members_read == []


def test_a_60_mb_json_header_in_a_small_model_file_is_refused_before_it_is_read(saved, tmp_path, members_read):
    _, header, arrays = saved
    path = tmp_path / "big-header.agpc"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, values in arrays.items():
            buffer = io.BytesIO()
            npy_format.write_array(buffer, values)
            archive.writestr(name + ".npy", buffer.getvalue())
        _header_member(archive, header, 15_000_000)  # 60 MB as NumPy holds text
    assert path.stat().st_size < 200_000
    with pytest.raises(ValueError, match=r"declare 60,0\d\d,\d\d\d bytes .*'__agpc_header__.npy' the most"):
        GPClassifier.load(path)
    assert members_read == []


def test_a_model_whose_load_would_not_fit_in_memory_is_refused_from_its_declared_shapes(saved, monkeypatch,
                                                                                       members_read):
    monkeypatch.setattr(model_file, "available_memory", lambda: 500, raising=False)  # 5 x 5 factors take 800
    with pytest.raises(ValueError, match=r"posterior_h declares 5 inducing points: loading the model takes about 800 "
                                         r"bytes, more than the 500 bytes of memory available"):
        GPClassifier.load(saved[0])
    assert set(members_read) <= {checkpoints.HEADER_KEY + ".npy"}  # no array inflated


def test_an_honest_model_file_compressed_afterwards_still_loads(saved, tmp_path):
    path, header, arrays = saved
    compressed = write_model(tmp_path / "compressed.agpc", header, arrays, compressed=True)
    X = make_banana(20, random_state=1)[0]
    np.testing.assert_array_equal(GPClassifier.load(compressed).predict_proba(X), GPClassifier.load(path).predict_proba(X))


@pytest.mark.parametrize("forgery", ["fitted_jitter=1e300", "L_C scaled by 1e-300"])
def test_a_forged_jitter_or_a_vanishing_factor_is_refused_at_load(saved, tmp_path, forgery):
    """Each loaded as a model predicting 0.5 everywhere (the second with an overflow warning)."""
    _, header, arrays = saved
    if forgery == "fitted_jitter=1e300":
        path = write_model(tmp_path / "m.agpc", dict(header, fitted_jitter=1e300), arrays)
        words = "fitted_jitter: 1e.300 is more than the jitter parameter"
    else:
        path = write_model(tmp_path / "m.agpc", header, dict(arrays, posterior_L_C=arrays["posterior_L_C"] * 1e-300))
        words = "no finite latent mean and variance"
    with pytest.raises(ValueError, match=words):
        GPClassifier.load(path)


def test_a_directory_given_as_the_model_says_it_is_a_directory(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    (tmp_path / "x.npy").write_bytes(b"")
    status = main(["predict", str(tmp_path / "models"), str(tmp_path / "x.npy"), "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err == f"agpc: error: {tmp_path / 'models'} is a directory, not a model file (those are " \
                                  "files written by 'agpc fit')"


# -- FIFOs and devices are never opened as files ------------------------------------------------------------

OPEN_IN_A_CHILD = textwrap.dedent("""
    import sys
    from agpc import GPClassifier
    from agpc.cli import main
    if sys.argv[1] == "load":
        try:
            GPClassifier.load(sys.argv[2])
        except ValueError as error:
            print(error)
    elif sys.argv[1] == "predict":
        sys.exit(main(["predict", sys.argv[2], sys.argv[3], "--out", sys.argv[4]]))
    else:
        sys.exit(main(["fit", sys.argv[2], "--target", "0", "--out", sys.argv[3]]))
""")


@posix_only
@pytest.mark.parametrize("what", ["a FIFO as a model file", "a FIFO as an .npy data file",
                                  "a FIFO as the model of agpc predict", "a FIFO as the CSV data of agpc fit",
                                  "a FIFO as the CSV rows of agpc predict", "/dev/zero as the CSV data of agpc fit"])
def test_a_fifo_is_refused_not_waited_on(tmp_path, what):
    """A FIFO blocks its reader until a writer comes: run in a child so that a hang is a failure, not a stall. (The
    CLI checks its model file before the zip check reads it, which a FIFO would block: the mutation audit of
    2026-12-04 found no test of that check; the hostile-input audit of that day found the CSV reader without the
    check: ``agpc fit pipe.csv`` waited for ever.)"""
    special = tmp_path / ("m.agpc" if "model" in what else "d.csv" if "CSV" in what else "d.npy")
    if what.startswith("/dev/zero"):
        special.symlink_to("/dev/zero")
    else:
        os.mkfifo(special)
    if "CSV rows" in what:
        model = tmp_path / "m.agpc"
        X = np.random.default_rng(0).normal(size=(30, 2))
        GPClassifier(max_iter=2, random_state=0).fit(X, (X[:, 0] > 0).astype(int)).save(model)
        command = ["predict", str(model), str(special), str(tmp_path / "p.csv")]
    elif "predict" in what:
        rows = tmp_path / "rows.csv"
        rows.write_text("1.0,2.0\n3.0,4.0\n")
        command = ["predict", str(special), str(rows), str(tmp_path / "p.csv")]
    else:
        command = ["load", str(special)] if "model file" in what else ["fit", str(special), str(tmp_path / "m.agpc")]
    run = subprocess.run([sys.executable, "-c", OPEN_IN_A_CHILD, *command], capture_output=True, text=True,
                         env=ENV, timeout=60)
    assert "not a regular file" in run.stdout + run.stderr, run.stdout + run.stderr


# -- zarr: metadata small regular files, shapes backed by the bytes stored ----------------------------------

def small_store(root, zarr):
    group = zarr.open_group(str(root), mode="w")
    X = np.random.default_rng(0).normal(size=(2000, 2))
    group.create_array("X", data=X, chunks=(1000, 2))
    group.create_array("y", data=(X[:, 0] > 0).astype(np.int64), chunks=(1000,))
    return root


@posix_only
@pytest.mark.parametrize("metadata", ["zarr.json a symlink to /dev/zero", "X/zarr.json a FIFO",
                                      ".zarray a FIFO (zarr 2)", ".zattrs a symlink to /dev/zero (zarr 2)"])
def test_zarr_metadata_must_be_a_small_regular_file(tmp_path, capsys, metadata):
    """A FIFO hung zarr's read until killed; /dev/zero was 'internal error: MemoryError'."""
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "d.zarr"
    if "zarr 2" in metadata:
        (store / "X").mkdir(parents=True)
        (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        file = store / "X" / metadata.split()[0]
        if metadata.startswith(".zattrs"):
            (store / "X" / ".zarray").write_text(json.dumps({
                "zarr_format": 2, "shape": [10, 2], "chunks": [10, 2], "dtype": "<f8", "compressor": None,
                "fill_value": 0, "filters": None, "order": "C"}))
    else:
        small_store(store, zarr)
        file = store / metadata.split()[0]
        file.unlink()
    if "FIFO" in metadata:
        os.mkfifo(file)
    else:
        file.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="is not a regular file"):
        untrusted.check_zarr_store(store)  # (before zarr reads anything: a FIFO would block this test)
    status = main(["fit", str(store), "--quiet", "--out", str(tmp_path / "m.agpc")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "is not a regular file" in err and err.count("\n") == 0


def test_a_forged_zarr_shape_is_refused_before_reading(tmp_path, capsys, monkeypatch):
    """10^8 rows declared in a store of a few KB, below the memory available: 2.6 GB and still running at 60 s."""
    zarr = pytest.importorskip("zarr")
    store = small_store(tmp_path / "forged.zarr", zarr)
    for name, shape in (("X", [10**8, 2]), ("y", [10**8])):
        document = json.loads((store / name / "zarr.json").read_text())
        document["shape"] = shape
        (store / name / "zarr.json").write_text(json.dumps(document))
    monkeypatch.setattr(untrusted, "available_memory", lambda: 10**12)  # below the memory: the shape alone tells
    with pytest.raises(ValueError, match=r"declares 2,400,000,000 bytes .* but stores [\d,]+ bytes of chunks: more "
                                         r"than 1000 to 1"):
        untrusted.open_zarr(store)
    status = main(["fit", str(store), "--quiet", "--out", str(tmp_path / "m.agpc")])
    assert status == 2 and "a forged shape?" in capsys.readouterr().err


def test_a_large_honest_store_with_fill_chunks_is_read(tmp_path, monkeypatch):
    """Sorted labels leave out their chunks of 0s (zarr 3 writes no chunk equal to the fill value): a store
    above the size checked, honest, still opens (the check is against the bytes stored, a few to one)."""
    zarr = pytest.importorskip("zarr")
    monkeypatch.setattr(untrusted, "_DECLARED_UNCHECKED", 1000, raising=False)  # checked as a large store is
    store = tmp_path / "sorted.zarr"
    group = zarr.open_group(str(store), mode="w")
    X = np.random.default_rng(0).normal(size=(4000, 2))
    group.create_array("X", data=X, chunks=(500, 2))
    group.create_array("y", data=np.repeat([0, 1], 2000), chunks=(500,), fill_value=0)
    arrays = untrusted.open_zarr(store)
    np.testing.assert_array_equal(arrays["y"][...], np.repeat([0, 1], 2000))


# -- inputs the estimator and predict take ------------------------------------------------------------------

class _CountedReads:
    """A zarr array that counts the blocks read from it (``fit`` sees the zarr array's own attributes)."""

    def __init__(self, array):
        self._array, self.reads = array, 0

    def __getitem__(self, key):
        self.reads += 1
        return self._array[key]

    def __getattr__(self, name):
        return getattr(self._array, name)


@pytest.mark.parametrize("declared, labels", [(2 * 10**6, 120), (10**12, 120), (2 * 10**7, 2 * 10**7)])
def test_fit_on_a_zarr_array_of_a_forged_row_count_is_refused_before_a_row_is_read(tmp_path, declared, labels):
    """120 rows stored, their count in zarr.json edited: the API scanned every declared row for finiteness before it
    compared X's rows with y's (2 x 10^6 rows: 20 s; 10^12: for ever), where ``agpc fit`` refused the store at once.
    Now the same checks first: the rows against y's, the declared shape against the bytes stored (y as long as the
    forged X: refused by the store's bytes), and no row read before them."""
    zarr = pytest.importorskip("zarr")
    store, _ = forged_zarr(tmp_path, 120, "shape", [declared, 2])
    y = make_banana(120, random_state=0)[1]
    counted = _CountedReads(zarr.open_array(str(store), mode="r"))
    expected = (f"X has {declared} rows but y has 120" if labels == 120 else
                r"forged\.zarr: declares 320,000,000 bytes .* but stores [\d,]+ bytes of chunks")
    with pytest.raises(ValueError, match=expected):
        GPClassifier(n_inducing=5, max_iter=1).fit(counted, y if labels == 120 else np.zeros(labels))
    assert counted.reads == 0


def test_a_dask_array_of_unknown_chunk_sizes_says_what_to_do():
    da = pytest.importorskip("dask.array")
    X, y = make_banana(200, random_state=0)
    X_d, y_d = da.from_array(X, chunks=50), da.from_array(y, chunks=50)
    keep = X_d[:, 0] > -100  # boolean indexing: dask no longer knows the chunk sizes
    with pytest.raises(ValueError, match=r"X is a dask array of unknown chunk sizes .*compute_chunk_sizes\(\)"):
        GPClassifier(n_inducing=5, max_iter=2).fit(X_d[keep], y_d[keep])


def test_predict_ignores_a_parquet_timestamp_column_it_does_not_use(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y = make_banana(150, random_state=0)
    columns = {"x1": X[:, 0], "x2": X[:, 1], "label": y}
    pq.write_table(pa.table(columns), tmp_path / "train.parquet")
    stamps = pa.array(np.arange(len(y)).astype("datetime64[s]"), type=pa.timestamp("s"))
    pq.write_table(pa.table({**columns, "when": stamps}), tmp_path / "test.parquet")
    model = tmp_path / "m.agpc"
    assert main(["fit", str(tmp_path / "train.parquet"), "--target", "label", "--inducing", "5", "--max-iter", "2",
                 "--quiet", "--out", str(model)]) == 0
    for data, out in (("train", "p0.csv"), ("test", "p1.csv")):
        status = main(["predict", str(model), str(tmp_path / f"{data}.parquet"), "--target", "label", "--out",
                       str(tmp_path / out)])
        assert status == 0, capsys.readouterr().err
    assert (tmp_path / "p0.csv").read_text() == (tmp_path / "p1.csv").read_text()


def test_a_parquet_file_declaring_more_rows_than_memory_holds_is_refused_before_reading(tmp_path, monkeypatch, capsys):
    """An audit (2026-12-03): a 2.7-MB Parquet file (zstd, row groups of zeros) declared 200 million rows and took
    5.9 GB before pyarrow's malloc failed ("internal error"). Its footer's row count is checked against the memory
    available first (here made 1 MB: 40,000 rows of 3 columns need 1.92 MB), one line, exit 2, nothing read; a
    MemoryError while reading is that refusal too."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = 40_000
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"a": np.zeros(n), "b": np.zeros(n), "y": np.arange(n) % 2}), path, compression="zstd")
    monkeypatch.setattr(untrusted, "available_memory", lambda: 1 << 20)
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("the rows were read"))
    assert main(["fit", str(path), "--target", "y", "--out", str(tmp_path / "m.agpc")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "declares 40,000 rows of 3 columns, at least 1,920,000 bytes" in err, err
    assert not (tmp_path / "m.agpc").exists()

    def no_memory(*args, **kwargs):
        raise pa.ArrowMemoryError("malloc of size 1600000000 failed")

    monkeypatch.setattr(untrusted, "available_memory", lambda: None)
    monkeypatch.setattr(pq, "read_table", no_memory)
    with pytest.raises(untrusted.RefusedFile, match=r"its columns do not fit in memory \(malloc of size"):
        untrusted.read_parquet_columns(path)


FORGED_FIELDS = {
    "log_amplitude=1e300": (lambda header, arrays: (header, dict(arrays, kernel_log_amplitude=np.array(1e300))),
                            r"kernel_log_amplitude \(the amplitude\): 1e\+300, whose exp is inf in float64"),
    "n_iter=10**30": (lambda header, arrays: (dict(header, n_iter=10**30), arrays),
                      r"n_iter: 1000000000000000000000000000000 is not a non-negative integer of 64 bits"),
}


@pytest.mark.parametrize("forge", FORGED_FIELDS, ids=FORGED_FIELDS)
def test_a_parameter_no_fit_gives_is_refused_at_load(saved, tmp_path, forge):
    """A hostile-input audit (2026-12-02): a file edited to n_iter = 10**30 loaded. A count past 64 bits, or an
    amplitude (a noise, a slope variance) whose exp is inf in float64, comes from no fit: refused, naming the field.
    (An amplitude of exp(-1e300) = 0 loads: a model of the prior, which a fit's steps can approach; the audit's
    log_amplitude = -1e300 is such a file.)"""
    _, header, arrays = saved
    edit, words = FORGED_FIELDS[forge]
    path = write_model(tmp_path / "m.agpc", *edit(header, arrays))
    with pytest.raises(ValueError, match=words):
        GPClassifier.load(path)


def test_a_latent_noise_of_zero_or_below_float64s_range_still_loads(saved, tmp_path):
    """The latent noise may be 0 (stored as -inf), and models saved before its floor held one of exp(-752) (batch
    EP's steps drove it there): both load as they did."""
    _, header, arrays = saved
    assert "kernel_log_noise" in arrays
    for log_noise in (-np.inf, -752.0):
        path = write_model(tmp_path / "m.agpc", header, dict(arrays, kernel_log_noise=np.array(log_noise)))
        assert np.all(np.isfinite(GPClassifier.load(path).predict_proba(np.zeros((2, 2)))))


def test_an_ordinal_model_whose_absent_classes_gaps_went_to_exp_minus_782_loads(tmp_path):
    """An adversarial review (2026-12-02) of the log-range rule's first form (every log within +-709.8): batch EP's
    steps drive an absent ordinal class's cut gap to exp(-782) (classes 0, 2, 4 of five, 212 iterations: log cut
    gaps [-782.5, 2.29, -782.45]), and the model it saved was refused at load. Such gaps load, and predict as
    the model does."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 2))
    y = np.digitize(X[:, 0], [-0.3, 0.3]) * 2
    model = GPClassifier(likelihood="ordinal", classes=[0, 1, 2, 3, 4], n_inducing=10, max_iter=3,
                         random_state=0).fit(X, y)
    path = tmp_path / "m.agpc"
    model.save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = json.loads(str(arrays.pop(checkpoints.HEADER_KEY)))
    gaps = arrays["kernel_log_cut_gaps"].copy()
    gaps[0], gaps[-1] = -782.5, -782.45
    loaded = GPClassifier.load(write_model(tmp_path / "gaps.agpc", header, dict(arrays, kernel_log_cut_gaps=gaps)))
    proba = loaded.predict_proba(X)
    assert np.all(np.isfinite(proba)) and np.allclose(proba.sum(axis=1), 1.0)
