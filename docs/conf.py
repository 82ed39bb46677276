"""Sphinx configuration: the API reference from the docstrings, and the Markdown pages (methods, results,
design notes, references) through myst-parser.

Build (what tests/test_docs.py runs, into a temporary directory):

    python -m pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

The API pages are generated from the package itself (autosummary, recursive over ``agpc``: api.rst), so a new
module appears without an edit here.
"""

import re
import sys
from pathlib import Path

# The checkout's agpc, when this file sits in a checkout (a copy of docs/ elsewhere relies on PYTHONPATH).
_REPOSITORY = Path(__file__).resolve().parents[1]
if (_REPOSITORY / "agpc" / "__init__.py").is_file():
    sys.path.insert(0, str(_REPOSITORY))

import agpc  # noqa: E402  (after the path above)

project = "agpc"
author = "the agpc developers"
copyright = "the agpc developers"
release = agpc.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# API pages: one page per module of the package, written into api/ at build time (not kept in git).
autosummary_generate = True
autosummary_imported_members = False
templates_path = ["_templates"]  # _templates/autosummary/module.rst: a module's page documents its members in full
autodoc_member_order = "bysource"
# Public methods that only agpc's own code calls, left off a module's page (the module template passes them to
# automodule's :exclude-members:, which reaches its classes' members too): the kernels' matrices, gradients and
# radial profiles (the inference code's interface to a kernel, named in ``Kernel``'s docstring for whoever writes
# one), and what prediction and model files ask of a kernel. A kernel's user builds, combines and reads it.
autosummary_context = {"internal_members": {
    "agpc.kernels": ["K", "Kdiag", "grads", "kappa", "dkappa_dr2", "profile_grads", "cut_point_grads", "growth",
                     "growth_power", "reach_lengthscales", "for_inputs", "from_params", "spec", "without_noise"],
}}
autodoc_typehints = "none"  # the numpydoc "Parameters" sections say the types
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# Markdown: headings get anchors so that "page.md#section" links resolve; $...$ maths as MathJax.
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]

# Offline: no intersphinx, nothing fetched at build time.
html_theme = "alabaster"
html_title = f"agpc {release}"


# The docstrings write maths as plain text: |M| (a minibatch's size), |C| (a determinant). In reStructuredText
# |...| is a substitution reference, so bars are escaped before parsing, except in literal blocks (after a line
# ending in "::"), which show them as they are. No docstring uses substitutions or grid tables. So a new
# docstring needs no reST escaping of its own for this notation.
_BAR = re.compile(r"(?<!\\)\|")


def _indent(line):
    return len(line) - len(line.lstrip())


def _escape_bars(app, what, name, obj, options, lines):
    literal_indent = None  # the indentation of the line that opened the literal block we are in
    for k, line in enumerate(lines):
        if literal_indent is not None and line.strip() and _indent(line) <= literal_indent:
            literal_indent = None
        if literal_indent is None:
            lines[k] = _BAR.sub(r"\\|", line)
            if line.rstrip().endswith("::"):
                literal_indent = _indent(line)


# scikit-learn adds set_fit_request / set_partial_fit_request / set_score_request (metadata routing) to every
# estimator; their docstrings point into scikit-learn's own glossary, which is not part of these pages.
def _skip_metadata_request_methods(app, what, name, obj, skip, options):
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _escape_bars)
    app.connect("autodoc-skip-member", _skip_metadata_request_methods)
