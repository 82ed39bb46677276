"""``backend.weighted_gram``: the weighted sums of outer products that minibatch EP's and SEP's steps add to their
u-space factor (``ep.product_change``, ``ep._block_sums``). On the NumPy fast path, with every weight >= 0, they are
symmetric products (NumPy runs W W^T as BLAS syrk, half the flops); elsewhere the general product. Either way the
same sums, checked here against the outer products added one by one."""

import numpy as np
import pytest
from conftest import to_np, to_xp

from agpc import backend as B
from agpc.inference import ep


def _reference(A, w, Bm=None, v=None):
    """sum_j w_j a_j a_j^T - sum_j v_j b_j b_j^T, one outer product at a time."""
    total = sum(w_j * np.outer(a, a) for a, w_j in zip(A.T, w))
    if Bm is not None:
        total = total - sum(v_j * np.outer(b, b) for b, v_j in zip(Bm.T, v))
    return total


def _problem(seed=0, m=40, k=300):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(m, k)), rng.random(k), rng.normal(size=(m, k)), rng.random(k)


def test_nonnegative_weights_take_the_symmetric_product_on_numpy():
    A, w, Bm, v = _problem()
    general = (A * w[None, :]) @ A.T
    assert not np.array_equal(general, general.T)  # (the general product is not exactly symmetric on these columns)
    one, difference = B.weighted_gram(A, w), B.weighted_gram(A, w, Bm, v)
    assert np.array_equal(one, one.T) and np.array_equal(difference, difference.T)  # (so the symmetric one ran)
    np.testing.assert_allclose(one, _reference(A, w), rtol=0, atol=1e-12 * np.abs(one).max())
    np.testing.assert_allclose(difference, _reference(A, w, Bm, v), rtol=0, atol=1e-12 * np.abs(difference).max())
    with B.reference_paths():  # (the general product: the same sums to round-off)
        np.testing.assert_allclose(B.weighted_gram(A, w, Bm, v), difference, rtol=0,
                                   atol=1e-12 * np.abs(difference).max())


@pytest.mark.parametrize("negative", ["w", "v"])
def test_a_negative_weight_takes_the_general_product(negative):
    A, w, Bm, v = _problem(1)
    (w if negative == "w" else v)[7] = -0.5
    got = B.weighted_gram(A, w, Bm, v)
    np.testing.assert_allclose(got, _reference(A, w, Bm, v), rtol=0, atol=1e-12 * np.abs(got).max())
    if negative == "w":
        got = B.weighted_gram(A, w)
        np.testing.assert_allclose(got, _reference(A, w), rtol=0, atol=1e-12 * np.abs(got).max())


def test_a_nan_weight_is_nan_in_the_sum_not_dropped():
    A, w, Bm, v = _problem(2)
    w[3] = np.nan
    assert np.isnan(B.weighted_gram(A, w)).all()
    assert np.isnan(B.weighted_gram(Bm, v, A, w)).all()


def test_every_namespace_gives_numpys_sums_on_the_inputs_device(xp_device):
    xp, device = xp_device
    A, w, Bm, v = _problem(3, m=12, k=30)
    for args, reference in (((A, w), _reference(A, w)), ((A, w, Bm, v), _reference(A, w, Bm, v))):
        got = B.weighted_gram(*(to_xp(a, xp, device) for a in args))
        if device is not None:
            assert got.device == device
        np.testing.assert_allclose(to_np(got), reference, rtol=0, atol=1e-12 * np.abs(reference).max())


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_change_of_minibatch_eps_product_is_the_sum_of_its_rows_terms(xp_device, held, weighted):
    """``ep.product_change``: sum_i w_i [(rho nu_new + (1 - rho) nu) u_i u_i^T - nu o_i o_i^T] (eq. 25 of
    Hernandez-Lobato & Hernandez-Lobato (2016)), or rho (nu_new - nu) u_i u_i^T where the old site is held along
    u_i itself; and the shifts likewise."""
    xp, device = xp_device
    rng = np.random.default_rng(4)
    m, b, rho = 10, 25, 0.3
    upsilon, omega = rng.normal(size=(m, b)), rng.normal(size=(m, b))
    nu, new_nu, mu, new_mu = rng.random(b), rng.random(b), rng.normal(size=b), rng.normal(size=b)
    weights = rng.random(b) if weighted else np.ones(b)
    if held:
        in_nu, in_mu = rho * new_nu + (1 - rho) * nu, rho * new_mu + (1 - rho) * mu
        P = _reference(upsilon, weights * in_nu, omega, weights * nu)
        r = upsilon @ (weights * in_mu) - omega @ (weights * mu)
    else:
        P = _reference(upsilon, weights * rho * (new_nu - nu))
        r = upsilon @ (weights * rho * (new_mu - mu))

    def put(a):
        return to_xp(a, xp, device)

    got_P, got_r = ep.product_change(put(upsilon), put(omega) if held else None, put(nu), put(mu), put(new_nu),
                                     put(new_mu), rho, put(weights) if weighted else None)
    np.testing.assert_allclose(to_np(got_P), P, rtol=0, atol=1e-12 * np.abs(P).max())
    np.testing.assert_allclose(to_np(got_r), r, rtol=0, atol=1e-12 * np.abs(r).max())
    if held and isinstance(got_P, np.ndarray):  # (NumPy, every weight >= 0: the two symmetric products ran)
        np.testing.assert_array_equal(got_P, got_P.T)
