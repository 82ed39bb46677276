"""``partial_fit``'s machinery: the stream trainer of a tied-factor method, built fresh or from a fitted model's
state, one guarded step on a batch, and the rules for continuing a fitted model (``GPClassifier.partial_fit``).

A stream step is one damped update of SEP's tied factor and one stochastic step on the hyper-parameters on the
rows given (Hernandez-Lobato & Hernandez-Lobato 2016, eq. 6; the tied factor of Li, Hernandez-Lobato & Turner
2015), by the same ``training.Trainer`` and divergence guard as ``fit``."""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter

import numpy as np

from . import backend as B
from . import methods as M
from . import labels as L
from . import size_rule
from .inference import multiclass_ep, training
from .inference.guard import GUARD_KEYS
from .inference.posterior import Factor
from .validation import attributes_kept_on_failure

__all__ = ["ROWS_SEEN", "check_stream_params", "structure", "check_continuable", "stream_trainer", "trainer_from_fitted",
           "rows_counted", "step", "unchanged_on_failure", "note_first_batch"]

ROWS_SEEN = "n_rows_seen"  # the history entry of partial_fit: the rows the stream has brought so far

# A batch of more than SETTLE_SHARE of the rows the stream stands for (its first, unless ``n_total`` says more) first
# takes the passes of a batch fit's warm-up (SETTLE_PASSES at a batch fit's damping; SEP's while log Z rises:
# ``Trainer.settle_factor``). One damped update of the tied factor from the prior takes every row's site at the prior
# as its cavity, as if each were alone: with the multiclass likelihood's sharp sites (latent noise 1e-3) a first
# batch of 50 rows gave test NLL 2.16, 68% of the rows at p > 0.999 (the batch fit of those rows 0.54; the
# hostile-input audit of 2026-12-04); after the passes 0.56.
SETTLE_SHARE = 0.5
SETTLE_PASSES = 10
SETTLE_DAMPING = 0.5


def check_stream_params(plan, streaming):
    """``partial_fit``'s own rules: checkpoint settings are warned about once (``streaming``: a stream already under
    way), since only ``fit`` writes checkpoints."""
    if (plan.checkpoint_path is not None or plan.checkpoint_every is not None) and not streaming:
        warnings.warn("partial_fit writes no checkpoints (checkpoint_path / checkpoint_every apply to fit); save "
                      "a stream model with save() or pickle it between calls", UserWarning, stacklevel=3)


def structure(plan):
    """The parameters that fix what a fitted model is (its method, type, size, kernel, likelihood and priors), of
    the plan of its fit: partial_fit continues a model only while they stay as it was fitted with."""
    return {"method": plan.method, "dtype": plan.dtype, "n_inducing": plan.n_inducing,
            "kernel": None if plan.kernel is None else repr(plan.kernel), "likelihood": plan.likelihood,
            "kernel_prior": plan.kernel_prior, "ard": plan.ard}


def check_continuable(plan, fitted_with, classes, fitted_classes):
    """partial_fit on a model of the classes ``fitted_classes`` fitted with the parameters ``fitted_with`` (a
    ``structure``) continues it: refused (one ValueError) when the model is not one a stream can continue, or when
    ``classes`` or the structural parameters (the ``plan``'s now) changed since it was fitted."""
    if not M.supports(fitted_with["method"], "partial_fit"):
        raise ValueError(
            f"partial_fit cannot continue this model: it was fitted with method={fitted_with['method']!r}, and "
            f"only the methods {list(M.methods_supporting('partial_fit'))} learn from a stream; call fit to start "
            "again"
        )
    if classes is not None:  # (an ordinal model's classes are in their order)
        given = L.check_labels(classes, what="classes")
        given = given if plan.ordinal else np.unique(given)
        if given.shape != fitted_classes.shape or not np.array_equal(given, fitted_classes):
            raise ValueError(f"classes={given.tolist()} differs from the classes this model was fitted with "
                             f"({fitted_classes.tolist()}); call fit to start again with other classes")
    now = structure(plan)
    changed = [f"{name} {fitted_with[name]!r} -> {now[name]!r}" for name in now if now[name] != fitted_with[name]]
    if changed:
        raise ValueError(f"partial_fit cannot continue this model: {', '.join(changed)} since it was fitted; "
                         "call fit to start again with the new parameters")


def stream_trainer(plan, kernel, Z, n_total, groups, jitter, shared=None, *, n_classes, likelihood=None):
    """A minibatch trainer of the plan's method (its engine, ``agpc.methods``) at (kernel, Z) for a model of
    ``n_classes`` classes; ``shared``: its lengthscales tied (None: as the plan's ``ard`` asks); ``likelihood``: the
    object a fitted model keeps, which it goes on with (None: the plan's)."""
    options = training.EngineOptions(
        jitter=jitter, optimize=groups, damping=None if plan.damping is None else float(plan.damping),
        optimizer=plan.optimizer, learning_rate=plan.learning_rate,
        likelihood=plan.engine_likelihood(n_classes) if likelihood is None else likelihood,
        n_quadrature=int(plan.n_quadrature),
        shared_lengthscales=plan.shared_lengthscales if shared is None else shared,
    )
    engine = plan.spec.make_engine(kernel, Z, n_total=n_total, minibatch=True, options=options)
    # Each call is one step on all it learns, Z too (docs/usage.md), not one in a few as in ``fit``
    # (``tied_steps``): the held gradients would be lost with a model file, which keeps no optimiser state.
    engine.holds_inducing = False
    return training.Trainer(engine)


def trainer_from_fitted(plan, fitted, groups, n_total, rows, rows_seen, *, likelihood=None):
    """A stream trainer at the fitted state of a model without one (fitted by ``fit``, or loaded; ``fitted``, its
    ``model.FittedState``): its kernel and inducing points, SEP's tied factor read back from its posterior
    (``posterior.Factor.from_posterior``; per class for a multiclass model), the fitted jitter, and the step count and
    history going on, with the likelihood object the model keeps (``likelihood``; None: the plan's). ``rows_seen``:
    the rows ``fit`` recorded, or None. Returns (trainer, rows seen before this
    batch). The optimiser's moments and a damping the divergence guard had lowered are not part of a fitted model:
    they start as configured."""
    if rows_seen is None and fitted.history.get(ROWS_SEEN):  # partial_fit's count, which a model file holds
        rows_seen = int(fitted.history[ROWS_SEEN][-1])
    if rows_seen is None and n_total is None:
        raise ValueError(
            "partial_fit continues this model (loaded from a file of a model fitted by fit), which does not "
            "record how many rows it was trained on: pass n_total, the number of rows it stands for with this "
            "batch"
        )
    # tied as the model was fitted (an "auto" fit that kept one shared scale goes on with it)
    trainer = stream_trainer(plan, fitted.kernel, fitted.inducing_points, n_total or rows_seen + rows, groups,
                             float(fitted.jitter), shared=(fitted.record or {}).get("ard") is False,
                             n_classes=len(fitted.classes), likelihood=likelihood)
    posterior = fitted.posterior
    trainer.engine.take_factor(multiclass_ep.factor_from_posteriors(posterior) if isinstance(posterior, tuple)
                               else Factor.from_posterior(posterior))
    trainer.n_steps = int(fitted.n_iter)
    history = {name: list(values) for name, values in fitted.history.items()}
    for name in training.HISTORY_KEYS:  # (a model from before the guard's record: none of its entries had actions)
        history.setdefault(name, [0] * len(history["log_marginal_likelihood"]) if name in GUARD_KEYS else [])
    trainer.history = history
    if history["time"]:
        trainer.t0 -= history["time"][-1]
    return trainer, (rows_seen if rows_seen is not None else n_total - rows)


def rows_counted(trainer, rows, weights):
    """What a batch of ``rows`` adds to the rows a stream stands for: the rows, or counted by their ``weights``
    (as the tied factor of a weighted fit stands for the sum of the weights: docs/weights.md). The trainer's engine
    takes the weights for the next ``step`` here, before the count changes: one that cannot weight its rows refuses
    them (one ValueError)."""
    engine = trainer.engine
    n_total, engine.sample_weight = engine.n_total, None
    if weights is None:
        return rows
    engine.take_sample_weight(weights)
    engine.n_total = n_total  # the rows the stream stands for, counted by weight, not this batch's
    return float(B.array_namespace(weights).sum(weights))


def step(trainer, X, y, rows_seen):
    """One guarded stream step on the rows (X, y), recorded in the history with the count of rows seen (which
    travels with the history into model files: a loaded stream model goes on from it); the rows weighted as
    ``rows_counted`` gave the engine their weights. Returns (posterior, log Z)."""
    before = Counter(trainer.guard.totals)
    weights = trainer.engine.sample_weight  # (``rows_counted``'s: the batch counted as the stream counts it)
    counted = X.shape[0] if weights is None else float(B.array_namespace(weights).sum(weights))
    if counted > SETTLE_SHARE * float(trainer.engine.n_total):
        # (SEP's passes on one batch climb log Z to its best and then swing, ADF's settle: 10 of them gave the batch
        # fit's 0.62 on that first batch, the first three 2.56, 0.83, 1.18)
        trainer.settle_factor(X, y, SETTLE_PASSES, SETTLE_DAMPING, while_rising=not trainer.engine.cavity.adf)
    trainer.step_until_taken(X, y, 0, X.shape[0], stepping=bool(trainer.names))
    said = trainer.guard.summary(trainer.method, since=before)  # (a stream has no end: said for each batch)
    if said is not None:
        B.warn_guard(said, stacklevel=3)
    trainer.record()
    trainer.history.setdefault(ROWS_SEEN, []).append(float(rows_seen))
    return trainer.posterior()



@contextlib.contextmanager
def unchanged_on_failure(owner, trainer, rows):
    """Around a ``partial_fit`` call's changes to the estimator ``owner`` and its stream ``trainer`` (None: the call
    makes it): where anything in the block raises, both are put back as they were before the call (the estimator's
    attributes; the trainer as ``Trainer.mark`` keeps it), and a step that failed numerically (a CholeskyError or
    FloatingPointError) is one ValueError saying so about these ``rows``. A batch of rows 1e200 times the model's
    scale stepped the lengthscales to NaN (their gradients inf x 0), raised a CholeskyError, and every batch after it
    raised the same; the rows it counted stayed counted, in the model's files too."""
    mark = None if trainer is None else trainer.mark()
    try:
        with attributes_kept_on_failure(owner):
            yield
    except BaseException as exc:
        if mark is not None:
            trainer.back_to(mark)
        if isinstance(exc, (B.CholeskyError, FloatingPointError)):
            raise ValueError(f"partial_fit could not take a step on these {rows:,} rows and left the model as it was "
                             f"before this call ({type(exc).__name__}: {exc}); rows far outside the scale of those "
                             "the model was fitted on can do this: scale them as those were") from exc
        raise


def note_first_batch(plan, n_inducing, rows):
    """Where ``n_inducing="auto"`` gave a stream fewer than ``size_rule.SPARSE_INDUCING`` inducing points because its
    first batch had fewer rows (``n_inducing``, ``rows``: the points are initialised from that batch's rows and stay
    that many), one warning saying so from the caller's line. A stream of 32-row batches had 32 points for good,
    where the documentation says a stream takes 100 (docs/small_data_defaults.md)."""
    if plan.n_inducing == "auto" and isinstance(plan.inducing, str) and n_inducing < size_rule.SPARSE_INDUCING:
        warnings.warn(f"partial_fit: the stream's first batch has {rows:,} rows, so its model has {n_inducing} inducing "
                      f"points for good (n_inducing='auto' takes {size_rule.SPARSE_INDUCING} from a first batch of at "
                      "least as many rows): start the stream with a larger batch, or set n_inducing", UserWarning,
                      stacklevel=B.outside_stacklevel())
