"""SEP, ADF and minibatch training (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.3, Hernandez-Lobato et al.
(2015))."""

import numpy as np
import pytest

from agpc import GPClassifier, optim
from agpc.datasets import make_banana
from agpc.inference import engines, ep, tied_steps, training
from agpc.kernels import RBF
from conftest import to_np, to_xp
from helpers import nll_of

JITTER = 1e-6


def _moments(result):
    return [np.asarray(a) for a in result.posterior.mean_and_cov()]


def test_sep_with_one_datum_equals_ep():
    """With n = 1 the SEP cavity q / f^(1/1) is EP's q / f_1: same fixed point, same log Z_q."""
    X = np.array([[0.3, -0.2]])
    y = np.array([1.0])
    kernel = RBF(lengthscales=[0.8, 1.2], amplitude=1.5, noise=0.1).for_inputs(X)
    Z = np.array([[0.0, 0.0], [1.0, 0.5], [-0.7, 0.2]])
    common = dict(jitter=JITTER, max_iter=500, optimize=(), tol=1e-14)
    fit_ep = training.fit(X, y, kernel, Z, method="ep", **common)
    fit_sep = training.fit(X, y, kernel, Z, method="sep", **common)
    assert fit_ep.converged and fit_sep.converged
    assert abs(fit_ep.log_z - fit_sep.log_z) < 1e-10
    for a, b in zip(_moments(fit_ep), _moments(fit_sep)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_adf_equals_one_ep_sweep_from_the_prior(xp_device):
    """ADF's cavity is q; from a uniform factor that is the prior, exactly EP's first sweep."""
    xp, device = xp_device
    X_np, y_np = make_banana(60, random_state=0)
    X, y = to_xp(X_np, xp, device), to_xp(y_np, xp, device)
    kernel = RBF(lengthscales=[0.8, 0.8], amplitude=2.0, noise=0.01).for_inputs(X)
    Z = to_xp(X_np[:8], xp, device)
    common = dict(jitter=JITTER, max_iter=1, optimize=(), damping=1.0)
    adf = training.fit(X, y, kernel, Z, method="adf", **common)
    sweep = training.fit(X, y, kernel, Z, method="ep", **common)
    assert sweep.n_iter == 1 and adf.n_iter == 1
    for a, b in zip(adf.posterior.mean_and_cov(), sweep.posterior.mean_and_cov()):
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def small_problem():
    X, y = make_banana(400, random_state=5)
    X_test, y_test = make_banana(3000, random_state=6)
    return X, y, X_test, y_test


def test_batch_sep_is_close_to_ep_and_adf_is_not_better(small_problem):
    """Hernandez-Lobato et al. (2015)'s table: SEP's test NLL is within a few hundredths of EP's, ADF's equal or worse.

    Stated tolerances, at EP's fitted hyper-parameters: test NLL within 0.02 (the spread between EP and
    SEP in Hernandez-Lobato et al. (2015)'s table); ADF's test NLL no better than EP's minus 0.005. SEP's tied factor
    makes its log Z_q a different approximation from EP's, not EP's value plus noise: we require the two within 5%
    of |log Z_q(EP)| (2.9% measured on this problem when the test was written: -125.8 against -129.5)."""
    X, y, X_test, y_test = small_problem
    fitted = GPClassifier(method="ep", n_inducing=15, max_iter=100, random_state=0).fit(X, y)
    Z = fitted.inducing_points_
    nll = {}
    log_z = {}
    for method in ("ep", "sep", "adf"):
        model = GPClassifier(method=method, kernel=fitted.kernel_, inducing=Z, optimize=False, max_iter=2000, tol=1e-9)
        model.fit(X, y)
        nll[method] = nll_of(model, X_test, y_test)
        log_z[method] = model.log_marginal_likelihood_
    assert abs(log_z["sep"] - log_z["ep"]) < 0.05 * abs(log_z["ep"]), log_z
    assert abs(nll["sep"] - nll["ep"]) < 0.02, nll
    assert nll["adf"] >= nll["ep"] - 0.005, nll


def test_minibatch_ep_and_sep_match_batch_ep_error_on_20k_rows():
    """Minibatch EP / SEP (200 rows, Adadelta, damping 0.99) on 20,000 banana rows reach a test error
    within 1 point of batch EP."""
    X, y = make_banana(20000, random_state=11)
    X_test, y_test = make_banana(10000, random_state=12)
    batch = GPClassifier(method="ep", n_inducing=25, max_iter=60, batch_size=None, random_state=0).fit(X, y)
    batch_error = 1.0 - batch.score(X_test, y_test)
    for method in ("ep", "sep"):
        model = GPClassifier(method=method, n_inducing=25, max_iter=3, batch_size=200, random_state=0).fit(X, y)
        error = 1.0 - model.score(X_test, y_test)
        assert error < batch_error + 0.01, (method, error, batch_error)


@pytest.mark.parametrize("method", ["ep", "sep"])
def test_stochastic_gradient_is_unbiased(method):
    """Eq. 6: with q and the sites fixed, the n/|M|-scaled minibatch gradient averages to the full one.
    400 minibatches of 40 rows drawn with replacement; every coordinate's mean must lie within 4
    standard errors of the full gradient (a false alarm about once in 15,000 coordinates)."""
    X, y = make_banana(600, random_state=2)
    y = y.astype(float)
    kernel = RBF(lengthscales=[0.9, 0.8], amplitude=2.0, noise=0.01).for_inputs(X)
    Z = X[:6] + 0.05
    fit = training.fit(X, y, kernel, Z, method=method, max_iter=30, optimize=(), jitter=JITTER)
    factor = ep.exact_factor(kernel, Z, X, fit.site_precision, fit.site_shift, jitter=JITTER) if method == "ep" else fit.factor
    nu = fit.site_precision if method == "ep" else None
    mu = fit.site_shift if method == "ep" else None

    def gradient(rows):
        out = ep.evaluate_factor(
            kernel, Z, X[rows], y[rows], factor, cavity=method, n_total=len(y),
            site_precision=None if nu is None else nu[rows], site_shift=None if mu is None else mu[rows],
            jitter=JITTER,
        )
        return np.concatenate([np.ravel(np.asarray(v)) for _, v in sorted(out["grads"].items())])

    full = gradient(np.arange(len(y)))
    rng = np.random.default_rng(0)
    samples = np.array([gradient(rng.integers(0, len(y), size=40)) for _ in range(400)])
    mean = samples.mean(axis=0)
    stderr = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
    assert np.all(np.abs(mean - full) < 4 * stderr + 1e-12), np.max(np.abs(mean - full) / (stderr + 1e-300))


def test_max_time_stops_cleanly_with_a_usable_model(small_problem, monkeypatch):
    """A fit stopped by its time budget mid-run is a usable model. The budget's stop is made at step 20 (a fit stopped
    by the clock alone scored 0.51 where a stall before its first step, on a loaded CI worker, would leave it none)."""
    from agpc.inference import hooks

    def before_step(self, run, rebuild_due):
        if run.trainer.n_steps < 20:
            return False
        run.stopped_by_time, run.stop_reason = True, "max_time"
        return True

    monkeypatch.setattr(hooks.TimeBudget, "before_step", before_step)
    X, y, X_test, y_test = small_problem
    model = GPClassifier(n_inducing=15, max_iter=100000, max_time=60.0, random_state=0, plateau=None).fit(X, y)
    assert model.stopped_by_time_ and model.stop_reason_ == "max_time"
    assert model.n_iter_ < 100000
    assert model.score(X_test, y_test) > 0.75


def test_moved_factor_is_the_posterior_read_at_the_new_points():
    """``ep.moved_factor``: q = prior x factor at Z, carried to Z' + dZ, is q'(u') = int p(f(Z') | u) q(u) du (the
    dense formulas: mean A m, covariance A S A^T + K' - A K A^T with A = K(Z', Z) K^-1, each point's jitter going
    with it); points that do not move keep the factor to round-off."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    kernel = RBF(lengthscales=[1.5, 2.0, 2.5], amplitude=1.3, noise=0.01).for_inputs(X)
    Z = X[:12]
    upsilon = np.linalg.solve(kernel.K(Z) + JITTER * np.eye(12), kernel.K(X, Z).T)  # (m, n): K^-1 k_i
    nu, mu = rng.uniform(0.0, 3.0, 60), rng.normal(size=60)
    factor = ep.Factor((upsilon * nu) @ upsilon.T, upsilon @ mu)
    same = ep.moved_factor(kernel, Z, Z, factor, jitter=JITTER)
    np.testing.assert_allclose(same.precision, factor.precision, rtol=1e-7, atol=1e-7 * np.abs(factor.precision).max())
    np.testing.assert_allclose(same.shift, factor.shift, rtol=1e-7, atol=1e-7 * np.abs(factor.shift).max())
    Z_new = Z + 0.1 * rng.normal(size=Z.shape)
    K, K_new = kernel.K(Z) + JITTER * np.eye(12), kernel.K(Z_new) + JITTER * np.eye(12)
    mean, cov = ep.posterior_from_factor(kernel, Z, factor, jitter=JITTER).mean_and_cov()
    A = (kernel.K(Z_new, Z) + JITTER * np.eye(12)) @ np.linalg.inv(K)
    moved_mean, moved_cov = ep.posterior_from_factor(kernel, Z_new, ep.moved_factor(kernel, Z, Z_new, factor,
                                                                                    jitter=JITTER),
                                                     jitter=JITTER).mean_and_cov()
    np.testing.assert_allclose(moved_mean, A @ mean, atol=1e-9)
    np.testing.assert_allclose(moved_cov, A @ cov @ A.T + K_new - A @ K @ A.T, atol=1e-9)


@pytest.mark.parametrize("method", ["sep", "adf"])
def test_minibatch_steps_that_move_the_inducing_points_keep_q(method, monkeypatch):
    """Issue 39 (SEP at m = 500 makes little progress per step): a minibatch step moves every inducing point
    (Adadelta: about 0.01 a coordinate from the first step) while the tied factor, refreshed at rows / n of itself a
    step, needs an epoch to follow. Held as it is in u-space the factor then describes the old points and q loses
    what it held (airline, 50,000 rows, m = 500: test NLL 0.667 after 3 epochs against 0.620 with Z frozen;
    docs/methods/sep.md). From the factor converged at fixed hyper-parameters, 10 minibatch steps that move only
    Z must leave q's test NLL within 0.005 of the fixed point's; with the factor held (the former step) it rose by
    0.038 here. (Every step moves Z here: ``TIED_INDUCING_EVERY`` = 1; what the carry does, not how often.)"""
    monkeypatch.setattr(tied_steps, "TIED_INDUCING_EVERY", 1)

    def data(n, seed):
        r = np.random.default_rng(seed)
        X = r.normal(size=(n, 2))
        f = np.sin(1.5 * X[:, 0]) + 0.8 * np.cos(2.0 * X[:, 1]) + 0.5 * X[:, 0] * X[:, 1]
        return X, np.where(f + 0.7 * r.normal(size=n) > 0, 1.0, -1.0)

    X, y = data(400, 0)
    X_test, y_test = data(3000, 100)
    kernel = RBF(lengthscales=[2.0, 2.0], amplitude=2.0, noise=1e-3).for_inputs(X)
    Z = X[:20].copy()
    fixed = training.fit(X, y, kernel, Z, method=method, jitter=JITTER, max_iter=300, optimize=(), tol=1e-8)
    assert fixed.converged

    def nll_after_steps():
        engine = engines.make_engine(method, kernel, Z, n_total=400, minibatch=True, optimize=("inducing",),
                                     jitter=JITTER)
        engine.state["factor"] = fixed.factor
        trainer = training.Trainer(engine)
        for k in range(10):
            trainer.step_until_taken(X, y, 50 * (k % 8), 50 * (k % 8) + 50, stepping=True)
        s = engine.state
        assert float(np.abs(s["Z"] - Z).max()) > 0.03  # the points did move
        return ep.validation_scores(s["kernel"], s["Z"], ep.posterior_from_factor(s["kernel"], s["Z"], s["factor"],
                                                                                  jitter=JITTER), X_test, y_test)[0]

    start = ep.validation_scores(kernel, Z, ep.posterior_from_factor(kernel, Z, fixed.factor, jitter=JITTER),
                                 X_test, y_test)[0]
    carried = nll_after_steps()
    monkeypatch.setattr(engines.EPEngine, "carries_factor", False)
    held = nll_after_steps()
    assert abs(carried - start) < 0.005, (start, carried)
    assert held > start + 0.02, (start, held)  # what the carried factor avoids


@pytest.mark.parametrize("method", ["sep", "adf"])
def test_minibatch_sep_moves_the_inducing_points_every_few_steps_by_their_mean_gradient(method, monkeypatch):
    """Minibatch SEP / ADF move Z on every ``TIED_INDUCING_EVERY``-th step (each move carries the tied factor, an m^3
    pipeline as long as the rest of the step): on the steps between, the kernel steps and Z stays; the move is
    Adadelta's step on the mean of the gradients in Z of the steps since the last move, taken from the passes'
    results here (independent of the engine's own sum), and the factor is carried (``moved_factor`` called once a
    move). The guard's revert (``restore``) puts back Z and drops the gradients held so far (a bad one among them
    would spoil every retry of the move)."""
    X, y = make_banana(240, random_state=3)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z0 = X[:12].copy()
    every = tied_steps.TIED_INDUCING_EVERY
    assert every > 1
    engine = engines.make_engine(method, kernel, Z0, n_total=240, minibatch=True, jitter=JITTER)
    gradients, carries = [], []
    evaluate, moved = engine.passes.evaluate_factor, tied_steps.moved_factor

    def recording_evaluate(*args, **kwargs):
        out = evaluate(*args, **kwargs)
        if out["grads"] is not None:  # (a step that does not move the hyper-parameters has none)
            gradients.append(np.array(out["grads"]["Z"]))
        return out

    def recording_moved(*args, **kwargs):
        carries.append(len(gradients))
        return moved(*args, **kwargs)

    monkeypatch.setattr(engine.passes, "evaluate_factor", recording_evaluate)
    monkeypatch.setattr(tied_steps, "moved_factor", recording_moved)
    trainer = training.Trainer(engine)
    trainer.step_until_taken(X, y, 210, 240, stepping=False)  # (the factor off the prior: a gradient in the kernel)
    amplitudes = [float(engine.state["kernel"].amplitude)]
    for k in range(every - 1):
        trainer.step_until_taken(X, y, 30 * k, 30 * k + 30, stepping=True)
        assert engine.state["Z"] is Z0 and not carries
        amplitudes.append(float(engine.state["kernel"].amplitude))
    assert len(set(amplitudes)) == every  # the kernel stepped every step
    held = engine.state["held_inducing"]
    assert held[1] == every - 1
    np.testing.assert_allclose(held[0], sum(gradients), rtol=1e-12)
    snap = engine.snapshot()
    trainer.step_until_taken(X, y, 150, 180, stepping=True)
    assert carries == [every] and engine.state["held_inducing"] is None
    adadelta = optim.Adadelta()
    adadelta.steps_in_units({"Z": np.std(Z0, axis=0, keepdims=True)})  # (Z's steps in units of its spread)
    expected = adadelta.step({"Z": Z0}, {"Z": sum(gradients) / every})["Z"]
    np.testing.assert_allclose(engine.state["Z"], expected, rtol=1e-12, atol=1e-15)
    engine.restore(snap)
    assert engine.state["Z"] is Z0 and engine.state["held_inducing"] is None


def test_held_step_moves_z_by_the_mean_of_every_gradient_held():
    """``held_step``: the gradients of the steps between two moves are summed, and the move takes their mean over
    the count held, also a count past the period (a checkpoint of a version that moved Z less often)."""
    names, g = ("log_amplitude", "Z"), np.arange(6.0).reshape(3, 2)
    held = None
    for k in range(1, tied_steps.TIED_INDUCING_EVERY):
        stepped, _, held = tied_steps.held_step(names, {"Z": g * k}, held)
        assert stepped == ("log_amplitude",) and held[1] == k
    stepped, grads, held = tied_steps.held_step(names, {"Z": g * tied_steps.TIED_INDUCING_EVERY}, held)
    every = tied_steps.TIED_INDUCING_EVERY
    assert stepped == names and held is None
    np.testing.assert_allclose(grads["Z"], g * (every + 1) / 2)  # the mean of g, 2g, ..., every g
    stepped, grads, held = tied_steps.held_step(names, {"Z": g}, (50.0 * g, 50))
    assert stepped == names and held is None
    np.testing.assert_allclose(grads["Z"], g)  # (50 g + g) / 51


@pytest.mark.parametrize("case", ["data-parallel shard", "adam"])
def test_where_z_is_not_held_minibatch_sep_moves_it_every_step(case):
    """A data-parallel shard's engine (its ``factor_rows`` set) carries no factor and holds no Z; under Adam, whose
    bias correction counts its calls, all entries together (``optim.Adam``), a held Z's moments would be corrected as
    though stepped at each call. In both Z moves at every step, under the default Adadelta too for the shard."""
    X, y = make_banana(240, random_state=3)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    engine = engines.make_engine("sep", kernel, X[:12].copy(), n_total=240, minibatch=True, jitter=JITTER,
                                 **({"optimizer": "adam"} if case == "adam" else {}))
    if case == "data-parallel shard":
        engine.factor_rows = 120
    assert engine.step_time_window == 1
    trainer = training.Trainer(engine)
    for k in range(3):
        Z = engine.state["Z"]
        trainer.step_until_taken(X, y, 30 * k, 30 * k + 30, stepping=True)
        assert engine.state["Z"] is not Z and engine.state.get("held_inducing") is None


def test_a_float32_factor_carried_many_times_keeps_q():
    """A float32 factor is carried in float64 (``ep.moved_factor``): the Schur complement I - R R^T is a difference
    near I, float32's round-off in float32, as large as the smallest whitened variances of a factor that holds many
    rows; carried in float32 the factor was NaN within 30 carries of points that did not move (sites x 100 here).
    30 carries of unmoved points keep q's mean and variances at the inducing points to float32's accuracy."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 2))
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    Z = X[:50]
    upsilon = np.linalg.solve(kernel.K(Z) + JITTER * np.eye(50), kernel.K(X, Z).T)
    nu, mu = 100.0 * rng.uniform(0.0, 1.0, 2000), rng.normal(size=2000)
    factor = ep.Factor((upsilon * nu) @ upsilon.T, upsilon @ mu)
    kernel32 = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X.astype(np.float32))
    Z32 = Z.astype(np.float32)
    carried = ep.Factor(factor.precision.astype(np.float32), factor.shift.astype(np.float32))
    for _ in range(30):
        carried = ep.moved_factor(kernel32, Z32, Z32, carried, jitter=JITTER)
    assert carried.precision.dtype == np.float32
    mean, cov = ep.posterior_from_factor(kernel, Z, factor, jitter=JITTER).mean_and_cov()
    mean32, cov32 = ep.posterior_from_factor(kernel, Z, ep.Factor(carried.precision.astype(float),
                                                                  carried.shift.astype(float)),
                                             jitter=JITTER).mean_and_cov()
    np.testing.assert_allclose(np.diag(cov32), np.diag(cov), rtol=1e-2)
    np.testing.assert_allclose(mean32, mean, atol=1e-2 * np.abs(mean).max())
