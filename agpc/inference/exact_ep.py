"""EP on the full GP: the model whose inducing points are the training rows, held fixed (the m = n limit of
``ep``), at the cost full-GP EP should have.

With Z = X the inducing values u are the latent values at the rows, so each site acts on u_i itself (upsilon_i = e_i,
no projection) and q(u) = N(Sigma mu, Sigma), Sigma = (K^-1 + D)^-1, K = K(X, X) + jitter I, D = diag(nu), is
parameterised as in Rasmussen & Williams (2006), sec. 3.6 (Alg. 3.5), through

    B = I + D^1/2 K D^1/2 = L L^T,    Sigma = D^-1/2 (I - B^-1) D^-1/2 = K - V^T V,   V = L^-1 D^1/2 K,

so that diag(Sigma)_i = (1 - (B^-1)_ii) / nu_i, and Sigma mu = K mu - K D^1/2 L^-T L^-1 D^1/2 K mu by two solves
with one right-hand side. Where nu_i Sigma_ii = 1 - (B^-1)_ii is small (``SMALL_SITE_SHARE``: a site that holds
little of its row's posterior precision, or none) the subtraction would cancel, and diag(Sigma)_i = K_ii - |v_i|^2
(Alg. 3.5's form, exact for site precisions of any size) is taken for those rows. One pass (the parallel damped
update of every site of Hernandez-Lobato & Hernandez-Lobato (2016), eq. 25, with log Z_q and its gradient at the
current hyper-parameters) therefore costs one n x n Cholesky factor and the inverse B^-1 from it (n^3 / 3 + 2 n^3 /
3 flops), which serves both the marginals and the gradient (R = D^1/2 B^-1 D^1/2), and a triangular solve with one
right-hand side a row of small share: none at a settled EP, every row at the first pass (no site yet). (Alg. 3.5's
V for every row would be a solve with n right-hand sides, n^3 flops, besides the inverse the gradient needs: twice
the arithmetic.) ``ep.evaluate`` on Z = X does several n x n factorisations and solves a pass instead, its n x m
algebra with m = n.

The model is ``ep``'s with its sites along e_i instead of upsilon_i = K^-1 k_i: the two differ by O(jitter) (the
latent at row i is u_i plus the kernel's latent noise, s_i = Kdiag_i - K_ii). The per-row EP algebra (cavities,
moment matching, log Z_q's terms) is ``ep``'s, with d_i = Sigma_ii, e_i = (Sigma mu)_i and prior_var_i = K_ii.

log Z_q (eq. 26) = g(q) - g(prior) + sum_i [log Z_i + g(cavity_i) - g(q) along u_i], with g(q) - g(prior) =
mu^T Sigma mu / 2 - log|B| / 2. Its gradient with the cavities fixed (eq. 4; equal to the derivative of log Z_q at
an EP fixed point) has the adjoint, with respect to K,

    dK = (beta beta^T - R) / 2 + diag(kappa) / 2,   beta = K^-1 Sigma mu = mu - R K mu,  R = (K + D^-1)^-1,

Rasmussen & Williams (2006), eq. 5.27's EP analogue (their b b^T - R), plus the latent noise's share through
s_i (kappa_i = -2 d log Z_i / d b_i, as in ``ep.block_pass``), and dKdiag = -kappa / 2.

More than two classes (Villacampa-Calvo & Hernandez-Lobato 2017): one such GP a class, each from its rows' total
sites along e_i (``multiclass_ep.site_totals``), the pairs' updates ``multiclass_ep.pair_update``'s, log Z_q the sum of
the classes' g(q_c) - g(prior_c) and the pairs' terms (eq. 9), the gradient class by class (eq. 10).

Everything here is written against the array API (the training rows are held whole: an n x n model).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backend import (
    add_outer,
    add_to_diagonal,
    array_namespace,
    cholesky,
    cholesky_inverse,
    cholesky_or_nan,
    read_rows,
    row_dot,
    solve_triangular,
)
from ..likelihoods import MULTICLASS_PROBIT, PROBIT
from . import ep, multiclass_ep, sites
from .posterior import PRIOR_FACTOR_NAME, posterior_from_sums

__all__ = ["evaluate", "posterior", "zero_sites", "validation_scores", "Marginals", "B_FACTOR_NAME"]

B_FACTOR_NAME = "B = I + D^1/2 K D^1/2 (the full-GP EP posterior)"

def _prior(kernel, Z, jitter):
    """K = K(Z, Z) + jitter I, the prior covariance of u (Z: the training rows), and K(Z, Z)'s diagonal; K is the
    kernel's new array, the jitter added in place (``_gradients`` takes it off again)."""
    K = kernel.K(Z)
    xp = array_namespace(K)
    diagonal = xp.asarray(xp.linalg.diagonal(K), copy=True)
    return add_to_diagonal(K, jitter, overwrite=True), diagonal


def _rows(X, y, Z):
    """The training rows (and labels) whole on Z's device: the model is n x n."""
    n = X.shape[0]
    if X.shape != Z.shape:
        raise ValueError(f"exact EP needs the inducing points to be the {n} training rows: Z has shape "
                         f"{tuple(Z.shape)}, X {tuple(X.shape)}")
    return read_rows(X, 0, n, Z), (None if y is None else read_rows(y, 0, n, Z))


def posterior(kernel, Z, site_precision, site_shift, *, jitter, checked=True):
    """q(u) in ``posterior.Posterior``'s factored form at the inducing points Z = X (for prediction, which is ``ep``'s):
    L_K = chol(K), and with A = L_K^T (the projection of e_i, ``ep``'s L_K^-1 k_i), C = I + L_K^T D L_K and
    c~ = L_K^T mu."""
    xp = array_namespace(Z)
    K, _ = _prior(kernel, Z, jitter)
    L_K = cholesky(K, what=PRIOR_FACTOR_NAME) if checked else cholesky_or_nan(K)
    root = xp.sqrt(site_precision)
    W = root[:, None] * L_K  # C - I = W^T W
    return posterior_from_sums(L_K, W.mT @ W, site_shift @ L_K, checked=checked)


@dataclass
class Marginals:
    """One GP's q(u) = N(Sigma mu, Sigma) over the rows, factored through B = I + D^1/2 K D^1/2 = L L^T, and its
    marginals: what a pass needs of it (``_marginals``)."""

    K: object  # K(X, X) + jitter I (no noise; ``_gradients`` takes the jitter off in place)
    jitter: float
    L: object  # chol(B)
    B_inverse: object  # B^-1 (the pass's own array: the gradient scales it in place into R)
    root: object  # D^1/2
    beta: object  # K^-1 Sigma mu = mu - R K mu
    mean: object  # Sigma mu: e_i
    var: object  # diag(Sigma): d_i
    prior_var: object  # diag(K): the prior variance of u_i
    noise_var: object  # s_i = Kdiag_i - K(X, X)_ii, the latent noise
    log_normaliser_gain: object  # g(q) - g(prior) = mu^T Sigma mu / 2 - log|B| / 2


SMALL_SITE_SHARE = 1e-2
"""Below this share nu_i d_i = 1 - (B^-1)_ii of row i's posterior precision that its own site holds, d_i is taken
from L^-1 D^1/2 k_i (``_marginals``) instead of (1 - (B^-1)_ii) / nu_i, whose subtraction would lose
eps / (nu_i d_i) of it (at most 1e-14 relative here, against about 1e-16)."""


def _marginals(kernel, Z, X, site_precision, site_shift, *, jitter, checked):
    """q's factor and marginals for one GP with sites (precision nu >= 0, shift mu) along e_i: one n x n Cholesky
    factor L of B and the inverse B^-1 from it (Rasmussen & Williams (2006), Alg. 3.5's posterior, with the marginal
    variances read from B^-1 instead of from V = L^-1 D^1/2 K, which takes a triangular solve with n right-hand
    sides: a third more arithmetic and at a slower rate than the inverse, which the gradient needs anyway).

    Sigma = (K^-1 + D)^-1 = D^-1/2 (I - B^-1) D^-1/2, so d_i = (1 - (B^-1)_ii) / nu_i, exact in exact arithmetic;
    where nu_i d_i is small (a site that holds a small share of the row's posterior precision: a row far from the
    boundary, or no site yet) that subtraction cancels, and d_i = K_ii - |L^-1 D^1/2 k_i|^2 (Alg. 3.5's form) is
    taken for those rows only: a triangular solve with as many right-hand sides as there are such rows."""
    xp = array_namespace(Z)
    nu, mu = site_precision, site_shift
    K, K_diagonal = _prior(kernel, Z, jitter)
    prior_var = K_diagonal + jitter
    root = xp.sqrt(nu)
    B = add_to_diagonal(root[:, None] * K * root[None, :], 1.0, overwrite=True)
    L = cholesky(B, what=B_FACTOR_NAME) if checked else cholesky_or_nan(B, overwrite=True)
    B_inverse = cholesky_inverse(L)
    K_mu = K @ mu
    solved = solve_triangular(L, root * K_mu, lower=True)  # L^-1 D^1/2 K mu
    scaled = root * solve_triangular(L, solved, lower=True, trans=True)  # R K mu
    site_share = 1.0 - xp.linalg.diagonal(B_inverse)  # nu_i d_i
    small = site_share < SMALL_SITE_SHARE
    var = site_share / xp.where(small, 1.0, nu)
    rows = xp.nonzero(small)[0]
    if rows.shape[0]:
        V = solve_triangular(L, root[:, None] * xp.take(K, rows, axis=1), lower=True)  # L^-1 D^1/2 k_i, those rows
        var[small] = xp.take(prior_var, rows) - row_dot(V, V, axis=-2)
    mean = K_mu - K @ scaled
    return Marginals(K=K, jitter=jitter, L=L, B_inverse=B_inverse, root=root, beta=mu - scaled, mean=mean, var=var,
                     prior_var=prior_var, noise_var=kernel.Kdiag(X) - K_diagonal,
                     log_normaliser_gain=0.5 * row_dot(mu, mean) - xp.sum(xp.log(xp.linalg.diagonal(L))))


def _gradients(kernel, Z, X, marg, kappa):
    """The gradient of log Z_q (eq. 4, cavities fixed) for one GP: the adjoint of K is (beta beta^T - R) / 2 plus the
    noise's share diag(kappa) / 2 (module docstring), R = D^1/2 B^-1 D^1/2 from the pass's inverse (scaled in place,
    and the outer product added in place) and O(n^2) besides; the latent noise's through Kdiag, -kappa / 2. The
    kernel's parameters only (the rows are not learned)."""
    root = marg.root
    dK = marg.B_inverse
    dK *= (-0.5 * root)[:, None]
    dK *= root[None, :]
    dK = add_to_diagonal(add_outer(dK, 0.5 * marg.beta, marg.beta), 0.5 * kappa, overwrite=True)
    # K(X, X) read as the cross-covariance of X with Z = X: its values are at hand (no distances again), the jitter
    # taken off in place (K's diagonal back to within an ulp of K(X, X)'s; a copy of K would be one more n x n array)
    K_rows = add_to_diagonal(marg.K, -marg.jitter, overwrite=True)
    marg.B_inverse = marg.K = None  # (overwritten)
    grads = kernel.grads(None, dK, -0.5 * kappa, X, Z, Knm=K_rows, overwrite=True)
    grads.pop("Z")  # (the Z side's share only: the exact model's inducing points are the rows, not learned)
    return grads


def _damped(out, new_nu, new_mu, nu, mu, valid, damping):
    """The pass's per-row output: new sites, damped by eq. 25 when ``damping`` is given, with the maxima the batch
    loop's stopping measure reads (``ep.relative_site_change``)."""
    xp = array_namespace(nu)
    if damping is not None:
        new_nu = damping * new_nu + (1.0 - damping) * nu
        new_mu = damping * new_mu + (1.0 - damping) * mu
        out["site_change"] = xp.stack([xp.max(xp.abs(new_nu - nu)), xp.max(xp.abs(nu)),
                                       xp.max(xp.abs(new_mu - mu)), xp.max(xp.abs(mu))])
    out.update(site_precision=new_nu, site_shift=new_mu, valid=valid)


def evaluate(kernel, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None, want_sites=True,
             damping=None, checked=True, nonnegative_sites=False, site_sums=None, want_next_sums=False, weights=None,
             likelihood=None):
    """One parallel EP pass over all rows of the full GP at fixed (kernel, sites): ``ep.evaluate``'s contract with
    Z = X (``block_rows`` is not used: the model is n x n), and ``multiclass_ep.evaluate``'s for a ``ClassKernels``
    with Z (C, n, d), one GP a class (Villacampa-Calvo & Hernandez-Lobato (2017): the pairs' updates are
    ``multiclass_ep.pair_update``, each class's marginals this module's). Returns a dict: ``log_z`` (0-d, eq. 26),
    the updated ``site_precision`` / ``site_shift`` (damped by ``damping`` when given, with ``site_change`` the
    maxima ``ep.relative_site_change`` reads), ``valid``, ``n_invalid`` (0-d), ``grads`` (eq. 4 with the cavities
    fixed, the kernel's parameters only: the exact model's inducing points are the rows, never moved) and
    ``posterior`` (``posterior.Posterior``, a tuple of them a class; built only when ``want_sites`` is False: the final
    pass, the training steps do not need it). Site precisions must be non-negative (the probit's always are);
    ``checked=False``: a failed factorisation gives a NaN log Z_q and no host synchronisation.
    ``nonnegative_sites``, ``site_sums``, ``want_next_sums``: ``ep.evaluate``'s, taken so that the batch EP engine
    drives either pass, and not used: the full GP keeps no sums of its sites between passes (its one factorisation,
    of I + D^1/2 K D^1/2 with D the site precisions, is new at every pass), so no ``site_sums`` come back.
    ``weights`` (n,) or None: the rows' sample weights, by power EP (``_weighted_evaluate``; for C classes
    ``_evaluate_classes``). ``likelihood``: the model's (``ep.block_pass``, ``multiclass_ep.pair_update``; None: the
    probit, or the multiclass probit for C classes); a binary one's site precisions are cut at 0 where its tilted
    moments would make them negative (a likelihood that is not log-concave)."""
    if kernel.n_latent > 1:
        return _evaluate_classes(kernel, Z, X, y, site_precision, site_shift, jitter=jitter, want_grad=want_grad,
                                 want_sites=want_sites, damping=damping, checked=checked, weights=weights,
                                 likelihood=MULTICLASS_PROBIT if likelihood is None else likelihood)
    likelihood = PROBIT if likelihood is None else likelihood
    if weights is not None:
        return _weighted_evaluate(kernel, Z, X, y, site_precision, site_shift, weights, jitter=jitter,
                                  want_grad=want_grad, want_sites=want_sites, damping=damping, checked=checked,
                                  likelihood=likelihood)
    xp = array_namespace(Z)
    X, y = _rows(X, y, Z)
    nu, mu = site_precision, site_shift
    marg = _marginals(kernel, Z, X, nu, mu, jitter=jitter, checked=checked)
    valid, one_minus, v, a = sites.cavity(nu, mu, marg.var, marg.mean, marg.prior_var)
    b = 1.0 + marg.noise_var + v
    site = likelihood.at(kernel).site_terms(y, a, b)
    log_zi, alpha, gamma = site.log_z, site.alpha, site.gamma
    new_nu, new_mu = sites.moment_matched_site(valid, nu, mu, a, v, alpha, gamma, nonnegative=True)  # (sqrt(nu) below)
    terms = xp.where(valid, log_zi + sites.removal_terms(nu, mu, marg.var, marg.mean, one_minus), 0.0)
    out = {"log_z": marg.log_normaliser_gain + xp.sum(terms), "n_invalid": xp.sum(xp.astype(~valid, Z.dtype)),
           "valid": None, "site_precision": None, "site_shift": None, "site_change": None, "grads": None,
           "posterior": None}
    if want_sites:
        _damped(out, new_nu, new_mu, nu, mu, valid, damping)
    else:
        out["posterior"] = posterior(kernel, Z, nu, mu, jitter=jitter, checked=checked)
    if want_grad:
        kappa = sites.variance_adjoint(site, xp.where(valid, alpha, 0.0), a, b, valid, None)  # -2 d log Z_i / d b_i
        out["grads"] = _gradients(kernel, Z, X, marg, kappa)
    return out


def _weighted_evaluate(kernel, Z, X, y, site_precision, site_shift, weights, *, jitter, want_grad, want_sites,
                       damping, checked, likelihood):
    """``evaluate`` with a sample weight w_i >= 0 a row: power EP (Minka 2004) on the factor p(y_i | f_i)^w_i with
    power 1 / w_i. The stored site (nu_i, mu_i) is one copy's, q holds it w_i times (D = diag(w nu), shift w mu);
    a pass removes one copy from q's marginal (the cavity), matches the moments of the cavity times one likelihood
    (the probit's closed form) and takes the new copy; log Z_q's per-row terms and the noise's share of the gradient
    count w_i times. At integer w_i these are EP's updates and energy on w_i copies of the row that share one site
    (the symmetric fixed point of EP on the repeated rows); a row of weight 0 is in neither q nor log Z_q, and its
    site is left as it is (the model of the other rows, exactly). With w_i < 1 the cavity holds less than the other
    rows' share of q and may be wider than the prior: only a non-positive cavity variance is invalid then."""
    xp = array_namespace(Z)
    X, y = _rows(X, y, Z)
    nu, mu = site_precision, site_shift
    marg = _marginals(kernel, Z, X, weights * nu, weights * mu, jitter=jitter, checked=checked)
    valid, one_minus, v, a = sites.weighted_cavity(nu, mu, marg.var, marg.mean, marg.prior_var, weights)
    b = 1.0 + marg.noise_var + v
    site = likelihood.at(kernel).site_terms(y, a, b)
    log_zi, alpha, gamma = site.log_z, site.alpha, site.gamma
    new_nu, new_mu = sites.moment_matched_site(valid, nu, mu, a, v, alpha, gamma, nonnegative=True)
    terms = xp.where(valid, log_zi + sites.removal_terms(nu, mu, marg.var, marg.mean, one_minus), 0.0)
    out = {"log_z": marg.log_normaliser_gain + xp.sum(weights * terms),
           "n_invalid": sites.counted_invalid(valid, weights, Z), "valid": None, "site_precision": None,
           "site_shift": None, "site_change": None, "grads": None, "posterior": None}
    if want_sites:
        _damped(out, new_nu, new_mu, nu, mu, valid, damping)
    else:
        out["posterior"] = posterior(kernel, Z, weights * nu, weights * mu, jitter=jitter, checked=checked)
    if want_grad:
        # -2 d (w_i log Z_i) / d b_i
        kappa = sites.variance_adjoint(site, weights * xp.where(valid, alpha, 0.0), a, b, valid, weights)
        out["grads"] = _gradients(kernel, Z, X, marg, kappa)
    return out


def _evaluate_classes(kernels, Z, X, y, site_precision, site_shift, *, jitter, want_grad, want_sites, damping,
                      checked, weights=None, likelihood=MULTICLASS_PROBIT):
    """``evaluate`` for C classes: each class's GP q_c from its rows' total sites (``multiclass_ep.site_totals``),
    the pairs' updates from the classes' marginals, log Z_q = sum_c g(q_c) - g(prior_c) + the pairs' terms
    (Villacampa-Calvo & Hernandez-Lobato (2017), eq. 9), the gradient class by class (eq. 10; each class's kappa
    summed over its sites, ``multiclass_ep.pair_update``). ``weights``: the rows' sample weights by power EP, q_c
    from w_i times each row's totals and the pairs' updates ``multiclass_ep.pair_update``'s with them."""
    xp = array_namespace(Z)
    C = Z.shape[0]
    X, y = _rows(X, y, Z[0, ...])
    totals = multiclass_ep.weighted_totals(
        multiclass_ep.site_totals(site_precision, site_shift, multiclass_ep.one_hot_labels(y, C)), weights)
    margs = [_marginals(kernels[c], Z[c, ...], X, totals[0][:, c], totals[1][:, c], jitter=jitter, checked=checked)
             for c in range(C)]
    update = multiclass_ep.pair_update(y, site_precision, site_shift, *(xp.stack([getattr(mg, key) for mg in margs],
                                                                               axis=1)
                                                                      for key in ("var", "mean", "prior_var",
                                                                                  "noise_var")),
                                       want_grad=want_grad, weights=weights, likelihood=likelihood)
    log_z = update.log_z_terms
    for marg in margs:
        log_z = log_z + marg.log_normaliser_gain
    n_invalid = xp.sum(xp.astype(~update.valid, Z.dtype)) if update.n_invalid is None else update.n_invalid
    out = {"log_z": log_z, "n_invalid": n_invalid, "valid": None,
           "site_precision": None, "site_shift": None, "site_change": None, "grads": None, "posterior": None}
    if want_sites:
        _damped(out, update.site_precision, update.site_shift, site_precision, site_shift, update.valid, damping)
    else:
        out["posterior"] = tuple(posterior(kernels[c], Z[c, ...], totals[0][:, c], totals[1][:, c], jitter=jitter,
                                           checked=checked) for c in range(C))
    if want_grad:
        grads = {}
        for c in range(C):
            class_grads = _gradients(kernels[c], Z[c, ...], X, margs[c], update.kappa[:, c])
            grads.update({f"{c}:{name}": value for name, value in class_grads.items()})
        out["grads"] = grads
    return out


def zero_sites(n, Z):
    """No site yet: (n,) for two classes, (n, 2C) for C (``multiclass_ep``'s storage)."""
    return (multiclass_ep if Z.ndim == 3 else ep).zero_sites(n, Z)


def validation_scores(kernel, Z, post, X_val, y_val, **likelihood):
    """Test NLL and error of q under the model's ``likelihood`` (``ep.validation_scores``,
    ``multiclass_ep.validation_scores`` for C classes)."""
    return (multiclass_ep if kernel.n_latent > 1 else ep).validation_scores(kernel, Z, post, X_val, y_val, **likelihood)
