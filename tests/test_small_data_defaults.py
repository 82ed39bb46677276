"""GPClassifier's default weak priors (``kernel_prior="auto"``, issue 19, docs/small_data_defaults.md): where they
are centred, that the user's own priors win, that the climbed objective's gradient with them matches finite
differences, that ``kernel_prior=None`` is maximum likelihood (no prior anywhere), and that they travel with a
model file (old files load as None, what they were trained with)."""

import io
import math
import os

import numpy as np
import pytest
from scipy import stats

import agpc
from agpc import RBF, GPClassifier, Matern52, RationalQuadratic
from agpc.inference import engines
from agpc.inference import variational as V
from agpc.kernels import DEFAULT_PRIOR_SCALE, kernel_from_spec, log_prior_and_grads, with_default_priors
from agpc.priors import Gamma, LogNormal, prior_from_spec
from conftest import central_differences, check_parameter_gradients, to_np, to_xp

HERE = os.path.dirname(os.path.abspath(__file__))


def _data(n=80, seed=0, scales=(1.0, 30.0, 0.02)):
    """Three features on very different scales (the classifier does not standardise), labels from all three."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, len(scales)))
    y = (Z[:, 0] + np.sin(2 * Z[:, 1]) - 0.5 * Z[:, 2] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return Z * np.asarray(scales), y


# -- the prior family: a LogNormal with one loc per feature -------------------------------------------------------

def test_per_feature_lognormal_is_scipys_density_entry_by_entry():
    loc = [0.3, -1.2, 2.0]
    prior = LogNormal(loc, 0.7)
    theta = np.array([0.5, 1.5, 9.0])
    expected = [stats.lognorm(0.7, scale=math.exp(mu)).logpdf(t) for mu, t in zip(loc, theta)]
    np.testing.assert_allclose(prior.log_density(theta), expected, rtol=1e-12)
    numeric = [central_differences(lambda v, j=j: float(prior.log_density(v)[j]), theta)[j] for j in range(3)]
    np.testing.assert_allclose(prior.dlog_density(theta), numeric, rtol=1e-7)
    assert prior.entries == 3 and LogNormal(0.0, 1.0).entries == 1
    assert prior_from_spec(prior.spec()) == prior and prior.spec()["loc"] == loc
    assert hash(prior) == hash(LogNormal(tuple(loc), 0.7))


@pytest.mark.parametrize("loc,scale,match", [([], 1.0, "loc"), ([0.0, float("nan")], 1.0, "loc"),
                                             (0.0, [1.0, 2.0], "scale"), (["a"], 1.0, "loc")])
def test_bad_per_feature_numbers_are_refused(loc, scale, match):
    with pytest.raises(ValueError, match=match):
        LogNormal(loc, scale)


def test_a_per_feature_prior_must_fit_its_parameter():
    with pytest.raises(ValueError, match="amplitude is one number"):
        RBF(priors={"amplitude": LogNormal([0.0, 1.0], 1.0)})
    with pytest.raises(ValueError, match="lists 2 values, but the kernel has 3 lengthscales"):
        RBF(priors={"lengthscales": LogNormal([0.0, 1.0], 1.0)}).for_inputs(np.zeros((2, 3)))
    kernel = RBF([1.0, 2.0, 3.0], priors={"lengthscales": LogNormal([0.0, 1.0], 1.0)})
    with pytest.raises(ValueError, match="lists 2 values"):
        kernel_from_spec(kernel.spec(), {k: np.asarray(v) for k, v in kernel.params.items()})


# -- with_default_priors: where the priors sit, what they leave alone ------------------------------------------------

def test_default_priors_are_centred_on_sqrt_d_standard_deviations():
    X, _ = _data()
    d = X.shape[1]
    reference = RBF(lengthscales=list(np.std(X, axis=0) * math.sqrt(d)))
    kernel = with_default_priors(RBF(lengthscales=1.0), reference).for_inputs(X)
    table = kernel.parameter_table()
    lengthscale_prior, amplitude_prior = table["log_lengthscales"].prior, table["log_amplitude"].prior
    np.testing.assert_allclose(lengthscale_prior.loc, np.log(np.std(X, axis=0) * math.sqrt(d)), rtol=1e-12)
    assert lengthscale_prior.scale == amplitude_prior.scale == DEFAULT_PRIOR_SCALE == math.sqrt(3.0)
    assert amplitude_prior == LogNormal(0.0, math.sqrt(3.0))
    assert table["log_noise"].prior is None
    # on the stored u = log theta the climbed density is N(u; loc, 3): the Jacobian makes the LogNormal a Normal
    value, _ = log_prior_and_grads(kernel)
    u_l, u_a = np.asarray(kernel.params["log_lengthscales"]), float(np.asarray(kernel.params["log_amplitude"]))
    expected = (stats.norm(lengthscale_prior.loc, math.sqrt(3.0)).logpdf(u_l).sum()
                + stats.norm(0.0, math.sqrt(3.0)).logpdf(u_a))
    np.testing.assert_allclose(float(value), expected, rtol=1e-12)


def test_the_users_own_priors_win_and_every_term_gets_the_defaults():
    reference = RBF(lengthscales=[2.0, 3.0])
    own = Gamma(2.0, 1.0)
    kernel = with_default_priors(
        RBF(priors={"lengthscales": own}) + RationalQuadratic(amplitude=0.5) * Matern52(), reference)
    table = kernel.parameter_table()
    assert table["0.log_lengthscales"].prior == own
    amplitudes = [key for key in table if key.endswith("log_amplitude")]
    lengthscales = [key for key in table if key.endswith("log_lengthscales") and key != "0.log_lengthscales"]
    assert len(amplitudes) == 3 and len(lengthscales) == 2  # the sum's RBF, and the product's two terms
    for key in amplitudes:
        assert table[key].prior == LogNormal(0.0, DEFAULT_PRIOR_SCALE)
    for key in lengthscales:
        assert table[key].prior == LogNormal([math.log(2.0), math.log(3.0)], DEFAULT_PRIOR_SCALE)
    others = [key for key in table if key not in amplitudes + lengthscales + ["0.log_lengthscales"]]
    assert others and all(table[key].prior is None for key in others)  # alpha and the one latent noise


# -- through the classifier ----------------------------------------------------------------------------------------

def test_auto_is_the_default_and_sits_on_the_fitted_kernel():
    X, y = _data()
    model = GPClassifier(n_inducing=6, max_iter=3, random_state=0).fit(X, y)
    assert model.kernel_prior == "auto" and model.kernel_prior_ == "auto"
    prior = model.kernel_.parameter_table()["log_lengthscales"].prior
    np.testing.assert_allclose(prior.loc, np.log(np.std(X, axis=0) * math.sqrt(X.shape[1])), rtol=1e-10)
    own = Gamma(3.0, 1.0)
    model = GPClassifier(kernel=RBF(noise=1e-3, priors={"amplitude": own}), n_inducing=6, max_iter=3,
                         random_state=0).fit(X, y)
    assert model.kernel_.parameter_table()["log_amplitude"].prior == own
    assert model.kernel_.parameter_table()["log_lengthscales"].prior.loc == prior.loc


def test_multiclass_classes_get_the_same_priors():
    X, y = _data(n=90)
    y = y + (X[:, 0] > 1.0)
    model = GPClassifier(method="ep", n_inducing=5, max_iter=2, random_state=0).fit(X, y)
    tables = [k.parameter_table() for k in model.kernel_.kernels]
    assert len(tables) == 3
    for table in tables:
        assert table["log_lengthscales"].prior == tables[0]["log_lengthscales"].prior is not None
        assert table["log_amplitude"].prior == LogNormal(0.0, DEFAULT_PRIOR_SCALE)


@pytest.mark.parametrize("value", ["yes", True, 1.0, "AUTO "])
def test_a_bad_kernel_prior_is_refused_naming_it(value):
    X, y = _data()
    with pytest.raises(ValueError, match="kernel_prior"):
        GPClassifier(kernel_prior=value, n_inducing=4, max_iter=1).fit(X, y)


@pytest.mark.parametrize("method", ["ep", "svi", "vi-taylor"])
def test_none_is_maximum_likelihood(method):
    """kernel_prior=None attaches nothing: no prior on the fitted kernel, and the model is, bit for bit, the one
    fitted from the kernel the default builds given explicitly (the ML fit as it was before the parameter);
    with "auto" the same fit moves elsewhere."""
    X, y = _data()
    options = dict(method=method, n_inducing=6, max_iter=15, random_state=0)
    plain = GPClassifier(kernel_prior=None, **options).fit(X, y)
    assert plain.kernel_.priors == {} and plain.kernel_prior_ is None
    assert log_prior_and_grads(plain.kernel_) == (None, {})
    default = RBF(lengthscales=list(np.std(X, axis=0) * math.sqrt(X.shape[1])), amplitude=1.0, noise=1e-3)
    explicit = GPClassifier(kernel=default, kernel_prior=None, **options).fit(X, y)
    np.testing.assert_array_equal(plain.predict_proba(X), explicit.predict_proba(X))
    np.testing.assert_array_equal(to_np(plain.inducing_points_), to_np(explicit.inducing_points_))
    if method == "ep":
        return  # (batch EP steps by the gradient's sign (Rprop): a weak prior changes its path only near the optimum)
    auto = GPClassifier(kernel_prior="auto", **options).fit(X, y)
    assert not np.array_equal(to_np(auto.kernel_.params["log_lengthscales"]),
                              to_np(plain.kernel_.params["log_lengthscales"]))


def test_climbed_objective_gradient_with_the_auto_prior_matches_finite_differences(xp_device):
    """What SVI and vi-* climb with kernel_prior="auto": the bound plus the log prior of the kernel the classifier
    built (``engines.with_log_prior``); its gradient in every kernel parameter and Z against central differences of
    that sum, on NumPy and array_api_strict."""
    xp, device = xp_device
    X_np, y_np = _data(n=40)
    model = GPClassifier(method="svi", n_inducing=5, max_iter=0, random_state=0).fit(X_np, y_np)
    X, Z = to_xp(X_np, xp, device), to_xp(to_np(model.inducing_points_), xp, device)
    y = to_xp(np.where(y_np == 1, 1.0, -1.0), xp, device)
    kernel = model.kernel_.with_params({k: to_xp(to_np(v), xp, device) for k, v in model.kernel_.params.items()})
    # a kernel away from the prior's centre, so that the prior's own gradient is far from zero
    kernel = kernel.with_params({**kernel.params, "log_lengthscales": kernel.params["log_lengthscales"] - 1.5,
                                 "log_amplitude": kernel.params["log_amplitude"] + 1.0})
    rng = np.random.default_rng(1)
    mean = to_xp(0.3 * rng.normal(size=5), xp, device)
    chol = to_xp(np.tril(0.2 * rng.normal(size=(5, 5))) + 0.8 * np.eye(5), xp, device)

    def objective(k, ZZ):
        value, _ = V.svi_elbo(k, ZZ, X, y, mean, chol, want_grad=False)
        return float(value) + float(log_prior_and_grads(k)[0])

    value, grads = V.svi_elbo(kernel, Z, X, y, mean, chol)
    grads, total = engines.with_log_prior(kernel, grads, value)
    assert set(log_prior_and_grads(kernel)[1]) == {"log_lengthscales", "log_amplitude"}
    np.testing.assert_allclose(float(total), objective(kernel, Z), rtol=1e-12)
    check_parameter_gradients(kernel, grads, Z, objective, xp, device, rtol=1e-6, atol=1e-6)


def test_fit_on_array_api_strict_matches_numpy():
    """The auto prior's per-feature centres travel to the data's namespace and device."""
    import array_api_strict as xps

    X, y = _data(n=60)
    options = dict(n_inducing=5, max_iter=5, random_state=0)
    host = GPClassifier(**options).fit(X, y)
    device = xps.Device("device1")
    strict = GPClassifier(**options).fit(xps.asarray(X, device=device), xps.asarray(y, device=device))
    assert strict.kernel_.params["log_lengthscales"].device == device
    np.testing.assert_allclose(to_np(strict.predict_proba(xps.asarray(X, device=device))), host.predict_proba(X),
                               rtol=1e-8, atol=1e-10)


# -- model files ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel_prior", ["auto", None])
def test_model_file_round_trip_keeps_the_setting_and_the_priors(kernel_prior):
    X, y = _data()
    model = GPClassifier(kernel_prior=kernel_prior, n_inducing=6, max_iter=4, random_state=0).fit(X, y)
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = GPClassifier.load(buffer)
    assert loaded.kernel_prior == kernel_prior and loaded.kernel_prior_ == kernel_prior
    assert loaded.kernel_.priors == model.kernel_.priors
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))


def test_files_written_before_kernel_prior_load_as_maximum_likelihood():
    model = GPClassifier.load(os.path.join(HERE, "data", "model_v1", "binary_banana.npz"))
    assert model.kernel_prior is None and model.kernel_prior_ is None
    assert agpc.model_file.VALUE_WHEN_ABSENT["kernel_prior"] is None


def test_partial_fit_refuses_a_changed_kernel_prior():
    X, y = _data()
    model = GPClassifier(method="sep", n_inducing=5, random_state=0).partial_fit(X[:40], y[:40])
    model.set_params(kernel_prior=None)
    with pytest.raises(ValueError, match="kernel_prior 'auto' -> None"):
        model.partial_fit(X[40:], y[40:])
