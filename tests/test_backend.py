"""The operations the array API lacks: each library's dispatch against SciPy/NumPy references."""

import math

import array_api_strict
import numpy as np
import pytest
import scipy.linalg
import scipy.special

from agpc import backend as B
from conftest import to_np, to_xp


def test_log_ndtr_generic_matches_scipy_over_both_tails(xp_device):
    xp, device = xp_device
    z = np.concatenate([np.linspace(-40, 40, 4001), [-1e3, -200, -37.5, 0.0, 8.2, 38.0, 1e3]])
    got = to_np(B.log_ndtr(to_xp(z, xp, device)))
    ref = scipy.special.log_ndtr(z)
    assert np.all(np.isfinite(got))
    # relative error of log Phi where it is not tiny, absolute error where Phi ~ 1 (log Phi ~ -Phi(-z))
    scale = np.maximum(np.abs(ref), 1e-300)
    rel = np.abs(got - ref) / scale
    assert np.max(np.where(np.abs(ref) > 1e-3, rel, 0)) < 1e-13
    assert np.max(np.where(np.abs(ref) <= 1e-3, rel, 0)) < 1e-10


def test_inverse_mills_ratio_matches_independent_references(xp_device):
    """N(z) / Phi(z) against references that share nothing with erfcx or agpc's continued fraction: below z = -10
    the Mills ratio's asymptotic series (exact rationals at z <= -30; its terms to 1e-14 of the sum from -10, the
    series alone there); above, exp(log N - log Phi) from SciPy's log_ndtr, whose exponent's error eps |log Phi| is
    at most 50 eps there."""
    from fractions import Fraction

    xp, device = xp_device
    z = np.concatenate([-np.geomspace(30.0, 1e6, 9), -np.linspace(10.0, 29.0, 20), np.linspace(-10.0, 8.0, 1801)])
    got = to_np(B.inverse_mills_ratio(to_xp(z, xp, device)))
    ref = np.exp(-0.5 * z * z - 0.5 * np.log(2.0 * np.pi) - scipy.special.log_ndtr(z))
    for i in np.flatnonzero(z <= -10.0):  # lambda(-x) = 1 / R(x), R(x) = (1/x) sum_k (-1)^k (2k - 1)!! / x^(2k)
        x = Fraction(float(-z[i]))
        total, term, k = Fraction(0), Fraction(1), 0
        while abs(term) > Fraction(1, 10 ** 18) * abs(total + 1) and k < 60:
            total, term, k = total + term, -term * (2 * k + 1) / (x * x), k + 1
        ref[i] = float(x / total)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=3e-14)


def test_ndtr_matches_scipy(xp_device):
    xp, device = xp_device
    z = np.linspace(-12, 12, 481)
    got = to_np(B.ndtr(to_xp(z, xp, device)))
    np.testing.assert_allclose(got, scipy.special.ndtr(z), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("trans", [False, True])
def test_solve_triangular_matches_scipy(xp_device, trans):
    xp, device = xp_device
    rng = np.random.default_rng(0)
    M = rng.normal(size=(7, 7))
    L = np.linalg.cholesky(M @ M.T + 7 * np.eye(7))
    Bm = rng.normal(size=(7, 5))
    got = to_np(B.solve_triangular(to_xp(L, xp, device), to_xp(Bm, xp, device), lower=True, trans=trans))
    ref = scipy.linalg.solve_triangular(L, Bm, lower=True, trans=1 if trans else 0)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-13)


def test_cholesky_escalates_jitter_on_a_singular_matrix(xp_device):
    xp, device = xp_device
    x = np.linspace(0, 1, 6)
    K = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 10.0**2)  # numerically rank-deficient
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(K)
    with pytest.warns(B.JitterWarning, match=r"jitter raised: matrix: extra jitter in its factorisation from 0.0e\+00 to "):
        L = to_np(B.cholesky(to_xp(K, xp, device)))
    assert np.all(np.isfinite(L))
    assert np.max(np.abs(L @ L.T - K)) < 1e-3


def test_cholesky_error_names_the_matrix_and_jitter(xp_device):
    xp, device = xp_device
    A = to_xp(np.array([[1.0, 0.0], [0.0, -5.0]]), xp, device)
    with pytest.raises(B.CholeskyError, match=r"Cholesky of Kmm.*jitter"):
        B.cholesky(A, what="Kmm")
    with pytest.raises(B.CholeskyError, match="NaN or inf"):
        B.cholesky(to_xp(np.array([[np.nan, 0.0], [0.0, 1.0]]), xp, device), what="Kmm")


def test_gauss_hermite_matches_numpy(xp_device):
    xp, device = xp_device
    for n in (1, 5, 20):
        nodes, weights = B.gauss_hermite(n, xp, device=device)
        ref_nodes, ref_weights = np.polynomial.hermite.hermgauss(n)
        np.testing.assert_allclose(np.sort(to_np(nodes)), ref_nodes, atol=1e-12)
        np.testing.assert_allclose(to_np(weights)[np.argsort(to_np(nodes))], ref_weights, rtol=1e-10, atol=1e-300)
        # integrates x^2 exp(-x^2) exactly: sqrt(pi)/2
        if n >= 2:
            assert math.isclose(float(to_np(xp.sum(weights * nodes**2))), math.sqrt(math.pi) / 2, rel_tol=1e-12)


def test_resolve_backend():
    assert B.resolve_backend("auto") is None
    assert B.resolve_backend("numpy").__name__.endswith("numpy")
    assert B.resolve_backend(array_api_strict) is array_api_strict
    with pytest.raises(ValueError, match="unknown backend 'tensorflow'"):
        B.resolve_backend("tensorflow")
    with pytest.raises(ValueError, match="unknown backend"):
        B.resolve_backend(42)
    try:
        import cupy  # noqa: F401

        has_cupy = True
    except Exception:
        has_cupy = False
    if not has_cupy:
        with pytest.raises(ValueError, match="backend='cupy' needs CuPy"):
            B.resolve_backend("cupy")


def test_arrays_follow_their_device():
    device = array_api_strict.Device("device1")
    x = array_api_strict.asarray([0.5, -1.0, 3.0], device=device)
    for out in (B.log_ndtr(x), B.ndtr(x)):
        assert out.device == device
    nodes, weights = B.gauss_hermite(4, array_api_strict, device=device)
    assert nodes.device == device and weights.device == device


def test_cluster_sums_numpy_path_equals_the_one_hot_product():
    """k-means's per-cluster sums and counts: NumPy's bincount path against the standard one-hot product
    (array_api_strict, on a non-default device), a cluster left empty included."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 3))
    labels = rng.integers(0, 6, size=500)
    labels[labels == 4] = 5  # cluster 4 empty
    sums, counts = B.cluster_sums(labels, X, 7)
    device = array_api_strict.Device("device1")
    strict_sums, strict_counts = B.cluster_sums(array_api_strict.asarray(labels, device=device),
                                                array_api_strict.asarray(X, device=device), 7)
    assert strict_sums.device == device
    np.testing.assert_allclose(sums, to_np(strict_sums), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(counts, to_np(strict_counts))
    assert counts[4] == 0 and counts[6] == 0 and sums.shape == (7, 3) and sums.dtype == X.dtype


def test_rows_in_memory_of_the_fit_type_are_read_without_a_copy_and_others_are_converted(tmp_path):
    # a pass's blocks of the fit's own float64 rows are views (a copy of each block cost a serial 3% of a
    # default fit); another type is converted, and rows of a file mapped in memory are read once into memory
    X = np.arange(40.0).reshape(10, 4)
    like = np.zeros((2, 4))
    block = B.read_rows(X, 2, 5, like)
    assert np.shares_memory(block, X) and block.shape == (3, 4)
    converted = B.read_rows(X.astype(np.float32), 2, 5, like)
    assert converted.dtype == np.float64 and np.array_equal(converted, X[2:5])
    mapped = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float64, shape=X.shape)
    mapped[...] = X
    read = B.read_rows(mapped, 2, 5, like)
    assert not isinstance(read, np.memmap) and not np.shares_memory(read, mapped)
    np.testing.assert_array_equal(read, X[2:5])
    strict = array_api_strict.asarray(X)
    strict_block = B.read_rows(strict, 2, 5, array_api_strict.zeros((2, 4), dtype=array_api_strict.float64))
    np.testing.assert_array_equal(to_np(strict_block), X[2:5])
