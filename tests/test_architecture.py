"""The import graph: no module of kvscope is in an import cycle, counting imports inside functions and
under TYPE_CHECKING (grimp, import-linter's graph builder, records both). The layer contracts themselves
are in pyproject.toml and run by `.ci/lint-imports` in CI."""

from __future__ import annotations

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
print(json.dumps({"modules": sorted(edges), "cycles": cycles}))
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


def find_cycles(tree: Path) -> dict:
    pytest.importorskip("grimp")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", FIND_CYCLES], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    return json.loads(out)


def test_no_import_cycles(tmp_path):
    graph = find_cycles(installed_tree(tmp_path))
    assert {"kvscope.engine.engine", "kvscope.kernels.paged_attention", "kvscope.widgets.report"} <= set(graph["modules"])
    assert graph["cycles"] == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    graph = find_cycles(installed_tree(tmp_path, cycle=True))
    assert graph["cycles"] == [["kvscope.zz_a", "kvscope.zz_b"]]


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
