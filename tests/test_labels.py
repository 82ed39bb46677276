"""Labels are taken exactly as written: integer labels of any size read from a CSV or Parquet file come back as
the same integers (or, beyond 64 bits, as their text), never through float64; whatever ``fit`` accepts,
``save`` writes and ``load`` reads back, with one limit (a label's length) checked at fit; a pandas
Categorical is labels in memory; a rare class is never lost to the validation split of ``agpc fit``."""

import csv
import datetime
import os
import re

import numpy as np
import pandas
import pytest

from agpc import GPClassifier, cli
from agpc import labels as L
from agpc.cli import main
from agpc.datasets import make_banana
from agpc.model_file import MAX_LABEL_BYTES

FIT_OPTIONS = ["--inducing", "5", "--max-iter", "2", "--random-state", "0", "--quiet"]


@pytest.fixture(scope="module")
def banana():
    return make_banana(120, random_state=0)


def write_csv(path, X, labels):
    with open(path, "w") as fh:
        fh.write("x1,x2,label\n")
        for row, label in zip(X.tolist(), labels):
            fh.write(f"{row[0]!r},{row[1]!r},{label}\n")
    return path


def two_classes(y, negative, positive):
    return [positive if v > 0 else negative for v in np.asarray(y).tolist()]


# Labels written as text, the classes a model must have after 'agpc fit' (values and NumPy kind)
WRITTEN = {
    "integers above 2^53": ("9007199254740992", "9007199254740993", [9007199254740992, 9007199254740993], "i"),
    "integers above 2^63": ("9223372036854775809", "9223372036854775810",
                            [9223372036854775809, 9223372036854775810], "u"),
    "integers above 2^64": ("18446744073709551617", "18446744073709551618",
                            ["18446744073709551617", "18446744073709551618"], "U"),
    "float labels 0.5 / 1.5": ("0.5", "1.5", ["0.5", "1.5"], "U"),
}


@pytest.mark.parametrize("case", list(WRITTEN))
@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_labels_are_read_exactly_as_written(tmp_path, banana, capsys, case, file_format):
    X, y = banana
    negative, positive, classes, kind = WRITTEN[case]
    labels = two_classes(y, negative, positive)
    if file_format == "csv":
        data = write_csv(tmp_path / "d.csv", X, labels)
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        data = tmp_path / "d.parquet"
        pq.write_table(pa.table({"x1": X[:, 0], "x2": X[:, 1], "label": labels}), data)  # a string column
    out = tmp_path / "m.agpc"
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(out)]) == 0, capsys.readouterr().err
    model = GPClassifier.load(out)
    assert model.classes_.dtype.kind == kind
    assert model.classes_.tolist() == classes
    # and predict --target scores the same file against those classes
    assert main(["predict", str(out), str(data), "--target", "label", "--out", str(tmp_path / "p.csv")]) == 0
    with open(tmp_path / "p.csv", newline="") as fh:
        header, *rows = list(csv.reader(fh))  # (the csv module undoes the quoting of a label holding a comma)
    assert header == ["predicted_label"] + [f"p_{c}" for c in classes]
    # a row each, its label the model's prediction for the row, as the training file wrote the labels
    assert [row[0] for row in rows] == [f"{c}" for c in model.predict(pandas.DataFrame(X, columns=["x1", "x2"]))]


def test_parquet_integer_columns_above_2_63_keep_their_values(tmp_path, banana):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    X, y = banana
    labels = np.where(y > 0, np.uint64(2**64 - 1), np.uint64(2**64 - 2))
    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x1": X[:, 0], "x2": X[:, 1], "label": pa.array(labels, type=pa.uint64())}), data)
    assert main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(tmp_path / "m.agpc")]) == 0
    assert GPClassifier.load(tmp_path / "m.agpc").classes_.tolist() == [2**64 - 2, 2**64 - 1]


def _categorical(y):
    pd = pytest.importorskip("pandas")
    return pd.Categorical(np.where(y > 0, "yes", "no"))


# Labels the estimator takes, and the classes (values and NumPy kind) the fitted and the loaded model have
ACCEPTED = {
    "int64": (lambda y: np.where(y > 0, 2**62 + 1, 2**62), [2**62, 2**62 + 1], "i"),
    "uint64 above 2^63": (lambda y: np.where(y > 0, np.uint64(2**63 + 1), np.uint64(2**63)), [2**63, 2**63 + 1],
                          "u"),
    "Python integers above 2^63 in an object array": (
        lambda y: np.array([2**63 + 1 if v > 0 else 2**63 for v in y], dtype=object), [2**63, 2**63 + 1], "u"),
    "Python integers in a list": (lambda y: [7 if v > 0 else 3 for v in y.tolist()], [3, 7], "i"),
    "booleans": (lambda y: y > 0, [False, True], "b"),
    "strings": (lambda y: np.where(y > 0, "yes", "no"), ["no", "yes"], "U"),
    "strings of the longest length a model file holds": (
        lambda y: np.where(y > 0, "a" * (MAX_LABEL_BYTES // 4), "b" * (MAX_LABEL_BYTES // 4)),
        ["a" * (MAX_LABEL_BYTES // 4), "b" * (MAX_LABEL_BYTES // 4)], "U"),
    "y as a pandas.Categorical": (_categorical, ["no", "yes"], "U"),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_what_fit_accepts_save_writes_and_load_reads_back(tmp_path, banana, case):
    X, y = banana
    make, classes, kind = ACCEPTED[case]
    model = GPClassifier(n_inducing=5, max_iter=2, random_state=0).fit(X, make(y))
    assert np.asarray(model.classes_).tolist() == classes
    model.save(tmp_path / "m.agpc")
    loaded = GPClassifier.load(tmp_path / "m.agpc")
    assert loaded.classes_.dtype.kind == kind and loaded.classes_.tolist() == classes
    assert np.asarray(loaded.predict(X)).tolist() == np.asarray(model.predict(X)).tolist()


@pytest.mark.parametrize("make, found", [
    (lambda y: np.where(y > 0, np.datetime64("2020-01-01"), np.datetime64("2021-01-01")), "labels of dtype datetime64"),
    (lambda y: np.where(y > 0, np.timedelta64(1, "D"), np.timedelta64(2, "D")), "labels of dtype timedelta64"),
    (lambda y: np.where(y > 0, 1 + 1j, 2 + 0j), "labels of dtype complex128"),
    (lambda y: np.where(y > 0, b"yes", b"no"), "labels of dtype |S3"),
    (lambda y: np.array([b"yes" if v > 0 else b"no" for v in y], dtype=object), "bytes labels"),
    (lambda y: np.array([datetime.date(2020, 1, 1 + int(v > 0)) for v in y], dtype=object), "date labels"),
])
def test_labels_a_model_file_cannot_give_back_are_refused_at_fit(banana, make, found):
    """Found by a hostile-input audit (2026-12-02): dates were accepted, written to the model file as text, and the
    loaded model predicted '2020-01-01' where the fitted one predicted a date (a score of 0 on the same labels).
    Labels of any kind a model file does not keep as they are (booleans, integers, floats, text) are one ValueError
    at fit saying how to convert them."""
    X, y = banana
    said = f"y holds {re.escape(found)}.*which a model file cannot give back.*y.astype\\(str\\)"
    with pytest.raises(ValueError, match=said):
        GPClassifier(n_inducing=5, max_iter=2).fit(X, make(y))


def test_integers_beyond_64_bits_are_refused_naming_what_to_do(banana):
    X, y = banana
    labels = np.array([2**64 + 1 if v > 0 else 2**64 for v in y], dtype=object)
    with pytest.raises(ValueError, match="integers beyond 64 bits.*give the labels as strings"):
        GPClassifier(n_inducing=5, max_iter=2).fit(X, labels)


def test_a_label_longer_than_a_model_file_holds_is_refused_at_fit(tmp_path, banana, no_training, capsys):
    X, y = banana
    long = "x" * 5000  # 20,000 bytes as NumPy holds text
    labels = two_classes(y, "short", long)
    with pytest.raises(ValueError, match="a label of 5,000 characters.*at most 1,024 characters"):
        GPClassifier(n_inducing=5, max_iter=2).fit(X, labels)
    data = write_csv(tmp_path / "d.csv", X, labels)
    status = main(["fit", str(data), "--target", "label", *FIT_OPTIONS, "--out", str(tmp_path / "m.agpc")])
    err = capsys.readouterr().err
    assert status == 2 and "a label of 5,000 characters" in err
    assert not (tmp_path / "m.agpc").exists()


NUL_ENDED = {"a list": list, "an object array": lambda labels: np.array(labels, dtype=object),
             "a pandas Series": lambda labels: pandas.Series(labels),
             "a pandas Categorical": lambda labels: pandas.Categorical(labels)}


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("container", list(NUL_ENDED))
def test_a_label_ending_in_nul_is_refused_at_fit(tmp_path, banana, no_training, container, classes):
    """Labels "x" and "x\0": NumPy's strings drop trailing NULs, so fit trained two classes, save wrote one twice
    and load refused the file ("a class is listed twice"); with two classes fit said "only one class". A label ending
    in NUL is refused at fit, naming it and its rows."""
    X, y = banana
    labels = [("x\0" if v > 0 else "x") if k % 3 or classes == 2 else "y" for k, v in enumerate(y.tolist())]
    with pytest.raises(ValueError, match=r"y has labels ending in a NUL character \('x\\x00'\) at rows .*would be the "
                                         "label 'x'"):
        GPClassifier(n_inducing=5, max_iter=2).fit(X, NUL_ENDED[container](labels))


def test_float_labels_with_fractions_are_refused_by_the_estimator_as_scikit_learn_does(banana):
    """Documented as intended (README, "Labels"): the estimator takes labels of any type that names classes,
    but a float array with fractions is what a regression target looks like, refused as scikit-learn's
    classifiers refuse it; 'agpc fit' reads such text as class names (see test_labels_are_read_exactly...)."""
    X, y = banana
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        GPClassifier(n_inducing=5, max_iter=2).fit(X, np.where(y > 0, 1.5, 0.5))
    model = GPClassifier(n_inducing=5, max_iter=2).fit(X, np.where(y > 0, "1.5", "0.5"))
    assert model.classes_.tolist() == ["0.5", "1.5"]


def test_a_rare_class_is_never_only_in_the_validation_split(tmp_path, banana, capsys):
    X, y = banana
    labels = np.where(y > 0, "a", "b").astype("<U4")
    labels[17] = "rare"  # one row of a third class
    seed = next(s for s in range(1000) if 17 in np.random.default_rng(s).choice(len(y), size=60, replace=False))
    _, y_train, _, y_val = cli._split(X, labels, 0.5, seed)
    assert "rare" in y_train.tolist() and sorted(set(y_val.tolist())) == ["a", "b"]
    data = write_csv(tmp_path / "d.csv", X, labels.tolist())
    status = main(["fit", str(data), "--target", "label", "--method", "sep", "--validation-fraction", "0.5",
                   "--random-state", str(seed), "--inducing", "5", "--max-iter", "2", "--quiet", "--out",
                   str(tmp_path / "m.agpc")])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "validation:" in captured.out
    assert GPClassifier.load(tmp_path / "m.agpc").classes_.tolist() == ["a", "b", "rare"]


def test_the_readme_says_what_labels_may_be():
    readme = open(os.path.join(os.path.dirname(__file__), os.pardir, "README.md")).read()
    assert "Labels" in readme and "0.5" in readme and "continuous" in readme


def test_a_holdout_that_every_class_needs_for_training_is_refused():
    """A mutation audit (2026-12-04): the refusal of a holdout left empty once every class keeps a row for training
    could go unnoticed. Four rows of four classes and a fraction of a quarter: the one row drawn is its class's only
    row, so it goes back to training and no row is left for validation: one ValueError naming the fraction."""
    with pytest.raises(ValueError, match=r"validation_fraction=0\.25 leaves no rows for validation once every class "
                                         "keeps a row for training"):
        L.holdout_mask(np.array(["a", "b", "c", "d"]), 0.25, 0)
    held = L.holdout_mask(np.array(["a", "a", "b", "b", "b", "b"]), 0.5, 0)  # (rows enough: some held, each class kept)
    assert held.any() and set(np.array(["a", "a", "b", "b", "b", "b"])[~held]) == {"a", "b"}


def test_integer_labels_at_the_edge_of_int64_stay_int64():
    """A mutation audit (2026-12-04): integer labels held as Python objects take the first of int64 and uint64 that
    holds them all; the bounds are inclusive. -1 and 2**63 - 1 fit int64 exactly (a strict bound refused them as
    "beyond 64 bits"); 0 and 2**63 - 1 are int64 too, not uint64; 2**63 needs uint64; -1 and 2**63 neither."""
    edge = 2**63 - 1
    np.testing.assert_array_equal(L.check_labels(np.array([-1, edge] * 3, dtype=object)), [-1, edge] * 3)
    assert L.check_labels(np.array([-1, edge], dtype=object)).dtype == np.int64
    assert L.check_labels(np.array([0, edge], dtype=object)).dtype == np.int64
    assert L.check_labels(np.array([0, edge + 1], dtype=object)).dtype == np.uint64
    with pytest.raises(ValueError, match="integers beyond 64 bits"):
        L.check_labels(np.array([-1, edge + 1], dtype=object))


# -- the checks and draws of agpc.labels, at their boundaries ----------------------------------------------------------

def test_the_validation_rows_are_the_fraction_of_the_rows_rounded():
    """round(fraction n) rows held out (0.29 of 10 rows is 3, not the 2 of int()), and a fraction that leaves no row for
    training is refused before any row is drawn."""
    y = np.array(["a"] * 5 + ["b"] * 5)
    assert [L.holdout_mask(y, 0.29, seed).sum() for seed in range(5)] == [3] * 5
    with pytest.raises(ValueError, match=r"validation_fraction=0.96 holds out all 10 rows for validation, none left"):
        L.holdout_mask(y, 0.96, 0)


def test_a_class_whose_training_rows_all_weigh_zero_keeps_a_row_of_positive_weight_for_training():
    """With sample weights, a class is in the training rows only through rows of positive weight: when the draw took
    its one such row for validation, that row goes back to training, however many rows of weight 0 it has there."""
    y = np.array(["a"] * 6 + ["b"] * 4)
    weights = np.array([1.0] * 6 + [1.0, 0.0, 0.0, 0.0])
    seeds = [s for s in range(200) if 6 in np.random.default_rng(s).choice(10, size=4, replace=False)]
    assert seeds
    for seed in seeds[:5]:
        val = L.holdout_mask(y, 0.4, seed, weights=weights)
        assert not val[6] and val.sum() == 3


def test_a_stratified_draw_keeps_a_row_of_every_class_even_a_rare_one():
    y = np.array([0] * 99 + [1])
    rows = L.stratified_rows(y, 10, np.random.default_rng(0))
    assert 99 in rows and len(rows) == 11 and np.all(np.diff(rows) > 0)


@pytest.mark.parametrize("labels, dtype", [([-(2**63), 5], np.int64), ([0, 2**64 - 1], np.uint64)])
def test_integer_labels_at_the_far_ends_of_int64_and_uint64_keep_their_values(labels, dtype):
    """The other ends of ``test_integer_labels_at_the_edge_of_int64_stay_int64``'s inclusive bounds: int64's minimum
    -2**63 is int64 (a strict lower bound refused it as beyond 64 bits), uint64's maximum 2**64 - 1 is uint64."""
    values = L.check_labels(labels)
    assert values.dtype == dtype and values.tolist() == labels


def test_a_label_of_the_longest_length_a_model_file_holds_is_taken_and_one_more_character_is_refused():
    longest = MAX_LABEL_BYTES // 4
    L.check_label_length(np.array(["a", "x" * longest]))
    with pytest.raises(ValueError, match=f"a label of {longest + 1:,} characters"):
        L.check_label_length(np.array(["a", "x" * (longest + 1)]))


def test_classes_are_refused_as_an_identifier_column_only_above_20_of_them_and_half_the_rows():
    L.check_class_share(np.arange(20), 20)  # (20 classes: never refused)
    L.check_class_share(np.arange(21), 42)  # (half the rows: taken)
    with pytest.raises(ValueError, match="y has 21 classes in 41 rows"):
        L.check_class_share(np.arange(21), 41)


def test_labels_of_blank_text_in_a_string_array_are_refused_as_missing():
    with pytest.raises(ValueError, match="y has empty labels at row 1: an empty cell is a missing label"):
        L.check_labels(np.array(["a", "  ", "b"]))


def test_a_label_beyond_every_class_is_refused_naming_it():
    """``label_ranks`` (an ordinal model's labels as their ranks): a label sorting after every class is one ValueError
    naming it, as one before or between them is."""
    order = np.array(["poor", "fair", "good"])
    np.testing.assert_array_equal(L.label_ranks(np.array(["good", "poor", "fair"]), order), [2, 0, 1])
    for label in ("zzz", "aaa", "great"):
        with pytest.raises(ValueError, match=rf"y contains labels \['{label}'\] not in classes"):
            L.label_ranks(np.array(["poor", label]), order)
