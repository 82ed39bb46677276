"""What a fitted classifier learned and how its training went, for a person to read.

- ``model_summary(model)``: the text ``GPClassifier.summary()`` returns and ``agpc inspect MODEL`` prints: the method
  and likelihood, the data's shape, classes and feature names, the kernel's parameters with the relevance of each
  feature, the inducing points, the training history (final log Z or bound, iterations and steps, time, jitter, why
  it stopped) and the validation scores where the fit had validation data.
- ``feature_relevance(kernel)``: the relevance of each feature from ARD lengthscales, 1 / lengthscale_j^2
  normalised to sum to one (the inverse squared lengthscale of automatic relevance determination: Neal (1996);
  Rasmussen & Williams (2006), sec. 5.1); for a kernel of categorical columns or of some columns (the mixed kernel
  of continuous and categorical columns), per column from each term's lengthscales (``column_relevance``).
- ``reliability_bins`` and ``expected_calibration_error``: how well predicted probabilities match the frequencies
  seen, over equal-width bins of the top-class probability (Naeini, Cooper & Hauskrecht (2015); Guo, Pleiss, Sun &
  Weinberger (2017), sec. 2), written against the array API.
- ``plot_model(model, path, calibration=None)``: one PNG of the training curve, the reliability diagram and the
  feature relevance (matplotlib, a dependency of agpc, imported when a plot is drawn).

A loaded model prints what its file recorded: files written before the fit record (rows, time, why training
stopped) existed say "not recorded" there.
"""

from __future__ import annotations

import os
import textwrap

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import backend as B
from . import methods as M
from .checkpoints import atomic_write
from .inference.guard import GUARD_KEYS
from .inference.training import STOP_REASONS
from .kernels import Categorical, Combination, Linear, OnColumns, Stationary
from .model import FittedState
from .untrusted import printable

__all__ = ["STOP_REASONS", "STOPPED_BECAUSE", "ModelReport", "model_summary", "feature_relevance", "column_relevance",
           "reliability_bins", "expected_calibration_error", "plot_model", "NAME_CHARS"]

STOPPED_BECAUSE = {
    "max_iter": "max_iter: the iterations (epochs with minibatches) it was given ran out",
    "converged": "converged: the largest relative change of the sites fell below tol",
    "plateau": "plateau: log Z stopped rising (plateau='auto', the default: docs/usage.md, \"When a fit stops\")",
    "max_time": "max_time: the time budget ran out",
    "early_stopping": "early stopping: the validation NLL stopped improving (n_iter_no_change), best state kept",
    "partial_fit": "a stream (partial_fit): trained one minibatch a call, no stop of its own",
}
"""Each of ``STOP_REASONS`` (the ``stop_reason_`` of a fitted model) as the summary says it."""

SHARED_SCALE_NOTE = ("one lengthscale scale shared (ard_=False): the bars are the starting ratios, i.e. the features' "
                     "own scales, not learned per feature")
"""What the relevance panel says of a model whose lengthscales moved by one common factor."""

NOT_RECORDED = "not recorded (a model saved or pickled before agpc recorded it)"
# what the history's "log_marginal_likelihood" is, by the method's family (vi-JJ's is a lower bound, vi-Taylor's
# an approximation of one: Izmailov & Kropotov (2017), sec. 4)
BOUND_NAMES = {"ep": "log Z (EP's estimate)", "gfitc": "log Z (EP's estimate)", "variational": "ELBO (lower bound)",
               "quadratic": "variational objective (vi-JJ: a lower bound; vi-Taylor: its approximation)"}


# -- feature relevance ----------------------------------------------------------------------------------

def feature_relevance(kernel, n_features=None):
    """(relevance, None) or (None, why there is none) for one kernel, or a ``ClassKernels`` (then relevance is
    (C, d), one row a class). Relevance_j = (1 / l_j^2) / sum_k (1 / l_k^2) for the ARD lengthscales l of a
    stationary kernel (RBF, Matern 5/2, rational quadratic): how fast the latent function may change along
    feature j, in the units the features were given (compare features on one scale: standardise them first). For a
    linear kernel, whose 1 / l_j^2 is its slope variance v_j (``kernels.Linear``), relevance_j = v_j / sum_k v_k.
    For a kernel of categorical columns or of some columns (``kernels.Categorical``, ``kernels.OnColumns``, and
    sums and products holding one: ``kernels.mixed_kernel``), each column's rate of ``column_relevance``
    normalised, one per feature of X (``n_features``; None: as many as the kernel's columns reach)."""
    if kernel.n_latent > 1:
        rows = [feature_relevance(k, n_features) for k in kernel.latent_kernels()]
        why = next((why for _, why in rows if why is not None), None)
        return (None, why) if why is not None else (np.stack([relevance for relevance, _ in rows]), None)
    kernel = kernel.covariance_kernel  # (an ordinal model's lengthscales are its latent kernel's)
    if _reads_columns(kernel):
        rates, _ = column_relevance(kernel, n_features)
        if rates is None:
            return None, (f"a term of the {type(kernel).__name__} kernel has no lengthscale per column; relevance is "
                          "given for RBF, Matern52, RationalQuadratic, Linear and Categorical terms (one lengthscale "
                          "shared by the features where their number is given)")
        return rates / rates.sum(), None
    if not isinstance(kernel, (Stationary, Linear)):
        return None, (f"the {type(kernel).__name__} kernel has no one set of ARD lengthscales (each term has its "
                      "own: see its parameters); relevance is given for a single RBF, Matern52, RationalQuadratic "
                      "or Linear kernel")
    lengthscales = _lengthscales(kernel)
    if lengthscales.shape[0] == 1:
        return None, "one lengthscale shared by every feature (no ARD): no feature is more relevant than another"
    # 1 / l_j^2 normalised, taken in logs: lengthscales of 1e200 (features of that scale) overflowed l^2 and gave NaN
    log_precision = -2.0 * np.log(lengthscales)
    precision = np.exp(log_precision - log_precision.max())
    return precision / precision.sum(), None


def _lengthscales(kernel, n_features=None):
    """(d,) or (C, d) host lengthscales of a kernel whose relevance is defined (a linear kernel's: 1 / sqrt(v_j),
    the distance along feature j over which its slope moves f by one prior standard deviation; a kernel of some
    columns: ``column_relevance``'s)."""
    if kernel.n_latent > 1:
        return np.stack([_lengthscales(k, n_features) for k in kernel.latent_kernels()])
    kernel = kernel.covariance_kernel
    if _reads_columns(kernel):
        return column_relevance(kernel, n_features)[1]
    scales = kernel.lengthscales if isinstance(kernel, Stationary) else kernel.variances ** -0.5
    return np.asarray(B.to_numpy(scales), dtype=np.float64).reshape(-1)


COLUMN_MEASURE = ("1 / (2 lengthscale^2) of a continuous feature, 1 / lengthscale^2 of a categorical one (the mean "
                  "over its listed levels; how much log k falls over one unit, or to another level), the largest "
                  "over the kernel's terms")
"""What the relevance of a kernel of some columns is made of (``column_relevance``), as the summary says it."""


def _reads_columns(kernel):
    """Whether ``kernel`` reads some columns of X only: a categorical kernel, an ``OnColumns``, or a sum or product
    holding one (its relevance is ``column_relevance``'s)."""
    if isinstance(kernel, Combination):
        return any(_reads_columns(term) for term in kernel.terms)
    return isinstance(kernel, (Categorical, OnColumns))


def column_relevance(kernel, n_features=None):
    """(rate (d,), lengthscale (d,)) per column of X for a kernel of some columns, or (None, None) where a term has
    no lengthscales. A column's rate is how much log k(x, z) falls as x moves away from z along it: over one unit
    of a continuous feature, 1 / (2 l_j^2) for a stationary term (the RBF's exponent; a linear term's v_j / 2, its
    1 / l_j^2 being v_j), and to another level of a categorical one, its mean weight (``kernels.Categorical``:
    ``mismatch_rates``; its lengthscale, 1 / sqrt of it); a column several terms read (the mixed kernel's sum and
    product) takes the largest, the term along which f may change fastest, and that term's lengthscale. A column no
    term reads: rate 0, lengthscale inf. d: ``n_features``, or as many as the kernel's columns reach."""
    rates = _column_rates(kernel, n_features)
    if rates is None:
        return None, None
    d = n_features if n_features is not None else max(rates) + 1
    rate, scale = np.zeros(d), np.full(d, np.inf)
    for j, entries in rates.items():
        if j < d:
            rate[j], scale[j] = max(entries)
    return rate, scale


def _column_rates(kernel, width):
    """{column: [(rate, lengthscale) of each term reading it]} of ``kernel`` on inputs of ``width`` columns (None:
    unknown), or None for a term without lengthscales (``column_relevance``)."""
    if isinstance(kernel, Combination):
        out = {}
        for term in kernel.terms:
            part = _column_rates(term, width)
            if part is None:
                return None
            for j, entries in part.items():
                out.setdefault(j, []).extend(entries)
        return out
    if isinstance(kernel, OnColumns):  # (its kernel's column i is X's column columns[i])
        part = _column_rates(kernel.kernel, len(kernel.columns))
        return None if part is None else {kernel.columns[i]: entries for i, entries in part.items()}
    if isinstance(kernel, Categorical):
        return {j: [(float(rate), float(1.0 / np.sqrt(rate)))] for j, rate in zip(kernel.columns,
                                                                               kernel.mismatch_rates())}
    if not isinstance(kernel, (Stationary, Linear)):
        return None
    scales = _lengthscales(kernel)
    if scales.shape[0] == 1:  # (one lengthscale for every column, of a number known or not)
        if width is None:
            return None
        scales = np.repeat(scales, width)
    return {j: [(0.5 / float(scale) ** 2, float(scale))] for j, scale in enumerate(scales)}


@dataclass(frozen=True, eq=False)
class ModelReport:
    """What the summary and the plot read of a fitted estimator (``GPClassifier.report()``): its class's name, its
    method, dtype and kernel prior, and its ``model.FittedState`` (the model, and what its fit recorded)."""

    estimator_name: str
    method: str
    dtype: str
    kernel_prior: Any
    state: FittedState

    def recorded(self, name):
        """What the fit recorded of ``name`` (of ``model.FIT_RECORD``), or None (not recorded)."""
        return (self.state.record or {}).get(name)


def _report_of(model):
    """``model`` as a ``ModelReport``: itself, or a fitted estimator's ``report()`` (NotFittedError before fit)."""
    if isinstance(model, ModelReport):
        return model
    if not callable(getattr(model, "report", None)):
        raise TypeError(f"expected a fitted GPClassifier or an agpc.inspection.ModelReport, got {type(model).__name__}")
    return model.report()


NAME_CHARS = 40  # the most characters of a feature's or a class's name a report shows (a model file may hold any)


def _feature_labels(model):
    """The features' names as printed (``untrusted.printable``: a name from a file or a DataFrame may hold
    characters that act on a terminal), or x0, x1, ... for a model without names."""
    names = model.state.feature_names_in
    return ([printable(name, limit=NAME_CHARS) for name in names] if names is not None
            else [f"x{j}" for j in range(int(model.state.n_features_in))])


def _relevance_lines(model, max_features):
    n_features = int(model.state.n_features_in)
    relevance, why = feature_relevance(model.state.kernel, n_features)
    if relevance is None:
        return [f"feature relevance: none ({why})"]
    labels = _feature_labels(model)
    per_class = relevance.ndim == 2
    overall = relevance.mean(axis=0) if per_class else relevance
    order = np.argsort(-overall, kind="stable")
    width = max(7, *(len(labels[j]) for j in order[:max_features]))
    # (the latent GPs' kernels: one a class for a multiclass model)
    kernels = [k.covariance_kernel for k in model.state.kernel.latent_kernels()]
    measure = ("slope variance v (a linear kernel; lengthscale: 1 / sqrt(v))"
               if all(isinstance(k, Linear) for k in kernels) else COLUMN_MEASURE
               if any(_reads_columns(k) for k in kernels) else "1 / lengthscale^2")
    lines = [f"feature relevance: {measure}, normalised to sum to 1 (features compared in the units they were given)"]
    if model.recorded("ard") is False:  # tied: the ratios are the start's, not learned
        lines.append("  (one lengthscale scale shared by every feature, ard_=False: the ratios are the starting ones, "
                     "not learned per feature)")
    if per_class:
        heads = [f"class {printable(c, limit=NAME_CHARS)}" for c in model.state.classes]
        lines.append(f"  {'feature':<{width}}  {'mean':>8}  " + "  ".join(f"{h:>10}" for h in heads))
        for j in order[:max_features]:
            lines.append(f"  {labels[j]:<{width}}  {overall[j]:>8.4f}  "
                         + "  ".join(f"{relevance[c, j]:>10.4f}" for c in range(relevance.shape[0])))
    else:
        lengthscales = _lengthscales(model.state.kernel, n_features)
        lines.append(f"  {'feature':<{width}}  {'relevance':>9}  {'lengthscale':>11}")
        for j in order[:max_features]:
            lines.append(f"  {labels[j]:<{width}}  {overall[j]:>9.4f}  {lengthscales[j]:>11.4g}")
    rest = order[max_features:]
    if rest.shape[0]:
        lines.append(f"  ... {rest.shape[0]} more features, relevance {overall[rest].sum():.4f} together")
    return lines


# -- the summary ----------------------------------------------------------------------------------------

def _scalar_parameters(kernel):
    """'amplitude 1.23, noise 0.001' of a kernel's scalar parameters (a sum's or product's with their term's
    position: '0.amplitude'); per-dimension ones are the relevance table's, or listed when there is none."""
    parts = []
    for key, parameter in kernel.parameter_table().items():
        values = np.asarray(B.to_numpy(parameter.value(kernel.params[key])), dtype=np.float64).reshape(-1)
        name = key[: len(key) - len(parameter.key)] + parameter.name
        if values.shape[0] == 1:
            parts.append(f"{name} {values[0]:.4g}")
        elif not isinstance(kernel, (Stationary, Linear)):
            parts.append(f"{name} [{', '.join(f'{v:.4g}' for v in values[:8])}{', ...' if values.shape[0] > 8 else ''}]")
    return ", ".join(parts)


def _kernel_lines(model):
    kernel = model.state.kernel
    prior = model.kernel_prior
    said = "weak default priors on its parameters (MAP)" if prior == "auto" else "no default priors"
    if kernel.n_latent > 1:
        lines = [f"kernel: one kernel a class, {said}"]
        lines += [f"  class {printable(c, limit=NAME_CHARS)}: {type(k).__name__}: {_scalar_parameters(k)}"
                  for c, k in zip(model.state.classes, kernel.latent_kernels())]
        return lines
    if kernel.cut_points is not None:  # an ordinal model's: the latent's kernel, and the cut points between the classes
        cuts = ", ".join(f"{v:.4g}" for v in np.asarray(B.to_numpy(kernel.cut_points), dtype=np.float64))
        latent = kernel.covariance_kernel
        return [f"kernel: {type(latent).__name__}: {_scalar_parameters(latent)} ({said}); cut points {cuts}"]
    return [f"kernel: {type(kernel).__name__}: {_scalar_parameters(kernel)} ({said})"]


def _preview(values, most=12):
    values = [printable(v, limit=NAME_CHARS) for v in values]
    return ", ".join(values[:most]) + (f", ... ({len(values)} in all)" if len(values) > most else "")


def _bound_name(model):
    """What the history's "log_marginal_likelihood" is for the model's method: EP's log Z or a lower bound."""
    spec = M.get_method(model.method) if model.method in M.method_names() else None
    return BOUND_NAMES.get(spec.family if spec is not None else None, "log Z_q")


def _warmup_note(model):
    """How many of ``n_iter_`` were warm-up sweeps, which ``max_iter`` does not count (None: not recorded)."""
    warmup = model.recorded("n_warmup")
    return f"; of them {warmup} warm-up sweeps, which max_iter does not count" if warmup else ""


def _subsample_lines(model):
    """The fit's start on a random subsample of its rows, where it took one (``GPClassifier.subsample_rows_``)."""
    rows, iterations = model.recorded("subsample_rows"), model.recorded("subsample_iter")
    if not rows:
        return []
    return [f"  started on a random {int(rows):,} rows ({int(iterations or 0)} iterations, warm-up sweeps included), "
            "then trained on all rows from there (the iterations above)"]


def _training_lines(model):
    history = model.state.history
    bound = _bound_name(model)
    reason = model.recorded("stop_reason")
    seconds = model.recorded("fit_time")
    steps = history.get("n_steps") or []
    lines = ["training:",
             f"  stopped: {STOPPED_BECAUSE.get(reason, NOT_RECORDED)}",
             f"  iterations (epochs with minibatches): {int(model.state.n_iter)}"
             + (f", {int(steps[-1])} steps" if steps else "") + _warmup_note(model),
             *_subsample_lines(model),
             f"  final {bound}: {float(model.state.log_marginal_likelihood):.6g}",
             "  fit time: " + ("not measured for partial_fit" if reason == "partial_fit" else NOT_RECORDED
                                if seconds is None else f"{seconds:.3g} s"),
             f"  jitter: {float(model.state.jitter):.3g} on the diagonal of K(Z, Z)"]
    guard = [int(sum(history.get(key) or [])) for key in GUARD_KEYS]
    if any(guard):  # (docs/methods/ep.md, "The training guard")
        rejected, rebuilds, halvings, restored = guard
        lines.append(f"  the training guard: {rejected} steps not taken, {rebuilds} exact rebuilds of q, damping and "
                     f"step sizes halved {halvings} times and doubled back {restored} times")
    nll = history.get("validation_nll") or []
    if nll:
        errors, at = history.get("validation_error") or [], history.get("validation_step") or []
        best = int(np.argmin(nll))
        lines += [f"validation ({len(nll)} scores):",
                  f"  last: NLL {nll[-1]:.4f}, error {errors[-1]:.4f} (step {int(at[-1])})",
                  f"  best: NLL {nll[best]:.4f}, error {errors[best]:.4f} (step {int(at[best])})"]
    else:
        lines.append("validation: none (fit without validation_data)")
    return lines


def model_summary(model, max_features=20):
    """A fitted model (a ``ModelReport``, or a fitted estimator's ``report()``) as text (``GPClassifier.summary()``,
    ``agpc inspect``): what it is, which features matter (the ``max_features`` most relevant are listed), how
    training went. Printing is the caller's."""
    model = _report_of(model)
    if isinstance(max_features, bool) or not isinstance(max_features, (int, np.integer)) or max_features < 1:
        raise ValueError(f"max_features must be a positive integer, got {max_features!r}")
    state = model.state
    rows = model.recorded("n_samples_fit")
    names = state.feature_names_in
    Z = state.inducing_points
    per_class = " a class" if len(Z.shape) == 3 else ""
    lines = [f"{model.estimator_name}: method {model.method}, likelihood {state.likelihood}, dtype {model.dtype}",
             f"data: {'rows ' + NOT_RECORDED if rows is None else f'{rows} rows'}, {int(state.n_features_in)} "
             f"features; {len(state.classes)} classes: {_preview(state.classes.tolist())}",
             "features: " + (_preview(names, 8) if names is not None else "not named (fitted on an array without "
                                                                        "column names)")]
    lines += _kernel_lines(model) + _relevance_lines(model, max_features)
    lines.append(f"inducing points: {Z.shape[-2]}{per_class}"
                 + (" (as many as training rows)" if rows is not None and Z.shape[-2] == rows else ""))
    return "\n".join(lines + _training_lines(model)) + "\n"


# -- calibration ----------------------------------------------------------------------------------------

def reliability_bins(proba, class_index, n_bins=10):
    """Per equal-width bin of the top-class probability, (rows, accuracy, mean confidence) as three NumPy arrays of
    ``n_bins`` (an empty bin: 0 rows, NaN accuracy and confidence). ``proba``: (n, C) probabilities of any
    array-API namespace; ``class_index``: (n,) each row's true class as a column of ``proba``. Bin b holds the rows
    whose top probability lies in (b / n_bins, (b + 1) / n_bins] (the first bin includes 0): Guo et al. (2017),
    sec. 2. One transfer to the host."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    xp = B.array_namespace(proba, class_index)
    if proba.ndim != 2 or class_index.ndim != 1 or class_index.shape[0] != proba.shape[0] or proba.shape[0] == 0:
        raise ValueError(f"expected probabilities (n, C) and n class indices with n >= 1, got shapes {proba.shape} and "
                         f"{class_index.shape}")
    confidence = xp.max(proba, axis=1)
    correct = xp.astype(xp.argmax(proba, axis=1) == xp.astype(class_index, xp.int64), proba.dtype)
    edges = [b / n_bins for b in range(n_bins + 1)]  # (exact at the tenths a probability may equal: 0.7 is 7 / 10)
    sums = []
    for b in range(n_bins):
        inside = confidence <= edges[b + 1]
        if b > 0:
            inside = inside & (confidence > edges[b])
        weight = xp.astype(inside, proba.dtype)
        sums += [xp.sum(weight), xp.sum(weight * correct), xp.sum(weight * confidence)]
    counts, hits, confidences = np.asarray(B.to_numpy(xp.stack(sums)), dtype=np.float64).reshape(n_bins, 3).T
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts.astype(np.int64), hits / counts, confidences / counts


def expected_calibration_error(proba, class_index, n_bins=10):
    """ECE = sum_b (n_b / n) |accuracy_b - confidence_b| over ``n_bins`` equal-width bins of the top-class
    probability (Naeini et al. (2015); Guo et al. (2017), sec. 2): 0 for probabilities that are as often right as
    they say; a float. Arguments as ``reliability_bins``."""
    counts, accuracy, confidence = reliability_bins(proba, class_index, n_bins)
    filled = counts > 0
    return float(np.sum(counts[filled] * np.abs(accuracy[filled] - confidence[filled])) / counts.sum())


# -- the plot -------------------------------------------------------------------------------------------

def _figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ModuleNotFoundError("the plot needs matplotlib, a dependency of agpc that is not installed here: "
                                  "pip install matplotlib", name="matplotlib") from exc
    figure = Figure(figsize=(15, 4.6))
    FigureCanvasAgg(figure)
    return figure


# The largest magnitude of a history's value the training curve draws. matplotlib's axis arithmetic (the span of the
# values, its margins, the tick steps) overflows float64 well before float64's largest number: a forged history of
# +-8e307 failed in its ticker ("arange: cannot compute length"), 1e308 alone drew with NumPy's overflow warnings;
# +-1e300 draws. No fit records a log Z, an NLL or a step count within orders of magnitude of it.
PLOTTED_RANGE = 1e300


def _plottable(steps, values):
    """(steps, values, how many points were left out) of a curve: the points whose step and value both lie within
    ``PLOTTED_RANGE``."""
    steps, values = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    kept = (np.abs(steps) <= PLOTTED_RANGE) & (np.abs(values) <= PLOTTED_RANGE)
    return steps[kept], values[kept], int(np.count_nonzero(~kept))


def _training_curve(history):
    """(steps, values, records not drawn) of the training curve: each record's log Z (or bound) at its step count.
    Records without one are not drawn: a file of an agpc before step counts has none (its records are drawn at their
    numbers, one a step in a batch fit), and ``partial_fit`` continuing it counts its own records' steps alone, the
    last of the history (``checkpoint_rules.check_history``)."""
    values = history.get("log_marginal_likelihood") or []
    steps = history.get("n_steps") or range(1, len(values) + 1)
    drawn = min(len(steps), len(values))
    return steps[len(steps) - drawn:], values[len(values) - drawn:], len(values) - drawn


def _plot_training(ax, model):
    history = model.state.history
    steps, values, without = _training_curve(history)
    steps, values, left_out = _plottable(steps, values)
    ax.plot(steps, values, color="#08519c", label="log Z_q")
    stopped = STOPPED_BECAUSE.get(model.recorded("stop_reason"), "not recorded").split(":")[0]
    ax.set(title=f"training (stopped: {stopped})", xlabel="steps", ylabel=_bound_name(model))
    nll = history.get("validation_nll") or []
    if nll:
        right = ax.twinx()
        at, nll, more = _plottable(history["validation_step"], nll)
        right.plot(at, nll, color="#cb181d", label="validation NLL")
        right.set_ylabel("validation NLL", color="#cb181d")
        left_out += more
    notes = [f"{left_out} recorded points beyond +-{PLOTTED_RANGE:.0e} not drawn"] if left_out else []
    notes += [f"{without} earlier records without a step count not drawn"] if without else []
    if notes:  # (a forged file's history, or an older file's continued by partial_fit: drawn without them, and said)
        ax.text(0.5, 0.97, "; ".join(notes), transform=ax.transAxes, ha="center", va="top", fontsize=8,
                color="#cb181d")


def _plot_reliability(ax, calibration, n_bins):
    ax.set(title="reliability", xlabel="top-class probability", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    if calibration is None:
        ax.text(0.5, 0.5, "no data given: a reliability diagram\nneeds labelled rows (agpc inspect --data\n"
                "TABLE --target COL)", ha="center", va="center", fontsize=9)
        return
    proba, class_index = calibration
    counts, accuracy, confidence = reliability_bins(proba, class_index, n_bins)
    centres = (np.arange(n_bins) + 0.5) / n_bins
    filled = counts > 0
    ax.bar(centres[filled], accuracy[filled], width=1.0 / n_bins, edgecolor="k", color="#6baed6", label="accuracy")
    ax.plot(confidence[filled], confidence[filled], "o", color="#cb181d", markersize=3, label="mean confidence")
    ece = expected_calibration_error(proba, class_index, n_bins)
    ax.legend(loc="upper left", fontsize=8, title=f"ECE {ece:.4f} ({int(counts.sum())} rows, {n_bins} bins)",
              title_fontsize=8)


def _plot_relevance(ax, model, max_features):
    relevance, why = feature_relevance(model.state.kernel, int(model.state.n_features_in))
    by_columns = any(_reads_columns(k.covariance_kernel) for k in model.state.kernel.latent_kernels())
    measure = "per column: 1 / (2 l^2), categorical 1 / l" if by_columns else "1 / lengthscale^2"
    ax.set_title(f"feature relevance ({measure})")
    if relevance is None:
        ax.text(0.5, 0.5, "\n".join(textwrap.wrap("none: " + why, 48)), ha="center", va="center", fontsize=8)
        ax.set_axis_off()
        return
    overall = relevance.mean(axis=0) if relevance.ndim == 2 else relevance
    order = np.argsort(-overall, kind="stable")[:max_features][::-1]
    labels = _feature_labels(model)
    ax.barh([labels[j] for j in order], overall[order], color="#74c476")
    xlabel = "relevance (mean over classes)" if relevance.ndim == 2 else "relevance"
    if model.recorded("ard") is False:  # what the summary says (``_relevance_lines``), on the panel too
        ax.set_title(f"feature relevance ({measure})\n" + "\n".join(textwrap.wrap(SHARED_SCALE_NOTE, 52)),
                     fontsize=8)
        xlabel += " (from each feature's scale, not learned)"
    ax.set_xlabel(xlabel)
    ax.locator_params(axis="x", nbins=4)


def plot_model(model, path, calibration=None, n_bins=10, max_features=20):
    """One PNG at ``path`` (written atomically; a device, a directory or a FIFO refused): the training curve (log Z
    or the bound, and the validation NLL where there is one), the reliability diagram with its expected calibration
    error on ``calibration`` = (proba (n, C), class_index (n,)) of labelled rows (without: the panel says so),
    and the feature relevance of the ``max_features`` most relevant features; ``model``: a ``ModelReport``, or a
    fitted estimator (its ``report()``)."""
    model = _report_of(model)
    figure = _figure()
    axes = figure.subplots(1, 3)
    _plot_training(axes[0], model)
    _plot_reliability(axes[1], calibration, n_bins)
    _plot_relevance(axes[2], model, max_features)
    figure.suptitle(f"{model.estimator_name}: method {model.method}, {len(model.state.classes)} classes, "
                    f"{int(model.state.n_features_in)} features")
    figure.tight_layout()
    with atomic_write(path, "wb", what=f"cannot write the plot to {os.fspath(path)}") as fh:
        figure.savefig(fh, format="png", dpi=90)
    return path
