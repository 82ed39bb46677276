"""Property-based checks of the promise "nothing silently wrong" (hypothesis).

Random small data sets, labels of many kinds and random corruptions of a saved model file must end in one of
two ways: a fitted (or loaded) model whose probabilities are finite and sum to one, or one of the errors agpc
documents (``ValueError`` naming the problem, :class:`agpc.CholeskyError`, :class:`agpc.ConvergenceError`).
Never another exception type, never a file left behind in the directory we were asked to write to.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
import zipfile

import numpy as np
import pytest

from agpc import GPClassifier
import agpc

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# The errors a user is told to expect (README "Errors"); anything else escaping is a bug.
DOCUMENTED = tuple(e for e in (ValueError, agpc.CholeskyError, getattr(agpc, "ConvergenceError", None)) if e)

_SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _check_fitted(model, X):
    proba = model.predict_proba(X)
    assert np.all(np.isfinite(proba))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-9)
    assert proba.shape == (X.shape[0], len(model.classes_))


def _check_documented(exc):
    assert isinstance(exc, DOCUMENTED), f"undocumented {type(exc).__name__}: {exc}"
    message = str(exc)
    assert message.strip(), f"{type(exc).__name__} with an empty message"


# -- random data and labels -------------------------------------------------------------------------

_CLASS_VALUES = {  # the classes a user's labels may be spelled as
    "int": [-1, 1, 3],
    "str": ["no", "yes", "maybe"],
    "bool": [False, True],
    "float": [0.0, 1.0, 2.5],
}
_AWKWARD_LABELS = ["", None, float("nan"), "a", 1]  # missing values, and a type mixed in

_COLUMN = st.sampled_from(["spread", "offset", "constant", "repeated"])


@st.composite
def _data(draw):
    """Mostly valid data (so that fits are exercised), sometimes spoiled: a non-finite feature, an awkward
    label; columns with a large offset against their spread (x + 1e7), constant ones, repeated rows."""
    n = draw(st.integers(1, 30))
    d = draw(st.integers(1, 3))
    columns = []
    for _ in range(d):
        kind = draw(_COLUMN)
        if kind == "constant":
            columns.append([draw(st.floats(-5, 5))] * n)
            continue
        values = draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n))
        if kind == "repeated":
            values = [values[i % 3] for i in range(n)]
        columns.append([v + 1e7 if kind == "offset" else v for v in values])
    X = np.array(columns, dtype=float).T.reshape(n, d)
    if draw(st.integers(0, 6)) == 0:
        X[draw(st.integers(0, n - 1)), draw(st.integers(0, d - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    kind = draw(st.sampled_from(sorted(_CLASS_VALUES)))
    pool = _CLASS_VALUES[kind]
    labels = [pool[i] for i in draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))]
    if draw(st.integers(0, 6)) == 0:
        labels[draw(st.integers(0, n - 1))] = draw(st.sampled_from(_AWKWARD_LABELS))
        return X, np.array(labels, dtype=object)
    return X, np.array(labels)


_MODELS = st.sampled_from([
    dict(method="ep"),
    dict(method="sep", batch_size=8),
    dict(method="adf", batch_size=8),
    dict(method="svi", batch_size=8),
    dict(method="vi-jj"),
    dict(method="gfitc"),
])


@settings(max_examples=60, **_SETTINGS)
@given(data=_data(), params=_MODELS, m=st.integers(1, 6), jitter=st.sampled_from([0.0, 1e-6]))
def test_fit_gives_a_model_or_a_documented_error(data, params, m, jitter):
    X, y = data
    with tempfile.TemporaryDirectory() as directory:
        model = GPClassifier(n_inducing=m, max_iter=3, jitter=jitter, random_state=0,
                             checkpoint_path=os.path.join(directory, "ckpt.npz"), checkpoint_every=2, **params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model.fit(X, y)
            except DOCUMENTED as exc:
                _check_documented(exc)
                event(f"refused: {type(exc).__name__}")
                leftover = [f for f in os.listdir(directory) if f != "ckpt.npz"]
                assert not leftover, f"files left behind after a failed fit: {leftover}"
                return
            _check_fitted(model, X)
            event("fitted")
        assert set(os.listdir(directory)) <= {"ckpt.npz"}


# -- random corruptions of a saved model ------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    from agpc.datasets import make_banana
    from sklearn.datasets import load_iris

    directory = tmp_path_factory.mktemp("models")
    X, y = make_banana(80, random_state=0)
    binary = GPClassifier(n_inducing=5, max_iter=5, random_state=0).fit(X, y)
    iris = load_iris()
    multi = GPClassifier(method="sep", n_inducing=4, max_iter=3, random_state=0).fit(iris.data, iris.target)
    saved = {}
    for name, model, data in (("binary", binary, X), ("multiclass", multi, iris.data)):
        path = directory / f"{name}.npz"
        model.save(path)
        saved[name] = _Saved(path.read_bytes(), data)
    return saved


class _Saved:
    """A saved model's bytes and data to predict on (a short repr keeps hypothesis' reports readable)."""

    def __init__(self, raw, X):
        self.raw, self.X = raw, X

    def __repr__(self):
        return f"<saved model, {len(self.raw)} bytes>"


def _read_npz(raw):
    import io

    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _write_npz(members):
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return buffer.getvalue()


def _npy_bytes(array):
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _npy_array(raw):
    import io

    return np.load(io.BytesIO(raw), allow_pickle=False)


from helpers import JSON_VALUES  # noqa: E402


@st.composite
def _corruption(draw):
    # (random header values and byte damage are test_persistence's; here: the arrays, nested header fields,
    # a member dropped, on a binary and a multiclass model)
    kind = draw(st.sampled_from(["header", "array", "drop"]))
    return kind, draw(st.randoms(use_true_random=False))


def _corrupt(raw, kind, rng, draw_value):
    members = _read_npz(raw)
    header_name = next(name for name in members if name.startswith("__agpc_header__"))
    if kind == "drop":
        members.pop(rng.choice(sorted(members)))
        return _write_npz(members)
    if kind == "header":
        header = json.loads(str(_npy_array(members[header_name])))
        path = [rng.choice(sorted(header))]
        target = header
        while isinstance(target[path[-1]], dict) and target[path[-1]] and rng.random() < 0.6:
            target = target[path[-1]]
            path.append(rng.choice(sorted(target)))
        target[path[-1]] = draw_value
        members[header_name] = _npy_bytes(np.asarray(json.dumps(header)))
        return _write_npz(members)
    # "array": change one stored array's values, shape or dtype
    name = rng.choice(sorted(n for n in members if n != header_name))
    values = _npy_array(members[name])
    change = rng.choice(["nan", "transpose", "shape", "dtype", "scale", "duplicate"])
    if change == "nan" and values.dtype.kind == "f" and values.size:
        values = values.copy()
        values.flat[rng.randrange(values.size)] = rng.choice([np.nan, np.inf, -np.inf])
    elif change == "transpose" and values.ndim >= 2:
        values = np.swapaxes(values, -1, -2).copy()
    elif change == "shape":
        values = values.reshape(-1)[: max(0, values.size - 1)]
    elif change == "dtype":
        values = values.astype(rng.choice(["int64", "float32", "U3", "bool"]))
    elif change == "scale" and values.dtype.kind == "f":
        values = values * rng.choice([-1.0, 0.0, 1e300])
    elif change == "duplicate" and values.ndim >= 1 and values.shape[0] > 1:
        values = values.copy()
        values[1] = values[0]
    members[name] = _npy_bytes(values)
    return _write_npz(members)


@settings(max_examples=150, **_SETTINGS)
@given(which=st.sampled_from(["binary", "multiclass"]), corruption=_corruption(), value=JSON_VALUES)
def test_a_corrupted_model_file_loads_or_is_refused(saved_models, which, corruption, value):
    raw, X = saved_models[which].raw, saved_models[which].X
    kind, rng = corruption
    corrupted = _corrupt(raw, kind, rng, value)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.npz")
        with open(path, "wb") as fh:
            fh.write(corrupted)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = GPClassifier.load(path)
            except ValueError as exc:
                _check_documented(exc)
                assert "model.npz" in str(exc), f"the message does not name the file: {exc}"
                event("refused")
                return
            _check_fitted(model, X)
            event("loaded")
            # whatever the file said, it chooses no place to write
            for name, setting in model.get_params().items():
                if "path" in name or "directory" in name:
                    assert setting is None, f"{name}={setting!r} was taken from the file"
        assert os.listdir(directory) == ["model.npz"]
