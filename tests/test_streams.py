"""Data on disk, streams (partial_fit), validation scoring and early stopping."""

import numpy as np
import pytest

from agpc import RBF, GPClassifier
from agpc.datasets import make_banana
from agpc.inference import tied_steps
from agpc.priors import LogNormal


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
    """The same start for fit and for a stream: kernel, inducing points and the kernel's priors (priors of its own,
    which win over kernel_prior="auto"'s: those are centred from the rows the kernel starts from, all of them for
    fit and the first batch for partial_fit, as the default kernel is)."""
    priors = {"lengthscales": LogNormal(0.5, 1.5), "amplitude": LogNormal(0.0, 1.5)}
    return dict(kernel=RBF(lengthscales=[0.8, 0.8], amplitude=2.0, noise=1e-3, priors=priors), inducing=X[:12].copy())


def test_partial_fit_over_memmap_chunks_equals_fit_on_the_same_stream(on_disk, monkeypatch):
    """Chunks of 250 rows in storage order, one pass: partial_fit call by call and fit with
    batch_size=250, shuffle=False, max_iter=1 epoch take the same steps and end at the same model (with priors of
    the kernel's own: see _fixed_start and test_kernel_prior_of_a_stream_is_centred_on_its_first_batch). A stream
    moves Z at every call, where fit moves it one step in ``tied_steps.TIED_INDUCING_EVERY``: fit here as at 1; at
    the default its Z ends elsewhere, the stream's where it would."""
    X, _, X_mm, y_mm = on_disk
    params = dict(method="sep", batch_size=250, shuffle=False, max_iter=1, random_state=0, **_fixed_start(X))
    held = GPClassifier(**params).fit(X_mm, y_mm)
    with monkeypatch.context() as patch:
        patch.setattr(tied_steps, "TIED_INDUCING_EVERY", 1)
        fitted = GPClassifier(**params).fit(X_mm, y_mm)
    assert not np.allclose(held.inducing_points_, fitted.inducing_points_, rtol=1e-6, atol=1e-9)
    streamed = GPClassifier(**params)
    for lo in range(0, X_mm.shape[0], 250):
        streamed.partial_fit(X_mm[lo:lo + 250], y_mm[lo:lo + 250], classes=[-1, 1], n_total=X_mm.shape[0])
    np.testing.assert_allclose(streamed.inducing_points_, fitted.inducing_points_, rtol=1e-12, atol=1e-12)
    for name in fitted.kernel_.params:
        np.testing.assert_allclose(streamed.kernel_.params[name], fitted.kernel_.params[name], rtol=1e-12)
    np.testing.assert_allclose(streamed.predict_proba(X[:100]), fitted.predict_proba(X[:100]), rtol=1e-10, atol=1e-12)


def test_kernel_prior_of_a_stream_is_centred_on_its_first_batch(on_disk):
    """With kernel_prior="auto" the stream's lengthscale priors are centred at sqrt(d) times the spread of its
    first batch, fit's at that of all the rows it starts from (here all 3,000)."""
    X, _, X_mm, y_mm = on_disk
    params = dict(method="sep", batch_size=250, shuffle=False, max_iter=1, random_state=0,
                  kernel=RBF(lengthscales=[0.8, 0.8], amplitude=2.0, noise=1e-3), inducing=X[:12].copy())
    fitted = GPClassifier(**params).fit(X_mm, y_mm)
    streamed = GPClassifier(**params).partial_fit(X_mm[:250], y_mm[:250], classes=[-1, 1], n_total=X_mm.shape[0])
    d = X.shape[1]
    for model, rows in ((fitted, X), (streamed, X[:250])):
        prior = model.kernel_.priors["log_lengthscales"]
        np.testing.assert_allclose(np.exp(np.asarray(prior.loc)), np.sqrt(d) * rows.std(axis=0), rtol=1e-12)


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
    assert "agpc ep" in err and "log Z_q (EP estimate)=" in err


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


def _stream(n=300, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    return X, (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)


@pytest.mark.parametrize("n_total", [0, -5, 2.5, float("nan"), True, 49, "300", 10 ** 300, 2 ** 53 + 1])
def test_partial_fit_refuses_an_n_total_that_is_not_a_count_of_at_least_the_batch(n_total):
    """n_total is the number of rows the model stands for, this batch's included: one ValueError naming it,
    on the first call and on a later one, and the model is left as it was."""
    X, y = _stream()
    model = GPClassifier(method="sep", n_inducing=5, random_state=0)
    with pytest.raises(ValueError, match="n_total must be a positive integer at least the 50 rows"):
        model.partial_fit(X[:50], y[:50], n_total=n_total)
    model.partial_fit(X[:50], y[:50], n_total=300)
    before = model.predict_proba(X)
    with pytest.raises(ValueError, match="n_total"):
        model.partial_fit(X[50:100], y[50:100], n_total=n_total)
    np.testing.assert_array_equal(model.predict_proba(X), before)
    assert model.n_iter_ == 1


def _classes_by_two_thresholds(X):
    return (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)


@pytest.mark.parametrize("method, n_classes", [("sep", 2), ("adf", 2), ("sep", 3)])
def test_partial_fit_after_load_continues_the_saved_stream(tmp_path, method, n_classes):
    """A stream model saved and loaded goes on from where it was (the step count, the rows seen, q), as does
    the same model in memory once its trainer is rebuilt from its fitted state (the optimiser's moments are not
    in a model file, so both start them fresh): the two continuations are the same model. Before, the loaded
    one started again from this one batch (n_iter_ back to 1)."""
    import copy

    X, y = _stream()
    if n_classes == 3:
        y = _classes_by_two_thresholds(X)
    model = GPClassifier(method=method, n_inducing=6, random_state=0)
    for lo in range(0, 200, 50):
        model.partial_fit(X[lo:lo + 50], y[lo:lo + 50], classes=list(range(n_classes)))
    model.save(tmp_path / "stream.agpc")
    loaded = GPClassifier.load(tmp_path / "stream.agpc")
    rebuilt = copy.deepcopy(model)
    del rebuilt._trainer  # as after a load: the fitted state only
    for continued in (model, loaded, rebuilt):
        continued.partial_fit(X[200:250], y[200:250])
        continued.partial_fit(X[250:300], y[250:300])
    assert loaded.n_iter_ == rebuilt.n_iter_ == model.n_iter_ == 6
    assert loaded.history_["n_rows_seen"][-1] == rebuilt.history_["n_rows_seen"][-1] == 300
    assert len(loaded.history_["log_marginal_likelihood"]) == 6
    np.testing.assert_allclose(loaded.predict_proba(X), rebuilt.predict_proba(X), rtol=1e-10, atol=1e-12)
    # the live trainer kept its optimiser's moments; the continuations differ by those only, not by a restart
    restarted = GPClassifier(method=method, n_inducing=6, random_state=0).partial_fit(
        X[200:250], y[200:250], classes=list(range(n_classes))).partial_fit(X[250:300], y[250:300])
    gap = np.abs(loaded.predict_proba(X) - model.predict_proba(X)).max()
    assert gap < np.abs(restarted.predict_proba(X) - model.predict_proba(X)).max()


@pytest.mark.parametrize("n_classes", [2, 3])
def test_partial_fit_after_fit_starts_from_the_fitted_posterior(tmp_path, n_classes):
    """The first partial_fit step after fit (in memory, or after a load) starts at the fitted q: with a
    vanishing damping and no hyper-parameter step it moves nothing (probabilities stay the fitted ones) and the
    step count goes on. In memory the fit's rows are counted; a model file does not hold them, so after a load
    n_total is asked for, in one ValueError naming it."""
    X, y = _stream()
    if n_classes == 3:
        y = _classes_by_two_thresholds(X)
    model = GPClassifier(method="sep", n_inducing=6, max_iter=5, random_state=0).fit(X[:250], y[:250])
    fitted, steps, warmup = model.predict_proba(X), model.n_iter_, model.n_warmup_
    assert warmup == 10  # (batch SEP's warm-up sweeps, which the history keeps after partial_fit)
    model.save(tmp_path / "fitted.agpc")
    loaded = GPClassifier.load(tmp_path / "fitted.agpc")
    with pytest.raises(ValueError, match="pass n_total"):
        loaded.partial_fit(X[250:], y[250:])
    for continued, n_total in ((model, None), (loaded, 300)):
        continued.set_params(damping=1e-12, optimize=False)
        continued.partial_fit(X[250:], y[250:], n_total=n_total)
        assert continued.n_iter_ == steps + 1 and continued.n_warmup_ == warmup
        assert continued.history_["n_rows_seen"][-1] == 300
        np.testing.assert_allclose(continued.predict_proba(X), fitted, rtol=0, atol=1e-9)  # a step of size 1e-12
        continued.partial_fit(X[250:], y[250:])  # (a stream going on: its first call's count stays)
        assert continued.n_iter_ == steps + 2 and continued.n_warmup_ == warmup


def test_partial_fit_cannot_continue_a_model_fitted_by_a_method_without_a_stream():
    """A per-row-site EP model (or any other method's) set to 'sep' afterwards: one ValueError, no restart."""
    X, y = _stream()
    model = GPClassifier(method="ep", n_inducing=6, max_iter=3, random_state=0).fit(X, y)
    fitted = model.predict_proba(X)
    model.set_params(method="sep")
    with pytest.raises(ValueError, match="cannot continue this model: it was fitted with method='ep'"):
        model.partial_fit(X[:50], y[:50], n_total=300)
    np.testing.assert_array_equal(model.predict_proba(X), fitted)


@pytest.mark.parametrize("change", [dict(method="adf"), dict(dtype="float32"), dict(n_inducing=4),
                                    dict(kernel=RBF(lengthscales=[1.0, 1.0])), dict(likelihood="probit")])
def test_partial_fit_refuses_changed_structure_and_classes(change):
    """Classes or structural parameters changed between partial_fit calls were ignored silently: now one
    ValueError naming what changed, telling to call fit; the model is left as it was."""
    X, y = _stream()
    model = GPClassifier(method="sep", n_inducing=6, random_state=0).partial_fit(X[:50], y[:50], classes=[0, 1])
    before = model.predict_proba(X)
    with pytest.raises(ValueError, match=r"classes=\[5, 6\] differs from .*\[0, 1\]"):
        model.partial_fit(X[50:100], y[50:100], classes=[5, 6])
    np.testing.assert_array_equal(model.predict_proba(X), before)
    model.partial_fit(X[50:100], y[50:100], classes=[1, 0])  # the same classes, in another order
    posterior = model.posterior_
    name = next(iter(change))
    model.set_params(**change)
    with pytest.raises(ValueError, match=f"cannot continue this model: {name} .* call fit to start again"):
        model.partial_fit(X[100:150], y[100:150])
    assert model.posterior_ is posterior and model.n_iter_ == 2


def test_partial_fit_says_once_that_it_writes_no_checkpoints(tmp_path):
    """checkpoint_path / checkpoint_every apply to fit; partial_fit set with them warns at its first call
    (not at every minibatch) and writes nothing there."""
    import warnings

    X, y = make_banana(120, random_state=0)
    model = GPClassifier(method="sep", n_inducing=5, random_state=0, checkpoint_path=tmp_path / "ckpt.npz",
                         checkpoint_every=1)
    with pytest.warns(UserWarning, match="partial_fit writes no checkpoints"):
        model.partial_fit(X[:60], y[:60], classes=np.unique(y))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.partial_fit(X[60:], y[60:])
    assert not (tmp_path / "ckpt.npz").exists()


def test_a_stream_model_pickled_before_kernel_prior_existed_continues(on_disk):
    """partial_fit's docstring suggests pickling a stream model between calls: one pickled by an agpc without
    kernel_prior (no attribute, no entry in the fitted structure) was trained without priors and continues so."""
    import pickle

    X, _, X_mm, y_mm = on_disk
    params = dict(method="sep", batch_size=250, random_state=0, kernel_prior=None, **_fixed_start(X))
    model = GPClassifier(**params).partial_fit(X_mm[:250], y_mm[:250], classes=[-1, 1], n_total=1000)
    reference = pickle.loads(pickle.dumps(model)).partial_fit(X_mm[250:500], y_mm[250:500])
    state = model.__getstate__()
    del state["kernel_prior"], state["kernel_prior_"]
    del state["_fitted_structure"]["kernel_prior"]
    old = GPClassifier.__new__(GPClassifier)
    old.__setstate__(state)
    assert old.kernel_prior is None and old.kernel_prior_ is None
    old.partial_fit(X_mm[250:500], y_mm[250:500])
    np.testing.assert_array_equal(old.predict_proba(X[:50]), reference.predict_proba(X[:50]))


@pytest.mark.parametrize("kind", ["binary", "ordinal", "multiclass"])
def test_a_stream_pickled_before_its_engine_held_a_likelihood_continues(kind):
    """A stream model pickled between calls by an agpc whose engines took the likelihood from the kernel's type
    (no ``likelihood`` on the engine) continues with that likelihood: the stream it would have been."""
    import pickle

    X, y = make_banana(300, random_state=0)
    if kind != "binary":
        y = np.digitize(X[:, 0], np.quantile(X[:, 0], [1 / 3, 2 / 3]))
    params = dict(method="sep", n_inducing=5, random_state=0, likelihood="ordinal" if kind == "ordinal" else None)
    model = GPClassifier(**params).partial_fit(X[:150], y[:150], classes=np.unique(y), n_total=300)
    reference = pickle.loads(pickle.dumps(model)).partial_fit(X[150:], y[150:])
    old = pickle.loads(pickle.dumps(model))
    # (as an older agpc pickled its engine: nor had it the flag that a stream moves Z at every call, which it did)
    for name in ("likelihood", "likelihood_option", "holds_inducing"):
        del old._trainer.engine.__dict__[name]
    old = pickle.loads(pickle.dumps(old))
    old.partial_fit(X[150:], y[150:])
    np.testing.assert_array_equal(old.predict_proba(X[:50]), reference.predict_proba(X[:50]))


@pytest.mark.parametrize("method, n_classes", [("sep", 2), ("adf", 2), ("sep", 3)])
def test_a_batch_no_step_can_take_is_one_value_error_and_leaves_the_stream_as_it_was(method, n_classes, tmp_path):
    """A hostile-input audit (2026-12-02): one batch of rows 1e200 times the stream's scale stepped the lengthscales
    to NaN and raised a CholeskyError; every good batch after it raised the same, and the rows of the failed batch
    stayed counted (a saved model kept them). Now one ValueError saying the model was left as it was, and the stream
    goes on as if the batch had never come: the same model, rows and history as a stream that never saw it."""
    import pickle
    import warnings

    from agpc import load_model, save_model

    X, y = make_banana(200, random_state=0)
    labels = y if n_classes == 2 else np.arange(200) % 3
    stream = GPClassifier(method=method, n_inducing=8, random_state=0)
    stream.partial_fit(X[:50], labels[:50], classes=np.unique(labels))
    untouched = pickle.loads(pickle.dumps(stream))
    with warnings.catch_warnings():  # (NumPy's overflow warnings on such rows are not what is tested here)
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ValueError, match="partial_fit could not take a step on these 50 rows and left the model as "
                                             "it was before this call") as info:
            stream.partial_fit(X[50:100] * 1e200, labels[50:100])
    assert info.value.__cause__ is not None
    for model in (stream, untouched):
        model.partial_fit(X[100:150], labels[100:150])
    np.testing.assert_allclose(stream.predict_proba(X), untouched.predict_proba(X), rtol=1e-12, atol=1e-14)
    assert stream.n_samples_fit_ == untouched.n_samples_fit_ == 100
    assert stream.history_ == untouched.history_ | {"time": stream.history_["time"]}
    save_model(stream, tmp_path / "stream.agpc")
    assert load_model(tmp_path / "stream.agpc").n_samples_fit_ == 100


def test_a_first_batch_that_fails_leaves_the_estimator_unfitted(monkeypatch):
    """The first call builds the stream; where its step fails, the estimator is as it was before: not fitted."""
    from sklearn.exceptions import NotFittedError

    from agpc.inference import training

    X, y = make_banana(60, random_state=0)

    def failing(self, *args, **kwargs):
        raise FloatingPointError("a step that failed")

    monkeypatch.setattr(training.Trainer, "step_until_taken", failing)
    stream = GPClassifier(method="sep", n_inducing=8, random_state=0)
    with pytest.raises(ValueError, match="FloatingPointError: a step that failed"):
        stream.partial_fit(X, y, classes=[-1, 1])
    assert not hasattr(stream, "_trainer") and not hasattr(stream, "classes_")
    with pytest.raises(NotFittedError):
        stream.predict(X)


@pytest.mark.parametrize("raises_jitter", [False, True], ids=["halvings", "jitter raised"])
def test_a_batch_the_guard_gave_up_on_leaves_its_halvings_and_counts_behind(monkeypatch, raises_jitter):
    """Where the guard reverted and halved the damping and step sizes (or raised the jitter) before giving up on a
    batch (a FloatingPointError after ``training.MAX_FAILURES`` failed steps), none of it stays: the next batch steps
    as in a stream that never saw the failed one, with the same damping, jitter, history and guard counts."""
    import pickle

    from agpc.inference import training

    X, y = make_banana(200, random_state=0)
    stream = GPClassifier(method="sep", n_inducing=8, random_state=0)
    for lo in (0, 50):  # (two batches: the guard has a good step to go back to)
        stream.partial_fit(X[lo:lo + 50], y[lo:lo + 50], classes=[-1, 1])
    untouched = pickle.loads(pickle.dumps(stream))
    host_scalars = training._host_scalars
    monkeypatch.setattr(training, "_host_scalars", lambda summary: [float("nan")] + list(host_scalars(summary))[1:])
    if raises_jitter:  # (each failure raises the jitter tenfold: JitterWarnings are not what is tested here)
        monkeypatch.setattr(training, "_jitter_needed", lambda kernel, Z, jitter: 10.0 * jitter)
    with pytest.raises(ValueError, match="FloatingPointError: sep diverged"):
        stream.partial_fit(X[100:150], y[100:150])
    monkeypatch.undo()
    for model in (stream, untouched):
        model.partial_fit(X[150:200], y[150:200])
    np.testing.assert_allclose(stream.predict_proba(X), untouched.predict_proba(X), rtol=1e-12, atol=1e-14)
    assert stream.history_ == untouched.history_ | {"time": stream.history_["time"]}
    assert stream.jitter_ == untouched.jitter_


@pytest.mark.parametrize("method", ["ep", "svi", "gfitc"])
def test_partial_fit_of_a_method_without_a_stream_says_which_methods_have_one(method):
    """A hostile-input audit (2026-12-02): scikit-learn's "has no attribute 'partial_fit'" named no method. It stays
    the AttributeError (``hasattr`` False, as scikit-learn's tools ask), raised from one that names them."""
    model = GPClassifier(method=method)
    assert not hasattr(model, "partial_fit")
    with pytest.raises(AttributeError) as info:
        model.partial_fit(np.zeros((4, 2)), [0, 1, 0, 1])
    assert str(info.value.__cause__) == (f"partial_fit learns from a stream with method 'sep' or 'adf': "
                                         f"method={method!r} trains by fit")


def test_a_first_batch_smaller_than_the_default_inducing_points_says_what_the_stream_gets():
    """A hostile-input audit (2026-12-02): a stream whose first batch had 32 rows kept 32 inducing points for good,
    silently, where the documentation says a stream takes 100. Now one warning from the caller's line; n_inducing
    set, or a first batch of at least 100 rows, says nothing."""
    import warnings

    X, y = make_banana(300, random_state=0)
    with pytest.warns(UserWarning, match="first batch has 32 rows, so its model has 32 inducing points") as caught:
        stream = GPClassifier(method="sep", random_state=0).partial_fit(X[:32], y[:32], classes=[-1, 1])
    assert stream.inducing_points_.shape == (32, 2) and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPClassifier(method="sep", random_state=0).partial_fit(X[:100], y[:100], classes=[-1, 1])
        GPClassifier(method="sep", n_inducing=20, random_state=0).partial_fit(X[:32], y[:32], classes=[-1, 1])
        stream.partial_fit(X[32:40], y[32:40])  # (a later small batch: the points were set by the first)


@pytest.mark.parametrize("method", ["sep", "adf"])
@pytest.mark.parametrize("classes", [2, 3])
def test_a_streams_first_batch_is_about_as_sure_as_a_fit_of_its_rows(method, classes):
    """The hostile-input audit of 2026-12-04: a fresh stream's step took each row's site against the prior, as if each
    row were alone, and with the multiclass likelihood's sharp sites a first batch of 50 rows was sure of everything
    (test NLL 2.16, 68% of the rows at p > 0.999, a tenth of them wrong; the batch fit of those rows: 0.54). A batch
    that is most of what a stream stands for now first takes a batch fit's warm-up passes
    (``streaming.SETTLE_SHARE``): at fixed hyper-parameters its model is near the batch fit's."""
    X, y = make_banana(2050, random_state=0)
    y = y.copy()
    if classes == 3:
        y[:2] = 2  # (a third class of two rows in the first batch)
    X_test, y_test = X[50:], y[50:]
    options = dict(method=method, n_inducing=10, random_state=0, optimize=False)
    stream = GPClassifier(**options).partial_fit(X[:50], y[:50])
    fitted = GPClassifier(**options).fit(X[:50], y[:50])

    def nll(model):
        p = np.asarray(model.predict_proba(X_test))
        return -np.mean(np.log(p[np.arange(len(y_test)), np.searchsorted(model.classes_, y_test)]))

    p = np.asarray(stream.predict_proba(X_test))
    sure_and_wrong = (p.max(axis=1) > 0.999) & (stream.classes_[p.argmax(axis=1)] != y_test)
    assert np.mean(sure_and_wrong) < 0.005
    assert nll(stream) < nll(fitted) + 0.25
