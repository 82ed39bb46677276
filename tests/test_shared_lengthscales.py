"""One learned lengthscale scale (``ard=False``) and the exact model's choice between it and a lengthscale per
feature by Akaike's criterion, then against a linear kernel by the evidence (``ard="auto"``, ``agpc.size_rule``;
docs/small_data_defaults.md)."""

import dataclasses
import math
import warnings
from pathlib import Path

import array_api_strict
import numpy as np
import pytest
from sklearn.datasets import load_iris, make_classification

import agpc
from agpc import GPClassifier, size_rule
from agpc.backend import array_namespace, to_numpy
from agpc.inference.engines import shared_scale_grads
from agpc.inputs import default_kernel
from agpc.kernels import with_default_priors
from agpc.methods import method_names, methods_supporting
from agpc.priors import LogNormal
from helpers import plan_of

SHARED = tuple(methods_supporting("shared_lengthscales"))
START = [1.0, 2.0, 4.0]


@pytest.mark.parametrize("xp", [np, array_api_strict], ids=["numpy", "array_api_strict"])
def test_the_tied_gradient_is_the_sum_of_log_z_s_and_the_mean_of_the_priors(xp):
    data = {"log_lengthscales": xp.asarray([0.5, -2.0, 1.0, 3.0]), "1:log_lengthscales": xp.asarray([1.0, 2.0]),
            "log_amplitude": xp.asarray(0.25)}
    prior = {"log_lengthscales": xp.asarray([-1.0, -2.0, 0.0, -5.0]), "1:log_lengthscales": xp.asarray([4.0, 0.0]),
             "log_amplitude": xp.asarray(-0.5)}
    with_prior = {key: data[key] + prior[key] for key in data}
    tied = shared_scale_grads(data, with_prior)
    np.testing.assert_allclose(np.asarray(tied["log_lengthscales"]), [2.5 - 2.0] * 4, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(tied["1:log_lengthscales"]), [3.0 + 2.0] * 2, rtol=1e-15)
    assert float(tied["log_amplitude"]) == -0.25  # untied parameters keep log Z's gradient plus the prior's


def _data(n=120, d=3, seed=0):
    X, y = make_classification(n, d, n_informative=2, n_redundant=0, random_state=seed)
    return X, y


def _fit(method, ard, **params):
    X, y = _data()
    sizes = {} if method == "ep" and params.get("n_inducing") == "all" else {"n_inducing": 10}
    kernel = agpc.RBF(lengthscales=START, amplitude=1.0, noise=1e-3,
                      priors={"lengthscales": LogNormal([0.0, 0.3, -0.2], 1.0)})  # centred away from the start
    options = {**sizes, **params, "max_iter": params.get("max_iter", 15)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GPClassifier(method=method, kernel=kernel, ard=ard, random_state=0, **options).fit(X, y)


@pytest.mark.parametrize("method, params", [(m, {}) for m in SHARED] + [("ep", {"n_inducing": "all"}),
                                            ("sep", {"batch_size": 40}), ("svi", {"batch_size": 40})],
                         ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={w}" for k, w in v.items()))
def test_shared_lengthscales_keep_their_starting_ratios(method, params):
    shared = np.asarray(_fit(method, False, **params).kernel_.lengthscales) / START
    per_feature = np.asarray(_fit(method, True, **params).kernel_.lengthscales) / START
    np.testing.assert_allclose(shared, shared[0], rtol=1e-12)
    assert abs(shared[0] - 1.0) > 1e-3  # the scale was learned
    assert np.ptp(per_feature) > 1e-3  # (and per feature the ratios move: the test would see the tie gone)


def test_a_stream_keeps_the_tie():
    X, y = _data()
    model = GPClassifier(method="sep", n_inducing=10, ard=False, random_state=0)
    start = None
    for lo in range(0, 120, 40):
        model.partial_fit(X[lo:lo + 40], y[lo:lo + 40], classes=[0, 1], n_total=120)
        start = np.asarray(model.kernel_.lengthscales) if start is None else start
    ratios = np.asarray(model.kernel_.lengthscales) / start
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)
    assert model.ard_ is False


@pytest.mark.parametrize("method", sorted(set(method_names()) - set(SHARED)))
def test_methods_without_it_refuse_it_naming_the_parameter(method):
    X, y = _data()
    with pytest.raises(ValueError, match="ard=False"):
        GPClassifier(method=method, ard=False).fit(X, y)


def test_akaike_keeps_per_feature_lengthscales_only_above_a_nat_for_each_parameter_they_free():
    assert not size_rule.akaike_keeps(-100.0, -100.0 + 4.0, 4)  # (an RBF of 5 features frees 4)
    assert size_rule.akaike_keeps(-100.0, -100.0 + 4.0 + 1e-9, 4)
    assert not size_rule.akaike_keeps(-100.0, -90.0, 11)


def test_the_plan_chooses_only_for_the_default_exact_model():
    exact, sparse = size_rule.ModelSize(50, True), size_rule.ModelSize(10, False)
    assert size_rule.ard_plan(plan_of(GPClassifier()), exact, 3) == size_rule.CHOOSE
    assert size_rule.ard_plan(plan_of(GPClassifier()), exact, 1) is True  # one feature: nothing to tie
    limit = size_rule.ARD_CHOICE_MAX_ROWS
    quadratic = size_rule.QUADRATIC_MAX_ROWS  # the last stage, the quadratic kernel, up to fewer rows
    assert size_rule.ard_plan(plan_of(GPClassifier()), size_rule.ModelSize(quadratic, True), 3) == size_rule.CHOOSE
    default = plan_of(GPClassifier())
    assert size_rule.ard_plan(default, size_rule.ModelSize(quadratic + 1, True), 3) == size_rule.CHOOSE_TO_LINEAR
    assert size_rule.ard_plan(default, size_rule.ModelSize(limit, True), 3) == size_rule.CHOOSE_TO_LINEAR
    assert size_rule.ard_plan(plan_of(GPClassifier()), size_rule.ModelSize(limit + 1, True), 3) is True
    assert size_rule.ard_plan(plan_of(GPClassifier()), sparse, 3) is True
    assert size_rule.ard_plan(plan_of(GPClassifier(kernel=agpc.RBF())), exact, 3) is True
    assert size_rule.ard_plan(plan_of(GPClassifier(checkpoint_path="x.npz")), exact, 3) is True
    assert size_rule.ard_plan(plan_of(GPClassifier(ard=False)), sparse, 3) is False
    assert size_rule.ard_plan(plan_of(GPClassifier(ard=True)), exact, 3) is True
    # past the row limit, the exact model still chooses where lengthscales per feature free more than one
    # parameter a feature (a kernel of categorical columns), and not on the sparse model
    assert size_rule.ard_plan(default, size_rule.ModelSize(limit + 1, True), 3, freed=2) is True
    assert size_rule.ard_plan(default, size_rule.ModelSize(limit + 1, True), 3, freed=3) == size_rule.CHOOSE_TO_LINEAR
    assert size_rule.ard_plan(default, sparse, 3, freed=30) is True
    # one categorical column of four levels: one feature, three lengthscales to tie
    assert size_rule.ard_plan(default, exact, 1, freed=3) == size_rule.CHOOSE


def _quiet_fit(X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GPClassifier(random_state=0, **params).fit(X, y)


def test_auto_keeps_per_feature_lengthscales_where_features_are_noise():
    X, y = make_classification(200, 8, n_informative=2, n_redundant=0, flip_y=0.0, class_sep=1.5, random_state=1)
    model, shared = _quiet_fit(X, y), _quiet_fit(X, y, ard=False)
    assert model.ard_ is True
    assert model.log_marginal_likelihood_ - shared.log_marginal_likelihood_ > X.shape[1] - 1


def test_auto_keeps_the_shared_scale_where_every_feature_counts_alike():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 6))
    radius2 = np.sum(X ** 2, axis=1) + rng.standard_normal(200)
    y = ((radius2 > 4.0) & (radius2 < 8.0)).astype(int)  # a radial band: every feature alike, and no quadric
    model, shared = _quiet_fit(X, y), _quiet_fit(X, y, ard=False)
    assert model.ard_ is False
    for key, value in shared.kernel_.params.items():  # the model is the shared stage's, exactly
        np.testing.assert_array_equal(np.asarray(model.kernel_.params[key]), np.asarray(value))
    assert model.log_marginal_likelihood_ == shared.log_marginal_likelihood_


def test_auto_keeps_a_linear_kernel_where_the_classes_are_split_by_a_plane(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 4))
    y = (X @ np.array([1.0, -2.0, 0.5, 1.5]) + 0.5 * rng.standard_normal(200) > 0.3).astype(int)
    model, rbf = _quiet_fit(X, y), _quiet_fit(X, y, ard=False)
    assert isinstance(model.kernel_, agpc.Linear) and model.ard_ is False
    assert model.log_marginal_likelihood_ - rbf.log_marginal_likelihood_ > size_rule.LINEAR_MARGIN
    # one shared scale: the start's ratios (1 / l_j^2 of the default RBF's lengthscales)
    ratios = np.asarray(model.kernel_.variances) * np.asarray(default_kernel(X).lengthscales) ** 2
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-10)
    assert "slope variance" in model.summary()
    model.save(tmp_path / "m.npz")
    loaded = GPClassifier.load(tmp_path / "m.npz")
    assert isinstance(loaded.kernel_, agpc.Linear) and loaded.ard_ is False
    # to round-off, as the exact model's with an RBF (whose loaded predictions differ by ~1e-12)
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-10, atol=1e-13)
    for ard in (True, False):  # the choice is ard="auto"'s: a user's ard keeps the RBF
        assert isinstance(_quiet_fit(X, y, ard=ard, max_iter=5).kernel_, agpc.RBF)


def test_auto_keeps_the_rbf_where_the_classes_are_not_split_by_a_plane():
    X, y = agpc.datasets.make_banana(200, random_state=0)
    assert isinstance(_quiet_fit(X, y).kernel_, agpc.RBF)


def test_the_linear_start_matches_the_default_kernel():
    X = np.random.default_rng(0).standard_normal((30, 4)) * np.array([1.0, 2.0, 0.5, 3.0])
    rbf = default_kernel(X)
    start = size_rule.linear_start(with_default_priors(rbf, rbf))
    lengthscales = np.asarray(rbf.lengthscales)
    np.testing.assert_allclose(np.asarray(start.variances), lengthscales ** -2.0, rtol=1e-12)
    assert float(start.bias) == 1.0 and float(start.noise) == float(rbf.noise)
    np.testing.assert_allclose(start.priors["log_variances"].loc, -2.0 * np.log(lengthscales), rtol=1e-12)
    assert start.priors["log_bias"].loc == 0.0
    assert size_rule.linear_start(rbf).priors == {}  # kernel_prior=None: none either
    assert size_rule.linear_start(agpc.Matern52().for_inputs(X)) is None  # only the default RBF has a counterpart


@pytest.mark.parametrize("dtype, scale", [("float64", 1e-170), ("float64", 1e170), ("float32", 1e-25),
                                          ("float32", 1e19)])
def test_features_of_extreme_scale_keep_the_rbf_without_a_linear_stage(dtype, scale):
    """The default RBF's lengthscales follow the features' scale, but the linear start's slope variances 1 / l_j^2
    leave the dtype's range: no linear stage (the whole fit failed with CholeskyError, after overflow warnings)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    y = (X @ np.array([1.0, -2.0, 0.5]) > 0).astype(int)
    scaled = (X * scale).astype(dtype)
    assert size_rule.linear_start(default_kernel(scaled).for_inputs(scaled)) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (none of the linear stage's overflows)
        model = GPClassifier(random_state=0, dtype=dtype, max_iter=10).fit(scaled, y)
    assert isinstance(model.kernel_, agpc.RBF) and np.isfinite(model.log_marginal_likelihood_)
    assert np.all(np.isfinite(model.predict_proba(scaled)))


def test_a_linear_stage_that_fails_numerically_keeps_the_rbf():
    def stages():
        yield _Stage("shared", -10.0)
        yield _Stage("per feature", -10.5)
        raise agpc.CholeskyError("Cholesky of Kmm failed: the matrix contains NaN or inf")

    stage = stages()
    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, default_kernel(np.eye(3)),
                                                       lambda *_: next(stage))
    assert result.kernel == "shared" and per_feature is False


def test_the_linear_kernel_is_kept_only_beyond_the_margin_over_the_rbf_kept():
    start = default_kernel(np.eye(3))
    margin = size_rule.LINEAR_MARGIN

    def choose(*log_zs):  # (the quadratic stage last, far below: never kept here)
        names = ("shared", "per feature", "linear", "quadratic")
        stages = iter(_Stage(name, log_z) for name, log_z in zip(names, log_zs + (-1e9,)))
        return size_rule.learn_lengthscales(size_rule.CHOOSE, 2, start, lambda *_: next(stages))

    result, per_feature = choose(-10.0, -10.0, -10.0 + margin + 1e-9)
    assert result.kernel == "linear" and per_feature is False
    assert choose(-10.0, -10.0, -10.0 + margin)[0].kernel == "shared"
    # per-feature lengthscales kept (log Z up by more than d - 1 = 2): the linear kernel must beat log Z - 2 by 1
    assert choose(-10.0, -7.5, -8.5)[0].kernel == "per feature"
    assert choose(-10.0, -7.5, -8.5 + 1e-6)[0].kernel == "linear"
    stages = iter([_Stage("shared", -10.0), _Stage("per feature", -10.5), _Stage("linear", -12.0, "max_time", True)])
    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, start, lambda *_: next(stages))
    assert result.kernel == "shared" and result.stop_reason == "max_time" and result.stopped_by_time


def test_a_later_kernel_whose_fit_raised_the_jitter_is_not_kept_nor_said():
    """A hostile-input audit (2026-12-02): beside two features of scale 1, a constant column of 1e9 took the quadratic
    kernel's jitter to 1e25, its log Z won by the margin, and the default fit predicted at chance (0.50 against the
    RBF's 0.84), with a JitterWarning and a GuardWarning as its only signs. A later kernel whose fit ended with more
    jitter than the model kept has the log Z of another model: not kept, the choice ends, and the warnings of its
    fit (about a model the fit does not return) are not said."""
    start = default_kernel(np.eye(3))
    raised = [_Stage("shared", -10.0), _Stage("per feature", -10.5), _Stage("linear", -5.0, jitter=1e5),
              _Stage("quadratic", 0.0)]
    stage = iter(raised)
    result, _ = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, start, lambda *_: next(stage))
    assert result.kernel == "shared" and next(stage).kernel == "quadratic"  # (never trained)
    stage = iter([_Stage("shared", -10.0), _Stage("per feature", -10.5), _Stage("linear", -5.0, jitter=1e-6)])
    assert size_rule.learn_lengthscales(size_rule.CHOOSE_TO_LINEAR, 2, start, lambda *_: next(stage))[0].kernel == (
        "linear")

    from agpc.datasets import make_banana

    X, y = make_banana(150, random_state=0)  # (the audit's table)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = GPClassifier(random_state=0).fit(np.c_[X, np.full(150, 1e9)], y)
    assert type(model.kernel_) is agpc.RBF and model.jitter_ == 1e-6
    assert not [w for w in caught if issubclass(w.category, (agpc.JitterWarning, agpc.GuardWarning))], [
        str(w.message) for w in caught]


def test_the_warnings_of_a_later_kernel_kept_are_said():
    """The linear kernel kept: what its fit raised (the jitter, the guard's actions) is the returned model's, said
    after the fit as any stage's."""
    from agpc import backend as B

    start = default_kernel(np.eye(3))

    def stages(*_):
        name, log_z = next(plan)
        if name == "linear":
            B.note_jitter("K(Z, Z)", 1e-6, 1e-4)
            B.warn_guard("the guard halved the damping")
        return _Stage(name, log_z)

    plan = iter([("shared", -10.0), ("per feature", -10.5), ("linear", -5.0)])
    with pytest.warns(agpc.JitterWarning, match="from 1.0e-06 to 1.0e-04"), pytest.warns(agpc.GuardWarning):
        with B.jitter_report("fit"):
            result, _ = size_rule.learn_lengthscales(size_rule.CHOOSE_TO_LINEAR, 2, start, stages)
    assert result.kernel == "linear"


def test_notes_of_a_stage_are_said_only_where_it_is_released():
    """``backend.held_notes``: jitter raises and guard summaries made inside reach the fit's report only where the
    holder is released (``release_notes``); outside a report nothing is held (said as they come)."""
    from agpc import backend as B

    for released in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with B.jitter_report("fit"):
                with B.held_notes() as notes:
                    B.note_jitter("K(Z, Z)", 1e-6, 1e-3)
                    B.warn_guard("the guard halved the damping")
                if released:
                    B.release_notes(notes)
        said = sorted(w.category.__name__ for w in caught)
        assert said == (["GuardWarning", "JitterWarning"] if released else []), said
    with pytest.warns(agpc.JitterWarning):
        with B.held_notes() as notes:
            B.note_jitter("K(Z, Z)", 1e-6, 1e-3)
    assert notes is None


def _noting_stages(plan, noted):
    """A ``train`` for ``learn_lengthscales`` of the stages ``plan`` ((name, log Z), in order); the stages named in
    ``noted`` raise the jitter and have the guard act, each saying its name."""
    from agpc import backend as B

    stages = iter(plan)

    def train(*_):
        name, log_z = next(stages)
        if name in noted:
            B.note_jitter(f"K(Z, Z) of the {name} kernel", 1e-6, 1e-4)
            B.warn_guard(f"the guard acted in the {name} fit")
        return _Stage(name, log_z)
    return train


def test_only_the_warnings_of_the_later_kernel_returned_are_said():
    """A review (2026-12-02): the linear kernel kept and then replaced by the quadratic one, the linear fit's warnings
    were said, about a model the fit does not return. Only the returned kernel's are said now."""
    from agpc import backend as B

    start = default_kernel(np.eye(3))
    plan = [("shared", -10.0), ("per feature", -10.5), ("linear", -5.0), ("quadratic", 100.0)]
    for noted, expected in ((("linear",), []), (("linear", "quadratic"), ["quadratic"])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with B.jitter_report("fit"):
                result, _ = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, start, _noting_stages(plan, noted))
        assert result.kernel == "quadratic"
        said = [str(w.message) for w in caught]
        assert len(said) == 2 * len(expected) and all("quadratic" in text for text in said), said


def test_the_quadratic_kernel_is_kept_only_beyond_its_margin_over_the_model_kept():
    start = default_kernel(np.eye(3))
    margin = size_rule.QUADRATIC_MARGIN

    def stages(*log_zs, last=None):
        names = ("shared", "per feature", "linear", "quadratic")
        return [_Stage(name, log_z) for name, log_z in zip(names, log_zs)] + ([last] if last else [])

    def choose(stage_list):
        stage = iter(stage_list)
        return size_rule.learn_lengthscales(size_rule.CHOOSE, 2, start, lambda *_: next(stage))

    result, per_feature = choose(stages(-10.0, -10.0, -10.0, -10.0 + margin + 1e-9))
    assert result.kernel == "quadratic" and per_feature is False
    assert choose(stages(-10.0, -10.0, -10.0, -10.0 + margin))[0].kernel == "shared"
    # the linear kernel kept (more than 1 nat above the RBF): the quadratic one must beat it, not the RBF
    assert choose(stages(-10.0, -10.0, -8.5, -8.5 + margin))[0].kernel == "linear"
    assert choose(stages(-10.0, -10.0, -8.5, -8.5 + margin + 1e-6))[0].kernel == "quadratic"
    # per-feature lengthscales kept (log Z up by more than d - 1 = 2): measured at log Z - 2
    assert choose(stages(-10.0, -7.5, -20.0, -9.5 + margin))[0].kernel == "per feature"
    assert choose(stages(-10.0, -7.5, -20.0, -9.5 + margin + 1e-6))[0].kernel == "quadratic"
    # the quadratic stage cut short by max_time below the linear kernel: the linear kernel kept, saying so
    result, _ = choose(stages(-10.0, -10.0, -8.5, last=_Stage("quadratic", -12.0, "max_time", True)))
    assert result.kernel == "linear" and result.stopped_by_time and result.stop_reason == "max_time"


def test_above_its_row_limit_the_choice_has_no_quadratic_stage():
    starts = []

    stages = []

    def train(start, shared, first, stage, later):  # (the second stage starts from the first's result: its name here)
        name = getattr(start, "name", start)
        starts.append(name)
        stages.append(stage)
        return _Stage(name, {"RBF": -10.0, "Linear": -8.0}.get(name, 100.0))

    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE_TO_LINEAR, 2, default_kernel(np.eye(3)), train)
    assert starts == ["RBF", "RBF", "Linear"] and result.kernel == "Linear" and per_feature is False
    # each stage named on its progress lines, counted out of the stages this plan has
    assert stages == ["kernel choice 1/3: one shared lengthscale", "kernel choice 2/3: a lengthscale per feature",
                      "kernel choice 3/3: linear kernel"]
    starts.clear()
    stages.clear()
    assert size_rule.learn_lengthscales(size_rule.CHOOSE, 2, default_kernel(np.eye(3)), train)[0].kernel == "Product"
    assert starts == ["RBF", "RBF", "Linear", "Product"] and stages[-1] == "kernel choice 4/4: quadratic kernel"
    stages.clear()
    size_rule.learn_lengthscales(True, 3, default_kernel(np.eye(3)), train)
    assert stages == [""]  # a fit of one stage: no name


def test_a_quadratic_stage_that_fails_numerically_keeps_the_model_kept():
    def stages():
        yield _Stage("shared", -10.0)
        yield _Stage("per feature", -10.5)
        yield _Stage("linear", -8.0)
        raise FloatingPointError("ep diverged: log Z is not finite")

    stage = stages()
    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, default_kernel(np.eye(3)),
                                                       lambda *_: next(stage))
    assert result.kernel == "linear" and per_feature is False


def test_the_quadratic_start_is_the_linear_start_squared():
    X = np.random.default_rng(0).standard_normal((30, 4)) * np.array([1.0, 2.0, 0.5, 3.0])
    rbf = with_default_priors(default_kernel(X), default_kernel(X))
    linear, quadratic = size_rule.linear_start(rbf), size_rule.quadratic_start(rbf)
    assert isinstance(quadratic, agpc.Product) and len(quadratic.terms) == 2
    assert float(quadratic.noise) == float(rbf.noise)
    for term in quadratic.terms:  # each factor the linear start, priors included, its noise held by the product
        assert float(term.noise) == 0.0 and term.priors.keys() == linear.priors.keys()
        for key in ("log_variances", "log_bias"):
            np.testing.assert_array_equal(np.asarray(term.params[key]), np.asarray(linear.params[key]))
    np.testing.assert_allclose(np.asarray(quadratic.K(X)), np.asarray(linear.K(X)) ** 2, rtol=1e-12)
    assert size_rule.quadratic_start(agpc.Matern52().for_inputs(X)) is None


@pytest.mark.parametrize("as_input, dtype", [(np.asarray, "float32"), (array_api_strict.asarray, "float64")],
                         ids=["float32", "array_api_strict"])
def test_the_quadratic_start_is_in_the_rows_namespace_and_type(as_input, dtype):
    """Every parameter of the quadratic start, the latent noise included, in the namespace, device and type of the
    start it is built from (a float64 NumPy noise beside float32 or array_api_strict terms made the fit's
    variances float64, or the fit fail)."""
    X = as_input(np.random.default_rng(0).standard_normal((30, 3)).astype(dtype))
    start = default_kernel(X).for_inputs(X)
    quadratic = size_rule.quadratic_start(start)
    reference = start.params["log_noise"]
    for key, value in quadratic.params.items():
        assert array_namespace(value) is array_namespace(reference) and value.dtype == reference.dtype, key
    assert float(quadratic.noise) == float(start.noise)
    assert quadratic.Kdiag(X).dtype == X.dtype


def test_auto_keeps_a_quadratic_kernel_where_the_classes_are_split_by_a_saddle(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3))
    y = (X[:, 0] * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.standard_normal(200) > 0).astype(int)  # x0 x1: a product
    model, rbf = _quiet_fit(X, y), _quiet_fit(X, y, ard=False)
    assert isinstance(model.kernel_, agpc.Product) and model.ard_ is False
    assert all(isinstance(term, agpc.Linear) for term in model.kernel_.terms)
    assert model.log_marginal_likelihood_ - rbf.log_marginal_likelihood_ > size_rule.QUADRATIC_MARGIN
    first, second = model.kernel_.terms  # equal at the start, equal gradients: equal at the end
    for key in ("log_variances", "log_bias"):
        np.testing.assert_allclose(np.asarray(first.params[key]), np.asarray(second.params[key]), rtol=1e-12)
    model.save(tmp_path / "m.npz")
    loaded = GPClassifier.load(tmp_path / "m.npz")
    assert isinstance(loaded.kernel_, agpc.Product) and loaded.ard_ is False
    np.testing.assert_allclose(loaded.predict_proba(X), model.predict_proba(X), rtol=1e-10, atol=1e-13)
    far = model.predict_proba(X[:3] * 1e300)  # its variance grows as |x|^4: far rows shrunk to a finite radius
    assert np.all(np.isfinite(far))


@pytest.mark.parametrize("device", [None, array_api_strict.Device("device1")], ids=["default", "device1"])
def test_the_default_choice_on_array_api_strict_equals_numpy(device):
    """The default fit of a small table, every stage of ``ard="auto"`` included (the quadratic kernel kept here),
    in array_api_strict on its default and a non-default device: the kept kernel's parameters on the rows' device
    and type, the same choice and predictions as on NumPy (a quadratic start built on the host failed here)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3))
    y = (X[:, 0] * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.standard_normal(120) > 0).astype(int)
    reference = _quiet_fit(X, y, max_iter=20)
    rows = array_api_strict.asarray(X, device=device)
    strict = _quiet_fit(rows, y, max_iter=20)
    assert type(strict.kernel_) is type(reference.kernel_) is agpc.Product
    for key, value in strict.kernel_.params.items():
        assert array_namespace(value) is array_api_strict and value.device == rows.device, key
        np.testing.assert_allclose(to_numpy(value), np.asarray(reference.kernel_.params[key]), rtol=1e-8, atol=1e-12)
    proba = strict.predict_proba(rows)
    np.testing.assert_allclose(to_numpy(proba), reference.predict_proba(X), rtol=1e-8, atol=1e-12)


def test_the_choice_is_saved_with_the_model(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 3))
    y = (X.sum(axis=1) > 0).astype(int)
    model = _quiet_fit(X, y)
    model.save(tmp_path / "m.npz")
    loaded = GPClassifier.load(tmp_path / "m.npz")
    assert loaded.ard_ is model.ard_ and isinstance(loaded.ard_, bool)
    assert math.isfinite(loaded.log_marginal_likelihood_)


def test_n_inducing_all_learns_per_feature_lengthscales_for_any_method():
    X, y = _data(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GPClassifier(method="vi-jj", n_inducing="all", max_iter=3).fit(X, y)  # (the tie would be refused)
    assert model.ard_ is True
    assert size_rule.ard_plan(plan_of(GPClassifier(n_inducing="all")), size_rule.ModelSize(60, True), 3) is True


def test_a_numpy_false_asks_for_the_tie_everywhere(tmp_path):
    X, y = _data()
    model = GPClassifier(method="sep", n_inducing=10, max_iter=10, ard=np.False_, random_state=0).fit(X, y)
    ratios = np.asarray(model.kernel_.lengthscales) / np.asarray(default_kernel(X).lengthscales)
    assert model.ard_ is False and np.ptp(np.log(ratios)) < 1e-12
    model.save(tmp_path / "m.npz")
    assert GPClassifier.load(tmp_path / "m.npz").ard is False
    with pytest.raises(ValueError, match="ard=False"):
        GPClassifier(method="vi-jj", ard=np.False_).check_params()


def test_a_stream_goes_on_with_the_tie_a_fit_used():
    X, y = _data()
    model = GPClassifier(method="sep", n_inducing=10, max_iter=5, ard=False, random_state=0).fit(X, y)
    before = np.asarray(model.kernel_.lengthscales)
    model.partial_fit(X[:40], y[:40])
    ratios = np.asarray(model.kernel_.lengthscales) / before
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)
    assert model.ard_ is False


def test_a_checkpoint_resumes_only_with_the_tie_it_was_written_with(tmp_path):
    X, y = _data()
    path = tmp_path / "run.npz"
    params = dict(method="sep", n_inducing=10, max_iter=6, checkpoint_path=path, checkpoint_every=2, random_state=0)
    GPClassifier(ard=True, **params).fit(X, y)
    with pytest.raises(ValueError, match=r"one shared lengthscale scale \(ard\)"):
        GPClassifier(ard=False, **{**params, "max_iter": 8}).fit(X, y, resume=True)
    GPClassifier(ard=False, **params).fit(X, y)
    with pytest.raises(ValueError, match=r"one shared lengthscale scale \(ard\)"):
        GPClassifier(ard=True, **{**params, "max_iter": 8}).fit(X, y, resume=True)


@dataclasses.dataclass
class _Stage:
    kernel: str
    log_z: float
    stop_reason: str = "plateau"
    stopped_by_time: bool = False
    jitter: float = 1e-6  # (``TrainResult.jitter``: on K(Z, Z) at the end of the stage's fit)


def test_a_second_stage_cut_by_max_time_says_so():
    stages = iter([_Stage("shared", -10.0), _Stage("per feature", -10.5, "max_time", True)])
    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, "start", lambda *_: next(stages))
    assert per_feature is False and result.kernel == "shared"
    assert result.stopped_by_time and result.stop_reason == "max_time"
    stages = iter([_Stage("shared", -10.0, "max_time", True)])  # out of time in the first: no second stage
    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, "start", lambda *_: next(stages))
    assert per_feature is False and result.stop_reason == "max_time"
    stages = iter([_Stage("shared", -10.0), _Stage("per feature", -7.9)])
    result, per_feature = size_rule.learn_lengthscales(size_rule.CHOOSE, 2, "start", lambda *_: next(stages))
    assert per_feature is True and result.kernel == "per feature"


def test_a_model_file_from_before_the_choice_says_per_feature():
    model = GPClassifier.load(Path(__file__).resolve().parent / "data" / "model_v2" / "binary_banana.npz")
    assert model.ard is True and model.ard_ is True


def test_the_summary_says_the_relevance_was_not_learned_per_feature():
    X, y = _data()
    model = GPClassifier(method="sep", n_inducing=10, max_iter=3, ard=False, random_state=0).fit(X, y)
    assert "shared by every feature, ard_=False" in model.summary()
    model = GPClassifier(method="sep", n_inducing=10, max_iter=3, ard=True, random_state=0).fit(X, y)
    assert "ard_=False" not in model.summary()


def test_more_classes_and_large_data_keep_lengthscales_per_feature():
    X, y = load_iris(return_X_y=True)
    assert _quiet_fit(X, y, max_iter=3).ard_ is True  # more than two classes: the sparse model, as before
    sparse = size_rule.ModelSize(100, False)  # minibatches, dask, ...
    assert size_rule.ard_plan(plan_of(GPClassifier()), sparse, 3) is True


def test_data_parallel_rounds_keep_the_tie_and_say_it_in_their_checkpoints(tmp_path):
    X, y = _data(160)
    path = tmp_path / "rounds.npz"
    params = dict(method="sep", n_inducing=10, batch_size=40, n_jobs=2, local_steps=2, max_iter=4, random_state=0,
                  checkpoint_path=path, checkpoint_every=2)
    model = GPClassifier(ard=False, **params).fit(X, y)
    ratios = np.asarray(model.kernel_.lengthscales) / np.asarray(default_kernel(X).lengthscales)
    assert np.ptp(np.log(ratios)) < 1e-12 and model.ard_ is False
    with pytest.raises(ValueError, match=r"one shared lengthscale scale \(ard\)"):
        GPClassifier(ard=True, **{**params, "max_iter": 6}).fit(X, y, resume=True)
