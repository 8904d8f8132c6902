"""Ctrl-C for real: SIGINT delivered to a terminal IPython running ``%kvscope --wait``, and SIGINT, SIGTERM
and SIGHUP delivered to a ``kvscope run`` process. The run stops at a step boundary, the files written are
whole and load back, every request is recorded as aborted, no temp file is left, the exit code is 128 + the
signal's number, nothing is left running, and (in IPython) the same process goes on to run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reliability_util import (
    FIGURES,
    assert_every_request_ended,
    assert_files_valid,
    assert_final_record_shows_all_freed,
)

import kvscope

pytestmark = pytest.mark.timeout(180)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
LONG_RUN = "--requests 4 --prompt-len 8-16 --output-len 1500 --block-size 8 --num-blocks 512 --step-delay 0.01"

IPY_SCRIPT = """\
%load_ext kvscope
import json, threading, time
print("READY", flush=True)
%kvscope {long_run} --trace {trace} --metrics {metrics} --wait -q
deadline = time.monotonic() + 10
while [t for t in threading.enumerate() if t.name.startswith("kvscope")] and time.monotonic() < deadline:
    time.sleep(0.02)
left = [t.name for t in threading.enumerate() if t.name.startswith("kvscope")]
again = %kvscope --requests 2 --prompt-len 8 --output-len 5 --num-blocks 64 --wait -q -o
print("RESULT " + json.dumps({{"left": left, "status": again.status,
                              "tokens": [len(o.token_ids) for o in again.outputs]}}), flush=True)
"""


class Output:
    """Collects a pipe on a thread, so the test can wait for a marker without blocking on reads."""

    def __init__(self, pipe) -> None:
        self.chunks: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:
        for chunk in iter(lambda: pipe.read(1), ""):
            self.chunks.append(chunk)

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def wait_for(self, marker: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.text:
            assert proc.poll() is None, f"the process ended before {marker!r}:\n{self.text[-3000:]}"
            assert time.monotonic() < deadline, f"no {marker!r} after {timeout} s:\n{self.text[-3000:]}"
            time.sleep(0.05)

    def join(self) -> str:
        self._thread.join(30)
        return self.text


def _interrupt(proc: subprocess.Popen, out: Output, err: Output, marker: Output, text: str,
               signals: tuple[int, ...] = (signal.SIGINT,), gap: float = 0.0) -> tuple[str, str]:
    """Wait for ``text`` on ``marker``, let the run go a while, send ``signals`` (Ctrl-C: SIGINT) ``gap``
    seconds apart, collect the outputs."""
    marker.wait_for(text, proc)
    time.sleep(2.0)  # mid-run: the model is loaded and steps are going
    assert proc.poll() is None, "the run ended before it could be interrupted"
    for i, signum in enumerate(signals):
        if i:
            time.sleep(gap)
        if proc.poll() is None:
            proc.send_signal(signum)
            FIGURES[f"{signal.Signals(signum).name}s delivered to a process"] += 1
    proc.wait(timeout=120)
    return out.join(), err.join()


def _check_interrupted_files(trace: Path, metrics: Path) -> kvscope.Run:
    run = kvscope.load(metrics)
    assert_files_valid(run, trace=trace, metrics=metrics)
    assert assert_every_request_ended(run, {"abort"})["abort"] == 4
    assert_final_record_shows_all_freed(run)
    assert 0 < run.summary()["output_tokens"] < 4 * 1500
    return run


def test_sigint_to_ipython_in_wait_mode(tmp_path):
    trace, metrics = tmp_path / "run.trace.json", tmp_path / "run.metrics.jsonl"
    script = tmp_path / "interrupt_me.ipy"
    script.write_text(IPY_SCRIPT.format(long_run=LONG_RUN, trace=trace, metrics=metrics))
    proc = subprocess.Popen(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor",
         "--HistoryManager.enabled=False", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    out, err = Output(proc.stdout), Output(proc.stderr)
    stdout, stderr = _interrupt(proc, out, err, out, "READY")

    assert proc.returncode == 0, stdout + stderr
    assert "Traceback" not in stdout + stderr and "KeyboardInterrupt" not in stdout + stderr, stdout + stderr
    assert "interrupted: the run was stopped after" in stdout, stdout
    assert f"; trace: {trace}; metrics: {metrics}" in stdout, stdout  # says where what ran is
    result = json.loads(stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result == {"left": [], "status": "finished", "tokens": [5, 5]}, result
    run = _check_interrupted_files(trace, metrics)
    steps = int(stdout.split("stopped after ", 1)[1].split()[0])
    assert steps == len(run.records) and run.records[-1].scheduled == []  # the last: the stop's record


def _kvscope_run(prefix: Path, cwd: Path) -> tuple[subprocess.Popen, Output, Output]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli.main", "run", *LONG_RUN.split(), "--out", str(prefix)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)
    return proc, Output(proc.stdout), Output(proc.stderr)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_to_kvscope_run(tmp_path, signum):
    """SIGTERM (a supervisor, `kill`) and SIGHUP (the terminal closed) end a run as Ctrl-C does (they used
    to kill it outright: no files, no message)."""
    prefix = tmp_path / "run"
    proc, out, err = _kvscope_run(prefix, tmp_path)
    stdout, stderr = _interrupt(proc, out, err, err, "requests: ", (signum,))  # the progress bar has started

    assert proc.returncode == 128 + signum, stdout + stderr  # 130, 143, 129
    assert "Traceback" not in stderr, stderr
    how = "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"
    assert f"{how}: the run was stopped early; the files hold what ran" in stdout, stdout
    if signum != signal.SIGINT:
        assert f"kvscope: {signum.name}: stopping the run and writing the files" in stderr, stderr
    assert "4 aborted" in stdout, stdout  # the summary table
    trace, metrics, html = (Path(f"{prefix}{s}") for s in (".trace.json", ".metrics.jsonl", ".html"))
    _check_interrupted_files(trace, metrics)
    assert_files_valid(kvscope.load(trace), html=html)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.metrics.jsonl", "run.trace.json"]


def test_more_signals_while_the_files_are_written(tmp_path):
    """A second SIGTERM and a SIGHUP while the run winds down ask for what is happening anyway: the files are
    written whole; a Ctrl-C after them quits at once, and whatever it cut off leaves no temp file."""
    prefix = tmp_path / "run"
    proc, out, err = _kvscope_run(prefix, tmp_path)
    stdout, stderr = _interrupt(proc, out, err, err, "requests: ", (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP),
                                gap=0.05)
    assert proc.returncode == 143 and "Traceback" not in stderr, stdout + stderr
    _check_interrupted_files(Path(f"{prefix}.trace.json"), Path(f"{prefix}.metrics.jsonl"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.metrics.jsonl", "run.trace.json"]

    again = tmp_path / "again"
    again.mkdir()
    proc, out, err = _kvscope_run(again / "run", again)
    stdout, stderr = _interrupt(proc, out, err, err, "requests: ", (signal.SIGTERM, signal.SIGINT), gap=0.3)
    assert proc.returncode in (130, 143), stdout + stderr  # 143: the files were written before the Ctrl-C came
    left = sorted(p.name for p in again.iterdir())
    assert not [name for name in left if name.endswith(".tmp")], left
    for name in left:  # what was written is whole
        if name.endswith((".json", ".jsonl")):
            kvscope.load(again / name)
