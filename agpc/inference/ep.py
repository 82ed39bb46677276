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

import math
import time
from dataclasses import dataclass, field

from ..backend import (
    CholeskyError,
    array_device,
    array_namespace,
    cholesky,
    solve_triangular,
)
from ..likelihoods import probit_tilted

__all__ = [
    "Posterior",
    "prior_cholesky",
    "project",
    "site_sums",
    "posterior_from_sums",
    "block_pass",
    "evaluate",
    "predict_latent",
    "train",
]

# A site whose cavity variance v_i = d_i / (1 - nu_i d_i) is not positive (1 - nu_i d_i below this) is
# skipped for the round: its old parameters are kept and it adds nothing to log Z_q or the gradient.
_CAVITY_EPS = 1e-10


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

    @property
    def beta(self):
        """beta = B^-1 c = L_K^-T L_C^-T h (m,): the predictive mean is k_*^T beta (seed 000 eq. 36)."""
        return self.L_K_inv.mT @ (self.L_C_inv.mT @ self.h)

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


def block_pass(kernel, X, y, site_precision, site_shift, Z, post, *, want_grad=True, At=None):
    """Cavities, moment matching, log Z_q terms and gradient adjoints for a block of rows.

    Seed 000: cavity (eqs. 14-15), tilted moments and new site (eqs. 17-23), log Z_q terms (eq. 26, in
    the one-dimensional form g(theta^i) - g(theta) along upsilon_i), and the data part of the gradient
    of eq. 4: sum_i d log Z_i / d xi with the cavity q^\\i(u) held fixed.
    """
    xp = array_namespace(X)
    nu, mu = site_precision, site_shift
    if At is None:
        At, _ = project(kernel, X, Z, post.L_K_inv)
    Kdiag = kernel.Kdiag(X)
    Qt = At @ post.L_C_inv.mT  # row i = L_C^-1 L_K^-1 k_i
    d = xp.sum(Qt * Qt, axis=1)  # k_i^T B^-1 k_i = upsilon_i^T Sigma upsilon_i
    e = Qt @ post.h  # k_i^T B^-1 c = upsilon_i^T mean
    s = Kdiag - xp.sum(At * At, axis=1)  # FITC conditional variance (eq. 16)

    one_minus = 1.0 - nu * d
    valid = one_minus > _CAVITY_EPS
    one_minus = xp.where(valid, one_minus, 1.0)
    v = d / one_minus  # cavity variance of g_i
    a = (e - mu * d) / one_minus  # cavity mean of g_i: v (e/d - mu), without dividing by d
    b = 1.0 + s + v
    log_zi, alpha, gamma = probit_tilted(y, a, b)

    # New site (eq. 23): the moment-matched marginal along upsilon_i divided by the cavity.
    denom = 1.0 - v * gamma
    new_nu = xp.where(valid, gamma / denom, nu)
    new_mu = xp.where(valid, (alpha + a * gamma) / denom, mu)

    # log Z_q terms: log Z_i + a^2/(2v) + log(v)/2 - e^2/(2d) - log(d)/2, rewritten without 1/d.
    terms = log_zi + (nu * e * e - 2.0 * mu * e + mu * mu * d) / (2.0 * one_minus) - 0.5 * xp.log(one_minus)
    log_z_terms = xp.sum(xp.where(valid, terms, 0.0))

    if not want_grad:
        return BlockResult(new_nu, new_mu, valid, log_z_terms, None, {})

    # d log Z_i / d xi with the cavity fixed: log Z_i = log Phi(y a / sqrt(b)) with a = k^T K^-1 m^\\i,
    # b = 1 + K_ii - k^T K^-1 k + k^T K^-1 Sigma^\\i K^-1 k. With g_i = B^-1 k_i, beta = B^-1 c:
    #   K^-1 m^\\i = beta + r_i g_i,  K^-1 Sigma^\\i upsilon_i = t_i g_i,
    #   r_i = (nu e - mu)/(1 - nu d),  t_i = 1/(1 - nu d).
    # Adjoints: dKnm_i = alpha_i (beta + r_i g_i) + (alpha a / b)_i (upsilon_i - t_i g_i),
    #           dKdiag_i = -(alpha a / b)_i / 2,
    #           dKmm = -U^T (dKnm + diag(dKdiag) U)   (U rows upsilon_i: K enters through K^-1 k and s).
    # In factored form g_i = L_K^-T L_C^-T Qt_i and upsilon_i = L_K^-T At_i.
    alpha = xp.where(valid, alpha, xp.zeros_like(alpha))
    alpha_a_b = alpha * a / b
    coef_g = (alpha * (nu * e - mu) - alpha_a_b) / one_minus  # alpha r - (alpha a / b) t
    dKdiag = -0.5 * alpha_a_b
    inner = (Qt * coef_g[:, None]) @ post.L_C_inv + At * alpha_a_b[:, None]
    dKnm = alpha[:, None] * post.beta[None, :] + inner @ post.L_K_inv
    U = At @ post.L_K_inv
    dKmm_data = -(U.mT @ (dKnm + U * dKdiag[:, None]))
    grads = kernel.grads(None, dKnm, dKdiag, X, Z)
    return BlockResult(new_nu, new_mu, valid, log_z_terms, dKmm_data, grads)


def _prior_adjoint(post):
    """-0.5 M of seed 000 eqs. 34-35: M = K^-1 - K^-1 Sigma K^-1 - K^-1 m m^T K^-1 = K^-1 - B^-1 - beta beta^T."""
    W = post.L_C_inv @ post.L_K_inv  # B^-1 = W^T W
    beta = post.beta
    return -0.5 * (post.L_K_inv.mT @ post.L_K_inv - W.mT @ W - beta[:, None] * beta[None, :])


def _row_blocks(n, block_rows):
    step = n if not block_rows else max(1, int(block_rows))
    return [(start, min(n, start + step)) for start in range(0, n, step)]


def evaluate(kernel, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None):
    """One pass over the data at fixed (kernel, Z, sites).

    Returns a dict: ``log_z`` (0-d, log Z_q of eq. 26), ``site_precision``/``site_shift`` (undamped EP
    updates), ``valid`` (mask), ``grads`` (dict of gradients of eq. 4, incl. "Z") and ``posterior``.
    Rows are processed in blocks of ``block_rows`` so that n x m temporaries stay bounded.
    """
    xp = array_namespace(X)
    n = X.shape[0]
    L_K = prior_cholesky(kernel, Z, jitter)
    L_K_inv = _triangular_inverse(L_K)
    blocks = _row_blocks(n, block_rows)
    single = len(blocks) == 1
    S = None
    c_tilde = None
    cached_At = None
    for lo, hi in blocks:
        At, _ = project(kernel, X[lo:hi, :], Z, L_K_inv)
        S_b, c_b = site_sums(At, site_precision[lo:hi], site_shift[lo:hi])
        S = S_b if S is None else S + S_b
        c_tilde = c_b if c_tilde is None else c_tilde + c_b
        if single:
            cached_At = At
    post = posterior_from_sums(L_K, S, c_tilde, L_K_inv=L_K_inv)
    # log Z_q global part (eq. 26): 0.5 c^T B^-1 c + 0.5 log|K| - 0.5 log|B| = 0.5 |h|^2 - log|L_C|
    log_z = 0.5 * xp.sum(post.h * post.h) - xp.sum(xp.log(xp.linalg.diagonal(post.L_C)))
    new_nu, new_mu, valid = [], [], []
    grads = None
    dKmm = _prior_adjoint(post) if want_grad else None
    for lo, hi in blocks:
        res = block_pass(
            kernel,
            X[lo:hi, :],
            y[lo:hi],
            site_precision[lo:hi],
            site_shift[lo:hi],
            Z,
            post,
            want_grad=want_grad,
            At=cached_At,
        )
        log_z = log_z + res.log_z_terms
        new_nu.append(res.site_precision)
        new_mu.append(res.site_shift)
        valid.append(res.valid)
        if want_grad:
            dKmm = dKmm + res.dKmm_data
            grads = res.grads if grads is None else {k: grads[k] + res.grads[k] for k in grads}
    out = {
        "log_z": log_z,
        "site_precision": new_nu[0] if single else xp.concat(new_nu),
        "site_shift": new_mu[0] if single else xp.concat(new_mu),
        "valid": valid[0] if single else xp.concat(valid),
        "posterior": post,
        "grads": None,
    }
    if want_grad:
        prior_grads = kernel.grads(dKmm, None, None, None, Z)
        out["grads"] = {k: grads[k] + prior_grads[k] for k in grads}
    return out


def predict_latent(kernel, Z, post, X, block_rows=65536):
    """Mean and variance of f(x) under q (seed 000 eq. 36), variance including the latent noise."""
    xp = array_namespace(X)
    beta = post.beta
    means, variances = [], []
    for lo, hi in _row_blocks(X.shape[0], block_rows):
        At, Knm = project(kernel, X[lo:hi, :], Z, post.L_K_inv)
        Qt = At @ post.L_C_inv.mT
        means.append(Knm @ beta)
        variances.append(kernel.Kdiag(X[lo:hi, :]) - xp.sum(At * At, axis=1) + xp.sum(Qt * Qt, axis=1))
    if len(means) == 1:
        return means[0], variances[0]
    return xp.concat(means), xp.concat(variances)


# --------------------------------------------------------------------------------------------------
# training loop (seed 000 sec. 2.3): a parallel damped sweep of all sites, then a step on the
# hyper-parameters, repeated.


@dataclass
class TrainResult:
    kernel: object
    Z: object
    site_precision: object
    site_shift: object
    posterior: object
    log_z: float
    n_iter: int
    history: dict = field(default_factory=dict)
    converged: bool = False


def _finite(value):
    return math.isfinite(value)


def train(
    X,
    y,
    kernel,
    Z,
    *,
    jitter=1e-6,
    max_iter=250,
    damping=0.5,
    optimize=("kernel", "inducing"),
    optimizer=None,
    tol=1e-6,
    n_warmup=10,
    block_rows=None,
    site_precision=None,
    site_shift=None,
    callback=None,
):
    """Fit sites and hyper-parameters (seed 000 sec. 2.3).

    Each iteration evaluates everything at the current (theta, sites) in one pass: the undamped EP
    update of every site and the gradient of eq. 4. Sites are then damped (eq. 25) and the
    hyper-parameters take one step. ``n_warmup`` sweeps at fixed theta first give the gradient sites
    worth differentiating. With nothing to optimise, sweeps run until the largest site change is below
    ``tol`` (relative), as scikit-learn's ``optimizer=None``.

    Guard rails: a non-finite log Z_q or a failed Cholesky reverts to the last good state and halves
    the damping and the step sizes (as the authors' code does).
    """
    from ..optim import Rprop

    xp = array_namespace(X)
    n = X.shape[0]
    device = array_device(X)
    if site_precision is None:
        site_precision = xp.zeros((n,), dtype=X.dtype, device=device)
    if site_shift is None:
        site_shift = xp.zeros((n,), dtype=X.dtype, device=device)
    optimize = tuple(optimize)
    names = []
    if "kernel" in optimize:
        names += [k for k in kernel.params if k != "log_noise" or math.isfinite(float(kernel.params[k]))]
    if "inducing" in optimize:
        names.append("Z")
    if optimizer is None and names:
        optimizer = Rprop(initial_steps=_initial_steps(kernel, Z, names))

    history = {"log_marginal_likelihood": [], "time": [], "n_invalid_sites": [], "damping": []}
    t0 = time.perf_counter()
    good = None  # (kernel params, Z, sites, optimizer state) of the last finite evaluation
    failures = 0
    converged = False
    log_z_value = float("nan")
    result = None
    it = 0
    total_iters = max_iter + (n_warmup if names else 0)
    while it < total_iters:
        stepping = bool(names) and it >= (n_warmup if names else 0)
        try:
            result = evaluate(
                kernel, Z, X, y, site_precision, site_shift, jitter=jitter, want_grad=stepping, block_rows=block_rows
            )
            log_z_value = float(result["log_z"])
        except CholeskyError:
            log_z_value = float("nan")
        if not _finite(log_z_value):
            failures += 1
            if good is None or failures > 30:
                raise FloatingPointError(
                    "EP diverged: log Z_q is not finite and halving the damping and step sizes did not help "
                    f"(after {failures} attempts); try a smaller damping or standardised inputs"
                )
            kernel, Z, site_precision, site_shift, opt_state = good
            if optimizer is not None:
                optimizer.restore(opt_state)
                optimizer.scale_steps(0.5)
            damping *= 0.5
            continue
        failures = 0
        good = (kernel, Z, site_precision, site_shift, optimizer.snapshot() if optimizer is not None else None)
        valid = result["valid"]
        history["log_marginal_likelihood"].append(log_z_value)
        history["time"].append(time.perf_counter() - t0)
        history["n_invalid_sites"].append(int(xp.sum(xp.astype(~valid, xp.int64))))
        history["damping"].append(damping)
        if callback is not None:
            callback(it, log_z_value)

        new_nu = damping * result["site_precision"] + (1.0 - damping) * site_precision
        new_mu = damping * result["site_shift"] + (1.0 - damping) * site_shift
        change = float(
            xp.max(xp.abs(new_nu - site_precision)) / (1.0 + float(xp.max(xp.abs(site_precision))))
            + xp.max(xp.abs(new_mu - site_shift)) / (1.0 + float(xp.max(xp.abs(site_shift))))
        )
        site_precision, site_shift = new_nu, new_mu
        it += 1
        if stepping:
            params = dict(kernel.params)
            params["Z"] = Z
            grads = result["grads"]
            updated = optimizer.step({k: params[k] for k in names}, {k: grads[k] for k in names})
            params.update(updated)
            Z = params.pop("Z")
            kernel = kernel.with_params(params)
        elif not names and change < tol:
            converged = True
            break

    final = evaluate(kernel, Z, X, y, site_precision, site_shift, jitter=jitter, want_grad=False, block_rows=block_rows)
    return TrainResult(
        kernel=kernel,
        Z=Z,
        site_precision=site_precision,
        site_shift=site_shift,
        posterior=final["posterior"],
        log_z=float(final["log_z"]),
        n_iter=it,
        history=history,
        converged=converged,
    )


def _initial_steps(kernel, Z, names):
    """First step sizes: 0.01 in log space for kernel parameters, 1% of the spread of Z per dimension."""
    xp = array_namespace(Z)
    steps = {}
    for name in names:
        if name == "Z":
            spread = xp.std(Z, axis=0) if Z.shape[0] > 1 else xp.ones(Z.shape[1], dtype=Z.dtype, device=array_device(Z))
            spread = xp.where(spread > 0, spread, 1.0)
            steps[name] = 0.01 * (xp.zeros_like(Z) + spread[None, :])
        else:
            steps[name] = xp.zeros_like(kernel.params[name]) + 0.01
    return steps
