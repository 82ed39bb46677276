"""Batch EP / SEP / ADF on a dask.array over a LocalCluster of two worker processes (seed 000 sec. 2.3):
the same per-chunk functions as the single-machine path, so the same numbers."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from agpc import GPClassifier  # noqa: E402
from agpc.datasets import make_banana  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def data():
    X, y = make_banana(600, random_state=1)
    X_test, _ = make_banana(100, random_state=2)
    return X, y, X_test


@pytest.mark.parametrize("method", ["ep", "sep", "adf"])
def test_dask_fit_equals_numpy_fit(client, data, method):
    """Three chunks of 200 rows: the log Z_q history, the inducing points and the predictions equal the
    NumPy path's to 1e-8 with the same seed; ``predict_proba`` on a dask array is a lazy dask array."""
    X, y, X_test = data
    ref = GPClassifier(method=method, n_inducing=10, max_iter=15, random_state=0).fit(X, y)
    model = GPClassifier(method=method, n_inducing=10, max_iter=15, random_state=0, client=client).fit(
        da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    )
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-8)
    np.testing.assert_allclose(model.inducing_points_, ref.inducing_points_, rtol=1e-8, atol=1e-10)
    lazy = model.predict_proba(da.from_array(X_test, chunks=(30, 2)))
    assert isinstance(lazy, da.Array) and lazy.chunks[0] == (30, 30, 30, 10)
    np.testing.assert_allclose(lazy.compute(), ref.predict_proba(X_test), rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(model.predict(da.from_array(X_test, chunks=(30, 2))).compute(), ref.predict(X_test))


def test_ep_sites_stay_on_the_workers(client, data, monkeypatch):
    """EP's per-row sites are dask arrays persisted on the workers; the driver gathers only the chunks'
    reduced (O(m^2)) results: nothing of n rows comes back during fit."""
    from agpc.inference import dask_engine

    X, y, _ = data
    gathered = []
    real = dask_engine._tree

    def spy(client_, futures, combine):
        out = real(client_, futures, combine)
        gathered.append(out)
        return out

    monkeypatch.setattr(dask_engine, "_tree", spy)
    GPClassifier(method="ep", n_inducing=10, max_iter=3, random_state=0, client=client).fit(
        da.from_array(X, chunks=(200, 2)), da.from_array(y, chunks=200)
    )
    for future in gathered:
        value = future.result()
        arrays = value.values() if isinstance(value, dict) else value
        for a in arrays:
            if hasattr(a, "shape"):
                assert 600 not in a.shape


def test_dask_input_errors_are_clear(client, data):
    X, y, _ = data
    Xd = da.from_array(X, chunks=(200, 2))
    with pytest.raises(ValueError, match="minibatch training on a dask array"):
        GPClassifier(batch_size=50, client=client).fit(Xd, da.from_array(y, chunks=200))
    with pytest.raises(ValueError, match="ep', 'sep' or 'adf'"):
        GPClassifier(method="svi", client=client).fit(Xd, da.from_array(y, chunks=200))
    bad = X.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        GPClassifier(client=client).fit(da.from_array(bad, chunks=(200, 2)), da.from_array(y, chunks=200))
