"""Binary EP with inducing points: gradients, the full-GP limit, and learning on a known problem."""

import re
import warnings

import numpy as np
import pytest

from agpc import CholeskyError, GPClassifier, GuardWarning, JitterWarning
from agpc.datasets import banana_bayes_error, banana_posterior, make_banana
from agpc.inference import engines, ep, multiclass_ep, sites, training
from agpc.inference.engines import make_engine
from agpc.kernels import RBF, Matern52
from conftest import check_parameter_gradients, to_np, to_xp
from helpers import binary_toy
from reference_full_gp_ep import full_gp_ep, full_gp_predict

JITTER = 1e-6


def _log_z(kernel, Z, X, y, nu, mu):
    return float(ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, want_grad=False)["log_z"])


@pytest.mark.parametrize("kernel_cls", [RBF, Matern52])
def test_log_z_gradient_matches_finite_differences_at_ep_fixed_point(kernel_cls, xp_device):
    """Hernandez-Lobato & Hernandez-Lobato (2016), eq. 4 / A.6: at convergence the gradient with the cavities fixed
    equals the derivative of log Z_q with the sites held fixed -- checked against central differences for every
    parameter kind."""
    xp, device = xp_device
    X_np, y_np = binary_toy()
    X, y = to_xp(X_np, xp, device), to_xp(y_np, xp, device)
    Z = to_xp(X_np[:7] + 0.1, xp, device)
    kernel = kernel_cls(lengthscales=[0.8, 1.3], amplitude=1.5, noise=0.05).for_inputs(X)
    fit = training.fit(X, y, kernel, Z, jitter=JITTER, max_iter=3000, optimize=(), tol=1e-13)
    assert fit.converged
    nu, mu = fit.site_precision, fit.site_shift
    grads = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER)["grads"]
    check_parameter_gradients(
        kernel, grads, Z, lambda k, ZZ: _log_z(k, ZZ, X, y, nu, mu), xp, device, rtol=1e-5, atol=1e-6
    )
    assert grads["Z"].device == X.device


def test_equals_textbook_full_gp_ep_when_inducing_points_are_the_data():
    """Z = X (m = n), no latent noise: s_i = 0 and the model is the full GP classifier, so EP must agree
    with Rasmussen & Williams Alg. 3.5 on log Z and on predictive probabilities."""
    rng = np.random.default_rng(7)
    n = 25
    X = np.sort(rng.uniform(-3, 3, size=(n, 1)), axis=0)
    y = np.where(np.sin(1.5 * X[:, 0]) + 0.4 * rng.normal(size=n) > 0, 1, -1)
    X_test = np.linspace(-4, 4, 17)[:, None]
    kernel = RBF(lengthscales=[0.9], amplitude=2.0, noise=0.0)
    jitter = 1e-10
    model = GPClassifier(
        kernel=kernel, inducing=X, optimize=False, jitter=jitter, max_iter=5000, tol=1e-13
    ).fit(X, y)
    K = np.asarray(kernel.for_inputs(X).K(X))
    ref = full_gp_ep(K + jitter * np.eye(n), y.astype(float), tol=1e-13)
    assert abs(model.log_marginal_likelihood_ - ref["log_z"]) < 1e-6
    K_cross = np.asarray(kernel.for_inputs(X).K(X, X_test))
    _, _, prob = full_gp_predict(K + jitter * np.eye(n), y.astype(float), ref, K_cross, np.full(len(X_test), 2.0))
    got = model.predict_proba(X_test)[:, 1]
    np.testing.assert_allclose(got, prob, atol=1e-6)


def test_log_z_rises_and_error_nears_bayes_on_banana():
    """On the synthetic banana (Bayes error ~0.134, known exactly from the generator), training raises
    log Z_q and the test error comes within 2 points of the Bayes error; the predicted probabilities
    are close to the true posterior p(y | x)."""
    X, y = make_banana(800, random_state=0)
    X_test, y_test = make_banana(4000, random_state=1)
    model = GPClassifier(n_inducing=20, max_iter=120, random_state=0).fit(X, y)
    history = np.asarray(model.history_["log_marginal_likelihood"])
    assert history[-1] > history[0] + 50  # from the prior's n log(1/2) to a fitted model
    assert np.mean(np.diff(history[-50:]) > -1e-3) > 0.9  # essentially monotone at the end
    bayes = banana_bayes_error()
    error = 1.0 - model.score(X_test, y_test)
    assert error < bayes + 0.02, (error, bayes)
    p_true = banana_posterior(X_test)
    p_model = model.predict_proba(X_test)[:, 1]
    assert np.mean(np.abs(p_true - p_model)) < 0.06


def test_sites_with_improper_cavities_are_skipped():
    """With q built from the same sites, a cavity is improper only when other sites have negative
    precision. Two copies of one row, one site at +10 and its twin at -9.9, leave q's precision along
    that direction small, so removing the +10 site gives a negative cavity variance: that site keeps
    its parameters for the round and adds nothing to log Z_q or the gradient; the others update."""
    X, y = binary_toy(30)
    X[1] = X[0]
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z = X[2:7].copy()
    nu = np.zeros(30)
    mu = np.zeros(30)
    nu[0], nu[1] = 10.0, -9.9
    out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER)
    valid = np.asarray(out["valid"])
    assert not valid[0] and valid[1] and valid[2:].all()
    assert out["site_precision"][0] == 10.0
    assert np.all(np.asarray(out["site_precision"])[2:] > 0)
    assert np.isfinite(float(out["log_z"]))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in out["grads"].values())


def test_blocked_pass_equals_single_pass():
    X, y = binary_toy(37)
    kernel = RBF(lengthscales=[0.8, 1.1], amplitude=1.2, noise=0.02).for_inputs(X)
    Z = X[:6].copy()
    rng = np.random.default_rng(0)
    nu, mu = rng.uniform(0, 0.5, 37), rng.normal(0, 0.3, 37)
    one = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER)
    blocked = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=8)
    assert abs(float(one["log_z"]) - float(blocked["log_z"])) < 1e-10
    np.testing.assert_allclose(blocked["site_precision"], one["site_precision"], rtol=1e-12)
    for name in one["grads"]:
        np.testing.assert_allclose(blocked["grads"][name], one["grads"][name], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("damping", [0.3, 0.8])
def test_a_damped_pass_writes_rho_new_plus_one_less_rho_old_and_their_sums(damping):
    """Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25: a pass with damping rho writes rho * new + (1 - rho) * old
    of each row's site (``write_block_sites``), new the undamped pass's, and the sums it hands the next pass
    (``next_site_sums``) are those of the damped sites: the next pass from them is the one that forms them again. A
    mutation audit (2026-12-03): swapping rho and 1 - rho, or summing rho * new + rho * old, passed every test, the
    default rho = 0.5 being symmetric (probabilities 0.005 and 0.12 off at rho = 0.8)."""
    X, y = binary_toy(37)
    kernel = RBF(lengthscales=[0.8, 1.1], amplitude=1.2, noise=0.02).for_inputs(X)
    Z = X[:6].copy()
    rng = np.random.default_rng(1)
    nu, mu = rng.uniform(0.05, 0.5, 37), rng.normal(0, 0.3, 37)
    undamped = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, want_grad=False)
    damped = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, want_grad=False, damping=damping,
                         want_next_sums=True, block_rows=8)
    new_nu, new_mu = undamped["site_precision"], undamped["site_shift"]
    np.testing.assert_allclose(damped["site_precision"], damping * new_nu + (1 - damping) * nu, rtol=1e-12)
    np.testing.assert_allclose(damped["site_shift"], damping * new_mu + (1 - damping) * mu, rtol=1e-12, atol=1e-15)
    assert not np.allclose(damped["site_precision"], (1 - damping) * new_nu + damping * nu)
    following = [ep.evaluate(kernel, Z, X, y, damped["site_precision"], damped["site_shift"], jitter=JITTER,
                             want_grad=False, **given) for given in ({}, {"site_sums": damped["site_sums"]})]
    assert float(following[1]["log_z"]) == pytest.approx(float(following[0]["log_z"]), rel=1e-12)
    np.testing.assert_allclose(following[1]["site_precision"], following[0]["site_precision"], rtol=1e-10)


def test_non_finite_log_z_reverts_and_halves_damping_and_steps(monkeypatch):
    """The authors' guard rail: a NaN log Z_q (or a failed Cholesky) puts back the last good state and
    halves the damping and the step sizes; training then goes on, and after ``guard.RESTORE_AFTER`` good steps in a
    row the damping is doubled back to where it started. The history counts each action, and one GuardWarning
    says them."""
    X, y = binary_toy(40)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z = X[:5].copy()
    real_evaluate = ep.evaluate
    calls = {"n": 0}

    def flaky_evaluate(*args, **kwargs):
        calls["n"] += 1
        out = real_evaluate(*args, **kwargs)
        if calls["n"] == 15:
            out["log_z"] = out["log_z"] * np.nan
        if calls["n"] == 20:
            raise CholeskyError("Cholesky of Kmm failed (test)")
        return out

    monkeypatch.setattr(ep, "evaluate", flaky_evaluate)
    with pytest.warns(GuardWarning, match="did not take 2 steps .*halved damping and step sizes twice"):
        fit = training.fit(X, y, kernel, Z, jitter=JITTER, max_iter=30, damping=0.5)
    damping = fit.history["damping"]
    # the 15th evaluation fails after 14 steps, its retry at half the damping is the 15th iteration; the 20th fails
    # after 4 more; each 10 good steps in a row double the damping back, up to where it started
    assert damping[:14] == [0.5] * 14 and damping[14:18] == [0.25] * 4 and damping[18:27] == [0.125] * 9
    assert damping[27:37] == [0.25] * 10 and damping[37:] == [0.5] * 3
    assert fit.history["guard_rejected"][14] == fit.history["guard_rejected"][18] == 1
    assert sum(fit.history["guard_halvings"]) == 2 and sum(fit.history["guard_restored"]) == 2
    assert sum(fit.history["guard_rebuilds"]) == 0  # (batch EP has nothing to rebuild: q is exact every pass)
    assert len(fit.history["log_marginal_likelihood"]) == fit.n_iter == 40  # 10 warm-up + 30, failures not counted
    assert np.all(np.isfinite(fit.history["log_marginal_likelihood"])) and np.isfinite(fit.log_z)


def test_minibatch_ep_revert_restores_sites_updated_in_place(monkeypatch):
    """Minibatch EP writes the visited rows' sites in place; a failed step must still put back exactly
    the state before the last good step (sites, kernel, Z), not leave that step's rows half-updated."""
    X, y = binary_toy(60)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    trainer = training.Trainer(engines.make_engine("ep", kernel, X[:5].copy(), n_total=60, minibatch=True,
                                                   jitter=JITTER))
    trainer.step(X, y, 0, 20, stepping=True)
    after_first = {k: np.array(trainer.state[k], copy=True) for k in ("nu", "mu", "Z")}
    lengthscales = np.array(trainer.state["kernel"].params["log_lengthscales"], copy=True)
    trainer.step(X, y, 20, 40, stepping=True)
    assert not np.array_equal(trainer.state["nu"][20:40], after_first["nu"][20:40])  # the step moved them

    real = ep.evaluate_factor

    def failing(*args, **kwargs):
        out = real(*args, **kwargs)
        out["log_z"] = out["log_z"] * np.nan
        return out

    monkeypatch.setattr(ep, "evaluate_factor", failing)
    took, _, _ = trainer.step(X, y, 40, 60, stepping=True)
    assert not took
    for key, value in after_first.items():
        np.testing.assert_array_equal(trainer.state[key], value)
    np.testing.assert_array_equal(trainer.state["kernel"].params["log_lengthscales"], lengthscales)
    assert trainer.damping == 0.99 / 2


def test_minibatch_ep_rebuilds_the_site_product_when_cavities_fail(monkeypatch):
    """Minibatch EP's running product holds every site exactly as it went in, so its cavities are proper; more
    than 5% of a minibatch's cavities failing say q is not what its sites make it. The guard does not take such a
    step: it rebuilds the product exactly (one pass) and tries the step again, and counts both. Besides, the loop
    rebuilds at the end of every epoch."""
    X, y = binary_toy(200)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    rebuilt = []
    real_rebuild = training.Trainer.rebuild_factor

    def counting(self, X_, y_, **options):
        rebuilt.append(self.n_steps)
        return real_rebuild(self, X_, y_, **options)

    monkeypatch.setattr(training.Trainer, "rebuild_factor", counting)
    real = ep.evaluate_factor

    def with_failed_cavities(*args, **kwargs):
        out = real(*args, **kwargs)
        if with_failed_cavities.fail_at == with_failed_cavities.calls:
            out["n_invalid"] = 10  # of 50 rows
        with_failed_cavities.calls += 1
        return out

    with_failed_cavities.calls, with_failed_cavities.fail_at = 0, 2
    monkeypatch.setattr(ep, "evaluate_factor", with_failed_cavities)
    with pytest.warns(GuardWarning, match="did not take 1 step .*inconsistent with q.*rebuilt q exactly"):
        fit = training.fit(X, y, kernel, X[:6].copy(), method="ep", batch_size=50, max_iter=2, jitter=JITTER,
                           random_state=0)
    # the third step rebuilt first (after 2 steps), then one rebuild at the end of each epoch (after 4 and 8)
    assert rebuilt == [2, 4, 8]
    assert fit.history["guard_rejected"] == fit.history["guard_rebuilds"] == [1, 0]
    assert fit.history["n_steps"] == [4, 8]


@pytest.mark.parametrize("method", ["ep", "sep", "adf"])
def test_padding_rows_with_weight_zero_change_nothing(method, xp_device):
    """A minibatch padded to a fixed size (issue 14: the step takes per-row weights, padding weight 0) gives
    the same log Z_q estimate, gradient and site change as the rows alone."""
    xp, device = xp_device
    X_np, y_np = binary_toy(60)
    X = to_xp(X_np, xp, device)
    kernel = RBF(lengthscales=[0.9, 1.2], amplitude=1.3, noise=0.02).for_inputs(X)
    Z = to_xp(X_np[:6] + 0.05, xp, device)
    rng = np.random.default_rng(3)
    nu_np, mu_np = rng.uniform(0.0, 0.3, 60), rng.normal(0.0, 0.2, 60)
    factor = ep.exact_factor(kernel, Z, X, to_xp(nu_np, xp, device), to_xp(mu_np, xp, device), jitter=JITTER)
    rows, padding = np.arange(10, 30), np.arange(40, 52)  # 20 real rows, 12 rows of padding

    def run(index, weights):
        take = lambda a: to_xp(np.asarray(a)[index], xp, device)  # noqa: E731
        return ep.evaluate_factor(
            kernel, Z, take(X_np), take(y_np), factor, cavity=method, n_total=60,
            site_precision=take(nu_np) if method == "ep" else None, site_shift=take(mu_np) if method == "ep" else None,
            jitter=JITTER, weights=None if weights is None else to_xp(weights, xp, device),
        )

    alone = run(rows, None)
    padded = run(np.concatenate([rows, padding]), np.concatenate([np.ones(20), np.zeros(12)]))
    np.testing.assert_allclose(float(padded["log_z"]), float(alone["log_z"]), rtol=1e-12)
    for name, value in alone["grads"].items():
        np.testing.assert_allclose(to_np(padded["grads"][name]), to_np(value), rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(to_np(padded["site_delta"].precision), to_np(alone["site_delta"].precision),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(to_np(padded["site_delta"].shift), to_np(alone["site_delta"].shift), rtol=1e-10,
                               atol=1e-12)


def test_a_pass_takes_its_cavity_as_a_declared_value_or_its_name():
    """The EP-family passes branch on the cavity they form, a ``sites.Cavity`` (EP's, SEP's, ADF's), never on a
    method's name: ``sites.cavity_of`` takes the value or its name and refuses anything else, with the message the
    passes gave before; a pass given ``cavity=SEP`` is the pass given ``cavity="sep"``, bit for bit."""
    for cavity in (sites.EP, sites.SEP, sites.ADF):
        assert sites.cavity_of(cavity) is cavity and sites.cavity_of(cavity.name) is cavity
    assert [cavity.name for cavity in (sites.EP, sites.SEP, sites.ADF)] == ["ep", "sep", "adf"]
    assert [(c.own_sites, c.tied, c.adf) for c in (sites.EP, sites.SEP, sites.ADF)] == [
        (True, False, False), (False, True, False), (False, False, True)]
    for other in ("EP", "svi", "vi-jj", "", None, 1, ["ep"]):
        with pytest.raises(ValueError, match=re.escape(f"unknown EP variant {other!r}")):
            sites.cavity_of(other)
    for passes in (ep, multiclass_ep):  # (refused before anything is computed)
        with pytest.raises(ValueError, match="unknown EP variant 'svi'"):
            passes.factor_cavity(None, None, None, cavity="svi", n_total=10, jitter=JITTER)
    X, y = binary_toy(60)
    kernel = RBF(lengthscales=[0.9, 1.2], amplitude=1.3, noise=0.02).for_inputs(X)
    Z = X[:6] + 0.05
    rng = np.random.default_rng(3)
    factor = ep.exact_factor(kernel, Z, X, rng.uniform(0.0, 0.3, 60), rng.normal(0.0, 0.2, 60), jitter=JITTER)
    by_value, by_name = (ep.evaluate_factor(kernel, Z, X[10:30], y[10:30], factor, cavity=cavity, n_total=60,
                                            jitter=JITTER) for cavity in (sites.SEP, "sep"))
    assert float(by_value["log_z"]) == float(by_name["log_z"])
    assert by_value["grads"].keys() == by_name["grads"].keys()
    for name, value in by_value["grads"].items():
        np.testing.assert_array_equal(by_name["grads"][name], value, err_msg=name)
    np.testing.assert_array_equal(by_name["site_delta"].precision, by_value["site_delta"].precision)
    np.testing.assert_array_equal(by_name["site_delta"].shift, by_value["site_delta"].shift)
    with pytest.raises(ValueError, match="unknown EP variant 'svi'"):
        ep.evaluate_factor(kernel, Z, X, y, factor, cavity="svi", n_total=60, jitter=JITTER)

def test_inputs_far_from_the_origin_do_not_cancel():
    """The RBF's squared distances come from one matrix product; centred on the middle of Z they stay
    accurate for features with a large offset against their spread (x + 1e7 used to fail its Cholesky)."""
    X, y = binary_toy(80)
    Z = X[:8] + 0.05
    nu, mu = np.full(80, 0.2), 0.1 * y
    kernel = RBF(lengthscales=[0.7, 1.1], amplitude=1.4, noise=0.01)
    offset = 1e7
    near = ep.evaluate(kernel.for_inputs(X), Z, X, y, nu, mu, jitter=JITTER)
    far = ep.evaluate(kernel.for_inputs(X), Z + offset, X + offset, y, nu, mu, jitter=JITTER)
    np.testing.assert_allclose(float(far["log_z"]), float(near["log_z"]), rtol=1e-7)
    for name in ("log_lengthscales", "log_amplitude", "Z"):
        np.testing.assert_allclose(far["grads"][name], near["grads"][name], rtol=1e-5, atol=1e-6, err_msg=name)
    model = GPClassifier(n_inducing=8, max_iter=20, random_state=0).fit(X + offset, y)
    assert np.all(np.isfinite(model.predict_proba(X + offset)))


@pytest.mark.parametrize("method", ["sep", "ep"])
def test_a_failed_factorisation_raises_the_jitter_on_the_guards_path(method):
    """Training steps factorise without checks (no host synchronisation): a failed Cholesky of Kmm arrives as
    a NaN log Z_q, and only then does the guard look, find the jitter with which Kmm factorises, say so in a
    warning, and go on with it (duplicated inducing points and jitter 0 here)."""
    X, y = binary_toy(60)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z = np.concatenate([X[:4], X[:4]])
    trainer = training.Trainer(engines.make_engine(method, kernel, Z, n_total=60, minibatch=True, jitter=0.0))
    message = r"jitter raised: Kmm \(covariance of the inducing points\): the model's jitter from 0.0e\+00 to "
    with pytest.warns(JitterWarning, match=message):
        took, _, log_z = trainer.step(X, y, 0, 20, stepping=True)
    assert not took and np.isnan(log_z)
    assert trainer.engine.jitter > 0.0
    took, _, log_z = trainer.step(X, y, 0, 20, stepping=True)
    assert took and np.isfinite(log_z)


@pytest.mark.parametrize("method", ["ep", "sep"])
def test_a_jitter_raise_beyond_the_good_states_reach_is_a_revert(method):
    """The guard raises the jitter for a K(Z, Z) that needs more round-off room, not for a step that left the
    kernel's scale: Adam at learning_rate=1e3 took the amplitude to ~1e77, the guard raised the jitter to 6e70 for
    it and kept it when the amplitude came back (every probability 0.5). Here a state of amplitude exp(177) after a
    good one of amplitude 1 (a pair of inducing points that coincide: K(Z, Z) singular but for the jitter): the
    guard puts the good state back and halves its steps, the jitter as it was."""
    X, y = binary_toy(60)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z = np.concatenate([X[:4], X[:1]])
    trainer = training.Trainer(engines.make_engine(method, kernel, Z, n_total=60, minibatch=True, jitter=JITTER))
    took, _, _ = trainer.step(X, y, 0, 20, stepping=True)
    assert took
    good = trainer.engine.kernel
    trainer.engine.state["kernel"] = good.with_params({**good.params, "log_amplitude": np.asarray(177.0)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitterWarning)
        took, _, log_z = trainer.step(X, y, 20, 40, stepping=True)
    assert not took and np.isnan(log_z)
    assert trainer.engine.jitter == JITTER and trainer.reverted and trainer.halvings == 1
    assert float(trainer.engine.kernel.params["log_amplitude"]) == float(good.params["log_amplitude"])


def test_a_factor_read_back_from_its_posterior_is_the_same_factor():
    """Factor.from_posterior inverts posterior_from_factor (q = prior x f, C = I + L_K^T P L_K): the factor it
    reads back from q is the one q was built from (a fitted model's q becomes SEP's tied factor again),
    including an indefinite one, as SEP's factor may be."""
    rng = np.random.default_rng(4)
    X, _ = binary_toy()
    Z = X[:6] + 0.05
    kernel = RBF(lengthscales=[1.1, 0.9], amplitude=1.3, noise=1e-3).for_inputs(X)
    G = rng.normal(size=(6, 6))
    for precision in (G @ G.T, 0.5 * (G + G.T) * 0.05):
        factor = ep.Factor(precision, rng.normal(size=6))
        post = ep.posterior_from_factor(kernel, Z, factor, jitter=JITTER)
        back = ep.Factor.from_posterior(post)
        scale = np.abs(precision).max()
        np.testing.assert_allclose(back.precision, precision, rtol=0, atol=1e-9 * scale)
        np.testing.assert_allclose(back.shift, factor.shift, rtol=1e-9, atol=1e-9 * np.abs(factor.shift).max())


def test_starting_from_given_sites_never_writes_into_the_callers_arrays():
    """Minibatch EP updates its sites in place (the one n-sized thing it holds): an engine started from the caller's
    sites (``EPEngine.start_from_sites``, ``make_engine(..., site_precision=...)``) copies them first. A break that
    took the arrays as they were changed the caller's sites with every step and passed the EP tests."""
    X, y = make_banana(120, random_state=4)
    y = y.astype(float)
    kernel = RBF(lengthscales=[0.9, 1.1], amplitude=1.4, noise=0.02).for_inputs(X)
    rng = np.random.default_rng(2)
    nu, mu = rng.uniform(0.0, 0.3, 120), rng.normal(0.0, 0.2, 120)
    given = nu.copy(), mu.copy()
    engine = make_engine("ep", kernel, X[:6] + 0.05, n_total=120, minibatch=True, site_precision=nu, site_shift=mu)
    trainer = training.Trainer(engine)
    trainer.rebuild_factor(X, y)  # (q from the given sites, as the loop's epoch starts)
    for lo in (0, 40, 80):
        trainer.step_until_taken(X, y, lo, lo + 40, stepping=False)
    assert not np.array_equal(engine.state["nu"], given[0])  # (the engine's sites moved)
    np.testing.assert_array_equal(nu, given[0])
    np.testing.assert_array_equal(mu, given[1])


def test_the_site_change_batch_training_stops_on_counts_the_shifts_as_well_as_the_precisions():
    """``relative_site_change`` (what a batch fit with nothing to learn stops on, ``tol``): max|new - old| / (1 +
    max|old|) of the precisions plus the same of the shifts. A mutation audit (2026-12-02): dropping the shifts'
    part passed every test, and a fit whose precisions had settled would stop while its means still moved."""
    assert ep.relative_site_change([0.0, 1.0, 0.5, 1.0]) == 0.25
    assert ep.relative_site_change([0.2, 1.0, 0.0, 3.0]) == 0.1
    assert ep.relative_site_change([0.2, 1.0, 0.6, 2.0]) == pytest.approx(0.3)


def test_the_site_change_is_relative_to_the_old_sites():
    """The mutation audit of 2026-12-04: ``write_block_sites`` keeps max|new - old| and max|old| of each block (the
    old sites, not the new ones, scale the change), and the blocks' maxima combine by maximum."""
    from types import SimpleNamespace
    old_precision, old_shift = np.array([1.0, 2.0, 0.5, 0.5]), np.array([0.5, -1.0, 0.0, 0.25])
    new_precision, new_shift = np.array([7.0, 2.0, 0.5, 9.5]), np.array([0.5, -1.0, 3.0, -5.75])
    out = {"site_precision": np.zeros(4), "site_shift": np.zeros(4), "valid": np.zeros(4, dtype=bool)}
    for lo, hi in ((0, 2), (2, 4)):
        block = SimpleNamespace(site_precision=new_precision[lo:hi], site_shift=new_shift[lo:hi],
                                valid=np.ones(hi - lo, dtype=bool))
        ep.write_block_sites(out, lo, hi, block, old_precision[lo:hi], old_shift[lo:hi], 1.0)
    np.testing.assert_array_equal(out["site_precision"], new_precision)
    np.testing.assert_array_equal(out["site_shift"], new_shift)
    expected = (np.max(np.abs(new_precision - old_precision)) / (1.0 + np.max(np.abs(old_precision)))
                + np.max(np.abs(new_shift - old_shift)) / (1.0 + np.max(np.abs(old_shift))))
    assert ep.relative_site_change(out["site_change"]) == pytest.approx(expected, rel=1e-14)


def test_the_conditional_variance_of_a_prediction_is_never_below_zero():
    """``predict_latent``'s first term, k(x, x) - a^T a (the variance of p(f | u)), is a difference that rounding can
    take below zero (nearly coincident inducing points, little jitter): it is clamped at 0. A mutation audit
    (2026-12-02): without the clamp every test passed. Here a^T a is made to exceed k(x, x) on purpose (L_K^-1
    scaled by 1.05) and q's own part is zero: the variance is 0, not negative, at the inducing points."""
    from types import SimpleNamespace

    from agpc.backend import cholesky, lower_triangular_inverse

    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.0)
    Z = np.random.default_rng(0).normal(size=(6, 2))
    L_K = cholesky(kernel.K(Z) + 1e-10 * np.eye(6))
    post = SimpleNamespace(beta=np.zeros(6), L_K_inv=1.05 * lower_triangular_inverse(L_K), L_C_inv=np.zeros((6, 6)))
    mean, variance = ep.predict_latent(kernel, Z, post, Z)
    np.testing.assert_array_equal(mean, 0.0)
    assert np.all(variance == 0.0), variance


def _cavity_rows():
    """Four rows' (nu, mu, d, e, prior variance): a cavity within the prior; one wider than the prior (d / (1 - nu d)
    = 0.9 / 0.55 = 1.64 > 1: what agreeing sites never give, a site kept from older hyper-parameters can); one whose
    variance is not positive (1 - nu d < 0); and one at the prior exactly."""
    nu = np.array([0.2, 0.5, 2.0, 0.0])
    d = np.array([0.5, 0.9, 0.9, 1.0])
    return nu, 0.1 * nu, d, 0.3 * d, np.ones(4)


def test_a_cavity_wider_than_the_prior_or_not_positive_is_invalid():
    """``sites.cavity``, ``weighted_cavity`` and ``held_cavity`` (a site held along its own direction: cross = d_h =
    d, e_h = e): valid only where 1 - nu d > 0 and the cavity is no wider than the prior; under power EP a row of
    weight below 1 drops the prior's bound (removing one copy takes out more than its share) and a row of weight 0
    is never valid. A mutation audit (2026-12-02): the held cavity's bound removed, or the weighted bound at weights
    above 1 only (not at 1), passed every test."""
    nu, mu, d, e, prior = _cavity_rows()
    expected = [True, False, False, True]
    assert sites.cavity(nu, mu, d, e, prior)[0].tolist() == expected
    assert sites.weighted_cavity(nu, mu, d, e, prior, np.ones(4))[0].tolist() == expected
    assert sites.weighted_cavity(nu, mu, d, e, prior, np.full(4, 2.0))[0].tolist() == expected
    assert sites.weighted_cavity(nu, mu, d, e, prior, np.full(4, 0.5))[0].tolist() == [True, True, False, True]
    assert sites.weighted_cavity(nu, mu, d, e, prior, np.zeros(4))[0].tolist() == [False] * 4
    assert sites.held_cavity(nu, mu, d, e, prior, d, e, d)[0].tolist() == expected
    assert sites.held_cavity(nu, mu, d, e, prior, d, e, d, np.ones(4))[0].tolist() == expected
    assert sites.held_cavity(nu, mu, d, e, prior, d, e, d, np.full(4, 0.5))[0].tolist() == [True, True, False, True]
    valid, one_minus, v, a = sites.held_cavity(nu, mu, d, e, prior, d, e, d)
    plain = sites.cavity(nu, mu, d, e, prior)
    np.testing.assert_allclose(v[valid], plain[2][valid], rtol=1e-14)  # (held along its own direction: cavity's)
    np.testing.assert_allclose(a[valid], plain[3][valid], rtol=1e-14)


@pytest.mark.parametrize("cavity", ["sep", "adf"])
def test_rows_whose_tied_cavity_is_wider_than_the_prior_are_invalid(cavity):
    """SEP / ADF (no site of the row in q): a row is valid only where its cavity's variance along upsilon_i is no
    wider than the prior's (``ep._block_cavity``). A factor of negative precision (S = -0.5 I whitened: q twice as
    wide as the prior along every direction) makes every row's cavity wider: every row invalid, counted, no term.
    A mutation audit (2026-12-02): taking every such row as valid passed every test."""
    from agpc.inference.posterior import Factor

    X, y = make_banana(40, random_state=0)
    Z = X[:6] + 0.05
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=1e-6)
    L_K = ep.prior_cholesky(kernel, Z, 1e-6)
    K_inv = np.linalg.inv(L_K @ L_K.T)
    factor = Factor(-0.5 * K_inv, np.zeros(6))
    out = ep.evaluate_factor(kernel, Z, X, y, factor, cavity=cavity, n_total=1e6, jitter=1e-6, want_grad=False)
    assert int(out["n_invalid"]) == 40  # (SEP / ADF keep no per-row validity: the count says it)
    healthy = ep.evaluate_factor(kernel, Z, X, y, Factor(0.5 * K_inv, np.zeros(6)), cavity=cavity, n_total=1e6,
                                 jitter=1e-6, want_grad=False)
    assert int(healthy["n_invalid"]) == 0
