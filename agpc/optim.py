"""Optimisers for hyper-parameters and inducing points, written against the array API.

Parameters and gradients are dicts of arrays that stay on the device; only the step logic is here.
All optimisers *ascend* (they maximise log Z_q or an ELBO).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize

from .backend import array_device, array_namespace, asarray_like, to_numpy

__all__ = ["Rprop", "Adadelta", "Adam", "OPTIMIZERS", "SNAPSHOT_ENTRIES", "written_by", "bounded_step", "lbfgsb_ascent"]


class Rprop:
    """Per-parameter adaptive steps after Hernandez-Lobato & Hernandez-Lobato (2016) (Appendix A.6, batch mode).

    Each entry moves by its own step size in the direction of its gradient's sign; the step grows by
    2% while the sign stays the same and halves when it flips. The seed multiplies the gradient by such
    a rate; sign-based, this needs no first rate matched to the scale of the gradient (which grows with n).
    """

    name = "rprop"  # (as ``GPClassifier(optimizer=...)`` names it)
    grows_steps = True  # a bounded entry held at its bound must not grow its step (``bounded_step``)
    per_entry_state = True  # each entry's state its own: an entry left out of some steps (``tied_steps``) is unharmed

    def __init__(self, initial_steps, increase=1.02, decrease=0.5):
        self.steps = dict(initial_steps)
        self.increase = increase
        self.decrease = decrease
        self.previous_sign = {}

    def step(self, params, grads):
        out = {}
        for name, value in params.items():
            xp = array_namespace(value)
            sign = xp.sign(grads[name])
            if name in self.previous_sign:
                agree = sign * self.previous_sign[name]
                ones = xp.ones_like(agree)
                factor = xp.where(agree > 0, self.increase * ones, xp.where(agree < 0, self.decrease * ones, ones))
                self.steps[name] = self.steps[name] * factor
            self.previous_sign[name] = sign
            out[name] = value + self.steps[name] * sign
        return out

    def scale_steps(self, factor):
        self.steps = {k: v * factor for k, v in self.steps.items()}

    def grow_steps(self, factor):
        """Rprop's steps grow by themselves while their gradients keep their signs: nothing to do here."""
        return False

    def snapshot(self):
        return (dict(self.steps), dict(self.previous_sign))

    def restore(self, state):
        steps, previous = state
        self.steps = dict(steps)
        self.previous_sign = dict(previous)

    @staticmethod
    def state_problem(state):
        """What is wrong with a ``snapshot`` read from a file (laid out as this run's: ``checkpoint_rules``), or None:
        steps are positive, and the last signs are signs."""
        steps, previous = state
        for name, value in steps.items():
            host = _host(value)
            if np.any(host <= 0):  # (not bounded above: a step grows 2% an iteration while its gradient keeps its
                # sign, past any bound in a long enough fit)
                return f"steps.{name}: a step of {host[host <= 0][0]:.6g} (Rprop's steps are positive)"
        for name, value in previous.items():
            if not np.all(np.isin(_host(value), (-1.0, 0.0, 1.0))):
                return f"signs.{name}: not signs (-1, 0, 1)"
        return None


class _StepsInUnits:
    """Adam's and Adadelta's steps of some entries in units of their own (``steps_in_units``)."""

    units = {}  # {name: unit}; none by default (each optimiser sets its own in ``steps_in_units``)

    def steps_in_units(self, units):
        """Step the entries of ``units`` ({name: array broadcast to the parameter's shape}) in those units: the
        optimiser works on x' = x / unit (its gradient unit * dx), so a step of about ``learning_rate`` in x' moves x
        by about ``learning_rate`` units. Why: Adam's and Adadelta's steps have a scale of their own (the learning
        rate; Adadelta's sqrt(eps) at first), where Rprop's first steps are set from the parameter's spread
        (``contract.initial_steps``). Inducing points stepped in absolute terms left the data behind where the
        features were small (make_banana times 1e-3: a step of 0.01 is three times the data's range; SVI's
        accuracy 0.49), so the engine gives Z the spread of its first points as its unit. The units are the engine's,
        from the points it was built with, not part of ``snapshot``."""
        self.units = dict(units)


class Adadelta(_StepsInUnits):
    """Adadelta (Zeiler 2012), as Hernandez-Lobato & Hernandez-Lobato (2016) uses for stochastic gradients: rho 0.9, eps
    1e-5.

    Per entry: E[g^2] <- rho E[g^2] + (1 - rho) g^2;  delta = sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) g;
    E[dx^2] <- rho E[dx^2] + (1 - rho) delta^2;  x <- x + learning_rate * delta  (ascent).
    Unit-consistent: the step does not scale with the gradient, so n / |M| scaling needs no tuning.
    """

    name = "adadelta"
    per_entry_state = True  # (as ``Rprop``'s)

    def __init__(self, learning_rate=1.0, rho=0.9, eps=1e-5):
        self.learning_rate = self.initial_learning_rate = learning_rate
        self.rho = rho
        self.eps = eps
        self.mean_sq_grad = {}
        self.mean_sq_step = {}

    def step(self, params, grads):
        # Written for few array operations (each one is a kernel launch on a GPU): no zero state is built
        # when there is none yet, and the ratio of the two root-mean-squares takes one square root.
        out = {}
        rho, eps = self.rho, self.eps
        for name, value in params.items():
            xp = array_namespace(value)
            unit = self.units.get(name)
            g = grads[name] if unit is None else grads[name] * unit
            msg, msd = self.mean_sq_grad.get(name), self.mean_sq_step.get(name)
            msg = (1.0 - rho) * (g * g) if msg is None else rho * msg + (1.0 - rho) * (g * g)
            delta = g * xp.sqrt((eps if msd is None else msd + eps) / (msg + eps))
            self.mean_sq_grad[name] = msg
            self.mean_sq_step[name] = (1.0 - rho) * (delta * delta) if msd is None else (
                rho * msd + (1.0 - rho) * (delta * delta))
            step = delta if self.learning_rate == 1.0 else self.learning_rate * delta
            out[name] = value + (step if unit is None else unit * step)
        return out

    def scale_steps(self, factor):
        self.learning_rate *= factor

    def grow_steps(self, factor):
        """The learning rate times ``factor``, at most the one it was built with; whether it grew."""
        return _grow_rate(self, factor)

    def snapshot(self):
        return (self.learning_rate, dict(self.mean_sq_grad), dict(self.mean_sq_step))

    def restore(self, state):
        self.learning_rate, msg, msd = state
        self.mean_sq_grad, self.mean_sq_step = dict(msg), dict(msd)

    def state_problem(self, state):
        """``Rprop.state_problem``'s check of a snapshot: the learning rate positive, the running means of squares
        not negative."""
        learning_rate, msg, msd = state
        return _rate_problem(learning_rate) or _squares_problem({**msg, **{f"{k} (steps)": v
                                                                                 for k, v in msd.items()}})


class Adam(_StepsInUnits):
    """Adam (Kingma & Ba 2015) for ascent: steps of about ``learning_rate`` per entry, bias-corrected."""

    name = "adam"
    per_entry_state = False  # the bias correction counts the calls, all entries together

    def __init__(self, learning_rate=0.01, beta1=0.9, beta2=0.999, eps=1e-8):
        self.learning_rate = self.initial_learning_rate = learning_rate
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.t = 0
        self.m = {}
        self.v = {}

    def step(self, params, grads):
        self.t += 1
        out = {}
        for name, value in params.items():
            xp = array_namespace(value)
            unit = self.units.get(name)
            g = grads[name] if unit is None else grads[name] * unit
            m, v = self.m.get(name), self.v.get(name)
            m = (1.0 - self.beta1) * g if m is None else self.beta1 * m + (1.0 - self.beta1) * g
            v = (1.0 - self.beta2) * (g * g) if v is None else self.beta2 * v + (1.0 - self.beta2) * (g * g)
            self.m[name], self.v[name] = m, v
            # bias corrections folded into host scalars: lr m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps)
            rate = self.learning_rate / (1.0 - self.beta1**self.t)
            v_scale = 1.0 / (1.0 - self.beta2**self.t)
            step = rate * m / (xp.sqrt(v_scale * v) + self.eps)
            out[name] = value + (step if unit is None else unit * step)
        return out

    def scale_steps(self, factor):
        self.learning_rate *= factor

    def grow_steps(self, factor):
        """The learning rate times ``factor``, at most the one it was built with; whether it grew."""
        return _grow_rate(self, factor)

    def snapshot(self):
        return (self.learning_rate, self.t, dict(self.m), dict(self.v))

    def restore(self, state):
        self.learning_rate, self.t, m, v = state
        self.m, self.v = dict(m), dict(v)

    def state_problem(self, state):
        """``Rprop.state_problem``'s check of a snapshot: the learning rate positive, a count of steps not negative,
        the second moments not negative (a negative one made sqrt(v) NaN)."""
        learning_rate, t, _, v = state
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            return f"t: {t!r}, not a count of steps"
        return _rate_problem(learning_rate) or _squares_problem(v)


def _host(value):
    """A snapshot's entry as a flat float64 NumPy array."""
    return np.reshape(np.asarray(to_numpy(value), dtype=np.float64), (-1,))


def _rate_problem(learning_rate):
    """What is wrong with a learning rate read from a file, or None: it is positive (not bounded by this run's: a
    resume may lower ``learning_rate``, and the checkpoint's goes on)."""
    if not learning_rate > 0.0:
        return f"learning rate: {learning_rate!r}, not positive"
    return None


def _squares_problem(means):
    """What is wrong with running means of squares read from a file ({name: array}), or None."""
    for name, value in means.items():
        if np.any(_host(value) < 0):
            return f"{name}: a negative mean of squares"
    return None


def _grow_rate(optimizer, factor):
    """An optimiser's learning rate grown by ``factor`` back toward its initial one (the guard's restoration)."""
    if optimizer.learning_rate >= optimizer.initial_learning_rate:
        return False
    optimizer.learning_rate = min(optimizer.learning_rate * factor, optimizer.initial_learning_rate)
    return True


OPTIMIZERS = {"adadelta": Adadelta, "adam": Adam}
# The entries of each built-in optimiser's ``snapshot``: distinct, so that a checkpoint's state names the optimiser
# that wrote it (``written_by``).
SNAPSHOT_ENTRIES = {"rprop": 2, "adadelta": 3, "adam": 4}


def written_by(state):
    """The name of the built-in optimiser whose ``snapshot`` has ``state``'s layout (a tuple or list of its number
    of entries), or None: a resume under another optimiser is said by name, not as a malformed state."""
    if not isinstance(state, (tuple, list)):
        return None
    return next((name for name, entries in SNAPSHOT_ENTRIES.items() if entries == len(state)), None)


def bounded_step(optimizer, params, grads, lower, finite_exp=()):
    """``optimizer.step(params, grads)`` with some entries bounded below (``lower``: {name: least value}): the
    stepped value is raised to its bound; an entry named in ``finite_exp`` (a log whose exp scales the kernel's
    values: ``kernels.value_scale_keys``) stepped past the largest log of its dtype is NaN. Its exp would be inf: a
    model of every covariance inf, or a flat one whose log Z n log(1/2) is finite, which the guard took, and whose
    next gradient (inf * 0) was NaN; a NaN makes the step's log Z NaN, which the guard goes back from and halves
    (Adam at learning_rate=1e3 stepped a latent noise's log to 767 and ended with a model of NaN probabilities).
    For an optimiser whose steps grow while a gradient keeps its sign (``Rprop``: ``grows_steps``) this is a
    projected gradient step: where an entry is at or below its bound and its gradient points further down, the
    gradient is taken as 0, so that its step does not grow while it is held (a step grown so would throw the entry
    far up once the gradient turns). Adam's and Adadelta's steps do not grow so: they need only the clip. Entries
    without a bound step as they would. (One array operation an entry for the clip, three more for the projection,
    two for each ``finite_exp`` entry: the step budgets of tests/test_step_budgets.py count them.)"""
    bounded = [name for name in lower if name in params]
    if not bounded:
        return _finite_exp(optimizer.step(params, grads), finite_exp)
    if getattr(optimizer, "grows_steps", False):
        grads = dict(grads)
        for name in bounded:
            xp = array_namespace(params[name])
            grads[name] = xp.where(params[name] > lower[name], grads[name], xp.maximum(grads[name], 0.0))
    out = optimizer.step(params, grads)
    for name in bounded:
        out[name] = array_namespace(out[name]).maximum(out[name], lower[name])
    return _finite_exp(out, finite_exp)


def _finite_exp(params, names):
    """``params`` with each entry named in ``names`` NaN where it is beyond the largest log of its dtype
    (``bounded_step``): two array operations an entry, on the device."""
    for name in names:
        if name in params:
            xp = array_namespace(params[name])
            ceiling = math.log(float(xp.finfo(params[name].dtype).max))
            params[name] = xp.where(params[name] <= ceiling, params[name], xp.nan)
    return params


def lbfgsb_ascent(params, value_and_grads, maxfun, lower=None, units=None):
    """Maximise f over a dict of arrays with scipy's L-BFGS-B, at most ``maxfun`` evaluations; ``lower``:
    {name: least value} for the entries bounded below (L-BFGS-B's own bounds, of entries without ``units``);
    ``units``: {name: array broadcast to the entry's shape}, entries L-BFGS-B moves in those units (x / unit, as
    ``Adam.steps_in_units``): its first step has unit length whatever the scale, which sent inducing points on features
    of 1e-200 out to O(1), 1e200 lengthscales away, and vi-JJ diverged at its first step.

    For a handful of hyper-parameters (Izmailov & Kropotov (2017): maxfun = 5 per outer iteration). The optimiser runs
    on the host: the arrays are flattened there and put back in their own namespace and device.
    ``value_and_grads(dict) -> (value, dict of gradients)``. Returns the new dict (the old one if the
    optimiser produced non-finite values).
    """
    names = list(params)
    shapes = [tuple(params[k].shape) for k in names]
    sizes = [int(np.prod(s)) if s else 1 for s in shapes]
    units = units or {}
    scale = np.concatenate([np.ravel(np.broadcast_to(to_numpy(units[k]), shape)) if k in units else np.ones(size)
                            for k, shape, size in zip(names, shapes, sizes)])

    def unflatten(vector):
        out, offset = {}, 0
        vector = vector * scale
        for name, shape, size in zip(names, shapes, sizes):
            xp = array_namespace(params[name])
            piece = asarray_like(np.reshape(vector[offset:offset + size], shape), xp,
                                 device=array_device(params[name]), dtype=params[name].dtype)
            out[name] = piece
            offset += size
        return out

    def objective(vector):
        value, grads = value_and_grads(unflatten(vector))
        flat = np.concatenate([np.ravel(to_numpy(grads[k])) for k in names])
        return -float(value), -flat * scale

    x0 = np.concatenate([np.ravel(to_numpy(params[k])) for k in names]) / scale
    lower = lower or {}
    bounds = None if not set(lower) & set(names) else [
        (lower.get(name), None) for name, size in zip(names, sizes) for _ in range(size)]
    result = scipy.optimize.minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                                     options={"maxfun": maxfun})
    if not np.all(np.isfinite(result.x)):
        return dict(params)
    return unflatten(result.x)
