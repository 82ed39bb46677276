"""A likelihood of the user's own, added by ``agpc.likelihoods.register_likelihood`` alone (no edit to the engines,
prediction, uncertainty or the model file): a probit with a fixed label-flip rate eps,

    p(y | f) = eps + (1 - 2 eps) Phi(y f),

defined in this file. The EP methods and GFITC train it through its ``site_terms``, SVI through its
``log_density``; it fits, predicts, saves, loads, resumes from a checkpoint and continues by ``partial_fit``. Its own
algebra is checked here by finite differences, and the plumbing by its limit eps = 0, where it is the probit: every
path must then give the probit's model (to round-off: the formulas differ in their association)."""

import io
import json
import math
import pickle

import numpy as np
import pytest
from helpers import interrupted_then_resumed
from scipy import stats

from agpc import GPClassifier, checkpoints
from agpc.backend import array_namespace, log_ndtr, log_normal_pdf
from agpc.datasets import make_banana
from agpc.likelihoods import (
    LIKELIHOODS,
    PROBIT,
    Likelihood,
    Probit,
    SiteTerms,
    register_likelihood,
    unregister_likelihood,
)


class FlipProbit(Likelihood):
    """p(y | f) = eps + (1 - 2 eps) Phi(y f): the probit with each label flipped at random with probability eps."""

    def __init__(self, flip_rate, name):
        self.flip_rate = float(flip_rate)
        self.name = name

    def __repr__(self):
        return f"FlipProbit({self.flip_rate!r}, {self.name!r})"

    def _log_terms(self, t):
        """log p at t = y f / scale, and log((1 - 2 eps) N(t)) - log p (the ratio of d p / dt to p)."""
        xp = array_namespace(t)
        log_keep = math.log1p(-2.0 * self.flip_rate)
        floor = math.log(self.flip_rate) if self.flip_rate > 0 else -math.inf
        log_p = xp.logaddexp(xp.full_like(t, floor), log_keep + log_ndtr(t))
        return log_p, xp.exp(log_keep + log_normal_pdf(t) - log_p)

    def log_density(self, y, f):
        value, ratio = self._log_terms(y * f)
        return value, y * ratio

    def site_terms(self, y, mean, variance):
        """Z = eps + (1 - 2 eps) Phi(z), z = y a / sqrt(b): alpha = y ratio / sqrt(b); Z depends on (a, b) through z
        alone, as the probit's does, so gamma = alpha^2 + alpha a / b and kappa = alpha a / b (left None)."""
        xp = array_namespace(mean)
        sqrt_b = xp.sqrt(variance)
        log_z, ratio = self._log_terms(y * mean / sqrt_b)
        alpha = y * ratio / sqrt_b
        return SiteTerms(log_z, alpha, alpha * alpha + alpha * mean / variance)


FLIP = "flip-probit-test"
EXACT_PROBIT = "flip-probit-zero-test"


@pytest.fixture(autouse=True)
def registered():
    register_likelihood(FlipProbit(0.1, FLIP))
    register_likelihood(FlipProbit(0.0, EXACT_PROBIT))
    yield
    for name in (FLIP, EXACT_PROBIT):
        if name in LIKELIHOODS:
            unregister_likelihood(name)


def _data(n=160, seed=0):
    X, y = make_banana(n, random_state=seed)
    return X, y


# -- the likelihood's own algebra ------------------------------------------------------------------------

def test_site_terms_are_the_derivatives_of_log_z():
    """alpha = d log Z / da and kappa = -2 d log Z / db by central differences of log Z (checked against scipy's
    normal cdf), gamma = -d alpha / da by central differences of alpha."""
    likelihood = LIKELIHOODS[FLIP]
    rng = np.random.default_rng(0)
    y = rng.choice([-1.0, 1.0], 50)
    a, b = rng.normal(size=50) * 3, rng.uniform(1.1, 5.0, 50)
    terms = likelihood.site_terms(y, a, b)
    np.testing.assert_allclose(terms.log_z, np.log(0.1 + 0.8 * stats.norm.cdf(y * a / np.sqrt(b))), rtol=1e-12)
    h = 1e-5

    def log_z(a, b):
        return likelihood.site_terms(y, a, b).log_z

    alpha = (log_z(a + h, b) - log_z(a - h, b)) / (2 * h)
    gamma = -(likelihood.site_terms(y, a + h, b).alpha - likelihood.site_terms(y, a - h, b).alpha) / (2 * h)
    kappa = -2 * (log_z(a, b + h) - log_z(a, b - h)) / (2 * h)
    np.testing.assert_allclose(terms.alpha, alpha, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(terms.gamma, gamma, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(terms.alpha * a / b, kappa, rtol=1e-7, atol=1e-10)
    value, slope = likelihood.log_density(y, a)
    np.testing.assert_allclose(slope, (likelihood.log_density(y, a + h)[0] - likelihood.log_density(y, a - h)[0])
                               / (2 * h), rtol=1e-7, atol=1e-10)


def test_registration_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="built in"):
        register_likelihood(FlipProbit(0.1, "probit"))
    with pytest.raises(ValueError, match="registered already"):
        register_likelihood(FlipProbit(0.2, FLIP))
    with pytest.raises(TypeError, match="takes an agpc.likelihoods.Likelihood"):
        register_likelihood(PROBIT.site_terms)
    with pytest.raises(ValueError, match="printable name"):
        register_likelihood(FlipProbit(0.1, "bad\x1b[2Jname"))

    class Nothing(Likelihood):
        name = "nothing-test"

    class SitesOnly(Likelihood):  # (EP could train it, but nothing could predict with it)
        name = "sites-only-test"
        site_terms = FlipProbit.site_terms

    class ProbitVariant(Probit):  # (it would predict with the probit's closed form whatever it trains)
        name = "probit-variant-test"
        log_density = FlipProbit.log_density

    for likelihood in (Nothing(), SitesOnly()):
        with pytest.raises(ValueError, match="defines no log_density"):
            register_likelihood(likelihood)
    with pytest.raises(ValueError, match="is a Probit: it would predict with Probit's closed forms"):
        register_likelihood(ProbitVariant())
    with pytest.raises(ValueError, match="built in and cannot be unregistered"):
        unregister_likelihood("probit")


# -- the limit eps = 0 is the probit, on every path that takes a registered likelihood ------------------------

@pytest.mark.parametrize("params", [
    dict(method="ep", n_inducing=12, max_iter=8),  # batch EP (sparse)
    dict(method="ep", max_iter=8, n_inducing="auto"),  # the exact model (m = n: exact_ep's passes)
    dict(method="ep", n_inducing=12, batch_size=40, max_iter=3),  # minibatch EP
    dict(method="sep", n_inducing=12, max_iter=8),
    dict(method="adf", n_inducing=12, batch_size=40, max_iter=3),
    dict(method="svi", n_inducing=12, batch_size=40, max_iter=3),
    dict(method="gfitc", n_inducing=12, max_iter=4),
], ids=["ep", "exact", "minibatch-ep", "sep", "adf-minibatch", "svi", "gfitc"])
def test_every_path_trains_it(params):
    """At eps = 0 the path trains the probit's model; at eps = 0.1 another one (its log Z more than a nat away: a
    path that trained the probit whatever the likelihood would give the probit's), whose probabilities stay in
    [eps, 1 - eps]."""
    X, y = _data(120, 1)
    probit = GPClassifier(random_state=0, **params).fit(X, y)
    own = GPClassifier(random_state=0, likelihood=EXACT_PROBIT, **params).fit(X, y)
    assert own.likelihood_ == EXACT_PROBIT
    np.testing.assert_allclose(own.log_marginal_likelihood_, probit.log_marginal_likelihood_, rtol=1e-7)
    np.testing.assert_allclose(own.predict_proba(X), probit.predict_proba(X), rtol=1e-6, atol=1e-9)
    flips = GPClassifier(random_state=0, likelihood=FLIP, **params).fit(X, y)
    assert abs(flips.log_marginal_likelihood_ - probit.log_marginal_likelihood_) > 1.0
    proba = flips.predict_proba(X)
    assert proba.min() >= 0.1 - 1e-12 and proba.max() <= 0.9 + 1e-12


# -- with flips: its model, not the probit's, everywhere a model is read -------------------------------------

@pytest.mark.parametrize("method", ["ep", "svi"])
def test_it_fits_predicts_saves_and_loads(method):
    """Its probabilities stay in [eps, 1 - eps] (the probit's reach 0 and 1 on the banana's separable parts), the
    validation scores and uncertainty are its own, and a saved model loads to the same predictions, while a file
    whose likelihood is not registered is refused by name."""
    X, y = _data()
    X_val, y_val = _data(80, 5)
    model = GPClassifier(method=method, likelihood=FLIP, n_inducing=10, random_state=0,
                         **({"batch_size": 40, "max_iter": 100} if method == "svi" else {"max_iter": 30})).fit(
        X, y, validation_data=(X_val, y_val))
    proba = model.predict_proba(X)
    assert proba.min() >= 0.1 - 1e-12 and proba.max() <= 0.9 + 1e-12
    assert model.history_["validation_error"][-1] < 0.2  # (it learned something)
    log_p = np.log(model.predict_proba(X_val)[np.arange(len(y_val)), np.searchsorted(model.classes_, y_val)])
    np.testing.assert_allclose(model.history_["validation_nll"][-1], -log_p.mean(), rtol=1e-6)
    floor = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))  # H[y | f] >= H(eps): no f makes a label certain
    assert np.all(model.predict_uncertainty(X).aleatoric >= floor - 1e-9)
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = GPClassifier.load(buffer)
    assert loaded.likelihood_ == FLIP
    np.testing.assert_array_equal(loaded.predict_proba(X), proba)
    unregister_likelihood(FLIP)
    buffer.seek(0)
    with pytest.raises(ValueError, match=f"not a valid agpc model file.*register_likelihood.*got '{FLIP}'"):
        GPClassifier.load(buffer)


@pytest.mark.parametrize("params", [
    dict(method="ep", n_inducing=8, batch_size=100, max_iter=3),
    dict(method="svi", n_inducing=8, batch_size=100, max_iter=3),
], ids=["minibatch-ep", "svi"])
def test_an_interrupted_fit_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch, params):
    X, y = _data(300, 2)
    reference, resumed = interrupted_then_resumed(monkeypatch, dict(params, likelihood=FLIP, random_state=0),
                                                  tmp_path / "run.ckpt", 5, X, y)
    np.testing.assert_allclose(resumed.predict_proba(X), reference.predict_proba(X), rtol=1e-10, atol=1e-14)


def test_partial_fit_trains_it_and_continues_with_it():
    """SEP's stream trains the registered likelihood at every call (at eps = 0: the probit's stream, step for step;
    at eps = 0.1 another one), and a model fitted by fit, or loaded, goes on with it."""
    X, y = _data(200, 3)
    models = {}
    for likelihood in (None, EXACT_PROBIT, FLIP):
        model = GPClassifier(method="sep", likelihood=likelihood, n_inducing=8, random_state=0)
        for lo in range(0, 200, 50):
            model.partial_fit(X[lo:lo + 50], y[lo:lo + 50], classes=np.unique(y), n_total=200)
        models[likelihood] = model
    assert models[EXACT_PROBIT].likelihood_ == EXACT_PROBIT
    np.testing.assert_allclose(models[EXACT_PROBIT].predict_proba(X), models[None].predict_proba(X), rtol=1e-6,
                               atol=1e-9)
    assert models[FLIP]._trainer.engine.likelihood is LIKELIHOODS[FLIP]
    flip_mean, probit_mean = models[FLIP].predict_latent(X)[0], models[None].predict_latent(X)[0]
    assert np.max(np.abs(flip_mean - probit_mean)) > 0.1  # (its sites are not the probit's)
    fitted = GPClassifier(method="sep", likelihood=FLIP, n_inducing=8, max_iter=3, random_state=0).fit(X, y)
    buffer = io.BytesIO()
    fitted.save(buffer)
    buffer.seek(0)
    for model in (fitted, GPClassifier.load(buffer)):
        model.partial_fit(X[:50], y[:50], n_total=250)
        assert model.likelihood_ == FLIP and model._trainer.engine.likelihood is LIKELIHOODS[FLIP]


def test_a_fitted_model_keeps_its_likelihood_whatever_the_registry_does_later():
    """Replacing the registered likelihood of that name, or unregistering it, changes no fitted model: the model
    keeps the object it was fitted with (and a pickle carries it; dask's lazy prediction sends that pickle)."""
    X, y = _data(120, 4)
    model = GPClassifier(method="ep", likelihood=FLIP, n_inducing=8, max_iter=5, random_state=0).fit(X, y)
    proba = model.predict_proba(X)
    register_likelihood(FlipProbit(0.3, FLIP), replace=True)
    np.testing.assert_array_equal(model.predict_proba(X), proba)
    unregister_likelihood(FLIP)
    np.testing.assert_array_equal(model.predict_proba(X), proba)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(model)).predict_proba(X), proba)
    assert np.all(model.predict_uncertainty(X).aleatoric > 0)


def test_a_checkpoint_of_another_likelihood_does_not_resume(tmp_path):
    X, y = _data(120, 5)
    path = tmp_path / "run.ckpt"
    params = dict(method="ep", n_inducing=8, max_iter=3, random_state=0, checkpoint_path=path, checkpoint_every=1)
    GPClassifier(**params).fit(X, y)
    with pytest.raises(ValueError, match=r"different training run: likelihood: 'probit' there, \"flip-probit-test: "
                                         r"FlipProbit\(0.1, 'flip-probit-test'\)\" here"):
        GPClassifier(**params, likelihood=FLIP).fit(X, y, resume=True)


def _forged_model_file(likelihood):
    """A binary SEP model's file whose header names ``likelihood`` (its parameters left as they were)."""
    X, y = _data(100, 6)
    buffer = io.BytesIO()
    GPClassifier(method="sep", n_inducing=6, max_iter=2, random_state=0).fit(X, y).save(buffer)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    header = dict(json.loads(str(arrays[checkpoints.HEADER_KEY])), likelihood=likelihood)
    forged = io.BytesIO()
    np.savez(forged, **dict(arrays, **{checkpoints.HEADER_KEY: np.asarray(json.dumps(header))}))
    forged.seek(0)
    return forged


def test_a_model_file_whose_likelihood_is_not_its_parameters_is_refused():
    """partial_fit would go on with the parameters' likelihood, prediction with the file's."""
    with pytest.raises(ValueError, match=f"likelihood: '{FLIP}', but its parameters .* fit 'probit'"):
        GPClassifier.load(_forged_model_file(FLIP))


def test_a_model_files_likelihood_name_is_refused_in_a_bounded_message_that_helps():
    """A built-in name of another kind of model is not "registered" advice; a huge or hostile name is shown
    escaped and cut short (the header may hold 64 MiB)."""
    with pytest.raises(ValueError, match="'ordinal' is not a likelihood of a binary model"):
        GPClassifier.load(_forged_model_file("ordinal"))
    with pytest.raises(ValueError, match="none of that name is registered") as refused:
        GPClassifier.load(_forged_model_file("x" * 100_000 + "\x1b[2J"))
    assert len(str(refused.value)) < 600 and "\x1b" not in str(refused.value)


def test_methods_that_cannot_train_it_and_multiclass_data_refuse_it():
    X, y = _data(60)
    with pytest.raises(ValueError, match="built on the logistic"):
        GPClassifier(method="vi-jj", likelihood=FLIP, max_iter=1).fit(X, y)
    y3 = np.arange(60) % 3
    with pytest.raises(ValueError, match=f"likelihood='{FLIP}' is a registered binary likelihood"):
        GPClassifier(method="ep", likelihood=FLIP, max_iter=1).fit(X, y3)


def test_partial_fit_goes_on_with_the_object_its_model_keeps():
    """A stream, and a fitted model continued by partial_fit, train the likelihood object the model was fitted
    with, whatever was registered under its name since (a model of neither otherwise)."""
    X, y = _data(200, 7)
    original = LIKELIHOODS[FLIP]
    live = GPClassifier(method="sep", likelihood=FLIP, n_inducing=6, random_state=0)
    live.partial_fit(X[:100], y[:100], classes=np.unique(y), n_total=200)
    fitted = GPClassifier(method="sep", likelihood=FLIP, n_inducing=6, max_iter=2, random_state=0).fit(X, y)
    register_likelihood(FlipProbit(0.3, FLIP), replace=True)
    for model in (live, fitted):
        model.partial_fit(X[100:], y[100:], n_total=300)
        assert model._trainer.engine.likelihood is original and model.fitted_model().likelihood is original
