"""docs/ARCHITECTURE.md is the map of what is built: every module path it names exists, and every package folder
is in its module tree (so a new folder, or a moved module, makes this test fail until the map is redrawn)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TOP = {"kvscope/": "kvscope", "kernels/": "kernels", "widgets/": "widgets"}  # where the tree's roots live


def module_tree() -> list[str]:
    """The paths of the code block under "## Modules", from its indentation: a line's first word is a folder
    (``name/``) or a module (``name.py``), two spaces deeper than its folder; several modules may share a line."""
    text = DOC.read_text()
    block = text[text.index("## Modules"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    paths, stack = [], []  # stack: (indent, folder path)
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        word = line.split()[0]
        if not re.fullmatch(r"[\w.]+/|[\w]+\.py,?", word):
            continue  # a continuation line of a description
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if word.endswith("/"):
            folder = TOP.get(word, word.rstrip("/")) if not parent else f"{parent}/{word.rstrip('/')}"
            paths.append(folder + "/")
            stack.append((indent, folder))
        else:  # modules at the start of the line: "a.py, b.py" or "a.py b.py" until a word that is not one
            for name in re.findall(r"^(?:[\w]+\.py[, ]+)+", line.strip() + " ")[0].replace(",", " ").split():
                paths.append(f"{parent}/{name}" if parent else name)
    return paths


def package_folders() -> set[str]:
    """Every folder of the installed package, as a repository path (``kvscope/runs/result/``, ``widgets/panels/``)."""
    folders = set()
    for top in ("kvscope", "kernels", "widgets"):
        for path in (ROOT / top).rglob("*.py"):
            folder = path.parent.relative_to(ROOT)
            if "__pycache__" not in folder.parts:
                folders.add(folder.as_posix() + "/")
    return folders


def test_every_module_the_map_names_exists():
    tree = module_tree()
    assert len(tree) > 100, tree[:20]
    missing = [p for p in tree if not (ROOT / p).exists()]
    assert missing == [], f"docs/ARCHITECTURE.md's module tree names what is not there: {missing}"
    named = set(re.findall(r"\b((?:kvscope|kernels|widgets|tests|benchmarks)/[\w/]+\.py)\b", DOC.read_text()))
    gone = sorted(p for p in named if not (ROOT / p).exists())
    assert gone == [], f"docs/ARCHITECTURE.md names modules that are not there: {gone}"


def test_every_package_folder_is_on_the_map():
    tree = set(module_tree())
    absent = sorted(package_folders() - tree)
    assert absent == [], f"package folders missing from docs/ARCHITECTURE.md's module tree: {absent}"
