"""Binary expectation propagation with inducing points (seed 000, sec. 2.2-2.3 and Appendix A).

Matrix-only formulation (DESIGN.md). Prior p(u) = N(0, K) on the m inducing values, K = Kmm + jitter I.
Site i acts on g_i = upsilon_i^T u with upsilon_i = K^-1 k_i (seed 000 eq. 2) and is stored as two numbers,
``site_precision`` nu_i and ``site_shift`` mu_i (precision times mean). With

    B = K + Knm^T diag(nu) Knm,   c = Knm^T mu,

q(u) = N(K B^-1 c, K B^-1 K) (seed 000 eqs. 12-13). For conditioning we never form B: with L_K = chol(K)
and A = L_K^-1 Knm^T (m x n), B = L_K C L_K^T where C = I + A diag(nu) A^T, and c~ = L_K^-1 c = A mu.
C and c~ are sums over rows (the distributed reduction). Per datum EP needs only

    d_i = k_i^T B^-1 k_i,  e_i = k_i^T B^-1 c,  s_i = K_ii - k_i^T K^-1 k_i,

column norms and dot products of Q = L_C^-1 A and A: O(n m^2), all matrix products.

Everything here is written against the array API: the functions take arrays and find their namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..backend import (
    CholeskyError,
    array_device,
    array_namespace,
    cholesky,
    is_out_of_core,
    read_rows,
    solve_triangular,
)
from ..likelihoods import probit_tilted

__all__ = [
    "Factor",
    "evaluate_factor",
    "exact_factor",
    "posterior_from_factor",
    "Posterior",
    "prior_cholesky",
    "project",
    "site_sums",
    "posterior_from_sums",
    "block_pass",
    "evaluate",
    "sweep_rows",
    "predict_latent",
]

# A site whose cavity variance v_i = d_i / (1 - nu_i d_i) is not positive (1 - nu_i d_i below this) is
# skipped for the round: its old parameters are kept and it adds nothing to log Z_q or the gradient.
_CAVITY_EPS = 1e-10
_PRIOR_SLACK = 1e-6  # relative round-off allowed when comparing a cavity variance with the prior's


def _triangular_inverse(L):
    xp = array_namespace(L)
    eye = xp.eye(L.shape[0], dtype=L.dtype, device=array_device(L))
    return solve_triangular(L, eye, lower=True)


@dataclass
class Posterior:
    """q(u) in factored form: L_K = chol(Kmm + jitter I), L_C = chol(I + A diag(nu) A^T), h = L_C^-1 A mu.

    The inverses of the two m x m triangular factors are kept: applying them to n x m blocks is a
    matrix product, several times faster than a triangular solve with n right-hand sides (trsm) on
    common BLAS builds and on GPUs, at O(m^3) once per pass.
    """

    L_K: object
    L_C: object
    h: object
    L_K_inv: object = None
    L_C_inv: object = None

    def __post_init__(self):
        if self.L_K_inv is None:
            self.L_K_inv = _triangular_inverse(self.L_K)
        if self.L_C_inv is None:
            self.L_C_inv = _triangular_inverse(self.L_C)

    @cached_property
    def whitened_mean(self):
        """C^-1 c~ = L_C^-T h: k_i^T B^-1 c = (L_K^-1 k_i)^T whitened_mean."""
        return self.L_C_inv.mT @ self.h

    @cached_property
    def C_inv(self):
        """C^-1 = L_C^-T L_C^-1 (m x m): k_i^T B^-1 k_j = (L_K^-1 k_i)^T C^-1 (L_K^-1 k_j)."""
        return self.L_C_inv.mT @ self.L_C_inv

    @cached_property
    def beta(self):
        """beta = B^-1 c = L_K^-T L_C^-T h (m,): the predictive mean is k_*^T beta (seed 000 eq. 36)."""
        return self.L_K_inv.mT @ self.whitened_mean

    def mean_and_cov(self):
        """Mean K B^-1 c and covariance K B^-1 K of q(u) (seed 000 eqs. 12-13), for inspection."""
        W = self.L_C_inv @ self.L_K.mT  # Sigma = W^T W
        return self.L_K @ (self.L_C_inv.mT @ self.h), W.mT @ W


def prior_cholesky(kernel, Z, jitter):
    """L_K = chol(K(Z, Z) + jitter I)."""
    xp = array_namespace(Z)
    m = Z.shape[0]
    Kmm = kernel.K(Z) + jitter * xp.eye(m, dtype=Z.dtype, device=array_device(Z))
    return cholesky(Kmm, what="Kmm (covariance of the inducing points)")


def project(kernel, X, Z, L_K_inv):
    """A^T = Knm L_K^-T (n x m, row i = L_K^-1 k_i) and Knm."""
    Knm = kernel.K(X, Z)
    return Knm @ L_K_inv.mT, Knm


def site_sums(At, site_precision, site_shift):
    """The block's share of C - I = A diag(nu) A^T and of c~ = A mu (A^T = At is n x m)."""
    return (At * site_precision[:, None]).mT @ At, site_shift @ At


def posterior_from_sums(L_K, S, c_tilde, L_K_inv=None):
    """Factor C = I + S and whiten c~: the global O(m^3) step after the reduction."""
    xp = array_namespace(S)
    m = S.shape[0]
    C = xp.eye(m, dtype=S.dtype, device=array_device(S)) + S
    L_C = cholesky(C, what="C = I + A diag(site_precision) A^T (posterior precision)")
    L_C_inv = _triangular_inverse(L_C)
    return Posterior(L_K=L_K, L_C=L_C, h=L_C_inv @ c_tilde, L_K_inv=L_K_inv, L_C_inv=L_C_inv)


@dataclass
class BlockResult:
    """What one block of rows returns: new sites, its log Z_q terms and its gradient contributions."""

    site_precision: object  # undamped EP update nu_hat (invalid sites keep the old value)
    site_shift: object
    valid: object  # bool mask: cavity variance positive
    log_z_terms: object  # 0-d: sum of the rows' log Z_q terms
    dKmm_data: object  # (m, m) adjoint contribution of the rows' log Z_i
    grads: dict  # kernel gradient of the rows' log Z_i through Knm and Kdiag (incl. "Z")
    sums: tuple = None  # whitened (S_new, c_new, S_old, c_old) of the rows' new and old sites


@dataclass
class Marginals:
    """q's marginal along each row's upsilon_i (seed 000 eqs. 14-16) and what it was computed from."""

    At: object  # (b, m): rows L_K^-1 k_i
    Knm: object  # (b, m)
    P: object  # (b, m): rows C^-1 L_K^-1 k_i, so B^-1 k_i = L_K^-T P_i
    d: object  # k_i^T B^-1 k_i = upsilon_i^T Sigma upsilon_i
    e: object  # k_i^T B^-1 c = upsilon_i^T mean
    prior_var: object  # upsilon_i^T K upsilon_i, the prior variance of g_i
    s: object  # FITC conditional variance K_ii - k_i^T K^-1 k_i (eq. 16), latent noise included


def marginals(kernel, X, Z, post, At=None, Knm=None):
    if At is None:
        At, Knm = project(kernel, X, Z, post.L_K_inv)
    P = At @ post.C_inv
    prior_var = _row_dot(At, At)
    return Marginals(At, Knm, P, _row_dot(At, P), At @ post.whitened_mean, prior_var, kernel.Kdiag(X) - prior_var)


def cavity(site_precision, site_shift, d, e, prior_var):
    """The cavity along upsilon_i after removing a site (nu, mu) from q's marginal (e, d).

    Returns (valid, 1 - nu d, cavity variance v, cavity mean a). A cavity is usable when its variance is
    positive and, since every site precision is non-negative, no wider than the prior's. Both hold
    whenever q and the sites agree; they fail when a site stored in a u-space factor (minibatch EP) was
    computed under older hyper-parameters."""
    xp = array_namespace(d)
    nu, mu = site_precision, site_shift
    one_minus = 1.0 - nu * d
    valid = one_minus > _CAVITY_EPS
    one_minus = xp.where(valid, one_minus, 1.0)
    valid = valid & (d <= (1.0 + _PRIOR_SLACK) * prior_var * one_minus + _CAVITY_EPS)
    v = d / one_minus  # cavity variance of g_i
    a = (e - mu * d) / one_minus  # cavity mean of g_i: v (e/d - mu), without dividing by d
    return valid, one_minus, v, a


def removal_terms(site_precision, site_shift, d, e, one_minus):
    """g(cavity) - g(q) along upsilon_i for a site (nu, mu): a^2/(2v) + log(v)/2 - e^2/(2d) - log(d)/2,
    rewritten without 1/d (the per-site part of eq. 26 besides log Z_i)."""
    xp = array_namespace(d)
    nu, mu = site_precision, site_shift
    return (nu * e * e - 2.0 * mu * e + mu * mu * d) / (2.0 * one_minus) - 0.5 * xp.log(one_minus)


def moment_matched_site(valid, site_precision, site_shift, a, v, alpha, gamma):
    """New site (eq. 23): the tilted marginal along upsilon_i (d log Z / da = alpha, -d^2 log Z / da^2 =
    gamma) divided by the cavity N(a, v); an invalid cavity keeps the old site."""
    xp = array_namespace(a)
    denom = 1.0 - v * gamma
    return xp.where(valid, gamma / denom, site_precision), xp.where(valid, (alpha + a * gamma) / denom, site_shift)


def adjoint_coefficient(alpha, kappa, site_precision, site_shift, e, one_minus):
    """Coefficient of g_i = B^-1 k_i in d log Z_i / d k_i (see ``data_adjoint``): alpha r_i - kappa t_i."""
    return (alpha * (site_precision * e - site_shift) - kappa) / one_minus


def data_adjoint(kernel, X, Z, post, marg, alpha, kappa, coef_g):
    """The data part of the gradient of eq. 4, sum_i d log Z_i / d xi with the cavity q^\\i(u) fixed.

    log Z_i depends on the cavity of g_i = upsilon_i^T u through a = k^T K^-1 m^\\i and b = (noise) + K_ii -
    k^T K^-1 k + k^T K^-1 Sigma^\\i K^-1 k, with alpha = d log Z_i / da and kappa = -2 d log Z_i / db.
    With g_i = B^-1 k_i, beta = B^-1 c:  K^-1 m^\\i = beta + r_i g_i,  K^-1 Sigma^\\i upsilon_i = t_i g_i,
    r_i = (nu e - mu)/(1 - nu d), t_i = 1/(1 - nu d) (``coef_g`` = alpha r - kappa t, summed over the
    sites a row has along upsilon_i). Adjoints:
        dKnm_i = alpha_i beta + coef_g_i g_i + kappa_i upsilon_i,   dKdiag_i = -kappa_i / 2,
        dKmm = -U^T (dKnm + diag(dKdiag) U)   (U rows upsilon_i: K enters through K^-1 k and s).
    In factored form g_i = L_K^-T P_i and upsilon_i = L_K^-T At_i, so with W = diag(coef_g) P +
    diag(kappa) At: dKnm = W L_K^-1 + alpha beta^T and
    dKmm = -L_K^-T [At^T (W + diag(dKdiag) At) L_K^-1 + (At^T alpha) beta^T]: three GEMMs a block.
    Returns (dKmm_data, kernel gradients through Knm and Kdiag incl. "Z")."""
    At = marg.At
    dKdiag = -0.5 * kappa
    beta = post.beta
    W = coef_g[:, None] * marg.P + kappa[:, None] * At
    dKnm = W @ post.L_K_inv + alpha[:, None] * beta[None, :]
    inner = (At.mT @ (W + dKdiag[:, None] * At)) @ post.L_K_inv + (At.mT @ alpha)[:, None] * beta[None, :]
    return -(post.L_K_inv.mT @ inner), kernel.grads(None, dKnm, dKdiag, X, Z, Knm=marg.Knm)


def block_pass(kernel, X, y, site_precision, site_shift, Z, post, *, want_grad=True, At=None, Knm=None, want_sums=False):
    """Cavities, moment matching, log Z_q terms and gradient adjoints for a block of rows.

    Seed 000: cavity (eqs. 14-15), tilted moments and new site (eqs. 17-23), log Z_q terms (eq. 26, in
    the one-dimensional form g(theta^i) - g(theta) along upsilon_i), and the data part of the gradient
    of eq. 4: sum_i d log Z_i / d xi with the cavity q^\\i(u) held fixed.
    """
    xp = array_namespace(X)
    nu, mu = site_precision, site_shift
    marg = marginals(kernel, X, Z, post, At=At, Knm=Knm)
    valid, one_minus, v, a = cavity(nu, mu, marg.d, marg.e, marg.prior_var)
    b = 1.0 + marg.s + v
    log_zi, alpha, gamma = probit_tilted(y, a, b)
    new_nu, new_mu = moment_matched_site(valid, nu, mu, a, v, alpha, gamma)
    terms = log_zi + removal_terms(nu, mu, marg.d, marg.e, one_minus)
    log_z_terms = xp.sum(xp.where(valid, terms, 0.0))
    sums = None
    if want_sums:  # the rows' share of the likelihood factor, before and after (for tied / minibatch updates)
        sums = site_sums(marg.At, new_nu, new_mu) + site_sums(marg.At, nu, mu)
    if not want_grad:
        return BlockResult(new_nu, new_mu, valid, log_z_terms, None, {}, sums)
    alpha = xp.where(valid, alpha, xp.zeros_like(alpha))
    kappa = alpha * a / b  # -2 d log Z_i / d b
    coef_g = adjoint_coefficient(alpha, kappa, nu, mu, marg.e, one_minus)
    dKmm_data, grads = data_adjoint(kernel, X, Z, post, marg, alpha, kappa, coef_g)
    return BlockResult(new_nu, new_mu, valid, log_z_terms, dKmm_data, grads, sums)


def _prior_adjoint(post):
    """-0.5 M of seed 000 eqs. 34-35: M = K^-1 - K^-1 Sigma K^-1 - K^-1 m m^T K^-1 = K^-1 - B^-1 - beta beta^T."""
    W = post.L_C_inv @ post.L_K_inv  # B^-1 = W^T W
    beta = post.beta
    return -0.5 * (post.L_K_inv.mT @ post.L_K_inv - W.mT @ W - beta[:, None] * beta[None, :])


_BLOCK_ELEMENTS = 1 << 21  # default block: ~16 MB of float64 per n x m temporary
_CACHE_ELEMENTS = 1 << 26  # keep the projections of all blocks between the two passes up to ~512 MB


def _row_blocks(n, block_rows, m=None):
    """Row ranges. By default blocks of ~16 MB per n x m temporary: the allocator then reuses the same
    memory block after block (fresh 100+ MB temporaries cost more in page faults than in arithmetic) and
    the working set stays in cache."""
    if not block_rows:
        block_rows = n if m is None else max(1024, _BLOCK_ELEMENTS // max(1, m))
    step = max(1, int(block_rows))
    return [(start, min(n, start + step)) for start in range(0, n, step)]


_IO_ROWS = 65536  # rows read at a time from data on disk: one read, then compute blocks sliced from it


def data_blocks(X, y, block_rows, like):
    """(lo, hi, X rows, y rows or None) over all rows, in the compute blocks of ``_row_blocks``.

    Data on disk are read ``_IO_ROWS`` rows at a time (a zarr chunk is decoded once, not once per compute
    block) and the compute blocks sliced from what was read, so the n x m temporaries stay ~16 MB while
    the reads stay large."""
    n, m = X.shape[0], like.shape[0]
    blocks = _row_blocks(n, block_rows, m)
    if not (is_out_of_core(X) or (y is not None and is_out_of_core(y))):
        for lo, hi in blocks:
            yield lo, hi, read_rows(X, lo, hi, like), (None if y is None else read_rows(y, lo, hi, like))
        return
    step = blocks[0][1] - blocks[0][0]
    io_rows = max(step, _IO_ROWS)
    for io_lo in range(0, n, io_rows):
        io_hi = min(n, io_lo + io_rows)
        X_io = read_rows(X, io_lo, io_hi, like)
        y_io = None if y is None else read_rows(y, io_lo, io_hi, like)
        for lo in range(io_lo, io_hi, step):
            hi = min(io_hi, lo + step)
            yield lo, hi, X_io[lo - io_lo:hi - io_lo, ...], (None if y_io is None else y_io[lo - io_lo:hi - io_lo])


def _row_dot(A, B):
    """Row-wise dot products of two (n, m) blocks, without an n x m temporary."""
    return array_namespace(A, B).linalg.vecdot(A, B, axis=-1)


def _whitened_sums(kernel, Z, X, site_precision, site_shift, L_K_inv, block_rows, keep_projection):
    """S = A diag(nu) A^T and c~ = A mu over all rows (the reduction); with ``keep_projection`` and
    while they fit the cache budget, also every block's (A^T, Knm) for the sweep to reuse."""
    n, m = X.shape[0], Z.shape[0]
    keep = keep_projection and n * m * 2 <= _CACHE_ELEMENTS
    S = c_tilde = None
    kept = [] if keep else None
    for lo, hi, X_block, _ in data_blocks(X, None, block_rows, Z):
        At, Knm = project(kernel, X_block, Z, L_K_inv)
        S_b, c_b = site_sums(At, site_precision[lo:hi], site_shift[lo:hi])
        S = S_b if S is None else S + S_b
        c_tilde = c_b if c_tilde is None else c_tilde + c_b
        if keep:
            kept.append((At, Knm))
    return S, c_tilde, kept


def write_block_sites(out, lo, hi, block, old_precision, old_shift, damping):
    """Write a block's new sites into the sweep's per-row output; with ``damping`` (rho, seed 000 eq. 25)
    the damped rho * new + (1 - rho) * old, and the block's largest |change| and |old value| go into
    ``out["site_change"]`` (reduced by maximum, see ``relative_site_change``). Damping here, block by block,
    means an undamped n-vector is never held next to the old and the new sites."""
    xp = array_namespace(old_precision)
    new_precision, new_shift = block.site_precision, block.site_shift
    if damping is not None:
        new_precision = damping * new_precision + (1.0 - damping) * old_precision
        new_shift = damping * new_shift + (1.0 - damping) * old_shift
        change = xp.stack([xp.max(xp.abs(new_precision - old_precision)), xp.max(xp.abs(old_precision)),
                           xp.max(xp.abs(new_shift - old_shift)), xp.max(xp.abs(old_shift))])
        out["site_change"] = change if out.get("site_change") is None else xp.maximum(out["site_change"], change)
    index = (slice(lo, hi),) + (...,) * (old_precision.ndim > 1)
    out["site_precision"][index] = new_precision
    out["site_shift"][index] = new_shift
    out["valid"][index] = block.valid


def relative_site_change(change):
    """max|new - old| / (1 + max|old|) of the precisions plus the same of the shifts, from the maxima
    ``write_block_sites`` kept (the measure batch training stops on)."""
    return float(change[0]) / (1.0 + float(change[1])) + float(change[2]) / (1.0 + float(change[3]))


def sweep_rows(X, y, site_precision, site_shift, block_step, *, block_rows, like, want_grad, want_sums=False,
               want_sites=True, damping=None, valid_columns=None):
    """The one EP sweep, for binary EP, multiclass EP and GFITC: ``block_step(index, X rows, y rows, the rows'
    site_precision, the rows' site_shift)`` (a ``BlockResult``) over all rows in the blocks of ``data_blocks``;
    the per-row results written into preallocated arrays (no per-block pieces joined at the end: that would
    hold them twice), damped when ``damping`` is given (``write_block_sites``), and the reductions added.
    ``want_sites=False`` keeps no per-row output at all (a final log Z pass needs only the sums).
    ``valid_columns``: the validity mask's columns per row (multiclass: one per class), None for one a row."""
    xp = array_namespace(like)
    n = X.shape[0]
    out = {"terms": None, "site_precision": None, "site_shift": None, "valid": None, "n_invalid": 0,
           "sums": None, "dKmm_data": None, "grads": None, "site_change": None}
    if want_sites:
        device = array_device(like)
        out["site_precision"] = xp.empty(site_precision.shape, dtype=like.dtype, device=device)
        out["site_shift"] = xp.empty(site_shift.shape, dtype=like.dtype, device=device)
        out["valid"] = xp.empty((n,) if valid_columns is None else (n, valid_columns), dtype=xp.bool, device=device)
    n_invalid = None
    for index, (lo, hi, X_block, y_block) in enumerate(data_blocks(X, y, block_rows, like)):
        rows = (slice(lo, hi),) + (...,) * (site_precision.ndim > 1)
        old_precision, old_shift = site_precision[rows], site_shift[rows]
        res = block_step(index, X_block, y_block, old_precision, old_shift)
        if want_sites:
            write_block_sites(out, lo, hi, res, old_precision, old_shift, damping)
        invalid = xp.sum(xp.astype(~res.valid, xp.int64))
        n_invalid = invalid if n_invalid is None else n_invalid + invalid
        accumulate(out, res, want_sums=want_sums, want_grad=want_grad)
    out["n_invalid"] = int(n_invalid)
    return out


def _sweep(kernel, Z, X, y, site_precision, site_shift, cavity, *, want_grad, block_rows, At=None, want_sums=False,
           want_sites=True, damping=None):
    """Binary EP's sweep: ``block_pass`` over all rows (``sweep_rows``). ``At``: the blocks' kept (A^T, Knm)
    from ``_whitened_sums``, or None to recompute them."""
    def block_step(index, X_block, y_block, nu, mu):
        kept = At[index] if At else None
        return block_pass(kernel, X_block, y_block, nu, mu, Z, cavity, want_grad=want_grad,
                          At=None if kept is None else kept[0], Knm=None if kept is None else kept[1],
                          want_sums=want_sums)

    return sweep_rows(X, y, site_precision, site_shift, block_step, block_rows=block_rows, like=Z,
                      want_grad=want_grad, want_sums=want_sums, want_sites=want_sites, damping=damping)


def evaluate(kernel, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None, want_sites=True,
             damping=None):
    """Batch EP: one pass over the data at fixed (kernel, Z, sites), q rebuilt exactly from all sites.

    Returns a dict: ``log_z`` (0-d, log Z_q of eq. 26), ``site_precision``/``site_shift`` (the EP
    updates; damped by ``damping`` when given, with ``site_change`` the maxima of ``write_block_sites``),
    ``valid`` (mask), ``grads`` (dict of gradients of eq. 4, incl. "Z") and ``posterior``.
    Rows are processed in blocks of ``block_rows`` so that n x m temporaries stay bounded.
    ``n_invalid`` counts the rows whose cavity was unusable; ``want_sites=False`` returns no per-row
    output (``site_precision``, ``site_shift`` and ``valid`` are None), so a final pass holds no n-vector.

    The three stages -- per-row-block sums (``_whitened_sums``), the driver's q (``posterior_from_sums``),
    the per-row-block sweep (``_sweep``) and the driver's ``finish_evaluate`` -- are what the distributed
    engine runs, the two per-row stages once per chunk of rows on the workers.
    """
    L_K = prior_cholesky(kernel, Z, jitter)
    L_K_inv = _triangular_inverse(L_K)
    S, c_tilde, At = _whitened_sums(kernel, Z, X, site_precision, site_shift, L_K_inv, block_rows, True)
    post = posterior_from_sums(L_K, S, c_tilde, L_K_inv=L_K_inv)
    sweep = _sweep(kernel, Z, X, y, site_precision, site_shift, post, want_grad=want_grad, block_rows=block_rows, At=At,
                   want_sites=want_sites, damping=damping)
    return finish_evaluate(kernel, Z, post, sweep, want_grad)


def finish_evaluate(kernel, Z, post, sweep, want_grad):
    """log Z_q and the full gradient from q and the (reduced) sweep."""
    out = {
        "n_invalid": sweep["n_invalid"],
        "log_z": _log_normaliser_gain(post) + sweep["terms"],
        "site_precision": sweep["site_precision"],
        "site_shift": sweep["site_shift"],
        "valid": sweep["valid"],
        "site_change": sweep.get("site_change"),
        "posterior": post,
        "grads": None,
    }
    if want_grad:
        prior_grads = kernel.grads(_prior_adjoint(post) + sweep["dKmm_data"], None, None, None, Z)
        out["grads"] = {k: sweep["grads"][k] + prior_grads[k] for k in sweep["grads"]}
    return out


def tree_add(x, y):
    """x + y for arrays and for dicts / tuples of them (None stays None)."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: tree_add(x[k], y[k]) for k in x}
    if isinstance(x, tuple):
        return tuple(tree_add(u, v) for u, v in zip(x, y))
    return x + y


def accumulate(out, block, *, want_sums, want_grad):
    """Add one block's reductions (log Z terms, sums, adjoints, gradients) into a sweep's running totals."""
    for key, value, wanted in (("terms", block.log_z_terms, True), ("sums", block.sums, want_sums),
                               ("dKmm_data", block.dKmm_data, want_grad), ("grads", block.grads, want_grad)):
        if wanted:
            out[key] = value if out[key] is None else tree_add(out[key], value)


_PER_ROW_KEYS = ("site_precision", "site_shift", "valid")


def without_rows(sweep):
    """A sweep's result without its per-row outputs (what a chunk sends to be reduced)."""
    return {k: (None if k in _PER_ROW_KEYS else v) for k, v in sweep.items()}


def add_sweeps(a, b):
    """Two chunks' sweep results added (sums, terms, adjoints, counts; the site-change maxima by maximum);
    per-row outputs are dropped: they stay with their chunk."""
    out = {k: (None if k in _PER_ROW_KEYS else tree_add(a[k], b[k])) for k in a if k != "site_change"}
    change = a.get("site_change")
    out["site_change"] = None if change is None else array_namespace(change).maximum(change, b["site_change"])
    return out


# --------------------------------------------------------------------------------------------------
# A likelihood factor held in u-space: SEP's tied factor (seed 002, seed 001 sec. 2.3.1), ADF's, and the
# running product of EP's sites in minibatch mode.


@dataclass
class Factor:
    """Gaussian factor exp(-u^T P u / 2 + u^T r) of the inducing values u: O(m^2) whatever n."""

    precision: object  # P (m, m)
    shift: object  # r (m,)

    @classmethod
    def uniform(cls, m, like):
        xp = array_namespace(like)
        return cls(
            xp.zeros((m, m), dtype=like.dtype, device=array_device(like)),
            xp.zeros((m,), dtype=like.dtype, device=array_device(like)),
        )

    def whitened(self, L_K):
        """S = L_K^T P L_K and c~ = L_K^T r, the form posterior_from_sums takes."""
        return L_K.mT @ self.precision @ L_K, L_K.mT @ self.shift

    @classmethod
    def from_whitened(cls, S, c_tilde, L_K_inv):
        return cls(L_K_inv.mT @ S @ L_K_inv, L_K_inv.mT @ c_tilde)

    def combine(self, keep, other, weight):
        """keep * self + weight * other, in natural parameters."""
        return Factor(keep * self.precision + weight * other.precision, keep * self.shift + weight * other.shift)


def _log_normaliser_gain(post):
    """g(theta) - g(theta_prior) for q = prior x factor: 0.5 c^T B^-1 c + 0.5 log|K| - 0.5 log|B|."""
    xp = array_namespace(post.h)
    return 0.5 * xp.sum(post.h * post.h) - xp.sum(xp.log(xp.linalg.diagonal(post.L_C)))


CAVITY_KINDS = ("ep", "sep", "adf")


def evaluate_factor(
    kernel, Z, X, y, factor, *, method, n_total, site_precision=None, site_shift=None, jitter,
    want_grad=True, block_rows=None,
):
    """One pass over rows X (all the data, or a minibatch) with q = prior x ``factor``.

    The three methods differ only in the cavity (seed 002):
      "ep"  q / site_i: each row's own site, (site_precision, site_shift) along its current upsilon_i;
      "sep" q / factor^(1/n_total): one cavity for every row;
      "adf" q itself.
    Returns a dict: ``log_z`` (estimate of log Z_q: the rows' terms scaled by n_total / rows), ``grads``
    (eq. 4 with the data part scaled likewise: the stochastic gradient of eq. 6), ``site_precision`` /
    ``site_shift`` (undamped updates of the rows' sites), ``new_sites`` and ``old_sites`` (the rows'
    sites as u-space Factors), ``valid`` and ``posterior`` (q). Stages: ``factor_cavity`` (driver),
    ``_sweep`` (per row block; per chunk on workers), ``finish_factor`` (driver).
    """
    prep = factor_cavity(kernel, Z, factor, method=method, n_total=n_total, jitter=jitter)
    if method != "ep":  # the cavity already excludes the factor: the rows' own "old site" is nothing
        site_precision = site_shift = zero_sites(X.shape[0], Z)
    sweep = _sweep(kernel, Z, X, y, site_precision, site_shift, prep["cavity"], want_grad=want_grad,
                   block_rows=block_rows, want_sums=True)
    return finish_factor(kernel, Z, prep, sweep, n_total / X.shape[0], want_grad)


def factor_cavity(kernel, Z, factor, *, method, n_total, jitter):
    """q = prior x factor, the cavity every row's update starts from, and log Z_q's global part."""
    if method not in CAVITY_KINDS:
        raise ValueError(f"unknown EP variant {method!r}")
    L_K = prior_cholesky(kernel, Z, jitter)
    L_K_inv = _triangular_inverse(L_K)
    S, c_tilde = factor.whitened(L_K)
    q = posterior_from_sums(L_K, S, c_tilde, L_K_inv=L_K_inv)
    log_z = _log_normaliser_gain(q)
    if method == "sep":
        # SEP's log Z_q: g(q) - g(prior) + sum_i log Z_i + n (g(cavity) - g(q))
        keep = 1.0 - 1.0 / n_total
        cavity = posterior_from_sums(L_K, keep * S, keep * c_tilde, L_K_inv=L_K_inv)
        log_z = log_z + n_total * (_log_normaliser_gain(cavity) - _log_normaliser_gain(q))
    else:
        cavity = q
    return {"q": q, "cavity": cavity, "log_z": log_z, "L_K_inv": L_K_inv}


def finish_factor(kernel, Z, prep, sweep, scale, want_grad):
    """The factor pass's results from the (reduced) sweep; ``scale`` = n_total / rows."""
    sums, q, L_K_inv = sweep["sums"], prep["q"], prep["L_K_inv"]
    out = {
        "log_z": prep["log_z"] + scale * sweep["terms"],
        "site_precision": sweep["site_precision"],
        "site_shift": sweep["site_shift"],
        "valid": sweep["valid"],
        "n_invalid": sweep["n_invalid"],
        "new_sites": Factor.from_whitened(sums[0], sums[1], L_K_inv),
        "old_sites": Factor.from_whitened(sums[2], sums[3], L_K_inv),
        "posterior": q,
        "grads": None,
    }
    if want_grad:
        prior_grads = kernel.grads(_prior_adjoint(q) + scale * sweep["dKmm_data"], None, None, None, Z)
        out["grads"] = {k: scale * sweep["grads"][k] + prior_grads[k] for k in sweep["grads"]}
    return out


def exact_factor(kernel, Z, X, site_precision, site_shift, *, jitter, block_rows=None, y=None):
    """The product of all EP sites at the current hyper-parameters, as a u-space Factor (one pass).
    ``y`` is not needed (a binary site does not depend on the label's position); it is accepted so that
    the multiclass engine, whose sites do, has the same signature."""
    L_K_inv = _triangular_inverse(prior_cholesky(kernel, Z, jitter))
    S, c_tilde, _ = _whitened_sums(kernel, Z, X, site_precision, site_shift, L_K_inv, block_rows, False)
    return Factor.from_whitened(S, c_tilde, L_K_inv)


def posterior_from_factor(kernel, Z, factor, *, jitter):
    L_K = prior_cholesky(kernel, Z, jitter)
    L_K_inv = _triangular_inverse(L_K)
    S, c_tilde = factor.whitened(L_K)
    return posterior_from_sums(L_K, S, c_tilde, L_K_inv=L_K_inv)


def predict_latent(kernel, Z, post, X, block_rows=None):
    """Mean and variance of f(x) under q (seed 000 eq. 36), variance including the latent noise."""
    xp = array_namespace(Z)
    beta = post.beta
    means, variances = [], []
    for _, _, X_block, _ in data_blocks(X, None, block_rows, Z):
        At, Knm = project(kernel, X_block, Z, post.L_K_inv)
        Qt = At @ post.L_C_inv.mT
        means.append(Knm @ beta)
        variances.append(kernel.Kdiag(X_block) - _row_dot(At, At) + _row_dot(Qt, Qt))
    if len(means) == 1:
        return means[0], variances[0]
    return xp.concat(means), xp.concat(variances)




# -- what the training loop needs besides the passes (the multiclass engine has the same functions) ---

def zero_sites(n, Z):
    xp = array_namespace(Z)
    return xp.zeros((n,), dtype=Z.dtype, device=array_device(Z))


def uniform_factor(Z):
    return Factor.uniform(Z.shape[0], Z)


def validation_scores(kernel, Z, post, X_val, y_val):
    """Test NLL and error of q on (X_val, y_val in {-1, +1}) (seed 000 eq. 37)."""
    from ..likelihoods import probit_predictive_log

    xp = array_namespace(Z)
    mean, var = predict_latent(kernel, Z, post, X_val)
    log_pos, log_neg = probit_predictive_log(mean, var)
    log_p = xp.where(y_val > 0, log_pos, log_neg)
    return float(-xp.mean(log_p)), float(xp.mean(xp.astype((mean > 0) != (y_val > 0), mean.dtype)))
