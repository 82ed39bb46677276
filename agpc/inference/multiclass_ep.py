"""Multiclass EP, SEP and ADF with inducing points (Villacampa-Calvo & Hernandez-Lobato 2017).

Model (Villacampa-Calvo & Hernandez-Lobato (2017), sec. 2.1, Kim & Ghahramani 2006): one latent GP f_c per class c =
0..C-1, each with its own kernel and its own m inducing points Z_c and values u_c ~ N(0, K_c); the label is argmax_c
f_c(x) where each f_c carries Gaussian latent noise (the kernel's ``noise``, in K_c(x, x)). With the FITC conditional
f_ic | u_c ~ N(m_ic, s_ic), m_ic = upsilon_ic^T u_c, upsilon_ic = K_c^-1 k_ic, s_ic = K_c(x_i, x_i) - k_ic^T
K_c^-1 k_ic, the likelihood of row i is p(f_{y_i} > f_k for all k != y_i | u), approximated by the product
of probits of Villacampa-Calvo & Hernandez-Lobato (2017), eq. 6:

    prod_{k != y_i} Phi((m_{i y_i} - m_ik) / sqrt(s_{i y_i} + s_ik)).

Each factor (i, k) depends on u only through the two scalars g_{i y_i} = upsilon_{i y_i}^T u_{y_i} and
g_ik = upsilon_ik^T u_k. EP approximates it by a Gaussian site that factorises over the two classes (q is
assumed to factorise over classes, Villacampa-Calvo & Hernandez-Lobato (2017), sec. 2.2): two one-dimensional sites, one
along upsilon_{i y_i} in class y_i and one along upsilon_ik in class k, each stored as (precision, shift) like a
binary site - four numbers per (i, k). For each class, q_c is then exactly the binary model's posterior
with a row's total site along upsilon_ic: the sum of its C - 1 "true class" parts if c = y_i, the one
"wrong class" part of the pair (i, c) otherwise. So all the m x m algebra, the marginals, the cavities and
the gradient adjoints are the binary ones (``ep``), class by class.

Tilted moments for the pair (i, k): with independent cavities g_y ~ N(a_y, v_y), g_k ~ N(a_k, v_k),
Z_ik = Phi((a_y - a_k) / sqrt(b)), b = s_y + s_k + v_y + v_k; d log Z / d a_y = alpha = -d log Z / d a_k and
-d^2 log Z / d a^2 = gamma for both, so each class's part is a binary site update with alpha signed.

Storage: ``site_precision`` and ``site_shift`` of shape (n, 2C): column k holds the class-k part of the
pair (i, k), column C + k the class-y_i part of the same pair (entries k = y_i unused, zero).

Labels inside this module are class indices 0..C-1 stored as floats (so they read from disk and move
between devices like the binary +1/-1 labels).
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

from ..backend import array_device, array_namespace, lower_triangular_inverse, prefers_inverses, row_dot
from ..likelihoods import MULTICLASS_PROBIT, argmax_log_proba, negative_log_likelihood
from . import blocks, ep, sites
from .posterior import (Factor, covariance_form, covariance_product, posterior_from_sums, prior_cholesky,
                        uses_inverse)

__all__ = [
    "MultiFactor",
    "MultiAnchor",
    "evaluate",
    "evaluate_factor",
    "exact_factor",
    "anchored_factor",
    "posterior_from_factor",
    "predict_latent",
    "predictive_log_proba",
    "zero_sites",
    "uniform_factor",
    "validation_scores",
    "one_hot_labels",
    "pair_update",
    "PairUpdate",
    "site_totals",
    "true_class_values",
    "add_prior_gradients",
    "prior_choleskys",
    "class_site_sums",
    "known_nonnegative",
    "posteriors_from_sums",
    "class_sweep",
    "finish_evaluate",
    "factor_cavity",
    "finish_factor",
]


def n_classes(Z):
    return Z.shape[0]


def zero_sites(n, Z):
    xp = array_namespace(Z)
    return xp.zeros((n, 2 * n_classes(Z)), dtype=Z.dtype, device=array_device(Z))


def one_hot_labels(y, C):
    """(b, C) bool: column c is True where the row's label is class c."""
    xp = array_namespace(y)
    classes = xp.arange(C, dtype=y.dtype, device=array_device(y))
    return y[:, None] == classes[None, :]


def true_class_values(values, onehot):
    """(b, 1): each row's value in its own label's column."""
    xp = array_namespace(values)
    return xp.sum(xp.where(onehot, values, 0.0), axis=1, keepdims=True)


def site_totals(site_precision, site_shift, onehot):
    """(b, C) total site along upsilon_ic per row and class: the C - 1 true-class parts summed in the
    label's column, the pair's wrong-class part elsewhere."""
    xp = array_namespace(site_precision)
    C = onehot.shape[1]
    nu_k, nu_y = site_precision[:, :C], site_precision[:, C:]
    mu_k, mu_y = site_shift[:, :C], site_shift[:, C:]
    nu = xp.where(onehot, xp.sum(nu_y, axis=1, keepdims=True), nu_k)
    mu = xp.where(onehot, xp.sum(mu_y, axis=1, keepdims=True), mu_k)
    return nu, mu


# -- the likelihood factor in u-space, one per class (SEP / ADF / minibatch EP) ----------------------

@dataclass
class MultiFactor:
    factors: tuple  # one Factor per class

    @classmethod
    def uniform(cls, Z):
        return cls(tuple(Factor.uniform(Z.shape[1], Z[c, ...]) for c in range(n_classes(Z))))

    def combine(self, keep, other, weight):
        return MultiFactor(tuple(a.combine(keep, b, weight) for a, b in zip(self.factors, other.factors)))

    @property
    def precision(self):
        return array_namespace(self.factors[0].precision).stack([f.precision for f in self.factors])

    @property
    def shift(self):
        return array_namespace(self.factors[0].shift).stack([f.shift for f in self.factors])


def uniform_factor(Z):
    return MultiFactor.uniform(Z)


class MultiAnchor:
    """Minibatch EP's anchor (``ep.Anchor``) of a multiclass model: the ``ClassKernels``, Z (C, m, d) and each
    class's L_K of the running product's last exact rebuild; ``anchor[c]`` is class c's ``ep.Anchor``."""

    def __init__(self, kernel, Z, L_K, jitter, L_K_inv=None):
        self.kernel, self.Z, self.jitter = kernel, Z, float(jitter)
        self.classes = tuple(ep.Anchor(kernel[c], Z[c, ...], L_K[c], jitter,
                                       L_K_inv=None if L_K_inv is None else L_K_inv[c]) for c in range(len(L_K)))

    @property
    def L_K(self):
        return array_namespace(self.Z).stack([a.L_K for a in self.classes])

    def __getitem__(self, c):
        return self.classes[c]


def factor_from_posteriors(posts):
    """One class's factor from each class's q (``posterior.Factor.from_posterior``)."""
    return MultiFactor(tuple(Factor.from_posterior(post) for post in posts))


# -- one block of rows ------------------------------------------------------------------------------

@dataclass
class MultiBlockResult:
    site_precision: object  # (b, 2C) undamped updates (invalid pairs keep the old values)
    site_shift: object
    valid: object  # (b, C): the pair (i, k) had usable cavities (True in the label's own column)
    log_z_terms: object
    dKmm_data: tuple  # per class
    grads: dict  # flat "<class>:<name>" and "Z" (C, m, d)
    sums: tuple = None  # per class (S_new, c_new, S_old, c_old), whitened
    n_invalid: object = None  # 0-d: failed pairs of rows of positive weight (sample weights); None: the sweep counts


@dataclass
class PairUpdate:
    """The pairs' EP update for a block of rows (``pair_update``), from each class's marginals along upsilon_ic."""

    site_precision: object  # (b, 2C) undamped updates (invalid pairs keep the old values)
    site_shift: object
    valid: object  # (b, C), True in the label's own column
    log_z_terms: object  # 0-d
    n_invalid: object = None  # 0-d with ``weights``: failed pairs of rows of positive weight (None: count ~valid)
    alpha: object = None  # (b, C): d log Z / d (cavity mean) summed over the sites a row has in class c
    kappa: object = None  # (b, C): -2 d log Z / d b, likewise
    coef: object = None  # (b, C): the coefficient of g_ic (``sites.adjoint_coefficient``), likewise
    coef_held: object = None  # (b, C): with ``held``, the coefficient of g'_ic (``sites.held_adjoint_coefficient``)


def _pair_cavities(wrong_class, true_class, row_weights, own_sites):
    """``pair_update``'s cavities: each pair's removes only its own part from each of its two classes (parallel EP),
    ``wrong_class`` / ``true_class`` (nu, mu, d, e, prior variance, held (d_h, e_h, cross) or None) of the class k
    and of the row's own class y, with ``row_weights`` (b, 1) by power EP (``own_sites``: q holds w_i copies of a
    site; SEP / ADF: none); a row of weight 0 has no valid pair. Returns ``sites.cavity``'s four for each part."""
    nu_k, mu_k, d, e, prior_var, held = wrong_class
    nu_y, mu_y, d_y, e_y, pv_y, held_y = true_class
    if held is not None:
        powers = row_weights if own_sites else None
        part_k = sites.held_cavity(nu_k, mu_k, d, e, prior_var, *held, powers)
        part_y = sites.held_cavity(nu_y, mu_y, d_y, e_y, pv_y, *held_y, powers)
        if row_weights is None:
            return part_k, part_y
    elif row_weights is None:
        return sites.cavity(nu_k, mu_k, d, e, prior_var), sites.cavity(nu_y, mu_y, d_y, e_y, pv_y)
    else:
        xp = array_namespace(d)
        powers = row_weights if own_sites else xp.ones_like(row_weights)  # (SEP / ADF: no copy of a site in q)
        part_k = sites.weighted_cavity(nu_k, mu_k, d, e, prior_var, powers)
        part_y = sites.weighted_cavity(nu_y, mu_y, d_y, e_y, pv_y, powers)
    return (part_k[0] & (row_weights > 0), *part_k[1:]), part_y


def pair_update(y, site_precision, site_shift, d, e, prior_var, s, *, want_grad=True, weights=None, own_sites=True,
                held=None, adf=False, likelihood=MULTICLASS_PROBIT):
    """Cavities, moment matching and log Z_q terms of every pair (i, k) of a block of rows, from each class's marginal
    of q along upsilon_ic (``d``, ``e``, ``prior_var``, ``s``: (b, C), as ``ep.Marginals`` holds them), and with
    ``want_grad`` the per-class coefficients of the gradient's data part (``ep.data_adjoint``; the full-GP pass of
    ``exact_ep`` needs only ``kappa``).

    ``weights`` (b,): the rows' sample weights by power EP (Minka 2004), as the binary pass takes them: q holds w_i
    copies of each of row i's pair sites (the marginals given are of that q), each pair's cavity removes one copy of
    its two parts (``sites.weighted_cavity``: a row of weight 0 has no valid pair and no update), and the pairs' log Z_q
    terms and gradient coefficients count w_i times. ``own_sites=False`` (SEP / ADF: zero sites, the marginals are
    the tied cavity's): the cavity is checked as without weights, and only the weights' factors apply. ``adf``: the
    cavity is q itself (ADF), and each pair's term also takes ``sites.adf_removal_terms`` of its two new parts.

    ``held`` (minibatch EP whose running product holds the rows' sites along other directions than their current
    ones: ``ep.Anchor``): (d_h, e_h, cross), each (b, C), q along each row's held direction in each class
    (``sites.Held``); each pair's parts leave q along them (``sites.held_cavity``)."""
    xp = array_namespace(d)
    C = d.shape[1]
    onehot = one_hot_labels(y, C)
    wrong = ~onehot
    nu_k, nu_y = site_precision[:, :C], site_precision[:, C:]
    mu_k, mu_y = site_shift[:, :C], site_shift[:, C:]
    d_y, e_y, pv_y, s_y = (true_class_values(v, onehot) for v in (d, e, prior_var, s))
    held_y = None if held is None else tuple(true_class_values(v, onehot) for v in held)
    row_weights = None if weights is None else weights[:, None]
    wrong_class, true_class = (nu_k, mu_k, d, e, prior_var, held), (nu_y, mu_y, d_y, e_y, pv_y, held_y)
    (valid_k, om_k, v_k, a_k), (valid_y, om_y, v_y, a_y) = _pair_cavities(wrong_class, true_class, row_weights,
                                                                          own_sites)
    valid = wrong & valid_k & valid_y
    b = s_y + s + v_y + v_k
    diff = a_y - a_k
    log_zp, alpha, gamma, *_ = likelihood.pair_terms(diff, b)
    new_nu_y, new_mu_y = sites.moment_matched_site(valid, nu_y, mu_y, a_y, v_y, alpha, gamma)
    new_nu_k, new_mu_k = sites.moment_matched_site(valid, nu_k, mu_k, a_k, v_k, -alpha, gamma)
    new_nu = xp.concat([new_nu_k, new_nu_y], axis=1)
    new_mu = xp.concat([new_mu_k, new_mu_y], axis=1)

    # log Z_q terms (Villacampa-Calvo & Hernandez-Lobato (2017), eq. 9 in the one-dimensional form of Hernandez-Lobato &
    # Hernandez-Lobato (2016), eq. 26): log Z_ik plus g(cavity) - g(q) in each of the two classes the pair touches.
    # (a rank-one removal's g(cavity) - g(q) depends only on q along the direction removed)
    out_y, out_k = ((d_y, e_y), (d, e)) if held is None else (held_y[:2], held[:2])
    terms = log_zp + sites.removal_terms(nu_y, mu_y, *out_y, om_y) + sites.removal_terms(nu_k, mu_k, *out_k, om_k)
    if adf:  # ADF: the cavity is q, the pair's parts in it its new ones (sites.adf_removal_terms)
        terms = (terms + sites.adf_removal_terms(a_y, v_y, alpha, gamma)
                 + sites.adf_removal_terms(a_k, v_k, -alpha, gamma))
    n_invalid = None
    if weights is not None:  # each pair's term w_i times; the failed pairs of rows in the model counted
        terms = terms * row_weights
        n_invalid = sites.counted_invalid(valid | onehot, row_weights, d)
    log_z_terms = xp.sum(xp.where(valid, terms, 0.0))
    out_valid = valid | onehot
    if not want_grad:
        return PairUpdate(new_nu, new_mu, out_valid, log_z_terms, n_invalid)
    return PairUpdate(new_nu, new_mu, out_valid, log_z_terms, n_invalid,
                      *_pair_gradient(alpha, diff, b, valid, onehot, row_weights, wrong_class, true_class, om_k, om_y))


def _pair_gradient(alpha, diff, b, valid, onehot, row_weights, wrong_class, true_class, om_k, om_y):
    """``pair_update``'s coefficients of the gradient's data part (Villacampa-Calvo & Hernandez-Lobato (2017), eq. 10
    with the cavities fixed): per class, the binary adjoints with the coefficients of every site the row has along
    upsilon_ic added up. From the pairs' alpha = d log Z_ik / d (a_y - a_k), ``diff`` = a_y - a_k and ``b``, the parts
    ``wrong_class`` / ``true_class`` as ``_pair_cavities`` takes them and their 1 - nu d (``om_k``, ``om_y``). Returns
    ``PairUpdate``'s (alpha, kappa, coef, coef_held), each (b, C); coef_held None where no site is held elsewhere."""
    xp = array_namespace(alpha)
    nu_k, mu_k, _, e, _, held = wrong_class
    nu_y, mu_y, _, e_y, _, held_y = true_class
    zero = xp.zeros_like(alpha)
    alpha = xp.where(valid, alpha, zero)
    if row_weights is not None:  # (kappa and the coefficients follow alpha: each pair's term w_i times)
        alpha = alpha * row_weights
    kappa = alpha * diff / b  # -2 d log Z_ik / d b

    def per_class(wrong_part, true_parts):
        return xp.where(onehot, xp.sum(true_parts, axis=1, keepdims=True), wrong_part)

    alpha_c = per_class(-alpha, alpha)
    kappa_c = per_class(kappa, kappa)
    if held is not None:  # g_ic's coefficient is -kappa a site; g'_ic's by ``sites.held_adjoint_coefficient``
        coef_held = per_class(sites.held_adjoint_coefficient(-alpha, kappa, nu_k, mu_k, held[1], held[2], om_k),
                              sites.held_adjoint_coefficient(alpha, kappa, nu_y, mu_y, held_y[1], held_y[2], om_y))
        return alpha_c, kappa_c, -kappa_c, coef_held
    coef_k = sites.adjoint_coefficient(-alpha, kappa, nu_k, mu_k, e, om_k)
    coef_y = sites.adjoint_coefficient(alpha, kappa, nu_y, mu_y, e_y, om_y)
    coef_c = per_class(coef_k, coef_y)
    return alpha_c, kappa_c, coef_c, None


def weighted_totals(totals, weights):
    """Per-class site totals (``site_totals``) as q holds them: w_i times with sample weights (power EP), else as
    they are."""
    if weights is None:
        return totals
    return totals[0] * weights[:, None], totals[1] * weights[:, None]


def covariance_marginals(kernel, X, Z, post, A=None, Knm=None):
    """``ep.marginals`` for a class of a block whose data gradient goes through the explicit inverses
    (``ep.explicit_block_gradient``) in float64 (``posterior.covariance_form``): P = C^-1 A (``covariance_product``)
    in the place of Q, which is not formed (``Marginals.Q`` is None)."""
    if A is None:
        Knm = kernel.K(X, Z)
        A = post.solve_K(Knm.mT)
    P, d, e = covariance_product(post, A)
    prior_var = row_dot(A, A, axis=-2)
    return ep.Marginals(A, Knm, None, d, e, prior_var, kernel.Kdiag(X) - prior_var, P=P)


def block_pass(kernels, X, y, site_precision, site_shift, Z, posts, *, want_grad=True, want_sums=False, weights=None,
               own_sites=True, anchors=None, damping=None, adf=False, projections=None, likelihood=MULTICLASS_PROBIT,
               explicit=False):
    """Cavities, moment matching, log Z_q terms and gradient adjoints for a block of rows, all classes (``weights``,
    ``own_sites``, ``adf``: ``pair_update``'s; the sums of the rows' sites then weigh each row's w_i times). Minibatch
    EP (``damping`` given): the sums are the change of the running product, class by class, each row's old site
    total out along the direction it is held along (``anchors``: a ``MultiAnchor``, or None: the current one) and its
    damped new one in (``ep.product_change``), as whitened sums. ``projections``: the block's per-class (A_c,
    K(X, Z_c)) formed already (``class_site_sums``), or None. ``likelihood``: the model's (``pair_update``).
    ``explicit`` (no ``anchors``): each class's data gradient through the explicit inverses of its factors
    (``ep.explicit_block_gradient``, as batch EP's binary pass), its ``dKmm`` the pair (A R'^T, A alpha) that
    ``class_sweep`` turns into the m x m adjoint once the blocks are added."""
    xp = array_namespace(X)
    C = n_classes(Z)
    explicit = explicit and anchors is None
    covariance = covariance_form(explicit, want_grad, Z)  # (then P = C^-1 A, not Q: ``covariance_marginals``)
    marginals = covariance_marginals if covariance else ep.marginals
    margs = [marginals(kernels[c], X, Z[c, ...], posts[c], *(() if projections is None else projections[c]))
             for c in range(C)]
    d = xp.stack([mg.d for mg in margs], axis=1)
    e = xp.stack([mg.e for mg in margs], axis=1)
    prior_var = xp.stack([mg.prior_var for mg in margs], axis=1)
    s = xp.stack([mg.s for mg in margs], axis=1)
    helds = None
    if anchors is not None and own_sites:
        helds = [sites.held_marginals(posts[c], margs[c], anchors[c].directions(X)) for c in range(C)]
    held = None if helds is None else tuple(xp.stack([getattr(h, k) for h in helds], axis=1)
                                            for k in ("d", "e", "cross"))
    update = pair_update(y, site_precision, site_shift, d, e, prior_var, s, want_grad=want_grad, weights=weights,
                         own_sites=own_sites, held=held, adf=adf, likelihood=likelihood)
    new_nu, new_mu = update.site_precision, update.site_shift
    sums = None
    if want_sums:
        onehot = one_hot_labels(y, C)
        tot_new = weighted_totals(site_totals(new_nu, new_mu, onehot), weights)
        tot_old = weighted_totals(site_totals(site_precision, site_shift, onehot), weights)
        if damping is not None:
            sums = tuple(ep.product_change(margs[c].A, None if helds is None else helds[c].W, tot_old[0][:, c],
                                           tot_old[1][:, c], tot_new[0][:, c], tot_new[1][:, c], damping)
                         for c in range(C))
        else:
            sums = tuple(
                ep.whitened_site_sums(margs[c].A, tot_new[0][:, c], tot_new[1][:, c])
                + ep.whitened_site_sums(margs[c].A, tot_old[0][:, c], tot_old[1][:, c])
                for c in range(C)
            )
    if not want_grad:
        return MultiBlockResult(new_nu, new_mu, update.valid, update.log_z_terms, None, {}, sums, update.n_invalid)
    alpha_c, kappa_c, coef_c = update.alpha, update.kappa, update.coef
    dKmm, grads, Z_grads = [], {}, []
    work = blocks.BlockScratch() if explicit else None  # (one thread's: one block at a time)
    for c in range(C):
        if explicit:  # (margs[c].P or .Q is overwritten: not needed after this)
            dKmm_c, g = ep.explicit_block_gradient(kernels[c], X, Z[c, ...], posts[c], margs[c].A,
                                                   margs[c].P if covariance else margs[c].Q, margs[c].Knm.mT,
                                                   alpha_c[:, c], kappa_c[:, c], coef_c[:, c], work,
                                                   covariance=covariance)
        else:
            held_term = None if helds is None else (helds[c], update.coef_held[:, c])
            dKmm_c, g, _ = ep.data_adjoint(kernels[c], X, Z[c, ...], posts[c], margs[c], alpha_c[:, c],
                                           kappa_c[:, c], coef_c[:, c], held=held_term)
        dKmm.append(dKmm_c)
        Z_grads.append(g.pop("Z"))
        grads.update({f"{c}:{name}": value for name, value in g.items()})
    grads["Z"] = xp.stack(Z_grads)
    return MultiBlockResult(new_nu, new_mu, update.valid, update.log_z_terms, tuple(dKmm), grads, sums,
                            update.n_invalid)


# -- passes over the data ---------------------------------------------------------------------------

def prior_choleskys(kernels, Z, jitter, checked=True):
    """Per class chol(K_c + jitter I) and its inverse (lists); ``checked`` as in ``posterior.prior_cholesky``."""
    L_K = [prior_cholesky(kernels[c], Z[c, ...], jitter, checked=checked) for c in range(n_classes(Z))]
    return L_K, [lower_triangular_inverse(L) for L in L_K]


def class_site_sums(kernels, Z, X, y, site_precision, site_shift, L_K_inv, block_rows, weights=None, *, workers=1,
                    kept=None, nonnegative=False):
    """Per class S_c = A_c diag(nu_tot) A_c^T and c~_c = A_c mu_tot over the rows (tuples, one entry a class):
    they add over any split of the rows (a chunk of rows a task on a cluster). ``weights``: the rows' sample
    weights, each row's totals w_i times (power EP). The blocks run on ``workers`` threads (``blocks.map_blocks``; their
    sums added in order); ``kept`` (a list): each block's per-class projections (A_c, K(X, Z_c)) are appended to it,
    for ``class_sweep`` to reuse (``evaluate``: the batch pass's second visit of the rows). ``nonnegative``: every
    site precision is known to be >= 0 (``known_nonnegative``), and the sums are symmetric products
    (``ep.site_sums``)."""
    C = n_classes(Z)
    S, c_tilde = [None] * C, [None] * C

    def block_sums(lo, hi, X_block, y_block):
        nu, mu = weighted_totals(site_totals(site_precision[lo:hi, ...], site_shift[lo:hi, ...],
                                             one_hot_labels(y_block, C)), None if weights is None else weights[lo:hi])
        projections = [ep.project(kernels[c], X_block, Z[c, ...], L_K_inv[c]) for c in range(C)]
        sums = [ep.site_sums(At, nu[:, c], mu[:, c], nonnegative=nonnegative)
                for c, (At, _) in enumerate(projections)]
        return sums, projections

    pieces = blocks.data_blocks(X, y, _block_rows(block_rows, Z, X.shape[0]), Z[0, ...])
    with closing(blocks.map_blocks(block_sums, pieces, workers)) as results:  # (ended on an error too)
        for _, (sums, projections) in results:
            for c, (S_b, c_b) in enumerate(sums):
                S[c] = S_b if S[c] is None else S[c] + S_b
                c_tilde[c] = c_b if c_tilde[c] is None else c_tilde[c] + c_b
            if kept is not None:
                kept.append(tuple((At.mT, Knm) for At, Knm in projections))
    return tuple(S), tuple(c_tilde)


def known_nonnegative(site_precision):
    """Whether every site precision (n, 2C) is >= 0, looked at where that costs no device synchronisation: on the
    NumPy fast path (``backend.prefers_inverses``), else False (the general product). The probit pair factors'
    precisions are >= 0 in exact arithmetic (gamma >= 0 and 1 - v gamma > 0) but nothing cuts round-off below 0, and
    other likelihoods (robust-max) need not be log-concave: so the sites are looked at, not assumed."""
    if not prefers_inverses(site_precision):
        return False
    return bool(array_namespace(site_precision).all(site_precision >= 0.0))


def _block_rows(block_rows, Z, n=None):
    """Blocks hold C sets of n x m temporaries: C times fewer rows than the binary default
    (``blocks.default_block_rows`` of the stacked Z; ``n`` the pass's rows)."""
    return block_rows or blocks.default_block_rows(Z, n)


def class_sweep(kernels, Z, X, y, site_precision, site_shift, posts, *, want_grad, block_rows, want_sums=False,
                want_sites=True, damping=None, weights=None, anchors=None, product_damping=None, adf=False,
                projections=None, workers=None, likelihood=MULTICLASS_PROBIT, explicit=False):
    """Multiclass EP's sweep: ``block_pass`` over all rows (``ep.sweep_rows``), a validity column per class.
    Its reductions add over any split of the rows (``blocks.add_sweeps``); ``site_precision`` None: zero sites
    (SEP / ADF, whose rows have none of their own). ``weights`` (n,): the rows' sample weights, ``adf``: ADF's row
    terms (``block_pass``); ``anchors``, ``product_damping``: ``block_pass``'s ``anchors`` and ``damping`` (minibatch
    EP). ``projections``: each block's per-class (A_c, K(X, Z_c)) kept by ``class_site_sums`` over the same blocks
    (``block_rows`` and ``workers`` then the layout both passes share), or None to form them. ``explicit`` (without
    ``anchors``): the blocks' data gradients through the explicit inverses of each class's factors
    (``block_pass``), their adjoints of K(Z_c, Z_c) formed once after the sum (``ep.data_kmm_adjoint``)."""
    own_sites = site_precision is not None
    explicit = explicit and anchors is None
    if explicit:  # what the blocks share, formed once before any thread needs it (as ``ep.batch_sweep``)
        for post in posts:
            post.L_K_inv, post.beta, post.whitened_mean
            if covariance_form(explicit, want_grad, Z):
                post.C_inv
            else:
                post.L_C_inv
    if not own_sites:
        site_precision = site_shift = zero_sites(X.shape[0], Z)

    def block_step(index, lo, hi, X_block, y_block, rows_precision, rows_shift):
        return block_pass(kernels, X_block, y_block, rows_precision, rows_shift, Z, posts, want_grad=want_grad,
                          want_sums=want_sums, weights=None if weights is None else weights[lo:hi],
                          own_sites=own_sites, anchors=anchors, damping=product_damping, adf=adf,
                          projections=None if projections is None else projections[index], likelihood=likelihood,
                          explicit=explicit)

    if workers is None:
        # (a minibatch: one thread)
        block_rows, workers = blocks.pass_layout(Z, X.shape[0], _block_rows(block_rows, Z, X.shape[0]))
    out = ep.sweep_rows(X, y, site_precision, site_shift, block_step, block_rows=block_rows, like=Z[0, ...],
                        want_grad=want_grad, want_sums=want_sums, want_sites=want_sites, damping=damping,
                        valid_columns=n_classes(Z), workers=workers)
    if want_grad and explicit:
        out["dKmm_data"] = tuple(ep.data_kmm_adjoint(post, *pair) for post, pair in zip(posts, out["dKmm_data"]))
    return out


def add_prior_gradients(kernels, Z, posts, sweep, scale=1.0):
    """Data gradients (scaled by n / rows for a minibatch, eq. 6) plus each class's prior part of eq. 4."""
    xp = array_namespace(Z)
    grads = {k: scale * v for k, v in sweep["grads"].items()}
    Z_grads = []
    for c in range(n_classes(Z)):
        prior = kernels[c].grads(ep.prior_kmm_adjoint(posts[c]) + scale * sweep["dKmm_data"][c], None, None, None,
                                 Z[c, ...])
        Z_grads.append(prior.pop("Z"))
        for name, value in prior.items():
            grads[f"{c}:{name}"] = grads[f"{c}:{name}"] + value
    grads["Z"] = grads["Z"] + xp.stack(Z_grads)
    return grads


def evaluate(kernels, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None,
             want_sites=True, damping=None, checked=True, weights=None, likelihood=MULTICLASS_PROBIT):
    """Batch multiclass EP: one pass at fixed (kernels, Z, sites), q_c rebuilt exactly from all sites.

    Returns the same dict as ``ep.evaluate``: ``log_z`` (Villacampa-Calvo & Hernandez-Lobato (2017), eq. 9),
    ``site_precision`` / ``site_shift`` (n, 2C; damped by ``damping`` when given, with ``site_change``), ``valid`` (n,
    C), ``n_invalid``, ``grads`` (eq. 10) and ``posterior`` (a tuple of per-class ``posterior.Posterior``).
    ``checked``: as in ``ep.evaluate`` (False in training steps: a failed factorisation is NaN, which reaches
    log Z_q and the loop's guard, with no host synchronisation; True escalates jitter on the host).

    ``weights`` (n,) or None: the rows' sample weights by power EP, as binary EP takes them (docs/weights.md): a row of
    weight w contributes its likelihood to the power w, q_c holds w_i copies of each of its sites, a pair's cavity
    removes one copy, and log Z_q and its gradient count each row's pair terms w_i times (``pair_update``)."""
    L_K, L_K_inv = prior_choleskys(kernels, Z, jitter, checked)
    # one layout for both visits of the rows, so that the sweep takes the sums' projections (as ``ep.evaluate``)
    block_rows, workers = blocks.pass_layout(Z, X.shape[0], _block_rows(block_rows, Z, X.shape[0]))
    kept = [] if blocks.projections_fit(X.shape[0], Z[0, ...], classes=n_classes(Z)) else None
    S, c_tilde = class_site_sums(kernels, Z, X, y, site_precision, site_shift, L_K_inv, block_rows, weights,
                                 workers=workers, kept=kept, nonnegative=known_nonnegative(site_precision))
    posts = posteriors_from_sums(L_K, L_K_inv, S, c_tilde, checked=checked)
    # (the data gradient through the factors' explicit inverses where ``ep.batch_sweep`` takes them: on NumPy, or for
    # many rows a point)
    explicit = uses_inverse(L_K[0], n_columns=min(X.shape[0], block_rows))
    sweep = class_sweep(kernels, Z, X, y, site_precision, site_shift, posts, want_grad=want_grad,
                        block_rows=block_rows, want_sites=want_sites, damping=damping, weights=weights,
                        projections=kept, workers=workers, likelihood=likelihood, explicit=explicit)
    return finish_evaluate(kernels, Z, posts, sweep, want_grad)


def posteriors_from_sums(L_K, L_K_inv, S, c_tilde, *, checked=True):
    """Each class's q from its sums (``class_site_sums``): a tuple of ``posterior.Posterior``."""
    return tuple(posterior_from_sums(L_K[c], S[c], c_tilde[c], L_K_inv=L_K_inv[c], checked=checked)
                 for c in range(len(L_K)))


def finish_evaluate(kernels, Z, posts, sweep, want_grad):
    """Batch multiclass EP's results from the classes' q and the (reduced) sweep: log Z_q of Villacampa-Calvo &
    Hernandez-Lobato (2017), eq. 9, the gradient of eq. 10."""
    log_z = sweep["terms"]
    for post in posts:
        log_z = log_z + post.log_normaliser_gain
    return {
        "log_z": log_z,
        "site_precision": sweep["site_precision"],
        "site_shift": sweep["site_shift"],
        "valid": sweep["valid"],
        "site_change": sweep["site_change"],
        "n_invalid": sweep["n_invalid"],
        "posterior": posts,
        "grads": add_prior_gradients(kernels, Z, posts, sweep) if want_grad else None,
    }


def _with_rest(rest, S, c_tilde):
    """Distributed SEP: the other shards' whitened sums added (none, and no operation, without them)."""
    return (S, c_tilde) if rest is None else (rest[0] + S, rest[1] + c_tilde)


def evaluate_factor(kernels, Z, X, y, factor, *, cavity, n_total, site_precision=None, site_shift=None, jitter,
                    want_grad=True, block_rows=None, weights=None, checked=True, others=None, factor_rows=None,
                    sample_weights=True, anchor=None, damping=None, likelihood=MULTICLASS_PROBIT):
    """One pass over rows X (all, or a minibatch) with q_c = prior_c x factor_c; the ``cavity`` (a ``sites.Cavity``
    or its name) as in ``ep.evaluate_factor``: EP's removes each pair's own parts, SEP's removes factor_c^(1/n_total)
    from every class (one tied factor per class, Villacampa-Calvo & Hernandez-Lobato (2017), sec. 2.3.1), ADF's removes
    nothing (each pair's log Z_q term then takes the removal term of its new parts, ``sites.adf_removal_terms``).
    ``checked``: as in ``evaluate``. ``weights`` (the rows'): sample weights (the multiclass passes have no
    padding; ``sample_weights`` is taken for ``ep.evaluate_factor``'s signature): EP's cavities by power EP, each
    row's terms, gradient and site change w_i times, and the rows counted by weight in the scale n_total / sum(w).
    ``others`` / ``factor_rows``: distributed SEP's shard, per class as in ``ep.factor_cavity``: q_c = prior_c x
    (others_c + factor_c), the SEP cavity removes factor_c^(1/factor_rows). ``anchor`` (a ``MultiAnchor``, or
    None), ``damping``: minibatch EP's, as ``ep.evaluate_factor`` takes them (``product_change``)."""
    cavity = sites.cavity_of(cavity)
    prep = factor_cavity(kernels, Z, factor, cavity=cavity, n_total=n_total, jitter=jitter, checked=checked,
                         others=others, factor_rows=factor_rows)
    if not cavity.own_sites:
        site_precision = site_shift = None  # (zero sites: the cavity already excludes the factor)
    minibatch_ep = cavity.own_sites and damping is not None
    sweep = class_sweep(kernels, Z, X, y, site_precision, site_shift, prep["cavity"], want_grad=want_grad,
                        block_rows=block_rows, want_sums=True, weights=weights,
                        anchors=anchor if minibatch_ep else None, product_damping=damping if minibatch_ep else None,
                        adf=cavity.adf, likelihood=likelihood)
    n_rows = X.shape[0] if weights is None else array_namespace(Z).sum(weights)
    return finish_factor(kernels, Z, prep, sweep, n_total / n_rows, want_grad, product=minibatch_ep)


def factor_cavity(kernels, Z, factor, *, cavity, n_total, jitter, checked=True, others=None, factor_rows=None):
    """Per class q_c = prior_c x factor_c and the cavity the rows' updates start from (a tuple each), log Z_q's
    global part, and the classes' L_K^-1 (``ep.factor_cavity`` class by class; the driver's m x m work). ``cavity``:
    a ``sites.Cavity`` or its name, as ``ep.factor_cavity`` takes it."""
    tied = sites.cavity_of(cavity).tied
    C = n_classes(Z)
    L_K, L_K_inv = prior_choleskys(kernels, Z, jitter, checked)
    qs, cavities, log_z = [], [], 0.0
    for c in range(C):
        S, c_tilde = factor.factors[c].whitened(L_K[c])
        rest = None if others is None else others.factors[c].whitened(L_K[c])
        q = posterior_from_sums(L_K[c], *_with_rest(rest, S, c_tilde), L_K_inv=L_K_inv[c], checked=checked)
        gain_q = q.log_normaliser_gain
        log_z = log_z + gain_q
        if tied:
            keep = 1.0 - 1.0 / (n_total if factor_rows is None else factor_rows)
            cav = posterior_from_sums(L_K[c], *_with_rest(rest, keep * S, keep * c_tilde), L_K_inv=L_K_inv[c],
                                         checked=checked)
            if rest is None and factor_rows is None:
                log_z = log_z + sites.sep_cavity_term(q, cav, S, n_total)
            else:  # a shard's cavity: the direct difference, as in ``ep.factor_cavity``
                log_z = log_z + n_total * (cav.log_normaliser_gain - gain_q)
        else:
            cav = q
        qs.append(q)
        cavities.append(cav)
    return {"q": tuple(qs), "cavity": tuple(cavities), "log_z": log_z, "L_K_inv": L_K_inv}


def finish_factor(kernels, Z, prep, sweep, scale, want_grad, product=False):
    """The factor pass's results from ``factor_cavity`` and the (reduced) sweep; ``scale`` = n_total / rows.
    ``product``: the sweep's sums are minibatch EP's change of its running product (``block_pass``), returned as
    ``product_change``."""
    C = n_classes(Z)
    sums, L_K_inv = sweep["sums"], prep["L_K_inv"]
    out = {
        "log_z": prep["log_z"] + scale * sweep["terms"],
        "site_precision": sweep["site_precision"],
        "site_shift": sweep["site_shift"],
        "valid": sweep["valid"],
        "n_invalid": sweep["n_invalid"],
        "posterior": prep["q"],
        "grads": add_prior_gradients(kernels, Z, prep["q"], sweep, scale) if want_grad else None,
    }
    if product:
        out["product_change"] = MultiFactor(tuple(Factor.from_whitened(sums[c][0], sums[c][1], L_K_inv[c])
                                                  for c in range(C)))
        return out
    new_sites = MultiFactor(tuple(Factor.from_whitened(sums[c][0], sums[c][1], L_K_inv[c]) for c in range(C)))
    old_sites = MultiFactor(tuple(Factor.from_whitened(sums[c][2], sums[c][3], L_K_inv[c]) for c in range(C)))
    out.update(new_sites=new_sites, old_sites=old_sites, site_delta=new_sites.combine(1.0, old_sites, -1.0))
    return out


def exact_factor(kernels, Z, X, site_precision, site_shift, *, jitter, block_rows=None, y, want_anchor=False):
    """The product of all sites at the current hyper-parameters, one u-space factor per class; ``want_anchor``:
    (factor, its ``MultiAnchor``)."""
    L_K, L_K_inv = prior_choleskys(kernels, Z, jitter)
    S, c_tilde = class_site_sums(kernels, Z, X, y, site_precision, site_shift, L_K_inv, block_rows)
    factor = MultiFactor(tuple(Factor.from_whitened(S[c], c_tilde[c], L_K_inv[c]) for c in range(n_classes(Z))))
    return (factor, MultiAnchor(kernels, Z, L_K, jitter, L_K_inv)) if want_anchor else factor


def anchored_factor(kernels, Z, posts, jitter):
    """``ep.anchored_factor`` class by class: (a ``MultiFactor``, its ``MultiAnchor``)."""
    return factor_from_posteriors(posts), MultiAnchor(kernels, Z, [post.L_K for post in posts], jitter)


def posterior_from_factor(kernels, Z, factor, *, jitter):
    return tuple(ep.posterior_from_factor(kernels[c], Z[c, ...], factor.factors[c], jitter=jitter)
                 for c in range(n_classes(Z)))


# -- prediction -------------------------------------------------------------------------------------

def predict_latent(kernels, Z, posts, X, block_rows=None):
    """Per-class predictive means and variances of f_c(x) (latent noise included), each (n, C)."""
    xp = array_namespace(Z)
    pairs = [ep.predict_latent(kernels[c], Z[c, ...], posts[c], X, block_rows=block_rows) for c in range(n_classes(Z))]
    return xp.stack([p[0] for p in pairs], axis=1), xp.stack([p[1] for p in pairs], axis=1)


def predictive_log_proba(mean, var, normalise=True):
    """log p(y = k | x) of Villacampa-Calvo & Hernandez-Lobato (2017), eq. 11 for independent Gaussian f_c,
    (n, C) (``likelihoods.argmax_log_proba``: the model's likelihood is the argmax of f itself)."""
    return argmax_log_proba(mean, var, normalise)


def validation_scores(kernels, Z, posts, X_val, y_val, likelihood=MULTICLASS_PROBIT):
    """Test NLL and error on (X_val, y_val as class indices) under the model's ``likelihood``."""
    xp = array_namespace(Z)
    mean, var = predict_latent(kernels, Z, posts, X_val)
    log_p = likelihood.class_log_proba(mean, var)
    nll = negative_log_likelihood(log_p, y_val)
    predicted = xp.argmax(log_p, axis=1)
    error = xp.mean(xp.astype(xp.astype(predicted, y_val.dtype) != y_val, y_val.dtype))
    return float(nll), float(error)
