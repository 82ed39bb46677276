"""Smoke tests of the paper-protocol benchmarks: each script's ``--quick`` setting runs to the end and prints
a Markdown table. The scripts run concurrently as subprocesses (a few seconds each).

Without ``../shared/data`` the scripts fall back to generated banana (uci_binary, banana_inducing,
time_curves) and scikit-learn's wine (uci_multiclass); a script that still finds nothing to run is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DATA = ROOT / ".." / "shared" / "data"
TIMEOUT = 300


def _runs(tmp_dir):
    binary = "gfitc,ep,sep,adf,svi,vi-jj,vi-taylor"
    few = "gfitc,ep,sep,svi"
    return {
        "uci_binary": ["uci_binary.py", "--quick", "--methods", binary],
        "uci_binary_generated": ["uci_binary.py", "--quick", "--methods", "ep,svi", "--data-dir", str(tmp_dir / "none")],
        "uci_iterations": ["uci_iterations.py", "--quick"],
        "uci_binary_ep": ["uci_binary_ep.py", "--quick", "--splits", "1", "--max-iter", "3", "--datasets", "crabs"],
        "uci_multiclass": ["uci_multiclass.py", "--quick", "--methods", few],
        "banana_inducing": ["banana_inducing.py", "--quick", "--methods", few],
        "time_curves": ["time_curves.py", "--quick", "--methods", few],
        "airline": ["airline.py", "--quick", "--blas-threads", "1"],
        "airline_3class": ["airline.py", "--quick", "--classes", "3", "--blas-threads", "1"],
        "airline_vs_gpflow": ["airline_vs_gpflow.py", "--quick", "--thread-table", "--out",
                              str(tmp_dir / "airline_vs_gpflow_quick.json")],
        "dask_scaling": ["dask_scaling.py", "--quick", "--store", str(tmp_dir / "dask")],
        "data_parallel_check": ["data_parallel_check.py", "--quick", "--crossover", "5000",
                                "--out", str(tmp_dir / "data_parallel_check_quick.json")],
        "threads": ["threads.py", "--quick"],
        "gpu": ["gpu.py", "--quick"],
        "small_data_defaults": ["small_data_defaults.py", "--quick", "--methods", "ep,svi"],
        "step_cost": ["step_cost.py", "--quick", "--counts"],
        "size_rule": ["size_rule.py", "--quick"],
    }

# presets of real data only
NEEDS_DATA = ("uci_iterations", "uci_binary_ep", "airline", "airline_3class", "airline_vs_gpflow")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Start every script at once, then collect (returncode, stdout, stderr) by name."""
    tmp_dir = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), MPLBACKEND="Agg")
    procs = {}
    for name, argv in _runs(tmp_dir).items():
        if name in NEEDS_DATA and not DATA.is_dir():
            continue
        procs[name] = subprocess.Popen([sys.executable, str(BENCH / argv[0])] + argv[1:], cwd=ROOT, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            out += f"\n(timed out after {TIMEOUT} s)"
        results[name] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("name", ["uci_binary", "uci_binary_generated", "uci_iterations", "uci_binary_ep",
                                  "uci_multiclass",
                                  "banana_inducing", "time_curves", "airline", "airline_3class", "airline_vs_gpflow",
                                  "dask_scaling", "data_parallel_check", "threads", "gpu", "small_data_defaults",
                                  "step_cost", "size_rule"])
def test_quick_run_prints_a_table(outputs, name):
    if name not in outputs:
        pytest.skip(f"{DATA} is absent and {name} has no generated fallback")
    code, out, err = outputs[name]
    assert code == 0, f"{name} exited with {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    if "|---" not in out and not DATA.is_dir():
        pytest.skip(f"{DATA} is absent: {name} had nothing to run")
    assert "|---" in out, f"{name} printed no Markdown table:\n{out[-3000:]}"
    assert "- CPUs:" in out, "the machine header is missing"
    assert "failed" not in out.split("Total wall time")[0].lower().replace("failed)", ""), out[-3000:]
