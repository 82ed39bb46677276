"""Smoke tests of benchmarks/: every script's ``--quick`` setting runs to the end and prints the machine facts
and a Markdown table, and every script goes through the one runner (benchmarks/_runner.py). The scripts run
concurrently as subprocesses (seconds each).

Without ``../shared/data`` the scripts fall back to generated banana (uci_binary, banana_inducing, time_curves),
scikit-learn's wine (uci_multiclass) and a generated ordinal set (ordinal); a script that still finds nothing to run is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DATA = ROOT / ".." / "shared" / "data"
TIMEOUT = 600


def _runs(tmp_dir):
    binary = "gfitc,ep,sep,adf,svi,vi-jj,vi-taylor"
    few = "gfitc,ep,sep,svi"
    return {
        "uci_binary": ["uci_binary.py", "--methods", binary],
        "uci_binary_generated": ["uci_binary.py", "--methods", "ep,svi", "--data-dir", str(tmp_dir / "none")],
        "uci_binary_ep_sklearn": ["uci_binary.py", "--preset", "ep-sklearn", "--splits", "1", "--max-iter", "3",
                                  "--datasets", "crabs"],
        "uci_iterations": ["uci_iterations.py"],
        "uci_multiclass": ["uci_multiclass.py", "--methods", few],
        "uci_multiclass_bundled": ["uci_multiclass.py", "--datasets", "iris", "--methods", "ep,logreg-ovr,sklearn-gpc",
                                   "--timing"],
        "banana_inducing": ["banana_inducing.py", "--methods", few],
        "time_curves": ["time_curves.py", "--methods", few],
        "airline": ["airline.py", "--blas-threads", "1"],
        "airline_3class": ["airline.py", "--classes", "3", "--blas-threads", "1"],
        "airline_vs_gpflow": ["airline.py", "--vs-gpflow", "--thread-table", "--out", str(tmp_dir / "avg.json")],
        "dask_scaling": ["dask_scaling.py", "--store", str(tmp_dir / "dask")],
        "data_parallel_check": ["dask_scaling.py", "--check", "--crossover", "5000", "--out", str(tmp_dir / "dp.json")],
        "threads": ["threads.py"],
        "gpu": ["gpu.py"],
        "gpu_batch_quality": ["gpu_batch_quality.py", "--out", str(tmp_dir / "gpu_batch_quality.json")],
        "small_data_defaults": ["small_data_defaults.py", "--methods", "ep,svi"],
        "step_cost": ["step_cost.py", "--counts"],
        "size_rule": ["size_rule.py"],
        "size_rule_exact": ["size_rule.py", "--candidates", "auto,all-linear,all-shared-noprior", "--reference",
                            "all-linear"],
        "ep_iteration": ["ep_iteration.py"],
        "float32": ["float32.py"],
        "memory": ["memory.py", "--dir", str(tmp_dir)],
        "variational": ["variational.py"],
        "class_weights": ["class_weights.py"],
        "ordinal": ["ordinal.py", "--out", str(tmp_dir / "ordinal.json")],
        "stability": ["stability.py", "--out", str(tmp_dir / "stability.json")],
        "stopping": ["stopping.py", "--out", str(tmp_dir / "stopping.json")],
        "defaults": ["defaults.py", "--out", str(tmp_dir / "defaults.json")],
        "defaults_method": ["defaults.py", "--method", "svi", "--out", str(tmp_dir / "defaults_svi.json")],
        "categorical": ["categorical.py", "--out", str(tmp_dir / "categorical.json")],
        "subsample_start": ["subsample_start.py"],
        "inducing_every": ["inducing_every.py"],
        "triangular_inverse": ["triangular_inverse.py"],
        "allocator": ["allocator.py"],
        "workers": ["workers.py"],
    }


NAMES = list(_runs(Path("/")))
# presets of real data only
NEEDS_DATA = ("uci_iterations", "uci_binary_ep_sklearn", "airline", "airline_3class", "airline_vs_gpflow")
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_script_is_run_here():
    assert sorted({argv[0] for argv in _runs(Path("/")).values()}) == SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_goes_through_the_runner(script):
    source = (BENCH / script).read_text()
    assert "from _runner import" in source and "begin(" in source, script
    assert "end(" in source or "finish_grid(" in source, script  # (_protocol.finish_grid ends with the runner's end)
    assert "ArgumentParser(" not in source and "print_machine" not in source, script


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Start every script at once, then collect (returncode, stdout, stderr) by name."""
    tmp_dir = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), MPLBACKEND="Agg")
    procs = {}
    for name, argv in _runs(tmp_dir).items():
        if name in NEEDS_DATA and not DATA.is_dir():
            continue
        procs[name] = subprocess.Popen([sys.executable, str(BENCH / argv[0]), "--quick"] + argv[1:], cwd=ROOT,
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_prints_a_table(outputs, name):
    if name not in outputs:
        pytest.skip(f"{DATA} is absent and {name} has no generated fallback")
    code, out, err = outputs[name]
    assert code == 0, f"{name} exited with {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    if "|---" not in out and not DATA.is_dir():
        pytest.skip(f"{DATA} is absent: {name} had nothing to run")
    assert out.startswith("## ") and "- CPUs:" in out.split("|")[0], "the machine facts are not printed first"
    assert "|---" in out, f"{name} printed no Markdown table:\n{out[-3000:]}"
    assert "Total wall time" in out, "the runner's end is missing"
    assert "failed" not in out.split("Total wall time")[0].lower().replace("failed)", ""), out[-3000:]


def test_size_rule_sets_each_models_log_z_beside_its_test_nll(outputs):
    """The exact-model candidates run, and each agpc candidate's row carries its log Z's paired difference to the
    reference's with the splits where it is above (what the evidence prefers beside what predicts)."""
    code, out, err = outputs["size_rule_exact"]
    assert code == 0, err[-3000:]
    rows = {line.split("|")[5].strip(): line for line in out.splitlines() if line.startswith("| moons-300 |")}
    assert {"auto", "all-linear", "all-shared-noprior"} <= set(rows), out[-3000:]
    for candidate in ("auto", "all-shared-noprior"):
        assert re.search(r"\| [+-]\d+\.\d\d ± (nan|\d+\.\d\d) \([01]/1\) \|", rows[candidate]), rows[candidate]


def test_stability_quick_slice_is_stable(outputs):
    """benchmarks/stability.py --quick (issue 39): every run of the slice (minibatch EP, SEP, SVI, multiclass EP, a
    SEP stream, batch EP; three seeds) is judged by the script's rules, and every one is STABLE."""
    code, out, err = outputs["stability"]
    assert code == 0, err[-3000:]
    verdicts = re.findall(r"^\| [\w-]+ \| \d \| (STABLE|UNSTABLE)", out, flags=re.M)
    counted = re.search(r"(\d+) of (\d+) runs STABLE", out)
    assert len(verdicts) == 18 and counted and counted.groups() == ("18", "18"), out[-3000:]


def test_a_baseline_copy_is_removed_when_the_run_ends(tmp_path):
    """``_runner.import_baseline`` (``--baseline`` of step_cost.py and defaults.py) imports a copy of another
    checkout's agpc from a temporary folder; each run left that folder behind. It is gone once the process ends."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import _runner; "
            "module = _runner.import_baseline(sys.argv[2]); print(module.__file__)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code, str(BENCH), str(ROOT)], capture_output=True, text=True,
                         timeout=TIMEOUT, env=env, check=True).stdout.strip()
    copy = Path(out).parents[1]
    assert copy.name.startswith("agpc-baseline-") and copy.parent == tmp_path
    assert not copy.exists()


def test_stability_rules_say_what_a_case_excuses_and_nothing_more(monkeypatch):
    """stability.verdict: a jump within batch ADF's warm-up records is said (its estimate is no evidence there,
    docs/methods/adf.md), one after them is UNSTABLE, and without the case's flag any jump is; a rising NLL is the
    case's documented over-fitting only when nothing else is wrong."""
    monkeypatch.syspath_prepend(str(BENCH))
    import stability

    warm = [-1467.8, 383.8, -132.9, -301.3, -349.5]  # waveform ADF's first records (three warm-up sweeps)
    steady = warm + [-350.0, -351.0]
    history = {"log_marginal_likelihood": steady, "validation_nll": [0.31, 0.31], "n_warmup": 3}
    kind, said = stability.verdict(history, 0.31, 1000, warmup_not_evidence=True)
    assert kind == "STABLE" and said == ["ADF's warm-up log Z is no evidence: docs/methods/adf.md"]
    assert stability.verdict(history, 0.31, 1000) == ("UNSTABLE", ["jump"])
    late = dict(history, log_marginal_likelihood=steady + [+400.0])
    assert stability.verdict(late, 0.31, 1000, warmup_not_evidence=True) == ("UNSTABLE", ["jump"])
    assert stability.verdict(history, 0.35, 1000, overfits="why") == ("UNSTABLE", ["jump", "nll"])
    kind, said = stability.verdict(history, 0.35, 1000, overfits="why", warmup_not_evidence=True)
    assert kind == "STABLE" and said[-1] == "why"
    smooth = dict(history, log_marginal_likelihood=[-400.0, -390.0, -385.0])
    assert stability.verdict(smooth, 0.35, 1000) == ("UNSTABLE", ["nll"])
