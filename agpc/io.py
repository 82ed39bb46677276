"""Deprecated: what was here moved. The old names keep working for one release, each with a DeprecationWarning
naming its new place; the next release removes this module.

- ``save_model``, ``load_model``: :mod:`agpc.persistence` (also ``agpc.save_model`` / ``agpc.load_model``);
- the model file format (``FORMAT``, ``VERSION``, ``NOT_RESTORED``, ...): :mod:`agpc.model_file`;
- checkpoints, EP site files and the atomic writes (``save_checkpoint``, ``sync_directory``, ...):
  :mod:`agpc.checkpoints`.
"""

from __future__ import annotations

import warnings

from . import checkpoints, model_file, persistence

# old name -> (the module it moved to, its name there)
MOVED = {
    "save_model": (persistence, "save_model"),
    "load_model": (persistence, "load_model"),
    "FORMAT": (model_file, "FORMAT"),
    "VERSION": (model_file, "VERSION"),
    "NOT_RESTORED": (model_file, "NOT_RESTORED"),
    "MAX_LABEL_BYTES": (model_file, "MAX_LABEL_BYTES"),
    "MAX_QUADRATURE": (model_file, "MAX_QUADRATURE"),
    "save_checkpoint": (checkpoints, "save_checkpoint"),
    "load_checkpoint": (checkpoints, "load_checkpoint"),
    "check_checkpoint_path": (checkpoints, "check_checkpoint_path"),
    "sync_directory": (checkpoints, "sync_directory"),
    "save_site_chunk": (checkpoints, "save_site_chunk"),
    "load_site_chunk": (checkpoints, "load_site_chunk"),
    "CHECKPOINT_FORMAT": (checkpoints, "CHECKPOINT_FORMAT"),
    "CHECKPOINT_VERSION": (checkpoints, "CHECKPOINT_VERSION"),
    "MAX_HEADER_BYTES": (checkpoints, "MAX_HEADER_BYTES"),
    # private here, public where they went
    "_HEADER": (checkpoints, "HEADER_KEY"),
    "_atomic_savez": (checkpoints, "atomic_savez"),
    "_umask": (checkpoints, "process_umask"),
    "_read_archive": (checkpoints, "read_archive"),
}

# what ``from agpc.io import *`` gave (each still warns: the names come from ``__getattr__``)
__all__ = [  # noqa: F822
    "save_model", "load_model", "save_checkpoint", "load_checkpoint", "check_checkpoint_path", "sync_directory",
    "save_site_chunk", "load_site_chunk", "FORMAT", "VERSION", "CHECKPOINT_VERSION", "NOT_RESTORED",
]


def __getattr__(name):
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, new_name = MOVED[name]
    warnings.warn(f"agpc.io.{name} is deprecated: it moved to {module.__name__}.{new_name} (agpc.io will be removed "
                  "in the next release)", DeprecationWarning, stacklevel=2)
    return getattr(module, new_name)


def __dir__():
    return sorted(set(globals()) | set(MOVED))
