"""The ``agpc`` command: fit / predict round trips (CSV, npz, npy, Parquet, zarr, a dask cluster) give the
estimator's own predictions; every bad input is one ``agpc: error:`` line with exit status 2 and leaves no
file behind, every other exception one ``agpc: internal error:`` line with exit status 1 (``--debug``: the
traceback); warnings are one line each, after the output and before the error line; the demo writes a PNG;
``bench`` collects the scripts' tables and PNGs."""

import csv
import gc
import importlib.metadata
import os
import signal
import subprocess
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas
import pytest
from sklearn.preprocessing import StandardScaler

import agpc
import agpc.inspection
import agpc.persistence
from agpc import CholeskyError, GPClassifier, cli, load_model
from agpc.cli import main
from agpc.datasets import make_banana
from agpc.inference import training
from agpc.size_rule import EXACT_MAX_ROWS
from helpers import local_client, write_csv, write_table

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = dict(n_inducing=10, max_iter=5, random_state=0)
FIT_OPTIONS = ["--inducing", "10", "--max-iter", "5", "--random-state", "0", "--quiet"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_predictions(path):
    """The header and the number columns of 'agpc predict''s CSV (its first column, the predicted labels, left out:
    ``read_labels``)."""
    with open(path) as fh:
        header = fh.readline().strip().split(",")
    assert header[0] == "predicted_label"
    return header, np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, usecols=range(1, len(header)))


def read_labels(path):
    """The predicted_label column of 'agpc predict''s CSV, as text (the csv module undoing its quoting)."""
    with open(path, newline="") as fh:
        return [row[0] for row in list(csv.reader(fh))[1:]]


@pytest.fixture(scope="module")
def banana():
    return make_banana(300, random_state=0)


@pytest.fixture(scope="module")
def reference(banana):
    return GPClassifier(**SETTINGS).fit(*banana)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, banana):
    path = tmp_path_factory.mktemp("model") / "banana.agpc"
    GPClassifier(**SETTINGS).fit(*banana).save(path)
    return path


def test_csv_fit_predict_round_trip_equals_the_estimator(tmp_path, banana, reference, capsys):
    X, y = banana
    data = write_csv(tmp_path / "train.csv", X, y)
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(model)]) == 0
    printed = capsys.readouterr().out
    assert "train:" in printed and "NLL" in printed and "fit time:" in printed
    assert main(["predict", str(model), str(data), "--target", "label", "--latent", "--out", str(out)]) == 0
    assert "error" in capsys.readouterr().out
    header, values = read_predictions(out)
    assert header == ["predicted_label", "p_-1", "p_1", "latent_mean", "latent_var"]
    np.testing.assert_allclose(values[:, :2], reference.predict_proba(X), rtol=1e-12, atol=1e-15)
    assert read_labels(out) == [str(label) for label in reference.predict(X).tolist()]  # integers, as written
    mean, var = reference.predict_latent(X)
    np.testing.assert_allclose(values[:, 2], mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(values[:, 3], var, rtol=1e-12)


def write_npz(path, X, y):
    np.savez(path, X=X, y=y)
    return path, []


def write_npy(path, X, y):
    np.save(path, np.column_stack([X, y]))
    return path, ["--target", "2"]


def write_parquet(path, X, y):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "cls": y}), path)
    return path, ["--target", "cls"]


def write_zarr(path, X, y):
    zarr = pytest.importorskip("zarr")
    group = zarr.open_group(str(path), mode="w")
    group.create_array("X", data=X, chunks=(100, 2))
    group.create_array("labels", data=y)
    return path, ["--target", "labels"]


@pytest.mark.parametrize("writer, name", [(write_npz, "d.npz"), (write_npy, "d.npy"), (write_parquet, "d.parquet"),
                                          (write_zarr, "d.zarr")])
def test_array_formats_fit_the_same_model(tmp_path, banana, reference, writer, name):
    data, target = writer(tmp_path / name, *banana)
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    assert main(["fit", str(data), *target, *FIT_OPTIONS, "--out", str(model)]) == 0
    assert main(["predict", str(model), str(data), *target, "--out", str(out)]) == 0
    header, values = read_predictions(out)
    assert header == ["predicted_label", "p_-1", "p_1"]
    np.testing.assert_allclose(values, reference.predict_proba(banana[0]), rtol=1e-12, atol=1e-15)


def test_validation_fraction_and_string_labels_of_three_classes(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = np.repeat(np.array(["a", "b", "c"]), 40)
    X = rng.normal(size=(120, 2)) + 3.0 * np.repeat(np.eye(3, 2), 40, axis=0)
    data = write_csv(tmp_path / "three.csv", X, y)
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    argv = ["fit", str(data), "--target", "2", "--inducing", "5", "--max-iter", "3", "--quiet",
            "--validation-fraction", "0.25", "--out", str(model)]
    assert main(argv) == 0
    assert "validation:  error" in capsys.readouterr().out
    assert main(["predict", str(model), str(data), "--target", "label", "--latent", "--out", str(out)]) == 0
    header, values = read_predictions(out)
    assert header == ["predicted_label", "p_a", "p_b", "p_c"] + [f"latent_{m}_{c}" for c in "abc"
                                                                 for m in ("mean", "var")]
    np.testing.assert_allclose(values[:, :3].sum(axis=1), 1.0, rtol=1e-9)
    # the predicted label: the string class of the row's highest probability, as the model predicts it
    predicted = read_labels(out)
    assert predicted == np.array(["a", "b", "c"])[np.argmax(values[:, :3], axis=1)].tolist()
    assert predicted == load_model(model).predict(pandas.DataFrame(X, columns=["x1", "x2"])).tolist()


def test_the_validation_fraction_is_the_fits_validation_data_and_inspect_shows_its_curve(tmp_path, banana,
                                                                                        monkeypatch, capsys):
    """The rows --validation-fraction holds out are fit's validation_data: the model file keeps their NLL and
    error along the training, which 'agpc inspect' prints and its --plot draws."""
    X, y = banana
    data, model = write_csv(tmp_path / "d.csv", X, y), tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--validation-fraction", "0.2",
                 "--out", str(model)]) == 0
    fitted = load_model(model)
    val = cli._validation_rows(y, 0.2, 0)
    expected = GPClassifier(**SETTINGS).fit(X[~val], y[~val], validation_data=(X[val], y[val]))
    for key in ("validation_step", "validation_nll", "validation_error"):
        assert fitted.history_[key] == expected.history_[key] and len(fitted.history_[key]) > 1
    with pytest.warns(UserWarning, match="valid feature names"):
        final = fitted.predict_proba(X[val])
    index = np.searchsorted(fitted.classes_, y[val])
    np.testing.assert_allclose(fitted.history_["validation_nll"][-1],
                               -np.mean(np.log(final[np.arange(len(index)), index])), rtol=1e-9)
    capsys.readouterr()
    figures = []
    real = agpc.inspection._figure
    monkeypatch.setattr(agpc.inspection, "_figure", lambda: figures.append(real()) or figures[-1])
    assert main(["inspect", str(model), "--plot", str(tmp_path / "m.png")]) == 0
    printed = capsys.readouterr().out
    nll, steps = fitted.history_["validation_nll"], fitted.history_["validation_step"]
    assert f"validation ({len(nll)} scores):" in printed and f"last: NLL {nll[-1]:.4f}" in printed
    drawn = [line for ax in figures[0].axes for line in ax.get_lines() if line.get_label() == "validation NLL"]
    assert len(drawn) == 1
    np.testing.assert_array_equal(drawn[0].get_xdata(), steps)
    np.testing.assert_array_equal(drawn[0].get_ydata(), nll)


GRADES = ["poor", "fair", "good", "best"]  # lowest first: not their alphabetical order


def graded(labels=GRADES, n=60):
    """Rows whose first feature sets an ordered grade (one of ``labels``, lowest first)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    return X, np.asarray(labels)[np.digitize(X[:, 0] + 0.3 * rng.normal(size=n), [-0.7, 0.0, 0.7])]


def test_fit_takes_ordered_classes_in_the_order_given_and_predict_and_inspect_read_the_model(tmp_path, capsys):
    X, y = graded()
    data, model, out = write_csv(tmp_path / "ratings.csv", X, y), tmp_path / "m.agpc", tmp_path / "p.csv"
    assert main(["fit", str(data), "--target", "label", "--likelihood", "ordinal", "--classes", ",".join(GRADES),
                 *FIT_OPTIONS, "--out", str(model)]) == 0
    assert "ordered classes poor, fair, good, best (lowest first)" in capsys.readouterr().out
    fitted = load_model(model)
    expected = GPClassifier(likelihood="ordinal", classes=GRADES, **SETTINGS).fit(X, y)
    assert fitted.likelihood_ == "ordinal" and fitted.classes_.tolist() == GRADES
    np.testing.assert_array_equal(fitted.cut_points_, expected.cut_points_)
    assert main(["predict", str(model), str(data), "--out", str(out)]) == 0
    header, values = read_predictions(out)
    assert header == ["predicted_label"] + [f"p_{grade}" for grade in GRADES]
    np.testing.assert_allclose(values, expected.predict_proba(X), rtol=1e-12, atol=1e-15)
    assert read_labels(out) == expected.predict(X).tolist()
    capsys.readouterr()
    assert main(["inspect", str(model)]) == 0
    printed = capsys.readouterr().out
    assert "likelihood ordinal" in printed and "4 classes: poor, fair, good, best" in printed


@pytest.mark.parametrize("given, order", [(None, [3, 5, 10, 12]), ("12,10,5,3", [12, 10, 5, 3]),
                                          ("3,5,10,12,15", [3, 5, 10, 12, 15]), (" 3, 5 ,10, 12", [3, 5, 10, 12])])
def test_numeric_grades_are_in_numeric_order_unless_classes_says_otherwise(tmp_path, monkeypatch, given, order):
    """Whole-number grades sort as numbers (3 before 10); --classes names them as the file writes them, and may
    name a class without rows."""
    X, y = graded([3, 5, 10, 12])
    data = write_csv(tmp_path / "d.csv", X, y)
    options = ["--target", "label", "--likelihood", "ordinal"] + ([] if given is None else ["--classes", given])
    fitted = _saved_fit(tmp_path, monkeypatch, data, options)
    assert fitted.classes_.tolist() == order and fitted.classes_.dtype.kind == "i"
    expected = GPClassifier(likelihood="ordinal", classes=None if given is None else order, **SETTINGS).fit(X, y)
    np.testing.assert_array_equal(fitted.cut_points_, expected.cut_points_)


def test_classes_drops_spaces_around_a_name_and_a_quoted_name_may_hold_a_comma(tmp_path, monkeypatch):
    """--classes is one CSV record: '"bad, really", fair' names the classes 'bad, really' and 'fair' (a label
    with a comma is quoted, as the data file quotes it; spaces around a name are not part of it)."""
    labels = ["bad, really", "fair", "good"]
    X, y = graded(labels + ["good"])
    data = tmp_path / "d.csv"
    with open(data, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["x1", "x2", "label"])
        writer.writerows([*row, label] for row, label in zip(X.tolist(), y.tolist()))
    fitted = _saved_fit(tmp_path, monkeypatch, data, ["--target", "label", "--likelihood", "ordinal",
                                                      "--classes", '"bad, really", fair , good'])
    assert fitted.classes_.tolist() == labels
    expected = GPClassifier(likelihood="ordinal", classes=labels, **SETTINGS).fit(X, y)
    np.testing.assert_array_equal(fitted.cut_points_, expected.cut_points_)


@pytest.mark.parametrize("labels, options, message", [
    (GRADES, [], "--likelihood ordinal: the labels of"),
    (GRADES, ["--classes", "poor,fair,good"], "labels best of"),
    (GRADES, ["--classes", "poor,fair,good,best,fair"], "(fair named more than once)"),
    (GRADES, ["--classes", "poor"], "name two classes or more"),
    ([3, 5, 10, 12], ["--classes", "3,5,ten,12"], "are whole numbers; ten is not"),
    ([3, 5, 10, 12], ["--classes", "3,5,10,12,"], "--classes 3,5,10,12,: its 5th name is empty"),
    (GRADES, ["--classes", "poor,,fair,good,best"], "its 2nd name is empty"),
    ([3, 5, 10, 12], ["--classes", ""], "--classes '' names no class: name the classes"),
    (GRADES, ["--classes", 'poor,"fair,good,best'], "a quoted name is not closed"),
    ([3, 5, 10, 12], ["--method", "vi-jj"], "likelihood must be 'logistic' or None, got 'ordinal'"),
])
def test_ordinal_option_problems_are_one_line_before_training(tmp_path, capsys, monkeypatch, labels, options,
                                                               message):
    monkeypatch.setattr(GPClassifier, "fit", failing_fit(AssertionError("fit was not to be reached")))
    data = write_csv(tmp_path / "d.csv", *graded(labels))
    status = main(["fit", str(data), "--target", "label", "--likelihood", "ordinal", *options, *FIT_OPTIONS,
                   "--out", str(tmp_path / "m.agpc")])
    out = capsys.readouterr()
    assert_one_line_error(status, out.err)
    assert message in out.err and out.out == "" and not (tmp_path / "m.agpc").exists()


@pytest.mark.parametrize("options, likelihood", [([], "probit"), (["--likelihood", "logistic"], "logistic"),
                                                 (["--likelihood", "probit"], "probit")])
def test_fit_takes_the_likelihood(tmp_path, banana, monkeypatch, options, likelihood):
    data = write_csv(tmp_path / "d.csv", *banana)
    fitted = _saved_fit(tmp_path, monkeypatch, data, ["--target", "label", "--method", "svi", *options])
    assert fitted.likelihood == (None if not options else likelihood) and fitted.likelihood_ == likelihood


def test_classes_without_the_ordinal_likelihood_is_one_line(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", *graded())
    status = main(["fit", str(data), "--target", "label", "--classes", ",".join(GRADES), *FIT_OPTIONS,
                   "--out", str(tmp_path / "m.agpc")])
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "--classes gives the order of ordered classes: it goes with --likelihood ordinal" in err


@pytest.mark.parametrize("in_files", [False, True])
def test_fit_on_a_dask_scheduler_equals_the_local_fit(tmp_path, banana, in_files):
    pytest.importorskip("distributed")
    data, _ = write_npz(tmp_path / "d.npz", *banana)
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    settings = ["--inducing", "10", "--max-iter", "2", "--quiet"]
    if in_files:  # batch EP's sites in files there during the fit; nothing left after it
        settings += ["--site-directory", str(tmp_path / "sites")]
    with local_client(1, processes=False, threads_per_worker=2) as client:
        argv = ["fit", str(data), *settings, "--scheduler", client.scheduler.address, "--out", str(model)]
        assert main(argv) == 0
    assert main(["predict", str(model), str(data), "--out", str(out)]) == 0
    local = GPClassifier(n_inducing=10, max_iter=2, random_state=0).fit(*banana)
    np.testing.assert_allclose(read_predictions(out)[1], local.predict_proba(banana[0]), rtol=1e-8, atol=1e-12)
    if in_files:
        assert list((tmp_path / "sites").iterdir()) == []


# -- bad input: one line, exit status 2, nothing written -----------------------------------------------

def make_bad_files(tmp, X, y):
    write_csv(tmp / "ok.csv", X, y)
    (tmp / "data.txt").write_text("1,2\n")
    (tmp / "text.csv").write_text("x1,x2,label\n1.0,high,0\n3.0,4.0,1\n")
    write_csv(tmp / "one.csv", X, np.ones(len(y), dtype=int))
    write_csv(tmp / "nan.csv", np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y)
    write_csv(tmp / "cats.csv", X, np.where(y > 0, "cat", "dog"))
    (tmp / "ragged.csv").write_text("x1,x2,label\n1.0,2.0,0\n3.0,1\n")
    (tmp / "empty.csv").write_text("")
    np.save(tmp / "three.npy", np.column_stack([X, y]))
    np.savez(tmp / "plain.npz", a=np.ones(3))


FIT = "fit --inducing 10 --max-iter 2 --quiet --out {tmp}/out.agpc "
PREDICT = "predict --out {tmp}/out.csv "
BAD_INPUTS = {  # argv templates of commands that must fail cleanly (files from make_bad_files)
    "missing data file": FIT + "{tmp}/nope.csv --target label",
    "unknown format": FIT + "{tmp}/data.txt --target 0",
    "missing target column": FIT + "{tmp}/ok.csv --target colour",
    "no target given": FIT + "{tmp}/ok.csv",
    "non-numeric feature": FIT + "{tmp}/text.csv --target label",
    "one class": FIT + "{tmp}/one.csv --target label",
    "NaN feature": FIT + "{tmp}/nan.csv --target label",
    "ragged CSV": FIT + "{tmp}/ragged.csv --target label",
    "empty CSV": FIT + "{tmp}/empty.csv --target label",
    "npy target by name": FIT + "{tmp}/three.npy --target label",
    "npz without X": FIT + "{tmp}/plain.npz",
    "site directory without a cluster": FIT + "{tmp}/ok.csv --target label --site-directory {tmp}",
    "more inducing points than rows": FIT + "{tmp}/ok.csv --target label --inducing 999",
    "output directory missing": FIT + "{tmp}/ok.csv --target label --out {tmp}/no/m.agpc",
    "missing model": PREDICT + "{tmp}/nope.agpc {tmp}/ok.csv --target label",
    "CSV as a model": PREDICT + "{tmp}/ok.csv {tmp}/ok.csv --target label",
    "npz that is not a model": PREDICT + "{tmp}/plain.npz {tmp}/ok.csv --target label",
    "feature count mismatch": PREDICT + "{model} {tmp}/three.npy",
    "labels the model lacks": PREDICT + "{model} {tmp}/cats.csv --target label",
}


def assert_one_line_error(status, err):
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agpc: error: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, model_file, banana, capsys, case):
    make_bad_files(tmp_path, *banana)
    argv = BAD_INPUTS[case].format(tmp=tmp_path, model=model_file).split()
    before = {p.name for p in tmp_path.rglob("*")}
    status = main(argv)
    assert_one_line_error(status, capsys.readouterr().err)
    assert {p.name for p in tmp_path.rglob("*")} == before


@pytest.mark.parametrize("command", ["fit", "predict onto the model", "predict onto the data", "hard link"])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, model_file, banana, capsys, command):
    X, y = banana
    data = write_csv(tmp_path / "d.csv", X, y)
    model = tmp_path / "m.agpc"
    model.write_bytes(model_file.read_bytes())
    argv, target = {
        "fit": (["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(data)], data),
        "predict onto the model": (["predict", str(model), str(data), "--target", "label", "--out", str(model)], model),
        "predict onto the data": (["predict", str(model), str(data), "--target", "label", "--out",
                                   str(tmp_path / "." / "d.csv")], data),
        "hard link": (["predict", str(model), str(data), "--target", "label", "--out", str(tmp_path / "link.agpc")],
                      model),
    }[command]
    if command == "hard link":
        os.link(model, tmp_path / "link.agpc")
    before = target.read_bytes()
    status = main(argv)
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "is the input file" in err
    assert target.read_bytes() == before


def test_failed_predict_leaves_an_existing_output_untouched(tmp_path, model_file, banana, capsys):
    X, y = banana
    data = write_csv(tmp_path / "cats.csv", X, np.where(y > 0, "cat", "dog"))
    out = tmp_path / "p.csv"
    out.write_text("earlier results\n")
    status = main(["predict", str(model_file), str(data), "--target", "label", "--out", str(out)])
    assert_one_line_error(status, capsys.readouterr().err)
    assert out.read_text() == "earlier results\n"


def test_parquet_without_pyarrow_names_the_package(tmp_path, monkeypatch, capsys):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "pandas", None)
    status = main(["fit", str(tmp_path / "d.parquet"), "--target", "y", "--out", str(tmp_path / "m.agpc")])
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "pip install pyarrow" in err


def subprocess_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_python_dash_m_reports_a_bad_model_in_one_line(tmp_path):
    (tmp_path / "x.agpc").write_text("not a model")
    env = subprocess_env()
    run = subprocess.run([sys.executable, "-m", "agpc", "predict", str(tmp_path / "x.agpc"), str(tmp_path / "x.agpc"),
                          "--out", str(tmp_path / "p.csv")], capture_output=True, text=True, env=env, timeout=120)
    assert_one_line_error(run.returncode, run.stderr)
    assert "is not an agpc model file" in run.stderr
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_a_directory_given_as_the_model_is_named_as_the_model(tmp_path, banana, command, capsys, monkeypatch):
    """``agpc predict . data.csv --out p.csv`` said "cannot write p.csv: it is inside the input ." (the audit): the
    output's checks ran before the model's. The model argument is checked first, by its own name."""
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.chdir(tmp_path)
    argv = (["predict", ".", str(data), "--out", "p.csv"] if command == "predict" else ["inspect", ".", "--plot",
                                                                                          "q.png"])
    status = main(argv)
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert ". is a directory, not a model file" in err
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "q.png").exists()


@pytest.mark.parametrize("lines_read", [0, 1])
@pytest.mark.parametrize("command", ["fit", "predict"])
def test_a_reader_that_stops_early_neither_fails_the_command_nor_loses_its_output(tmp_path, banana, model_file,
                                                                                   command, lines_read):
    """agpc fit ... | head -1: the reader leaving is not a failure of the command (it ended in exit 2,
    'Broken pipe', and fit wrote no model); its files are written and it exits 0."""
    data = write_csv(tmp_path / "d.csv", *banana)
    out = tmp_path / ("m.agpc" if command == "fit" else "p.csv")
    argv = (["fit", str(data), "--target", "label", *FIT_OPTIONS] if command == "fit"
            else ["predict", str(model_file), str(data), "--target", "label"])
    with subprocess.Popen([sys.executable, "-m", "agpc", *argv, "--out", str(out)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=subprocess_env()) as proc:
        for _ in range(lines_read):
            assert proc.stdout.readline().startswith(b"agpc fit:" if command == "fit" else b"wrote ")
        proc.stdout.close()
        err = proc.stderr.read().decode()
        status = proc.wait(timeout=120)
    assert status == 0, err
    assert "error" not in err and "Broken pipe" not in err, err
    if command == "fit":
        fitted = GPClassifier.load(out)
        assert list(fitted.feature_names_in_) == ["x1", "x2"]
        with warnings.catch_warnings():  # the model knows its columns' names, the array has none
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            np.testing.assert_array_equal(fitted.predict_proba(banana[0]),
                                          GPClassifier.load(model_file).predict_proba(banana[0]))
    else:
        assert read_predictions(out)[1].shape == (len(banana[1]), 2)


# -- CSV cells and column names --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def named_model(tmp_path_factory, banana):
    """The model 'agpc fit' trains on a CSV with the header x1, x2, label (caught before it is saved: the
    model file keeps feature names once the persist branch of issue 15 is merged)."""
    tmp = tmp_path_factory.mktemp("named")
    data = write_csv(tmp / "train.csv", *banana)
    saved = []
    real_save = agpc.persistence.save_model
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agpc.persistence, "save_model", lambda model, path: (saved.append(model), real_save(model, path)))
        assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(tmp / "m.agpc")]) == 0
    return saved[0]


def test_fit_records_the_header_as_feature_names(named_model, reference, banana):
    assert list(named_model.feature_names_in_) == ["x1", "x2"]
    assert named_model.feature_names_in_.dtype == object  # as scikit-learn's fit on a DataFrame sets it
    with pytest.warns(UserWarning, match="X does not have valid feature names"):  # scikit-learn's, on NumPy input
        proba = named_model.predict_proba(banana[0])
    np.testing.assert_array_equal(proba, reference.predict_proba(banana[0]))


def test_fit_on_parquet_records_its_column_names(tmp_path, banana, monkeypatch):
    data, target = write_parquet(tmp_path / "d.parquet", *banana)
    saved = []
    monkeypatch.setattr(agpc.persistence, "save_model", lambda model, path: saved.append(model))
    assert main(["fit", str(data), *target, *FIT_OPTIONS, "--out", str(tmp_path / "m.agpc")]) == 0
    assert list(saved[0].feature_names_in_) == ["a", "b"]


@pytest.mark.parametrize("flag, expected", [([], "auto"), (["--kernel-prior", "none"], None)])
def test_fit_takes_the_kernel_prior(tmp_path, banana, monkeypatch, flag, expected):
    data, target = write_npy(tmp_path / "d.npy", *banana)
    saved = []
    monkeypatch.setattr(agpc.persistence, "save_model", lambda model, path: saved.append(model))
    assert main(["fit", str(data), *target, *FIT_OPTIONS, *flag, "--out", str(tmp_path / "m.agpc")]) == 0
    assert saved[0].kernel_prior_ == expected


@pytest.mark.parametrize("flag, expected", [([], "auto"), (["--ard", "per-feature"], True),
                                           (["--ard", "shared"], False)])
def test_fit_takes_ard(tmp_path, banana, monkeypatch, flag, expected):
    data, target = write_npy(tmp_path / "d.npy", *banana)
    saved = []
    monkeypatch.setattr(agpc.persistence, "save_model", lambda model, path: saved.append(model))
    assert main(["fit", str(data), *target, *FIT_OPTIONS, *flag, "--out", str(tmp_path / "m.agpc")]) == 0
    assert saved[0].ard == expected and (expected == "auto" or saved[0].ard_ is expected)


def test_fit_on_a_file_without_names_records_none(tmp_path, banana, monkeypatch):
    data, target = write_npy(tmp_path / "d.npy", *banana)
    saved = []
    monkeypatch.setattr(agpc.persistence, "save_model", lambda model, path: saved.append(model))
    assert main(["fit", str(data), *target, *FIT_OPTIONS, "--out", str(tmp_path / "m.agpc")]) == 0
    assert not hasattr(saved[0], "feature_names_in_")


@pytest.fixture
def predict_with(monkeypatch):
    """'agpc predict' with the given in-memory model in place of the one read from MODEL."""
    def use(model):
        monkeypatch.setattr(cli, "_load_model", lambda path: model)
    return use


SHUFFLED = {  # the training columns in another order, with the label and an extra text column among them
    "label first, x2 before x1": lambda X, y: {"label": y, "x2": X[:, 1], "id": [f"r{i}" for i in range(len(y))],
                                               "x1": X[:, 0]},
    "the training file itself": lambda X, y: {"x1": X[:, 0], "x2": X[:, 1], "label": y},
    "string labels and a comment": lambda X, y: {"note": ["a, b" if v > 0 else "c" for v in y], "x2": X[:, 1],
                                                 "x1": X[:, 0], "kind": np.where(y > 0, "cat", "dog")},
}


@pytest.mark.parametrize("layout", list(SHUFFLED))
def test_predict_takes_the_models_columns_by_name(tmp_path, banana, named_model, reference, predict_with, capsys,
                                                  layout):
    X, y = banana
    data = tmp_path / "shuffled.csv"
    columns = SHUFFLED[layout](X, y)
    with open(data, "w", newline="") as fh:  # csv quoting for the comment column
        writer = csv.writer(fh)
        writer.writerow(list(columns))
        writer.writerows(zip(*(np.asarray(c).tolist() for c in columns.values())))
    predict_with(named_model)
    out = tmp_path / "p.csv"
    assert main(["predict", "m.agpc", str(data), "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""  # no warning: the columns were matched by name
    np.testing.assert_allclose(read_predictions(out)[1], reference.predict_proba(X), rtol=1e-12, atol=1e-15)


def test_swapped_columns_give_the_unswapped_predictions_and_scores(tmp_path, banana, named_model, predict_with,
                                                                  capsys):
    X, y = banana
    straight = write_table(tmp_path / "straight.csv", {"x1": X[:, 0], "x2": X[:, 1], "label": y})
    swapped = write_table(tmp_path / "swapped.csv", {"x2": X[:, 1], "label": y, "x1": X[:, 0]})
    predict_with(named_model)
    printed = []
    for data in (straight, swapped):
        out = tmp_path / f"{data.stem}.out"
        assert main(["predict", "m.agpc", str(data), "--target", "label", "--out", str(out)]) == 0
        printed.append(capsys.readouterr().out.splitlines()[-1])
    np.testing.assert_array_equal(read_predictions(tmp_path / "straight.out")[1],
                                  read_predictions(tmp_path / "swapped.out")[1])
    assert printed[0] == printed[1] and "error" in printed[0]


def test_predict_on_parquet_takes_the_columns_by_name(tmp_path, banana, reference, predict_with):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y = banana
    pq.write_table(pa.table({"b": X[:, 1], "cls": y, "a": X[:, 0]}), tmp_path / "d.parquet")
    model = GPClassifier(**SETTINGS).fit(X, y)
    cli._record_feature_names(model, ["a", "b"])
    predict_with(model)
    assert main(["predict", "m.agpc", str(tmp_path / "d.parquet"), "--out", str(tmp_path / "p.csv")]) == 0
    np.testing.assert_allclose(read_predictions(tmp_path / "p.csv")[1], reference.predict_proba(X), rtol=1e-12,
                               atol=1e-15)


@pytest.mark.parametrize("columns, target, message", [
    (("x1", "label"), [], "no column 'x2', which the model was trained on (it needs x1, x2; the file has x1, label)"),
    (("x2", "x1", "label"), ["--target", "x1"], "the --target column 'x1' is one of the model's features"),
    (("x1", "x2", "x2"), [], "names column 'x2' 2 times"),
])
def test_predict_column_problems_are_one_line(tmp_path, banana, named_model, predict_with, capsys, columns, target,
                                              message):
    X, y = banana
    data = write_csv(tmp_path / "d.csv", np.column_stack([X, X[:, :1]])[:, :len(columns) - 1], y, names=columns)
    predict_with(named_model)
    status = main(["predict", "m.agpc", str(data), *target, "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert message in err and not (tmp_path / "p.csv").exists()


def test_labels_of_another_kind_than_the_models_classes_are_said_so(tmp_path, banana, predict_with, capsys):
    """A model fitted in Python on the text labels '-1', '1', scored on a file whose labels are -1, 1 (read as
    integers, quoted or not), said "labels -1, 1 are not among the model's classes -1, 1" (a careless-input audit):
    now the error names both kinds and what to do; a label of the same kind that is no class is said as before."""
    X, y = banana
    text_model = GPClassifier(**SETTINGS).fit(X, y.astype(str))
    cli._record_feature_names(text_model, ["x1", "x2"])
    predict_with(text_model)
    data = write_csv(tmp_path / "d.csv", X, y)
    for labels, message in [(y, "the labels are read as integers (-1, 1) but the model's classes are text ('-1', "
                                "'1'): a label is a class only as the same kind; the model was fitted on labels of "
                                "text, and agpc reads a label column of whole numbers as integers, quoted or not"),
                            (np.where(y > 0, "1", "x"), "labels x are not among the model's classes -1, 1")]:
        write_csv(data, X, labels)
        status = main(["predict", "m.agpc", str(data), "--target", "label", "--out", str(tmp_path / "p.csv")])
        err = capsys.readouterr().err
        assert_one_line_error(status, err)
        assert message in err and not (tmp_path / "p.csv").exists()


def test_labels_a_spreadsheet_would_run_as_formulas_are_written_quoted_with_a_warning(tmp_path, banana, capsys):
    """A careless-input audit: a class "=1+1" (or "@SUM(A1)", "-2+3") was written to predictions.csv as it was, and a
    spreadsheet opening the file ran it as a formula (CSV injection). Such a label is written with a ' before it
    (OWASP's advice), a label that is a number ("-1", "-0.5") as it is, and a warning names those altered."""
    X, y = banana
    classes = np.array(["=1+1", "-1", "-2+3", "-0.5"])
    labels = classes[(y > 0) + 2 * (X[:, 0] > 0)]
    model = tmp_path / "m.agpc"
    GPClassifier(**SETTINGS).fit(pandas.DataFrame(X, columns=["x1", "x2"]), labels).save(model)
    out = tmp_path / "p.csv"
    assert main(["predict", str(model), str(write_csv(tmp_path / "d.csv", X, y)), "--out", str(out)]) == 0
    expected = load_model(model).predict(pandas.DataFrame(X, columns=["x1", "x2"])).tolist()
    assert set(expected) == set(classes)  # (every kind of label is written)
    assert read_labels(out) == [f"'{v}" if v in ("=1+1", "-2+3") else v for v in expected]
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("agpc: warning:")]
    assert len(warning) == 1 and "'-2+3', '=1+1'" in warning[0] and "'-1'" not in warning[0]


def test_a_file_without_names_is_taken_by_position_with_a_warning(tmp_path, banana, named_model, reference,
                                                                  predict_with, capsys):
    data, _ = write_npz(tmp_path / "d.npz", *banana)
    predict_with(named_model)
    assert main(["predict", "m.agpc", str(data), "--out", str(tmp_path / "p.csv")]) == 0
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"agpc: warning: {data} has no column names: its columns were taken by "
                                        "position as the model's features x1, x2, unchecked"]
    np.testing.assert_allclose(read_predictions(tmp_path / "p.csv")[1], reference.predict_proba(banana[0]),
                               rtol=1e-12, atol=1e-15)


def test_a_model_without_names_takes_columns_by_position_with_a_warning(tmp_path, banana, model_file, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    assert main(["predict", str(model_file), str(data), "--target", "label", "--out", str(tmp_path / "p.csv")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agpc: warning: the model has no feature names")


def test_fit_then_predict_through_the_model_file_matches_columns_by_name(tmp_path, banana, reference, capsys):
    """The model file keeps the feature names, so predict takes the columns by name whatever their order (this was
    an xfail until model files kept the names; issue 25: a stale xfail turns a regression into an expected failure)."""
    X, y = banana
    data = write_csv(tmp_path / "train.csv", X, y)
    swapped = write_table(tmp_path / "swapped.csv", {"label": y, "x2": X[:, 1], "x1": X[:, 0]})
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(model)]) == 0
    assert list(load_model(model).feature_names_in_) == ["x1", "x2"]
    assert main(["predict", str(model), str(swapped), "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    np.testing.assert_allclose(read_predictions(out)[1], reference.predict_proba(X), rtol=1e-12, atol=1e-15)


def test_a_header_with_spaces_names_the_same_columns_for_pandas_and_the_command(tmp_path, banana, monkeypatch):
    """"x1, x2, k, label": pandas' read_csv keeps the spaces (" x2", " label"), the command strips every cell, the
    header's too. A model fitted in Python on that DataFrame was refused by 'agpc predict' on the same file ("no
    column ' x2', which the model was trained on ... the file has x1, x2, ...") and --target " label" was "no column"
    (a careless-input audit): names given to the command, and a model's, are now read as the header is."""
    X, y = banana
    k = np.arange(len(y)) % 3
    data = tmp_path / "spaced.csv"
    data.write_text("x1, x2, k, label\n" + "".join(f"{a!r}, {b!r}, {c}, {d}\n"
                                                    for (a, b), c, d in zip(X.tolist(), k, y)))
    frame = pandas.read_csv(data)
    assert list(frame.columns) == ["x1", " x2", " k", " label"]
    model = GPClassifier(**SETTINGS).fit(frame[["x1", " x2"]], frame[" label"])
    model.save(tmp_path / "m.agpc")
    out = tmp_path / "p.csv"
    assert main(["predict", str(tmp_path / "m.agpc"), str(data), "--target", " label", "--out", str(out)]) == 0
    np.testing.assert_array_equal(read_predictions(out)[1], model.predict_proba(frame[["x1", " x2"]]))
    fitted = _saved_fit(tmp_path, monkeypatch, data, ["--target", " label", "--categorical", " k"])
    assert list(fitted.feature_names_in_) == ["x1", "x2", "k"] and fitted.is_categorical_.tolist() == [False, False,
                                                                                                       True]


# -- what a fit prints ----------------------------------------------------------------------------------

def _stderr_lines(err):
    """The last drawing of each line on standard error (a progress bar redraws its line after a carriage return)."""
    return [line.split("\r")[-1].strip() for line in err.split("\n") if line.strip()]


def test_fit_says_its_plan_first_and_counts_iterations_as_max_iter_does(tmp_path, banana, capsys):
    """Docs (usage.md, "What a fit prints"): the plan before training, in --max-iter's units, an estimate, a named
    line a stage; the summary counts what --max-iter counts, the warm-up sweeps apart."""
    data = write_csv(tmp_path / "d.csv", *banana)
    argv = ["fit", str(data), "--target", "label", "--inducing", "10", "--max-iter", "5", "--out", str(tmp_path / "m")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    warmup = training.TrainSettings().n_warmup
    assert f" (5 iterations of --max-iter 5 + {warmup} warm-up sweeps; 10 inducing points)" in out
    lines = _stderr_lines(err)
    assert lines[0] == (f"agpc ep: 300 rows, batch steps on all rows; {warmup} warm-up sweeps, then at most 5 "
                        "iterations (max_iter), fewer once it settles; a time estimate follows the first steps")
    assert [line.split(":")[0] for line in lines] == ["agpc ep", "agpc ep warm-up sweeps", "agpc ep", "agpc ep training",
                                                      "agpc ep", "agpc fit"]
    assert lines[2].startswith("agpc ep: estimate from the first steps") and lines[2].endswith("for 5 iterations")
    assert lines[-1] == "agpc fit: scoring the 300 training rows"
    assert load_model(tmp_path / "m").n_iter_ == 5 + warmup  # (n_iter_ keeps its meaning: every history entry)


def test_plateau_none_runs_every_iteration_and_says_no_earlier_stop(tmp_path, capsys, monkeypatch):
    """--plateau none is GPClassifier(plateau=None): the plan promises no earlier stop and every --max-iter iteration
    runs; the default stops once log Z stops rising (here a plateau at once: a rule whose rise no step reaches)."""
    from agpc import size_rule

    X, y = make_banana(900, random_state=0)
    data = write_csv(tmp_path / "d.csv", X, y)
    argv = ["fit", str(data), "--target", "label", "--inducing", "10", "--max-iter", "30", "--out", str(tmp_path / "m")]
    monkeypatch.setattr(size_rule, "SPARSE_PLATEAU_RISE_PER_ROW", 1e9)
    assert main(argv + ["--plateau", "none"]) == 0
    lines = _stderr_lines(capsys.readouterr()[1])
    assert "fewer once it settles" not in lines[0] and load_model(tmp_path / "m").n_iter_ == 40
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "fewer once it settles" in _stderr_lines(err)[0] and "stopped: log Z stopped rising (plateau)" in out
    model = load_model(tmp_path / "m")
    assert model.stop_reason_ == "plateau" and model.n_iter_ == 10 + size_rule.SPARSE_PLATEAU_STEPS + 1


def test_the_cli_uses_every_core_for_batch_passes_and_one_for_minibatches(tmp_path, banana, monkeypatch):
    """--jobs unset: n_jobs=-1 for a batch fit (its passes' threads: the model n_jobs=1 gives) and 1 for minibatches
    (more processes would train data-parallel rounds, another model); --jobs N is n_jobs=N."""
    from agpc import threads

    saved = []
    real = cli.persistence.save_model
    monkeypatch.setattr(cli.persistence, "save_model", lambda model, path: saved.append(model) or real(model, path))
    data = write_csv(tmp_path / "d.csv", *banana)
    base = ["fit", str(data), "--target", "label", "--inducing", "10", "--max-iter", "1", "--quiet"]
    assert main(base + ["--out", str(tmp_path / "b")]) == 0
    assert saved[-1].n_jobs == -1 and saved[-1].n_jobs_ == threads.available_cores()
    assert main(base + ["--batch-size", "100", "--out", str(tmp_path / "mb")]) == 0
    assert saved[-1].n_jobs is None and saved[-1].n_jobs_ == 1
    assert main(base + ["--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    assert saved[-1].n_jobs == 1 and saved[-1].n_jobs_ == 1


def test_a_fit_in_data_parallel_rounds_counts_its_epochs_not_its_rounds_as_minibatches(tmp_path, capsys):
    """The hostile-input audit of 2026-12-04: ``--jobs 2`` with minibatches (data-parallel rounds, each many
    minibatches) said "0.25 epochs of --max-iter 50 (100 steps)" of a fit of 25 epochs."""
    data = write_csv(tmp_path / "d.csv", *make_banana(2000, random_state=0))
    assert main(["fit", str(data), "--target", "label", "--inducing", "10", "--batch-size", "50", "--method", "sep",
                 "--jobs", "2", "--max-iter", "2", "--quiet", "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    model = load_model(tmp_path / "m")
    rounds = int(model.history_["n_steps"][-1])
    assert model.n_iter_ == 2
    assert f"(2 epochs of --max-iter 2 ({rounds:,} data-parallel rounds)" in out, out


def test_a_minibatch_fit_counts_epochs_and_quiet_prints_nothing_on_standard_error(tmp_path, banana, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    argv = ["fit", str(data), "--target", "label", "--inducing", "10", "--batch-size", "100", "--method", "sep",
            "--max-iter", "2", "--out", str(tmp_path / "m")]
    assert main(argv + ["--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and " (2 epochs of --max-iter 2 (6 steps); 10 inducing points)" in out
    assert main(argv) == 0
    lines = _stderr_lines(capsys.readouterr().err)
    assert lines[0].startswith("agpc sep: 300 rows in minibatches of 100 (3 steps an epoch); at most 2 epochs")
    assert lines[1].startswith("agpc sep: estimate from the first steps") and lines[1].endswith("for 2 epochs")
    assert lines[2].startswith("agpc sep training, epoch 2/2: 100%")


# -- the top level: every exception is one line; exit 2 bad input, 1 internal, 130 interrupted ----------

def failing_fit(exc):
    def fit(self, X, y, **kwargs):
        raise exc
    return fit


def fit_argv(tmp, data):
    return ["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(tmp / "m.agpc")]


@pytest.mark.parametrize("exc", [ValueError("the library refused it"),
                                 PermissionError(13, "Permission denied", "x.csv"),
                                 IsADirectoryError(21, "Is a directory", "out"), OSError(28, "No space left on device"),
                                 CholeskyError("not positive definite")], ids=lambda e: type(e).__name__)
def test_bad_input_exceptions_from_the_library_are_exit_2(tmp_path, banana, monkeypatch, capsys, exc):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", failing_fit(exc))
    status = main(fit_argv(tmp_path, data))
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "internal error" not in err and not (tmp_path / "m.agpc").exists()


@pytest.mark.parametrize("exc", [FloatingPointError("ep diverged"), AttributeError("'NoneType' has no attribute 'L_C'"),
                                 TypeError("unsupported operand"), MemoryError(), RuntimeError("boom")],
                         ids=lambda e: type(e).__name__)
def test_internal_errors_are_one_line_exit_1_naming_debug(tmp_path, banana, monkeypatch, capsys, exc):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", failing_fit(exc))
    status = main(fit_argv(tmp_path, data))
    err = capsys.readouterr().err
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"agpc: internal error: {type(exc).__name__}"), err
    assert str(exc) in lines[0] and "--debug" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "m.agpc").exists()


@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_debug_prints_the_traceback_and_keeps_the_exit_status(tmp_path, banana, monkeypatch, capsys, where):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", failing_fit(FloatingPointError("ep diverged")))
    argv = fit_argv(tmp_path, data)
    argv = {"before": ["--debug"] + argv, "after": argv + ["--debug"], "env": argv}[where]
    if where == "env":
        monkeypatch.setenv("AGPC_TRACEBACK", "1")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == "FloatingPointError: ep diverged"
    assert "agpc: internal error" not in err


def test_debug_keeps_a_usage_errors_exit_status_2(tmp_path, capsys):
    status = main(["predict", str(tmp_path / "nope.agpc"), str(tmp_path / "d.csv"), "--out", str(tmp_path / "p.csv"),
                   "--debug"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" in err and "UsageError" in err


def test_an_interrupt_is_one_line_exit_130(tmp_path, banana, monkeypatch, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", failing_fit(KeyboardInterrupt()))
    assert main(fit_argv(tmp_path, data)) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["agpc: interrupted"]


@pytest.fixture
def every_core_busy():
    """A process spinning on every core for the test's duration, as on a busy machine."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


# Run 'python -m agpc ARGS' from a process that first ignores SIGINT (kept across exec, as a shell's background
# job has it) or closes its standard output (>&-); a wrapper that execs, rather than a preexec_fn, which is not
# safe beside the threads a test process may have.
EXEC_AGPC = """
import os, signal, sys
if sys.argv[1] == "sigint-ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
elif sys.argv[1] == "stdout-closed":
    os.close(1)
os.execv(sys.executable, [sys.executable, "-m", "agpc", *sys.argv[2:]])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize("inherited", ["SIGINT as usual", "SIGINT ignored by the parent (a background job)"])
def test_ctrl_c_during_fit_is_one_line_exit_130_and_writes_nothing(tmp_path, banana, every_core_busy, inherited):
    """Beside a process keeping every core busy, the command exits within 10 s of the signal. A process
    started as a background job of a shell without job control inherits SIGINT ignored, and Python leaves it
    so: the fit went on to its --max-time (the test's 120 s timeout on a busy machine)."""
    data = write_csv(tmp_path / "d.csv", *banana)
    argv = ["fit", str(data), "--target", "label", "--inducing", "10", "--max-iter", "100000000", "--max-time", "300",
            "--plateau", "none", "--quiet", "--out", str(tmp_path / "m.agpc")]  # (no stop of its own before the signal)
    how = "sigint-ignored" if "ignored" in inherited else "as-is"
    with subprocess.Popen([sys.executable, "-c", EXEC_AGPC, how, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=subprocess_env()) as proc:
        assert proc.stdout.readline().startswith("agpc fit:")  # the data are read; training starts
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)  # (a fit that ignored the signal runs to its --max-time, 300 s;
        except subprocess.TimeoutExpired:  # an interpreter's exit under CI's load and this test's busy cores: seconds)
            proc.kill()
            pytest.fail("no exit within 60 s of SIGINT")
    assert proc.returncode == 130 and err.strip().splitlines() == ["agpc: interrupted"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM to a child process")
def test_sigterm_during_fit_is_one_line_exit_143_and_writes_nothing(tmp_path, banana):
    """The hostile-input audit of 2026-12-04: ``timeout`` (SIGTERM) ended a ``--jobs 2`` fit by Python's default,
    with no clean-up: the copies of the rows its workers shared stayed in /dev/shm. SIGTERM now unwinds the command as
    Ctrl-C does (what it set up is taken down), one line, exit status 143 as a shell reports it."""
    data = write_csv(tmp_path / "d.csv", *banana)
    argv = ["fit", str(data), "--target", "label", "--inducing", "10", "--max-iter", "100000000", "--max-time", "300",
            "--plateau", "none", "--quiet", "--out", str(tmp_path / "m.agpc")]
    with subprocess.Popen([sys.executable, "-c", EXEC_AGPC, "as-is", *argv], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=subprocess_env()) as proc:
        assert proc.stdout.readline().startswith("agpc fit:")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("no exit within 60 s of SIGTERM")
    assert proc.returncode == 143 and err.strip().splitlines() == ["agpc: terminated (SIGTERM)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]


def test_ctrl_c_over_the_progress_bar_is_the_last_line_on_a_line_of_its_own(tmp_path, banana, monkeypatch, capsys):
    """With the progress bar showing (no --quiet), "agpc: interrupted" was written onto the bar's line and the bar
    drawn again after it when it was collected, where the help says the error line is the last line."""
    data = write_csv(tmp_path / "d.csv", *banana)
    real, steps = training.Trainer.step, []

    def step(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == 4:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(training.Trainer, "step", step)
    status = main(["fit", str(data), "--target", "label", "--inducing", "10", "--max-iter", "50", "--out",
                   str(tmp_path / "m.agpc")])
    gc.collect()  # (the bar of the interrupted run, collected: nothing more may be drawn)
    err = capsys.readouterr().err
    assert status == 130 and "agpc ep:" in err  # (the bar was shown)
    assert err.endswith("\nagpc: interrupted\n"), repr(err[-200:])


INTERRUPTED_WHILE_LOADING = """
import builtins, os, runpy, signal, sys

# as a terminal's foreground process has SIGINT, or as a shell's background job inherits it (ignored); either
# way, not as the test runner happened to be started
signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == "sigint-ignored" else signal.default_int_handler)
real_import = builtins.__import__

def interrupting_import(name, *args, **kwargs):
    if name == "numpy" and not getattr(interrupting_import, "sent", False):
        interrupting_import.sent = True
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the command loads NumPy and the rest
    return real_import(name, *args, **kwargs)

builtins.__import__ = interrupting_import
sys.argv = ["agpc", "--version"]
runpy.run_module("agpc", run_name="__main__", alter_sys=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to the process itself")
@pytest.mark.parametrize("inherited", ["SIGINT as usual", "SIGINT ignored by the parent (a background job)"])
def test_ctrl_c_while_the_command_loads_is_one_line_exit_130(inherited):
    """The first second or two of 'agpc ...' is Python importing NumPy, SciPy and scikit-learn: a Ctrl-C
    then printed Python's traceback. The console script is agpc.__main__:main, which catches it there; in a
    process that inherited SIGINT ignored, agpc.__main__ takes it back while it loads (the version was printed)."""
    how = "sigint-ignored" if "ignored" in inherited else "as-is"
    run = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_LOADING, how], capture_output=True, text=True,
                         env=subprocess_env(), timeout=120)
    assert run.returncode == 130 and run.stderr.strip().splitlines() == ["agpc: interrupted"], run.stderr
    assert run.stdout == ""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        assert b'agpc = "agpc.__main__:main"' in fh.read()


def test_a_closed_standard_output_is_not_an_error(tmp_path, banana):
    """agpc fit ... >&- : the model is written, the summary dropped, exit 0 (was an AttributeError, exit 1)."""
    data = write_csv(tmp_path / "d.csv", *banana)
    run = subprocess.run([sys.executable, "-c", EXEC_AGPC, "stdout-closed", *fit_argv(tmp_path, data)],
                         stderr=subprocess.PIPE, text=True, env=subprocess_env(), timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert GPClassifier.load(tmp_path / "m.agpc").n_features_in_ == 2


def test_a_missing_optional_package_is_exit_2_naming_it(tmp_path, banana, monkeypatch, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", failing_fit(ModuleNotFoundError("No module named 'cupy'", name="cupy")))
    status = main(fit_argv(tmp_path, data))
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "'cupy'" in err


def test_inducing_defaults_to_the_size_rule_as_the_estimator_does(tmp_path, capsys):
    """``--inducing`` is ``n_inducing``: 'auto' by default (the estimator's default: the exact model on 120 binary
    rows, an inducing point a row), 'all' and a number as the estimator takes them; the summary line says the
    model's size. Fails if the command keeps a fixed default of its own."""
    assert 120 <= EXACT_MAX_ROWS  # (the rows below are the exact case of the rule)
    X, y = make_banana(120, random_state=1)
    data = write_csv(tmp_path / "train.csv", X, y)
    expected = GPClassifier(max_iter=3, random_state=0).fit(X, y)
    assert expected.inducing_points_.shape[0] == 120  # the size rule's exact model, as the estimator fits it
    for choice, m in [(None, 120), ("all", 120), ("7", 7)]:
        model = tmp_path / f"m-{choice}.agpc"
        extra = [] if choice is None else ["--inducing", choice]
        argv = ["fit", str(data), "--target", "label", "--max-iter", "3", "--random-state", "0", "--quiet", *extra,
                "--out", str(model)]
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert f"{m} inducing points)" in printed
        fitted = load_model(model)
        assert fitted.inducing_points_.shape[0] == m
        if choice is None:  # the estimator's default fit, the same model
            named = {"x1": X[:, 0], "x2": X[:, 1]}  # (the CLI's model has the CSV's column names)
            np.testing.assert_allclose(fitted.predict_proba(pandas.DataFrame(named)), expected.predict_proba(X),
                                       rtol=1e-10)
    assert main(["fit", str(data), "--target", "label", "--inducing", "0", "--out", str(tmp_path / "z.agpc")]) == 2
    assert "'auto', 'all' or a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["fit"], ["frobnicate"], ["fit", "d.csv", "--out", "m", "--inducing", "many"],
                                  ["predict", "--latent"], ["--no-such-option"]])
def test_argument_errors_are_one_line_exit_2(argv, capsys):
    status = main(argv)
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "--help" in err


def test_version_comes_from_the_installed_metadata(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"agpc {version('agpc')}"


def test_version_falls_back_to_the_package_attribute(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli._version() == agpc.__version__


def test_help_documents_exit_statuses_and_warnings(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "130 interrupted" in text and "2 bad input" in text and "1 an internal error" in text
    assert "agpc: warning:" in text and "always the last line" in text


def warning_fit(real_fit, message):
    def fit(self, X, y, **kwargs):
        warnings.warn(message, UserWarning)
        warnings.warn(message, UserWarning)  # from another line: shown once all the same
        warnings.warn("overflow somewhere\nin two lines", RuntimeWarning)
        return real_fit(self, X, y, **kwargs)
    return fit


def test_warnings_are_one_line_each_after_the_output(tmp_path, banana, monkeypatch, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)
    monkeypatch.setattr(GPClassifier, "fit", warning_fit(GPClassifier.fit, "jitter raised to 1e-4"))
    assert main(fit_argv(tmp_path, data)) == 0
    out, err = capsys.readouterr()
    assert "wrote" in out
    assert err.strip().splitlines() == ["agpc: warning: jitter raised to 1e-4",
                                        "agpc: warning: RuntimeWarning: overflow somewhere in two lines"]


def test_warnings_come_before_the_error_line_which_is_last(tmp_path, banana, monkeypatch, capsys):
    data = write_csv(tmp_path / "d.csv", *banana)

    def fit(self, X, y, **kwargs):
        warnings.warn("inducing points too close together", UserWarning)
        raise FloatingPointError("ep diverged")

    monkeypatch.setattr(GPClassifier, "fit", fit)
    assert main(fit_argv(tmp_path, data)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "agpc: warning: inducing points too close together"
    assert len(lines) == 2 and lines[1].startswith("agpc: internal error: FloatingPointError: ep diverged")


INJECTED = """import sys, warnings
import agpc.classifier
real_fit = agpc.classifier.GPClassifier.fit
def fit(self, X, y, **kwargs):
    warnings.warn("a warning from the library", UserWarning)
    if {fail}:
        raise TypeError("a bug")
    return real_fit(self, X, y, **kwargs)
agpc.classifier.GPClassifier.fit = fit
from agpc.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("fail", [False, True])
def test_in_a_terminal_the_warning_follows_the_output_and_the_error_is_last(tmp_path, banana, fail):
    data = write_csv(tmp_path / "d.csv", *banana)
    run = subprocess.run([sys.executable, "-c", INJECTED.format(fail=fail), *fit_argv(tmp_path, data)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=subprocess_env(), timeout=120)
    lines = run.stdout.strip().splitlines()
    if fail:
        assert run.returncode == 1 and "Traceback" not in run.stdout
        assert lines[-2:] == ["agpc: warning: a warning from the library",
                              "agpc: internal error: TypeError: a bug (run again with --debug for the traceback)"]
    else:
        assert run.returncode == 0
        assert lines[-2].startswith("wrote ") and lines[-1] == "agpc: warning: a warning from the library"


def test_python_dash_m_version_and_debug_traceback(tmp_path):
    run = subprocess.run([sys.executable, "-m", "agpc", "--version"], capture_output=True, text=True,
                         env=subprocess_env(), timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("agpc ")
    (tmp_path / "x.agpc").write_text("not a model")
    argv = ["predict", str(tmp_path / "x.agpc"), str(tmp_path / "x.agpc"), "--out", str(tmp_path / "p.csv"), "--debug"]
    run = subprocess.run([sys.executable, "-m", "agpc", *argv], capture_output=True, text=True, env=subprocess_env(),
                         timeout=120)
    assert run.returncode == 2 and "Traceback" in run.stderr and "UsageError" in run.stderr


# -- demo and bench ------------------------------------------------------------------------------------

def test_demo_writes_a_png(tmp_path, capsys):
    png = tmp_path / "demo.png"
    assert main(["demo", "--inducing", "10", "--max-iter", "2", "--plot", str(png)]) == 0
    assert "| banana (synthetic, 2-D)" in capsys.readouterr().out
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert [p.name for p in tmp_path.iterdir()] == ["demo.png"]


def test_demo_leaves_no_file_unless_asked(tmp_path, monkeypatch, capsys):
    """Without --plot the demo writes nothing: it used to leave agpc-demo.png in the directory it ran in (a source
    checkout's, where git showed it as a new file)."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--inducing", "10", "--max-iter", "2"]) == 0
    assert "Plot: none written (--plot PATH" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options, said", [(["--inducing", "-3"], "n_inducing"), (["--max-iter", "-1"], "max_iter"),
                                           (["--inducing", "5000"], "--inducing 5000: at most 512")])
def test_demo_checks_its_options_before_its_table(options, said, capsys):
    """Found by a hostile-input audit (2026-12-02): a bad option printed the table's header on stdout, then the error.
    Now the options are checked first: nothing on stdout, one error line."""
    assert main(["demo", *options]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("agpc: error:") and said in err, (out, err)


FAKE_BENCHMARK = """import sys
import warnings
from pathlib import Path
out = Path(__file__).parent / "results"
out.mkdir(exist_ok=True)
(out / "fake.png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\nfake")
print("## Fake benchmark\\n\\nsome prose\\n")
print("| setting | value |\\n|---|---|\\n| quick | " + str("--quick" in sys.argv) + " |")
"""


def test_bench_runs_the_scripts_present_and_collects_tables_and_pngs(tmp_path, monkeypatch, capsys):
    bench_dir = tmp_path / "benchmarks"
    bench_dir.mkdir()
    (bench_dir / "uci_binary.py").write_text(FAKE_BENCHMARK)
    (bench_dir / "airline.py").write_text("import sys\nprint('| a |')\nsys.exit(3)\n")
    monkeypatch.setattr(cli, "_benchmarks_dir", lambda: bench_dir)
    out = tmp_path / "results"
    assert main(["bench", "--quick", "--out", str(out)]) == 1  # airline.py failed
    results = (out / "results.md").read_text()
    assert "### Fake benchmark" in results and "| quick | True |" in results and "some prose" not in results
    assert "![fake.png](fake.png)" in results and (out / "fake.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "exit status 3" in results
    for missing in ("uci_iterations.py", "uci_multiclass.py", "banana_inducing.py", "time_curves.py"):
        assert f"## benchmarks/{missing}\n\nSkipped: not in this checkout." in results
    assert "skipped benchmarks/time_curves.py" in capsys.readouterr().out


def test_bench_without_a_source_checkout_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_benchmarks_dir", lambda: None)
    status = main(["bench", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "source repository" in err and not (tmp_path / "b").exists()


@pytest.mark.parametrize("out, said", [("/dev/null", "--out /dev/null: not a directory ('agpc bench' writes a "
                                                    "directory of results"),
                                       ("file", "not a directory"), ("/proc/agpc-bench", "is under /proc"),
                                       ("", "--out: an empty path names no directory")])
def test_bench_out_that_is_not_a_directory_is_one_line(tmp_path, monkeypatch, capsys, out, said):
    """'agpc bench --quick --out /dev/null' said "/dev/null: File exists" (mkdir's error); no script is run."""
    monkeypatch.setattr(cli, "_run_benchmark", lambda *a: pytest.fail("a benchmark was run"))
    if out == "file":
        out = tmp_path / "results.txt"
        out.write_text("kept")
    status = main(["bench", "--quick", "--out", str(out)])
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert said in err


def test_bench_writes_no_png_through_a_link_in_out_to_what_agpc_does_not_write(tmp_path, monkeypatch, capsys):
    """Found by a hostile-input audit (2026-12-02): a benchmark's PNG was copied by shutil.copy2, which followed a
    link of that name in --out wherever it pointed (here a directory, which then received the file). Every file of
    --out is now written as every output is: the link is one error line, nothing is written through it."""
    bench_dir = tmp_path / "benchmarks"
    bench_dir.mkdir()
    (bench_dir / "uci_binary.py").write_text(FAKE_BENCHMARK)
    monkeypatch.setattr(cli, "_benchmarks_dir", lambda: bench_dir)
    out, elsewhere = tmp_path / "results", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "fake.png").symlink_to(elsewhere)
    status = main(["bench", "--quick", "--out", str(out)])
    err = capsys.readouterr().err
    assert_one_line_error(status, err)
    assert "--out: fake.png" in err and "directory" in err
    assert list(elsewhere.iterdir()) == []


def test_bench_finds_the_checkouts_benchmarks():
    assert cli._benchmarks_dir() == ROOT / "benchmarks"


def _saved_fit(tmp_path, monkeypatch, data, options):
    """The model 'agpc fit DATA OPTIONS' saves (caught on its way to the file)."""
    saved = []
    monkeypatch.setattr(agpc.persistence, "save_model", lambda model, path: saved.append(model))
    assert main(["fit", str(data), *options, *FIT_OPTIONS, "--out", str(tmp_path / "m.agpc")]) == 0
    return saved[0]


def test_fit_takes_a_weight_column_and_the_balanced_class_weight(tmp_path, banana, monkeypatch):
    """--weight-column NAME is each row's sample_weight, not a feature; --class-weight balanced is class_weight:
    the saved models are the estimator's with those weights (a validation split keeps the training rows' weights)."""
    X, y = banana
    w = np.linspace(0.2, 2.0, len(y))
    data = write_table(tmp_path / "d.csv", {"x1": X[:, 0].tolist(), "w": w.tolist(), "x2": X[:, 1].tolist(),
                                            "label": y.tolist()})
    weighted = _saved_fit(tmp_path, monkeypatch, data, ["--target", "label", "--weight-column", "w"])
    assert list(weighted.feature_names_in_) == ["x1", "x2"]
    expected = GPClassifier(**SETTINGS).fit(X, y, sample_weight=w)
    with pytest.warns(UserWarning, match="valid feature names"):
        np.testing.assert_array_equal(weighted.predict_proba(X), expected.predict_proba(X))
    balanced = _saved_fit(tmp_path, monkeypatch, data, ["--target", "label", "--weight-column", "w",
                                                        "--class-weight", "balanced"])
    assert balanced.class_weight == "balanced"
    expected = GPClassifier(class_weight="balanced", **SETTINGS).fit(X, y, sample_weight=w)
    with pytest.warns(UserWarning, match="valid feature names"):
        np.testing.assert_array_equal(balanced.predict_proba(X), expected.predict_proba(X))
    split = _saved_fit(tmp_path, monkeypatch, data, ["--target", "label", "--weight-column", "w",
                                                     "--validation-fraction", "0.2"])
    val = cli._validation_rows(y, 0.2, 0)
    expected = GPClassifier(**SETTINGS).fit(X[~val], y[~val], sample_weight=w[~val], validation_data=(X[val], y[val]))
    with pytest.warns(UserWarning, match="valid feature names"):
        np.testing.assert_array_equal(split.predict_proba(X), expected.predict_proba(X))


_X1, _LABELS = [0.1 * i for i in range(12)], [0, 1] * 6  # (12 rows: more than FIT_OPTIONS' inducing points)


@pytest.mark.parametrize("columns, options, message", [
    ({"x1": _X1, "w": [1] * 11 + [-1], "label": _LABELS}, ["--weight-column", "w"], "non-negative"),
    ({"x1": _X1, "w": [1] * 11 + ["heavy"], "label": _LABELS}, ["--weight-column", "w"], "'w'"),
    ({"x1": _X1, "label": _LABELS}, ["--weight-column", "w"], "no column 'w'"),
    ({"x1": _X1, "label": _LABELS}, ["--weight-column", "label"], "is the --target column"),
])
def test_a_bad_weight_column_is_one_error(tmp_path, capsys, columns, options, message):
    data = write_table(tmp_path / "d.csv", columns)
    assert main(["fit", str(data), "--target", "label", *options, *FIT_OPTIONS, "--out", str(tmp_path / "m")]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("weight, said", [("-1", "line 13, weight column 'w': -1, a weight must be non-negative"),
                                          ("nan", "line 13, weight column 'w': missing value"),
                                          ("inf", "line 13, weight column 'w': inf, a weight must be finite")])
def test_a_bad_weight_names_its_line_and_column(tmp_path, capsys, weight, said):
    """CLI weight errors said "at row 11" (counted from 0, no file or column) where every other CLI error says "line
    13": a bad weight is the reader's error, naming the file, the line and the weight column."""
    data = write_table(tmp_path / "d.csv", {"x1": _X1, "w": [1] * 11 + [weight], "label": _LABELS})
    assert main(["fit", str(data), "--target", "label", "--weight-column", "w", *FIT_OPTIONS, "--out",
                 str(tmp_path / "m")]) == 2
    assert f"d.csv: {said}" in capsys.readouterr().err


def test_a_row_of_weight_0_is_neither_trained_on_nor_scored(tmp_path, banana, monkeypatch, capsys):
    """Weight 0 is the row removed (docs/weights.md): 'agpc fit --weight-column' with a validation split saves the
    model of the file without those rows, and scores none of them."""
    X, y = banana
    w = np.where(np.arange(len(y)) % 7 == 3, 0.0, 1.0)
    data = write_table(tmp_path / "d.csv", {"x1": X[:, 0].tolist(), "w": w.tolist(), "x2": X[:, 1].tolist(),
                                            "label": y.tolist()})
    keep = w > 0
    removed = write_table(tmp_path / "removed.csv", {"x1": X[keep, 0].tolist(), "x2": X[keep, 1].tolist(),
                                                     "label": y[keep].tolist()})
    options = ["--target", "label", "--validation-fraction", "0.2"]
    weighted = _saved_fit(tmp_path, monkeypatch, data, options + ["--weight-column", "w"])
    scored = capsys.readouterr().out
    without = _saved_fit(tmp_path, monkeypatch, removed, options)
    assert scored.split("training rows")[1].split("fit time")[0] == capsys.readouterr().out.split(
        "training rows")[1].split("fit time")[0]  # (the same rows trained on and scored, the same scores)
    with pytest.warns(UserWarning, match="valid feature names"):
        np.testing.assert_allclose(weighted.predict_proba(X), without.predict_proba(X), rtol=1e-10, atol=1e-12)


def test_a_weight_column_needs_named_columns(tmp_path, banana, capsys):
    data, target = write_npy(tmp_path / "d.npy", *banana)
    assert main(["fit", str(data), *target, "--weight-column", "0", *FIT_OPTIONS, "--out", str(tmp_path / "m")]) != 0
    assert "named columns" in capsys.readouterr().err


# -- names from a file reach the terminal escaped ------------------------------------------------------------

HOSTILE = {"colour": "x\x1b[31mred", "title": "t\x1b]0;owned\x07", "bidi": "\u202eevil", "class": "a\x1b[2J",
           "newline": "b\nc", "separator": "\u2028agpc: error: forged\u2029!"}
# (U+2028 / U+2029: str.splitlines and the log tools that follow it break a line there: a name could forge a line)
ACTS_ON_A_TERMINAL = [chr(c) for c in (*range(0, 10), *range(11, 32), *range(0x7f, 0xa0))] + ["\u202e", "\u2028",
                                                                                              "\u2029"]


def _quoted_table(path, columns):
    """A CSV written by the csv module (a cell holding a line break is quoted)."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(list(columns))
        writer.writerows(zip(*(np.asarray(values).tolist() for values in columns.values())))
    return path


def _acting(text):
    """The characters of printed text that would act on a terminal (a line break ends a line: not counted)."""
    return sorted({c for c in text if c in ACTS_ON_A_TERMINAL})


def test_names_and_labels_from_files_reach_the_terminal_escaped_and_the_model_keeps_them(tmp_path, capsys):
    """A CSV header, a label or a model file's names with ESC / OSC / BEL / a newline / a direction override were
    printed as they were by ``agpc fit``, ``agpc inspect``, ``summary()`` and ``agpc predict``'s error line (a model
    file could set the terminal's title). Every name is printed through ``untrusted.printable``; the model keeps the
    exact names."""
    X, y = make_banana(80, random_state=0)
    labels = np.where(y > 0, HOSTILE["class"], HOSTILE["newline"])
    names = [HOSTILE["colour"], HOSTILE["title"] + HOSTILE["bidi"] + HOSTILE["separator"]]
    data = _quoted_table(tmp_path / "hostile.csv", {names[0]: X[:, 0], names[1]: X[:, 1], "label": labels})
    model = tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(model)]) == 0
    fit_output = capsys.readouterr()
    assert main(["inspect", str(model)]) == 0
    inspected = capsys.readouterr()
    loaded = load_model(model)
    assert loaded.feature_names_in_.tolist() == names and sorted(loaded.classes_.tolist()) == sorted(set(labels))
    summary = loaded.summary()
    for printed in (fit_output.out, fit_output.err, inspected.out, inspected.err, summary):
        assert _acting(printed) == []
    assert "x\\x1b[31mred" in inspected.out and "t\\x1b]0;owned\\x07\\u202eevil\\u2028agpc" in summary
    assert "b\\nc" in summary and "b\\nc" in fit_output.out
    assert main(["predict", str(model), str(data), "--out", str(tmp_path / "q.csv")]) == 0  # labels kept exactly
    assert read_labels(tmp_path / "q.csv") == loaded.predict(pandas.DataFrame(X, columns=names)).tolist()
    assert _acting(capsys.readouterr().out) == []
    assert summary.count("\n") == GPClassifier(**SETTINGS).fit(
        pandas.DataFrame(X, columns=["x1", "x2"]), np.where(y > 0, "a", "b")).summary().count("\n")
    unknown = _quoted_table(tmp_path / "unknown.csv", {names[0]: X[:3, 0], names[1]: X[:3, 1],
                                                     "label": ["z\x1b]0;again\x07"] * 3})
    assert main(["predict", str(model), str(unknown), "--target", "label", "--out", str(tmp_path / "p.csv")]) == 2
    error = capsys.readouterr().err
    assert _acting(error.rstrip("\n")) == [] and "z\\x1b]0;again\\x07" in error and error.count("\n") == 1


def test_a_dataframe_s_column_names_are_escaped_in_the_summary():
    X, y = make_banana(60, random_state=1)
    frame = pandas.DataFrame(X, columns=[HOSTILE["title"], HOSTILE["newline"]])
    model = GPClassifier(**SETTINGS).fit(frame, y)
    summary = model.summary()
    assert _acting(summary) == [] and "t\\x1b]0;owned\\x07" in summary and "b\\nc" in summary
    assert model.feature_names_in_.tolist() == [HOSTILE["title"], HOSTILE["newline"]]


def test_long_names_are_cut_in_reports_and_the_model_keeps_them():
    """A model file (or a DataFrame) may name a feature or a class in a megabyte (a feature name has no bound in
    the file format): ``summary()`` and ``agpc inspect`` printed it whole, every table row padded to its width.
    A report shows at most ``inspection.NAME_CHARS`` characters of a name, then its length, still escaped."""
    X, y = make_banana(60, random_state=1)
    long_feature = "\x1b]0;" + "f" * 200_000
    frame = pandas.DataFrame(X, columns=[long_feature, "short"])
    model = GPClassifier(**SETTINGS).fit(frame, np.where(y > 0, "c" * 1_000, "other"))
    summary = model.summary()
    assert len(summary) < 10_000 and _acting(summary) == [], len(summary)
    assert "\\x1b]0;" + "f" * 10 in summary and "(200,004 characters)" in summary
    assert "(1,000 characters)" in summary
    assert model.feature_names_in_.tolist() == [long_feature, "short"]


def test_fit_standardize_then_predict_on_the_raw_csv_equals_a_fit_on_standardised_data(tmp_path, banana, capsys):
    """agpc fit --standardize standardises on the training rows and keeps the means and scales in the model file:
    agpc predict on the raw CSV gives what a Python fit on the standardised features predicts for them (issue 41,
    item 7), and the loaded model is that scaler and classifier."""
    X, y = banana
    X = X * [1.0, 1000.0] + [0.0, -500.0]  # features of very different scales
    data = write_csv(tmp_path / "train.csv", X, y)
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    assert main(["fit", str(data), "--target", "label", "--standardize", *FIT_OPTIONS, "--out", str(model)]) == 0
    assert main(["predict", str(model), str(data), "--out", str(out)]) == 0
    scaler = StandardScaler().fit(X)
    expected = GPClassifier(**SETTINGS).fit(scaler.transform(X), y).predict_proba(scaler.transform(X))
    _, values = read_predictions(out)
    np.testing.assert_allclose(values, expected, rtol=1e-12, atol=1e-15)
    loaded = load_model(model)
    np.testing.assert_array_equal(loaded[0].mean_, scaler.mean_)
    assert list(loaded.feature_names_in_) == ["x1", "x2"]
    capsys.readouterr()
    assert main(["inspect", str(model)]) == 0
    assert "standardised" in capsys.readouterr().out


def test_predict_latent_of_a_standardize_model_is_the_classifier_s_on_the_standardised_rows(tmp_path, banana):
    """agpc predict --latent on a --standardize model (a Pipeline, which has no predict_latent) writes the
    classifier's latent moments at the scaled rows (it crashed with an AttributeError)."""
    X, y = banana
    X = X * [1.0, 1000.0]
    data = write_csv(tmp_path / "train.csv", X, y)
    model, out = tmp_path / "m.agpc", tmp_path / "p.csv"
    assert main(["fit", str(data), "--target", "label", "--standardize", *FIT_OPTIONS, "--out", str(model)]) == 0
    assert main(["predict", str(model), str(data), "--latent", "--out", str(out)]) == 0
    loaded = load_model(model)
    mean, var = loaded[-1].predict_latent(loaded[0].transform(pandas.DataFrame(X, columns=["x1", "x2"])))
    header, values = read_predictions(out)
    assert header[-2:] == ["latent_mean", "latent_var"]
    np.testing.assert_allclose(values[:, -2:], np.column_stack([mean, var]), rtol=1e-12, atol=1e-15)


def test_standardize_weighs_the_rows_as_the_fit_does(tmp_path, banana):
    """With --weight-column the scaler's means and scales count a row of weight 2 as the row twice, as the fit
    does (docs/weights.md): they are those of the rows repeated by their weights, not of the rows once each."""
    X, y = banana
    w = np.where(X[:, 0] > 0, 3, 1)  # the weights move the mean of x1: an unweighted scaler differs
    data = write_table(tmp_path / "w.csv", {"x1": X[:, 0], "x2": X[:, 1], "w": w, "label": y})
    model = tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", "--weight-column", "w", "--standardize", *FIT_OPTIONS,
                 "--out", str(model)]) == 0
    repeated = StandardScaler().fit(np.repeat(X, w, axis=0))
    scaler = load_model(model)[0]
    np.testing.assert_allclose(scaler.mean_, repeated.mean_, rtol=1e-12)
    np.testing.assert_allclose(scaler.scale_, repeated.scale_, rtol=1e-12)
    assert abs(scaler.mean_[0] - X[:, 0].mean()) > 0.1


def test_standardize_is_refused_for_rows_that_stay_on_disk_or_on_a_cluster(tmp_path, banana, capsys):
    """--standardize holds the training rows in memory: a zarr store (read a chunk at a time) and a fit on a dask
    cluster are refused, before any connection, with one line that says why."""
    data, target = write_zarr(tmp_path / "d.zarr", *banana)
    model = tmp_path / "m.agpc"
    assert main(["fit", str(data), *target, "--standardize", *FIT_OPTIONS, "--out", str(model)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--standardize" in error and "chunk at a time" in error
    csv_data = write_csv(tmp_path / "d.csv", *banana)
    assert main(["fit", str(csv_data), "--target", "label", "--standardize", "--scheduler", "tcp://127.0.0.1:1",
                 *FIT_OPTIONS, "--out", str(model)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--standardize" in error and "--scheduler" in error
    assert not model.exists()


def test_inspect_of_a_standardize_model_names_the_file_s_columns(tmp_path, banana, capsys):
    """The pipeline's feature names (on its scaler) are the summary's, not x0, x1 and "not named"."""
    X, y = banana
    data = write_csv(tmp_path / "train.csv", X, y, names=["height", "weight", "label"])
    model = tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", "--standardize", *FIT_OPTIONS, "--out", str(model)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(model)]) == 0
    out = capsys.readouterr().out
    assert "features: height, weight" in out and "not named" not in out and "x0" not in out
    assert "standardised" in out


def test_early_stopping_on_holds_out_rows_and_says_so(tmp_path, capsys):
    """--early-stopping on is GPClassifier(early_stopping=True): 10% of the rows held out, the summary counts the epochs
    on the others and says how many were held out; off (the default) holds none out."""
    X, y = make_banana(600, random_state=0)
    data = write_csv(tmp_path / "d.csv", X, y)
    argv = ["fit", str(data), "--target", "label", "--inducing", "8", "--max-iter", "5", "--quiet",
            "--out", str(tmp_path / "m")]
    assert main(argv + ["--early-stopping", "on"]) == 0
    out = capsys.readouterr()[0]
    model = load_model(tmp_path / "m")
    assert model.early_stopping_ and model.n_samples_fit_ == 540
    assert "; 60 of the rows held out to stop on (early_stopping)" in out
    assert main(argv) == 0
    assert "held out" not in capsys.readouterr()[0] and not load_model(tmp_path / "m").early_stopping_


def test_standardize_of_a_column_whose_variance_overflows_names_the_column(tmp_path, banana, capsys):
    """Found by a hostile-input audit (2026-12-02): a finite column near 1e200 (its squares overflow) made the
    scaler's NaN, and the fit said "Input X contains NaN" of a file that holds none. One line names the column."""
    X, y = banana
    data = write_csv(tmp_path / "big.csv", np.c_[X[:, :1], X[:, 1:2] * 1e200], y)
    model = tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", "--standardize", *FIT_OPTIONS, "--out", str(model)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--standardize" in error and "overflows float64" in error, error
    assert "NaN" not in error and "RuntimeWarning" not in error and not model.exists()


def test_a_categorical_column_of_levels_that_look_like_numbers_is_read_as_the_model_s_text(tmp_path, capsys):
    """The hostile-input audit of 2026-12-04: a model of a text column of levels "10", "S", "M" refused a file to
    predict whose column held mostly "10" ("feature column 'size' is not numeric (value 'S')": the reader took the
    column by its majority, as numbers); a file of "10" only was read as the number 10. The model's categorical
    columns are read as text: the rows predict as the same rows in the training file do."""
    X, y = make_banana(200, random_state=0)
    sizes = np.where(y > 0, "10", np.where(np.arange(200) % 2, "S", "M"))
    train = tmp_path / "train.csv"
    train.write_text("a,b,size,label\n" + "".join(f"{a},{b},{s},{c}\n" for (a, b), s, c in zip(X, sizes, y)))
    model = tmp_path / "m.agpc"
    assert main(["fit", str(train), "--target", "label", *FIT_OPTIONS, "--quiet", "--out", str(model)]) == 0
    reference = load_model(model).predict_proba(pandas.DataFrame({"a": X[:, 0], "b": X[:, 1], "size": sizes}))
    ten = np.flatnonzero(sizes == "10")
    for name, rows in (("mostly_ten", np.r_[ten, np.flatnonzero(sizes != "10")[:10]]), ("only_ten", ten)):
        data = tmp_path / f"{name}.csv"
        data.write_text("a,b,size\n" + "".join(f"{X[i, 0]},{X[i, 1]},{sizes[i]}\n" for i in rows))
        assert main(["predict", str(model), str(data), "--out", str(tmp_path / f"{name}_p.csv")]) == 0, name
        predicted = pandas.read_csv(tmp_path / f"{name}_p.csv")
        np.testing.assert_allclose(predicted[["p_-1", "p_1"]].to_numpy(), reference[rows], rtol=1e-12, err_msg=name)
    capsys.readouterr()


def test_one_class_left_by_the_weight_column_is_said_so(tmp_path, banana, capsys):
    """The hostile-input audit of 2026-12-04: a file of two classes whose --weight-column left one row of weight above
    0 was "every label is -1", of a file that holds both: the refusal says the rows of weight 0 were left out."""
    X, y = banana
    path = tmp_path / "w.csv"
    path.write_text("a,b,label,w\n" + "".join(f"{a},{b},{c},{int(i == 0)}\n" for i, ((a, b), c) in
                                                 enumerate(zip(X, y))))
    assert main(["fit", str(path), "--target", "label", "--weight-column", "w", "--out", str(tmp_path / "m")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"(1 of {len(y)}: those of weight 0 are left out) are all labelled" in error


def test_a_value_that_starts_with_a_dash_is_said_to_need_an_equals_sign(tmp_path, banana, capsys):
    """The hostile-input audit of 2026-12-04: ``--classes -2,-1,0,1`` (ordered classes from a negative one) was
    "argument --classes: expected one argument", which argparse says of a value that looks like an option."""
    data = write_csv(tmp_path / "d.csv", *banana)
    argv = ["fit", str(data), "--target", "label", "--likelihood", "ordinal", "--out", str(tmp_path / "m.agpc")]
    assert main(argv + ["--classes", "-1,1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "expected one argument" in error and "--classes=-2)" in error, error
    assert main(argv + ["--classes=-1,1", *FIT_OPTIONS]) == 0


def test_standardize_of_a_column_whose_variance_underflows_names_the_column(tmp_path, banana, capsys):
    """The hostile-input audit of 2026-12-04: features times 1e-160 fitted with --standardize and wrote a model file
    that 'agpc predict' then refused ("scaler_scale: a scale below 1.49e-154"). The fit refuses it, naming the column,
    before it trains or writes anything."""
    X, y = banana
    data = write_csv(tmp_path / "tiny.csv", np.c_[X[:, :1], X[:, 1:2] * 1e-160], y)
    model = tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", "--standardize", *FIT_OPTIONS, "--out", str(model)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--standardize" in error and "standard deviation" in error, error
    assert "below 1.49e-154" in error and not model.exists()


def test_smaller_misreadings_of_a_hostile_input_audit_are_refused(tmp_path, capsys):
    """A hostile-input audit (2026-12-02): a CSV cell "1_000" was read as 1000 (Python's float takes underscores;
    "1,000" was refused); ``--out results/`` wrote a file named "results"; ``--plot plot.pdf`` wrote PNG bytes
    under that name; a masked array's mask was ignored (the values under it predicted)."""
    table = tmp_path / "t.csv"
    table.write_text("a,b,y\n" + "".join(f"{i / 10},{(i * 7) % 5},{i % 2}\n" for i in range(30)) + "1_000,3,1\n")
    assert main(["fit", str(table), "--target", "y", "--out", str(tmp_path / "m.agpc")] + FIT_OPTIONS) == 2
    assert "line 32, feature column 'a' is not numeric (value '1_000')" in capsys.readouterr().err
    table.write_text("a,b,y\n" + "".join(f"{i / 10},{(i * 7) % 5},{i % 2}\n" for i in range(31)))
    assert main(["fit", str(table), "--target", "y", "--out", str(tmp_path / "results") + "/"] + FIT_OPTIONS) == 2
    assert "it ends with '/', a directory's name, and no such directory exists; name a file" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
    assert main(["fit", str(table), "--target", "y", "--out", str(tmp_path / "m.agpc")] + FIT_OPTIONS) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "m.agpc"), "--plot", str(tmp_path / "plot.pdf")]) == 2
    assert "--plot" in capsys.readouterr().err and not (tmp_path / "plot.pdf").exists()
    model = load_model(tmp_path / "m.agpc")
    rows = np.ma.masked_array([[0.1, 1.0], [0.2, 2.0]], mask=[[0, 0], [1, 0]])
    with pytest.raises(ValueError, match=r"X is a masked array with masked values \(first at row 1, column 0\)"):
        model.predict(rows)
    np.testing.assert_array_equal(model.predict(np.ma.masked_array(rows.data)), model.predict(rows.data))


def test_file_names_reach_the_terminal_escaped_on_every_line(tmp_path, capsys):
    """A hostile-input audit (2026-12-02): errors printed file names escaped, but the lines of a command that
    worked (``agpc fit: <data>: ...``, ``wrote <out>``, ``scores on <data>``) printed them raw: a file name could set
    the terminal's title or clear it."""
    X, y = make_banana(80, random_state=0)
    data = write_csv(tmp_path / ("d" + HOSTILE["title"] + ".csv"), X, y)
    model = tmp_path / ("m" + HOSTILE["class"] + ".agpc")
    plot = tmp_path / ("p" + HOSTILE["colour"] + ".png")
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(model)]) == 0
    assert main(["predict", str(model), str(data), "--out", str(tmp_path / ("q" + HOSTILE["bidi"] + ".csv"))]) == 0
    assert main(["inspect", str(model), "--data", str(data), "--target", "label", "--plot", str(plot)]) == 0
    printed = capsys.readouterr()
    assert _acting(printed.out) == [] and _acting(printed.err) == []
    assert "t\\x1b]0;owned\\x07" in printed.out and "a\\x1b[2J" in printed.out
