"""Prior densities on kernel hyper-parameters, from a fixed table of families (plain data, never code).

A prior is placed on a parameter's *constrained* value theta (a lengthscale, a variance: the number a user
thinks in), but the optimisers climb the *unconstrained* value u that the kernel stores (u = log theta). The
term added to the objective is therefore the log density of u,

    log p_u(u) = log p_theta(theta(u)) + log |d theta / d u|        (theta = exp(u): log |.| = u),

Jacobian included, as GPflow does for a prior on the constrained value (``Parameter.log_prior_density``).
Why: the climbed objective is then a proper log density in the coordinates that move, so a MAP estimate is
the mode of the posterior of u and does not depend on a coordinate the optimiser never sees; a Laplace or
MCMC treatment added later would need exactly this density. (For a Gamma(shape a, rate b) prior on a
lengthscale the climbed mode is theta = a / b, not the density's own mode (a - 1) / b.)

A prior is saved as ``{"family": name, <number>: value, ...}`` (``spec``) and rebuilt only from
``PRIOR_FAMILIES`` by ``prior_from_spec``: a model file names a family, never an import path.

A family may let some of its numbers (``per_entry``) be a list, one value per entry of a per-dimension
parameter: the LogNormal's ``loc`` is how GPClassifier's default prior (``kernel_prior="auto"``,
docs/small_data_defaults.md) centres each lengthscale on its own feature's scale.
"""

from __future__ import annotations

import math

from .backend import array_device, array_namespace, asarray_like, host_array
from .checkpoint_rules import LOG_RANGE
from .untrusted import shown

__all__ = ["Prior", "Gamma", "LogNormal", "PRIOR_FAMILIES", "prior_from_spec"]


def _is_finite_number(value):
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


class Prior:
    """A density on a positive value theta. Subclasses set ``family`` and ``numbers`` (the names of their
    arguments, in order; ``positive``: those that must be positive; ``per_entry``: those that may also be a
    non-empty list, one value per entry of a per-dimension parameter) and define ``log_density(theta)`` and
    ``dlog_density(theta)`` (d/d theta), both elementwise on arrays of any namespace."""

    family = "Prior"
    numbers = ()
    positive = ()
    per_entry = ()

    def __init__(self, *values):
        if len(values) != len(self.numbers):
            raise TypeError(f"{self.family} takes {len(self.numbers)} numbers ({', '.join(self.numbers)})")
        for name, value in zip(self.numbers, values):
            listed = name in self.per_entry and isinstance(value, (list, tuple))
            entries = list(value) if listed else [value]
            if not entries or not all(_is_finite_number(v) and (name not in self.positive or v > 0) for v in entries):
                kind = "a positive finite" if name in self.positive else "a finite"
                also = " or a non-empty list of them (one per entry)" if name in self.per_entry else ""
                raise ValueError(f"{self.family} prior: {name} must be {kind} number{also}, got {shown(value)}")
            setattr(self, name, tuple(float(v) for v in entries) if listed else float(value))
        lengths = {len(getattr(self, name)) for name in self.per_entry if isinstance(getattr(self, name), tuple)}
        if len(lengths) > 1:
            raise ValueError(f"{self.family} prior: its per-entry lists have different lengths {sorted(lengths)}")

    @property
    def entries(self):
        """How many entries the numbers describe: the length of its per-entry lists, or 1 (one value for all)."""
        return max((len(getattr(self, name)) for name in self.per_entry if isinstance(getattr(self, name), tuple)),
                   default=1)

    def _number(self, name, theta):
        """The number ``name`` as theta's arithmetic takes it: a float, or a per-entry list as an array of
        theta's namespace, device and type."""
        value = getattr(self, name)
        if not isinstance(value, tuple):
            return value
        return asarray_like(host_array(value), array_namespace(theta), device=array_device(theta), dtype=theta.dtype)

    def log_density(self, theta):
        raise NotImplementedError

    def dlog_density(self, theta):
        raise NotImplementedError

    def spec(self):
        """Plain data: the family's name and its numbers."""
        return {"family": self.family, **{name: (list(value) if isinstance(value, tuple) else value)
                                           for name in self.numbers for value in [getattr(self, name)]}}

    def __eq__(self, other):
        return type(other) is type(self) and other.spec() == self.spec()

    def __hash__(self):
        return hash((self.family, *(getattr(self, name) for name in self.numbers)))

    def __repr__(self):
        return f"{self.family}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.numbers)})"


class Gamma(Prior):
    """Gamma(shape a, rate b): p(theta) = b^a theta^(a-1) exp(-b theta) / Gamma(a), mean a / b."""

    family = "Gamma"
    numbers = positive = ("shape", "rate")

    def __init__(self, shape, rate):
        super().__init__(shape, rate)

    def log_density(self, theta):
        xp = array_namespace(theta)
        a, b = self.shape, self.rate
        return a * math.log(b) - math.lgamma(a) + (a - 1.0) * xp.log(theta) - b * theta

    def dlog_density(self, theta):
        return (self.shape - 1.0) / theta - self.rate


class LogNormal(Prior):
    """log theta ~ N(mu, sigma^2) (``loc`` mu, ``scale`` sigma). ``loc`` may be a list, one mu per entry of a
    per-dimension parameter (a lengthscale per feature, each centred on its own feature's scale). On the
    stored u = log theta the climbed density (Jacobian included, module docstring) is exactly N(u; mu, sigma^2)."""

    family = "LogNormal"
    numbers = ("loc", "scale")
    positive = ("scale",)
    per_entry = ("loc",)

    def __init__(self, loc, scale):
        super().__init__(loc, scale)
        locs = self.loc if isinstance(self.loc, tuple) else (self.loc,)
        if any(abs(v) > LOG_RANGE for v in locs):  # (1e300: z^2 overflowed in every density, NumPy's warning
            # at each step: the hostile-input audit of 2026-12-04)
            raise ValueError(f"{self.family} prior: loc is a log, of a parameter a float64 holds: within "
                             f"+-{LOG_RANGE:.6g}, got {shown(loc)}")

    def log_density(self, theta):
        xp = array_namespace(theta)
        log_theta = xp.log(theta)
        z = (log_theta - self._number("loc", theta)) / self.scale
        return -0.5 * z * z - math.log(self.scale) - 0.5 * math.log(2.0 * math.pi) - log_theta

    def dlog_density(self, theta):
        xp = array_namespace(theta)
        return -((xp.log(theta) - self._number("loc", theta)) / (self.scale * self.scale) + 1.0) / theta


PRIOR_FAMILIES = {cls.family: cls for cls in (Gamma, LogNormal)}


def prior_from_spec(spec):
    """The prior ``spec`` describes: a family of ``PRIOR_FAMILIES`` and exactly its numbers. Anything else (an
    unknown family, a missing or extra number, a number out of range) is one ``ValueError``."""
    family = spec.get("family") if isinstance(spec, dict) else None
    cls = PRIOR_FAMILIES.get(family) if isinstance(family, str) else None
    if cls is None:
        raise ValueError(f"unknown prior {shown(spec)}; known families: {sorted(PRIOR_FAMILIES)}")
    if set(spec) != {"family", *cls.numbers}:
        raise ValueError(f"prior {shown(spec)}: a {family} prior has exactly the numbers {list(cls.numbers)}")
    return cls(*(spec[name] for name in cls.numbers))
