"""The model of every method, fitted with a fixed seed, is the model it was when the fixtures were written.

The fixtures in ``tests/data/models_unchanged/`` were written by this module (``python
tests/test_models_unchanged.py --write``) on main before the training layer was restructured (the engine contract,
the loop with hooks, one fit path): a restructuring that changes no arithmetic changes no bit of any fitted model.
Each case fits one method on one path (batch, minibatch, multiclass, the exact full-GP default of small data,
``partial_fit``, a dask array, data on disk, data-parallel rounds in local workers with a fixed number of local
steps) and keeps every array the saved model holds, the history of log Z and the predicted probabilities on a grid.

On the machine and with the NumPy / BLAS build that wrote them, the comparison is exact (bit-identical). Elsewhere a
BLAS may sum in another order, so it is to 1e-9 relative: still far below any change of the algorithm. The
fixture records which machine wrote it.
"""

import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import make_blobs, make_moons

from agpc import GPClassifier
from agpc.methods import method_names, methods_supporting

FIXTURES = Path(__file__).resolve().parent / "data" / "models_unchanged"


def _binary(n=120, seed=0):
    X, y = make_moons(n, noise=0.3, random_state=seed)
    return X, y


def _three(n=150, seed=0):
    X, y = make_blobs(n, centers=3, cluster_std=2.0, random_state=seed)
    return (X - X.mean(0)) / X.std(0), y


def _batch(method):
    return dict(method=method, n_inducing=8, max_iter=4), "binary"


def _minibatch(method):
    return dict(method=method, n_inducing=8, max_iter=2, batch_size=40), "binary"


def _multiclass(method):
    return dict(method=method, n_inducing=6, max_iter=3), "three"


def _cases():
    cases = {}
    for name in method_names():
        cases[f"batch-{name}"] = _batch(name)
    for name in methods_supporting("minibatch"):
        cases[f"minibatch-{name}"] = _minibatch(name)
    for name in methods_supporting("multiclass"):
        cases[f"multiclass-{name}"] = _multiclass(name)
    cases["default-exact"] = dict(max_iter=3), "binary"  # small data: the full-GP model of the size rule
    # the exact model with lengthscales per feature (ard=True), which the default was before it chose by Akaike's
    # criterion: its fixture is the one default-exact had then
    cases["exact-per-feature"] = dict(max_iter=3, ard=True), "binary"
    cases["partial_fit-sep"] = dict(method="sep", n_inducing=8, batch_size=40), "partial_fit"
    cases["dask-ep"] = dict(method="ep", n_inducing=8, max_iter=3), "dask"
    cases["dask-sep-minibatch"] = dict(method="sep", n_inducing=8, max_iter=2, batch_size=40, local_steps=2), "dask"
    cases["disk-sep-minibatch"] = dict(method="sep", n_inducing=8, max_iter=2, batch_size=40), "disk"
    cases["n_jobs-sep"] = dict(method="sep", n_inducing=8, max_iter=2, batch_size=40, n_jobs=2, local_steps=2), "binary"
    return cases


CASES = _cases()


def _fit(params, data, tmp_path):
    model = GPClassifier(random_state=0, **params)
    X, y = _three() if data == "three" else _binary()
    if data == "partial_fit":
        for lo in range(0, X.shape[0], 40):
            model.partial_fit(X[lo:lo + 40], y[lo:lo + 40], classes=[0, 1], n_total=X.shape[0])
    elif data == "dask":
        import dask.array as da  # noqa: PLC0415 (dask is imported only where it is used)

        model.fit(da.from_array(X, chunks=(40, X.shape[1])), da.from_array(y, chunks=40))
    elif data == "disk":
        np.save(tmp_path / "X.npy", X)
        np.save(tmp_path / "y.npy", y)
        model.fit(np.load(tmp_path / "X.npy", mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r"))
    else:
        model.fit(X, y)
    return model, X


def _record(model, X, tmp_path):
    """Every array of the saved model, log Z's history and the predicted probabilities on a grid."""
    path = tmp_path / "model.npz"
    model.save(path)
    with np.load(path, allow_pickle=False) as saved:
        arrays = {f"model/{key}": saved[key] for key in saved.files if not key.startswith("__")}
    grid = np.linspace(X.min(0) - 0.5, X.max(0) + 0.5, 7)
    points = np.stack(np.meshgrid(*grid.T), -1).reshape(-1, X.shape[1])
    arrays["predict_proba"] = np.asarray(model.predict_proba(points))
    arrays["log_marginal_likelihood"] = np.asarray(float(model.log_marginal_likelihood_))
    arrays["history/log_marginal_likelihood"] = np.asarray(model.history_["log_marginal_likelihood"], dtype=float)
    arrays["n_iter"] = np.asarray(int(model.n_iter_))
    return arrays


def _machine():
    config = np.show_config(mode="dicts") if sys.version_info >= (3, 10) else {}
    blas = config.get("Build Dependencies", {}).get("blas", {})
    return {"machine": platform.machine(), "processor": platform.processor(), "numpy": np.__version__,
            "blas": f"{blas.get('name')} {blas.get('version')}", "cpu": _cpu_model()}


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


@pytest.mark.parametrize("case", sorted(CASES))
def test_model_unchanged(case, tmp_path):
    fixture = FIXTURES / f"{case}.npz"
    assert fixture.exists(), f"no fixture for {case}: a method or path was added; write its fixture on main first"
    with np.load(fixture, allow_pickle=False) as stored:
        expected = {key: stored[key] for key in stored.files if key != "machine"}
        writer = json.loads(str(stored["machine"]))
    params, data = CASES[case]
    got = _record(*_fit(params, data, tmp_path), tmp_path)
    assert sorted(got) == sorted(expected)
    exact = writer == _machine()
    for key, value in expected.items():
        if exact:
            np.testing.assert_array_equal(got[key], value, err_msg=f"{case}: {key} is not bit-identical")
        else:
            np.testing.assert_allclose(got[key], value, rtol=1e-9, atol=1e-12, err_msg=f"{case}: {key}")


def write(names=None):
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for case in sorted(names or CASES):
        params, data = CASES[case]
        with tempfile.TemporaryDirectory() as tmp:
            arrays = _record(*_fit(params, data, Path(tmp)), Path(tmp))
        np.savez(FIXTURES / f"{case}.npz", machine=np.asarray(json.dumps(_machine(), sort_keys=True)), **arrays)
        print("wrote", case)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"]:
        sys.exit("usage: python tests/test_models_unchanged.py --write [case ...]")
    write(sys.argv[2:])
