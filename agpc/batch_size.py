"""How many rows a training step takes: ``GPClassifier(batch_size=...)`` resolved for a fit (docs/gpu.md).

``batch_size="auto"`` is the full batch up to ``FULL_BATCH_MAX_ROWS`` rows and minibatches of 200 above, on the
CPU; for the default method's binary model of rows in memory on the host, the full batch up to
``BINARY_BATCH_MAX_ROWS`` (``full_batch_max_rows``). On a GPU a binary model takes the fewest rows whose
arithmetic outweighs twice the launch overhead of the step's few hundred kernels (``backend.launch_bound_rows`` with
the method's step model, ``methods.gpu_step_model``, and the device's throughput), at most n /
``GPU_STEPS_PER_EPOCH`` (512: the hyper-parameters must move often enough an epoch, or the model after the same
epochs is worse) and what fits in one row block in ``backend.DEVICE_MEMORY_FRACTION`` of the free memory; a step
then computes that minibatch as one row block (``gpu_block_rows``).
"""

from __future__ import annotations

import math
from types import MappingProxyType

import numpy as np

from . import backend as B
from .inference import blocks
from .methods import get_method, gpu_step_model, method_names, supports

__all__ = ["FULL_BATCH_MAX_ROWS", "BINARY_BATCH_MAX_ROWS", "CPU_MINIBATCH", "full_batch_max_rows",
           "binary_on_host", "GPU_STEP_MODEL", "GPU_STEPS_PER_EPOCH", "rows_per_step",
           "gpu_batch_rows", "gpu_rule_rows", "gpu_step_seconds", "gpu_block_rows"]

FULL_BATCH_MAX_ROWS = 20000  # batch_size="auto": the full batch up to here, minibatches above
CPU_MINIBATCH = 200  # batch_size="auto" above FULL_BATCH_MAX_ROWS, off a GPU
BINARY_BATCH_MAX_ROWS = 200_000
"""batch_size="auto" for EP (the default method) on a binary model of rows in memory on the host: the full batch up
to here (``full_batch_max_rows``). On the binary tables measured between 20,000 and 200,000 rows
(docs/small_data_defaults.md, "Batch steps up to 200,000 rows") batch steps gave airline's test NLL sooner (50,000
rows: the minibatch default's NLL in about 105 steps against 58-65 epochs, 0.31-0.39 of the time; 200,000: +0.0024
after 80 steps, 77 s, against 71 epochs of minibatches); the generated tables, whose evidence climbs slowly, end
0.005 above their minibatch fits (clf-50000x20 runs to ``max_iter``, 260 steps, in 0.63 of their time). Since
2026-12-01 such a default fit first fits a random 10,000 of its rows (``size_rule.subsample_start_rows``) and then
stops on the window of smaller batch fits; a fit on all rows alone (``batch_size=None``) on a longer one
(``size_rule.fit_plateau``). Multiclass and ordinal models, the
other methods, a GPU, a cluster and rows on disk keep ``FULL_BATCH_MAX_ROWS``: not measured there."""

# The GPU step model of each built-in method that declares one, by name (what docs/gpu.md quotes). The registry is
# where it lives (``methods.Method.gpu_step``); the rule reads it there, by ``methods.gpu_step_model``.
GPU_STEP_MODEL = MappingProxyType({name: get_method(name).gpu_step for name in method_names()
                                   if get_method(name).gpu_step is not None})
# The GPU's minibatch is at most n / 512 rows (rounded down to 200 times a power of two): at least 512 steps an epoch.
# Chosen by the test NLL after the same epochs (benchmarks/gpu_batch_quality.py, docs/gpu.md "The GPU's minibatch"):
# with fewer steps an epoch the hyper-parameters move too seldom (airline, 1.85 M rows, m = 100, 10 epochs: n / 8
# rows +0.0102 against the CPU's 200, 25,600 rows (73 steps) +0.0020, 3,200 (579 steps) +0.0003; 180,000 generated
# rows: 3,200 (57 steps) +0.0051, 400 (450 steps) +0.0003).
GPU_STEPS_PER_EPOCH = 512


def full_batch_max_rows(plan):
    """The most rows ``batch_size="auto"`` takes in full batch steps for a ``plan.FitPlan``:
    ``BINARY_BATCH_MAX_ROWS`` where the plan knows its rows to be ``binary_on_host`` (which holds for EP alone),
    else ``FULL_BATCH_MAX_ROWS``."""
    return BINARY_BATCH_MAX_ROWS if plan.binary_on_host else FULL_BATCH_MAX_ROWS


def binary_on_host(plan, X, y, n_rows, target_xp=None):
    """Whether a fit of ``plan`` takes ``BINARY_BATCH_MAX_ROWS`` as its full batch's bound: EP with
    ``batch_size="auto"`` on ``n_rows`` rows, more than ``FULL_BATCH_MAX_ROWS`` (below, the bound is the same),
    X held in memory as NumPy takes it (an array, a DataFrame, a list; ``target_xp`` None or NumPy: not a GPU's, a
    cluster's or a reference namespace's), and two classes (``plan.classes`` where given, else the distinct labels
    of y in memory). False wherever any of it is not known here: the labels' own checks come later, and say what is
    wrong. The bound applies to the rows a fit trains on: those left by early stopping's hold-out (``inputs.held_out``
    asks ``FitPlan.steps`` of them), as ``FULL_BATCH_MAX_ROWS`` does; rows that no hold-out brings within it are not
    read (False: the labels of a fit of millions of rows are not scanned for nothing)."""
    if plan.batch_size != "auto" or plan.method != "ep" or plan.ordinal or n_rows <= FULL_BATCH_MAX_ROWS:
        return False
    left = n_rows * (1.0 - plan.validation_fraction) if plan.early_stopping else n_rows
    if left > BINARY_BATCH_MAX_ROWS:
        return False
    if target_xp is not None and not B.is_numpy_namespace(target_xp):
        return False
    if not _in_host_memory(X):
        return False
    if plan.classes is not None:  # (as the model takes them: distinct)
        try:
            return np.unique(np.asarray(plan.classes)).size == 2
        except (TypeError, ValueError):
            return False
    if not _in_host_memory(y):
        return False
    try:
        return np.unique(np.asarray(y)).size == 2
    except (TypeError, ValueError):  # (mixed or odd labels: refused with their reason later, on minibatches here)
        return False


def _in_host_memory(a):
    """Whether ``a`` is held in memory as NumPy takes it (an array, a DataFrame, a list): not a dask array, data on
    disk, or another namespace's array (a GPU's, a reference namespace's)."""
    return not (B.is_dask_array(a) or B.is_out_of_core(a) or (B.is_array_api_obj(a) and not isinstance(a, np.ndarray)))


def rows_per_step(plan, n, xp=None, Z=None, n_classes=2):
    """Rows a step of the fit on n rows a ``plan.FitPlan`` describes (None: the full batch): its ``batch_size``,
    or for "auto" the full batch up to ``full_batch_max_rows`` rows (and for a batch-only method), else
    ``CPU_MINIBATCH``, or on a GPU (``xp`` and the initial inducing points ``Z`` given, a binary model)
    ``gpu_batch_rows``."""
    if plan.batch_size != "auto":
        return plan.batch_size
    if n <= full_batch_max_rows(plan) or not supports(plan.method, "minibatch"):
        return None
    rows = gpu_batch_rows(plan.method, n, xp, Z) if (xp is not None and Z is not None and n_classes == 2) else None
    return CPU_MINIBATCH if rows is None else rows


def gpu_batch_rows(method, n, xp, Z):
    """The GPU's minibatch for n rows (None off a GPU): ``gpu_rule_rows`` for the device of ``Z`` (its throughput
    for Z's dtype and its free memory)."""
    throughput = B.device_throughput(xp, Z.dtype, B.array_device(Z))
    if throughput is None:
        return None
    m, d, itemsize = Z.shape[-2], Z.shape[-1], xp.finfo(Z.dtype).bits // 8
    fit = B.rows_within_memory(blocks.block_bytes_per_row(m, d, itemsize), xp, B.array_device(Z))
    return gpu_rule_rows(method, n, m, throughput, fit, itemsize)


def gpu_rule_rows(method, n, m, throughput, fit_rows=None, itemsize=8):
    """The rows of a GPU minibatch step for n rows and m inducing points: ``backend.launch_bound_rows`` with
    ``methods.gpu_step_model(method)`` and the device's ``throughput``, at most n / ``GPU_STEPS_PER_EPOCH`` rows
    (rounded down to ``CPU_MINIBATCH`` times a power of two; never fewer than ``CPU_MINIBATCH``) and ``fit_rows``
    (what fits in one row block in ``backend.DEVICE_MEMORY_FRACTION`` of the free memory; None: no limit). Pure, so
    that a benchmark on the CPU can ask what a given GPU would take (docs/gpu.md)."""
    largest = n // GPU_STEPS_PER_EPOCH
    if fit_rows is not None:
        largest = min(largest, fit_rows)
    if largest > CPU_MINIBATCH:  # 200 times a power of two, as the launch-bound rows are: the sizes measured
        largest = CPU_MINIBATCH * 2 ** int(math.log2(largest / CPU_MINIBATCH))
    return B.launch_bound_rows(throughput, block_rows=largest, largest=largest, **_step_model(method, m, itemsize))


def gpu_step_seconds(method, rows, m, throughput, block_rows=None, itemsize=8):
    """The launch model's (host seconds of the launches, device seconds of the work) of one binary step of
    ``method`` on ``rows`` rows in blocks of ``block_rows`` (None: one block) with m inducing points
    (``backend.step_time`` with ``methods.gpu_step_model(method)``): the step takes about the larger of the two."""
    return B.step_time(throughput, rows, block_rows=block_rows or rows, **_step_model(method, m, itemsize))


def _step_model(method, m, itemsize):
    model = gpu_step_model(method)
    return {"launches": model["launches"], "block_launches": model["block_launches"],
            "flops_per_row": model["flops_per_row_m2"] * m * m,
            "bytes_per_row": model["elements_per_row_m"] * m * itemsize}


def gpu_block_rows(plan, batch_size, xp):
    """Row blocks of a GPU minibatch chosen by "auto": the whole minibatch (it was sized to fit in memory), so
    that a step launches its kernels once; None (the plan's ``block_rows``) otherwise."""
    if (plan.batch_size != "auto" or plan.block_rows is not None or batch_size is None
            or B.device_throughput(xp, xp.float64) is None):
        return None
    return batch_size
