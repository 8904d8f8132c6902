"""Every file kvscope writes is written atomically: a crash in the middle of writing a trace, a
metrics file or a report (disk full, Ctrl-C) leaves the previous file as it was and no temp file;
and no code in the package writes a file any other way.

(That the report shows prompts as text and fetches nothing from the network is checked in a real
browser by ``tests/widgets/test_report_browser.py``.)
"""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest
from reliability_util import FIGURES, assert_files_valid, tiny_engine, workload

from kvscope.runs.background.live import LiveRun, Outputs
from kvscope.utils import files as kvscope_files

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("kvscope", "widgets", "kernels")
# Writes that may bypass atomic_write, and why: (file, enclosing function) -> reason
ALLOWED = {
    ("kvscope/utils/files.py", "atomic_write"): "the atomic write itself",
    ("kvscope/utils/files.py", "_create_temp"): "atomic_write's temp file (and unwritable's probe, removed at once)",
    ("kvscope/telemetry/profiler.py", "_kineto_events"): "torch's own trace, to a private temp file, removed",
    ("kvscope/cli/main.py", "main"): "stdout onto /dev/null when a pipe reader left",
    ("kvscope/runs/result/comparison.py", "save_csv"): "to_csv into the open temp file that atomic_write hands it",
    ("kvscope/watched/plugin.py", "__init__"): "the plugin's step log: O_APPEND lines that a watcher tails as "
                                             "they come (a log, never rewritten, so nothing to replace atomically)",
    ("kvscope/watched/vllm_demo.py", "start_vllm"): "the demo server's own log, in the demo's private work folder",
    ("kvscope/watched/vllm_demo.py", "serve_for_demo"): "the demo's private work folder (mkdtemp)",
    ("kernels/cpu_build.py", "build_once"): "the C++ kernel's build lock file and key.json, in its own build folder "
                                            "(kernels is a leaf layer: it cannot reach kvscope.utils)",
    ("kvscope/models/gguf_cache.py", "save_converted"): "a converted model folder, written whole under a private "
                                                       "temporary name (mkdtemp, its marker last), then renamed",
    ("kvscope/cli/calibrate.py", "cmd_calibrate"): "LinearStepModel.save, which writes through atomic_write",
}
PATH_WRITERS = {"write_text", "write_bytes", "mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile",
                "export_chrome_trace", "copyfile", "copy2", "copytree", "move"}
WRITERS_GIVEN_A_PATH = {"to_csv", "to_json", "to_parquet", "to_pickle", "savefig", "save"}  # else they return text
SAVES = {"trace": "save_trace", "metrics": "save_metrics", "html": "save_html"}


class Interrupted:
    """A file object that fails after ``limit`` characters, as a full disk or a Ctrl-C would."""

    def __init__(self, f, limit: int, exc: BaseException) -> None:
        self.f, self.left, self.exc = f, limit, exc

    def write(self, text: str) -> int:
        if len(text) >= self.left:
            self.f.write(text[: self.left])
            FIGURES["file writes interrupted midway"] += 1
            raise self.exc
        self.left -= len(text)
        return self.f.write(text)

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _interrupt_writes(monkeypatch, exc: BaseException, limit: int, only: str = "") -> None:
    """Make atomic_write's temp files (those whose name contains ``only``) fail after ``limit`` chars."""
    real_fdopen, real_create_temp, names = os.fdopen, kvscope_files._create_temp, {}

    def create_temp(path):
        fd, tmp = real_create_temp(path)
        names[fd] = tmp.name
        return fd, tmp

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return Interrupted(f, limit, exc) if only in names.get(fd, "\0") else f

    monkeypatch.setattr(kvscope_files, "_create_temp", create_temp)
    monkeypatch.setattr(kvscope_files.os, "fdopen", fdopen)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict[str, bytes], dict[str, int], LiveRun]:
    """Each kind of file of one run (the previous file), the size of each kind for another run, and
    that other run (whose writes get interrupted)."""
    folder = tmp_path_factory.mktemp("previous")
    first = LiveRun(tiny_engine(), workload(2, out=4, seed=1), dashboard=False).start().wait(timeout=60)
    second = LiveRun(tiny_engine(), workload(4, out=12, seed=2), dashboard=False).start().wait(timeout=60)
    previous = {kind: getattr(first, save)(folder / f"1.{kind}").read_bytes() for kind, save in SAVES.items()}
    sizes = {kind: getattr(second, save)(folder / f"2.{kind}").stat().st_size for kind, save in SAVES.items()}
    return previous, sizes, second


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
@pytest.mark.parametrize("kind", ["trace", "metrics", "html"])
def test_a_write_interrupted_midway_keeps_the_previous_file(runs, tmp_path, monkeypatch, kind, exc):
    previous, sizes, second = runs
    path = tmp_path / f"run.{kind}"
    path.write_bytes(previous[kind])
    _interrupt_writes(monkeypatch, exc, limit=sizes[kind] // 2)
    with pytest.raises(type(exc)):
        getattr(second, SAVES[kind])(path)
    assert path.read_bytes() == previous[kind], "the previous file was damaged"
    assert os.listdir(tmp_path) == [path.name], "a temp file was left behind"


def test_a_disk_full_at_the_end_of_a_run_costs_only_that_file(tmp_path, monkeypatch):
    files = Outputs(trace=tmp_path / "run.trace.json", metrics=tmp_path / "run.metrics.jsonl",
                    html=tmp_path / "run.html")
    files.trace.write_text("the previous trace")
    _interrupt_writes(monkeypatch, OSError(errno.ENOSPC, "No space left on device"), limit=1000, only="trace")
    run = LiveRun(tiny_engine(), workload(3, out=6), outputs=files, dashboard=False).start().wait(timeout=60)
    assert run.files.errors == {"trace": "OSError: [Errno 28] No space left on device"}
    assert files.trace.read_text() == "the previous trace"
    assert_files_valid(run, metrics=files.metrics, html=files.html)
    assert sorted(os.listdir(tmp_path)) == ["run.html", "run.metrics.jsonl", "run.trace.json"]


def _writes(tree: ast.AST) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) for every call in ``tree`` that creates or writes a file."""
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                callee = child.func
                attr = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                if attr in ("open", "fdopen"):
                    mode = child.args[1] if len(child.args) > 1 else next(
                        (k.value for k in child.keywords if k.arg in ("mode", "flags")), None)
                    text = ast.unparse(mode) if mode is not None else "'r'"
                    unknown = mode is not None and not isinstance(mode, (ast.Constant, ast.BinOp, ast.Attribute))
                    if unknown or any(c in text for c in "wax+") or "O_WRONLY" in text or "O_RDWR" in text:
                        found.append((name, child.lineno, f"{attr}({text})"))
                elif attr in PATH_WRITERS or (attr in WRITERS_GIVEN_A_PATH and (child.args or child.keywords)):
                    found.append((name, child.lineno, attr))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_every_file_write_in_the_package_goes_through_atomic_write():
    files = sorted(p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 40
    unexpected, seen = [], set()
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for func, line, call in _writes(ast.parse(path.read_text(encoding="utf-8"))):
            seen.add((rel, func))
            if (rel, func) not in ALLOWED:
                unexpected.append(f"{rel}:{line} in {func}(): {call}")
    assert unexpected == [], "files written without kvscope.utils.files.atomic_write:\n" + "\n".join(unexpected)
    assert seen == set(ALLOWED), f"stale allowances: {set(ALLOWED) - seen}"  # the scan does find writes


def test_the_scan_would_catch_a_plain_write():
    bad = "def save(run, path):\n    with open(path, 'w') as f:\n        f.write('x')\n    Path(path).write_text('y')\n"
    assert [(f, call) for f, _, call in _writes(ast.parse(bad))] == [("save", "open('w')"), ("save", "write_text")]
