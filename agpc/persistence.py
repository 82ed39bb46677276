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

from .classifier import GPClassifier
from .model_file import FORMAT, NOT_RESTORED, VERSION, read_model_file, write_model_file

__all__ = ["save_model", "load_model", "FORMAT", "VERSION", "NOT_RESTORED"]


def save_model(model, path):
    """Write a fitted GPClassifier to ``path`` (a file name, kept as given and written atomically: a crash
    never leaves half a file where a good one was) or to a binary file object. Parameters that name where
    training writes (``NOT_RESTORED``: checkpoint and site paths, the dask client) are not restored on load."""
    write_model_file(path, model)


def load_model(path, backend="numpy"):
    """Read a model written by :func:`save_model` (model file format version 1 or later up to ``VERSION``)
    from a file name or a binary file object; arrays are placed in ``backend``'s namespace ("numpy", "cupy"
    or an array namespace). Everything read is checked against the format's schema first; a file that does
    not satisfy it is one ``ValueError`` naming the file and the field."""
    return read_model_file(path, GPClassifier, backend=backend)
