"""agpc's CuPy paths on a mocked CuPy (tests/cupy_mock.py: CuPy's modules stood in for, its array namespace a counting
one named ``array_api_compat.cupy``), for what a machine without a GPU can still check of them:

- a machine where CuPy cannot compute is refused before any work, naming what is missing (``check_device``);
- a failed factorisation that CuPy returns instead of raising is caught on the device (``factor_failure``);
- row dot products are one fused reduction on CuPy, not array-api-compat's generic ``vecdot`` (``row_dot``);
- float32 products in TF32 (``CUPY_TF32``) are warned about and recorded.

What only a GPU can decide (what cuSOLVER returns for a failed factorisation, whether the kernels compile, the
timings) is re-checked by gpu_tests/run_on_gpu.sh.
"""

import csv
import warnings

import numpy as np
import pytest
from cupy_mock import H100_PROPERTIES, CUDARuntimeError, MockCupy

from agpc import GPClassifier
from agpc import backend as B
from agpc.cli import main
from agpc.datasets import make_banana
from agpc.inference import engines, ep, training
from gpu_tests.test_sync_free_step import BATCH, N_INDUCING, N_ROWS, step_problem

GENERIC_VECDOT_OPERATIONS = ("moveaxis", "conj", "broadcast_arrays")  # array-api-compat's vecdot on CuPy


# -- a machine where CuPy cannot compute --------------------------------------------------------------------

MISSING = {
    "driver": (dict(fail={"runtime": CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is "
                                                      "insufficient for CUDA runtime version")}),
               "no usable CUDA device.*cudaErrorInsufficientDriver"),
    "no device": (dict(device_count=0), "no CUDA device"),
    "cuBLAS at import": (dict(fail={"import": ImportError('Failure finding "libcublasLt.so.12"')}),
                         "cupyx.scipy.linalg.*libcublasLt"),
    "NVRTC": (dict(fail={"nvrtc": RuntimeError("CuPy failed to load libnvrtc.so.12")}), "NVRTC.*libnvrtc"),
    "cuBLAS": (dict(fail={"cublas": RuntimeError("CUBLAS_STATUS_NOT_INITIALIZED")}), "cuBLAS.*NOT_INITIALIZED"),
    "cuSOLVER": (dict(fail={"cusolver": RuntimeError("CUSOLVER_STATUS_NOT_INITIALIZED")}), "cuSOLVER"),
}


@pytest.mark.parametrize("case", list(MISSING))
def test_backend_cupy_without_a_usable_device_is_refused_before_any_work(monkeypatch, case):
    options, message = MISSING[case]
    mock = MockCupy(monkeypatch, **options)
    X, y = make_banana(60, random_state=0)
    with mock.xp.counting() as tally, pytest.raises(ValueError, match=message) as refused:
        GPClassifier(backend="cupy", n_inducing=5, max_iter=2).fit(X, y)
    assert type(refused.value).__name__ == "DeviceUnavailableError"
    assert "agpc[gpu]" in str(refused.value) or "backend='numpy'" in str(refused.value)
    # the only device work before the refusal is the probe's own (a product, a factorisation, an addition)
    assert all(any(frame[2] in ("products", "factorisations", "elementwise") for frame in event.frames)
               for event in tally.events if event.kind == "op"), tally.report()


def test_cupy_input_on_a_machine_whose_cuda_libraries_fail_is_refused_first(monkeypatch):
    mock = MockCupy(monkeypatch)
    X, y = make_banana(60, random_state=0)
    X_device, y_device = mock.put(X), mock.put(y)
    mock.fail["cublas"] = RuntimeError("CUBLAS_STATUS_NOT_INITIALIZED")
    with pytest.raises(ValueError, match="cuBLAS"):
        GPClassifier(n_inducing=5, max_iter=2).fit(X_device, y_device)


def test_a_usable_device_is_probed_once(monkeypatch):
    mock = MockCupy(monkeypatch)
    B.check_device(mock.xp)
    probes = len(mock.library_calls)
    B.check_device(mock.xp)
    assert probes == 2 and len(mock.library_calls) == probes  # (a product and a factorisation, once)
    B.check_device(B.resolve_backend("numpy"))  # other namespaces: nothing to check


def test_cli_backend_cupy_without_a_driver_exits_2_naming_it(monkeypatch, tmp_path, capsys):
    MockCupy(monkeypatch, fail={"runtime": CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is "
                                                            "insufficient for CUDA runtime version")})
    X, y = make_banana(60, random_state=0)
    data = tmp_path / "d.csv"
    with open(data, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b", "label"])
        writer.writerows([[a, b, label] for (a, b), label in zip(X, y)])
    status = main(["fit", str(data), "--target", "label", "--backend", "cupy", "--inducing", "5", "--max-iter", "2",
                   "--quiet", "--out", str(tmp_path / "m.agpc")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("agpc: error: ")
    assert "cudaErrorInsufficientDriver" in err[0] and "no usable CUDA device" in err[0]
    # what to do, in the command line's words, and the versions a user compares to pick a driver or a CuPy wheel
    assert "--backend numpy" in err[0] and "CuPy 14.2.0 (mock) for CUDA runtime 12.9" in err[0]
    assert not (tmp_path / "m.agpc").exists()


# -- a failed factorisation, caught on the device -------------------------------------------------------------

def _lapack_failure(a, pivot):
    """What LAPACK's potrf leaves when it stops at column ``pivot`` (the leading minor of order ``pivot + 1`` not
    positive definite): the factor's first ``pivot`` columns, the pivot (a[p, p] minus the row's squares, here made
    non-positive if it was not) on the diagonal, A's own entries below and to the right. Finite garbage."""
    out = np.tril(np.array(a, dtype=float))
    L = np.linalg.cholesky(a[:pivot, :pivot])
    out[:pivot, :pivot] = L
    out[pivot:, :pivot] = np.linalg.solve(L, a[:pivot, pivot:]).T
    out[pivot, pivot] = -abs(a[pivot, pivot] - out[pivot, :pivot] @ out[pivot, :pivot])
    return out


def test_factor_failure_is_zero_for_a_factor_and_nan_for_what_failed_factorisations_leave(gpu):
    rng = np.random.default_rng(0)
    M = rng.normal(size=(6, 6))
    A = M @ M.T + 6 * np.eye(6)
    good = np.linalg.cholesky(A)
    cases = {"negative pivot": _lapack_failure(A, 3), "zero pivot": good * np.where(np.eye(6) == 1, 0.0, 1.0),
             "NaN": np.full((6, 6), np.nan), "inf": np.where(np.eye(6) == 1, np.inf, good)}
    assert float(B.to_numpy(B.factor_failure(gpu.put(good)))) == 0.0
    assert gpu.on_device(B.factor_failure(gpu.put(good)))
    for name, factor in cases.items():
        assert np.isnan(B.to_numpy(B.factor_failure(gpu.put(factor)))), name
    stack = np.stack([good, cases["negative pivot"]])
    assert np.isnan(B.to_numpy(B.factor_failure(gpu.put(stack))))
    assert float(B.to_numpy(B.factor_failure(gpu.put(np.stack([good, good]))))) == 0.0


def test_the_flag_fires_when_the_stand_ins_factorisation_returns_finite_garbage(gpu, monkeypatch):
    """The stand-in namespace's Cholesky patched to return, as a library that does not raise might, the finite
    partial factor LAPACK leaves: the flag is NaN, computed with no host synchronisation."""
    rng = np.random.default_rng(1)
    M = rng.normal(size=(5, 5))
    A = M @ M.T + np.eye(5)
    A[2, 2] = -5.0  # indefinite: a factorisation stops at the third pivot
    monkeypatch.setattr(gpu.xp.linalg, "cholesky", lambda a: gpu.put(_lapack_failure(B.to_numpy(a), 2)))
    L = gpu.xp.linalg.cholesky(gpu.put(A))
    assert np.all(np.isfinite(B.to_numpy(L)))
    counting = gpu.counting()
    with counting.counting() as tally:
        flag = B.factor_failure(gpu.put_counted(counting, B.to_numpy(L)))
    assert tally.counts()["syncs"] == 0
    assert np.isnan(B.to_numpy(flag))


def test_cholesky_or_nan_on_cupy_makes_a_failed_factor_nan(monkeypatch):
    mock = MockCupy(monkeypatch)
    A = np.array([[4.0, 2.0, 0.0], [2.0, 1.0, 0.5], [0.0, 0.5, 3.0]])  # indefinite: potrf fails at the 2nd pivot
    raw = B.to_numpy(mock.xp.linalg.cholesky(mock.put(A)))
    assert np.all(np.isfinite(raw)) and raw[1, 1] <= 0  # what CuPy would hand back without a word
    assert np.all(np.isnan(B.to_numpy(B.cholesky_or_nan(mock.put(A)))))
    good = np.array([[4.0, 2.0], [2.0, 3.0]])
    np.testing.assert_array_equal(B.to_numpy(B.cholesky_or_nan(mock.put(good))), np.linalg.cholesky(good))


def test_a_step_whose_prior_factorisation_fails_silently_on_cupy_is_refused_by_the_guard(monkeypatch):
    """A minibatch SEP step on the mocked CuPy whose factorisation of K(Z, Z) returns finite garbage (LAPACK's
    partial factor), as cuSOLVER may: log Z would be finite and wrong; the device-side check makes it NaN, and the
    training loop's guard refuses the step (the state stays as it was)."""
    mock = MockCupy(monkeypatch)
    X, y, kernel, Z = step_problem(mock.put)
    trainer = training.Trainer(engines.make_engine("sep", kernel, Z, n_total=N_ROWS, minibatch=True, jitter=1e-6))
    trainer.step(X, y, 0, BATCH, stepping=True)
    Z_before = B.to_numpy(trainer.state["Z"])
    Kmm = B.to_numpy(trainer.state["kernel"].K(trainer.state["Z"])) + 1e-6 * np.eye(N_INDUCING)

    def garbage_for_kmm(a):
        if np.allclose(a, Kmm, rtol=1e-12, atol=0):
            return _lapack_failure(a, N_INDUCING // 2)
        return np.linalg.cholesky(a)

    mock.cholesky_result = garbage_for_kmm
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        took, _, log_z = trainer.step(X, y, BATCH, 2 * BATCH, stepping=True)
    assert not took and not np.isfinite(log_z)
    np.testing.assert_array_equal(B.to_numpy(trainer.state["Z"]), Z_before)
    # the guard's answer to a prior that does not factorise: more jitter, said once
    assert [str(w.message) for w in seen if issubclass(w.category, B.JitterWarning) and "Kmm" in str(w.message)]


# -- row dot products --------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, -2])
def test_row_dot_matches_vecdot_on_every_namespace(gpu, monkeypatch, axis):
    rng = np.random.default_rng(2)
    A, C = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    expected = np.sum(A * C, axis=axis)
    np.testing.assert_allclose(B.row_dot(A, C, axis=axis), expected, rtol=1e-14)
    on_device = B.row_dot(gpu.put(A), gpu.put(C), axis=axis)
    assert gpu.on_device(on_device)
    np.testing.assert_allclose(B.to_numpy(on_device), expected, rtol=1e-14)
    mock = MockCupy(monkeypatch)
    A_cupy, C_cupy = mock.put(A), mock.put(C)
    with mock.xp.counting() as tally:
        on_cupy = B.row_dot(A_cupy, C_cupy, axis=axis)
    np.testing.assert_allclose(B.to_numpy(on_cupy), expected, rtol=1e-14)
    assert [event.name for event in tally.events if event.kind == "op"] == ["ReductionKernel[agpc_row_dot]"]


def test_row_dot_is_one_operation_on_the_stand_in(gpu):
    counting = gpu.counting()
    A = gpu.put_counted(counting, np.ones((6, 4)))
    with counting.counting() as tally:
        B.row_dot(A, A)
    assert tally.counts()["op"] == 1


def _generic_vecdot_operations(tally):
    return [(event.name, next((f"{f[0].rsplit('agpc/', 1)[-1]}:{f[1]}" for f in event.frames if "/agpc/" in f[0]),
                              "?"))
            for event in tally.events if event.kind == "op" and event.name in GENERIC_VECDOT_OPERATIONS]


def test_kernel_and_prediction_take_no_generic_vecdot_on_cupy(monkeypatch):
    """K(X, Z) (squared distances: row norms) and the predictive variances (row norms of two projections) on the
    mocked CuPy: no operation of array-api-compat's generic vecdot (moveaxis, broadcast, conj)."""
    mock = MockCupy(monkeypatch)
    X, y, kernel, Z = step_problem(mock.put)
    post = ep.posterior_from_sums(ep.prior_cholesky(kernel, Z, 1e-6),
                                  mock.put(0.1 * np.eye(N_INDUCING)), mock.put(np.ones(N_INDUCING)))
    with mock.xp.counting() as tally:
        kernel.K(X, Z)
        ep.predict_latent(kernel, Z, post, X)
    assert not _generic_vecdot_operations(tally), _generic_vecdot_operations(tally)


# -- TF32 -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tf32", ["1", None])
def test_float32_in_tf32_is_warned_about_and_recorded(monkeypatch, tf32):
    mock = MockCupy(monkeypatch)
    if tf32 is None:
        monkeypatch.delenv("CUPY_TF32", raising=False)
    else:
        monkeypatch.setenv("CUPY_TF32", tf32)
    X, y = make_banana(80, random_state=0)
    options = dict(n_inducing=6, max_iter=2, random_state=0)
    with pytest.warns(UserWarning, match="TF32") if tf32 else _no_tf32_warning():
        model = GPClassifier(dtype="float32", **options).fit(mock.put(X), mock.put(y))
    assert model.tf32_ is bool(tf32)
    with _no_tf32_warning():
        model = GPClassifier(dtype="float64", **options).fit(mock.put(X), mock.put(y))
    assert model.tf32_ is False  # float64 products never use TF32
    monkeypatch.setenv("CUPY_TF32", "1")
    with _no_tf32_warning():
        assert GPClassifier(dtype="float32", **options).fit(X, y).tf32_ is False  # NumPy: no TF32


def test_tf32_is_what_cupy_fixed_not_what_the_variable_says_now(monkeypatch):
    """CuPy fixes the float32 compute type once (``cupy._core.get_compute_type``, at the first float32 product):
    ``set_compute_type`` to TF32 without the variable is TF32; the variable set after the first float32 product is
    not; and a device older than compute capability 8.0 has no TF32 whatever the variable."""
    X, y = make_banana(80, random_state=0)
    options = dict(n_inducing=6, max_iter=2, random_state=0, dtype="float32")
    monkeypatch.delenv("CUPY_TF32", raising=False)
    mock = MockCupy(monkeypatch)
    mock.cupy._core.set_compute_type(np.float32, mock.cupy._core._routines_linalg.COMPUTE_TYPE_TF32)
    with pytest.warns(B.TF32Warning):
        assert GPClassifier(**options).fit(mock.put(X), mock.put(y)).tf32_ is True

    mock = MockCupy(monkeypatch)
    GPClassifier(**options).fit(mock.put(X), mock.put(y))  # the first float32 products: no TF32, fixed
    monkeypatch.setenv("CUPY_TF32", "1")
    with _no_tf32_warning():
        assert GPClassifier(**options).fit(mock.put(X), mock.put(y)).tf32_ is False

    mock = MockCupy(monkeypatch, properties=dict(H100_PROPERTIES, major=7, minor=0))  # a V100: CuPy warns, no TF32
    with _no_tf32_warning(), pytest.warns(UserWarning, match="compute capability 8.0"):
        assert GPClassifier(**options).fit(mock.put(X), mock.put(y)).tf32_ is False


class _no_tf32_warning:
    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("error", message=".*TF32")

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


# -- the mock refuses what CuPy refuses -------------------------------------------------------------------------

def test_the_mock_refuses_what_cupy_refuses_or_would_do_silently(monkeypatch):
    """``cupyx.scipy.linalg.solve_triangular``: a stack's batch shape repeated exactly (CuPy does not broadcast, SciPy
    takes no stack), and one dtype (CuPy casts the right-hand side to the triangle's without a word); the row-dot
    reduction kernel: one dtype for its type T (CuPy: "Type is mismatched")."""
    mock = MockCupy(monkeypatch)
    solve = mock.cupyx["cupyx.scipy.linalg"].solve_triangular
    L = mock.put(np.linalg.cholesky(4.0 * np.eye(3) + 1.0))
    rhs = mock.put(np.ones((3, 2)))
    np.testing.assert_allclose(B.to_numpy(solve(L, rhs, lower=True)),
                               np.linalg.solve(np.linalg.cholesky(4.0 * np.eye(3) + 1.0), np.ones((3, 2))))
    with pytest.raises(TypeError, match="cast"):
        solve(L, mock.put(np.ones((3, 2)), dtype=np.float32), lower=True)
    stack = mock.put(np.stack([B.to_numpy(L)] * 2))
    with pytest.raises(ValueError, match="batch count"):
        solve(stack, mock.put(np.ones((1, 3, 2))), lower=True)  # (SciPy-style broadcasting of the batch)
    with pytest.raises(ValueError, match="incompatible dimensions"):
        solve(L, mock.put(np.ones((2, 3, 2))), lower=True)  # (a 2-D triangle, a stack of right-hand sides)
    assert B.to_numpy(solve(stack, mock.put(np.ones((2, 3))), lower=True)).shape == (2, 3)
    with pytest.raises(TypeError, match="Type is mismatched"):
        B.row_dot(mock.put(np.ones((4, 3))), mock.put(np.ones((4, 3)), dtype=np.float32))
