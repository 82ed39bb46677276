"""gpu_tests/run_on_gpu.sh and what it runs (gpu_tests/probe_cupy.py, benchmarks/gpu.py, benchmarks/airline.py
--backend cupy), here where there is no GPU: the script stops within seconds with exit status 2 and one line
naming what is missing (the interpreter, agpc, CuPy, a CUDA device, CuPy's CUDA libraries); every probe runs to its end on the mocked
CuPy, whose refusals during stream capture are CuPy 14's; the benchmarks' GPU paths run on the mock (the first GPU
run answers each question for real)."""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from gpu_tests import probe_cupy
from gpu_tests.conftest import CUDA
from cupy_mock import CUDARuntimeError, MockCupy

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "gpu_tests" / "run_on_gpu.sh"
BENCHMARKS = ROOT / "benchmarks"
HAS_CUPY = importlib.util.find_spec("cupy") is not None


def test_the_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def _run_script(tmp_path, **env):
    """(exit status, stdout, the results file's text, seconds) of the script run from ``tmp_path`` with ``env``
    over this process's environment (a value None removes the variable)."""
    out = tmp_path / "out.md"
    environment = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    started = time.perf_counter()
    done = subprocess.run([shutil.which("bash"), str(SCRIPT), str(out)], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - started
    return done.returncode, done.stdout + done.stderr, out.read_text() if out.exists() else "", seconds


def _stopped(status, stdout, text, seconds, *needles):
    """The script stopped at its checks: exit 2 within 45 s (its imports take 1-2 s on an idle machine, ten times
    that on a loaded CI worker; a run past its checks takes minutes), the one message (naming each of ``needles``) on stdout
    and in the results file, and no section run after the checks."""
    assert status == 2, stdout
    assert seconds < 45, f"{seconds:.1f} s"
    message = next(line for line in stdout.splitlines() if all(needle in line for needle in needles))
    assert text.startswith("# agpc on a GPU") and message in text and "Nothing else was run." in text
    assert "## What failed" not in text and "probe_cupy.py)" not in text
    return message


def test_without_an_interpreter_the_script_says_so(tmp_path):
    message = _stopped(*_run_script(tmp_path, PYTHON=str(tmp_path / "nonexistent" / "python3")),
                       "No Python interpreter", "nonexistent")
    assert "CuPy" not in message


def test_the_default_interpreter_is_python3_and_its_absence_is_said(tmp_path):
    """No PYTHON and no python3 on PATH (a PATH holding only the tools the script uses)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("dirname", "realpath", "hostname", "date", "git", "timeout", "tee", "tail", "head"):
        if shutil.which(tool):
            (tools / tool).symlink_to(shutil.which(tool))
    message = _stopped(*_run_script(tmp_path, PYTHON=None, PATH=str(tools)), "No Python interpreter", "'python3'")
    assert "CuPy" not in message


def test_an_interpreter_without_agpc_is_said(tmp_path):
    """This interpreter isolated (-I: no PYTHONPATH, no user site) and without its site-packages (-S): no agpc."""
    python = tmp_path / "python-without-agpc"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    python.chmod(0o755)
    message = _stopped(*_run_script(tmp_path, PYTHON=str(python)), "agpc cannot be imported", str(python))
    assert "No module named" in message


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: the script goes on to the device")
def test_without_cupy_the_script_says_so(tmp_path):
    message = _stopped(*_run_script(tmp_path, PYTHON=sys.executable), "No CuPy", sys.executable)
    assert "No module named 'cupy'" in message and "pip install" in message


def _stand_in_cupy(tmp_path, device_count):
    """A folder holding a stand-in ``cupy`` package (and no ``cupyx``) whose ``getDeviceCount`` returns
    ``device_count``, or raises it when it is an exception's text (what CuPy raises without a driver)."""
    fake = tmp_path / "fake" / "cupy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(textwrap.dedent(f'''
        __version__ = "14.2.0 (stand-in)"


        class CUDARuntimeError(RuntimeError):
            pass


        class _Runtime:
            @staticmethod
            def getDeviceCount():
                if isinstance({device_count!r}, str):
                    raise CUDARuntimeError({device_count!r})
                return {device_count!r}

            @staticmethod
            def getDevice():
                return 0


        class cuda:
            runtime = _Runtime
    '''))
    return str(fake.parent)


def test_without_a_cuda_driver_the_script_says_so(tmp_path):
    driver = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"
    message = _stopped(*_run_script(tmp_path, PYTHON=sys.executable, PYTHONPATH=_stand_in_cupy(tmp_path, driver)),
                       "No usable CUDA device", "cudaErrorInsufficientDriver")
    assert "getDeviceCount" in message


def test_without_a_cuda_device_the_script_says_so(tmp_path):
    message = _stopped(*_run_script(tmp_path, PYTHON=sys.executable, PYTHONPATH=_stand_in_cupy(tmp_path, 0)),
                       "No usable CUDA device")
    assert "getDeviceCount() is 0" in message


def test_without_cupys_cuda_libraries_the_script_says_so(tmp_path):
    """A device, but no cupyx (CuPy's SciPy routines: cuBLAS and cuSOLVER): agpc.backend.check_device's line."""
    message = _stopped(*_run_script(tmp_path, PYTHON=sys.executable, PYTHONPATH=_stand_in_cupy(tmp_path, 1)),
                       "CuPy cannot compute on this machine: ")
    assert "cupyx" in message and message.count("CuPy cannot compute") == 1


def test_every_command_has_a_timeout_and_the_sections_fit_in_10_minutes():
    """Every Python the script starts, and nvidia-smi, runs under ``timeout`` (``ask`` for the checks, ``run`` for
    the sections); the sections' budgets add up to no more than the deadline that cuts them, under 10 minutes."""
    source = SCRIPT.read_text().replace("\\\n", " ")  # one line a command
    commands = [line.strip() for line in source.splitlines()
                if re.search(r'(?<!command -v )"\$PY" |nvidia-smi 2>&1', line) and not line.strip().startswith("#")]
    assert len(commands) == 10, commands
    for command in commands:
        assert command.startswith(("ask ", "run ", "if ! ask ")) or "timeout -k " in command, command
    budgets = [int(command.split('" ')[1].split()[0]) for command in commands if command.startswith("run ")]
    deadline = int(source.split("DEADLINE=$((SECONDS + ")[1].split(")")[0])
    assert len(budgets) == 4 and sum(budgets) <= deadline < 600


def test_every_probe_runs_on_the_mocked_cupy(monkeypatch, capsys):
    MockCupy(monkeypatch)
    assert probe_cupy.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n### ") == len(probe_cupy.PROBES) and "Probes failed: none" in out
    for library in ("cuBLAS: a @ b", "cuBLAS: solve_triangular", "cuSOLVER: cholesky"):
        assert f"- {library}: refused: NotImplementedError: calling" in out
    assert "- elementwise (a * 2 + 1): captured" in out


def test_the_library_call_probe_times_each_call_agpc_makes_on_cupy(monkeypatch, capsys):
    """solve_triangular, cholesky and row_dot's reduction kernel, at m = 100 and 200 in both types, each with its
    host and device time and its host time in the launch model's units; and each goes through CuPy's own routine."""
    mock = MockCupy(monkeypatch)
    monkeypatch.setattr(probe_cupy, "SIZES", dict(probe_cupy.SIZES, repeats=2, warmups=1))
    with mock.xp.counting() as tally:
        probe_cupy.library_calls(mock.cupy)
    lines = capsys.readouterr().out.splitlines()
    for dtype in ("float64", "float32"):
        for m in (100, 200):
            for call in ("cupyx.scipy.linalg.solve_triangular", "cupy.linalg.cholesky", "row_dot's ReductionKernel",
                         "agpc.backend.cholesky_or_nan", "one elementwise kernel"):
                line = next(line for line in lines if line.startswith(f"- {dtype}, m = {m}: {call}"))
                assert " us a call (" in line and "x LAUNCH_SECONDS), device " in line, line
    assert ("cublas", "trsm") in mock.library_calls and ("cusolver", "potrf") in mock.library_calls
    assert tally.by_operation()["ReductionKernel[agpc_row_dot]"] > 0


def test_the_probe_refuses_a_machine_where_cupy_cannot_compute(monkeypatch, capsys):
    MockCupy(monkeypatch, fail={"runtime": CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")})
    assert probe_cupy.main(["--check-device"]) == 2
    assert "cudaErrorNoDevice" in capsys.readouterr().out


# -- the benchmarks it runs ------------------------------------------------------------------------------------------

def _benchmark(name):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(out):
    """{header: column} rows of the first Markdown table whose head starts with "| method"."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method"))
    columns = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(columns, (c.strip() for c in line.strip("|").split("|")))))
    return columns, rows


def test_the_gpu_benchmark_times_the_gpus_own_batch_beside_the_launch_model(monkeypatch, capsys):
    """``--batches ...,auto``: the rows batch_size="auto" picks on the (mocked H100) device for --auto-n rows (n / 512
    rounded down to 200 times a power of two here: 1,600 of 10^6), timed on the GPU alone; every GPU row has the
    launch model's time next to the measured one."""
    MockCupy(monkeypatch)
    gpu = _benchmark("gpu")
    assert gpu.main(["--quick", "--methods", "sep,svi,batch-ep", "--ms", "20", "--batches", "60,auto", "--dtypes",
                     "float64", "--repeats", "1", "--auto-n", "1000000"]) == 0
    columns, rows = _table(capsys.readouterr().out)
    assert columns[columns.index("GPU ms/step") + 1] == "GPU model ms"
    auto = [r for r in rows if r["batch"].startswith("auto")]
    assert [r["method"] for r in auto] == ["sep", "svi"]  # (batch EP is not a minibatch method: no GPU batch)
    for r in auto:
        assert r["batch"] == "auto: 1,600" and r["NumPy ms/step"] == "-", r
    for r in rows:
        assert float(r["GPU ms/step"]) > 0 and float(r["GPU model ms"].removesuffix(" L")) > 0, r


def test_one_failed_configuration_does_not_stop_the_gpu_table(monkeypatch, capsys):
    gpu = _benchmark("gpu")
    real = gpu.config_cells

    def failing(args, gpu_xp, method, m, batch, dtype, auto=False):
        if m == 20 and dtype == "float64":
            raise FloatingPointError("a timed sep step failed (the guard refused it)")
        return real(args, gpu_xp, method, m, batch, dtype, auto)

    monkeypatch.setattr(gpu, "config_cells", failing)
    assert gpu.main(["--quick", "--methods", "sep", "--ms", "20,30", "--batches", "60", "--dtypes", "float64",
                     "--repeats", "1"]) == 1
    out = capsys.readouterr().out
    _, rows = _table(out)
    assert [r["m"] for r in rows] == ["20", "30"]
    assert rows[0]["NumPy ms/step"].startswith("failed (FloatingPointError: a timed sep step failed")
    assert float(rows[1]["NumPy ms/step"]) > 0
    assert "Failed configurations (1): sep 20 60 float64." in out


def test_the_airline_benchmark_on_cupy_refuses_a_machine_without_a_gpu_in_one_line():
    if HAS_CUPY and CUDA:
        pytest.skip("CuPy computes here")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(BENCHMARKS / "airline.py"), "--backend", "cupy", "--quick"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert time.perf_counter() - started < 45  # (imports: 1-2 s idle, ten times that on a loaded worker; a run: minutes)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("airline.py: --backend cupy: "), done.stderr
    assert "CuPy" in done.stderr


def test_the_airline_benchmark_fits_on_cupy_with_both_default_batches(monkeypatch, capsys, tmp_path):
    """``--backend cupy`` on the mocked GPU (an H100): each method fitted with the CPU's default batch (200) and the
    GPU's (auto: n / 512 rounded down to 200 times a power of two, 400 rows here), its arrays CuPy's, its steps of those rows, and a table of the one against the
    other."""
    from agpc import GPClassifier
    from agpc.inference.training import Trainer

    rng = np.random.default_rng(0)
    X = rng.standard_normal((210_000, 8)).astype(np.float32)
    np.savez(tmp_path / "airline.npz", X=X, arr_delay=10 * (X[:, 0] + 0.5 * rng.standard_normal(210_000)))
    mock = MockCupy(monkeypatch)
    airline = _benchmark("airline")
    fits, steps = [], set()
    real_fit, real_step = GPClassifier.fit, Trainer.step

    def fit(self, X, y, **kwargs):
        fits.append((self.backend, self.batch_size, type(X), type(kwargs["validation_data"][0])))
        return real_fit(self, X, y, **kwargs)

    def step(self, X, y, lo=0, hi=None, **kwargs):
        steps.add((len(fits), hi - lo))
        return real_step(self, X, y, lo, hi, **kwargs)

    monkeypatch.setattr(GPClassifier, "fit", fit)
    monkeypatch.setattr(Trainer, "step", step)
    # (a budget of 2 s left the first fit without a step once, in a full suite run on two busy workers; 4 s leaves
    # room)
    airline.main(["--backend", "cupy", "--data", str(tmp_path / "airline.npz"), "--n-test", "1000", "--budget", "4",
                  "--linear-budget", "0.1", "--methods", "sep", "--plot", str(tmp_path / "airline.png")])
    out = capsys.readouterr().out
    assert fits == [("cupy", 200, mock.ndarray, mock.ndarray), ("cupy", "auto", mock.ndarray, mock.ndarray)]
    assert steps == {(1, 200), (2, 400)}
    assert "SEP (cupy; 200 rows a step" in out and "SEP batch auto (cupy; 400 rows a step, 523 steps an epoch" in out
    _, rows = _table(out.split("### Each batch against batch 200")[1])
    assert [(r["method"], r["batch"], r["rows a step"]) for r in rows] == [("SEP", "200", "200"),
                                                                           ("SEP", "auto", "400")]
    assert rows[0]["minus batch 200's"] == "+0.0000" and rows[1]["final model NLL"].replace(".", "", 1).isdigit()


@pytest.mark.skipif(CUDA, reason="with a GPU there is a device to require")
def test_once_the_script_requires_a_gpu_the_tests_and_the_benchmark_refuse_to_run_without_one():
    """run_on_gpu.sh sets AGPC_REQUIRE_CUDA after its checks: the GPU tests must then not pass on the mock and the
    stand-in, nor benchmarks/gpu.py print its NumPy half only."""
    env = dict(os.environ, AGPC_REQUIRE_CUDA="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(ROOT / "gpu_tests" / "test_replay_removed.py")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert tests.returncode == pytest.ExitCode.USAGE_ERROR, tests.stdout + tests.stderr
    assert "no CUDA device" in tests.stdout + tests.stderr
    benchmark = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--quick"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
    assert benchmark.returncode == 2 and "no usable GPU" in benchmark.stderr, benchmark.stdout + benchmark.stderr
