"""early_stopping: a fit of minibatch size holds out a share of its rows and stops when their NLL stops improving
(scikit-learn's HistGradientBoosting convention; docs/small_data_defaults.md, "Early stopping on held-out rows"). The
split is the documented one (``labels.holdout_mask``), the fit on the rest is exactly the fit the user would
write by hand, and every kind of input keeps what it had (names, namespace, device)."""

import pickle
import warnings

import array_api_strict
import numpy as np
import pandas as pd
import pytest

from agpc import GPClassifier, checkpoints
from agpc.backend import GuardWarning
from agpc.datasets import make_banana
from agpc.inputs import EARLY_STOPPING_PATIENCE, HOLDOUT_SEED
from agpc.labels import holdout_mask
from conftest import to_np
from helpers import interrupted_then_resumed

# 22,300 rows: 2,230 held out leave 20,070, above batch_size="auto"'s 20,000-row full batch: minibatches
N_ROWS = 22_300
SMALL = dict(n_inducing=6, max_iter=2, random_state=0, early_stopping="auto")


@pytest.fixture(autouse=True)
def binary_rows_take_minibatches_too(monkeypatch):
    """Binary EP in memory takes the full batch up to ``BINARY_BATCH_MAX_ROWS`` (200,000) rows, every other fit up
    to 20,000: the bound set to 20,000 here, so that the binary banana rows take minibatches, as every other kind
    of fit of that size does (tests/test_batch_size.py: as it is)."""
    from agpc import batch_size

    monkeypatch.setattr(batch_size, "BINARY_BATCH_MAX_ROWS", batch_size.FULL_BATCH_MAX_ROWS)


@pytest.fixture(scope="module")
def rows():
    X, y = make_banana(N_ROWS, random_state=0)
    return X, y


def _by_hand(X, y, seed, fraction=0.1, sample_weight=None, **params):
    """The fit a user would write: the rows of ``holdout_mask`` held out as validation data, early stopping on them."""
    val = holdout_mask(y, fraction, seed)
    weights = None if sample_weight is None else sample_weight[~val]
    params = dict(params, early_stopping=False)
    return GPClassifier(n_iter_no_change=EARLY_STOPPING_PATIENCE, **params).fit(
        X[~val], y[~val], sample_weight=weights, validation_data=(X[val], y[val]))


def test_auto_holds_out_a_tenth_of_a_minibatch_fit_and_is_the_fit_by_hand(rows):
    X, y = rows
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=N_ROWS)
    auto = GPClassifier(**SMALL).fit(X, y, sample_weight=w)
    assert auto.early_stopping_ and auto.n_samples_fit_ == N_ROWS - 2230
    assert len(auto.history_["validation_nll"]) == len(auto.history_["log_marginal_likelihood"])
    by_hand = _by_hand(X, y, 0, sample_weight=w, **SMALL)
    np.testing.assert_array_equal(auto.predict_proba(X[:500]), by_hand.predict_proba(X[:500]))
    assert auto.history_["validation_nll"] == by_hand.history_["validation_nll"]


def test_the_split_without_a_seed_is_the_same_every_time(rows, monkeypatch):
    """random_state=None holds out the rows of ``HOLDOUT_SEED`` on every fit (two fits that differ in a parameter are
    scored on the same rows); an int draws them from itself."""
    from agpc import labels

    X, y = rows
    seeds, split = [], labels.holdout_mask
    monkeypatch.setattr(labels, "holdout_mask", lambda y, fraction, seed, **kw: seeds.append(seed) or split(
        y, fraction, seed, **kw))
    for random_state in (None, None, 7):
        GPClassifier(n_inducing=6, max_iter=1, random_state=random_state, early_stopping="auto").fit(X, y)
    assert seeds == [HOLDOUT_SEED, HOLDOUT_SEED, 7]


@pytest.mark.parametrize("early_stopping, validation", [("auto", False), (False, False), ("auto", True)])
def test_no_rows_are_held_out_below_minibatch_size_when_off_or_with_validation_data(early_stopping, validation):
    """A batch fit (20,000 rows or fewer left), early_stopping=False, or the user's own validation data: the fit is
    the one on all the rows, to the bit."""
    X, y = make_banana(400, random_state=2)
    given = (X[:50], y[:50]) if validation else None
    fitted = GPClassifier(**dict(SMALL, early_stopping=early_stopping)).fit(X, y, validation_data=given)
    plain = GPClassifier(**dict(SMALL, early_stopping=False)).fit(X, y, validation_data=given)
    assert not fitted.early_stopping_ and fitted.n_samples_fit_ == 400
    np.testing.assert_array_equal(fitted.predict_proba(X), plain.predict_proba(X))


def test_true_holds_out_at_any_size_and_stops_on_the_held_out_nll():
    X, y = make_banana(600, random_state=3)
    model = GPClassifier(early_stopping=True, validation_fraction=0.25, n_inducing=8, max_iter=200,
                         random_state=0).fit(X, y)
    assert not GPClassifier(n_inducing=8, max_iter=2).fit(X, y).early_stopping_  # (the default: none held out)
    assert model.early_stopping_ and model.n_samples_fit_ == 450
    assert model.stop_reason_ in ("early_stopping", "plateau")
    by_hand = _by_hand(X, y, 0, fraction=0.25, n_inducing=8, max_iter=200, random_state=0)
    np.testing.assert_array_equal(model.predict_proba(X), by_hand.predict_proba(X))


def test_a_dataframe_keeps_its_column_names_and_labels_their_kind(rows):
    X, y = rows
    frame = pd.DataFrame(X, columns=["width", "height"])
    labels = pd.Series(np.where(y == 1, "yes", "no"))
    model = GPClassifier(**SMALL).fit(frame, labels)
    assert model.early_stopping_ and list(model.feature_names_in_) == ["width", "height"]
    assert list(model.classes_) == ["no", "yes"]
    by_hand = _by_hand(X, np.where(y == 1, "yes", "no"), 0, **SMALL)
    np.testing.assert_array_equal(model.predict_proba(frame.iloc[:300]), by_hand.predict_proba(X[:300]))


@pytest.mark.parametrize("device", [None, array_api_strict.Device("device1")], ids=["default", "device1"])
def test_array_api_rows_are_held_out_in_their_namespace_and_device(rows, device):
    X, y = rows
    xp = array_api_strict
    Xs = xp.asarray(X, device=device) if device is not None else xp.asarray(X)
    ys = xp.asarray(y.astype(np.float64), device=device) if device is not None else xp.asarray(y.astype(np.float64))
    model = GPClassifier(n_inducing=6, max_iter=1, random_state=0, early_stopping="auto").fit(Xs, ys)
    assert model.early_stopping_ and model.n_samples_fit_ == N_ROWS - 2230
    proba = model.predict_proba(Xs[:100, ...])
    assert proba.device == Xs.device
    by_hand = _by_hand(X, y.astype(np.float64), 0, n_inducing=6, max_iter=1, random_state=0)
    np.testing.assert_allclose(to_np(proba), by_hand.predict_proba(X[:100]), rtol=1e-9, atol=1e-12)


def test_data_on_disk_is_not_held_out_by_auto_and_refused_by_true(rows, tmp_path):
    X, y = rows
    path = tmp_path / "X.npy"
    np.save(path, X)
    on_disk = np.load(path, mmap_mode="r")
    model = GPClassifier(n_inducing=6, max_iter=1, random_state=0, early_stopping="auto").fit(on_disk, y)
    assert not model.early_stopping_ and model.n_samples_fit_ == N_ROWS
    with pytest.raises(ValueError, match="early_stopping=True holds out rows of X in memory"):
        GPClassifier(**dict(SMALL, early_stopping=True)).fit(on_disk, y)


@pytest.mark.parametrize("value, problem", [(0.0, "validation_fraction"), (1.0, "validation_fraction"),
                                            ("yes", "early_stopping")])
def test_bad_settings_are_one_error_naming_them(value, problem):
    X, y = make_banana(100, random_state=0)
    with pytest.raises(ValueError, match=problem):
        GPClassifier(**{problem: value}).fit(X, y)


def test_a_fraction_that_leaves_a_class_no_training_row_keeps_one():
    X, y = make_banana(40, random_state=0)
    y = y.copy()
    y[:2] = 2  # a third class of two rows
    val = holdout_mask(y, 0.5, 0)
    assert np.all(np.isin([-1, 1, 2], y[~val]))
    with pytest.raises(ValueError, match="validation_fraction=0.01 holds out no row of the 40 for validation"):
        holdout_mask(y, 0.01, 0)
    # (a hostile-input audit, 2026-12-02: 0.999 of 40 "left 40 of 40 rows for validation", not saying none trains)
    with pytest.raises(ValueError, match="validation_fraction=0.999 holds out all 40 rows for validation, none left "
                                         "for training; give a smaller fraction"):
        holdout_mask(y, 0.999, 0)


def test_the_model_file_and_an_older_pickle_say_what_was_held_out(rows, tmp_path):
    X, y = rows
    model = GPClassifier(**SMALL).fit(X, y)
    model.save(tmp_path / "m.agpc")
    loaded = GPClassifier.load(tmp_path / "m.agpc")
    assert loaded.early_stopping_ is True and loaded.early_stopping == "auto"
    plain = GPClassifier(n_inducing=6, max_iter=1, random_state=0).fit(X[:300], y[:300])
    plain.save(tmp_path / "plain.agpc")
    assert GPClassifier.load(tmp_path / "plain.agpc").early_stopping_ is False
    state = pickle.loads(pickle.dumps(model)).__getstate__()
    for name in ("early_stopping", "validation_fraction", "early_stopping_"):
        state.pop(name)
    older = GPClassifier.__new__(GPClassifier)
    older.__setstate__(state)  # (an estimator pickled before early_stopping: trained on all its rows)
    assert older.get_params()["early_stopping"] is False and older.early_stopping_ is False
    assert older.get_params()["validation_fraction"] == 0.1


def test_a_resumed_fit_holds_out_the_same_rows_and_ends_at_the_same_model(rows, tmp_path, monkeypatch):
    X, y = rows
    params = dict(n_inducing=6, max_iter=2, batch_size=2000, random_state=0, early_stopping="auto")
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "ckpt", 6, X, y)
    assert reference.early_stopping_ and resumed.early_stopping_
    np.testing.assert_array_equal(resumed.predict_proba(X[:300]), reference.predict_proba(X[:300]))


def test_numpy_booleans_scalar_weights_categorical_and_column_labels_are_taken_as_given():
    """NumPy's False is off (a ParameterGrid's values are NumPy's); a scalar sample_weight weights every row; a pandas
    Categorical of labels is in memory (not data on disk); a column of labels is held out as a 1-D one."""
    X, y = make_banana(600, random_state=4)
    params = dict(n_inducing=6, max_iter=2, random_state=0)
    assert not GPClassifier(early_stopping=np.False_, **params).fit(X, y).early_stopping_
    assert GPClassifier(early_stopping=np.True_, **params).fit(X, y, sample_weight=2.0).n_samples_fit_ == 540
    assert GPClassifier(early_stopping=True, **params).fit(X, pd.Categorical(y)).early_stopping_
    with pytest.warns(UserWarning, match="column-vector y"):
        assert GPClassifier(early_stopping=True, **params).fit(X, y[:, None]).n_samples_fit_ == 540


def test_a_class_keeps_a_training_row_of_positive_weight():
    """A class whose only rows of positive weight were drawn for validation gets one back: the weighted fit that
    works without a hold-out works with it (the held-out NLL is unweighted, as validation_data's)."""
    X, y = make_banana(40, random_state=0)
    y = y.copy()
    y[:3] = 2
    w = np.ones(40)
    w[1:3] = 0.0  # class 2's one row of positive weight is row 0
    for seed in range(20):
        val = holdout_mask(y, 0.5, seed, weights=w)
        assert np.any((y == 2) & ~val & (w > 0))
    GPClassifier(early_stopping=True, validation_fraction=0.5, n_inducing=4, max_iter=2,
                 random_state=5).fit(X, y, sample_weight=w)


def test_auto_trains_on_every_row_where_none_can_be_held_out():
    """A tiny fit in minibatches: "auto" leaves its rows alone where the fraction holds out none (True refuses)."""
    X, y = make_banana(4, random_state=0)
    y = np.array([0, 1, 0, 1])
    params = dict(method="sep", batch_size=2, n_inducing=2, max_iter=1, random_state=0)
    assert not GPClassifier(early_stopping="auto", **params).fit(X, y).early_stopping_
    with pytest.raises(ValueError, match="validation_fraction=0.1 holds out no row of the 4 for validation"):
        GPClassifier(early_stopping=True, **params).fit(X, y)


def test_a_refused_refit_leaves_the_fitted_record_as_it_was(rows):
    """early_stopping_ is written with the fit's other attributes: a refit refused half-way leaves the model's."""
    X, y = make_banana(300, random_state=0)
    model = GPClassifier(n_inducing=6, max_iter=2, random_state=0).fit(X, y)
    model.set_params(early_stopping=True, class_weight={7: 2.0})
    with pytest.raises(ValueError):
        model.fit(X, y)
    assert model.early_stopping_ is False and model.n_samples_fit_ == 300


@pytest.mark.parametrize("kind", ["binary", "multiclass", "ordinal"])
def test_validation_rows_far_beyond_the_kernels_reach_score_as_the_prior_without_warnings(kind):
    """A hostile-input audit (2026-12-02): validation rows of finite values near 1e300 overflowed their squared
    distances to the inducing points, with NumPy's RuntimeWarnings on every validation step, where prediction
    clamps such rows to the kernel's reach (``kernels.within_reach``) and is silent. Validation scores them as
    prediction does: the kernel is 0 there, the latent is the prior's, and the NLL is log(classes)."""
    X, y = make_banana(300, random_state=0)
    labels = y if kind == "binary" else np.arange(300) % 3
    extra = {"likelihood": "ordinal"} if kind == "ordinal" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model = GPClassifier(max_iter=3, n_inducing=10, random_state=0, **extra).fit(
            X, labels, validation_data=(X[:50] * 1e300, labels[:50]))
    nll = np.asarray(model.history_["validation_nll"])
    assert nll.size and np.all(np.isfinite(nll))
    if kind != "ordinal":  # (the ordinal model's cut points make its prior's class probabilities unequal)
        np.testing.assert_allclose(nll, np.log(len(np.unique(labels))), rtol=1e-12)


def test_a_fit_resumed_after_its_best_evaluation_goes_back_to_it(tmp_path, monkeypatch):
    """Early stopping's best state is in the checkpoint (``Run.kept``): batch EP on 1,000 banana rows, its best held-out
    NLL at the 29th evaluation and its stop at the 34th (patience 5); interrupted after 33 steps (its checkpoint at the
    32nd), the resumed fit puts back the 29th state as the uninterrupted one does. (Found 2026-12-04: it returned
    its last state, probabilities up to 0.036 from the uninterrupted fit's, with no word.)"""
    X, y = make_banana(1000, random_state=0)
    params = dict(n_inducing=30, max_iter=200, random_state=0, early_stopping=True, n_iter_no_change=5, plateau=None)
    reference, resumed = interrupted_then_resumed(monkeypatch, params, tmp_path / "ckpt", 33, X, y)
    saved = checkpoints.load_checkpoint(tmp_path / "ckpt", np.asarray)
    assert saved["n_steps"] == 32 and saved["kept"]["validation"]["at"] == 29
    assert reference.stop_reason_ == resumed.stop_reason_ == "early_stopping" and reference.n_iter_ == 34
    np.testing.assert_array_equal(resumed.predict_proba(X), reference.predict_proba(X))


@pytest.mark.parametrize("method", ["ep", "sep"])
def test_a_step_that_leaves_no_model_is_not_scored_and_the_guard_handles_it(method):
    """Batch EP / SEP with Adam at learning_rate=1e3 and validation data: a step takes the kernel out of the floats
    (Kmm of NaN), and the validation hook scored that state at once, a CholeskyError out of ``fit`` where the same fit
    without validation data went on, its guard putting the state before the step back and saying so. The state is
    not scored now: the fit ends as the guard leaves it, every recorded validation NLL finite."""
    X, y = make_banana(600, random_state=0)
    with pytest.warns(GuardWarning, match=f"{method}: the training guard did not take"):
        model = GPClassifier(method=method, n_inducing=10, max_iter=30, random_state=0, optimizer="adam",
                             learning_rate=1e3).fit(X, y, validation_data=(X[:100], y[:100]))
    scores = model.history_["validation_nll"]
    assert scores and np.all(np.isfinite(scores))
    assert len(scores) < len(model.history_["log_marginal_likelihood"])  # (the states that were no model: unscored)
    assert np.all(np.isfinite(model.predict_proba(X[:50])))


@pytest.mark.parametrize("weights, problem", [(np.ones(399), r"one weight a row, shape \(400,\); got shape \(399,\)"),
                                              (np.ones((400, 2)), r"one weight a row, shape \(400,\); got shape \(400, 2\)"),
                                              (np.array(["a"] * 400), "sample_weight must be numbers")])
def test_bad_sample_weights_are_the_fits_own_error_with_early_stopping(weights, problem):
    """The rows held out for early stopping are split by the weights, which were read before the fit checked them:
    weights of another length or shape raised an IndexError from the split's mask, text NumPy's UFuncTypeError
    (this stop's audit). Now the fit's own ValueError, as without early stopping."""
    X, y = make_banana(400, random_state=0)
    for early_stopping in (True, False):
        with pytest.raises(ValueError, match=problem):
            GPClassifier(early_stopping=early_stopping, n_inducing=5, max_iter=2).fit(X, y, sample_weight=weights)
