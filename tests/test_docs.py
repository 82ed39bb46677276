"""The documentation builds: the API reference from the docstrings and the Markdown pages, warnings as errors.

Sphinx runs as CI would run it by hand (``python -m sphinx -W --keep-going -b html docs OUT``), offline (no
intersphinx), on a copy of docs/ in a temporary directory, so that the API pages autosummary writes at build
time never land in the checkout. A docstring that is not valid reStructuredText (an indented line with no
blank line before it, a lone ``*``) or a Markdown link to a page that does not exist fails here, with every
warning listed.
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory):
    for module in ("sphinx", "myst_parser"):  # the docs extra, part of the test extra
        try:
            __import__(module)
        except ImportError:
            pytest.fail(f"{module} is missing: python -m pip install -e '.[test]' (or '.[docs]')")
    work = tmp_path_factory.mktemp("docs")
    source, out = work / "docs", work / "html"
    shutil.copytree(ROOT / "docs", source, ignore=shutil.ignore_patterns("_build", "_generated"))
    environment = dict(os.environ)
    # This checkout's agpc, ahead of any installed copy (conf.py imports it for the version and autodoc).
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [environment.get("PYTHONPATH")] if p])
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(source), str(out)],
        capture_output=True, text=True, env=environment, cwd=work, timeout=600)
    return result, out


def test_the_documentation_builds_without_warnings(built_docs):
    result, _ = built_docs
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0 and not warnings, (
        f"sphinx-build exited {result.returncode} with {len(warnings)} warnings:\n" + "\n".join(warnings)
        + ("" if warnings else "\n" + result.stderr[-3000:]))


def test_every_module_of_the_package_has_an_api_page(built_docs):
    """autosummary walks agpc recursively: a public module added to the package gets its page with no edit."""
    _, out = built_docs
    names = (".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
             for path in (ROOT / "agpc").rglob("*.py"))
    modules = sorted(name for name in names if not any(part.startswith("_") for part in name.split(".")))
    pages = {path.stem for path in (out / "_generated").glob("*.html")}
    assert modules and not set(modules) - pages, f"modules without an API page: {sorted(set(modules) - pages)}"


def test_the_pages_are_in_the_build(built_docs):
    """Every Markdown page under docs/ is in the HTML (so in a toctree: Sphinx warns about orphans too)."""
    _, out = built_docs
    pages = sorted(path.relative_to(ROOT / "docs").with_suffix(".html")
                   for path in (ROOT / "docs").rglob("*.md") if "_build" not in path.parts)
    missing = [str(page) for page in pages if not (out / page).is_file()]
    assert pages and not missing, f"pages not built: {missing}"


def _layers_script():
    spec = importlib.util.spec_from_file_location("docs_layers", ROOT / "docs" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_and_design_notes_number_the_layers_as_the_contract_does():
    """One numbering of the layers: the lists in the README and docs/design.md are the import-linter contracts of
    pyproject.toml as ``python docs/layers.py`` writes them, and both pages hold the package's list."""
    layers = _layers_script()
    contracts = layers.contracts()
    assert len(contracts["layers"]) >= 2 and "inference-layers" in contracts
    for page in layers.PAGES:
        text = page.read_text()
        assert "<!-- begin layers: layers -->" in text, f"{page.name} has no list of the layers"
        assert layers.rewritten(text, contracts) == text, f"{page.name}: run python docs/layers.py"
        listed = layers.render(contracts["layers"])
        assert listed in text and listed.startswith("1. `agpc.cli`")


def test_the_layers_script_writes_a_changed_contract(tmp_path):
    layers = _layers_script()
    page = "intro\n<!-- begin layers: layers -->\nstale\n<!-- end layers: layers -->\nafter\n"
    written = layers.rewritten(page, {"layers": [[["agpc.a", "agpc.b"]], [["agpc.c"], ["agpc.d"]]]})
    assert written == ("intro\n<!-- begin layers: layers -->\n1. `agpc.a`, `agpc.b`\n2. `agpc.c` | `agpc.d`\n"
                       "<!-- end layers: layers -->\nafter\n")
    with pytest.raises(ValueError, match="no import-linter layers contract with id 'other'"):
        layers.rewritten("<!-- begin layers: other -->\n<!-- end layers: other -->", {})


def test_the_readme_is_a_front_door():
    """At most ~120 lines, with the two commands .ci/run and users rely on."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    assert "```\npython -m pip install -e . && agpc demo\n```" in readme
    assert ('<!-- test-command -->\n```\npython -m pip install -e ".[test]" && python -m pytest -q tests gpu_tests\n```'
            in readme)
