"""How ``GPClassifier(n_inducing="auto")``, the default, sizes the model by the data (docs/small_data_defaults.md).

Up to ``EXACT_MAX_ROWS`` training rows the model is the exact one: an inducing point at every training row, held
there (the full GP, the m = n limit of the inducing-point model). A method with a full-GP pass of its own (the
registry's ``Method.exact_passes``: EP, ``agpc.inference.exact_ep``) trains it at full-GP EP's cost, one n x n
factorisation and inverse a step, in batch mode, for two classes, until its log Z stops rising
(``exact_plateau``). Above that, for more than two classes (whose exact model costs a factorisation a class and was
not better on the study's multiclass sets), for the methods without such a pass (SEP, ADF, GFITC, SVI, the vi-*
methods) and on minibatches, ``SPARSE_INDUCING`` inducing points (or every row, when there
are fewer), started by k-means and learned with the kernel, as every fit was before the rule. A fit on a dask array,
on data on disk (a memmap or zarr array, read a chunk at a time) or on a stream (``partial_fit``) does not hold the
rows whole as the exact model needs: it takes the sparse model. ``n_inducing="all"`` asks for the exact model
whatever the size (up to ``ALL_MAX_ROWS``); an integer, for that many inducing points, as before.

The exact model's lengthscales (``ard="auto"``, the default; ``ard_plan``, ``learn_lengthscales``): on up to
``ARD_CHOICE_MAX_ROWS`` rows (on all its rows for a kernel of categorical columns, whose lengthscales per feature
free more than one parameter a feature) it learns one scale shared by every feature first, then a lengthscale per
feature from there, and keeps those only when Akaike's criterion says they are worth their parameters
(``akaike_keeps``, charging ``kernels.tied_parameters``); last it
trains a linear kernel (``linear_start``), kept only when its log Z beats the RBF model's by ``LINEAR_MARGIN``
(``linear_keeps``), and a quadratic one (``quadratic_start``), kept only when its log Z beats the model kept so far
by ``QUADRATIC_MARGIN``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .backend import (CholeskyError, array_namespace, device_free_bytes, held_notes, overflow_raises, release_notes,
                      to_numpy)
from .batch_size import FULL_BATCH_MAX_ROWS
from .inference.blocks import fewest_block_rows
from .inference.sites import CAVITIES
from .kernels import RBF, Linear, Product, with_default_priors
from .untrusted import available_memory

__all__ = ["EXACT_MAX_ROWS", "SPARSE_INDUCING", "ALL_MAX_ROWS", "PLATEAU_STEPS", "PLATEAU_RISE_PER_ROW", "ModelSize",
           "model_size", "exact_plateau", "fit_plateau", "SPARSE_PLATEAU_STEPS", "SPARSE_PLATEAU_RISE_PER_ROW",
           "LARGE_BATCH_PLATEAU_STEPS",
           "MINIBATCH_PLATEAU_EPOCHS", "MINIBATCH_PLATEAU_RISE_PER_ROW", "fit_model_size", "exact_passes",
           "ARD_CHOICE_MAX_ROWS",
           "QUADRATIC_MAX_ROWS", "CHOOSE", "CHOOSE_TO_LINEAR", "ard_plan", "akaike_keeps", "LINEAR_MARGIN",
           "linear_start", "QUADRATIC_MARGIN", "quadratic_start", "linear_keeps", "learn_lengthscales",
           "INDUCING_CHOICE", "choose_inducing", "SUBSAMPLE_START_ROWS", "SUBSAMPLE_START_MAX_INDUCING",
           "subsample_start_rows", "FEWEST_BLOCK_MATRICES", "FEWEST_LATENT_MATRICES", "fit_memory_floor",
           "check_fit_memory"]

EXACT_MAX_ROWS = 700
"""The most training rows for which ``n_inducing="auto"`` takes the exact model (chosen in
docs/small_data_defaults.md: its cost, O(n^3) a step and about 100-200 steps to its plateau (``exact_plateau``),
against the 5 s a small fit may take on one core; on the study's sets it is as good as or better than the sparse
model below it)."""

SPARSE_INDUCING = 100
"""The inducing points of ``n_inducing="auto"`` above ``EXACT_MAX_ROWS`` (the default before the rule)."""

ALL_MAX_ROWS = 5000
"""The most rows ``n_inducing="all"`` takes. A full-GP EP step holds about eight n x n matrices at once (the kernel,
its scaled copy, the factor and its solves, the inverse of the gradient) and costs a few n^3 flops: at 5,000 rows
1.6 GB in float64 and a few seconds a step on two cores; at 20,000 it would be 26 GB and minutes a step, past this
kind of machine. Larger data take inducing points."""


PLATEAU_STEPS = 10
PLATEAU_RISE_PER_ROW = 1e-4
"""The exact model's training stops once its log Z (EP's marginal likelihood) has risen by less than
``PLATEAU_RISE_PER_ROW`` nats a training row over the last ``PLATEAU_STEPS`` hyper-parameter steps
(``exact_plateau``; at most ``max_iter`` steps, as before). Chosen in docs/small_data_defaults.md: on the study's
sets it stopped after 88-260 of the 260 passes (162 on average), at a test NLL 0.0007 ± 0.0005 below where all of
them end (no set worse by more than 0.0004 on average), and each pass it saves costs O(n^3)."""


SPARSE_PLATEAU_STEPS = 5
SPARSE_PLATEAU_RISE_PER_ROW = 3e-4
LARGE_BATCH_PLATEAU_STEPS = 20
MINIBATCH_PLATEAU_EPOCHS = 20
MINIBATCH_PLATEAU_RISE_PER_ROW = 3e-4
"""The default fit's stop on its plateau of log Z above the exact model (``fit_plateau``): batch steps stop once log
Z has risen by less than ``SPARSE_PLATEAU_RISE_PER_ROW`` nats a training row over the last ``SPARSE_PLATEAU_STEPS``
steps (``LARGE_BATCH_PLATEAU_STEPS`` on more than ``FULL_BATCH_MAX_ROWS`` rows), minibatch fits once it has risen by
less than ``MINIBATCH_PLATEAU_RISE_PER_ROW`` over the last ``MINIBATCH_PLATEAU_EPOCHS`` epochs (the history's record
of an epoch: minibatch EP's exact log Z_q at its end, the mean of the steps' estimates for the others). Chosen in
docs/small_data_defaults.md ("When the sparse model stops", ``benchmarks/stopping.py``); the longer window of batch
fits past 20,000 rows (where ``batch_size="auto"`` took minibatches before, and still does but for binary EP) in its
"Batch steps up to 200,000 rows": on the slowly climbing clf-50000x20 a window of 5 steps stopped the fit after 126
steps, 0.012 above its minibatch fit, one of 10 after 231 (+0.0066); 20 steps keep it to ``max_iter`` (+0.0054). The
longer window holds for every batch fit of more than 20,000 rows (counted by weight), those of other kinds too, but
for binary EP's fits on all rows after their start on a subsample (``subsample_start_rows``), which stop on
``SPARSE_PLATEAU_STEPS``."""


SUBSAMPLE_START_ROWS = 10_000
SUBSAMPLE_START_MAX_INDUCING = 1_000
"""Binary EP's batch fits of more than ``FULL_BATCH_MAX_ROWS`` rows (``batch_size.binary_on_host``: up to 200,000
rows in memory) train first on a random ``SUBSAMPLE_START_ROWS`` of their rows, to that fit's plateau, and then on
all rows from the kernel and inducing points it reached, stopping on the window of ``SPARSE_PLATEAU_STEPS`` steps
(``subsample_start_rows``). On all rows the fit spends most of its steps moving the hyper-parameters from where they
start, at Rprop's small first steps, a pass over every row each; from the subsample's they are close to where all
rows take them. Chosen in docs/small_data_defaults.md ("A start on a subsample"): on airline subsets of 50,000 and
200,000 rows and generated tables of 30,000-100,000 rows the default fit took 0.15-0.47 of the time at a test NLL
-0.0033 to +0.0023 of the fit on all rows alone (mean +0.0004); on the sets it was checked on, +0.0000 to +0.0036 at
0.25-0.42 of the time. Not taken with more than ``SUBSAMPLE_START_MAX_INDUCING`` inducing points (not measured; a
tenth of the subsample)."""


def subsample_start_rows(plan, n_rows, size, minibatch, plateau, learns=True):
    """The rows of the random subsample a fit of ``plan`` on ``n_rows`` training rows (counted by weight) trains on
    first (``SUBSAMPLE_START_ROWS``), or None: only binary EP's batch fits in memory of more than
    ``FULL_BATCH_MAX_ROWS`` rows (``plan.binary_on_host``, ``minibatch`` False), of the sparse model (``size``, a
    ``ModelSize``) of at most ``SUBSAMPLE_START_MAX_INDUCING`` points, that stop on their plateau (``plateau``, the
    estimator's: None runs every iteration it may, on all rows) and learn something (``learns``: the ``optimize``
    groups are not empty; a fit that learns nothing only refines the sites of its rows)."""
    if (plateau is None or minibatch or not learns or not plan.binary_on_host or size.at_rows
            or n_rows <= FULL_BATCH_MAX_ROWS or size.n_inducing > SUBSAMPLE_START_MAX_INDUCING):
        return None
    return SUBSAMPLE_START_ROWS


def exact_plateau(n_rows):
    """(steps, rise) of the exact model's stop on ``n_rows`` training rows: the training loop's ``plateau``."""
    return PLATEAU_STEPS, PLATEAU_RISE_PER_ROW * n_rows


def fit_plateau(plateau, n_rows, at_rows, minibatch=False, started_on_subsample=False, by_weight=None):
    """The training loop's ``plateau`` (steps, rise) for ``GPClassifier(plateau=...)`` on ``n_rows`` training rows
    (``by_weight``: their weights' sum, where they have weights: log Z is a sum of each row's term times its weight,
    so the rise is per row counted by weight; a fit of rows with integer weights stopped on another iteration than the
    fit of the rows repeated, and one of weights of 1,000 on a rise a thousand times too small for its log Z):
    None (run to ``max_iter``), or for "auto" the exact model's stop (``at_rows``), the sparse model's in batch mode
    (``SPARSE_PLATEAU_STEPS``, or ``LARGE_BATCH_PLATEAU_STEPS`` past ``batch_size.FULL_BATCH_MAX_ROWS`` rows unless
    the fit ``started_on_subsample``, ``subsample_start_rows``; and ``SPARSE_PLATEAU_RISE_PER_ROW``) or on minibatches
    (``MINIBATCH_PLATEAU_EPOCHS``, ``MINIBATCH_PLATEAU_RISE_PER_ROW``)."""
    if plateau is None:
        return None
    weighted = n_rows if by_weight is None else by_weight
    if at_rows:
        return exact_plateau(weighted)
    if minibatch:
        return MINIBATCH_PLATEAU_EPOCHS, MINIBATCH_PLATEAU_RISE_PER_ROW * weighted
    large = n_rows > FULL_BATCH_MAX_ROWS and not started_on_subsample
    steps = LARGE_BATCH_PLATEAU_STEPS if large else SPARSE_PLATEAU_STEPS
    return steps, SPARSE_PLATEAU_RISE_PER_ROW * weighted


@dataclass(frozen=True)
class ModelSize:
    """What a fit on ``n_rows`` rows trains: ``n_inducing`` points, at the training rows and held there
    (``at_rows``: the exact model) or started by the plan's ``inducing`` and learned as ``optimize`` says."""

    n_inducing: int
    at_rows: bool


def model_size(n_inducing, n_rows, *, has_exact_pass, rows_known=True, n_classes=2):
    """The ``ModelSize`` of ``n_inducing`` ("auto", "all" or an integer) for ``n_rows`` training rows of
    ``n_classes`` classes.
    ``has_exact_pass``: the method trains the exact model by a full-GP pass of its own (else "auto" is sparse at
    every size: its inducing-point passes on m = n would cost O(n^3) with a large constant every step).
    ``rows_known=False``: a stream, a dask array or data on disk (read a chunk at a time; "auto" is then the sparse
    model, "all" is refused)."""
    if n_inducing == "all":
        if not rows_known:
            raise ValueError("n_inducing='all' puts an inducing point at every training row: it needs the rows whole "
                             "(fit on an in-memory array), not a stream, a dask array or data on disk")
        if n_rows > ALL_MAX_ROWS:
            raise ValueError(f"n_inducing='all' holds n x n matrices: {n_rows} rows is more than {ALL_MAX_ROWS}; "
                             "give a number of inducing points")
        return ModelSize(n_rows, True)
    if n_inducing == "auto":
        if rows_known and has_exact_pass and n_classes == 2 and n_rows <= EXACT_MAX_ROWS:
            return ModelSize(n_rows, True)
        return ModelSize(min(SPARSE_INDUCING, n_rows), False)
    return ModelSize(int(n_inducing), False)


def exact_passes(plan, steps):
    """The full-GP passes of the plan's method for the exact model of its rows (``Method.exact_passes``, any number
    of classes), where its fit runs batch passes over them (``steps``, a ``plan.Steps``); else None."""
    if steps.minibatch or plan.ordinal:  # (an ordinal model: the full-GP passes are the probit's)
        return None
    return plan.spec.exact_passes


def fit_model_size(plan, steps, n_rows, n_classes=2, rows_known=True):
    """The inducing points of the plan's fit (its rows' ``steps``) on ``n_rows`` rows (``model_size`` of its
    ``n_inducing``; the rows counted by their weights): how many, and whether they are the training rows
    themselves, held there (the exact model). An array of initial points (``inducing``) sets m itself. More inducing
    points than rows are refused."""
    explicit = not isinstance(plan.inducing, str)
    if explicit:
        size = ModelSize(len(plan.inducing), False)
    else:
        size = model_size(plan.n_inducing, n_rows, rows_known=rows_known, n_classes=n_classes,
                          has_exact_pass=exact_passes(plan, steps) is not None)
    if size.n_inducing > n_rows:
        what = f"{size.n_inducing} initial inducing points" if explicit else f"n_inducing={size.n_inducing}"
        raise ValueError(f"{what} exceeds the number of training rows ({n_rows}): use at most one inducing point per "
                         "row")
    return size


# The fewest n x m temporaries a latent function holds per row of a block at a pass's peak: the least of those
# measured per row by tracemalloc on NumPy (2026-12-03, as tests/test_device_memory.py measures them: 3.2 m for SEP
# at m = 30, 3.6 m a class for multiclass EP at m = 60, up to 15 m; ``blocks.BLOCK_MATRICES`` is the budget above
# them all). ``fit_memory_floor`` counts these, no more, so that it stays below what any fit takes (a whole fit's
# peak against the floor: tests/test_device_memory.py).
FEWEST_BLOCK_MATRICES = 3
# The m x m matrices every latent function of the model holds whatever the method: its factor's (or q's) precision
# and the Cholesky factor of its posterior.
FEWEST_LATENT_MATRICES = 2


def fit_memory_floor(plan, steps, size, n_features, n_latent, itemsize, on_device=False):
    """Bytes the plan's fit on its rows (``steps``, a ``plan.Steps``) cannot do with less of, by part: ``block``, one
    row block's temporaries (of ``fewest_block_rows`` rows on the host, fewer where a step or ``block_rows`` has
    fewer; one row on a device, whose blocks shrink to its free memory); ``model``, ``FEWEST_LATENT_MATRICES`` m x m
    matrices a latent function (``n_latent``: C for C classes, else 1); ``sites``, for EP (a cavity with sites of
    its own, Villacampa-Calvo & Hernandez-Lobato 2017, sec. 3) the site precision and shift of every row (2 C a row
    for C classes), kept for the whole fit. A floor: what the fit adds to it (its other per-row arrays, gradients,
    the optimiser's moments) is not counted."""
    m = size.n_inducing
    rows = 1 if on_device else min(fewest_block_rows(n_latent), steps.step_rows or steps.n_rows, steps.n_rows)
    if plan.block_rows is not None:
        rows = min(rows, int(plan.block_rows))
    cavity = CAVITIES.get(plan.method)
    own_sites = cavity is not None and cavity.own_sites and not plan.ordinal
    per_row = 2 * n_latent if n_latent > 1 else 1
    # (a batch pass returns every row's new sites while the fit holds the old ones: four such arrays at once; a
    # minibatch step updates its rows' sites in place)
    copies = 2 if steps.minibatch else 4
    return {"block": itemsize * rows * (n_latent * FEWEST_BLOCK_MATRICES * m + n_features),
            "model": itemsize * n_latent * FEWEST_LATENT_MATRICES * m * m,
            "sites": itemsize * copies * per_row * steps.n_rows if own_sites else 0}


def check_fit_memory(plan, steps, size, n_features, n_classes, xp, device=None):
    """A MemoryError, before anything is built, for a fit of ``n_classes`` classes whose ``fit_memory_floor`` is
    more than the memory its arrays can take (a device's free memory, ``backend.device_free_bytes``, else the
    host's, ``untrusted.available_memory``): many classes times many inducing points would otherwise run minutes
    into the first pass before the allocator refuses it. Its message names the parts and what lowers them."""
    n_latent = 1 if (plan.ordinal or n_classes == 2) else n_classes  # (an ordinal model: one latent GP)
    on_device = device_free_bytes(xp, device)
    free = available_memory() if on_device is None else on_device
    parts = fit_memory_floor(plan, steps, size, n_features, n_latent, np.dtype(plan.dtype).itemsize,
                             on_device=on_device is not None)
    need = sum(parts.values())
    if free is None or need <= free:
        return
    named = {"block": "a row block's temporaries", "model": "the m x m matrices of each latent function",
             "sites": "EP's sites of every row"}
    shares = ", ".join(f"{_gib(parts[part])} for {what}" for part, what in named.items() if parts[part])
    raise MemoryError(
        f"a fit of {steps.n_rows:,} rows of {n_classes:,} classes with {size.n_inducing:,} inducing points needs at "
        f"least {_gib(need)} of memory ({shares}), more than the {_gib(free)} "
        f"{'free on the device' if on_device is not None else 'available'}: fewer inducing points (n_inducing), fewer "
        "classes (merge the rare ones), a smaller block_rows or a method without sites a row (method='sep' or 'svi') "
        "needs less")


def _gib(n_bytes):
    return f"{n_bytes / (1 << 30):.2f} GiB"


ARD_CHOICE_MAX_ROWS = 500
"""The most training rows for which ``ard="auto"`` chooses between one shared lengthscale scale, one per feature, a
linear and a quadratic kernel (``ard_plan``). The choice trains the exact model two to four times (1.5-2.2 times the
cost of one fit on the study's sets of 400-600 rows for the first two; the linear and the quadratic kernel add
0.1-0.8 of one each, docs/small_data_defaults.md); above 500 rows the first two alone took 5.3-5.7 CPU s on one
core on two of the seven test sets (australian, breast: 615-621 rows), past the 5 s a small fit may take, and the
study's sets hold no evidence of a gain there (clf-700x8 and clf-700x14 kept their lengthscales per feature). A
kernel whose lengthscales per feature free more than d - 1 parameters is chosen for past it (``ard_plan``)."""

QUADRATIC_MAX_ROWS = 400
"""The most training rows for which ``ard="auto"`` weighs the quadratic kernel, its last stage (``ard_plan``). It
adds 0.2-0.3 of the fit before it at 400 rows, 0.3-0.65 at 450 and 0.1-0.4 at 500: the default's CPU seconds of one
fit, one BLAS thread, a quiet core, three generated sets of 8-10 features (docs/small_data_defaults.md), went from
2.1-2.8 to 2.6-3.5 at 400 rows, from 3.3-3.6 to 4.3-5.9 at 450 and from 3.5-4.9 to 3.9-6.9 at 500, past the 5 s a
small fit may take. The study's and the test sets where it was chosen and checked have 180-360 rows."""

CHOOSE = "choose"
"""``ard_plan``'s answer for a fit that trains one shared lengthscale scale first, then a lengthscale per feature from
there, kept only if ``akaike_keeps`` says so, then a linear and a quadratic kernel, each kept only if
``linear_keeps`` says so."""

CHOOSE_TO_LINEAR = "choose-to-linear"
"""``ard_plan``'s answer above ``QUADRATIC_MAX_ROWS`` rows: ``CHOOSE`` without its quadratic stage."""


def ard_plan(plan, size, n_features, freed=None):
    """How the plan's fit learns its lengthscales (its ``ard``): True, per feature; False, one scale for all,
    the features keeping their starting ratios; ``CHOOSE`` (``CHOOSE_TO_LINEAR`` above ``QUADRATIC_MAX_ROWS`` rows),
    both in turn and the better by Akaike's criterion.
    ``ard="auto"`` chooses (and weighs a linear and a quadratic kernel after, ``learn_lengthscales``) for
    ``n_inducing="auto"``'s exact model of the default kernel (``kernel=None``) with something to tie, without
    checkpoints (a fit of several stages would write several runs to one file), on up to ``ARD_CHOICE_MAX_ROWS``
    rows, and on all the exact model's rows where lengthscales per feature free more than one parameter a feature
    (``freed``: ``kernels.tied_parameters``, n_features - 1 when not given): the default kernel of categorical
    columns, a lengthscale a level in both its sum and its product (docs/small_data_defaults.md, "Categorical
    columns"). It is per feature everywhere else, as before the rule (docs/small_data_defaults.md says where it was
    chosen and checked)."""
    if not isinstance(plan.ard, str):
        return bool(plan.ard)
    freed = n_features - 1 if freed is None else freed
    # n_inducing="auto"'s exact model only (binary batch EP, where the rule was chosen): not
    # "all" (any method, classes or size: C (d - 1) parameters for C classes, an ELBO for SVI, O(n^3) twice)
    if (size.at_rows and (size.n_inducing <= ARD_CHOICE_MAX_ROWS or freed > n_features - 1)
            and plan.n_inducing == "auto" and plan.kernel is None and freed > 0 and plan.checkpoint_path is None
            and plan.spec.supports("shared_lengthscales")):
        return CHOOSE if size.n_inducing <= QUADRATIC_MAX_ROWS else CHOOSE_TO_LINEAR
    return True


def akaike_keeps(log_z_shared, log_z_per_feature, freed):
    """Whether lengthscales per feature beat one shared scale by Akaike's (1974) criterion on EP's log marginal
    likelihood: they add ``freed`` hyper-parameters (d - 1 for an RBF of d features; ``kernels.tied_parameters``),
    so they must raise log Z by more than that many nats (AIC = 2 k - 2 log Z; the criterion estimates the expected
    log predictive density, the test NLL's kind of score). Chosen on the study's sets (docs/small_data_defaults.md):
    type-II maximum likelihood of d lengthscales on a few hundred noisy rows over-fits, and one scale loses badly
    only where features are pure noise, where per-feature lengthscales gain far more than d nats."""
    return log_z_per_feature - log_z_shared > freed


LINEAR_MARGIN = 1.0
"""Nats by which a linear kernel's log Z must exceed the RBF model's (after ``akaike_keeps``' penalty, when its
lengthscales are per feature) for ``ard="auto"`` to keep it: a Bayes factor of e, where Kass & Raftery (1995) put
the boundary of "positive" evidence (2 ln B > 2). The two models have as many hyper-parameters (one shared scale, an
amplitude or a bias, the latent noise), so the criterion is the evidence alone; the margin keeps the RBF, the
default kernel, where the evidence cannot tell them apart (docs/small_data_defaults.md: on the study's sets the
linear kernel's log Z came within 1 nat of the RBF's where it predicted worse)."""


def linear_start(kernel):
    """The linear kernel ``ard="auto"`` weighs against ``kernel``, the default RBF at its start (None for any other
    kernel): slope variances 1 / l_j^2 of its lengthscales l_j (``kernels.Linear``: on standardised features f's
    prior variance sum_j x_j^2 / l_j^2 is then about the RBF's amplitude of 1), a bias of 1, the same latent noise,
    and the default priors when the RBF has them (``kernels.with_default_priors``). Trained with one shared scale.
    None too where those slope variances are not normal numbers of the kernel's type (features of scale past ~1e154
    or below ~1e-154 in float64, 1e19 / 1e-19 in float32, which the RBF's lengthscales follow)."""
    if type(kernel) is not RBF:
        return None
    params = kernel.params
    finfo = array_namespace(params["log_lengthscales"]).finfo(params["log_lengthscales"].dtype)
    representable = (math.log(finfo.smallest_normal), math.log(finfo.max))
    if not all(representable[0] < -2.0 * float(c) < representable[1] for c in to_numpy(params["log_lengthscales"])):
        return None
    linear = Linear.from_params({"log_variances": -2.0 * params["log_lengthscales"],
                                 "log_bias": 0.0 * params["log_amplitude"], "log_noise": params["log_noise"]})
    return with_default_priors(linear, kernel) if kernel.priors else linear


QUADRATIC_MARGIN = 2.0
"""Nats by which the quadratic kernel's log Z (``quadratic_start``) must exceed the model kept before it (the RBF's,
after ``akaike_keeps``' penalty, or the linear kernel's) for ``ard="auto"`` to keep it: a Bayes factor of e^2, inside
Kass & Raftery's (1995) "positive" evidence (2 ln B from 2 to 6). It has as many hyper-parameters as the linear
kernel (a slope scale and a bias); the margin is wider than ``LINEAR_MARGIN`` because on the study's sets
(docs/small_data_defaults.md) a margin of 1 kept it on two sets where it predicted worse, and 2 on none."""


def quadratic_start(kernel):
    """The quadratic kernel ``ard="auto"`` weighs after the linear one: the linear kernel of ``linear_start`` times
    itself, k(x, z) = (sum_j v_j x_j z_j + b)^2, a latent function quadratic in the features, products of features
    included (Rasmussen & Williams (2006), eq. 4.22: the polynomial kernel of degree 2). The two factors start equal
    and their gradients are equal, so they stay equal: one shared slope scale and one bias are learned, the latent
    noise is the RBF's. None where ``linear_start`` is."""
    linear = linear_start(kernel)
    if linear is None:
        return None
    factor = linear.without_noise()
    product = Product(factor, factor)
    # the latent noise as the linear start holds it, in the start's namespace, device and type (``Product`` takes a
    # noise as a number and holds it on the host in float64, for a user's kernel that ``for_inputs`` moves later;
    # nothing moves this one)
    return product.with_params({**product.params, "log_noise": linear.params["log_noise"]})


def linear_keeps(log_z_kept, log_z_candidate, margin=LINEAR_MARGIN):
    """Whether a later kernel of ``ard="auto"`` is kept: its log Z beats the kept model's (the RBF's, less Akaike's
    penalty for lengthscales per feature, or the linear kernel's) by more than ``margin`` (``LINEAR_MARGIN``, or
    ``QUADRATIC_MARGIN`` for the quadratic kernel)."""
    return log_z_candidate - log_z_kept > margin


def _out_of_time(kept, cut):
    """``kept``, saying that the fit ran out of time when a later stage ``cut`` was cut short by ``max_time``."""
    if kept is cut or not cut.stopped_by_time:
        return kept
    return replace(kept, stopped_by_time=True, stop_reason=cut.stop_reason)


def _stage_names(quadratic):
    """The names of the stages of ``learn_lengthscales``' choice, in their order, as the progress lines say them."""
    kinds = ["one shared lengthscale", "a lengthscale per feature", "linear kernel"] + (["quadratic kernel"] if quadratic
                                                                                        else [])
    return [f"kernel choice {i}/{len(kinds)}: {kind}" for i, kind in enumerate(kinds, 1)]


INDUCING_CHOICE = ("inducing choice 1/2: points on rows' levels", "inducing choice 2/2: points of any level")
"""The progress lines' names of ``choose_inducing``'s two stages."""


def choose_inducing(learn, Z, alternative, has_room=lambda: True):
    """(training result, whether its lengthscales are per feature) of ``learn(Z, stage name, fits after it)`` (a whole
    fit from the inducing points Z: ``learn_lengthscales``; the fits that may follow it, 1 or 0, are for its progress
    lines' estimate of the whole fit), or where ``alternative`` points are given
    (``inducing.with_any_levels``: some categorical coordinates "any level"), of both in turn, the one of the higher
    log Z kept. Which points a table's categorical columns need is the data's: tic-tac-toe's class (lines of three
    cells) gained 45-53 nats of log Z from points of any level in most columns, car's lost 0-10 (docs/results.md,
    "Categorical columns"); both have the kernel's parameters, so log Z compares the two inducing sets as it
    compares models. A first fit that ran out of time or stopped early on validation data is
    kept, and so is one after which ``has_room()`` says the time budget has no room for a second as long; a second
    that fails numerically, or runs out of time, leaves the first (``_out_of_time`` says so)."""
    first = learn(Z, "" if alternative is None else INDUCING_CHOICE[0], int(alternative is not None))
    if alternative is None or first[0].stop_reason in ("max_time", "early_stopping") or not has_room():
        return first
    try:
        second = learn(alternative, INDUCING_CHOICE[1], 0)
    except (CholeskyError, FloatingPointError):
        return first
    if second[0].stopped_by_time or not second[0].log_z > first[0].log_z:
        return _out_of_time(first[0], second[0]), first[1]
    return second


def learn_lengthscales(plan, freed, kernel, train, then_fits=0):
    """(training result, whether its lengthscales are per feature) of a fit whose ``ard_plan`` is ``plan``, from
    ``kernel``, whose lengthscales per feature free ``freed`` parameters (``akaike_keeps``); ``train(start,
    shared, first)`` runs the training loop from the kernel ``start``, its lengthscales
    tied (``shared``), ``first`` for the first stage (the one a resumed fit resumes). ``CHOOSE``: one shared scale
    first, then per feature from where it ended, kept by ``akaike_keeps``, then a linear kernel (``linear_start``,
    one shared scale) and a quadratic one (``quadratic_start``, its two equal factors one shared scale each), each
    kept by ``linear_keeps`` against the model kept before it; a stage that fails numerically ends the choice (the
    model kept so far stands); ``CHOOSE_TO_LINEAR``: the same without the quadratic kernel. A first stage that ran
    out of time or stopped early on validation data stays shared, and a stage cut short by ``max_time`` ends the
    choice. Each stage may take ``max_iter`` steps and ``max_time`` covers them all; the result (``n_iter_``,
    ``history_``) is the kept stage's, and says ``max_time`` when a later stage was cut short by it. ``train``'s fourth
    argument names the stage on the fit's progress lines ("" for a fit of one stage), its fifth counts the stages that
    may follow it (for the line's estimate of the whole fit): this choice's later ones, and all of each of the
    ``then_fits`` whole fits after it (``choose_inducing``'s second, whose choice has as many)."""
    choosing = plan in (CHOOSE, CHOOSE_TO_LINEAR)
    stage_names = _stage_names(plan == CHOOSE) if choosing else [""]
    after = then_fits * len(stage_names)
    names = iter((name, len(stage_names) - k + after) for k, name in enumerate(stage_names, 1))
    result = train(kernel, plan is not True, True, *next(names))
    if not choosing or result.stop_reason in ("max_time", "early_stopping"):
        return result, plan is True
    per_feature = train(result.kernel, False, False, *next(names))
    keep = akaike_keeps(result.log_z, per_feature.log_z, freed)
    kept, log_z_kept = (per_feature, per_feature.log_z - freed) if keep else (result, result.log_z)
    last = per_feature
    later = [(linear_start(kernel), LINEAR_MARGIN)]
    if plan == CHOOSE:
        later.append((quadratic_start(kernel), QUADRATIC_MARGIN))
    kept_notes = None  # (held_notes of the later kernel kept: said once the choice is over)
    for start, margin in later:
        if last.stopped_by_time or start is None:
            break
        # (the warnings of a candidate not kept, its jitter raised or the guard's actions, are not the returned model's)
        with held_notes() as notes:
            try:
                with overflow_raises():  # (an overflow fails the candidate, as a Cholesky that fails does)
                    candidate = train(start, True, False, *next(names))
            except (CholeskyError, FloatingPointError):
                # a candidate the numbers cannot hold (features of scale ~1e-160 or 1e160, 1e-19 or 1e19 in float32:
                # its slope variances 1 / l_j^2, or x_j^2, past the dtype's range) is not kept; the model kept so far
                # stands
                break
            except BaseException:  # (an interrupt: what the guard did in the stage happened, and is said)
                release_notes(notes)
                raise
        if _jitter_raised_past(candidate, kept):
            # nor one whose fit raised the jitter past the kept model's: its log Z is of K(Z, Z) plus that jitter,
            # another model (a constant column of 1e4 beside two of scale 1 took the quadratic kernel's to 1e5 and
            # won, at a test accuracy of 0.73 against the RBF's 0.84; of 1e9, to 1e25: 0.50)
            break
        last = candidate
        if linear_keeps(log_z_kept, candidate.log_z, margin):
            kept, log_z_kept, keep, kept_notes = candidate, candidate.log_z, False, notes
    release_notes(kept_notes)
    return _out_of_time(kept, last), keep


def _jitter_raised_past(candidate, kept):
    """Whether the fit of ``candidate`` (a training result) ended with more jitter on K(Z, Z) than ``kept``'s."""
    return candidate.jitter is not None and kept.jitter is not None and candidate.jitter > kept.jitter
