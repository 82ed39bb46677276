"""The ordinal logistic (proportional-odds) baseline of benchmarks/_ordinal_logistic.py: its gradient by central
finite differences, its log-probabilities against the plain difference of two logistic functions, the fitted model
at a stationary point of its penalised likelihood, and (where statsmodels is installed) against statsmodels'
OrderedModel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

# benchmarks/ is a folder of scripts, not a package: the module is loaded from its file
_SPEC = importlib.util.spec_from_file_location(
    "ordinal_logistic", Path(__file__).resolve().parents[1] / "benchmarks" / "_ordinal_logistic.py")
ordinal_logistic = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ordinal_logistic)
OrdinalLogisticRegression = ordinal_logistic.OrdinalLogisticRegression
cut_points_of, log_interval, objective = ordinal_logistic.cut_points_of, ordinal_logistic.log_interval, \
    ordinal_logistic.objective


def ordinal_data(seed, n=300, d=3, cut_points=(-1.5, -0.2, 0.8, 2.0)):
    """Rows from the proportional-odds model itself: eta = X w, y = number of cut points below eta + logistic noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w = np.linspace(1.5, -0.7, d)
    latent = X @ w + rng.logistic(size=n)
    return X, np.searchsorted(np.asarray(cut_points), latent), w, np.asarray(cut_points)


@pytest.mark.parametrize("alpha", [0.0, 0.1])
def test_gradient_matches_finite_differences(alpha):
    X, y, _, _ = ordinal_data(0, n=60)
    rng = np.random.default_rng(1)
    params = np.concatenate([rng.normal(size=X.shape[1]), [-1.0], rng.normal(scale=0.5, size=3)])
    _, grad = objective(params, X, y, alpha)
    step = 1e-6
    numeric = np.array([(objective(params + step * e, X, y, alpha)[0] - objective(params - step * e, X, y, alpha)[0])
                        / (2 * step) for e in np.eye(params.size)])
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


def test_log_interval_is_the_log_of_the_difference():
    a = np.array([0.5, 3.0, -2.0, 12.0, np.inf, 1.0])
    c = np.array([-0.5, 2.9, -np.inf, 11.0, 0.0, -1.0])
    np.testing.assert_allclose(np.exp(log_interval(a, c)), expit(a) - expit(c), rtol=1e-10, atol=1e-300)
    # far in the upper tail the plain difference rounds to zero; the log form keeps it
    assert log_interval(np.array([60.0]), np.array([59.0]))[0] == pytest.approx(
        -59.0 + np.log(1 - np.exp(-1.0)), rel=1e-9)


def test_fit_reaches_a_stationary_point_and_recovers_the_model():
    X, y, w, cut_points = ordinal_data(2, n=2000)
    model = OrdinalLogisticRegression(alpha=1e-4).fit(X, y)
    packed = np.concatenate([model.coef_, [model.cut_points_[0]], np.log(np.diff(model.cut_points_))])
    np.testing.assert_allclose(cut_points_of(packed, X.shape[1]), model.cut_points_)
    assert np.max(np.abs(objective(packed, X, y, 1e-4)[1])) < 1e-4
    np.testing.assert_allclose(model.coef_, w, atol=0.15)
    np.testing.assert_allclose(model.cut_points_, cut_points, atol=0.2)
    proba = model.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    # the (nearly) maximum-likelihood fit explains the rows at least as well as the parameters that made them
    true = np.concatenate([w, [cut_points[0]], np.log(np.diff(cut_points))])
    assert objective(packed, X, y, 0.0)[0] <= objective(true, X, y, 0.0)[0]
    assert np.mean(model.predict(X) == y) == np.mean(proba.argmax(axis=1) == y)


def test_against_statsmodels_ordered_model():
    """statsmodels' OrderedModel (logit link, maximum likelihood, no penalty) on the same rows: the same weights and
    cut points at alpha = 0, to the optimisers' tolerance."""
    ordinal_model = pytest.importorskip("statsmodels.miscmodels.ordinal_model")
    X, y, _, _ = ordinal_data(3, n=400)
    ours = OrdinalLogisticRegression(alpha=0.0).fit(X, y)
    theirs = ordinal_model.OrderedModel(y, X, distr="logit").fit(method="bfgs", disp=False, maxiter=2000, gtol=1e-8)
    d = X.shape[1]
    np.testing.assert_allclose(ours.coef_, theirs.params[:d], atol=1e-4)
    # statsmodels' thresholds: the first, then the logs of the increments
    their_cuts = theirs.model.transform_threshold_params(theirs.params)[1:-1]
    np.testing.assert_allclose(ours.cut_points_, their_cuts, atol=1e-4)
