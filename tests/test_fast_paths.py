"""The NumPy fast paths of agpc.backend (BLAS / LAPACK called directly) against the array-API reference code
(``backend.reference_paths``): each primitive, and a whole minibatch step of SEP, EP, ADF and SVI.

The bound. The fast path does the same arithmetic in another order: triangular solves become products with
an explicit triangular inverse (trtri, then trmm), and general products triangular ones. A triangular inverse
and a substitution each have a backward error of a few m eps (Higham (2002), secs. 8.1 and 14.2), so the two
results differ by at most about m eps kappa(L) relatively, kappa(L) = kappa(K)^(1/2) for the Cholesky factor L
of K (and kappa(L_C) for q's). The gradients are held to ``ROUNDOFF_FACTOR * m * eps * kappa(L_K)`` of their
largest entry, the factors' condition numbers computed on the problem; log Z, a sum of logs and squares whose
terms carry that relative error, to 1e-10 absolute (the brief's bound; measured: 5e-13 at |log Z| ~ 900 on the
airline-like step of benchmarks/step_cost.py).
"""

import types

import array_api_strict
import numpy as np
import pytest
import scipy.linalg
from array_api_compat import numpy as xp
from threadpoolctl import threadpool_info, threadpool_limits

from agpc import backend as B
from agpc.inference import ep, variational
from agpc.inference.posterior import Factor, Posterior, inverse_congruence, moved_factor
from agpc.kernels import RBF

ROUNDOFF_FACTOR = 10.0
M, ROWS, N = 24, 30, 90
JITTER = 1e-6


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 3))
    y = np.sign(X @ np.array([1.0, -0.5, 0.3]) + 0.3 * rng.normal(size=N))
    kernel = RBF(lengthscales=[1.0, 1.3, 0.8], amplitude=1.2, noise=0.01).for_inputs(xp.asarray(X))
    return xp.asarray(X), xp.asarray(y), kernel, xp.asarray(X[:M] + 0.05)


def _tolerance(kernel, Z):
    """ROUNDOFF_FACTOR m eps kappa(L_K): the bound of the module docstring."""
    K = np.asarray(kernel.K(Z)) + JITTER * np.eye(M)
    return ROUNDOFF_FACTOR * M * np.finfo(np.float64).eps * np.sqrt(np.linalg.cond(K))


def _assert_gradients_equal(fast, reference, tolerance):
    assert set(fast) == set(reference)
    for name in reference:
        scale = np.max(np.abs(reference[name]))
        np.testing.assert_allclose(fast[name], reference[name], rtol=0, atol=tolerance * scale, err_msg=name)


def _a_tied_factor(kernel, Z, X, y):
    """A SEP factor after one pass over the rows (a q unlike the prior, so that every term is exercised)."""
    sites = ep.evaluate(kernel, Z, X, y, ep.zero_sites(N, Z), ep.zero_sites(N, Z), jitter=JITTER, want_grad=False)
    return ep.exact_factor(kernel, Z, X, sites["site_precision"], sites["site_shift"], jitter=JITTER), sites


@pytest.mark.parametrize("method", ["sep", "ep", "adf"])
def test_a_minibatch_ep_step_on_the_fast_path_equals_the_reference(method):
    X, y, kernel, Z = _problem()
    factor, sites = _a_tied_factor(kernel, Z, X, y)
    rows = slice(ROWS, 2 * ROWS)
    own = dict(site_precision=sites["site_precision"][rows], site_shift=sites["site_shift"][rows]) if method == "ep" else {}

    def step():
        return ep.evaluate_factor(kernel, Z, X[rows], y[rows], factor, cavity=method, n_total=N, jitter=JITTER,
                                  checked=False, **own)

    with B.counting_fast_calls() as calls:
        fast = step()
    with B.reference_paths(), B.counting_fast_calls() as none:
        reference = step()
    assert sum(calls.values()) > 0 and sum(none.values()) == 0  # the two paths did run
    assert abs(float(fast["log_z"]) - float(reference["log_z"])) <= 1e-10
    tolerance = _tolerance(kernel, Z)
    _assert_gradients_equal(fast["grads"], reference["grads"], tolerance)
    for new, old in ((fast["site_delta"].precision, reference["site_delta"].precision),
                     (fast["site_delta"].shift, reference["site_delta"].shift)):
        np.testing.assert_allclose(new, old, rtol=0, atol=tolerance * np.max(np.abs(old)))


def test_an_svi_step_on_the_fast_path_equals_the_reference():
    X, y, kernel, Z = _problem()
    rng = np.random.default_rng(1)
    whitened_mean = 0.3 * rng.normal(size=M)
    whitened_chol = np.tril(0.1 * rng.normal(size=(M, M))) + 0.7 * np.eye(M)

    def step():
        return variational.svi_elbo(kernel, Z, X[ROWS:2 * ROWS], y[ROWS:2 * ROWS], whitened_mean, whitened_chol,
                                    n_total=N, jitter=JITTER)

    fast_value, fast = step()
    with B.reference_paths():
        ref_value, reference = step()
    assert abs(float(fast_value) - float(ref_value)) <= 1e-10
    _assert_gradients_equal(fast, reference, _tolerance(kernel, Z))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_each_fast_primitive_equals_its_reference(dtype):
    """C- and Fortran-ordered operands, both sides, transposed or not, vectors and matrices."""
    rng = np.random.default_rng(2)
    m = 9
    A = rng.normal(size=(m, m))
    K = (A @ A.T + m * np.eye(m)).astype(dtype)
    eps = np.finfo(dtype).eps
    tolerance = 100 * m * eps

    def both(function, *args, blas=True, **kwargs):
        with B.counting_fast_calls() as calls:
            fast = function(*args, **kwargs)
        with B.reference_paths():
            reference = function(*args, **kwargs)
        assert sum(calls.values()) >= int(blas), function.__name__  # it did take the fast path
        assert fast.dtype == reference.dtype == dtype
        np.testing.assert_allclose(fast, reference, rtol=0, atol=tolerance * np.max(np.abs(reference)),
                                   err_msg=function.__name__)
        return fast

    asymmetric = K + np.triu(rng.normal(size=(m, m)), 1).astype(dtype)  # only the lower triangle is read
    L = both(B.cholesky_or_nan, asymmetric)
    assert L.flags.c_contiguous
    for factor in (L, np.asfortranarray(L)):
        both(B.lower_triangular_inverse, factor)
        both(B.cholesky_inverse, factor)
        for B_ in (rng.normal(size=(m, 4)).astype(dtype), np.asfortranarray(rng.normal(size=(m, 4))).astype(dtype),
                   rng.normal(size=m).astype(dtype)):
            for trans in (False, True):
                both(B.triangular_matmul, factor, B_, trans=trans)
                both(B.solve_triangular, factor, B_, trans=trans)
                if B_.ndim == 2:
                    both(B.triangular_matmul, factor, np.ascontiguousarray(B_.T), trans=trans, right=True)
    for S in (K, np.asfortranarray(K[:, ::-1])):  # (a Fortran-ordered S: the diagonal written in place all the same)
        both(B.identity_plus, S, 0.5, identity=2.0, blas=False)
        both(B.identity_plus, S, blas=False)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", [B.TRIANGULAR_INVERSE_BLOCK + 1, 2 * B.TRIANGULAR_INVERSE_BLOCK,
                               2 * B.TRIANGULAR_INVERSE_BLOCK + 1, 257])
def test_the_triangular_inverses_equal_scipys_solve(m, dtype, threads):
    """Above twice ``TRIANGULAR_INVERSE_BLOCK``, while OpenBLAS runs on one thread, the NumPy fast path inverts a
    triangle by halves (trtri on the blocks, two trmm's a halving) and ``cholesky_inverse`` takes that inverse and a
    lauum; below, or on more threads, one trtri and one potri. Each against SciPy's triangular solve with the identity
    (float64), in both memory orders, with zeros kept above the diagonal and the operand left as it was, within 100 m
    eps kappa(L) (the module docstring's bound, ROUNDOFF_FACTOR m eps kappa, with room for float32; kappa(L)^2 for
    (L L^T)^-1)."""
    rng = np.random.default_rng(m)
    A = rng.normal(size=(m, m))
    L64 = np.linalg.cholesky(A @ A.T / m + 0.1 * np.eye(m))
    reference = scipy.linalg.solve_triangular(L64, np.eye(m), lower=True)
    gram_reference = reference.T @ reference
    bound = 100 * m * np.finfo(dtype).eps * np.linalg.cond(L64)
    prefix = "s" if dtype == np.float32 else "d"
    with threadpool_limits(threads, user_api="blas"):
        if _blas_thread_counts() != {threads}:
            pytest.skip(f"the BLAS libraries would not run {threads} threads here")
        for L in (L64.astype(dtype), np.asfortranarray(L64.astype(dtype))):
            before = L.copy()
            with B.counting_fast_calls() as calls:
                inverse = B.lower_triangular_inverse(L)
                gram = B.cholesky_inverse(L)
            by_halves = threads == 1 and m > 2 * B.TRIANGULAR_INVERSE_BLOCK and B._openblas_pools()[1]
            blocks = _diagonal_blocks(m) if by_halves else 1
            halves = blocks > 1  # (each inverse: a trtri a block, two trmm's a halving)
            assert calls[prefix + "trtri"] == (2 * blocks if halves else 1)
            assert calls[prefix + "trmm"] == 2 * 2 * (blocks - 1)
            assert calls[prefix + "potri"] == int(not halves) and calls[prefix + "lauum"] == int(halves)
            assert inverse.dtype == gram.dtype == dtype
            np.testing.assert_array_equal(L, before)
            assert not np.any(np.triu(inverse, 1))
            np.testing.assert_allclose(inverse, reference, rtol=0, atol=bound * np.max(np.abs(reference)))
            np.testing.assert_array_equal(gram, gram.T)
            np.testing.assert_allclose(gram, gram_reference, rtol=0,
                                       atol=bound * np.linalg.cond(L64) * np.max(np.abs(gram_reference)))


def _diagonal_blocks(m):
    """The diagonal blocks a triangle of order m is inverted in by halves (each at most TRIANGULAR_INVERSE_BLOCK)."""
    return 1 if m <= B.TRIANGULAR_INVERSE_BLOCK else _diagonal_blocks(m // 2) + _diagonal_blocks(m - m // 2)


def _blas_thread_counts():
    """The thread counts of the BLAS libraries loaded, as threadpoolctl reports them."""
    return {info["num_threads"] for info in threadpool_info() if info.get("user_api") == "blas"}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("zero_at", [3, 100])
def test_a_singular_triangle_inverted_by_blocks_is_nan(zero_at, threads):
    """A zero on the diagonal in either half of a triangle inverted by halves (one thread) or by one trtri / potri:
    NaN."""
    L = np.tril(np.random.default_rng(5).normal(size=(150, 150))) + 5 * np.eye(150)
    L[zero_at, zero_at] = 0.0
    with threadpool_limits(threads, user_api="blas"):
        if _blas_thread_counts() != {threads}:
            pytest.skip(f"the BLAS libraries would not run {threads} threads here")
        for operand in (L, np.asfortranarray(L)):
            with B.counting_fast_calls() as calls:
                assert np.all(np.isnan(B.lower_triangular_inverse(operand)))
                assert np.all(np.isnan(B.cholesky_inverse(operand)))
            assert (calls["dtrtri"] > 1) == (threads == 1)  # (by halves: a trtri a block, up to the singular one)


@pytest.mark.parametrize("found, threads, expected", [
    ([], 1, False),  # no BLAS threadpoolctl knows (Apple's Accelerate): LAPACK's routines
    (["openblas"], 1, True),
    (["openblas"], 2, False),
    (["openblas", "mkl"], 1, False),  # a BLAS not measured beside OpenBLAS
    (["blis"], 1, False),
])
def test_only_openblas_on_one_thread_inverts_by_halves(monkeypatch, found, threads, expected):
    """``backend.inverts_by_halves`` over what threadpoolctl finds (looked up once, then read), for NumPy arrays
    above twice the block only; ``backend.congruence_by_sygst`` from its order on."""
    built = []

    class Pool:
        def __init__(self, api):
            self.internal_api, self.num_threads = api, threads

    class Controller:
        def __init__(self):
            built.append(self)

        def select(self, user_api):
            return types.SimpleNamespace(lib_controllers=[Pool(api) for api in found])

    monkeypatch.setattr(B, "ThreadpoolController", Controller)
    monkeypatch.setattr(B, "_BLAS_POOLS", None)
    order = 2 * B.TRIANGULAR_INVERSE_BLOCK
    assert B.inverts_by_halves(np.eye(order + 1)) is expected
    assert B.inverts_by_halves(np.eye(order)) is False
    assert B.inverts_by_halves(np.eye(order + 1, dtype=np.int64)) is False  # (not the fast path's)
    assert B.inverts_by_halves(np.eye(order + 1)) is expected
    assert len(built) == 1
    # sygst for a symmetric congruence likewise, from its order on (two threads shared two trmm's better)
    order = B.CONGRUENCE_MIN_ORDER
    assert B.congruence_by_sygst(np.eye(order)) is expected
    assert B.congruence_by_sygst(np.eye(order - 1)) is False
    assert B.congruence_by_sygst(np.eye(order, dtype=np.int64)) is False


@pytest.mark.parametrize("threads", [1, 2])
def test_the_carry_by_halves_equals_the_reference(threads):
    """``posterior.moved_factor`` above twice the block: on one OpenBLAS thread L_C^-1 by halves (no trsm: U and c~ by
    products with it), on two by solves; either against the array-API reference path."""
    rng = np.random.default_rng(7)
    m = 2 * B.TRIANGULAR_INVERSE_BLOCK + 3
    Z_old = rng.uniform(-4.0, 4.0, size=(m, 2))
    Z_new = Z_old + 0.01 * rng.normal(size=(m, 2))
    kernel = RBF(lengthscales=[0.6, 0.8], amplitude=1.0, noise=0.01).for_inputs(xp.asarray(Z_old))
    H = rng.normal(size=(m, 3 * m)) / m
    factor = Factor(xp.asarray(H @ H.T), xp.asarray(rng.normal(size=m)))
    with threadpool_limits(threads, user_api="blas"):
        if _blas_thread_counts() != {threads}:
            pytest.skip(f"the BLAS libraries would not run {threads} threads here")
        with B.counting_fast_calls() as calls:
            fast = moved_factor(kernel, xp.asarray(Z_old), xp.asarray(Z_new), factor, jitter=JITTER)
    with B.reference_paths():
        reference = moved_factor(kernel, xp.asarray(Z_old), xp.asarray(Z_new), factor, jitter=JITTER)
    by_halves = threads == 1 and B._openblas_pools()[1]
    assert (calls["dtrsm"] == 0) == by_halves and (calls["dtrsv"] == 0) == by_halves
    K = np.asarray(kernel.K(xp.asarray(Z_new))) + JITTER * np.eye(m)
    bound = ROUNDOFF_FACTOR * m * np.finfo(np.float64).eps * np.linalg.cond(K)
    for got, want in ((fast.precision, reference.precision), (fast.shift, reference.shift)):
        np.testing.assert_allclose(got, want, rtol=0, atol=bound * np.max(np.abs(want)))


def test_a_failed_factorisation_on_the_fast_path_is_nan_not_an_exception():
    """The divergence guard reads a failed Cholesky factor as NaN in log Z (one host sync a step, no raise)."""
    bad = np.eye(4)
    bad[2, 2] = -1.0
    with B.counting_fast_calls() as calls:
        L = B.cholesky_or_nan(bad)
    assert calls["dpotrf"] == 1 and np.all(np.isnan(L))
    assert np.all(np.isnan(B.lower_triangular_inverse(np.zeros((3, 3)))))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_gram_of_a_formed_inverse_is_one_lauum_of_it(dtype):
    """``triangular_gram(L^-1)`` = (L L^T)^-1 (q's C^-1 once L_C^-1 is formed, an anchor's K^-1, the prior's
    gradient): on the fast path one lauum and nothing else, in both memory orders, the inverse left as it was (the
    Posterior keeps it), exactly symmetric and within ``test_the_triangular_inverses_equal_scipys_solve``'s bound of
    SciPy's; the reference path's triangular product gives the same."""
    m = 150
    rng = np.random.default_rng(m)
    A = rng.normal(size=(m, m))
    L64 = np.linalg.cholesky(A @ A.T / m + 0.1 * np.eye(m))
    reference = scipy.linalg.solve_triangular(L64, np.eye(m), lower=True)
    gram_reference = reference.T @ reference
    atol = 100 * m * np.finfo(dtype).eps * np.linalg.cond(L64) ** 2 * np.max(np.abs(gram_reference))
    prefix = "s" if dtype == np.float32 else "d"
    for inverse in (reference.astype(dtype), np.asfortranarray(reference.astype(dtype))):
        before = inverse.copy()
        with B.counting_fast_calls() as calls:
            gram = B.triangular_gram(inverse)
        assert dict(calls) == {prefix + "lauum": 1}
        np.testing.assert_array_equal(inverse, before)
        assert gram.dtype == dtype
        np.testing.assert_array_equal(gram, gram.T)
        np.testing.assert_allclose(gram, gram_reference, rtol=0, atol=atol)
        with B.reference_paths():
            np.testing.assert_allclose(B.triangular_gram(inverse), gram, rtol=0, atol=atol)
    L = L64.astype(dtype)
    post = Posterior(L_K=L, L_C=L, h=np.zeros(m, dtype=dtype))
    formed = post.L_C_inv.copy()
    with B.counting_fast_calls() as calls:
        np.testing.assert_allclose(post.C_inv, gram, rtol=0, atol=atol)
    assert dict(calls) == {prefix + "lauum": 1}
    np.testing.assert_array_equal(post.L_C_inv, formed)
    frozen = reference.astype(dtype)  # a read-only operand is not written into even where it may be
    frozen.setflags(write=False)
    np.testing.assert_allclose(B.triangular_gram(frozen, overwrite=True), gram, rtol=0, atol=atol)
    np.testing.assert_array_equal(frozen, reference.astype(dtype))
    with B.counting_fast_calls() as calls:  # (an empty operand is not given to lauum, which refuses it)
        assert B.triangular_gram(np.zeros((0, 0), dtype=dtype)).shape == (0, 0)
    assert not any(name.endswith("lauum") for name in calls)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_symmetric_congruence_is_one_sygst_from_its_order(dtype, monkeypatch):
    """``symmetric_congruence(T, P)`` = T^T P T (L^-T P L^-1 of the prior's gradient, for T = L^-1): on the fast path
    from ``CONGRUENCE_MIN_ORDER`` one sygst and nothing else, in every memory order of T and P, exactly symmetric,
    within a product's round-off of the long-double T^T P T; below it the two triangular products, whose result the
    reference path gives too; P left as it was unless it may be overwritten, and a read-only P never written into.
    ``posterior.inverse_congruence`` gives the same by triangular solves without the inverse (array_api_strict). (The
    order from which sygst is taken is set to this test's m, 96, and its condition on the BLAS threads taken as met:
    the arithmetic depends on neither.)"""
    m = 96
    monkeypatch.setattr(B, "CONGRUENCE_MIN_ORDER", m)
    monkeypatch.setattr(B, "_one_openblas_thread", lambda: True)
    rng = np.random.default_rng(m)
    A = rng.normal(size=(m, m))
    L64 = np.linalg.cholesky(A @ A.T / m + 0.1 * np.eye(m))
    T64 = scipy.linalg.solve_triangular(L64, np.eye(m), lower=True)
    P64 = rng.normal(size=(m, m))
    P64 = P64 + P64.T
    T, P = T64.astype(dtype), P64.astype(dtype)
    exact = (T.astype(np.longdouble).T @ P.astype(np.longdouble) @ T.astype(np.longdouble)).astype(np.float64)
    # each entry sums m products of |T|^T |P| |T|: a product's forward error
    atol = 2 * m * np.finfo(dtype).eps * np.max(np.abs(T64).T @ np.abs(P64) @ np.abs(T64))
    prefix = "s" if dtype == np.float32 else "d"
    for T_order in (T, np.asfortranarray(T)):
        for P_order in (P, np.asfortranarray(P)):
            before = P_order.copy()
            with B.counting_fast_calls() as calls:
                out = B.symmetric_congruence(T_order, P_order)
            assert dict(calls) == {prefix + "sygst": 1}
            np.testing.assert_array_equal(P_order, before)
            assert out.dtype == dtype
            np.testing.assert_array_equal(out, out.T)
            np.testing.assert_allclose(out, exact, rtol=0, atol=atol)
            with B.reference_paths():
                np.testing.assert_allclose(B.symmetric_congruence(T_order, P_order), exact, rtol=0, atol=atol)
    frozen = P.copy()
    frozen.setflags(write=False)
    np.testing.assert_allclose(B.symmetric_congruence(T, frozen, overwrite=True), exact, rtol=0, atol=atol)
    np.testing.assert_array_equal(frozen, P)
    strict = array_api_strict.asarray(L64.astype(dtype)), array_api_strict.asarray(P)
    np.testing.assert_allclose(np.asarray(inverse_congruence(*strict)), exact, rtol=0,
                               atol=atol * np.linalg.cond(L64))
    monkeypatch.setattr(B, "CONGRUENCE_MIN_ORDER", m + 1)
    with B.counting_fast_calls() as calls:
        np.testing.assert_allclose(B.symmetric_congruence(T, P), exact, rtol=0, atol=atol)
    assert dict(calls) == {prefix + "trmm": 2}


def test_the_fast_path_does_not_write_into_its_operands():
    rng = np.random.default_rng(3)
    L = np.tril(rng.normal(size=(6, 6))) + 4 * np.eye(6)
    B_ = rng.normal(size=(6, 5))
    L_copy, B_copy = L.copy(), B_.copy()
    for trans in (False, True):
        B.triangular_matmul(L, B_, trans=trans)
        B.triangular_matmul(L, B_.T, trans=trans, right=True)
        B.solve_triangular(L, B_, trans=trans)
    B.lower_triangular_inverse(L)
    B.cholesky_inverse(L)
    np.testing.assert_array_equal(L, L_copy)
    np.testing.assert_array_equal(B_, B_copy)


def test_operands_of_two_types_take_the_reference_path():
    """float32 and float64 together are promoted as the reference promotes them (no BLAS call in the narrower
    type)."""
    L = np.tril(np.random.default_rng(4).normal(size=(5, 5))) + 3 * np.eye(5)
    B_ = np.ones((5, 2), dtype=np.float32)
    with B.counting_fast_calls() as calls:
        out = B.triangular_matmul(L, B_)
        solved = B.solve_triangular(L, B_)
    assert sum(calls.values()) == 0
    assert out.dtype == solved.dtype == np.float64
    np.testing.assert_allclose(out, L @ B_.astype(np.float64), rtol=1e-14)
