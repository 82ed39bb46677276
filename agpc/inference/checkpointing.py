"""Checkpoints of a training run: the run's fingerprint, writing the whole state of the loop and its engine, and
restoring it after every field was checked (``agpc.checkpoint_rules``), so that a run interrupted and resumed ends
at the same model as one that is not (same seed, same data).

A checkpoint holds the loop's record (step counts, history, the random generator's state, the epoch's visiting
order, the early-stopping record, the seconds spent) and the engine's ``checkpoint_state``. A resume refuses a
checkpoint of another run: other data (``data_fingerprint``), another method, layout of minibatches, model size,
parameters learned or priors.
"""

from __future__ import annotations

import hashlib
import time

from ..backend import array_device, asarray_like, to_host_vector
from ..checkpoint_rules import array_shapes, check_engine_state, check_loop_state, dtype_text, is_array
from ..checkpoints import load_checkpoint, save_checkpoint

__all__ = ["FINGERPRINT_ROWS", "fingerprint_stride", "data_fingerprint", "run_fingerprint", "write_checkpoint",
           "restore"]

FINGERPRINT_ROWS = 1000


def fingerprint_stride(n):
    """The stride of the rows a data fingerprint reads: at most ``FINGERPRINT_ROWS`` rows, spread over all n
    (fixed positions, so an array on disk or on a cluster is read at those rows only)."""
    return max(1, -(-int(n) // FINGERPRINT_ROWS))


def data_fingerprint(n, d, rows, labels, classes):
    """A hash of the training data for a checkpoint's run fingerprint: n, d, the classes and the rows and
    (encoded) labels at ``fingerprint_stride`` positions. Resuming on other data of the same shape would
    silently mix two fits; this catches it (a change only between the sampled rows goes unseen)."""
    digest = hashlib.sha256(f"{int(n)} {int(d)} {[str(c) for c in classes]}".encode())
    for values in (rows, labels):
        digest.update(to_host_vector(values).tobytes())
    return digest.hexdigest()[:32]


def run_fingerprint(engine, n, n_batches, data_hash):
    """What a checkpoint must have been written by for this run to resume it."""
    kernel, Z = engine.state["kernel"], engine.state["Z"]
    return {"n": int(n), "method": engine.name, "n_batches": n_batches, "Z_shape": [int(v) for v in Z.shape],
            "per_row_sites": engine.per_row_sites, "params": list(engine.names), "data": data_hash,
            # full-GP passes read Z as the rows themselves, site i as row i's: a sparse run's checkpoint whose
            # Z has n points (in another order) must not resume under them
            "full_gp": engine.full_gp,
            # the objective's priors: a resume under other priors (kernel_prior changed) would climb
            # another objective from the saved state
            "priors": {key: parameter.prior.spec() for key, parameter in kernel.parameter_table().items()
                       if parameter.prior is not None},
            # tied lengthscales (ard=False) climb along another path: said only when tied, so that a checkpoint
            # written before the tie existed (per feature) still resumes
            **({"shared_lengthscales": True} if engine.shared_lengthscales else {})}


def write_checkpoint(trainer, rng, order, best, path, fingerprint):
    """Everything the loop needs to go on exactly as if it had not stopped."""
    engine_state = trainer.engine.checkpoint_state(path, trainer.n_steps)
    save_checkpoint(path, {
        "fingerprint": fingerprint, "engine": engine_state,
        "n_steps": trainer.n_steps, "n_updates": trainer.n_updates, "history": trainer.history,
        "pending": [list(p) for p in trainer._pending],
        "rng": rng.bit_generator.state, "order": [int(i) for i in order],
        "best": {k: v for k, v in best.items() if k != "state"},
        "elapsed": time.perf_counter() - trainer.t0,
    })
    trainer.engine.checkpoint_written(engine_state)


def restore(trainer, rng, path, fingerprint, has_validation):
    """Put a checkpoint's state into a freshly built trainer; returns (order, best). Everything read is
    checked first: a field of the wrong type or shape is one ValueError naming the file and the field."""
    if path is None:
        raise ValueError("resume=True needs checkpoint_path")

    def refuse(why):
        return ValueError(f"{path} is not a valid agpc checkpoint: {why}")

    xp, device = trainer.xp, array_device(trainer.state["Z"])
    saved = load_checkpoint(path, lambda a: asarray_like(a, xp, device=device))
    _check_fingerprint(saved, trainer, path, fingerprint)
    check_loop_state(saved, fingerprint, refuse)
    check_engine_state(saved["engine"], trainer.engine, fingerprint, path, refuse)
    _restore_engine(trainer, rng, saved, path, refuse)
    trainer.n_steps = saved["n_steps"]
    trainer.n_updates = saved["n_updates"]
    trainer.history = saved["history"]
    trainer._pending = [tuple(p) for p in saved["pending"]]
    trainer.t0 = time.perf_counter() - saved["elapsed"]
    trainer.good = None
    best = dict(saved["best"], state=None)
    if has_validation and trainer.history.get("validation_nll") is None:
        raise ValueError(f"checkpoint {path} has no validation history but this run has validation data")
    return list(saved["order"]), best


def _written_for(saved, engine):
    """The fingerprint a checkpoint was written for, in this version's form."""
    written_for = saved.get("fingerprint")
    if isinstance(written_for, dict):  # a checkpoint from before priors were part of the fingerprint had none
        written_for = {"priors": {}, "full_gp": False, **written_for}  # (nor the full GP's passes, which came later)
        legacy = engine.legacy_checkpoint_keys
        if legacy and isinstance(written_for.get("params"), list):  # the parameters by the names of an older form
            written_for["params"] = [legacy.get(name, name) if isinstance(name, str) else name
                                     for name in written_for["params"]]
    return written_for


def _check_fingerprint(saved, trainer, path, fingerprint):
    """Refuse a checkpoint of another run: another type first, then other data, then any other difference."""
    written_for = _written_for(saved, trainer.engine)
    # The data's hash is of its rows in the run's type, so a resume in another dtype would read as other data:
    # said first, by the type the checkpoint's arrays are in.
    saved_Z = saved["engine"].get("Z") if isinstance(saved.get("engine"), dict) else None
    run_dtype = trainer.state["Z"].dtype
    if is_array(saved_Z) and saved_Z.dtype != run_dtype:
        raise ValueError(
            f"checkpoint {path} was written by a fit computing in {dtype_text(saved_Z.dtype)}, but this fit "
            f"computes in {dtype_text(run_dtype)}: resume with dtype='{dtype_text(saved_Z.dtype)}', or fit "
            "afresh without resume"
        )
    # other data of the same shape (the default priors are centred on the data, so they may differ with it)
    data_derived = ("data", "priors")
    if isinstance(written_for, dict) and written_for.get("data") != fingerprint["data"] and (
        {k: v for k, v in written_for.items() if k not in data_derived}
        == {k: v for k, v in fingerprint.items() if k not in data_derived}
    ):
        raise ValueError(
            f"checkpoint {path} was written for different training data: the same number of rows and features, "
            f"but other rows, labels or sample weights (data fingerprint {written_for.get('data')}, this data {fingerprint['data']})"
        )
    if written_for != fingerprint:
        differs = sorted(set(written_for) | set(fingerprint)) if not isinstance(written_for, dict) else sorted(
            key for key in set(written_for) | set(fingerprint) if written_for.get(key) != fingerprint.get(key))
        hint = ("; a fit on a dask array with checkpoint_path stepped on the driver (local_steps=0) by default "
                "before data-parallel rounds were checkpointed: pass local_steps=0 to resume such a checkpoint"
                if differs == ["n_batches"] else "")
        raise ValueError(
            f"checkpoint {path} was written by a different training run (differing in {', '.join(differs)}: "
            f"{written_for}); this run is {fingerprint}{hint}"
        )


def _restore_engine(trainer, rng, saved, path, refuse):
    """The random generator's and the engine's state from a checked checkpoint; the engine's arrays must come
    back in the shapes of this run's."""
    fresh = array_shapes(trainer.engine.state)
    try:
        rng.bit_generator.state = saved["rng"]
    except (KeyError, TypeError, ValueError) as exc:
        raise refuse(f"rng: not the state of this run's generator ({type(exc).__name__}: {exc})") from None
    try:
        trainer.engine.restore_checkpoint(saved["engine"], path)
    # what restoring raises on a missing entry or a value of the wrong kind: the field is named
    except (KeyError, TypeError, IndexError) as exc:  # (a ValueError here says what is wrong already)
        raise refuse(f"engine: {type(exc).__name__}: {exc}") from None
    restored = array_shapes(trainer.engine.state)
    for key, shape in fresh.items():
        if restored.get(key) != shape:
            raise refuse(f"engine.{key}: shape {restored.get(key)}, this run's is {shape}")
