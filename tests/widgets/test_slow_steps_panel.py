"""The slow-steps panel: every slow step marked, with what set it apart and the capture window it opened (step
range), each window shaded and labelled; hidden for a run without --capture-slow; tolerant of a
malformed ``meta["capture_slow"]`` (a loaded file may hold anything)."""

from __future__ import annotations

import pytest

from kvscope.telemetry.records import KVState, ScheduledItem, StepRecord
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.slow_steps import SlowStepsPanel


def step(i: int, ms: float) -> StepRecord:
    ns = round(ms * 1e6)
    items = [ScheduledItem(f"d{j}", "decode", 1, 20 + i, True) for j in range(4)]
    kv = KVState(64, 4, 8, 0, 30, 0.1, 0.1, 0.0, 0, 0, 0, 0, 0)
    return StepRecord(i, i * 10**9, i * 10**9 + ns, 0, 0, ns, 0, 0, 0, 0, 4, 4, 4, 0, 0, 0, 4, items, kv)


def records(n: int, slow: dict[int, float]) -> list[StepRecord]:
    return [step(i, slow.get(i, 5.0 + 0.1 * ((i * 7) % 5 - 2))) for i in range(n)]


CAPTURE = {"num_steps": 3, "max_windows": 1, "rule": {"ratio": 2.0, "min_excess_ms": 1.0, "warmup_steps": 16},
           "windows": [{"index": 0, "trigger_step": 30, "first_step": 31, "last_step": 33, "duration_ms": 80.0,
                        "expected_ms": 5.0}], "trace": "out/run.trace.json"}


def filled(meta: dict, recs: list[StepRecord]) -> SlowStepsPanel:
    panel = SlowStepsPanel(meta)
    panel.update(Tick(recs, [], final=True))
    return panel


def test_slow_steps_are_marked_with_the_window_they_opened():
    # 30 opens the window (31-33); 32 is profiled, so not judged; 50 is slow once the window bound is reached
    panel = filled({"capture_slow": CAPTURE}, records(60, {30: 80.0, 32: 400.0, 50: 90.0}))
    assert panel.model.visible
    marks = dict(zip(panel.marks.data["step"], panel.marks.data["window"]))
    assert marks == {30: "window 0: steps 31-33", 50: "none opened"}
    why = dict(zip(panel.marks.data["step"], panel.marks.data["why"]))
    assert why[30] == "forward 16.0x its median"  # nothing recorded set it apart: its phase is named
    assert list(panel.boxes.data["left"]) == [30.5] and list(panel.boxes.data["right"]) == [33.5]
    assert panel.boxes.data["label"] == ["window 0: steps 31-33, opened by slow step 30"]
    assert 31 not in panel.expected.data["step"] and 34 in panel.expected.data["step"]  # window steps: not judged
    assert 400.0 in panel.line.data["ms"]  # but drawn: the profiled step's own time, inside its window
    text = panel.div.text
    assert "2 of " in text and "1 of at most 1: 0: steps 31-33 (after step 30)" in text
    assert "out/run.trace.json" in text


def test_a_run_without_capture_is_hidden():
    assert not filled({}, records(60, {25: 60.0})).model.visible  # its slow steps: `kvscope explain`


def test_an_armed_capture_that_caught_nothing_says_so():
    panel = filled({"capture_slow": {**CAPTURE, "windows": []}}, records(60, {}))
    assert panel.model.visible and list(panel.marks.data["step"]) == []
    assert "0 of at most 1: none" in panel.div.text


@pytest.mark.parametrize("capture", [
    {"windows": "x"}, {"windows": [{"index": "0"}], "rule": {"ratio": 0.5}}, {"windows": [None]},
    {"rule": {"ratio": "2", "min_excess_ms": None}}, {"windows": [{"index": True, "trigger_step": 1,
                                                                   "first_step": 2, "last_step": 3}]},
])
def test_a_malformed_capture_meta_is_ignored(capture):
    panel = filled({"capture_slow": capture}, records(40, {25: 60.0}))
    assert list(panel.marks.data["step"]) == [25] and list(panel.boxes.data["left"]) == []
    assert list(panel.marks.data["window"]) == ["none opened"]
    assert not filled({"capture_slow": "yes"}, records(40, {25: 60.0})).model.visible
