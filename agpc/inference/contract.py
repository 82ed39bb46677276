"""The contract between the training loop and an engine (``Engine``, an abstract base: the members the loop calls,
with defaults for the optional ones) and the parts every engine shares: its options (``EngineOptions``), a step's
``Outcome``, the state a fit reports (``FittedParts``), the schedule the loop follows with it (``Schedule``: warm-up
steps, exact rebuilds, whether a run may end; EP's and GFITC's own), the hyper-parameters it steps and their
optimiser (``parameter_names``, ``make_optimizer``, ``hyper_step``, the kernel's log prior), the tied factor and
anchor as a checkpoint stores them, and ``forwarding`` for an engine that wraps another. The built-in engines and
the table of them are ``agpc.inference.engines``; a method of one's own subclasses ``Engine`` (docs/methods.md).
"""

from __future__ import annotations

import abc
import math
import operator
import warnings
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from ..backend import (ModulesByName, array_namespace, few_rows_set_spread, moments_without_extremes,
                       outside_stacklevel, scaled_std)
from ..kernels import PER_FEATURE_SCALES, log_prior_and_grads, step_lower_bounds, value_scale_keys
from ..likelihoods import likelihood_by_name, probit_for
from ..optim import OPTIMIZERS, Rprop, bounded_step
from . import ep, multiclass_ep
from .posterior import Factor

__all__ = ["Engine", "StateLayout", "Schedule", "EPSchedule", "GFITCSchedule", "FittedParts", "EngineOptions",
           "Forwarded", "forwarding", "Outcome",
           "parameter_names", "initial_steps", "make_optimizer", "relative_change", "relative_change_on_device",
           "with_log_prior", "shared_scale_grads", "hyper_step", "factor_arrays", "factor_from_arrays",
           "anchor_arrays", "anchor_from_arrays", "ep_passes", "refuse_passes", "refuse_minibatch", "quoted_names",
           "NOT_DAMPED",
           "EP_METHODS", "QUADRATIC_METHODS", "CLUSTER_QUADRATIC_METHODS", "ALL_METHODS", "ROUND_METHODS"]

EP_METHODS = ("ep", "sep", "adf")
QUADRATIC_METHODS = ("vi-jj", "vi-jj-hybrid", "vi-jj-full", "vi-taylor")
CLUSTER_QUADRATIC_METHODS = ("vi-jj", "vi-taylor")  # xi stays per row on the workers; the driver steps the kernel
ALL_METHODS = EP_METHODS + ("svi",) + QUADRATIC_METHODS + ("gfitc",)
ROUND_METHODS = EP_METHODS + ("svi",)  # the built-in engines' methods data-parallel rounds train (``round_refusal``)


def quoted_names(names):
    """'a', 'b' or 'c'."""
    names = [repr(name) for name in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
NOT_DAMPED = float("nan")  # history's "damping" for the methods that have none


@dataclass
class Outcome:
    """What a committed step reports to the loop."""

    change: float | None  # relative change of the sites / factor / xi; None where not measured
    stepped: bool  # the hyper-parameters moved (counts toward ``max_iter`` in batch mode)
    record: bool  # batch mode: the step closes an iteration of the history
    n_invalid: int = 0  # rows whose cavity was unusable (EP family)
    guard: dict | None = None  # what the guards of the step's own inner steps did (``guard.Guard.add``'s counts)


@dataclass(frozen=True)
class EngineOptions:
    """What an engine is built with besides (kernel, Z) and its rows: ``GPClassifier``'s parameters, gathered in one
    place (``GPClassifier._train``). Every engine takes the same options and reads those its method has; a method's
    own values replace the estimator's (``agpc.methods.Method.train_options``)."""

    jitter: float = 1e-6  # on the diagonal of Kmm
    optimize: tuple = ("kernel", "inducing")  # what the hyper-parameter steps move
    block_rows: int | None = None  # rows a pass holds at once
    damping: float | None = None  # EP family, GFITC (default 0.5 in batch mode, 0.99 in minibatch mode)
    optimizer: object = None  # a name of ``optim.OPTIMIZERS`` or an optimiser
    learning_rate: float | None = None
    likelihood: object = None  # a binary model's (a name or a ``likelihoods.Likelihood``; None: the probit)
    n_quadrature: int = 20  # SVI's Gauss-Hermite nodes
    tol: float = 1e-6  # GFITC: the relative site change below which its sites have settled
    site_rows: int | None = None  # EP: the rows it keeps sites for (default all; data-parallel rounds: none)
    shared_lengthscales: bool = False  # the EP family, GFITC, SVI: every lengthscale moves by one common factor


def engine_likelihood(kernel, options):
    """The likelihood object the EP family and GFITC train (``EngineOptions.likelihood``: a ``Likelihood``, or a
    binary one's name); by default the probit, or the multiclass probit of a model with a kernel a class
    (Villacampa-Calvo & Hernandez-Lobato 2017, eq. 6)."""
    if options.likelihood is None:
        return probit_for(kernel)
    return likelihood_by_name(options.likelihood, multiclass=kernel.n_latent > 1)


def ep_passes(kernel):
    """The EP passes of a model with ``kernel``, by the latent GPs it declares (``kernels.Kernel.n_latent``):
    ``multiclass_ep`` for one a class (sites on pairs of classes), else the binary ``ep``."""
    return multiclass_ep if kernel.n_latent > 1 else ep


def refuse_passes(name, passes):
    """An engine whose passes run in memory only: passes elsewhere are one clear error."""
    if passes is not None:
        raise ValueError(f"method {name!r} does not run its passes on a cluster (passes=); only {EP_METHODS} "
                         f"and {CLUSTER_QUADRATIC_METHODS} do")


def refuse_minibatch(name, minibatch):
    if minibatch:
        raise ValueError(f"method {name!r} is batch-only: every step needs all the rows (batch_size=None)")


# -- shared pieces ----------------------------------------------------------------------------------

def parameter_names(kernel, optimize):
    """The hyper-parameters a fit moves: the kernel's (a latent noise fixed at 0 excluded) and "Z"."""
    names = []
    if "kernel" in optimize:
        table = kernel.parameter_table()
        names += [k for k in kernel.params if not table[k].may_be_zero or math.isfinite(float(kernel.params[k]))]
    if "inducing" in optimize:
        names.append("Z")
    return names


def initial_steps(kernel, Z, names):
    """First Rprop steps: 0.01 in log space for kernel parameters, 1% of the spread of Z per dimension."""
    xp = array_namespace(Z)
    steps = {}
    for name in names:
        if name == "Z":
            steps[name] = 0.01 * (xp.zeros_like(Z) + inducing_spread(Z))
        else:
            steps[name] = xp.zeros_like(kernel.params[name]) + 0.01
    return steps


def inducing_spread(Z):
    """The spread of the inducing points per input dimension (and per class for a multiclass model's (C, m, d)
    points), (..., 1, d): their standard deviation, 1 where it is 0 (or where there is one point): the scale of Z's
    steps (Rprop's first ones, ``initial_steps``; Adam's and Adadelta's unit, ``optim.Adam.steps_in_units``)."""
    xp = array_namespace(Z)
    if Z.shape[-2] < 2:
        return xp.ones_like(Z[..., :1, :])
    spread = scaled_std(Z, axis=-2, keepdims=True)  # xp.std of Z * 1e-300 is 0, of Z * 1e154 inf
    # a point on an outlier of the data (a value of 1e5 where the others lie within +-3) sets its dimension's
    # deviation: 1% of that as the first step threw every other point out of the data (banana: log Z to chance at
    # the first step, test NLL 0.41 against 0.295); the spread of the other points is the scale there
    bulk = xp.expand_dims(moments_without_extremes(Z)[1], axis=-2)
    spread = xp.where(few_rows_set_spread(spread, bulk), bulk, spread)
    return xp.where(spread > 0, spread, xp.ones_like(spread))




def make_optimizer(optimizer, learning_rate, kernel, Z, names, minibatch, rprop_growth=None):
    """The optimiser a fit steps with: ``optimizer`` (a name, None for the default: Rprop in batch mode, Adadelta on
    minibatches, or an optimiser object); ``rprop_growth``: Rprop's growth factor (None: ``Rprop``'s, the seed's)."""
    if optimizer is None:
        optimizer = "adadelta" if minibatch else "rprop"
        if optimizer == "rprop" and learning_rate is not None:  # (set with optimizer="rprop": refused up front)
            warnings.warn(f"learning_rate={learning_rate!r} is not used: batch steps (all rows a step) climb with "
                          "Rprop by default (optimizer=None), which adapts a step size per parameter and takes no "
                          "learning rate; set optimizer='adam' or 'adadelta' to step with it", UserWarning,
                          stacklevel=outside_stacklevel())
    if isinstance(optimizer, str):
        if optimizer == "rprop":
            growth = {} if rprop_growth is None else {"increase": rprop_growth}
            return Rprop(initial_steps=initial_steps(kernel, Z, names), **growth)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}: use 'rprop', 'adadelta' or 'adam'")
        cls = OPTIMIZERS[optimizer]
        return cls() if learning_rate is None else cls(learning_rate=learning_rate)
    return optimizer


def relative_change(new, old, xp):
    return float(relative_change_on_device(new, old, xp))


def relative_change_on_device(new, old, xp):
    """max|new - old| / (1 + max|old|) as a 0-d array (left on the device)."""
    return xp.max(xp.abs(new - old)) / (1.0 + xp.max(xp.abs(old)))


def with_log_prior(kernel, grads, value=None):
    """(grads, value) of the objective the hyper-parameters climb: log Z (EP / SEP / ADF / GFITC) or the ELBO
    (SVI, ``vi-*``) plus the log prior density of the kernel's parameters (``agpc.priors``: the density of the stored
    unconstrained values, Jacobian included), i.e. MAP instead of type-II maximum likelihood. Both come back
    unchanged -- no operation -- for a kernel without priors. The model's reported log marginal likelihood stays
    log Z (or the ELBO) alone: the prior is not evidence."""
    log_prior, prior_grads = log_prior_and_grads(kernel)
    if log_prior is None:
        return grads, value
    grads = dict(grads)
    for key, gradient in prior_grads.items():
        grads[key] = grads[key] + gradient
    return grads, (None if value is None else value + log_prior)


def shared_scale_grads(grads, with_prior):
    """``with_prior`` (the gradients of log Z plus the log prior, ``with_log_prior``) with each kernel's
    lengthscales (a linear kernel's slope variances: ``kernels.PER_FEATURE_SCALES``) tied: l_j = l_j(0) e^s, one
    log scale s for all of a kernel's features (``ard=False``), whose gradient is sum_j d log Z / d log l_j plus the
    mean of the features' log prior gradients (the prior of one lengthscale, not of d of them: the product of the d
    priors along the tie would hold s d times tighter). Every entry gets that gradient, so that an optimiser
    stepping them entrywise (Rprop, the batch EP family's) keeps their ratios as they started."""
    tied = dict(with_prior)
    for key, gradient in with_prior.items():
        if key.endswith(PER_FEATURE_SCALES):
            xp = array_namespace(gradient)
            data = grads[key]
            common = xp.sum(data, axis=-1, keepdims=True) + xp.mean(gradient - data, axis=-1, keepdims=True)
            tied[key] = xp.zeros_like(gradient) + common
    return tied


def hyper_step(optimizer, names, kernel, Z, grads, shared_lengthscales=False):
    """One ascent step of the named hyper-parameters (kernel parameters and "Z") on log Z plus the log prior, the
    latent noise held at or above its floor (``kernels.step_lower_bounds``); ``shared_lengthscales``: each kernel's
    lengthscales by one common factor (``shared_scale_grads``)."""
    with_prior, _ = with_log_prior(kernel, grads)
    grads = shared_scale_grads(grads, with_prior) if shared_lengthscales else with_prior
    params = dict(kernel.params)
    params["Z"] = Z
    updated = bounded_step(optimizer, {k: params[k] for k in names}, {k: grads[k] for k in names},
                           step_lower_bounds(kernel), value_scale_keys(kernel))
    params.update(updated)
    Z = params.pop("Z")
    return kernel.with_params(params), Z


def factor_arrays(factor):
    """A u-space factor as a checkpoint stores it: (precision, shift), a list of such pairs for a multiclass
    ``MultiFactor``, None for none."""
    if factor is None:
        return None
    parts = getattr(factor, "factors", None)
    return [(f.precision, f.shift) for f in parts] if parts is not None else (factor.precision, factor.shift)


def factor_from_arrays(saved):
    """The factor ``factor_arrays`` stored."""
    if isinstance(saved, list):
        return multiclass_ep.MultiFactor(tuple(Factor(p, c) for p, c in saved))
    return None if saved is None else Factor(*saved)


def anchor_arrays(anchor):
    """Minibatch EP's anchor (``ep.Anchor``, ``multiclass_ep.MultiAnchor``) as a checkpoint stores it: the kernel's
    parameters, Z, L_K (one factor a class) and the jitter; None for none."""
    if anchor is None:
        return None
    return {"kernel": dict(anchor.kernel.params), "Z": anchor.Z, "L_K": anchor.L_K, "jitter": float(anchor.jitter)}


def anchor_from_arrays(saved, kernel):
    """The anchor ``anchor_arrays`` stored (``kernel``: this run's, whose form the stored parameters take)."""
    if saved is None:
        return None
    at = kernel.with_params(saved["kernel"])
    if kernel.n_latent > 1:
        return multiclass_ep.MultiAnchor(at, saved["Z"], [saved["L_K"][c, ...] for c in range(kernel.n_latent)],
                                         saved["jitter"])
    return ep.Anchor(at, saved["Z"], saved["L_K"], saved["jitter"])


class Forwarded:
    """A property that reads (and, ``settable``, writes) the attribute of the same name of an inner object: the
    members a wrapper of an engine (``training.Trainer``, the data-parallel round engine) shows as its own."""

    def __init__(self, inner, settable=False):
        self.inner, self.settable = inner, settable

    def __set_name__(self, owner, name):
        self.name = name
        self.read = operator.attrgetter(f"{self.inner}.{name}")
        self.holder = operator.attrgetter(self.inner)

    def __get__(self, obj, owner=None):
        return self if obj is None else self.read(obj)

    def __set__(self, obj, value):
        if not self.settable:
            raise AttributeError(f"{self.name} is read from the inner {self.inner}")
        setattr(self.holder(obj), self.name, value)


def forwarding(inner, *names, settable=()):
    """A base class whose members ``names`` (and ``settable``, writable too) are those of the same name of the
    object in the attribute ``inner``: how a wrapper of an engine shows the engine's members as its own."""
    members = {name: Forwarded(inner, settable=name in settable) for name in (*settable, *names)}
    return type(f"Forwarding{inner.title()}", (), members)


@dataclass(frozen=True)
class StateLayout:
    """What an engine's state holds beyond (kernel, Z), entry by role: what the loop, the checkpoint rules
    (``checkpoint_rules``), a fit's result (``FittedParts``), a stream and data-parallel rounds read of the state,
    in place of its keys and its method's name. An engine declares one (``Engine.layout``); a state of arrays only,
    checked by their shapes and type, declares nothing."""

    # the (precision, shift) entries of one site a row, in the loop's row order (EP's and GFITC's "nu", "mu"): put
    # back in the caller's order for the result, kept a chunk at a time by data-parallel rounds
    per_row: tuple = ()
    # the entry holding a tied site product (``posterior.Factor``, or one a class): SEP's and ADF's, minibatch EP's
    # running one; a stream continues a fitted q through it (``Engine.take_factor``), data-parallel rounds keep one a
    # chunk, a resume checks it as a factor
    tied_factor: str | None = None
    triangular: tuple = ()  # lower-triangular factors (SVI's q(v) covariance factor): a resume checks them so
    flags: tuple = ()  # booleans a checkpoint holds (minibatch EP's rebuild flag, GFITC's settled flag)
    counts: tuple = ()  # non-negative integers a checkpoint holds (GFITC's sweeps)
    extras: tuple = ()  # entries of ``checkpoint_state`` the engine checks itself as it restores them
    # entries of older checkpoints, old name -> new (the engine converts them as it restores)
    legacy: dict = field(default_factory=dict)


class Schedule:
    """What the training loop (``training.train``) and its hooks ask of an engine besides its steps, in a run
    (``Engine.schedule`` makes one for it): how many warm-up steps, whether and when an exact rebuild is made, and
    whether a batch run whose hyper-parameter steps are spent may end. This one is the default, an engine with none
    of these; an engine of one's own passes ``warmup`` / ``epoch_rebuilds``, or subclasses it to answer
    ``rebuild_due`` and ``may_finish`` from its state."""

    def __init__(self, warmup=0, epoch_rebuilds=False):
        # batch mode: steps that do not move the hyper-parameters before the first that does (batch EP / SEP / ADF's
        # warm-up sweeps); ``max_iter`` counts the steps after them
        self.warmup = int(warmup)
        # the engine's running q (minibatch EP's site product) is made exact (``Engine.rebuild_factor``) at each
        # epoch's end (want_log_z=True: the epoch's history entry is its log Z), as the guard's first repair of a step
        # it refuses, and as the final pass of q alone where log Z's does not fit the time left; the time budget
        # times it before the first (``Engine.time_rebuild``)
        self.epoch_rebuilds = bool(epoch_rebuilds)

    def rebuild_due(self):
        """Whether an exact rebuild (``Engine.rebuild_factor``) comes before the next step: the engine's running q
        drifted from what it stands for (minibatch EP started from given sites, or resumed from an old checkpoint)."""
        return False

    def may_finish(self):
        """Whether a batch run whose ``max_iter`` hyper-parameter steps are spent may end now (GFITC: once its sites
        settled at the last hyper-parameters)."""
        return True


class EPSchedule(Schedule):
    """EP / SEP / ADF's (``EPEngine.schedule``): the warm-up sweeps of batch mode, and minibatch EP's exact rebuilds
    of its running site product, at each epoch's end and whenever the engine flags it (``needs_rebuild``)."""

    def __init__(self, engine, warmup=0, epoch_rebuilds=False):
        super().__init__(warmup, epoch_rebuilds)
        self.engine = engine

    def rebuild_due(self):
        return self.engine.needs_rebuild


class GFITCSchedule(Schedule):
    """GFITC's (``GFITCEngine.schedule``): a batch run ends only once its sites settled (``settled``) at the last
    hyper-parameters, the ones the final pass is made at."""

    def __init__(self, engine):
        super().__init__()
        self.engine = engine

    def may_finish(self):
        return self.engine.settled


class FittedParts(NamedTuple):
    """An engine's state as a fit reports it (``Engine.fitted_parts``), per-row entries in the caller's row order."""

    kernel: Any
    Z: Any
    site_precision: Any  # EP and GFITC: one a row; else None
    site_shift: Any
    factor: Any  # SEP / ADF (and minibatch EP): the tied site product in u-space; else None
    state: dict  # all of it, by the engine's own keys (SVI: "whitened_mean", "whitened_chol"; vi-*: "xi")


def _refuse_former_schedule(owner, members):
    """A TypeError when ``members`` (an engine class's or instance's) hold a flag the loop read before
    ``Schedule`` (``Engine.FORMER_SCHEDULE``), saying what answers it now."""
    former = sorted(name for name in Engine.FORMER_SCHEDULE if name in members)
    if former:
        fields = ", ".join(f"{name} -> {Engine.FORMER_SCHEDULE[name]}" for name in former)
        raise TypeError(f"{owner} tells the loop its schedule by {former}: the loop asks the engine's schedule "
                        f"now, a ``Schedule`` its ``schedule(settings, minibatch)`` returns ({fields})")


class Engine(ModulesByName, abc.ABC):
    """The contract between the training loop and a method: one step, and never a loop of its own (module
    docstring). What the loop calls, besides the abstract methods: ``snapshot`` / ``restore`` / ``shrink`` (the
    guard's revert-and-halve), ``keep`` / ``put_back`` (early stopping's best state), and the optional members
    below, whose defaults say "nothing of the kind". The engine owns its state: its keys, its row order and its
    final pass; what the loop, its hooks, the checkpoints, the result and a stream read of it are its ``layout`` (a
    ``StateLayout``) and the members ``kernel``, ``Z``, ``factor``, ``row_site_precision``, ``state_arrays``,
    ``fitted_parts`` and ``take_factor``, never its keys. Engines pickle (a model trained by ``partial_fit`` holds
    one): their namespace and passes modules travel by name."""

    layout = StateLayout()  # what its state holds, by role

    # The class attributes an engine declared its state by before ``StateLayout``, and the field each became: an
    # engine of one's own written to that contract is refused when its class is made (else they would be ignored,
    # and the checks they asked for, silently not made).
    FORMER_DECLARATIONS = MappingProxyType({
        "per_row_sites": "per_row", "triangular_state": "triangular", "tied_factor": "tied_factor",
        "checkpoint_flags": "flags", "checkpoint_counts": "counts", "checkpoint_factors": "tied_factor",
        "checkpoint_extras": "extras", "legacy_checkpoint_keys": "legacy"})

    # The flags an engine told the loop its schedule by before ``Schedule``, and what answers each now: an engine
    # setting them is refused (its class when made, an instance when the loop asks its schedule), else the loop
    # would ignore them and silently skip its warm-up, its rebuilds or its settling.
    FORMER_SCHEDULE = MappingProxyType({
        "uses_warmup": "Schedule(warmup=...)", "needs_rebuild": "Schedule.rebuild_due()",
        "settled": "Schedule.may_finish()"})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        former = sorted(name for name in Engine.FORMER_DECLARATIONS if name in vars(cls))
        if former:
            fields = ", ".join(f"{name} -> {Engine.FORMER_DECLARATIONS[name]}" for name in former)
            raise TypeError(f"{cls.__name__} declares its state by {former}: an engine declares it by one "
                            f"``layout = StateLayout(...)`` now ({fields})")
        # (inherited or forwarded flags too, unless the class answers its own schedule: then they are its state)
        _refuse_former_schedule(cls.__name__, vars(cls) if cls.schedule is not Engine.schedule else
                                {name for name in Engine.FORMER_SCHEDULE if hasattr(cls, name)})
    has_damping = False
    full_gp = False  # the passes read Z as the rows themselves (the exact model's): part of a checkpoint's fingerprint
    likelihood = None  # the model's ``likelihoods.Likelihood`` it trains (a checkpoint's fingerprint says which)
    threaded_passes = False  # its passes over rows spread their blocks over Python threads (``blocks.map_blocks``)
    shared_lengthscales = False  # ``EngineOptions.shared_lengthscales``: set by the engines that step it
    name = None  # the method it trains (in messages)
    # what its log Z is, as a progress bar names the history's "log_marginal_likelihood": EP's approximation of the
    # log evidence (not a bound, so it may exceed the exact value), or a variational bound
    objective = "objective"
    # whether its hyper-parameter steps climb the log Z it records (with the kernel's log prior): a batch fit's fall of
    # it is then an overshoot, not a plateau (``hooks.Plateau``); SEP's and ADF's steps follow a gradient that is not
    # quite their log Z's (``EPEngine.log_z_climbed``)
    log_z_climbed = True

    @property
    def per_row_sites(self):
        """Whether the state holds a site a row (``layout.per_row``)."""
        return bool(self.layout.per_row)

    @abc.abstractmethod
    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        """(summary, work) of a step on rows lo:hi, committing nothing: ``summary`` is log Z (a float or 0-d
        array) or a 1-D device array whose first entry is log Z and whose others ``apply`` needs on the host; a
        failed factorisation may show as NaN there, or raise ``CholeskyError``."""

    @abc.abstractmethod
    def apply(self, work, lo, hi, *, stepping, scalars=None):
        """Commit the step ``evaluate`` prepared (``scalars``: its summary on the host); returns an ``Outcome``."""

    @abc.abstractmethod
    def posterior(self, X, y, want_log_z=True):
        """(q at the current state, log Z at it or None for the history's): the final pass."""

    @abc.abstractmethod
    def validation_scores(self, post, X_val, y_val):
        """(NLL, error) of q on validation rows."""

    @abc.abstractmethod
    def checkpoint_state(self, path, step):
        """The state as plain data and arrays (``restore_checkpoint`` puts it back)."""

    @abc.abstractmethod
    def restore_checkpoint(self, saved, path):
        """Put back what ``checkpoint_state`` wrote (checked by ``checkpoint_rules`` first)."""

    @classmethod
    def round_refusal(cls, name, n_classes):
        """Why data-parallel rounds (``data_parallel``) cannot train method ``name`` on ``n_classes`` classes with
        this engine (None: they can). By default they cannot."""
        return f"data-parallel training runs {quoted_names(ROUND_METHODS)}, not {name!r}"

    def schedule(self, settings, minibatch):
        """The ``Schedule`` the loop follows with this engine in a run of ``settings`` (``training.TrainSettings``),
        ``minibatch`` the loop's mode; by default one that asks for nothing."""
        # (by attribute lookup: a mixin's or a forwarded flag would be ignored as surely as the engine's own)
        _refuse_former_schedule(type(self).__name__, {name for name in Engine.FORMER_SCHEDULE if hasattr(self, name)})
        return Schedule()

    def rebuild_factor(self, X, y, want_log_z=False):
        """Make the running q exact (where the schedule asks: ``Schedule.epoch_rebuilds``, ``rebuild_due``; by
        default there is nothing to); ``want_log_z``: and return log Z at the state rebuilt (None where there is
        none)."""

    def time_rebuild(self, X, y, rows):
        """Run the work of ``rebuild_factor()`` (q alone) on the first ``rows`` rows, committing nothing (the time
        budget measures it, and counts an epoch's end with log Z as ``hooks.REBUILD_PASSES`` times that); by default
        there is none."""

    def rows_in_q(self, X, with_sites=None):
        """How many rows of X ``rebuild_factor(want_log_z=False)`` goes over, where that depends on the rows with sites
        (``with_sites``: taken to be so many, else counted); the time budget scales its timing of ``time_rebuild`` by
        it. By default None: every row."""
        return None

    def checkpoint_written(self, saved):
        """Called once the checkpoint holding ``saved`` (``checkpoint_state``'s) is on disk."""

    def state_in_row_order(self, permutation):
        """The state with its per-row entries (``layout.per_row``) in the caller's row order, the loop having visited
        the rows in ``permutation``'s (None: in the caller's)."""
        state = dict(self.state)
        if permutation is not None and self.layout.per_row:
            inverse = self.xp.argsort(permutation)
            for key in self.layout.per_row:
                state[key] = self.xp.take(state[key], inverse, axis=0)
        return state

    # -- what the loop, its hooks, the checkpoints, the result and a stream read of the state ---------------------

    @property
    def kernel(self):
        """The kernel (its hyper-parameters) at the current state."""
        return self.state["kernel"]

    @property
    def Z(self):
        """The inducing points at the current state."""
        return self.state["Z"]

    @property
    def factor(self):
        """The tied site product (SEP / ADF, minibatch EP's running one: ``posterior.Factor``, or one a class), or
        None (``layout.tied_factor``)."""
        return None if self.layout.tied_factor is None else self.state[self.layout.tied_factor]

    @property
    def row_site_precision(self):
        """The per-row site precisions in the loop's row order (EP, GFITC: ``layout.per_row``), or None."""
        return self.state[self.layout.per_row[0]] if self.layout.per_row else None

    def state_arrays(self):
        """{name: array} of the state's arrays, kernel parameters as "kernel.<name>" (what a resume checks the
        shapes of)."""
        arrays = {f"kernel.{k}": v for k, v in self.kernel.params.items()}
        arrays.update({k: v for k, v in self.state.items() if hasattr(v, "shape") and hasattr(v, "dtype")})
        return arrays

    def fitted_parts(self, permutation):
        """The state as a fit reports it (``FittedParts``), its per-row sites in the caller's row order
        (``state_in_row_order``)."""
        state, layout = self.state_in_row_order(permutation), self.layout
        precision, shift = (state[key] for key in layout.per_row) if layout.per_row else (None, None)
        factor = None if layout.tied_factor is None else state[layout.tied_factor]
        return FittedParts(state["kernel"], state["Z"], precision, shift, factor, state)

    def take_factor(self, factor):
        """Go on from ``factor``, a tied site product (``posterior.Factor``, or one a class) read back from a fitted
        q: a stream continuing a fitted model (``partial_fit``), of an engine whose state holds one."""
        if self.layout.tied_factor is None:
            raise TypeError(f"{type(self).__name__} holds no tied site product to continue from")
        self.state[self.layout.tied_factor] = factor

    def __init__(self, kernel, Z, *, names, optimizer, n_total, minibatch, jitter, block_rows):
        """The parts every engine has: ``names`` (the hyper-parameters it moves) and their ``optimizer``, the rows
        it stands for, batch or minibatch steps, the jitter of Kmm and the row blocks of its passes."""
        self.xp = array_namespace(Z)
        self.names = names
        self.optimizer = optimizer
        # the unit of Z's steps: its spread as built (Adam's, Adadelta's and L-BFGS-B's; Rprop's steps start scaled),
        # the columns' own deviations about where k-means places the points (``inducing.kmeans`` clusters in them)
        self.inducing_unit = inducing_spread(Z) if "Z" in names else None
        if self.inducing_unit is not None and hasattr(optimizer, "steps_in_units"):
            optimizer.steps_in_units({"Z": self.inducing_unit})
        self.n_total = n_total
        self.minibatch = minibatch
        self.jitter = jitter
        self.requested_jitter = float(jitter)  # (``jitter`` as built: the guard may raise ``jitter`` during the run)
        self.block_rows = block_rows
        self.damping = NOT_DAMPED
        self.state = {"kernel": kernel, "Z": Z}
        self._snapshot = None

    @property
    def has_params(self):
        return bool(self.names)

    sample_weight = None  # the rows' sample weights in the loop's row order (``take_sample_weight``), or None

    def sample_weight_refusal(self):
        """Why this engine, as built, cannot train with sample weights (a sentence), or None when it can. By default
        it cannot: an engine whose passes weight the rows says so."""
        return (f"method {self.name!r} does not take sample_weight in this configuration (its passes do not weight "
                "the rows yet; docs/weights.md lists which methods and paths do)")

    def take_sample_weight(self, weights):
        """Train with ``weights`` (one a row, in the loop's row order; None: unweighted, today's arithmetic), or
        refuse them with one ValueError (``sample_weight_refusal``)."""
        if weights is None:
            return
        refusal = self.sample_weight_refusal()
        if refusal is not None:
            raise ValueError(refusal)
        self.sample_weight = weights

    def _weighted(self):
        """A pass's ``weights=`` when the fit has sample weights (none otherwise: today's call, unchanged)."""
        # (``[:None]``, all of them: the weights of rows a dask array brings to this process a chunk at a time come
        # as one NumPy array, beside the sites minibatch EP holds here)
        return {} if self.sample_weight is None else {"weights": self.sample_weight[:None]}

    def _refuse_weights(self, weights):
        """Per-row weights are taken where the passes apply them (SVI, and EP / SEP / ADF on minibatches);
        elsewhere (the batch passes) one clear error rather than weights silently ignored."""
        if weights is not None:
            raise ValueError(f"{type(self).__name__} does not take per-row weights (yet): its passes do not apply them")

    def snapshot(self):
        snap = {"state": dict(self.state), "damping": self.damping, "undo": None,
                "optimizer": self.optimizer.snapshot() if self.optimizer is not None else None}
        self._snapshot = snap
        return snap

    def restore(self, snap):
        self.state = dict(snap["state"])
        self.damping = snap["damping"]
        if self.optimizer is not None:
            self.optimizer.restore(snap["optimizer"])

    def shrink(self):
        """Halve damping and step sizes after a revert; False when there is nothing to halve."""
        if self.optimizer is None and not self.has_damping:
            return False
        if self.optimizer is not None:
            self.optimizer.scale_steps(0.5)
        if self.has_damping:
            self.damping *= 0.5
        return True

    nominal_damping = NOT_DAMPED  # the damping the engine was built with (what ``grow`` goes back up to)

    def grow(self):
        """Double halved damping and step sizes back, at most to the values the engine was built with (the guard,
        after good steps: ``guard``); whether anything grew. An optimiser whose steps adapt by themselves (Rprop)
        grows them itself."""
        grew = self.optimizer is not None and self.optimizer.grow_steps(2.0)
        if self.has_damping and self.damping < self.nominal_damping:
            self.damping = min(2.0 * self.damping, self.nominal_damping)
            grew = True
        return grew

    def keep(self):
        return dict(self.state)

    def put_back(self, kept):
        self.state = dict(kept)

    def kernel_of(self, kept):
        """The kernel of a state ``keep`` returned (the plateau stop weighs its log prior)."""
        return kept["kernel"]

    # The rows' sites held on a cluster's workers (EP on a dask array), whose checkpoint the workers write beside the
    # file (``checkpoint_state``): one set of them a checkpoint, the current state's.
    sites_on_cluster = False

    def checkpoint_kept(self, kept, path, step):
        """``checkpoint_state`` of a state ``keep`` returned earlier (early stopping's best, the plateau stop's), so
        that a resumed run can go back to it as the uninterrupted one does (``restore_checkpoint`` then ``keep`` read
        it back); None where the checkpoint cannot hold a second state (``sites_on_cluster``)."""
        if self.sites_on_cluster:
            return None
        current, self.state = self.state, dict(kept)
        try:
            return self.checkpoint_state(path, step)
        finally:
            self.state = current

    def _common_checkpoint(self):
        s = self.state
        # (the jitter the run is at: the guard may have raised it, and a resume from the one it started with failed
        # again where the run had gone on)
        return {"kernel": dict(s["kernel"].params), "Z": s["Z"], "damping": float(self.damping),
                "jitter": float(self.jitter),
                "optimizer": self.optimizer.snapshot() if self.optimizer is not None else None}

    def _restore_common(self, saved):
        s = self.state
        s["kernel"] = s["kernel"].with_params(saved["kernel"])
        s["Z"] = saved["Z"]
        self.damping = saved["damping"]
        self.jitter = saved.get("jitter", self.jitter)  # (a checkpoint from before it was kept: the run's first)
        if self.optimizer is not None:
            self.optimizer.restore(saved["optimizer"])
