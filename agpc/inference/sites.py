"""EP's per-row site algebra (Hernandez-Lobato & Hernandez-Lobato (2016), sec. 2.3 and Appendix A): the cavity of a
row's site along upsilon_i and when it is usable (eqs. 14-15; power EP for row weights, Minka 2004; a site held along
another direction, minibatch EP's ``ep.Anchor``), the moment-matched new site (eq. 23), the rows' terms of log Z_q
(eq. 26, ADF's removal term), the adjoint coefficients of the gradient (eq. 4); and
the SEP cavity's log-normaliser gap (Li, Hernandez-Lobato & Turner 2015), the same algebra for a tied factor.
Elementwise over the rows of a block (m x m for the SEP gap); the passes that form the marginals and add the terms
up are ``agpc.inference.ep``'s and the other methods'. Which cavity a pass forms (EP's, SEP's or ADF's) is a
declared value, ``Cavity``, that the passes branch on.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ..backend import array_device, array_namespace, is_out_of_core, machine_epsilon, row_dot, triangular_matmul

__all__ = ["Cavity", "EP", "SEP", "ADF", "CAVITIES", "cavity_of", "cavity_tolerances", "cavity", "weighted_cavity",
           "counted_invalid", "Held", "held_marginals", "held_cavity", "held_adjoint_coefficient", "removal_terms",
           "adf_removal_terms", "moment_matched_site", "adjoint_coefficient", "variance_adjoint", "row_adjoints",
           "add_cut_point_grads", "sep_cavity_gap", "sep_cavity_term", "rows_with_sites", "only_rows_with_sites",
           "rows_in_site_sums", "GATHER_MAX_SHARE", "GATHER_MAX_ELEMENTS"]


@dataclass(frozen=True)
class Cavity:
    """The cavity an EP-family pass forms for a row's update from q: the one thing EP, SEP and ADF differ in
    (Hernandez-Lobato et al. (2015): parallel EP, parallel SEP and parallel ADF side by side; Li,
    Hernandez-Lobato & Turner 2015 for SEP). The passes branch on these fields, never on a method's name: a variant
    is what it does to the cavity, and the fields say it where the branch is taken.

    ``own_sites`` (EP): every row keeps its own site (nu_i, mu_i), and its cavity is q with that site removed,
    q / t_i (two numbers a row to store). ``tied`` (SEP): the rows share one tied factor f (q = prior x f^n) and
    every row's cavity is q / f^(1/n), one cavity for all (O(m^2) memory whatever n); log Z_q takes n (g(cavity) -
    g(q)) once (``sep_cavity_term``). ``adf`` (ADF): the cavity is q itself, nothing removed; each row's log Z_q
    term then takes the removal term of its new site (``adf_removal_terms``)."""

    name: str  # the variant's name, as the EP-family methods are named ("ep", "sep", "adf")
    own_sites: bool
    tied: bool
    adf: bool


EP = Cavity("ep", own_sites=True, tied=False, adf=False)
SEP = Cavity("sep", own_sites=False, tied=True, adf=False)
ADF = Cavity("adf", own_sites=False, tied=False, adf=True)
CAVITIES = MappingProxyType({variant.name: variant for variant in (EP, SEP, ADF)})


def cavity_of(value):
    """The ``Cavity`` of ``value``: a ``Cavity`` itself, or one of the names "ep", "sep", "adf" (``CAVITIES``); a
    ValueError for anything else. Each pass normalises its ``cavity`` argument with it once."""
    if isinstance(value, Cavity):
        return value
    if isinstance(value, str) and value in CAVITIES:
        return CAVITIES[value]
    raise ValueError(f"unknown EP variant {value!r}")


# A site whose cavity variance v_i = d_i / (1 - nu_i d_i) is not positive (1 - nu_i d_i below this) is
# skipped for the round: its old parameters are kept and it adds nothing to log Z_q or the gradient.
_CAVITY_EPS = 1e-10
_PRIOR_SLACK = 1e-6  # relative round-off allowed when comparing a cavity variance with the prior's
# Both are float64 settings, far above float64's round-off (eps = 2.2e-16) but below float32's (1.2e-7): in a
# narrower type neither may fall below this many round-offs of the type (``cavity_tolerances``).
_CAVITY_ROUNDOFFS = 100.0


def cavity_tolerances(x):
    """(threshold on 1 - nu d, relative slack against the prior variance) for arrays of ``x``'s type: the
    float64 settings above, or 100 eps of the type where that is larger (float32: 1.2e-5 both). 1 - nu d and
    the variances d, prior_var are sums of m products, each carrying a few eps of relative round-off; a test
    finer than that marks sites invalid at random. Host floats: no array operation."""
    roundoff = _CAVITY_ROUNDOFFS * machine_epsilon(x)
    return max(_CAVITY_EPS, roundoff), max(_PRIOR_SLACK, roundoff)


def cavity(site_precision, site_shift, d, e, prior_var):
    """The cavity along upsilon_i after removing a site (nu, mu) from q's marginal (e, d).

    Returns (valid, 1 - nu d, cavity variance v, cavity mean a). A cavity is usable when its variance is
    positive and, since every site precision is non-negative, no wider than the prior's. Both hold
    whenever q and the sites agree; they fail when a site stored in a u-space factor (minibatch EP) was
    computed under older hyper-parameters."""
    threshold, slack = cavity_tolerances(d)
    nu, mu = site_precision, site_shift
    valid, one_minus = _removable(nu, d, threshold)
    valid = valid & (d <= (1.0 + slack) * prior_var * one_minus + threshold)
    v = d / one_minus  # cavity variance of g_i
    a = (e - mu * d) / one_minus  # cavity mean of g_i: v (e/d - mu), without dividing by d
    return valid, one_minus, v, a


def _removable(nu, d, threshold):
    """(valid, 1 - nu d) of removing sites of precision nu from q's variance d along their direction: valid where
    1 - nu d exceeds ``threshold`` (the cavity's variance is then positive); 1 where it does not, so that the
    divisions by it that follow stay finite."""
    xp = array_namespace(d)
    one_minus = 1.0 - nu * d
    valid = one_minus > threshold
    return valid, xp.where(valid, one_minus, 1.0)


def _prior_bound(prior_var, weights):
    """The widest a cavity may be under power EP (``weighted_cavity``): the prior's variance for rows of weight
    at least 1, none (infinite) below, where removing one copy of a site takes out more than the row's share."""
    xp = array_namespace(prior_var)
    return xp.where(weights >= 1.0, prior_var, xp.full_like(prior_var, xp.inf))


def weighted_cavity(site_precision, site_shift, d, e, prior_var, weights):
    """``cavity`` for rows of sample weights w_i >= 0 by power EP (Minka 2004): q holds w_i copies of row i's site
    (nu_i, mu_i) and the cavity is q with one copy removed; where w_i < 1 that takes out more than the row's share
    of q, and the cavity may be wider than the prior (only a non-positive variance is invalid there). A row of
    weight 0 is not in the model: its cavity is invalid (no update, no term, and not counted as a failure:
    ``counted_invalid``). Returns ``cavity``'s (valid, 1 - nu d, v, a)."""
    valid, one_minus, v, a = cavity(site_precision, site_shift, d, e, _prior_bound(prior_var, weights))
    return valid & (weights > 0), one_minus, v, a


def counted_invalid(valid, weights, like):
    """The failed cavities a pass counts: every invalid one, or (``weights``) those of rows in the model."""
    xp = array_namespace(like)
    invalid = ~valid if weights is None else (~valid & (weights > 0))
    return xp.sum(xp.astype(invalid, like.dtype))


@dataclass
class Held:
    """q seen along each row's held direction omega_i (the direction its site went into the running product along,
    ``Anchor``), beside its current upsilon_i (``Marginals``): W = L_K^T omega and Q_h = L_C^-1 W (m x b, whitened
    at the current kernel and Z), d_h = omega^T Sigma omega, e_h = omega^T mean and cross = upsilon^T Sigma omega
    (b,); ``omega`` itself (m x b, u-space)."""

    omega: object
    W: object
    Q: object
    d: object
    e: object
    cross: object


def held_marginals(post, marg, omega):
    """``Held`` for the rows whose current marginals are ``marg``, held along the columns of ``omega`` (m, b)."""
    W = triangular_matmul(post.L_K, omega, trans=True)
    Qh = post.solve_C(W)
    return Held(omega, W, Qh, row_dot(Qh, Qh, axis=-2), post.h @ Qh, row_dot(marg.Q, Qh, axis=-2))


def held_cavity(site_precision, site_shift, d, e, prior_var, d_h, e_h, cross, weights=None):
    """``cavity`` (``weighted_cavity`` with sample ``weights``) of a site held in q along omega_i, not along the
    current upsilon_i (``Held``'s d_h, e_h, cross): q^-i = q / exp(-nu (omega^T u)^2 / 2 + mu omega^T u), seen along
    upsilon_i. With Sigma^-i = Sigma + nu Sigma omega omega^T Sigma / (1 - nu d_h) (Sherman-Morrison), the cavity of
    g_i = upsilon_i^T u is

        v = d + nu cross^2 / (1 - nu d_h),   a = e + cross (nu e_h - mu) / (1 - nu d_h),

    ``cavity``'s d / (1 - nu d), (e - mu d) / (1 - nu d) where omega = upsilon (cross = d_h = d, e_h = e). As q
    holds the site along omega, 1 - nu d_h > 0 and v <= the prior's variance in exact arithmetic: the checks are
    ``cavity``'s (the prior's bound dropped for weights below 1, as ``weighted_cavity``). Returns (valid,
    1 - nu d_h, v, a)."""
    threshold, slack = cavity_tolerances(d)
    nu, mu = site_precision, site_shift
    valid, one_minus = _removable(nu, d_h, threshold)
    spread = nu * cross * cross
    bound = prior_var if weights is None else _prior_bound(prior_var, weights)
    valid = valid & (d * one_minus + spread <= (1.0 + slack) * bound * one_minus + threshold)
    if weights is not None:
        valid = valid & (weights > 0)
    v = d + spread / one_minus
    a = e + cross * (nu * e_h - mu) / one_minus
    return valid, one_minus, v, a


def held_adjoint_coefficient(alpha, kappa, site_precision, site_shift, e_h, cross, one_minus):
    """For a site held along omega_i (``held_cavity``), the coefficient of g'_i = B^-1 K omega_i in d log Z_i / d k_i;
    that of g_i = B^-1 k_i is then -kappa. With K^-1 m^-i = beta + r' g'_i and K^-1 Sigma^-i upsilon_i = g_i + t' g'_i,
    r' = (nu e_h - mu) / (1 - nu d_h), t' = nu cross / (1 - nu d_h), it is alpha r' - kappa t' (``data_adjoint``); at
    omega = upsilon the two add up to ``adjoint_coefficient``."""
    return (alpha * (site_precision * e_h - site_shift) - kappa * site_precision * cross) / one_minus


def removal_terms(site_precision, site_shift, d, e, one_minus):
    """g(cavity) - g(q) along upsilon_i for a site (nu, mu): a^2/(2v) + log(v)/2 - e^2/(2d) - log(d)/2,
    rewritten without 1/d (the per-site part of eq. 26 besides log Z_i)."""
    xp = array_namespace(d)
    nu, mu = site_precision, site_shift
    return (nu * e * e - 2.0 * mu * e + mu * mu * d) / (2.0 * one_minus) - 0.5 * xp.log(one_minus)


def adf_removal_terms(a, v, alpha, gamma, denom=None, shift=None):
    """g(cavity) - g(cavity x t) for the site t that moment matching makes of the tilted distribution with cavity
    N(a, v) (d log Z_i / da = alpha, -d^2 log Z_i / da^2 = gamma): minus the log of the mass of t under the cavity.

    ADF's row term of log Z_q (Hernandez-Lobato et al. (2015), cavity = q): the removal term g(q^-i) - g(q) of eq. 26
    with q^-i = q and the row's site in q its new one, so that each site carries the normaliser Z_i / E_q[t_i] that
    makes q x t_i hold the mass of the tilted q x phi_i. Without it the sum of the rows' terms leaves out
    sum_i log E_q[t_i] (~ sum_i mu_i^2 / (2 nu_i), which grows with the sites' precision), and log Z_q is no
    estimate of the evidence (positive, unbounded on a multiclass model); with it, the hyper-parameter gradient
    (eq. 4 with the cavity q fixed) is this estimate's own gradient with the sites held. With q x t = N(a + v alpha,
    v (1 - v gamma)) the difference of the two log normalisers is, without 1/v::

        -(1/2) log(1 - v gamma) - (2 a alpha + v alpha^2 + a^2 gamma) / (2 (1 - v gamma)).

    ``denom`` = 1 - v gamma and ``shift`` = alpha + a gamma: the caller's, when it has formed them for the new site."""
    xp = array_namespace(a)
    denom = 1.0 - v * gamma if denom is None else denom
    shift = alpha + a * gamma if shift is None else shift
    return -0.5 * (xp.log(denom) + (a * shift + alpha * (a + v * alpha)) / denom)


def moment_matched_site(valid, site_precision, site_shift, a, v, alpha, gamma, *, nonnegative=False):
    """New site (eq. 23): the tilted marginal along upsilon_i (d log Z / da = alpha, -d^2 log Z / da^2 =
    gamma) divided by the cavity N(a, v); an invalid cavity keeps the old site. ``nonnegative``: a precision that
    round-off deep in a tail left just below 0 is set to 0 (the probit's sites are never negative in exact
    arithmetic; the batch passes that take square roots of the sites rely on it)."""
    xp = array_namespace(a)
    denom = 1.0 - v * gamma
    precision = gamma / denom
    if nonnegative:
        precision = xp.maximum(precision, 0.0)
    return xp.where(valid, precision, site_precision), xp.where(valid, (alpha + a * gamma) / denom, site_shift)


def adjoint_coefficient(alpha, kappa, site_precision, site_shift, e, one_minus):
    """Coefficient of g_i = B^-1 k_i in d log Z_i / d k_i (see ``data_adjoint``): alpha r_i - kappa t_i."""
    return (alpha * (site_precision * e - site_shift) - kappa) / one_minus


def variance_adjoint(site, alpha, a, total_var, valid, weights):
    """kappa = -2 d log Z_i / d b of the rows (``data_adjoint``), zero where the cavity is invalid and times the
    rows' weights, as ``alpha`` (already so) is: the probit's alpha a / b (formed from alpha, the binary passes'
    arithmetic), else the likelihood's own (``likelihoods.SiteTerms``)."""
    if site.kappa is None:
        return alpha * a / total_var
    xp = array_namespace(alpha)
    kappa = xp.where(valid, site.kappa, 0.0)
    return kappa if weights is None else kappa * weights


def row_adjoints(site, a, total_var, valid, weights):
    """(alpha, kappa) of the rows for the gradient's data part (``ep.data_adjoint``): alpha = d log Z_i / d a, zero
    where the cavity is invalid and times the rows' ``weights`` (each row's log Z_q term counts w_i times), and
    kappa = -2 d log Z_i / d b (``variance_adjoint``), which follows alpha; ``total_var``: b, the rows' variance."""
    xp = array_namespace(site.alpha)
    alpha = xp.where(valid, site.alpha, 0.0)
    if weights is not None:
        alpha = alpha * weights
    return alpha, variance_adjoint(site, alpha, a, total_var, valid, weights)


def add_cut_point_grads(grads, kernel, likelihood, site, valid, weights):
    """An ordinal model's rows' sum_i d log Z_i / d (cut point parameters), added into ``grads`` (the kernel's
    gradients, which hold 0 there: ``OrdinalKernel.grads``); nothing for the probit. Rows of an invalid cavity
    add nothing, others times their weights (as their log Z_i terms)."""
    if site.cut_slopes is None:
        return grads
    xp = array_namespace(site.log_z)
    row_scale = xp.astype(valid, site.log_z.dtype)
    if weights is not None:
        row_scale = row_scale * weights
    for key, value in kernel.cut_point_grads(likelihood.cut_point_gradient(site.cut_slopes, row_scale)).items():
        grads[key] = grads[key] + value
    return grads


# n (g(cavity) - g(q)) taken as that difference loses n eps of |g| to cancellation: nothing for float64 below
# n = 4.5e9 (the direct form, two cached scalars, is kept there), whole nats for float32 at n = 1e5.
_SEP_DIRECT_MAX_LOSS = 1e-6
_SEP_SERIES_TERMS = 4  # tr(M), ..., tr(M^4) of ``sep_cavity_gap``: one m x m product


def _sep_series_is_exact(n_total, eps):
    """Whether the truncated series of ``sep_cavity_gap`` is within round-off of the whole sum: its remainder,
    at most m / (10 n^4 (1 - 1/n)), against m eps (float32: n >= 31; below that the direct form loses at most
    31 eps of |g|)."""
    return 10.0 * n_total**_SEP_SERIES_TERMS * (1.0 - 1.0 / n_total) * eps >= 1.0


def sep_cavity_gap(q, cavity, S, n_total):
    """n (g(cavity) - g(q)) of SEP's log Z without the difference of two nearly equal log normalisers.

    SEP's log Z is EP's (Hernandez-Lobato & Hernandez-Lobato (2016), eq. 26, log Z_q = g(q) - g(prior) + sum_i [log Z_i
    + g(q^-i) - g(q)]) with every cavity the same, q^-i = q / f^(1/n) for the tied factor f (Li, Hernandez-Lobato &
    Turner 2015; Hernandez-Lobato et al. (2015), sec. 4), so the n per-row terms g(q^-i) - g(q) become one, times n. In
    whitened form C_q = I + S, C_c = I + k S, c~_c = k c~ with k = 1 - 1/n, and g = c~^T C^-1 c~ / 2 - log|C| / 2. With
    C_c^-1 - C_q^-1 = C_c^-1 (S / n) C_q^-1 and k^2 - 1 = -(2 - 1/n) / n::

        n (quadratic parts) = [ (C_c^-1 c~)^T S (C_q^-1 c~) - (2 - 1/n) c~^T C_c^-1 c~ ] / 2,

    O(1) terms, no factor n left. With M = I - C_q^-1 = C_q^-1 S (symmetric, eigenvalues r_j in [0, 1), each
    known to eps absolutely), |C_c| / |C_q| = |I - M / n|, so::

        n (log-determinant parts) = -(n / 2) log|I - M / n| = (1 / 2) sum_k tr(M^k) / (k n^(k-1)),

    whose terms fall by 1/n each: four terms (tr M, |M|_F^2, and from the one product M M, tr(M^3) and |M^2|_F^2)
    leave at most m / (10 n^4) out, below round-off where this is used (``_sep_series_is_exact``). No factor
    n multiplies a rounded quantity: the error is a few m eps whatever n. C_q^-1 is the one the gradient's
    prior adjoint uses (cached on q); the rest is one m x m product and O(m^2) sums."""
    xp = array_namespace(S)
    keep = 1.0 - 1.0 / n_total
    cavity_solved = cavity.whitened_mean / keep  # C_c^-1 c~ (the cavity's whitened mean is C_c^-1 (k c~))
    quadratic = 0.5 * (row_dot(cavity_solved, S @ q.whitened_mean)
                       - (2.0 - 1.0 / n_total) * row_dot(cavity.h, cavity.h) / keep**2)
    m = S.shape[0]
    M = xp.eye(m, dtype=S.dtype, device=array_device(S)) - q.C_inv
    M2 = M @ M
    traces = (xp.sum(xp.linalg.diagonal(M)), xp.sum(M * M), xp.sum(M2 * M), xp.sum(M2 * M2))
    log_det = traces[0]
    for k in range(1, _SEP_SERIES_TERMS):
        log_det = log_det + traces[k] / ((k + 1) * float(n_total) ** k)
    return quadratic + 0.5 * log_det


def sep_cavity_term(q, cavity, S, n_total):
    """n (g(cavity) - g(q)) of SEP's log Z: the difference itself where the type keeps its digits, else
    ``sep_cavity_gap``."""
    eps = machine_epsilon(S)
    if n_total * eps <= _SEP_DIRECT_MAX_LOSS or not _sep_series_is_exact(n_total, eps):
        return n_total * (cavity.log_normaliser_gain - q.log_normaliser_gain)
    return sep_cavity_gap(q, cavity, S, n_total)


def rows_with_sites(site_precision, site_shift):
    """The indices of the rows with a site other than zero (multiclass rows (n, 2C): any of a row's), or None where
    every row has one. One host read (the count). A row whose sites are all zero adds exactly nothing to q's sums
    (nu_i a_i a_i^T and mu_i a_i): minibatch EP's rows not visited yet, in its first epoch."""
    xp = array_namespace(site_precision)
    some = (site_precision != 0) | (site_shift != 0)
    if some.ndim > 1:
        some = xp.any(some, axis=1)
    index = xp.nonzero(some)[0]
    return None if index.shape[0] == some.shape[0] else index


def only_rows_with_sites(X, y, site_precision, site_shift):
    """(X, y, site_precision, site_shift) of the rows with a site other than zero (``rows_with_sites``), for a sum
    over the rows' sites that the others would only make longer: minibatch EP's exact rebuild of q, which in the
    first epoch of a fit on 2,048,097 airline rows went over every row to add the sites of a few hundred thousand.
    The rows are copied (``GATHER_MAX_SHARE``, ``GATHER_MAX_ELEMENTS`` bound the copy); where no row has a site, the
    first one stands for them all (its zero sites add nothing, and the sums keep their shape). As given where every
    row has a site, or the rows are not gathered (``rows_in_site_sums``)."""
    index = rows_with_sites(site_precision, site_shift) if _gathers_rows(X, site_precision) else None
    if index is None or not _within_copy_bounds(index.shape[0], X):
        return X, y, site_precision, site_shift
    if index.shape[0] == 0:
        return tuple(None if a is None else a[:1, ...] for a in (X, y, site_precision, site_shift))
    xp = array_namespace(site_precision)
    return tuple(None if a is None else xp.take(a, index, axis=0) for a in (X, y, site_precision, site_shift))


def rows_in_site_sums(X, site_precision, site_shift, with_sites=None):
    """How many rows ``only_rows_with_sites`` keeps of X: every row where X is not gathered (data on disk, read a
    block at a time in order; a host array with a device's sites), or the copy would exceed its bounds. ``with_sites``:
    the rows taken to have sites (a time budget's projection; the sites are then not looked at), else those that do
    (one host read)."""
    n = int(X.shape[0])
    if not _gathers_rows(X, site_precision):
        return n
    if with_sites is None:
        index = rows_with_sites(site_precision, site_shift)
        with_sites = n if index is None else int(index.shape[0])
    return max(1, int(with_sites)) if _within_copy_bounds(with_sites, X) else n


# The rows gathered are a copy, on the device too: at most this many elements of X (256 MB of float64), so that a
# late rebuild in the first epoch does not hold X nearly twice, and this share of its rows (past it the copy saves
# less than a tenth of the pass). Where the count crosses either, the time budget's room jumps to a pass over every
# row (``hooks.TimeBudget._final_seconds``): at 90% a jump of a tenth (at a half it had cost 65-80-s airline fits
# 7-12% of their steps in a review's simulation).
GATHER_MAX_SHARE = 0.9
GATHER_MAX_ELEMENTS = 1 << 25


def _within_copy_bounds(rows, X):
    """Whether ``rows`` rows of X may be gathered: at most ``GATHER_MAX_SHARE`` of its rows and ``GATHER_MAX_ELEMENTS``
    elements (every row has a site: nothing to gather)."""
    width = X.shape[1] if X.ndim > 1 else 1
    return rows < X.shape[0] and rows <= GATHER_MAX_SHARE * X.shape[0] and rows * width <= GATHER_MAX_ELEMENTS


def _gathers_rows(X, site_precision):
    """Whether X's rows can be gathered by their sites: X is in memory as an array of the sites' library, on their
    device."""
    try:
        if is_out_of_core(X) or array_namespace(X, site_precision) is not array_namespace(site_precision):
            return False
    except TypeError:  # (arrays of two libraries)
        return False
    return array_device(X) == array_device(site_precision)
