"""The training guard: what makes a step not taken, what is done about it, and the record of both.

A step (``training.Trainer.step``) is evaluated before anything is committed; the guard then looks at what the
evaluation says of q and of the objective:

- **q improper**: log Z (or the ELBO) is not finite. The passes factorise without host checks, so a Cholesky factor
  that failed (I + S not positive definite, the prior's Kmm not factorising) arrives as NaN here.
- **a jump of log Z** (from the second step on: the first has no step before it to be judged against): the
  estimate lies farther from the median of the last ``JUMP_WINDOW`` taken steps' estimates
  than ``JUMP_FACTOR`` times the larger of that median's size and the spread of those estimates (1.4826 times
  their median absolute deviation, the noise of a minibatch estimate), *and* it is larger than ``JUMP_PER_ROW``
  nats for each row the model stands for: an order of magnitude, and more than a probit term of a row (log Phi(z)
  is -10 at z = -4.2) could make it. (The second-epoch break of minibatch EP on the airline data went from -33,000
  to +1.5e7, 290 nats a row.) Both are needed: a minibatch estimate of rows sorted by class legitimately moves by
  two orders of magnitude from one minibatch to the next, at a few nats a row. (The test waited for three taken
  steps until 2026-12-04: SVI at learning_rate=1e3 on 2,000 rows went from -2,000 to -3.3e7 in its first steps,
  taken, and kept there; with one, its second is refused and the rate halved.)
- **cavities inconsistent with q** (where the step's caller can repair q, minibatch EP: more than
  ``INVALID_FRACTION`` of the rows' cavities improper, which cannot happen when q is the product of its sites).

Such a step is not taken. What the guard does, in this order:

1. **repair** q where its caller can (minibatch EP: an exact rebuild of its running site product from all sites,
   one pass over the rows), once, and retry the step at the same damping and step sizes;
2. raise the jitter where the inducing points' prior covariance no longer factorises at the configured one
   (``training.Trainer``, reported as a ``JitterWarning``);
3. otherwise put back the state before the last good step and halve damping and step sizes (compounding over
   failures in a row; after ``training.MAX_FAILURES`` it gives up with a FloatingPointError).

An engine may also halve its own damping where its steps are taken but do not converge (GFITC: a two-cycle of its
EP sweeps, ``engines.GFITCEngine.cycle_sweeps``), reported in a step's ``Outcome.guard`` and counted here as a
halving (and under "cycles" for the warning's words).

After ``RESTORE_AFTER`` good steps in a row, halved damping and step sizes are doubled back toward the values the
fit started with (``engines.Engine.grow``), so that one bad moment does not slow the rest of a long fit. The jump
and the cavity tests are evidence, not proof: a repaired step that still fails its cavity test is taken (q is then
exactly the product of its sites: the cavities are as they are), and a jump that a repair and one halving did not
remove is the data's and is taken; only a q that is not proper fails on until the guard gives up. Every action is
counted in the history (``GUARD_KEYS``, per entry) and said once at the end of the fit in a ``GuardWarning`` naming
what happened and what to do (``Guard.summary``).
NumPy's floating-point warnings of a refused step ("overflow encountered in exp" where a careless learning rate
took the kernel past the floats) are not said: the summary says what was done about the step
(``training.Trainer.step`` holds them: ``backend.FloatingPointErrorsHeld``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque

__all__ = ["Guard", "GUARD_KEYS", "JUMP_FACTOR", "JUMP_WINDOW", "JUMP_PER_ROW", "RESTORE_AFTER", "INVALID_FRACTION",
           "REASONS"]

JUMP_FACTOR = 10.0
JUMP_WINDOW = 20
JUMP_PER_ROW = 10.0
RESTORE_AFTER = 10
INVALID_FRACTION = 0.05

# why a step was not taken
REASONS = {"improper": "log Z was not finite (q not proper: a Cholesky factor failed, or a NaN in the step)",
           "jump": "its log Z jumped by an order of magnitude",
           "cavities": "more than 5% of its cavities were inconsistent with q"}
# the history's record of the guard, per entry (an epoch in minibatch mode, an iteration in batch mode)
GUARD_KEYS = ("guard_rejected", "guard_rebuilds", "guard_halvings", "guard_restored")


class Guard:
    """The guard's checks and its record for one training run (module docstring). The trainer asks ``problem`` of
    every evaluated step, tells ``taken`` and the actions it took (``note``); ``flush`` gives the counts of a history
    entry; ``summary`` the sentence of the warning at the end of the fit."""

    def __init__(self):
        self.recent = deque(maxlen=JUMP_WINDOW)  # the last taken steps' log Z estimates
        self.pending = Counter()  # actions since the last history entry
        self.totals = Counter()  # actions and reasons over the run
        self.streak = 0  # good steps since the last halving (or restoration)
        self.repaired = False  # a repair since the last good step
        self.jumps = 0  # steps not taken for a jump since the last good step

    def problem(self, log_z, n_invalid=0.0, rows=0, can_repair=False, n_total=0.0, can_halve=True):
        """Why a step whose evaluation gave ``log_z`` (and ``n_invalid`` failed cavities of its ``rows``; the model
        stands for ``n_total`` rows) must not be taken (a key of ``REASONS``), or None. A jump is not taken while a
        remedy is left for it (``can_repair``: a repair; ``can_halve``: damping or step sizes to halve)."""
        if not math.isfinite(log_z):
            return "improper"
        if self.jumps < can_repair + can_halve and self.recent and abs(log_z) > JUMP_PER_ROW * n_total:
            reference = statistics.median(self.recent)
            spread = 1.4826 * statistics.median(abs(v - reference) for v in self.recent)
            if abs(log_z - reference) > JUMP_FACTOR * max(abs(reference), spread, 1.0):
                return "jump"
        if can_repair and not self.repaired and n_invalid > INVALID_FRACTION * rows:
            return "cavities"
        return None

    def rejected(self, reason):
        self.pending["guard_rejected"] += 1
        self.totals["guard_rejected"] += 1
        self.totals[reason] += 1
        self.jumps += reason == "jump"

    def note(self, action, count=1):
        """An action the trainer took: "guard_rebuilds", "guard_halvings", "guard_restored" (and "jitter")."""
        if action == "guard_halvings":
            self.streak = 0
        if action in GUARD_KEYS:
            self.pending[action] += count
        self.totals[action] += count

    def taken(self, log_z):
        """A step was taken; returns whether damping and step sizes may be doubled back now."""
        self.recent.append(float(log_z))
        self.repaired = False
        self.jumps = 0
        self.streak += 1
        if self.streak >= RESTORE_AFTER:
            self.streak = 0
            return True
        return False

    def add(self, counts):
        """Actions of guards further down (data-parallel shards' steps), as counts by ``GUARD_KEYS`` and reasons."""
        for key, value in counts.items():
            if key in GUARD_KEYS:
                self.pending[key] += value
            self.totals[key] += value

    def flush(self):
        """The counts of the history entry that closes now, one per ``GUARD_KEYS``."""
        counts = [int(self.pending[key]) for key in GUARD_KEYS]
        self.pending = Counter()
        return counts

    def summary(self, method, since=None):
        """The warning's text: what the guard did over the run (``since``: since that copy of ``totals``, a stream's
        one batch) and what to do, or None when it did nothing."""
        t = self.totals if since is None else self.totals - since
        if not any(t[key] for key in GUARD_KEYS):
            return None
        reasons = ", ".join(f"{t[r]} because {text}" for r, text in REASONS.items() if t[r])
        said = [f"did not take {t['guard_rejected']} step{'s' if t['guard_rejected'] != 1 else ''}"
                + (f" ({reasons})" if reasons else "")] if t["guard_rejected"] else []
        if t["guard_rebuilds"]:
            said.append(f"rebuilt q exactly from its sites {_times(t['guard_rebuilds'])}")
        if t["guard_halvings"] - t["cycles"]:
            said.append(f"halved damping and step sizes {_times(t['guard_halvings'] - t['cycles'])}")
        if t["cycles"]:
            said.append(f"halved the EP damping {_times(t['cycles'])} where its sweeps went round a two-cycle "
                        "(each undoing the last)")
        if t["guard_restored"]:
            said.append(f"doubled them back {_times(t['guard_restored'])} after good steps")
        advice = ("if it recurs, standardise the inputs, lower learning_rate (minibatch) or damping, or raise jitter; "
                  "history_['guard_*'] has the counts per epoch or iteration")
        return f"{method}: the training guard " + "; ".join(said) + ". " + advice[0].upper() + advice[1:]


def _times(count):
    return {1: "once", 2: "twice"}.get(count, f"{count} times")
