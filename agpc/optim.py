"""Optimisers for hyper-parameters and inducing points, written against the array API.

Parameters and gradients are dicts of arrays that stay on the device; only the step logic is here.
All optimisers *ascend* (they maximise log Z_q or an ELBO).
"""

from __future__ import annotations

from .backend import array_namespace

__all__ = ["Rprop"]


class Rprop:
    """Per-parameter adaptive steps of seed 000 (Appendix A.6, batch mode).

    Each entry moves by its own step size in the direction of its gradient's sign; the step grows by
    2% while the sign stays the same and halves when it flips. Sign-based, so it needs no learning
    rate matched to the scale of the gradient (which grows with n).
    """

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

    def snapshot(self):
        return (dict(self.steps), dict(self.previous_sign))

    def restore(self, state):
        steps, previous = state
        self.steps = dict(steps)
        self.previous_sign = dict(previous)
