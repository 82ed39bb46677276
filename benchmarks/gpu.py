"""One training step, ready for a GPU: time per step on NumPy (and on CuPy where CUDA is present, next to the
launch model's prediction, and at the batch ``batch_size="auto"`` picks there), the step divided by one GEMM of
shape (batch x m)(m x m), rows per second, and the step's array operations (on a GPU: kernel launches) and host
synchronisations.

Protocol, options and commands: benchmarks/README.md, section "gpu.py".
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _runner import begin, end, numbers, options, parse, parse_list, row
from _runner import header as table_header

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # array_counting, shared with the tests

METHODS = ("sep", "ep", "svi", "batch-ep")
NO_GPU = "no GPU on this machine"
AUTO = "auto"  # a --batches value: the rows batch_size="auto" picks on the GPU for --auto-n rows
# agpc.backend's standard-only special functions: the counting namespace is not NumPy to agpc.backend, so log Phi
# takes its generic series there; it is counted as the one operation it is on NumPy and CuPy (as
# tests/test_step_budgets.py counts it)
GENERIC_FALLBACKS = ("_log_ndtr_generic",)
N_FEATURES = 8  # in 8 dimensions m <= 1000 Gaussian inducing points keep K(Z, Z) well conditioned at lengthscale 1
JITTER = 1e-6


def parse_args(argv=None):
    p = options(__doc__, "m = 20, 50; batch = 60, 150; 2 repeats; one BLAS thread")
    p.add_argument("--ms", default=None, help="comma-separated m values (default 100,200,500,1000)")
    p.add_argument("--batches", default=None,
                   help="comma-separated batch sizes, or auto: the GPU's own (default 200,1000,10000,auto)")
    p.add_argument("--auto-n", type=float, default=1e8,
                   help="training rows n for which the auto batch is picked (default 1e8: at most n / 512 = "
                        "102,400 rows; fewer where the device's arithmetic covers its launches sooner)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)}")
    p.add_argument("--dtypes", default="float64,float32", help="comma-separated: float64, float32")
    p.add_argument("--repeats", type=int, default=None, help="timed steps per configuration, median (default 5)")
    p.add_argument("--max-step-seconds", type=float, default=20.0,
                   help="skip a configuration whose first step took longer than this (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", action="store_true",
                   help="print docs/gpu.md's model table (launches, bytes, H100 time; m = 200, 1000 x batch = 200, "
                        "2000, 20000 unless --ms / --batches) instead of timing")
    model = "--model" in (sys.argv[1:] if argv is None else argv)
    args = parse(p, argv, full=dict(ms="200,1000" if model else "100,200,500,1000", repeats=5,
                                    batches="200,2000,20000" if model else "200,1000,10000,auto"),
                 quick=dict(ms="20,50", batches="60,150", repeats=2, blas_threads=1))
    args.ms, args.auto_n = numbers(args.ms), int(args.auto_n)
    args.batches = [AUTO if b == AUTO else int(float(b)) for b in parse_list(args.batches)]
    args.methods = parse_list(args.methods, METHODS, "method")
    args.dtypes = parse_list(args.dtypes, ("float64", "float32"), "dtype")
    return args


# -- what this branch and this machine have -----------------------------------------------------------------

def gpu_namespace():
    """(array_api_compat.cupy, None) where CuPy can compute on a CUDA device (``agpc.backend.check_device``: a
    device, a driver and the CUDA libraries), else (None, why not)."""
    from agpc import backend

    try:
        backend.check_device()
    except backend.DeviceUnavailableError as exc:
        return None, str(exc)
    import array_api_compat.cupy as xp

    return xp, None


# -- one configuration --------------------------------------------------------------------------------------

def make_problem(m, batch, method, dtype, seed):
    """Host arrays (X, y, Z) for ``method`` at (m, batch) in ``dtype``."""
    rng = np.random.default_rng(seed)
    n = batch if method == "batch-ep" else 2 * batch
    X = rng.standard_normal((n, N_FEATURES))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1] * X[:, 2] - 0.3 * X[:, 3] ** 2 + 0.3 * X[:, 4:].sum(axis=1)
    y = np.where(f + 0.1 * rng.standard_normal(n) > 0, 1.0, -1.0)
    Z = rng.standard_normal((m, N_FEATURES))
    return X.astype(dtype), y.astype(dtype), Z.astype(dtype)


class Step:
    """A warmed-up trainer for one configuration in namespace ``xp``; calling it takes one step."""

    def __init__(self, xp, problem, method, batch, block_rows=None):
        from agpc import backend
        from agpc.inference import engines, training
        from agpc.kernels import RBF

        X, y, Z = (xp.asarray(a) for a in problem)
        kernel = RBF(lengthscales=[1.0] * N_FEATURES, amplitude=1.0, noise=1e-3).for_inputs(X)
        minibatch = method != "batch-ep"
        self.X, self.y, self.batch, self.minibatch = X, y, batch, minibatch
        jitter = max(JITTER, backend.jitter_floor(Z))  # the estimator's: 1e-6, raised to the floor for Z's type
        self.trainer = training.Trainer(engines.make_engine("ep" if method == "batch-ep" else method, kernel, Z,
                                                            n_total=X.shape[0], minibatch=minibatch, jitter=jitter,
                                                            block_rows=block_rows))
        self.calls = 0
        # warm-up: the optimiser's state, compiled kernels on a GPU; a step the training loop's guard refused
        # (it raises the jitter or halves the steps and the next one goes on) is not one to time
        for _ in range(3):
            if self.take():
                break
        else:
            raise FloatingPointError("three warm-up steps failed on the benchmark data")

    def take(self):
        """One step; True when the guard took it (a finite log Z)."""
        lo = (self.calls % 2) * self.batch if self.minibatch else 0
        self.calls += 1
        took, _, log_z = self.trainer.step(self.X, self.y, lo, lo + self.batch, stepping=True)
        return took and np.isfinite(log_z)

    def __call__(self):
        if not self.take():
            raise FloatingPointError(f"a timed {self.trainer.method} step failed (the guard refused it)")


def time_numpy(step, repeats, max_seconds):
    """Seconds per step (median), or None when the first step exceeded ``max_seconds``."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if times[0] > max_seconds:
            return None
    return statistics.median(times)


def time_gemm(m, batch, dtype, rounds=5, min_seconds=0.02):
    """Seconds of one (batch x m) @ (m x m) product on NumPy: the median over ``rounds`` of the mean of a loop of
    at least ``min_seconds`` (a shared machine perturbs single timings)."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal((batch, m)).astype(dtype)
    B = rng.standard_normal((m, m)).astype(dtype)
    A @ B
    means = []
    for _ in range(rounds):
        loops, elapsed = 0, 0.0
        t0 = time.perf_counter()
        while elapsed < min_seconds:
            A @ B
            loops += 1
            elapsed = time.perf_counter() - t0
        means.append(elapsed / loops)
    return statistics.median(means)


def count_step(problem, method, batch):
    """(array operations, host synchronisations, ``step_cost.StepCost``) of one step, counted on
    array_api_compat.numpy."""
    import array_api_compat.numpy as base
    from array_counting import CountingNamespace
    from step_cost import step_cost

    namespace = CountingNamespace(base)
    step = Step(namespace, problem, method, batch)
    with namespace.counting() as tally:
        step()
    folded = tally.folded(GENERIC_FALLBACKS)
    counts = folded.counts()
    return counts["op"], counts["syncs"], step_cost(folded, problem[0].dtype.itemsize)


def model_cell(cost, dtype):
    """docs/gpu.md's model of the step's time on an H100 SXM, in ms ("L": its launches set it)."""
    from agpc.backend import DeviceThroughput

    h100 = DeviceThroughput("H100 SXM", 66.9e12 if dtype == "float32" else 33.5e12, 3.35e12)
    launch, device, step = cost.seconds(h100)
    return _ms(step) + (" L" if launch >= device else "")


def launch_model_cell(xp, method, batch, m, dtype, block_rows):
    """The launch model's time of the step on this GPU (``agpc.batch_size.gpu_step_seconds`` with the device's
    throughput; batch EP priced as an EP step), in ms ("L": its launches set it)."""
    from agpc.backend import device_throughput
    from agpc.batch_size import gpu_step_seconds

    launch, work = gpu_step_seconds("ep" if method == "batch-ep" else method, batch, m, device_throughput(xp, dtype),
                                    block_rows, np.dtype(dtype).itemsize)
    return _ms(max(launch, work)) + (" L" if launch >= work else "")


def auto_batch(xp, method, m, dtype, n):
    """The rows ``batch_size="auto"`` picks on this GPU for n rows and m inducing points of ``dtype`` (all n up to
    ``agpc.batch_size.FULL_BATCH_MAX_ROWS``)."""
    from agpc import GPClassifier
    from agpc.batch_size import rows_per_step
    from agpc.plan import FitPlan

    Z = xp.zeros((m, N_FEATURES), dtype=getattr(xp, dtype))
    params = GPClassifier(method=method, n_inducing=m, dtype=dtype).get_params()
    return rows_per_step(FitPlan.of("GPClassifier", params), n, xp, Z) or n


def time_gpu(xp, problem, method, batch, dtype, repeats, block_rows=None):
    """(GPU seconds per step, GPU seconds of the GEMM, synchronisations of one step, the launch model's cell), GPU
    times the medians of ``cupyx.profiler.benchmark`` (named: it reads a callable's ``__name__`` otherwise, which
    a ``Step`` has not)."""
    import cupy
    from cupy_syncs import counting_syncs
    from cupyx.profiler import benchmark

    from agpc.inference.blocks import default_block_rows

    step = Step(xp, problem, method, batch, block_rows)
    step_times = benchmark(step, n_repeat=repeats, n_warmup=1, name=f"{method} step").gpu_times[0]
    with counting_syncs(cupy) as syncs:
        step()
    m = problem[2].shape[0]
    rng = np.random.default_rng(1)
    A = xp.asarray(rng.standard_normal((batch, m)).astype(dtype))
    B = xp.asarray(rng.standard_normal((m, m)).astype(dtype))
    gemm_times = benchmark(lambda: A @ B, n_repeat=max(repeats, 10), n_warmup=2, name="gemm").gpu_times[0]
    # the blocks the step ran in: its own, or those a pass of `batch` rows takes by default on this device
    blocks = step.trainer.engine.block_rows or default_block_rows(step.trainer.state["Z"], batch)
    return (float(np.median(step_times)), float(np.median(gemm_times)), syncs.count,
            launch_model_cell(xp, method, batch, m, dtype, blocks))


# -- the table ----------------------------------------------------------------------------------------------

def _ms(seconds):
    return f"{1e3 * seconds:.3g}"


def _rate(rows, seconds):
    return f"{rows / seconds:,.0f}"


def run(args):
    """The table; 1 when a configuration failed (its row says how), else 0."""
    gpu_xp, no_gpu_reason = gpu_namespace()
    if gpu_xp is None and os.environ.get("AGPC_REQUIRE_CUDA"):  # (gpu_tests/run_on_gpu.sh: a GPU run must be one)
        print(f"AGPC_REQUIRE_CUDA is set but there is no usable GPU: {no_gpu_reason}", file=sys.stderr)
        return 2
    header = ["method", "m", "batch", "dtype", "NumPy ms/step", "GEMM ms", "step/GEMM", "NumPy rows/s", "ops",
              "syncs", "model ms (H100)"]
    header += (["GPU ms/step", "GPU model ms", "GPU step/GEMM", "GPU rows/s", "GPU speed-up", "GPU syncs"]
               if gpu_xp is not None else ["GPU"])
    table_header(header)
    failed = []
    for method in args.methods:
        for m in args.ms:
            for batch in args.batches:
                # the GPU's own minibatch: picked on a device, for the minibatch methods
                if batch == AUTO and (gpu_xp is None or method == "batch-ep"):
                    continue
                for dtype in args.dtypes:
                    cells = [method, str(m), str(batch), dtype]
                    try:
                        rows = batch
                        if batch == AUTO:
                            rows = auto_batch(gpu_xp, method, m, dtype, args.auto_n)
                            cells[2] = f"auto: {rows:,}"
                        cells += config_cells(args, gpu_xp, method, m, rows, dtype, auto=batch == AUTO)
                    except Exception as exc:  # one configuration's failure is its row's: the table goes on
                        failed.append(" ".join(cells))
                        cells += [f"failed ({type(exc).__name__}: {exc})"[:160]] + ["-"] * (len(header) - 5)
                    row(*cells)
    if gpu_xp is None:
        print(f"\nGPU columns: {NO_GPU} ({no_gpu_reason}); the GPU's own batch (auto) needs one.")
    if failed:
        print(f"\nFailed configurations ({len(failed)}): {'; '.join(failed)}.")
    return 1 if failed else 0


def config_cells(args, gpu_xp, method, m, batch, dtype, auto=False):
    import array_api_compat.numpy as np_xp

    problem = make_problem(m, batch, method, dtype, args.seed)
    if auto:  # 10^4-10^6 rows: seconds a step on NumPy, so the GPU's own batch is timed on the GPU alone
        cells = ["-"] * 7
    else:
        step_seconds = time_numpy(Step(np_xp, problem, method, batch), args.repeats, args.max_step_seconds)
        if step_seconds is None:
            return [f"skipped (first step > {args.max_step_seconds:g} s)"] + ["-"] * (12 if gpu_xp is not None else 7)
        gemm_seconds = time_gemm(m, batch, dtype)
        cells = [_ms(step_seconds), _ms(gemm_seconds), f"{step_seconds / gemm_seconds:.1f}",
                 _rate(batch, step_seconds)]
        ops, syncs, cost = count_step(problem, method, batch)
        cells += [str(ops), str(syncs), model_cell(cost, dtype)]
        if gpu_xp is None:
            return cells + [NO_GPU]
    # the auto batch runs as the estimator runs it on a GPU: one row block (agpc.batch_size.gpu_block_rows)
    gpu_step, gpu_gemm, gpu_syncs, predicted = time_gpu(gpu_xp, problem, method, batch, dtype, args.repeats,
                                                        block_rows=batch if auto else None)
    return cells + [_ms(gpu_step), predicted, f"{gpu_step / gpu_gemm:.1f}", _rate(batch, gpu_step),
                    "-" if auto else f"{step_seconds / gpu_step:.1f}x", str(gpu_syncs)]


def model_table(args):
    """docs/gpu.md's table: each step counted on a mocked CuPy, priced on an H100 SXM."""
    import pytest
    from cupy_mock import MockCupy
    from step_cost import step_cost

    from agpc.backend import DeviceThroughput
    from agpc.inference import engines, training
    from agpc.kernels import RBF

    table_header(["method", "m", "batch", "dtype", "blocks", "launches", "GFLOP", "MB moved", "launch ms", "device ms",
                  "model ms", "bound by"])
    for method in [m for m in args.methods if m != "batch-ep"]:
        for m in args.ms:
            for batch in [b for b in args.batches if b != AUTO]:  # (auto_batch_table: the GPU's own batch)
                for dtype in args.dtypes:
                    for one_block in (False, True):
                        with pytest.MonkeyPatch.context() as patch:
                            mock = MockCupy(patch)
                            X, y, Z = (mock.put(a) for a in make_problem(m, batch, method, dtype, args.seed))
                            kernel = RBF(lengthscales=[1.0] * N_FEATURES, amplitude=1.0, noise=1e-3).for_inputs(X)
                            trainer = training.Trainer(engines.make_engine(method, kernel, Z, n_total=2 * batch,
                                minibatch=True, jitter=max(JITTER, 100 * m * float(np.finfo(dtype).eps)),
                                block_rows=batch if one_block else None))
                            trainer.step(X, y, 0, batch, stepping=True)
                            with mock.xp.counting() as tally:
                                trainer.step(X, y, batch, 2 * batch, stepping=True)
                        cost = step_cost(tally.folded(GENERIC_FALLBACKS), np.dtype(dtype).itemsize)
                        h100 = DeviceThroughput("H100 SXM", 66.9e12 if dtype == "float32" else 33.5e12, 3.35e12)
                        launch, device, step = cost.seconds(h100)
                        blocks = "one" if one_block else "default"
                        row(method, m, batch, dtype, blocks, cost.launches, f"{cost.flops / 1e9:.3g}",
                            f"{cost.bytes / 1e6:.3g}", _ms(launch), _ms(device), _ms(step),
                            "launches" if launch >= device else "arithmetic")
    auto_batch_table()


def auto_batch_table():
    """The rows a step ``batch_size="auto"`` takes on three GPUs (device properties mocked), n = 10^8."""
    import pytest
    from cupy_mock import A100_PROPERTIES, H100_PROPERTIES, RTX4090_PROPERTIES, MockCupy

    from agpc import GPClassifier

    ms = (100, 200, 500, 1000)
    print("\nbatch_size='auto' on a GPU (SEP / EP / ADF; n = 10^8 rows, 40 GiB free):\n")
    table_header(["device", "dtype", *(f"m = {m}" for m in ms)])
    for name, properties in (("H100 SXM", H100_PROPERTIES), ("A100 SXM", A100_PROPERTIES),
                             ("RTX 4090", RTX4090_PROPERTIES)):
        for dtype in ("float64", "float32"):
            cells = []
            for m in ms:
                with pytest.MonkeyPatch.context() as patch:
                    mock = MockCupy(patch, properties=properties)
                    Z = mock.put(np.zeros((m, N_FEATURES)), dtype=dtype)
                    cells.append(f"{GPClassifier(method='sep', dtype=dtype)._batch_size_for(10**8, mock.xp, Z):,}")
            row(name, dtype, *cells)


def main(argv=None):
    args = parse_args(argv)
    title = "One training step on a GPU, modelled" if args.model else "One training step on NumPy and on a GPU"
    started = begin(f"{title} (benchmarks/gpu.py)", args, argv)
    status = model_table(args) if args.model else run(args)
    end(started)
    return status


if __name__ == "__main__":
    sys.exit(main())
