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
    status = fit_cli(path, tmp_path, "--target", "0")
    assert_refused_in_one_line(status, capsys.readouterr().err, path, ["declares shape"])


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


def forged_zarr(root, X_shape, y_shape, X_chunks, y_chunks):
    """A zarr 2 group whose metadata declare shapes its (absent) chunks do not fill: a few hundred bytes."""
    os.makedirs(root, exist_ok=True)
    (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    for name, shape, chunks, dtype in (("X", X_shape, X_chunks, "<f8"), ("y", y_shape, y_chunks, "<i8")):
        os.makedirs(root / name)
        (root / name / ".zarray").write_text(json.dumps({
            "zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype, "compressor": None,
            "fill_value": 0, "filters": None, "order": "C"}))
    return root


@pytest.mark.parametrize("X_shape, y_shape, name", [((100, 10 ** 9), (100,), "X"), ((100, 2), (10 ** 11,), "y")])
def test_zarr_declaring_more_than_memory_without_its_chunks_is_refused(tmp_path, capsys, X_shape, y_shape, name):
    """It was a MemoryError (745 GiB), exit 1; just under the memory it would be allocated and filled."""
    pytest.importorskip("zarr")
    store = forged_zarr(tmp_path / "forged.zarr", X_shape, y_shape, (100, 1000), (1000,))
    with pytest.raises(ValueError, match=f"array '{name}' declares shape .* but stores 0 of its"):
        untrusted.open_zarr(store)
    assert_refused_in_one_line(fit_cli(store, tmp_path), capsys.readouterr().err, store, ["stores 0 of its"])
    assert not (tmp_path / "m.agpc").exists()


def test_zarr_arrays_read_whole_must_fit_in_memory(tmp_path, capsys, monkeypatch):
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "d.zarr"
    group = zarr.open_group(str(store), mode="w")
    X = np.random.default_rng(0).normal(size=(300, 2))
    group.create_array("X", data=X, chunks=(50, 2))
    group.create_array("y", data=(X[:, 0] > 0).astype(np.int64), chunks=(50,))
    monkeypatch.setattr(untrusted, "available_memory", lambda: 2000)  # the labels take 2,400 bytes
    assert_refused_in_one_line(fit_cli(store, tmp_path), capsys.readouterr().err, store,
                               ["array 'y' of shape (300,) takes 2,400 bytes in memory, more than the 2,000"])


def test_zarr_chunks_left_out_as_fill_values_are_read(tmp_path):
    """zarr 3 does not write a chunk equal to the fill value (sorted labels: a block of 0s): an honest store
    that does not hold every chunk reads as its fill value, whatever the memory."""
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "sorted.zarr"
    group = zarr.open_group(str(store), mode="w")
    X = np.random.default_rng(0).normal(size=(200, 2))
    y = np.repeat([0, 1], 100)
    group.create_array("X", data=X, chunks=(50, 2))
    group.create_array("y", data=y, chunks=(50,), fill_value=0)
    stored = [p for p in (store / "y").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert len(stored) < 4  # the test's premise: the chunks of 0s are not stored
    arrays = untrusted.open_zarr(store)
    np.testing.assert_array_equal(arrays["y"][...], y)
    np.testing.assert_array_equal(np.asarray(arrays["X"]), X)


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


# -- model files: versions, feature names, schema, no paths ---------------------------------------------------

from agpc import GPClassifier  # noqa: E402
from agpc import checkpoints, model_file  # noqa: E402
from agpc.datasets import make_banana  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402

FIXTURES = os.path.join(HERE, "data", "model_v1")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", ["binary_banana", "multiclass_iris"])
def test_earlier_versions_load_and_predict_as_when_they_were_saved(name, version):
    """Files written by the agpc of each earlier format version (tests/data/model_vN/make_fixtures.py)."""
    fixtures = os.path.join(HERE, "data", f"model_v{version}")
    model = GPClassifier.load(os.path.join(fixtures, f"{name}.npz"))
    assert model.kernel_prior_ is None  # trained before the default priors existed
    expected = np.load(os.path.join(fixtures, f"{name}_expected.npz"))
    np.testing.assert_array_equal(model.classes_, expected["classes"])
    np.testing.assert_allclose(model.predict_proba(expected["X"]), expected["proba"], rtol=1e-12, atol=1e-15)


def rewrite(saved, tmp_path, header=None, arrays=None, raw_header=None):
    """A copy of the saved model with header fields and arrays replaced (None values remove them)."""
    _, base_header, base_arrays = saved
    new_header = dict(base_header, **(header or {}))
    new_arrays = dict(base_arrays, **(arrays or {}))
    new_arrays = {k: v for k, v in new_arrays.items() if v is not None}
    new_header = {k: v for k, v in new_header.items() if v is not None}
    path = tmp_path / "crafted.agpc"
    with open(path, "wb") as fh:  # a file object: np.savez would add ".npz" to the name
        np.savez(fh, **new_arrays, **{checkpoints.HEADER_KEY: np.asarray(raw_header or json.dumps(new_header))})
    return path


@pytest.mark.parametrize("new_array", [None, np.zeros(3)])
def test_a_newer_format_version_is_refused_naming_both_versions(saved, tmp_path, new_array):
    path = rewrite(saved, tmp_path, header={"version": model_file.VERSION + 1}, arrays={"a_later_field": new_array})
    newer = model_file.VERSION + 1
    with pytest.raises(ValueError, match=f"version {newer}.*versions 1 to {model_file.VERSION}") as info:
        GPClassifier.load(path)
    assert str(path) in str(info.value)


def test_files_choose_no_path_we_write_to(saved, tmp_path):
    target = tmp_path / "chosen-by-the-file"
    params = dict(saved[1]["params"], checkpoint_path=str(target), checkpoint_every=1, site_directory=str(target))
    model = GPClassifier.load(rewrite(saved, tmp_path, header={"params": params}))
    assert model.get_params()["checkpoint_path"] is None
    assert model.get_params()["checkpoint_every"] is None and model.get_params()["site_directory"] is None
    X, y = make_banana(60, random_state=4)
    model.set_params(max_iter=1).fit(X, y)
    assert not target.exists()


def test_a_saved_checkpoint_path_is_not_restored(tmp_path):
    X, y = make_banana(60, random_state=4)
    model = GPClassifier(n_inducing=4, max_iter=2, checkpoint_path=tmp_path / "run.ckpt", checkpoint_every=1)
    model.fit(X, y).save(tmp_path / "m.agpc")
    loaded = GPClassifier.load(tmp_path / "m.agpc")
    assert loaded.checkpoint_path is None and loaded.checkpoint_every is None
    assert loaded.get_params()["n_inducing"] == 4


def upper_triangular(L):
    L = L.copy()
    L[0, -1] = 0.5
    return L


def negative_diagonal(L):
    L = L.copy()
    L[1, 1] = -L[1, 1]
    return L


def first_set_to(values, value):
    values = values.copy()
    values.flat[0] = value
    return values


CORRUPTIONS = {
    # name: (header changes, array changes (functions of the saved arrays), words the message must hold)
    "L_C not triangular": ({}, {"posterior_L_C": lambda a: upper_triangular(a["posterior_L_C"])},
                           ["posterior_L_C", "lower triangular"]),
    "L_C negative diagonal": ({}, {"posterior_L_C": lambda a: negative_diagonal(a["posterior_L_C"])},
                              ["posterior_L_C", "positive"]),
    "L_C NaN": ({}, {"posterior_L_C": lambda a: a["posterior_L_C"] * np.nan}, ["posterior_L_C", "NaN"]),
    "duplicated classes": ({}, {"classes": lambda a: np.array([1, 1])}, ["classes", "twice"]),
    "classes 2-D": ({}, {"classes": lambda a: a["classes"][None, :]}, ["classes"]),
    "object classes": ({}, {"classes": lambda a: np.array([1, 2], dtype=object)}, ["classes", "object"]),
    "inducing shape": ({}, {"inducing_points": lambda a: a["inducing_points"][:, :1]}, ["inducing_points", "shape"]),
    # (the hostile-input audit of 2026-12-04: an inducing point of 1e308 overflowed K(Z, Z), and the file was refused
    # for its fitted_jitter)
    "inducing point past the kernel's arithmetic": ({}, {"inducing_points": lambda a: first_set_to(
        a["inducing_points"], 1e308)}, ["inducing_points: with the kernel they give no covariance matrix"]),
    "integer h": ({}, {"posterior_h": lambda a: a["posterior_h"].astype(np.int64)}, ["posterior_h", "dtype"]),
    "missing kernel array": ({}, {"kernel_log_amplitude": lambda a: None}, ["kernel_log_amplitude", "missing"]),
    "lengthscale shape": ({}, {"kernel_log_lengthscales": lambda a: np.zeros(7)}, ["kernel_log_lengthscales"]),
    # (the hostile-input audit of 2026-12-04: lengthscales of exp(800) = inf loaded, a kernel of one constant that
    # answered one probability everywhere, and 'agpc inspect' printed NumPy's overflow warnings)
    "lengthscales past float64": ({}, {"kernel_log_lengthscales": lambda a: np.full_like(a["kernel_log_lengthscales"],
                                                                                          800.0)},
                                  ["kernel_log_lengthscales (the lengthscales): 800, whose exp is inf in float64"]),
    "extra array": ({}, {"payload": lambda a: np.zeros(3)}, ["unexpected", "payload"]),
    "params not a mapping": ({"params": [1, 2]}, {}, ["params"]),
    "unknown method": ({"params": {"method": "nope"}}, {}, ["params", "nope"]),
    "params value a mapping": ({"params": {"n_inducing": {"a": 1}}}, {}, ["params.n_inducing"]),
    "jitter a string": ({"params": {"jitter": "big"}}, {}, ["params", "jitter"]),
    "quadrature in the billions": ({"params": {"n_quadrature": 10 ** 9}}, {}, ["params", "n_quadrature must be an int "
                                                                                "in [1, 1000]"]),
    # (found by the random header test: 2**64 reached the BLAS as a C int, an OverflowError in prediction)
    "blas_threads past a C int": ({"params": {"blas_threads": 2 ** 64}}, {}, ["params", "blas_threads"]),
    "unknown kernel": ({"kernel": {"type": "Evil"}}, {}, ["kernel", "Evil"]),
    "kernel_params short": ({"kernel_params": ["log_amplitude"]}, {}, ["kernel_params"]),
    "kernel_params not a list": ({"kernel_params": 3}, {}, ["kernel_params"]),
    "n_features_in a string": ({"n_features_in": "2"}, {}, ["n_features_in"]),
    "n_iter negative": ({"n_iter": -1}, {}, ["n_iter"]),
    "more warm-up sweeps than sweeps": ({"fit_record": {"n_warmup": 10 ** 9}}, {}, ["fit_record.n_warmup", "n_iter"]),
    "unknown likelihood": ({"likelihood": "robust-max"}, {}, ["likelihood"]),
    "history of strings": ({"history": {"log_marginal_likelihood": ["x"]}}, {}, ["history"]),
    "feature names too few": ({"feature_names_in": ["a"]}, {}, ["feature_names_in"]),
    "feature names repeated": ({"feature_names_in": ["a", "a"]}, {}, ["feature_names_in"]),
    "another estimator": ({"estimator": "Pipeline"}, {}, ["estimator"]),
    "version a string": ({"version": "1"}, {}, ["version"]),
    "another format": ({"format": "agpc-checkpoint"}, {}, ["format"]),
    # (the mutation audit of 2026-12-04: a file of one class, a fit record of a subsample of every row or of
    # iterations on a subsample of 0 rows; a callable header is of the saved model's own)
    "one class": ({}, {"classes": lambda a: a["classes"][:1]}, ["classes", "at least two classes"]),
    "a subsample of every row": (lambda s: _fit_record_with(s, subsample_rows=s[1]["fit_record"]["n_samples_fit"],
                                                            subsample_iter=3), {},
                                 ["fit_record.subsample_rows", "not fewer than"]),
    "iterations on a subsample of 0 rows": (lambda s: _fit_record_with(s, subsample_rows=0, subsample_iter=3), {},
                                            ["fit_record.subsample_iter", "a subsample of 0 rows"]),
    # (a hostile-input audit: histories whose entries recorded together are missing or of other lengths loaded, and
    # agpc inspect failed on them: KeyError 'validation_step' with --plot, IndexError without, matplotlib's
    # "operands could not be broadcast" for more step counts than log Z's)
    "validation scores without their steps": (lambda s: _history_with(s, validation_nll=[0.5], validation_error=[0.1]),
                                              {}, ["history: no 'validation_step'", "records", "together"]),
    "validation errors fewer than the scores": (
        lambda s: _history_with(s, validation_step=[1.0, 2.0], validation_nll=[0.5, 0.4], validation_error=[]), {},
        ["history: validation_step has 2, validation_nll has 2, validation_error has 0 entries", "recorded together"]),
    "more step counts than log Z's": (lambda s: _history_with(s, n_steps=s[1]["history"]["n_steps"] + [1e3]), {},
                                      ["history: n_steps has", "more than the", "of log_marginal_likelihood"]),
}


def _history_with(saved, **entries):
    return {"history": dict(saved[1]["history"], **entries)}


def _fit_record_with(saved, **fields):
    return {"fit_record": dict(saved[1]["fit_record"], **fields)}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_every_field_is_checked_and_refused_in_one_value_error(saved, tmp_path, case):
    header, changes, words = CORRUPTIONS[case]
    header = header(saved) if callable(header) else header
    if "params" in header and isinstance(header["params"], dict):
        header = dict(header, params=dict(saved[1]["params"], **header["params"]))
    path = rewrite(saved, tmp_path, header=header, arrays={k: f(saved[2]) for k, f in changes.items()})
    with pytest.raises(ValueError) as info:
        GPClassifier.load(path)
    message = str(info.value)
    assert str(path) in message and "not a valid agpc model file" in message
    for word in words:
        assert word in message, message


def test_the_loaders_final_probe_refuses_a_model_that_does_not_predict(saved, tmp_path):
    """Issue 25: the loader's last check (it predicts at the model's own inducing points) is what refuses a file
    whose every field passes its own check but whose whole does not predict. Here posterior_L_C and posterior_h are
    finite numbers of the right shape and type, a Cholesky factor with a positive diagonal: L_C = 1e-160 I and
    h = 1e150. Then q's whitened mean L_C^-T h overflows, so every entry of beta = L_K^-T L_C^-T h is infinite or
    NaN and so is the predictive mean (K(x, Z) > 0 for an RBF kernel), while the variance, through L_C^-1, is inf:
    the probabilities are NaN at every input. Without the probe this file loaded as a model that answers NaN."""
    m = saved[2]["posterior_h"].shape[0]
    path = rewrite(saved, tmp_path, arrays={"posterior_L_C": 1e-160 * np.eye(m), "posterior_h": np.full(m, 1e150)})
    with pytest.raises(ValueError, match="posterior_h, posterior_L_C: the model they describe") as info:
        GPClassifier.load(path)
    assert str(path) in str(info.value) and "not a valid agpc model file" in str(info.value)


def _one_inducing_point_at(Z, value):
    Z = np.array(Z, copy=True)
    Z[0, 0] = value
    return Z


def test_a_file_with_one_inducing_point_far_from_the_others_predicts_as_that_point_allows(saved, tmp_path):
    """The hostile-input audit of 2026-12-05: a forged file whose inducing points held ONE point at 1e154 (the others
    as written) loaded and predicted one probability for every input, without a word. The kernel's distances were
    centred on the points' mean, 1e153 from the others, and lost every digit. Such a point is 0 to every other point
    and every input (as one at 1e4 is, far beyond the kernel's reach but not the arithmetic's): the model is the
    one without it, and its predictions are those of the same file with the point at 1e4."""
    X, _ = make_banana(50, random_state=8)
    proba = {}
    for value in (1e154, 1e4):
        Z = _one_inducing_point_at(saved[2]["inducing_points"], value)
        path = rewrite(saved, tmp_path, arrays={"inducing_points": Z})
        proba[value] = GPClassifier.load(path).predict_proba(X)[:, 1]
    assert np.ptp(proba[1e4]) > 0.1  # (a model that tells the inputs apart: 3 iterations of banana)
    np.testing.assert_allclose(proba[1e154], proba[1e4], rtol=1e-12)


def test_a_fit_from_one_given_inducing_point_far_from_the_others_learns_and_loads(tmp_path):
    """Fitting can write such a file: points given as ``inducing`` are the model's. With one at 1e154 the fit warned
    that its model gave every input one probability (training accuracy 0.52); it is the fit with that point at 1e4
    now, where the point is as inert, and it is saved and loaded as it is (a load that refused it would refuse a
    file agpc wrote)."""
    X, y = make_banana(120, random_state=3)
    proba = {}
    for value in (1e4, 1e154):  # (the far one last: the model saved)
        model = GPClassifier(inducing=_one_inducing_point_at(X[:6], value), max_iter=10, random_state=0).fit(X, y)
        proba[value] = model.predict_proba(X)[:, 1]
    assert np.ptp(proba[1e4]) > 0.5
    np.testing.assert_allclose(proba[1e154], proba[1e4], rtol=1e-12)
    model.save(tmp_path / "far.agpc")
    np.testing.assert_array_equal(GPClassifier.load(tmp_path / "far.agpc").predict_proba(X)[:, 1], proba[1e154])


@pytest.mark.parametrize("raw, words", [("{not json", ["header", "JSON"]), ("[" * 100_000, ["header"]),
                                        ('{"version": ' + "1" * 5000 + "}", ["header"]),
                                        ('"a string"', ["format"])])
def test_a_header_that_is_not_a_json_object_is_refused(saved, tmp_path, raw, words):
    path = rewrite(saved, tmp_path, raw_header=raw)
    with pytest.raises(ValueError) as info:
        GPClassifier.load(path)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_a_member_declaring_petabytes_is_one_value_error(saved, tmp_path):
    path = rewrite(saved, tmp_path)
    write_npy_header(tmp_path / "posterior_h.npy", (2 ** 40, 2 ** 13))
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("payload.npy", (tmp_path / "posterior_h.npy").read_bytes())
    with pytest.raises(ValueError, match="'payload' declares shape") as info:
        GPClassifier.load(path)
    assert str(path) in str(info.value)


def test_a_member_larger_than_the_schema_allows_is_refused_before_it_is_inflated(saved, tmp_path, members_read):
    """A zip bomb: 3 MB of inducing points deflated to a few kB, which the archive's size allows, but the
    header (d features) and posterior_h (m inducing points) allow m x d values."""
    import io

    path = rewrite(saved, tmp_path, arrays={"inducing_points": None})
    m, d = saved[2]["inducing_points"].shape
    buffer = io.BytesIO()
    npy_format.write_array(buffer, np.zeros((200_000, d)))
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("inducing_points.npy", buffer.getvalue())
    expected = rf"'inducing_points.npy' declares shape \(200000, {d}\).* {m * d} values"
    with pytest.raises(ValueError, match=expected) as info:
        GPClassifier.load(path)
    assert str(path) in str(info.value)
    assert "inducing_points.npy" not in members_read


def test_a_header_larger_than_a_header_is_refused_before_it_is_read(saved, monkeypatch, members_read):
    monkeypatch.setattr(checkpoints, "MAX_HEADER_BYTES", 256)
    with pytest.raises(ValueError, match="'__agpc_header__.npy' declares a header of .* 256 at most"):
        GPClassifier.load(saved[0])
    assert members_read == []


def test_long_class_labels_are_refused_before_they_are_read(saved, tmp_path, members_read):
    path = rewrite(saved, tmp_path, arrays={"classes": np.asarray(["a" * 2000, "b"])})
    with pytest.raises(ValueError, match="'classes.npy' declares labels of 8,000 bytes"):
        GPClassifier.load(path)
    assert "classes.npy" not in members_read


# -- feature names -------------------------------------------------------------------------------------------

def _frames():
    """DataFrame libraries scikit-learn takes feature names from, those installed (pyarrow: a test dependency)."""
    makers = []
    try:
        import pyarrow as pa

        makers.append(("pyarrow", lambda columns: pa.table(columns)))
    except ImportError:
        pass
    try:
        import pandas as pd

        makers.append(("pandas", lambda columns: pd.DataFrame(columns)))
    except ImportError:
        pass
    return makers


@pytest.mark.parametrize("library, frame", _frames() or [pytest.param(None, None, marks=pytest.mark.skip(
    reason="neither pyarrow nor pandas is installed"))])
def test_feature_names_survive_save_and_load_and_reordered_columns_are_refused(tmp_path, library, frame):
    X, y = make_banana(120, random_state=3)
    columns = {"width": X[:, 0], "height": X[:, 1]}
    model = GPClassifier(n_inducing=5, max_iter=3, random_state=0).fit(frame(columns), y)
    model.save(tmp_path / "m.agpc")
    loaded = GPClassifier.load(tmp_path / "m.agpc")
    assert list(loaded.feature_names_in_) == ["width", "height"] and loaded.n_features_in_ == 2
    np.testing.assert_array_equal(loaded.predict_proba(frame(columns)), model.predict_proba(frame(columns)))
    with pytest.raises(ValueError, match="feature names"):
        loaded.predict_proba(frame({"height": X[:, 1], "width": X[:, 0]}))
    with pytest.raises(ValueError, match="feature names"):
        loaded.predict_proba(frame({"w": X[:, 0], "h": X[:, 1]}))


def test_a_model_fitted_on_an_array_has_no_feature_names_after_load(saved):
    assert not hasattr(GPClassifier.load(saved[0]), "feature_names_in_")


def test_the_payload_of_these_tests_is_armed(tmp_path):
    """The hostile files above are hostile: reading them the unsafe way runs the payload."""
    marker = tmp_path / "ran"
    np.save(tmp_path / "hostile.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
    np.load(tmp_path / "hostile.npy", allow_pickle=True)
    assert marker.exists()


# -- random corruptions (hypothesis): a ValueError naming the file, or a model that predicts probabilities ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers import JSON_VALUES  # noqa: E402


def assert_refused_or_sound(path):
    X_query = make_banana(10, random_state=9)[0]
    try:
        model = GPClassifier.load(path)
    except ValueError as exc:
        assert str(path) in str(exc)
        return
    proba = model.predict_proba(X_query)
    assert np.all(np.isfinite(proba)) and np.allclose(proba.sum(axis=1), 1.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["format", "version", "estimator", "params", "kernel", "kernel_params",
                              "n_features_in", "log_marginal_likelihood", "n_iter", "likelihood", "history",
                              "feature_names_in", "params.method", "params.jitter", "params.n_quadrature",
                              "params.blas_threads", "params.optimize", "params.checkpoint_path"]),
       value=JSON_VALUES)
def test_random_header_values_are_refused_or_harmless(saved, tmp_path, field, value):
    header = dict(saved[1])
    if field.startswith("params."):
        header["params"] = dict(header["params"], **{field.split(".", 1)[1]: value})
    else:
        header[field] = value
    path = rewrite(saved, tmp_path, raw_header=json.dumps(header))
    assert_refused_or_sound(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_byte_damage_is_refused_or_harmless(saved, tmp_path, data):
    raw = bytearray(saved[0].read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "damaged.agpc"
    path.write_bytes(bytes(raw))
    assert_refused_or_sound(path)


def test_a_prior_with_another_number_of_entries_than_features_is_refused_naming_the_file(saved, tmp_path):
    """The kernel's own check of a per-feature prior (two features, three centres) comes back as the model
    file's one error naming the file and the field, as every other field's does."""
    kernel = json.loads(json.dumps(saved[1]["kernel"]))
    kernel["priors"]["lengthscales"]["loc"] = [0.0, 0.1, 0.2]
    path = rewrite(saved, tmp_path, header={"kernel": kernel})
    with pytest.raises(ValueError, match="kernel: the prior on lengthscales lists 3 values") as refused:
        GPClassifier.load(path)
    assert str(path) in str(refused.value)


def test_a_zip_version_zipfile_does_not_read_is_refused(saved, tmp_path):
    """A damaged byte in a central directory entry's "version needed to extract" made zipfile raise
    NotImplementedError ("zip file version 6.4"), which escaped the reader (found by the test above)."""
    raw = bytearray(saved[0].read_bytes())
    entry = raw.find(b"PK\x01\x02")
    assert entry >= 0, "no central directory entry in a model file"
    raw[entry + 6] = 64  # the two bytes at offset 6: version needed to extract (6.4; zipfile reads up to 6.3)
    path = tmp_path / "version.agpc"
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="zip file version 6.4") as refused:
        GPClassifier.load(path)
    assert str(path) in str(refused.value)


def test_a_hostile_zarr_array_behind_a_symbolic_link_is_refused(tmp_path):
    pytest.importorskip("zarr")
    marker = tmp_path / "ran"
    hostile_zarr(tmp_path / "elsewhere.zarr", marker, {"id": "pickle", "protocol": 5})
    store = tmp_path / "linked.zarr"
    store.mkdir()
    (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    os.symlink(tmp_path / "elsewhere.zarr" / "y", store / "y")
    write_zarr2_array(store, "X", (3, 2), "<f8", None, np.arange(6.0).tobytes())
    with pytest.raises(ValueError, match="pickle codec"):
        untrusted.open_zarr(store)
    assert not marker.exists()


def test_an_npy_header_that_breaks_numpys_parser_is_one_value_error(tmp_path):
    """numpy parses the header as a Python literal; an unclosed brace escapes it as tokenize.TokenError."""
    header = b"{'descr': '<f8', 'shape': (3,"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    path = tmp_path / "broken.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 24)
    with pytest.raises(ValueError, match="no valid npy header") as info:
        untrusted.read_npy(path)
    assert str(path) in str(info.value)


def test_zarr_metadata_with_empty_chunks_is_refused_and_user_attributes_are_not_metadata(tmp_path):
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "d.zarr"
    group = zarr.open_group(str(store), mode="w")
    array = group.create_array("X", shape=(4, 2), chunks=(2, 2), dtype="f8")
    array[...] = np.ones((4, 2))
    array.attrs["codec"] = {"name": "pickle-rick", "chunks": "many"}  # a user's attribute names nothing
    np.testing.assert_array_equal(np.asarray(untrusted.open_zarr(store)["X"]), np.ones((4, 2)))
    document = json.loads((store / "X" / "zarr.json").read_text())
    document["chunk_grid"]["configuration"]["chunk_shape"] = [0, 2]  # zarr divides by it
    (store / "X" / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="chunks of shape"):
        untrusted.open_zarr(store)


def test_cli_outputs_are_flushed_to_disk_before_the_rename(tmp_path, monkeypatch, capsys):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    data = tmp_path / "x.npy"
    np.save(data, make_banana(5, random_state=0)[0])
    model = os.path.join(FIXTURES, "binary_banana.npz")
    assert main(["predict", model, str(data), "--out", str(tmp_path / "p.csv")]) == 0
    assert events[:2] == ["fsync", "replace"] and (tmp_path / "p.csv").exists()


def test_a_model_loads_from_an_open_file_as_from_its_path(saved):
    import io

    path = saved[0]
    with open(path, "rb") as fh:
        from_file = GPClassifier.load(fh)
    from_bytes = GPClassifier.load(io.BytesIO(path.read_bytes()))
    X_query = make_banana(10, random_state=9)[0]
    np.testing.assert_array_equal(from_file.predict_proba(X_query), GPClassifier.load(path).predict_proba(X_query))
    np.testing.assert_array_equal(from_bytes.predict_proba(X_query), from_file.predict_proba(X_query))
    with pytest.raises(ValueError, match="BytesIO.*not a valid agpc model file"):
        GPClassifier.load(io.BytesIO(b"PK\x03\x04 damaged"))
    with open(path) as fh, pytest.raises(ValueError, match=r"load_model: .* is open in text mode; a model file is "
                                                           r"binary \(open it with mode 'rb'\)"):
        GPClassifier.load(fh)  # (was: "not a valid agpc model file ... File is not a zip file")


def test_a_model_saves_to_a_binary_file_object_and_not_to_a_directory(saved, tmp_path):
    import io

    model = GPClassifier.load(saved[0])
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    X_query = make_banana(10, random_state=9)[0]
    np.testing.assert_array_equal(GPClassifier.load(buffer).predict_proba(X_query), model.predict_proba(X_query))
    with open(tmp_path / "m.agpc", "wb") as fh:
        model.save(fh)
    np.testing.assert_array_equal(GPClassifier.load(tmp_path / "m.agpc").predict_proba(X_query),
                                  model.predict_proba(X_query))
    with open(tmp_path / "t.agpc", "w") as fh, pytest.raises(ValueError, match="text mode"):
        model.save(fh)
    directory = tmp_path / "models"
    directory.mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match="is a directory") as info:
        model.save(directory)
    assert str(directory) in str(info.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no temporary file left beside it


def test_a_model_whose_jitter_was_raised_predicts_the_same_after_load(tmp_path, monkeypatch):
    """The guard may raise the jitter of K(Z, Z) during fit (duplicated inducing points, jitter 0): the model
    file keeps the jitter the fit ended with, so the loaded model factorises K(Z, Z) as the fitted one did."""
    import warnings

    from agpc import JitterWarning
    from agpc.datasets import make_banana

    from agpc import backend

    X, y = make_banana(80, random_state=0)
    Z = np.concatenate([X[:4], X[:4]])
    # the dtype's jitter floor (100 m eps) makes this Kmm factorise: without it, it is the guard's case
    monkeypatch.setattr(backend, "jitter_floor", lambda Z: 0.0)
    model = GPClassifier(method="ep", inducing=Z, jitter=0.0, max_iter=3, batch_size=None, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JitterWarning)
        model.fit(X, y)
        assert model.jitter_ > model.jitter  # the case this test is about
        model.save(tmp_path / "raised.npz")
        loaded = GPClassifier.load(tmp_path / "raised.npz")
        expected, got = model.predict_proba(X), loaded.predict_proba(X)
    assert loaded.jitter_ == model.jitter_
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


# -- the entry points: agpc.save_model / load_model, the estimator's fitted state ---------------------------


import agpc  # noqa: E402


def test_save_model_and_load_model_are_the_estimators_save_and_load(saved, tmp_path):
    model = GPClassifier.load(saved[0])
    X_query = make_banana(10, random_state=9)[0]
    agpc.save_model(model, tmp_path / "entry.agpc")
    loaded = agpc.load_model(tmp_path / "entry.agpc")
    assert type(loaded) is GPClassifier
    np.testing.assert_array_equal(loaded.predict_proba(X_query), model.predict_proba(X_query))
    with np.load(tmp_path / "entry.agpc") as written_by_entry, np.load(saved[0]) as written_by_save:
        # the same file as GPClassifier.save wrote (header and arrays; the zip's time stamps aside)
        assert sorted(written_by_entry.files) == sorted(written_by_save.files)
        for name in written_by_save.files:
            np.testing.assert_array_equal(written_by_entry[name], written_by_save[name])
    with pytest.raises(NotFittedError):
        agpc.save_model(GPClassifier(), tmp_path / "unfitted.agpc")
    assert not (tmp_path / "unfitted.agpc").exists()


@pytest.mark.parametrize("name", ["binary_banana", "multiclass_iris"])
def test_load_model_reads_version_1_files_as_the_estimator_does(name):
    expected = np.load(os.path.join(FIXTURES, f"{name}_expected.npz"))
    model = agpc.load_model(os.path.join(FIXTURES, f"{name}.npz"))
    np.testing.assert_allclose(model.predict_proba(expected["X"]), expected["proba"], rtol=1e-12, atol=1e-15)


def test_a_fitted_state_makes_an_unfitted_estimator_the_fitted_model(saved):
    """fitted_state / set_fitted_state are all the model file takes from and gives to the estimator: a new
    estimator with the same parameters given the state is the model."""
    model = GPClassifier.load(saved[0])
    copy = GPClassifier(**model.get_params()).set_fitted_state(model.fitted_state())
    X_query = make_banana(10, random_state=9)[0]
    np.testing.assert_array_equal(copy.predict_proba(X_query), model.predict_proba(X_query))
    for name in ("classes_", "n_features_in_", "jitter_", "likelihood_", "n_iter_", "history_"):
        np.testing.assert_array_equal(getattr(copy, name), getattr(model, name))
    with pytest.raises(NotFittedError):
        GPClassifier().fitted_state()


def test_check_params_refuses_what_fit_refuses():
    GPClassifier(method="ep", likelihood="probit").check_params()
    with pytest.raises(ValueError, match="probit"):
        GPClassifier(method="ep", likelihood="logistic").check_params()
    with pytest.raises(ValueError, match="n_inducing"):
        GPClassifier(n_inducing=0).check_params()



@pytest.mark.parametrize("added", ["class_weight", "classes"])
def test_a_model_pickled_before_a_parameter_existed_is_a_whole_estimator(added):
    """A model pickled by an agpc without ``class_weight`` / ``classes`` unpickles with the parameter at its default
    (what that agpc did): get_params, repr and clone work, and it predicts as it did."""
    X, y = make_banana(60, random_state=0)
    model = GPClassifier(n_inducing=5, max_iter=3, random_state=0).fit(X, y)
    state = dict(model.__getstate__())  # (a copy: the model's own __dict__ stays whole)
    del state[added]
    old = GPClassifier.__new__(GPClassifier)
    old.__setstate__(state)
    assert old.get_params()[added] is None
    assert "GPClassifier" in repr(old) and clone(old).get_params() == model.get_params()
    np.testing.assert_array_equal(old.predict_proba(X), model.predict_proba(X))


# -- a Pipeline of a StandardScaler and the classifier (issue 41, item 6) -------------------------------------

def _standardised_pipeline(frame=True):
    import pandas as pd
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 3)) * [1.0, 100.0, 1e4] + [0.0, 5.0, -3e4]
    y = (X[:, 0] + X[:, 1] / 100.0 > 0).astype(int)
    X = pd.DataFrame(X, columns=["a", "b", "c"]) if frame else X
    pipeline = make_pipeline(StandardScaler(), GPClassifier(n_inducing=5, max_iter=3, random_state=0))
    return pipeline.fit(X, y), X


def test_a_standardising_pipeline_is_saved_and_loaded_whole(tmp_path):
    """save_model(pipeline) keeps the scaler's numbers in the file (data, no pickle); load_model gives a Pipeline
    that predicts what the saved one did, on the raw features, its input columns named as before."""
    import agpc

    pipeline, X = _standardised_pipeline()
    path = tmp_path / "pipeline.agpc"
    agpc.save_model(pipeline, path)
    loaded = agpc.load_model(path)
    assert [name for name, _ in loaded.steps] == [name for name, _ in pipeline.steps]
    assert list(loaded.feature_names_in_) == ["a", "b", "c"]
    np.testing.assert_array_equal(loaded[0].mean_, pipeline[0].mean_)
    np.testing.assert_array_equal(loaded[0].scale_, pipeline[0].scale_)
    np.testing.assert_array_equal(loaded.predict_proba(X), pipeline.predict_proba(X))
    with pytest.raises(ValueError, match="holds a standardisation.*agpc.load_model"):
        GPClassifier.load(path)  # the classifier alone would predict on unscaled features


def test_a_pipeline_with_other_steps_is_refused_not_saved_without_them(tmp_path):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler

    import agpc

    X, y = make_banana(40, random_state=0)
    pipeline = make_pipeline(MinMaxScaler(), GPClassifier(n_inducing=4, max_iter=2, random_state=0)).fit(X, y)
    with pytest.raises(ValueError, match=r"steps are \['MinMaxScaler', 'GPClassifier'\].*pipeline\[-1\]"):
        agpc.save_model(pipeline, tmp_path / "m.agpc")
    with pytest.raises(TypeError, match="saves a fitted GPClassifier.*got a list"):
        agpc.save_model([pipeline], tmp_path / "m.agpc")
    assert not (tmp_path / "m.agpc").exists()


@pytest.fixture(scope="module")
def saved_pipeline(tmp_path_factory):
    """A standardising pipeline saved by this agpc: (its path, header and arrays as written, the pipeline, X)."""
    import agpc

    pipeline, X = _standardised_pipeline(frame=False)
    path = tmp_path_factory.mktemp("pipeline") / "good.agpc"
    agpc.save_model(pipeline, path)
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files if k != checkpoints.HEADER_KEY}
        header = json.loads(str(archive[checkpoints.HEADER_KEY]))
    return path, header, arrays, pipeline, X


def _scaled(name, change):
    """An array change of the saved scaler: ``change`` applied to a copy of its array ``name``."""
    return {f"scaler_{name}": lambda a: change(a[f"scaler_{name}"].copy())}


def _at(index, value):
    def change(values):
        values[index] = value
        return values
    return change


# A crafted scaler: (header["scaler"] changes, array changes (functions of the saved arrays; None removes one),
# words of the message). The saved scaler (with_mean and with_std, features of scales about 1, 100 and 1e4)
# holds mean, var and scale.
SCALER_CORRUPTIONS = {
    "scale zero": ({}, {"scaler_scale": lambda a: np.zeros(3)}, "scaler_scale: holds a scale that is not positive"),
    "mean NaN": ({}, {"scaler_mean": lambda a: np.full(3, np.nan)}, "scaler_mean: holds NaN"),
    "var too long": ({}, {"scaler_var": lambda a: np.ones(4)}, "scaler_var.npy' declares shape"),
    "var 2-D": ({}, {"scaler_var": lambda a: np.ones((1, 3))}, "scaler_var: shape"),
    "steps repeated": ({"steps": ["a", "a"]}, {}, "scaler.steps"),
    "with_mean an int": ({"with_mean": 1}, {}, "with_mean and with_std"),
    "unknown array": ({"arrays": ["mean", "code"]}, {}, "scaler.arrays"),
    # F1: the flags say which arrays a fitted StandardScaler has
    "with_std without scale": ({"arrays": ["mean", "var"]}, {"scaler_scale": lambda a: None},
                               "scaler.arrays: ['mean', 'var'], a StandardScaler with with_mean=True, with_std=True "
                               "has ['mean', 'var', 'scale']"),
    "with_mean without mean": ({"with_std": False, "arrays": ["var", "scale"]}, {"scaler_mean": lambda a: None},
                               "scaler.arrays: ['var', 'scale'], a StandardScaler with with_mean=True, "
                               "with_std=False has ['mean']"),
    "no arrays": ({"arrays": []}, {"scaler_mean": lambda a: None, "scaler_var": lambda a: None,
                                   "scaler_scale": lambda a: None}, "scaler.arrays: [], a StandardScaler"),
    "scale not sqrt(var)": ({}, _scaled("scale", lambda v: v * 1.001), "scaler_scale: feature 0's scale"),
    "constant feature's scale not 1": ({}, _scaled("var", _at(0, 0.0)), "scaler_scale: feature 0's scale"),
    # F2: scales and means that pass as numbers but leave no model (1e-300: every input 0.5; 1e308: overflow)
    "scale 1e-300": ({}, {**_scaled("scale", _at(0, 1e-300)), **_scaled("var", _at(0, 1e-600))},
                     "scaler_scale: a scale below"),
    "mean 1e308": ({}, _scaled("mean", lambda v: np.array([1e308, -1e308, v[2]])),
                   "scaler_scale: feature 0's scale"),
    # F5: step names are plain identifiers that are not the Pipeline's own parameters
    "steps named as Pipeline parameters": ({"steps": ["memory", "verbose"]}, {}, "scaler.steps: 'memory'"),
    "control characters in a step name": ({"steps": ["a\x1b[2J", "b"]}, {}, "scaler.steps: 'a\\x1b[2J'"),
}


@pytest.mark.parametrize("case", list(SCALER_CORRUPTIONS))
def test_a_crafted_scaler_is_refused_naming_the_field(saved_pipeline, tmp_path, case):
    import agpc

    header, changes, field = SCALER_CORRUPTIONS[case]
    _, base_header, base_arrays, _, _ = saved_pipeline
    base_header = dict(base_header, scaler=dict(base_header["scaler"], **header))
    with np.errstate(under="ignore"):
        arrays = {name: change(base_arrays) for name, change in changes.items()}
    path = rewrite((None, base_header, base_arrays), tmp_path, arrays=arrays)
    with pytest.raises(ValueError) as info:
        agpc.load_model(path)
    assert field in str(info.value) and str(path) in str(info.value), str(info.value)


def test_a_scaler_whose_pipeline_does_not_reach_its_inducing_points_is_refused(saved_pipeline, tmp_path):
    """F2: a first feature made constant (var 0, scale 1, as scikit-learn stores one) of mean 1e308: every field
    passes its own check, but 1e308 + x is 1e308 for every ordinary x, so the pipeline maps every input to 0 there
    and predicts nothing the classifier does (every real input: an overflow blamed on the input). The loader maps
    the inducing points back through the scaler and predicts through the whole pipeline: not what the classifier
    predicts at them, so the file is refused."""
    import agpc

    _, header, arrays, _, _ = saved_pipeline
    assert np.ptp(arrays["inducing_points"][:, 0]) > 0.1  # (their first coordinates are not all 0)
    path = rewrite((None, header, arrays), tmp_path, arrays={
        "scaler_mean": np.r_[1e308, arrays["scaler_mean"][1:]], "scaler_var": np.r_[0.0, arrays["scaler_var"][1:]],
        "scaler_scale": np.r_[1.0, arrays["scaler_scale"][1:]]})
    with pytest.raises(ValueError, match="scaler: the pipeline, at the inducing points") as info:
        agpc.load_model(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("with_mean, with_std", [(True, False), (False, True), (False, False)])
def test_every_standard_scaler_is_saved_and_loaded_whole(tmp_path, with_mean, with_std):
    """Each choice of a StandardScaler's flags (the arrays it has follow them) and a constant feature (var 0,
    scale 1) load and predict bit for bit as saved."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    import agpc

    X, y = make_banana(40, random_state=0)
    X = np.c_[X * [1.0, 1e3] + [5.0, -2e4], np.full(40, 7.5)]
    pipeline = make_pipeline(StandardScaler(with_mean=with_mean, with_std=with_std),
                             GPClassifier(n_inducing=4, max_iter=2, random_state=0)).fit(X, y)
    agpc.save_model(pipeline, tmp_path / "m.agpc")
    loaded = agpc.load_model(tmp_path / "m.agpc")
    np.testing.assert_array_equal(loaded.predict_proba(X), pipeline.predict_proba(X))


@pytest.mark.parametrize("version, scaler, words", [
    (4, None, "version 4 holds a scaler"),
    (3, "kept", "scaler: format version 3 holds no scaler"),
])
def test_a_scaler_is_in_the_files_of_version_4_only(saved, saved_pipeline, tmp_path, version, scaler, words):
    """The writer writes version 4 exactly when the file holds a scaler (else 3): a version 4 header without one,
    or an older header with one (which that version would silently drop), is not a file it wrote."""
    import agpc

    header = dict(saved[1], version=version)
    if scaler is not None:
        header["scaler"] = saved_pipeline[1]["scaler"]
    with pytest.raises(ValueError, match=words) as info:
        agpc.load_model(rewrite((None, header, saved[2]), tmp_path))
    assert "not a valid agpc model file" in str(info.value)


def test_a_pipeline_whose_scaler_has_other_features_is_refused_before_writing(saved_pipeline, tmp_path):
    """F3: a scaler of 4 features before a classifier of 3 cannot predict; the file it would write cannot be loaded,
    and writing it would replace the good file there."""
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    import agpc

    good, _, _, pipeline, X = saved_pipeline
    path = tmp_path / "m.agpc"
    path.write_bytes(good.read_bytes())
    wider = Pipeline([("standardscaler", StandardScaler().fit(np.c_[X, X[:, :1]])), ("gpclassifier", pipeline[-1])])
    with pytest.raises(ValueError, match="its StandardScaler has 4 features, its GPClassifier 3"):
        agpc.save_model(wider, path)
    assert path.read_bytes() == good.read_bytes()


def test_a_step_name_that_is_not_an_identifier_is_refused_before_writing(saved_pipeline, tmp_path):
    """F5: a name the loader would refuse is not written (a file that saves must load)."""
    from sklearn.pipeline import Pipeline

    import agpc

    _, _, _, pipeline, _ = saved_pipeline
    renamed = Pipeline([("scale\x1b[2J", pipeline[0]), ("gpclassifier", pipeline[-1])])
    with pytest.raises(ValueError, match="step names.*identifiers"):
        agpc.save_model(renamed, tmp_path / "m.agpc")
    assert not (tmp_path / "m.agpc").exists()


def test_saving_and_loading_a_plain_classifier_imports_no_pipeline_module(saved, tmp_path):
    """F17: sklearn.pipeline and sklearn.preprocessing (about 80 modules, 60-70 ms) are imported only where a
    Pipeline is saved or loaded."""
    import subprocess
    import sys

    code = ("import sys, agpc; m = agpc.load_model(sys.argv[1]); agpc.save_model(m, sys.argv[2]); "
            "print(sorted(name for name in ('sklearn.pipeline', 'sklearn.preprocessing') if name in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(saved[0]), str(tmp_path / "copy.agpc")], check=True,
                         capture_output=True, text=True, cwd=os.path.dirname(HERE)).stdout
    assert out.strip() == "[]"
    assert (tmp_path / "copy.agpc").exists()


@pytest.mark.parametrize("change, message", [
    (dict(n_quadrature="abc"), r"n_quadrature must be an int in \[1, 1000\]"),
    (dict(classes=[7, 8]), r"classes= gives the order of ordered classes"),
    (dict(method="svi", likelihood="logistic"), r"the model was fitted with the 'probit' likelihood, and its "
                                                r"parameters set since \(method 'svi', likelihood 'logistic'\) fit "
                                                r"'logistic': set them back, or fit again, before saving"),
])
def test_parameters_set_since_the_fit_that_load_would_refuse_are_refused_at_save(tmp_path, change, message):
    """A hostile-input audit (2026-12-02): ``save_model`` wrote a model whose parameters, set after the fit, the
    loader refuses (bad values, or a method and likelihood that fit another likelihood than the model's): the file
    was found unreadable only when loaded. Now refused at save, nothing written."""
    import pickle

    X, y = make_banana(80, random_state=0)
    model = pickle.loads(pickle.dumps(GPClassifier(n_inducing=4, max_iter=2, random_state=0).fit(X, y)))
    model.set_params(**change)
    for save in (lambda path: agpc.save_model(model, path), model.save):
        with pytest.raises(ValueError, match=message):
            save(tmp_path / "m.agpc")
        assert not list(tmp_path.iterdir())


def test_a_path_argument_of_the_wrong_kind_is_one_value_error(tmp_path):
    """A hostile-input audit (2026-12-02): ``load_model(None)`` and ``save_model(model, None)`` raised os.stat's
    TypeError; a file's bytes given as its name got a message of the whole file's bytes; saving to a file open for
    reading raised io.UnsupportedOperation; a name in bytes failed in the zip reader (AttributeError)."""
    import io

    X, y = make_banana(80, random_state=0)
    model = GPClassifier(n_inducing=4, max_iter=2, random_state=0).fit(X, y)
    path = tmp_path / "m.agpc"
    agpc.save_model(model, path)
    with pytest.raises(ValueError, match=r"^load_model: a file name or a binary file object, got NoneType$"):
        agpc.load_model(None)
    with pytest.raises(ValueError, match=r"^save_model: a file name or a binary file object open for writing, got "
                                         r"NoneType$"):
        agpc.save_model(model, None)
    contents = path.read_bytes()
    with pytest.raises(ValueError, match=r"^load_model: a bytes object of [\d,]+ bytes holding NUL is no file name "
                                         r"\(a file's contents\? wrap them in io.BytesIO\)$"):
        agpc.load_model(contents)
    with open(path, "rb") as reading, pytest.raises(ValueError, match=r"m\.agpc is not open for writing \(open it "
                                                                      r"with mode 'wb'\)"):
        model.save(reading)
    assert path.read_bytes() == contents
    expected = model.predict_proba(X)
    np.testing.assert_array_equal(agpc.load_model(io.BytesIO(contents)).predict_proba(X), expected)
    agpc.save_model(model, os.fsencode(tmp_path / "bytes.agpc"))
    np.testing.assert_array_equal(agpc.load_model(os.fsencode(tmp_path / "bytes.agpc")).predict_proba(X), expected)


def test_a_save_checks_only_what_load_would_refuse(tmp_path):
    """The review of this stop's fixes (2026-12-02): ``save`` ran ``check_params``, all of fit's checks, so a model
    fitted on CuPy and loaded where CuPy cannot run predicted but could not be saved again (the device check), and a
    model with the deprecated ``step_replay`` warned at every save (an error under -W error). A save refuses what
    ``load_model`` refuses, nothing else."""
    X, y = make_banana(80, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = GPClassifier(n_inducing=4, max_iter=2, random_state=0, step_replay=True).fit(X, y)
    model.set_params(backend="cupy")  # (as a model fitted on CuPy is, loaded on a machine without CuPy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save(tmp_path / "m.agpc")
        agpc.save_model(model, tmp_path / "m2.agpc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        np.testing.assert_array_equal(agpc.load_model(tmp_path / "m.agpc").predict_proba(X), model.predict_proba(X))


def test_a_kernel_the_loader_would_refuse_is_not_saved(tmp_path):
    """A kernel nested deeper than a model file may describe (sums and products, 8 deep) fitted, saved, and
    load_model then refused its own file ("unknown kernel specification"); so did a Sum of 1,101 terms. The save
    reads the description as the loader will, and refuses it before writing anything."""
    X, y = make_banana(40, random_state=4)
    RBF = agpc.RBF
    kernel = RBF(1.0)
    for _ in range(5):
        kernel = (kernel + RBF(1.0)) * RBF(1.0)
    model = GPClassifier(kernel=kernel, n_inducing=4, max_iter=1, random_state=0).fit(X, y)
    path = tmp_path / "deep.agpc"
    with pytest.raises(ValueError, match="could not be loaded back from a model file .*nested deeper than the 8"):
        model.save(path)
    assert list(tmp_path.iterdir()) == []
    shallow = GPClassifier(kernel=(RBF(1.0) + RBF(1.0)) * RBF(1.0), n_inducing=4, max_iter=1, random_state=0)
    shallow.fit(X, y).save(path)
    np.testing.assert_allclose(agpc.load_model(path).predict_proba(X), shallow.predict_proba(X))


def test_a_fit_of_max_iter_0_saves_and_loads(tmp_path):
    """The mutation audit of 2026-12-04: a fit of ``max_iter=0`` records 0 warm-up sweeps of its 0 iterations
    (n_warmup equal to n_iter, as many as the iterations they are part of): its file loads and predicts as it does."""
    X, y = make_banana(120, random_state=3)
    model = GPClassifier(n_inducing=5, max_iter=0, random_state=0).fit(X, y)
    assert model.n_iter_ == 0 and model.n_warmup_ == 0
    model.save(tmp_path / "m.agpc")
    loaded = GPClassifier.load(tmp_path / "m.agpc")
    assert loaded.n_warmup_ == 0
    np.testing.assert_allclose(loaded.predict_proba(X[:5]), model.predict_proba(X[:5]), rtol=1e-12)


@pytest.mark.parametrize("name", ["log_noise", "log_amplitude", "log_lengthscales"])
def test_a_kernel_parameter_out_of_the_floats_is_not_saved(tmp_path, name):
    """The hostile-input audit of 2026-12-04: a fit at Adam's learning rate 1e3 ended with a latent noise of exp(767),
    inf, and ``save_model`` wrote a file that ``load_model`` refused ("whose exp is inf in float64"). Saving refuses
    it, naming the parameter, and writes nothing; so for lengthscales, which a model file bounds as well."""
    X, y = make_banana(120, random_state=3)
    model = GPClassifier(n_inducing=5, max_iter=2, random_state=0).fit(X, y)
    model.kernel_ = model.kernel_.with_params({**model.kernel_.params,
                                               name: np.full_like(model.kernel_.params[name], 767.0)})
    path = tmp_path / "m.agpc"
    with pytest.raises(ValueError, match=rf"save_model: .*kernel_{name} .*767, whose exp is inf in float64\)"):
        model.save(path)
    assert not path.exists()
