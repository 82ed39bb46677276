"""What one counted step asks of a GPU: kernel launches, floating-point operations and bytes moved, from the events
of a ``array_counting.Tally`` (each array operation with the shapes of its array operands).

Every array operation is one kernel launch. Its arithmetic and memory traffic are estimated from the operand shapes:

- ``matmul`` of (..., p, q) and (..., q, r): 2 p q r flops (times the batch), reading both operands and writing
  the (p, r) result;
- ``linalg.solve`` of a (k, k) system with r right-hand sides: k^2 r flops, the triangular solve it stands for in
  agpc's generic ``solve_triangular`` (and ``cupyx.scipy.linalg.solve_triangular``, cuBLAS trsm, on the mocked CuPy);
  ``linalg.cholesky`` of (k, k): k^3 / 3;
- everything else (elementwise operations, reductions, indexing, ``vecdot``): one flop per element of its largest
  operand, reading every operand and writing an array the size of the largest one (a view, e.g. ``.mT`` or a slice,
  is counted as if it copied: an upper estimate).

Bytes are elements times the item size. This is the model behind docs/gpu.md and ``benchmarks/gpu.py``'s model
columns; a GPU run (gpu_tests/run_on_gpu.sh) checks it against measured step times.
"""

from __future__ import annotations

import math

__all__ = ["StepCost", "step_cost"]

_MATMULS = frozenset(("matmul", "linalg.matmul", "__matmul__", "__rmatmul__", "__imatmul__"))
_SOLVES = frozenset(("linalg.solve", "cupyx.scipy.linalg.solve_triangular"))  # (on CuPy: trsm)
_FREE = frozenset((".mT", ".T"))  # views: a transposed operand is read by the next kernel, not copied


class StepCost:
    """Launches, flops and bytes of one counted step."""

    def __init__(self, launches, flops, bytes_moved):
        self.launches, self.flops, self.bytes = int(launches), float(flops), float(bytes_moved)

    def seconds(self, throughput):
        """(host launch time, device time, modelled step time) on a ``agpc.backend.DeviceThroughput``: the host
        issues launches while the device works, so a step takes the longer of the two."""
        launch = self.launches * throughput.launch_seconds
        device = self.flops / throughput.flops + self.bytes / throughput.bytes
        return launch, device, max(launch, device)

    def __repr__(self):
        return f"StepCost(launches={self.launches}, flops={self.flops:.3g}, bytes={self.bytes:.3g})"


def _size(shape):
    return math.prod(shape) if shape else 1


def _event_cost(event):
    """(flops, elements moved) of one ``op`` event."""
    shapes = [tuple(s) for s in event.shapes]
    if event.name in _FREE or not shapes:
        return 0.0, 0.0
    if event.name in _MATMULS and len(shapes) >= 2 and len(shapes[0]) >= 2 and len(shapes[1]) >= 2:
        a, b = (shapes[1], shapes[0]) if event.name == "__rmatmul__" else (shapes[0], shapes[1])
        p, q, r = a[-2], a[-1], b[-1]
        batch = max(_size(a[:-2]), _size(b[:-2]))
        return 2.0 * p * q * r * batch, batch * (p * q + q * r + p * r)
    if event.name in _SOLVES and len(shapes) >= 2:
        k = shapes[0][-1]
        rhs = shapes[1][-1] if len(shapes[1]) >= 2 else 1
        return float(k * k * rhs), float(k * k + 2 * k * rhs)
    if event.name == "linalg.cholesky":
        k = shapes[0][-1]
        batch = _size(shapes[0][:-2])
        return batch * k ** 3 / 3.0, 2.0 * batch * k * k
    largest = max(_size(s) for s in shapes)
    return float(largest), float(sum(_size(s) for s in shapes) + largest)


def step_cost(tally, itemsize):
    """The ``StepCost`` of the ``op`` events of ``tally`` (fold agpc.backend's generic special functions first, as
    ``Tally.folded`` does, so that each counts as the one kernel it is on CuPy), for arrays of ``itemsize`` bytes."""
    launches, flops, elements = 0, 0.0, 0.0
    for event in tally.events:
        if event.kind != "op":
            continue
        launches += 1
        f, e = _event_cost(event)
        flops += f
        elements += e
    return StepCost(launches, flops, elements * itemsize)
