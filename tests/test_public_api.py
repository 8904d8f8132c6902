"""The public surface, pinned: what the README, the docs, the notebooks and the benchmarks show a user must keep
working when modules move. Moving a module behind one of these names fails here first."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import kvscope

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"Comparison", "Engine", "EngineConfig", "ModelSpec", "PDEngine", "RequestOutput", "Run", "SamplingParams",
          "WatchRun", "compare", "load", "watch"}
COMMANDS = {"demo", "run", "plan", "view", "compare", "sweep", "watch", "simulate", "calibrate", "explain", "search"}
# `from kvscope.x import a, b` and `import kvscope.x` as written in prose, code blocks and notebook cells.
FROM_IMPORT = re.compile(r"from (kvscope(?:\.\w+)*) import \(?([\w, \n]+?)\)?(?:\n|$|\\n|\")")
PLAIN_IMPORT = re.compile(r"^\s*import (kvscope(?:\.\w+)*)", re.M)


def shown_texts() -> dict[str, str]:
    """Every user-facing text that shows kvscope code: README, docs, notebooks' code cells, benchmarks."""
    texts = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "docs").rglob("*.md")):
        texts[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "examples").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        texts[str(path.relative_to(ROOT))] = "\n".join(
            "".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        texts[str(path.relative_to(ROOT))] = path.read_text()
    return texts


def shown_imports() -> set[tuple[str, str]]:
    """(module, name) pairs; name is "" for a plain ``import kvscope.x``."""
    found: set[tuple[str, str]] = set()
    for text in shown_texts().values():
        for module, names in FROM_IMPORT.findall(text):
            for name in names.replace("\n", " ").split(","):
                name = name.strip().split(" as ")[0].strip()
                if name.isidentifier():
                    found.add((module, name))
        found.update((module, "") for module in PLAIN_IMPORT.findall(text))
    return found


def test_the_top_level_names():
    assert set(kvscope.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(kvscope, name) is not None, name
    from kvscope import Engine, Run, SamplingParams, compare, load, watch

    assert callable(Engine) and callable(SamplingParams) and callable(load) and callable(compare)
    assert isinstance(Run, type)
    assert watch is importlib.import_module("kvscope.runs.background.watch").watch  # a plain function
    importlib.import_module("kvscope.watched.metrics")  # a source package of another name: replaces nothing

    assert kvscope.watch is watch
    assert callable(kvscope.load_ipython_extension) and callable(kvscope.unload_ipython_extension)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kvscope.nope  # noqa: B018


def test_the_models_names():
    import kvscope.models

    assert callable(kvscope.models.load_model) and callable(kvscope.models.build_tiny_model)
    assert callable(kvscope.models.smollm2_path) and callable(kvscope.models.tiny_config)


def test_every_import_the_docs_notebooks_and_benchmarks_show_resolves():
    pairs = shown_imports()
    assert len(pairs) > 20  # the scan found the imports (it would pass vacuously otherwise)
    missing = []
    for module, name in sorted(pairs):
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"import {module}: {exc}")
            continue
        if name and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"from {module} import {name}")
    assert not missing, missing


def test_the_entry_points():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "kvscope"]
    assert script.value == "kvscope.cli.main:main" and callable(script.load())
    (plugin,) = [e for e in entry_points(group="vllm.stat_logger_plugins") if e.name == "kvscope"]
    # It loads only inside a vLLM server (tests/watched/test_real_vllm.py); here: where it points exists.
    assert plugin.value == "kvscope.watched.plugin:KvscopeStatLogger"
    assert importlib.util.find_spec("kvscope.watched.plugin") is not None


def test_the_command_and_its_subcommands():
    proc = subprocess.run([sys.executable, "-m", "kvscope", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = set(re.findall(r"^    (\w+)(?: |$)", proc.stdout, re.M))  # a long name puts its help on the next line
    assert listed == COMMANDS
