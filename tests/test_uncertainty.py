"""predict_uncertainty: the predictive entropy and its split into the expected entropy (aleatoric) and the mutual
information between label and latent (epistemic, BALD; Houlsby et al. 2011), against scipy's adaptive quadrature,
on every backend, for every likelihood, and the same whatever the batch of rows predicted together."""

import importlib.util
import math
import pathlib

import array_api_strict
import numpy as np
import pytest
from scipy import integrate, special, stats

from agpc import GPClassifier
from agpc import methods as M
from agpc import uncertainty as U
from agpc.datasets import make_banana
from agpc.likelihoods import PROBIT, likelihood_by_name
from conftest import to_np, to_xp
from helpers import binary_toy, three_classes

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "examples" / "active_learning.py"

# (mean, var) rows from the certain to the uninformed: tiny and huge variances, means deep in either tail
MEANS = np.array([0.0, 0.3, -2.0, 5.0, 30.0, -100.0, 0.0, 3.0, 1.0, 0.0, 8.0, -20.0, 10.0, 2.0, -0.7])
VARS = np.array([1e-6, 0.01, 1.0, 4.0, 1e-3, 50.0, 1e4, 1e6, 100.0, 1e-9, 0.5, 400.0, 1e8, 1e-12, 2.5])


def scipy_expected_entropy(mean, var, likelihood):
    """E_{N(f | mean, var)} H[p(y | f)] by scipy.integrate.quad, the integrand written from the definitions."""
    sd = math.sqrt(var)

    def integrand(f):
        if likelihood == "probit":
            p = special.ndtr(f)
        else:
            p = special.expit(f)
        return stats.norm.pdf(f, mean, sd) * (special.entr(p) + special.entr(1.0 - p))

    # beyond |f| = 60 (probit) or 150 (logistic) the entropy is below 1e-60; the normal's mass beyond 40 sd is 0
    reach = 60.0 if likelihood == "probit" else 150.0
    low, high = max(mean - 40 * sd, -reach), min(mean + 40 * sd, reach)
    if high <= low:
        return 0.0
    breaks = [p for p in (0.0, mean, mean - sd, mean + sd) if low < p < high]
    return integrate.quad(integrand, low, high, points=breaks, limit=1000, epsabs=1e-14, epsrel=1e-12)[0]


@pytest.mark.parametrize("likelihood", ["probit", "logistic"])
def test_expected_entropy_matches_scipy_quad_per_row(xp_device, likelihood):
    xp, device = xp_device
    got = to_np(likelihood_by_name(likelihood).expected_entropy(to_xp(MEANS, xp, device), to_xp(VARS, xp, device)))
    reference = np.array([scipy_expected_entropy(m, v, likelihood) for m, v in zip(MEANS, VARS)])
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-10)


def test_houlsby_closed_form_is_close_to_the_quadrature():
    """Houlsby et al. (2011)'s closed form is an approximation: 1.9e-3 nats at most on this grid (measured 1.87e-3,
    at mean -2, var 1e-6), and it is not the quadrature (it differs by more than 1e-4 somewhere)."""
    mean, var = (a.ravel() for a in np.meshgrid(np.linspace(-10, 10, 201), np.logspace(-6, 6, 61)))
    gap = np.abs(PROBIT.houlsby_expected_entropy(mean, var) - PROBIT.expected_entropy(mean, var))
    assert gap.max() < 1.9e-3
    assert gap.max() > 1e-4


@pytest.fixture(scope="module")
def binary_model():
    X, y = make_banana(120, random_state=0)
    return GPClassifier(max_iter=30, random_state=0).fit(X, y), X


@pytest.fixture(scope="module")
def fitted_models(binary_model):
    X, y = binary_toy(80, seed=3)
    X3, y3 = three_classes(90, seed=1)
    return {
        "ep exact": binary_model,
        "svi probit": (GPClassifier(method="svi", n_inducing=8, max_iter=15, random_state=0).fit(X, y), X),
        "svi logistic": (GPClassifier(method="svi", likelihood="logistic", n_inducing=8, max_iter=15,
                                      random_state=0).fit(X, y), X),
        "vi-jj": (GPClassifier(method="vi-jj", n_inducing=8, max_iter=10, random_state=0).fit(X, y), X),
        "multiclass ep": (GPClassifier(n_inducing=8, max_iter=10, random_state=0).fit(X3, y3), X3),
        "multiclass svi": (GPClassifier(method="svi", n_inducing=8, max_iter=10, random_state=0).fit(X3, y3), X3),
    }


@pytest.mark.parametrize("name", ["ep exact", "svi probit", "svi logistic", "vi-jj", "multiclass ep",
                                  "multiclass svi"])
def test_the_split_adds_up_and_is_bounded(fitted_models, name):
    model, X = fitted_models[name]
    total, aleatoric, epistemic = model.predict_uncertainty(X)
    proba = model.predict_proba(X)
    np.testing.assert_allclose(total, -np.sum(special.xlogy(proba, proba), axis=1), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(aleatoric + epistemic, total, rtol=1e-14, atol=1e-16)
    assert np.all(aleatoric >= 0) and np.all(epistemic >= 0) and np.all(epistemic <= total)
    assert np.all(total <= math.log(len(model.classes_)) + 1e-12)
    if len(model.classes_) == 2:  # each row's expected entropy is scipy's, from the model's own latent marginal
        mean, var = model.predict_latent(X[:6])
        reference = [scipy_expected_entropy(m, v, model.likelihood_) for m, v in zip(mean, var)]
        np.testing.assert_allclose(aleatoric[:6], reference, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", M.methods_supporting("uncertainty"))
def test_every_method_the_registry_says_gives_the_split(name):
    """The support table's `predict_uncertainty` column (``agpc.methods``): every method it says yes for gives the
    split of its own predictive (two classes), which adds up to the entropy of ``predict_proba``."""
    X, y = binary_toy(40, seed=4)
    model = GPClassifier(method=name, n_inducing=5, max_iter=3, random_state=0).fit(X, y)
    total, aleatoric, epistemic = model.predict_uncertainty(X)
    proba = model.predict_proba(X)
    np.testing.assert_allclose(total, -np.sum(special.xlogy(proba, proba), axis=1), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(aleatoric + epistemic, total, rtol=1e-14, atol=1e-16)
    assert np.all(aleatoric >= 0) and np.all(epistemic >= 0)


def test_multiclass_expected_entropy_is_the_likelihoods_constant(fitted_models):
    """Robust max: H[y | f] is the entropy of (1 - eps, eps / (C - 1), ...) whatever f, so the aleatoric part is that
    number at every row. Multiclass EP's label is the argmax of f: no aleatoric part, all of it epistemic."""
    model, X = fitted_models["multiclass svi"]
    eps, C = 1e-3, 3
    p_given_f = np.array([1 - eps] + [eps / (C - 1)] * (C - 1))
    _, aleatoric, _ = model.predict_uncertainty(X)
    np.testing.assert_allclose(aleatoric, -np.sum(p_given_f * np.log(p_given_f)), rtol=1e-14)
    model, X = fitted_models["multiclass ep"]
    total, aleatoric, epistemic = model.predict_uncertainty(X)
    assert np.all(aleatoric == 0.0)
    np.testing.assert_array_equal(epistemic, total)


def test_epistemic_is_small_where_data_are_dense(binary_model):
    model, X = binary_model
    far = X + 8.0 * X.std(axis=0)  # several lengthscales from every training row
    near = model.predict_uncertainty(X).epistemic
    away = model.predict_uncertainty(far).epistemic
    assert np.median(away) > 3 * np.median(near)
    assert np.min(away) > np.max(near)


def test_houlsby_method_of_the_estimator(binary_model, fitted_models):
    model, X = binary_model
    exact = model.predict_uncertainty(X)
    approximate = model.predict_uncertainty(X, method="houlsby")
    np.testing.assert_array_equal(approximate.total, exact.total)
    assert 0 < np.max(np.abs(approximate.aleatoric - exact.aleatoric)) < 1.9e-3
    for name in ("svi logistic", "multiclass ep"):
        other, X_other = fitted_models[name]
        with pytest.raises(ValueError, match="houlsby"):
            other.predict_uncertainty(X_other, method="houlsby")
    with pytest.raises(ValueError, match="unknown uncertainty method 'monte-carlo'"):
        model.predict_uncertainty(X, method="monte-carlo")


@pytest.mark.parametrize("likelihood", ["probit", "logistic", "robust-max", "multiclass argmax"])
def test_every_backend_gives_numpys_numbers(xp_device, likelihood):
    xp, device = xp_device
    rng = np.random.default_rng(0)
    C = 3 if likelihood in ("robust-max", "multiclass argmax") else 2
    shape = (7, C) if C > 2 else (7,)
    mean, var = 2 * rng.normal(size=shape), rng.uniform(0.01, 5.0, size=shape)
    log_p = np.log(rng.dirichlet(np.ones(C), size=7))
    name = "probit" if likelihood == "multiclass argmax" else likelihood
    reference = U.uncertainty(mean, var, log_p, name)
    got = U.uncertainty(to_xp(mean, xp, device), to_xp(var, xp, device), to_xp(log_p, xp, device), name)
    for ref, value in zip(reference, got):
        assert value.device == to_xp(mean, xp, device).device
        np.testing.assert_allclose(to_np(value), ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("device", [None, array_api_strict.Device("device1")], ids=["default", "device1"])
def test_strict_rows_give_strict_results_on_their_device(binary_model, device):
    model, X = binary_model
    Xs = array_api_strict.asarray(X, device=device)
    result = model.predict_uncertainty(Xs)
    for value, reference in zip(result, model.predict_uncertainty(X)):
        assert type(value).__module__.startswith("array_api_strict") and value.device == Xs.device
        np.testing.assert_allclose(to_np(value), reference, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["ep exact", "svi logistic", "multiclass svi"])
def test_a_rows_prediction_does_not_depend_on_its_batch(fitted_models, name):
    """Quadrature, not sampling: rows predicted in two batches get what they get all at once, to the last bits
    that BLAS's matrix products leave to the shape of the batch (measured: 3e-16 absolute, 1.1e-15 relative, on
    rows at a block edge of the kernel matrix product); the split of the latent into uncertainty is row by row,
    bit for bit (next test)."""
    model, X = fitted_models[name]
    half = len(X) // 2 + 3
    np.testing.assert_allclose(model.predict_proba(X),
                               np.concatenate([model.predict_proba(X[:half]), model.predict_proba(X[half:])]),
                               rtol=1e-14, atol=1e-16)
    whole, parts = model.predict_uncertainty(X), zip(model.predict_uncertainty(X[:half]),
                                                      model.predict_uncertainty(X[half:]))
    for value, (first, second) in zip(whole, parts):
        np.testing.assert_allclose(value, np.concatenate([first, second]), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("likelihood", ["probit", "logistic", "robust-max"])
def test_the_split_is_computed_row_by_row(likelihood):
    """From the same latent marginals and predictive, a batch and its two halves give the same bits."""
    rng = np.random.default_rng(1)
    C = 3 if likelihood == "robust-max" else 2
    shape = (41, C) if C > 2 else (41,)
    mean, var = 2 * rng.normal(size=shape), rng.uniform(0.01, 50.0, size=shape)
    log_p = np.log(rng.dirichlet(np.ones(C), size=41))
    whole = U.uncertainty(mean, var, log_p, likelihood)
    first, second = U.uncertainty(mean[:17], var[:17], log_p[:17], likelihood), \
        U.uncertainty(mean[17:], var[17:], log_p[17:], likelihood)
    for value, a, b in zip(whole, first, second):
        np.testing.assert_array_equal(value, np.concatenate([a, b]))


def test_the_active_learning_example_runs_small():
    spec = importlib.util.spec_from_file_location("active_learning", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    scores = example.run("bald", seed=0, n_picks=3, n_pool=40, n_test=60, max_iter=5, report_at=(0, 3))
    assert set(scores) == {0, 3}
    for nll, accuracy in scores.values():
        assert np.isfinite(nll) and 0.0 <= accuracy <= 1.0
    results = example.main(seeds=range(2), n_picks=2, n_pool=30, n_test=40, max_iter=5, report_at=(2,))
    assert [len(runs) for runs in results.values()] == [2, 2]
