"""Python started in the clone's root (as the README's commands and notebooks start it) sees the clone's
top-level folders on ``sys.path``. None of them may shadow an installed distribution: transformers >= 5.25
imports Hugging Face's ``kernels`` package whenever ``importlib.util.find_spec("kernels")`` finds one, and a
regular package named ``kernels`` in the working folder used to be found first.

The top-level folders other than ``kvscope/`` therefore have no ``__init__.py``: a folder without one is only a
namespace portion, which loses to a regular package or module anywhere on ``sys.path`` (PEP 420)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


def python_in(cwd: Path, code: str) -> dict:
    """Run ``code`` with ``python -c`` in ``cwd`` (so the working folder is first on sys.path); its last
    stdout line is JSON."""
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Folders that stand first on sys.path: the root (python -c, python -m pytest, a notebook server started there),
# examples/ (the notebooks), benchmarks/ (`python benchmarks/x.py`), and the test folders that the tests put there
# themselves (the conftest.py files, the stand-ins of tests/watched/fakes.py).
ON_PATH = ("", "examples", "benchmarks", "tests", "tests/watched", "tests/reliability", "tests/telemetry",
           "tests/widgets")


def importable_names(folder: Path) -> set[str]:
    """What ``import NAME`` finds in ``folder`` as a module or a regular package (a folder without
    ``__init__.py`` is only a namespace portion: any regular package or module of that name wins over it)."""
    return {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir()
                                                    if p.is_dir() and (p / "__init__.py").exists()}


def test_no_folder_on_the_path_shadows_an_installed_package():
    """No module or regular package in a folder that stands first on sys.path has the name of an installed
    distribution's package or of a standard-library module (``benchmarks/kernels.py`` once hid Hugging Face's
    ``kernels`` from transformers in every benchmark). Only ``kvscope`` itself, in the root."""
    taken = set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
    clashes = {folder: sorted((importable_names(ROOT / folder) & taken) - {"kvscope"}) for folder in ON_PATH}
    assert all(not names for names in clashes.values()), clashes
    assert importable_names(ROOT) == {"kvscope"}  # the root has no other module or regular package at all


def test_installed_distributions_win_over_the_clones_folders():
    """Every installed top-level import name that is also a folder in the root resolves to the installed one
    when Python starts in the root (``kernels`` from transformers 5.25's dependency, among others)."""
    clashes = sorted(name for name in importlib.metadata.packages_distributions()
                     if name != "kvscope" and (ROOT / name).exists())
    code = (
        "import importlib.util, json\n"
        f"names = {clashes!r}\n"
        "print(json.dumps({n: (importlib.util.find_spec(n).origin or '') for n in names}))"
    )
    origins = python_in(ROOT, code)
    for name, origin in origins.items():
        assert origin and not origin.startswith(str(ROOT / name)), (name, origin)


def test_transformers_gets_the_real_kernels_package_from_the_root():
    """transformers' own check and import of Hugging Face's ``kernels`` package, and a kvscope engine, from the
    clone's root and from ``examples/`` (where the notebooks run)."""
    code = (
        "import json, importlib.metadata, transformers\n"
        "try:\n"
        "    import kernels\n"
        "except ModuleNotFoundError:  # none installed, and not in the root (from examples/)\n"
        "    kernels = None\n"
        "from kvscope import Engine, SamplingParams\n"
        "from kvscope.kernels.backend import resolve_backend\n"
        "out = Engine('tiny').generate(['kernels'], SamplingParams(max_tokens=3))[0]\n"
        "try:\n"
        "    importlib.metadata.version('kernels'); installed = True\n"
        "except importlib.metadata.PackageNotFoundError:\n"
        "    installed = False\n"
        "seen = {'kernels': getattr(kernels, '__file__', None), 'installed': installed,\n"
        "        'transformers': transformers.__version__, 'tokens': len(out.token_ids)}\n"
        "if installed:  # transformers' own check, and the import it makes\n"
        "    from transformers.utils.import_utils import is_kernels_available\n"
        "    from kernels import get_kernel\n"
        "    seen['available'] = is_kernels_available()\n"
        "print(json.dumps(seen))"
    )
    for cwd in (ROOT, ROOT / "examples"):
        seen = python_in(cwd, code)
        assert seen["tokens"] == 3
        if seen["installed"]:  # transformers >= 5.25 depends on it; older ones do not
            assert seen["kernels"] and not seen["kernels"].startswith(str(ROOT / "kernels")), seen
            assert seen["available"] is True, seen
        else:  # without Hugging Face's package, the root's folder is a bare namespace: no kvscope code runs
            assert seen["kernels"] is None, seen


def test_pytest_collects_from_the_root():
    """``python -m pytest --co`` from the root (the README's test command) on a small folder: no errors."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:randomly", "tests/kernels"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.splitlines()[-1], done.stdout[-500:]
    assert " collected" in done.stdout or "tests collected" in done.stdout, done.stdout[-500:]
