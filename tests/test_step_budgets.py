"""What one training step costs: array operations, O(m^3) operations and host synchronisations.

One step of each method runs on ``array_counting.CountingNamespace`` over array_api_strict's non-default
device (a stand-in for a GPU: an array that strays to the host device fails there), and its counts are
held to the budgets below. A count above its budget fails with the call sites to look at.

The problem is small and fixed: m = 24 inducing points, minibatches and EP row blocks of 30 rows, d = 3,
n = 90. The row size differs from m so that (30 x m) @ (m x m) products count as ``rows_m2``, not as
O(m^3). Every step is counted after one warm-up step (the optimisers create their state on the first).

Run this file as a script (``PYTHONPATH=. python tests/test_step_budgets.py``) to print each step's
counts with its top operations and call sites.
"""

import contextlib

import array_api_strict
import numpy as np
import pytest
from array_counting import CountingNamespace, check_budget

from agpc.backend import to_numpy
from agpc.inference import engines, ep, tied_steps, training
from agpc.kernels import RBF

# ---------------------------------------------------------------------------------------------------
# THE BUDGETS: the most of each kind that one step may cost (lowered as the algebra got leaner; never raised to
# make a test pass). When the counting test was written (before the lean EP algebra) a SEP step cost 479
# operations, 18 O(m^3) operations and 18 host synchronisations (6 of them from xp.clip), batch EP 14 O(m^3)
# and 16 synchronisations per pass, SVI 442 operations, 13 synchronisations and an upload. Before the lean step
# (whitened SVI, kernel gradients without the X part, K(Z, Z) computed once a step): SEP 377 operations and 10
# O(m^3), EP 406 / 9, ADF 352 / 9, SVI 401 / 16 with 4 rows_m2. SVI's whitened q moved work from O(m^3) products
# to O(rows m^2) ones (m3 16 -> 4, rows_m2 4 -> 6: the rows' products with L_w and L_K^-T, which the u-space form
# had folded into m x m inverses); its budget for rows_m2 was raised with that change of algorithm, the two kinds
# together halved (20 -> 10). SVI's Cholesky adjoint then took the lower triangle of sum dA A^T for that of
# L_K^T tril(L_K^-T dA A^T), equal in exact arithmetic (``variational.SVIBoundTerms``): the rows add S = A G A^T, one
# symmetric product, where they made two general products, and a step makes S L_w and L_w (L_w^T S) where it made
# L_K^T tril(.): rows_m2 6 -> 5, m3 4 -> 5 (at b rows, 4 m^2 b + m^3 flops -> m^2 b + 2 m^3: 3 m^3 where there were
# 5 at b = m), and 295 -> 303 operations (the negated sums, the outer product m_w (A g_m)^T, the two products' views).
# That is the step counted here, whose 30 rows are at least m / 2; a narrower minibatch (fewer than m / 2 rows, e.g.
# 200 rows at m > 400) keeps d L_w's product with its rows: m3 4, rows_m2 6, one more operation.
#   op              array operations, with agpc.backend's standard-only log Phi (``GENERIC_FALLBACKS``)
#                   counted as the one operation it is on NumPy and CuPy
#   m3              O(m^3) operations: factorisations, inverses (solves with >= m right-hand sides),
#                   products whose three dimensions are >= m
#   rows_m2         O(rows m^2) products and solves: (30 x m) @ (m x m) and the like
#   host            device-to-host conversions (float, bool, int, .item(), __array__, ...)
#   data_dependent  data-dependent shapes: boolean masks (xp.clip on CuPy makes two), nonzero, unique_*
#   syncs           host + data_dependent: what stalls a GPU
#   upload          arrays made from host data during the step
# Rows: one minibatch step (Trainer.step) of SEP / EP / ADF / SVI; "batch_ep" one
# ep.evaluate pass with its gradient over three row blocks and the one float(log Z_q) the loop reads;
# "batch_ep_step" one batch EP iteration of the training loop (Trainer.step: that pass, the site-change
# test, the Rprop step). The counts do not depend on m or the batch size, only on the number of row blocks.
# Blocks of 30 rows are narrow (fewer than 4 rows per inducing point): the passes take triangular solves. A
# batch pass's own blocks are wide (about 10^4 rows): "batch_ep_wide" is the same pass as "batch_ep" over three
# blocks of 100 rows, which take the fused sweep's explicit inverses and triangular products (ep.batch_block_pass;
# counted with 100 as the row size). It was added with that sweep (768 operations, 5 host reads). The merge of that
# sweep with the lean step lowered every row to its count: the kernel's gradient reads a block of K(X, Z) by one
# product with the inputs augmented (and RBF's takes dK K once, for the amplitude and for r^2's adjoint), the
# checked Cholesky factorisations read the host once each instead of twice (batch EP passes: 5 -> 3 host reads).
# The latent noise's lower bound (``optim.bounded_step``) costs one operation a step (the clip) for Adadelta and Adam
# and four for Rprop (the clip and the projection of the noise's gradient); the minibatch rows include it.
# "ep_anchored" is minibatch EP's step in every epoch after the first, where its rows' sites leave the running product
# along the directions they went in along (``ep.Anchor``, issue 39): the rows' held directions and q along them
# (K(Z_a, X), one product with the anchor's K^-1, L_K^T, a solve with L_C: rows_m2 5 -> 7), their cavities and the
# product's change as one (m x 2b) (2b x m) product (m3 9 -> 10 here, as 2b >= m). Its budget is its count when it
# was written (397 operations, 8 rows_m2, 20 BLAS calls), lowered as the anchor's K^-1 replaced its two triangular
# products (395, 7, 18); the first epoch's step ("ep") got 2 operations cheaper with it (the factor of 1 in
# ``ep.Factor.combine`` takes none).
# ADF's row terms of log Z_q gained the removal term of each row's new site (``sites.adf_removal_terms``: without it
# ADF's log Z_q was no estimate of the evidence, positive and unbounded on a multiclass model): ten operations a
# step, 298 -> 308, a change of what the step computes, not a cost found elsewhere.
# SEP / ADF's minibatch step carries its tied factor to the inducing points it moved (``ep.moved_factor``, issue 39:
# held in u-space, the factor described the old points and q lost what it held): a change of algorithm, which raised
# their budgets from 323 / 308 operations and 10 / 9 O(m^3) to 411 / 396 and 24 / 23 (the factor whitened at both
# ends, two factorisations, four triangular solves, two products, one inverse), and the NumPy fast path's calls
# from 20 / 16 to 33 / 29. (One thread, NumPy: +27% a step at m = 200, +81% at m = 500.)
# Since SEP / ADF move Z once every ``tied_steps.TIED_INDUCING_EVERY`` steps, their other steps hold Z and carry nothing:
# "sep" / "adf" count such a step (310 / 295 operations, 10 / 9 O(m^3)), "sep_moving" / "adf_moving" the step that
# moves Z and carries the factor (408 / 393, 24 / 23: the budgets of the former step, 411 / 396, at their count).
# A wide block of a pass with a gradient forms P = C^-1 A by one general product with q's explicit C^-1 where
# Q = L_C^-1 A and the gradient's L_C^-T Q were two triangular products (``ep.covariance_product``, float64):
# "batch_ep_wide" 702 -> 696 operations, rows_m2 18 -> 15 (its budget 705 / 18 at its count).
# Distances are centred on each column's lower median of the inducing points where they were centred on their mean
# (``kernels._middle``, a hostile-input audit: one inducing point of 1e154 moved the mean 1e153 from the others, whose
# distances lost every digit, and the model predicted one probability for every input): a sort and the row taken
# from it where the mean was one operation, one more each time a step centres; and K(Z, Z)'s gradient leaves out its
# diagonal (its expanded terms cancel only in exact arithmetic, and a far point's took the others' with them): four
# operations. A change of what the step computes, not a cost found elsewhere: sep 310 -> 316, sep_moving 408 -> 418,
# ep 350 -> 358, ep_anchored 395 -> 404, adf 295 -> 301, adf_moving 393 -> 403, svi 303 -> 311, batch_ep 700 -> 701,
# batch_ep_step 759 -> 760, batch_ep_wide 696 -> 700 (each budget its count).
# A value-scaling log (the amplitude's, the latent noise's) stepped past the largest log of its dtype is NaN
# (``optim.bounded_step``, a careless-input audit: Adam at learning_rate=1e3 stepped a latent noise's log to 767, a
# flat state of log Z n log(1/2) that the guard took, and the fit ended with NaN probabilities): a comparison and a
# ``where`` for each, four operations a step. A change of what the step computes: sep 316 -> 320, sep_moving
# 418 -> 422, ep 358 -> 362, ep_anchored 404 -> 408, adf 301 -> 305, adf_moving 403 -> 407, svi 311 -> 315,
# batch_ep_step 760 -> 764 (each budget its count).
# The probit's N(z) / Phi(z) is one erfcx (``backend.inverse_mills_ratio``; here its standard-only fallback, folded as
# one operation like log Phi's) where it was exp(log N(z) - log Phi(z)), five operations; the exponent's round-off,
# eps |log Phi|, had left EP's gamma no digit at z = -1e4. Three operations fewer for each block of rows: sep 320 ->
# 317, sep_moving 422 -> 419, ep 362 -> 359, ep_anchored 408 -> 405, adf 305 -> 302, adf_moving 407 -> 404, batch_ep
# 701 -> 692, batch_ep_step 764 -> 755, batch_ep_wide 700 -> 691 (each budget its count; SVI's log density unchanged).
STEP_BUDGETS = {
    "sep":           {"op": 317, "m3": 10, "rows_m2": 5, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "sep_moving":    {"op": 419, "m3": 24, "rows_m2": 5, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "ep":            {"op": 359, "m3": 9, "rows_m2": 5, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "ep_anchored":   {"op": 405, "m3": 10, "rows_m2": 7, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "adf":           {"op": 302, "m3": 9, "rows_m2": 5, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "adf_moving":    {"op": 404, "m3": 23, "rows_m2": 5, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "svi":           {"op": 315, "m3": 5, "rows_m2": 5, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "batch_ep":      {"op": 692, "m3": 9, "rows_m2": 15, "host": 3, "data_dependent": 0, "syncs": 3, "upload": 0},
    "batch_ep_step": {"op": 755, "m3": 9, "rows_m2": 15, "host": 1, "data_dependent": 0, "syncs": 1, "upload": 0},
    "batch_ep_wide": {"op": 691, "m3": 10, "rows_m2": 15, "host": 3, "data_dependent": 0, "syncs": 3, "upload": 0},
}
# ---------------------------------------------------------------------------------------------------

GENERIC_FALLBACKS = ("_log_ndtr_generic", "_inverse_mills_generic")  # agpc.backend's standard-only special functions
N_INDUCING, ROWS, N_FEATURES, N_ROWS = 24, 30, 3, 90
WIDE_ROWS = 100  # a wide block: more than 4 rows per inducing point
JITTER = 1e-6
DEVICE = array_api_strict.Device("device1")


def _data(n_rows=N_ROWS):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, N_FEATURES))
    y = np.sign(X @ np.array([1.0, -0.5, 0.3]) + 0.3 * rng.normal(size=n_rows))
    return X, y


def _problem(xp, n_rows=N_ROWS):
    """(X, y, kernel, Z) in namespace ``xp`` on the stand-in device."""
    X_host, y_host = _data(n_rows)
    X = xp.asarray(X_host, device=DEVICE)
    y = xp.asarray(y_host, device=DEVICE)
    kernel = RBF(lengthscales=[1.0] * N_FEATURES, amplitude=1.0, noise=0.01).for_inputs(X)
    return X, y, kernel, X[:N_INDUCING, ...]


def _counting_namespace():
    return CountingNamespace(array_api_strict, m=N_INDUCING, rows=(ROWS,))


def _window(xp):
    """Count on a counting namespace; on any other, do nothing."""
    return xp.counting() if isinstance(xp, CountingNamespace) else contextlib.nullcontext()


def _warmed_up(X, y, engine, method):
    """A trainer of ``engine`` after the warm-up steps before the counted one, and the counted step's rows: one step;
    for "ep_anchored" an exact rebuild and one more; for "sep_moving" / "adf_moving" the steps up to the one that
    moves Z (``tied_steps.TIED_INDUCING_EVERY``: SEP's and ADF's other steps hold Z, and count as "sep" / "adf")."""
    trainer = training.Trainer(engine)
    trainer.step(X, y, 0, ROWS, stepping=True)
    if method == "ep_anchored":
        trainer.rebuild_factor(X, y)
        trainer.step(X, y, ROWS, 2 * ROWS, stepping=True)
        return trainer, (2 * ROWS, 3 * ROWS)
    steps = tied_steps.TIED_INDUCING_EVERY if method.endswith("_moving") else 2
    for k in range(1, steps - 1):
        trainer.step(X, y, k % 3 * ROWS, k % 3 * ROWS + ROWS, stepping=True)
    k = steps - 1
    return trainer, (k % 3 * ROWS, k % 3 * ROWS + ROWS)


def _base_method(method):
    return "ep" if method == "ep_anchored" else method.removesuffix("_moving")


def _check_step_kind(trainer, method, Z_before):
    """The counted step of "sep" / "adf" held Z; that of "sep_moving" / "adf_moving" moved it."""
    if _base_method(method) in ("sep", "adf"):
        moved = trainer.state["Z"] is not Z_before
        assert moved == method.endswith("_moving") and (trainer.state.get("held_inducing") is None) == moved


def minibatch_step(xp, method):
    """One minibatch step of SEP / EP / ADF (``Trainer.step`` with a hyper-parameter step), after the warm-up steps
    of ``_warmed_up``. "ep_anchored": minibatch EP's step after an epoch's end, on rows its site product holds along
    the directions of the rebuild before the last hyper-parameter step (``ep.Anchor``). Returns (tally or None, log
    Z_q estimate, inducing points after the step)."""
    X, y, kernel, Z = _problem(xp)
    trainer, rows = _warmed_up(X, y, engines.make_engine(_base_method(method), kernel, Z, n_total=N_ROWS,
                                                         minibatch=True, jitter=JITTER), method)
    before = trainer.state["Z"]
    with _window(xp) as tally:
        _, _, log_z = trainer.step(X, y, *rows, stepping=True)
    _check_step_kind(trainer, method, before)
    return tally, log_z, trainer.state["Z"]


def batch_ep_iteration(xp, rows=ROWS):
    """One batch EP pass with its gradient (``ep.evaluate``) over three row blocks of ``rows`` rows, damped as
    training damps it, from the sites of one earlier pass, and the one log Z_q the loop reads from it."""
    X, y, kernel, Z = _problem(xp, 3 * rows)
    sites = ep.evaluate(kernel, Z, X, y, ep.zero_sites(3 * rows, Z), ep.zero_sites(3 * rows, Z), jitter=JITTER,
                        block_rows=rows, damping=0.5)
    with _window(xp) as tally:
        result = ep.evaluate(kernel, Z, X, y, sites["site_precision"], sites["site_shift"], jitter=JITTER,
                             want_grad=True, block_rows=rows, damping=0.5)
        log_z = float(result["log_z"])
    return tally, log_z, result["grads"]["Z"]


def batch_ep_step(xp):
    """One batch EP iteration of the training loop (``Trainer.step`` in batch mode, row blocks of 30,
    Rprop), after one warm-up iteration: ``ep.evaluate`` plus the loop's own reads and the step."""
    X, y, kernel, Z = _problem(xp)
    trainer = training.Trainer(engines.make_engine("ep", kernel, Z, n_total=N_ROWS, minibatch=False, jitter=JITTER,
                                                   block_rows=ROWS))
    trainer.step(X, y, 0, N_ROWS, stepping=True)
    with _window(xp) as tally:
        _, _, log_z = trainer.step(X, y, 0, N_ROWS, stepping=True)
    return tally, log_z, trainer.state["Z"]


def svi_step(xp, monkeypatch):
    """One SVI minibatch step of the training loop (``Trainer.step``, minibatches of 30, Adam), after one
    warm-up step. Returns (tally or None, log Z (the bound's estimate), inducing points after the step)."""
    X, y, kernel, Z = _problem(xp)
    trainer = training.Trainer(engines.make_engine("svi", kernel, Z, n_total=N_ROWS, minibatch=True, jitter=JITTER))
    trainer.step(X, y, 0, ROWS, stepping=True)
    with _window(xp) as tally:
        _, _, log_z = trainer.step(X, y, ROWS, 2 * ROWS, stepping=True)
    return tally, log_z, trainer.state["Z"]


# The NumPy fast path (agpc.backend: BLAS / LAPACK called directly) bypasses the namespace, so the counting
# namespace above counts the reference path only. What the fast path calls is counted here: the BLAS / LAPACK
# routines of one minibatch step on NumPy arrays (``backend.counting_fast_calls``), so that they cannot grow
# unseen either. (Its other NumPy operations are the reference path's, counted above.) SEP / ADF 33 / 29 -> 34 / 30:
# the carry (``posterior.moved_factor``) applies L1^-1 three times by one trtri and trmm's, and the step's L_K^-1
# once, where it made five trsm's (OpenBLAS's trsm runs at a third of trmm's speed: 0.9 ms less a step at m = 200).
# The steps that hold Z (``tied_steps.TIED_INDUCING_EVERY``) make no carry: 20 / 16. (Above order 128, on one OpenBLAS
# thread, the inverses are formed by halves, more calls each: ``backend.inverts_by_halves``; not at this test's m.)
# SVI 9 -> 10: the trmm of L_w (L_w^T S) above (the rows' S is a NumPy matmul, syrk, not counted here).
FAST_CALL_BUDGETS = {"sep": 20, "sep_moving": 34, "ep": 16, "ep_anchored": 18, "adf": 16, "adf_moving": 30, "svi": 10}


def numpy_step(method):
    """One minibatch step of ``method`` on NumPy arrays after one warm-up step: (Counter of the fast path's
    BLAS / LAPACK calls, log Z estimate)."""
    from array_api_compat import numpy as np_xp

    from agpc import backend

    X_host, y_host = _data()
    X, y = np_xp.asarray(X_host), np_xp.asarray(y_host)
    kernel = RBF(lengthscales=[1.0] * N_FEATURES, amplitude=1.0, noise=0.01).for_inputs(X)
    trainer, rows = _warmed_up(X, y, engines.make_engine(_base_method(method), kernel, X[:N_INDUCING, ...],
                                                         n_total=N_ROWS, minibatch=True, jitter=JITTER), method)
    before = trainer.state["Z"]
    with backend.counting_fast_calls() as calls:
        _, _, log_z = trainer.step(X, y, *rows, stepping=True)
    _check_step_kind(trainer, method, before)
    return calls, log_z


def _budget_counts(tally):
    return tally.folded(GENERIC_FALLBACKS).counts()


def _check(tally, method):
    check_budget(tally.folded(GENERIC_FALLBACKS), STEP_BUDGETS[method], label=f"one {method} step")


def _assert_same_as_plain_strict(counted, plain):
    """The counting namespace changes nothing: bit for bit the numbers of plain array_api_strict."""
    _, log_z, Z = counted
    _, log_z_plain, Z_plain = plain
    assert log_z == log_z_plain and np.isfinite(log_z)
    np.testing.assert_array_equal(to_numpy(Z), to_numpy(Z_plain))


@pytest.mark.parametrize("method", ["sep", "sep_moving", "ep", "ep_anchored", "adf", "adf_moving"])
def test_minibatch_step_is_within_budget(method):
    counted = minibatch_step(_counting_namespace(), method)
    _assert_same_as_plain_strict(counted, minibatch_step(array_api_strict, method))
    _check(counted[0], method)


@pytest.mark.parametrize("method", ["sep", "sep_moving", "ep", "ep_anchored", "adf", "adf_moving", "svi"])
def test_the_numpy_fast_path_of_a_step_is_within_budget(method):
    calls, log_z = numpy_step(method)
    assert np.isfinite(log_z)
    total = sum(calls.values())
    assert 0 < total <= FAST_CALL_BUDGETS[method], f"one {method} step on NumPy: {total} BLAS / LAPACK calls > " \
        f"{FAST_CALL_BUDGETS[method]}: {dict(calls)}"


def test_one_extra_blas_call_in_a_step_breaks_the_fast_path_budget(monkeypatch):
    """The fast path's count cannot silently stop working: one more triangular inverse inside the step (here
    in the kernel's Kdiag) is counted, and the step's own count as the budget fails."""
    from agpc import backend

    calls, _ = numpy_step("sep")
    original = RBF.Kdiag

    def kdiag_with_an_inverse(self, X):
        backend.lower_triangular_inverse(np.eye(3))  # the extra LAPACK call
        return original(self, X)

    monkeypatch.setattr(RBF, "Kdiag", kdiag_with_an_inverse)
    patched, _ = numpy_step("sep")
    assert sum(patched.values()) > sum(calls.values())
    assert patched["dtrtri"] > calls["dtrtri"]


def test_svi_step_is_within_budget(monkeypatch):
    counted = svi_step(_counting_namespace(), monkeypatch)
    _assert_same_as_plain_strict(counted, svi_step(array_api_strict, monkeypatch))
    _check(counted[0], "svi")


# budget -> (the counting namespace, the batch EP work counted in it)
BATCH_EP_WORK = {
    "batch_ep": (_counting_namespace, batch_ep_iteration),  # one iteration
    "batch_ep_wide": (lambda: CountingNamespace(array_api_strict, m=N_INDUCING, rows=(WIDE_ROWS,)),  # wide blocks
                      lambda xp: batch_ep_iteration(xp, WIDE_ROWS)),
    "batch_ep_step": (_counting_namespace, batch_ep_step),  # one step of the training loop
}


@pytest.mark.parametrize("budget", list(BATCH_EP_WORK))
def test_batch_ep_is_within_budget(budget):
    namespace, work = BATCH_EP_WORK[budget]
    counted = work(namespace())
    _assert_same_as_plain_strict(counted, work(array_api_strict))
    _check(counted[0], budget)


def test_one_extra_float_in_a_step_breaks_the_host_budget(monkeypatch):
    """The counting cannot silently stop working: one more float() of a device scalar inside agpc's step
    (here in the kernel's Kdiag) is counted where it happens, and a budget at the step's own count fails."""
    xp = _counting_namespace()
    tally, _, _ = minibatch_step(xp, "sep")
    original, counted_calls = RBF.Kdiag, []

    def kdiag_with_a_float(self, X):
        float(self.amplitude)  # the extra host round trip
        if xp.tally is not None:
            counted_calls.append(1)
        return original(self, X)

    monkeypatch.setattr(RBF, "Kdiag", kdiag_with_a_float)
    patched, _, _ = minibatch_step(xp, "sep")
    assert len(counted_calls) >= 1
    assert patched.count("host") == tally.count("host") + len(counted_calls)
    assert patched.by_site("host")[_site_of(kdiag_with_a_float, "float(self.amplitude)")] == len(counted_calls)
    check_budget(tally, {"host": tally.count("host")})
    with pytest.raises(AssertionError, match=r"host \d+ > \d+"):
        check_budget(patched, {"host": tally.count("host")}, label="one sep step")


def _site_of(function, text):
    """"tests/test_step_budgets.py:LINE name" of the line of ``function`` that contains ``text``."""
    import inspect

    lines, first = inspect.getsourcelines(function)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"tests/test_step_budgets.py:{first + offset} {function.__name__}"


if __name__ == "__main__":
    monkeypatch = pytest.MonkeyPatch()
    runs = {method: minibatch_step(_counting_namespace(), method)[0]
            for method in ("sep", "sep_moving", "ep", "ep_anchored", "adf", "adf_moving")}
    runs["svi"] = svi_step(_counting_namespace(), monkeypatch)[0]
    runs["batch_ep"] = batch_ep_iteration(_counting_namespace())[0]
    runs["batch_ep_step"] = batch_ep_step(_counting_namespace())[0]
    runs["batch_ep_wide"] = batch_ep_iteration(CountingNamespace(array_api_strict, m=N_INDUCING, rows=(WIDE_ROWS,)),
                                               WIDE_ROWS)[0]
    monkeypatch.undo()
    for method, tally in runs.items():
        print(f"== {method}: {_budget_counts(tally)}")
        print(tally.folded(GENERIC_FALLBACKS).report(top=10))
    for method in FAST_CALL_BUDGETS:
        calls, _ = numpy_step(method)
        print(f"== {method} on NumPy: {sum(calls.values())} BLAS / LAPACK calls: {dict(sorted(calls.items()))}")
