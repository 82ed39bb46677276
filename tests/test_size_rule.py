"""``n_inducing="auto"`` (the default) sizes the model by the data (``agpc.size_rule``, docs/small_data_defaults.md):
the rule itself, and one tiny fit per branch of it."""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from agpc import GPClassifier, size_rule
from agpc.datasets import make_banana
from agpc.inference import ep, hooks, multiclass_ep
from agpc.size_rule import ALL_MAX_ROWS, EXACT_MAX_ROWS, SPARSE_INDUCING, ModelSize, model_size
from conftest import to_np

ROOT = Path(__file__).resolve().parent.parent


def _data(n=40, seed=0, classes=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    score = X[:, 0] + np.sin(2 * X[:, 1])
    y = (score > 0).astype(int) if classes == 2 else np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))
    return X, y


@pytest.mark.parametrize("n_inducing,n_rows,exact,known,expected,classes", [
    ("auto", EXACT_MAX_ROWS, True, True, ModelSize(EXACT_MAX_ROWS, True), 2),  # up to the threshold: the exact model
    ("auto", 60, True, True, ModelSize(60, True), 2),
    ("auto", EXACT_MAX_ROWS + 1, True, True, ModelSize(SPARSE_INDUCING, False), 2),  # above it: the sparse model
    ("auto", 300, False, True, ModelSize(SPARSE_INDUCING, False), 2),  # no full-GP pass: sparse at every size
    ("auto", 50, False, True, ModelSize(50, False), 2),  # (never more inducing points than rows)
    ("auto", 2_000_000, True, True, ModelSize(SPARSE_INDUCING, False), 2),  # airline: as before the rule
    ("auto", 300, True, False, ModelSize(SPARSE_INDUCING, False), 2),  # a stream or a dask array
    ("auto", 150, True, True, ModelSize(SPARSE_INDUCING, False), 3),  # more than two classes: sparse
    ("all", 900, False, True, ModelSize(900, True), 2),
    (7, 300, True, True, ModelSize(7, False), 2),  # an integer: as before the rule
])
def test_the_rule(n_inducing, n_rows, exact, known, expected, classes):
    assert model_size(n_inducing, n_rows, has_exact_pass=exact, rows_known=known, n_classes=classes) == expected


def test_all_is_refused_where_there_are_no_rows_to_put_points_at():
    with pytest.raises(ValueError, match="needs the rows whole"):
        model_size("all", 100, has_exact_pass=True, rows_known=False)
    with pytest.raises(ValueError, match=f"more than {ALL_MAX_ROWS}"):
        model_size("all", ALL_MAX_ROWS + 1, has_exact_pass=True)


def test_small_binary_ep_is_the_exact_model_by_its_full_gp_pass(monkeypatch):
    """Nothing set, a few rows: the inducing points are the rows, held there; the kernel is learned; and the steps
    run on ``exact_ep`` (inducing-point EP's pass is never called, except where it is asked for by an integer)."""
    X, y = _data()

    def refuse(*args, **kwargs):
        raise AssertionError("the exact model trains on agpc.inference.exact_ep")

    monkeypatch.setattr(ep, "evaluate", refuse)
    model = GPClassifier(max_iter=5, random_state=0).fit(X, y)  # every stage of ard="auto" on exact_ep
    np.testing.assert_array_equal(to_np(model.inducing_points_), X)
    assert model.predict_proba(X).shape == (40, 2)
    per_feature = GPClassifier(max_iter=5, random_state=0, ard=True).fit(X, y)  # the RBF alone
    start = GPClassifier._default_kernel(X)
    assert not np.allclose(to_np(per_feature.kernel_.params["log_lengthscales"]),
                           to_np(start.params["log_lengthscales"]))
    with pytest.raises(AssertionError, match="exact_ep"):
        GPClassifier(n_inducing=10, max_iter=5, random_state=0).fit(X, y)


def test_the_exact_model_stops_on_its_plateau():
    """Nothing set, a few rows: the exact model's training stops at the first step where its log Z has risen by less
    than ``exact_plateau``'s rise over its window of steps (never before), well before max_iter; with plateau=None a
    model runs its max_iter steps."""
    X, y = _data(80)
    model = GPClassifier(random_state=0).fit(X, y)
    history = np.asarray(model.history_["log_marginal_likelihood"])
    steps, rise = size_rule.exact_plateau(80)
    warmup = 10
    assert warmup + steps < model.n_iter_ < warmup + model.max_iter
    rises = history[steps:] - history[:-steps]  # rises[i]: over the window that ends at step i + steps + 1
    assert rises[-1] < rise
    assert np.all(rises[warmup:-1] >= rise)
    sparse = GPClassifier(n_inducing=10, max_iter=model.n_iter_, random_state=0, plateau=None).fit(X, y)
    assert sparse.n_iter_ == warmup + model.n_iter_ and sparse.stop_reason_ == "max_iter"


@pytest.mark.parametrize("minibatch, at_rows, rows, expected", [
    (False, True, 500, (size_rule.PLATEAU_STEPS, size_rule.PLATEAU_RISE_PER_ROW * 500)),
    (False, False, 500, (size_rule.SPARSE_PLATEAU_STEPS, size_rule.SPARSE_PLATEAU_RISE_PER_ROW * 500)),
    (False, False, 20_000, (size_rule.SPARSE_PLATEAU_STEPS, size_rule.SPARSE_PLATEAU_RISE_PER_ROW * 20_000)),
    (False, False, 20_001, (size_rule.LARGE_BATCH_PLATEAU_STEPS, size_rule.SPARSE_PLATEAU_RISE_PER_ROW * 20_001)),
    (True, False, 500, (size_rule.MINIBATCH_PLATEAU_EPOCHS, size_rule.MINIBATCH_PLATEAU_RISE_PER_ROW * 500)),
    (True, False, 50_000, (size_rule.MINIBATCH_PLATEAU_EPOCHS, size_rule.MINIBATCH_PLATEAU_RISE_PER_ROW * 50_000)),
])
def test_fit_plateau_is_the_rule_of_each_kind_of_fit(minibatch, at_rows, rows, expected):
    """Batch fits past batch_size="auto"'s 20,000-row full batch (binary EP's, up to 200,000 rows) stop on a
    window of ``LARGE_BATCH_PLATEAU_STEPS`` steps (20), the others as they did."""
    assert size_rule.LARGE_BATCH_PLATEAU_STEPS == 20 and size_rule.SPARSE_PLATEAU_STEPS == 5
    assert size_rule.fit_plateau("auto", rows, at_rows, minibatch=minibatch) == pytest.approx(expected)
    assert size_rule.fit_plateau(None, rows, at_rows, minibatch=minibatch) is None


def _first_window_below(history, steps, rise, skip, drops=False):
    """The index of the first record (after ``skip`` records) whose window of ``steps`` records rose by less
    than ``rise``; with ``drops`` (batch mode, ``hooks.Plateau``): and whose last record is within ``rise`` of the
    window's best, or that comes ``drop_patience`` windows after the best record."""
    h = np.asarray(history)
    for k in range(skip + steps, len(h)):
        window = h[k - steps:k + 1]
        if drops and k - np.argmax(h[skip:k + 1]) - skip >= hooks.Plateau.drop_patience * steps:
            return k
        if h[k] - h[k - steps] < rise and not (drops and window.max() - h[k] > rise):
            return k
    return None


@pytest.mark.parametrize("batch_size", [None, 60], ids=["batch steps", "minibatch epochs"])
def test_the_sparse_default_stops_on_its_plateau(monkeypatch, batch_size):
    """Nothing set but the model's size: a sparse model's training stops at the first record (a batch step after
    the warm-up, or an epoch) where log Z has risen by less than ``fit_plateau``'s rise over its window (the rule's
    constants made small enough for a test of seconds), and not before; the reason is ``plateau``."""
    monkeypatch.setattr(size_rule, "SPARSE_PLATEAU_STEPS", 4)
    monkeypatch.setattr(size_rule, "SPARSE_PLATEAU_RISE_PER_ROW", 2e-3)
    monkeypatch.setattr(size_rule, "MINIBATCH_PLATEAU_EPOCHS", 3)
    monkeypatch.setattr(size_rule, "MINIBATCH_PLATEAU_RISE_PER_ROW", 2e-3)
    X, y = _data(300)
    model = GPClassifier(n_inducing=10, batch_size=batch_size, max_iter=200, random_state=0).fit(X, y)
    history = model.history_["log_marginal_likelihood"]
    steps, rise = size_rule.fit_plateau("auto", 300, False, minibatch=batch_size is not None)
    assert model.stop_reason_ == "plateau" and len(history) < model.n_warmup_ + 200
    assert _first_window_below(history, steps, rise, model.n_warmup_, drops=batch_size is None) == len(history) - 1
    full = GPClassifier(n_inducing=10, batch_size=batch_size, max_iter=len(history) - model.n_warmup_,
                        random_state=0, plateau=None).fit(X, y)
    np.testing.assert_allclose(full.predict_proba(X), model.predict_proba(X), rtol=1e-10)  # (the same run, cut there)


def test_above_the_threshold_and_without_a_full_gp_pass_the_model_is_sparse(monkeypatch):
    monkeypatch.setattr(size_rule, "EXACT_MAX_ROWS", 30)
    monkeypatch.setattr(size_rule, "SPARSE_INDUCING", 8)
    X, y = _data()
    model = GPClassifier(max_iter=3, random_state=0).fit(X, y)
    assert model.inducing_points_.shape == (8, 3)
    monkeypatch.setattr(size_rule, "EXACT_MAX_ROWS", 100)
    for method in ("sep", "svi"):  # no full-GP pass: sparse whatever the size
        assert GPClassifier(method=method, max_iter=3, random_state=0).fit(X, y).inducing_points_.shape == (8, 3)
    assert GPClassifier(batch_size=10, max_iter=1, random_state=0).fit(X, y).inducing_points_.shape == (8, 3)
    X3, y3 = _data(45, classes=3)  # more than two classes: sparse
    assert GPClassifier(max_iter=2, random_state=0).fit(X3, y3).inducing_points_.shape == (3, 8, 3)


def test_multiclass_all_is_the_exact_model_by_the_full_gp_pass(monkeypatch):
    """Three classes, n_inducing="all": every class's inducing points are the rows, trained on exact_ep."""
    def refuse(*args, **kwargs):
        raise AssertionError("the exact model trains on agpc.inference.exact_ep")

    monkeypatch.setattr(multiclass_ep, "evaluate", refuse)
    X3, y3 = _data(45, classes=3)
    model = GPClassifier(n_inducing="all", max_iter=3, random_state=0).fit(X3, y3)
    Z = to_np(model.inducing_points_)
    assert Z.shape == (3, 45, 3) and all(np.array_equal(Z[c], X3) for c in range(3))
    assert model.predict_proba(X3).shape == (45, 3)


def test_all_puts_the_points_at_the_rows_for_every_method():
    X, y = _data(30)
    model = GPClassifier(method="sep", n_inducing="all", max_iter=3, random_state=0).fit(X, y)
    np.testing.assert_array_equal(to_np(model.inducing_points_), X)  # held there: not learned
    with pytest.raises(ValueError, match="needs the rows whole"):
        GPClassifier(method="sep", n_inducing="all").partial_fit(X, y)


def test_a_sparse_checkpoint_does_not_resume_as_the_exact_model(tmp_path):
    """A sparse fit with an inducing point a row (an integer n_inducing = n, the points held) matches the exact model's
    run in every other field of the fingerprint; its Z is k-means' order of the rows, not the rows', and the full-GP
    passes would pair row i with another row's point. The fingerprint names the passes: the resume is refused."""
    X, y = _data(40)
    path = tmp_path / "sparse.ckpt"
    settings = dict(optimize=("kernel",), max_iter=2, random_state=0, checkpoint_path=path, checkpoint_every=1)
    GPClassifier(n_inducing=40, **settings).fit(X, y)
    with pytest.raises(ValueError, match=r"the exact model \(n_inducing\): False there, True here"):
        GPClassifier(n_inducing="auto", **{**settings, "max_iter": 4}).fit(X, y, resume=True)
    GPClassifier(n_inducing=40, **{**settings, "max_iter": 4}).fit(X, y, resume=True)  # its own run goes on


def test_all_holds_the_points_at_the_rows_in_local_worker_processes():
    """n_jobs=2 trains the model n_jobs=1 would: with n_inducing='all' the points are the rows, held there (the
    workers' rounds do not learn them, and no k-means places n centres)."""
    X, y = _data(60)
    model = GPClassifier(method="sep", n_inducing="all", batch_size=20, n_jobs=2, max_iter=1, random_state=0)
    model.fit(X, y)
    assert model.n_jobs_ == 2
    np.testing.assert_array_equal(to_np(model.inducing_points_), X)


def test_the_exact_models_row_limit_is_what_the_docs_say():
    """docs/small_data_defaults.md's table and the estimator's docstring give the rule's row limit (700) to the
    reader; the rule must take the exact model up to that many rows and the sparse one above, read from the docs, not
    from the constant (the tests above read ``EXACT_MAX_ROWS``, so changing it to 1000 passed them all)."""
    table = (ROOT / "docs" / "small_data_defaults.md").read_text()
    limit = int(re.search(r"^\| n <= (\d+) \| `ep`, two classes, batch \| \*\*exact\*\*", table, re.M).group(1))
    assert f"| {limit} < n <= 20,000 |" in table
    assert f"up to {limit} rows, binary batch EP trains the exact model" in " ".join(GPClassifier.__doc__.split())
    assert model_size("auto", limit, has_exact_pass=True) == ModelSize(limit, True)
    assert model_size("auto", limit + 1, has_exact_pass=True) == ModelSize(SPARSE_INDUCING, False)


def test_the_plateau_s_rise_is_per_row_counted_by_weight():
    """An estimator-API audit (2026-12-02): the plateau's rise was per row of positive weight, so a fit of rows
    with integer weights stopped on another iteration than the fit of the rows repeated (49 against 52). The rise is
    per row counted by weight (log Z sums each row's term times its weight): they stop on the same iteration."""
    rng = np.random.default_rng(1)
    X, y = make_banana(400, random_state=1)
    counts = rng.integers(1, 4, size=400)
    settings = dict(n_inducing=30, max_iter=120, random_state=0)
    weighted = GPClassifier(**settings).fit(X, y, sample_weight=counts.astype(float))
    repeated = GPClassifier(**settings).fit(np.repeat(X, counts, axis=0), np.repeat(y, counts))
    assert weighted.stop_reason_ == repeated.stop_reason_ == "plateau"
    assert weighted.n_iter_ == repeated.n_iter_
    np.testing.assert_allclose(weighted.predict_proba(X), repeated.predict_proba(X), atol=1e-6)


@dataclass
class _Stage:
    """A stand-in for a training result, as ``choose_inducing`` and ``learn_lengthscales`` read one."""
    name: str
    log_z: float
    stop_reason: str = "max_iter"
    stopped_by_time: bool = False
    kernel: object = None


_stage = _Stage


def _choose(first, second):
    calls = []

    def learn(Z, stage, fits_after):
        calls.append(Z)
        return {"levels": first, "any": second}[Z], True

    return size_rule.choose_inducing(learn, "levels", "any")[0], calls


def test_choose_inducing_keeps_a_first_fit_that_stopped_early_or_ran_out_of_time():
    """The mutation audit of 2026-12-04: a first fit stopped early on validation data (or by ``max_time``) is kept
    without a second fit, though the second would have the higher log Z."""
    for reason in ("early_stopping", "max_time"):
        kept, calls = _choose(_stage("first", -10.0, reason), _stage("second", -5.0))
        assert (kept.name, kept.stop_reason, calls) == ("first", reason, ["levels"])
    kept, calls = _choose(_stage("first", -10.0), _stage("second", -5.0))
    assert (kept.name, calls) == ("second", ["levels", "any"])  # (else the second, of higher log Z, is kept)


def test_choose_inducing_keeps_the_first_fit_when_the_second_ran_out_of_time():
    """The mutation audit of 2026-12-04: a second fit cut short by ``max_time`` leaves the first, though its log Z is
    higher, and the kept result says the fit ran out of time."""
    kept, calls = _choose(_stage("first", -10.0), _stage("second", -5.0, "max_time", True))
    assert calls == ["levels", "any"]
    assert (kept.name, kept.stop_reason, kept.stopped_by_time) == ("first", "max_time", True)


def test_learn_lengthscales_stops_after_a_first_stage_stopped_early():
    """The mutation audit of 2026-12-04: ``ard="auto"``'s choice ends after its first stage (one shared lengthscale)
    when that stage stopped early on validation data; it is kept, shared, and no other stage is trained."""
    from agpc.kernels import RBF
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01)
    for reason in ("early_stopping", "max_time"):
        calls = []

        def train(start, shared, first, name, remaining, reason=reason):
            calls.append((shared, first))
            return _stage("stage %d" % len(calls), -10.0 + 5.0 * len(calls), reason, reason == "max_time", start)

        result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 1, kernel, train)
        assert (result.name, result.stop_reason, per_feature, calls) == ("stage 1", reason, False, [(True, True)])
