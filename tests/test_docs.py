"""The documentation builds: the API reference from the docstrings and the Markdown pages, warnings as errors.

Sphinx runs as CI would run it by hand (``python -m sphinx -W --keep-going -b html docs OUT``), offline (no
intersphinx), on a copy of docs/ in a temporary directory, so that the API pages autosummary writes at build
time never land in the checkout. A docstring that is not valid reStructuredText (an indented line with no
blank line before it, a lone ``*``) or a Markdown link to a page that does not exist fails here, with every
warning listed.
"""

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
