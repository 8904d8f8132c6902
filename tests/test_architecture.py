"""The import graph: no module of kvscope is in an import cycle, and no folder either, counting imports inside
functions and under TYPE_CHECKING (grimp, import-linter's graph builder, records both) and imports by string
(``import_module("kvscope....")``, a lazy-export table: any string constant in the package that names one of its
modules). The layer contracts themselves are in pyproject.toml and run by `.ci/lint-imports` in CI."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tarjan's strongly connected components over grimp's graph; prints the cycles as JSON.
FIND_CYCLES = r"""
import json, sys
import grimp
graph = grimp.build_graph("kvscope", cache_dir=None)
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
for importer, imported in json.loads(sys.argv[1]):  # imports by string, found by the test (string_imports)
    edges[importer] = sorted({*edges[importer], imported})
index, low, stack, on_stack, cycles = {}, {}, [], set(), []
sys.setrecursionlimit(10_000)
def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v); on_stack.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop(); on_stack.discard(w); component.append(w)
            if w == v:
                break
        if len(component) > 1 or v in edges[v]:
            cycles.append(sorted(component))
for m in edges:
    if m not in index:
        visit(m)
print(json.dumps({"modules": sorted(edges), "cycles": cycles, "edges": edges}))
"""


def installed_tree(folder: Path, cycle: bool = False) -> Path:
    """The package as installed (kernels/ and widgets/ under kvscope/), as symlinks, with an empty
    ``__init__.py`` in the two namespace folders (grimp skips a folder without one, as .ci/lint-imports does);
    ``cycle`` adds a module pair that imports each other inside functions, to show the check can fail."""
    pkg = folder / "kvscope"
    pkg.mkdir()
    for entry in (ROOT / "kvscope").iterdir():
        if entry.name not in ("__pycache__", "kernels", "widgets"):
            (pkg / entry.name).symlink_to(entry)
    for name in ("kernels", "widgets"):
        (pkg / name).mkdir()
        (pkg / name / "__init__.py").touch()
        for entry in (ROOT / name).iterdir():
            if entry.name != "__pycache__":
                (pkg / name / entry.name).symlink_to(entry)
    if cycle:
        (pkg / "zz_a.py").write_text("def f():\n    from . import zz_b\n")
        (pkg / "zz_b.py").write_text("def g():\n    from .zz_a import f\n")
    return folder


def module_files(tree: Path) -> dict[str, Path]:
    """Every module of the installed tree and its file (``kvscope.engine`` -> .../engine/__init__.py)."""
    files = {}
    for folder, _, names in os.walk(tree / "kvscope", followlinks=True):  # the tree is made of links
        for path in (Path(folder) / n for n in names if n.endswith(".py")):
            parts = path.relative_to(tree).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def string_imports(tree: Path) -> list[tuple[str, str]]:
    """(importer, imported) for every string constant in a module, docstrings aside, that names another module of
    the package: ``import_module("kvscope.runs.result.run")``, ``{"Run": "kvscope.runs.result.run"}``."""
    files = module_files(tree)
    found = []
    for importer, path in files.items():
        module = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(module)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(module):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and node.value.startswith("kvscope.") and node.value in files and node.value != importer):
                found.append((importer, node.value))
    return sorted(set(found))


def find_cycles(tree: Path, extra: list[tuple[str, str]] | None = None) -> dict:
    pytest.importorskip("grimp")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    extra = string_imports(tree) if extra is None else extra
    out = subprocess.run([sys.executable, "-c", FIND_CYCLES, json.dumps(extra)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out)


def folder_cycles(tree: Path, edges: dict[str, list[str]]) -> list[list[str]]:
    """Cycles between folders side by side: at every level of the tree, a folder (its modules and its
    subfolders') imports a sibling folder only if that sibling never imports it back, directly or around a
    loop of siblings. The package's own three files (``kvscope/__init__.py``: the public names, imported
    lazily; ``__main__``; ``_version``) sit above every folder and are left out."""
    files = module_files(tree)
    folders = {m for m, path in files.items() if path.name == "__init__.py"} | {
        m for m in files if (tree / Path(*m.split("."))).is_dir()}

    def chain(module: str) -> list[str]:  # the folders a module sits in, outermost first
        parts = module.split(".")
        return [".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in folders]

    between: dict[str, set[str]] = {}
    for importer, imported in ((a, b) for a, bs in edges.items() for b in bs if b.startswith("kvscope.")):
        a, b = chain(importer), chain(imported)
        for fa, fb in zip(a, b):
            if fa != fb:  # the first level where they part: sibling folders
                between.setdefault(fa, set()).add(fb)
                break
    cycles, done = [], set()
    for start in sorted(between):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(between.get(node, ())):
                if nxt == start:
                    key = frozenset(path)
                    if key not in done:
                        done.add(key)
                        cycles.append(path)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return cycles


def test_no_import_cycles(tmp_path):
    tree = installed_tree(tmp_path)
    graph = find_cycles(tree)
    modules = set(graph["modules"])
    assert {"kvscope.engine.engine", "kvscope.kernels.paged_attention", "kvscope.widgets.report"} <= modules
    assert graph["cycles"] == []
    assert folder_cycles(tree, graph["edges"]) == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    graph = find_cycles(installed_tree(tmp_path, cycle=True))
    assert graph["cycles"] == [["kvscope.zz_a", "kvscope.zz_b"]]


def test_the_cycle_check_sees_imports_by_string_and_folder_cycles(tmp_path):
    """A string naming a module counts as its import; two folders that import each other are a cycle even when
    no two modules are."""
    tree = installed_tree(tmp_path)
    (tree / "kvscope" / "zz_one").mkdir()
    (tree / "kvscope" / "zz_two").mkdir()
    for name, body in [("zz_one/__init__.py", ""), ("zz_one/a.py", "LAZY = {'b': 'kvscope.zz_two.b'}\n"),
                       ("zz_one/c.py", ""), ("zz_two/__init__.py", ""), ("zz_two/b.py", ""),
                       ("zz_two/d.py", "def f():\n    from kvscope.zz_one import c\n")]:
        (tree / "kvscope" / name).write_text(body)
    assert ("kvscope.zz_one.a", "kvscope.zz_two.b") in string_imports(tree)
    graph = find_cycles(tree)
    assert graph["cycles"] == []  # no module cycle ...
    assert folder_cycles(tree, graph["edges"]) == [["kvscope.zz_one", "kvscope.zz_two"]]  # ... but a folder one


def contract_folders() -> set[str]:
    """The subpackages that the layer contract in pyproject.toml names."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def test_every_module_sits_in_a_layer_folder():
    """A new module lands in a folder, and the folder's contracts cover it: directly in kvscope/ there are only
    the package's own three files."""
    folders = contract_folders()
    assert {"kvscope.cli", "kvscope.magic", "kvscope.runs", "kvscope.widgets", "kvscope.engine",
            "kvscope.telemetry", "kvscope.kernels"} <= folders
    top = sorted(p.name for p in (ROOT / "kvscope").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "_version.py"]
    installed = {f"kvscope.{p.name}" for p in (ROOT / "kvscope").iterdir()
                 if p.is_dir() and (p / "__init__.py").exists()} | {"kvscope.kernels", "kvscope.widgets"}
    assert installed == folders, installed ^ folders
