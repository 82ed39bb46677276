"""Every registered method on every path it takes, fitted on CuPy, goes through agpc's own CuPy branches and never
through a generic array-API fallback: cupyx's ``solve_triangular``, ``factor_failure`` (the device-side check of a
cuSOLVER factor; every factor is checked on the device), ``row_dot``'s reduction kernel, cupyx's ``log_ndtr`` for a probit likelihood
and its ``erfcx`` for EP's probit sites
(tests/cupy_branches.py counts them with spies on the entry points, so ``is_cupy_namespace`` sees CuPy).

On a machine with a CUDA device the fits run on CuPy itself; elsewhere (CI) on the mocked CuPy (tests/cupy_mock.py),
which refuses what CuPy refuses (mixed dtypes in ``solve_triangular`` and in the reduction kernel, unequal batch
shapes). The cases come from the registry (``agpc.methods``): a newly registered method is tested here without
an edit. Each fit also matches NumPy's, so that the CuPy branches compute what the NumPy ones do.
"""

import math

import numpy as np
import pytest
from cupy_branches import FACTORISATIONS, GENERIC_PATHS, watching_cupy_branches

from agpc import GPClassifier
from agpc import backend as B
from agpc import batch_size
from agpc.datasets import make_banana
from agpc.methods import ORDINAL, get_method, method_names, supports
from gpu_tests.conftest import CUDA

N_ROWS, N_INDUCING, BATCH = 150, 12, 40
# batch_size="auto" takes minibatches above FULL_BATCH_MAX_ROWS rows; on a GPU the rule's own batch (200 here: n /
# 512 is fewer; test_gpu_batch.py holds the rule to its values)
AUTO_ROWS = batch_size.FULL_BATCH_MAX_ROWS + 800
# Parity with NumPy: the same arithmetic through cuBLAS / cuSOLVER (or the mock's SciPy), amplified by two steps
# (as test_fit_on_device.py); the worst case measured on the mock is 3e-13 (vi-jj-full).
RTOL, ATOL = 1e-8, 1e-10
# float32: another summation order in float32 (the mock's CuPy branches against NumPy's fast paths), amplified by
# the optimiser's two steps; the worst case measured on the mock is 1.1e-4 absolute (vi-jj-full)
FLOAT32_RTOL, FLOAT32_ATOL = 2e-3, 2e-4
# batch_size="auto": one epoch of 104 steps, not 2 x 4, over which SEP's and ADF's tied factor and the optimiser
# carry the round-off of the two paths forward: 5.2e-6 (SEP) and 3.5e-6 (ADF) absolute on the mock, 1e-8 for EP and
# SVI. (Parity to 1e-8 over few steps is the "minibatch" cases'.)
AUTO_RTOL, AUTO_ATOL = 1e-4, 2e-5


def _paths(name):
    """{path: (estimator options, data kind, how it is fitted)} of the paths the registry says method ``name`` takes:
    its capabilities (``agpc.methods.CAPABILITIES``) and likelihoods, on CuPy's arrays (dask is the host's)."""
    method = get_method(name)
    paths = {"batch": ({}, "binary", "fit"), "float32": ({"dtype": "float32"}, "binary", "fit"),
             "on disk": ({"backend": "cupy"}, "binary", "on disk")}
    if supports(name, "sample_weight"):
        paths["weights"] = ({}, "weighted", "fit")
    if supports(name, "shared_lengthscales"):
        paths["shared lengthscales"] = ({"ard": False}, "binary", "fit")
    for likelihood in method.likelihoods[1:]:  # (the first is the default, the batch case's)
        paths[likelihood] = ({"likelihood": likelihood}, ORDINAL if likelihood == ORDINAL else "binary", "fit")
    if supports(name, "multiclass"):
        paths["multiclass"] = ({}, "multiclass", "fit")
    if method.exact_passes is not None:
        paths["exact"] = ({"n_inducing": "auto"}, "binary", "fit")
    if supports(name, "minibatch"):
        paths["minibatch auto"] = ({"batch_size": "auto", "n_inducing": 8}, "large", "fit")
        for path, (options, data, how) in list(paths.items()):
            if path not in ("exact", "minibatch auto"):
                paths[f"minibatch {path}".replace(" batch", "")] = ({"batch_size": BATCH, **options}, data, how)
    if supports(name, "partial_fit"):
        paths["partial_fit"] = ({}, "binary", "partial_fit")
    return paths


def _cases():
    """{case: (method, estimator options, data kind, how it is fitted)} for every registered method and path."""
    return {f"{name} {path}": (name, *spec) for name in method_names() for path, spec in _paths(name).items()}


CASES = _cases()


def _data(kind):
    """(X, y, sample_weight or None, X_test)."""
    rng = np.random.default_rng(0)
    if kind == "large":
        X, y = make_banana(AUTO_ROWS, random_state=3)
        return X, y, None, X[:40]
    if kind in ("binary", "weighted"):
        X, y = make_banana(N_ROWS, random_state=3)
        X_test, _ = make_banana(40, random_state=4)
        return X, y, (rng.uniform(0.2, 3.0, N_ROWS) if kind == "weighted" else None), X_test
    X = rng.normal(size=(N_ROWS + 40, 3))
    if kind == "multiclass":
        y = np.argmax(X @ rng.normal(size=(3, 3)) + 0.3 * rng.normal(size=(N_ROWS + 40, 3)), axis=1)
    else:  # ordinal: a latent line cut in four ordered classes
        y = np.digitize(X @ np.array([1.0, -0.5, 0.3]) + 0.3 * rng.normal(size=N_ROWS + 40), [-0.8, 0.0, 0.8])
    return X[:N_ROWS], y[:N_ROWS], None, X[N_ROWS:]


def _model(case, **changes):
    method, options, _, _ = CASES[case]
    options = {"n_inducing": N_INDUCING, **options, **changes}  # (the exact case asks for "auto": 150 rows, the exact model)
    epochs = 1 if CASES[case][2] == "large" else 2
    options.setdefault("backend", "auto")
    return GPClassifier(method=method, max_iter=epochs, random_state=0, plateau=None, **options)


@pytest.fixture
def cupy_device(monkeypatch):
    """(array namespace, put: NumPy to device) of CuPy: the real one on a CUDA device, else the mock."""
    if CUDA:
        import array_api_compat.cupy as xp

        return xp, lambda value: xp.asarray(np.asarray(value))
    from cupy_mock import MockCupy

    mock = MockCupy(monkeypatch)
    return mock.xp, mock.put


def _uses_probit(case):
    method, options, data, _ = CASES[case]
    spec = get_method(method)
    if data == ORDINAL:
        return True
    if options.get("likelihood") == "logistic":
        return False
    if data == "multiclass" and method == "svi":
        return False  # multiclass SVI: the robust-max likelihood
    return spec.likelihoods[0] == "probit"


def _probit_sites(case):
    """Whether the case's method updates probit sites (``Probit.site_terms``): an EP method's binary or multiclass
    probit, not the ordinal likelihood's intervals nor SVI's log density."""
    method = CASES[case][0]
    return _uses_probit(case) and CASES[case][2] != ORDINAL and get_method(method).registered_likelihoods == "site_terms"


def _fit(model, how, put, X, y, weights):
    if how == "partial_fit":
        classes = put(np.unique(y))
        for lo in range(0, X.shape[0], BATCH):
            model.partial_fit(put(X[lo:lo + BATCH]), put(y[lo:lo + BATCH]), classes=classes,
                              **({} if weights is None else {"sample_weight": put(weights[lo:lo + BATCH])}))
        return model
    if how == "on disk":  # NumPy's memory map of the rows: agpc reads them onto the device
        return model.fit(X, y, **({} if weights is None else {"sample_weight": weights}))
    return model.fit(put(X), put(y), **({} if weights is None else {"sample_weight": put(weights)}))


@pytest.mark.parametrize("case", list(CASES))
def test_every_method_and_path_goes_through_the_cupy_branches(cupy_device, monkeypatch, tmp_path, case):
    xp, put = cupy_device
    method, options, data, how = CASES[case]
    X, y, weights, X_test = _data(data)
    if how == "on disk":
        np.save(tmp_path / "X.npy", X)
        X = np.load(tmp_path / "X.npy", mmap_mode="r")
    calls = watching_cupy_branches(monkeypatch, xp)
    gpu_batches = []
    rule = batch_size.gpu_batch_rows
    monkeypatch.setattr(batch_size, "gpu_batch_rows", lambda *a: gpu_batches.append(rule(*a)) or gpu_batches[-1])
    model = _fit(_model(case), how, put, X, y, weights)
    proba = model.predict_proba(put(X_test))
    assert B.array_namespace(proba).__name__ == xp.__name__
    assert B.array_namespace(model.inducing_points_).__name__ == xp.__name__
    taken = dict(calls)
    assert not [path for path in GENERIC_PATHS if calls[path]], f"{case}: a generic path on CuPy: {taken}"
    assert calls["cupyx.scipy.linalg.solve_triangular"] > 0, f"{case}: no cupyx solve_triangular: {taken}"
    # cuSOLVER does not raise when a factorisation fails: every factor is checked on the device, and the steps
    # that bring one scalar to the host (every method with minibatches) check it without a synchronisation
    assert calls["backend._healthy_diagonal"] >= calls[FACTORISATIONS] > 0, f"{case}: an unchecked factor: {taken}"
    if supports(method, "minibatch"):
        assert calls["backend.factor_failure"] > 0, f"{case}: no sync-free check of a factor: {taken}"
    assert calls["backend.row_dot kernel"] > 0, f"{case}: no row_dot kernel: {taken}"
    if _uses_probit(case):
        assert calls["cupyx.scipy.special.log_ndtr"] > 0, f"{case}: no cupyx log_ndtr: {taken}"
    if _probit_sites(case):  # (EP's probit site terms: the inverse Mills ratio by erfcx)
        assert calls["cupyx.scipy.special.erfcx"] > 0, f"{case}: no cupyx erfcx: {taken}"
    # the path is the one named: the GPU's own batch, the exact model, float32
    if options.get("batch_size") == "auto":
        assert len(gpu_batches) == 1 and gpu_batches[0] is not None, gpu_batches  # the GPU's rule decided
        assert model.history_["n_steps"][0] == math.ceil(AUTO_ROWS / gpu_batches[0])
    else:
        assert not [rows for rows in gpu_batches if rows is not None], (case, gpu_batches)
    if path_of(case) == "exact":
        assert model.inducing_points_.shape[-2] == N_ROWS  # an inducing point at every row
    float32 = options.get("dtype") == "float32"
    assert proba.dtype == (xp.float32 if float32 else xp.float64)
    # the same model on NumPy; batch_size="auto" is another batch on a GPU (its own rule): the reference takes it
    changes = {"batch_size": gpu_batches[0]} if options.get("batch_size") == "auto" else {}
    reference = _fit(_model(case, backend="numpy", **changes), how, lambda value: value, X, y, weights)
    rtol, atol = (FLOAT32_RTOL, FLOAT32_ATOL) if float32 else (AUTO_RTOL, AUTO_ATOL) if changes else (RTOL, ATOL)
    np.testing.assert_allclose(B.to_numpy(proba), reference.predict_proba(X_test), rtol=rtol, atol=atol)


def path_of(case):
    return case.split(" ", 1)[1]


def test_the_cases_are_every_method_on_every_path_the_registry_names():
    """Read independently of the case list: each capability with a path of its own, each further likelihood, the
    exact model; on minibatches too where the method has them."""
    expected = set()
    for name in method_names():
        method = get_method(name)
        own = {"batch", "float32", "on disk"}
        own |= {path for capability, path in (("sample_weight", "weights"), ("multiclass", "multiclass"),
                                              ("shared_lengthscales", "shared lengthscales"))
                if supports(name, capability)}
        own |= set(method.likelihoods[1:])
        expected |= {f"{name} {path}" for path in own}
        if supports(name, "minibatch"):
            expected |= {f"{name} minibatch auto"} | {f"{name} minibatch" + ("" if p == "batch" else f" {p}")
                                                      for p in own}
        if supports(name, "partial_fit"):
            expected.add(f"{name} partial_fit")
        if method.exact_passes is not None:
            expected.add(f"{name} exact")
    assert set(CASES) == expected
    assert {path_of(case) for case in CASES} >= {"batch", "minibatch", "minibatch auto", "exact", "multiclass",
                                                 ORDINAL, "weights", "float32", "partial_fit", "on disk"}
