"""Every kernel runs one shared contract (GPyTorch's ``base_kernel_test_case`` idea): values against a direct
computation, gradients w.r.t. every parameter of its table and every entry of Z by central finite differences,
Kdiag consistent with K, log prior gradients by finite differences, a fit through GPClassifier(kernel=...), a
save / load round trip with the same predictions, and the values and gradients on array_api_strict (default and
a non-default device). A new kernel is tested by one more subclass of ``KernelContract``."""

import json
import warnings

import array_api_strict
import numpy as np
import pytest

import agpc
from agpc import persistence as model_files
from agpc.kernels import (
    RBF,
    Categorical,
    ClassKernels,
    Linear,
    Matern52,
    OnColumns,
    Product,
    RationalQuadratic,
    Sum,
    kernel_from_spec,
    log_prior_and_grads,
    mixed_kernel,
)
from agpc.kernels import KERNEL_REACH, within_reach
from agpc.priors import Gamma, LogNormal, prior_from_spec
from conftest import central_differences, check_parameter_gradients, to_np, to_xp

D = 3


def squared_distances(X, Z, lengthscales):
    """r^2 by the definition, pair by pair (no expansion of the square)."""
    diff = (X[:, None, :] - Z[None, :, :]) / np.asarray(lengthscales)
    return np.sum(diff * diff, axis=-1)


def rbf_reference(lengthscales, amplitude):
    return lambda X, Z: amplitude * np.exp(-0.5 * squared_distances(X, Z, lengthscales))


def matern52_reference(lengthscales, amplitude):
    def k(X, Z):
        r = np.sqrt(squared_distances(X, Z, lengthscales))
        return amplitude * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)
    return k


def rational_quadratic_reference(lengthscales, amplitude, alpha):
    # Rasmussen & Williams (2006), eq. 4.19, as written there
    return lambda X, Z: amplitude * (1 + squared_distances(X, Z, lengthscales) / (2 * alpha)) ** (-alpha)


def objective(kernel, X, Z, W_mm, W_nm, w_diag, xp):
    """A scalar L = <W_mm, K(Z,Z)> + <W_nm, K(X,Z)> + <w, Kdiag(X)>, so dL/dK* = W*."""
    return float(xp.sum(W_mm * kernel.K(Z)) + xp.sum(W_nm * kernel.K(X, Z)) + xp.sum(w_diag * kernel.Kdiag(X)))


def small_problem(seed=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(40, D))
    y = np.where(X[:, 0] + 0.5 * np.sin(2 * X[:, 1]) + 0.3 * rng.normal(size=40) > 0, 1, 0)
    return X, y


class KernelContract:
    """What every kernel must satisfy. A subclass gives ``make_kernel`` (with ``priors=True``: a prior on every
    learnable parameter), ``reference`` (the noise-free covariance computed directly) and ``noise``; a kernel of
    categorical columns gives ``inputs`` (rows with level codes there), ``problem`` (a small classification problem
    of such rows), ``discrete_columns`` (the columns of Z it must never move: exactly 0 gradient there, where finite
    differences across a code mean nothing) and ``fit_options`` (inducing points that are rows, so on levels)."""

    noise = 0.2
    discrete_columns = ()
    fit_options = {}

    def make_kernel(self, priors=False):
        raise NotImplementedError

    def reference(self, X, Z):
        raise NotImplementedError

    def inputs(self, rng, n):
        """n rows of D features to compute the kernel on."""
        return rng.normal(size=(n, D))

    def problem(self):
        return small_problem()

    def test_values_against_direct_computation(self):
        rng = np.random.default_rng(0)
        X, Z = self.inputs(rng, 7), self.inputs(rng, 4)
        kernel = self.make_kernel().for_inputs(X)
        np.testing.assert_allclose(np.asarray(kernel.K(X, Z)), self.reference(X, Z), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(kernel.K(X)), self.reference(X, X), rtol=1e-12, atol=1e-14)

    def test_diag_consistent_with_K(self, xp_device):
        xp, device = xp_device
        X = to_xp(self.inputs(np.random.default_rng(1), 8), xp, device)
        kernel = self.make_kernel().for_inputs(X)
        K, diag = kernel.K(X), kernel.Kdiag(X)
        assert K.device == X.device and diag.device == X.device
        K, diag = to_np(K), to_np(diag)
        np.testing.assert_allclose(K, K.T, atol=1e-14)
        # the latent noise enters Kdiag only, once for the whole kernel
        np.testing.assert_allclose(diag, np.diag(K) + self.noise, rtol=1e-12)
        assert np.min(np.linalg.eigvalsh(K)) > -1e-10

    def test_gradients_by_finite_differences(self, xp_device):
        xp, device = xp_device
        rng = np.random.default_rng(3)
        n, m = 9, 5
        X = to_xp(self.inputs(rng, n), xp, device)
        Z = to_xp(self.inputs(rng, m), xp, device)
        W_mm = to_xp(rng.normal(size=(m, m)), xp, device)  # deliberately not symmetric
        W_nm = to_xp(rng.normal(size=(n, m)), xp, device)
        w_diag = to_xp(rng.normal(size=n), xp, device)
        kernel = self.make_kernel().for_inputs(X)
        grads = kernel.grads(W_mm, W_nm, w_diag, X, Z)
        assert set(grads) == set(kernel.parameter_table()) | {"Z"}
        held = self.held(Z, xp, device)
        check_parameter_gradients(kernel, grads, Z, lambda k, ZZ: objective(k, X, held(ZZ), W_mm, W_nm, w_diag, xp),
                                  xp, device, rtol=1e-6, atol=1e-7)
        assert grads["Z"].device == X.device
        # any adjoint may be absent
        only_mm = kernel.grads(W_mm, None, None, X, Z)
        check_parameter_gradients(kernel, only_mm, Z, lambda k, ZZ: float(xp.sum(W_mm * k.K(held(ZZ)))),
                                  xp, device, rtol=1e-6, atol=1e-7)
        for g in (grads, only_mm):  # codes are never moved: exactly 0, not a small number
            assert np.all(to_np(g["Z"])[:, list(self.discrete_columns)] == 0.0)

    def held(self, Z, xp, device):
        """ZZ -> ZZ with the ``discrete_columns`` put back to Z's: finite differences of the objective in those
        columns are then 0, the gradient asked of them."""
        if not self.discrete_columns:
            return lambda ZZ: ZZ
        columns = list(self.discrete_columns)

        def hold(ZZ):
            values = to_np(ZZ).copy()
            values[:, columns] = to_np(Z)[:, columns]
            return to_xp(values, xp, device)
        return hold

    def test_parameter_table_describes_params(self):
        kernel = self.make_kernel().for_inputs(np.zeros((2, D)))
        table = kernel.parameter_table()
        assert list(table) == list(kernel.params)
        for key, parameter in table.items():
            assert key.endswith(parameter.key)
            expected = ((D,) if parameter.shape == "per_dimension" else (parameter.length,) if parameter.length
                        else ())
            assert kernel.params[key].shape == expected
        assert [key for key, p in table.items() if p.may_be_zero] == ["log_noise"]  # one noise, the kernel's

    def test_log_prior_gradients_by_finite_differences(self):
        kernel = self.make_kernel(priors=True).for_inputs(np.zeros((2, D)))
        assert set(kernel.priors) == set(kernel.params)
        value, grads = log_prior_and_grads(kernel)
        assert set(grads) == set(kernel.params)
        for key, stored in kernel.params.items():
            numeric = central_differences(
                lambda u: float(log_prior_and_grads(kernel.with_params({**kernel.params, key: u}))[0]), stored)
            np.testing.assert_allclose(grads[key], numeric, rtol=1e-6, atol=1e-8, err_msg=key)
        # the density of u = log theta: log p(theta) + u for each entry (agpc.priors), against scipy's densities
        stats = pytest.importorskip("scipy.stats")
        expected = 0.0
        for key, parameter in kernel.parameter_table().items():
            theta = np.exp(kernel.params[key])
            prior = parameter.prior
            dist = (stats.gamma(prior.shape, scale=1 / prior.rate) if prior.family == "Gamma"
                    else stats.lognorm(prior.scale, scale=np.exp(prior.loc)))
            expected += np.sum(dist.logpdf(theta) + np.log(theta))
        np.testing.assert_allclose(float(value), expected, rtol=1e-12)

    def test_without_priors_adds_nothing(self):
        assert log_prior_and_grads(self.make_kernel()) == (None, {})

    def test_fit_through_classifier_save_and_load(self, tmp_path):
        X, y = self.problem()
        model = agpc.GPClassifier(kernel=self.make_kernel(priors=True), n_inducing=6, max_iter=4, random_state=0,
                                  **self.fit_options)
        model.fit(X, y)
        fitted = model.kernel_
        assert type(fitted) is type(self.make_kernel())
        assert set(fitted.parameter_table()) == set(self.make_kernel().for_inputs(X).parameter_table())
        assert fitted.priors.keys() == self.make_kernel(priors=True).priors.keys()
        start = self.make_kernel().for_inputs(X).params
        assert any(not np.allclose(fitted.params[k], start[k]) for k in start), "no hyper-parameter moved"
        proba = model.predict_proba(X)
        assert np.all(np.isfinite(proba))
        # far inputs: clamped to the kernel's reach, or shrunk radially where its variance grows with |x| (a linear
        # term): finite probabilities, no NaN from an overflowed k(x, x) (a rational quadratic alone has neither)
        if fitted.reach_lengthscales is not None or fitted.growth is not None:
            far = model.predict_proba(X[:2] * 1e300)
            assert np.all(np.isfinite(far))
            np.testing.assert_allclose(far.sum(axis=1), 1.0)
        if fitted.growth is not None:  # along a ray the probability has converged: the same far and farther
            np.testing.assert_allclose(model.predict_proba(X[:2] * 1e160), far, rtol=1e-6, atol=1e-12)
        path = tmp_path / "model.npz"
        model_files.save_model(model, path)
        loaded = model_files.load_model(path)
        assert loaded.kernel_.spec() == fitted.spec()
        assert repr(loaded.kernel_) == repr(fitted)
        np.testing.assert_array_equal(loaded.predict_proba(X), proba)

    @pytest.mark.parametrize("device", [None, array_api_strict.Device("device1")], ids=["default", "device1"])
    def test_fit_on_array_api_strict_equals_numpy(self, device):
        """The fit (priors included) in array_api_strict on its default and a non-default device: every fitted
        parameter on the input's device, the same predictions as on NumPy."""
        X, y = self.problem()
        fit = lambda X_, y_: agpc.GPClassifier(kernel=self.make_kernel(priors=True), n_inducing=6,  # noqa: E731
                                               max_iter=4, random_state=0, **self.fit_options).fit(X_, y_)
        reference = fit(X, y).predict_proba(X)
        Xs = array_api_strict.asarray(X, device=device)
        model = fit(Xs, array_api_strict.asarray(y.astype(np.float64), device=device))
        assert all(value.device == Xs.device for value in model.kernel_.params.values())
        proba = model.predict_proba(Xs)
        assert proba.device == Xs.device
        np.testing.assert_allclose(to_np(proba), reference, rtol=1e-8, atol=1e-10)


class TestRBF(KernelContract):
    def make_kernel(self, priors=False):
        return RBF([0.7, 1.3, 2.1], amplitude=1.7, noise=self.noise, priors={
            "lengthscales": Gamma(2.0, 1.5), "amplitude": LogNormal(0.0, 1.0), "noise": Gamma(1.5, 4.0)} if priors
            else None)

    def reference(self, X, Z):
        return rbf_reference([0.7, 1.3, 2.1], 1.7)(X, Z)


class TestMatern52(KernelContract):
    def make_kernel(self, priors=False):
        return Matern52([0.9, 1.1, 1.6], amplitude=0.8, noise=self.noise, priors={
            "lengthscales": LogNormal(0.3, 0.5), "amplitude": Gamma(2.0, 2.0), "noise": LogNormal(-2.0, 1.0)}
            if priors else None)

    def reference(self, X, Z):
        return matern52_reference([0.9, 1.1, 1.6], 0.8)(X, Z)


class TestRationalQuadratic(KernelContract):
    def make_kernel(self, priors=False):
        return RationalQuadratic([0.6, 1.2, 1.9], amplitude=1.3, noise=self.noise, alpha=0.7, priors={
            "lengthscales": Gamma(3.0, 2.0), "amplitude": Gamma(2.0, 1.0), "noise": Gamma(1.5, 4.0),
            "alpha": LogNormal(0.0, 2.0)} if priors else None)

    def reference(self, X, Z):
        return rational_quadratic_reference([0.6, 1.2, 1.9], 1.3, 0.7)(X, Z)


class TestLinear(KernelContract):
    def make_kernel(self, priors=False):
        return Linear([0.6, 1.4, 0.3], bias=0.8, noise=self.noise, priors={
            "variances": LogNormal(-1.0, 1.5), "bias": Gamma(2.0, 2.0), "noise": Gamma(1.5, 4.0)} if priors else None)

    def reference(self, X, Z):
        return (X * np.array([0.6, 1.4, 0.3])) @ Z.T + 0.8


class TestLinearPlusRBF(KernelContract):
    """A sum of a stationary and a non-stationary term (the linear kernel inside a combination)."""

    def make_kernel(self, priors=False):
        linear = Linear([0.5, 0.9, 1.2], bias=0.4,
                        priors={"variances": Gamma(2.0, 2.0), "bias": LogNormal(0.0, 1.0)} if priors else None)
        rbf = RBF([0.7, 1.3, 2.1], amplitude=1.1,
                  priors={"lengthscales": Gamma(2.0, 1.5), "amplitude": Gamma(2.0, 2.0)} if priors else None)
        return Sum(linear, rbf, noise=self.noise, priors={"noise": Gamma(1.5, 4.0)} if priors else None)

    def reference(self, X, Z):
        return (X * np.array([0.5, 0.9, 1.2])) @ Z.T + 0.4 + rbf_reference([0.7, 1.3, 2.1], 1.1)(X, Z)


class TestLinearTimesLinear(KernelContract):
    """A product of two linear kernels: a quadratic latent function, the last stage of ``ard="auto"``; its variance
    grows as |x|^4 (``growth_power`` 2), which the radial shrink of far rows must bound."""

    def make_kernel(self, priors=False):
        first = Linear([0.5, 0.9, 1.2], bias=0.4,
                       priors={"variances": Gamma(2.0, 2.0), "bias": LogNormal(0.0, 1.0)} if priors else None)
        second = Linear([1.1, 0.3, 0.7], bias=1.5,
                        priors={"variances": LogNormal(0.0, 1.0), "bias": Gamma(2.0, 1.0)} if priors else None)
        return Product(first, second, noise=self.noise, priors={"noise": Gamma(1.5, 4.0)} if priors else None)

    def reference(self, X, Z):
        return ((X * np.array([0.5, 0.9, 1.2])) @ Z.T + 0.4) * ((X * np.array([1.1, 0.3, 0.7])) @ Z.T + 1.5)

    def test_growth_bounds_the_variance(self):
        """k(x, x) <= (sum_j growth_j x_j^2 + c)^2: the leading coefficient of the product's variance along a ray is
        bounded by the square of the terms' largest slope variances feature by feature (power 2)."""
        kernel = self.make_kernel()
        assert kernel.growth_power == 2
        np.testing.assert_allclose(np.asarray(kernel.growth), [1.1, 0.9, 1.2])
        for direction in (np.array([[0.3, -0.8, 0.5]]), np.array([[1.0, 0.0, 0.0]]), np.array([[0.0, 1.0, 1e-3]])):
            t = 1e6
            leading = float(kernel.Kdiag(direction * t)[0]) / t ** 4
            assert leading <= float(np.sum(np.asarray(kernel.growth) * direction ** 2)) ** 2 * (1 + 1e-9)


@pytest.mark.parametrize("dtype, scale", [("float64", 1e100), ("float64", 1e-100), ("float32", 1e12),
                                          ("float32", 1e-12)])
def test_far_rows_of_a_quadratic_kernel_shrink_and_rows_at_the_features_scale_do_not(dtype, scale):
    """The quadratic kernel ``ard="auto"`` weighs, at slope variances 1 / scale^2 for features of that scale:
    rows of the features' scale are left as they are (the product of the slope variances, past the type's range
    there, shrank every row to a radius of 0 or of limit^(1/2)), and far rows are shrunk to where k(x, x) is at
    most the square root of the type's largest number."""
    X = (np.random.default_rng(0).standard_normal((6, D)) * scale).astype(dtype)
    linear = Linear(1.0 / scale ** 2, bias=1.0)
    kernel = Product(linear, linear).for_inputs(X)
    np.testing.assert_array_equal(np.asarray(within_reach(kernel, X, X)), X)
    with np.errstate(over="raise"):
        far = within_reach(kernel, X, X * np.asarray(1e200 if dtype == "float64" else 1e20, dtype=dtype))
        variance = np.asarray(kernel.Kdiag(far))
    assert np.all(variance <= float(np.finfo(dtype).max) ** 0.5 * (1 + 1e-5)) and np.all(variance > 1e3)


@pytest.mark.parametrize("dtype, scale", [("float32", 1e7), ("float64", 1e50), ("float64", 1e-150)])
def test_a_feature_of_another_scale_does_not_shrink_every_row_of_a_growing_kernel(dtype, scale):
    """A hostile-input audit (2026-12-02): the radius of far rows was the largest slope variance's, so a column of a
    far larger scale than the others (its slope variance small) shortened every row's radius and shrank the rows onto
    that column: the default quadratic kernel's training accuracy 0.985 fell to 0.555 (float32, a column of 1e7) and
    0.525 (float64, 1e50), without a word. Rows of the features' own scale are now left as they are."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    X[:, 2] *= scale
    model = agpc.GPClassifier(max_iter=5, random_state=0, dtype=dtype).fit(X.astype(dtype), y)
    assert model.kernel_.growth is not None  # (the quadratic kernel the default keeps on this set)
    rows = X.astype(dtype)
    np.testing.assert_array_equal(np.asarray(within_reach(model.kernel_, model.inducing_points_, rows)), rows)
    assert model.score(rows, y) > 0.95


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_row_of_entries_near_the_largest_number_keeps_its_direction(dtype):
    """The same audit: a row whose length overflowed (entries near the type's largest number) was shrunk by a factor
    of 0, onto the origin, with an overflow warning; it keeps its direction now, the limit along its ray."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    model = agpc.GPClassifier(kernel=Linear(), max_iter=5, random_state=0, dtype=dtype).fit(X.astype(dtype), y)
    largest = float(np.finfo(dtype).max)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        far = model.predict_proba(np.full((1, 3), largest, dtype=dtype))
    np.testing.assert_allclose(far, model.predict_proba(np.full((1, 3), largest ** 0.5, dtype=dtype)), rtol=1e-5)
    assert far[0, 1] > 0.99  # (the direction (1, 1, 1) of the positive class, not the origin's 0.49)


def test_the_reach_of_a_multiclass_model_spans_every_class_s_inducing_points():
    """Each class has its own inducing points: a row is clamped only beyond the reach of all of them (the union of
    the classes' ranges), so a row on one class's points is left where it is however far the other classes' lie.
    The mutation audit of 2026-12-04: the union taken as the intersection passed every test."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 2))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    model = agpc.GPClassifier(n_inducing=6, max_iter=3, random_state=0).fit(X, y)
    kernel, Z = model.kernel_, np.array(model.inducing_points_)
    reach = max(float(np.max(np.asarray(kernel[c].reach_of_columns(X)))) for c in range(Z.shape[0]))
    Z += (np.arange(Z.shape[0]) * 1e3 * KERNEL_REACH * reach)[:, None, None]  # classes far beyond each other's reach
    rows = Z.reshape(-1, Z.shape[-1])
    np.testing.assert_array_equal(np.asarray(within_reach(kernel, Z, rows)), rows)
    beyond = np.asarray(within_reach(kernel, Z, np.array([[-1e200] * 2, [1e200] * 2])))
    assert np.all(beyond[0] >= rows.min(axis=0) - 2 * KERNEL_REACH * reach)
    assert np.all(beyond[1] <= rows.max(axis=0) + 2 * KERNEL_REACH * reach)


@pytest.mark.parametrize("dtype, variance", [("float64", 1e307), ("float64", 1.0), ("float64", 1e-300),
                                             ("float32", 3e38), ("float32", 1.0), ("float32", 1e-38)])
def test_far_rows_of_a_linear_kernel_land_on_its_radius_whatever_the_slope_variance(dtype, variance):
    """Shrunk rows keep their direction and land where sum_j g_j x_j^2 is R^2 (R^2 = sqrt(max)), for slope variances
    across the type's range: a factor taken as R / |x|_g underflowed to 0 at g = 1e307 for rows of 1e300 (the origin),
    and |x| overflowed for rows of entries near the largest number. Rows within the radius stay as they are."""
    largest = float(np.finfo(dtype).max)
    kernel = Linear([variance] * 4).for_inputs(np.ones((2, 4), dtype=dtype))
    rows = np.array([[1.0, -1.0, 1e-20, 1e30], [1e30] * 4, [largest] * 4, [-largest, largest, 0.0, 1.0]], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        held = np.asarray(within_reach(kernel, rows[:1], rows))
    g = np.longdouble(variance)
    for row, out in zip(rows.astype(np.longdouble), held.astype(np.longdouble)):
        if g * np.sum(row ** 2) <= np.sqrt(np.longdouble(largest)):
            np.testing.assert_array_equal(out, row)
            continue
        np.testing.assert_allclose(float(g * np.sum(out ** 2)), largest ** 0.5, rtol=1e-5)
        np.testing.assert_allclose((out / np.max(np.abs(out))).astype(float), (row / np.max(np.abs(row))).astype(float),
                                   rtol=1e-5, atol=1e-30)


def test_a_kernel_of_one_s_own_may_give_its_growth_as_a_plain_number():
    """A review (2026-12-02): once growth was per feature, OnColumns took the largest of its kernel's by the array
    API, and a kernel of one's own whose growth is a Python float raised TypeError there (and a product whose first
    growing term gave one did already). Every combination takes a plain number, on NumPy and array_api_strict."""

    class PlainGrowth(Linear):
        @property
        def growth(self):
            return 2.0

    X = np.random.default_rng(0).normal(size=(5, 3))
    for kernel in (OnColumns(PlainGrowth(), [0, 1]), Product(PlainGrowth(), PlainGrowth()),
                   Product(PlainGrowth(), Linear()), PlainGrowth() + RBF(), OnColumns(PlainGrowth(), [0]) * Linear()):
        for rows in (X, array_api_strict.asarray(X)):
            held = to_np(within_reach(kernel.for_inputs(rows), rows, rows * 1e300))
            assert np.all(np.isfinite(held)) and np.all(np.abs(held) < 1e78)
            read = [0, 1] if isinstance(kernel, OnColumns) else [0, 1, 2]  # (a column no kernel reads: held anyhow)
            np.testing.assert_allclose(held[:, read] / np.max(np.abs(held[:, read]), axis=1, keepdims=True),
                                       X[:, read] / np.max(np.abs(X[:, read]), axis=1, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_column_no_growing_term_reads_does_not_shrink_the_rows_it_is_in(dtype):
    """A linear term on some columns beside an RBF on an id-like column of scale 1e10 (a time stamp): the growth of
    OnColumns(Linear) stood for every column of X, so rows far out in the RBF's column (1e12 in float32, past the
    radius of 4e9) were shrunk, the linear term's columns with them, and predicted as nearer the origin, silently.
    Now the growth is per column of X (0 where a kernel does not read it) and that column is held at the RBF's own
    reach: the row is predicted as any row that far out in that column (where the RBF term is 0)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    X[:, 2] *= 1e10
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    X = X.astype(dtype)
    kernel = OnColumns(Linear(), [0, 1]) + OnColumns(RBF(lengthscales=1e10), [2])
    model = agpc.GPClassifier(kernel=kernel, n_inducing=20, max_iter=5, random_state=0, dtype=dtype).fit(X, y)
    rows = np.repeat(X[:4], 3, axis=0)
    out = float(np.sqrt(np.finfo(dtype).max))  # far past the square's range: the RBF's squared distance overflowed
    rows[:, 2] = np.tile([1e16, 1e17 if dtype == "float32" else 1e160, out], 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proba = model.predict_proba(rows.astype(dtype))
        held = np.asarray(within_reach(model.kernel_, model.inducing_points_, rows.astype(dtype)))
    np.testing.assert_array_equal(held[:, :2], rows[:, :2])  # (the linear term's columns are not moved)
    np.testing.assert_allclose(proba[1::3], proba[::3], rtol=1e-5)
    np.testing.assert_allclose(proba[2::3], proba[::3], rtol=1e-5)
    assert np.all(np.abs(held[:, 2]) <= np.max(np.abs(np.asarray(model.inducing_points_)[:, 2])) + 1.1e3 * float(
        np.asarray(model.kernel_.terms[1].kernel.lengthscales)[0]))


def test_each_column_is_held_at_the_reach_of_the_terms_that_read_it():
    """A sum whose terms read different columns: each column is held at its own term's reach (the longest of its
    terms'), not at the longest reach of all (a column of an RBF of lengthscale 0.1 beside a rational quadratic of a
    long reach was held far out, and its squared distance overflowed there); a categorical term's columns are not held,
    and the others are held where the continuous terms say (a reach of 1 stood for every column)."""
    Z = np.zeros((3, 3))
    rows = np.array([[1e200, -1e200, 1.0], [3.0, 1e160, 2.0]])
    short = OnColumns(RBF(lengthscales=0.1), [0])
    for other, reach_1 in ((OnColumns(RationalQuadratic(lengthscales=1.0), [1]), None),
                           (OnColumns(RBF(lengthscales=[1e-3, 2.0]), [1, 2]), 1e3 * 1e-3),
                           (Categorical([2]), None)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kernel = (short + other).for_inputs(Z)
            held = np.asarray(within_reach(kernel, Z, rows))
            kernel.K(held, Z)  # (the squared distances overflowed)
            strict = (short + other).for_inputs(array_api_strict.asarray(Z))  # (the same on the array API)
            np.testing.assert_array_equal(
                to_np(within_reach(strict, array_api_strict.asarray(Z), array_api_strict.asarray(rows))), held)
        np.testing.assert_allclose(held[:, 0], [1e3 * 0.1, 3.0])
        if reach_1 is not None:
            np.testing.assert_allclose(held[:, 1], [-reach_1, reach_1])
        if other.name == "Categorical":  # (its column as given; column 1, which no term reads, anywhere finite)
            np.testing.assert_array_equal(held[:, 2], rows[:, 2])
            assert np.all(np.isfinite(held[:, 1]))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("alpha", [1.0, 0.01])
def test_rows_of_a_rational_quadratic_past_the_square_s_range_are_held_and_give_finite_probabilities(dtype, alpha):
    """The rational quadratic decays as a power of r, so it has no reach where it is 0; but a row whose squared
    distance overflows gave inf - inf (NaN probabilities at X * 1.7e308, an overflow warning from 1e154 on): such
    rows are held where the squares (and r^2 / 2 alpha) stay finite, in both types, with or without an RBF term beside
    it; rows nearer are not moved (a review: float32 at alpha = 0.01 moved from 1e14 lengthscales, at a first
    reach)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    y = (X[:, 0] > 0).astype(int)
    largest = float(np.finfo(dtype).max)
    for kernel in (RationalQuadratic(alpha=alpha), RationalQuadratic(alpha=alpha) + RBF()):
        model = agpc.GPClassifier(kernel=kernel, n_inducing=8, max_iter=3, random_state=0, dtype=dtype).fit(X, y)
        far = np.repeat(X[:2], 2, axis=0)
        far[:, 1:] = [[largest], [-largest], [largest ** 0.5 * 10], [-largest ** 0.5 * 10]]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (the squared distances' overflow warned before)
            proba = model.predict_proba(far.astype(dtype))
        assert np.all(np.isfinite(proba)) and np.all(np.abs(proba[:, 1] - 0.5) < 0.05)
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
        lengthscale = float(np.min(np.asarray(model.kernel_.lengthscales if kernel.name == "RationalQuadratic"
                                              else model.kernel_.terms[0].lengthscales)))
        near = (far[:, :] / largest * lengthscale * (1e17 if dtype == "float32" else 1e152)).astype(dtype)
        held = within_reach(model.kernel_, model.inducing_points_, near)
        np.testing.assert_array_equal(np.asarray(held), near)


@pytest.mark.parametrize("make, reference", [(RBF, rbf_reference), (Matern52, matern52_reference)])
@pytest.mark.parametrize("rows", [7, 7000])  # a small block, and one from one product of augmented inputs
@pytest.mark.parametrize("far", [1e154, -1e154])
def test_one_far_inducing_point_leaves_the_others_distances_exact(make, reference, rows, far):
    """A hostile-input audit (2026-12-05): a forged model file with ONE inducing point at 1e154 among ordinary ones
    loaded and predicted one probability for every input. K centred both inputs on the mean of the inducing points,
    1e153 from the others, where every expanded square lost all its digits. The far point is 0 to every other (it
    is, by the definition), and the others' covariances and gradients are those without it: the far point adds its
    own variance's term to the amplitude's gradient, and nothing else (the expanded terms of K(Z, Z)'s diagonal took
    the far column's lengthscale gradient with them)."""
    rng = np.random.default_rng(5)
    lengthscales, amplitude = [0.7, 1.3, 2.0], 1.4
    X, Z = rng.normal(size=(rows, D)), rng.normal(size=(10, D))
    Z[3, 2] = far
    kernel = make(lengthscales=lengthscales, amplitude=amplitude, noise=0.1)
    direct = reference(lengthscales, amplitude)
    np.testing.assert_allclose(np.asarray(kernel.K(X, Z)), direct(X, Z), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(kernel.K(Z)), direct(Z, Z), rtol=1e-12, atol=1e-14)
    W_mm, W_nm = rng.normal(size=(10, 10)), rng.normal(size=(rows, 10))
    near = np.arange(10) != 3
    with_far = kernel.grads(W_mm, W_nm, None, X, Z)
    without = kernel.grads(W_mm[near][:, near], W_nm[:, near], None, X, Z[near])
    for name, value in without.items():
        expected = np.insert(value, 3, 0.0, axis=0) if name == "Z" else value
        expected = expected + W_mm[3, 3] * amplitude if name == "log_amplitude" else expected
        np.testing.assert_allclose(np.asarray(with_far[name]), expected, rtol=1e-10, atol=1e-12, err_msg=name)


class TestSum(KernelContract):
    def make_kernel(self, priors=False):
        first = RBF([0.7, 1.3, 2.1], amplitude=1.1, noise=0.05,
                    priors={"lengthscales": Gamma(2.0, 1.5), "amplitude": Gamma(2.0, 2.0)} if priors else None)
        second = RationalQuadratic([1.5, 0.8, 1.0], amplitude=0.4, noise=0.15, alpha=2.5,
                                   priors={"lengthscales": Gamma(3.0, 2.0), "amplitude": LogNormal(-1.0, 1.0),
                                           "alpha": Gamma(2.0, 0.5)} if priors else None)
        if priors:  # the noise's prior belongs to the sum (its one noise parameter)
            return Sum(first, second, noise=self.noise, priors={"noise": Gamma(1.5, 4.0)})
        return first + second  # the terms' noises (0.05 + 0.15) become the sum's one noise

    def reference(self, X, Z):
        return rbf_reference([0.7, 1.3, 2.1], 1.1)(X, Z) + rational_quadratic_reference([1.5, 0.8, 1.0], 0.4, 2.5)(X, Z)


class TestProduct(KernelContract):
    def make_kernel(self, priors=False):
        first = Matern52([0.9, 1.1, 1.6], amplitude=1.2, noise=self.noise,
                         priors={"lengthscales": LogNormal(0.3, 0.5), "amplitude": Gamma(2.0, 2.0)} if priors else None)
        second = RBF([2.0, 2.5, 3.0], amplitude=0.9,
                     priors={"lengthscales": Gamma(4.0, 1.5), "amplitude": Gamma(2.0, 2.0)} if priors else None)
        if priors:
            return Product(first, second, noise=self.noise, priors={"noise": LogNormal(-2.0, 1.0)})
        return first * second

    def reference(self, X, Z):
        return matern52_reference([0.9, 1.1, 1.6], 1.2)(X, Z) * rbf_reference([2.0, 2.5, 3.0], 0.9)(X, Z)


class TestNested(KernelContract):
    """A product inside a sum: the inner combination's noise is fixed at 0, the outer one owns the noise."""

    def make_kernel(self, priors=False):
        inner = RBF([0.7, 1.3, 2.1], amplitude=1.1, priors={"lengthscales": Gamma(2.0, 1.5),
                                                            "amplitude": Gamma(2.0, 2.0)} if priors else None) * \
            RationalQuadratic([1.5, 0.8, 1.0], amplitude=0.4, alpha=2.5, priors={
                "lengthscales": Gamma(3.0, 2.0), "amplitude": LogNormal(-1.0, 1.0), "alpha": Gamma(2.0, 0.5)}
                if priors else None)
        outer = Matern52([0.9, 1.1, 1.6], amplitude=0.8, priors={"lengthscales": LogNormal(0.3, 0.5),
                                                                 "amplitude": Gamma(2.0, 2.0)} if priors else None)
        return Sum(inner, outer, noise=self.noise, priors={"noise": Gamma(1.5, 4.0)} if priors else None)

    def reference(self, X, Z):
        rq = rational_quadratic_reference([1.5, 0.8, 1.0], 0.4, 2.5)
        product = rbf_reference([0.7, 1.3, 2.1], 1.1)(X, Z) * rq(X, Z)
        return product + matern52_reference([0.9, 1.1, 1.6], 0.8)(X, Z)


def categorical_reference(columns, lengthscales, amplitude):
    """amplitude * exp(-sum_j [x_j != z_j] / l_j^2), the mismatches counted pair by pair."""
    def k(X, Z):
        differ = X[:, None, columns] != Z[None, :, columns]
        return amplitude * np.exp(-np.sum(differ / np.asarray(lengthscales) ** 2, axis=-1))
    return k


def level_reference(columns, levels, lengthscales, level_lengthscales, amplitude):
    """The per-level form pair by pair: the RBF of one-hot indicators, one lengthscale an indicator (a value not
    listed: its column's), as ``sklearn.gaussian_process.kernels.RBF`` computes it on the indicators of each pair."""
    from sklearn.gaussian_process.kernels import RBF as SklearnRBF

    per_level = iter(level_lengthscales)
    scales = [{level: next(per_level) for level in column} for column in levels]

    def k(X, Z):
        out = np.empty((X.shape[0], Z.shape[0]))
        for a, x in enumerate(X):
            for b, z in enumerate(Z):
                indicators, lengths = [], []  # (x's and z's indicator of each value either has, its lengthscale)
                for j, column, own in zip(columns, scales, lengthscales):
                    for value in sorted({x[j], z[j]}):
                        indicators.append((float(x[j] == value), float(z[j] == value)))
                        lengths.append(column.get(value, own))
                rows = np.array(indicators).T
                out[a, b] = amplitude * SklearnRBF(np.array(lengths))(rows[:1], rows[1:])[0, 0]
        return out
    return k


def coded(rng, n, columns, levels=3):
    """n rows of D features, level codes 0..levels-1 (and -1, a level unseen at fit) in ``columns``."""
    X = rng.normal(size=(n, D))
    X[:, columns] = rng.integers(-1, levels, size=(n, len(columns)))
    return X


def coded_problem(columns, seed=4):
    """A problem whose class is moved by the levels of ``columns`` (in no order of their codes) and by column 1."""
    rng = np.random.default_rng(seed)
    X = coded(rng, 40, columns)
    effect = np.array([0.3, -1.2, 1.0, -0.4])  # of the codes -1, 0, 1, 2
    latent = sum(effect[X[:, j].astype(int) + 1] for j in columns) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=40)
    return X, np.where(latent > 0, 1, 0)


class TestCategorical(KernelContract):
    """The overlap kernel on columns 0 and 2 of codes (column 1 is not read)."""

    discrete_columns = (0, 2)
    fit_options = {"inducing": "random"}

    def make_kernel(self, priors=False):
        return Categorical([0, 2], lengthscales=[0.8, 1.7], amplitude=1.3, noise=self.noise, priors={
            "lengthscales": Gamma(2.0, 1.5), "amplitude": LogNormal(0.0, 1.0), "noise": Gamma(1.5, 4.0)} if priors
            else None)

    def reference(self, X, Z):
        return categorical_reference([0, 2], [0.8, 1.7], 1.3)(X, Z)

    def inputs(self, rng, n):
        return coded(rng, n, [0, 2])

    def problem(self):
        return coded_problem([0, 2])


class TestCategoricalPerLevel(KernelContract):
    """The per-level form on columns 0 and 2: levels 0 and 1 listed in column 0, 0, 1 and 2 in column 2 (the other
    codes, 2 and the unseen -1 in column 0, -1 in column 2, take the column's lengthscale)."""

    discrete_columns = (0, 2)
    fit_options = {"inducing": "random"}
    levels = [[0, 1], [0, 1, 2]]

    def make_kernel(self, priors=False):
        return Categorical([0, 2], lengthscales=[0.8, 1.7], amplitude=1.3, noise=self.noise, levels=self.levels,
                           level_lengthscales=[0.6, 2.2, 1.1, 0.4, 3.0], priors={
            "lengthscales": Gamma(2.0, 1.5), "level_lengthscales": LogNormal(0.3, 1.2),
            "amplitude": LogNormal(0.0, 1.0), "noise": Gamma(1.5, 4.0)} if priors else None)

    def reference(self, X, Z):
        return level_reference([0, 2], self.levels, [0.8, 1.7], [0.6, 2.2, 1.1, 0.4, 3.0], 1.3)(X, Z)

    def inputs(self, rng, n):
        return coded(rng, n, [0, 2])

    def problem(self):
        return coded_problem([0, 2])


class TestOnColumns(KernelContract):
    """An RBF of columns 2 and 0, in that order (columns taken by index, not as a slice)."""

    def make_kernel(self, priors=False):
        return OnColumns(RBF([0.7, 1.6], amplitude=1.2, noise=self.noise, priors={
            "lengthscales": Gamma(2.0, 1.5), "amplitude": LogNormal(0.0, 1.0), "noise": Gamma(1.5, 4.0)} if priors
            else None), [2, 0])

    def reference(self, X, Z):
        return rbf_reference([0.7, 1.6], 1.2)(X[:, [2, 0]], Z[:, [2, 0]])


class TestOnColumnsLinear(KernelContract):
    """A linear kernel of columns 1 and 2 (a slice of X): its variance grows with |x| (the radial shrink of far
    rows)."""

    def make_kernel(self, priors=False):
        return OnColumns(Linear([0.6, 1.4], bias=0.8, noise=self.noise, priors={
            "variances": LogNormal(-1.0, 1.5), "bias": Gamma(2.0, 2.0), "noise": Gamma(1.5, 4.0)} if priors
            else None), [1, 2])

    def reference(self, X, Z):
        return (X[:, 1:] * np.array([0.6, 1.4])) @ Z[:, 1:].T + 0.8


class TestMixed(KernelContract):
    """BoTorch's mixed form (``mixed_kernel``): an RBF of column 1 plus the overlap kernel of columns 0 and 2 plus
    their product."""

    discrete_columns = (0, 2)
    fit_options = {"inducing": "random"}

    def make_kernel(self, priors=False):
        continuous = OnColumns(RBF([0.9], amplitude=1.1, priors={
            "lengthscales": Gamma(2.0, 1.5), "amplitude": LogNormal(0.0, 1.0)} if priors else None), [1])
        categorical = Categorical([0, 2], lengthscales=[0.8, 1.7], amplitude=0.7, priors={
            "lengthscales": Gamma(2.0, 1.5), "amplitude": Gamma(2.0, 2.0)} if priors else None)
        return mixed_kernel(continuous, categorical, noise=self.noise,
                            priors={"noise": Gamma(1.5, 4.0)} if priors else None)

    def reference(self, X, Z):
        continuous = rbf_reference([0.9], 1.1)(X[:, [1]], Z[:, [1]])
        categorical = categorical_reference([0, 2], [0.8, 1.7], 0.7)(X, Z)
        return continuous + categorical + continuous * categorical

    def inputs(self, rng, n):
        return coded(rng, n, [0, 2])

    def problem(self):
        return coded_problem([0, 2])


# -- what is not per kernel ---------------------------------------------------------------------------

def test_combinations_flatten_and_keep_one_noise():
    kernel = RBF(noise=0.1) + Matern52(noise=0.2) + RationalQuadratic()
    assert isinstance(kernel, Sum) and len(kernel.terms) == 3
    assert sorted(k for k in kernel.params if k.endswith("noise")) == ["log_noise"]
    np.testing.assert_allclose(np.exp(kernel.params["log_noise"]), 0.3, rtol=1e-12)
    assert isinstance(RBF() * RBF() + RBF(), Sum)


def test_kernel_rejects_bad_parameters_and_shapes():
    with pytest.raises(ValueError, match="lengthscales must be positive"):
        RBF(lengthscales=[1.0, -2.0])
    with pytest.raises(ValueError, match="amplitude"):
        RBF(amplitude=0.0)
    with pytest.raises(ValueError, match="noise"):
        RBF(noise=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        RationalQuadratic(alpha=float("inf"))
    with pytest.raises(TypeError, match="RBF has no parameter 'alpha'"):
        RBF(alpha=2.0)
    with pytest.raises(ValueError, match="3 lengthscales but the data have 2 features"):
        RBF(lengthscales=[1.0, 1.0, 1.0]).for_inputs(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_from_spec({"type": "Nope"}, {})
    with pytest.raises(ValueError, match="not a parameter of this kernel"):
        RBF(priors={"alpha": Gamma(1.0, 1.0)})
    with pytest.raises(TypeError, match="not an agpc.priors.Prior"):
        RBF(priors={"lengthscales": (2.0, 1.0)})
    with pytest.raises(ValueError, match="positive initial noise"):
        RBF(priors={"noise": Gamma(1.0, 1.0)})
    with pytest.raises(ValueError, match="prior on the noise of a term"):
        RBF(noise=0.1, priors={"noise": Gamma(1.0, 1.0)}) + RBF()
    with pytest.raises(ValueError, match="at least two"):
        Sum(RBF())


@pytest.mark.parametrize("spec", [
    {"type": "agpc.kernels.RBF"},
    {"type": "RBF", "priors": {"lengthscales": {"family": "os.system", "shape": 1.0, "rate": 1.0}}},
    {"type": "RBF", "priors": {"lengthscales": {"family": "Gamma", "shape": -1.0, "rate": 1.0}}},
    {"type": "RBF", "priors": {"lengthscales": {"family": "Gamma", "shape": 1.0}}},
    {"type": "RBF", "priors": {"alpha": {"family": "Gamma", "shape": 1.0, "rate": 1.0}}},
    {"type": "RBF", "terms": []},
    {"type": "Sum", "terms": [{"type": "RBF"}]},
    {"type": "Sum", "terms": "RBF"},
])
def test_untrusted_specs_are_refused(spec):
    """A spec names kernels and prior families of the fixed tables only, with exactly their fields and numbers."""
    with pytest.raises(ValueError):
        kernel_from_spec(spec, {})


def test_a_spec_of_more_terms_than_a_file_may_list_is_refused_before_they_are_built(monkeypatch):
    """A forged model file's Sum of 20,000 terms kept ``agpc inspect`` busy past two minutes (an audit, 2026-12-03):
    a combination lists at most MAX_SPEC_TERMS, and one over is refused before any of its terms is built; that many
    are accepted."""
    from agpc import kernels

    built = []
    real = kernels._template
    monkeypatch.setattr(kernels, "_template", lambda spec, depth=0: (built.append(depth), real(spec, depth))[1])
    with pytest.raises(ValueError, match=r"a Sum of 1,025 terms, more than the 1,024 a model file may list"):
        kernels.spec_parameter_table({"type": "Sum", "terms": [{"type": "RBF"}] * (kernels.MAX_SPEC_TERMS + 1)})
    assert built == [0]
    table = kernels.spec_parameter_table({"type": "Sum", "terms": [{"type": "RBF"}] * kernels.MAX_SPEC_TERMS})
    assert len(built) == 2 + kernels.MAX_SPEC_TERMS and len(table) >= 2 * kernels.MAX_SPEC_TERMS


@pytest.mark.parametrize("kernel_field", [
    {"type": "Sum", "terms": [{"type": "RBF"}, {"type": "builtins.eval"}]},
    {"type": "Sum", "terms": [{"type": "RBF"}, {"type": "RBF"}],
     "priors": {"noise": {"family": "numpy.load", "loc": 0.0, "scale": 1.0}}},
    {"type": "Sum", "terms": [{"type": "RBF"}] * 3},  # a third term the file holds no arrays for
])
def test_model_file_with_a_crafted_kernel_is_refused(tmp_path, kernel_field):
    X, y = small_problem()
    model = agpc.GPClassifier(kernel=RBF() + RBF(), n_inducing=5, max_iter=1, random_state=0).fit(X, y)
    path = tmp_path / "model.npz"
    model_files.save_model(model, path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    # the header: the one member holding a JSON text
    (header_name,) = [name for name, value in arrays.items() if value.dtype.kind == "U"]
    header = json.loads(str(arrays[header_name]))
    header["kernel"] = kernel_field
    arrays[header_name] = np.asarray(json.dumps(header))
    crafted = tmp_path / "crafted.npz"
    np.savez(crafted, **arrays)
    with pytest.raises(ValueError, match="kernel") as info:
        model_files.load_model(crafted)
    assert str(crafted) in str(info.value)


def test_deeply_nested_spec_is_refused():
    spec = {"type": "RBF"}
    for _ in range(20):
        spec = {"type": "Sum", "terms": [spec, {"type": "RBF"}]}
    with pytest.raises(ValueError, match="nested deeper than the 8 a model file may describe"):
        kernel_from_spec(spec, {})


@pytest.mark.parametrize("spec", [{"type": "\x1b[2J" + "x" * 1_000_000},
                                  {"type": "RBF", "priors": {"amplitude": {"type": "\x1b]0;owned\x07" * 50_000}}},
                                  {"type": "RBF", "priors": {"amplitude": {"type": "Gamma", "a": "\x1b" * 10**5,
                                                                          "b": 1.0}}},
                                  {"type": "Sum", "terms": [{"type": "RBF"}], "extra": "\x1b" * 10**5}])
def test_a_forged_spec_is_shown_cut_and_escaped_in_its_error(spec):
    """A hostile-input audit (2026-12-02): a model file's kernel description was shown whole (``{spec!r}``): a
    megabyte of it in one error line. Every untrusted value a kernel or prior refusal shows is cut at 80 characters
    with its length (``untrusted.shown``), and nothing in it acts on a terminal."""
    with pytest.raises(ValueError) as info:
        kernel_from_spec(spec, {})
    message = str(info.value)
    assert len(message) < 400 and "\x1b" not in message and "characters)" in message, message[:400]


@pytest.mark.parametrize("loc", [1e300, -800.0, [0.0, 710.0]])
def test_a_log_normal_centred_beyond_the_floats_is_refused(loc):
    """The hostile-input audit of 2026-12-04: LogNormal(1e300, 1), its loc accepted as finite, overflowed z^2 in
    every density (NumPy's warning at each step). loc is a log of the parameter: refused beyond a float64's."""
    with pytest.raises(ValueError, match=r"LogNormal prior: loc is a log, of a parameter a float64 holds"):
        LogNormal(loc, 1.0)
    assert LogNormal(709.0, 1.0).loc == 709.0 and LogNormal([-709.0, 0.0], 1.0).loc == (-709.0, 0.0)


def test_prior_specs_round_trip():
    for prior in (Gamma(2.0, 0.5), LogNormal(-1.0, 0.3)):
        assert prior_from_spec(prior.spec()) == prior


def test_class_kernels_prefix_the_table():
    kernels = ClassKernels([RBF(priors={"amplitude": Gamma(2.0, 1.0)}), RBF() + Matern52()])
    table = kernels.parameter_table()
    assert list(table) == list(kernels.params)
    assert table["0:log_amplitude"].prior == Gamma(2.0, 1.0)
    assert "1:0.log_lengthscales" in table and table["1:log_noise"].may_be_zero
    value, grads = log_prior_and_grads(kernels)
    assert list(grads) == ["0:log_amplitude"]


def test_scalar_lengthscale_broadcasts_to_ard():
    kernel = RBF(lengthscales=2.0).for_inputs(np.zeros((3, 4)))
    np.testing.assert_allclose(np.asarray(kernel.lengthscales), [2.0] * 4)


def test_top_level_exports():
    for name in ("RBF", "Matern52", "RationalQuadratic", "Linear", "Sum", "Product", "Categorical", "OnColumns",
                 "mixed_kernel"):
        assert getattr(agpc, name) is getattr(agpc.kernels, name)


@pytest.mark.parametrize("method,n_classes", [("ep", 2), ("sep", 2), ("svi", 2), ("vi-jj-full", 2), ("vi-taylor", 2),
                                              ("gfitc", 3), ("ep", 3), ("svi", 3)])
def test_priors_enter_the_climbed_objective(method, n_classes):
    """log Z (or the ELBO) plus the log prior is what every method climbs: a prior 1e-3 wide (in log lengthscale)
    holds the lengthscales at its mode, where the same fit without it moves them. (The prior's gradient itself is
    FD-tested by the kernel contract; the objective is the sum, ``engines.with_log_prior``.)"""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 2))
    noisy = X[:, 0] + 0.3 * rng.normal(size=60)
    y = np.digitize(noisy, [-0.5, 0.5]) if n_classes == 3 else (noisy + 0.5 * np.sin(2 * X[:, 1]) > 0).astype(int)
    mode = np.log(4.0)
    moved = []
    # (GFITC's multiclass sites settle slowly: at the default tol each of its 21 inner loops ran its 100 sweeps)
    settle = {"tol": 1e-3} if method == "gfitc" else {}
    for priors in (None, {"lengthscales": LogNormal(mode, 1e-3)}):
        model = agpc.GPClassifier(method=method, kernel=RBF([4.0, 4.0], noise=0.01, priors=priors), n_inducing=8,
                                  max_iter=20, random_state=0, **settle).fit(X, y)
        kernels = list(model.kernel_.kernels) if n_classes > 2 else [model.kernel_]
        moved.append(max(float(np.max(np.abs(k.params["log_lengthscales"] - mode))) for k in kernels))
        assert np.isfinite(model.log_marginal_likelihood_)
    without, with_prior = moved
    assert without > 0.03 and with_prior < 0.005, moved


# -- scikit-learn's parameter protocol (issue 41, item 6) ------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: RBF(lengthscales=[0.5, 2.0], amplitude=1.5, noise=0.01, priors={"amplitude": Gamma(2.0, 1.0)}),
    lambda: Matern52(lengthscales=5.0),
    lambda: RationalQuadratic(lengthscales=0.3, alpha=2.5),
    lambda: Linear(variances=[0.1, 0.2], bias=0.5),
    lambda: RBF(2.0) + Linear(),
    lambda: Product(RBF(noise=0.1), Matern52(3.0), noise=0.05),
    lambda: agpc.kernels.OrdinalKernel(RBF(0.7), [-1.0, 0.5, 2.0]),
    lambda: Categorical([2, 0], lengthscales=[0.5, 3.0], noise=0.01, priors={"amplitude": Gamma(2.0, 1.0)}),
    lambda: OnColumns(Matern52([1.0, 2.0], noise=0.1), [1, 3]),
    lambda: mixed_kernel(OnColumns(RBF(0.5), [0]), Categorical([1], noise=0.2)),
])
def test_clone_makes_an_equal_separate_kernel(make):
    """scikit-learn's clone constructs from get_params(deep=False): the same parameters, arrays and repr, another
    object (changing the clone leaves the original as it was)."""
    from sklearn.base import clone

    kernel = make()
    copy = clone(kernel)
    assert copy is not kernel and type(copy) is type(kernel)
    assert repr(copy) == repr(kernel)
    assert copy.params.keys() == kernel.params.keys()
    for key, value in kernel.params.items():
        np.testing.assert_array_equal(to_np(copy.params[key]), to_np(value))
    before = repr(kernel)
    name = next(key for key in copy.get_params(deep=True) if key.endswith(("lengthscales", "variances")))
    copy.set_params(**{name: 9.0})
    assert repr(kernel) == before != repr(copy)


def test_get_params_gives_the_values_as_constructed_and_repr_prints_them():
    """RBF(lengthscales=5.0) stores log 5; its parameters and repr are 5.0, not exp(log 5) = 4.999999999999999."""
    kernel = RBF(lengthscales=5.0, amplitude=0.3)
    assert kernel.get_params() == {"lengthscales": 5.0, "amplitude": 0.3, "noise": 0.0, "priors": None}
    assert "lengthscales=[5.0]" in repr(kernel)
    assert float(np.exp(to_np(kernel.params["log_lengthscales"]))[0]) != 5.0  # the stored log is unchanged
    assert "lengthscales=[5.0]" in repr(RBF(5.0) + Linear())  # a term's too


def test_set_params_rebuilds_the_kernel_and_checks_its_values():
    kernel = RBF(lengthscales=1.0)
    assert kernel.set_params(lengthscales=[2.0, 3.0], amplitude=4.0) is kernel
    np.testing.assert_allclose(to_np(kernel.lengthscales), [2.0, 3.0])
    np.testing.assert_allclose(to_np(kernel.amplitude), 4.0)
    with pytest.raises(ValueError, match="lengthscales must be positive"):
        kernel.set_params(lengthscales=-1.0)
    with pytest.raises(ValueError, match="invalid parameter 'length' for the kernel RBF"):
        kernel.set_params(length=1.0)
    combined = RBF(1.0) + Linear()
    combined.set_params(k1__lengthscales=2.5, k2__bias=0.25, noise=0.1)
    np.testing.assert_allclose(to_np(combined.params["0.log_lengthscales"]), np.log(2.5))
    np.testing.assert_allclose(to_np(combined.params["1.log_bias"]), np.log(0.25))
    np.testing.assert_allclose(to_np(combined.noise), 0.1)
    with pytest.raises(ValueError, match="invalid parameter 'noise__x'"):
        combined.set_params(noise__x=1.0)


def test_a_fitted_kernel_reports_its_learned_values():
    X, y = np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 2
    model = agpc.GPClassifier(kernel=RBF(1.0), n_inducing=4, max_iter=3, kernel_prior=None, random_state=0).fit(X, y)
    learned = model.kernel_.get_params()
    np.testing.assert_allclose(learned["lengthscales"], np.exp(to_np(model.kernel_.params["log_lengthscales"])))
    assert model.kernel.get_params()["lengthscales"] == 1.0  # the estimator's parameter is not the fitted kernel


def test_grid_search_over_a_kernel_parameter():
    """GridSearchCV(GPClassifier(kernel=RBF()), {"kernel__lengthscales": ...}): each candidate is fitted with its
    lengthscale (a clone's kernel, set by set_params), the user's kernel is left as given."""
    from sklearn.model_selection import GridSearchCV

    rng = np.random.default_rng(1)
    X = rng.normal(size=(24, 2))
    y = (X[:, 0] > 0).astype(int)
    kernel = RBF(lengthscales=1.0)
    search = GridSearchCV(agpc.GPClassifier(kernel=kernel, n_inducing=4, max_iter=2, optimize=False,
                                            kernel_prior=None, random_state=0),
                          {"kernel__lengthscales": [0.5, 2.0], "kernel__amplitude": [1.0]}, cv=2)
    search.fit(X, y)
    assert search.best_params_["kernel__lengthscales"] in (0.5, 2.0)
    assert search.best_estimator_.kernel.get_params()["lengthscales"] == search.best_params_["kernel__lengthscales"]
    fitted = search.best_estimator_.kernel_.lengthscales  # optimize=False: the candidate's own, unlearned
    np.testing.assert_allclose(to_np(fitted), search.best_params_["kernel__lengthscales"])
    assert kernel.get_params()["lengthscales"] == 1.0
    combined = GridSearchCV(agpc.GPClassifier(kernel=RBF() + Linear(), n_inducing=4, max_iter=2, optimize=False,
                                              kernel_prior=None, random_state=0),
                            {"kernel__k1__lengthscales": [0.5, 2.0]}, cv=2).fit(X, y)
    np.testing.assert_allclose(to_np(combined.best_estimator_.kernel_.params["0.log_lengthscales"]),
                               np.log(combined.best_params_["kernel__k1__lengthscales"]))


def test_a_fitted_kernel_refuses_set_params():
    """kernel_ is the fitted model's: set_params on it changed predict_proba and left a file that would not load
    (its per-feature prior against one lengthscale). It refuses, terms too; its clone and the estimator's kernel
    can be set."""
    from sklearn.base import clone

    X, y = np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 2
    model = agpc.GPClassifier(kernel=RBF(1.0) + Linear(), n_inducing=4, max_iter=2, random_state=0).fit(X, y)
    before = model.predict_proba(X)
    refusal = r"belongs to a fitted model \(kernel_\): use sklearn.base.clone"
    with pytest.raises(TypeError, match=refusal):
        model.kernel_.set_params(noise=0.5)
    with pytest.raises(TypeError, match=refusal):
        model.kernel_.terms[0].set_params(lengthscales=0.05)
    np.testing.assert_array_equal(model.predict_proba(X), before)
    copy = clone(model.kernel_).set_params(k1__lengthscales=0.05)
    np.testing.assert_allclose(to_np(copy.params["0.log_lengthscales"]), np.log(0.05))
    assert model.kernel.set_params(k1__lengthscales=2.0) is model.kernel


def test_a_combination_follows_its_terms_changed_in_place():
    """A sum holds its (noise-free) terms: one changed in place by set_params shows in the sum's params as in its
    repr, in every combination that holds it (the params were cached at first read and went stale)."""
    term = RBF(lengthscales=2.0)
    total, product = term + Linear(), term * Linear()
    assert total.params["0.log_lengthscales"] == pytest.approx(np.log(2.0))
    term.set_params(lengthscales=0.05)
    for combination in (total, product):
        np.testing.assert_allclose(to_np(combination.params["0.log_lengthscales"]), np.log(0.05))
        assert "lengthscales=[0.05]" in repr(combination)
    total.set_params(k1__lengthscales=3.0)
    np.testing.assert_allclose(to_np(total.params["0.log_lengthscales"]), np.log(3.0))


def test_get_params_reports_what_the_kernel_computes_with():
    """A caller's array or list changed after construction: the kernel computes with the values it was given, and
    get_params, repr and clone now report those, not what the caller's object holds."""
    from sklearn.base import clone

    given = np.array([1.0, 2.0])
    listed = [0.5, 0.25]
    priors = {"amplitude": Gamma(2.0, 1.0)}
    kernel, linear = RBF(lengthscales=given, priors=priors), Linear(variances=listed)
    assert kernel.get_params()["lengthscales"] is given  # unchanged: the object given (clone's check)
    given *= 10
    listed.append(9.0)
    priors["lengthscales"] = Gamma(1.0, 1.0)
    np.testing.assert_array_equal(kernel.get_params()["lengthscales"], [1.0, 2.0])
    assert kernel.get_params()["priors"].keys() == {"amplitude"}
    assert linear.get_params()["variances"] == [0.5, 0.25]
    assert "lengthscales=[1.0, 2.0]" in repr(kernel)
    np.testing.assert_allclose(np.exp(to_np(clone(kernel).params["log_lengthscales"])), [1.0, 2.0])
    np.testing.assert_allclose(np.exp(to_np(clone(linear).params["log_variances"])), [0.5, 0.25])
    estimator = clone(agpc.GPClassifier(kernel=RBF(lengthscales=[1.0, 2.0])))
    assert estimator.kernel.get_params()["lengthscales"] == [1.0, 2.0]


def test_a_combination_s_noise_follows_a_replaced_term():
    """noise=None means the terms' noises: a term replaced by set_params brings its own (it was dropped, the noise
    frozen at construction), the other terms keep theirs; a noise given outright stays; clone keeps the noise."""
    from sklearn.base import clone

    def noise(kernel):  # (the stored log's exp: 0.1 comes back as 0.10000000000000002, whichever the kernel)
        return pytest.approx(float(to_np(kernel.noise)), rel=1e-12)

    assert noise(Sum(RBF(), Linear()).set_params(k1=RBF(noise=0.5))) == 0.5
    assert noise(clone(Sum(RBF(), Linear())).set_params(k1=RBF(noise=0.5))) == 0.5
    noisy = Sum(RBF(noise=0.1), Linear())
    assert to_np(clone(noisy).params["log_noise"]) == to_np(noisy.params["log_noise"]) and noise(noisy) == 0.1
    assert noise(noisy.set_params(k1__lengthscales=2.0)) == 0.1  # the term set in place still stands for 0.1
    assert noise(noisy.set_params(k2=Linear(bias=2.0, noise=0.2))) == 0.3
    assert noise(noisy.set_params(k1=RBF(noise=0.5))) == 0.7
    assert noise(Sum(RBF(), Linear(), noise=0.2).set_params(k1=RBF(noise=0.5))) == 0.2


@pytest.mark.parametrize("kind", [Matern52, RationalQuadratic])
def test_a_large_block_of_near_coincident_pairs_stays_within_the_amplitude(kind):
    """A mutation audit (2026-12-02): the clamp at 0 of the squared distances of a large block (n m >= 65,536 pairs,
    formed from augmented inputs in one product) removed passed every test. Round-off leaves r^2 of near-coincident
    pairs far from the origin slightly negative: Matern 5/2's sqrt of it is NaN, a rational quadratic's value above
    its amplitude."""
    rng = np.random.default_rng(0)
    Z = 1e3 + rng.normal(size=(256, 3))
    X = np.concatenate([Z, Z]) + 1e-9 * rng.normal(size=(512, 3))
    kernel = kind(lengthscales=[0.7, 1.3, 1.0], amplitude=1.5).for_inputs(X)
    K = np.asarray(kernel.K(X, Z))
    assert K.shape == (512, 256) and np.all(np.isfinite(K)) and np.all(K <= 1.5)
    own = np.concatenate([np.diag(K[:256]), np.diag(K[256:])])  # (each row beside its own inducing point)
    np.testing.assert_allclose(own, 1.5, rtol=1e-12)


BAD_ARGUMENTS = {
    "a lengthscale written as text": (lambda: RBF(lengthscales="1"), ValueError,
                                      r"lengthscales must be positive and finite, got '1'"),
    "a boolean lengthscale": (lambda: Matern52(lengthscales=True), ValueError, "got True"),
    "a NumPy boolean amplitude": (lambda: RBF(amplitude=np.bool_(True)), ValueError, "amplitude must be positive"),
    "a list with text": (lambda: RBF(lengthscales=[1.0, "2"]), ValueError, "lengthscales must be positive"),
    "a 2-D array": (lambda: RBF(lengthscales=np.ones((1, 2))), ValueError, "lengthscales must be positive"),
    "two amplitudes": (lambda: RBF(amplitude=np.array([2.0, 3.0])), ValueError, "amplitude must be positive"),
    "priors as a list": (lambda: RBF(priors=[Gamma(2.0, 1.0)]), TypeError,
                         r"priors: a dict of \{parameter name: agpc.priors.Prior\}.*not a list"),
}


@pytest.mark.parametrize("make, error, words", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS)
def test_a_kernel_argument_that_is_not_a_number_is_refused(make, error, words):
    """A hostile-input audit (2026-12-02): lengthscales="1" and lengthscales=True were taken as 1.0 (float() reads
    them), and priors=[Gamma(2, 1)] raised "'list' object has no attribute 'items'". Arrays of any namespace, of at
    most one axis, and NumPy numbers are still taken."""
    with pytest.raises(error, match=words):
        make()
    assert RBF(lengthscales=array_api_strict.asarray([1.0, 2.0])).params["log_lengthscales"].shape == (2,)
    assert float(np.exp(RBF(amplitude=np.float32(2.0)).params["log_amplitude"])) == pytest.approx(2.0)
    assert RBF(lengthscales=[np.int64(1), 2.5]).params["log_lengthscales"].shape == (2,)
