"""The replayed minibatch step (``GPClassifier(step_replay=True)``, ``agpc.inference.replay``): what it leaves
outside the CUDA graph, and on a GPU what it saves.

Columns:
- eager ops: one ordinary minibatch step (``Trainer.step``), its array operations counted through
  ``CountingNamespace`` (tests/array_counting.py) over ``array_api_compat.numpy``: on a GPU, kernel launches;
- buffered ops: the same step through the fixed-shape buffers (``ReplayedEvaluation`` with capture off);
- in the graph: of those, the evaluation on the buffers (what one ``graph.launch()`` replaces on a GPU);
- outside: what still launches one by one (filling the buffers, the ``apply`` half: the site / factor update
  and the optimiser's step; when a graph is replayed, plus one copy of each array ``apply`` keeps);
- syncs: host synchronisations of the buffered step (the summary's one transfer);
- GPU ms / step eager and replayed: ``cupyx.profiler.benchmark`` (GPU time, median) where CuPy and a CUDA
  device are present; otherwise the table says "no GPU on this machine".
Each step is measured after two warm-up steps (the optimiser's state exists; a replayed step has captured).

    PYTHONPATH=. python benchmarks/replay.py            # m = 100, 500 x batch = 200, 1000
    PYTHONPATH=. python benchmarks/replay.py --quick    # m = 20, batch = 60
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # array_counting.CountingNamespace, shared with the tests
from _machine import print_machine  # noqa: E402
from gpu import GENERIC_FALLBACKS, JITTER, N_FEATURES, NO_GPU  # noqa: E402 (benchmarks/gpu.py: one counting rule)

METHODS = ("sep", "ep", "adf", "svi")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke-test setting (m = 20, batch = 60, sep and svi)")
    parser.add_argument("--ms", default="100,500", help="comma-separated m values")
    parser.add_argument("--batches", default="200,1000", help="comma-separated batch sizes")
    parser.add_argument("--repeats", type=int, default=20, help="GPU timing repeats")
    return parser.parse_args(argv)


def make_trainer(put, method, m, batch, replayed, capture):
    """A minibatch trainer on 2 x batch + batch // 2 rows (the third minibatch padded), after two steps."""
    from agpc.inference import replay, training
    from agpc.kernels import RBF

    rng = np.random.default_rng(0)
    n = 2 * batch + batch // 2
    X_host = rng.standard_normal((n, N_FEATURES))
    y_host = np.where(np.sin(X_host[:, 0]) + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    X, y = put(X_host), put(y_host)
    kernel = RBF(lengthscales=[1.0] * N_FEATURES, amplitude=1.0, noise=1e-3).for_inputs(X)
    Z = put(rng.standard_normal((m, N_FEATURES)))
    trainer = training.Trainer(kernel, Z, method=method, n_total=n, minibatch=True, jitter=JITTER)
    if replayed:
        trainer.replayed = replay.ReplayedEvaluation(trainer.engine, batch, capture=capture)
    batches = [(0, batch), (batch, 2 * batch), (2 * batch, n)]
    for lo, hi in batches[:2]:
        trainer.step(X, y, lo, hi, stepping=True)
    return trainer, X, y, batches


def counts(method, m, batch):
    """(eager ops, buffered ops, ops in the graph, buffered syncs) of the padded third step."""
    import array_api_compat.numpy as base
    from array_counting import CountingNamespace

    out = {}
    for name in ("eager", "buffered"):
        namespace = CountingNamespace(base)
        trainer, X, y, batches = make_trainer(lambda v: namespace.asarray(v), method, m, batch, name == "buffered",
                                              capture=False)
        lo, hi = batches[2]
        with namespace.counting() as tally:
            trainer.step(X, y, lo, hi, stepping=True)
        out[name] = tally.folded(GENERIC_FALLBACKS).counts()
        if name == "buffered":
            trainer.replayed.fill_buffers(X, y, lo, hi)
            with namespace.counting() as tally:
                trainer.replayed.evaluate_buffers(True)
            out["graph"] = tally.folded(GENERIC_FALLBACKS).counts()
    return out["eager"]["op"], out["buffered"]["op"], out["graph"]["op"], out["buffered"]["syncs"]


def gpu_times(method, m, batch, repeats):
    """(eager, replayed) GPU ms per step, or None without CuPy and a CUDA device."""
    try:
        import array_api_compat.cupy as xp
        import cupy
        from cupyx.profiler import benchmark

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    times = []
    for replayed in (False, True):
        trainer, X, y, batches = make_trainer(lambda v: xp.asarray(np.asarray(v)), method, m, batch, replayed,
                                              capture=True)
        lo, hi = batches[0]
        run = benchmark(lambda: trainer.step(X, y, lo, hi, stepping=True), n_repeat=repeats, n_warmup=2)
        times.append(1e3 * float(np.median(run.gpu_times[0])))
    return times


def main(argv=None):
    args = parse_args(argv)
    ms = [20] if args.quick else [int(v) for v in args.ms.split(",")]
    batches = [60] if args.quick else [int(v) for v in args.batches.split(",")]
    methods = ("sep", "svi") if args.quick else METHODS
    print_machine("The replayed minibatch step: operations left outside the graph (benchmarks/replay.py)", argv)
    print("| method | m | batch | eager ops | buffered ops | in the graph | outside | syncs | GPU ms eager | GPU ms replayed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method in methods:
        for m in ms:
            for batch in batches:
                eager, buffered, graph, syncs = counts(method, m, batch)
                gpu = gpu_times(method, m, batch, 2 if args.quick else args.repeats)
                gpu_cells = [NO_GPU, NO_GPU] if gpu is None else [f"{t:.3g}" for t in gpu]
                print(f"| {method} | {m} | {batch} | {eager} | {buffered} | {graph} | {buffered - graph} | {syncs} | "
                      + " | ".join(gpu_cells) + " |", flush=True)


if __name__ == "__main__":
    main()
