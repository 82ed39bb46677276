"""Every registered method on every path it takes, fitted on CuPy, goes through agpc's own CuPy branches and never
through a generic array-API fallback: cupyx's ``solve_triangular``, ``factor_failure`` (the device-side check of a
cuSOLVER factor; every factor is checked on the device), ``row_dot``'s reduction kernel and cupyx's ``log_ndtr`` for a probit likelihood
(tests/cupy_branches.py counts them with spies on the entry points, so ``is_cupy_namespace`` sees CuPy).

On a machine with a CUDA device the fits run on CuPy itself; elsewhere (CI) on the mocked CuPy (tests/cupy_mock.py),
which refuses what CuPy refuses (mixed dtypes in ``solve_triangular`` and in the reduction kernel, unequal batch
shapes). The cases come from the registry (``agpc.methods``): a newly registered method is tested here without
an edit. Each fit also matches NumPy's, so that the CuPy branches compute what the NumPy ones do.
"""

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
# batch_size="auto" takes minibatches above FULL_BATCH_MAX_ROWS rows; on a GPU the rule's own batch (n / 8 here)
AUTO_ROWS = batch_size.FULL_BATCH_MAX_ROWS + 800
# Parity with NumPy: the same arithmetic through cuBLAS / cuSOLVER (or the mock's SciPy), amplified by two steps
RTOL, ATOL = 1e-7, 1e-9
FLOAT32_RTOL, FLOAT32_ATOL = 2e-3, 2e-4


def _cases():
    """{case: (method, estimator options, data kind)} for every registered method and every path it supports."""
    cases = {}
    for name in method_names():
        method = get_method(name)
        paths = {"batch": ({}, "binary"), "float32": ({"dtype": "float32"}, "binary")}
        if supports(name, "sample_weight"):
            paths["weights"] = ({}, "weighted")
        if supports(name, "minibatch"):
            paths["minibatch"] = ({"batch_size": BATCH}, "binary")
            paths["minibatch auto"] = ({"batch_size": "auto", "n_inducing": 8}, "large")
            paths["minibatch weights"] = ({"batch_size": BATCH}, "weighted")
        if supports(name, "multiclass"):
            paths["multiclass"] = ({}, "multiclass")
            if supports(name, "minibatch"):
                paths["multiclass minibatch"] = ({"batch_size": BATCH}, "multiclass")
        if ORDINAL in method.likelihoods:
            paths["ordinal"] = ({"likelihood": ORDINAL}, "ordinal")
        if method.exact_passes is not None:
            paths["exact"] = ({"n_inducing": "auto"}, "binary")
        for path, (options, data) in paths.items():
            cases[f"{name} {path}"] = (name, options, data)
    return cases


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
    method, options, _ = CASES[case]
    options = {"n_inducing": N_INDUCING, **options, **changes}  # (the exact case asks for "auto": 150 rows, the exact model)
    epochs = 1 if CASES[case][2] == "large" else 2
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
    method, options, data = CASES[case]
    spec = get_method(method)
    if data == "ordinal":
        return True
    if data == "multiclass" and method == "svi":
        return False  # multiclass SVI: the robust-max likelihood
    return spec.likelihoods[0] == "probit"


@pytest.mark.parametrize("case", list(CASES))
def test_every_method_and_path_goes_through_the_cupy_branches(cupy_device, monkeypatch, case):
    xp, put = cupy_device
    X, y, weights, X_test = _data(CASES[case][2])
    fit_options = {} if weights is None else {"sample_weight": put(weights)}
    calls = watching_cupy_branches(monkeypatch, xp)
    gpu_batches = []
    rule = batch_size.gpu_batch_rows
    monkeypatch.setattr(batch_size, "gpu_batch_rows", lambda *a: gpu_batches.append(rule(*a)) or gpu_batches[-1])
    model = _model(case).fit(put(X), put(y), **fit_options)
    proba = model.predict_proba(put(X_test))
    assert B.array_namespace(proba).__name__ == xp.__name__
    taken = dict(calls)
    assert not [path for path in GENERIC_PATHS if calls[path]], f"{case}: a generic path on CuPy: {taken}"
    assert calls["cupyx.scipy.linalg.solve_triangular"] > 0, f"{case}: no cupyx solve_triangular: {taken}"
    # cuSOLVER does not raise when a factorisation fails: every factor is checked on the device, and the steps
    # that bring one scalar to the host (every method with minibatches) check it without a synchronisation
    assert calls["backend._healthy_diagonal"] >= calls[FACTORISATIONS] > 0, f"{case}: an unchecked factor: {taken}"
    if supports(CASES[case][0], "minibatch"):
        assert calls["backend.factor_failure"] > 0, f"{case}: no sync-free check of a factor: {taken}"
    assert calls["backend.row_dot kernel"] > 0, f"{case}: no row_dot kernel: {taken}"
    if _uses_probit(case):
        assert calls["cupyx.scipy.special.log_ndtr"] > 0, f"{case}: no cupyx log_ndtr: {taken}"
    # the same model on NumPy; batch_size="auto" is another batch on a GPU (its own rule): the reference takes it
    reference = _model(case, **({"batch_size": gpu_batches[0]} if gpu_batches else {})).fit(X, y, **({} if weights is None else {"sample_weight": weights}))
    float32 = CASES[case][1].get("dtype") == "float32"
    np.testing.assert_allclose(B.to_numpy(proba), reference.predict_proba(X_test),
                               rtol=FLOAT32_RTOL if float32 else RTOL, atol=FLOAT32_ATOL if float32 else ATOL)


def test_the_cases_cover_every_registered_method_and_the_paths_of_issue_42():
    assert {case.split(" ")[0] for case in CASES} == set(method_names())
    paths = {case.split(" ", 1)[1] for case in CASES}
    assert {"batch", "minibatch", "minibatch auto", "exact", "multiclass", "ordinal", "weights", "float32"} <= paths
