"""gpu_tests/run_on_gpu.sh and the probes it runs (gpu_tests/probe_cupy.py), here where there is no GPU: the script
stops at once with exit status 2 and a results file saying why; every probe runs to its end on the mocked CuPy, whose
refusals during stream capture are CuPy 14's (the first GPU run answers each question for real)."""

import os
import pathlib
import subprocess
import sys

import pytest
from gpu_tests import probe_cupy
from gpu_tests.conftest import CUDA
from cupy_mock import CUDARuntimeError, MockCupy



SCRIPT = pathlib.Path(__file__).resolve().parent / "run_on_gpu.sh"


def test_the_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(CUDA, reason="with a GPU the script runs for minutes: run it by hand")
def test_without_a_gpu_the_script_stops_with_exit_2_and_says_why(tmp_path):
    out = tmp_path / "results.md"
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    text = out.read_text()
    assert text.startswith("# agpc on a GPU") and "CuPy cannot compute on this machine" in text
    assert "nothing else was run" in text


def test_every_probe_runs_on_the_mocked_cupy(monkeypatch, capsys):
    MockCupy(monkeypatch)
    assert probe_cupy.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n### ") == len(probe_cupy.PROBES) and "Probes failed: none" in out
    for library in ("cuBLAS: a @ b", "cuBLAS: solve_triangular", "cuSOLVER: cholesky"):
        assert f"- {library}: refused: NotImplementedError: calling" in out
    assert "- elementwise (a * 2 + 1): captured" in out


def test_the_probe_refuses_a_machine_where_cupy_cannot_compute(monkeypatch, capsys):
    MockCupy(monkeypatch, fail={"runtime": CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")})
    assert probe_cupy.main(["--check-device"]) == 2
    assert "cudaErrorNoDevice" in capsys.readouterr().out
