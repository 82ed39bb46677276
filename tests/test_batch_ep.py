"""Batch EP's iteration: the sweep that visits each block once (``ep.batch_sweep``) against the two-pass
computation it replaced, its blocks on several threads, the sums it leaves for the next pass, and the
kernel blocks it is built on."""

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from agpc import threads
from agpc.inference import blocks, engines, ep, training
from agpc.inference.engines import EPEngine
from agpc.kernels import RBF, Matern52
from conftest import to_np, to_xp
from helpers import long_double_inverse

JITTER = 1e-6


def _problem(xp=None, device=None, n=260, m=12, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.where(np.sin(2.0 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    nu, mu = rng.uniform(0.0, 0.6, n), rng.normal(0.0, 0.4, n)
    Z = X[rng.choice(n, m, replace=False)] + 0.05
    if xp is not None:
        X, y, nu, mu, Z = (to_xp(v, xp, device) for v in (X, y, nu, mu, Z))
    kernel = RBF(lengthscales=[0.9, 1.2, 0.7], amplitude=1.4, noise=0.02).for_inputs(X)
    return kernel, Z, X, y, nu, mu


def _two_pass(kernel, Z, X, y, nu, mu, *, block_rows, damping, want_grad=True):
    """Batch EP as it was computed before the fused sweep, from the library's pieces that still compute it so:
    q from the sums of all sites, then the minibatch step's ``block_pass`` (marginals, then ``data_adjoint``'s
    solves) over every block with that q."""
    L_K = ep.prior_cholesky(kernel, Z, JITTER)
    S, c_tilde, _ = ep.site_sums_over_rows(kernel, Z, X, nu, mu, L_K, block_rows, False)
    post = ep.posterior_from_sums(L_K, S, c_tilde)
    sweep = ep.binary_sweep(kernel, Z, X, y, nu, mu, post, want_grad=want_grad, block_rows=block_rows,
                            damping=damping)
    return ep.finish_evaluate(kernel, Z, post, sweep, want_grad)


def _assert_same(fused, reference, rtol=1e-11):
    assert abs(float(fused["log_z"]) - float(reference["log_z"])) <= rtol * abs(float(reference["log_z"]))
    for key in ("site_precision", "site_shift"):
        np.testing.assert_allclose(to_np(fused[key]), to_np(reference[key]), rtol=rtol, atol=1e-13, err_msg=key)
    np.testing.assert_array_equal(to_np(fused["valid"]), to_np(reference["valid"]))
    assert float(fused["n_invalid"]) == float(reference["n_invalid"])
    for name, value in reference["grads"].items():
        scale = np.abs(to_np(value)).max()
        np.testing.assert_allclose(to_np(fused["grads"][name]), to_np(value), rtol=rtol, atol=rtol * scale,
                                   err_msg=name)


# block_rows: one wide block and several (the explicit inverses and triangular products of the fused form; 130
# and 260 rows > 4 m), and narrow blocks (triangular solves and data_adjoint's form, 30 rows < 4 m)
@pytest.mark.parametrize("block_rows", [None, 130, 30])
@pytest.mark.parametrize("damping", [None, 0.5])
@pytest.mark.parametrize("kept", [True, False])
def test_fused_sweep_equals_the_two_pass_computation(xp_device, block_rows, damping, kept, monkeypatch):
    """``kept``: the blocks' A and kernel blocks are kept between the two visits, or the sweep forms them again."""
    xp, device = xp_device
    kernel, Z, X, y, nu, mu = _problem(xp, device)
    monkeypatch.setattr(blocks, "CACHE_ELEMENTS", (2 if kept else 0) * X.shape[0] * Z.shape[0])
    reference = _two_pass(kernel, Z, X, y, nu, mu, block_rows=block_rows, damping=damping)
    for nonnegative in (False, True):  # the site precisions here are >= 0: both forms of the sums apply
        fused = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=block_rows, damping=damping,
                            nonnegative_sites=nonnegative)
        _assert_same(fused, reference)
        if damping is not None:
            np.testing.assert_allclose(to_np(fused["site_change"]), to_np(reference["site_change"]), rtol=1e-11)


def test_fused_sweep_with_invalid_cavities_and_no_gradient():
    """Rows whose cavity is improper keep their sites and add nothing, as in the two-pass computation. (With q
    built from the same sites a cavity is improper only beside a negative site: two copies of a row, sites +10
    and -9.9, as in test_ep.)"""
    kernel, Z, X, y, nu, mu = _problem()
    X, nu = X.copy(), nu.copy()
    X[1] = X[0]
    nu[0], nu[1] = 10.0, -9.9
    for want_grad in (True, False):
        reference = _two_pass(kernel, Z, X, y, nu, mu, block_rows=130, damping=0.5, want_grad=want_grad)
        fused = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=130, damping=0.5, want_grad=want_grad)
        assert not to_np(fused["valid"])[0] and float(fused["n_invalid"]) >= 1
        if want_grad:
            _assert_same(fused, reference)
        else:
            assert fused["grads"] is None
            assert abs(float(fused["log_z"]) - float(reference["log_z"])) <= 1e-11 * abs(float(reference["log_z"]))


def test_a_negative_site_precision_is_summed_as_negative():
    """The general form of the sums takes sites of either sign (``nonnegative_sites`` is not set for these)."""
    kernel, Z, X, y, nu, mu = _problem()
    nu = nu - 0.2
    reference = _two_pass(kernel, Z, X, y, nu, mu, block_rows=None, damping=None)
    _assert_same(ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER), reference)


def test_blocks_on_several_threads_give_the_one_thread_results(monkeypatch):
    """With a BLAS scope of several threads the blocks run on that many Python threads (each BLAS call on one);
    the block results, and their sums in order, are the one-thread ones. Both passes run under a one-thread BLAS
    limit: the m x m algebra outside the blocks runs at the limit in force, and OpenBLAS's SkylakeX kernels give
    results an ulp apart on one thread and on two (11 of 1,800 sites differed, on an AVX-512 Xeon), which is not
    what is tested here; the threads' count comes from ``pass_workers``, patched to 3."""
    kernel, Z, X, y, nu, mu = _problem(n=1800)
    with threadpool_limits(1):  # blocks of 200 rows, the rows 600-row blocks would have on three threads
        one = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=200, damping=0.5, checked=False,
                          nonnegative_sites=True)
    seen, calls = set(), []
    block_pass = ep.batch_block_pass
    together = threading.Barrier(3, timeout=60)  # the first three blocks must run at once

    def recording(*args, **kwargs):
        seen.add(threading.get_ident())
        calls.append(1)
        if len(calls) <= 3:
            together.wait()
        return block_pass(*args, **kwargs)

    monkeypatch.setattr(ep, "batch_block_pass", recording)
    monkeypatch.setattr(threads, "pass_workers", lambda: 3)
    with threadpool_limits(1):
        many = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=600, damping=0.5, checked=False,
                           nonnegative_sites=True)
    assert len(seen) == 3 and threading.get_ident() not in seen
    assert len(calls) == 9  # wide blocks of 200 rows: the explicit products
    assert float(many["log_z"]) == float(one["log_z"])
    for key in ("site_precision", "site_shift", "site_change"):
        np.testing.assert_array_equal(many[key], one[key])
    for name in one["grads"]:
        np.testing.assert_array_equal(many["grads"][name], one["grads"][name])


def test_the_threads_of_a_pass_keep_the_callers_fast_path_scope(monkeypatch):
    """backend.reference_paths and counting_fast_calls hold on the pass's threads: the reference pass on three
    threads calls no BLAS routine directly and equals the fast pass to round-off, whose calls are all counted."""
    from agpc import backend

    kernel, Z, X, y, nu, mu = _problem(n=1800)
    monkeypatch.setattr(threads, "pass_workers", lambda: 3)
    seen = set()
    block_pass = ep.batch_block_pass
    monkeypatch.setattr(ep, "batch_block_pass", lambda *a, **k: seen.add(threading.get_ident()) or block_pass(*a, **k))
    options = dict(jitter=JITTER, block_rows=600, damping=0.5, checked=False, nonnegative_sites=True)
    with backend.counting_fast_calls() as fast_calls:
        fast = ep.evaluate(kernel, Z, X, y, nu, mu, **options)
    with backend.reference_paths(), backend.counting_fast_calls() as reference_calls:
        reference = ep.evaluate(kernel, Z, X, y, nu, mu, **options)
    assert seen and threading.get_ident() not in seen  # every block on the pool's threads
    assert sum(reference_calls.values()) == 0
    # per block of 200 rows: A and the adjoint of K(Z, X) by trmm (C^-1 A by a general product), and the rank-one
    # update; once per pass on the caller's thread: L_K's and L_C's factors and inverses, C^-1's products and the
    # m x m adjoint's
    blocks = 9
    assert fast_calls["dtrmm"] >= 2 * blocks and fast_calls["dger"] == blocks
    _assert_same(fast, reference, rtol=1e-9)


def test_an_error_in_a_block_on_a_thread_reaches_the_caller(monkeypatch):
    kernel, Z, X, y, nu, mu = _problem(n=900)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise FloatingPointError("block")

    monkeypatch.setattr(ep, "batch_block_pass", failing)
    monkeypatch.setattr(threads, "pass_workers", lambda: 2)
    with pytest.raises(FloatingPointError, match="block"):
        ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=100)
    assert len(calls) < 9  # the queued blocks were not started after the error


def test_pass_threads_follow_the_blas_scope():
    """One Python thread a BLAS thread the scope allows, at most one a block, and none for other libraries."""
    Z = np.zeros((4, 2))
    with threadpool_limits(1):
        assert blocks.block_workers(Z, 10) == 1
    with threadpool_limits(2):
        assert blocks.block_workers(Z, 10) == 2
        assert blocks.block_workers(Z, 1) == 1
        import array_api_strict

        assert blocks.block_workers(array_api_strict.asarray(Z), 10) == 1
        rows, workers = blocks.pass_layout(Z, 10**6)  # (4 blocks of 250,000 where 4 of 262,144 would leave a short one)
        assert workers == 2 and rows == 250_000 <= -(-blocks.default_block_rows(Z, 10**6) // 2)
        assert blocks.pass_layout(Z, 10**6, 5000) == (2500, 2)  # the rows of a given block too


@pytest.mark.parametrize("block_rows", [None, 60])
def test_sums_left_for_the_next_pass_give_its_q(block_rows, monkeypatch):
    """want_next_sums: the sums of the damped new sites at this pass's kernel and Z; a pass given them
    (site_sums) skips its visit for the sums and gives the pass that forms them again."""
    kernel, Z, X, y, nu, mu = _problem()
    first = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER, block_rows=block_rows, damping=0.5,
                        want_next_sums=True, nonnegative_sites=True)
    nu1, mu1 = first["site_precision"], first["site_shift"]
    again = ep.evaluate(kernel, Z, X, y, nu1, mu1, jitter=JITTER, block_rows=block_rows, damping=0.5)
    visits = []
    sums_over_rows = ep.site_sums_over_rows
    monkeypatch.setattr(ep, "site_sums_over_rows", lambda *a, **k: visits.append(1) or sums_over_rows(*a, **k))
    reused = ep.evaluate(kernel, Z, X, y, nu1, mu1, jitter=JITTER, block_rows=block_rows, damping=0.5,
                         site_sums=first["site_sums"])
    assert not visits
    _assert_same(reused, again, rtol=1e-10)


def test_training_reuses_the_sums_only_while_the_hyperparameters_stay(monkeypatch):
    """The warm-up sweeps (no step on the hyper-parameters) take the sums the sweep before them left; a pass after
    a step forms them again. The fit is the one that forms them every pass."""
    kernel, Z, X, y, _, _ = _problem()
    options = dict(jitter=JITTER, max_iter=3, n_warmup=4, damping=0.5, block_rows=80)
    visits = []
    sums_over_rows = ep.site_sums_over_rows
    monkeypatch.setattr(ep, "site_sums_over_rows", lambda *a, **k: visits.append(1) or sums_over_rows(*a, **k))
    fit = training.fit(X, y, kernel, Z, **options)
    # steps: 4 warm-up sweeps (the first forms the sums, the next three take them), then 3 steps on the
    # hyper-parameters (the first takes the last warm-up's sums, the next two follow a step); the final pass
    # (after a step)
    assert len(visits) == 1 + 2 + 1
    visits.clear()
    fixed = training.fit(X, y, kernel, Z, **dict(options, optimize=()))  # nothing to learn: every pass
    assert fixed.n_iter == 3 and len(visits) == 1  # after the first takes the sums the one before it left
    monkeypatch.setattr(EPEngine, "_binary_batch_options",
                        lambda self, stepping: {"nonnegative_sites": self.sites_nonnegative})
    plain = training.fit(X, y, kernel, Z, **options)
    assert abs(fit.log_z - plain.log_z) <= 1e-9 * abs(plain.log_z)
    np.testing.assert_allclose(to_np(fit.site_precision), to_np(plain.site_precision), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(to_np(fit.Z), to_np(plain.Z), rtol=1e-9, atol=1e-12)


def test_sums_are_formed_again_after_the_jitter_was_raised():
    kernel, Z, X, y, _, _ = _problem()
    engine = training.make_engine("ep", kernel, Z, n_total=X.shape[0], minibatch=False, jitter=JITTER)
    summary, work = engine.evaluate(X, y, 0, X.shape[0], stepping=False)
    engine.apply(work, 0, X.shape[0], stepping=False, scalars=np.asarray(summary))
    assert engine._binary_batch_options(False)["site_sums"] is not None
    engine.jitter = 10 * JITTER
    assert engine._binary_batch_options(False)["site_sums"] is None


def test_sites_given_with_a_negative_precision_take_the_general_sums():
    kernel, Z, X, y, nu, mu = _problem()
    zero = training.make_engine("ep", kernel, Z, n_total=X.shape[0], minibatch=False)
    assert zero.sites_nonnegative
    given = training.make_engine("ep", kernel, Z, n_total=X.shape[0], minibatch=False, site_precision=nu,
                                 site_shift=mu)
    assert given.sites_nonnegative
    negative = training.make_engine("ep", kernel, Z, n_total=X.shape[0], minibatch=False, site_precision=nu - 1.0,
                                    site_shift=mu)
    assert not negative.sites_nonnegative
    assert negative._binary_batch_options(True)["nonnegative_sites"] is False


def test_new_site_precisions_are_never_negative(monkeypatch):
    """A new site's precision gamma / (1 - v gamma) is positive for the probit; where round-off would leave
    gamma below 0 (deep in a tail) the precision is 0, so the training loop's sites stay nonnegative
    (``nonnegative_sites``). Here gamma is made negative for some rows on purpose."""
    kernel, Z, X, y, nu, mu = _problem()
    moments = ep.PROBIT.tilted_moments

    def tail_roundoff(y, a, b):
        log_z, alpha, gamma = moments(y, a, b)
        return log_z, alpha, np.where(np.arange(gamma.shape[0]) % 7 == 0, -1e-12, gamma)

    monkeypatch.setattr(ep.PROBIT, "tilted_moments", tail_roundoff)
    out = ep.evaluate(kernel, Z, X, y, nu, mu, jitter=JITTER)
    new = to_np(out["site_precision"])
    assert np.all(new >= 0.0) and np.all(new[::7] == 0.0)


@pytest.mark.parametrize("kernel_cls", [RBF, Matern52])
def test_kernel_blocks_of_many_pairs_match_the_definition(kernel_cls, xp_device):
    """Blocks of at least 2^16 pairs come from one product of augmented inputs (``kernels._augmented_pair``):
    checked against the covariance computed from the differences x - z themselves, far from the origin too."""
    xp, device = xp_device
    rng = np.random.default_rng(0)
    for offset in (0.0, 1e4):
        X_np, Z_np = rng.normal(size=(700, 3)) + offset, rng.normal(size=(100, 3)) + offset
        lengthscales, amplitude = np.array([0.7, 1.1, 2.0]), 1.7
        kernel = kernel_cls(lengthscales=list(lengthscales), amplitude=amplitude).for_inputs(to_xp(X_np, xp, device))
        r2 = (((X_np[:, None, :] - Z_np[None, :, :]) / lengthscales) ** 2).sum(-1)
        r = np.sqrt(r2)
        expected = amplitude * (np.exp(-0.5 * r2) if kernel_cls is RBF
                                else (1 + np.sqrt(5) * r + 5 * r2 / 3) * np.exp(-np.sqrt(5) * r))
        for K in (kernel.K(to_xp(X_np, xp, device), to_xp(Z_np, xp, device)),
                  kernel.K(to_xp(Z_np, xp, device), to_xp(X_np, xp, device)).mT):
            np.testing.assert_allclose(to_np(K), expected, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("kernel_cls", [RBF, Matern52])
def test_gradients_of_a_block_of_many_pairs_match_finite_differences(kernel_cls):
    """The chain rule for blocks of at least 2^16 pairs (r^2's adjoint read by one product; RBF's amplitude
    gradient from its column sums) against central differences of sum(dKnm * K(X, Z)) + sum(dKdiag * Kdiag)."""
    from conftest import check_parameter_gradients
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(1)
    X, Z = rng.normal(size=(700, 3)), rng.normal(size=(100, 3))
    dKnm, dKdiag = rng.normal(size=(700, 100)), rng.normal(size=700)
    kernel = kernel_cls(lengthscales=[0.7, 1.1, 2.0], amplitude=1.7, noise=0.1).for_inputs(X)

    def objective(k, ZZ):
        return float(np.sum(dKnm * np.asarray(k.K(X, ZZ))) + np.sum(dKdiag * np.asarray(k.Kdiag(X))))

    grads = kernel.grads(None, dKnm, dKdiag, X, Z)
    check_parameter_gradients(kernel, grads, Z, objective, xp, None, rtol=1e-6, atol=1e-5)


UNLOCKED_NAMES = ("strmm", "dtrmm", "strsm", "dtrsm", "sger", "dger")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("through", ["cython_blas", "scipy.linalg.blas"])
def test_triangular_products_and_rank_one_updates_in_place(dtype, through, monkeypatch):
    """backend.triangular_matmul and add_outer against plain products, for C- and Fortran-ordered triangles, on
    either side, in place, into a scratch array, counted as BLAS calls, and through SciPy's Python BLAS (which
    holds the interpreter lock) when cython_blas's routines are not there."""
    import ctypes

    from agpc import backend

    prefix = "d" if dtype == np.float64 else "s"
    if through == "scipy.linalg.blas":
        monkeypatch.setattr(backend, "_UNLOCKED_BLAS", {name: None for name in UNLOCKED_NAMES})
    else:  # this SciPy has them, called as C functions (ctypes releases the interpreter lock for those)
        for name in ("trmm", "trsm", "ger"):
            routine = backend._unlocked_blas(prefix + name)
            assert routine is not None and not type(routine)._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    with backend.blas_releasing_the_lock():
        _check_triangular_products_and_rank_one_updates(dtype, prefix)


def _check_triangular_products_and_rank_one_updates(dtype, prefix):
    from agpc import backend

    rng = np.random.default_rng(2)
    T = np.tril(rng.normal(size=(40, 40))).astype(dtype)
    B = rng.normal(size=(40, 130)).astype(dtype)
    tolerance = 1e-12 if dtype == np.float64 else 1e-4
    for triangle in (T, np.asfortranarray(T)):
        for trans in (False, True):
            op = (triangle.T if trans else triangle).astype(np.float64)
            for right, operand in ((False, B), (True, np.asfortranarray(B.T)), (True, np.ascontiguousarray(B.T))):
                expected = operand.astype(np.float64) @ op if right else op @ operand.astype(np.float64)
                for options in ({}, {"overwrite": True}, {"out": np.empty_like(operand)}):
                    given = operand.copy(order="A")
                    with backend.counting_fast_calls() as calls:
                        result = backend.triangular_matmul(triangle, given, trans=trans, right=right, **options)
                    assert calls == {prefix + "trmm": 1}
                    np.testing.assert_allclose(result, expected, rtol=tolerance, atol=tolerance)
                    assert np.shares_memory(result, given) == bool(options.get("overwrite"))
                    assert "out" not in options or np.shares_memory(result, options["out"])
                    assert result.dtype == dtype
                    if not options:
                        np.testing.assert_array_equal(given, operand)  # not written into
            solved = backend.solve_triangular(triangle + 40 * np.eye(40, dtype=dtype), B, trans=trans)
            np.testing.assert_allclose((op + 40 * np.eye(40)) @ solved, B, rtol=tolerance, atol=tolerance)
    u, v = rng.normal(size=40).astype(dtype), rng.normal(size=130).astype(dtype)
    M = B.copy()
    with backend.counting_fast_calls() as calls:
        result = backend.add_outer(M, u, v)
    assert result is M and calls == {prefix + "ger": 1}
    np.testing.assert_allclose(result, B.astype(np.float64) + np.outer(u, v), rtol=tolerance, atol=tolerance)


def test_only_the_threads_of_a_pass_call_blas_with_the_lock_released(monkeypatch):
    """A batch pass on several threads takes cython_blas's routines (``backend.blas_releasing_the_lock``); a pass on
    one thread and a minibatch step take SciPy's Python wrappers."""
    from agpc import backend

    used = []

    def recorded(name):
        routine = backend._unlocked_blas(name)
        return lambda *arguments: used.append(name) or routine(*arguments)

    monkeypatch.setattr(backend, "_UNLOCKED_BLAS", {name: recorded(name) for name in UNLOCKED_NAMES})
    kernel, Z, X, y, nu, mu = _problem(n=1800)
    options = dict(jitter=JITTER, block_rows=600, damping=0.5, checked=False, nonnegative_sites=True)
    with threadpool_limits(1):
        one = ep.evaluate(kernel, Z, X, y, nu, mu, **options)
        trainer = training.Trainer(engines.make_engine("sep", kernel, Z, n_total=X.shape[0], minibatch=True,
                                                       jitter=JITTER))
        trainer.step(X, y, 0, 100, stepping=True)
    assert not used
    monkeypatch.setattr(threads, "pass_workers", lambda: 3)
    many = ep.evaluate(kernel, Z, X, y, nu, mu, **options)
    assert used.count("dtrmm") >= 2 * 9 and used.count("dger") == 9  # (nine blocks of 200 rows: A, the adjoint)
    _assert_same(many, one, rtol=1e-12)


def test_the_lock_free_blas_refuses_operands_that_do_not_fit():
    """cython_blas through ctypes checks no dimensions (SciPy's wrappers do): a triangle that does not fit its
    operand, or vectors that do not fit the matrix of a rank-one update, is a ValueError before the call, never
    a read past an array."""
    from agpc import backend

    triangle, operand = np.tril(np.ones((3, 3))), np.ones((4, 5))
    with backend.blas_releasing_the_lock():
        for right in (False, True):
            with pytest.raises(ValueError, match="does not fit"):
                backend.triangular_matmul(triangle, operand, right=right)
        with pytest.raises(ValueError, match="add_outer"):
            backend.add_outer(np.zeros((4, 5)), np.ones(4), np.ones(6))


def test_a_cython_blas_routine_absent_or_of_another_signature_is_not_called(monkeypatch):
    """The routine's address is taken only from a capsule whose C signature (its name) is the one called; a
    missing entry or another signature leaves SciPy's Python wrapper to do the work, with the same result."""
    import scipy.linalg.cython_blas

    from agpc import backend

    table = scipy.linalg.cython_blas.__pyx_capi__
    monkeypatch.setattr(backend, "_UNLOCKED_BLAS", {})
    monkeypatch.setitem(table, "dtrmm", table["dger"])  # another signature under trmm's name
    monkeypatch.delitem(table, "dger")  # and ger's entry gone
    assert backend._unlocked_blas("dtrmm") is None and backend._unlocked_blas("dger") is None
    assert backend._unlocked_blas("dtrsm") is not None
    rng = np.random.default_rng(5)
    T, B = np.tril(rng.normal(size=(30, 30))), rng.normal(size=(30, 70))
    u, v = rng.normal(size=30), rng.normal(size=70)
    with backend.blas_releasing_the_lock():
        product = backend.triangular_matmul(T, B.copy(), overwrite=True)
        updated = backend.add_outer(B.copy(), u, v)
    np.testing.assert_allclose(product, T @ B, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(updated, B + np.outer(u, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("site_scale", [1.0, 1e2, 1e4, 1e6])
def test_the_marginals_by_c_inverse_err_as_those_by_l_c_inverse(site_scale):
    """``ep.covariance_product``, the batch pass's marginals where its gradient goes through the explicit inverses
    (P = C^-1 A by one general product with q's C^-1; d_i = A_i^T P_i, e_i = (L_C^-T h)^T A_i), against d and e from
    the same float64 A, nu and mu with C inverted in long double: within 20 eps sqrt(cond C) of d (relative) and of
    max |e|, as the form by Q = L_C^-1 A is (measured: 0.03-1.1 eps sqrt(cond C) for both, cond C from 1e2 to 1e8:
    half of the inducing points away from the data, so that strong sites leave C's other directions near 1). P is
    C^-1 A to the error of C^-1 itself."""
    rng = np.random.default_rng(int(np.log10(site_scale)))
    m, n = 40, 400
    X = rng.standard_normal((n, 3))
    Z = np.concatenate([X[rng.choice(n, m // 2, replace=False)], 2.5 + rng.standard_normal((m - m // 2, 3))])
    kernel = RBF(lengthscales=[1.0, 1.0, 1.0]).for_inputs(X)
    L_K = ep.prior_cholesky(kernel, Z, JITTER)
    A = ep.left_solve(L_K, kernel.K(Z, X))
    nu = site_scale * rng.exponential(size=n)
    mu = np.sqrt(nu) * rng.standard_normal(n)
    post = ep.posterior_from_sums(L_K, (A * nu) @ A.T, A @ mu)
    P, d, e = ep.covariance_product(post, A)
    Q = post.L_C_inv @ A
    A_ld = A.astype(np.longdouble)
    C_inv = long_double_inverse(np.eye(m) + (A_ld * nu.astype(np.longdouble)) @ A_ld.T)
    P_ref = C_inv @ A_ld
    d_ref = np.sum(A_ld * P_ref, axis=0)
    e_ref = (A_ld @ mu.astype(np.longdouble)) @ P_ref
    cond = np.linalg.cond(np.eye(m) + (A * nu) @ A.T)
    assert cond > (1e7 if site_scale == 1e6 else 10.0)  # (the last case is the ill-conditioned one)
    bound = 20 * np.finfo(np.float64).eps * np.sqrt(cond)
    for d_of, e_of in ((d, e), (np.sum(Q * Q, axis=0), post.h @ Q)):
        assert np.max(np.abs(d_of - d_ref) / d_ref) < bound
        assert np.max(np.abs(e_of - e_ref)) < bound * np.max(np.abs(e_ref))
    np.testing.assert_allclose(P, np.asarray(P_ref, dtype=np.float64), rtol=0,
                               atol=20 * np.finfo(np.float64).eps * cond * float(np.abs(P_ref).max()))


def test_a_pass_forms_c_inverse_a_only_for_a_float64_gradient(monkeypatch):
    """``ep.covariance_form``: a batch pass forms P = C^-1 A (``ep.covariance_product``) in the place of Q = L_C^-1 A
    only where its gradient goes through the explicit inverses, in float64. A pass without a gradient (the warm-up
    sweeps, the final pass) keeps Q, one triangular product where P is a general one; float32 keeps it, as its
    explicit C^-1 loses 1 - nu_i d_i where a row's own site dominates. Both forms give the same pass to round-off, and
    the gradient's L_C^-T Q by the triangular product where Q is kept."""
    kernel, Z, X, y, nu, mu = _problem(n=1800)
    formed, original = [], ep.covariance_product
    monkeypatch.setattr(ep, "covariance_product", lambda *a, **k: formed.append(1) or original(*a, **k))
    options = dict(jitter=JITTER, block_rows=600, damping=0.5, checked=False, nonnegative_sites=True)
    by_p = ep.evaluate(kernel, Z, X, y, nu, mu, **options)
    assert formed  # (blocks of at most 600 rows, wide: more than 4 rows per inducing point)
    formed.clear()
    without_gradient = ep.evaluate(kernel, Z, X, y, nu, mu, want_grad=False, **options)
    assert not formed
    monkeypatch.setattr(ep, "covariance_form", lambda *args: False)  # (Q, and L_C^-T Q by a triangular product)
    by_q = ep.evaluate(kernel, Z, X, y, nu, mu, **options)
    assert not formed
    _assert_same(by_p, by_q, rtol=1e-10)
    assert float(without_gradient["log_z"]) == pytest.approx(float(by_q["log_z"]), rel=1e-12)
    monkeypatch.undo()
    wide = np.zeros((4, 100))
    assert ep.covariance_form(True, True, wide)
    assert not ep.covariance_form(True, True, wide.astype(np.float32))
    assert not ep.covariance_form(True, False, wide) and not ep.covariance_form(False, True, wide)
