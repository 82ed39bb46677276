"""GPClassifier: the estimator's contract, input validation and persistence."""

import json
import os
import warnings
import zipfile

import numpy as np
import pytest
from sklearn.metrics import accuracy_score

from agpc import RBF, GPClassifier, JitterWarning, Matern52
from agpc import backend as B
from agpc import prediction as P
from agpc.datasets import make_banana


@pytest.fixture(scope="module")
def banana():
    X, y = make_banana(200, random_state=0)
    return X, y


@pytest.fixture(scope="module")
def fitted(banana):
    X, y = banana
    return GPClassifier(n_inducing=12, max_iter=40, random_state=0).fit(X, y)


def test_string_labels_round_trip(banana):
    X, y = banana
    labels = np.where(y > 0, "spam", "ham")
    model = GPClassifier(n_inducing=10, max_iter=30, random_state=0).fit(X, labels)
    assert list(model.classes_) == ["ham", "spam"]
    predicted = model.predict(X)
    assert set(predicted) <= {"ham", "spam"}
    # the probability column for "spam" is the one for the +1 class of the numeric fit
    numeric = GPClassifier(n_inducing=10, max_iter=30, random_state=0).fit(X, y)
    np.testing.assert_allclose(model.predict_proba(X), numeric.predict_proba(X), rtol=1e-12)
    assert model.score(X, labels) > 0.8


def test_fitted_attributes_and_shapes(fitted, banana):
    X, _ = banana
    assert fitted.inducing_points_.shape == (12, 2)
    assert fitted.n_features_in_ == 2
    assert fitted.n_iter_ == len(fitted.history_["log_marginal_likelihood"])  # warm-up sweeps included
    assert np.isfinite(fitted.log_marginal_likelihood_)
    proba = fitted.predict_proba(X[:7])
    assert proba.shape == (7, 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    mean, var = fitted.predict_latent(X[:7])
    assert mean.shape == (7,) and var.shape == (7,) and np.all(var > 0)
    np.testing.assert_allclose(np.log(proba), fitted.predict_log_proba(X[:7]), rtol=1e-10)
    assert np.all((fitted.decision_function(X[:7]) > 0) == (fitted.predict(X[:7]) == fitted.classes_[1]))


def test_optimize_freezes_what_it_does_not_name(banana):
    X, y = banana
    Z0 = X[:8].copy()
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01)
    only_kernel = GPClassifier(kernel=kernel, inducing=Z0, optimize=("kernel",), max_iter=20).fit(X, y)
    np.testing.assert_array_equal(only_kernel.inducing_points_, Z0)
    assert not np.allclose(only_kernel.kernel_.params["log_lengthscales"], 0.0)
    only_z = GPClassifier(kernel=kernel, inducing=Z0, optimize=("inducing",), max_iter=20).fit(X, y)
    assert not np.allclose(only_z.inducing_points_, Z0)
    for name, value in kernel.params.items():
        np.testing.assert_array_equal(only_z.kernel_.params[name], value)
    frozen = GPClassifier(kernel=kernel, inducing=Z0, optimize=False, max_iter=500, tol=1e-10).fit(X, y)
    np.testing.assert_array_equal(frozen.inducing_points_, Z0)
    assert frozen.n_iter_ < 500  # EP converged on fixed hyper-parameters
    # the user's kernel object is not modified by fitting
    np.testing.assert_array_equal(kernel.params["log_lengthscales"], [0.0, 0.0])


def test_matern_kernel_and_random_inducing(banana):
    X, y = banana
    model = GPClassifier(kernel=Matern52(lengthscales=1.0), inducing="random", n_inducing=10, max_iter=30, random_state=1).fit(X, y)
    assert type(model.kernel_).__name__ == "Matern52"
    assert model.score(X, y) > 0.8


def test_same_seed_same_model(banana):
    X, y = banana
    a = GPClassifier(n_inducing=10, max_iter=20, random_state=5).fit(X, y)
    b = GPClassifier(n_inducing=10, max_iter=20, random_state=5).fit(X, y)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda X, y: (np.where(np.arange(len(X))[:, None] == 3, np.nan, X), y), "NaN"),
        (lambda X, y: (np.where(np.arange(len(X))[:, None] == 3, np.inf, X), y), "infinity"),
        (lambda X, y: (X[:, 0], y), "Expected 2D array"),
        (lambda X, y: (X, y[:-1]), "X has 200 rows but y has 199"),
        (lambda X, y: (X, np.ones_like(y)), "only one class"),
    ],
    ids=["nan", "inf", "1d", "rows", "one-class"],
)
def test_bad_input_raises_a_clear_value_error(banana, make, message):
    X, y = banana
    Xb, yb = make(X, y)
    with pytest.raises(ValueError, match=message):
        GPClassifier(n_inducing=5, max_iter=2).fit(Xb, yb)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n_inducing": 500}, r"n_inducing=500 exceeds the number of training rows \(200\)"),
        ({"method": "laplace"}, "method must be one of 'ep', .*, got 'laplace'"),
        ({"backend": "tensorflow"}, "backend must be .*, got 'tensorflow'"),
        ({"damping": 0.0}, r"damping must be None or a finite number in \(0, 1\], got 0.0"),
        ({"optimize": ("kernel", "noise")}, r"optimize must be .*, got \('kernel', 'noise'\)"),
        ({"inducing": "grid"}, "inducing must be one of 'auto', 'kmeans', 'variance', 'random' or an array .*, got 'grid'"),
        ({"inducing": np.zeros((4, 3))}, r"inducing points must have shape \(m, 2\)"),
        # a hostile-input audit (2026-12-02): complex points lost their imaginary part with NumPy's ComplexWarning,
        # text raised NumPy's "could not convert string to float"
        ({"inducing": np.zeros((4, 2), dtype=complex)}, "inducing points must be real numbers, got an array of complex"),
        ({"inducing": np.array([["a", "b"]])}, "inducing points must be real numbers, got an array of <U1 holding"),
        # (the hostile-input audit of 2026-12-04: an object array of text raised "could not convert string to float")
        ({"inducing": np.array([[1, "a"], [2, 3]], dtype=object)},
         "inducing points must be real numbers, got an array of object holding values that are not numbers"),
        ({"kernel": "rbf"}, "kernel must be None or an agpc kernel"),
    ],
)
def test_bad_parameters_raise_a_clear_value_error(banana, params, message):
    X, y = banana
    with pytest.raises(ValueError, match=message):
        GPClassifier(**{"n_inducing": 5, "max_iter": 2, **params}).fit(X, y)


def test_inducing_points_written_as_numbers_in_text_are_taken_as_numbers(banana):
    """(A review, 2026-12-02: the refusal of text points refused numbers written as text, which fitted before.)"""
    X, y = banana
    as_text = GPClassifier(inducing=X[:6].astype(str), max_iter=2, random_state=0).fit(X, y)
    as_numbers = GPClassifier(inducing=X[:6], max_iter=2, random_state=0).fit(X, y)
    np.testing.assert_array_equal(as_text.predict_proba(X), as_numbers.predict_proba(X))


def test_inducing_points_given_as_copies_are_said_to_be_fewer(banana):
    """The hostile-input audit of 2026-12-04: 20 copies of one row as the inducing points fitted at chance (copies
    move together: one point in effect), without a word. One warning says how many are distinct; distinct points
    give none."""
    X, y = banana
    with pytest.warns(UserWarning, match=r"inducing: 20 points given, 1 of them distinct") as said:
        model = GPClassifier(inducing=X[[0] * 20], max_iter=3, random_state=0).fit(X, y)
    assert [w.filename for w in said if "distinct" in str(w.message)] == [__file__]  # (said on the user's line)
    Z = np.asarray(model.inducing_points_)
    assert np.unique(Z, axis=0).shape[0] == 1  # (what the warning says: the copies stayed copies)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        GPClassifier(inducing=X[:20], max_iter=3, random_state=0).fit(X, y)


def test_predict_checks_feature_count(fitted):
    with pytest.raises(ValueError, match="X has 3 features, but GPClassifier is expecting 2"):
        fitted.predict(np.zeros((4, 3)))


def test_save_load_round_trip(fitted, banana, tmp_path):
    X, _ = banana
    path = tmp_path / "model.agpc"
    fitted.save(path)
    loaded = GPClassifier.load(path)
    np.testing.assert_allclose(loaded.predict_proba(X), fitted.predict_proba(X), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(loaded.classes_, fitted.classes_)
    assert loaded.get_params()["n_inducing"] == fitted.get_params()["n_inducing"]
    assert loaded.log_marginal_likelihood_ == fitted.log_marginal_likelihood_
    assert loaded.history_["log_marginal_likelihood"] == fitted.history_["log_marginal_likelihood"]
    # the file is plain data: an npz whose header is JSON
    with zipfile.ZipFile(path) as archive:
        assert "__agpc_header__.npy" in archive.namelist()
    header = json.loads(str(np.load(path, allow_pickle=False)["__agpc_header__"]))
    assert header["format"] == "agpc-model"


def test_the_model_file_reads_and_writes_values_never_the_estimator(fitted, banana, tmp_path):
    """``agpc.model_file`` writes (class name, parameters, FittedState) and reads them back through a schema of
    values; what it calls of the estimator is the schema's parameter check, nothing else: a subclass whose
    prediction methods fail still loads (the file's model is tried by the prediction code, not by the estimator),
    and a parameter the check refuses is named."""
    from agpc.model_file import EstimatorSchema, read_model_parts, write_model_file

    X, _ = banana
    path = tmp_path / "model.agpc"
    write_model_file(path, "GPClassifier", fitted.get_params(deep=False), fitted.fitted_state())
    checked = []
    schema = EstimatorSchema("GPClassifier", GPClassifier().get_params(deep=False),
                             lambda params: checked.append(GPClassifier(**params).check_params()))
    params, state, scaler = read_model_parts(path, schema)
    assert len(checked) == 1 and scaler is None
    assert params == {**fitted.get_params(deep=False), "backend": params["backend"]}
    loaded = GPClassifier(**params).set_fitted_state(state)
    np.testing.assert_allclose(loaded.predict_proba(X), fitted.predict_proba(X), rtol=1e-12, atol=1e-14)

    class Broken(GPClassifier):
        def predict_proba(self, X):
            raise AssertionError("the model file called predict_proba")

        predict_latent = predict_log_proba = predict_proba

    write_model_file(path, "Broken", fitted.get_params(deep=False), fitted.fitted_state())
    assert isinstance(Broken.load(path), Broken)

    def refuse(params):
        raise ValueError("damping: refused by this schema")

    with pytest.raises(ValueError, match="params: damping: refused by this schema"):
        read_model_parts(path, EstimatorSchema("Broken", schema.defaults, refuse))
    with pytest.raises(ValueError, match="estimator: 'Broken', this agpc loads GPClassifier"):
        GPClassifier.load(path)


def test_load_refuses_foreign_and_corrupt_files(fitted, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="not a valid agpc model file"):
        GPClassifier.load(text)
    other = tmp_path / "other.npz"
    np.savez(other, a=np.arange(3))
    with pytest.raises(ValueError, match="no agpc header"):
        GPClassifier.load(other)
    good = tmp_path / "good.agpc"
    fitted.save(good)
    truncated = tmp_path / "truncated.agpc"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    with pytest.raises(ValueError, match="not a valid agpc model file"):
        GPClassifier.load(truncated)
    # a header that lies about the shapes
    arrays = dict(np.load(good, allow_pickle=False))
    header = json.loads(str(arrays["__agpc_header__"]))
    header["n_features_in"] = 5
    arrays["__agpc_header__"] = np.asarray(json.dumps(header))
    liar = tmp_path / "liar.agpc"
    with open(liar, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ValueError, match="inducing_points: shape"):  # the field that disagrees is named
        GPClassifier.load(liar)
    # a pickled object array is never unpickled
    pickled = tmp_path / "pickled.agpc"
    arrays = dict(np.load(good, allow_pickle=False))
    arrays["posterior_h"] = np.array([object()], dtype=object)
    with open(pickled, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ValueError, match="not a valid agpc model file"):
        GPClassifier.load(pickled)


def test_save_is_atomic(fitted, tmp_path, monkeypatch):
    """A failure while writing leaves the previous model file intact and no temporary file behind."""
    path = tmp_path / "model.agpc"
    fitted.save(path)
    before = path.read_bytes()

    def broken_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        fitted.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.agpc"]


def test_saved_model_has_the_permissions_of_any_new_file(fitted, tmp_path):
    """The temporary file behind the atomic save is created owner-only; the model must not stay so."""
    umask = os.umask(0o022)
    try:
        fitted.save(tmp_path / "model.agpc")
        (tmp_path / "plain").write_bytes(b"")
    finally:
        os.umask(umask)
    assert (tmp_path / "model.agpc").stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777 == 0o644


def test_three_classes_with_a_binary_only_method_name_the_methods_that_can(banana):
    X, y = banana
    with pytest.raises(ValueError, match="3 classes but method='vi-jj' is binary only.*'ep', 'sep', 'adf', 'svi'"):
        GPClassifier(method="vi-jj", n_inducing=5).fit(X, np.arange(len(y)) % 3)


@pytest.mark.parametrize("where", ["memory", "disk", "partial_fit"])
def test_the_parameters_are_checked_once_a_call(banana, monkeypatch, tmp_path, where):
    """``fit`` (rows in memory or on disk) and ``partial_fit`` check the parameters once, before anything reads them:
    the one fit path takes the checked values on, where fit and partial_fit each checked them twice."""
    X, y = banana
    real, calls = GPClassifier._check_params, []
    monkeypatch.setattr(GPClassifier, "_check_params", lambda self: calls.append(1) or real(self))
    model = GPClassifier(method="sep", n_inducing=5, max_iter=1, random_state=0)
    if where == "partial_fit":
        model.partial_fit(X[:50], y[:50], classes=np.unique(y))
        model.partial_fit(X[50:100], y[50:100])
        assert len(calls) == 2
        return
    if where == "disk":
        np.save(tmp_path / "X.npy", X)
        X = np.load(tmp_path / "X.npy", mmap_mode="r")
    model.fit(X, y)
    assert len(calls) == 1


def test_score_weights_each_row_by_its_sample_weight():
    """``score(X, y, sample_weight=w)`` is the weighted accuracy (scikit-learn's ``accuracy_score``): GridSearchCV
    passes the folds' weights to it. No test called it with weights, and a break that ignored them passed."""
    X, y = make_banana(200, random_state=3)
    model = GPClassifier(n_inducing=8, max_iter=5, random_state=0).fit(X, y)
    predicted = model.predict(X)
    w = np.where(predicted == y, 0.2, 3.0)  # (the errors weigh more)
    assert model.score(X, y, sample_weight=w) == pytest.approx(accuracy_score(y, predicted, sample_weight=w),
                                                               rel=1e-12)
    assert model.score(X, y, sample_weight=w) < model.score(X, y) - 0.05


def test_score_takes_a_column_of_labels_as_fit_does_and_refuses_labels_that_do_not_match_the_rows():
    """A hostile-input audit (2026-12-02): ``score(X, y[:, None])`` or a one-column DataFrame of labels (what fit
    takes, with scikit-learn's DataConversionWarning) returned 0.507 where the accuracy was 0.83, with no warning:
    the column broadcast against the predictions to an n x n table. Labels of another length raised NumPy's
    broadcasting error, and y=None a TypeError."""
    pd = pytest.importorskip("pandas")
    from sklearn.exceptions import DataConversionWarning

    X, y = make_banana(200, random_state=0)
    model = GPClassifier(n_inducing=10, max_iter=3, random_state=0).fit(X, y)
    accuracy = accuracy_score(y, model.predict(X))
    for column in (y[:, None], pd.DataFrame({"label": y})):
        with pytest.warns(DataConversionWarning):
            assert model.score(X, column) == pytest.approx(accuracy, rel=1e-12)
    with pytest.raises(ValueError, match="X has 200 rows but y has 3"):
        model.score(X, y[:3])
    with pytest.raises(ValueError, match="y must be 1-D"):
        model.score(X, np.c_[y, y])
    with pytest.raises(ValueError, match="the target y is None"):
        model.score(X, None)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_a_jitter_raised_in_prediction_is_warned_at_the_callers_line(monkeypatch, n_classes):
    """Every public prediction method holds the scope that reports a raised jitter, so its JitterWarning points at
    the line that called it, whichever path inside (the latent, the probabilities, the labels) raised it."""
    X, y = make_banana(90, random_state=0)
    labels = y if n_classes == 2 else np.arange(90) % 3
    model = GPClassifier(n_inducing=6, max_iter=2, random_state=0).fit(X, labels)
    latent = P.latent

    def raising(*args, **kwargs):  # a prediction whose factorisation needed more jitter
        B.note_jitter("K(Z, Z)", 0.0, 1e-3)
        return latent(*args, **kwargs)

    monkeypatch.setattr(P, "latent", raising)
    for name in ("predict", "predict_proba", "predict_log_proba", "decision_function", "predict_latent",
                 "predict_uncertainty"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            getattr(model, name)(X[:5])
        said = [w for w in caught if issubclass(w.category, JitterWarning)]
        assert [os.path.basename(w.filename) for w in said] == [os.path.basename(__file__)], (name, said)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_a_jitter_above_the_kernels_prior_variance_is_said(n_classes):
    """``jitter=1e6`` fitted silently a model whose probabilities were all 0.500 (banana, 1,000 rows: test NLL 0.693,
    1e3: 0.464, against 0.336 at the default): the jitter swamped K(Z, Z). A fit whose jitter ends above its fitted
    kernel's prior variance at the inducing points (each class's, the smallest) says so in one UserWarning, from the
    caller's line; a jitter the kernel's variance grows past (1.0 here) says nothing."""
    X, y = make_banana(300, random_state=0)
    labels = y if n_classes == 2 else np.digitize(X[:, 0], [-0.5, 0.5])
    options = dict(n_inducing=10, max_iter=20, random_state=0)
    with pytest.warns(UserWarning, match=r"jitter_=1e\+06 exceeds the fitted kernel's prior variance at the "
                                         r"inducing points \(\d") as caught:
        model = GPClassifier(jitter=1e6, **options).fit(X, labels)
    assert [w.filename for w in caught if "jitter_=" in str(w.message)] == [__file__]
    assert min(float(np.mean(k.Kdiag(Z))) for k, Z in model.kernel_.latent_parts(model.inducing_points_)) < 1e6
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        GPClassifier(jitter=1.0, **options).fit(X, labels)
    # (K(Z, Z) holds no latent noise, which Kdiag adds: a review found an amplitude of 1e-7 under a noise of 1 unsaid)
    quiet = RBF(lengthscales=[1.0, 1.0], amplitude=1e-7, noise=1.0)
    with pytest.warns(UserWarning, match=r"jitter_=1e-06 exceeds the fitted kernel's prior variance at the inducing "
                                         r"points \(1e-07\)"):
        GPClassifier(kernel=quiet, n_inducing=10, max_iter=0).fit(X, y)


@pytest.mark.parametrize("kind", ["binary, ep", "binary, sep minibatches", "multiclass", "ordinal"])
def test_labels_memory_mapped_beside_rows_in_memory_fit_as_labels_in_memory(tmp_path, kind):
    """A hostile-input audit (2026-12-02): ``fit(X, np.load("y.npy", mmap_mode="r"))`` with X in memory failed in
    every method (IndexError: "array is 0-dimensional"; "index 111 is out of bounds"): labels on disk were left
    there, as beside rows on disk, and the fit in memory then read none. They are read whole: the same model."""
    X, y = make_banana(120, random_state=0)
    labels = np.arange(120) % 3 if kind in ("multiclass", "ordinal") else y
    np.save(tmp_path / "y.npy", labels)
    on_disk = np.load(tmp_path / "y.npy", mmap_mode="r")
    options = dict(n_inducing=8, max_iter=3, random_state=0)
    options.update({"binary, sep minibatches": dict(method="sep", batch_size=40), "ordinal": dict(
        likelihood="ordinal")}.get(kind, {}))
    expected = GPClassifier(**options).fit(X, labels).predict_proba(X)
    np.testing.assert_array_equal(GPClassifier(**options).fit(X, on_disk).predict_proba(X), expected)


FRACTIONAL = {"in memory": lambda tmp, X, y: (X, y), "a list": lambda tmp, X, y: (X, y.tolist()),
              "on disk": lambda tmp, X, y: _on_disk(tmp, X, y)}


def _on_disk(tmp, X, y):
    np.save(tmp / "X.npy", X)
    np.save(tmp / "y.npy", y)
    return np.load(tmp / "X.npy", mmap_mode="r"), np.load(tmp / "y.npy", mmap_mode="r")


@pytest.mark.parametrize("where", FRACTIONAL, ids=FRACTIONAL)
@pytest.mark.parametrize("likelihood", [None, "ordinal"])
def test_labels_with_a_fraction_are_refused_in_agpcs_words_and_whole_floats_of_any_size_are_classes(tmp_path, where,
                                                                                                  likelihood):
    """A hostile-input audit (2026-12-02): labels 0.5 / 1.5 were refused in memory with scikit-learn's "Unknown
    label type: continuous. Maybe you are trying to fit a classifier...", taken as two classes on disk (and on dask,
    tests/test_dask.py), and by an ordinal model in memory; whole floats of 2^63 or more (1e20) were "continuous",
    with NumPy's warning about a cast to int64. One rule now, on every path: a fraction is refused, in agpc's words;
    whole numbers of any size are classes."""
    X, y = make_banana(80, random_state=0)
    options = dict(n_inducing=6, max_iter=2, random_state=0, likelihood=likelihood)
    with pytest.raises(ValueError, match=r"y holds labels that are not whole numbers \(\[0\.5, 1\.5\]\): a "
                                         "classifier's labels are classes"):
        GPClassifier(**options).fit(*FRACTIONAL[where](tmp_path, X, np.where(y > 0, 1.5, 0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model = GPClassifier(**options).fit(*FRACTIONAL[where](tmp_path, X, np.where(y > 0, 2e20, 1e20)))
    assert model.classes_.tolist() == [1e20, 2e20]
    # (an adversarial review: with scikit-learn's check off for float labels, inf was taken as a class, and its model
    # file refused at load)
    with pytest.raises(ValueError, match=r"y holds infinite labels \(\[inf\]\): a class needs a finite label"):
        GPClassifier(**options).fit(*FRACTIONAL[where](tmp_path, X, np.where(y > 0, np.inf, 0.0)))


def test_a_refused_refit_leaves_the_fitted_model_as_it_was():
    """An estimator-API audit (2026-12-02): a refit refused after ``validate_data`` had reset the feature names
    (sample weights too large, an n_inducing above the rows, a bad validation set, ...) left the old model under the
    refused fit's names, and it then predicted a DataFrame of the new column order with its columns swapped, with
    nothing said (accuracy 0.87 -> 0.34). A refused fit puts every attribute back."""
    pandas = pytest.importorskip("pandas")
    X, y = make_banana(200, random_state=0)
    frame = pandas.DataFrame(X, columns=["a", "b"])
    model = GPClassifier(n_inducing=20, max_iter=10, random_state=0).fit(frame, y)
    kept, right = dict(vars(model)), model.predict_proba(frame)
    swapped = frame[["b", "a"]]
    for refused in (dict(sample_weight=np.full(200, 1e300)), dict(validation_data=(X[:, :1], y))):
        with pytest.raises(ValueError):
            model.fit(swapped, y, **refused)
        assert vars(model).keys() == kept.keys() and all(vars(model)[k] is v for k, v in kept.items())
        with pytest.raises(ValueError, match="feature names"):
            model.predict_proba(swapped)
    with pytest.raises(ValueError):
        model.set_params(n_inducing=500).fit(swapped.iloc[:50], y[:50])
    np.testing.assert_array_equal(model.predict_proba(frame), right)
    fresh = GPClassifier(n_inducing=20, max_iter=10)
    with pytest.raises(ValueError):
        fresh.fit(frame, y, sample_weight=np.full(200, 1e300))
    assert not hasattr(fresh, "feature_names_in_") and not hasattr(fresh, "n_features_in_")


class _Client:
    """Passes the parameter table's check of ``client`` (a distributed.Client's compute and submit)."""

    def compute(self, *args):
        raise AssertionError("a fit in memory asked the client to compute")

    submit = compute


def test_settings_of_a_place_the_rows_are_not_in_are_said():
    """client, local_steps and site_directory given for a fit in this process (NumPy rows, batch passes or
    minibatches: no dask.array, no n_jobs worker processes) were ignored without a word; each is now one UserWarning
    naming it and why, the fit going on as before (the model of the fit without them). Where they are read: the fits
    on a dask array and in worker processes (tests/test_data_parallel.py, tests/test_local_workers.py)."""
    X, y = make_banana(200, random_state=0)
    quick = dict(n_inducing=6, max_iter=2, random_state=0)
    for batch_size in (None, 50):
        plain = GPClassifier(batch_size=batch_size, **quick).fit(X, y)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            model = GPClassifier(batch_size=batch_size, client=_Client(), local_steps=2, site_directory="sites",
                                 **quick).fit(X, y)
        unused = sorted(str(w.message) for w in said if "is not used" in str(w.message))
        assert [message.split(" is not used: ")[0] for message in unused] == [
            "client", "local_steps=2", "site_directory='sites'"]
        assert all("this fit's rows train in this process" in message for message in unused), unused
        np.testing.assert_array_equal(model.predict_proba(X), plain.predict_proba(X))


def test_labels_of_nearly_one_row_a_class_are_refused_before_the_model_is_built():
    """A hostile-input audit (2026-12-02): an identifier column given as y (100,000 labels in 100,000 rows) started a
    multiclass model of one latent function a class, and ran for minutes with nothing said. More classes than half
    the rows (past 20) are one error; many classes of a few rows each still fit."""
    X, _ = make_banana(200, random_state=0)
    for y in (np.arange(200), np.arange(200).astype(str), np.arange(200) % 150):
        with pytest.raises(ValueError, match=r"y has \d+ classes in 200 rows .* identifier column"):
            GPClassifier(max_iter=2).fit(X, y)
    model = GPClassifier(n_inducing=5, max_iter=2).fit(X[:90], np.arange(90) % 30)  # (30 classes of 3 rows: fits)
    assert len(model.classes_) == 30


def test_inducing_points_and_an_n_inducing_that_disagree_are_said():
    """``inducing=`` an array of 10 points with ``n_inducing=7`` trained the 10 points, n_inducing ignored unsaid (this
    stop's audit): the points stay the model's, and a warning says n_inducing is not used; with their own count, or
    n_inducing="auto", nothing is said."""
    X, y = make_banana(200, random_state=0)
    with pytest.warns(UserWarning, match=r"n_inducing=7 is not used: the 10 points given as inducing are the model's"):
        model = GPClassifier(inducing=X[:10], n_inducing=7, max_iter=2).fit(X, y)
    assert model.inducing_points_.shape == (10, 2)
    for n_inducing in (10, "auto"):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="n_inducing=")
            assert GPClassifier(inducing=X[:10], n_inducing=n_inducing, max_iter=2).fit(X, y).inducing_points_.shape == (10, 2)
