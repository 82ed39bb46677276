"""batch_size="auto": the full batch up to 20,000 rows, and for EP's binary model of rows in memory on the host up to
``BINARY_BATCH_MAX_ROWS`` (docs/small_data_defaults.md, "Batch steps up to 200,000 rows"); minibatches of 200
above. What decides it (``batch_size.binary_on_host``), that the fit, its hold-out for early stopping and the
command line all resolve it alike, and that every other kind of fit keeps the 20,000-row bound."""

import array_api_strict
import dask.array as da
import numpy as np
import pytest

from agpc import GPClassifier, batch_size
from agpc.plan import FitPlan

N = 30_000  # past FULL_BATCH_MAX_ROWS, within BINARY_BATCH_MAX_ROWS


def _plan(**params):
    return FitPlan.of("GPClassifier", dict({"method": "ep", "likelihood": None, "batch_size": "auto"}, **params))


def _rows(n=N, classes=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = (X[:, 0] > 0).astype(int) if classes == 2 else np.arange(n) % classes
    return X, y


def test_the_bounds_are_the_documented_ones():
    assert batch_size.FULL_BATCH_MAX_ROWS == 20_000 and batch_size.BINARY_BATCH_MAX_ROWS == 200_000
    assert batch_size.CPU_MINIBATCH == 200


@pytest.mark.parametrize("n, expected", [(20_000, None), (20_001, None), (N, None), (200_000, None),
                                         (200_001, batch_size.CPU_MINIBATCH)])
def test_binary_ep_in_memory_takes_the_full_batch_up_to_its_bound(n, expected):
    X, y = _rows(n)
    plan = _plan().for_rows(X, y, n)
    assert plan.binary_on_host == (batch_size.FULL_BATCH_MAX_ROWS < n <= batch_size.BINARY_BATCH_MAX_ROWS)
    assert plan.steps(n).step_rows == expected
    assert batch_size.rows_per_step(plan, n) == expected


def _other_kinds():
    X, y = _rows()
    three = _rows(classes=3)
    return {
        "three classes": (_plan(), *three, None),
        "an ordinal model": (_plan(likelihood="ordinal"), X, y, None),
        "method sep": (_plan(method="sep"), X, y, None),
        "method svi": (_plan(method="svi"), X, y, None),
        "a batch size given": (_plan(batch_size=500), X, y, None),
        "a dask array": (_plan(), da.from_array(X, chunks=10_000), y, None),
        "rows on disk": (_plan(), "memmap", y, None),
        "a reference namespace's rows": (_plan(), array_api_strict.asarray(X), y, None),
        "a reference namespace asked for": (_plan(), X, y, array_api_strict),
        "labels of mixed kinds": (_plan(), X, np.array([1, "a"] * (N // 2), dtype=object), None),
        "labels on disk": (_plan(), X, "memmap labels", None),
    }


@pytest.mark.parametrize("kind", list(_other_kinds()))
def test_every_other_kind_of_fit_keeps_the_20000_row_bound(kind, tmp_path):
    plan, X, y, target = _other_kinds()[kind]
    if isinstance(X, str):  # (a memmap of the rows: data read from disk a block at a time)
        rows = _rows()[0]
        X = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=rows.dtype, shape=rows.shape)
        X[:] = rows
    if isinstance(y, str):  # (the labels in a memmap)
        labels = _rows()[1]
        y = np.lib.format.open_memmap(tmp_path / "y.npy", mode="w+", dtype=labels.dtype, shape=labels.shape)
        y[:] = labels
    planned = plan.for_rows(X, y, N, target)
    assert not planned.binary_on_host
    assert batch_size.full_batch_max_rows(planned) == batch_size.FULL_BATCH_MAX_ROWS
    if planned.batch_size == "auto":
        assert planned.steps(N).minibatch and planned.steps(batch_size.FULL_BATCH_MAX_ROWS).step_rows is None


def test_classes_given_decide_without_reading_the_labels():
    """``classes`` given (two): the labels are not read (a hold-out or a stream may lack one class)."""
    X, _ = _rows()
    assert _plan(classes=[0, 1]).for_rows(X, None, N).binary_on_host
    assert not _plan(classes=[0, 1, 2]).for_rows(X, None, N).binary_on_host


def test_a_fit_takes_the_rule_and_a_multiclass_fit_minibatches():
    """The estimator resolves the rule on its rows: 30,000 binary rows train in batch steps (a step an iteration,
    no rows held out by early_stopping="auto", which holds out rows of minibatch fits only), three classes in
    minibatches of 200 (150 steps an epoch)."""
    X, y = _rows()
    binary = GPClassifier(n_inducing=5, max_iter=2, random_state=0, early_stopping="auto").fit(X, y)
    steps = binary.history_["n_steps"]
    assert np.all(np.diff(steps) == 1) and not binary.early_stopping_ and binary.n_samples_fit_ == N
    X3, y3 = _rows(classes=3)
    multi = GPClassifier(n_inducing=5, max_iter=1, random_state=0).fit(X3, y3)
    assert multi.history_["n_steps"][-1] == N // batch_size.CPU_MINIBATCH


def test_the_command_line_resolves_the_steps_as_the_fit_does():
    """``agpc fit`` says ahead (its n_jobs: every core for batch passes) and after (iterations or epochs) what the
    fit does: the same rule on the same rows."""
    from agpc import cli

    X, y = _rows()
    model = GPClassifier(n_inducing=5, backend="numpy")
    assert not cli._steps(model, (X, y)).minibatch
    assert cli._steps(model, _rows(classes=3)).minibatch
    assert cli._steps(GPClassifier(backend="cupy"), (X, y)).minibatch  # (a GPU: its own rule, in ``placement``)


def test_distinct_classes_given_count_once():
    X, _ = _rows()
    assert _plan(classes=[0, 0, 1]).for_rows(X, None, N).binary_on_host


def test_labels_not_in_memory_keep_the_20000_row_bound():
    X, y = _rows()
    assert not _plan().for_rows(X, da.from_array(y, chunks=10_000), N).binary_on_host


@pytest.mark.parametrize("n, held", [(210_000, False), (230_000, True)])
def test_the_bound_is_on_the_rows_left_by_the_hold_out(n, held):
    """early_stopping="auto" holds out 10% where the rows left would take minibatches, as at the 20,000-row bound:
    230,000 binary rows leave 207,000, minibatches, so 10% are held out; 210,000 would leave 189,000, within the
    bound, so nothing is held out, and the fit on all 210,000 takes minibatches without early stopping (rows of
    other kinds between 20,000 and 22,222 do the same at their bound)."""
    from agpc import inputs

    X, y = _rows(n)
    plan = FitPlan.of("GPClassifier", {"method": "ep", "likelihood": None, "early_stopping": "auto"}).for_rows(X, y, n)
    assert plan.binary_on_host == (not held)  # (207,000 left: past the bound whatever the labels, not read)
    assert (inputs.held_out(plan, X, y, None, n, 0) is not None) == held
    assert plan.steps(n).minibatch


def test_the_estimators_own_helper_and_a_cluster_in_the_command_line_resolve_it_alike():
    from agpc import cli

    X, y = _rows()
    model = GPClassifier(n_inducing=5, backend="numpy")
    assert model._batch_size_for(N, rows=(X, y)) is None
    assert model._batch_size_for(N) == batch_size.CPU_MINIBATCH  # (without the rows: every other fit's bound)
    reference = GPClassifier(n_inducing=5, backend=array_api_strict)  # (a reference namespace asked for)
    assert reference._batch_size_for(N, rows=(X, y)) == batch_size.CPU_MINIBATCH
    assert cli._steps(model, (X, y), on_cluster=True).minibatch  # (--scheduler: the fit's rows are dask arrays)


def test_a_categorical_binary_fit_past_20000_rows_fits_once(monkeypatch):
    """The choice between inducing points on the rows' levels and points of any level (two whole fits,
    ``size_rule.choose_inducing``) is made up to 20,000 rows, where it was measured; binary EP's batch steps past
    them fit once."""
    import pandas as pd

    from agpc import classifier

    def refused(*args, **kwargs):
        raise AssertionError("the any-level choice ran on more than 20,000 rows")

    monkeypatch.setattr(classifier, "with_any_levels", refused)
    X, y = _rows(N)
    frame = pd.DataFrame({"a": X[:, 0], "b": pd.Categorical(np.where(X[:, 1] > 0, "p", "q"))})
    model = GPClassifier(n_inducing=5, max_iter=1, random_state=0).fit(frame, y)
    assert np.all(np.diff(model.history_["n_steps"]) == 1)  # (batch steps)


def test_a_categorical_fit_of_20000_rows_still_weighs_points_of_any_level(monkeypatch):
    """At 20,000 rows, the bound itself, the choice is made as before (the two fits are not run here: the test
    stops at the choice's points)."""
    from agpc import classifier

    class Chosen(Exception):
        pass

    def chosen(*args, **kwargs):
        raise Chosen

    monkeypatch.setattr(classifier, "with_any_levels", chosen)
    import pandas as pd

    X, y = _rows(batch_size.FULL_BATCH_MAX_ROWS)
    frame = pd.DataFrame({"a": X[:, 0], "b": pd.Categorical(np.where(X[:, 1] > 0, "p", "q"))})
    with pytest.raises(Chosen):
        GPClassifier(n_inducing=5, max_iter=1, random_state=0).fit(frame, y)
