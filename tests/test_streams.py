"""Data on disk, streams (partial_fit), validation scoring and early stopping."""

import numpy as np
import pytest

from agpc import RBF, GPClassifier
from agpc.datasets import make_banana


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    X, y = make_banana(3000, random_state=21)
    folder = tmp_path_factory.mktemp("data")
    np.save(folder / "X.npy", X)
    np.save(folder / "y.npy", y)
    X_mm = np.load(folder / "X.npy", mmap_mode="r")
    y_mm = np.load(folder / "y.npy", mmap_mode="r")
    return X, y, X_mm, y_mm


def _fixed_start(X):
    return dict(kernel=RBF(lengthscales=[0.8, 0.8], amplitude=2.0, noise=1e-3), inducing=X[:12].copy())


def test_partial_fit_over_memmap_chunks_equals_fit_on_the_same_stream(on_disk):
    """Chunks of 250 rows in storage order, one pass: partial_fit call by call and fit with
    batch_size=250, shuffle=False, max_iter=1 epoch take the same steps and end at the same model."""
    X, _, X_mm, y_mm = on_disk
    params = dict(method="sep", batch_size=250, shuffle=False, max_iter=1, random_state=0, **_fixed_start(X))
    fitted = GPClassifier(**params).fit(X_mm, y_mm)
    streamed = GPClassifier(**params)
    for lo in range(0, X_mm.shape[0], 250):
        streamed.partial_fit(X_mm[lo:lo + 250], y_mm[lo:lo + 250], classes=[-1, 1], n_total=X_mm.shape[0])
    np.testing.assert_allclose(streamed.inducing_points_, fitted.inducing_points_, rtol=1e-12, atol=1e-12)
    for name in fitted.kernel_.params:
        np.testing.assert_allclose(streamed.kernel_.params[name], fitted.kernel_.params[name], rtol=1e-12)
    np.testing.assert_allclose(streamed.predict_proba(X[:100]), fitted.predict_proba(X[:100]), rtol=1e-10, atol=1e-12)


def test_fit_on_memmap_equals_fit_in_memory(on_disk):
    X, y, X_mm, y_mm = on_disk
    params = dict(method="ep", batch_size=500, shuffle=False, max_iter=2, random_state=0, **_fixed_start(X))
    in_memory = GPClassifier(**params).fit(X, y)
    from_disk = GPClassifier(**params).fit(X_mm, y_mm)
    np.testing.assert_allclose(from_disk.predict_proba(X[:200]), in_memory.predict_proba(X[:200]), rtol=1e-10, atol=1e-12)


def test_on_disk_input_is_validated_a_chunk_at_a_time(tmp_path):
    X = np.zeros((100, 2))
    X[70, 1] = np.nan
    np.save(tmp_path / "X.npy", X)
    X_mm = np.load(tmp_path / "X.npy", mmap_mode="r")
    with pytest.raises(ValueError, match="NaN or infinity"):
        GPClassifier(n_inducing=5).fit(X_mm, np.arange(100) % 2)


def test_partial_fit_learns_a_stream_and_refuses_ep():
    X, y = make_banana(4000, random_state=3)
    X_test, y_test = make_banana(3000, random_state=4)
    model = GPClassifier(method="sep", n_inducing=20, random_state=0)
    for lo in range(0, 4000, 200):
        model.partial_fit(X[lo:lo + 200], y[lo:lo + 200], classes=[-1, 1])
    assert model.score(X_test, y_test) > 0.8
    assert len(model.history_["log_marginal_likelihood"]) == 20
    assert not hasattr(GPClassifier(method="ep"), "partial_fit")
    with pytest.raises(ValueError, match="not in classes"):
        model.partial_fit(X[:10], np.full(10, 7))


def test_validation_history_and_early_stopping():
    X, y = make_banana(600, random_state=8)
    X_val, y_val = make_banana(600, random_state=9)
    model = GPClassifier(n_inducing=15, max_iter=300, eval_every=5, n_iter_no_change=3, tol=1e-3, random_state=0)
    model.fit(X, y, validation_data=(X_val, y_val))
    h = model.history_
    assert len(h["validation_nll"]) == len(h["validation_error"]) == len(h["validation_step"]) > 0
    assert model.early_stopped_ and model.n_iter_ < 310
    best = min(h["validation_nll"])
    proba = model.predict_proba(X_val)
    nll = -np.mean(np.log(proba[np.arange(len(y_val)), (y_val == 1).astype(int)]))
    assert abs(nll - best) < 1e-9  # the kept state is the best one seen


def test_verbose_shows_a_progress_bar(capsys):
    X, y = make_banana(200, random_state=0)
    GPClassifier(n_inducing=8, max_iter=5, verbose=True).fit(X, y)
    err = capsys.readouterr().err
    assert "agpc ep" in err and "log_Zq" in err


def _joblib_round_trip(model):
    import io

    import joblib

    buffer = io.BytesIO()
    joblib.dump(model, buffer)
    buffer.seek(0)
    return joblib.load(buffer)


@pytest.mark.parametrize("method, n_classes", [("sep", 2), ("adf", 2), ("sep", 3)])
@pytest.mark.parametrize("round_trip", ["pickle", "joblib", "deepcopy"])
def test_a_stream_model_survives_pickle_and_goes_on_learning_the_same(method, n_classes, round_trip):
    """A model trained by partial_fit keeps its trainer (engine state, optimiser, the module of its passes):
    it pickles, joblib-dumps and deep-copies, and partial_fit after the round trip gives exactly the model
    that partial_fit without it gives."""
    import copy
    import pickle

    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 2))
    y = (X[:, 0] > 0).astype(int) + (n_classes == 3) * (X[:, 1] > 0.5).astype(int)
    copies = {"pickle": lambda m: pickle.loads(pickle.dumps(m)), "joblib": _joblib_round_trip,
              "deepcopy": copy.deepcopy}
    model = GPClassifier(method=method, n_inducing=5, random_state=0).partial_fit(X[:50], y[:50])
    restored = copies[round_trip](model)
    for lo in (50, 100):
        model.partial_fit(X[lo:lo + 50], y[lo:lo + 50])
        restored.partial_fit(X[lo:lo + 50], y[lo:lo + 50])
    np.testing.assert_array_equal(restored.predict_proba(X), model.predict_proba(X))
    assert restored.n_iter_ == model.n_iter_ == 3
