"""The documentation builds: the API reference from the docstrings and the Markdown pages, warnings as errors.

Sphinx runs as CI would run it by hand (``python -m sphinx -W --keep-going -b html docs OUT``), offline (no
intersphinx), on a copy of docs/ in a temporary directory, so that the API pages autosummary writes at build
time never land in the checkout. A docstring that is not valid reStructuredText (an indented line with no
blank line before it, a lone ``*``) or a Markdown link to a page that does not exist fails here, with every
warning listed.
"""

import argparse
import doctest
import html
import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import agpc.classifier
from agpc import GPClassifier, cli, kernels, methods, size_rule

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


def _page_text(path):
    """An HTML page's text: tags out, entities decoded, runs of whitespace as one space."""
    text = re.sub(r"<script.*?</script>|<[^>]+>", " ", path.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(text))


def _docs_conf():
    spec = importlib.util.spec_from_file_location("docs_conf", ROOT / "docs" / "conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_estimators_api_page_documents_each_parameter_and_attribute_and_has_an_example(built_docs):
    """Issue 41: GPClassifier's page gives each parameter its own entry (two sharing one description made
    ``eval_every`` claim to stop training), each fitted attribute its own entry with its type (a shared line
    rendered as "Type: the learned kernel and inducing points ..."), and a runnable example."""
    _, out = built_docs
    page = out / "_generated" / "agpc.classifier.html"
    raw, text = page.read_text(), _page_text(page)
    for name in GPClassifier().get_params(deep=False):
        assert len(re.findall(rf"<strong>{name}</strong>", raw)) == 1, f"{name}: not one entry of its own"
    described = re.search(r"eval_every \(.*?\) – (.*?) n_iter_no_change \(", text)
    assert described and "not improved" not in described[1], "eval_every's description is n_iter_no_change's"
    for attribute in ("classes_", "kernel_", "inducing_points_", "history_", "stop_reason_", "fit_time_"):
        assert f'id="agpc.classifier.GPClassifier.{attribute}"' in raw, f"{attribute} has no entry"
    assert "Type: the learned" not in text and re.search(r"Examples .*>>> clf = GPClassifier \(", text)


def test_the_kernels_api_page_lists_their_parameters_and_not_the_inference_codes_methods(built_docs):
    """RBF and Matern52 list their constructor's parameters (their ``__init__`` is Stationary's); the members
    docs/conf.py names as internal (the kernel matrices, gradients, profiles: ``K``, ``grads``, ``profile_grads``
    ...) are on no class of the page, and no member shows Python's own ``int`` docstring."""
    _, out = built_docs
    page = out / "_generated" / "agpc.kernels.html"
    raw, text = page.read_text(), _page_text(page)
    internal = _docs_conf().autosummary_context["internal_members"]["agpc.kernels"]
    assert {"K", "grads", "profile_grads", "growth_power"} <= set(internal)
    shown = set(re.findall(r'id="agpc\.kernels\.\w+\.(\w+)"', raw))
    assert shown and not shown & set(internal), f"internal members on the page: {sorted(shown & set(internal))}"
    for kernel in ("RBF", "Matern52"):
        entry = re.search(rf'id="agpc\.kernels\.{kernel}".*?(?=<dl class="py class">|$)', raw, flags=re.S)[0]
        assert all(f"<strong>{name}</strong>" in entry for name in ("lengthscales", "amplitude", "noise", "priors"))
    assert "int([x])" not in text and "-> integer" not in text


def test_the_estimators_docstring_example_runs():
    """The Examples section of GPClassifier (and any other doctest of agpc.classifier and agpc.kernels) passes
    as written: the API page's example is one a reader can paste."""
    attempted = 0
    for module in (agpc.classifier, kernels):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{module.__name__}: {result.failed} doctest examples failed"
        attempted += result.attempted
    assert attempted >= 5


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
    assert ('<!-- test-command -->\n```\npython -m pip install -e ".[test]" && python -m pytest -q -n 2 --dist loadfile tests gpu_tests\n```'
            in readme)


# -- the Markdown pages against the code -------------------------------------------------------------------------

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "methods").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!-- doctest: skip \((?P<why>[^)]+)\) -->\s*$")
SHARED = ROOT.parent / "shared"  # the project's shared data, beside the checkout where it exists


def _blocks(page):
    """(language, code, the reason it is skipped or None, line) of every fenced block of ``page``; a block is
    skipped by the comment ``<!-- doctest: skip (why) -->`` on the line before its fence."""
    text = page.read_text()
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        yield (match["lang"], match["body"], skip["why"] if skip else None, text.count("\n", 0, match.start()) + 1)


def _relative(page):
    return str(page.relative_to(ROOT))


PYTHON_PAGES = [page for page in PAGES if any(lang == "python" for lang, *_ in _blocks(page))]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_relative)
def test_every_python_block_of_the_pages_runs(page, tmp_path, monkeypatch):
    """Every ```python block of README.md, docs/*.md and docs/methods/*.md runs as a reader would paste it: the
    blocks of one page in order in one fresh namespace, in an empty working directory (a file a block writes
    lands there), matplotlib drawing to no screen. A block is left out only by the comment
    ``<!-- doctest: skip (the reason) -->`` just above it (for what this machine cannot have: a GPU, a cluster;
    test_the_skipped_blocks_say_why lists them); one that reads the project's data under ``shared/`` is skipped
    where that directory is absent. The examples are kept small (a few thousand rows, tens of inducing points,
    short ``max_iter``) so that all of them together take well under a minute."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__docs__"}
    for lang, code, skip, line in _blocks(page):
        if lang != "python" or skip:
            continue
        if "shared/" in code and not SHARED.is_dir():
            pytest.skip(f"{_relative(page)}:{line} reads {SHARED}, absent here")
        try:
            exec(compile(code, f"{_relative(page)}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"the python block at {_relative(page)}:{line} failed: {exc!r}") from exc


def test_the_skipped_blocks_say_why():
    """A skipped block names its reason, and skips stay rare (each one is a promise nobody checks)."""
    skipped = [f"{_relative(page)}:{line} ({why})" for page in PAGES for _, _, why, line in _blocks(page) if why]
    print("blocks not run:", skipped or "none")
    assert len(skipped) <= 3, f"more blocks skipped than run-able examples allow: {skipped}"


def _command_lines(page):
    """(line, words, whole) for every ``agpc ...`` command of a page, cut at ``&&``, ``|``, ``;`` and before a
    redirection: each line of a fenced block that is neither Python nor ``text`` (what a command prints, whose lines
    begin with ``agpc ep:`` and the like) (``whole``: a command as typed), and each inline code span (a fragment of
    one in prose, such as ``agpc fit --method sep``); a ``...`` placeholder is left out."""
    text = page.read_text()
    pieces = [(line + k + 1, body_line, True) for lang, body, _, line in _blocks(page) if lang not in ("python", "text")
              for k, body_line in enumerate(body.splitlines())]
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    pieces += [(prose.count("\n", 0, m.start()) + 1, m[1], False) for m in re.finditer(r"`([^`]+)`", prose)]
    for line, piece, whole in pieces:
        if "..." in piece:
            continue
        lexer = shlex.shlex(piece.replace("\n", " "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # not a shell line (an unbalanced quote in prose)
            continue
        command = []
        for token in [*tokens, ";"]:
            if token in ("&&", "||", "|", ";"):
                if command[:1] == ["agpc"] and len(command) > 1:
                    yield line, command[1:], whole
                command = []
            elif token[0] in "<>" or command == [None]:
                command = [None]  # a redirection: the rest of this command is its target
            else:
                command.append(token)


def test_every_agpc_command_in_the_pages_parses():
    """Each ``agpc`` command the pages show in a code block is parsed by the command's own parser
    (``agpc.cli``), so a wrong option name or value fails here; in a prose fragment (an inline code span, which
    leaves out the required arguments) each ``--option`` must be one that command takes. They are not run:
    ``agpc demo`` and a fit on a real file take minutes, and what they do is tested in tests/test_cli.py."""
    parser, options = cli._parser(), _cli_options()
    commands = [(page, *command) for page in PAGES for command in _command_lines(page)]
    assert sum(whole for *_, whole in commands) >= 5, "the pages show the agpc command"
    failed = []
    for page, line, words, whole in commands:
        where = f"{_relative(page)}:{line}: agpc {shlex.join(words)}"
        if not whole:
            unknown = [word.split("=")[0] for word in words if word.startswith("--")
                       and not {words[0], "agpc"} & set(options.get(word.split("=")[0], ()))]
            failed += [f"{where}: {words[0]} takes no {option}" for option in unknown]
            continue
        try:
            parser.parse_args(words)
        except (cli.UsageError, SystemExit) as exc:  # (--help and --version exit, with 0)
            if not isinstance(exc, SystemExit) or exc.code:
                failed.append(f"{where}: {exc}")
    assert not failed, "\n".join(failed)


def _cli_options():
    """{option: the commands that take it} of ``agpc`` and every subcommand, read from the parser itself."""
    parser = cli._parser()
    options = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                for option in (o for a in command._actions for o in a.option_strings):
                    options.setdefault(option, []).append(name)
        for option in action.option_strings:
            options.setdefault(option, []).append("agpc")
    return {option: names for option, names in options.items() if option.startswith("--") and option != "--help"}


def test_usage_md_names_every_option_of_the_command_and_every_parameter_of_the_estimator():
    """The README promises docs/usage.md documents every option of ``GPClassifier`` and of ``agpc``: each
    ``--option`` of every command (``agpc <command> --help``) appears in it, and each parameter of
    ``GPClassifier().get_params()`` in one of its code spans. A new option or parameter fails here until it is
    described there."""
    text = (ROOT / "docs" / "usage.md").read_text()
    options = _cli_options()
    assert {"--target", "--out", "--max-time", "--version"} <= set(options)
    missing = [f"{option} ({', '.join(names)})" for option, names in options.items()
               if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)]
    spans = re.findall(r"`([^`]+)`", FENCE.sub("", text))
    named = {word for span in spans for word in re.findall(r"[A-Za-z_]\w*", span)}
    parameters = GPClassifier().get_params(deep=False)
    assert {"method", "n_inducing", "max_time"} <= set(parameters)
    missing += [f"GPClassifier({name}=...)" for name in parameters if name not in named]
    assert not missing, "docs/usage.md does not mention: " + ", ".join(missing)


def _flat(page):
    """A page's text with its line breaks and indentation as single spaces (a phrase may wrap anywhere)."""
    return re.sub(r"\s+", " ", page.read_text())


def test_the_pages_state_what_the_code_does():
    """Issue 41's contradictions, each read from the code: the exact model's row limit (``size_rule``), the
    default ``n_inducing``, the kernels there are, that batch EP trains more than two classes on a dask array
    (the method registry), and that ``--max-time`` budgets the fit only (the command's help, read from its
    parser)."""
    docs = ROOT / "docs"
    limit = f"up to {size_rule.EXACT_MAX_ROWS} rows"
    for page in (ROOT / "README.md", docs / "usage.md", docs / "methods" / "ep.md"):
        assert limit in _flat(page), f"{page.name} does not give the exact model's limit, {limit}"
    assert GPClassifier().n_inducing == "auto" and '`n_inducing="auto"`' in _flat(docs / "methods" / "ep.md")
    stale = [page.name for page in (docs / "methods").glob("*.md") if "`n_inducing=100`" in page.read_text()]
    assert not stale, f"method pages giving n_inducing=100 as the default: {stale}"
    leaves = [name for name, kind in kernels.KERNELS.items() if not issubclass(kind, kernels.Combination)]
    assert len(leaves) >= 4 and all(f"`agpc.{name}`" in _flat(docs / "methods.md") for name in leaves)
    ep = methods.get_method("ep")
    if {"multiclass", "dask_batch"} <= ep.capabilities:
        assert "binary only" not in _flat(docs / "methods" / "ep.md")
    fit = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["fit"]
    budget = next(a for a in fit._actions if "--max-time" in a.option_strings)
    assert "max_time" in budget.help and "on top" in budget.help
    assert "`agpc fit --max-time S` also reads the data" in _flat(docs / "usage.md")
