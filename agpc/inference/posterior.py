"""The Gaussian q(u) of every method, in the factored form they share, and the tied site product that SEP / ADF
and minibatch EP keep in u-space (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.2 and Appendix A).

With K = Kmm + jitter I, L_K = chol(K), A = L_K^-1 Knm^T and the sites' sums C = I + A diag(nu) A^T = L_C L_C^T and
c~ = A mu, q(u) = N(K B^-1 c, K B^-1 K) for B = K + Knm^T diag(nu) Knm = L_K C L_K^T (their eqs. 12-13): held as
``Posterior(L_K, L_C, h = L_C^-1 c~)``. A ``Factor`` is a Gaussian factor of u in natural parameters (P, r), q =
prior x factor; ``moved_factor`` carries one to new inducing points. The triangular algebra (``left_solve``:
solves or products with explicit inverses, whichever is faster) is here too, since q is applied through it, and
the prior's part of the gradient, which depends on q alone (``prior_kmm_adjoint``).

Written against the array API: the functions take arrays and find their namespace. The passes over rows that
produce the sums are ``agpc.inference.ep``'s (and the other methods'); this module knows nothing of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..backend import (
    array_device,
    array_namespace,
    cholesky,
    cholesky_inverse,
    cholesky_or_nan,
    identity_plus,
    inverts_by_halves,
    lower_triangular_inverse,
    matmul,
    prefers_inverses,
    row_dot,
    solve_triangular,
    symmetric_congruence,
    triangular_gram,
    triangular_matmul,
)

__all__ = ["Posterior", "Factor", "left_solve", "uses_inverse", "SOLVE_MAX_COLUMNS_PER_M", "PRIOR_FACTOR_NAME",
           "prior_cholesky", "posterior_from_sums", "moved_factor", "prior_kmm_adjoint", "inverse_congruence",
           "covariance_form", "covariance_product"]


class Posterior:
    """q(u) in factored form: L_K = chol(Kmm + jitter I), L_C = chol(I + A diag(nu) A^T), h = L_C^-1 A mu.

    ``solve_K`` / ``solve_C`` apply the inverses of the two triangular factors: by triangular solves, or by
    products with the explicit inverses (``L_K_inv``, ``L_C_inv``, formed on first use and cached) where that is
    faster: many right-hand sides, or a library whose triangular solves are slow (``backend.prefers_inverses``).
    """

    def __init__(self, L_K, L_C, h, L_K_inv=None, L_C_inv=None):
        self.L_K, self.L_C, self.h = L_K, L_C, h
        self._L_K_inv, self._L_C_inv = L_K_inv, L_C_inv

    @property
    def L_K_inv(self):
        if self._L_K_inv is None:
            self._L_K_inv = lower_triangular_inverse(self.L_K)
        return self._L_K_inv

    @property
    def L_C_inv(self):
        if self._L_C_inv is None:
            self._L_C_inv = lower_triangular_inverse(self.L_C)
        return self._L_C_inv

    def solve_K(self, B, *, trans=False, overwrite=False):
        """L_K^-1 B (``trans``: L_K^-T B); ``overwrite``: B is the caller's temporary (``left_solve``)."""
        return left_solve(self.L_K, B, trans=trans, L_inv=self.L_K_inv if uses_inverse(self.L_K, B) else None,
                          overwrite=overwrite)

    def congruence_K(self, P, *, overwrite=False):
        """L_K^-T P L_K^-1 for a symmetric P (``inverse_congruence``)."""
        return inverse_congruence(self.L_K, P, L_inv=self.L_K_inv if uses_inverse(self.L_K, P) else None,
                                  overwrite=overwrite)

    def solve_C(self, B, *, trans=False, overwrite=False):
        """L_C^-1 B (``trans``: L_C^-T B); ``overwrite`` as for ``solve_K``."""
        return left_solve(self.L_C, B, trans=trans, L_inv=self.L_C_inv if uses_inverse(self.L_C, B) else None,
                          overwrite=overwrite)

    @cached_property
    def whitened_mean(self):
        """C^-1 c~ = L_C^-T h: k_i^T B^-1 c = (L_K^-1 k_i)^T whitened_mean."""
        return solve_triangular(self.L_C, self.h, lower=True, trans=True)

    @cached_property
    def C_inv(self):
        """C^-1 = L_C^-T L_C^-1 (m x m): k_i^T B^-1 k_j = (L_K^-1 k_i)^T C^-1 (L_K^-1 k_j)."""
        if self._L_C_inv is not None:  # (formed already: one lauum of it on NumPy)
            return triangular_gram(self._L_C_inv)
        return cholesky_inverse(self.L_C)

    @cached_property
    def beta(self):
        """beta = B^-1 c = L_K^-T L_C^-T h (m,): the predictive mean is k_*^T beta (Hernandez-Lobato & Hernandez-Lobato
        (2016), eq. 36)."""
        return solve_triangular(self.L_K, self.whitened_mean, lower=True, trans=True)

    @cached_property
    def log_normaliser_gain(self):
        """g(theta) - g(theta_prior) for q = prior x factor: 0.5 c^T B^-1 c + 0.5 log|K| - 0.5 log|B|
        (0-d; NaN when a Cholesky factor failed, which is how a failure reaches the training loop)."""
        xp = array_namespace(self.h)
        return 0.5 * row_dot(self.h, self.h) - xp.sum(xp.log(xp.linalg.diagonal(self.L_C)))

    def mean_and_cov(self):
        """Mean K B^-1 c and covariance K B^-1 K of q(u) (Hernandez-Lobato & Hernandez-Lobato (2016), eqs. 12-13), for
        inspection."""
        W = self.L_C_inv @ self.L_K.mT  # Sigma = W^T W
        return self.L_K @ self.whitened_mean, W.mT @ W


def prior_kmm_adjoint(post):
    """-0.5 M of Hernandez-Lobato & Hernandez-Lobato (2016), eqs. 34-35: M = K^-1 - K^-1 Sigma K^-1 - K^-1 m m^T K^-1 =
    K^-1 - B^-1 - beta beta^T, with K^-1 - B^-1 = L_K^-T (I - C^-1) L_K^-1 (two triangular solves; I - C^-1 is
    symmetric). Not K^-1 - G^T G, G = L_C^-1 L_K^-1, which takes fewer flops where both inverses are formed but,
    where the sites are weak, cancels at the size of K^-1 where this form cancels in I - C^-1: 1.0-1.8 times this
    form's error against a long-double reference, up to 3.4 in a review's cases (tried 2026-12-01: docs/methods/ep.md,
    "The step's m x m algebra")."""
    sandwich = post.congruence_K(identity_plus(post.C_inv, -1.0), overwrite=True)
    beta = post.beta
    return 0.5 * (beta[:, None] * beta[None, :] - sandwich)


def covariance_form(explicit, want_grad, like):
    """Whether a batch block forms P = C^-1 A (``covariance_product``) in the place of Q = L_C^-1 A: where its data
    gradient goes through the explicit inverses (``explicit`` and ``want_grad``: P is then the gradient's L_C^-T Q
    too, one general product for two triangular ones) and in float64 (``like``'s dtype). Without a gradient P would
    be one general product where Q is one triangular product (such passes took 1.13-1.14 times as long at m = 200
    and 500). The explicit C^-1 errs by about eps |A_i|^2 in d_i where L_C^-1 errs by eps d_i, which 1 - nu_i d_i
    amplifies where a row's own site dominates its direction (float32: 4e-2 against 8e-4 relative at 1 - nu d =
    1e-3), so float32 keeps Q (docs/methods/ep.md, "q's C^-1 in a batch pass's products")."""
    return bool(explicit and want_grad) and like.dtype == array_namespace(like).float64


def covariance_product(post, A, *, out=None):
    """(P, d, e) of a block A = L_K^-1 K(Z, X) (m x b): P = C^-1 A by one general product with q's explicit C^-1
    (``Posterior.C_inv``), d_i = A_i^T P_i = |L_C^-1 A_i|^2 and e_i = w^T A_i = h^T L_C^-1 A_i (w = L_C^-T h,
    ``Posterior.whitened_mean``). Where the gradient goes through the explicit inverses, P is its L_C^-T Q
    (``ep.explicit_block_gradient``): one product where Q = L_C^-1 A and L_C^-T Q took two triangular ones, which
    OpenBLAS runs at a lower flop rate (one thread, AMD EPYC: 0.43 of it at m = 100, 0.55 at m = 200 and 5,000
    rows). ``out``: where P may be written."""
    P = matmul(post.C_inv, A, out=out)
    return P, row_dot(A, P, axis=-2), post.whitened_mean @ A


# Beyond this many right-hand sides per inducing point an explicit triangular inverse (O(m^3), once per pass,
# cached on the Posterior) and matrix products beat triangular solves: BLAS trsm is far less optimised than
# gemm, single- and multi-threaded (a batch EP pass at n = 10^5, m = 200 took 1.4 s with solves on one thread,
# 2.1-3.0 s on two). Elsewhere solves, except on a library that prefers inverses for any matrix of right-hand
# sides (``backend.prefers_inverses``: NumPy, whose minibatch step applies each factor's inverse two to four times).
SOLVE_MAX_COLUMNS_PER_M = 4


def uses_inverse(L, B=None, *, n_columns=None):
    """Whether L^-1 B is applied as a product with L's explicit inverse: for a matrix B (B None: ``n_columns``
    right-hand sides, of L's kind) on a library that prefers inverses, or for more right-hand sides than
    ``SOLVE_MAX_COLUMNS_PER_M`` per row of L."""
    if (B is None or B.ndim == 2) and prefers_inverses(L if B is None else B):
        return True
    n_columns = (B.shape[1] if B.ndim == 2 else 1) if n_columns is None else n_columns
    return n_columns > SOLVE_MAX_COLUMNS_PER_M * L.shape[0]


def left_solve(L, B, *, trans=False, L_inv=None, overwrite=False, out=None):
    """L^-1 B (``trans``: L^-T B) for lower-triangular L: a triangular solve, or, where ``uses_inverse``, a
    product with L's explicit inverse (``L_inv`` when given, else formed here). ``overwrite``: B is the
    caller's temporary; ``out``: where the product may be written (both as ``backend.triangular_matmul`` takes
    them; the caller uses the return value)."""
    if uses_inverse(L, B):
        inv = lower_triangular_inverse(L) if L_inv is None else L_inv
        return triangular_matmul(inv, B, trans=trans, overwrite=overwrite, out=out)
    return solve_triangular(L, B, lower=True, trans=trans)


def inverse_congruence(L, P, *, L_inv=None, overwrite=False):
    """L^-T P L^-1 (m x m) for a lower-triangular L and a symmetric P, the m x m part of a gradient through
    K = L L^T: where ``uses_inverse``, with L's explicit inverse (``L_inv`` when given, else formed here;
    ``backend.symmetric_congruence``, one sygst on one OpenBLAS thread at large m), else by two triangular solves.
    ``overwrite``: P is the caller's temporary."""
    if uses_inverse(L, P):
        return symmetric_congruence(lower_triangular_inverse(L) if L_inv is None else L_inv, P, overwrite=overwrite)
    half = solve_triangular(L, P, lower=True, trans=True)  # L^-T P
    return solve_triangular(L, half.mT, lower=True, trans=True)  # L^-T (L^-T P)^T = L^-T P L^-1


# How jitter reports name the prior covariance of the inducing points (``training`` looks for it).
PRIOR_FACTOR_NAME = "Kmm (covariance of the inducing points)"


def prior_cholesky(kernel, Z, jitter, *, checked=True, Kmm=None):
    """L_K = chol(K(Z, Z) + jitter I). ``checked=False`` (training steps): no host synchronisation and no
    jitter escalation; a failed factorisation gives NaN, which reaches log Z_q and the loop's guard. ``Kmm``:
    K(Z, Z) when the caller has it (it is not changed)."""
    Kmm = identity_plus(kernel.K(Z) if Kmm is None else Kmm, identity=jitter)
    if not checked:
        return cholesky_or_nan(Kmm, overwrite=True)
    return cholesky(Kmm, what=PRIOR_FACTOR_NAME)


def posterior_from_sums(L_K, S, c_tilde, L_K_inv=None, *, checked=True, scale=1.0):
    """Factor C = I + scale S and whiten scale c~: the global O(m^3) step after the reduction. ``checked``: as
    in ``prior_cholesky``."""
    C = identity_plus(S, scale)
    if scale != 1.0:
        c_tilde = scale * c_tilde
    if checked:
        L_C = cholesky(C, what="C = I + A diag(site_precision) A^T (posterior precision)")
    else:
        L_C = cholesky_or_nan(C, overwrite=True)
    return Posterior(L_K=L_K, L_C=L_C, h=solve_triangular(L_C, c_tilde, lower=True), L_K_inv=L_K_inv)


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
        """S = L_K^T P L_K and c~ = L_K^T r, the form posterior_from_sums takes (two triangular products)."""
        half = triangular_matmul(L_K, self.precision, right=True)  # P L_K
        return triangular_matmul(L_K, half, trans=True, overwrite=True), self.shift @ L_K

    @classmethod
    def from_whitened(cls, S, c_tilde, L_K_inv):
        return cls(L_K_inv.mT @ S @ L_K_inv, L_K_inv.mT @ c_tilde)

    @classmethod
    def unwhitened(cls, S, c_tilde, L_K, L_K_inv=None):
        """The factor whose ``whitened(L_K)`` is (S, c~): P = L_K^-T S L_K^-1 by two triangular solves, or by two
        triangular products with ``L_K_inv`` = L_K^-1 when given."""
        def back(B):  # L_K^-T B
            if L_K_inv is None:
                return solve_triangular(L_K, B, lower=True, trans=True)
            return triangular_matmul(L_K_inv, B, trans=True)

        return cls(back(back(S).mT), back(c_tilde))

    @classmethod
    def from_posterior(cls, post):
        """The factor f of q = prior x f, read back from q's factored form (``posterior_from_sums``: L_C L_C^T
        = C = I + S and h = L_C^-1 c~, so S = L_C L_C^T - I and c~ = L_C h), unwhitened by q's own L_K: the
        ``posterior_from_factor`` of the result at q's kernel, Z and jitter is q again. This is how a fitted
        model's q becomes SEP's tied factor again (Hernandez-Lobato et al. (2015): q = prior x f^n)."""
        xp = array_namespace(post.L_C)
        eye = xp.eye(post.L_C.shape[0], dtype=post.L_C.dtype, device=array_device(post.L_C))
        return cls.unwhitened(post.L_C @ post.L_C.mT - eye, post.L_C @ post.h, post.L_K)

    def combine(self, keep, other, weight):
        """keep * self + weight * other, in natural parameters (a factor of exactly 1 takes no operation: on a GPU
        each is a launch, and 1.0 * x is x)."""
        def times(factor, value):
            return value if factor == 1.0 else factor * value

        return Factor(times(keep, self.precision) + times(weight, other.precision),
                      times(keep, self.shift) + times(weight, other.shift))


def moved_factor(kernel, Z_old, Z_new, factor, *, jitter, L_K=None, L_K_inv=None):
    """The u-space ``factor`` of q = prior x factor at inducing points ``Z_old``, carried to ``Z_new`` (same
    kernel): q'(u') = int p(f(Z_new) | u) q(u) du, the GP posterior that q implies, read at the new points, and
    the factor returned is q' / prior(u'). A tied factor (SEP / ADF) held as it is in u-space while Z moves
    stands for other information: the values it knew at the old points are taken to be those at the new ones, and
    a step of 0.01 per coordinate already costs q the test NLL that many steps of the factor had gained
    (docs/methods/sep.md, "Inducing points that move"). ``L_K``: chol(K(Z_old) + jitter I), when the caller has it,
    and ``L_K_inv`` its inverse (the step's q holds both on a library that prefers inverses).

    Whitened at both ends (L0 = L_K, L1 = chol(K(Z_new) + jitter I), C = I + L0^T P L0 = L_C L_C^T, c~ = L0^T r)
    with R = L1^-1 (K(Z_new, Z_old) + jitter I) L0^-T and U = L_C^-1 R^T, q' has whitened covariance and mean

        V = (I - R R^T) + U^T U,   w = U^T L_C^-1 c~,

    the conditional covariance of f(Z_new) given u (a Schur complement, whitened) plus q's own, carried: a sum of
    two positive semi-definite parts. Then C' = V^-1, S' = C' - I, c~' = C' w, unwhitened by L1. Unchecked
    factorisations (a failure is NaN in the factor, which the next step's log Z carries to the loop's guard). Beside
    the three factorisations: the whitening (two triangular products), L0^-1, L1^-1 and L_C^-1 applied once each
    (R, U), two products (V), the inverse C' and the unwhitening (L1^-1 twice). Where inverses are preferred
    (``left_solve``: OpenBLAS's trsm runs at a third of trmm's speed) L1^-1 is formed once for its three uses,
    L0^-1 is the caller's, and L_C^-1 is formed for its two uses where it is formed by halves (``backend.
    inverts_by_halves``; benchmarks/results/triangular_inverse.md: on one thread the inverse and a trmm took 0.68 ms
    against trsm's 0.79 at m = 200, 5.0 against 6.6 at m = 500; on two threads, and at m = 100, trsm was the faster):
    on NumPy at m = 200 the carry took 4.2 ms against 5.1 with the solves (before L_C^-1 was formed).

    The Schur complement I - R R^T is a difference of two matrices near I when the points move little (a step
    moves them by about 0.01): computed in float32 it is float32's round-off (1e-7), as large as q's smallest
    whitened variances once the factor holds many rows, and each carry adds that error again (m = 50, 2,000 rows:
    the variances 1e-2 off after 100 carries, the factor NaN within 30 where the points did not move; float64:
    1e-11). So a float32 factor is carried in float64 (m x m work, small beside the step's b x m) and returned in
    its own type."""
    xp = array_namespace(Z_new)
    if Z_new.dtype != xp.float64:
        def wide(a):
            return xp.astype(a, xp.float64)

        carried = _moved_factor(kernel, wide(Z_old), wide(Z_new), Factor(wide(factor.precision), wide(factor.shift)),
                                jitter=jitter, L_K=None, L_K_inv=None)
        return Factor(xp.astype(carried.precision, Z_new.dtype), xp.astype(carried.shift, Z_new.dtype))
    return _moved_factor(kernel, Z_old, Z_new, factor, jitter=jitter, L_K=L_K, L_K_inv=L_K_inv)


def _moved_factor(kernel, Z_old, Z_new, factor, *, jitter, L_K, L_K_inv):
    """``moved_factor`` in the type of its arguments."""
    L0 = prior_cholesky(kernel, Z_old, jitter, checked=False) if L_K is None else L_K
    L1 = prior_cholesky(kernel, Z_new, jitter, checked=False)
    L1_inv = lower_triangular_inverse(L1) if uses_inverse(L1, n_columns=L1.shape[0]) else None
    S, c_tilde = factor.whitened(L0)
    L_C = cholesky_or_nan(identity_plus(S), overwrite=True)
    # (the jitter of inducing point j goes with it: cross-covariance K(Z_old, Z_new) + jitter I, so that points
    # that do not move carry q over exactly)
    cross = identity_plus(kernel.K(Z_old, Z_new), identity=jitter)
    R = left_solve(L1, left_solve(L0, cross, L_inv=L_K_inv, overwrite=True).mT, L_inv=L1_inv)
    # L_C^-1 applied to R^T and c~: by its inverse where that is formed by halves (``backend.inverts_by_halves``: on
    # one OpenBLAS thread the inverse and a trmm beat trsm above m = 128), else by triangular solves
    L_C_inv = lower_triangular_inverse(L_C, halves=True) if inverts_by_halves(L_C) else None
    U = triangular_matmul(L_C_inv, R.mT) if L_C_inv is not None else solve_triangular(L_C, R.mT, lower=True)
    V = identity_plus(U.mT @ U - R @ R.mT)
    C_new = cholesky_inverse(cholesky_or_nan(0.5 * (V + V.mT), overwrite=True))
    h = triangular_matmul(L_C_inv, c_tilde) if L_C_inv is not None else solve_triangular(L_C, c_tilde, lower=True)
    w = U.mT @ h
    S_new = identity_plus(C_new, identity=-1.0)
    return Factor.unwhitened(0.5 * (S_new + S_new.mT), C_new @ w, L1, L_K_inv=L1_inv)
