"""GFITC (method="gfitc"): EP on the FITC prior, the baseline of Hernandez-Lobato & Hernandez-Lobato (2016) and
Villacampa-Calvo & Hernandez-Lobato (2017).

Gradients against finite differences at an EP fixed point (binary and multiclass, NumPy and array_api_strict),
the textbook full-GP EP on the dense FITC prior, learning on banana and wine against method="ep", save / load,
guard rails and the batch-only errors.
"""

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from agpc import GPClassifier, GuardWarning
from agpc.backend import CholeskyError
from agpc.datasets import make_banana
from agpc.inference import gfitc, training
from agpc.inference.engines import GFITCEngine
from agpc.kernels import RBF, ClassKernels, Matern52
from conftest import check_parameter_gradients, to_np, to_xp
from reference_full_gp_ep import full_gp_ep, full_gp_predict
from helpers import binary_toy, nll_of, three_classes

JITTER = 1e-6


def _three_classes(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X, y = three_classes(n, rng=rng)
    y = y.astype(float)
    Z = np.stack([X[rng.choice(n, 4, replace=False)] + 0.05 * c for c in range(3)])
    return X, y, Z


def _class_kernels(X):
    return ClassKernels(
        [cls(lengthscales=[0.9 + 0.2 * c, 1.3], amplitude=1.0 + 0.3 * c, noise=0.05 + 0.05 * c).for_inputs(X)
         for c, cls in enumerate((RBF, Matern52, RBF))]
    )


def _fixed_point(kernel, Z, X, y, tol_ep, damping=0.5):
    """EP run to convergence at fixed hyper-parameters: the one loop with nothing to optimise."""
    fit = training.fit(X, y, kernel, Z, method="gfitc", jitter=JITTER, damping=damping, optimize=(), tol=tol_ep,
                         max_iter=5000)
    assert fit.converged
    return fit.site_precision, fit.site_shift


@pytest.fixture(scope="module")
def binary_fixed_point():
    """EP converged on NumPy (the fixed point does not depend on the namespace; the test moves it)."""
    X, y = binary_toy(40)
    kernel = RBF(lengthscales=[0.8, 1.3], amplitude=1.5, noise=0.05).for_inputs(X)
    Z = X[:7] + 0.1
    return X, y, Z, _fixed_point(kernel, Z, X, y, 1e-13)


@pytest.fixture(scope="module")
def multiclass_fixed_point():
    X, y, Z = _three_classes()
    # undamped: the same fixed point in half the sweeps of damping 0.5 (multiclass parallel EP is slow)
    return X, y, Z, _fixed_point(_class_kernels(X), Z, X, y, 1e-10, damping=1.0)


def _check_gradients(fixed_point, make_kernel, xp_device):
    """At an EP fixed point d log Z_EP / d xi with the sites fixed is the gradient of
    log N(mu~ | 0, K_fitc + Sigma~) (R&W eq. 5.27): every kernel parameter and every entry of Z
    against central differences of log Z_EP, the sites held fixed."""
    xp, device = xp_device
    X_np, y_np, Z_np, (tau, nu) = fixed_point
    X, y, Z = to_xp(X_np, xp, device), to_xp(y_np, xp, device), to_xp(Z_np, xp, device)
    tau, nu = to_xp(to_np(tau), xp, device), to_xp(to_np(nu), xp, device)
    kernel = make_kernel(X)
    out = gfitc.evaluate(kernel, Z, X, y, tau, nu, jitter=JITTER)
    assert out["n_invalid"] == 0

    def log_z(k, ZZ):
        return float(gfitc.evaluate(k, ZZ, X, y, tau, nu, jitter=JITTER, want_grad=False)["log_z"])

    check_parameter_gradients(kernel, out["grads"], Z, log_z, xp, device, rtol=1e-5, atol=1e-6)
    assert out["grads"]["Z"].device == X.device and out["site_precision"].device == X.device


def test_binary_gradient_matches_finite_differences_at_ep_fixed_point(binary_fixed_point, xp_device):
    _check_gradients(binary_fixed_point,
                     lambda X: RBF(lengthscales=[0.8, 1.3], amplitude=1.5, noise=0.05).for_inputs(X), xp_device)


@pytest.mark.parametrize("xp_device", ["numpy", "strict-device1"], indirect=True)  # as tests/test_multiclass.py
def test_multiclass_gradient_matches_finite_differences_at_ep_fixed_point(multiclass_fixed_point, xp_device):
    """One GP per class, pair sites factorised over the two classes (Villacampa-Calvo & Hernandez-Lobato 2017): each
    class's gradient is its own FITC term with the rows' total sites."""
    _check_gradients(multiclass_fixed_point, _class_kernels, xp_device)


@pytest.mark.parametrize("inducing", ["data", "subset"])
def test_equals_textbook_full_gp_ep_on_the_fitc_prior(inducing):
    """GFITC is full EP on f ~ N(0, K_fitc): Rasmussen & Williams Alg. 3.5 on the dense K_fitc must give the
    same converged sites (tau~, nu~), log Z_EP (eq. 3.65) and predictions (Alg. 3.6, with the FITC
    cross-covariance Q(X, X*) and prior variance Kdiag(X*)). Z = X (m = n, no latent noise: the full GP
    up to jitter) and m < n with latent noise (the diag(K - Q) correction matters)."""
    rng = np.random.default_rng(7)
    n = 25
    X = np.sort(rng.uniform(-3, 3, size=(n, 1)), axis=0)
    y = np.where(np.sin(1.5 * X[:, 0]) + 0.4 * rng.normal(size=n) > 0, 1.0, -1.0)
    X_test = np.linspace(-4, 4, 17)[:, None]
    if inducing == "data":
        kernel, Z = RBF(lengthscales=[0.9], amplitude=2.0, noise=0.0), X.copy()
    else:
        kernel, Z = RBF(lengthscales=[0.9], amplitude=2.0, noise=0.1), np.linspace(-2.5, 2.5, 6)[:, None]
    k = kernel.for_inputs(X)
    fit = training.fit(X, y, k, Z, method="gfitc", jitter=JITTER, max_iter=5000, optimize=(), tol=1e-13)
    assert fit.converged

    Kmm = k.K(Z) + JITTER * np.eye(Z.shape[0])
    Q = k.K(X, Z) @ np.linalg.solve(Kmm, k.K(Z, X))
    K_fitc = Q - np.diag(np.diag(Q)) + np.diag(k.Kdiag(X))
    ref = full_gp_ep(K_fitc, y, tol=1e-13)
    assert abs(fit.log_z - ref["log_z"]) < 1e-8
    np.testing.assert_allclose(fit.site_precision, ref["tau_tilde"], rtol=0, atol=1e-8)
    np.testing.assert_allclose(fit.site_shift, ref["nu_tilde"], rtol=0, atol=1e-8)

    Q_cross = k.K(X, Z) @ np.linalg.solve(Kmm, k.K(Z, X_test))
    mean_ref, var_ref, prob_ref = full_gp_predict(K_fitc, y, ref, Q_cross, k.Kdiag(X_test))
    model = GPClassifier(method="gfitc", kernel=kernel, inducing=Z, optimize=False, jitter=JITTER, max_iter=5000,
                         tol=1e-13).fit(X, y)
    assert abs(model.log_marginal_likelihood_ - ref["log_z"]) < 1e-8
    mean, var = model.predict_latent(X_test)
    np.testing.assert_allclose(mean, mean_ref, rtol=0, atol=1e-8)
    np.testing.assert_allclose(var, var_ref, rtol=0, atol=1e-8)
    np.testing.assert_allclose(model.predict_proba(X_test)[:, 1], prob_ref, rtol=0, atol=1e-8)


def test_binary_fixed_point_is_method_ep_fixed_point(binary_fixed_point):
    """With one site per row, f-space moment matching (GFITC) and u-space moment matching (Hernandez-Lobato &
    Hernandez-Lobato 2016) give the same fixed point at fixed hyper-parameters: EP's site on g_i is GFITC's through the
    FITC conditional, nu_ep = tau / (1 + s tau), mu_ep = nu / (1 + s tau), and log Z_q (eq. 26) equals log Z_EP. The
    methods differ in the schedule: GFITC converges EP before every hyper-parameter step."""
    X, y, Z, (tau, nu) = binary_fixed_point
    kernel = RBF(lengthscales=[0.8, 1.3], amplitude=1.5, noise=0.05).for_inputs(X)
    fit = training.fit(X, y, kernel, Z, jitter=JITTER, max_iter=3000, optimize=(), tol=1e-13)
    assert fit.converged
    s = kernel.Kdiag(X) - np.sum(kernel.K(X, Z) * np.linalg.solve(kernel.K(Z) + JITTER * np.eye(7), kernel.K(Z, X)).T,
                                 axis=1)
    np.testing.assert_allclose(fit.site_precision, tau / (1 + s * tau), rtol=0, atol=1e-9)
    np.testing.assert_allclose(fit.site_shift, nu / (1 + s * tau), rtol=0, atol=1e-9)
    log_z = float(gfitc.evaluate(kernel, Z, X, y, tau, nu, jitter=JITTER, want_grad=False)["log_z"])
    assert abs(fit.log_z - log_z) < 1e-9


@pytest.fixture(scope="module")
def banana():
    X, y = make_banana(400, random_state=0)
    X_test, y_test = make_banana(2000, random_state=1)
    kw = dict(n_inducing=15, max_iter=40, random_state=0)
    return X, y, X_test, y_test, GPClassifier(method="gfitc", tol=1e-4, **kw).fit(X, y), GPClassifier(**kw).fit(X, y)


def test_banana_learns_as_well_as_ep(banana):
    """Same initial kernel and inducing points, 40 steps each: log Z_EP rises and GFITC's test error and NLL are
    within 0.02 of method="ep"'s (measured: error 0.1585 vs 0.1555, NLL 0.3683 vs 0.3673) and its NLL well
    below a linear logistic regression's (measured 0.463, error 0.208)."""
    from sklearn.linear_model import LogisticRegression

    X, y, X_test, y_test, model, reference = banana
    history = np.asarray(model.history_["log_marginal_likelihood"])
    assert model.n_iter_ == len(history) == 40  # one entry a step on the hyper-parameters
    assert np.all(np.diff(model.history_["n_steps"]) >= 2)  # each after its EP sweeps and its gradient pass
    assert history[-1] > history[0] + 20
    assert nll_of(model, X_test, y_test) < nll_of(reference, X_test, y_test) + 0.02
    assert model.score(X_test, y_test) > reference.score(X_test, y_test) - 0.02
    assert nll_of(model, X_test, y_test) < nll_of(LogisticRegression().fit(X, y), X_test, y_test) - 0.05


def test_save_load_round_trip(banana, tmp_path):
    model = banana[4]
    X_test = banana[2]
    path = tmp_path / "gfitc.agpc"
    model.save(path)
    loaded = GPClassifier.load(path)
    assert loaded.method == "gfitc"
    np.testing.assert_allclose(loaded.predict_proba(X_test), model.predict_proba(X_test), rtol=1e-12, atol=1e-14)


def test_multiclass_wine_learns_as_well_as_ep_and_round_trips(tmp_path):
    """Three classes on wine (standardised, 80/20 split): GFITC's test NLL within 0.05 of method="ep"'s at
    the same settings, accuracy >= 0.9 (measured at 15 steps, m = 6: NLL 0.207 vs 0.204 for EP, accuracy 0.944
    both); probabilities sum to one; the saved model predicts the same."""
    from sklearn.datasets import load_wine

    X, y = load_wine(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    Xtr, ytr, Xte, yte = X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]
    kw = dict(n_inducing=6, max_iter=15, random_state=0)
    model = GPClassifier(method="gfitc", tol=1e-3, **kw).fit(Xtr, ytr)
    reference = GPClassifier(**kw).fit(Xtr, ytr)
    assert isinstance(model.kernel_, ClassKernels) and tuple(model.inducing_points_.shape) == (3, 6, 13)
    P = model.predict_proba(Xte)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert nll_of(model, Xte, yte) < nll_of(reference, Xte, yte) + 0.05
    assert model.score(Xte, yte) >= 0.9
    path = tmp_path / "wine_gfitc.agpc"
    model.save(path)
    np.testing.assert_allclose(GPClassifier.load(path).predict_proba(Xte), P, rtol=1e-12, atol=1e-14)


def test_strict_device1_fit_equals_numpy_fit():
    """The training loop (EP runs, steps, prediction) on array_api_strict's device1 gives NumPy's numbers,
    every output on the input's device."""
    import array_api_strict as xs

    X, y = make_banana(80, random_state=3)
    X_test, _ = make_banana(20, random_state=4)
    kw = dict(method="gfitc", n_inducing=6, max_iter=5, tol=1e-4, random_state=0)
    ref = GPClassifier(**kw).fit(X, y)
    device = xs.Device("device1")
    model = GPClassifier(**kw).fit(xs.asarray(X, device=device), xs.asarray(y.astype(float), device=device))
    proba = model.predict_proba(xs.asarray(X_test, device=device))
    assert model.inducing_points_.device == device and proba.device == device
    np.testing.assert_allclose(model.history_["log_marginal_likelihood"], ref.history_["log_marginal_likelihood"],
                               rtol=1e-8)
    np.testing.assert_allclose(to_np(proba), ref.predict_proba(X_test), rtol=1e-8, atol=1e-12)


def test_non_finite_log_z_reverts_and_halves_damping_and_steps(monkeypatch):
    """Guard rails as training.Trainer: a NaN log Z_EP (30th pass) or a failed Cholesky (45th) puts back the
    state before the last step and halves damping and step sizes, which grow back after good steps (guard.Guard);
    training goes on to max_iter steps and the fit warns with the counts."""
    X, y = binary_toy(40)
    kernel = RBF(lengthscales=[1.0, 1.0], amplitude=1.0, noise=0.01).for_inputs(X)
    passes = []
    real = gfitc.evaluate

    def failing_on_passes_30_and_45(*args, **kwargs):
        passes.append(None)
        if len(passes) == 45:
            raise CholeskyError("Cholesky of Kmm failed (test)")
        return dict(real(*args, **kwargs), log_z=float("nan")) if len(passes) == 30 else real(*args, **kwargs)

    monkeypatch.setattr(gfitc, "evaluate", failing_on_passes_30_and_45)
    with pytest.warns(GuardWarning, match="did not take 2 steps.*halved damping and step sizes twice"):
        fit = training.fit(X, y, kernel, X[:5].copy(), method="gfitc", jitter=JITTER, max_iter=8, tol=1e-4)
    assert len(passes) > 45 and fit.n_iter == 8
    history = fit.history
    assert sum(history["guard_rejected"]) == sum(history["guard_halvings"]) == 2
    assert sum(history["guard_restored"]) == 2  # each halving doubled back after good steps
    assert history["damping"][0] == 0.5 and min(history["damping"]) == 0.25 and history["damping"][-1] == 0.5
    assert np.all(np.isfinite(fit.history["log_marginal_likelihood"]))


def test_a_two_cycle_of_the_sweeps_halves_the_damping():
    """Sample weights 1000 and 1e-4 on 50 rows (scikit-learn's class-weight check): from about the 120th iteration
    parallel EP's sweeps go round a two-cycle (rows' cavities invalid and valid in turn, each step the reverse of
    the last), which at damping 0.5 ran every inner loop to its 100 sweeps and let the hyper-parameters step at
    sites that had not settled (log Z fell from its best). The guard halves the damping after
    ``cycle_sweeps`` reversed steps in a row (engines.GFITCEngine): no inner loop runs to the cap, log Z ends at its
    best, and the warning says what was done."""
    X, y = make_blobs(n_samples=50, centers=2, random_state=0, cluster_std=20)
    model = GPClassifier(method="gfitc", n_inducing=5, random_state=0, max_iter=200, tol=1e-3, plateau=None,
                         class_weight={0: 1000, 1: 0.0001})
    with pytest.warns(GuardWarning, match="halved the EP damping .* two-cycle"):
        model.fit(X, y)
    history = model.history_
    sweeps_per_iteration = np.diff(history["n_steps"])  # (cumulative: one hyper-parameter step, then the sweeps)
    assert sum(history["guard_halvings"]) >= 1 and sum(history["guard_rejected"]) == 0
    assert sweeps_per_iteration.max() < GFITCEngine.max_sweeps
    log_z = np.array(history["log_marginal_likelihood"])
    assert log_z[-1] >= log_z[100:].max() - 1e-3 * abs(log_z[-1])


def test_batch_only_errors():
    """GFITC needs all sites converged (and the n x m factor of all rows) before every step: minibatches and
    dask arrays are refused with a ValueError that says so; like EP it has no partial_fit (scikit-learn's
    convention for a method an estimator cannot offer)."""
    import dask.array as da

    X, y = binary_toy(30)
    with pytest.raises(ValueError, match="batch-only.*batch_size=10.*not a sum over rows"):
        GPClassifier(method="gfitc", n_inducing=5, batch_size=10).fit(X, y)
    assert not hasattr(GPClassifier(method="gfitc"), "partial_fit")
    with pytest.raises(ValueError, match="batch-only.*dask"):
        GPClassifier(method="gfitc", n_inducing=5).fit(da.from_array(X, chunks=10), da.from_array(y, chunks=10))
    with pytest.raises(ValueError, match="rprop"):
        GPClassifier(method="gfitc", n_inducing=5, optimizer="adam").fit(X, y)
    assert isinstance(GPClassifier(method="gfitc", n_inducing=5, batch_size="auto", max_iter=1).fit(X, y),
                      GPClassifier)


def test_the_two_cycle_guard_counts_reversed_sweeps_and_keeps_its_halving():
    """The mutation audit of 2026-12-04: GFITC's two-cycle guard (``GFITCEngine.apply``). A sweep after a zero step
    reverses nothing; ``cycle_sweeps`` reversed sweeps in a row (cosine -1 here) halve the damping; and within that
    inner loop the guard's doubling back (``grow``) waits, the damping staying halved."""
    from agpc.inference import engines
    X, y = binary_toy(30, seed=0)
    engine = engines.make_engine("gfitc", RBF(lengthscales=[1.0, 1.0]).for_inputs(X), X[:5].copy(), n_total=30,
                                 minibatch=False, **vars(engines.EngineOptions(tol=1e-12)))
    rho = engine.damping
    assert not np.any(to_np(engine.state["site_step"]))  # (the first sweep follows a zero step)
    _, work = engine.evaluate(X, y, 0, 30, stepping=True)
    outcome = engine.apply(work, 0, 30, stepping=True)
    assert engine.reversals == 0 and outcome.guard is None and engine.damping == rho
    for k in range(1, engine.cycle_sweeps + 1):
        _, work = engine.evaluate(X, y, 0, 30, stepping=True)
        out, s = work[0], engine.state
        s["site_step"] = -rho * (out["site_precision"] - s["nu"])  # the coming step, reversed
        outcome = engine.apply(work, 0, 30, stepping=True)
        if k < engine.cycle_sweeps:
            assert engine.reversals == k and outcome.guard is None and engine.damping == rho
    assert outcome.guard == {"guard_halvings": 1, "cycles": 1}
    assert engine.damping == 0.5 * rho and engine.cycle_halved and engine.reversals == 0
    assert not engine.grow() and engine.damping == 0.5 * rho
