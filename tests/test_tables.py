"""agpc.tables, the reader of data files behind the ``agpc`` command: what it reads (features, labels exactly as
written, column names) and that every problem with a file is one TableError naming the file, row and column.
The command's use of it (exit status 2, nothing written) is tested in test_cli.py."""

import re
import tracemalloc

import numpy as np
import pytest

from agpc import tables
from agpc.cli import main
from agpc.datasets import make_banana
from agpc.tables import TableError, load_data
from helpers import write_csv, write_table


@pytest.fixture(scope="module")
def banana():
    return make_banana(60, random_state=0)


def write_npz(path, X, y):
    np.savez(path, X=X, y=y)
    return path


def write_zarr(path, X, y):
    zarr = pytest.importorskip("zarr")
    group = zarr.open_group(str(path), mode="w")
    group.create_array("X", data=X, chunks=(20, 2))
    group.create_array("y", data=y)
    return path


def test_every_format_reads_the_same_table(tmp_path, banana):
    X, y = banana
    np.save(tmp_path / "d.npy", np.column_stack([X, y]))
    files = {"csv": (write_csv(tmp_path / "d.csv", X, y), "label"), "npz": (write_npz(tmp_path / "d.npz", X, y), None),
             "npy": (tmp_path / "d.npy", "2")}
    for kind, (path, target) in files.items():
        X_read, y_read, names = load_data(path, target, labels_required=True)
        np.testing.assert_array_equal(X_read, X, err_msg=kind)
        np.testing.assert_array_equal(y_read, y.astype(np.int64), err_msg=kind)
        assert y_read.dtype == np.int64, kind  # whole numbers are integers, never floats
        assert names == (["x1", "x2"] if kind == "csv" else None)


def test_a_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path, banana):
    data = write_csv(tmp_path / "bom.csv", *banana)
    data.write_bytes(b"\xef\xbb\xbf" + data.read_bytes())  # as spreadsheet programs write UTF-8
    X, y, names = load_data(data, "label")
    assert names == ["x1", "x2"]
    np.testing.assert_array_equal(X, banana[0])
    assert load_data(data, "x1").feature_names == ["x2", "label"]


def test_byte_order_marks_at_the_start_are_none_of_the_header_and_one_elsewhere_is_shown_escaped(tmp_path, banana):
    """A careless-input audit: a file saved with a byte order mark twice kept the second in its first column's name
    (utf-8-sig drops one), and a message showed that name with U+FEFF unescaped, invisible: "no column 'x1'" of a
    file whose columns read "x1, x2"."""
    data = write_csv(tmp_path / "bom.csv", *banana)
    data.write_bytes(b"\xef\xbb\xbf" * 2 + data.read_bytes())
    X, _, names = load_data(data, "label")
    assert names == ["x1", "x2"]
    np.testing.assert_array_equal(X, banana[0])
    data.write_text(data.read_text(encoding="utf-8-sig").lstrip("\ufeff").replace("x2", "\ufeffx2", 1))
    with pytest.raises(TableError) as refused:
        load_data(data, "x3")
    assert "columns: x1, \\ufeffx2, label" in str(refused.value) and "\ufeff" not in str(refused.value)


def test_a_models_feature_names_select_the_columns_by_name(tmp_path, banana):
    X, y = banana
    data = write_table(tmp_path / "d.csv", {"label": y, "x2": X[:, 1], "note": ["a"] * len(y), "x1": X[:, 0]})
    X_read, y_read, names = load_data(data, "label", features=["x1", "x2"])
    np.testing.assert_array_equal(X_read, X)
    assert names == ["x1", "x2"] and y_read.tolist() == y.astype(int).tolist()
    with pytest.raises(TableError, match="no column 'x3', which the model was trained on"):
        load_data(data, None, features=["x1", "x3"])


def test_names_given_for_a_csv_file_are_read_as_its_header_is(tmp_path, banana):
    """A header "x1, x2, w, label" is read as x1, x2, w, label (every cell without the spaces around it), where
    pandas' read_csv keeps " x2": --target " label", --weight-column " w" and a model's feature names from such a
    DataFrame named no column of the file (a careless-input audit). Each is now read as the header is; two feature
    names that become one are one error naming both, not one column taken twice."""
    X, y = banana
    data = tmp_path / "spaced.csv"
    data.write_text("x1, x2, w, label\n" + "".join(f"{a!r}, {b!r}, 2.0, {c}\n" for (a, b), c in zip(X.tolist(), y)))
    X_read, y_read, names = load_data(data, " label", features=["x1", " x2"])
    np.testing.assert_array_equal(X_read, X)
    assert names == ["x1", "x2"] and y_read.tolist() == y.astype(int).tolist()
    (X_read, y_read, names), weights = tables.load_weighted_data(data, " label ", " w")
    assert names == ["x1", "x2"] and weights.tolist() == [2.0] * len(y)
    with pytest.raises(TableError, match=r"the model's features 'x2' and ' x2' are both the column 'x2' of a CSV "
                                         r"file \(agpc reads a header cell without the spaces around it\)"):
        load_data(data, "label", features=["x2", " x2"])


@pytest.mark.parametrize("cell, column, what", [(2, "label", "label"), (0, "x1", "feature"), (1, "x2", "feature")])
def test_an_empty_cell_is_one_error_naming_file_line_and_column(tmp_path, banana, cell, column, what):
    X, y = banana
    data = write_csv(tmp_path / "holes.csv", X, y)
    lines = data.read_text().splitlines()
    fields = lines[6].split(",")
    fields[cell] = "  "  # blank: as empty as ''
    lines[6] = ",".join(fields)
    lines[9] = ",".join("" if i == cell else f for i, f in enumerate(lines[9].split(",")))
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(TableError) as refused:
        load_data(data, "label", labels_required=True)
    assert f"holes.csv: line 7, {what} column '{column}': missing value, an empty cell (and 1 more rows)" in str(
        refused.value)


@pytest.mark.parametrize("empty", [",,", " , , ", ",,,,,"])
def test_a_line_of_empty_cells_is_an_error_and_a_blank_line_is_no_row(tmp_path, banana, capsys, empty):
    """",," or ",,,,," between data rows was dropped silently (exit 0, fewer training rows), where docs/usage.md says
    an empty cell is an error naming its line and column: it is now (a wrong number of fields, the error of that);
    a blank line (nothing, or spaces) is still no row."""
    X, y = banana
    data = write_csv(tmp_path / "gaps.csv", X, y)
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines[:5] + ["", "   "] + lines[5:]) + "\n")  # blank lines: no rows
    X_read, y_read, _ = load_data(data, "label")
    np.testing.assert_array_equal(X_read, X)
    data.write_text("\n".join(lines[:5] + [empty] + lines[5:]) + "\n")
    expected = ("line 6, feature column 'x1': missing value, an empty cell" if empty.count(",") == 2
                else "line 6 has 6 fields but the header has 3")
    with pytest.raises(TableError, match=expected):
        load_data(data, "label")
    status = main(["fit", str(data), "--target", "label", "--quiet", "--out", str(tmp_path / "m.agpc")])
    assert status == 2 and expected in capsys.readouterr().err and not (tmp_path / "m.agpc").exists()


def test_a_label_that_often_marks_a_missing_value_is_warned_about(tmp_path, banana):
    X, y = banana
    labels = np.where(y > 0, "yes", "no").astype(object)
    labels[[3, 8]] = "N/A"
    data = write_csv(tmp_path / "d.csv", X, labels)
    with pytest.warns(UserWarning, match=r"label column 'label' holds 'N/A', taken as a class of its own"):
        _, y_read, _ = load_data(data, "label")
    assert sorted(set(y_read.tolist())) == ["N/A", "no", "yes"]


def test_a_nan_label_in_an_npz_is_an_error_naming_the_row(tmp_path, banana):
    X, y = banana
    np.savez(tmp_path / "d.npz", X=X, y=np.where(np.arange(len(y)) == 7, np.nan, y.astype(float)))
    with pytest.raises(TableError, match="data row 8, label column 'y': missing value, nan"):
        load_data(tmp_path / "d.npz", labels_required=True)


def test_float16_labels_are_whole_numbers_without_an_overflow_warning(tmp_path, banana):
    """Labels 0.0 and 1.0 in float16 (the range check cast int64's bounds to float16) printed 'agpc: warning:
    RuntimeWarning: overflow encountered in cast' on a fit that went on to succeed."""
    X, y = banana
    np.savez(tmp_path / "d.npz", X=X, y=y.astype(np.float16))
    _, y_read, _ = load_data(tmp_path / "d.npz", labels_required=True)  # (RuntimeWarnings are errors here)
    assert y_read.dtype == np.int64 and y_read.tolist() == y.astype(int).tolist()


@pytest.mark.parametrize("writer, suffix", [(write_npz, ".npz"), (write_zarr, ".zarr")], ids=["npz", "zarr"])
def test_a_column_of_labels_is_taken_as_1d_and_other_2d_labels_are_refused(tmp_path, banana, writer, suffix):
    X, y = banana
    column = writer(tmp_path / f"column{suffix}", X, y.reshape(-1, 1))
    wide = writer(tmp_path / f"wide{suffix}", X, np.column_stack([y, y]))
    _, y_read, _ = load_data(column, labels_required=True)
    assert y_read.tolist() == y.astype(int).tolist()
    with pytest.raises(TableError, match=rf"label array 'y' has shape \({len(y)}, 2\)"):
        load_data(wide, labels_required=True)


def test_a_null_label_in_parquet_is_an_error_not_a_class(tmp_path, banana):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y = banana
    labels = [None if i == 4 else ("cat" if v > 0 else "dog") for i, v in enumerate(y)]
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "cls": labels}), tmp_path / "d.parquet")
    with pytest.raises(TableError, match="data row 5, label column 'cls': missing value, a null"):
        load_data(tmp_path / "d.parquet", "cls", labels_required=True)
    # (a hostile-input audit, 2026-12-02: a null in a column of numbers was read as NaN and said to be "nan")
    numbers = pa.array([None if i == 4 else int(v > 0) for i, v in enumerate(y)], pa.int64())
    feature = pa.array([None if i == 7 else v for i, v in enumerate(X[:, 0].tolist())], pa.float64())
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "cls": numbers}), tmp_path / "n.parquet")
    with pytest.raises(TableError, match="data row 5, label column 'cls': missing value, a null"):
        load_data(tmp_path / "n.parquet", "cls", labels_required=True)
    pq.write_table(pa.table({"a": feature, "b": X[:, 1], "cls": numbers}), tmp_path / "f.parquet")
    with pytest.raises(TableError, match="data row 8, feature column 'a': missing value, a null"):
        load_data(tmp_path / "f.parquet", "cls", labels_required=True)


@pytest.mark.parametrize("cell", ["2\x00", "\x002", "2\x005"])
def test_a_nul_byte_in_a_csv_cell_is_an_error_naming_line_and_column(tmp_path, banana, cell):
    X, y = banana
    data = write_csv(tmp_path / "d.csv", X, y, names=("a", "b", "label"))
    lines = data.read_text().splitlines()
    lines[3] = lines[3].split(",", 1)[0] + f",{cell}," + lines[3].rsplit(",", 1)[1]
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(TableError, match="line 4, column 'b'.*NUL byte"):
        load_data(data, "label", labels_required=True)


def test_parquet_columns_sharing_a_name_are_one_line_naming_them(tmp_path, banana):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y = banana
    pq.write_table(pa.table([X[:, 0], X[:, 1], y], names=["a", "a", "cls"]), tmp_path / "d.parquet")
    with pytest.raises(ValueError) as refused:  # agpc.untrusted's refusal: one line naming the file
        load_data(tmp_path / "d.parquet", "cls", labels_required=True)
    message = str(refused.value)
    assert "names more than one column 'a' (2 times)" in message and "__fragment_index" not in message
    assert "\n" not in message


def test_a_header_of_numbers_is_warned_about(tmp_path, banana):
    data = write_table(tmp_path / "d.csv", {"1.5": banana[0][:, 0], "2": banana[0][:, 1], "3": banana[1]})
    with pytest.warns(UserWarning, match="looks like data"):
        assert load_data(data, "3").feature_names == ["1.5", "2"]


@pytest.mark.parametrize("header, message", [("x1,x1,label", "names column 'x1' 2 times"),
                                             ("x1,,label", "column 2 has no name")])
def test_feature_columns_need_names_of_their_own(tmp_path, banana, header, message):
    data = write_csv(tmp_path / "d.csv", *banana, names=header.split(","))
    with pytest.raises(TableError, match=message):
        load_data(data, "label", labels_required=True)


def _csv_with(feature, label):
    return f"x1,x2,label\n0.1,0.2,1\n0.3,0.4,-1\n{feature},0.6,{label}\n0.7,0.8,1\n"


@pytest.mark.parametrize("name, content, message", [
    ("d.txt", "1,2\n", "unknown data format '.txt'"),
    ("empty.csv", "", "the file is empty"),
    ("ragged.csv", "x1,x2,label\n1.0,2.0,0\n3.0,1\n", "line 3 has 2 fields but the header has 3"),
    ("header.csv", "x1,x2,label\n", "no data rows below the header"),
    ("d.csv", _csv_with("0.5", "nan"), "line 4, label column 'label': missing value, 'nan'"),
    ("d.csv", _csv_with("NaN", "1"), "line 4, feature column 'x1': missing value, 'NaN'"),
    ("d.csv", _csv_with("NA", "1"),
     "line 4, feature column 'x1' is not numeric (value 'NA'); fill in or drop rows with missing values"),
    ("d.csv", _csv_with("high", "1"), "line 4, feature column 'x1' is not numeric (value 'high'); features must be numbers"),
])
def test_a_file_that_cannot_be_read_is_one_error_naming_it(tmp_path, name, content, message):
    """A file that is no table, or a missing value (or a marker of one) in a column that is used: one line naming
    the file, and the line and column where there is one."""
    (tmp_path / name).write_text(content)
    with pytest.raises(TableError) as refused:
        load_data(tmp_path / name, "label", labels_required=True)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith(str(tmp_path / name))
    assert isinstance(refused.value, ValueError)  # the command reports it as bad input, exit status 2


@pytest.mark.parametrize("record", ["commas", "quoted field over lines", "one long field"])
def test_a_long_csv_line_is_refused_within_memory_of_its_bound(tmp_path, monkeypatch, record):
    """A CSV line of 1 GB of commas took 15.6 GB before it was killed (the csv module holds ~30 bytes a field): a
    record past ``tables.MAX_RECORD_CHARS`` is one TableError naming the file and its line, and reading it takes
    memory of the bound's order, not the line's (here a 4 MB record under a bound of 64 Ki characters)."""
    monkeypatch.setattr(tables, "MAX_RECORD_CHARS", 1 << 16)
    big = 4 << 20
    body = {"commas": "," * big, "quoted field over lines": '"' + "x\n" * (big // 2) + '",1,2',
            "one long field": "7" * big + ",1,2"}[record]
    path = tmp_path / "long.csv"
    path.write_text("x1,x2,label\n1,2,0\n3,4,1\n" + body + "\n5,6,0\n")
    tracemalloc.start()
    try:
        with pytest.raises(TableError, match=r"long\.csv: line 4 is longer than 65,536 characters"):
            load_data(path, "label")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, f"{peak:,} bytes to refuse a record of {big:,} characters"


def _loaded_within(path, times):
    """``load_data(path, "label")``, its peak of traced memory checked below ``times`` the file's size."""
    tracemalloc.start()
    try:
        data = load_data(path, "label")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < times * path.stat().st_size, f"{peak:,} bytes to read a file of {path.stat().st_size:,}"
    return data


def test_a_csv_file_is_read_within_a_bounded_multiple_of_its_size(tmp_path, monkeypatch):
    """Every cell of a CSV file was a Python string until the whole file was read: 14.8 times the file's size at the
    peak (tracemalloc; 30,000 rows x 11 columns of numbers, 3.1 MB), 14 times in RSS at 200,000 rows. Rows are now
    turned into arrays CSV_CHUNK_ROWS at a time (7.6 times), the values and the errors' line numbers as before, and
    held as UTF-8 bytes (a byte a character, not NumPy text's four), a column of numbers read into floats from them:
    4.1 times (200,000 x 21, 38 MB: 294 -> 111 MB of peak RSS growth), and each column let go once in the table: 2.5
    times (81 MB). A file of categories holds one string a level, not one a cell: 9.3 -> 4.4 times."""
    monkeypatch.setattr(tables, "CSV_CHUNK_ROWS", 512)  # (several chunks of a small file, as of a large one)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6000, 10))
    path = tmp_path / "numbers.csv"
    np.savetxt(path, np.column_stack([X, X[:, 0] > 0]), delimiter=",", fmt="%.6f",
               header=",".join([f"x{j}" for j in range(10)] + ["label"]), comments="")
    data = _loaded_within(path, 3.2)
    np.testing.assert_allclose(data.X, np.round(X, 6))
    assert data.feature_names == [f"x{j}" for j in range(10)]
    broken = path.read_text().splitlines()
    broken[1500] += ",7"  # (a row of the third chunk: its line named as before)
    path.write_text("\n".join(broken) + "\n")
    with pytest.raises(TableError, match=r"numbers\.csv: line 1501 has 12 fields but the header has 11"):
        load_data(path, "label")
    codes = rng.integers(0, 40, size=(6000, 5))
    path = tmp_path / "levels.csv"
    path.write_text(",".join([f"c{j}" for j in range(5)] + [f"x{j}" for j in range(5)] + ["label"]) + "\n" + "".join(
        ",".join([*(f"level_{c}" for c in codes[i]), *(f"{v:.6f}" for v in X[i, :5]), str(int(X[i, 0] > 0))]) + "\n"
        for i in range(6000)))
    data = _loaded_within(path, 6)
    assert data.X[:, 0].tolist() == [f"level_{c}" for c in codes[:, 0]]


def test_csv_text_beyond_ascii_reads_as_written(tmp_path, monkeypatch):
    """The cells held as UTF-8 bytes come back as the text written: levels and labels beyond ASCII, a "nan" that
    marks a missing value named from its text, in a chunk after columns of numbers. (A column of numbers in another
    script's digits, which Python's float reads, was read so too; it is refused now, as labels so written are text:
    ``test_features_in_other_scripts_digits_are_refused_as_labels_so_written_are_not_numbers``.)"""
    monkeypatch.setattr(tables, "CSV_CHUNK_ROWS", 2)
    path = tmp_path / "words.csv"
    path.write_text("colour,n,x,label\ncafé,12,1.5,ja\nrot,3,2.5,nein\ncafé,4,-1,ja\nblau,7,0,später\n",
                    encoding="utf-8")
    data = load_data(path, "label")
    assert data.X[:, 0].tolist() == ["café", "rot", "café", "blau"]
    assert data.X[:, 1].tolist() == [12.0, 3.0, 4.0, 7.0] and data.X[:, 2].tolist() == [1.5, 2.5, -1.0, 0.0]
    assert data.y.tolist() == ["ja", "nein", "ja", "später"]
    path.write_text("n,x,label\n1,2,0\n2,3,1\n3,nan,0\n", encoding="utf-8")
    with pytest.raises(TableError, match=r"line 4, feature column 'x': missing value, 'nan'"):
        load_data(path, "label")


def test_other_files_columns_are_judged_as_they_come(tmp_path):
    """CSV's bytes are CSV's alone (a review, 2026-12-04: Parquet's float32 columns came back float32, and a NaN in a
    Parquet column lost its named missing-value error, once numbers were taken as read for every file)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"a": np.array([1.5, 2.5], np.float32), "y": [0, 1]}), path)
    assert load_data(path, "y").X.dtype == np.float64
    pq.write_table(pa.table({"a": np.array([1.0, np.nan]), "b": [1.0, 2.0], "y": [0, 1]}), path)
    with pytest.raises(TableError, match=r"data row 2, feature column 'a': missing value, nan"):
        load_data(path, "y")


def test_a_csv_field_beyond_the_csv_modules_limit_names_its_line(tmp_path):
    path = tmp_path / "wide.csv"
    path.write_text('x1,x2,label\n1,2,0\n"' + "9" * 200_000 + '",2,1\n')
    with pytest.raises(TableError, match=r"wide\.csv: line 3: field larger than field limit"):
        load_data(path, "label")


NOT_UTF8 = {
    "Latin-1 on line 4": (b"a,b,label\n1,2,0\n2,3,1\ncaf\xe9,4,1\n", r"line 4 is not UTF-8 \(byte 0xe9\)"),
    # past the text reader's 8 KB blocks, whose decoder named an offset into its block
    "Latin-1 on line 3001": (b"a,b,label\n" + b"".join(b"%d,%d,%d\n" % (i, i % 7, i % 2) for i in range(2999))
                             + b"caf\xe9,1,0\n" + b"5,5,1\n" * 2000, r"line 3001 is not UTF-8 \(byte 0xe9\)"),
    "a character cut at the end": (b"a,b,label\n1,2,0\n\xc3", r"line 3 is not UTF-8 \(byte 0xc3\)"),
}


@pytest.mark.parametrize("content, words", NOT_UTF8.values(), ids=NOT_UTF8)
def test_a_csv_file_that_is_not_utf8_is_told_its_line_and_what_to_do(tmp_path, content, words):
    """A hostile-input audit (2026-12-02): a Latin-1 CSV was refused with Python's "'utf-8' codec can't decode byte
    0xe9 in position 25", an offset into the block the decoder read, not a line of the file."""
    path = tmp_path / "latin.csv"
    path.write_bytes(content)
    with pytest.raises(TableError, match=words + r": agpc reads CSV files as UTF-8; save the file as UTF-8"):
        load_data(path, "label")


def test_a_directory_without_zarr_metadata_is_told_what_agpc_reads(tmp_path, capsys):
    """``agpc fit DIR`` on a directory that is not a zarr store said zarr's "GroupNotFoundError: No group found in
    store StorePath(LocalStore, ...)"."""
    (tmp_path / "data" / "part").mkdir(parents=True)
    assert main(["fit", str(tmp_path / "data"), "--target", "label", "--out", str(tmp_path / "m.agpc")]) == 2
    err = capsys.readouterr().err
    assert "a directory without zarr metadata (zarr.json, or .zgroup / .zarray)" in err
    assert "give a data file (CSV, Parquet, .npy, .npz) or a zarr store's directory" in err and "LocalStore" not in err


def test_a_utf16_csv_is_told_so_not_advised_as_latin1(tmp_path):
    """An adversarial review (2026-12-02): a UTF-16 file was told to convert "iconv -f latin1", which would be wrong."""
    path = tmp_path / "wide.csv"
    path.write_bytes("a,b,label\n1,2,0\n".encode("utf-16"))
    with pytest.raises(TableError, match=r"the file is UTF-16 \(it starts with UTF-16's byte order mark\).*iconv -f "
                                         "utf-16 -t utf-8"):
        load_data(path, "label")


@pytest.mark.parametrize("where", ["middle", "last line"])
def test_a_quote_never_closed_is_an_error_naming_its_line_not_a_class(tmp_path, where):
    """A hostile-input audit (2026-12-02): csv's lenient reader took the rest of the file after an opening quote
    into one field, so a truncated file's last rows became one label, a class of their own: 41 rows and three classes
    trained from an 80-row, two-class file, silently. The quote's line is named now."""
    rows = [f"{i},{i % 5},{i % 2}" for i in range(40)]
    lines = rows + ['1,2,"1'] + (rows if where == "middle" else [])
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n" + "\n".join(lines) + "\n")
    with pytest.raises(TableError, match=r"d\.csv: line 42: a quoted field is not closed"):
        load_data(path, "label")
    path.write_text('a,b,label\n1,"2",0\n3,4,"1"\n')  # (quoted fields that close are read as before)
    X, y, _ = load_data(path, "label")
    assert X.tolist() == [[1.0, 2.0], [3.0, 4.0]] and y.tolist() == [0, 1]


@pytest.mark.parametrize("record, said", [('"3\n",oops,"1\n\n"', "line 3, feature column 'b' is not numeric"),
                                          ('3,"4\n\n"', "line 3 has 2 fields but the header has 3")])
def test_an_error_in_a_record_of_several_lines_names_its_first_line(tmp_path, record, said):
    """A careless-input audit: a record whose quoted fields span lines 3 to 6 was reported on line 6, where it ends
    (the csv module's line count), not on line 3, where it starts."""
    path = tmp_path / "d.csv"
    path.write_text(f"a,b,label\n1,2,0\n{record}\n4,5,1\n")
    with pytest.raises(TableError, match=rf"d\.csv: {said}"):
        load_data(path, "label")


def test_labels_written_with_leading_zeros_stay_as_written(tmp_path, banana):
    """The same audit: labels of whole numbers were read as integers, so "007" and "7" were one class and "02134"
    was written back as 2134 (a postal code, an identifier). Labels are integers only where each is written as its
    number is (no leading zero); "3.0", as programs that write every number as a float do, still is 3, "+1" is 1."""
    X, _ = banana
    codes = np.array(["007", "7", "02134"] * 20, dtype=object)
    _, y_read, _ = load_data(write_csv(tmp_path / "d.csv", X, codes), "label")
    assert sorted(set(y_read.tolist())) == ["007", "02134", "7"]
    _, y_read, _ = load_data(write_csv(tmp_path / "e.csv", X, np.array(["3.0", "-4", "+12"] * 20, dtype=object)),
                             "label")
    assert y_read.dtype.kind == "i" and sorted(set(y_read.tolist())) == [-4, 3, 12]
    _, y_read, _ = load_data(write_csv(tmp_path / "f.csv", X, np.array(["1" * 5000, "2"] * 30, dtype=object)),
                             "label")
    assert sorted(set(y_read.tolist())) == ["1" * 5000, "2"]


def test_labels_in_other_scripts_digits_stay_as_written(tmp_path, banana):
    """The hostile-input audit of 2026-12-04: a whole number was matched by \\d, which takes any script's digits, and
    read by int(), which reads them: rows labelled "\u0661" (Arabic-Indic one) joined the class 1 of rows labelled
    "1", and full-width "\uff11" / "\uff10" came back from ``agpc predict`` as 1 / 0. Only ASCII digits make an
    integer label."""
    X, _ = banana
    _, y_read, _ = load_data(write_csv(tmp_path / "d.csv", X, np.array(["1", "\u0661", "0"] * 20, dtype=object)),
                             "label")
    assert sorted(set(y_read.tolist())) == ["0", "1", "\u0661"]
    _, y_read, _ = load_data(write_csv(tmp_path / "e.csv", X, np.array(["\uff11", "\uff10"] * 30, dtype=object)),
                             "label")
    assert sorted(set(y_read.tolist())) == ["\uff10", "\uff11"]


@pytest.mark.parametrize("cells, said", [
    (["\uff11\uff12", "3", "5"], "line 2, feature column 'a' is not numeric (value '\uff11\uff12'); features must be "
                                "numbers in ASCII digits 0-9"),
    (["\uff11\uff12", "\uff13", "\u0665"], "line 2, feature column 'a' holds numbers agpc does not read (value "
                                       "'\uff11\uff12'): write them in ASCII digits 0-9")])
def test_features_in_other_scripts_digits_are_refused_as_labels_so_written_are_not_numbers(tmp_path, cells, said):
    """A careless-input audit: Python's float reads full-width "\uff11\uff12" as 12, so a feature cell so written was
    the number 12 while a label so written stays text (``test_labels_in_other_scripts_digits_stay_as_written``). A
    numeric feature column holding one is now an error naming the cell; a categorical column's level stays text."""
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n" + "".join(f"{cell},{i},{i % 2}\n" for i, cell in enumerate(cells)))
    with pytest.raises(TableError, match=rf"d\.csv: {re.escape(said)}"):
        load_data(path, "label")
    path.write_text("a,b,label\nS,1,0\nM,2,1\n\uff11\uff12,3,0\n")
    assert load_data(path, "label").X[:, 0].tolist() == ["S", "M", "\uff11\uff12"]


def test_a_long_name_is_shown_cut_in_a_message():
    """The same audit: a model file's feature name of 200,000 characters made ``agpc predict``'s error one line of
    400 kB; ``preview`` shows the first ``NAME_SHOWN`` characters of each name and the length it had."""
    shown = tables.preview(["a" * 200_000, "b"])
    assert len(shown) < 2 * tables.NAME_SHOWN and "200,000 characters" in shown and shown.endswith(", b")


def test_an_empty_array_of_a_forged_width_is_refused_at_once(tmp_path):
    """A hostile-input audit (2026-12-02): an .npy header declaring shape (0, 10**18) declares 0 bytes, so it passed
    the check of declared against stored bytes, and the reader then made a list of 10**18 column names: a hang in
    a 128-byte file."""
    path = tmp_path / "forged.npy"
    np.save(path, np.zeros((0, 3)))
    raw = path.read_bytes()
    header = raw[10:].split(b"}")[0] + b"}"
    forged = header.replace(b"(0, 3)", b"(0, 1000000000000000000)")
    path.write_bytes(raw[:8] + len(forged.ljust(len(header))).to_bytes(2, "little") + forged.ljust(len(header)))
    with pytest.raises(TableError, match=r"forged\.npy: the array has no rows \(shape \(0, 1000000000000000000\)\)"):
        load_data(path, 2)


@pytest.mark.parametrize("cells, first", [(['"1,5"', '"2,25"', '"-0,5"'], "1,5"), (["50%", "12.5 %", "7%"], "50%"),
                                          (['"1,000"', '"12,500"', "7"], "1,000"),
                                          (['"1.234,5"', '"2.000,25"', '"3,5"'], "1.234,5")])
def test_numbers_written_another_way_are_refused_not_taken_as_categories(tmp_path, cells, first):
    """A hostile-input audit (2026-12-02): a column of decimal commas, percentages or thousands separators was not a
    number, so it became a categorical column of one level per distinct value, silently. Now one error naming the
    file, the line, the column and the value; columns of real categories that hold digits stay categories."""
    rows = [cells[i % len(cells)] for i in range(12)]
    path = tmp_path / "spreadsheet.csv"
    path.write_text("x1,share,label\n" + "".join(f"{i * 0.1!r},{cell},{i % 2}\n" for i, cell in enumerate(rows)))
    with pytest.raises(TableError) as refused:
        load_data(path, "label")
    assert (f"spreadsheet.csv: line 2, feature column 'share' holds numbers agpc does not read (value '{first}')"
            in str(refused.value))
    for kept in (["1.2.3", "2.0.1", "1.2.3"], ["1-2", "3-4", "10-20"], ["S", "M", "L"]):
        path.write_text("x1,kind,label\n" + "".join(f"{i * 0.1!r},{kept[i % 3]},{i % 2}\n" for i in range(12)))
        X, _, _ = load_data(path, "label")
        assert X[0, 1] == kept[0]
