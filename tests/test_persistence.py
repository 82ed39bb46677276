"""Files agpc reads are not trusted: hostile data files (npy, npz, zarr, Parquet) are refused before any data is
read, with one ValueError naming the file and the problem, and no payload runs; model files keep the feature
names, carry a format version, are validated field by field, and choose no path we write to; checkpoints are
validated the same way and tied to the data they were written for."""

import json
import os
import pickle
import warnings
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npy_format

from agpc import untrusted
from agpc.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))


class Payload:
    """Unpickling this creates the file ``marker``: a file that can run code would leave it behind."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def assert_refused_in_one_line(status, err, path, words):
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("agpc: error:"), err
    assert str(path) in lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def fit_cli(data, tmp_path, *target):
    return main(["fit", str(data), *target, "--quiet", "--max-iter", "1", "--out", str(tmp_path / "m.agpc")])


# -- npy / npz --------------------------------------------------------------------------------------

def test_object_npy_is_refused_without_unpickling(tmp_path, capsys):
    marker = tmp_path / "ran"
    path = tmp_path / "hostile.npy"
    np.save(path, np.array([[Payload(marker), 1.0]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="dtype object") as info:
        untrusted.read_npy(path)
    assert str(path) in str(info.value)
    assert_refused_in_one_line(fit_cli(path, tmp_path, "--target", "1"), capsys.readouterr().err, path, ["object"])
    assert not marker.exists()


def write_npy_header(path, shape, descr="<f8", data=b"\0" * 64):
    with open(path, "wb") as fh:
        npy_format.write_array_header_1_0(fh, {"descr": descr, "fortran_order": False, "shape": shape})
        fh.write(data)


def test_npy_header_declaring_a_huge_shape_is_one_value_error(tmp_path, capsys):
    path = tmp_path / "huge.npy"
    write_npy_header(path, (2 ** 40, 2 ** 13))  # 8 bytes each: 71 PiB declared, 64 bytes held
    with pytest.raises(ValueError, match="declares shape") as info:
        untrusted.read_npy(path)
    assert str(path) in str(info.value) and "64 bytes" in str(info.value)
    assert_refused_in_one_line(fit_cli(path, tmp_path, "--target", "0"), capsys.readouterr().err, path, ["declares shape"])


def test_npy_of_a_structured_dtype_is_refused(tmp_path):
    path = tmp_path / "structured.npy"
    np.save(path, np.zeros(3, dtype=[("a", "<f8"), ("b", "<i4")]))
    with pytest.raises(ValueError, match="only numbers, booleans and strings"):
        untrusted.read_npy(path)


def test_npz_members_are_all_checked_before_any_is_read(tmp_path, capsys):
    marker = tmp_path / "ran"
    path = tmp_path / "hostile.npz"
    np.savez(path, X=np.ones((4, 2)), y=np.array([Payload(marker)] * 4, dtype=object))
    with pytest.raises(ValueError, match="array 'y' has dtype object"):
        untrusted.read_npz(path)
    assert_refused_in_one_line(fit_cli(path, tmp_path), capsys.readouterr().err, path, ["'y'", "object"])
    assert not marker.exists()

    huge = tmp_path / "huge.npz"
    write_npy_header(tmp_path / "X.npy", (2 ** 50,))
    with zipfile.ZipFile(huge, "w") as archive:  # stored: the member's size is what it holds
        archive.write(tmp_path / "X.npy", "X.npy")
    with pytest.raises(ValueError, match="array 'X' declares shape"):
        untrusted.read_npz(huge)


def test_npz_member_with_a_forged_uncompressed_size_is_refused(tmp_path):
    path = tmp_path / "forged.npz"
    np.savez_compressed(path, X=np.ones((50, 2)))
    raw = bytearray(path.read_bytes())
    # the central directory's uncompressed size (offset 24 in its entry) claims 2 GiB for a few hundred bytes
    central = raw.rindex(b"PK\x01\x02")
    raw[central + 24:central + 28] = (2 ** 31).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="forged sizes") as info:
        untrusted.read_npz(path)
    assert str(path) in str(info.value)


def test_plain_npy_and_npz_read_as_numpy_does(tmp_path):
    X = np.arange(12.0).reshape(6, 2)
    labels = np.array(["a", "b"] * 3)
    np.save(tmp_path / "X.npy", X)
    np.savez_compressed(tmp_path / "d.npz", X=X, y=labels)
    np.testing.assert_array_equal(untrusted.read_npy(tmp_path / "X.npy"), X)
    arrays = untrusted.read_npz(tmp_path / "d.npz")
    np.testing.assert_array_equal(arrays["X"], X)
    np.testing.assert_array_equal(arrays["y"], labels)


# -- zarr ---------------------------------------------------------------------------------------------

def write_zarr2_array(root, name, shape, dtype, filters, chunk):
    """A zarr 2-format array written by hand (any installed zarr can read this layout; none needs to write it)."""
    os.makedirs(root / name, exist_ok=True)
    meta = {"zarr_format": 2, "shape": list(shape), "chunks": list(shape), "dtype": dtype, "compressor": None,
            "fill_value": None, "filters": filters, "order": "C"}
    (root / name / ".zarray").write_text(json.dumps(meta))
    (root / name / ".".join("0" * len(shape))).write_bytes(chunk)


def hostile_zarr(root, marker, codec):
    os.makedirs(root, exist_ok=True)
    (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    write_zarr2_array(root, "X", (3, 2), "<f8", None, np.arange(6.0).tobytes())
    labels = np.array([Payload(marker), 1, 2], dtype=object)
    write_zarr2_array(root, "y", (3,), "|O", [codec], pickle.dumps(labels))
    return root


@pytest.mark.parametrize("codec, problem", [({"id": "pickle", "protocol": 5}, "pickle codec"),
                                            ({"id": "json2", "encoding": "utf-8"}, "dtype object")])
def test_zarr_with_pickled_or_object_arrays_is_refused_before_zarr_reads_it(tmp_path, capsys, codec, problem):
    pytest.importorskip("zarr")
    marker = tmp_path / "ran"
    store = hostile_zarr(tmp_path / "hostile.zarr", marker, codec)
    with pytest.raises(ValueError, match=problem):
        untrusted.open_zarr(store)
    assert_refused_in_one_line(fit_cli(store, tmp_path), capsys.readouterr().err, store, [problem])
    model = os.path.join(HERE, "data", "model_v1", "binary_banana.npz")
    status = main(["predict", model, str(store), "--target", "y", "--out", str(tmp_path / "p.csv")])
    assert_refused_in_one_line(status, capsys.readouterr().err, store, [problem])
    assert not marker.exists() and not (tmp_path / "p.csv").exists()


def test_zarr_pickle_codec_written_by_zarr_itself_is_refused(tmp_path):
    zarr = pytest.importorskip("zarr")
    numcodecs = pytest.importorskip("numcodecs")
    marker = tmp_path / "ran"
    store = tmp_path / "written.zarr"
    try:  # zarr 2 writes object arrays with the pickle codec; zarr 3 warns that it does not, then refuses
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            array = zarr.open(str(store), mode="w", shape=(2,), dtype=object, object_codec=numcodecs.Pickle())
            array[...] = np.array([Payload(marker), 1], dtype=object)
    except (TypeError, ValueError, NotImplementedError):
        pytest.skip(f"zarr {zarr.__version__} does not write arrays with the pickle codec")
    with pytest.raises(ValueError, match="pickle codec"):
        untrusted.open_zarr(store)


def test_zarr_chunk_that_cannot_be_decoded_is_one_line(tmp_path, capsys):
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "corrupt.zarr"
    group = zarr.open_group(str(store), mode="w")
    X = np.random.default_rng(0).normal(size=(40, 2))
    group.create_array("X", shape=X.shape, chunks=(20, 2), dtype="f8")[...] = X
    group.create_array("y", shape=(40,), chunks=(20,), dtype="i8")[...] = (X[:, 0] > 0).astype(int)
    chunks = sorted(p for p in (store / "X").rglob("*") if p.is_file() and not p.name.startswith((".", "zarr.json")))
    chunks[-1].write_bytes(b"not a compressed chunk")
    status = fit_cli(store, tmp_path)
    assert_refused_in_one_line(status, capsys.readouterr().err, store, ["array 'X' cannot be read"])


def test_zarr_string_labels_are_read(tmp_path):
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "labels.zarr"
    group = zarr.open_group(str(store), mode="w")
    group.create_array("X", shape=(3, 1), dtype="f8")[...] = np.ones((3, 1))
    group.create_array("y", shape=(3,), dtype=str)[...] = np.array(["a", "b", "a"])
    arrays = untrusted.open_zarr(store)
    assert [str(v) for v in arrays["y"][...]] == ["a", "b", "a"]
    np.testing.assert_array_equal(np.asarray(arrays["X"]), np.ones((3, 1)))


# -- Parquet ----------------------------------------------------------------------------------------------

def test_parquet_extension_columns_are_refused_from_the_schema(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    marker = tmp_path / "ran"
    # the extension type pyarrow < 14.0.1 unpickled from a file's schema (CVE-2023-47248), spelled by hand
    field = pa.field("label", pa.binary(), metadata={b"ARROW:extension:name": b"arrow.py_extension_type",
                                                      b"ARROW:extension:metadata": pickle.dumps(Payload(marker))})
    table = pa.table({"x": pa.array([0.0, 1.0]), "label": pa.array([b"a", b"b"], pa.binary())},
                     schema=pa.schema([pa.field("x", pa.float64()), field]))
    path = tmp_path / "hostile.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match="label") as info:
        untrusted.read_parquet_columns(path)
    assert str(path) in str(info.value)
    assert_refused_in_one_line(fit_cli(path, tmp_path, "--target", "label"), capsys.readouterr().err, path,
                               ["label", "numbers, booleans and strings"])
    assert not marker.exists()


def test_parquet_needs_a_pyarrow_that_does_not_unpickle(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    monkeypatch.setattr(pa, "__version__", "14.0.0")
    with pytest.raises(ImportError, match="14.0.1"):
        untrusted.read_parquet_columns(tmp_path / "any.parquet")
