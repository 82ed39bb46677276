"""Minibatch SEP and ADF move their inducing points once every ``TIED_INDUCING_EVERY`` steps (``engines.EPEngine``).

Each move carries the tied factor to the new points (``posterior.moved_factor``: three m x m factorisations and some
ten O(m^3) products; a factor held as it is while Z moves stands for other points, docs/methods/sep.md), which at
m = 200 and minibatches of 200 is half as long as the rest of the step, and two thirds as long at m = 500. So Z moves on
one step in ``TIED_INDUCING_EVERY``, by the mean of the gradients in Z of the steps since it last moved (held in the
engine's state between moves, and in its checkpoints), and the factor is carried then; the kernel's parameters step
every step. The factor is never held at points it does not describe: Z takes one optimiser step per
``TIED_INDUCING_EVERY`` minibatches, on a gradient of that many times their rows.

Below ``engines`` (which alone imports it); it imports nothing of agpc's but ``backend``, ``checkpoint_rules`` and
``posterior``.
"""

from __future__ import annotations

from ..backend import prefers_inverses
from ..checkpoint_rules import check_held_gradient
from .posterior import Factor, moved_factor

__all__ = ["TIED_INDUCING_EVERY", "TiedFactorSteps", "held_step", "held_arrays", "held_from_arrays"]

TIED_INDUCING_EVERY = 8
"""Chosen in docs/methods/sep.md ("Inducing points that move every few steps"; benchmarks/inducing_every.py): on all
the airline rows (m = 200, minibatches of 200) SEP moving Z every 8th step took 1.3-1.7 times the steps of every step
in 20-120 s and reached a test NLL 0.0002-0.0013 lower on each of 2-3 seeds a budget (ADF: 0.0006 and 0.0000), every
2nd or 4th step none lower than every 8th by more than 0.0002; at m = 500, 70 ms a step against 121 and NLL 0.6124
against 0.6146 after 60 s."""


class TiedFactorSteps:
    """What an EP-family engine (``engines.EPEngine``: its ``minibatch``, ``cavity``, ``names``, ``factor_rows``,
    ``state``, ``optimizer``, ``jitter`` and ``holds_inducing``) does with its tied factor when its hyper-parameter
    steps move Z."""

    # Minibatch SEP / ADF: carry the tied factor to the inducing points after each step that moves them (one step in
    # ``TIED_INDUCING_EVERY``). The factor is refreshed at rows / n of itself a step (an epoch to renew it), while
    # each move moves every inducing point; held as it is in u-space, it would describe the old points
    # (docs/methods/sep.md, "Inducing points that move"). Batch SEP / ADF renew half the factor a step and keep it
    # as it is; data-parallel shards (``factor_rows``) and multiclass factors are not carried.
    carries_factor = True

    def _moves_factor(self):
        return (self.carries_factor and self.minibatch and not self.cavity.own_sites and "Z" in self.names
                and self.factor_rows is None and isinstance(self.state["factor"], Factor))

    def _holds_inducing(self):
        """Whether Z is held between moves (``held_step``): where the tied factor is carried (``_moves_factor``),
        the period is above 1, the optimiser keeps each entry's state by itself (``per_entry_state``: Adadelta, Rprop;
        Adam's bias correction counts its calls, all entries together, and would correct a held Z's moments as though
        it had stepped at each call), and the engine ``holds_inducing`` (not a ``partial_fit`` stream's: each call one
        step on everything it learns, and a model file, which a stream may go on from, keeps no optimiser state)."""
        return (TIED_INDUCING_EVERY > 1 and getattr(self, "holds_inducing", True) and self._moves_factor()
                and getattr(self.optimizer, "per_entry_state", False))

    @property
    def step_time_window(self):
        """How many of the last steps the time budget's estimate of the next one looks at (``hooks.TimeBudget``):
        where Z is held, a period of them (the step that moves Z, and carries the factor, is the slowest)."""
        return TIED_INDUCING_EVERY if self._holds_inducing() else 1

    def _names_stepped(self, grads):
        """(the parameters this step moves, their gradients): all of ``names``, but where Z is held between moves
        (``_holds_inducing``) Z only every few steps, the state holding its gradients between (``held_step``)."""
        if not self._holds_inducing():
            return self.names, grads
        names, grads, self.state["held_inducing"] = held_step(self.names, grads, self.state.get("held_inducing"))
        return names, grads

    def _carry_factor(self, kernel, Z_old, q):
        """The state's tied factor carried from ``Z_old`` to the state's Z (same ``kernel``), with the step's q at
        ``Z_old``: its L_K, and L_K^-1 where the step formed it."""
        self.state["factor"] = moved_factor(kernel, Z_old, self.state["Z"], self.state["factor"], jitter=self.jitter,
                                            L_K=getattr(q, "L_K", None),
                                            L_K_inv=q.L_K_inv if q is not None and prefers_inverses(Z_old) else None)


def held_step(names, grads, held):
    """(the parameters a step moves, their gradients, the gradient in Z held after it) for a fit that holds Z
    between moves (``TiedFactorSteps._holds_inducing``): all of ``names`` on the step that moves Z, by the mean of its
    gradients since it last moved (``held``: their (sum, count), or None; a count at or past the period moves it at
    once), else the others, Z's gradient added to ``held``."""
    total, steps = (grads["Z"], 1) if held is None else (held[0] + grads["Z"], held[1] + 1)
    if steps < TIED_INDUCING_EVERY:
        return tuple(name for name in names if name != "Z"), grads, (total, steps)
    return names, dict(grads, Z=total / steps), None


def held_arrays(held):
    """The held gradient as a checkpoint stores it: {"gradient", "steps"}, or None between no two moves."""
    return None if held is None else {"gradient": held[0], "steps": int(held[1])}


def held_from_arrays(saved, Z, holds, refuse):
    """The held gradient a checkpoint stored (``held_arrays``), checked (``checkpoint_rules.check_held_gradient``):
    None for none (a checkpoint of a step that moved Z, or from before Z was held between moves). ``holds``: whether
    this run's engine holds one (minibatch SEP / ADF carrying their factor); a held gradient is refused otherwise."""
    if saved is None:
        return None
    if not holds:
        raise refuse("engine.held_inducing: this run's steps hold no gradient in Z between moves (minibatch SEP / "
                      "ADF with learned inducing points do)")
    check_held_gradient(saved, Z, "engine.held_inducing", refuse)
    return saved["gradient"], saved["steps"]
