"""Write the layers of agpc, numbered as the import-linter contracts in pyproject.toml list them, into the README and
docs/design.md.

Each page holds blocks between ``<!-- begin layers: ID -->`` and ``<!-- end layers: ID -->``, where ID is the id of
a contract of type "layers" (``layers``: the whole package; ``inference-layers``: inside agpc.inference). The block
is the contract's layers, from the top; the package's (``layers``) are numbered, layer 1 being the contract's first
entry, which may import every layer below it and is imported by none. Run ``python docs/layers.py`` after changing a contract;
tests/test_docs.py fails while a page and the contract differ.
"""

import pathlib
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", ROOT / "docs" / "design.md")
NUMBERED = "layers"  # the package's layers carry the one numbering; the others are listed from the top
BLOCK = re.compile(r"(<!-- begin layers: (?P<id>[\w-]+) -->\n)(?P<body>.*?)(<!-- end layers: (?P=id) -->)", re.S)


def contracts(pyproject=ROOT / "pyproject.toml"):
    """{contract id: its layers, top first, each a list of groups of module names}. Modules in one group (joined
    by ":" in the contract) may import each other; groups joined by "|" may not."""
    found = {}
    for contract in tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            found[contract["id"]] = [[[name.strip() for name in group.split(":")] for group in layer.split("|")]
                                     for layer in contract["layers"]]
    return found


def render(layers, numbered=True):
    """One line per layer, from the top: ``N. `a`, `b` | `c``` (``- `a`...`` for a contract whose layers are not
    the package's numbered ones)."""
    lines = []
    for number, layer in enumerate(layers, start=1):
        groups = (", ".join(f"`{name}`" for name in group) for group in layer)
        lines.append((f"{number}. " if numbered else "- ") + " | ".join(groups))
    return "\n".join(lines) + "\n"


def rewritten(text, layers_by_id):
    """``text`` with every layers block made anew from the contracts; a block naming no contract is an error."""
    def block(match):
        if match["id"] not in layers_by_id:
            raise ValueError(f"no import-linter layers contract with id {match['id']!r}")
        numbered = match["id"] == NUMBERED
        return match.group(1) + render(layers_by_id[match["id"]], numbered) + match.group(4)

    return BLOCK.sub(block, text)


def main(pages=PAGES):
    layers_by_id = contracts()
    for page in pages:
        text = page.read_text()
        new = rewritten(text, layers_by_id)
        if new != text:
            page.write_text(new)
            print(f"rewrote the layers of {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main([pathlib.Path(arg).resolve() for arg in sys.argv[1:]] or PAGES)
