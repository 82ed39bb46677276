"""benchmarks/gpu.py end to end with CuPy mocked (tests/cupy_mock.py, whose ``cupyx.profiler.benchmark`` reads a
callable's ``__name__`` when it is given no ``name``, as CuPy's does): every GPU column is filled, the table is
whole. A GPU run gives the real figures (gpu_tests/run_on_gpu.sh)."""

import importlib.util
import pathlib
import sys

from cupy_mock import MockCupy

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _gpu_benchmark():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("gpu_benchmark_under_test", BENCHMARKS / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_benchmark_runs_end_to_end_on_a_mocked_cupy(monkeypatch, capsys):
    MockCupy(monkeypatch)
    gpu = _gpu_benchmark()
    gpu.main(["--quick", "--methods", "sep,batch-ep", "--ms", "20", "--batches", "60", "--dtypes", "float64,float32",
              "--repeats", "1"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| method"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[-6:] == ["GPU ms/step", "GPU model ms", "GPU step/GEMM", "GPU rows/s", "GPU speed-up",
                            "GPU syncs"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| sep") or line.startswith("| batch-ep")]
    assert len(rows) == 4, out
    for row in rows:
        assert len(row) == len(columns) and "n/a" not in row, row
        cells = dict(zip(columns, row))
        assert float(cells["GPU ms/step"]) > 0 and cells["GPU speed-up"].endswith("x")
        assert cells["GPU syncs"] == "1", row  # one step, counted on (mocked) CuPy's own paths to the host
        assert cells["model ms (H100)"].split()[0].replace(".", "", 1).isdigit()
