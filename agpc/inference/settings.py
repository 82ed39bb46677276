"""The settings of a training run, gathered from ``GPClassifier``'s parameters in one place: ``TrainSettings`` (the
loop's and its hooks') beside ``engines.EngineOptions`` (the engine's), and the rule by which a method's own values
replace the estimator's (``with_overrides``)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .engines import EngineOptions

__all__ = ["TrainSettings", "setting_names", "with_overrides"]


@dataclass(frozen=True)
class TrainSettings:
    """The training loop's settings and its hooks' (``hooks.standard_hooks``), from ``GPClassifier``'s parameters
    (built in one place, ``GPClassifier._train``); a method's own values replace the estimator's
    (``agpc.methods.Method.train_options``)."""

    batch_size: int | None = None  # rows a minibatch step takes; None (or all rows or more): batch steps
    max_iter: int = 250  # hyper-parameter steps in batch mode (steps when nothing is learned), epochs in minibatch mode
    tol: float = 1e-6  # nothing to learn: stop when the sites (factor, xi) change less; early stopping's improvement
    n_warmup: int = 10  # batch EP / SEP / ADF: sweeps before the first hyper-parameter step
    shuffle: bool = True  # False: minibatches in storage order (a stream)
    random_state: object = None
    max_time: float | None = None  # seconds for the whole fit, from ``started`` (``hooks.TimeBudget``)
    started: float | None = None  # a ``time.perf_counter()`` reading (default: the start of ``train``)
    eval_every: int | None = None  # steps between validation scores (``hooks.Validation``)
    n_iter_no_change: int | None = None  # early stopping
    progress: bool = False  # a tqdm bar (``hooks.Progress``)
    stage: str = ""  # the run's name among a fit's several, on its progress lines (``size_rule.learn_lengthscales``)
    # the stages that follow this one, for the progress line's estimate of the whole fit: (their name, the cost of
    # their iterations in units of this run's, the fit's max_time or None[, how many: 1 if not given]); the fit on all
    # rows after a subsample's, the later stages of the exact model's kernel choice
    then: tuple | None = None
    checkpoint_path: object = None  # where checkpoints are written and read (``hooks.Checkpoints``)
    checkpoint_every: int | None = None  # steps between checkpoints
    resume: bool = False
    data_hash: str | None = None  # ``checkpointing.data_fingerprint`` of the training data
    plateau: tuple | None = None  # (steps, rise): stop once log Z rose less over ``steps`` records (``hooks.Plateau``)

    def minibatch(self, n):
        """Whether a run on n rows steps on minibatches."""
        return self.batch_size is not None and self.batch_size < n


def setting_names():
    """The names ``with_overrides`` takes: the fields of ``TrainSettings`` and of ``engines.EngineOptions``."""
    return {f.name for f in fields(TrainSettings)} | {f.name for f in fields(EngineOptions)}


def with_overrides(settings, options, overrides):
    """(settings, options) with the values of ``overrides`` (a name of both, as ``tol``, replaces both)."""
    unknown = sorted(set(overrides) - setting_names())
    if unknown:
        raise TypeError(f"{unknown} are neither settings of the training loop nor options of an engine")
    mine = {f.name for f in fields(settings)}
    theirs = {f.name for f in fields(options)}
    return (replace(settings, **{k: v for k, v in overrides.items() if k in mine}),
            replace(options, **{k: v for k, v in overrides.items() if k in theirs}))
