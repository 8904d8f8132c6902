"""SIGTERM, SIGHUP and a second Ctrl-C to ``kvscope sweep`` (issue 25, item 13): what finished is written
and said, as for ``kvscope run`` and ``watch``; ``kvscope compare`` says why it stopped."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
from reliability_util import FIGURES

from kvscope.cli.main import main
from kvscope.cli.signals import StopSignal

SWEEP = ["--block-size", "8,16,32", "--requests", "4", "--prompt-len", "12-24", "--output-len", "6-8",
         "--max-num-seqs", "4", "--num-blocks", "48", "--step-delay", "0.05"]


def _sweep_until_first_run(tmp_path):
    out = tmp_path / "s.html"
    proc = subprocess.Popen([sys.executable, "-m", "kvscope", "sweep", *SWEEP, "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 60
    while True:  # the first run's line: it finished
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        try:
            if lines.get(timeout=0.2).startswith("block-size=8"):
                return proc, out
        except queue.Empty:
            pass


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGHUP,), (signal.SIGINT, signal.SIGINT)])
def test_a_signal_after_the_first_run_writes_what_finished(tmp_path, signals):
    proc, out = _sweep_until_first_run(tmp_path)
    try:
        for signum in signals:
            proc.send_signal(signum)
            time.sleep(0.1)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signals[0], err  # before: 143 and nothing, no files
    how = "interrupted" if signals[0] == signal.SIGINT else f"stopped by {signal.Signals(signals[0]).name}"
    assert f"{how}: the comparison holds the" in err and "of 3 runs that finished" in err
    rows = pd.read_csv(out.with_suffix(".csv"))
    assert 1 <= len(rows) < 3 and rows["block_size"].iloc[0] == 8
    assert "kvscope comparison" in out.read_text(encoding="utf-8")
    FIGURES["real signals to kvscope sweep"] += len(signals)


def test_compare_says_why_it_stopped(monkeypatch, tmp_path, capsys):
    from watch_util import saved_watch

    trace = saved_watch(tmp_path)

    def stopped(*args, **kwargs):
        raise StopSignal(signal.SIGTERM)
    monkeypatch.setattr("kvscope.runs.result.comparison.compare", stopped)
    assert main(["compare", str(trace), str(trace), "-o", str(tmp_path / "c.html")]) == 143
    err = capsys.readouterr().err
    assert "SIGTERM: compare stopped" in err and not (tmp_path / "c.html").exists()
