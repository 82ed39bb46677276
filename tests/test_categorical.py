"""Categorical columns (issue 45): ``GPClassifier(categorical_features=...)`` in scikit-learn's values, text levels
learned at fit and kept in the model file, an unseen level its own level at predict, the inducing points on level
values (``agpc.categories``, ``inducing.kmeans_with_levels``)."""

import warnings

import numpy as np
import pandas as pd
import pytest

from agpc import GPClassifier
from agpc import categories as C
from agpc.kernels import ANY_LEVEL
from agpc.model_file import LEVELS_PREFIX

REGIONS = np.array(["north", "south", "east", "west"])


def table(n=240, seed=0):
    """A DataFrame of two numeric columns, a text column and a pandas category column whose levels move the class."""
    rng = np.random.default_rng(seed)
    region = rng.integers(0, 4, size=n)
    kind = rng.integers(0, 3, size=n)
    x = rng.normal(size=(n, 2))
    latent = x[:, 0] + 1.5 * np.array([-1.0, 1.0, 0.5, -0.5])[region] + np.array([0.8, -0.8, 0.0])[kind]
    y = (latent + 0.3 * rng.normal(size=n) > 0).astype(int)
    frame = pd.DataFrame({"a": x[:, 0], "region": REGIONS[region], "b": x[:, 1],
                          "kind": pd.Categorical(np.array(["p", "q", "r"])[kind])})
    return frame, y


# -- which columns -----------------------------------------------------------------------------------------------

def test_from_dtype_takes_the_category_and_text_columns_of_a_dataframe():
    frame, _ = table(20)
    assert C.categorical_mask(frame, "from_dtype", 4).tolist() == [False, True, False, True]
    assert not C.categorical_mask(np.zeros((3, 4)), "from_dtype", 4).any()  # (an array's columns are numbers)
    assert not C.categorical_mask(frame, None, 4).any()


def test_indices_names_and_masks_are_scikit_learns_values():
    frame, _ = table(20)
    assert C.categorical_mask(frame, [1, 3], 4).tolist() == [False, True, False, True]
    assert C.categorical_mask(frame, ["kind"], 4).tolist() == [False, False, False, True]
    assert C.categorical_mask(frame, [True, False, False, False], 4).tolist() == [True, False, False, False]


@pytest.mark.parametrize("given, message", [
    ([4], "out of range"), ([-1], "out of range"), (["nope"], "has no column 'nope'"),
    ([True, False], "one entry a feature"),
    ([1.5], "neither a column index nor a column name")])
def test_a_bad_choice_of_columns_is_one_error_naming_it(given, message):
    frame, _ = table(20)
    with pytest.raises(ValueError, match=message):
        C.categorical_mask(frame, given, 4)


def test_names_need_column_names():
    with pytest.raises(ValueError, match="X has no column names"):
        C.categorical_mask(np.zeros((3, 2)), ["a"], 2)


# -- levels and codes --------------------------------------------------------------------------------------------

def test_text_levels_are_learned_sorted_and_numbers_are_used_as_they_are():
    frame, _ = table(60)
    frame["code"] = np.arange(60) % 5  # an integer-coded categorical column
    columns = C.learn_columns(frame, C.categorical_mask(frame, ["region", "kind", "code"], 5))
    assert sorted(columns.levels) == [1, 3]  # (the integer column has no text levels: its values are its levels)
    assert columns.levels[1].tolist() == sorted(set(frame["region"]))
    encoded = C.encode(frame, columns, 5)
    assert list(encoded.columns) == list(frame.columns)  # (names kept for the feature-name checks)
    np.testing.assert_array_equal(encoded["region"].to_numpy(),
                                  np.searchsorted(columns.levels[1], frame["region"].to_numpy()))
    np.testing.assert_array_equal(encoded["code"].to_numpy(), frame["code"].to_numpy())


def test_an_unseen_level_is_coded_as_its_own_level_or_refused_for_training_rows():
    frame, _ = table(30)
    columns = C.learn_columns(frame, C.categorical_mask(frame, "from_dtype", 4))
    new = frame.head(3).copy()
    new["region"] = ["north", "atlantis", "west"]
    assert C.encode(new, columns, 4)["region"].tolist()[1] == C.UNSEEN
    with pytest.raises(ValueError, match="'atlantis'.*first rows did not have"):
        C.encode(new, columns, 4, unseen_refused=True)


@pytest.mark.parametrize("values, message", [
    (["a", None, "b"], "missing values \\(None\\).*give them a level"), (["a", "", "b"], "empty values"),
    (["a", 1, "b"], "mixes kinds of values"), (["a", pd.NA, "b"], "missing values \\(NA\\)")])
def test_missing_blank_or_mixed_values_are_refused_naming_the_column(values, message):
    frame = pd.DataFrame({"x": [0.0, 1.0, 2.0], "c": pd.Series(values, dtype=object)})
    with pytest.raises(ValueError, match=f"X column 'c' \\(categorical\\) has.*{message}|{message}"):
        C.learn_columns(frame, C.categorical_mask(frame, "from_dtype", 2))


def test_a_column_of_more_levels_than_a_category_has_is_refused(monkeypatch):
    monkeypatch.setattr(C, "MAX_LEVELS", 10)
    frame = pd.DataFrame({"x": np.zeros(20), "id": [f"row{k}" for k in range(20)]})
    with pytest.raises(ValueError, match="20 distinct values.*identifier"):
        C.learn_columns(frame, C.categorical_mask(frame, "from_dtype", 2))


# -- the estimator -----------------------------------------------------------------------------------------------

def test_a_dataframe_with_text_and_category_columns_fits_and_predicts_with_nothing_set():
    frame, y = table()
    model = GPClassifier(n_inducing=12, max_iter=20, random_state=0).fit(frame, y)
    assert model.is_categorical_.tolist() == [False, True, False, True]
    assert model.categorical_levels_[1].tolist() == sorted(REGIONS.tolist())
    assert model.feature_names_in_.tolist() == list(frame.columns)
    proba = model.predict_proba(frame)
    assert np.all(np.isfinite(proba)) and model.score(frame, y) > 0.75
    # the inducing points sit on levels: the categorical coordinates are codes the rows have, or "any level" where
    # the fit chose such points (``size_rule.choose_inducing``)
    assert _on_levels(model)


def test_categorical_columns_beat_the_same_columns_taken_as_numbers():
    """The levels move the class by amounts unrelated to their codes' order: a kernel of the levels fits them, an RBF
    over the codes as numbers cannot (the test NLL on other rows of the same table)."""
    frame, y = table(400, seed=1)
    test, y_test = table(400, seed=2)
    native = GPClassifier(n_inducing=16, max_iter=30, random_state=0).fit(frame, y)
    codes = C.encode(frame, native._categorical_columns(), 4).astype(float)
    as_numbers = GPClassifier(n_inducing=16, max_iter=30, random_state=0, categorical_features=None).fit(codes, y)
    test_codes = C.encode(test, native._categorical_columns(), 4).astype(float)

    def nll(proba):
        return -np.mean(np.log(proba[np.arange(len(y_test)), y_test]))

    assert nll(native.predict_proba(test)) < nll(as_numbers.predict_proba(test_codes)) - 0.02


def test_a_level_unseen_at_fit_is_its_own_level():
    frame, y = table()
    model = GPClassifier(n_inducing=12, max_iter=10, random_state=0).fit(frame, y)
    rows = frame.head(4).copy()
    one, other = rows.copy(), rows.copy()
    one["region"], other["region"] = "atlantis", "lemuria"
    with pytest.warns(UserWarning, match="none of its 4 values is a level"):  # (every row's level unseen: said)
        p_one, p_other = model.predict_proba(one), model.predict_proba(other)
    assert np.all(np.isfinite(p_one))
    np.testing.assert_array_equal(p_one, p_other)  # (two unseen levels: each correlated with the others alike)
    assert not np.allclose(p_one, model.predict_proba(rows))


def test_text_columns_refused_when_categorical_features_is_none():
    frame, y = table(40)
    with pytest.raises(ValueError, match="X column 'region' holds text"):
        GPClassifier(n_inducing=6, max_iter=2, categorical_features=None).fit(frame, y)


REPEATED_OR_NEGATIVE = {
    "a mask written as integers": (np.array([0, 1, 0, 1]), r"lists column 0 more than once, in \[0, 1, 0, 1\]: each "
                                   r"column once \(a mask is of booleans: \[False, True, False, True\]\)"),
    "a name twice": (["kind", "kind"], r"lists column 'kind' more than once"),
    "an index twice": ([3, 3], r"lists column 3 more than once, in \[3, 3\]: each column once$"),
    "a negative index": ([-1], r"column -1 is out of range for X of 4 features \(indices 0 to 3\)"),
}


@pytest.mark.parametrize("given, words", REPEATED_OR_NEGATIVE.values(), ids=REPEATED_OR_NEGATIVE)
def test_a_column_listed_twice_or_a_negative_index_is_refused(given, words):
    """A hostile-input audit (2026-12-02): categorical_features=[0, 1, 0, 1], a mask written as integers, was read
    as the indices {0, 1}, columns 0 and 1 taken as categorical and 3 as continuous, silently; [-1] was the last
    column, where HistGradientBoostingClassifier and agpc's own OnColumns refuse a negative index."""
    frame, y = table(40)
    codes = C.encode(frame, C.learn_columns(frame, C.categorical_mask(frame, "from_dtype", 4)), 4)
    X = codes if isinstance(given[0], str) else codes.to_numpy(dtype=float)
    with pytest.raises(ValueError, match=words):
        GPClassifier(n_inducing=6, max_iter=1, categorical_features=given).fit(X, y)


def test_the_command_line_refuses_a_negative_categorical_index(tmp_path, capsys):
    from agpc.cli import main

    frame, y = table(40)
    frame.assign(label=y).to_csv(tmp_path / "t.csv", index=False)
    code = main(["fit", str(tmp_path / "t.csv"), "--target", "label", "--categorical", "-1", "--out",
                 str(tmp_path / "m.agpc")])
    assert code == 2 and "--categorical '-1': not a feature column" in capsys.readouterr().err
    assert not (tmp_path / "m.agpc").exists()


def test_a_categorical_column_of_numbers_names_its_missing_values_and_refuses_an_identifier():
    """A hostile-input audit (2026-12-02): a categorical column of codes holding NaN got scikit-learn's "Input X
    contains NaN", no column named (the docs promise it named), and one of 70,000 distinct codes trained (at 10^6
    for two minutes), where a column of text that many levels is refused as an identifier."""
    rng = np.random.default_rng(0)
    options = dict(n_inducing=6, max_iter=1, categorical_features=[2])
    codes = np.r_[np.arange(38) % 3, np.nan, 1.0]
    with pytest.raises(ValueError, match=r"X column 2 \(categorical\) holds NaN \(a missing value\) at row 38: give"):
        GPClassifier(**options).fit(np.column_stack([rng.normal(size=(40, 2)), codes]), np.arange(40) % 2)
    frame = pd.DataFrame({"a": rng.normal(size=40), "b": rng.normal(size=40),
                          "c": pd.array([pd.NA] * 2 + list(np.arange(38) % 3), dtype="Int64")})
    with pytest.raises(ValueError, match=r"X column 'c' \(categorical\) holds NaN \(a missing value\) at row 0 and "
                                         r"1 more"):
        GPClassifier(**dict(options, categorical_features=["c"])).fit(frame, np.arange(40) % 2)
    n = C.MAX_LEVELS + 1
    identifier = np.column_stack([rng.normal(size=(n, 2)), np.arange(n, dtype=float)])
    with pytest.raises(ValueError, match=r"X column 2 \(categorical\) has 65,537 distinct values: more than 65,536 "
                                         "levels is an identifier"):
        GPClassifier(**options).fit(identifier, np.arange(n) % 2)
    # (an adversarial review: at predict, a batch may hold any number of codes; the count is fit's)
    model = GPClassifier(**options).fit(identifier[:200] % [1.0, 1.0, 20.0], np.arange(200) % 2)
    assert model.predict_proba(identifier).shape == (n, 2)


def test_a_column_of_a_level_a_row_is_said_to_be_an_identifier():
    """A text column of one value a row (an identifier left in the table) trained without a word: banana's 3,000
    rows took 7.7 s against 1.2 s for the same test NLL, and only predict said that no value was a level. Past 100
    levels and half the rows a fit says it; a category of few levels, or many levels of many rows each, is quiet."""
    rng = np.random.default_rng(1)
    n = 400
    frame = pd.DataFrame({"a": rng.normal(size=n), "id": [f"row{i:04d}" for i in range(n)]})
    y = (frame["a"] > 0).astype(int)
    with pytest.warns(UserWarning, match=r"X column 'id' \(categorical\) has 400 distinct values in 400 rows: most "
                                         r"likely an identifier"):
        GPClassifier(n_inducing=6, max_iter=1, random_state=0).fit(frame, y)
    codes = np.column_stack([rng.normal(size=n), np.arange(n, dtype=float)])  # (the same, as codes of numbers)
    with pytest.warns(UserWarning, match=r"X column 1 \(categorical\) has 400 distinct values in 400 rows"):
        GPClassifier(n_inducing=6, max_iter=1, random_state=0, categorical_features=[1]).fit(codes, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for levels in (4, 150):  # (150 levels of 400 rows: fewer than half of them)
            quiet = frame.assign(id=[f"level{i % levels}" for i in range(n)])
            GPClassifier(n_inducing=6, max_iter=1, random_state=0).fit(quiet, y)


def test_an_integer_coded_column_given_by_index_is_categorical_on_an_array():
    frame, y = table(200)
    codes = C.encode(frame, C.learn_columns(frame, C.categorical_mask(frame, "from_dtype", 4)), 4)
    X = codes.to_numpy(dtype=float)
    model = GPClassifier(n_inducing=10, max_iter=10, random_state=0, categorical_features=[1, 3]).fit(X, y)
    assert model.is_categorical_.tolist() == [False, True, False, True] and model.categorical_levels_ == {}
    assert "Categorical" in repr(model.kernel_)
    assert _on_levels(model)  # (a level the rows have, or "any level")


def test_levels_round_trip_through_the_model_file(tmp_path):
    frame, y = table()
    model = GPClassifier(n_inducing=10, max_iter=10, random_state=0).fit(frame, y)
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = GPClassifier.load(path)
    assert loaded.is_categorical_.tolist() == model.is_categorical_.tolist()
    assert {j: v.tolist() for j, v in loaded.categorical_levels_.items()} == {
        j: v.tolist() for j, v in model.categorical_levels_.items()}
    unseen = frame.head(5).assign(region="atlantis")
    np.testing.assert_array_equal(loaded.predict_proba(frame), model.predict_proba(frame))
    with pytest.warns(UserWarning, match="none of its 5 values is a level"):
        np.testing.assert_array_equal(loaded.predict_proba(unseen), model.predict_proba(unseen))


def _rewritten(path, out, change):
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays)
    np.savez(out, **arrays)
    return out


@pytest.mark.parametrize("change, message", [
    (lambda a: a.__setitem__(LEVELS_PREFIX + "1", np.array(["z", "a"])), "sorted distinct text levels"),
    (lambda a: a.__setitem__(LEVELS_PREFIX + "0", np.array(["a", "b"])), "not one of categorical_columns"),
    (lambda a: a.__setitem__(LEVELS_PREFIX + "01", np.array(["a", "b"])), "not one of categorical_columns"),
])
def test_a_model_file_with_forged_levels_is_refused(tmp_path, change, message):
    frame, y = table(80)
    model = GPClassifier(n_inducing=6, max_iter=3, random_state=0).fit(frame, y)
    model.save(tmp_path / "model.npz")
    forged = _rewritten(tmp_path / "model.npz", tmp_path / "forged.npz", change)
    with pytest.raises(ValueError, match=message):
        GPClassifier.load(forged)


def test_a_stream_keeps_the_levels_of_its_first_call():
    frame, y = table(200)
    model = GPClassifier(method="sep", n_inducing=8, random_state=0)
    model.partial_fit(frame.head(100), y[:100], classes=[0, 1], n_total=200)
    levels = {j: v.tolist() for j, v in model.categorical_levels_.items()}
    model.partial_fit(frame.tail(100), y[100:])
    assert {j: v.tolist() for j, v in model.categorical_levels_.items()} == levels
    with pytest.raises(ValueError, match="first rows did not have"):
        model.partial_fit(frame.head(10).assign(region="atlantis"), y[:10])


# -- the command line --------------------------------------------------------------------------------------------

def _write_csv(path, frame, y):
    frame.assign(label=y).to_csv(path, index=False)
    return path


def test_a_csv_with_text_columns_fits_and_predicts_with_nothing_set(tmp_path, capsys):
    from agpc.cli import main
    from agpc.persistence import load_model

    frame, y = table(200)
    frame = frame.assign(kind=frame["kind"].astype(str), code=np.arange(200) % 3)
    data = _write_csv(tmp_path / "table.csv", frame, y)
    model_path, out = tmp_path / "model.npz", tmp_path / "predicted.csv"
    argv = ["fit", str(data), "--target", "label", "--max-iter", "5", "--quiet", "--categorical", "code",
            "--out", str(model_path)]
    assert main(argv) == 0
    model = load_model(model_path)
    assert model.is_categorical_.tolist() == [False, True, False, True, True]  # region, kind (text), code (given)
    assert sorted(model.categorical_levels_) == [1, 3]
    assert main(["predict", str(model_path), str(data), "--target", "label", "--out", str(out)]) == 0
    predicted = pd.read_csv(out)
    assert len(predicted) == 200 and np.all(np.isfinite(predicted["p_1"]))


def test_the_command_line_refuses_an_unknown_categorical_column_and_standardising_categories(tmp_path, capsys):
    from agpc.cli import main

    frame, y = table(60)
    data = _write_csv(tmp_path / "table.csv", frame.assign(kind=frame["kind"].astype(str)), y)
    out = str(tmp_path / "model.npz")
    assert main(["fit", str(data), "--target", "label", "--categorical", "nope", "--out", out]) != 0
    assert "--categorical 'nope': not a feature column" in capsys.readouterr().err
    assert main(["fit", str(data), "--target", "label", "--standardize", "--out", out]) != 0
    assert "--standardize scales numeric columns" in capsys.readouterr().err


# -- every method, every path ------------------------------------------------------------------------------------

def _coded_table(n=300):
    """The table with its text columns as level codes (an array, columns 1 and 3 categorical) and three classes."""
    frame, y = table(n)
    codes = C.encode(frame, C.learn_columns(frame, C.categorical_mask(frame, "from_dtype", 4)), 4)
    return codes.to_numpy(dtype=float), y, (y + (frame["kind"] == "r").to_numpy()).astype(int)


def _on_levels(model):
    """The inducing points sit on levels (or "any level", ``kernels.ANY_LEVEL``) in the categorical columns."""
    Z = np.asarray(model.inducing_points_)
    return (set(np.unique(Z[..., 1])) <= set(range(4)) | {ANY_LEVEL}
            and set(np.unique(Z[..., 3])) <= set(range(3)) | {ANY_LEVEL})


def _registry_cases():
    from agpc import methods as M

    for name in M.method_names():
        spec = M.get_method(name)
        yield name, "batch"
        if spec.supports("multiclass"):
            yield name, "multiclass"
        if spec.supports("minibatch"):
            yield name, "minibatch"


@pytest.mark.parametrize("method, path", list(_registry_cases()))
def test_every_method_trains_on_mixed_columns_on_each_of_its_paths(method, path):
    """The mixed kernel on every method of the registry (weighted rows), batch, multiclass and minibatch where the
    method has them: the inducing points stay on levels, and the model beats the majority class."""
    X, y, y3 = _coded_table()
    target = y3 if path == "multiclass" else y
    # (GFITC's parallel EP settles multiclass sites slowly, their change still ~5e-4 a sweep after 100: at the default
    # tol each of its inner loops runs its 100 sweeps, 800 in all, 10 s of a suite that tests the kernel's parts here)
    settle = {"tol": 1e-3} if method == "gfitc" else {}
    model = GPClassifier(method=method, n_inducing=12, max_iter=3, random_state=0, categorical_features=[1, 3],
                         batch_size=60 if path == "minibatch" else "auto", **settle)
    model.fit(X, target, sample_weight=np.linspace(0.5, 2.0, len(target)))
    assert "Categorical" in repr(model.kernel_) and _on_levels(model)
    majority = np.max(np.bincount(target)) / len(target)
    assert model.score(X, target) > majority


def test_mixed_columns_on_disk_on_array_api_strict_and_in_an_ordinal_model(tmp_path):
    import array_api_strict as xs

    X, y, y3 = _coded_table()
    options = dict(n_inducing=12, max_iter=3, random_state=0, categorical_features=[1, 3])
    reference = GPClassifier(**options).fit(X, y).predict_proba(X)
    stored = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=np.float64, shape=X.shape)
    stored[:] = X
    stored.flush()
    on_disk = GPClassifier(**options).fit(np.load(tmp_path / "X.npy", mmap_mode="r"), y)
    np.testing.assert_array_equal(on_disk.predict_proba(X), reference)
    strict = GPClassifier(**options).fit(xs.asarray(X), xs.asarray(y.astype(np.float64)))
    np.testing.assert_allclose(np.asarray(strict.predict_proba(xs.asarray(X))), reference, rtol=1e-9, atol=1e-12)
    ordinal = GPClassifier(**options, likelihood="ordinal").fit(X, y3)
    assert _on_levels(ordinal) and ordinal.score(X, y3) > np.max(np.bincount(y3)) / len(y3)


def test_mixed_columns_resume_from_a_checkpoint_to_the_same_model(tmp_path, monkeypatch):
    from helpers import interrupted_then_resumed

    X, y, _ = _coded_table()
    # (points given: a fit with checkpoints makes no choice of inducing points, size_rule.choose_inducing, which the
    # uninterrupted reference would)
    params = dict(inducing=X[::10][:12], max_iter=12, random_state=0, categorical_features=[1, 3])
    whole, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "fit.ckpt", 18, X, y)
    np.testing.assert_allclose(resumed.predict_proba(X), whole.predict_proba(X), rtol=1e-10, atol=1e-12)
    assert _on_levels(resumed)


def test_mixed_columns_of_a_dask_array_train_on_its_cluster_as_in_memory():
    pytest.importorskip("distributed")
    import dask.array as da
    from helpers import local_client

    X, y, _ = _coded_table()
    options = dict(n_inducing=12, max_iter=3, random_state=0, categorical_features=[1, 3])
    with local_client(2) as client:
        model = GPClassifier(**options, client=client).fit(da.from_array(X, chunks=(100, 4)),
                                                           da.from_array(y, chunks=100))
    assert _on_levels(model) and "Categorical" in repr(model.kernel_)
    np.testing.assert_allclose(model.predict_proba(X), GPClassifier(**options).fit(X, y).predict_proba(X),
                               rtol=1e-6, atol=1e-8)


def test_mixed_columns_in_the_exact_model_and_in_data_parallel_rounds():
    """Small data take the exact model (its inducing points the rows: on levels by construction); n_jobs = 2 trains
    minibatch rounds in two processes on the mixed kernel."""
    X, y, _ = _coded_table()
    exact = GPClassifier(random_state=0, max_iter=5, categorical_features=[1, 3]).fit(X, y)
    assert np.asarray(exact.inducing_points_).shape[0] == X.shape[0] and _on_levels(exact)
    rounds = GPClassifier(n_inducing=12, max_iter=2, batch_size=50, n_jobs=2, random_state=0,
                          categorical_features=[1, 3]).fit(X, y)
    assert rounds.n_jobs_ == 2 and _on_levels(rounds)
    assert rounds.score(X, y) > np.max(np.bincount(y)) / len(y)


# -- what a review found (each failed before its fix) ------------------------------------------------------------

def test_a_category_column_of_numbers_is_categorical_from_its_dtype():
    """A hostile-input audit (2026-12-02): ``categorical_features="from_dtype"`` took a pandas category of numbers
    (codes, a zip code) as a continuous column, where the docstring and scikit-learn's HistGradientBoostingClassifier
    take every category column as categorical. It is now, and trains as the same column named in
    categorical_features does."""
    frame, y = table(120)
    codes = frame.assign(kind=pd.Categorical(frame["kind"].cat.codes.to_numpy() + 10))
    mask = C.categorical_mask(codes, "from_dtype", 4)
    assert mask.tolist() == [False, True, False, True]
    options = dict(n_inducing=8, max_iter=3, random_state=0)
    by_dtype = GPClassifier(**options).fit(codes, y)
    named = GPClassifier(categorical_features=["region", "kind"], **options).fit(codes, y)
    assert by_dtype.is_categorical_.tolist() == [False, True, False, True]
    np.testing.assert_allclose(by_dtype.predict_proba(codes), named.predict_proba(codes), rtol=1e-12, atol=1e-14)
    # a category of numbers written as text (a file read with "?" for a missing value) is refused as before
    written = frame.assign(kind=pd.Categorical([f"{v:.2f}" if i % 17 else "?" for i, v in enumerate(frame["a"])]))
    with pytest.raises(ValueError, match="X column 'kind' holds numbers written as text"):
        GPClassifier(**options).fit(written, y)


def test_an_object_column_of_numbers_stays_numeric_and_numbers_written_as_text_are_refused():
    frame, y = table(120)
    numbers = frame.assign(a=frame["a"].astype(object))
    model = GPClassifier(n_inducing=8, max_iter=3, random_state=0).fit(numbers, y)
    assert model.is_categorical_.tolist() == [False, True, False, True]
    written = frame.assign(a=[f"{v:.3f}" for v in frame["a"]])
    written.loc[7, "a"] = "?"  # (a file read with "?" for a missing value: every value is text)
    with pytest.raises(ValueError, match="X column 'a' holds numbers written as text"):
        GPClassifier(n_inducing=8, max_iter=3).fit(written, y)


def test_a_kernel_of_ones_own_with_a_categorical_term_keeps_the_inducing_points_on_levels():
    from agpc.kernels import RBF, Categorical, OnColumns, mixed_kernel

    X, y, _ = _coded_table()
    kernel = mixed_kernel(OnColumns(RBF(lengthscales=[1.0, 1.0]), [0, 2]), Categorical([1, 3]))
    model = GPClassifier(kernel=kernel, n_inducing=10, max_iter=3, random_state=0, categorical_features=None)
    assert _on_levels(model.fit(X, y))


def test_inducing_points_given_as_an_array_keep_their_levels():
    X, y, _ = _coded_table()
    Z = X[:6].copy()
    Z[:, 1] = [2, 0, 1, 2, 3, 0]
    model = GPClassifier(inducing=Z, n_inducing=6, max_iter=0, random_state=0, categorical_features=[1, 3]).fit(X, y)
    np.testing.assert_array_equal(np.asarray(model.inducing_points_)[:, 1], Z[:, 1])


def _mixed_rows(n=200, seed=0):
    """Rows of a continuous column, two categorical ones (4 and 3 levels, coded 0..L-1) and a continuous one."""
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.normal(size=n), rng.integers(0, 4, size=n), rng.integers(0, 3, size=n),
                            rng.normal(size=n)])


@pytest.mark.parametrize("method", ["kmeans", "variance"])
def test_inducing_points_do_not_depend_on_the_codes_of_levels_or_the_units_of_other_columns(method):
    """With categorical columns, k-means and the variance choice read the rows by the levels' indicators and the
    other columns in units of their deviation (``inputs.start_inducing_points``): other codes for the same levels,
    and a column in other units, give the same points (in those codes and units); k-means by the codes as numbers
    did not."""
    from agpc.inputs import start_inducing_points

    X = _mixed_rows()
    renamed = {0.0: 7.0, 1.0: -2.0, 2.0: 30.0, 3.0: 0.5}
    Y = X.copy()
    Y[:, 1] = [renamed[v] for v in X[:, 1]]
    Y[:, 3] = 1000.0 * X[:, 3]
    Z, W = (start_inducing_points(rows, 12, method, [1, 2], random_state=np.random.default_rng(3)) for rows in (X, Y))
    np.testing.assert_array_equal(W[:, 1], [renamed[v] for v in Z[:, 1]])
    np.testing.assert_array_equal(W[:, 2], Z[:, 2])
    np.testing.assert_allclose(W[:, [0, 3]], Z[:, [0, 3]] * [1.0, 1000.0], rtol=1e-9)
    # each point's categorical coordinates are a row's; k-means's others a centre's (not a row's), the variance
    # choice's its row's
    assert all(np.any(np.all(X[:, 1:3] == z[1:3], axis=1)) for z in Z)
    is_row = [np.any(np.all(X == z, axis=1)) for z in Z]
    assert not any(is_row) if method == "kmeans" else all(is_row)


def _conditional_variance_choice(E, count):
    """The greedy choice written out: each step, the row of largest diag(K - K_xZ K_ZZ^-1 K_Zx) under the RBF
    exp(-|e - e'|^2 / 2), by a dense solve (ties: the first row)."""
    K = np.exp(-0.5 * np.sum((E[:, None, :] - E[None, :, :]) ** 2, axis=-1))
    chosen = []
    for _ in range(count):
        if chosen:
            Kxz = K[:, chosen]
            variance = 1.0 - np.sum(Kxz * np.linalg.solve(K[np.ix_(chosen, chosen)], Kxz.T).T, axis=1)
        else:
            variance = np.ones(len(E))
        variance[chosen] = -np.inf
        chosen.append(int(np.argmax(variance)))
    return chosen


def test_the_variance_choice_is_the_greedy_conditional_variance_of_the_encoded_rows():
    from agpc.inducing import _variance_order, encoded_rows
    from agpc.inputs import listed_levels, start_inducing_points

    X = _mixed_rows(150, seed=4)
    scales = np.array([0.7, 1.0, 1.0, 2.5])
    E, continuous = encoded_rows(X, [1, 2], listed_levels(X, [1, 2]), scales)
    assert continuous == 2 and E.shape == (150, 2 + 4 + 3)
    np.testing.assert_allclose(E[:, 0], X[:, 0] / 0.7)
    np.testing.assert_allclose(E[:, 2:6].sum(axis=1), 1.0 / np.sqrt(2.0))  # (one level of four, over sqrt(k))
    assert _variance_order(E, 20, np.random.default_rng(0)).tolist() == _conditional_variance_choice(E, 20)
    Z = start_inducing_points(X, 20, "auto", [1, 2])  # ("auto" with categorical columns: the variance choice)
    assert all(np.any(np.all(X == z, axis=1)) for z in Z) and len({tuple(z) for z in Z}) == 20


def test_the_variance_choice_takes_every_row_before_any_twice_and_bounds_its_rows(monkeypatch):
    """Fewer rows than points: each row once (the rest known exactly), then again (drawn at random); beyond
    ``VARIANCE_ELEMENTS`` / points rows, rows drawn at random."""
    from agpc import inducing
    from agpc.inputs import start_inducing_points

    X = np.array([[0.0, 1.0], [0.0, 2.0], [1.0, 1.0], [0.5, 2.0]])
    Z = start_inducing_points(X, 6, "variance", [1])
    assert np.all(np.isfinite(Z)) and {tuple(z) for z in Z[:4]} == {tuple(x) for x in X}
    assert {tuple(z) for z in Z[4:]} <= {tuple(x) for x in X}
    seen = []
    order = inducing._variance_order
    monkeypatch.setattr(inducing, "_variance_order", lambda E, count, rng: seen.append(E.shape) or order(E, count, rng))
    monkeypatch.setattr(inducing, "VARIANCE_ELEMENTS", 400)
    Z = start_inducing_points(_mixed_rows(300), 10, "variance", [1, 2], random_state=np.random.default_rng(0))
    assert seen == [(40, 2 + 4 + 3)] and Z.shape == (10, 4)


def test_points_past_the_kernels_numerical_rank_are_drawn_from_all_the_rows():
    """One continuous column and one of two levels, the rows in the order of x: the kernel's rank is spent after a
    few dozen points, and the rest are drawn from the rows not taken, not the first rows in order (which put 3 of 4
    points in the lowest quarter of x)."""
    from agpc.inputs import start_inducing_points

    rng = np.random.default_rng(0)
    X = np.column_stack([np.sort(rng.normal(size=3000)), rng.integers(0, 2, size=3000)]).astype(float)
    Z = start_inducing_points(X, 100, "variance", [1], random_state=np.random.default_rng(1))
    assert len({tuple(z) for z in Z}) == 100
    assert 0.1 < np.mean(Z[:, 0] < np.quantile(X[:, 0], 0.25)) < 0.4


@pytest.mark.parametrize("method", ["kmeans", "variance"])
def test_a_continuous_column_far_from_zero_in_float32_spreads_its_points_as_in_float64(method):
    """The rows are centred before the expanded distances |e|^2 + |e'|^2 - 2 e.e' (uncentred, float32 rows at 1e4
    had distances 22 off, and k-means put its points in the middle quarter of x)."""
    from agpc.inputs import start_inducing_points

    rng = np.random.default_rng(0)
    X = np.column_stack([1e4 + rng.normal(size=3000), rng.integers(0, 3, size=3000)])
    points = [start_inducing_points(X.astype(dtype), 20, method, [1], random_state=np.random.default_rng(0))
              for dtype in (np.float32, np.float64)]
    spread = [np.subtract(*np.quantile(Z[:, 0], [0.75, 0.25])) for Z in points]
    assert spread[0] > 0.5 * spread[1] > 0.5


def test_the_variance_choice_draws_from_the_generator_only_where_it_chooses():
    from agpc.inputs import start_inducing_points

    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    start_inducing_points(_mixed_rows(200), 12, "variance", [1, 2], random_state=rng)
    assert rng.bit_generator.state == state


def test_a_fit_with_categorical_columns_starts_from_the_variance_choice_by_default():
    X, y, _ = _coded_table(150)
    points = [np.asarray(GPClassifier(inducing=how, n_inducing=10, max_iter=0, random_state=0,
                                      categorical_features=[1, 3]).fit(X, y).inducing_points_)
              for how in ("auto", "variance", "kmeans")]
    np.testing.assert_array_equal(points[0], points[1])
    assert not np.array_equal(points[0], points[2])


def test_kmeans_with_levels_clusters_a_bounded_number_of_indicators_and_rows(monkeypatch):
    """At most ``ENCODED_WIDTH`` indicators (each column's first levels) and ``ENCODED_ELEMENTS`` entries (rows drawn
    beyond that) are clustered; the points still take their rows' levels."""
    from agpc import inducing
    from agpc.inputs import start_inducing_points

    rng = np.random.default_rng(1)
    X = np.column_stack([rng.normal(size=300)] + [rng.integers(0, 6, size=300) for _ in range(5)]).astype(float)
    seen = []
    clustered = inducing.kmeans
    monkeypatch.setattr(inducing, "kmeans", lambda rows, *a, **k: seen.append(rows.shape) or clustered(rows, *a, **k))
    monkeypatch.setattr(inducing, "ENCODED_WIDTH", 8)
    monkeypatch.setattr(inducing, "ENCODED_ELEMENTS", 200)
    Z = start_inducing_points(X, 10, "kmeans", [1, 2, 3, 4, 5], random_state=np.random.default_rng(0))
    assert seen == [(200 // 6, 6)]  # (1 continuous column and the first level of each of 5; 33 rows)
    assert Z.shape == (10, 6) and all(np.any(np.all(X[:, 1:] == z[1:], axis=1)) for z in Z)


@pytest.mark.parametrize("method", ["kmeans", "variance"])
def test_inducing_points_with_levels_on_array_api_strict_keep_the_rows_device_and_numpys_points(method):
    import array_api_strict as xs

    from agpc.inputs import start_inducing_points

    X = _mixed_rows(120)
    device = xs.Device("device1")
    options = dict(random_state=np.random.default_rng(0), weights=np.linspace(0.5, 2.0, 120))
    Z = start_inducing_points(xs.asarray(X, device=device), 8, method, [1, 2], **options)
    assert Z.device == device
    options["random_state"] = np.random.default_rng(0)
    np.testing.assert_allclose(xs_to_np(Z), start_inducing_points(X, 8, method, [1, 2], **options), rtol=1e-12)


def test_auto_inducing_points_of_numeric_columns_are_k_means():
    X = _mixed_rows(150)
    y = (X[:, 0] + X[:, 3] > 0).astype(int)
    points = [np.asarray(GPClassifier(inducing=how, n_inducing=10, max_iter=0, random_state=0).fit(X, y)
                         .inducing_points_) for how in ("auto", "kmeans", "variance")]
    np.testing.assert_array_equal(points[0], points[1])
    assert not np.array_equal(points[0], points[2])


@pytest.mark.parametrize("given", [[1, 3], [False, True, False, True], np.array([False, True, False, True]),
                                   ["region", "kind"]])
def test_categorical_features_round_trip_through_the_model_file(tmp_path, given):
    from sklearn.base import clone

    frame, y = table(120)
    model = GPClassifier(n_inducing=6, max_iter=2, random_state=0, categorical_features=given).fit(frame, y)
    model.save(tmp_path / "model.npz")
    loaded = GPClassifier.load(tmp_path / "model.npz")
    assert list(loaded.get_params()["categorical_features"]) == list(np.asarray(given).tolist())
    assert clone(loaded).fit(frame, y).is_categorical_.tolist() == [False, True, False, True]


@pytest.mark.parametrize("columns", [[3], [0, 5]])
def test_a_model_file_whose_kernel_reads_a_column_it_has_not_is_refused(tmp_path, columns):
    import json

    X, y, _ = _coded_table(80)
    GPClassifier(n_inducing=6, max_iter=2, random_state=0, categorical_features=[1]).fit(X[:, :3], y).save(
        tmp_path / "model.npz")

    def forge(arrays):
        header = json.loads(str(arrays["__agpc_header__"]))
        terms = header["kernel"]["terms"]
        terms[1]["columns"] = columns[:1] if len(columns) == 1 else terms[1]["columns"]
        if len(columns) > 1:
            terms[0]["columns"] = columns
            terms[0]["kernel"]["priors"]["lengthscales"]["loc"] = [0.0, 0.0]
        arrays["__agpc_header__"] = np.asarray(json.dumps(header))

    forged = _rewritten(tmp_path / "model.npz", tmp_path / "forged.npz", forge)
    with pytest.raises(ValueError, match="reads column|not a valid agpc model file"):
        GPClassifier.load(forged)


def test_device_arrays_with_categorical_columns_are_not_read_on_the_host():
    import array_api_strict as xs

    X, y, _ = _coded_table(120)
    device = xs.Device("device1")
    model = GPClassifier(n_inducing=6, max_iter=2, random_state=0, categorical_features=[1, 3]).fit(
        xs.asarray(X, device=device), xs.asarray(y.astype(np.float64), device=device))
    assert model.inducing_points_.device == device and _on_levels_of(model)


def _on_levels_of(model):
    return set(np.unique(np.asarray(xs_to_np(model.inducing_points_))[:, 1])) <= set(range(4)) | {ANY_LEVEL}


def xs_to_np(a):
    from agpc.backend import to_numpy

    return to_numpy(a)


@pytest.mark.parametrize("bad, message", [
    (5, "validation_data must be a pair"), (np.array([True]), "one entry a feature"),
    (np.array([True, False, False, True, False]), "one entry a feature")])
def test_malformed_validation_data_and_masks_are_one_clear_error(bad, message):
    frame, y = table(60)
    if isinstance(bad, int):
        with pytest.raises(ValueError, match=message):
            GPClassifier(n_inducing=6, max_iter=1).fit(frame, y, validation_data=bad)
    else:
        with pytest.raises(ValueError, match=message):
            GPClassifier(n_inducing=6, max_iter=1, categorical_features=bad).fit(frame, y)


def test_rows_of_another_shape_at_predict_are_refused_in_scikit_learns_words():
    frame, y = table(80)
    model = GPClassifier(n_inducing=6, max_iter=2, random_state=0).fit(frame, y)
    with pytest.raises(ValueError, match="feature names should match"):
        model.predict(frame[["region", "a", "b", "kind"]])
    with pytest.raises(ValueError, match="X has 3 features, but GPClassifier is expecting 4"):
        model.predict(frame.iloc[:, :3].to_numpy(dtype=object))
    with pytest.raises(ValueError, match="Expected a 2D array of rows"):
        model.predict(frame.iloc[0].to_numpy(dtype=object))


def test_float32_refuses_codes_it_cannot_keep_apart():
    X, y, _ = _coded_table(80)
    X[:, 1] = 2.0 ** 25 + X[:, 1]  # (33554432 and 33554433 are one float32)
    with pytest.raises(ValueError, match="float32 cannot hold exactly"):
        GPClassifier(n_inducing=6, max_iter=1, dtype="float32", categorical_features=[1]).fit(X, y)
    GPClassifier(n_inducing=6, max_iter=1, dtype="float64", categorical_features=[1]).fit(X, y)


def test_numbers_where_text_levels_were_learned_are_compared_as_text_and_warned_about():
    frame, y = table(80)
    model = GPClassifier(n_inducing=6, max_iter=2, random_state=0).fit(frame.assign(kind=frame["kind"].astype(str)),
                                                                        y)
    rows = frame.head(5).assign(kind=frame["kind"].astype(str)).to_numpy(dtype=object)
    rows[:, 1] = 7  # (a column of text levels read back as numbers)
    with pytest.warns(UserWarning, match="none of its 5 values is a level"):
        proba = model.predict_proba(rows)
    assert np.all(np.isfinite(proba))


def test_a_csv_column_of_text_levels_with_some_number_levels_is_categorical(tmp_path):
    from agpc.cli import main
    from agpc.persistence import load_model

    frame, y = table(120)
    levels = frame["region"].to_numpy(dtype=object)
    levels[:5] = "10"  # (a level that is a number, among text)
    data = _write_csv(tmp_path / "table.csv", frame.drop(columns="kind").assign(region=levels), y)
    assert main(["fit", str(data), "--target", "label", "--max-iter", "2", "--quiet", "--out",
                 str(tmp_path / "m.npz")]) == 0
    assert "10" in load_model(tmp_path / "m.npz").categorical_levels_[1].tolist()


def test_the_any_level_code_is_refused_at_prediction_as_at_fit():
    """Found by a hostile-input audit (2026-12-02): a column of codes holding ``kernels.ANY_LEVEL`` (an inducing
    point's "any level") was refused at fit but predicted from as "any level", a probability neither a seen nor an
    unseen level gives. Prediction checks the codes as fit does: one ValueError naming the column."""
    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(size=(60, 2)), np.arange(60) % 3]
    y = (X[:, 0] + (X[:, 2] == 1) > 0.3).astype(int)
    model = GPClassifier(n_inducing=5, categorical_features=[2], max_iter=2, random_state=1).fit(X, y)
    assert model.predict_proba([[0.3, -0.2, 99.0]]).shape == (1, 2)  # (an unseen code: predicted as one)
    for call in (model.predict_proba, model.predict, model.decision_function):
        with pytest.raises(ValueError, match="X column 2 \\(categorical\\) holds .*any level"):
            call([[0.3, -0.2, ANY_LEVEL]])


def test_numbers_for_a_float32_models_text_levels_are_compared_as_text():
    """A text column read back as numbers (levels "20200101", ... from a file, as integers) is compared with the
    levels as text at prediction, in a float32 model too: the check of codes (exact in float32, none "any level")
    is for columns of codes, not for those of text levels (a review found it refusing 20200103 here)."""
    rng = np.random.default_rng(0)
    levels = np.array(["20200101", "20200102", "20200103"])
    column = rng.choice(levels, 90)
    frame = pd.DataFrame({"x": rng.normal(size=90), "d": column})
    y = (frame["x"] + (frame["d"] == "20200101") > 0.3).astype(int).to_numpy()
    model = GPClassifier(n_inducing=5, max_iter=2, dtype="float32", categorical_features=["d"], random_state=0)
    model.fit(frame, y)
    as_numbers = pd.DataFrame({"x": frame["x"], "d": column.astype(np.int64)})
    np.testing.assert_array_equal(model.predict_proba(as_numbers), model.predict_proba(frame))
