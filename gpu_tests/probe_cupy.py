"""What the GPU tests assume about CuPy, checked on a real device (run by gpu_tests/run_on_gpu.sh).

The tests that run without a GPU mock CuPy (tests/cupy_mock.py) on what CuPy 14's source says. This script asks a
real CUDA device the questions only it can answer, and prints one Markdown section per question:

1. the device, CuPy, CUDA, and the throughput agpc reads from the device's properties;
2. stream capture: are cuBLAS (``@``, ``solve_triangular``) and cuSOLVER (``cholesky``) calls refused during capture
   (why CUDA-graph replay was removed), and is an elementwise kernel captured;
3. a failed Cholesky factorisation: what CuPy returns (its diagonal) for an indefinite matrix and for NaN input, and
   whether ``agpc.backend.factor_failure`` flags it; what ``cupyx.errstate(linalg="raise")`` does;
4. ``cupyx.allow_synchronize(False)``: which paths to the host it catches;
5. tests/cupy_syncs.py's counter: each path counted exactly once;
6. ``agpc.backend.row_dot``'s reduction kernel against NumPy, float64 and float32;
7. float32: a float32 fit on the GPU against NumPy's float32 and float64 fits; TF32 (``CUPY_TF32``); flush-to-zero;
8. the host time of one CuPy operation (the model's ``LAUNCH_SECONDS``) and the minibatch ``batch_size="auto"``
   picks;
9. the host and device time of each library call a step makes through CuPy (``solve_triangular``, ``cholesky``,
   ``row_dot``'s reduction kernel), which the launch model counts as one launch each.

Exit status 0 when every probe ran, 1 when one raised (its section says what), 2 when CuPy cannot compute here.

    python gpu_tests/probe_cupy.py                 # all probes
    python gpu_tests/probe_cupy.py --check-device  # only whether CuPy can compute here (exit 2 if not)
    python gpu_tests/probe_cupy.py --quick         # small float32 fits
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import traceback

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from agpc import backend as B  # noqa: E402

PROBES = []
# the float32 fits, and the calls timed by the library-call probe (--quick: smaller, fewer)
SIZES = {"rows": 3000, "test_rows": 2000, "n_inducing": 50, "max_iter": 30, "repeats": 200, "warmups": 10}


def probe(title):
    def register(function):
        PROBES.append((title, function))
        return function

    return register


def _line(text):
    print(text, flush=True)


@probe("Device, CuPy and CUDA")
def device_facts(cupy):
    runtime = cupy.cuda.runtime
    device = runtime.getDevice()
    props = runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    _line(f"- device {device}: {name}, compute capability {props['major']}.{props['minor']}, "
          f"{props['multiProcessorCount']} multiprocessors at {props['clockRate'] / 1e6:.3g} GHz, "
          f"{props['totalGlobalMem'] / 2**30:.1f} GiB")
    _line(f"- CuPy {cupy.__version__}; CUDA runtime {runtime.runtimeGetVersion()}, driver {runtime.driverGetVersion()}")
    _line(f"- CUPY_TF32={os.environ.get('CUPY_TF32', '(unset)')}")
    for dtype in ("float64", "float32"):
        _line(f"- agpc.backend.device_throughput({dtype}): {B.device_throughput(_xp(), dtype)}")


@probe("Stream capture: which calls CuPy refuses (why step_replay was removed)")
def capture(cupy):
    import cupyx.scipy.linalg

    a = cupy.asarray(np.eye(4) * 2.0)
    b = cupy.ones((4, 4))
    cases = {"elementwise (a * 2 + 1)": lambda: a * 2.0 + 1.0, "cuBLAS: a @ b": lambda: a @ b,
             "cuBLAS: solve_triangular": lambda: cupyx.scipy.linalg.solve_triangular(a, b, lower=True),
             "cuSOLVER: cholesky": lambda: cupy.linalg.cholesky(a)}
    for name, call in cases.items():
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                out = call()
                outcome = "captured"
            except Exception as exc:  # the refusal is what is asked about
                out, outcome = None, f"refused: {type(exc).__name__}: {exc}"
            graph = stream.end_capture()
            if out is not None:
                graph.launch()
        stream.synchronize()
        _line(f"- {name}: {outcome}")


@probe("A failed Cholesky factorisation")
def failed_cholesky(cupy):
    import cupyx

    indefinite = np.array([[4.0, 2.0, 0.0, 0.0], [2.0, 1.0, 0.5, 0.0], [0.0, 0.5, 3.0, 0.1], [0.0, 0.0, 0.1, 2.0]])
    cases = {"indefinite (LAPACK stops at pivot 2)": indefinite, "NaN entry": np.where(np.eye(4) == 1, np.nan, 0.1),
             "positive definite": np.eye(4) * 2.0}
    for name, matrix in cases.items():
        L = cupy.linalg.cholesky(cupy.asarray(matrix))
        diag = np.diag(L.get())
        flag = float(B.factor_failure(L).get())
        _line(f"- {name}: diagonal {np.array2string(diag, precision=4)}; finite {bool(np.all(np.isfinite(L.get())))}; "
              f"factor_failure {flag}")
        try:
            with cupyx.errstate(linalg="raise"):
                cupy.linalg.cholesky(cupy.asarray(matrix))
            _line("  - under cupyx.errstate(linalg='raise'): no error")
        except Exception as exc:  # what CuPy raises is the answer
            _line(f"  - under cupyx.errstate(linalg='raise'): {type(exc).__name__}: {exc}")


def _paths_to_the_host(cupy):
    """{name: a call that synchronises with the device} for each path a step could take to the host."""
    x = cupy.ones(())
    return {"ndarray.get": lambda: x.get(), "float()": lambda: float(x), "bool()": lambda: bool(x),
            "item()": lambda: x.item(), "tolist()": lambda: x.tolist(), "cupy.asnumpy": lambda: cupy.asnumpy(x),
            "Stream.synchronize": lambda: cupy.cuda.get_current_stream().synchronize(),
            "Event.synchronize": lambda: cupy.cuda.Event().synchronize(),
            "Device.synchronize (a Cython method: not interceptable)": lambda: cupy.cuda.Device().synchronize()}


@probe("cupyx.allow_synchronize(False): what it catches")
def allow_synchronize(cupy):
    import cupyx

    if not hasattr(cupyx, "allow_synchronize"):
        _line("- this CuPy has no cupyx.allow_synchronize")
        return
    for name, call in _paths_to_the_host(cupy).items():
        try:
            with cupyx.allow_synchronize(False):
                call()
            _line(f"- {name}: not caught")
        except Exception as exc:  # DeviceSynchronized is the catch
            _line(f"- {name}: caught ({type(exc).__name__})")


@probe("tests/cupy_syncs.py: each path to the host counted once")
def sync_counter(cupy):
    from cupy_syncs import counting_syncs

    for name, call in _paths_to_the_host(cupy).items():
        with counting_syncs(cupy) as syncs:
            call()
        _line(f"- {name}: counted {syncs.count}")


@probe("agpc.backend.row_dot: one reduction kernel against NumPy")
def row_dot(cupy):
    xp = _xp()
    rng = np.random.default_rng(0)
    for dtype in ("float64", "float32"):
        A, C = rng.standard_normal((2000, 300)).astype(dtype), rng.standard_normal((2000, 300)).astype(dtype)
        for axis in (-1, -2):
            got = B.row_dot(xp.asarray(A), xp.asarray(C), axis=axis).get()
            ref = np.sum(A.astype(np.float64) * C, axis=axis)
            _line(f"- {dtype}, axis {axis}: max relative error {np.max(np.abs(got - ref) / np.abs(ref).max()):.2e}")


@probe("float32 on the GPU: accuracy, TF32, flush-to-zero")
def float32(cupy):
    from agpc import GPClassifier
    from agpc.datasets import make_banana

    X, y = make_banana(SIZES["rows"], random_state=1)
    X_test, y_test = make_banana(SIZES["test_rows"], random_state=2)
    options = dict(n_inducing=SIZES["n_inducing"], max_iter=SIZES["max_iter"], random_state=0)
    results = {}
    for name, dtype, data in (("NumPy float64", "float64", X), ("NumPy float32", "float32", X),
                              ("CuPy float32", "float32", cupy.asarray(X))):
        model = GPClassifier(dtype=dtype, **options).fit(data, y)
        proba = model.predict_proba(X_test)
        proba = proba.get() if hasattr(proba, "get") else proba
        nll = -np.mean(np.log(np.clip(proba[np.arange(len(y_test)), (y_test == model.classes_[1]).astype(int)],
                                      1e-300, None)))
        results[name] = (proba, nll, getattr(model, "tf32_", None))
        _line(f"- {name}: test NLL {nll:.5f}, tf32_ {results[name][2]}")
    reference = results["NumPy float64"][0]
    for name in ("NumPy float32", "CuPy float32"):
        _line(f"- {name} against NumPy float64: max |p - p64| {np.max(np.abs(results[name][0] - reference)):.2e}")
    tiny = cupy.asarray(np.array([1e-39, 1e-45], dtype=np.float32))
    _line(f"- flush-to-zero: float32 [1e-39, 1e-45] * 1 on the GPU gives {(tiny * np.float32(1.0)).get()} "
          f"(NumPy: {np.array([1e-39, 1e-45], dtype=np.float32) * np.float32(1.0)})")


@probe("Launch overhead and the GPU minibatch")
def launches(cupy):
    from agpc import GPClassifier

    x = cupy.ones(())
    for _ in range(100):
        x = x + 1.0
    cupy.cuda.Device().synchronize()
    started = time.perf_counter()
    for _ in range(2000):
        x = x + 1.0
    issued = time.perf_counter() - started
    cupy.cuda.Device().synchronize()
    _line(f"- host time per CuPy addition: {issued / 2000 * 1e6:.2f} us (the model assumes "
          f"{B.LAUNCH_SECONDS * 1e6:.3g} us)")
    xp = _xp()
    for m in (200, 1000):
        for dtype in ("float64", "float32"):
            Z = xp.asarray(np.random.default_rng(0).standard_normal((m, 8)).astype(dtype))
            rows = GPClassifier(n_inducing=m, method="sep", dtype=dtype)._batch_size_for(10**8, xp, Z)
            _line(f"- batch_size='auto' at m = {m}, {dtype}, n = 10^8: {rows} rows a step")


@probe("Host time of the library calls a step makes (the launch model counts each as one launch)")
def library_calls(cupy):
    from cupyx.profiler import benchmark

    xp = _xp()
    rng = np.random.default_rng(0)
    rows = 200  # the CPU's minibatch: a step's (rows x m) blocks
    for dtype in ("float64", "float32"):
        for m in (100, 200):
            A = rng.standard_normal((m, m))
            K = xp.asarray((A @ A.T / m + np.eye(m)).astype(dtype))
            L = xp.linalg.cholesky(K)
            R = xp.asarray(rng.standard_normal((m, rows)).astype(dtype))
            P = xp.asarray(rng.standard_normal((rows, m)).astype(dtype))
            # agpc's own calls, as a step makes them (agpc.backend: through array-api-compat and agpc's wrappers)
            calls = {"cupyx.scipy.linalg.solve_triangular (m x m, m x 200)": lambda: B.solve_triangular(L, R),
                     "cupy.linalg.cholesky (m x m)": lambda: xp.linalg.cholesky(K),
                     "agpc.backend.cholesky_or_nan (cholesky and factor_failure)": lambda: B.cholesky_or_nan(K),
                     "row_dot's ReductionKernel (200 x m)": lambda: B.row_dot(P, P),
                     "one elementwise kernel (200 x m + 1.0)": lambda: P + 1.0}
            for name, call in calls.items():
                timed = benchmark(call, n_repeat=SIZES["repeats"], n_warmup=SIZES["warmups"], name=name)
                host, device = float(np.median(timed.cpu_times)), float(np.median(timed.gpu_times[0]))
                _line(f"- {dtype}, m = {m}: {name}: host {host * 1e6:.1f} us a call "
                      f"({host / B.LAUNCH_SECONDS:.1f} x LAUNCH_SECONDS), device {device * 1e6:.1f} us")


def _xp():
    import array_api_compat.cupy as xp

    return xp


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check-device", action="store_true", help="only check that CuPy can compute here")
    parser.add_argument("--quick", action="store_true", help="small float32 fits (a smoke test of the probes)")
    args = parser.parse_args(argv)
    if args.quick:
        SIZES.update(rows=200, test_rows=100, n_inducing=8, max_iter=3, repeats=3, warmups=1)
    try:
        B.check_device()
    except B.DeviceUnavailableError as exc:
        _line(f"CuPy cannot compute on this machine: {exc}")
        return 2
    if args.check_device:
        _line("CuPy can compute here.")
        return 0
    import cupy

    failed = []
    for title, function in PROBES:
        _line(f"\n### {title}\n")
        try:
            function(cupy)
        except Exception:  # every probe is reported, and the next one runs
            failed.append(title)
            _line("FAILED:\n```\n" + traceback.format_exc() + "```")
    _line(f"\nProbes failed: {', '.join(failed) if failed else 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
