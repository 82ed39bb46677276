"""Covariance functions: values, diagonals and gradients given adjoints (no autodiff).

Inference code computes the adjoints of its objective L with respect to the three kernel matrices it
uses -- dL/dKmm (m x m), dL/dKnm (n x m) and dL/dKdiag (n) -- and the kernel turns them into gradients
for its own parameters and for the inducing inputs Z (GPy's ``update_gradients_full`` idea). A new
kernel therefore needs no change to any inference code.

Every kernel class declares its parameters in a table (``parameters``: one :class:`Parameter` each, with
its name, its transform, its shape rule and, per kernel instance, an optional prior). Parameters are
stored unconstrained under ``"<transform>_<name>"`` (``log_lengthscales``: values are exp of the stored
logs). The gradients, the model files, the checkpoints' checks, the optimisers' parameter names and the
multiclass ``ClassKernels`` read that table; nothing else lists parameter names.

``amplitude`` is the signal variance, ``noise`` the variance of additive latent noise at the data points:
it enters ``Kdiag`` (the prior variance of f at a data point) but never a cross-covariance, so ``K(Z, Z)``
and ``K(X, Z)`` do not see it (DESIGN.md). A sum or product of kernels (``k1 + k2``, ``k1 * k2``) therefore
has ONE noise parameter, its own: its terms' covariances are combined, then the noise is added once.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from dataclasses import dataclass, replace
from functools import cached_property

from .backend import (array_device, array_namespace, asarray_like, capped_exp, host_array, is_cupy_namespace,
                      is_out_of_core, matmul, row_dot, to_numpy, without_diagonal)
from .priors import LogNormal, Prior, prior_from_spec
from .untrusted import shown

__all__ = [
    "KERNEL_REACH",
    "within_reach",
    "Parameter",
    "Kernel",
    "Stationary",
    "RBF",
    "Matern52",
    "RationalQuadratic",
    "Linear",
    "Sum",
    "Product",
    "ClassKernels",
    "OrdinalKernel",
    "Categorical",
    "OnColumns",
    "mixed_kernel",
    "ORDINAL_KERNEL",
    "KERNELS",
    "kernel_from_spec",
    "spec_parameter_table",
    "log_prior_and_grads",
    "step_lower_bounds",
    "value_scale_keys",
    "LATENT_NOISE_FLOOR",
    "PER_FEATURE_SCALES",
    "DEFAULT_PRIOR_SCALE",
    "with_default_priors",
    "categorical_columns",
    "any_level_columns",
    "tied_parameters",
    "ANY_LEVEL",
]

SCALAR = "scalar"
PER_DIMENSION = "per_dimension"  # one value per input dimension (ARD); a single value broadcasts at first use
PER_COLUMN = "per_column"  # one value per column a kernel of ``columns`` reads (``Parameter.length`` of them)
VECTORS = (PER_DIMENSION, PER_COLUMN)  # the shapes whose value a user gives as a list (or one number for all)
LOG = "log"  # stored u = log(value), value = exp(u) (a positive parameter)
IDENTITY = "identity"  # stored as it is (the first cut point of an ordinal model: any real number)

PER_FEATURE_SCALES = ("log_lengthscales", "log_variances", "log_level_lengthscales")
"""Keys of the per-feature parameters that say how fast f changes along each feature (a stationary kernel's
lengthscales, a linear kernel's slope variances, a categorical kernel's lengthscales a column and a level): what
``GPClassifier(ard=False)`` moves by one common factor a key (``agpc.inference.engines.shared_scale_grads``), in a
combination's terms too ("0.log_lengthscales")."""

LATENT_NOISE_FLOOR = 1e-6
"""The least latent noise variance a fit steps to. Negligible beside the probit's (or the logistic's) own unit of
noise on f, so it changes no fitted probability that a smaller noise would give by more than ~1e-6; GPflow bounds
a Gaussian likelihood's variance below at the same 1e-6 (``gpflow.likelihoods.Gaussian``). docs/design.md, kernels."""


# The parameters whose exp multiplies or adds to a kernel's values (``Parameter.scales_values``).
VALUE_SCALES = ("amplitude", "noise", "variances", "bias")


@dataclass(frozen=True)
class Parameter:
    """One row of a kernel's parameter table.

    - ``name``: the constrained quantity ("lengthscales"); stored unconstrained under ``key``
      ("log_lengthscales").
    - ``transform``: how it is stored: ``"log"`` (positive values; the optimisers move the log).
    - ``shape``: ``"scalar"``, ``"per_dimension"`` (one per input feature) or ``"per_column"`` (one per column of a
      kernel's ``columns``: :class:`Categorical`, and a kernel's per-feature parameters inside :class:`OnColumns`).
    - ``may_be_zero``: a value of exactly 0 is allowed, stored as -inf, and is then fixed (the latent noise: 0
      means no noise, not a parameter to learn).
    - ``lower``: the least value the optimisers step it to (``step_lower_bounds``), or None. The latent noise's is
      ``LATENT_NOISE_FLOOR``: with no bound, batch EP's sign-based steps, which grow while the gradient keeps its
      sign, drove a noise the data did not need to exp(-752), where it underflows to 0 and its gradient vanishes.
    - ``prior``: a :class:`agpc.priors.Prior` on the constrained value, or None (set per kernel, not per class).
    """

    name: str
    transform: str = LOG
    shape: str = SCALAR
    may_be_zero: bool = False
    prior: Prior | None = None
    lower: float | None = None
    length: int | None = None  # a vector of this many entries whatever the inputs (an ordinal model's cut gaps)

    @property
    def stored_as_log(self):
        """Whether the stored value is the parameter's log (every positive parameter): its value is exp of it."""
        return self.transform == LOG

    @property
    def scales_values(self):
        """Whether exp of the stored value multiplies or adds to the kernel's values (an amplitude, a latent noise, a
        linear kernel's slope variances and bias: ``VALUE_SCALES``), where an infinite one is no model
        (``checkpoint_rules.check_log_range``); a lengthscale's inf is a feature ignored, which a checkpoint may
        resume from (a model file may not: ``model_file``)."""
        return self.stored_as_log and self.name in VALUE_SCALES

    @property
    def key(self):
        return self.name if self.transform == IDENTITY else f"{self.transform}_{self.name}"

    def stored(self, value):
        """The unconstrained value of a positive ``value`` (a Python float)."""
        if self.transform == IDENTITY:
            return value
        return math.log(value) if value > 0 else -math.inf

    def value(self, stored):
        """The constrained value of a stored array."""
        return stored if self.transform == IDENTITY else array_namespace(stored).exp(stored)

    def log_prior_and_grad(self, stored):
        """log p_u(u) = log p(theta) + log |d theta / d u| summed over the entries, and its gradient w.r.t. u
        (theta = exp(u): the Jacobian term is u, and d/du = theta p'(theta) / p(theta) + 1; agpc.priors says
        why the Jacobian is included)."""
        xp = array_namespace(stored)
        theta = self.value(stored)
        log_density = xp.sum(self.prior.log_density(theta) + stored)
        return log_density, theta * self.prior.dlog_density(theta) + 1.0


def _checked_value(parameter, value):
    """A user's initial value of ``parameter``: a list of positive finite floats (per dimension) or a float."""
    if hasattr(value, "shape"):  # an array of any namespace: its values (of at most one axis)
        values = to_numpy(value).reshape(-1).tolist() if len(value.shape) <= 1 else [None]
    elif parameter.shape in VECTORS and hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
        values = [to_numpy(v).item() if hasattr(v, "shape") and len(v.shape) == 0 else v for v in value]
    else:
        values = [value]
    # numbers only: float() also read "1" and True as 1.0
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values) or (
            parameter.shape not in VECTORS and len(values) != 1):
        values = []
    values = [float(v) for v in values]
    ok = (lambda v: math.isfinite(v) and v >= 0) if parameter.may_be_zero else (lambda v: math.isfinite(v) and v > 0)
    if not values or not all(ok(v) for v in values):
        kind = "non-negative" if parameter.may_be_zero else "positive"
        raise ValueError(f"{parameter.name} must be {kind} and finite, got {value!r}")
    if parameter.shape in VECTORS:
        return host_array([parameter.stored(v) for v in values])
    return host_array(parameter.stored(values[0]))


def _mutable(value):
    """Whether a constructor argument is an object its caller could change in place (a list, dict or array)."""
    return (isinstance(value, (list, dict)) or hasattr(value, "shape")
            or (isinstance(value, tuple) and any(_mutable(v) for v in value)))  # (a tuple of lists: levels)


def _copy_of(value):
    """A copy of a mutable constructor argument: a dict's entries (priors, themselves immutable), a list's or an
    array's numbers (a list stays a list; an array becomes a host array, which every constructor accepts)."""
    if isinstance(value, dict):
        return dict(value)
    if _nested(value):  # (a categorical kernel's levels: a list a column, of its own length)
        return [_copy_of(v) if _mutable(v) else v for v in value]
    numbers = to_numpy(value).copy()
    return numbers.tolist() if isinstance(value, list) else numbers


def _nested(value):
    """Whether ``value`` is a list or tuple holding sequences or arrays (a list a column), not of numbers."""
    return isinstance(value, (list, tuple)) and any(isinstance(v, (list, tuple)) or hasattr(v, "shape")
                                                    for v in value)


def _unchanged(value, kept):
    """Whether a mutable argument still holds what ``kept`` (its ``_copy_of``) holds."""
    if isinstance(value, dict):
        return value == kept
    if _nested(value) or _nested(kept):
        return (isinstance(value, (list, tuple)) and len(value) == len(kept)
                and all(_unchanged(v, k) if _mutable(v) else v == k for v, k in zip(value, kept)))
    numbers = to_numpy(value)
    kept = to_numpy(kept)
    return numbers.shape == kept.shape and numbers.tolist() == kept.tolist()


def _noise_stood_for(term):
    """The noise ``term`` brings to a combination whose noise is not given: its own, or, for a term a combination
    holds without its noise (``without_noise``), the noise it had."""
    return getattr(term, "_stripped_noise", None) or float(to_numpy(term.noise))


def _entries(value):
    """The numbers of a per-dimension value as given: a sequence (or array) of them, or one."""
    return to_numpy(value).reshape(-1) if hasattr(value, "__len__") or hasattr(value, "shape") else [value]


def _checked_priors(table, priors):
    """{key: Prior} from a user's {name: Prior} (names of the kernel's parameter table)."""
    by_name = {p.name: p.key for p in table.values()}
    shapes = {p.name: p.shape for p in table.values()}
    if priors is not None and not hasattr(priors, "items"):
        raise TypeError(f"priors: a dict of {{parameter name: agpc.priors.Prior}} (e.g. {{'lengthscales': Gamma(2.0, "
                        f"1.0)}}), not a {type(priors).__name__}")
    out = {}
    for name, prior in (priors or {}).items():
        key = by_name.get(name)
        if key is None:
            raise ValueError(f"prior on {name!r}: not a parameter of this kernel (its parameters: {sorted(by_name)})")
        if not isinstance(prior, Prior):
            raise TypeError(f"prior on {name!r}: {prior!r} is not an agpc.priors.Prior (e.g. agpc.priors.Gamma)")
        if prior.entries > 1 and shapes[name] not in VECTORS:
            raise ValueError(f"prior on {name!r}: {prior!r} lists {prior.entries} values, but {name} is one number")
        out[key] = prior
    return out


def _check_prior_entries(kernel):
    """A prior that lists one number per entry (``agpc.priors``: a LogNormal's per-feature loc) lists as many as
    its parameter has entries (the data's features): one ValueError otherwise."""
    for key, parameter in kernel.parameter_table().items():
        entries = 1 if parameter.prior is None else parameter.prior.entries
        size = kernel.params[key].shape[0] if kernel.params[key].ndim else 1
        if entries > 1 and entries != size:
            raise ValueError(f"the prior on {parameter.name} lists {entries} values, but the kernel has {size} "
                             f"{parameter.name} (one per feature of the data)")
    return kernel


def step_lower_bounds(kernel):
    """{key: the least stored value an optimiser may step the parameter to} over the parameters that have a lower
    bound (``Parameter.lower``; the latent noise), for ``Kernel`` and ``ClassKernels`` alike: what
    ``agpc.optim.bounded_step`` and ``lbfgsb_ascent`` take."""
    return {key: parameter.stored(parameter.lower) for key, parameter in kernel.parameter_table().items()
            if parameter.lower is not None}


def value_scale_keys(kernel):
    """The keys of the parameters whose exp multiplies or adds to the kernel's values (``Parameter.scales_values``),
    for ``Kernel`` and ``ClassKernels`` alike: a step past the floats' largest log makes one inf, every covariance
    inf or a flat model of log Z n log(1/2) that the guard would take (``agpc.optim.bounded_step`` marks it NaN)."""
    return tuple(key for key, parameter in kernel.parameter_table().items() if parameter.scales_values)


def log_prior_and_grads(kernel):
    """(sum of the log prior densities of ``kernel``'s parameters, {key: gradient w.r.t. the stored value})
    over the parameters that carry a prior; (None, {}) when none does, so that a kernel without priors adds
    nothing to any objective (not even an operation). Works for ``Kernel`` and ``ClassKernels``."""
    total, grads = None, {}
    for key, parameter in kernel.parameter_table().items():
        if parameter.prior is None:
            continue
        value, grad = parameter.log_prior_and_grad(kernel.params[key])
        total = value if total is None else total + value
        grads[key] = grad
    return total, grads


class Kernel:
    """Base of every kernel: the parameter table, priors, ``with_params`` and the ``+`` / ``*`` operators.

    A subclass sets ``name`` and ``parameters`` and defines ``K``, ``Kdiag`` and ``grads``; ``for_inputs``,
    ``spec`` and ``__repr__`` here serve a kernel whose parameters are its table's (combinations and the ordinal
    kernel define their own). ``params`` maps each parameter's key to its stored (unconstrained) array; ``priors``
    maps keys to priors. Training never changes a kernel: ``with_params`` makes a new one.

    ``get_params`` / ``set_params`` are scikit-learn's (its kernels have them too): the constructor's arguments, as
    they were given (``RBF(lengthscales=5.0)`` reports 5.0, not exp(log 5.0)) or, for a kernel a fit made, their
    current values; ``set_params`` rebuilds the kernel in place from them, as the constructor would (what
    ``GridSearchCV`` over ``kernel__lengthscales`` and ``clone`` need).
    """

    name = "Kernel"
    parameters = ()

    # -- the model's structure, declared (engines, passes and reports read these, never the kernel's type) --------

    n_latent = 1
    """The latent GPs whose covariances the kernel gives: one (a ``ClassKernels``: one a class). A model of more
    than one has its inducing points stacked (C, m, d), the multiclass passes and the multiclass likelihoods."""

    cut_points = None
    """An ordinal model's cut points, which ride with its kernel (``OrdinalKernel``); None for every other kernel."""

    def latent_kernels(self):
        """The kernel of each latent GP, in order: (self,) here (a ``ClassKernels``: one a class)."""
        return (self,)

    def latent_parts(self, Z):
        """(kernel, its inducing points) of each latent GP: ((self, Z),) for Z (m, d) here (a ``ClassKernels``: class
        c's kernel and Z[c] of Z (C, m, d))."""
        return ((self, Z),)

    @property
    def covariance_kernel(self):
        """The kernel of the latent function's covariance alone: itself here (an ``OrdinalKernel``: its latent kernel,
        without the cut points the likelihood reads), whose lengthscales describe the model."""
        return self

    def parameter_table(self):
        """{key: Parameter} of this kernel's parameters, each with its prior (or None)."""
        return {p.key: replace(p, prior=self.priors.get(p.key)) for p in self.parameters}

    def with_params(self, params):
        kernel = type(self).__new__(type(self))
        kernel.params = dict(params)
        kernel.priors = self.priors
        return kernel

    def _start(self, values, priors):
        """The parameters from a user's initial values ({name: value}, checked) and priors ({name: Prior}). Built on
        the host from Python numbers; moved to the data's namespace by ``for_inputs``."""
        self.params = {p.key: _checked_value(p, values[p.name]) for p in self.parameters}
        self.priors = _checked_priors({p.key: p for p in self.parameters}, priors)
        self._keep_given({**values, "priors": priors})  # the arguments as given: get_params, repr (not the stored logs)
        if "log_noise" in self.priors and not values["noise"] > 0:
            raise ValueError("a prior on the noise needs a positive initial noise (a noise of 0 is fixed, not learned)")

    # -- scikit-learn's parameter protocol ------------------------------------------------------------

    def _keep_given(self, given):
        """Keep the constructor's arguments as given (``_given``) and a copy of each that its caller could change in
        place (a list, an array, a dict): the kernel computes with the values it was given, so an argument changed
        since then is reported as the copy (``_given_now``), not as the caller's object now holds it."""
        self._given = given
        self._given_copies = {name: _copy_of(value) for name, value in given.items() if _mutable(value)}

    def _given_now(self):
        """The arguments as given: each the caller's own object while it still holds what it held at construction
        (scikit-learn's ``clone`` checks that a constructor keeps the very objects it was passed), else a copy of
        what it held then."""
        given = dict(self._given)
        for name, kept in getattr(self, "_given_copies", {}).items():
            if not _unchanged(given[name], kept):
                given[name] = _copy_of(kept)
        return given

    def _arguments(self):
        """{constructor argument: value} that rebuild this kernel: as given (``_given_now``), else current."""
        return {**self._current_values(), **(self._given_now() if hasattr(self, "_given") else {})}

    def _current_values(self):
        """{constructor argument: its value now} from the stored parameters (host floats; a list per dimension) and
        the priors ({name: Prior}, or None): a kernel a fit made, which was given no arguments."""
        values = {}
        for p in self.parameters:
            value = to_numpy(p.value(self.params[p.key]))
            values[p.name] = [float(v) for v in value.reshape(-1)] if p.shape in VECTORS else float(value)
        names = {p.key: p.name for p in self.parameters}
        own = {names[key]: prior for key, prior in self.priors.items() if key in names}
        values["priors"] = own or None
        return values

    def get_params(self, deep=True):
        """{constructor argument: value}, scikit-learn's: the values the kernel was constructed with (the objects
        given), else its current ones; ``deep``: a term's own as ``<term>__<name>`` too (sums, products, ordinal)."""
        params = self._arguments()
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Kernel):
                    params.update((f"{name}__{key}", v) for key, v in value.get_params(deep=True).items())
        return params

    def set_params(self, **params):
        """scikit-learn's: set constructor arguments (``lengthscales=2.0``; a term's by ``k1__lengthscales``) and
        rebuild this kernel from them in place, checked as the constructor checks them. Returns self.

        Only a kernel built by its constructor (the estimator's ``kernel``) can be set: one a fit or a model file
        built from parameter arrays (``kernel_``, its terms) refuses, since changing it in place would change the
        fitted model's predictions and leave its priors and the data's features out of step (its saved file would
        not load)."""
        if not hasattr(self, "_given"):
            raise TypeError(f"this kernel belongs to a fitted model (kernel_): use sklearn.base.clone(...) for a "
                            f"kernel of its values that can be set, or set the estimator's kernel and refit "
                            f"({type(self).__name__}.set_params)")
        if not params:
            return self
        values = self._arguments()
        nested = {}
        for key, value in params.items():
            name, split, rest = key.partition("__")
            if name not in values or (split and not isinstance(values[name], Kernel)):
                raise ValueError(f"invalid parameter {key!r} for the kernel {type(self).__name__}; its parameters: "
                                 f"{sorted(values)}")
            if split:
                nested.setdefault(name, {})[rest] = value
            else:
                values[name] = value
        for name, sub in nested.items():
            stripped = getattr(values[name], "_stripped_noise", None)
            values[name].set_params(**sub)  # (a rebuild: it forgets the noise it stood for, unless a noise is set)
            if stripped is not None and "noise" not in sub:
                values[name]._stripped_noise = stripped
        rebuilt = type(self)(**values)
        self.__dict__.clear()  # (the cached constrained values too)
        self.__dict__.update(rebuilt.__dict__)
        return self

    @classmethod
    def from_params(cls, params):
        """A kernel holding the given unconstrained parameters (arrays of any namespace), without priors."""
        kernel = cls.__new__(cls)
        kernel.params = dict(params)
        kernel.priors = {}
        return kernel

    def for_inputs(self, X):
        """This kernel with its parameters in X's namespace and device, per-dimension parameters broadcast to X's
        width."""
        xp = array_namespace(X)
        device = array_device(X)
        d = X.shape[1]
        out = {k: asarray_like(v, xp, device=device, dtype=X.dtype) for k, v in self.params.items()}
        for parameter in self.parameters:
            if parameter.shape != PER_DIMENSION:
                continue
            value = out[parameter.key]
            if value.shape[0] == 1 and d != 1:
                out[parameter.key] = xp.broadcast_to(value, (d,)) + xp.zeros((d,), dtype=X.dtype, device=device)
            elif value.shape[0] != d:
                raise ValueError(f"kernel has {value.shape[0]} {parameter.name} but the data have {d} features")
        return _check_prior_entries(self.with_params(out))

    def _positive(self, name):
        """The positive parameter ``name``, from its stored log (every positive parameter is held as its log)."""
        log_value = self.params[f"log_{name}"]
        return array_namespace(log_value).exp(log_value)

    @cached_property
    def noise(self):
        return self._positive("noise")

    def spec(self):
        """JSON-able description (type name, priors if any); the parameter arrays are saved beside it."""
        return {"type": self.name, **self._prior_spec()}

    def _prior_spec(self):
        """{"priors": {name: prior spec}} when a parameter has a prior (files of kernels without priors keep
        the spec they always had)."""
        names = {p.key: p.name for p in self.parameters}
        own = {names[key]: prior.spec() for key, prior in self.priors.items() if key in names}
        return {"priors": own} if own else {}

    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(self, other)

    def __mul__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Product(self, other)

    @property
    def growth(self):
        """A bound on how fast the kernel's variance grows with x, per feature: g (an array of one entry a feature, or
        one entry for all) with k(x, x) <= (sum_j g_j x_j^2 + c)^growth_power for a constant c, or None for a bounded
        kernel (every stationary one). Predictions shrink far rows radially to where it stays finite. g is per power
        of x_j^2 (a linear kernel's slope variances, and a product of linear kernels' largest per feature), so that
        it stays in the type's range wherever the slope variances do; per feature, so that a feature of a far larger
        scale than the others (a small slope variance) does not shorten the radius of every row (one g, the largest
        slope variance, shrank rows of a column of scale 1e7 in float32 onto that column: accuracy 0.985 -> 0.555)."""
        return None

    growth_power = 1
    """The power p of ``growth``'s bound: 1 for a linear kernel, the sum of the terms' for a product."""

    @property
    def reach_lengthscales(self):
        """Per input dimension, a length beyond which (times ``KERNEL_REACH``, 1e3) the kernel
        is exactly 0, or None when it has no such reach (a heavy tail). Predictions clamp far inputs to it."""
        return None

    def growth_of_columns(self, X):
        """``growth`` for each column of X (only X's width, namespace, device and type are read): an array of X's
        width and type, or None for a bounded kernel; what the shrink of far rows weighs each column by
        (``within_reach``). A kernel that reads some columns only (``OnColumns``) gives 0 for the others: a column it
        does not read leaves it as it is, whatever that column's scale (with one growth for every column, such a
        column of scale 1e10 in float32 shrank the rows it was in, and so the columns the kernel does read)."""
        return _for_every_column(self.growth, X)

    def reach_of_columns(self, X):
        """``reach_lengthscales`` for each column of X (only X's width, namespace, device and type are read), or
        None: what ``within_reach`` clamps each column to. 0 for a column the kernel does not read (``OnColumns``):
        moving it leaves the kernel as it is, so in a sum or product (the longest reach a column) it leaves the
        reach of the terms that do read it (one longest reach for every column let a short-lengthscale term's
        column be held at a far longer term's reach, and overflow there). inf for every column of a kernel whose
        variance grows (``growth``): it is 0 nowhere, and far rows are shrunk for it instead."""
        reach = self.reach_lengthscales
        if reach is None and self.growth is not None:
            xp = array_namespace(X)
            return xp.full((X.shape[1],), math.inf, dtype=X.dtype, device=array_device(X))
        return _for_every_column(reach, X)

    def without_noise(self):
        """This kernel with its latent noise fixed at 0 (a term of a sum or product: the combination owns the
        noise). A prior on a term's noise is refused: put it on the combination's."""
        if "log_noise" in self.priors:
            raise ValueError(f"{self.name}: a prior on the noise of a term of a sum or product; the combination "
                             "has one noise parameter, set the prior there")
        params = dict(self.params)
        noise = params["log_noise"]
        if float(to_numpy(noise)) == -math.inf:  # no noise already: the term itself (``clone`` of a sum needs it)
            return self
        params["log_noise"] = asarray_like(host_array(-math.inf), array_namespace(noise), device=array_device(noise),
                                           dtype=noise.dtype)
        kernel = self.with_params(params)
        if hasattr(self, "_given"):  # a user's kernel's copy: its arguments, and settable (``set_params``)
            kernel._keep_given({**self._given_now(), "noise": 0.0})
        # the noise this term stands for in a combination whose noise was not given: a rebuild of the combination
        # (``set_params`` of another term) counts it again (``_noise_stood_for``)
        kernel._stripped_noise = float(to_numpy(self.noise))
        return kernel

    def __repr__(self):
        """Name(parameter=value, ...): a leaf kernel's parameters by its table (combinations list their terms)."""
        # the values as given where there are some (RBF(lengthscales=5.0) is not lengthscales=[4.999999999999999])
        given = self.get_params(deep=False)
        values = ", ".join(
            f"{p.name}={[float(v) for v in _entries(given[p.name])]!r}" if p.shape in VECTORS
            else f"{p.name}={float(given[p.name]):.6g}"
            for p in self.parameters
        )
        return f"{self.name}({self._repr_leading()}{values}{self._repr_priors()})"

    def _repr_leading(self):
        """What ``__repr__`` prints before the parameters ("columns=[0, 2], " for a kernel of some columns)."""
        return ""

    def _repr_priors(self):
        names = {p.key: p.name for p in self.parameters}
        own = {names[key]: prior for key, prior in self.priors.items() if key in names}
        return f", priors={own!r}" if own else ""


# From this many entries (512 KB of float64) a cross-covariance block is formed from one product of augmented inputs
# (``_augmented_pair``): below it (a minibatch step's blocks) the extra small operations cost more than the n x m
# temporaries they save.
_AUGMENTED_MIN_ELEMENTS = 1 << 16


_FEWER_ROWS = 4  # a set of at most 1 / this of the other's rows is the inducing points' (``_centre``)


def _centre(Xs, Zs):
    """The point both inputs of K are centred on before their squared distances are expanded (``_r2``): the
    ``_middle`` of Zs, K(X, Z)'s inducing points, or of Xs where it has at most 1 / ``_FEWER_ROWS`` of Zs's rows
    (K(Z, X) of a batch pass's block of thousands of rows)."""
    return _middle(Xs if _FEWER_ROWS * Xs.shape[0] <= Zs.shape[0] else Zs)


def _middle(points):
    """Each column's lower median of ``points`` (k, d): an entry of the column, with at least half the points on
    either side of it, so that fewer than half the points, however far, cannot move it off the others. A centre
    c costs the expanded |x - z|^2 a round-off of about eps (|x - c|^2 + |z - c|^2), so it must lie among the
    points whose distances matter. The mean did not: one inducing point of 1e154 among ordinary ones (a forged
    model file, or points given to fit) put it 1e153 from the others, where every distance lost all its digits
    and the model predicted one probability for every input; and the mean of a data block moves with an outlier
    among its rows (float32 banana with one value of 1e6 put it some 900 lengthscales from the other rows, whose
    expanded squares' round-off broke the whole block's K(Z, X); the inducing points start off such rows:
    ``inputs.typical_rows``). One sort of k x d entries, on the device (no host sync)."""
    xp = array_namespace(points)
    if points.shape[0] == 0:  # (an empty block: any centre will do, and an empty sort has no middle row)
        return xp.zeros(points.shape[1:], dtype=points.dtype, device=array_device(points))
    # (unstable: a value is all that is read, and NumPy's stable sort, the standard's default, took 2.5 times as long)
    return xp.sort(points, axis=0, stable=False)[(points.shape[0] - 1) // 2, ...]


def _augments(Xs, Zs):
    """Whether K(X, Z) is formed from augmented inputs: two different input sets with many pairs."""
    return Zs is not Xs and Xs.shape[0] * Zs.shape[0] >= _AUGMENTED_MIN_ELEMENTS


def _augmented_pair(Xc, Zc, cross, norm_scale, x_offset, z_offset):
    """(left, right) with left @ right^T = cross x.z + norm_scale (|x|^2 + |z|^2) + x_offset + z_offset for every
    pair of rows of Xc (n, d) and Zc (m, d): the inputs augmented by their scaled squared norms and a column of
    ones. One (n, d + 2) x (d + 2, m) product writes the n x m result once, where the sum of a Gram matrix and
    two broadcast norms made four n x m temporaries (a block pass at m = 200 spent more in them than in its
    O(n m^2) products). The sum is the same as before, accumulated in another order: |x|^2 + |z|^2 - 2 x.z
    loses eps (|x|^2 + |z|^2) either way, which centring the inputs keeps small (``_r2``)."""
    xp = array_namespace(Xc, Zc)
    ones_x = xp.ones((Xc.shape[0], 1), dtype=Xc.dtype, device=array_device(Xc))
    ones_z = xp.ones((Zc.shape[0], 1), dtype=Zc.dtype, device=array_device(Zc))
    x2 = norm_scale * row_dot(Xc, Xc) + x_offset
    z2 = norm_scale * row_dot(Zc, Zc) + z_offset
    return (xp.concat([cross * Xc, x2[:, None], ones_x], axis=1), xp.concat([Zc, ones_z, z2[:, None]], axis=1))


def _for_every_column(values, X):
    """``values`` (a number, or an array of one entry or one a column) as an array of one entry for every column of
    X, in X's namespace, device and type; None stays None."""
    if values is None:
        return None
    xp = array_namespace(X)
    values = asarray_like(values, xp, device=array_device(X), dtype=X.dtype)  # (a plain number too)
    return xp.broadcast_to(xp.reshape(values, (-1,)), (X.shape[1],))


def _largest(values):
    """The entry-wise largest of the arrays ``values``, or None where one of them is None."""
    if any(value is None for value in values):
        return None
    largest = values[0]
    for value in values[1:]:
        largest = array_namespace(largest).maximum(largest, value)
    return largest


class Stationary(Kernel):
    """Base of stationary kernels k(x, z) = amplitude * kappa(r^2), r^2 = sum_j ((x_j - z_j)/l_j)^2.

    A subclass defines only ``kappa(r2)`` and ``dkappa_dr2(r2)`` (and, for a profile with parameters of its
    own, ``profile_parameters`` and ``profile_grads``); the base owns the parameters, the scaled distances and
    the chain rule to lengthscales and inputs (one matrix product of O(n m d) for all d lengthscales, no
    n x m x d temporary).

    Parameters
    ----------
    lengthscales : float or sequence of float, default=1.0
        One per input dimension (ARD), or a single value broadcast to every dimension at first use.
    amplitude : float, default=1.0
        Signal variance.
    noise : float, default=0.0
        Variance of additive latent noise at the data points (0 for none: fixed, not learned). A learned noise
        stays at or above ``LATENT_NOISE_FLOOR`` (1e-6): a training step never takes it lower, and lifts a
        smaller starting value to it.
    priors : dict or None, default=None
        {parameter name: agpc.priors.Prior}, e.g. ``{"lengthscales": Gamma(2.0, 1.0)}``; None: no prior.
    """

    name = "Stationary"
    finite_reach = True
    _dK_dr2_per_K = None  # c when dK / d(r^2) = c K (RBF: -1/2): the gradient then needs no dK / d(r^2) block
    profile_parameters = ()  # parameters of kappa itself (a rational quadratic's alpha)
    parameters = (
        Parameter("lengthscales", shape=PER_DIMENSION),
        Parameter("amplitude"),
        Parameter("noise", may_be_zero=True, lower=LATENT_NOISE_FLOOR),
    )

    def __init__(self, lengthscales=1.0, amplitude=1.0, noise=0.0, priors=None, **profile_values):
        unknown = sorted(set(profile_values) - {p.name for p in self.profile_parameters})
        if unknown:
            raise TypeError(f"{self.name} has no parameter {unknown[0]!r}")
        self._start({"lengthscales": lengthscales, "amplitude": amplitude, "noise": noise, **profile_values}, priors)

    # -- parameters ------------------------------------------------------------------------------

    # Training never changes a kernel in place (``with_params`` makes a new one) and ``set_params``, the one
    # in-place change (a user's kernel only, never a fitted one), rebuilds the kernel's __dict__ and these caches
    # with it, so the constrained values are computed once per kernel, not once per use (one operation each on a
    # device).
    @cached_property
    def lengthscales(self):
        return self._positive("lengthscales")

    @cached_property
    def amplitude(self):
        return self._positive("amplitude")

    @property
    def reach_lengthscales(self):
        # RBF and Matern 5/2 profiles underflow to 0 within 1e3 lengthscales; a profile that does not says so with
        # ``finite_reach = False`` (far rows then go in as given), or gives a reach of its own (the rational
        # quadratic's, which decays as a power of r: where its arithmetic would overflow)
        return self.lengthscales if self.finite_reach else None

    # -- the radial profile (subclasses) ---------------------------------------------------------

    def kappa(self, r2):
        raise NotImplementedError

    def dkappa_dr2(self, r2):
        raise NotImplementedError

    def profile_grads(self, r2, weight):
        """{key: sum(weight * d kappa(r2) / d stored value)} for each of ``profile_parameters``."""
        return {}

    # -- values ----------------------------------------------------------------------------------

    def _scaled(self, X):
        return X / self.lengthscales

    def _r2(self, Xs, Zs):
        """Squared distances from one matrix product: |x|^2 + |z|^2 - 2 x.z, with both sets centred on the
        middle of the smaller first (``_centre``), so that a large common offset (x + 1e7) does not cancel
        catastrophically. The round-off that can still make an entry slightly negative is cut with ``maximum``, not
        ``clip`` (array-api-compat's clip copies to the host on CuPy)."""
        xp = array_namespace(Xs, Zs)
        centre = _centre(Xs, Zs)
        Xc = Xs - centre
        if _augments(Xs, Zs):
            left, right = _augmented_pair(Xc, Zs - centre, -2.0, 1.0, 0.0, 0.0)
            return xp.maximum(left @ right.mT, 0.0)
        Zc = Xc if Zs is Xs else Zs - centre
        gram = Xc @ Zc.mT
        if Zc is Xc:
            # K(Z, Z): the norms taken from the Gram matrix's own diagonal make r^2_jj = 0 exactly and keep
            # r^2 consistent with one rounded Gram matrix (float32: Kmm's diagonal was 1 - 1e-4 at
            # lengthscales of 0.1 standard deviations, where |z|^2 ~ 10^3 and eps |z|^2 ~ 10^-4).
            x2 = z2 = xp.linalg.diagonal(gram)
            r2 = -2.0 * gram  # (a new array: the norms are a view of gram's diagonal)
        else:
            x2 = row_dot(Xc, Xc)  # one fused reduction on every namespace (CuPy has no vecdot)
            z2 = row_dot(Zc, Zc)
            r2 = gram
            r2 *= -2.0
        # in place: r2 is this function's own temporary (n x m temporaries fewer than the plain expression)
        r2 += x2[:, None]
        r2 += z2[None, :]
        return xp.maximum(r2, 0.0)

    def K(self, X, Z=None, *, out=None):
        """Cross-covariance K(X, Z) (no noise term), shape (n, m); ``Z=None`` means K(X, X) without noise.
        ``out``: an array of that shape the result may be written into (``backend.scratch``; kernels that form
        a block in one product use it, the others ignore it: callers use the return value)."""
        Xs = self._scaled(X)
        Zs = Xs if Z is None else self._scaled(Z)
        if _augments(Xs, Zs):
            block = self._large_block(Xs, Zs, out)
            if block is not None:
                return block
        return self.amplitude * self.kappa(self._r2(Xs, Zs))

    def _large_block(self, Xs, Zs, out):
        """K of a block of many pairs formed in fewer passes than kappa(r^2) takes (RBF), or None."""
        return None

    def Kdiag(self, X):
        """Prior variances of f at the data points, amplitude + noise, shape (n,)."""
        xp = array_namespace(X)
        return xp.full((X.shape[0],), 1.0, dtype=X.dtype, device=array_device(X)) * (
            self.amplitude + self.noise
        )

    # -- gradients -------------------------------------------------------------------------------

    def _distance_grads(self, G, Xs, Zs, scale=1.0):
        """Chain rule through r^2 for a block whose adjoint w.r.t. r^2 is ``scale`` G (shape (n, m)): a temporary the
        caller owns (K(Z, Z)'s has its diagonal set to 0 in place).

        Returns (gradient w.r.t. log lengthscales (d,), gradient w.r.t. Z (m, d), the column sums of G (m,)),
        the gradient w.r.t. Z through both arguments when the block is K(Z, Z) (``Xs is Zs``); X is data (no
        gradient w.r.t. it). r2_nm = sum_j (xs_nj - zs_mj)^2 with xs = x / l, so d r2 / d log l_j =
        -2 (xs_nj - zs_mj)^2, summed over the block as row . xs_j^2 + col . zs_j^2 - 2 xs_j . (G zs)_j (row / col:
        G's row / column sums). For K(X, Z) every term comes from one product, G^T [xs, xs^2, 1] (the inputs
        augmented by their squares and a column of ones): G, n x m, is read once.
        """
        xp = array_namespace(G, Xs, Zs)
        # Every term is a function of xs_n - zs_m: centring both on the middle of Zs changes nothing but the
        # round-off (the expanded squares would cancel catastrophically for inputs far from the centre: ``_middle``).
        centre = _middle(Zs)
        same = Zs is Xs
        Zs = Zs - centre
        Xs = Zs if same else Xs - centre
        if same:
            # without the diagonal: r_jj = 0 adds nothing to any gradient, but its expanded terms G_jj zs_j^2 (4 - 2
            # - 2 of them) cancel only in exact arithmetic, and one point far from the others (1e154) took every
            # other term's digits with them (its column's lengthscale gradient was 0). The column sums returned
            # are the whole block's (the caller's amplitude gradient).
            whole_col = xp.sum(G, axis=0)
            G = without_diagonal(G, overwrite=True)  # (G is the caller's temporary: ``_block_grads``)
            row = xp.sum(G, axis=1)  # (m,)
            col = xp.sum(G, axis=0)  # (m,)
            GZ = G @ Zs  # (m, d)
            GtX = G.mT @ Xs  # (m, d)
            both = row + col
            d_log_l = (4.0 * scale) * row_dot(Xs, GZ, axis=-2) - (2.0 * scale) * (both @ (Zs * Zs))
            dZ = (Zs * both[:, None] - GZ - GtX) * ((2.0 * scale) / self.lengthscales)  # through either argument
            return d_log_l, dZ, whole_col
        n, d = Xs.shape
        ones = xp.ones((n, 1), dtype=Xs.dtype, device=array_device(Xs))
        products = G.mT @ xp.concat([Xs, Xs * Xs, ones], axis=1)  # (m, 2 d + 1)
        GtX, col = products[:, :d], products[:, 2 * d]  # G^T xs (m, d) and G's column sums (m,)
        x2_row = xp.sum(products[:, d:2 * d], axis=0)  # sum_nm G_nm xs_nj^2
        cross = row_dot(Zs, GtX, axis=-2)  # sum_nm G_nm xs_nj zs_mj
        d_log_l = (4.0 * scale) * cross - (2.0 * scale) * (x2_row + col @ (Zs * Zs))
        dZ = (Zs * col[:, None] - GtX) * ((2.0 * scale) / self.lengthscales)
        return d_log_l, dZ, col

    def _block_grads(self, dK, K, Xs, Zs, overwrite=False):
        """(gradients w.r.t. log amplitude, log lengthscales and Z) of sum(dK * K) for a block K = K(X, Z) (or
        K(Z, Z), ``Xs is Zs``) whose values are known. ``overwrite``: dK may be overwritten."""
        xp = array_namespace(dK, K)
        c = self._dK_dr2_per_K
        if c is None:
            d_log_l, dZ, _ = self._distance_grads(dK * self._dK_dr2(K, Xs, Zs), Xs, Zs)
            return xp.sum(dK * K), d_log_l, dZ
        # dK / d(r^2) = c K: r^2's adjoint is c dK K, and the amplitude's gradient, sum(dK K), the sum of its
        # column sums (no block of dK / d(r^2), no second pass over the block)
        if overwrite:
            dK *= K
            weighted = dK
        else:
            weighted = dK * K
        d_log_l, dZ, col = self._distance_grads(weighted, Xs, Zs, scale=c)
        return xp.sum(col), d_log_l, dZ

    def _dK_dr2(self, K, Xs, Zs):
        """dK/d(r^2) for a block whose values K are known (subclasses may use K to skip the distances)."""
        return self.amplitude * self.dkappa_dr2(self._r2(Xs, Zs))

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None, Kmm=None, *, overwrite=False):
        """Gradients of L from its adjoints w.r.t. K(Z, Z), K(X, Z) and Kdiag(X).

        Any adjoint may be ``None``. Returns a dict with one entry per parameter in ``self.params``
        (same shapes) and ``"Z"`` (m, d). The adjoints are read entry-wise: dL = sum_jk dKmm_jk dKmm_jk,
        so a non-symmetric dKmm is fine. ``Knm`` / ``Kmm``, if the caller already has K(X, Z) / K(Z, Z),
        save recomputing them. ``overwrite``: dKnm may be overwritten (a batch pass's block: no n x m temporary for
        dKnm K).
        """
        xp = array_namespace(Z)
        amp = self.amplitude
        Zs = self._scaled(Z)
        # the sums start at the first term that has one (zeros only for a gradient no adjoint reaches)
        d_log_l = dZ = d_log_amp = d_log_noise = None
        d_profile = {p.key: None for p in self.profile_parameters}  # empty (no operation) for RBF and Matern52

        def plus(total, term):
            return term if total is None else total + term

        if dKmm is not None:
            if Kmm is None:
                Kmm = amp * self.kappa(self._r2(Zs, Zs))
            d_log_amp, d_log_l, dZ = self._block_grads(dKmm, Kmm, Zs, Zs)
            if d_profile:
                profile = self.profile_grads(self._r2(Zs, Zs), dKmm * amp)
                d_profile = {k: plus(v, profile[k]) for k, v in d_profile.items()}
        if dKnm is not None:
            Xs = self._scaled(X)
            if Knm is None:
                Knm = amp * self.kappa(self._r2(Xs, Zs))
            g_amp, g_l, g_Z = self._block_grads(dKnm, Knm, Xs, Zs, overwrite=overwrite)
            d_log_amp, d_log_l, dZ = plus(d_log_amp, g_amp), plus(d_log_l, g_l), plus(dZ, g_Z)
            if d_profile:
                profile = self.profile_grads(self._r2(Xs, Zs), dKnm * amp)
                d_profile = {k: plus(v, profile[k]) for k, v in d_profile.items()}
        if dKdiag is not None:
            total = xp.sum(dKdiag)
            d_log_amp = plus(d_log_amp, total * amp)
            d_log_noise = total * self.noise
        device = array_device(Z)
        zero = xp.zeros((), dtype=Z.dtype, device=device)
        d_log_l = xp.zeros(Z.shape[1], dtype=Z.dtype, device=device) if d_log_l is None else d_log_l
        dZ = xp.zeros(Z.shape, dtype=Z.dtype, device=device) if dZ is None else dZ
        d_log_amp = zero if d_log_amp is None else d_log_amp
        d_log_noise = zero if d_log_noise is None else d_log_noise
        d_profile = {k: zero if v is None else v for k, v in d_profile.items()}
        return {"log_lengthscales": d_log_l, "log_amplitude": d_log_amp, "log_noise": d_log_noise, **d_profile,
                "Z": dZ}


def _with_stationary_parameters(cls):
    """A stationary kernel whose constructor is ``Stationary``'s: its docstring gains ``Stationary``'s Parameters
    section, so that its API page and ``help()`` list them, from the one text that describes them."""
    # (cleandoc: Python 3.13 strips a docstring's indentation when it compiles it, older versions keep it)
    stationary = inspect.cleandoc(Stationary.__doc__)
    section = stationary[stationary.index("Parameters\n---"):]
    cls.__doc__ = f"{inspect.cleandoc(cls.__doc__)}\n\n{section}"
    return cls


@_with_stationary_parameters
class RBF(Stationary):
    """ARD squared exponential (the default kernel): k(x, z) = amplitude * exp(-r^2 / 2), with
    r^2 = sum_j ((x_j - z_j) / l_j)^2, plus the latent noise at the data points. For example
    ``agpc.RBF(lengthscales=[1.0, 2.0], amplitude=2.0, noise=1e-3)``: two features, the second varying on twice
    the scale of the first.
    """

    name = "RBF"
    _dK_dr2_per_K = -0.5

    def kappa(self, r2):
        return array_namespace(r2).exp(-0.5 * r2)

    def dkappa_dr2(self, r2):
        return -0.5 * array_namespace(r2).exp(-0.5 * r2)

    def _large_block(self, Xs, Zs, out):
        """K(X, Z) = exp(log amplitude - r^2 / 2), the exponent from one product (``_augmented_pair``), capped at
        log amplitude (r^2 >= 0, as ``_r2`` cuts it): one n x m array (on NumPy, written into ``out`` when given;
        three elsewhere) where r^2, its scaling, the exponential and the amplitude made eight."""
        centre = _centre(Xs, Zs)
        log_amplitude = self.params["log_amplitude"]
        left, right = _augmented_pair(Xs - centre, Zs - centre, 1.0, -0.5, log_amplitude, 0.0)
        return capped_exp(matmul(left, right.mT, out=out), log_amplitude)


@_with_stationary_parameters
class Matern52(Stationary):
    """ARD Matern 5/2: k(x, z) = amplitude * (1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r), r as for :class:`RBF`; twice
    differentiable functions, rougher than the RBF's (Rasmussen & Williams (2006), eq. 4.17).
    """

    name = "Matern52"

    def kappa(self, r2):
        xp = array_namespace(r2)
        r = xp.sqrt(r2)
        return (1.0 + math.sqrt(5.0) * r + (5.0 / 3.0) * r2) * xp.exp(-math.sqrt(5.0) * r)

    def dkappa_dr2(self, r2):
        # d kappa / d r = -(5/3) r (1 + sqrt5 r) exp(-sqrt5 r); divided by dr2/dr = 2r (finite at r = 0)
        xp = array_namespace(r2)
        r = xp.sqrt(r2)
        return -(5.0 / 6.0) * (1.0 + math.sqrt(5.0) * r) * xp.exp(-math.sqrt(5.0) * r)


class RationalQuadratic(Stationary):
    """ARD rational quadratic: kappa = (1 + r^2 / (2 alpha))^(-alpha) (Rasmussen & Williams (2006), eq. 4.19),
    a scale mixture of RBF kernels; alpha -> infinity gives the RBF.

    Parameters are those of :class:`Stationary` and ``alpha`` (positive, default 1).
    """

    name = "RationalQuadratic"
    profile_parameters = (Parameter("alpha"),)
    parameters = Stationary.parameters + profile_parameters

    def __init__(self, lengthscales=1.0, amplitude=1.0, noise=0.0, alpha=1.0, priors=None):
        super().__init__(lengthscales, amplitude, noise, priors, alpha=alpha)

    @cached_property
    def alpha(self):
        return self._positive("alpha")

    @property
    def reach_lengthscales(self):
        """No length beyond which the profile is 0 ((1 + r^2 / (2 alpha))^(-alpha) is 1e-3 at r = 1e3 for alpha =
        1/2), but one beyond which the profile's arithmetic overflowed: a point's squared distance |x|^2 - 2 x.z +
        |z|^2 (inf - inf: NaN predictions at X * 1.7e308), or r^2 / (2 alpha) (a profile of 0 where it is 0.4 at
        alpha = 0.01). ``KERNEL_REACH`` times this is sqrt(max min(1, 2 alpha) / 4 d) lengthscales of the type for
        d lengthscales (d = 2, alpha >= 1/2: 4.7e153 in float64, 6.5e18 in float32), where both stay finite: a point
        farther is held there (``within_reach``), and nothing nearer moves (a review found float32 predictions at
        alpha = 0.01 moved from 1e14 lengthscales with a reach of 1e-6 sqrt(max)). Each column is held at its own
        lengthscale's reach, through an ``OnColumns`` too (``Kernel.reach_of_columns``)."""
        lengthscales = self.lengthscales
        xp = array_namespace(lengthscales)
        share = float(xp.finfo(lengthscales.dtype).max) / (4.0 * max(1, math.prod(lengthscales.shape)))
        return lengthscales * (xp.sqrt(share * xp.minimum(2.0 * self.alpha, 1.0)) / KERNEL_REACH)

    def _log_base(self, r2):
        """log(1 + r^2 / (2 alpha)), by log1p (exact for the small r^2 of near points)."""
        return array_namespace(r2).log1p(r2 / (2.0 * self.alpha))

    def kappa(self, r2):
        return array_namespace(r2).exp(-self.alpha * self._log_base(r2))

    def dkappa_dr2(self, r2):
        return -0.5 * array_namespace(r2).exp(-(self.alpha + 1.0) * self._log_base(r2))

    def profile_grads(self, r2, weight):
        # log kappa = -alpha log b, b = 1 + r^2 / (2 alpha): d log kappa / d log alpha
        #   = alpha (-log b + r^2 / (2 alpha b)) = -alpha log b + r^2 / (2 b)
        xp = array_namespace(r2)
        log_base = self._log_base(r2)
        kappa = xp.exp(-self.alpha * log_base)
        d_log_kappa = -self.alpha * log_base + r2 / (2.0 * xp.exp(log_base))
        return {"log_alpha": xp.sum(weight * kappa * d_log_kappa)}


class Linear(Kernel):
    """Linear kernel k(x, z) = sum_j v_j x_j z_j + b (Rasmussen & Williams (2006), eq. 4.6 with a bias): a latent
    function linear in the features, f(x) = w . x + w_0 with w_j ~ N(0, v_j) and w_0 ~ N(0, b), i.e. Bayesian probit
    regression. Not stationary: its covariances grow with |x|, so it has no reach (``reach_lengthscales`` None).

    Parameters
    ----------
    variances : float or sequence of float
        The slope variances v_j, one per input dimension (ARD), or a single value broadcast to every dimension at
        first use. 1 / v_j plays the part of a stationary kernel's l_j^2: a feature with a small v_j hardly moves f.
        Start them near 1 / (d Var x_j) on features far from unit scale (``ard="auto"``'s linear stage does): a
        unit v_j on features of 1e6 or more puts k(x, x) past 1e13, where EP's marginals start to lose their
        precision in float64: the fit raises its jitter (a ``JitterWarning``) and ends on a poorer model, measured
        in docs/usage.md.
    bias : float
        The variance of the intercept w_0 (positive).
    noise : float
        Variance of additive latent noise at the data points, as for :class:`Stationary`.
    priors : dict or None
        {parameter name: agpc.priors.Prior}; None: no prior.
    """

    name = "Linear"
    parameters = (
        Parameter("variances", shape=PER_DIMENSION),
        Parameter("bias"),
        Parameter("noise", may_be_zero=True, lower=LATENT_NOISE_FLOOR),
    )

    def __init__(self, variances=1.0, bias=1.0, noise=0.0, priors=None):
        self._start({"variances": variances, "bias": bias, "noise": noise}, priors)

    @cached_property
    def variances(self):
        return self._positive("variances")

    @cached_property
    def bias(self):
        return self._positive("bias")

    @property
    def growth(self):
        return self.variances  # k(x, x) = sum_j v_j x_j^2 + b

    def K(self, X, Z=None, *, out=None):
        """K(X, Z) = X diag(v) Z^T + b (no noise term); ``out`` is not used (``Stationary.K``)."""
        return (X * self.variances) @ (X if Z is None else Z).mT + self.bias

    def Kdiag(self, X):
        """Prior variances of f at the data points: sum_j v_j x_j^2 + b + noise."""
        return row_dot(X * self.variances, X) + (self.bias + self.noise)

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None, Kmm=None, *, overwrite=False):
        """Gradients of L from its adjoints (``Stationary.grads``' contract). With G an adjoint of a block X Zt,
        dL / dv_j = sum_nm G_nm x_nj z_mj = (Z * (G^T X))_j summed over rows, and dL / dZ = (G^T X) diag(v), through
        both arguments of K(Z, Z) ((G + G^T) Z)."""
        xp = array_namespace(Z)
        device = array_device(Z)
        v, b = self.variances, self.bias
        d_v = xp.zeros(Z.shape[1], dtype=Z.dtype, device=device)
        dZ = xp.zeros(Z.shape, dtype=Z.dtype, device=device)
        zero = xp.zeros((), dtype=Z.dtype, device=device)
        d_b = d_noise = zero
        for adjoint, left in ((dKmm, None), (dKnm, X)):
            if adjoint is None:
                continue
            GtX = (adjoint + adjoint.mT) @ Z if left is None else adjoint.mT @ left  # (m, d)
            share = 0.5 if left is None else 1.0  # K(Z, Z): both arguments' terms are in GtX, each entry twice
            d_v = d_v + share * xp.sum(Z * GtX, axis=0)
            d_b = d_b + xp.sum(adjoint)
            dZ = dZ + GtX * v
        if dKdiag is not None:
            total = xp.sum(dKdiag)
            d_v = d_v + dKdiag @ (X * X)
            d_b = d_b + total
            d_noise = total * self.noise
        return {"log_variances": d_v * v, "log_bias": d_b * b, "log_noise": d_noise, "Z": dZ}


class Combination(Kernel):
    """Base of :class:`Sum` and :class:`Product`: the terms' covariances combined, plus ONE latent noise.

    The noise enters Kdiag only (the module docstring), so a term's own noise would be a second parameter for
    the same variance; the terms are held with their noise fixed at 0 and the combination owns the noise,
    initialised (``noise=None``) at the sum of the terms' noises. Parameter keys are the terms' keys prefixed
    with their position (``"0.log_lengthscales"``) and ``"log_noise"``.
    """

    name = "Combination"
    parameters = (Parameter("noise", may_be_zero=True, lower=LATENT_NOISE_FLOOR),)

    def __init__(self, *terms, noise=None, priors=None, **named):
        if named:  # scikit-learn's names of the terms (``get_params``, ``clone``): k1, k2, ...
            names = [f"k{i}" for i in range(1, len(named) + 1)]
            if terms or set(named) != set(names):
                raise TypeError(f"{type(self).__name__} takes its terms in order, or named k1, k2, ... (all of them, "
                                f"not both ways), got {len(terms)} in order and the names {sorted(named)}")
            terms = tuple(named[name] for name in names)
        derived = noise is None
        if derived:
            noise = sum(_noise_stood_for(term) for term in terms if isinstance(term, Kernel))
        flat = []
        for term in terms:
            if not isinstance(term, Kernel):
                raise TypeError(f"{type(self).__name__} combines agpc kernels, got {term!r}")
            # (k1 + k2) + k3 is one sum of three terms: the same kernel, flat parameter keys
            flat.extend(term.terms if type(term) is type(self) and not term.priors_own else [term])
        if len(flat) < 2:
            raise ValueError(f"{type(self).__name__} needs at least two kernels")
        self.terms = tuple(term.without_noise() for term in flat)
        self.own = {"log_noise": _checked_value(self.parameters[0], noise)}
        self.priors_own = _checked_priors({"log_noise": self.parameters[0]}, priors)
        if self.priors_own and not noise > 0:
            raise ValueError("a prior on the noise needs a positive initial noise (a noise of 0 is fixed, not learned)")
        # noise=None stays None (the terms' noises, recomputed when set_params replaces a term) where the held terms
        # still account for it; an inner sum's noise given outright, flattened away, does not: it is kept as a value
        derived = derived and sum(_noise_stood_for(term) for term in self.terms) == noise
        self._keep_given({"noise": None if derived else noise, "priors": priors})

    def get_params(self, deep=True):
        """``Kernel.get_params``; the noise as a value where it was derived from noisy terms: the terms reported hold
        no noise (``without_noise``), so ``clone``, which builds from fresh copies of them, would otherwise lose it."""
        params = super().get_params(deep)
        derived = sum(_noise_stood_for(term) for term in self.terms)  # the constructor's sum: a clone stores the
        if params["noise"] is None and derived != 0.0:                   # same log noise
            params["noise"] = derived
        return params

    def _current_values(self):
        return {**{f"k{i}": term for i, term in enumerate(self.terms, 1)}, **super()._current_values()}

    @classmethod
    def _from_parts(cls, terms, own, priors_own):
        kernel = cls.__new__(cls)
        kernel.terms, kernel.own, kernel.priors_own = tuple(terms), dict(own), dict(priors_own)
        return kernel

    @property
    def params(self):
        # read from the terms on every use, not cached: a term set in place (``set_params``, ``k1__lengthscales``,
        # or the user's own kernel the combination holds) changes what the combination computes with and reports
        params = {f"{i}.{key}": value for i, term in enumerate(self.terms) for key, value in term.params.items()
                  if key != "log_noise"}
        params.update(self.own)
        return params

    @property
    def priors(self):
        priors = {f"{i}.{key}": p for i, term in enumerate(self.terms) for key, p in term.priors.items()}
        priors.update(self.priors_own)
        return priors

    def parameter_table(self):
        table = {f"{i}.{key}": p for i, term in enumerate(self.terms) for key, p in term.parameter_table().items()
                 if key != "log_noise"}
        table["log_noise"] = replace(self.parameters[0], prior=self.priors_own.get("log_noise"))
        return table

    def with_params(self, params):
        terms = [term.with_params({**term.params, **{key: params[f"{i}.{key}"] for key in term.params
                                                     if key != "log_noise"}})
                 for i, term in enumerate(self.terms)]
        return self._from_parts(terms, {"log_noise": params["log_noise"]}, self.priors_own)

    def for_inputs(self, X):
        xp = array_namespace(X)
        own = {k: asarray_like(v, xp, device=array_device(X), dtype=X.dtype) for k, v in self.own.items()}
        return self._from_parts([term.for_inputs(X) for term in self.terms], own, self.priors_own)

    def spec(self):
        return {"type": self.name, "terms": [term.spec() for term in self.terms], **self._prior_spec()}

    def __repr__(self):
        return (f"{self.name}({', '.join(repr(term) for term in self.terms)}, "
                f"noise={float(to_numpy(self.noise)):.6g}{self._repr_priors()})")

    def _growing_terms(self):
        """The terms whose variance grows with |x| (``Kernel.growth``); the bounded ones (stationary) are left out:
        a row shrunk far past every lengthscale makes a stationary factor 0 and leaves a stationary summand at its
        amplitude."""
        return [term for term in self.terms if term.growth is not None]

    @property
    def reach_lengthscales(self):
        """The longest of the terms' reaches per dimension: beyond it every term, so the combination, is 0."""
        return _largest([term.reach_lengthscales for term in self.terms])

    def reach_of_columns(self, X):
        """The longest of the terms' reaches, column by column (``Kernel.reach_of_columns``)."""
        return _largest([term.reach_of_columns(X) for term in self.terms])

    def _combine(self, values):
        raise NotImplementedError

    def K(self, X, Z=None, *, out=None):
        """The terms' K(X, Z) combined (no noise term); ``out`` is not used (``Stationary.K``)."""
        return self._combine([term.K(X, Z) for term in self.terms])

    def Kdiag(self, X):
        """The terms' prior variances combined, plus the one latent noise."""
        return self._combine([term.Kdiag(X) for term in self.terms]) + self.noise

    def _term_adjoints(self, dKmm, dKnm, dKdiag, X, Z):
        """Per term, the adjoints of L w.r.t. that term's three matrices."""
        raise NotImplementedError

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None, Kmm=None, *, overwrite=False):
        """The terms' gradients (chain rule through the combination), prefixed; the noise's from Kdiag. (``Knm``
        and ``Kmm``, the combination's, are not the terms': each term computes its own; the terms get adjoints of
        their own: ``overwrite`` changes nothing here.)"""
        xp = array_namespace(Z)
        out = {}
        dZ = None
        for i, (term, adjoints) in enumerate(zip(self.terms, self._term_adjoints(dKmm, dKnm, dKdiag, X, Z))):
            grads = term.grads(*adjoints, X, Z)
            dZ = grads["Z"] if dZ is None else dZ + grads["Z"]
            out.update({f"{i}.{key}": value for key, value in grads.items() if key not in ("Z", "log_noise")})
        out["log_noise"] = (xp.sum(dKdiag) * self.noise if dKdiag is not None
                            else xp.zeros((), dtype=Z.dtype, device=array_device(Z)))
        out["Z"] = dZ
        return out


class Sum(Combination):
    """k(x, z) = sum_i k_i(x, z), plus one latent noise at the data points (``k1 + k2``)."""

    name = "Sum"

    def _combine(self, values):
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total

    def _term_adjoints(self, dKmm, dKnm, dKdiag, X, Z):
        return [(dKmm, dKnm, dKdiag)] * len(self.terms)  # dL/dK_i = dL/dK

    @property
    def growth(self):
        """The sum of the growing terms' growths, feature by feature: sum_i (g_i . x^2 + c_i)^(p_i) <= ((sum_i g_i) .
        x^2 + c)^p at the highest power p (a term of a lower power adds a lower power)."""
        growing = self._growing_terms()
        return self._combine([term.growth for term in growing]) if growing else None

    def growth_of_columns(self, X):
        """The sum of the growing terms' growths, column by column (``Kernel.growth_of_columns``)."""
        growing = self._growing_terms()
        return self._combine([term.growth_of_columns(X) for term in growing]) if growing else None

    @property
    def growth_power(self):
        """The highest power of the growing terms (1 when none grows)."""
        return max((term.growth_power for term in self._growing_terms()), default=1)


class Product(Combination):
    """k(x, z) = prod_i k_i(x, z), plus one latent noise at the data points (``k1 * k2``)."""

    name = "Product"

    def _combine(self, values):
        total = values[0]
        for value in values[1:]:
            total = total * value
        return total

    def _term_adjoints(self, dKmm, dKnm, dKdiag, X, Z):
        # dL/dK_i = dL/dK * prod_{j != i} K_j (entry-wise), for each of the three matrices that has an adjoint
        def others(adjoint, values):
            if adjoint is None:
                return [None] * len(self.terms)
            return [adjoint * self._combine(values[:i] + values[i + 1:]) for i in range(len(values))]

        mm = others(dKmm, [term.K(Z) for term in self.terms] if dKmm is not None else None)
        nm = others(dKnm, [term.K(X, Z) for term in self.terms] if dKnm is not None else None)
        diag = others(dKdiag, [term.Kdiag(X) for term in self.terms] if dKdiag is not None else None)
        return list(zip(mm, nm, diag))

    @property
    def growth(self):
        """The largest of the growing terms' growths feature by feature, at the sum of their powers (two linear terms:
        |x|^4): prod_i (g_i . x^2 + c_i)^(p_i) <= (max_i g_i . x^2 + max_i c_i)^(sum_i p_i). (Not the product of the
        g_i, the coefficients of |x|^4 themselves: they overflow where each g_i is in the type's range, features of
        scale below ~1e-77 in float64, ~1e-10 in float32, and the lower powers' coefficients are not bounded by them.)"""
        growing = self._growing_terms()
        if not growing:
            return None
        largest = growing[0].growth
        for term in growing[1:]:
            growth = term.growth
            if isinstance(largest, numbers.Real) and isinstance(growth, numbers.Real):  # (plain numbers: one's own)
                largest = max(largest, growth)
            else:
                largest = array_namespace(largest, growth).maximum(largest, growth)
        return largest

    def growth_of_columns(self, X):
        """The largest of the growing terms' growths, column by column (``growth``, ``Kernel.growth_of_columns``)."""
        growths = [term.growth_of_columns(X) for term in self._growing_terms()]
        return _largest(growths) if growths else None

    @property
    def growth_power(self):
        """The sum of the growing terms' powers (1 when none grows)."""
        return sum(term.growth_power for term in self._growing_terms()) or 1


class OrdinalKernel(Kernel):
    """The latent GP's kernel of an ordinal model together with its likelihood's cut points b_1 < ... < b_{K-1}
    (Chu & Ghahramani (2005), the ordinal probit; ``agpc.likelihoods.Ordinal``): covariances are the latent kernel's; the
    parameters are the latent kernel's plus ``first_cut_point`` (b_1, stored as it is) and ``log_cut_gaps``
    (log(b_{j+1} - b_j), K - 2 of them), a parameterisation in which every step of the optimisers keeps the cut
    points ordered. The cut points ride with the kernel's parameters so that everything that steps, checks,
    checkpoints and saves kernel parameters does the same for them; their gradient comes from the likelihood
    (the passes add it: ``grads`` here gives them 0, the kernel matrices not depending on them)."""

    name = "Ordinal"
    parameters = (Parameter("first_cut_point", transform=IDENTITY), Parameter("cut_gaps"))

    def __init__(self, latent, cut_points):
        # (one latent GP's kernel without cut points of its own: an ordinal model has one set of them)
        if not isinstance(latent, Kernel) or latent.cut_points is not None:
            raise TypeError(f"OrdinalKernel wraps an agpc kernel, got {latent!r}")
        values = [float(v) for v in to_numpy(cut_points).reshape(-1)]
        if not values or not all(math.isfinite(v) for v in values) or any(b <= a for a, b in zip(values, values[1:])):
            raise ValueError(f"cut points must be finite and increasing (at least one), got {values}")
        self.latent = latent
        self.own = {"first_cut_point": host_array(values[0]),
                    "log_cut_gaps": host_array([math.log(b - a) for a, b in zip(values, values[1:])])}
        self._keep_given({"cut_points": cut_points})

    def _current_values(self):
        return {"latent": self.latent, "cut_points": [float(v) for v in to_numpy(self.cut_points)]}

    @property
    def covariance_kernel(self):
        return self.latent

    @classmethod
    def _from_parts(cls, latent, own):
        kernel = cls.__new__(cls)
        kernel.latent, kernel.own = latent, dict(own)
        return kernel

    @property
    def n_classes(self):
        return int(self.own["log_cut_gaps"].shape[0]) + 2

    @cached_property
    def cut_points(self):
        """b_1, ..., b_{K-1}: the first cut point and the running sums of the gaps after it."""
        first, log_gaps = self.own["first_cut_point"], self.own["log_cut_gaps"]
        xp = array_namespace(first)
        return xp.concat([xp.reshape(first, (1,)), first + xp.cumulative_sum(xp.exp(log_gaps))]) \
            if log_gaps.shape[0] else xp.reshape(first, (1,))

    def cut_point_grads(self, d_cuts):
        """{parameter key: gradient} from the gradient in the cut points b_1..b_{K-1}: b_j = b_1 + sum_{l < j}
        exp(g_l), so d/d b_1 = sum_j d_j and d/d g_l = exp(g_l) sum_{j > l} d_j."""
        xp = array_namespace(d_cuts)
        later = xp.flip(xp.cumulative_sum(xp.flip(d_cuts)))  # sum_{j >= i} d_j
        return {"first_cut_point": xp.sum(d_cuts), "log_cut_gaps": xp.exp(self.own["log_cut_gaps"]) * later[1:]}

    @property
    def params(self):
        return {**self.latent.params, **self.own}

    @property
    def priors(self):
        return self.latent.priors

    def parameter_table(self):
        table = self.latent.parameter_table()
        first, gaps = self.parameters
        table[first.key] = first
        table[gaps.key] = replace(gaps, length=self.n_classes - 2)
        return table

    def with_params(self, params):
        latent = self.latent.with_params({key: params[key] for key in self.latent.params})
        return self._from_parts(latent, {key: params[key] for key in self.own})

    def for_inputs(self, X):
        xp = array_namespace(X)
        own = {k: asarray_like(v, xp, device=array_device(X), dtype=X.dtype) for k, v in self.own.items()}
        return self._from_parts(self.latent.for_inputs(X), own)

    def spec(self):
        return {"type": self.name, "latent": self.latent.spec(), "classes": self.n_classes}

    def __repr__(self):
        cuts = ", ".join(f"{float(v):.6g}" for v in to_numpy(self.cut_points))
        return f"Ordinal({self.latent!r}, cut_points=[{cuts}])"

    @property
    def noise(self):
        return self.latent.noise

    @property
    def reach_lengthscales(self):
        return self.latent.reach_lengthscales

    @property
    def growth(self):
        return self.latent.growth

    def growth_of_columns(self, X):
        return self.latent.growth_of_columns(X)

    def reach_of_columns(self, X):
        return self.latent.reach_of_columns(X)

    @property
    def growth_power(self):
        """The latent kernel's."""
        return self.latent.growth_power

    def without_noise(self):
        return self._from_parts(self.latent.without_noise(), self.own)

    def K(self, X, Z=None, *, out=None):
        return self.latent.K(X, Z, out=out)

    def Kdiag(self, X):
        return self.latent.Kdiag(X)

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None, Kmm=None, *, overwrite=False):
        """The latent kernel's gradients, and 0 for the cut points (the likelihood's part is added by the passes)."""
        out = self.latent.grads(dKmm, dKnm, dKdiag, X, Z, Knm=Knm, Kmm=Kmm, overwrite=overwrite)
        xp = array_namespace(Z)
        out.update({key: xp.zeros_like(value) for key, value in self.own.items()})
        return out


# -- kernels of some columns of X: categorical columns, and any kernel on a subset of the features (issue 45) --------

MAX_COLUMNS = 1 << 16
"""The most columns a :class:`Categorical` or :class:`OnColumns` kernel reads: a model file's description lists
them, and a hostile one is refused by its length before its entries are read."""

MAX_COLUMN_INDEX = (1 << 31) - 1
"""The largest column index they take."""


def _checked_columns(columns, owner):
    """``columns`` as a tuple of ints: 1 to ``MAX_COLUMNS`` distinct column indices from 0 to ``MAX_COLUMN_INDEX``
    (Python or NumPy integers, not booleans); one ValueError naming ``owner`` otherwise."""
    try:
        size = None if isinstance(columns, (str, bytes, dict)) else len(columns)
    except TypeError:
        size = None
    if size is None:
        raise ValueError(f"{owner}: columns must be a list of column indices, got {type(columns).__name__}")
    if not 1 <= size <= MAX_COLUMNS:
        raise ValueError(f"{owner}: columns must list 1 to {MAX_COLUMNS} column indices, got {size}")
    values = list(columns)
    bad = [c for c in values if isinstance(c, bool) or not isinstance(c, numbers.Integral)
           or not 0 <= c <= MAX_COLUMN_INDEX]
    if bad:
        raise ValueError(f"{owner}: a column index is an integer from 0 to {MAX_COLUMN_INDEX}, got {bad[0]!r}")
    values = tuple(int(c) for c in values)
    if len(set(values)) != len(values):
        raise ValueError(f"{owner}: columns lists a column more than once")
    return values


def _check_width(owner, columns, n_features):
    """One ValueError when a kernel of ``columns`` meets data of fewer features than its columns need."""
    last = max(columns)
    if last >= n_features:
        raise ValueError(f"{owner}: column {last} is out of range for data of {n_features} features")


def _index(values, like):
    """The integers ``values`` as an index array in the namespace and on the device of ``like``."""
    xp = array_namespace(like)
    return xp.asarray(list(values), dtype=xp.int64, device=array_device(like))


def _per_column(stored, size, owner, name="lengthscales"):
    """A per-column (or per-level) parameter's stored values (a host array of one value or ``size``) as ``size``
    values."""
    if stored.shape[0] == size:
        return stored
    if stored.shape[0] == 1:
        return host_array([float(stored[0])] * size)
    entries = "columns" if name == "lengthscales" else "levels"
    raise ValueError(f"{owner} has {size} {entries} but {stored.shape[0]} {name}")


ANY_LEVEL = -(2.0 ** 127)
"""The code of an inducing point's "any level" in a categorical column of the per-level form: there the point is the
average of f over the column's listed levels, equally weighted (an inter-domain inducing variable), correlated with a
row at level a as the mean of a's correlations with them. Exactly representable in float32 and float64."""

def _may_hold(xp, *masks):
    """Whether any of the boolean ``masks`` may be true: read where that is free (NumPy, array_api_strict), taken
    as yes on a GPU (a read is a host sync there): the kernel's "any level" terms are then computed, as zeros where
    there is none."""
    return is_cupy_namespace(xp) or any(bool(xp.any(mask)) for mask in masks)


LEVEL_CHUNK = 256
"""Levels whose gradients a one-hot matrix gathers at once (``Categorical._gather``, a column at a time): its
n x LEVEL_CHUNK booleans and floats bound the memory of a kernel of many listed levels there."""

ONE_HOT_MAX_LEVELS = 16
"""The most levels of a column that ``Categorical._one_hot``'s products take: their cost grows with a column's
levels where a column at a time costs the same whatever they are. K and its gradients, 5,000 x 100 pairs, one
thread: 20 columns of 2 levels 0.024 s by the products against 0.114 a column at a time, 30 of 20 levels 0.140
against 0.141, 10 of 64 levels 0.134 against 0.056."""

MAX_LISTED_LEVELS = 1 << 20
"""The most levels a :class:`Categorical` kernel lists (``levels``, over all its columns): a model file's description
lists them, and a hostile one is refused by its length before its entries are read."""


def _checked_levels(levels, n_columns, owner):
    """(``levels`` as a tuple (one a column) of sorted tuples of distinct finite floats, the position in ``levels``
    of each of them in that order (a list, the columns' one after the other)), or (None, None): one ValueError
    naming ``owner`` otherwise. Each column lists 1 to ``MAX_LISTED_LEVELS`` of them, all of them together at most
    ``MAX_LISTED_LEVELS``."""
    if levels is None:
        return None, None
    if isinstance(levels, (str, bytes, dict)) or not hasattr(levels, "__len__") or len(levels) != n_columns:
        raise ValueError(f"{owner}: levels must list the levels of each of its {n_columns} columns, one list a column")
    out, order, total = [], [], 0
    for column in levels:
        if isinstance(column, (str, bytes, dict)) or not hasattr(column, "__len__"):
            raise ValueError(f"{owner}: the levels of a column are a list of numbers, got {type(column).__name__}")
        total += len(column)
        if not len(column) or total > MAX_LISTED_LEVELS:
            raise ValueError(f"{owner}: each column lists at least one level, all of them at most "
                             f"{MAX_LISTED_LEVELS} levels")
        values = []
        for value in column:
            try:  # (a JSON integer of 400 digits is a Real whose float() overflows)
                number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
            except (OverflowError, ValueError, TypeError):
                number = None
            if number is None or not math.isfinite(number):
                raise ValueError(f"{owner}: a level is a finite number (a code), got {repr(value)[:40]}")
            if number == ANY_LEVEL:
                raise ValueError(f"{owner}: the code {ANY_LEVEL} (kernels.ANY_LEVEL) is an inducing point's \"any "
                                 "level\", not a level a column can list")
            values.append(number)
        if len(set(values)) != len(values):
            raise ValueError(f"{owner}: a column lists a level more than once")
        ranks = sorted(range(len(values)), key=values.__getitem__)
        out.append(tuple(values[r] for r in ranks))
        order.extend(total - len(values) + r for r in ranks)
    return tuple(out), order


@dataclass(frozen=True)
class _OneHot:
    """The columns of a per-level ``Categorical`` that products of one-hot matrices take (``Categorical._one_hot``):
    their positions in its columns, the two ends' indicators of their listed levels side by side (n x L, m x L),
    the levels' weights 1 / l^2 (L,), the ends' indicators of "any level" codes a column (n x t, m x t; both None
    where neither holds one) and the number of levels of each column."""
    taken: list
    O_A: object
    O_B: object
    w: object
    any_A: object
    any_B: object
    sizes: list


@dataclass(frozen=True)
class _OneHotColumns:
    """``Categorical._one_hot_columns``' answer for a chunk of columns: the two ends' indicators of the listed levels
    (n x L, m x L) and of "any level" (n x t, m x t), each column's offset in L, and whether it may be taken."""
    O: list
    any_level: list
    offsets: list
    ok: list


@dataclass(frozen=True)
class _AnyTerms:
    """What the pairs with an "any level" end read of a per-level ``Categorical``'s one-hot columns
    (``Categorical._any_terms``): the level-to-column map (t, L), and per listed level v, q, S, h (L,), per column
    C (t,)."""
    blocks: object
    v: object
    q: object
    S: object
    h: object
    C: object


class Categorical(Kernel):
    """The kernel of categorical columns holding level codes: the RBF of their one-hot indicators, with a lengthscale
    for each column (the exchangeable form) or for each level (``levels``), without the indicators' columns:
    k(x, z) = amplitude * exp(-sum_{j in columns} [x_j != z_j] (w_j(x_j) + w_j(z_j)) / 2), plus the latent noise at the
    data points, where w_j(a) = 1 / l_{j,a}^2 for a level a that ``levels`` lists for column j, and 1 / l_j^2 for
    every other value of the column. (Two rows' one-hot indicators of column j differ in two places where x_j !=
    z_j, and the RBF's exp(-d^2 / (2 l^2)) of each is this.)

    Exchangeable form (``levels=None``): every level has the column's lengthscale, so two different levels are
    correlated exp(-1 / l_j^2): l_j -> infinity makes the column irrelevant, a small l_j makes its levels
    independent. The kernel of BoTorch's ``CategoricalKernel`` (its ``MixedSingleTaskGP``; Ru, Alvi, Nguyen, Osborne &
    Roberts (2020), CoCaBO's "overlap" kernel) with l_j^2 for its lengthscale, which averages the mismatches over the
    columns where this sums them: the exchangeable correlation of Qian, Wu & Wu (2008) with one parameter a column.

    Per-level form (``levels``: the levels each column lists): levels a != b are correlated
    exp(-(1 / l_{j,a}^2 + 1 / l_{j,b}^2) / 2), so a level of a short lengthscale stands apart from all others while
    the others stay alike (a target set by whether a column takes one particular level). A value the column does not
    list (a level unseen at fit, ``categories.UNSEEN``) is a level of its own with the column's lengthscale l_j.
    Squared, as the RBF's, the lengthscales move the weights twice as fast in log space as 1 / l would, and the
    default priors on log l (``with_default_priors``) allow a level's weight what they allow a feature's: with 1 / l
    the fits of monk2 reached a log Z 4 nats lower in 1,000 steps than the one-hot RBF's.

    Each column's factor is positive semi-definite: with v_a = exp(-w(a) / 2), it is v_a v_b for a != b and
    1 = v_a^2 + (1 - v_a^2) for a = b, a rank-one matrix plus a non-negative diagonal; so is their product.
    Only the equality of two values is read, so the codes are any numbers (the integers 0..L-1 ``agpc.categories``
    gives text levels, or a file's own codes).

    In the per-level form a point may hold ``ANY_LEVEL`` in a column: it then stands for the mean of f over the
    column's listed levels, u = (1 / L) sum_c f(.., c, ..) (an inter-domain inducing variable), so its factor with a
    value a is h(a) = (1 / L) sum_c k_j(a, c) = q_a (1 - v_a^2) + v_a S (q_a = 1 / L for a listed a, else 0; S =
    sum_c v_c / L), and with another such code C = S^2 + sum_c (1 - v_c^2) / L^2: covariances of linear functionals
    of f, so K(Z, Z) stays positive semi-definite. The code is meant for inducing points (``Kdiag`` of such a row is
    still amplitude + noise; ``inducing.with_any_levels``).

    Its gradient w.r.t. the inducing points is exactly 0 (codes are discrete: an optimiser never moves an inducing
    point off its levels). Bounded by its amplitude (no ``growth``).

    Parameters
    ----------
    columns : sequence of int
        The categorical columns of X (1 to ``MAX_COLUMNS`` distinct indices).
    lengthscales : float or sequence of float, default=1.0
        One per column of ``columns``, or one for all of them: the lengthscale of every level (exchangeable form), or
        of the values ``levels`` does not list.
    amplitude : float, default=1.0
        Signal variance.
    noise : float, default=0.0
        Variance of additive latent noise at the data points, as for :class:`Stationary`.
    priors : dict or None, default=None
        {parameter name: agpc.priors.Prior}; None: no prior.
    levels : sequence of sequences of float, or None, default=None
        None: the exchangeable form. Else one list a column of ``columns``: the level codes that get a lengthscale
        of their own (1 to ``MAX_LISTED_LEVELS`` in all). ``GPClassifier``'s default kernel lists the levels of its
        start's rows (``agpc.inputs.default_kernel``).
    level_lengthscales : float or sequence of float, default=1.0
        With ``levels``: one per listed level (the columns' lists one after the other), or one for all of them.
    """

    name = "Categorical"
    parameters = (
        Parameter("lengthscales", shape=PER_COLUMN),
        Parameter("amplitude"),
        Parameter("noise", may_be_zero=True, lower=LATENT_NOISE_FLOOR),
    )
    level_parameter = Parameter("level_lengthscales", shape=PER_COLUMN)
    """The per-level form's extra parameter (its instances' ``parameters`` end with it)."""

    def __init__(self, columns, lengthscales=1.0, amplitude=1.0, noise=0.0, priors=None, levels=None,
                 level_lengthscales=1.0):
        self.columns = _checked_columns(columns, self.name)
        self.levels, order = _checked_levels(levels, len(self.columns), self.name)
        values = {"lengthscales": lengthscales, "amplitude": amplitude, "noise": noise}
        if self.levels is not None:
            self.parameters = type(self).parameters + (self.level_parameter,)
            values["level_lengthscales"] = level_lengthscales
        elif not (isinstance(level_lengthscales, numbers.Real) and level_lengthscales == 1.0):
            raise ValueError(f"{self.name}: level_lengthscales are those of the listed levels: give levels too")
        self._start(values, priors)
        # (one per column from the start: the number of columns is known here, unlike the data's features)
        self.params["log_lengthscales"] = _per_column(self.params["log_lengthscales"], len(self.columns), self.name)
        if self.levels is not None:  # (given in the order of the levels as given; held in their sorted order)
            self.params["log_level_lengthscales"] = _per_column(self.params["log_level_lengthscales"],
                                                                self.n_levels, self.name, "level_lengthscales")[order]
        self._keep_given({"columns": columns, **self._given, "levels": levels,
                          "level_lengthscales": level_lengthscales})

    @property
    def n_levels(self):
        """The levels the kernel lists, all columns together (0 in the exchangeable form)."""
        return 0 if self.levels is None else sum(len(column) for column in self.levels)

    def _current_values(self):
        values = {"columns": list(self.columns), **super()._current_values()}
        values["levels"] = None if self.levels is None else [list(column) for column in self.levels]
        values.setdefault("level_lengthscales", 1.0)
        return values

    def _repr_leading(self):
        given = self.get_params(deep=False)["levels"]  # (as given: in the order of level_lengthscales as given)
        levels = "" if given is None else f"levels={[[float(v) for v in column] for column in given]!r}, "
        return f"columns={list(self.columns)!r}, {levels}"

    def with_params(self, params):
        kernel = super().with_params(params)
        kernel.columns, kernel.levels = self.columns, self.levels
        if self.levels is not None:
            kernel.parameters = self.parameters
        return kernel

    def parameter_table(self):
        table = super().parameter_table()
        table["log_lengthscales"] = replace(table["log_lengthscales"], length=len(self.columns))
        if self.levels is not None:
            table["log_level_lengthscales"] = replace(table["log_level_lengthscales"], length=self.n_levels)
        return table

    def for_inputs(self, X):
        """This kernel with its parameters in X's namespace, device and type (X: all the features, (n, d))."""
        _check_width(self.name, self.columns, X.shape[1])
        xp, device = array_namespace(X), array_device(X)
        params = {k: asarray_like(v, xp, device=device, dtype=X.dtype) for k, v in self.params.items()}
        return _check_prior_entries(self.with_params(params))

    def spec(self):
        levels = {} if self.levels is None else {"levels": [list(column) for column in self.levels]}
        return {"type": self.name, "columns": list(self.columns), **levels, **self._prior_spec()}

    @cached_property
    def lengthscales(self):
        return self._positive("lengthscales")

    @cached_property
    def amplitude(self):
        return self._positive("amplitude")

    @cached_property
    def _column_weights(self):
        """1 / l_j^2 a column."""
        log_lengthscales = self.params["log_lengthscales"]
        return array_namespace(log_lengthscales).exp(-2.0 * log_lengthscales)

    @cached_property
    def _level_table(self):
        """Per column of the per-level form: (its listed levels, sorted, and their weights 1 / l_{j,a}^2) as arrays of
        the parameters' namespace, device and type."""
        stored = self.params["log_level_lengthscales"]
        xp, device = array_namespace(stored), array_device(stored)
        weights = xp.exp(-2.0 * stored)
        table, offset = [], 0
        for column in self.levels:
            size = len(column)
            table.append((xp.asarray(column, dtype=stored.dtype, device=device), weights[offset:offset + size]))
            offset += size
        return table

    @property
    def reach_lengthscales(self):
        """1 for every column (one array entry, broadcast): a reach, so that a sum or product with a continuous term
        is clamped where that term's reach says (``within_reach`` takes the longest reach of the terms per
        column), and no longer; the columns this kernel reads are not clamped at all, since it compares their codes
        for equality only."""
        amplitude = self.amplitude
        xp = array_namespace(amplitude)
        return xp.reshape(xp.ones_like(amplitude), (1,))

    def reach_of_columns(self, X):
        """1 at the columns it reads (which ``within_reach`` does not clamp), 0 at X's others: it does not read them,
        so in a sum or product each of them is held where the other terms' reach says (a reach of 1 there held a
        column of a term of lengthscale 1e-3 a thousand times farther out than that term's own reach)."""
        xp = array_namespace(X)
        device = array_device(X)
        reads = xp.any(xp.arange(X.shape[1], device=device)[:, None] == _index(self.columns, X)[None, :], axis=1)
        return xp.astype(reads, X.dtype)

    def mismatch_rates(self):
        """How much log k falls when a row moves to another level of each column (host floats, (k,)): 1 / l_j^2 in
        the exchangeable form, the mean of the column's listed levels' 1 / l_{j,a}^2 in the per-level form (two
        levels a, b fall (w_a + w_b) / 2): what ``summary()`` and ``agpc inspect`` report as the column's relevance."""
        if self.levels is None:
            return host_array([float(w) for w in to_numpy(self._column_weights).reshape(-1)])
        return host_array([float(to_numpy(weights).mean()) for _, weights in self._level_table])

    @staticmethod
    def _differ(A, B, j):
        """[a_j != b_j] for every pair of rows of A (n, d) and B (m, d): booleans (n, m)."""
        return A[:, j][:, None] != B[:, j][None, :]

    def _level_weights(self, values, i):
        """(w_j of each of ``values`` (a column's codes, (n,)), the index of its listed level, whether it is one) for
        the i-th column of the per-level form: its listed level's weight, else the column's."""
        xp = array_namespace(values)
        levels, weights = self._level_table[i]
        index = xp.minimum(xp.searchsorted(levels, values), levels.shape[0] - 1)
        listed = xp.take(levels, index) == values
        return xp.where(listed, xp.take(weights, index), self._column_weights[i]), index, listed

    def _level_sums(self, i):
        """(S, C, log S) of column i of the per-level form: S = sum_c q_c v_c and C = sum_c q_c^2 (1 - v_c^2) + S^2 over
        its listed levels, q_c = 1 / L, v_c = exp(-w_c / 2): an "any level" point's correlations (``_any_factor``);
        log S from the largest -w_c / 2, finite where S underflows."""
        xp = array_namespace(self.params["log_level_lengthscales"])
        _, weights = self._level_table[i]
        v = xp.exp(-0.5 * weights)
        q = 1.0 / weights.shape[0]
        S = q * xp.sum(v)
        top = xp.max(-0.5 * weights)
        return S, q * q * xp.sum(1.0 - v * v) + S * S, top + xp.log(q * xp.sum(xp.exp(-0.5 * weights - top)))

    def _any_factor(self, values, i):
        """(log h (n,), v / h, v, q, listed, index, w) of ``values`` against an "any level" point in column i: h(a) =
        q_a (1 - v_a^2) + v_a S, the mean over the listed levels c of a's correlation with c (q_a = 0 for a value not
        listed). For such a value h = v_a S, whose log and v / h (= 1 / S) are taken without forming it: v_a
        underflows to 0 at a short column lengthscale (a log of 0, a gradient of 0 / 0)."""
        xp = array_namespace(values)
        u, index, listed = self._level_weights(values, i)
        v = xp.exp(-0.5 * u)
        zero = xp.zeros((), dtype=values.dtype, device=array_device(values))
        one = zero + 1.0
        q = xp.where(listed, zero + 1.0 / self._level_table[i][0].shape[0], zero)
        S, _, log_S = self._level_sums(i)
        h = xp.where(listed, q * (1.0 - v * v) + v * S, one)  # (>= q (1 - v^2) > 0 where listed)
        log_h = xp.where(listed, xp.log(h), -0.5 * u + log_S)
        return log_h, xp.where(listed, v / h, one / S), v, q, listed, index, u

    def _log_factor(self, A, B, i, j):
        """log of column j's factor (n, m): -[a != b] w (exchangeable), -[a != b] (w_a + w_b) / 2 (per level), and
        in the per-level form the "any level" codes' averages (``ANY_LEVEL``)."""
        xp = array_namespace(A, B)
        zero = xp.zeros((), dtype=A.dtype, device=array_device(A))
        a, b = A[:, j], B[:, j]
        if self.levels is None:
            return xp.where(self._differ(A, B, j), -self._column_weights[i], zero)
        ha, hb = -0.5 * self._level_weights(a, i)[0], -0.5 * self._level_weights(b, i)[0]  # (halved on n and m)
        out = xp.where(self._differ(A, B, j), ha[:, None] + hb[None, :], zero)
        any_a, any_b = a == ANY_LEVEL, b == ANY_LEVEL
        if not _may_hold(xp, any_a, any_b):
            return out
        _, C, _ = self._level_sums(i)
        log_ha, log_hb = self._any_factor(a, i)[0], self._any_factor(b, i)[0]
        out = xp.where(any_b[None, :], log_ha[:, None], out)
        out = xp.where(any_a[:, None], log_hb[None, :], out)
        return xp.where(any_a[:, None] & any_b[None, :], xp.log(C), out)

    def _one_hot(self, A, B):
        """The per-level form's columns that products of one-hot matrices take, or None: those that list at most
        ``ONE_HOT_MAX_LEVELS`` levels of finite weights where every value of A and of B is a listed level or
        ``ANY_LEVEL`` (no unlisted value), taken in their order while they fit in max(2 m, ``ONE_HOT_MAX_LEVELS``)
        levels in all for m rows of B (a column that does not fit in what is left is skipped, a later smaller one
        may be taken): the products' temporaries are about 5 L a row of A (4 L + t wide with "any level" ends), a
        few times K's m.
        With O the rows' one-hot indicators of those columns' levels side by side (n x L) and W = O diag(w),
        sum_j [a_j != b_j] w_{a_j} = (W_A (1 - O_B)^T)_ab, since within column j only b_j's entry of O_B is 1: one
        n x 2L x m product gives the columns' whole mismatch (``_mismatch``), where a column at a time makes five
        passes of n x m (australian's exact model, 8 columns of 2 to 14 levels: 42-48 -> 20-23 s a fit of 260
        steps, the same model). It is a sum of non-negative terms, exactly 0 for equal rows. Returns a
        ``_OneHot``; its ``any_A`` / ``any_B`` are None where no value of either end is ``ANY_LEVEL``. Read where
        that is free only (NumPy, array_api_strict): on a GPU which values are listed is a host sync, so every
        column is taken one at a time there (``_log_factor``)."""
        if self.levels is None:
            return None
        xp = array_namespace(A, B)
        if is_cupy_namespace(xp):
            return None
        table = self._level_table
        # (a weight of inf, a lengthscale that underflowed, would be 0 * inf in the products: NaN)
        candidates = [i for i, (levels, weights) in enumerate(table)
                      if levels.shape[0] <= ONE_HOT_MAX_LEVELS and bool(xp.all(xp.isfinite(weights)))]
        room = max(2 * B.shape[0], ONE_HOT_MAX_LEVELS)
        taken, ends, anys = [], ([], []), ([], [])
        while candidates and room > 0:
            # (the candidates in order, a chunk of at most ``room`` levels at a time: its indicators are n x room)
            chunk, size = [], 0
            while candidates and size + table[candidates[0]][0].shape[0] <= room:
                size += table[candidates[0]][0].shape[0]
                chunk.append(candidates.pop(0))
            if not chunk:
                candidates.pop(0)  # (more levels than are left room for: a later, smaller column may fit)
                continue
            fits = self._one_hot_columns(A, B, chunk, table)
            for position, i in enumerate(chunk):  # (each fits in what is left: the chunk fitted in all of it)
                levels = table[i][0].shape[0]
                if fits.ok[position]:
                    taken.append(i)
                    room -= levels
                    for end, any_end, O, any_level in zip(ends, anys, fits.O, fits.any_level):
                        end.append(O[:, fits.offsets[position]:fits.offsets[position] + levels])
                        any_end.append(any_level[:, position:position + 1])
        if not taken:
            return None
        O_A, O_B = (xp.astype(xp.concat(end, axis=1), A.dtype) for end in ends)
        any_A, any_B = (xp.astype(xp.concat(end, axis=1), A.dtype) for end in anys)
        if not bool(xp.any(any_A != 0.0)) and not bool(xp.any(any_B != 0.0)):
            any_A = any_B = None
        return _OneHot(taken, O_A, O_B, xp.concat([table[i][1] for i in taken]), any_A, any_B,
                       [table[i][0].shape[0] for i in taken])

    def _one_hot_columns(self, A, B, chunk, table):
        """For the columns ``chunk`` (positions in ``columns``) of both ends at once: each end's indicators of their
        listed levels side by side (booleans, n x L: a value against every listed level of its column, one
        comparison) and of ``ANY_LEVEL`` (n x t), the offset of each column's levels, and whether each column
        holds only listed levels and ``ANY_LEVEL`` on both ends (host booleans): ``_one_hot``'s gate."""
        xp = array_namespace(A, B)
        device = array_device(A)
        sizes = [table[i][0].shape[0] for i in chunk]
        offsets = [sum(sizes[:p]) for p in range(len(sizes))]

        def indices(values):
            return asarray_like(host_array(values, dtype="int64"), xp, device=device)

        owner = indices([p for p, size in enumerate(sizes) for _ in range(size)])
        starts, ends = indices(offsets), indices([o + size for o, size in zip(offsets, sizes)])
        levels = xp.concat([table[i][0] for i in chunk])
        columns = indices([self.columns[i] for i in chunk])
        O, any_level, ok = [], [], [True] * len(chunk)
        for rows in (A, B):
            values = xp.take(rows, columns, axis=1)  # (n, t)
            indicators = xp.take(values, owner, axis=1) == levels[None, :]
            anywhere = values == ANY_LEVEL
            # (a value is listed where its column's block of indicators holds a 1: running sums, n x L, not a
            # product with the level-to-column map, n x L x t)
            # (the leading zeros made here, on the rows' device: array_api_strict before 2.6 makes include_initial's
            # on the default device, and a concat across devices fails)
            running = xp.concat([xp.zeros((indicators.shape[0], 1), dtype=xp.int32, device=device),
                                 xp.cumulative_sum(xp.astype(indicators, xp.int32), axis=1)], axis=1)
            listed = xp.take(running, ends, axis=1) > xp.take(running, starts, axis=1)
            ok = [before and bool(now) for before, now in zip(ok, to_numpy(xp.all(listed | anywhere, axis=0)).tolist())]
            O.append(indicators)
            any_level.append(anywhere)
        return _OneHotColumns(O, any_level, offsets, ok)

    def _any_blocks(self, one_hot):
        """(the level-to-column map (t, L), g (L,), c (t,)) of ``one_hot``'s t columns: g_a = -log h(a), a listed
        level's log correlation with an "any level" point of its column (``_any_factor``), and c = -log C, two such
        points' (``_level_sums``)."""
        terms = self._any_terms(one_hot)
        xp = array_namespace(one_hot.w)
        return terms.blocks, -xp.log(terms.h), -xp.log(terms.C)

    def _any_terms(self, one_hot):
        """``_AnyTerms`` of ``one_hot``'s t columns, all of them at once: the level-to-column map B (t, L), and per
        listed level c of column t, v_c = exp(-w_c / 2), q = 1 / L_t, S_t = q sum_{c in t} v_c, h_c = q (1 - v_c^2) +
        v_c S_t, and C_t = q^2 sum_{c in t} (1 - v_c^2) + S_t^2 (``_level_sums`` and ``_any_factor`` of a column at a
        time; a level's S and q are its column's, spread by B). h > 0 for every finite weight (q > 0)."""
        xp = array_namespace(one_hot.w)
        device, dtype = array_device(one_hot.w), one_hot.w.dtype
        blocks = xp.concat([xp.astype(xp.arange(len(one_hot.taken), device=device)[:, None] == t, dtype)
                            * xp.ones((1, size), dtype=dtype, device=device)
                            for t, size in enumerate(one_hot.sizes)], axis=1)
        q_t = 1.0 / xp.asarray([float(size) for size in one_hot.sizes], dtype=dtype, device=device)
        v = xp.exp(-0.5 * one_hot.w)
        S_t = q_t * (blocks @ v)
        q, S = q_t @ blocks, S_t @ blocks
        h = q * (1.0 - v * v) + v * S
        return _AnyTerms(blocks, v, q, S, h, q_t * q_t * (blocks @ (1.0 - v * v)) + S_t * S_t)

    def _mismatch(self, A, B):
        """-sum_j log F_j for every pair of rows (n, m): the columns ``_one_hot`` takes by one product, half of
        [W_A, 1 - O_A] [1 - O_B, W_B]^T (each end's weight where the pair differs), the others one at a time
        (temporaries n x m there: a broadcast over the columns would hold n x m x k). With "any level" ends (N: a row's
        indicator of them spread over its column's levels, Q the same a column): 1 - O - N in place of 1 - O, and
        the pairs with such an end by [O g, N, Q c] [N, O g, Q]^T."""
        one_hot = self._one_hot(A, B)
        taken, total = set(), None
        if one_hot is not None:
            xp = array_namespace(A, B)
            taken, O_A, O_B, w = set(one_hot.taken), one_hot.O_A, one_hot.O_B, one_hot.w
            if one_hot.any_A is None:
                left = xp.concat([O_A * w[None, :], 1.0 - O_A], axis=1)
                right = xp.concat([1.0 - O_B, O_B * w[None, :]], axis=1)
                total = 0.5 * (left @ right.mT)
            else:
                blocks, g, c = self._any_blocks(one_hot)
                N_A, N_B = one_hot.any_A @ blocks, one_hot.any_B @ blocks
                left = xp.concat([0.5 * (O_A * w[None, :]), 0.5 * (1.0 - O_A - N_A), O_A * g[None, :], N_A,
                                  one_hot.any_A * c[None, :]], axis=1)
                right = xp.concat([1.0 - O_B - N_B, O_B * w[None, :], N_B, O_B * g[None, :], one_hot.any_B], axis=1)
                total = left @ right.mT
        for i, j in enumerate(self.columns):
            if i in taken:
                continue
            term = self._log_factor(A, B, i, j)
            if total is None:
                total = -term
            else:
                total -= term
        return total

    def K(self, X, Z=None, *, out=None):
        """Cross-covariance K(X, Z) (no noise term); ``Z=None``: K(X, X). ``out`` is not used (``Stationary.K``)."""
        mismatch = self._mismatch(X, X if Z is None else Z)
        return array_namespace(mismatch).exp(self.params["log_amplitude"] - mismatch)

    def Kdiag(self, X):
        """Prior variances of f at the data points, amplitude + noise, shape (n,)."""
        xp = array_namespace(X)
        return xp.full((X.shape[0],), 1.0, dtype=X.dtype, device=array_device(X)) * (self.amplitude + self.noise)

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None, Kmm=None, *, overwrite=False):
        """Gradients of L from its adjoints (``Stationary.grads``' contract). With G the adjoint of a block K and
        D_j = G K [x_j != z_j]: dL / d log amplitude = sum(G K); in the exchangeable form dL / d log l_j =
        2 sum(D_j) / l_j^2 (dK / d log l_j = 2 K [x_j != z_j] / l_j^2); in the per-level form each end of a pair brings
        its own weight, dK / d log l_{j,a} = K [x_j != z_j] ([x_j = a] + [z_j = a]) / l_{j,a}^2, so a level's gradient
        sums D_j's rows and columns at that level (``_level_grads``), and l_j's those at values the column does not
        list. The gradient w.r.t. Z is 0 (codes are discrete)."""
        xp = array_namespace(Z)
        device = array_device(Z)
        zero = xp.zeros((), dtype=Z.dtype, device=device)
        d_log_amp, d_log_noise = zero, zero
        d_log_l = xp.zeros(len(self.columns), dtype=Z.dtype, device=device)
        d_log_levels = None if self.levels is None else xp.zeros(self.n_levels, dtype=Z.dtype, device=device)
        for adjoint, rows, values in ((dKmm, Z, Kmm), (dKnm, X, Knm)):
            if adjoint is None:
                continue
            values = self.K(rows, Z) if values is None else values
            if overwrite and adjoint is dKnm:  # (the caller's block, which it lets us write: no n x m temporary)
                adjoint *= values
                weighted = adjoint
            else:
                weighted = adjoint * values
            d_log_amp = d_log_amp + xp.sum(weighted)
            if self.levels is None:
                d_log_l = d_log_l + 2.0 * xp.stack([xp.sum(xp.where(self._differ(rows, Z, j), weighted, zero))
                                                    for j in self.columns])
            else:
                column, level = self._level_grads(weighted, rows, Z)
                d_log_l, d_log_levels = d_log_l + column, d_log_levels + level
        d_log_l = d_log_l * xp.where(xp.isfinite(self._column_weights), self._column_weights, zero)  # (as levels')
        if dKdiag is not None:
            total = xp.sum(dKdiag)
            d_log_amp = d_log_amp + total * self.amplitude
            d_log_noise = total * self.noise
        out = {"log_lengthscales": d_log_l, "log_amplitude": d_log_amp, "log_noise": d_log_noise}
        if self.levels is not None:
            out["log_level_lengthscales"] = d_log_levels
        out["Z"] = xp.zeros(Z.shape, dtype=Z.dtype, device=device)
        return out

    def _level_grads(self, weighted, rows, Z):
        """The per-level form's (sum over the columns' unlisted values, (k,); sum over the listed levels, (n_levels,))
        of sum(D_j) d log F_j / d log l: at pairs of values, D_j's row sums at the rows of a value plus its column
        sums at the inducing points of that value, gathered by a one-hot matrix of the listed levels (n x L_j), times
        1 / l_{j,a}^2 (the column's 1 / l_j^2 is applied by the caller); pairs with an "any level" end add d log h /
        d log l (``_any_grads``), pairs of two d log C / d log l."""
        xp = array_namespace(Z)
        zero = xp.zeros((), dtype=Z.dtype, device=array_device(Z))
        unlisted, listed = [], []
        by_product = self._one_hot_level_grads(weighted, rows, Z)
        for i, j in enumerate(self.columns):
            if i in by_product:
                unlisted.append(by_product[i][0])
                listed.append(by_product[i][1])
                continue
            any_r, any_z = rows[:, j] == ANY_LEVEL, Z[:, j] == ANY_LEVEL
            normal = ~any_r[:, None] & ~any_z[None, :]
            D = xp.where(self._differ(rows, Z, j) & normal, weighted, zero)
            levels, weights = self._level_table[i]
            column_total, level_total = zero, None
            for ends, values in ((xp.sum(D, axis=1), rows[:, j]), (xp.sum(D, axis=0), Z[:, j])):
                _, index, is_listed = self._level_weights(values, i)
                column_total = column_total + xp.sum(xp.where(is_listed, zero, ends))
                sums = self._gather(ends, index, is_listed, levels.shape[0])
                level_total = sums if level_total is None else level_total + sums
            # (a weight of inf, a lengthscale that underflowed, reads K = 0 at every pair it is in: its gradient, the
            # limit of w e^(-w / 2), is 0, not 0 x inf)
            level_total = level_total * xp.where(xp.isfinite(weights), weights, zero)
            if not _may_hold(xp, any_r, any_z):
                unlisted.append(column_total)
                listed.append(level_total)
                continue
            column_total, level_total = self._any_level_grads(
                i, level_total, column_total,
                xp.sum(xp.where(~any_r[:, None] & any_z[None, :], weighted, zero), axis=1), rows[:, j],
                xp.sum(xp.where(any_r[:, None] & ~any_z[None, :], weighted, zero), axis=0), Z[:, j],
                xp.sum(xp.where(any_r[:, None] & any_z[None, :], weighted, zero)))
            unlisted.append(column_total)
            listed.append(level_total)
        return xp.stack(unlisted), xp.concat(listed)

    def _any_level_grads(self, i, level_total, column_total, row_ends, row_values, point_ends, point_values, both):
        """(column_total, level_total) of column i with its pairs of an "any level" end added: ``row_ends`` (n,),
        the adjoint-weighted sums over a row's "any level" points (0 at rows of that code themselves), likewise
        ``point_ends`` (m,) over a point's such rows, and ``both`` the sum over pairs of two: d log h / d log l
        (``_any_grads``) at each end, and d log C / d log l for the pairs of two."""
        for ends, values in ((row_ends, row_values), (point_ends, point_values)):
            column_part, level_part = self._any_grads(ends, values, i)
            column_total, level_total = column_total + column_part, level_total + level_part
        levels, weights = self._level_table[i]
        S, C, _ = self._level_sums(i)
        v = array_namespace(weights).exp(-0.5 * weights)
        q = 1.0 / levels.shape[0]
        return column_total, level_total + both * 2.0 * q * v * weights * (S - q * v) / C

    def _one_hot_level_grads(self, weighted, rows, Z):
        """{column position i: (its unlisted part, its levels' part) of ``_level_grads``} for the columns
        ``_one_hot`` takes. With M = ``weighted`` (n, m), a level a's part is w_a times the sum of M over the pairs of
        a row of level a and a point of another level, and of a point of level a and a row of another level:
        w_a (diag(O_r^T M P_Z) + diag(O_Z^T M^T P_r))_a with P = 1 - O (1 - O - N with "any level" ends: the other
        levels of a row's column), two n x m x L products where a column at a time makes four n x m passes. Summed
        over those pairs only, never as all pairs less the equal ones: the pairs that differ carry K ~ e^-w, which a
        difference loses to round-off where w is large (float32 at a lengthscale of 0.25: the wrong sign). Pairs with
        an "any level" end add ``_any_level_grads`` of M's sums over them, M Q_Z, M^T Q_r and diag(Q_r^T M Q_Z)."""
        one_hot = self._one_hot(rows, Z)
        if one_hot is None:
            return {}
        O_r, O_Z, w = one_hot.O_A, one_hot.O_B, one_hot.w
        xp = array_namespace(weighted)
        if one_hot.any_A is None:
            other_r, other_Z = 1.0 - O_r, 1.0 - O_Z
        else:
            terms = self._any_terms(one_hot)
            to_any, from_any = weighted @ one_hot.any_B, weighted.mT @ one_hot.any_A  # (n, t), (m, t)
            other_r, other_Z = 1.0 - O_r - one_hot.any_A @ terms.blocks, 1.0 - O_Z - one_hot.any_B @ terms.blocks
        totals = w * (xp.sum(O_r * (weighted @ other_Z), axis=0) + xp.sum(O_Z * (weighted.mT @ other_r), axis=0))
        zero = xp.zeros((), dtype=weighted.dtype, device=array_device(weighted))
        if one_hot.any_A is not None:
            totals = totals + self._one_hot_any_grads(one_hot, terms, to_any, from_any)
        out, offset = {}, 0
        for i, size in zip(one_hot.taken, one_hot.sizes):
            out[i] = (zero, totals[offset:offset + size])  # (no unlisted values in these columns: 0 for l_j)
            offset += size
        return out

    def _one_hot_any_grads(self, one_hot, terms, to_any, from_any):
        """The levels' part (L,) of the pairs with an "any level" end in ``one_hot``'s columns, all at once: what
        ``_any_level_grads`` adds a column at a time (its unlisted part is 0 here: every value is a listed level or
        "any level"). A row's sum over its "any level" points (``to_any`` (n, t), ``from_any`` (m, t) the points'
        over such rows) falls on its level of each column, e_c = sum over the ends at level c (an "any level" end
        has no level: its row of O is 0 there); with ``terms`` (``_any_terms``) v, q, S, h, C (d log h(a) / d log l_c in
        ``_any_grads``):
            e_c (v_c / h_c) w_c (S - 2 q v_c) + q v_c w_c sum_{c' in its column} e_c' v_c' / h_c'
        and the pairs of two such ends, D summed over them (``both``, a column), 2 q v_c w_c (S - q v_c) / C."""
        xp = array_namespace(to_any)
        w, v, q, S = one_hot.w, terms.v, terms.q, terms.S
        e = xp.sum(one_hot.O_A * (to_any @ terms.blocks), axis=0) + xp.sum(one_hot.O_B * (from_any @ terms.blocks),
                                                                             axis=0)
        ratio = e * v / terms.h
        both = xp.sum(one_hot.any_A * to_any, axis=0)
        return (ratio * w * (S - 2.0 * q * v) + q * v * w * ((terms.blocks @ ratio) @ terms.blocks)
                + ((2.0 * both / terms.C) @ terms.blocks) * q * v * w * (S - q * v))

    @staticmethod
    def _gather(ends, index, is_listed, size):
        """The sum of ``ends`` (n,) at each of ``size`` listed levels (``index``, where ``is_listed``), by one-hot
        matrices of at most ``LEVEL_CHUNK`` levels at a time: n x LEVEL_CHUNK temporaries, whatever the levels."""
        xp = array_namespace(ends)
        device = array_device(ends)
        zero = xp.zeros((), dtype=ends.dtype, device=device)
        index = xp.where(is_listed, index, xp.full_like(index, -1))
        parts = []
        for start in range(0, size, LEVEL_CHUNK):
            positions = xp.arange(start, min(start + LEVEL_CHUNK, size), device=device)
            parts.append(xp.sum(xp.where(index[:, None] == positions[None, :], ends[:, None], zero), axis=0))
        return parts[0] if len(parts) == 1 else xp.concat(parts)

    def _any_grads(self, ends, values, i):
        """(column part (before 1 / l_j^2), level part (L,)) of sum_pairs D d log h(a) / d log l at pairs of a value
        a (``values``; ``ends``: D summed over its "any level" partners) and an "any level" point: d log h(a) / d log
        l_c = [a = c] v_a w_a (S - 2 q_a v_a) / h_a + v_a q_c v_c w_c / h_a for a listed c, and 1 (times w_j) for l_j
        where a is not listed (h = v_a S there)."""
        xp = array_namespace(ends)
        zero = xp.zeros((), dtype=ends.dtype, device=array_device(ends))
        _, v_over_h, v, q, is_listed, index, u = self._any_factor(values, i)
        levels, weights = self._level_table[i]
        S, _, _ = self._level_sums(i)
        own = xp.where(is_listed, ends * v_over_h * u * (S - 2.0 * q * v), zero)
        vl = xp.exp(-0.5 * weights)
        level = self._gather(own, index, is_listed, levels.shape[0]) + (1.0 / levels.shape[0]) * vl * weights * xp.sum(
            ends * v_over_h)
        column = xp.sum(xp.where(is_listed | (values == ANY_LEVEL), zero, ends))
        return column, level


class OnColumns(Kernel):
    """``kernel`` applied to some columns of X only: K(X, Z) = kernel.K(X[:, columns], Z[:, columns]), and Kdiag
    likewise (GPflow's ``active_dims``). The continuous part of a mixed model reads the continuous columns through
    it and ignores the categorical ones (``mixed_kernel``).

    Its parameters are the kernel's, under the same keys (its per-feature ones hold one value per column of
    ``columns``); its gradient w.r.t. Z is the kernel's in those columns and exactly 0 in the others; its noise,
    growth and reach are the kernel's (``reach_lengthscales`` says how the reach is given).

    Parameters
    ----------
    kernel : Kernel
        Any agpc kernel of one latent GP (not an ordinal model's).
    columns : sequence of int
        The columns of X it reads, in the order the kernel takes them (1 to ``MAX_COLUMNS`` distinct indices).
    """

    name = "OnColumns"

    def __init__(self, kernel, columns):
        if not isinstance(kernel, Kernel) or kernel.cut_points is not None or kernel.n_latent != 1:
            raise TypeError(f"OnColumns applies an agpc kernel of one latent GP to some columns, got {kernel!r}")
        self.kernel = kernel
        self.columns = _checked_columns(columns, self.name)
        self._keep_given({"kernel": kernel, "columns": columns})

    @classmethod
    def _from_parts(cls, kernel, columns):
        out = cls.__new__(cls)
        out.kernel, out.columns = kernel, columns
        return out

    def _current_values(self):
        return {"kernel": self.kernel, "columns": list(self.columns)}

    @property
    def params(self):
        return self.kernel.params

    @property
    def priors(self):
        return self.kernel.priors

    def parameter_table(self):
        """The kernel's, its per-feature parameters one value per column of ``columns`` (what a model file holds)."""
        size = len(self.columns)
        return {key: replace(p, shape=PER_COLUMN, length=size) if p.shape == PER_DIMENSION else p
                for key, p in self.kernel.parameter_table().items()}

    def with_params(self, params):
        return self._from_parts(self.kernel.with_params(params), self.columns)

    def for_inputs(self, X):
        """The kernel made for X's columns ``columns`` (X: all the features, (n, d))."""
        _check_width(self.name, self.columns, X.shape[1])
        return self._from_parts(self.kernel.for_inputs(self._select(X)), self.columns)

    def spec(self):
        return {"type": self.name, "columns": list(self.columns), "kernel": self.kernel.spec()}

    def __repr__(self):
        return f"{self.name}({self.kernel!r}, columns={list(self.columns)!r})"

    def without_noise(self):
        kernel = self.kernel.without_noise()
        if kernel is self.kernel:
            return self
        out = self._from_parts(kernel, self.columns)
        if hasattr(self, "_given"):  # (a user's kernel's copy: settable, as ``Kernel.without_noise`` keeps it)
            out._keep_given({**self._given_now(), "kernel": kernel})
        out._stripped_noise = kernel._stripped_noise
        return out

    @property
    def growth(self):
        """The kernel's largest, one entry for every column: its columns' weighted squared norm is at most that times
        |x|^2, so the bound holds for the whole row, without X's width (``growth_of_columns`` gives it per column of
        X, 0 at the columns the kernel does not read, which is what the shrink of far rows uses)."""
        growth = self.kernel.growth
        if growth is None or isinstance(growth, numbers.Real):  # (a kernel of one's own may give a plain number)
            return growth
        xp = array_namespace(growth)
        return xp.reshape(xp.max(growth), (1,))

    @property
    def growth_power(self):
        return self.kernel.growth_power

    @property
    def reach_lengthscales(self):
        """The kernel's longest reach, one array entry for every column (broadcast), or None where it has none:
        beyond it the kernel is 0 along each of its columns, without X's width (``reach_of_columns`` gives the reach
        per column of X, which is what the clamp of far inputs uses)."""
        reach = self.kernel.reach_lengthscales
        if reach is None:
            return None
        xp = array_namespace(reach)
        return xp.reshape(xp.max(reach), (1,))

    def growth_of_columns(self, X):
        """The kernel's growth at its columns, 0 at X's others (``Kernel.growth_of_columns``)."""
        return self._spread(self.kernel.growth_of_columns(self._select(X[:0, ...])), X)

    def reach_of_columns(self, X):
        """The kernel's reach at its columns, 0 at X's others (``Kernel.reach_of_columns``)."""
        return self._spread(self.kernel.reach_of_columns(self._select(X[:0, ...])), X)

    def _spread(self, values, X):
        """``values`` (one a column of ``columns``) in their places among X's columns, 0 at the others."""
        return None if values is None else self._widened(values[None, :], X.shape[1])[0, ...]

    @cached_property
    def _span(self):
        """(start, stop) when the columns are one ascending run (taken as a slice of X), else None."""
        start = self.columns[0]
        return (start, start + len(self.columns)) if self.columns == tuple(range(start, start + len(
            self.columns))) else None

    def _select(self, X):
        """X's columns ``columns``, in their order."""
        if self._span is not None:
            return X[:, self._span[0]:self._span[1]]
        return array_namespace(X).take(X, _index(self.columns, X), axis=1)

    def _widened(self, dZ, width):
        """dZ (m, k), a gradient w.r.t. the selected columns of Z, as (m, width): each column in its place, exactly
        0 in the columns the kernel does not read."""
        xp = array_namespace(dZ)
        m, device = dZ.shape[0], array_device(dZ)
        if self._span is not None:
            start, stop = self._span
            return xp.concat([xp.zeros((m, start), dtype=dZ.dtype, device=device), dZ,
                              xp.zeros((m, width - stop), dtype=dZ.dtype, device=device)], axis=1)
        padded = xp.concat([dZ, xp.zeros((m, 1), dtype=dZ.dtype, device=device)], axis=1)
        source = [len(self.columns)] * width  # (the column of zeros)
        for i, j in enumerate(self.columns):
            source[j] = i
        return xp.take(padded, _index(source, dZ), axis=1)

    def K(self, X, Z=None, *, out=None):
        return self.kernel.K(self._select(X), None if Z is None else self._select(Z), out=out)

    def Kdiag(self, X):
        return self.kernel.Kdiag(self._select(X))

    def grads(self, dKmm, dKnm, dKdiag, X, Z, Knm=None, Kmm=None, *, overwrite=False):
        """The kernel's gradients on the selected columns; its gradient w.r.t. Z in Z's width (``_widened``)."""
        out = self.kernel.grads(dKmm, dKnm, dKdiag, None if X is None else self._select(X), self._select(Z),
                                Knm=Knm, Kmm=Kmm, overwrite=overwrite)
        out["Z"] = self._widened(out["Z"], Z.shape[1])
        return out


def mixed_kernel(continuous, categorical, noise=None, priors=None):
    """The kernel of mixed continuous and categorical columns of BoTorch's ``MixedSingleTaskGP`` (and of CoCaBO:
    Ru et al. (2020)): the sum of a kernel of the continuous columns, a kernel of the categorical ones and their
    product, k = k_cont + k_cat + k_cont' k_cat', the product's factors copies of the two with parameters of their
    own. For example ``mixed_kernel(OnColumns(RBF(), [0, 2]), Categorical([1, 3]))``: a sum of three terms (the
    product one of them), with one latent noise, ``noise`` (None: the two kernels' noises, counted once); ``priors``:
    the sum's own ({"noise": prior}), as for :class:`Sum`."""
    for kernel in (continuous, categorical):
        if not isinstance(kernel, Kernel):
            raise TypeError(f"mixed_kernel combines agpc kernels, got {kernel!r}")
    if noise is None:
        noise = _noise_stood_for(continuous) + _noise_stood_for(categorical)
    return Sum(continuous, categorical, Product(copy.deepcopy(continuous), copy.deepcopy(categorical)), noise=noise,
               priors=priors)


ORDINAL_KERNEL = OrdinalKernel.name
KERNELS = {cls.name: cls for cls in (RBF, Matern52, RationalQuadratic, Linear, Sum, Product, Categorical, OnColumns)}
MAX_SPEC_DEPTH = 8  # a file's kernel description nests sums and products at most this deep
# the terms of one sum or product a file's description may list: each read of a combination's parameters walks its
# terms, and loading checks them one by one (20,000 forged terms kept ``agpc inspect`` busy past two minutes; 2,000
# took 9.9 s, an audit of 2026-12-03); an additive kernel of a term a feature has as many as the table's columns
MAX_SPEC_TERMS = 1024
MAX_SPEC_CLASSES = 1 << 16  # an ordinal description's classes (its cut points are K - 1 numbers in the file)


def _template(spec, depth=0):
    """A kernel of the structure and priors ``spec`` describes (parameter values are placeholders). Only names of
    ``KERNELS`` and of agpc.priors.PRIOR_FAMILIES are accepted: a model file never names code. An ordinal model's
    description ("Ordinal": its latent kernel's and its number of classes) is accepted at the top only."""
    if depth == 0 and isinstance(spec, dict) and spec.get("type") == ORDINAL_KERNEL:
        classes = spec.get("classes")
        if set(spec) != {"type", "latent", "classes"} or not (isinstance(classes, int) and not isinstance(
                classes, bool) and 2 <= classes <= MAX_SPEC_CLASSES):
            raise ValueError(f"kernel specification {shown(spec)}: an Ordinal kernel has the fields type, latent and "
                             f"classes (2 to {MAX_SPEC_CLASSES})")
        return OrdinalKernel(_template(spec["latent"], depth + 1), [float(k) for k in range(classes - 1)])
    cls = KERNELS.get(spec.get("type")) if isinstance(spec, dict) and isinstance(spec.get("type"), str) else None
    if cls is None:
        raise ValueError(f"unknown kernel specification {shown(spec)}; known kernels: {sorted(KERNELS)}")
    if depth > MAX_SPEC_DEPTH:
        raise ValueError(f"kernel specification: sums and products nested deeper than the {MAX_SPEC_DEPTH} a model "
                         "file may describe")
    if cls is OnColumns:
        return _on_columns_template(spec, depth)
    combination = issubclass(cls, Combination)
    allowed = {"type", "priors"} | ({"terms"} if combination else set()) | (
        {"columns", "levels"} if cls is Categorical else set())
    if not set(spec) <= allowed or (combination and not isinstance(spec.get("terms"), list)) or (
            cls is Categorical and not (isinstance(spec.get("columns"), list) and isinstance(
                spec.get("levels", []), list))):
        raise ValueError(f"kernel specification {shown(spec)}: expected the fields {sorted(allowed)}")
    priors = spec.get("priors", {})
    if not isinstance(priors, dict) or ("priors" in spec and not priors):
        raise ValueError(f"kernel specification {shown(spec)}: priors must be a non-empty mapping of parameter names")
    # (a categorical kernel's parameters depend on its levels: the template's table, not its class's)
    kernel = Categorical(spec["columns"], levels=spec.get("levels")) if cls is Categorical else None
    checked = _checked_priors({p.key: p for p in (kernel or cls).parameters},
                              {name: prior_from_spec(value) for name, value in priors.items()})
    if combination and len(spec["terms"]) > MAX_SPEC_TERMS:
        raise ValueError(f"kernel specification: a {cls.name} of {len(spec['terms']):,} terms, more than the "
                         f"{MAX_SPEC_TERMS:,} a model file may list")
    if combination:
        # terms hold no noise of their own (``Combination``): a nested combination's is fixed at 0 like a
        # stationary term's (a prior on it is refused, as at construction)
        kernel = cls._from_parts([_template(term, depth + 1).without_noise() for term in spec["terms"]],
                                 {"log_noise": host_array(0.0)}, checked)
        if len(kernel.terms) < 2:
            raise ValueError(f"kernel specification {shown(spec)}: a {cls.name} has at least two terms")
        return kernel
    kernel = kernel or cls()
    kernel.priors = checked
    return kernel


def _on_columns_template(spec, depth):
    """``_template`` of an OnColumns description: exactly its type, its columns (a list, checked as the constructor
    checks them) and its kernel's description (checked as any other, one level deeper)."""
    if set(spec) != {"type", "columns", "kernel"} or not isinstance(spec["columns"], list):
        raise ValueError("kernel specification of an OnColumns kernel: expected exactly the fields columns (a list of "
                         "column indices), kernel and type")
    return OnColumns(_template(spec["kernel"], depth + 1), spec["columns"])


def spec_parameter_table(spec):
    """{key: Parameter} of the kernel ``spec`` describes (what a model file must hold for it)."""
    return _template(spec).parameter_table()


def kernel_from_spec(spec, params):
    """Rebuild a kernel from ``spec()`` and its parameter arrays (used by model loading)."""
    template = _template(spec)
    expected = set(template.parameter_table())
    missing = sorted(expected - set(params))
    if missing:
        raise ValueError(f"kernel parameters missing: {missing}")
    level_key = Categorical.level_parameter.key
    for key, parameter in template.parameter_table().items():  # (one a listed level: as many as its description's)
        if key.endswith(level_key) and tuple(params[key].shape) != (parameter.length,):
            raise ValueError(f"kernel parameter {key}: {parameter.length} values (one a listed level) expected, got "
                             f"shape {tuple(params[key].shape)}")
    return _check_prior_entries(template.with_params({key: params[key] for key in expected}))


# -- the reach of a kernel: far inputs held within it ----------------------------------------------------------------

# A stationary kernel's profile is exactly 0 beyond this many lengthscales (RBF: exp(-r^2 / 2) underflows past
# r = 39; Matern 5/2: past r ~ 330).
KERNEL_REACH = 1e3


def within_reach(kernel, Z, Xc):
    """Xc with each coordinate held within ``KERNEL_REACH`` lengthscales of the inducing points' range. The
    kernel at a point beyond that is 0 to every inducing point, and still is at the clamped point, so the
    predictions do not change; the squared distances of the far point itself overflowed (X * 1e300:
    "overflow encountered in vecdot"). Each column is held at its own reach (``Kernel.reach_of_columns``: the
    longest of the terms that read it); where a term's variance grows with x (a linear one), far rows are first shrunk
    along their direction (``_within_radius``), and only the columns no growing term reads are then clamped. Columns a
    categorical kernel reads (``kernels.categorical_columns``) are not clamped."""
    kernels = [kernel[c] for c in range(Z.shape[0])] if Z.ndim == 3 else [kernel]
    if is_out_of_core(Xc):  # (rows on disk are held a block at a time, as read: ``ep.predict_latent``)
        return Xc
    growths = [(k.growth_of_columns(Xc), k.growth_power) for k in kernels if k.growth is not None]
    if growths:
        Xc = _within_radius(Xc, growths)
    # then the columns that only bounded terms read (a growing term's reach is inf: a shrunk row is not moved)
    reaches = [k.reach_of_columns(Xc) for k in kernels]
    if any(reach is None for reach in reaches):
        return Xc
    xp = array_namespace(Xc)
    largest = float(xp.finfo(Xc.dtype).max)
    reach_limit = largest / (4.0 * KERNEL_REACH)  # reach + |Z| stays finite (|Z| held within half the largest float)
    lower = upper = None
    for c, k in enumerate(kernels):
        Zc = Z[c, ...] if Z.ndim == 3 else Z
        reach = KERNEL_REACH * xp.minimum(reaches[c], reach_limit)
        # (an inducing point on a row of 1.7e308, k-means' centre of that one row, overflowed max(Z) + reach: the
        # audit; a point beyond half the largest float is held there, where every lengthscale's reach spans it)
        low = xp.maximum(xp.min(Zc, axis=0), -0.5 * largest) - reach
        high = xp.minimum(xp.max(Zc, axis=0), 0.5 * largest) + reach
        lower = low if lower is None else xp.minimum(lower, low)
        upper = high if upper is None else xp.maximum(upper, high)
    clamped = xp.minimum(xp.maximum(Xc, lower), upper)
    categorical = categorical_columns(kernel)
    if not categorical:
        return clamped
    # codes are compared for equality only, which cannot overflow: a categorical column is left as it is (a clamp
    # could move a code onto a level, or a listed level of the per-level form off its own lengthscale)
    device = array_device(Xc)
    is_categorical = xp.any(xp.arange(Xc.shape[1], device=device)[:, None] == xp.asarray(
        categorical, dtype=xp.int64, device=device)[None, :], axis=1)
    return xp.where(is_categorical[None, :], Xc, clamped)


def _within_radius(Xc, growths):
    """Xc with each row whose variance could overflow shrunk along its own direction, for kernels whose variance grows
    with x (``growths``: each kernel's ``Kernel.growth`` g, per feature, and ``growth_power`` p, k(x, x) <= (sum_j
    g_j x_j^2 + c)^p: a linear term p = 1, a product of two p = 2): to the length where sum_j g_j x_j^2 is R^2, R =
    limit^(1 / 2p), limit the square root of the dtype's largest number (1e154 in float64, 2e19 in float32), the
    shortest of the kernels'. The latent's mean and variance at t x grow as t^p and t^(2p), so the probit's Phi(mean
    / sqrt(1 + variance)) has converged to its limit along the ray long before; the far row's own k(x, x) and the
    products of the predictive variance overflowed to inf and gave NaN (X * 1e160). The weighted lengths are taken of
    each row scaled by its largest entry and of g by its largest, so that none overflows (a row of entries near the
    largest number had a length of inf, and went to the origin); no host sync."""
    xp = array_namespace(Xc)
    biggest = float(xp.finfo(Xc.dtype).max)
    limit = biggest ** 0.5
    largest = xp.max(xp.abs(Xc), axis=1)
    safe = xp.where(largest > 0, largest, xp.ones_like(largest))
    unit = Xc / safe[:, None]
    allowed = safe  # the largest entry each row may keep
    for growth, power in growths:
        growth = asarray_like(growth, xp, device=array_device(Xc), dtype=Xc.dtype)  # (a plain number too)
        # in units of t, the largest sqrt(g_j): |x / s|_g / t is at most sqrt(d), R / t within the type for every g
        # the type holds, and their quotient, the entry the row may keep, held below half the largest number
        roots = xp.sqrt(growth)
        top = xp.max(roots)
        top = xp.where(top > 0, top, xp.ones_like(top))
        weighted = unit * (roots / top)
        length = xp.sqrt(row_dot(weighted, weighted))
        reach = limit ** (1.0 / (2.0 * power)) / top
        allowed = xp.minimum(allowed, reach / xp.maximum(length, 2.0 * reach / biggest))
    # (a row within every radius as it is, bit for bit; a shrunk one as its direction times what it may keep, never
    # a factor below the smallest number: x * 1e300 at g = 1e307 went to 0)
    return xp.where((allowed < safe)[:, None], unit * allowed[:, None], Xc)


DEFAULT_PRIOR_SCALE = math.sqrt(3.0)
"""Standard deviation of the default priors on log lengthscale and log amplitude (``with_default_priors``)."""


def categorical_columns(kernel, per_level=None):
    """The columns of X that ``kernel`` reads as categories (its ``Categorical`` terms', through ``OnColumns``,
    sums, products, an ordinal model's latent kernel and a class's kernels), sorted: where the inducing points must
    sit on levels (``inputs.start_inducing_points``) whoever built the kernel. ``per_level``: True, only the columns of
    per-level terms; False, only those of exchangeable ones."""
    if isinstance(kernel, Categorical):
        keep = per_level is None or per_level == (kernel.levels is not None)
        return sorted(set(int(j) for j in kernel.columns)) if keep else []
    if isinstance(kernel, OnColumns):
        return sorted(set(int(kernel.columns[j]) for j in categorical_columns(kernel.kernel, per_level)))
    parts = _parts(kernel)
    return sorted(set().union(*(categorical_columns(part, per_level) for part in parts))) if parts else []


def _parts(kernel):
    """The kernels ``kernel`` is made of: a combination's terms, a class's kernels, an ordinal model's latent kernel;
    [] for a leaf."""
    covariance = getattr(kernel, "covariance_kernel", kernel)  # (an ordinal model's: its latent kernel)
    return (getattr(kernel, "terms", None) or getattr(kernel, "kernels", None)
            or ([covariance] if covariance is not kernel else []))


def any_level_columns(kernel):
    """The columns where an inducing point may hold ``ANY_LEVEL``: those of the kernel's per-level categorical terms
    that no other term reads too (an exchangeable one would take the code for a level of its own, an RBF or a
    linear term for a coordinate of -1.7e38); none where a term reads every column (a kernel not of ``OnColumns``)."""
    others = _columns_read_otherwise(kernel)
    if others is None:
        return []
    return [j for j in categorical_columns(kernel, per_level=True) if j not in others]


def tied_parameters(kernel, X):
    """How many hyper-parameters tying the per-feature scales (``ard=False``: each ``PER_FEATURE_SCALES`` parameter
    of each part of the kernel moves by one common factor, ``inference.contract.shared_scale_grads``) removes, on
    rows X (host data, (n, d)): per such parameter, the entries the rows can move, less one. An RBF of d features
    frees d - 1; a per-level ``Categorical`` moves the lengthscales of the listed levels its rows hold and its
    columns' own ones where they hold unlisted values (two rows of listed levels never read the column's): each of
    them in a column of three values or more, one (their sum w_a + w_b, all a pair reads) in a column of two, none
    in a column of one; a kernel's columns are those ``OnColumns`` gives it. What
    Akaike's criterion charges lengthscales per feature (``size_rule.akaike_keeps``): the default mixed kernel has
    two of each (its sum and its product)."""
    X = to_numpy(X)
    if isinstance(kernel, OnColumns):
        return tied_parameters(kernel.kernel, X[:, list(kernel.columns)])
    parts = _parts(kernel)
    if parts:
        return sum(tied_parameters(part, X) for part in parts)
    if isinstance(kernel, Categorical) and kernel.levels is not None:
        held, unlisted, moved = 0, 0, 0
        for j, column in zip(kernel.columns, kernel.levels):
            values, listed = set(X[:, j].tolist()), set(float(level) for level in column)
            if len(values) < 2:  # (one value pairs no two levels: none of the column's lengthscales is read)
                continue
            read = len(listed & values) + bool(values - listed)  # (the weights its values read)
            held, unlisted = held + bool(listed & values), unlisted + bool(values - listed)
            # (two values read their weights only as the one sum w_a + w_b; three or more, each of them)
            moved += read if len(values) > 2 else 1
        return max(moved - bool(held) - bool(unlisted), 0)
    return sum(max(math.prod(to_numpy(value).shape) - 1, 0) for key, value in kernel.params.items()
               if key.endswith(PER_FEATURE_SCALES))


def _columns_read_otherwise(kernel):
    """The set of columns that terms of ``kernel`` other than per-level ``Categorical`` ones read, or None for all of
    them (a term not restricted to columns: a stationary or linear kernel of every feature)."""
    if isinstance(kernel, Categorical):
        return set() if kernel.levels is not None else set(int(j) for j in kernel.columns)
    if isinstance(kernel, OnColumns):
        inner = _columns_read_otherwise(kernel.kernel)
        return set(int(j) for j in kernel.columns) if inner is None else {int(kernel.columns[j]) for j in inner}
    parts = _parts(kernel)
    if not parts:  # (a leaf other than these: a kernel of every column)
        return None
    out = set()
    for part in parts:
        read = _columns_read_otherwise(part)
        if read is None:
            return None
        out |= read
    return out


def with_default_priors(kernel, reference):
    """``kernel`` with the default weak priors (GPClassifier's ``kernel_prior="auto"``) on every parameter that
    has no prior of its own (the user's priors are kept: they win):

    - each lengthscale: log l_j ~ Normal(log r_j, sd sqrt(3)), r_j the reference lengthscale of feature j,
      i.e. of the kernel GPClassifier builds by default, sqrt(d) times the feature's standard deviation (the
      dimension-scaled prior of Hvarfner, Hellsten & Nardi (2024), log l_j ~ Normal(mu_0 + log sqrt(d), sd
      sqrt(3)), here with mu_0 = 0 on features measured in units of their standard deviation);
    - the amplitude (signal variance): log amplitude ~ Normal(0, sd sqrt(3));
    - a linear kernel's slope variances: log v_j ~ Normal(-2 log r_j, sd sqrt(3)), the variance 1 / r_j^2 that
      gives f the prior variance of the stationary default on standardised features (sum_j x_j^2 / (d sd_j^2) ~ 1);
      its bias: log b ~ Normal(0, sd sqrt(3));
    - a categorical kernel's lengthscales (per column, and per level in its per-level form): log l ~ Normal(log
      sqrt(k), sd sqrt(3)) for a kernel of k columns, centred on the default kernel's categorical lengthscale sqrt(k)
      (two rows that differ in every column correlated exp(-1): ``agpc.inputs.default_kernel``);
    - nothing on the latent noise or on a profile's own parameters (a rational quadratic's alpha).

    Every term of a sum or product gets them, and the kernel of an ``OnColumns`` those of its columns' reference
    lengthscales; ``reference`` is a kernel with per-feature ``log_lengthscales`` (host values). Why and what it
    does: docs/small_data_defaults.md."""
    if isinstance(kernel, Combination):
        terms = [with_default_priors(term, reference) for term in kernel.terms]
        return kernel._from_parts(terms, kernel.own, kernel.priors_own)
    if isinstance(kernel, OnColumns):
        return OnColumns._from_parts(with_default_priors(kernel.kernel, _reference_on(reference, kernel.columns)),
                                     kernel.columns)
    names = {p.key for p in kernel.parameters}
    defaults = {}
    centres = [float(c) for c in to_numpy(reference.params["log_lengthscales"]).reshape(-1)]
    if isinstance(kernel, Categorical):  # (its lengthscales count mismatched columns, not a feature's units)
        centre = 0.5 * math.log(len(kernel.columns))
        defaults.update({key: LogNormal(centre, DEFAULT_PRIOR_SCALE) for key in ("log_lengthscales",
                                                                                 "log_level_lengthscales")
                         if key in names})
    elif "log_lengthscales" in names:
        defaults["log_lengthscales"] = LogNormal(centres, DEFAULT_PRIOR_SCALE)
    if "log_amplitude" in names:
        defaults["log_amplitude"] = LogNormal(0.0, DEFAULT_PRIOR_SCALE)
    if "log_variances" in names:  # a linear kernel's slope variances, 1 / r_j^2: Var f(x) = |x / r|^2 ~ 1 (+ bias)
        defaults["log_variances"] = LogNormal([-2.0 * c for c in centres], DEFAULT_PRIOR_SCALE)
    if "log_bias" in names:
        defaults["log_bias"] = LogNormal(0.0, DEFAULT_PRIOR_SCALE)
    with_priors = kernel.with_params(kernel.params)
    with_priors.priors = {**defaults, **kernel.priors}
    return with_priors


def _reference_on(reference, columns):
    """``with_default_priors``' reference of the columns ``columns`` of the data: the reference's lengthscales of
    those columns (a single one, shared by every feature, stays)."""
    centres = to_numpy(reference.params["log_lengthscales"]).reshape(-1)
    if centres.shape[0] == 1:
        return reference
    _check_width(OnColumns.name, columns, centres.shape[0])
    return RBF.from_params({"log_lengthscales": host_array([float(centres[j]) for j in columns])})


class ClassKernels:
    """One kernel per class (multiclass models: one latent GP per class, Villacampa-Calvo & Hernandez-Lobato
    (2017), sec. 2.1).

    ``params`` is one flat dict ("<class>:<key>" -> array) so that the optimisers, which step dicts
    of arrays, need to know nothing about classes; ``kernels[c]`` is class c's own kernel.
    """

    cut_points = None  # (the model's structure as ``Kernel`` declares it: no ordinal cut points)

    def __init__(self, kernels):
        self.kernels = tuple(kernels)
        # (two at least: a model of one latent GP is a single kernel's, so ``n_latent > 1`` says "one a class")
        if len(self.kernels) < 2:
            raise ValueError(f"ClassKernels needs a kernel for each of at least two classes, got {len(self.kernels)}")

    def __len__(self):
        return len(self.kernels)

    @property
    def n_latent(self):
        """One latent GP a class (``Kernel.n_latent``)."""
        return len(self.kernels)

    def latent_kernels(self):
        return self.kernels

    def latent_parts(self, Z):
        """(class c's kernel, Z[c]) for each class c of Z (C, m, d)."""
        return tuple((self.kernels[c], Z[c, ...]) for c in range(Z.shape[0]))

    @property
    def covariance_kernel(self):
        return self

    def __getitem__(self, c):
        return self.kernels[c]

    @property
    def params(self):
        return {f"{c}:{name}": value for c, k in enumerate(self.kernels) for name, value in k.params.items()}

    @property
    def priors(self):
        return {f"{c}:{key}": p for c, k in enumerate(self.kernels) for key, p in k.priors.items()}

    def parameter_table(self):
        return {f"{c}:{key}": p for c, k in enumerate(self.kernels) for key, p in k.parameter_table().items()}

    def with_params(self, params):
        return ClassKernels(
            k.with_params({name: params[f"{c}:{name}"] for name in k.params}) for c, k in enumerate(self.kernels)
        )

    def for_inputs(self, X):
        return ClassKernels(k.for_inputs(X) for k in self.kernels)

    def __repr__(self):
        return f"ClassKernels({list(self.kernels)!r})"
