"""The architecture, checked on every test run: layers that only point down, no imports of agpc modules inside
functions, no private names used across modules.

- import-linter's contracts (``[tool.importlinter]`` in pyproject.toml), one test each, run on this checkout's
  ``agpc``; every module of agpc must have its place in the "layers" contract and every module it names must
  exist.
- ruff's PLC0415 (import outside top level) over agpc/ and PLC2701 (import of a private name) over agpc/ and
  benchmarks/, configured in ``[tool.ruff]``: the only imports allowed inside functions are the optional
  third-party modules of ``banned-module-level-imports``, never an agpc module, and no ``noqa`` exempts a line.
- ruff's PLC2701 does not look inside one package (an import from the same top-level package is exempt), nor at
  attribute access, so ``ep._name`` from another agpc module is found here, from the source (the AST).

Offline: both tools are in the ``test`` extra.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter.api import read_configuration
from ruff.__main__ import find_ruff_bin

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "agpc"
BENCHMARKS = ROOT / "benchmarks"
PYPROJECT = ROOT / "pyproject.toml"

CONFIG = read_configuration(str(PYPROJECT))
CONTRACTS = {c["id"]: c for c in CONFIG["contracts_options"]}
# Not a layer: the package itself (its __init__ gathers the public names), ``python -m agpc`` and the
# agpc.inference package (its __init__ imports nothing), whose modules have their own places.
NOT_LAYERS = {"agpc", "agpc.__main__", "agpc.inference"}


def _env():
    """This checkout first on the path: the agpc that is analysed is the one under test."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _agpc_modules():
    return {_module_name(p) for p in PACKAGE.rglob("*.py")}


def _layer_modules(contract):
    """The modules a layers contract names (parentheses mark an optional module)."""
    names = set()
    for layer in contract["layers"]:
        for name in layer.replace("|", ":").split(":"):
            names.add(name.strip().strip("()"))
    return names


def test_contracts_have_no_ignored_imports():
    assert CONTRACTS, "no import-linter contracts in pyproject.toml"
    for contract_id, contract in CONTRACTS.items():
        assert not contract.get("ignore_imports"), f"contract {contract_id!r} ignores imports"


@pytest.mark.parametrize("contract_id", sorted(CONTRACTS))
def test_import_contract(contract_id):
    run = subprocess.run(
        [sys.executable, "-c",
         "import sys; from importlinter.cli import lint_imports; "
         f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, limit_to_contracts=({contract_id!r},), "
         "no_cache=True, no_logo=True))"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        pytest.fail(f"import-linter: contract {contract_id!r} broken\n{run.stdout}\n{run.stderr}", pytrace=False)


def test_every_module_has_its_layer():
    """A new module is given its place in the layers (import-linter checks only the modules a contract names),
    and the layers name no module that is not there (import-linter skips a missing optional one)."""
    named = _layer_modules(CONTRACTS["layers"])
    modules = _agpc_modules()
    assert modules - NOT_LAYERS - named == set(), "modules of agpc with no layer in pyproject.toml"
    assert named - modules == set(), "modules named in the layers contract that do not exist"


def _ruff(*args):
    run = subprocess.run([find_ruff_bin(), "check", "--no-cache", "--ignore-noqa", "--output-format", "json", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1), f"ruff failed to run\n{run.stdout}\n{run.stderr}"
    return json.loads(run.stdout)


def _benchmark_helper(diagnostic):
    """benchmarks/ is a folder of scripts, not a package, so ruff cannot see that ``from _machine import ...``
    is a script importing its folder's own helper module (private to the folder, as a package's private
    modules are to it): the one PLC2701 finding that is not one."""
    path = Path(diagnostic["filename"])
    message = diagnostic["message"]
    return (path.parent == BENCHMARKS and diagnostic["code"] == "PLC2701" and message.startswith("Private name import `")
            and message.count("`") == 2 and (BENCHMARKS / (message.split("`")[1] + ".py")).is_file())


def test_ruff_imports_at_top_level_and_no_private_imports():
    findings = [d for d in _ruff("agpc", "benchmarks") if not _benchmark_helper(d)]
    report = "\n".join(f"{Path(d['filename']).relative_to(ROOT)}:{d['location']['row']}: {d['code']} {d['message']}"
                       for d in findings)
    if findings:
        pytest.fail(f"ruff (configured in pyproject.toml):\n{report}", pytrace=False)


def test_ruff_allows_no_agpc_import_inside_functions():
    """The modules that may be imported inside functions are optional third-party ones, never agpc."""
    lint = tomllib.loads(PYPROJECT.read_text())["tool"]["ruff"]["lint"]
    allowed = lint["flake8-tidy-imports"]["banned-module-level-imports"]
    assert allowed and not [name for name in allowed if name.split(".")[0] == "agpc"]
    assert {"PLC0415", "PLC2701", "TID253"} <= set(lint["select"]) and lint["preview"]


def _imported_agpc_names(tree, package):
    """Names bound by a module's imports (``package``: the package relative imports start from) to agpc modules
    or to names in them: name -> (module, name in it or None)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                bound[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, None)
                else:
                    bound[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
    return {name: source for name, source in bound.items() if source[0] == "agpc" or source[0].startswith("agpc.")}


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _private_uses(path):
    """``from agpc.x import _y``; ``x._y`` with ``x`` an agpc module or a name imported from one; and
    ``setattr(x, "_y", ...)``, ``getattr(x, "_y")`` or ``monkeypatch.setattr(x, "_y", ...)``: with their lines."""
    module = _module_name(path) if path.is_relative_to(PACKAGE) else path.stem
    tree = ast.parse(path.read_text(), str(path))
    bound = _imported_agpc_names(tree, module if path.name == "__init__.py" else module.rpartition(".")[0])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [(node.lineno, f"import of {alias.name}") for alias in node.names
                      if _private(alias.name) and (alias.asname or alias.name) in bound]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in bound:
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            target, name = node.args[0], node.args[1]
            if (func in ("getattr", "setattr", "delattr", "hasattr") and isinstance(target, ast.Name)
                    and target.id in bound and isinstance(name, ast.Constant) and isinstance(name.value, str)
                    and _private(name.value)):
                found.append((node.lineno, f"{func}({target.id}, {name.value!r})"))
    return found


def test_no_private_names_across_modules():
    paths = sorted(PACKAGE.rglob("*.py")) + sorted(BENCHMARKS.glob("*.py"))
    report = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in paths for line, what in _private_uses(path)]
    if report:
        pytest.fail("private names of agpc used outside their module:\n" + "\n".join(report), pytrace=False)


def test_the_private_name_check_finds_what_it_should(tmp_path):
    """The check above on a module written to break it in each way it looks for (and in one it allows)."""
    source = tmp_path / "uses_private.py"
    source.write_text(
        "from agpc.inference import ep, training\n"
        "from agpc.inference.ep import _hidden\n"
        "from agpc.backend import CholeskyError\n"
        "import numpy as np\n"
        "def f(x):\n"
        "    ep._sweep(x)\n"
        "    setattr(training, '_validation_scores', None)\n"
        "    return x._own_attribute, CholeskyError._private_detail, np._NoValue\n"
    )
    found = sorted(what for _, what in _private_uses(source))
    assert found == ["CholeskyError._private_detail", "ep._sweep", "import of _hidden",
                     "setattr(training, '_validation_scores')"]


# -- one plan, one state (issue 44): the fit's helpers read a plan; the loop reads an engine through its members --

# The front half of a fit: the helpers that take the fit's ``agpc.plan.FitPlan`` in the estimator's place.
FIT_HELPERS = ("plan", "inputs", "dask_inputs", "placement", "ordinal", "size_rule", "batch_size", "streaming")
# The modules around the engines that read their state through ``Engine``'s members, never by its keys.
STATE_READERS = ("inference/training", "inference/hooks", "inference/checkpointing", "checkpoint_rules", "streaming")


def _estimator_uses(path):
    """(line, what) of each function of ``path`` with a parameter named ``estimator`` and each assignment to a fitted
    attribute (a name ending in ``_``) of something other than ``self``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            if "estimator" in names:
                found.append((node.lineno, f"{node.name} takes the estimator"))
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for part in ast.walk(target):
                if (isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store) and part.attr.endswith("_")
                        and not part.attr.startswith("_") and not (isinstance(part.value, ast.Name)
                                                                     and part.value.id == "self")):
                    found.append((part.lineno, f"writes {ast.unparse(part)}"))
    return found


def _state_key_reads(path):
    """(line, what) of each read of an engine state by a string key in ``path``: ``<x>.state["..."]``,
    ``state["..."]``, ``state.get("...")``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        owner = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value,
                                                                                                 str):
            owner = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            owner = node.func.value
        named = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else None
        if named == "state":
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_fit_helpers_take_a_plan_and_write_nothing_on_the_estimator():
    report = [f"agpc/{name}.py:{line}: {what}" for name in FIT_HELPERS
              for line, what in _estimator_uses(PACKAGE / f"{name}.py")]
    if report:
        pytest.fail("a fit helper takes the estimator or writes a fitted attribute:\n" + "\n".join(report),
                    pytrace=False)


def test_the_loop_reads_an_engine_through_its_members_not_its_state_keys():
    report = [f"agpc/{name}.py:{line}: {what}" for name in STATE_READERS
              for line, what in _state_key_reads(PACKAGE / f"{name}.py")]
    if report:
        pytest.fail("an engine's state read by its keys outside the engines:\n" + "\n".join(report), pytrace=False)


def test_the_plan_and_state_checks_find_what_they_should(tmp_path):
    """The two checks above on a module written to break them in each way they look for (and in ones they allow)."""
    source = tmp_path / "bag.py"
    source.write_text(
        "def helper(estimator, X):\n"
        "    estimator.n_jobs_ = 2\n"
        "    model.tf32_ += 1\n"
        "    self.kernel_ = None\n"
        "    plan._private_ = 1\n"
        "    return engine.state['Z'], state.get('nu'), trainer.state['kernel'], saved['engine'], plan.get('x')\n"
    )
    assert sorted(what for _, what in _estimator_uses(source)) == [
        "helper takes the estimator", "writes estimator.n_jobs_", "writes model.tf32_"]
    assert sorted(what for _, what in _state_key_reads(source)) == [
        "engine.state['Z']", "state.get('nu')", "trainer.state['kernel']"]


MAX_FUNCTION_LINES = 60  # of code, its docstring aside (issue 44)
MAX_MODULE_LINES = {"inference/training": 900, "inference/engines": 900, "inference/ep": 900}


def _long_functions(path, limit=MAX_FUNCTION_LINES):
    """(line, what) of each function of ``path`` longer than ``limit`` lines, its docstring not counted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                    str):
                lines -= first.end_lineno - first.lineno + 1
            if lines > limit:
                found.append((node.lineno, f"{node.name}: {lines} lines"))
    return found


def test_no_function_is_longer_than_sixty_lines_and_the_core_modules_stay_readable():
    report = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
              for line, what in _long_functions(path)]
    report += [f"agpc/{name}.py: {count} lines, more than {limit}" for name, limit in MAX_MODULE_LINES.items()
               if (count := len((PACKAGE / f"{name}.py").read_text().splitlines())) > limit]
    if report:
        pytest.fail("split them:\n" + "\n".join(report), pytrace=False)


def test_the_length_check_counts_code_not_docstrings(tmp_path):
    source = tmp_path / "long.py"
    body = "".join(f"    x{k} = {k}\n" for k in range(59))  # (with its def line: 60 lines, the most allowed)
    source.write_text(f'def short():\n    """A\n    long\n    docstring."""\n{body}\n\ndef long():\n{body}    return 1\n')
    assert [what for _, what in _long_functions(source)] == ["long: 61 lines"]
