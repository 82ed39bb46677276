"""Variational inducing-point GP classification (Izmailov & Kropotov (2017); Hernandez-Lobato & Hernandez-Lobato (2016),
sec. 3).

svi: the evidence lower bound of Hensman et al. (2015), Izmailov & Kropotov (2017), eq. 11,

    ELBO = sum_i E_{q(f_i)} log p(y_i | f_i) - KL(q(u) || p(u)),

with the expectations by Gauss-Hermite quadrature, maximised over (q, kernel, Z) by Adadelta/Adam. q(u) is
held whitened, as GPflow's SVGP holds it (``whiten=True``): u = L_K v with
L_K = chol(Kmm + jitter I), p(v) = N(0, I) and q(v) = N(m_w, L_w L_w^T), so q(u) = N(L_K m_w, L_K L_w L_w^T L_K^T)
and KL(q(u) || p(u)) = KL(q(v) || N(0, I)).

vi-JJ / vi-Taylor (Izmailov & Kropotov (2017), sec. 4): a quadratic lower bound (Jaakkola-Jordan) or expansion (Taylor)
of log p(y_i | f_i) at xi_i makes the optimal q(u) analytic (eqs. 12-13, 17-18). That q has exactly the form
of an EP posterior with site precision nu_i = 2 w_i and site shift mu_i (w = lambda(xi), mu = y / 2 for JJ;
w = psi(xi), mu = phi + 2 psi xi for Taylor), so it is built with ``posterior.posterior_from_sums`` and the
collapsed bound (eqs. 14, 19) is

    sum_i const_i(xi) + [0.5 c^T B^-1 c + 0.5 log|K| - 0.5 log|B|] - sum_i w_i s_i,

whose bracket is the log-normaliser gain of that posterior. Gradients come as adjoints for the kernel.
"""

from __future__ import annotations

from contextlib import closing

from ..backend import (
    add_to_diagonal,
    array_device,
    array_namespace,
    cholesky,
    lower_triangular_inverse,
    prefers_inverses,
    row_dot,
    solve_triangular,
    triangular_gram,
    triangular_matmul,
    weighted_gram,
)
from ..kernels import step_lower_bounds, value_scale_keys
from ..likelihoods import Ordinal, likelihood_by_name, sigmoid, softplus
from ..optim import bounded_step
from . import blocks, ep
from . import posterior as Q
from .posterior import Posterior, left_solve, posterior_from_sums

__all__ = [
    "VI_METHODS",
    "data_scale",
    "svi_step",
    "whitened_from_unwhitened",
    "initial_xi",
    "posterior_of",
    "prior_cholesky",
    "SVIBoundTerms",
    "log_likelihood",
    "expected_log_likelihood",
    "svi_elbo",
    "quadratic_bound",
    "weighted_quadratic_sites",
    "quadratic_site_sums",
    "quadratic_posterior",
    "quadratic_row_terms",
    "add_quadratic_terms",
    "finish_quadratic_bound",
    "QUADRATIC_ROW_KEYS",
    "update_xi",
    "posterior_from_gaussian",
    "posterior_from_whitened",
]


def log_likelihood(y, f, likelihood):
    """log p(y | f) and its derivative in f, for y in {-1, +1} (``likelihood``: a name or a Likelihood)."""
    return likelihood_by_name(likelihood, multiclass=False).log_density(y, f)


def expected_log_likelihood(y, mean, var, likelihood, n_quadrature=20):
    """E_{N(f | mean, var)} log p(y | f) by Gauss-Hermite, and its derivatives in mean and var
    (``Likelihood.expected_log_density``)."""
    return likelihood_by_name(likelihood, multiclass=False).expected_log_density(y, mean, var, n_quadrature)


def prior_cholesky(kernel, Z, jitter, *, checked=True):
    """chol(K_mm + jitter I), stacked over classes for a multiclass model's (C, m, d) inducing points.
    ``checked=False``: as ``posterior.prior_cholesky`` (training steps: a failure is NaN, no host synchronisation)."""
    if Z.ndim == 3:
        return array_namespace(Z).stack([Q.prior_cholesky(kernel[c], Z[c, ...], jitter, checked=checked)
                                         for c in range(Z.shape[0])])
    return Q.prior_cholesky(kernel, Z, jitter, checked=checked)


class SVIBoundTerms:
    """One GP's share of the SVI bound for the whitened q(v) = N(m_w, L_w L_w^T), u = L_K v (module docstring).

    With A = L_K^-1 Knm^T (column i: a_i = L_K^-1 k_i) the marginal of f_i is N(a_i^T m_w, s_i + v_i): the
    conditional's variance s_i = K_ii - |a_i|^2 (latent noise included in K_ii; FITC's residual) plus q's share
    v_i = |L_w^T a_i|^2, and KL = (|L_w|_F^2 + |m_w|^2 - m - 2 sum log|diag L_w|) / 2.
    With g_m, g_v, g_s the derivatives of the rows' data terms in their means, q-variances v_i and residuals s_i
    (G = diag g_v, G_s = diag g_s; a term of the total variance s_i + v_i alone has g_s = g_v), the data term's
    adjoints are::

      dA = m_w g_m^T + 2 L_w L_w^T A G - 2 A G_s,     d m_w = A g_m,     d L_w = 2 tril(A G A^T L_w),
      dKnm^T = L_K^-T dA,   dKdiag = g_s,   dL_K = -tril(L_K^-T dA A^T)   (A = L_K^-1 Knm^T),

    and dL_K reaches Kmm through the Cholesky factorisation: dKmm = sym(L_K^-T Phi(L_K^T dL_K) L_K^-1), Phi the
    lower triangle with its diagonal halved, sym(X) = (X + X^T) / 2 (Murray (2016), "Differentiation of the
    Cholesky decomposition", eq. 10). The KL does not depend on the kernel (the whitening's point) and gives
    d m_w = -m_w, d L_w = -(L_w - diag(1 / diag L_w)).

    Phi needs only the lower triangle of L_K^T dL_K = -L_K^T tril(M), M = L_K^-T dA A^T, and that is the lower
    triangle of -dA A^T: L_K^T tril(M) = dA A^T - L_K^T striu(M), and an upper triangle times a strictly upper one is
    strictly upper. So M and its product with L_K^T are never formed. With one adjoint of the total variance
    (g_s = g_v: a binary likelihood's), over the rows

      sum dA A^T = m_w (A g_m)^T + 2 L_w L_w^T S - 2 S,   S = sum A G A^T,

    so a block adds the m x m sum S and A g_m: a symmetric product (``backend.weighted_gram``; BLAS syrk on NumPy,
    m^2 b flops for b rows) where the general products of L_K^-T dA by A^T and of A G by (L_w^T A)^T stood
    (4 m^2 b), and L_K^T tril(M) (m^3) is L_w (L_w^T S) (m^3). d L_w's S L_w is one more triangular product a step
    (m^3) where the rows are at least m / 2 (a minibatch of 200 rows at m = 200: 3 m^3 flops where there were 5),
    and a narrower block's own product (A G) (L_w^T A)^T (2 m^2 b) where not. With an adjoint g_s of its own (the
    multiclass robust max's, whose g_v and g_s take either sign, so that no product is symmetric) a block adds
    dA A^T and (A G) (L_w^T A)^T, two general products as before, and the step makes no m^3 product for them (one
    fewer than before). A bound's blocks give g_s all or none."""

    def __init__(self, kernel, Z, whitened_mean, whitened_chol, jitter):
        xp = array_namespace(Z)
        self.xp, self.kernel, self.Z = xp, kernel, Z
        self.mean, self.chol = whitened_mean, whitened_chol
        self.Kmm = kernel.K(Z)
        # unchecked: a failed factorisation makes the bound NaN, which the training loop's guard handles
        self.L_K = Q.prior_cholesky(kernel, Z, jitter, checked=False, Kmm=self.Kmm)
        # L_K^-1 is applied four times a step (A, dKnm, and the Cholesky adjoint's two sides)
        self.L_K_inv = lower_triangular_inverse(self.L_K) if prefers_inverses(Z) else None
        diagonal = xp.linalg.diagonal(whitened_chol)
        self.kl = 0.5 * (xp.sum(whitened_chol * whitened_chol) + row_dot(whitened_mean, whitened_mean)
                         - Z.shape[0] - 2.0 * xp.sum(xp.log(xp.abs(diagonal))))
        self.grads = None
        # the blocks' sums: A g_m; -S of blocks of at least m / 2 rows, of narrower ones; the others' -S L_w; with an
        # adjoint g_s of its own, dA A^T (``block_adjoints``, added by ``add``)
        self._sums, self._own_s = (None,) * 5, None

    def _solve(self, B, trans=False, overwrite=True):
        """L_K^-1 B (``trans``: L_K^-T B); ``overwrite``: B is the caller's temporary."""
        return left_solve(self.L_K, B, trans=trans, L_inv=self.L_K_inv, overwrite=overwrite)

    def marginals(self, Xb):
        """(the block for ``block_adjoints``, mean and variance of f at the rows under q, latent noise included)."""
        block, (mean, spread_variance, residual) = self.marginal_parts(Xb)
        return block, mean, residual + spread_variance

    def marginal_parts(self, Xb):
        """(the block for ``block_adjoints``, (mean a_i^T m_w, q's share of the variance v_i = |L_w^T a_i|^2, the
        conditional's s_i = K_ii - |a_i|^2, latent noise included)) at the rows: f_i | u ~ N(a_i^T L_K^-1 u, s_i),
        q(a_i^T L_K^-1 u) = N(mean, v_i). Reads the terms only: the blocks of a pass may run on threads."""
        Knm = self.kernel.K(Xb, self.Z)
        A = self._solve(Knm.mT, overwrite=False)  # (Knm is kept for the kernel's gradient)
        spread = triangular_matmul(self.chol, A, trans=True)  # L_w^T A
        residual = self.kernel.Kdiag(Xb) - row_dot(A, A, axis=-2)
        return (Xb, Knm, A, spread), (self.mean @ A, row_dot(spread, spread, axis=-2), residual)

    def block_adjoints(self, block, g_m, g_v, g_s=None):
        """A block's share of the adjoints (for ``add``, in the rows' order), from its ``marginal_parts`` block and
        g_v of q's share of the variance, g_s of the conditional's (None: g_v, the adjoint of the total variance; all
        of a bound's blocks give it, or none). Reads the terms only: the blocks of a pass may run on threads."""
        Xb, Knm, A, spread = block
        own_s = g_s is not None
        g_s = g_s if own_s else g_v
        d_A = self.mean[:, None] * g_m[None, :] + 2.0 * (triangular_matmul(self.chol, spread * g_v[None, :])
                                                          - A * g_s[None, :])
        # the sums are kept negated: -S = A (-G) A^T, whose weights are >= 0 where g_v <= 0 (a log-concave likelihood's,
        # up to round-off; another sign takes the general product)
        minus_g_v = -g_v
        # d L_w's A G A^T L_w: for a block of at least m / 2 rows as S L_w once a step (m^3 flops), for a narrower one
        # or one with its own g_s as its own (A G) (L_w^T A)^T (2 m^2 b flops)
        wide = 2 * A.shape[1] >= A.shape[0] and not own_s
        minus_gram = None if own_s else weighted_gram(A, minus_g_v)
        parts = (A @ g_m, minus_gram if wide else None, None if wide else minus_gram,
                 None if wide else (A * minus_g_v[None, :]) @ spread.mT, d_A @ A.mT if own_s else None)
        dKnm_t = self._solve(d_A, trans=True)  # L_K^-T dA (d_A overwritten)
        return self.kernel.grads(None, dKnm_t.mT, g_s, Xb, self.Z, Knm=Knm), parts, own_s

    def add(self, share):
        """Add a block's ``block_adjoints`` to the pass's sums."""
        block, parts, own_s = share
        if self._own_s not in (None, own_s):
            raise ValueError("block_adjoints: g_s is given for every block of a bound or for none")
        self._own_s = own_s
        self.grads = block if self.grads is None else {k: self.grads[k] + block[k] for k in block}
        self._sums = tuple(_added(total, part) for total, part in zip(self._sums, parts))

    def gradients(self, scale):
        """Gradients of scale * (data term) - KL for every kernel parameter, "Z", "whitened_mean" and
        "whitened_chol" (its lower triangle)."""
        xp, L_K, chol = self.xp, self.L_K, self.chol
        d_mean, minus_wide, minus_narrow, minus_chol_narrow, d_A_A = self._sums
        minus_chol = _added(None if minus_wide is None else triangular_matmul(chol, minus_wide, trans=True).mT,
                            minus_chol_narrow)  # -S L_w
        # Cholesky adjoint (Murray 2016, eq. 10) of dL_K = -scale tril(L_K^-T dA A^T): Phi of -scale dA A^T (above)
        if d_A_A is None:  # sum dA A^T = m_w (A g_m)^T + 2 (L_w L_w^T S - S)
            minus_gram = _added(minus_wide, minus_narrow)  # -S
            d_A_A = self.mean[:, None] * d_mean[None, :] + 2.0 * (minus_gram - triangular_matmul(chol, minus_chol.mT))
        lower = xp.tril(d_A_A)
        # sym(L_K^-T Phi L_K^-1) = L_K^-T (Phi + Phi^T) L_K^-1 / 2; Phi + Phi^T: the symmetric matrix of that triangle
        # (the diagonal, counted twice, set right in place: ``add_to_diagonal``, one pass where eye makes three)
        symmetric = add_to_diagonal(lower + lower.mT, -xp.linalg.diagonal(lower), overwrite=True)
        dKmm = (-0.5 * scale) * Q.inverse_congruence(L_K, symmetric, L_inv=self.L_K_inv, overwrite=True)
        prior = self.kernel.grads(dKmm, None, None, None, self.Z, Kmm=self.Kmm)
        out = {k: scale * self.grads[k] + prior[k] for k in self.grads}
        out["whitened_mean"] = scale * d_mean - self.mean
        out["whitened_chol"] = add_to_diagonal(xp.tril((-2.0 * scale) * minus_chol - chol),
                                               1.0 / xp.linalg.diagonal(chol), overwrite=True)
        return out


def _added(total, part):
    """total + part, where either may be None (nothing yet, or nothing of that kind)."""
    if total is None or part is None:
        return part if total is None else total
    return total + part


def svi_elbo(kernel, Z, X, y, whitened_mean, whitened_chol, *, likelihood="probit", n_quadrature=20, jitter=1e-6,
             n_total=None, want_grad=True, block_rows=None, weights=None):
    """Izmailov & Kropotov (2017), eq. 11 for the whitened q(v) = N(whitened_mean, whitened_chol whitened_chol^T)
    (module docstring), on rows X (all, or a minibatch scaled to n_total).

    ``weights`` (per row, or None for all ones) multiply each row's expected log-likelihood and so its
    adjoints; the rows then stand for sum(weights) rows when scaled to ``n_total`` (a padded minibatch gives
    its padding weight 0 and is the minibatch without it).
    Returns (elbo, grads) with grads for every kernel parameter, "Z", "whitened_mean" and "whitened_chol" (lower
    triangle), each at fixed values of the others (the kernel's at fixed q(v): GPflow's); the adjoints are in
    ``SVIBoundTerms``.
    """
    xp = array_namespace(Z)
    scale = data_scale(X, n_total, weights)
    terms = SVIBoundTerms(kernel, Z, whitened_mean, whitened_chol, jitter)
    likelihood = likelihood_by_name(likelihood, multiclass=False).at(kernel)
    ordinal = isinstance(likelihood, Ordinal)  # its cut points are the kernel's: their gradient is added to its own
    block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)

    def block_terms(lo, hi, Xb, yb):
        """A block's expected log-likelihood, its share of the adjoints and of the cut points' gradient."""
        block, f_mean, f_var = terms.marginals(Xb)
        if ordinal:
            expected, g_m, g_v, slopes = likelihood.expected_log_density_with_cuts(yb, f_mean, f_var, n_quadrature)
        else:
            expected, g_m, g_v = expected_log_likelihood(yb, f_mean, f_var, likelihood, n_quadrature)
        if weights is not None:
            w = weights[lo:hi]
            expected, g_m, g_v = w * expected, w * g_m, w * g_v
        if not want_grad:
            return xp.sum(expected), None, None
        d_cuts = None
        if ordinal:  # sum_i w_i E_q d log p(y_i | f_i) / d b
            d_cuts = likelihood.cut_point_gradient(slopes, xp.ones_like(f_mean) if weights is None else weights[lo:hi])
        return xp.sum(expected), terms.block_adjoints(block, g_m, g_v), d_cuts

    expected_total = d_cuts = None
    with closing(blocks.map_blocks(block_terms, blocks.data_blocks(X, y, block_rows, Z), workers)) as results:
        for _, (total, share, block_cuts) in results:  # (added in the rows' order, whatever thread ran the block)
            expected_total = total if expected_total is None else expected_total + total
            if want_grad:
                terms.add(share)
            if block_cuts is not None:
                d_cuts = block_cuts if d_cuts is None else d_cuts + block_cuts
    elbo = scale * expected_total - terms.kl
    if not want_grad:
        return elbo, None
    grads = terms.gradients(scale)
    if ordinal:
        for key, value in kernel.cut_point_grads(d_cuts).items():
            grads[key] = grads[key] + scale * value
    return elbo, grads


def data_scale(X, n_total, weights):
    """n_total / (rows the minibatch stands for): 1 for all the data (``n_total`` None); with ``weights``
    the rows stand for sum(weights) (a 0-d array: no trip to the host)."""
    if n_total is None:
        return 1.0
    if weights is None:
        return n_total / X.shape[0]
    return n_total / array_namespace(weights).sum(weights)


def svi_step(optimizer, names, kernel, Z, whitened_mean, whitened_chol, grads):
    """One ascent step of (kernel, Z, whitened_mean, whitened_chol) on the gradients of eq. 11 (``svi_elbo``).

    The optimiser steps q in whitened coordinates, as GPflow's SVGP does: the raw coordinates of q(u) are as
    badly conditioned as Kmm, the whitened ones are not. The kernel's step holds q(v) fixed, so q(u) = L_K q(v)
    follows the kernel. Returns the new (kernel, Z, whitened_mean, whitened_chol)."""
    params = dict(kernel.params)
    params.update(Z=Z, whitened_mean=whitened_mean, whitened_chol=whitened_chol)
    params.update(bounded_step(optimizer, {k: params[k] for k in names}, {k: grads[k] for k in names},
                               step_lower_bounds(kernel), value_scale_keys(kernel)))
    whitened_mean, whitened_chol, Z = params.pop("whitened_mean"), params.pop("whitened_chol"), params.pop("Z")
    return kernel.with_params(params), Z, whitened_mean, whitened_chol


def whitened_from_unwhitened(kernel, Z, mean, chol, *, jitter):
    """(m_w, L_w) = (L_K^-1 mean, L_K^-1 chol) of q(u) = N(mean, chol chol^T) (per class for a (C, m, d) Z): how
    a checkpoint of the u-space form, which agpc wrote before q was held whitened, resumes. Exact: L_K^-1 chol is
    lower triangular, and its product with its transpose is L_K^-1 Sigma L_K^-T."""
    L_K = prior_cholesky(kernel, Z, jitter)
    if Z.ndim == 3:  # class by class
        xp = array_namespace(Z)
        return (xp.stack([solve_triangular(L_K[c, ...], mean[c, ...]) for c in range(Z.shape[0])]),
                xp.stack([xp.tril(solve_triangular(L_K[c, ...], chol[c, ...])) for c in range(Z.shape[0])]))
    return solve_triangular(L_K, mean), array_namespace(Z).tril(solve_triangular(L_K, chol))


# --------------------------------------------------------------------------------------------------
# vi-JJ and vi-Taylor (logistic likelihood)


def jj_lambda(xi):
    """lambda(xi) = tanh(xi/2) / (4 xi) = (sigma(xi) - 1/2) / (2 xi), even in xi, 1/8 at 0 (Jaakkola & Jordan)."""
    xp = array_namespace(xi)
    a = xp.abs(xi)
    small = a < 1e-4
    safe = xp.where(small, xp.ones_like(a), a)
    return xp.where(small, 0.125 - a * a / 96.0, xp.tanh(safe / 2.0) / (4.0 * safe))


def jj_lambda_prime(xi):
    """d lambda / d xi."""
    xp = array_namespace(xi)
    a = xp.abs(xi)
    small = a < 1e-4
    safe = xp.where(small, xp.ones_like(a), a)
    t = xp.tanh(safe / 2.0)
    value = (0.5 * (1.0 - t * t) * safe - t) / (4.0 * safe * safe)
    return xp.sign(xi) * xp.where(small, -a / 48.0, value)


def _quadratic_sites(y, xi, kind):
    """(w, site shift, const) of the quadratic form in f_i at xi_i (Izmailov & Kropotov (2017), eqs. 12-18)."""
    xp = array_namespace(y, xi)
    if kind == "jj":
        w = jj_lambda(xi)
        const = -softplus(-xi, xp) - 0.5 * xi + w * xi * xi  # log sigma(xi) - xi/2 + lambda xi^2
        return w, 0.5 * y, const
    if kind == "taylor":
        s = sigmoid(y * xi, xp)
        phi = y * (1.0 - s)  # d/df log sigma(y f) at xi
        psi = 0.5 * s * (1.0 - s)  # -(1/2) d^2/df^2 (y^2 = 1)
        const = -softplus(-y * xi, xp) - phi * xi - psi * xi * xi
        return psi, phi + 2.0 * psi * xi, const
    raise ValueError(f"unknown quadratic bound {kind!r}")


def weighted_quadratic_sites(y, xi, kind, weights=None):
    """``_quadratic_sites`` of the weighted bound: each row's quadratic bound (or expansion) of log p(y_i | f_i) times
    its sample weight w_i, so that (w, site shift, const) are all w_i times (an integer weight is the row repeated, a
    weight of 0 contributes nothing); ``weights`` None: the unweighted sites, as they are."""
    w, shift, const = _quadratic_sites(y, xi, kind)
    if weights is None:
        return w, shift, const
    return weights * w, weights * shift, weights * const


def quadratic_bound(kernel, Z, X, y, xi, *, kind, jitter=1e-6, want_grad=True, want_xi_grad=False, block_rows=None,
                    weights=None):
    """The collapsed bound of Izmailov & Kropotov (2017), eq. 14 (kind "jj") or eq. 19 (kind "taylor") at fixed xi.

    Returns a dict: ``value``, ``posterior`` (the analytic optimal q, eqs. 12-13 / 17-18, as an EP-form
    Posterior), ``mean``/``var`` of f at the rows (m_i, S_i of eq. 10 under that q), ``grads`` (kernel and
    "Z") and, with ``want_xi_grad`` (JJ), ``xi_grad``.
    Kernel adjoints: with beta = B^-1 c and M = beta beta^T + B^-1, the gain 0.5 c^T B^-1 c + 0.5 log|K| -
    0.5 log|B| gives dKnm = mu beta^T - diag(nu) Knm M and dKmm = 0.5 (K^-1 - M); the term -sum w_i s_i
    gives dKdiag = -w, dKnm = 2 w_i v_i and dKmm = -V^T diag(w) V.

    Two passes over the rows, each a sum over them (``quadratic_site_sums``, then ``quadratic_row_terms``),
    joined by the m x m work of ``quadratic_posterior`` and ``finish_quadratic_bound``: a cluster runs the
    passes a chunk of rows a task and adds the chunks' results (``dask_engine.DaskPasses.quadratic_bound``).

    ``weights`` (n,) or None: the rows' sample weights, the weighted bound sum_i w_i (row i's quadratic term) + the
    rest (``weighted_quadratic_sites``): the analytic q, the value, the kernel gradients and the xi gradient all
    from the weighted sites; the optimal xi of a row (eq. 15) does not depend on its weight.
    """
    L_K = Q.prior_cholesky(kernel, Z, jitter)
    S, c_tilde, const_sum = quadratic_site_sums(kernel, Z, X, y, xi, kind=kind, L_K=L_K, block_rows=block_rows,
                                                weights=weights)
    prep = quadratic_posterior(L_K, S, c_tilde)
    terms = quadratic_row_terms(kernel, Z, X, y, xi, prep, kind=kind, want_grad=want_grad,
                                want_xi_grad=want_xi_grad, block_rows=block_rows, weights=weights)
    out = finish_quadratic_bound(kernel, Z, prep, const_sum, terms, want_grad=want_grad)
    out.update({k: terms[k] for k in QUADRATIC_ROW_KEYS if terms[k] is not None})
    return out


QUADRATIC_ROW_KEYS = ("mean", "var", "xi_grad")  # the per-row outputs of ``quadratic_row_terms``


def quadratic_site_sums(kernel, Z, X, y, xi, *, kind, L_K, block_rows=None, weights=None):
    """The rows' sums that fix the optimal q at xi (Izmailov & Kropotov (2017), eqs. 12-13 / 17-18): S = A diag(2 w) A^T
    and c~ = A mu (as ``ep.site_sums_over_rows``: q has EP's form with sites (2 w_i, mu_i)), and sum_i const_i.
    Each adds over any split of the rows. ``weights``: the rows' sample weights (``weighted_quadratic_sites``)."""
    xp = array_namespace(Z)
    w, shift, const = weighted_quadratic_sites(y, xi, kind, weights)
    S, c_tilde, _ = ep.site_sums_over_rows(kernel, Z, X, 2.0 * w, shift, L_K, block_rows, False)
    return S, c_tilde, xp.sum(const)


def quadratic_posterior(L_K, S, c_tilde):
    """The optimal q from the rows' sums (m x m work): the EP-form ``posterior`` and what the rows' terms
    and the adjoints need of it (``L_K_inv``, ``K_inv``, ``M`` = beta beta^T + B^-1)."""
    L_K_inv = lower_triangular_inverse(L_K)
    post = posterior_from_sums(L_K, S, c_tilde, L_K_inv=L_K_inv)
    beta = post.beta
    B_inv_w = post.L_C_inv @ L_K_inv  # B^-1 = B_inv_w^T B_inv_w (a product of two lower triangles: one)
    M = beta[:, None] * beta[None, :] + triangular_gram(B_inv_w, overwrite=True)
    return {"posterior": post, "L_K_inv": L_K_inv, "K_inv": triangular_gram(L_K_inv), "M": M}


def quadratic_row_terms(kernel, Z, X, y, xi, prep, *, kind, want_grad=True, want_xi_grad=False, block_rows=None,
                        weights=None):
    """The rows' part of the bound at the optimal q ``prep`` (``quadratic_posterior``): ``value`` = -sum_i w_i s_i,
    the kernel adjoints' data part (``grads`` of the Knm and diagonal adjoints, ``dKmm`` = -V^T diag(w) V), which
    add over any split of the rows; and per row (``QUADRATIC_ROW_KEYS``) m_i, S_i and the JJ xi gradient.
    ``weights``: the rows' sample weights (``weighted_quadratic_sites``; the xi gradient w_i times)."""
    xp = array_namespace(Z)
    w, shift, _ = weighted_quadratic_sites(y, xi, kind, weights)
    nu = 2.0 * w
    post, L_K_inv, M = prep["posterior"], prep["L_K_inv"], prep["M"]
    beta, L_C_inv = post.beta, post.L_C_inv  # (formed here, once, before a block's thread would form them)
    block_rows, workers = blocks.pass_layout(Z, X.shape[0], block_rows)

    def block_terms(lo, hi, Xb):
        """A block's -sum w_i s_i, means, variances, JJ xi gradient and adjoints (on a pass's thread)."""
        Knm = kernel.K(Xb, Z)
        At = Knm @ L_K_inv.mT
        Qt = At @ L_C_inv.mT
        d = ep.row_dot(Qt, Qt)
        e = Knm @ beta
        s = kernel.Kdiag(Xb) - ep.row_dot(At, At)
        wb, nub, shiftb = w[lo:hi], nu[lo:hi], shift[lo:hi]
        xi_grad = None
        if want_xi_grad:  # JJ: d/dxi = lambda'(xi) (xi^2 - s - e^2 - d), zero at eq. 15
            xib = xi[lo:hi]
            xi_grad = jj_lambda_prime(xib) * (xib * xib - s - e * e - d)
            xi_grad = xi_grad if weights is None else weights[lo:hi] * xi_grad
        dKmm = grads = None
        if want_grad:
            V = At @ L_K_inv
            dKnm = shiftb[:, None] * beta[None, :] - (Knm * nub[:, None]) @ M + 2.0 * wb[:, None] * V
            dKmm = -(V.mT @ (V * wb[:, None]))
            grads = kernel.grads(None, dKnm, -wb, Xb, Z, Knm=Knm)
        return -xp.sum(wb * s), e, s + d, xi_grad, dKmm, grads

    value = grads = dKmm = None
    means, variances, xi_grads = [], [], []
    pieces = ((lo, hi, Xb) for lo, hi, Xb, _ in blocks.data_blocks(X, None, block_rows, Z))
    with closing(blocks.map_blocks(block_terms, pieces, workers)) as results:  # (ended on an error too: map_blocks)
        for _, (block_value, e, variance, xi_grad, block_dKmm, block_grads) in results:  # (added in order)
            value = block_value if value is None else value + block_value
            means.append(e)
            variances.append(variance)
            if xi_grad is not None:
                xi_grads.append(xi_grad)
            if want_grad:
                dKmm = block_dKmm if dKmm is None else dKmm + block_dKmm
                grads = block_grads if grads is None else {k: grads[k] + block_grads[k] for k in grads}

    def joined(parts):
        return None if not parts else parts[0] if len(parts) == 1 else xp.concat(parts)

    return {"value": value, "grads": grads, "dKmm": dKmm, "mean": joined(means), "var": joined(variances),
            "xi_grad": joined(xi_grads)}


def add_quadratic_terms(a, b):
    """Two chunks' ``quadratic_row_terms`` added (value and adjoints); the per-row outputs stay with their chunk."""
    return {k: (None if k in QUADRATIC_ROW_KEYS else blocks.tree_add(a[k], b[k])) for k in a}


def finish_quadratic_bound(kernel, Z, prep, const_sum, terms, *, want_grad=True):
    """The bound and its kernel gradients from the optimal q (``quadratic_posterior``), the rows' sum of
    const_i and the rows' terms (``quadratic_row_terms``, summed over the rows): the gain, plus the prior's
    part of the adjoints, dKmm = 0.5 (K^-1 - M)."""
    post = prep["posterior"]
    out = {"value": post.log_normaliser_gain + const_sum + terms["value"], "posterior": post, "grads": None}
    if want_grad:
        prior = kernel.grads(0.5 * (prep["K_inv"] - prep["M"]) + terms["dKmm"], None, None, None, Z)
        out["grads"] = {k: terms["grads"][k] + prior[k] for k in terms["grads"]}
    return out


def update_xi(mean, var, kind):
    """Optimal xi under q: JJ xi^2 = m^2 + S (Izmailov & Kropotov (2017), eq. 15), Taylor xi = m (sec. 4.2).

    S is the variance of q(f_i) (Izmailov & Kropotov (2017), eq. 10: K_ii - q_ii plus a positive semi-definite term), so
    xi^2 = E_q f_i^2 >= 0; in floating point, with nearly coincident inducing points and no jitter, K_ii - q_ii can
    come out a rounding error below zero, and S with it: clamped at 0 (then xi = |m|; lambda is even and
    1/8 at 0) rather than a NaN from the square root of a negative number."""
    xp = array_namespace(mean)
    if kind == "jj":
        return xp.sqrt(mean * mean + xp.maximum(var, 0.0))
    return mean


def posterior_from_gaussian(kernel, Z, mean, chol, *, jitter):
    """q(u) = N(mean, chol chol^T) in EP form (L_K, L_C, h), so every method predicts with one code path.

    B = K Sigma^-1 K, so C = L_K^-1 B L_K^-T = (chol^-1 L_K)^T (chol^-1 L_K), and h = L_C^-1 L_K^T Sigma^-1 mean.
    """
    L_K = Q.prior_cholesky(kernel, Z, jitter)
    chol_inv = lower_triangular_inverse(chol)
    R = chol_inv @ L_K
    C = R.mT @ R
    L_C = cholesky(C, what="C of the variational posterior")
    L_C_inv = lower_triangular_inverse(L_C)
    c_tilde = L_K.mT @ (chol_inv.mT @ (chol_inv @ mean))
    return Posterior(L_K=L_K, L_C=L_C, h=L_C_inv @ c_tilde, L_C_inv=L_C_inv)


def posterior_from_whitened(kernel, Z, whitened_mean, whitened_chol, *, jitter):
    """The whitened q(v) = N(m_w, L_w L_w^T), u = L_K v, in EP form (L_K, L_C, h): C = L_K^-1 B L_K^-T =
    L_K^T Sigma^-1 L_K = (L_w L_w^T)^-1 and h = L_C^-1 c~ with c~ = L_K^T Sigma^-1 mean = C m_w, so h = L_C^T m_w."""
    L_K = Q.prior_cholesky(kernel, Z, jitter)
    chol_inv = lower_triangular_inverse(whitened_chol)
    L_C = cholesky(chol_inv.mT @ chol_inv, what="C of the variational posterior")
    return Posterior(L_K=L_K, L_C=L_C, h=L_C.mT @ whitened_mean)


VI_METHODS = ("svi", "vi-jj", "vi-jj-hybrid", "vi-jj-full", "vi-taylor")


def initial_xi(kernel, Z, X, kind, block_rows=None):
    """xi at q = prior (m_i = 0, S_i = K_ii): where vi-JJ / vi-Taylor start (Izmailov & Kropotov (2017), Alg. 1)."""
    xp = array_namespace(Z)
    prior_var = xp.concat([kernel.Kdiag(Xb) for _, _, Xb, _ in blocks.data_blocks(X, None, block_rows, Z)])
    return update_xi(xp.zeros((X.shape[0],), dtype=Z.dtype, device=array_device(Z)), prior_var, kind)


def posterior_of(kernel, Z, whitened_mean, whitened_chol, *, jitter):
    """``posterior_from_whitened`` for one GP, or per class (a tuple) for Z of shape (C, m, d)."""
    if Z.ndim == 3:
        return tuple(posterior_from_whitened(kernel[c], Z[c, ...], whitened_mean[c, ...], whitened_chol[c, ...],
                                             jitter=jitter) for c in range(Z.shape[0]))
    return posterior_from_whitened(kernel, Z, whitened_mean, whitened_chol, jitter=jitter)


def predictive_log_proba(mean, var, likelihood, n_quadrature=20):
    """log p(y = +1 | x) and log p(y = -1 | x) for f ~ N(mean, var): closed form for probit, Gauss-Hermite
    for logistic (``Likelihood.predictive_log_proba``)."""
    return likelihood_by_name(likelihood, multiclass=False).predictive_log_proba(mean, var, n_quadrature)
