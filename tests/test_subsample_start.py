"""Binary EP's batch fits of more than 20,000 rows start on a random subsample (``size_rule.subsample_start_rows``):
which fits do, what the fit on all rows starts from, its stop, its time budget, checkpoints and resume, and what the
fitted model, its file, ``summary()`` and the command line say of it."""

import re
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification

from agpc import GPClassifier, cli, persistence, size_rule
from agpc.backend import CholeskyError
from agpc.batch_size import FULL_BATCH_MAX_ROWS
from agpc.labels import stratified_rows
from agpc.inference import training
from agpc.plan import FitPlan
from agpc.size_rule import ModelSize

ROWS = FULL_BATCH_MAX_ROWS + 500  # (the fewest rows that start on a subsample, and a little more)


@pytest.fixture(scope="module")
def table():
    X, y = make_classification(ROWS, 5, n_informative=3, n_redundant=1, random_state=0)
    return X, y


def _plan(X, y, **params):
    return FitPlan.of("GPClassifier", GPClassifier(**params).get_params(deep=False)).for_rows(X, y, X.shape[0], None)


def test_the_rule_takes_binary_ep_batch_fits_of_more_than_20000_rows_that_stop_on_their_plateau(table):
    X, y = table
    plan, sparse = _plan(X, y), ModelSize(100, False)
    assert plan.binary_on_host
    assert size_rule.subsample_start_rows(plan, ROWS, sparse, False, "auto") == size_rule.SUBSAMPLE_START_ROWS
    # not: a fit run to max_iter, on minibatches, of the exact model, of 20,000 rows counted by weight or fewer, of
    # more inducing points than measured, of another method or of three classes (``binary_on_host`` False)
    assert size_rule.subsample_start_rows(plan, ROWS, sparse, False, None) is None
    assert size_rule.subsample_start_rows(plan, ROWS, sparse, False, "auto", learns=False) is None
    assert size_rule.subsample_start_rows(plan, ROWS, sparse, True, "auto") is None
    assert size_rule.subsample_start_rows(plan, ROWS, ModelSize(ROWS, True), False, "auto") is None
    assert size_rule.subsample_start_rows(plan, FULL_BATCH_MAX_ROWS, sparse, False, "auto") is None
    assert size_rule.subsample_start_rows(plan, ROWS, ModelSize(size_rule.SUBSAMPLE_START_MAX_INDUCING + 1, False),
                                          False, "auto") is None
    for other in (_plan(X, y, method="sep"), _plan(X, y, batch_size=None), _plan(X, y % 2 + (X[:, 0] > 1), )):
        assert not other.binary_on_host
        assert size_rule.subsample_start_rows(other, ROWS, sparse, False, "auto") is None


def test_a_fit_started_on_a_subsample_stops_on_the_short_window():
    steps_started, _ = size_rule.fit_plateau("auto", ROWS, False, started_on_subsample=True)
    steps_alone, _ = size_rule.fit_plateau("auto", ROWS, False)
    assert (steps_started, steps_alone) == (size_rule.SPARSE_PLATEAU_STEPS, size_rule.LARGE_BATCH_PLATEAU_STEPS)
    assert size_rule.fit_plateau("auto", 5000, False, started_on_subsample=True)[0] == size_rule.SPARSE_PLATEAU_STEPS


def test_the_subsample_keeps_each_class_in_its_share_and_a_rare_one_at_all():
    y = np.r_[np.zeros(29_999), np.ones(1)]
    weights = np.ones(30_000)
    weights[:10_000] = 0.0  # (rows of weight 0 are not drawn: they are not in the model)
    picked = stratified_rows(y, 10_000, np.random.default_rng(0), weights=weights)
    assert np.all(np.diff(picked) > 0) and picked.min() >= 10_000
    assert (y[picked] == 1).sum() == 1 and abs(picked.size - 10_000) <= 1
    y = np.r_[np.zeros(20_000), np.ones(10_000)]
    picked = stratified_rows(y, 9_000, np.random.default_rng(1))
    assert ((y[picked] == 0).sum(), (y[picked] == 1).sum()) == (6_000, 3_000)


def _recording_train(monkeypatch, fail_on_subsample=None):
    """The calls of ``GPClassifier._train``: (rows, weights, kernel parameters, Z, max_time, checkpoints, plateau,
    whether it had validation rows, result); ``fail_on_subsample``: an exception the subsample's fit raises (a failed
    factorisation)."""
    real = GPClassifier._train
    calls = []

    def train(self, plan, placed, kernel, Z, classes, groups, rng, resume, validation, *args, max_time="fit",
              checkpoints=True, **kwargs):
        call = dict(X=np.array(placed.X), weights=placed.weights, params={k: np.array(v) for k, v in
                    kernel.params.items()}, Z=np.array(Z), max_time=max_time, checkpoints=checkpoints,
                    plateau=args[-1], validation=validation is not None)
        calls.append(call)
        if fail_on_subsample is not None and placed.X.shape[0] < ROWS:
            raise fail_on_subsample("a failed factorisation (test)")
        call["result"] = real(self, plan, placed, kernel, Z, classes, groups, rng, resume, validation, *args,
                              max_time=max_time, checkpoints=checkpoints, **kwargs)
        return call["result"]

    monkeypatch.setattr(GPClassifier, "_train", train)
    return calls


def _positions(X, rows):
    """The row numbers in X of each of ``rows`` (rows of X)."""
    where = {row.tobytes(): i for i, row in enumerate(X)}
    return np.array([where[row.tobytes()] for row in rows])


def test_the_fit_on_all_rows_starts_from_the_subsample_fits_kernel_and_points(table, monkeypatch):
    X, y = table
    calls = _recording_train(monkeypatch)
    model = GPClassifier(n_inducing=8, max_iter=4, random_state=0).fit(X, y, validation_data=(X[:300], y[:300]))
    first, second = calls
    rows = size_rule.SUBSAMPLE_START_ROWS
    assert first["X"].shape == (rows, X.shape[1]) and second["X"].shape == X.shape
    # distinct training rows, in their order
    picked = _positions(X, first["X"])
    assert np.all(np.diff(picked) > 0)
    assert first["checkpoints"] is False and first["max_time"] is None and second["checkpoints"] is True
    assert (first["validation"], second["validation"]) == (False, True)  # (validation scores the model on all rows)
    # the subsample's fit stops as a fit of its rows does; the fit on all rows on the short window
    assert first["plateau"] == size_rule.fit_plateau("auto", rows, False)
    assert second["plateau"] == size_rule.fit_plateau("auto", ROWS, False, started_on_subsample=True)
    for name, value in first["result"].kernel.params.items():
        np.testing.assert_array_equal(second["params"][name], np.asarray(value))
    np.testing.assert_array_equal(second["Z"], np.asarray(first["result"].Z))
    assert not np.array_equal(first["Z"], second["Z"])  # (the subsample's fit moved them)
    assert (model.subsample_rows_, model.subsample_iter_) == (rows, first["result"].n_iter)
    assert model.n_iter_ == second["result"].n_iter and model.history_ == second["result"].history
    assert (model.predict_proba(X[:50]) > 0).all()


def test_the_subsample_keeps_its_rows_weights_and_half_the_time_left(table, monkeypatch):
    X, y = table
    weights = np.random.default_rng(1).uniform(0.5, 2.0, ROWS)
    calls = _recording_train(monkeypatch)
    model = GPClassifier(n_inducing=8, max_iter=2, random_state=0, max_time=600.0).fit(X, y, sample_weight=weights)
    first, second = calls
    np.testing.assert_array_equal(np.asarray(first["weights"]), weights[_positions(X, first["X"])])
    # the time spent before the subsample's fit (s) and half of the 600 - s left: 300 + s / 2, s within the fit's time
    assert 300.0 <= first["max_time"] <= 300.0 + model.fit_time_ / 2 and second["max_time"] == "fit"


@pytest.mark.parametrize("params", [dict(batch_size=200, max_iter=1), dict(plateau=None, max_iter=2),
                                    dict(method="sep", batch_size=None, max_iter=2), dict(optimize=False, max_iter=2),
                                    dict(max_iter=0)])
def test_fits_outside_the_rule_train_once_on_all_rows(table, monkeypatch, params):
    X, y = table
    calls = _recording_train(monkeypatch)
    model = GPClassifier(n_inducing=8, random_state=0, **params).fit(X, y)
    assert [call["X"].shape[0] for call in calls] == [ROWS]
    assert (model.subsample_rows_, model.subsample_iter_) == (0, 0)


@pytest.mark.parametrize("failure", [CholeskyError, FloatingPointError])
def test_a_subsample_fit_that_fails_leaves_the_fit_on_all_rows_as_it_was(table, monkeypatch, failure):
    X, y = table
    calls = _recording_train(monkeypatch, fail_on_subsample=failure)
    with pytest.warns(RuntimeWarning, match="failed numerically .*training on all rows from the start instead"):
        model = GPClassifier(n_inducing=8, max_iter=2, random_state=0).fit(X, y)
    first, second = calls
    assert first["X"].shape[0] < ROWS and second["X"].shape[0] == ROWS
    np.testing.assert_array_equal(second["Z"], first["Z"])  # (the start of before)
    assert second["plateau"] == size_rule.fit_plateau("auto", ROWS, False)  # (and its 20-step window)
    assert (model.subsample_rows_, model.subsample_iter_) == (0, 0)


class _Interrupt(Exception):
    pass


def test_an_interrupted_fit_resumes_on_all_rows_to_the_uninterrupted_model(table, tmp_path, monkeypatch):
    """The subsample's fit writes no checkpoint; the fit on all rows does, and a resume continues it from there
    (without fitting the subsample again) to the model of the fit that was not interrupted."""
    X, y = table
    params = dict(n_inducing=8, max_iter=6, random_state=0)
    reference = GPClassifier(**params).fit(X, y)
    real = training.Trainer.step
    seen = {"subsample": 0, "all": 0}

    def step(self, X_step, *args, **kwargs):
        seen["all" if X_step.shape[0] == ROWS else "subsample"] += 1
        if seen["all"] > 13:
            raise _Interrupt
        return real(self, X_step, *args, **kwargs)

    monkeypatch.setattr(training.Trainer, "step", step)
    path = tmp_path / "run.ckpt"
    with pytest.raises(_Interrupt):
        GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(X, y)
    assert seen["subsample"] == reference.subsample_iter_
    seen.update(subsample=0, all=-1000)
    calls = _recording_train(monkeypatch)
    resumed = GPClassifier(**params, checkpoint_path=path, checkpoint_every=4).fit(X, y, resume=True)
    # one run, on all rows, on the window of the run it continues
    assert [call["plateau"] for call in calls] == [size_rule.fit_plateau("auto", ROWS, False,
                                                                         started_on_subsample=True)]
    assert seen["subsample"] == 0 and 0 < seen["all"] + 1000 < reference.n_iter_
    # (what the subsample's fit did is not in the checkpoint: not recorded, and not said to be none)
    assert (resumed.subsample_rows_, resumed.subsample_iter_) == (None, None)
    assert reference.subsample_rows_ == size_rule.SUBSAMPLE_START_ROWS
    np.testing.assert_allclose(resumed.history_["log_marginal_likelihood"],
                               reference.history_["log_marginal_likelihood"], rtol=1e-12)
    np.testing.assert_allclose(resumed.inducing_points_, reference.inducing_points_, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(resumed.predict_proba(X[:200]), reference.predict_proba(X[:200]), rtol=1e-10)


def test_the_model_file_summary_and_command_line_say_it(table, tmp_path):
    X, y = table
    model = GPClassifier(n_inducing=8, max_iter=2, random_state=0).fit(X, y)
    rows, iterations = model.subsample_rows_, model.subsample_iter_
    assert rows == size_rule.SUBSAMPLE_START_ROWS and iterations >= 1
    path = tmp_path / "model.agpc"
    persistence.save_model(model, path)
    loaded = persistence.load_model(path)
    assert (loaded.subsample_rows_, loaded.subsample_iter_) == (rows, iterations)
    assert f"started on a random {rows:,} rows ({iterations} iterations, warm-up sweeps included)" in loaded.summary()
    said = cli._iterations(model, 2, (X, y))
    assert f"after {iterations} iterations (warm-up sweeps included) on a random {rows:,} of them" in said
    alone = GPClassifier(n_inducing=8, max_iter=2, random_state=0, plateau=None).fit(X, y)
    assert "random" not in alone.summary() and "random" not in cli._iterations(alone, 2, (X, y))


def _estimate_of(err, stage):
    """The estimate line of the progress stage named ``stage`` in the standard error ``err`` of a verbose fit."""
    lines = [line.split("\r")[-1].strip() for line in err.split("\n")]
    return next(line for line in lines if line.startswith(f"agpc ep [{stage}]: estimate from the first steps"))


def _seconds(text):
    """Seconds of a ``hooks.duration`` text ("0.35 s", "48 s", "6 min 41 s")."""
    minutes = re.search(r"(\d+) min", text)
    seconds = re.search(r"([\d.]+) s", text)
    return 60.0 * (int(minutes.group(1)) if minutes else 0) + float(seconds.group(1))


@pytest.mark.parametrize("max_iter, max_time", [(4, None), (250, 1.0)])
def test_the_subsample_fits_estimate_adds_the_fit_on_all_rows_after_it(table, capsys, max_iter, max_time):
    """The first stage's estimate line says what the whole fit costs at most: the fit on all rows after it, whose
    iterations (warm-up sweeps counted as iterations) cost this stage's times its rows over the subsample's (its
    line had said only its own 9 s where the fit on all 45,000 rows took 12 s more and could take 45)."""
    X, y = table
    with warnings.catch_warnings():  # (max_time's: the budget ends the fit)
        warnings.simplefilter("ignore", UserWarning)
        GPClassifier(n_inducing=5, max_iter=max_iter, random_state=0, verbose=True, max_time=max_time).fit(X, y)
    err = capsys.readouterr().err
    rows = size_rule.SUBSAMPLE_START_ROWS
    first = _estimate_of(err, f"1/2: a random {rows:,} of {ROWS:,} rows")
    per_iteration = float(re.search(r"\(([\d.e-]+) s an iteration\)", first).group(1))
    times = ROWS / rows
    assert f"; then the fit on all {ROWS:,} rows, its iterations ~{times:.2g} times as long: at most ~" in first
    more = _seconds(first.split("at most ~")[2].split(" more")[0])
    expected = times * per_iteration * (training.TrainSettings().n_warmup + max_iter)
    assert more == pytest.approx(expected, rel=0.06, abs=0.006)  # (both printed to 2-3 significant digits)
    whole = _seconds(first.split("the whole fit at most ~")[1])
    assert whole >= more
    # (250 iterations of each stage at most: more than the second max_time gives the whole fit)
    assert ("(max_time ends it at ~1 s)" in first) == (max_time is not None)
    if "2/2" in err:  # (the fit on all rows' own line: nothing follows it)
        assert "then" not in _estimate_of(err, f"2/2: all {ROWS:,} rows")


def test_each_kernel_choice_stage_estimates_the_stages_after_it(capsys):
    """The exact model's kernel choice (``ard="auto"`` on up to 500 rows) runs up to four stages, each at most
    ``max_iter`` iterations; each stage's estimate line adds the later stages, at its own pace (the same rows and
    model size), and the whole fit's at most. Before, each said only "this stage's"."""
    from agpc.datasets import make_banana

    X, y = make_banana(200, random_state=0)
    max_iter = 6
    GPClassifier(max_iter=max_iter, random_state=0, verbose=True).fit(X, y)
    err = capsys.readouterr().err
    names = size_rule._stage_names(True)
    assert len(names) == 4
    for k, name in enumerate(names, 1):
        line = _estimate_of(err, name)
        later = len(names) - k
        if not later:
            assert "then" not in line
            continue
        per_iteration = float(re.search(r"\(([\d.e-]+) s an iteration\)", line).group(1))
        each = per_iteration * (training.TrainSettings().n_warmup + max_iter)
        said = f"; then the {later} later kernel stage{'s' if later != 1 else ''}"
        assert said + (", each at most ~" if later > 1 else ": at most ~") in line, line
        more = _seconds(line.split(" more")[0].split("at most ~")[-1])
        assert more == pytest.approx(later * each, rel=0.06, abs=0.006)  # (printed to 2-3 significant digits)
        assert "times as long" not in line and _seconds(line.split("the whole fit at most ~")[1]) >= more


def test_the_first_inducing_choice_estimates_the_second_fit_after_it(capsys):
    """A sparse model of a table with a categorical column is fitted twice (``size_rule.choose_inducing``: from points
    on the rows' levels, then from points of any level) and the one of higher log Z kept. The first fit's estimate
    line adds the second, as many iterations at most at its pace, and the whole fit's at most; before, it said only
    "this stage's" (a 18,458-row CSV: ~26 s, where the fit could take twice that)."""
    rng = np.random.default_rng(0)
    n = 600
    level = rng.integers(0, 3, size=n)
    x = rng.normal(size=n)
    X = np.column_stack([x, level]).astype(np.float64)
    y = (x + 0.8 * (level == 1) + 0.5 * rng.normal(size=n) > 0).astype(int)
    max_iter = 6
    GPClassifier(n_inducing=8, max_iter=max_iter, random_state=0, verbose=True, categorical_features=[1]).fit(X, y)
    err = capsys.readouterr().err
    first, second = (_estimate_of(err, name) for name in size_rule.INDUCING_CHOICE)
    per_iteration = float(re.search(r"\(([\d.e-]+) s an iteration\)", first).group(1))
    assert "; then the fit from the other inducing points: at most ~" in first, first
    more = _seconds(first.split(" more")[0].split("at most ~")[-1])
    expected = per_iteration * (training.TrainSettings().n_warmup + max_iter)
    assert more == pytest.approx(expected, rel=0.06, abs=0.006)  # (printed to 2-3 significant digits)
    assert _seconds(first.split("the whole fit at most ~")[1]) >= more
    assert "then" not in second
