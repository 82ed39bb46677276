"""Every warning agpc gives a user names the user's own line: the call of the public API (``fit``, ``partial_fit``,
``score``, ``agpc.load_model``, ...) that led to it, however deep inside agpc it arose and whichever path it took
there (a fit on all rows or on a subsample first, ``score`` through ``predict``, a fit's validation rows). A
warning that names a line inside agpc, or a frame past the top of the stack (Python's "sys", line 1), tells the user
nothing about which of their calls to look at."""

import inspect
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import make_moons

import agpc
from agpc import GPClassifier, GuardWarning, JitterWarning, backend, size_rule
from agpc.inference import ep, training


def _said(category, call):
    """(the warnings of ``category`` that ``call()`` gave, the line of this file ``call`` is written on)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, category)], inspect.getsourcelines(call)[1]


def _at_the_call(said, line):
    assert said, "no warning was given"
    assert [(w.filename, w.lineno) for w in said] == [(__file__, line)] * len(said), [
        (w.filename, w.lineno, str(w.message)[:80]) for w in said]


def _nan_once(real, at):
    """``real`` (a pass of ``agpc.inference.ep``) whose ``at``-th call returns a NaN log Z: the guard's to handle."""
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == at:
            out["log_z"] = out["log_z"] * np.nan
        return out

    return wrapped


@pytest.mark.parametrize("batch_size, subsample", [(None, False), (100, False), (None, True)])
def test_the_guards_warning_names_the_line_of_fit(monkeypatch, batch_size, subsample):
    """The guard's summary is said at the end of a training loop, two or three calls below ``fit`` depending on the
    path (the fit on a subsample first, here forced on 400 rows, is one deeper): collected in ``fit``'s scope
    (``backend.jitter_report``) and said from the caller's line."""
    X, y = make_moons(400, noise=0.3, random_state=0)
    if subsample:
        monkeypatch.setattr(size_rule, "subsample_start_rows", lambda *args, **kwargs: 150)
    monkeypatch.setattr(ep, "evaluate", _nan_once(ep.evaluate, 3))
    monkeypatch.setattr(ep, "evaluate_factor", _nan_once(ep.evaluate_factor, 3))
    model = GPClassifier(n_inducing=8, max_iter=4, batch_size=batch_size, random_state=0)
    said, line = _said(GuardWarning, lambda: model.fit(X, y))
    _at_the_call(said, line)
    # (minibatches: the third ep.evaluate is an epoch's exact rebuild, whose NaN log Z reverts the step before it too)
    assert f"the training guard did not take {2 if batch_size else 1} step" in str(said[0].message)
    assert model.subsample_rows_ == (150 if subsample else 0)


def test_the_guards_warning_names_the_line_of_partial_fit(monkeypatch):
    X, y = make_moons(300, noise=0.3, random_state=0)
    model = GPClassifier(method="sep", n_inducing=8, random_state=0)
    model.partial_fit(X[:100], y[:100], classes=[0, 1], n_total=300)
    monkeypatch.setattr(ep, "evaluate_factor", _nan_once(ep.evaluate_factor, 1))
    said, line = _said(GuardWarning, lambda: model.partial_fit(X[100:200], y[100:200]))
    _at_the_call(said, line)


def test_a_jitter_raised_to_load_a_file_names_the_line_of_the_load(monkeypatch, tmp_path):
    """A model file whose jitter does not factorise its K(Z, Z) (here: a point twice in Z, the jitter edited to 0)
    loads with the jitter raised, said once from the line that loaded it, by either way of loading."""
    monkeypatch.setattr(backend, "jitter_floor", lambda Z: 0.0)  # (else the floor alone factorises K(Z, Z))
    X, y = make_moons(200, noise=0.3, random_state=0)
    Z = np.concatenate([X[:4], X[:4]])
    with pytest.warns(JitterWarning):
        model = GPClassifier(inducing=Z, jitter=0.0, max_iter=2, random_state=0).fit(X, y)
    model.jitter_ = 0.0
    path = tmp_path / "model.agpc"
    model.save(path)
    for load in (lambda: agpc.load_model(path), lambda: GPClassifier.load(path)):
        said, line = _said(JitterWarning, load)
        _at_the_call(said, line)


def test_an_unseen_column_of_levels_is_said_at_the_users_call():
    """A categorical column none of whose values the model was fitted with, by ``predict_proba``, ``score`` (through
    ``predict``) and as a fit's validation rows: three depths below the user's call."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=300), "c": rng.choice(["a", "b", "c"], size=300)})
    y = (frame["x"] + (frame["c"] == "a") > 0.5).to_numpy().astype(int)
    model = GPClassifier(n_inducing=8, max_iter=2, random_state=0).fit(frame, y)
    unseen = frame.assign(c="zzz")
    for call in (lambda: model.predict_proba(unseen), lambda: model.score(unseen, y),
                 lambda: GPClassifier(n_inducing=8, max_iter=2, random_state=0).fit(frame, y,
                                                                                   validation_data=(unseen, y))):
        said, line = _said(UserWarning, call)
        _at_the_call([w for w in said if "none of its 300 values is a level" in str(w.message)], line)


def test_the_guards_warning_is_said_when_the_fit_then_raises(monkeypatch):
    """What the guard did happened: a fit interrupted after it (here in the final pass; a Ctrl-C, or the error of the
    fit on all rows after the one on a subsample) still says it, from the caller's line, and the error is the
    interrupt's. A filter that makes the warning an error does not replace the error in flight."""
    X, y = make_moons(400, noise=0.3, random_state=0)
    monkeypatch.setattr(ep, "evaluate", _nan_once(ep.evaluate, 3))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("during the final pass")

    monkeypatch.setattr(training, "_final_pass", interrupted)
    model = GPClassifier(n_inducing=8, max_iter=4, random_state=0)

    def fit():
        with pytest.raises(KeyboardInterrupt, match="during the final pass"):
            model.fit(X, y)

    said, _ = _said(GuardWarning, fit)
    assert len(said) == 1 and said[0].filename == __file__ and "did not take 1 step" in str(said[0].message)
    monkeypatch.setattr(ep, "evaluate", _nan_once(ep.evaluate, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GuardWarning)
        with pytest.raises(KeyboardInterrupt, match="during the final pass"):
            model.fit(X, y)
