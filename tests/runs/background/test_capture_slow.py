"""``--capture-slow`` through a run: the option reaches the engine, the run's meta says which steps opened
which windows and where their trace is, the files keep it, the report marks the slow step and its window;
combinations that cannot work are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from slow_forward import slow_once

import kvscope
from kvscope import Engine
from kvscope.cli.main import build_parser as build_cli_parser
from kvscope.options.run import OptionError
from kvscope.runs.background.live import LiveRun, Outputs
from kvscope.runs.setup.prepare import prepare
from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
from kvscope.runs.setup.spec import RunSpec
from kvscope.runs.workload.items import synthetic_workload
from kvscope.telemetry.slow_capture import MAX_WINDOWS

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(180)


def parse(line: str) -> RunSpec:
    return RunSpec.from_args(build_cli_parser().commands["run"].parse_args(line.split()))


def test_the_option_reaches_the_live_run():
    assert parse("--capture-slow 5").capture_slow == (5, MAX_WINDOWS)  # the options' default is the capture's
    assert prepare(parse("--capture-slow 3:2")).run_options()["capture_slow"] == (3, 2)
    assert prepare(parse("")).run_options()["capture_slow"] is None
    assert parse("--capture-slow 3").with_option("capture_slow", (4, 1)).capture_slow == (4, 1)


def test_what_cannot_capture_is_refused():
    with pytest.raises(OptionError, match=r"^--pd 1P1D does not combine with --capture-slow$"):
        parse("--pd 1P1D --capture-slow 3").check()
    with pytest.raises(OptionError, match="no kernels to profile: leave --capture-slow out"):
        prepare_simulation(parse("--capture-slow 3"), SimSpec())


def test_a_live_run_records_its_windows_and_reports_them(tmp_path):
    engine = slow_once(Engine("tiny", num_blocks=64), at=30, seconds=0.4)
    items = synthetic_workload(3, (8, 16), (50, 50), vocab_size=512, exclude_ids=[0, 1, 2], seed=3)
    files = Outputs(trace=tmp_path / "run.trace.json", html=tmp_path / "run.html")
    run = LiveRun(engine, items, outputs=files, capture_slow=(2, 4), dashboard=False).start().wait(timeout=120)
    assert run.error is None, run.error
    meta = run.meta["capture_slow"]
    assert meta["num_steps"] == 2 and meta["max_windows"] == 4 and meta["trace"] == str(files.trace)
    slow_step = next(r.step for r in run.run.records if r.duration_ns > 300_000_000)
    listed = {s["step"]: s["window"] for s in meta["slow_steps"]}
    assert listed[slow_step] is not None  # the injected pause opened a window (load may open others before it)
    window = meta["windows"][listed[slow_step]]
    assert (window["trigger_step"], window["first_step"], window["last_step"]) == \
        (slow_step, slow_step + 1, slow_step + 2)
    assert 1 <= meta["num_triggered"] == len(meta["windows"]) <= 4
    back = kvscope.load(files.trace)
    assert back.meta["capture_slow"] == json.loads(json.dumps(meta))
    profiled = {r.step for r in back.records if r.profile is not None}
    assert {slow_step + 1, slow_step + 2} <= profiled and back.profiler_events
    page = files.html.read_text()
    assert "Slow steps and their profiler windows" in page
    assert f"window {listed[slow_step]}: steps {slow_step + 1}-{slow_step + 2}" in page
