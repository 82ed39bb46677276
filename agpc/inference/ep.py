"""Binary expectation propagation with inducing points (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.2-2.3 and
Appendix A).

Matrix-only formulation (DESIGN.md). Prior p(u) = N(0, K) on the m inducing values, K = Kmm + jitter I.
Site i acts on g_i = upsilon_i^T u with upsilon_i = K^-1 k_i (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 2) and is
stored as two numbers, ``site_precision`` nu_i and ``site_shift`` mu_i (precision times mean). With

    B = K + Knm^T diag(nu) Knm,   c = Knm^T mu,

q(u) = N(K B^-1 c, K B^-1 K) (Hernandez-Lobato & Hernandez-Lobato (2016), eqs. 12-13). For conditioning we never form B:
with L_K = chol(K) and A = L_K^-1 Knm^T (m x n), B = L_K C L_K^T where C = I + A diag(nu) A^T, and c~ = L_K^-1 c = A mu.
C and c~ are sums over rows (the distributed reduction). Per datum EP needs only

    d_i = k_i^T B^-1 k_i,  e_i = k_i^T B^-1 c,  s_i = K_ii - k_i^T K^-1 k_i,

column norms and dot products of Q = L_C^-1 A and A (or of P = C^-1 A and A: ``covariance_product``): O(n m^2), all
matrix products.

Everything here is written against the array API: the functions take arrays and find their namespace.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

from ..backend import (
    add_outer,
    array_device,
    array_namespace,
    identity_plus,
    lower_triangular_inverse,
    prefers_inverses,
    row_dot as backend_row_dot,
    scaled_columns,
    triangular_gram,
    triangular_matmul,
    weighted_gram,
)
from ..likelihoods import PROBIT, negative_log_likelihood
from . import blocks, sites
# q(u) and the tied factor (their own module; named here too, as the passes modules' interface the engines call
# through, ``passes.posterior_from_sums`` etc., and for models pickled when they were defined here)
from .posterior import (PRIOR_FACTOR_NAME, Factor, Posterior, covariance_form, covariance_product, left_solve,
                        moved_factor, posterior_from_sums, prior_cholesky, prior_kmm_adjoint, uses_inverse)

__all__ = [
    "Anchor",
    "product_change",
    "Factor",
    "evaluate_factor",
    "exact_factor",
    "anchored_factor",
    "posterior_from_factor",
    "Posterior",
    "prior_cholesky",
    "PRIOR_FACTOR_NAME",
    "project",
    "site_sums",
    "posterior_from_sums",
    "block_pass",
    "evaluate",
    "sweep_rows",
    "binary_sweep",
    "batch_block_pass",
    "batch_sweep",
    "data_kmm_adjoint",
    "explicit_block_gradient",
    "next_site_sums",
    "site_sums_over_rows",
    "prior_kmm_adjoint",
    "predict_latent",
    "moved_factor",
    "row_dot",
]


def project(kernel, X, Z, L_K_inv):
    """A^T = Knm L_K^-T (n x m, row i = L_K^-1 k_i) and Knm, given the explicit inverse of L_K: a triangular product
    (``backend.triangular_matmul``; on NumPy one trmm, 0.7 times a general product's time at m = 100-200)."""
    Knm = kernel.K(X, Z)
    return triangular_matmul(L_K_inv, Knm, trans=True, right=True), Knm


def site_sums(At, site_precision, site_shift, *, nonnegative=False):
    """The block's share of C - I = A diag(nu) A^T and of c~ = A mu (A^T = At is n x m). ``nonnegative``: every
    nu_i >= 0 is known, and C - I is W^T W, W = diag(sqrt nu) A^T, a symmetric product (syrk on NumPy, as in
    ``whitened_site_sums``): in 20 iterations of a default multiclass fit, 0.77-0.83 of the general one's time,
    about 2% of the fit (docs/results.md, "Freed memory kept", at its end)."""
    if not nonnegative:
        return (At * site_precision[:, None]).mT @ At, site_shift @ At
    W = At * array_namespace(At).sqrt(site_precision)[:, None]
    return W.mT @ W, site_shift @ At


def whitened_site_sums(A, site_precision, site_shift, *, nonnegative=False, overwrite=False, out=None):
    """The block's share of C - I = A diag(nu) A^T and of c~ = A mu, for A = L_K^-1 Knm^T (m x n).

    ``nonnegative``: every nu_i >= 0 is known, and C - I is formed as W W^T with W = A diag(sqrt nu), a symmetric
    product (BLAS syrk on NumPy: half the flops of the general product). ``overwrite``: A may be overwritten;
    ``out``: where the scaled copy of A may go (``backend.scratch``)."""
    if not nonnegative:
        return scaled_columns(A, site_precision, out=out) @ A.mT, A @ site_shift
    xp = array_namespace(A)
    c_tilde = A @ site_shift
    root = xp.sqrt(site_precision)
    if overwrite:
        A *= root[None, :]
        W = A
    else:
        W = scaled_columns(A, root, out=out)
    return W @ W.mT, c_tilde


@dataclass
class BlockResult:
    """What one block of rows returns: new sites, its log Z_q terms and its gradient contributions."""

    site_precision: object  # undamped EP update nu_hat (invalid sites keep the old value)
    site_shift: object
    valid: object  # bool mask: cavity variance positive
    log_z_terms: object  # 0-d: sum of the rows' (weighted) log Z_q terms
    n_invalid: object  # 0-d: rows (of positive weight) whose cavity was unusable
    dKmm_data: object  # (m, m) adjoint contribution of the rows' log Z_i
    grads: dict  # kernel gradient of the rows' log Z_i through Knm and Kdiag (incl. "Z")
    sums: tuple = None  # (P, r): the change of the rows' sites (new - old, weighted) as a u-space factor


@dataclass
class Marginals:
    """q's marginal along each row's upsilon_i (Hernandez-Lobato & Hernandez-Lobato (2016), eqs. 14-16) and what it was
    computed from. Blocks are held as columns (m x b): the triangular solves then take the rows as right-hand sides."""

    A: object  # (m, b): columns L_K^-1 k_i
    Knm: object  # (b, m)
    Q: object  # (m, b): columns L_C^-1 L_K^-1 k_i, so d_i = |Q_i|^2 and B^-1 k_i = L_K^-T L_C^-T Q_i
    d: object  # k_i^T B^-1 k_i = upsilon_i^T Sigma upsilon_i
    e: object  # k_i^T B^-1 c = upsilon_i^T mean
    prior_var: object  # upsilon_i^T K upsilon_i, the prior variance of g_i
    s: object  # FITC conditional variance K_ii - k_i^T K^-1 k_i (eq. 16), latent noise included
    P: object = None  # (m, b): C^-1 A, where it is formed in the place of Q (then None: ``multiclass_ep``)


def marginals(kernel, X, Z, post, A=None, Knm=None):
    array_namespace(Z)
    if A is None:
        Knm = kernel.K(X, Z)
        A = post.solve_K(Knm.mT)
    Q = post.solve_C(A)
    prior_var = backend_row_dot(A, A, axis=-2)
    return Marginals(A, Knm, Q, backend_row_dot(Q, Q, axis=-2), post.h @ Q, prior_var, kernel.Kdiag(X) - prior_var)


class Anchor:
    """Where minibatch EP's running site product holds the sites of the rows not visited since its last exact
    rebuild (``exact_factor``): the kernel, Z and L_K = chol(Kmm + jitter I) of that rebuild.

    A row's site (nu_i, mu_i) acts on g_i = upsilon_i^T u with upsilon_i = K^-1 k_i (Hernandez-Lobato &
    Hernandez-Lobato (2016), eq. 2), which moves whenever the kernel or Z do. The rebuild put every site into the
    product along upsilon_i of that moment; a minibatch step that swapped a row's old site out along its *current*
    upsilon_i would leave nu_i (omega omega^T - upsilon upsilon^T) behind, an indefinite residue that piles up as
    the hyper-parameters move and made q improper in the second epoch on the airline data. Instead the old site
    leaves along the direction it went in along, omega_i = upsilon_i at the anchor (``directions``): the product
    stays exactly sum_i nu_i omega_i omega_i^T over each row's held direction, positive semi-definite whatever the
    hyper-parameters do. Every row is visited at most once between two rebuilds (the loop rebuilds at the start of
    each epoch), so the anchor's directions are the held ones of every row a step visits; rows whose sites are
    still zero (the first epoch) need none (``anchor`` None)."""

    def __init__(self, kernel, Z, L_K, jitter, *, L_K_inv=None):
        self.kernel, self.Z, self.L_K, self.jitter = kernel, Z, L_K, float(jitter)
        self._L_K_inv, self._K_inv = L_K_inv, None

    @property
    def L_K_inv(self):
        if self._L_K_inv is None:
            self._L_K_inv = lower_triangular_inverse(self.L_K)
        return self._L_K_inv

    @property
    def K_inv(self):
        """K^-1 = L_K^-T L_K^-1 at the anchor (m x m), formed once (``backend.triangular_gram``: a lauum on NumPy): a
        step's directions are then one general product, which BLAS runs faster than two triangular ones."""
        if self._K_inv is None:
            self._K_inv = triangular_gram(self.L_K_inv)
        return self._K_inv

    def directions(self, X):
        """omega_i = K^-1 k_i at the anchor for the rows X, as columns (m, b), in u-space."""
        return self.K_inv @ self.kernel.K(self.Z, X)

    def __getstate__(self):  # (the inverses are formed again where they are needed)
        return {"kernel": self.kernel, "Z": self.Z, "L_K": self.L_K, "jitter": self.jitter, "_L_K_inv": None,
                "_K_inv": None}


def data_adjoint(kernel, X, Z, post, marg, alpha, kappa, coef_g, *, want_upsilon=False, held=None):
    """The data part of the gradient of eq. 4, sum_i d log Z_i / d xi with the cavity q^\\i(u) fixed.

    log Z_i depends on the cavity of g_i = upsilon_i^T u through a = k^T K^-1 m^\\i and b = (noise) + K_ii -
    k^T K^-1 k + k^T K^-1 Sigma^\\i K^-1 k, with alpha = d log Z_i / da and kappa = -2 d log Z_i / db.
    With g_i = B^-1 k_i, beta = B^-1 c:  K^-1 m^\\i = beta + r_i g_i,  K^-1 Sigma^\\i upsilon_i = t_i g_i,
    r_i = (nu e - mu)/(1 - nu d), t_i = 1/(1 - nu d) (``coef_g`` = alpha r - kappa t, summed over the
    sites a row has along upsilon_i). Adjoints:
        dKnm_i = alpha_i beta + coef_g_i g_i + kappa_i upsilon_i,   dKdiag_i = -kappa_i / 2,
        dKmm = -U^T (dKnm + diag(dKdiag) U)   (U rows upsilon_i: K enters through K^-1 k and s).
    In factored form g_i = L_K^-T L_C^-T Q_i and upsilon_i = L_K^-T A_i, so
        dKnm^T - beta alpha^T = L_K^-T [L_C^-T Q diag(coef_g) + A diag(kappa)]:
    two triangular solves, the second one also giving U^T (its right-hand sides stacked), and one product
    for dKmm. ``held``: (``Held``, its coefficients) for sites held along other directions omega_i
    (``held_adjoint_coefficient``): their g'_i = L_K^-T L_C^-T Q_h,i join the first solve's right-hand sides.
    Returns (dKmm_data, kernel gradients through Knm and Kdiag incl. "Z", U^T or None)."""
    xp = array_namespace(Z)
    A, b = marg.A, marg.A.shape[1]
    dKdiag = -0.5 * kappa
    right = marg.Q * coef_g[None, :]
    if held is not None:
        right = right + held[0].Q * held[1][None, :]
    inner = post.solve_C(right, trans=True, overwrite=True) + A * kappa[None, :]
    solved = post.solve_K(xp.concat([inner, A], axis=1), trans=True, overwrite=True)
    upsilon_t = solved[:, b:]
    dKnm_t = solved[:, :b] + post.beta[:, None] * alpha[None, :]
    dKmm_data = -(upsilon_t @ (dKnm_t + upsilon_t * dKdiag[None, :]).mT)
    grads = kernel.grads(None, dKnm_t.mT, dKdiag, X, Z, Knm=marg.Knm)
    return dKmm_data, grads, (upsilon_t if want_upsilon else None)


def block_pass(kernel, X, y, site_precision, site_shift, Z, post, *, weights=None, want_grad=True, A=None, Knm=None,
               want_sums=False, sample_weights=False, anchor=None, damping=None, adf=False, likelihood=PROBIT):
    """Cavities, moment matching, log Z_q terms and gradient adjoints for a block of rows.

    Hernandez-Lobato & Hernandez-Lobato (2016): cavity (eqs. 14-15), tilted moments and new site (eqs. 17-23), log Z_q
    terms (eq. 26, in the one-dimensional form g(theta^i) - g(theta) along upsilon_i), and the data part of the gradient
    of eq. 4: sum_i d log Z_i / d xi with the cavity q^\\i(u) held fixed.
    ``site_precision`` / ``site_shift`` None: the rows have no site of their own in ``post`` (SEP / ADF:
    ``post`` is already the cavity). ``weights`` (b,): each row's log Z_i, gradient and site change is
    multiplied by its weight (0 for the padding of a minibatch). ``want_sums``: the change of the rows'
    sites, weighted, as a u-space factor: sum_i w_i (new_i - old_i) upsilon_i upsilon_i^T (and the shifts).
    ``sample_weights``: the ``weights`` are sample weights of rows with sites of their own (minibatch EP by power
    EP: ``post`` holds w_i copies of each row's site), whose cavities ``weighted_cavity`` forms.
    ``adf``: the cavity is q itself (ADF): each row's log Z_q term also takes ``adf_removal_terms`` of its new site.
    ``likelihood``: the model's (a ``likelihoods.Likelihood`` with ``site_terms``; taken ``at`` the kernel).

    Minibatch EP (``damping`` given: the rows have sites of their own in ``post``, its running product): ``sums`` is
    then the change of that product, each row's old site out along the direction it is held along and its damped new
    one (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25) in along its current upsilon_i; ``anchor`` (an ``Anchor``,
    or None where the rows' sites went in along their current upsilon_i or are zero) gives the held directions, and
    the cavities, log Z_q terms and gradient are those of the sites held there (``held_cavity``).
    """
    xp = array_namespace(Z)
    marg = marginals(kernel, X, Z, post, A=A, Knm=Knm)
    own_sites = site_precision is not None
    nu, mu = (site_precision, site_shift) if own_sites else (0.0, 0.0)
    held = sites.held_marginals(post, marg, anchor.directions(X)) if own_sites and anchor is not None else None
    valid, one_minus, v, a = _block_cavity(marg, nu, mu, held, own_sites, weights if sample_weights else None)
    b = 1.0 + marg.s + v
    likelihood = likelihood.at(kernel)
    site = likelihood.site_terms(y, a, b)
    new_nu, new_mu, terms = _block_update(site, marg, held, (valid, one_minus, v, a), nu, mu, own_sites, adf)
    if weights is not None:
        terms = terms * weights
    log_z_terms = xp.sum(terms)
    n_invalid = sites.counted_invalid(valid, weights, marg.d)
    dKmm_data, grads, upsilon_t = None, {}, None
    if want_grad:
        alpha, kappa = sites.row_adjoints(site, a, b, valid, weights)
        held_term = None
        if held is not None:
            coef_g = -kappa
            held_term = (held, sites.held_adjoint_coefficient(alpha, kappa, nu, mu, held.e, held.cross, one_minus))
        else:
            coef_g = sites.adjoint_coefficient(alpha, kappa, nu, mu, marg.e, one_minus) if own_sites else -kappa
        dKmm_data, grads, upsilon_t = data_adjoint(kernel, X, Z, post, marg, alpha, kappa, coef_g,
                                                   want_upsilon=want_sums, held=held_term)
        sites.add_cut_point_grads(grads, kernel, likelihood, site, valid, weights)
    sums = None
    if want_sums:  # the rows' share of the likelihood factor (for tied / minibatch updates), in u-space
        if upsilon_t is None:
            upsilon_t = post.solve_K(marg.A, trans=True)
        sums = _block_sums(upsilon_t, held, nu, mu, new_nu, new_mu, own_sites, damping, weights)
    return BlockResult(new_nu, new_mu, valid, log_z_terms, n_invalid, dKmm_data, grads, sums)


def _block_update(site, marg, held, cavity, nu, mu, own_sites, adf):
    """``block_pass``'s new sites (eq. 23) and the rows' log Z_q terms (eq. 26; 0 where the cavity is invalid) from
    the rows' ``cavity`` (``_block_cavity``'s valid, 1 - nu d, v, a) and the likelihood's ``site`` terms there; an
    invalid cavity keeps a row's old site. Rows without sites of their own (``own_sites`` False: q is the cavity, SEP
    / ADF) remove nothing: no removal term, and their new sites are zero where the cavity is invalid. ``adf``: each
    row's term also takes ``sites.adf_removal_terms`` of its new site."""
    xp = array_namespace(marg.d)
    valid, one_minus, v, a = cavity
    log_zi, alpha, gamma = site.log_z, site.alpha, site.gamma
    if own_sites:  # (ADF's own sites are zero: a cluster's chunks are given them)
        new_nu, new_mu = sites.moment_matched_site(valid, nu, mu, a, v, alpha, gamma)
        row_terms = log_zi + sites.adf_removal_terms(a, v, alpha, gamma) if adf else log_zi
        # g(cavity) - g(q) of a rank-one removal depends only on q along the direction removed
        d_out, e_out = (marg.d, marg.e) if held is None else (held.d, held.e)
        return new_nu, new_mu, xp.where(valid, row_terms + sites.removal_terms(nu, mu, d_out, e_out, one_minus), 0.0)
    denom = 1.0 - v * gamma
    shift = alpha + a * gamma
    new_nu = xp.where(valid, gamma / denom, 0.0)
    new_mu = xp.where(valid, shift / denom, 0.0)
    row_terms = log_zi + sites.adf_removal_terms(a, v, alpha, gamma, denom, shift) if adf else log_zi
    return new_nu, new_mu, xp.where(valid, row_terms, 0.0)


def _block_cavity(marg, nu, mu, held, own_sites, sample_weights):
    """``block_pass``'s cavities: (valid, 1 - nu d, v, a) of the rows' sites (nu, mu) removed from q's marginals
    ``marg``: along the directions they are held along (``held``, minibatch EP), by power EP for ``sample_weights``
    or as they are; the rows without sites of their own (``own_sites`` False: q is the cavity) remove nothing (the
    same as ``sites.cavity`` with zero sites, fewer operations)."""
    if held is not None:
        return sites.held_cavity(nu, mu, marg.d, marg.e, marg.prior_var, held.d, held.e, held.cross, sample_weights)
    if own_sites:
        return (sites.weighted_cavity(nu, mu, marg.d, marg.e, marg.prior_var, sample_weights)
                if sample_weights is not None else sites.cavity(nu, mu, marg.d, marg.e, marg.prior_var))
    threshold, slack = sites.cavity_tolerances(marg.d)
    return marg.d <= (1.0 + slack) * marg.prior_var + threshold, 1.0, marg.d, marg.e


def _block_sums(upsilon_t, held, nu, mu, new_nu, new_mu, own_sites, damping, weights):
    """``block_pass``'s ``sums``: the change of the rows' sites, weighted, as a u-space factor (minibatch EP's
    damped swap of each row's site along its held and its current direction: ``product_change``)."""
    if own_sites and damping is not None:
        return product_change(upsilon_t, None if held is None else held.omega, nu, mu, new_nu, new_mu, damping,
                              weights)
    change_nu, change_mu = (new_nu - nu, new_mu - mu) if own_sites else (new_nu, new_mu)
    if weights is not None:
        change_nu, change_mu = change_nu * weights, change_mu * weights
    return weighted_gram(upsilon_t, change_nu), upsilon_t @ change_mu


def product_change(upsilon, omega, site_precision, site_shift, new_precision, new_shift, damping, weights=None):
    """The change of minibatch EP's running site product (u-space (P, r)) when the rows' sites (nu, mu), held along
    the columns of ``omega`` (None: along their current upsilon, the columns of ``upsilon``), become the damped
    rho new + (1 - rho) old (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25) along ``upsilon``:

        sum_i w_i [(rho nu_new + (1 - rho) nu) upsilon_i upsilon_i^T - nu omega_i omega_i^T]   (and the shifts),

    ``weights`` w_i (sample weights or a padding's zeros; none: 1). Each row's term removes exactly what the product
    holds of it, so the product stays a sum of rank-one terms of precisions >= 0 (``Anchor``). Where the directions
    differ, a difference of two such sums, else rho (new - old) alone (``backend.weighted_gram``: syrk on NumPy)."""
    if omega is None:
        in_nu, in_mu = damping * (new_precision - site_precision), damping * (new_shift - site_shift)
        if weights is not None:
            in_nu, in_mu = in_nu * weights, in_mu * weights
        return weighted_gram(upsilon, in_nu), upsilon @ in_mu
    in_nu = damping * new_precision + (1.0 - damping) * site_precision
    in_mu = damping * new_shift + (1.0 - damping) * site_shift
    out_nu, out_mu = site_precision, site_shift
    if weights is not None:
        in_nu, in_mu, out_nu, out_mu = in_nu * weights, in_mu * weights, out_nu * weights, out_mu * weights
    return weighted_gram(upsilon, in_nu, omega, out_nu), upsilon @ in_mu - omega @ out_mu


def row_dot(A, B):
    """Row-wise dot products of two (n, m) blocks, without an n x m temporary (``backend.row_dot``: one fused
    reduction on every namespace, CuPy's included)."""
    return backend_row_dot(A, B)


def site_sums_over_rows(kernel, Z, X, site_precision, site_shift, L_K, block_rows, keep_projection, *,
                        nonnegative=False, workers=None):
    """S = A diag(nu) A^T and c~ = A mu over all rows (the reduction); with ``keep_projection`` and
    while they fit the cache budget, also every block's (A, K(Z, X)) (both m x b) for ``batch_sweep`` to reuse.
    (Keeping A alone, the sweep forming K(Z, X) again, did not pay: at n = 10^5, m = 500 the kept arrays' fresh
    pages cost more than A's product saved.) ``nonnegative``: every site precision is known to be >= 0
    (``whitened_site_sums``). Blocks run on the threads of ``blocks.pass_layout`` (``workers`` given: ``block_rows`` is
    already the layout's); their sums are added in order."""
    if workers is None:
        block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)
    keep = keep_projection and blocks.projections_fit(X.shape[0], Z)
    L_K_inv = lower_triangular_inverse(L_K) if uses_inverse(L_K, n_columns=min(X.shape[0], block_rows)) else None
    scratch_arrays = blocks.BlockScratch()

    def block_sums(lo, hi, X_block):
        Kmn = kernel.K(Z, X_block, out=None if keep else scratch_arrays("K", (Z.shape[0], X_block.shape[0]), Z))
        A = left_solve(L_K, Kmn, L_inv=L_K_inv, overwrite=not keep)  # (not kept: in the kernel block's memory)
        S_b, c_b = whitened_site_sums(A, site_precision[lo:hi], site_shift[lo:hi], nonnegative=nonnegative,
                                      overwrite=not keep, out=scratch_arrays("W", A.shape, A) if keep else None)
        return S_b, c_b, ((A, Kmn) if keep else None)

    S = c_tilde = None
    kept = [] if keep else None
    pieces = ((lo, hi, X_block) for lo, hi, X_block, _ in blocks.data_blocks(X, None, block_rows, Z))
    with closing(blocks.map_blocks(block_sums, pieces, workers)) as results:  # (ended on an error too: see map_blocks)
        for _, (S_b, c_b, projection) in results:
            S = S_b if S is None else S + S_b
            c_tilde = c_b if c_tilde is None else c_tilde + c_b
            if keep:
                kept.append(projection)
    return S, c_tilde, kept


def write_block_sites(out, lo, hi, block, old_precision, old_shift, damping):
    """Write a block's new sites into the sweep's per-row output; with ``damping`` (rho, Hernandez-Lobato &
    Hernandez-Lobato (2016), eq. 25) the damped rho * new + (1 - rho) * old, and the block's largest |change| and |old
    value| go into ``out["site_change"]`` (reduced by maximum, see ``relative_site_change``). Damping here, block by
    block, means an undamped n-vector is never held next to the old and the new sites."""
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
               want_sites=True, damping=None, valid_columns=None, workers=1):
    """The one EP sweep, for binary EP, multiclass EP and GFITC: ``block_step(index, lo, hi, X rows, y rows,
    the rows' site_precision, the rows' site_shift)`` (a ``BlockResult``) over all rows in the blocks of
    ``blocks.data_blocks``; the per-row results written into preallocated arrays (no per-block pieces joined at the
    end: that would hold them twice), damped when ``damping`` is given (``write_block_sites``), and the
    reductions added. ``site_precision`` None: the rows have no sites of their own (SEP / ADF; the blocks get
    None). ``want_sites=False`` keeps no per-row output at all (a final log Z pass needs only the sums).
    ``valid_columns``: the validity mask's columns a row (multiclass: one per class), None for one a row.
    ``n_invalid`` stays on the device (0-d): a block step that does not count its own is counted here.
    ``workers``: block steps run at once in Python threads (``blocks.map_blocks``); results are taken in order."""
    xp = array_namespace(like)
    n = X.shape[0]
    out = {"terms": None, "site_precision": None, "site_shift": None, "valid": None, "n_invalid": None,
           "sums": None, "dKmm_data": None, "grads": None, "site_change": None}
    zero_sites_given = site_precision is None
    if zero_sites_given and want_sites:
        site_precision = site_shift = zero_sites(n, like)
    if want_sites:
        device = array_device(like)
        out["site_precision"] = xp.empty(site_precision.shape, dtype=like.dtype, device=device)
        out["site_shift"] = xp.empty(site_shift.shape, dtype=like.dtype, device=device)
        out["valid"] = xp.empty((n,) if valid_columns is None else (n, valid_columns), dtype=xp.bool, device=device)

    def row_index(lo, hi):
        return None if site_precision is None else (slice(lo, hi),) + (...,) * (site_precision.ndim > 1)

    def steps():
        for index, (lo, hi, X_block, y_block) in enumerate(blocks.data_blocks(X, y, block_rows, like)):
            rows = row_index(lo, hi)
            yield (index, lo, hi, X_block, y_block, None if zero_sites_given else site_precision[rows],
                   None if zero_sites_given else site_shift[rows])

    with closing(blocks.map_blocks(block_step, steps(), workers)) as results:  # (ended on an error too: see map_blocks)
        for (_, lo, hi, *_), res in results:
            if want_sites:
                rows = row_index(lo, hi)
                write_block_sites(out, lo, hi, res, site_precision[rows], site_shift[rows], damping)
            if getattr(res, "n_invalid", None) is None:  # (added by ``accumulate`` where the block counts its own)
                invalid = xp.sum(xp.astype(~res.valid, xp.int64))
                out["n_invalid"] = invalid if out["n_invalid"] is None else out["n_invalid"] + invalid
            blocks.accumulate(out, res, want_sums=want_sums, want_grad=want_grad)
    return out


def binary_sweep(kernel, Z, X, y, site_precision, site_shift, cavity, *, want_grad, block_rows, want_sums=False,
                 want_sites=True, damping=None, weights=None, sample_weights=False, anchor=None, product_damping=None,
                 adf=False, likelihood=PROBIT):
    """Binary EP's sweep for a cavity held as a u-space factor (minibatch EP, SEP, ADF): ``block_pass`` over all
    rows (``sweep_rows``). ``site_precision`` None: the rows have no sites of their own (SEP / ADF).
    ``weights``, ``sample_weights``, ``adf``, ``likelihood``: as ``block_pass`` takes them; ``anchor``,
    ``product_damping``: its
    ``anchor`` and ``damping`` (minibatch EP). Batch EP sweeps with ``batch_sweep``."""
    def block_step(index, lo, hi, X_block, y_block, rows_precision, rows_shift):
        return block_pass(kernel, X_block, y_block, rows_precision, rows_shift, Z, cavity, want_grad=want_grad,
                          want_sums=want_sums, weights=None if weights is None else weights[lo:hi],
                          sample_weights=sample_weights, anchor=anchor, damping=product_damping, adf=adf,
                          likelihood=likelihood)

    block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)  # (a minibatch: one thread)
    return sweep_rows(X, y, site_precision, site_shift, block_step, block_rows=block_rows, like=Z,
                      want_grad=want_grad, want_sums=want_sums, want_sites=want_sites, damping=damping,
                      workers=workers)


# --------------------------------------------------------------------------------------------------
# Batch EP: q rebuilt from all sites (one pass, ``site_sums_over_rows``), then one sweep that visits each block
# of rows once for its marginals, new sites, log Z_q terms and gradient adjoints (``batch_block_pass``).


def _kernel_block(kernel, X, Z, post, A, Kmn, work, L_K_inv, want_grad):
    """(K(Z, X), A = L_K^-1 K(Z, X)) of a block, unless given: A in the thread's array (the kernel block stays for
    the gradient), or in the kernel block's."""
    if A is None:
        Kmn = kernel.K(Z, X, out=work("K", (Z.shape[0], X.shape[0]), Z))
        A = left_solve(post.L_K, Kmn, L_inv=L_K_inv, overwrite=True,
                       out=work("A", Kmn.shape, Kmn) if want_grad else None)
    return Kmn, A


def explicit_block_gradient(kernel, X, Z, post, A, QP, Kmn, alpha, kappa, coef_g, work, *, covariance):
    """The data part of the gradient of a batch block, through the explicit inverses of L_K and of C or L_C (the
    wide blocks of a batch pass), from ``QP``: P = C^-1 A = L_C^-T Q (``covariance``: ``covariance_product``) or Q =
    L_C^-1 A. With R = L_C^-T Q diag(coef_g) + A diag(kappa) the adjoint of K(Z, X) is
    dKmn = L_K^-T R + beta alpha^T (``data_adjoint``), and with R' = R - A diag(kappa) / 2::

        dKmm_data = -U^T (dKnm + diag(dKdiag) U) = -L_K^-T [A R'^T + (A alpha) w^T] L_K^-1,

    w = L_C^-T h (``Posterior.whitened_mean``): per block only the m x m product A R'^T and the m-vector
    A alpha, added over blocks; the two triangular products with L_K^-1 come once, after the sum
    (``data_kmm_adjoint``). So ``dKmm_data`` here is the pair (A R'^T, A alpha). QP is overwritten. Valid wherever q
    holds the rows' sites along their current upsilon_i (``data_adjoint`` without ``held``): batch EP's pass, and
    each class of the multiclass one (``multiclass_ep.block_pass``)."""
    QP *= coef_g[None, :]
    # L_C^-T Q diag(coef_g): P diag(coef_g) itself, or one triangular product (in QP's memory)
    R = QP if covariance else left_solve(post.L_C, QP, trans=True, L_inv=post.L_C_inv, overwrite=True)
    half = scaled_columns(A, 0.5 * kappa, out=work("H", A.shape, A))
    R += half  # R'
    dKmm_data = (A @ R.mT, A @ alpha)
    R += half  # R
    dKmn = add_outer(left_solve(post.L_K, R, trans=True, L_inv=post.L_K_inv, overwrite=True), post.beta, alpha)
    return dKmm_data, kernel.grads(None, dKmn.mT, -0.5 * kappa, X, Z, Knm=Kmn.mT, overwrite=True)


def batch_block_pass(kernel, X, y, site_precision, site_shift, Z, post, *, want_grad, want_sums=False, A=None,
                     Kmn=None, nonnegative=False, work=None, explicit=None, weights=None, likelihood=PROBIT):
    """Batch EP's visit of a block of rows whose sites are all in q (``post``, rebuilt from every site).

    What ``block_pass`` computes for rows with sites of their own, in one pass over the block and with
    fewer n x m operations: the kernel block K(Z, X) (m x b, or ``Kmn`` kept from ``site_sums_over_rows``
    with its A), A = L_K^-1 K(Z, X), Q = L_C^-1 A, the marginals (Hernandez-Lobato & Hernandez-Lobato (2016),
    eqs. 14-16: d = |Q_i|^2, e = h^T Q_i, k_i^T K^-1 k_i = |A_i|^2; or, where ``covariance_form``, P = C^-1 A in
    Q's place, d_i = A_i^T P_i, e_i = (L_C^-T h)^T A_i: ``covariance_product``), cavities, moments and new sites
    (eqs. 17-23), the log Z_q terms (eq. 26) and the data part of the gradient (eq. 4, ``data_adjoint``; in factored
    form through the explicit inverses of L_K and C or L_C, ``explicit_block_gradient``, where ``explicit``: by
    default where ``uses_inverse``, i.e. on NumPy, or for more than ``SOLVE_MAX_COLUMNS_PER_M`` rows per
    inducing point; otherwise by triangular solves in ``data_adjoint``'s form, one solve fewer per block, whose
    ``dKmm_data`` is the m x m adjoint).

    A new site precision is never negative (the probit's gamma and 1 - v gamma are positive; round-off deep in a
    tail could leave it a hair below 0, which is cut to 0), so nonnegative sites stay so: ``nonnegative`` (the
    rows' sites are all >= 0) lets ``want_sums`` form the sums of the new sites by a symmetric product.

    ``want_sums``: the whitened sums of the new (undamped) sites, A diag(nu_new) A^T and A mu_new, at this
    pass's hyper-parameters. ``work``: the thread's ``blocks.BlockScratch``; on NumPy the block's n x m arrays live
    there (Q or P, and R, are updated in place) and only the kernel block and the gradient's product with it are
    new.

    ``weights`` (b,): the rows' sample weights, by power EP (``weighted_cavity``; q's sums hold w_i times each
    site): each row's log Z_q term and gradient count w_i times, and the sums of the new sites are weighted.
    ``likelihood``: as ``block_pass`` takes it."""
    xp = array_namespace(Z)
    work = blocks.BlockScratch() if work is None else work
    explicit = uses_inverse(post.L_K, n_columns=X.shape[0]) if explicit is None else explicit
    L_K_inv = post.L_K_inv if explicit else None
    Kmn, A = _kernel_block(kernel, X, Z, post, A, Kmn, work, L_K_inv, want_grad)
    covariance = covariance_form(explicit, want_grad, A)
    if covariance:  # P = C^-1 A in the place of Q (the gradient's L_C^-T Q)
        QP, d, e = covariance_product(post, A, out=work("Q", A.shape, A))
    else:
        QP = left_solve(post.L_C, A, L_inv=post.L_C_inv if explicit else None, out=work("Q", A.shape, A))
        d, e = backend_row_dot(QP, QP, axis=-2), post.h @ QP
    prior_var = backend_row_dot(A, A, axis=-2)
    nu, mu = site_precision, site_shift
    if weights is None:
        valid, one_minus, v, a = sites.cavity(nu, mu, d, e, prior_var)
    else:
        valid, one_minus, v, a = sites.weighted_cavity(nu, mu, d, e, prior_var, weights)
    total_var = 1.0 + (kernel.Kdiag(X) - prior_var) + v  # b_i of eq. 17: probit, FITC variance s_i, cavity
    likelihood = likelihood.at(kernel)
    site = likelihood.site_terms(y, a, total_var)
    new_nu, new_mu = sites.moment_matched_site(valid, nu, mu, a, v, site.alpha, site.gamma, nonnegative=True)
    terms = xp.where(valid, site.log_z + sites.removal_terms(nu, mu, d, e, one_minus), 0.0)
    log_z_terms = xp.sum(terms if weights is None else weights * terms)
    n_invalid = sites.counted_invalid(valid, weights, d)
    dKmm_data, grads = None, {}
    if want_grad:  # (kappa and the adjoint's coefficients follow alpha: each row's term w_i times)
        alpha, kappa = sites.row_adjoints(site, a, total_var, valid, weights)
        coef_g = sites.adjoint_coefficient(alpha, kappa, nu, mu, e, one_minus)
        if explicit:  # (QP is overwritten: it is not needed after this)
            dKmm_data, grads = explicit_block_gradient(kernel, X, Z, post, A, QP, Kmn, alpha, kappa, coef_g, work,
                                                       covariance=covariance)
        else:
            marg = Marginals(A, Kmn.mT, QP, d, e, prior_var, None)
            dKmm_data, grads, _ = data_adjoint(kernel, X, Z, post, marg, alpha, kappa, coef_g)
        sites.add_cut_point_grads(grads, kernel, likelihood, site, valid, weights)
    sums = _new_site_sums(A, new_nu, new_mu, nonnegative, weights) if want_sums else None
    return BlockResult(new_nu, new_mu, valid, log_z_terms, n_invalid, dKmm_data, grads, sums)


def _new_site_sums(A, new_nu, new_mu, nonnegative, weights):
    """The whitened sums of a block's new sites, each w_i times when the rows have sample weights."""
    if weights is None:
        return whitened_site_sums(A, new_nu, new_mu, nonnegative=nonnegative)
    return whitened_site_sums(A, weights * new_nu, weights * new_mu, nonnegative=nonnegative)


def data_kmm_adjoint(post, inner, A_alpha):
    """dKmm_data = -L_K^-T [inner + (A alpha) w^T] L_K^-1 from the blocks' summed (A R'^T, A alpha) of
    ``batch_block_pass`` (w = ``Posterior.whitened_mean``, so that (A alpha) w^T L_K^-1 = (A alpha) beta^T)."""
    inside = inner + A_alpha[:, None] * post.whitened_mean[None, :]
    half = post.solve_K(inside.mT, trans=True, overwrite=True)  # L_K^-T inside^T
    return -post.solve_K(half.mT, trans=True, overwrite=True)


def batch_sweep(kernel, Z, X, y, site_precision, site_shift, post, *, want_grad, block_rows, projections=None,
                want_sites=True, damping=None, want_sums=False, nonnegative=False, workers=None, weights=None,
                likelihood=PROBIT):
    """Batch EP's sweep: ``batch_block_pass`` over all rows (``sweep_rows``: damping, the per-row outputs and
    the reductions; the blocks on the threads of ``blocks.pass_layout``), then the gradient's m x m part
    (``data_kmm_adjoint``). ``projections``: the blocks' kept (A, K(Z, X)) from ``site_sums_over_rows`` (with
    the same ``block_rows``), or None to compute them. Returns ``sweep_rows``' dict, with ``dKmm_data`` the
    data part of the adjoint of Kmm and, with ``want_sums``, ``sums`` the whitened sums of the undamped new
    sites. ``nonnegative``: as ``batch_block_pass`` takes it. ``workers``: as ``site_sums_over_rows`` takes it.
    ``weights``: the rows' sample weights (n,), as ``batch_block_pass`` takes them, or None; ``likelihood``: as it
    takes it."""
    if workers is None:
        block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)
    work = blocks.BlockScratch()
    explicit = uses_inverse(post.L_K, n_columns=min(X.shape[0], block_rows))
    if explicit:  # what the blocks share, formed here once, before any thread needs it (q caches it on first use)
        post.L_K_inv, (post.C_inv, post.whitened_mean) if covariance_form(explicit, want_grad, Z) else post.L_C_inv
    if want_grad:
        post.beta

    def block_step(index, lo, hi, X_block, y_block, rows_precision, rows_shift):
        A, Kmn = projections[index] if projections else (None, None)
        return batch_block_pass(kernel, X_block, y_block, rows_precision, rows_shift, Z, post, want_grad=want_grad,
                                want_sums=want_sums, A=A, Kmn=Kmn, nonnegative=nonnegative, work=work,
                                explicit=explicit, weights=None if weights is None else weights[lo:hi],
                                likelihood=likelihood)

    out = sweep_rows(X, y, site_precision, site_shift, block_step, block_rows=block_rows, like=Z,
                     want_grad=want_grad, want_sums=want_sums, want_sites=want_sites, damping=damping,
                     workers=workers)
    if want_grad and explicit:
        out["dKmm_data"] = data_kmm_adjoint(post, *out["dKmm_data"])
    return out


def evaluate(kernel, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None, want_sites=True,
             damping=None, checked=True, nonnegative_sites=False, site_sums=None, want_next_sums=False, weights=None,
             likelihood=PROBIT):
    """Batch EP: one pass over the data at fixed (kernel, Z, sites), q rebuilt exactly from all sites (``weights``:
    the rows' sample weights by power EP, q holding w_i copies of row i's site: ``batch_block_pass``; ``likelihood``:
    the model's, the probit of Hernandez-Lobato & Hernandez-Lobato (2016) by default: ``block_pass``).

    Returns a dict: ``log_z`` (0-d, log Z_q of eq. 26), ``site_precision``/``site_shift`` (the EP
    updates; damped by ``damping`` when given, with ``site_change`` the maxima of ``write_block_sites``),
    ``valid`` (mask), ``grads`` (dict of gradients of eq. 4, incl. "Z") and ``posterior``.
    Rows are processed in blocks of ``block_rows`` so that n x m temporaries stay bounded.
    ``n_invalid`` (0-d) counts the rows whose cavity was unusable; ``want_sites=False`` returns no per-row
    output (``site_precision``, ``site_shift`` and ``valid`` are None), so a final pass holds no n-vector.
    ``checked=False`` (the training loop): Cholesky failures give a NaN log Z_q instead of an exception
    and no host synchronisation (see ``prior_cholesky``). ``nonnegative_sites``: every site precision is known to
    be >= 0, as the training loop's are (zero at the start, given ones checked, and the sweep keeps them so): S is
    then formed by symmetric products (``whitened_site_sums``); it must not be set for other sites.

    q needs the sums S, c~ of all sites before any row's update, so an iteration visits the rows twice: once for
    the sums (``site_sums_over_rows``), once for everything else (``batch_sweep``). The sums of the *new* sites
    come almost free with the second visit (``want_next_sums``: returned as ``site_sums``, damped as the sites
    are), but they belong to this pass's kernel, Z and jitter: when the next pass runs at the same ones (no step
    on the hyper-parameters in between: the warm-up sweeps, a fit with nothing to learn), passing them back as
    ``site_sums`` skips its first visit and gives the same q. After a step on the hyper-parameters every A_i
    has moved and the sums must be formed again.

    The stages -- per-row-block sums (``site_sums_over_rows``), the driver's q (``posterior_from_sums``),
    the per-row-block sweep (``batch_sweep``) and the driver's ``finish_evaluate`` -- are what the distributed
    engine runs, the two per-row stages once per chunk of rows on the workers.
    """
    block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)  # once: the sweep reuses the sums' projections
    L_K = prior_cholesky(kernel, Z, jitter, checked=checked)
    kept = None
    if site_sums is None:
        in_q = (site_precision, site_shift) if weights is None else (weights * site_precision, weights * site_shift)
        S, c_tilde, kept = site_sums_over_rows(kernel, Z, X, *in_q, L_K, block_rows, True,
                                               nonnegative=nonnegative_sites, workers=workers)
    else:
        S, c_tilde = site_sums
    post = posterior_from_sums(L_K, S, c_tilde, checked=checked)
    sweep = batch_sweep(kernel, Z, X, y, site_precision, site_shift, post, want_grad=want_grad,
                        block_rows=block_rows, projections=kept, want_sites=want_sites, damping=damping,
                        want_sums=want_next_sums, nonnegative=nonnegative_sites, workers=workers, weights=weights,
                        likelihood=likelihood)
    out = finish_evaluate(kernel, Z, post, sweep, want_grad)
    if want_next_sums:
        out["site_sums"] = next_site_sums(sweep["sums"], (S, c_tilde), damping)
    return out


def next_site_sums(new, old, damping):
    """The sums of the damped new sites, rho new + (1 - rho) old (Hernandez-Lobato & Hernandez-Lobato (2016),
    eq. 25), from the sweep's sums of the undamped new sites and the pass's own: the sums are linear in the
    sites."""
    if damping is None:
        return new
    return tuple(damping * n + (1.0 - damping) * o for n, o in zip(new, old))


def finish_evaluate(kernel, Z, post, sweep, want_grad):
    """log Z_q and the full gradient from q and the (reduced) sweep."""
    out = {
        "n_invalid": sweep["n_invalid"],
        "log_z": post.log_normaliser_gain + sweep["terms"],
        "site_precision": sweep["site_precision"],
        "site_shift": sweep["site_shift"],
        "valid": sweep["valid"],
        "site_change": sweep.get("site_change"),
        "posterior": post,
        "grads": None,
    }
    if want_grad:
        prior_grads = kernel.grads(prior_kmm_adjoint(post) + sweep["dKmm_data"], None, None, None, Z)
        out["grads"] = {k: sweep["grads"][k] + prior_grads[k] for k in sweep["grads"]}
    return out


# --------------------------------------------------------------------------------------------------
# A likelihood factor held in u-space: SEP's tied factor (Hernandez-Lobato et al. (2015), Villacampa-Calvo &
# Hernandez-Lobato (2017), sec. 2.3.1), ADF's, and the running product of EP's sites in minibatch mode.


def evaluate_factor(
    kernel, Z, X, y, factor, *, cavity, n_total, site_precision=None, site_shift=None, jitter,
    want_grad=True, block_rows=None, weights=None, checked=True, others=None, factor_rows=None, sample_weights=False,
    anchor=None, damping=None, likelihood=PROBIT,
):
    """One pass over rows X (all the data, or a minibatch) with q = prior x ``factor``.

    The three methods differ only in the cavity (Hernandez-Lobato et al. 2015), ``cavity`` (a ``sites.Cavity``, or
    its name: ``sites.cavity_of``)::

      EP  (own_sites) q / site_i: each row's own site, (site_precision, site_shift) along its current upsilon_i;
      SEP (tied)      q / factor^(1/n_total): one cavity for every row;
      ADF (adf)       q itself (each row's log Z_q term with the removal term of its new site: ``adf_removal_terms``).

    Returns a dict: ``log_z`` (estimate of log Z_q: the rows' terms scaled by n_total / rows, the rows
    counted by their ``weights`` when given), ``grads`` (eq. 4 with the data part scaled likewise: the
    stochastic gradient of eq. 6), ``site_precision`` / ``site_shift`` (undamped updates of the rows'
    sites; EP only), ``site_delta`` (the change of the rows' sites, new - old, as a u-space Factor),
    ``valid``, ``n_invalid`` (0-d) and ``posterior`` (q). ``checked``: as in ``evaluate``. Stages:
    ``factor_cavity`` (driver), ``binary_sweep`` (per row block; per chunk on workers), ``finish_factor`` (driver).

    ``sample_weights``: ``weights`` are minibatch EP's sample weights (``block_pass``); ``likelihood``: the model's
    (``block_pass``).

    ``damping`` (minibatch EP, with its rows' sites): ``product_change`` is then the change of the running site
    product ``factor`` when the rows' sites become their damped updates, each old one taken out along the direction
    it is held along (``anchor``'s, or the current one where None: ``block_pass``); to be added to ``factor`` as it is.

    ``others`` / ``factor_rows``: distributed SEP (Li, Hernandez-Lobato & Turner 2015, sec. 4), one tied
    factor per shard of the data, q = prior x (others + factor): ``factor`` is the shard's (it stands for
    ``factor_rows`` rows), ``others`` the product of the other shards' (see ``factor_cavity``).
    """
    cavity = sites.cavity_of(cavity)
    prep = factor_cavity(kernel, Z, factor, cavity=cavity, n_total=n_total, jitter=jitter, checked=checked,
                         others=others, factor_rows=factor_rows)
    own = cavity.own_sites
    if not own:  # the cavity already excludes the factor: the rows have no site of their own
        site_precision = site_shift = None
    sweep = binary_sweep(kernel, Z, X, y, site_precision, site_shift, prep["cavity"], want_grad=want_grad,
                         block_rows=block_rows, want_sums=True, want_sites=own, weights=weights,
                         sample_weights=sample_weights, anchor=anchor if own else None,
                         product_damping=damping if own else None, adf=cavity.adf, likelihood=likelihood)
    n_rows = X.shape[0] if weights is None else array_namespace(Z).sum(weights)
    out = finish_factor(kernel, Z, prep, sweep, n_total / n_rows, want_grad)
    if own and damping is not None:
        out["product_change"] = out.pop("site_delta")
    return out


def factor_cavity(kernel, Z, factor, *, cavity, n_total, jitter, checked=True, others=None, factor_rows=None):
    """q = prior x factor, the cavity every row's update starts from, and log Z_q's global part.

    Distributed SEP (Li, Hernandez-Lobato & Turner 2015, sec. 4): the data are split in shards, shard k has
    its own tied factor F_k = f_k^(n_k) and q = prior x prod_k F_k. For a row of one shard, ``factor`` is
    its F_k (``factor_rows`` = n_k, default ``n_total``), ``others`` the product of the other shards'
    factors, and the cavity q / F_k^(1 / n_k). log Z_q's global part is then the unbiased estimate of
    g(q) - g(prior) + sum_k n_k (g(cavity_k) - g(q)) from this shard, drawn with probability n_k / n:
    g(q) - g(prior) + n (g(cavity_k) - g(q)), the same formula as with one shard. ``cavity``: a ``sites.Cavity`` or
    its name (``sites.cavity_of``), as ``evaluate_factor`` takes it."""
    tied = sites.cavity_of(cavity).tied
    Kmm = kernel.K(Z)  # (kept for the gradient: ``finish_factor``)
    L_K = prior_cholesky(kernel, Z, jitter, checked=checked, Kmm=Kmm)
    # q and the cavity share L_K: where inverses are preferred, one L_K^-1 for both
    L_K_inv = lower_triangular_inverse(L_K) if prefers_inverses(L_K) else None
    S, c_tilde = factor.whitened(L_K)
    rest = None if others is None else others.whitened(L_K)

    def with_rest(S_part, c_part):  # (no operation at all when the factor is all the data's)
        return (S_part, c_part) if rest is None else (rest[0] + S_part, rest[1] + c_part)

    q = posterior_from_sums(L_K, *with_rest(S, c_tilde), L_K_inv=L_K_inv, checked=checked)
    log_z = q.log_normaliser_gain
    if tied:
        # SEP's log Z_q: g(q) - g(prior) + sum_i log Z_i + n (g(cavity) - g(q))
        keep = 1.0 - 1.0 / (n_total if factor_rows is None else factor_rows)
        if rest is None:  # C = I + keep S, c~ scaled by keep, in one pass each
            cav = posterior_from_sums(L_K, S, c_tilde, L_K_inv=L_K_inv, checked=checked, scale=keep)
        else:
            cav = posterior_from_sums(L_K, *with_rest(keep * S, keep * c_tilde), L_K_inv=L_K_inv, checked=checked)
        if rest is None and factor_rows is None:
            log_z = log_z + sites.sep_cavity_term(q, cav, S, n_total)
        else:  # a shard's cavity: the direct difference (``sep_cavity_gap`` assumes one tied factor); in float64
            # its cancellation, n eps |g|, stays below 1e-6 nats up to n = 4.5e9 (see _SEP_DIRECT_MAX_LOSS)
            log_z = log_z + n_total * (cav.log_normaliser_gain - q.log_normaliser_gain)
    else:  # EP's and ADF's rows start from q (EP's removes each row's own site in ``block_pass``)
        cav = q
    return {"q": q, "cavity": cav, "log_z": log_z, "Kmm": Kmm}


def finish_factor(kernel, Z, prep, sweep, scale, want_grad):
    """The factor pass's results from the (reduced) sweep; ``scale`` = n_total / rows."""
    q = prep["q"]
    out = {
        "log_z": prep["log_z"] + scale * sweep["terms"],
        "site_precision": sweep["site_precision"],
        "site_shift": sweep["site_shift"],
        "valid": sweep["valid"],
        "n_invalid": sweep["n_invalid"],
        "site_delta": Factor(*sweep["sums"]),
        "posterior": q,
        "grads": None,
    }
    if want_grad:
        prior_grads = kernel.grads(prior_kmm_adjoint(q) + scale * sweep["dKmm_data"], None, None, None, Z,
                                   Kmm=prep.get("Kmm"))
        out["grads"] = {k: scale * sweep["grads"][k] + prior_grads[k] for k in sweep["grads"]}
    return out


def exact_factor(kernel, Z, X, site_precision, site_shift, *, jitter, block_rows=None, y=None, want_anchor=False):
    """The product of all EP sites at the current hyper-parameters, as a u-space Factor (one pass).
    ``y`` is not needed (a binary site does not depend on the label's position); it is accepted so that
    the multiclass engine, whose sites do, has the same signature. ``want_anchor``: (factor, its ``Anchor``)."""
    L_K = prior_cholesky(kernel, Z, jitter)
    S, c_tilde, _ = site_sums_over_rows(kernel, Z, X, site_precision, site_shift, L_K, block_rows, False)
    factor = Factor.unwhitened(S, c_tilde, L_K)
    return (factor, Anchor(kernel, Z, L_K, jitter)) if want_anchor else factor


def anchored_factor(kernel, Z, post, jitter):
    """Minibatch EP's running product after an exact pass over all its sites: q's factor (``Factor.from_posterior``)
    and its ``Anchor`` (q's own L_K: the directions every row's site is now held along)."""
    return Factor.from_posterior(post), Anchor(kernel, Z, post.L_K, jitter)


def posterior_from_factor(kernel, Z, factor, *, jitter):
    L_K = prior_cholesky(kernel, Z, jitter)
    S, c_tilde = factor.whitened(L_K)
    return posterior_from_sums(L_K, S, c_tilde)


def predict_latent(kernel, Z, post, X, block_rows=None):
    """Mean and variance of f(x) under q (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 36), variance including the
    latent noise.

    s_* = (K_** - K_*u K_uu^-1 K_u*) + K_*u K_uu^-1 Sigma K_uu^-1 K_u* (Hernandez-Lobato & Hernandez-Lobato (2016), eq.
    36): the first term is the variance of p(f_* | u), a Schur complement of the joint prior covariance, and never
    negative; it is computed as a difference, which with nearly coincident inducing points and little jitter (an
    ill-conditioned K_uu) can come out below zero by rounding: clamped at 0 there, so that the variance and
    the probabilities built on it stay defined (the JitterWarning of such a fit says the factorisation was
    near its limit)."""
    xp = array_namespace(Z)
    beta = post.beta
    means, variances = [], []
    for _, _, X_block, _ in blocks.data_blocks(X, None, block_rows, Z):
        At, Knm = project(kernel, X_block, Z, post.L_K_inv)
        Qt = At @ post.L_C_inv.mT
        means.append(Knm @ beta)
        variances.append(xp.maximum(kernel.Kdiag(X_block) - row_dot(At, At), 0.0) + row_dot(Qt, Qt))
    if len(means) == 1:
        return means[0], variances[0]
    return xp.concat(means), xp.concat(variances)


# -- what the training loop needs besides the passes (the multiclass engine has the same functions) ---

def zero_sites(n, Z):
    xp = array_namespace(Z)
    return xp.zeros((n,), dtype=Z.dtype, device=array_device(Z))


def uniform_factor(Z):
    return Factor.uniform(Z.shape[0], Z)


def validation_scores(kernel, Z, post, X_val, y_val, likelihood=PROBIT, n_quadrature=20):
    """Test NLL and error of q on (X_val, y_val as the passes carry labels) under the model's ``likelihood``
    (the probit's predictive: Hernandez-Lobato & Hernandez-Lobato (2016), eq. 37; ``n_quadrature``: the nodes of
    one by quadrature)."""
    mean, var = predict_latent(kernel, Z, post, X_val)
    likelihood = likelihood.at(kernel)
    return class_scores(likelihood.class_log_proba(mean, var, n_quadrature), likelihood.class_index(y_val))


def class_scores(log_p, truth):
    """NLL and error from log p(class | x) (n, C) and the true class index (n,)."""
    xp = array_namespace(log_p)
    error = xp.mean(xp.astype(xp.argmax(log_p, axis=1) != truth, log_p.dtype))
    return float(negative_log_likelihood(log_p, truth)), float(error)
