"""Saving and loading fitted models: ``save_model`` / ``load_model``, the documented entry points.

A model file is data, never serialised Python objects: one ``.npz`` of arrays and a JSON header (format
``FORMAT``, version ``VERSION``), every field checked against the format's schema when it is read, so that a
file from anywhere can be loaded without running anything it holds. The format, its schema and its limits
are :mod:`agpc.model_file` (below the estimator, so that ``GPClassifier.save`` / ``GPClassifier.load`` use it
too); this module is where a user starts, above the estimator::

    agpc.save_model(model, "model.npz")
    model = agpc.load_model("model.npz")             # arrays in NumPy
    model = agpc.load_model("model.npz", "cupy")     # or on a GPU

Training checkpoints are another format (:mod:`agpc.checkpoints`): a checkpoint resumes a fit, a model file
predicts.
"""

from __future__ import annotations

import sys

import numpy as np
from sklearn.utils.validation import check_is_fitted

from . import backend as B
from .classifier import GPClassifier
from .model_file import (FORMAT, NOT_RESTORED, SCALER_ARRAYS, VERSION, read_model_parts, step_names_problem,
                         write_model_file)

# sklearn.pipeline and sklearn.preprocessing (about 80 modules, 60-70 ms) are imported only where a Pipeline is
# saved or loaded: most model files hold a classifier alone

__all__ = ["save_model", "load_model", "FORMAT", "VERSION", "NOT_RESTORED"]

PIPELINE_TAKEN = ("a Pipeline of a fitted StandardScaler and a fitted GPClassifier (make_pipeline(StandardScaler(), "
                  "GPClassifier()))")


def save_model(model, path):
    """Write a fitted GPClassifier to ``path`` (a file name, kept as given and written atomically: a crash
    never leaves half a file where a good one was) or to a binary file object. Parameters that name where
    training writes (``NOT_RESTORED``: checkpoint and site paths, the dask client) are not restored on load.

    ``model`` may also be a Pipeline of a fitted StandardScaler and a fitted GPClassifier: the file then holds the
    scaler's numbers too (its means and scales: data, like the rest) and ``load_model`` gives the Pipeline back.
    Any other Pipeline is refused: a model file never holds code, so other preprocessing cannot be saved in it,
    and saving the classifier alone would lose it silently; so is one whose scaler and classifier take different
    numbers of features, or whose step names are not plain identifiers (``make_pipeline``'s are), before anything
    is written."""
    classifier, scaler = _parts(model)
    # (parameters set after the fit are checked as fit checks them: a file of parameters load_model refuses was
    # written, and was found unreadable only when loaded)
    classifier.check_saved_params()
    write_model_file(path, type(classifier).__name__, classifier.get_params(deep=False), classifier.fitted_state(),
                     scaler)


def _parts(model):
    """(the GPClassifier, the standardisation before it or None) of what ``save_model`` was given."""
    if isinstance(model, GPClassifier):
        return model, None
    # (a Pipeline exists only once sklearn.pipeline is imported: nothing else needs importing it)
    pipeline_module = sys.modules.get("sklearn.pipeline")
    if pipeline_module is None or not isinstance(model, pipeline_module.Pipeline):
        raise TypeError(f"save_model saves a fitted GPClassifier, or {PIPELINE_TAKEN}; got a {type(model).__name__}")
    from sklearn.preprocessing import StandardScaler

    kinds = [type(step).__name__ for _, step in model.steps]
    if len(model.steps) != 2 or type(model.steps[0][1]) is not StandardScaler or not isinstance(
            model.steps[1][1], GPClassifier):
        raise ValueError(f"save_model saves a fitted GPClassifier, or {PIPELINE_TAKEN}; this Pipeline's steps are "
                         f"{kinds}. A model file holds data, never code, so other preprocessing cannot be saved in "
                         "it (and saving pipeline[-1] alone would predict on unprocessed features): save pipeline[-1] "
                         "with save_model and apply the preprocessing yourself before predicting")
    (first, scaler), (second, classifier) = model.steps
    check_is_fitted(scaler)
    check_is_fitted(classifier)
    if scaler.n_features_in_ != classifier.n_features_in_:  # (the file written would not load)
        raise ValueError(f"save_model: this Pipeline does not predict: its StandardScaler has {scaler.n_features_in_} "
                         f"features, its GPClassifier {classifier.n_features_in_}")
    problem = step_names_problem([first, second])
    if problem:
        raise ValueError(f"save_model keeps a Pipeline's step names in the model file, which takes plain "
                         f"identifiers: {problem}")
    names = getattr(scaler, "feature_names_in_", None)
    return classifier, {"with_mean": scaler.with_mean, "with_std": scaler.with_std,
                        "n_samples_seen": int(np.max(scaler.n_samples_seen_)), "steps": [first, second],
                        "feature_names": None if names is None else [str(v) for v in names],
                        **{name: getattr(scaler, f"{name}_", None) for name in SCALER_ARRAYS}}


def load_model(path, backend="numpy"):
    """Read a model written by :func:`save_model` (model file format version 1 or later up to ``VERSION``)
    from a file name or a binary file object; arrays are placed in ``backend``'s namespace ("numpy", "cupy"
    or an array namespace). Everything read is checked against the format's schema first; a file that does
    not satisfy it is one ``ValueError`` naming the file and the field. A file saved from a Pipeline (a
    StandardScaler and the classifier; ``agpc fit --standardize`` writes one too) is that Pipeline again."""
    with B.jitter_report("agpc.load_model"):  # (a jitter raised to factorise the file's K(Z, Z): said at the caller)
        params, state, scaler = read_model_parts(path, GPClassifier.file_schema(), backend=backend)
        classifier = GPClassifier(**params).set_fitted_state(state)
    if scaler is None:
        return classifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    standardise = StandardScaler(with_mean=scaler["with_mean"], with_std=scaler["with_std"])
    for name in SCALER_ARRAYS:
        setattr(standardise, f"{name}_", scaler[name])
    standardise.n_samples_seen_ = scaler["n_samples_seen"]
    standardise.n_features_in_ = int(classifier.n_features_in_)
    if scaler["feature_names"] is not None:
        standardise.feature_names_in_ = np.asarray(scaler["feature_names"], dtype=object)
    first, second = scaler["steps"]
    return Pipeline([(first, standardise), (second, classifier)])
