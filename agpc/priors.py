"""Prior densities on kernel hyper-parameters, from a fixed table of families (plain data, never code).

A prior is placed on a parameter's *constrained* value theta (a lengthscale, a variance: the number a user
thinks in), but the optimisers climb the *unconstrained* value u that the kernel stores (u = log theta). The
term added to the objective is therefore the log density of u,

    log p_u(u) = log p_theta(theta(u)) + log |d theta / d u|        (theta = exp(u): log |.| = u),

Jacobian included, as GPflow does for a prior on the constrained value (``Parameter.log_prior_density``).
Why: the climbed objective is then a proper log density in the coordinates that move, so a MAP estimate is
the mode of the posterior of u and does not depend on a coordinate the optimiser never sees; the Laplace or
MCMC treatment issue 19 may add later needs exactly this density. (For a Gamma(shape a, rate b) prior on a
lengthscale the climbed mode is theta = a / b, not the density's own mode (a - 1) / b.)

A prior is saved as ``{"family": name, <number>: value, ...}`` (``spec``) and rebuilt only from
``PRIOR_FAMILIES`` by ``prior_from_spec``: a model file names a family, never an import path.
"""

from __future__ import annotations

import math

from .backend import array_namespace

__all__ = ["Prior", "Gamma", "LogNormal", "PRIOR_FAMILIES", "prior_from_spec"]


class Prior:
    """A density on a positive value theta. Subclasses set ``family`` and ``numbers`` (the names of their
    arguments, in order; ``positive``: those that must be positive) and define ``log_density(theta)`` and
    ``dlog_density(theta)`` (d/d theta), both elementwise on arrays of any namespace."""

    family = "Prior"
    numbers = ()
    positive = ()

    def __init__(self, *values):
        if len(values) != len(self.numbers):
            raise TypeError(f"{self.family} takes {len(self.numbers)} numbers ({', '.join(self.numbers)})")
        for name, value in zip(self.numbers, values):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
                    name in self.positive and not value > 0):
                kind = "a positive finite" if name in self.positive else "a finite"
                raise ValueError(f"{self.family} prior: {name} must be {kind} number, got {value!r}")
            setattr(self, name, float(value))

    def log_density(self, theta):
        raise NotImplementedError

    def dlog_density(self, theta):
        raise NotImplementedError

    def spec(self):
        """Plain data: the family's name and its numbers."""
        return {"family": self.family, **{name: getattr(self, name) for name in self.numbers}}

    def __eq__(self, other):
        return type(other) is type(self) and other.spec() == self.spec()

    def __hash__(self):
        return hash(tuple(self.spec().items()))

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
    """log theta ~ N(mu, sigma^2) (``loc`` mu, ``scale`` sigma)."""

    family = "LogNormal"
    numbers = ("loc", "scale")
    positive = ("scale",)

    def __init__(self, loc, scale):
        super().__init__(loc, scale)

    def log_density(self, theta):
        xp = array_namespace(theta)
        log_theta = xp.log(theta)
        z = (log_theta - self.loc) / self.scale
        return -0.5 * z * z - math.log(self.scale) - 0.5 * math.log(2.0 * math.pi) - log_theta

    def dlog_density(self, theta):
        xp = array_namespace(theta)
        return -((xp.log(theta) - self.loc) / (self.scale * self.scale) + 1.0) / theta


PRIOR_FAMILIES = {cls.family: cls for cls in (Gamma, LogNormal)}


def prior_from_spec(spec):
    """The prior ``spec`` describes: a family of ``PRIOR_FAMILIES`` and exactly its numbers. Anything else (an
    unknown family, a missing or extra number, a number out of range) is one ``ValueError``."""
    family = spec.get("family") if isinstance(spec, dict) else None
    cls = PRIOR_FAMILIES.get(family) if isinstance(family, str) else None
    if cls is None:
        raise ValueError(f"unknown prior {spec!r}; known families: {sorted(PRIOR_FAMILIES)}")
    if set(spec) != {"family", *cls.numbers}:
        raise ValueError(f"prior {spec!r}: a {family} prior has exactly the numbers {list(cls.numbers)}")
    return cls(*(spec[name] for name in cls.numbers))
