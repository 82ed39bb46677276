"""The synthetic generators: shapes, standardisation, determinism, known Bayes error."""

import numpy as np
import pytest

from agpc import GPClassifier
from agpc.datasets import airline_like_bayes_error, airline_like_posterior, make_airline_like


def test_airline_like_is_standardised_and_deterministic():
    X, y = make_airline_like(100000, random_state=3)
    assert X.shape == (100000, 8) and y.shape == (100000,)
    assert set(np.unique(y)) == {-1, 1}
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=0.02)
    np.testing.assert_allclose(X.std(axis=0), 1.0, atol=0.02)
    X2, y2 = make_airline_like(100000, random_state=3)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
def test_airline_like_on_disk_equals_in_memory_whatever_the_chunk(tmp_path, fmt):
    if fmt == "zarr":
        pytest.importorskip("zarr")
    X, y = make_airline_like(150000, random_state=5)
    X_disk, y_disk = make_airline_like(150000, random_state=5, path=tmp_path, format=fmt, chunk_size=70000)
    np.testing.assert_array_equal(np.asarray(X_disk[:]), X)
    np.testing.assert_array_equal(np.asarray(y_disk[:]), y)


def test_airline_like_bayes_error_is_in_the_stated_range_and_nonlinear():
    """Bayes error 10-20% (the issue's range); a linear model is clearly worse (the task is non-linear)."""
    bayes = airline_like_bayes_error(n_mc=200000)
    assert 0.10 < bayes < 0.20
    from sklearn.linear_model import LogisticRegression

    X, y = make_airline_like(40000, random_state=7)
    linear_error = 1 - LogisticRegression().fit(X[:20000], y[:20000]).score(X[20000:], y[20000:])
    assert linear_error > bayes + 0.05
    p = airline_like_posterior(X[:5])
    assert np.all((p > 0) & (p < 1))


def test_sep_minibatch_learns_the_airline_like_task_from_disk(tmp_path):
    X_disk, y_disk = make_airline_like(20000, random_state=9, path=tmp_path)
    X_test, y_test = make_airline_like(5000, random_state=10)
    model = GPClassifier(method="sep", n_inducing=30, batch_size=200, max_iter=2, random_state=0).fit(X_disk, y_disk)
    error = 1 - model.score(X_test, y_test)
    assert error < airline_like_bayes_error(n_mc=100000) + 0.05, error
