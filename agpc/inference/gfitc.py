"""Generalised FITC (GFITC; Naish-Guzman & Holden 2008): EP on the FITC prior, the baseline of Hernandez-Lobato &
Hernandez-Lobato (2016), sec. 3 and, with one GP per class, of Villacampa-Calvo & Hernandez-Lobato (2017), sec. 3.

The inducing values are marginalised: f ~ N(0, K_fitc), K_fitc = Q + diag(Kdiag - diag Q), Q = Knm K^-1 Kmn,
K = Kmm + jitter I. EP puts one Gaussian site t_i(f_i) = exp(-nu_i f_i^2 / 2 + mu_i f_i) on each latent
value, nu_i its precision and mu_i its shift as in ``ep`` (Rasmussen & Williams 2006 write tau~ and nu~)
(multiclass: a pair site per wrong class k, factorised over f_{i y_i} and f_ik as in ``multiclass_ep``), runs
to convergence, and only then takes one step on the hyper-parameters (kernel and inducing points) along the
gradient of log Z_EP; repeated (``engines.GFITCEngine``: one sweep a step, driven by the one training loop).
Batch only: every step needs all n sites converged, and log Z_EP is not a sum over rows (Hernandez-Lobato &
Hernandez-Lobato (2016), sec. 3).

O(n m^2) by Woodbury, through the inducing values. Write f_i = g_i + eps_i with g_i = upsilon_i^T u,
u ~ N(0, K), eps_i ~ N(0, s_i) independent, s_i = Kdiag_i - k_i^T K^-1 k_i (the FITC conditional, Hernandez-Lobato &
Hernandez-Lobato (2016), eq. 1). Integrating f_i out of N(f_i | g_i, s_i) t_i(f_i) leaves a factor on g_i of the binary
EP form (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 2), with

    precision w_i = nu_i / (1 + s_i nu_i),   shift r_i = mu_i / (1 + s_i nu_i),
    log normaliser  -log(1 + s_i nu_i) / 2 + s_i mu_i^2 / (2 (1 + s_i nu_i)),

so q(u) is a ``posterior.Posterior`` built from (w, r): B = K + Knm^T diag(w) Knm = K + Kmn D^-1 Knm, where
D = diag(s) + diag(1/nu) and D^-1 = diag(w) (finite when nu_i = 0). With e_i = k_i^T B^-1 c and
d_i = k_i^T B^-1 k_i (q's mean and variance of g_i), the marginal of f_i under q is

    mean_i = (e_i + s_i mu_i) / (1 + s_i nu_i),   var_i = (s_i + d_i / (1 + s_i nu_i)) / (1 + s_i nu_i).

Predictions need only q(u): f_* = g_* + eps_*, mean k_*^T B^-1 c, variance Kdiag_* - Q_** + k_*^T B^-1 k_*
(``ep.predict_latent``), probit link for binary, Villacampa-Calvo & Hernandez-Lobato (2017), eq. 11 quadrature for
multiclass.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

from ..backend import array_namespace, lower_triangular_inverse
from ..likelihoods import probit_for
from . import blocks, ep, multiclass_ep, sites
from .posterior import posterior_from_sums, prior_cholesky, uses_inverse

__all__ = ["evaluate", "zero_sites"]


@dataclass
class FitcMarginals:
    """q's marginal of f_i for one class (and what it was computed from)."""

    g: object  # ep.Marginals: q(u) along upsilon_i (e, d), the FITC variance s, the projections
    precision: object  # w_i = nu_i / (1 + s_i nu_i): the site as a factor on g_i
    shift: object  # r_i = mu_i / (1 + s_i nu_i)
    mean: object  # E_q f_i
    var: object  # Var_q f_i
    log_normaliser: object  # log of int N(f_i | g_i, s_i) t_i(f_i) df_i beyond its g_i-dependent part


def _site_on_g(site_precision, site_shift, s):
    """(w, r, 1 + s nu): the site t_i(f_i) seen through the FITC conditional N(f_i | g_i, s_i)."""
    one_plus = 1.0 + s * site_precision
    return site_precision / one_plus, site_shift / one_plus, one_plus


def fitc_marginals(kernel, X, Z, post, site_precision, site_shift, At=None, Knm=None):
    """The marginals of f_i under q (module docstring), from the rows' total sites on f_i (precision, shift)."""
    xp = array_namespace(X)
    g = ep.marginals(kernel, X, Z, post, A=None if At is None else At.mT, Knm=Knm)
    w, r, one_plus = _site_on_g(site_precision, site_shift, g.s)
    mean = (g.e + g.s * site_shift) / one_plus
    var = (g.s + g.d / one_plus) / one_plus
    log_normaliser = -0.5 * xp.log(one_plus) + 0.5 * g.s * site_shift * r
    return FitcMarginals(g, w, r, mean, var, log_normaliser)


def _fitc_adjoint(kernel, X, Z, post, fm, weights=None):
    """Data part of the gradient of log N(mu~ | 0, K_fitc + Sigma~) (R&W eq. 3.65's first two terms, which
    carry all of d log Z_EP / d xi at an EP fixed point, R&W eq. 5.27), sites fixed.

    With A = K_fitc + Sigma~ = D + Knm K^-1 Kmn (D^-1 = diag(w)) and Woodbury,
    A^-1 mu~ = r - w e =: b and diag(A^-1) = w - w^2 d. The adjoint of K_fitc is G = (b b^T - A^-1) / 2;
    K_fitc = Q + diag(Kdiag) - diag(diag Q) gives dKdiag = diag G and, with G' = G - diag(diag G) and
    U = Knm K^-1 (rows upsilon_i^T): dKnm = 2 G' U, dKmm = -U^T G' U. Woodbury turns these into
    (U^T b = beta = B^-1 c, Kmn diag(w) Knm = B - K)
        dKnm = b beta^T - diag(w) Knm B^-1 - 2 diag(diag G) U,
        dKmm = (K^-1 - B^-1 - beta beta^T) / 2 + U^T diag(diag G) U,
    which is ``ep.data_adjoint`` with alpha = b, kappa = -2 diag G, coef_g = -w, plus ``ep.prior_kmm_adjoint``
    (added by the callers, as for EP). O(n m^2), no n x n matrix. ``weights``: a row stands for w_i copies with
    the same projections and coefficients, so each coefficient counts w_i times."""
    b = fm.shift - fm.precision * fm.g.e
    diag_G = 0.5 * (b * b - fm.precision + fm.precision * fm.precision * fm.g.d)
    if weights is None:
        return ep.data_adjoint(kernel, X, Z, post, fm.g, b, -2.0 * diag_G, -fm.precision)[:2]
    return ep.data_adjoint(kernel, X, Z, post, fm.g, weights * b, -2.0 * weights * diag_G,
                           -weights * fm.precision)[:2]


# -- the likelihoods: cavity on f, tilted moments, new site ----------------------------------------

def _cavity(site_precision, site_shift, var, mean, prior_var, weights):
    """``sites.cavity`` of a site on f_i. With sample weights (``weights`` (b,) or (b, 1)) the marginal of f_i is a
    copy's, which holds its own site once (``evaluate``'s docstring): the same cavity, but a row of weight 0 is not in
    the model (no update, no term, not counted as a failure: ``sites.counted_invalid``)."""
    valid, one_minus, v, a = sites.cavity(site_precision, site_shift, var, mean, prior_var)
    return (valid if weights is None else valid & (weights > 0)), one_minus, v, a


def _binary_update(likelihood, y, site_precision, site_shift, fms, weights=None):
    """Binary: cavity of f_i (R&W eq. 3.56), the ``likelihood``'s tilted moments (the probit's: eq. 3.58), new site
    (eq. 3.59).
    Returns (new precisions, new shifts, valid, the sites' log Z_EP terms log Z_i + g(cavity) - g(q) along f_i, zero
    where the cavity is unusable: that site keeps its parameters for the round, as in ``ep``). ``weights``: a copy's
    cavity (``_cavity``), each site's terms w_i times."""
    xp = array_namespace(site_precision)
    (fm,) = fms
    valid, one_minus, v, a = _cavity(site_precision, site_shift, fm.var, fm.mean, fm.g.prior_var + fm.g.s, weights)
    log_zi, alpha, gamma, *_ = likelihood.site_terms(y, a, 1.0 + v)
    new_precision, new_shift = sites.moment_matched_site(valid, site_precision, site_shift, a, v, alpha, gamma)
    terms = log_zi + sites.removal_terms(site_precision, site_shift, fm.var, fm.mean, one_minus)
    if weights is not None:
        terms = weights * terms
    return new_precision, new_shift, valid, xp.where(valid, terms, 0.0)


def _pair_update(likelihood, y, site_precision, site_shift, fms, weights=None):
    """Multiclass: one site per wrong class k on (f_{i y_i}, f_ik), factorised over the two classes
    (``multiclass_ep`` storage: column k the class-k part, column C + k the class-y_i part); each part is
    removed from its own class's marginal of f. On f the likelihood of Villacampa-Calvo & Hernandez-Lobato (2017), eq. 1
    is exactly the product of Theta(f_y - f_k) (the latent noise is in Kdiag); against the two cavities each factor
    integrates to the probit of Villacampa-Calvo & Hernandez-Lobato (2017), eq. 6 with variance v_y + v_k, and the
    tilted moments are the ``likelihood``'s (``MulticlassProbit.pair_terms``). ``weights``: as in ``_binary_update``,
    a copy's cavities, its terms w_i times."""
    xp = array_namespace(site_precision)
    C = len(fms)
    row_weights = None if weights is None else weights[:, None]
    onehot = multiclass_ep.one_hot_labels(y, C)
    mean = xp.stack([fm.mean for fm in fms], axis=1)
    var = xp.stack([fm.var for fm in fms], axis=1)
    prior_var = xp.stack([fm.g.prior_var + fm.g.s for fm in fms], axis=1)
    mean_y, var_y, prior_var_y = (multiclass_ep.true_class_values(v, onehot) for v in (mean, var, prior_var))
    precision_k, precision_y = site_precision[:, :C], site_precision[:, C:]
    shift_k, shift_y = site_shift[:, :C], site_shift[:, C:]
    valid_k, om_k, v_k, a_k = _cavity(precision_k, shift_k, var, mean, prior_var, row_weights)
    valid_y, om_y, v_y, a_y = _cavity(precision_y, shift_y, var_y, mean_y, prior_var_y, row_weights)
    valid = ~onehot & valid_k & valid_y
    log_zp, alpha, gamma, *_ = likelihood.pair_terms(a_y - a_k, v_y + v_k)
    new_precision_y, new_shift_y = sites.moment_matched_site(valid, precision_y, shift_y, a_y, v_y, alpha, gamma)
    new_precision_k, new_shift_k = sites.moment_matched_site(valid, precision_k, shift_k, a_k, v_k, -alpha, gamma)
    terms = (log_zp + sites.removal_terms(precision_y, shift_y, var_y, mean_y, om_y)
             + sites.removal_terms(precision_k, shift_k, var, mean, om_k))
    if weights is not None:
        terms = row_weights * terms
    # (valid is True in the label's own column, which holds no pair)
    return (xp.concat([new_precision_k, new_precision_y], axis=1), xp.concat([new_shift_k, new_shift_y], axis=1),
            valid | onehot, xp.where(valid, terms, 0.0))


# -- one model, binary or one GP per class ----------------------------------------------------------

class _Model:
    """The per-class pieces: a binary model is one class with sites of shape (n,), a multiclass model
    C classes (``ClassKernels``, Z of shape (C, m, d)) with sites of shape (n, 2C)."""

    def __init__(self, kernel, Z, likelihood=None):
        self.multiclass = kernel.n_latent > 1
        self.kernel, self.Z = kernel, Z
        self.likelihood = probit_for(kernel) if likelihood is None else likelihood
        self.parts = list(kernel.latent_parts(Z))

    def block_rows(self, block_rows, n):
        return block_rows or blocks.default_block_rows(self.Z, n)

    def totals(self, site_precision, site_shift, y):
        """Per class, a row's (a copy's) total site on f_ic."""
        if not self.multiclass:
            return [(site_precision, site_shift)]
        onehot = multiclass_ep.one_hot_labels(y, len(self.parts))
        precision_c, shift_c = multiclass_ep.site_totals(site_precision, site_shift, onehot)
        return [(precision_c[:, c], shift_c[:, c]) for c in range(len(self.parts))]


def _rows(a, lo, hi):
    return (slice(lo, hi),) + (slice(None),) * (len(a.shape) - 1)


def _posteriors(model, X, y, site_precision, site_shift, jitter, block_rows, workers, weights=None):
    """q(u_c) for every class from the sites (one pass, its blocks on ``workers`` threads, their sums added in order),
    and every block's projections (A^T, Knm) per class for the sweep to reuse while they fit ep's cache budget
    (``weights``: each row's factor on g_i w_i times)."""
    L_K = [prior_cholesky(k, Zc, jitter) for k, Zc in model.parts]
    L_K_inv = [lower_triangular_inverse(L) for L in L_K]
    C, n = len(model.parts), X.shape[0]
    keep = blocks.projections_fit(n, model.parts[0][1], classes=C)

    def block_sums(lo, hi, X_block, y_block):
        rows = _rows(site_precision, lo, hi)
        totals = model.totals(site_precision[rows], site_shift[rows], y_block)
        sums, projections = [], []
        for c, ((k, Zc), (precision_c, shift_c)) in enumerate(zip(model.parts, totals)):
            At, Knm = ep.project(k, X_block, Zc, L_K_inv[c])
            w, r, _ = _site_on_g(precision_c, shift_c, k.Kdiag(X_block) - ep.row_dot(At, At))
            if weights is not None:  # (w_i copies of the row, each its own latent value: w_i times its factor on g)
                w, r = weights[lo:hi] * w, weights[lo:hi] * r
            sums.append(ep.site_sums(At, w, r))
            projections.append((At, Knm))
        return sums, (projections if keep else None)

    S, c_tilde, kept = [None] * C, [None] * C, []
    pieces = blocks.data_blocks(X, y, block_rows, model.parts[0][1])
    with closing(blocks.map_blocks(block_sums, pieces, workers)) as results:  # (ended on an error too: map_blocks)
        for _, (sums, projections) in results:
            for c, (S_b, c_b) in enumerate(sums):
                S[c] = S_b if S[c] is None else S[c] + S_b
                c_tilde[c] = c_b if c_tilde[c] is None else c_tilde[c] + c_b
            if keep:
                kept.append(projections)
    posts = [posterior_from_sums(L_K[c], S[c], c_tilde[c], L_K_inv=L_K_inv[c]) for c in range(C)]
    return posts, (kept if keep else None)


def _block_pass(model, X, y, site_precision, site_shift, posts, projections, *, want_grad, weights=None):
    """A block's site updates, log Z_EP terms and gradient adjoints. ``weights`` (b,): each row stands for w_i copies
    (``evaluate``): the marginals and cavities are a copy's, its site updated as a copy's, and its terms, FITC
    log-normalisers and gradient coefficients count w_i times."""
    xp = array_namespace(X)
    fms = [  # (a copy's marginals: its own sites once, q(u) holding every copy's)
        fitc_marginals(k, X, Zc, post, precision_c, shift_c, *(projections[c] if projections else (None, None)))
        for c, ((k, Zc), post, (precision_c, shift_c))
        in enumerate(zip(model.parts, posts, model.totals(site_precision, site_shift, y)))
    ]
    update = _pair_update if model.multiclass else _binary_update
    new_precision, new_shift, valid_out, terms = update(model.likelihood, y, site_precision, site_shift, fms, weights)
    n_invalid = None  # (counted by the sweep) or, with weights, the failures of rows in the model
    if weights is not None:
        n_invalid = sites.counted_invalid(valid_out, weights[:, None] if model.multiclass else weights, X)
    log_z_terms = xp.sum(terms)
    for fm in fms:
        log_z_terms = log_z_terms + xp.sum(fm.log_normaliser if weights is None else weights * fm.log_normaliser)
    if not want_grad:
        return ep.BlockResult(new_precision, new_shift, valid_out, log_z_terms, n_invalid, None, {})
    adjoints = [_fitc_adjoint(k, X, Zc, post, fm, weights) for (k, Zc), post, fm in zip(model.parts, posts, fms)]
    if not model.multiclass:
        return ep.BlockResult(new_precision, new_shift, valid_out, log_z_terms, n_invalid, adjoints[0][0],
                              adjoints[0][1])
    grads = {f"{c}:{name}": value for c, (_, g) in enumerate(adjoints) for name, value in g.items() if name != "Z"}
    grads["Z"] = xp.stack([g["Z"] for _, g in adjoints])
    return ep.BlockResult(new_precision, new_shift, valid_out, log_z_terms, n_invalid, tuple(d for d, _ in adjoints),
                          grads)


def evaluate(kernel, Z, X, y, site_precision, site_shift, *, jitter, want_grad=True, block_rows=None, weights=None,
             likelihood=None):
    """One pass of GFITC at fixed (kernel, Z, sites): q rebuilt from all sites, every site's undamped EP
    update, log Z_EP and (``want_grad``) its gradient for the kernel parameters and Z, valid at an EP
    fixed point. Binary: ``kernel`` a kernel, Z (m, d), y in {-1, +1}, sites (n,) on f_i. Multiclass:
    ``ClassKernels``, Z (C, m, d), y class indices, sites (n, 2C) as in ``multiclass_ep``.

    log Z_EP = sum_c [g(q_c) - g(prior_c)] + sum_i log-normalisers + sum_sites [log Z_i + g(cav) - g(q)]:
    the form of Hernandez-Lobato & Hernandez-Lobato (2016), eq. 26 over (u, f), equal to R&W eq. 3.65 with K = K_fitc
    (tested against the textbook full-GP EP on the dense FITC prior). Returns the dict of ``ep.evaluate``.

    ``weights`` (n,) or None: the rows' sample weights, row i standing for w_i copies of itself, each with a latent
    value of its own (independent FITC noise of variance s_i about one g_i, as the row repeated has): a copy's
    marginal of f holds its own site once, q(u) holds each copy's factor on g_i w_i times (``_posteriors``), and log
    Z_EP and its gradient count each copy's terms w_i times (``_block_pass``). A weight-0 row is the row removed, an
    integer weight the row repeated (docs/weights.md). ``likelihood``: the model's (None: the probit, or the multiclass
    probit for C classes); a binary one takes its ``site_terms`` on f_i, whose variance holds its unit noise."""
    model = _Model(kernel, Z, likelihood)
    # once: the sweep reuses the first stage's projections; the blocks of both on the threads of ``pass_layout``
    block_rows, workers = blocks.pass_layout(model.parts[0][1], X.shape[0], model.block_rows(block_rows, X.shape[0]))
    posts, kept = _posteriors(model, X, y, site_precision, site_shift, jitter, block_rows, workers, weights)
    for post in posts:  # (what the blocks share, formed here once, before any thread needs it: q caches it)
        if uses_inverse(post.L_K, n_columns=min(X.shape[0], block_rows)):
            post.L_K_inv, post.L_C_inv
        if want_grad:
            post.beta

    def block_step(index, lo, hi, X_block, y_block, rows_precision, rows_shift):
        return _block_pass(model, X_block, y_block, rows_precision, rows_shift, posts, kept[index] if kept else None,
                           want_grad=want_grad, weights=None if weights is None else weights[lo:hi])

    sweep = ep.sweep_rows(X, y, site_precision, site_shift, block_step, block_rows=block_rows,
                          like=model.parts[0][1], want_grad=want_grad,
                          valid_columns=len(model.parts) if model.multiclass else None, workers=workers)
    if not model.multiclass:
        return ep.finish_evaluate(kernel, Z, posts[0], sweep, want_grad)
    log_z = sweep["terms"]
    for post in posts:
        log_z = log_z + post.log_normaliser_gain
    grads = multiclass_ep.add_prior_gradients(kernel, Z, posts, sweep) if want_grad else None
    return dict(sweep, log_z=log_z, posterior=tuple(posts), grads=grads)


def zero_sites(n, Z):
    """All sites uniform: (n,) for a binary model (Z of shape (m, d)), (n, 2C) for a multiclass one."""
    return multiclass_ep.zero_sites(n, Z) if len(Z.shape) == 3 else ep.zero_sites(n, Z)
