"""``--capture-slow``: a slow step opens one profiler window over the next N steps, windows are bounded, a steady
run opens none, and with a real engine the window's kernels land in the run's trace."""

from __future__ import annotations

import json

import pytest
from slow_forward import slow_once
from step_records import steady, step
from telemetry_util import PROMPT_A, PROMPT_B, greedy, make_engine

import kvscope
from kvscope import Run
from kvscope.telemetry.profiler import NULL_MARKS
from kvscope.telemetry.slow_capture import MAX_WINDOWS, SlowCapture


class FakeRecorder:
    def __init__(self) -> None:
        self.subscribers = []

    def subscribe(self, fn):
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn)

    def publish(self, records) -> None:
        for r in records:
            for fn in tuple(self.subscribers):
                fn(r)


class FakeWindow:
    def __init__(self, log: list) -> None:
        self.log, self.stopped = log, False
        log.append(self)

    def stop(self) -> None:
        self.stopped = True


def capture(num_steps=3, max_windows=MAX_WINDOWS, busy=lambda: False):
    recorder, windows = FakeRecorder(), []
    cap = SlowCapture(recorder, lambda: FakeWindow(windows), num_steps, max_windows, busy=busy).start()
    return recorder, cap, windows


def with_spikes(n: int, *at: int) -> list:
    records = steady(n)
    for i in at:
        records[i] = step(i, 80.0)
    return records


def test_one_slow_step_opens_one_window_of_n_steps():
    recorder, cap, windows = capture(num_steps=3)
    changes = []
    cap.on_change = lambda: changes.append((cap.num_slow, windows[-1].stopped if windows else None))
    recorder.publish(with_spikes(60, 30))
    assert len(windows) == 1 and windows[0].stopped  # closed after its last step
    assert changes == [(1, False), (1, True)]  # after the slow step, and once its window closed
    meta = cap.describe("run.trace.json")
    assert meta["num_triggered"] == 1 and meta["num_slow"] == 1 and meta["num_skipped"] == 0
    w = meta["windows"][0]
    assert (w["trigger_step"], w["first_step"], w["last_step"]) == (30, 31, 33)
    assert w["duration_ms"] == pytest.approx(80.0) and w["expected_ms"] < 10
    assert meta["slow_steps"] == [{"step": 30, "duration_ms": pytest.approx(80.0),
                                   "expected_ms": w["expected_ms"], "window": 0}]
    assert meta["trace"] == "run.trace.json"
    json.dumps(meta, allow_nan=False)  # goes into the run's files as it is


def test_a_steady_run_opens_nothing():
    recorder, cap, windows = capture()
    recorder.publish(steady(400, jitter=0.9))
    assert windows == [] and cap.describe()["num_slow"] == 0


def test_windows_are_bounded():
    recorder, cap, windows = capture(num_steps=2, max_windows=2)
    recorder.publish(with_spikes(120, 30, 50, 70, 90))
    meta = cap.describe()
    assert len(windows) == 2 and meta["num_triggered"] == 2
    assert meta["num_slow"] == 4 and meta["num_skipped"] == 2
    assert [w["trigger_step"] for w in meta["windows"]] == [30, 50]
    assert [s["window"] for s in meta["slow_steps"]] == [0, 1, None, None]


def test_steps_inside_a_window_are_not_judged():
    recorder, cap, windows = capture(num_steps=3)
    recorder.publish(with_spikes(60, 30, 32))  # 32 is profiled: the profiler's own cost, not a trigger
    assert len(windows) == 1 and cap.describe()["num_slow"] == 1


def test_no_window_while_another_is_open():
    other = {"open": False}
    recorder, cap, windows = capture(busy=lambda: other["open"])
    records = with_spikes(60, 30)
    recorder.publish(records[:30])
    other["open"] = True  # an on-demand --profile window
    recorder.publish(records[30:])
    assert windows == [] and cap.describe()["num_slow"] == cap.describe()["num_skipped"] == 1


def test_stop_closes_an_open_window_and_unsubscribes():
    recorder, cap, windows = capture(num_steps=10)
    recorder.publish(with_spikes(32, 30))
    cap.stop()
    assert windows[0].stopped and recorder.subscribers == []


def test_a_profiler_that_cannot_start_is_reported_once():
    recorder, calls = FakeRecorder(), []

    def broken():
        calls.append(1)
        raise OSError("no profiler here")

    cap = SlowCapture(recorder, broken, 3).start()
    recorder.publish(with_spikes(80, 30, 50))
    meta = cap.describe()
    assert calls == [1] and meta["error"] == "OSError: no profiler here"
    assert meta["num_triggered"] == 0 and meta["num_skipped"] == meta["num_slow"] == 2


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="num_steps=0"):
        SlowCapture(FakeRecorder(), lambda: None, 0)


# ---- with a real engine ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def captured():
    """A run whose 25th forward sleeps 300 ms; the rule asks for 10x and 100 ms over, so only that one counts
    on a loaded machine."""
    engine = slow_once(make_engine(), at=25, seconds=0.3)
    with engine.capture_slow(3, max_windows=2, ratio=10, min_excess_s=0.1) as cap:
        engine.generate([PROMPT_A, PROMPT_B], greedy(40))
    assert engine.phase_marks is NULL_MARKS
    return engine, cap, Run.from_engine(engine)


def test_the_slow_step_opens_one_window_over_the_next_steps(captured):
    _, cap, run = captured
    meta = cap.describe()
    slow_step = next(r.step for r in run.records if r.duration_ns > 250_000_000)
    assert meta["num_triggered"] == 1
    w = meta["windows"][0]
    assert (w["trigger_step"], w["first_step"], w["last_step"]) == (slow_step, slow_step + 1, slow_step + 3)
    assert [r.step for r in run.records if r.profile is not None] == [slow_step + 1, slow_step + 2, slow_step + 3]


def test_the_trace_holds_the_windows_kernels(captured, tmp_path):
    _, cap, run = captured
    w = cap.describe()["windows"][0]
    by_step = {r.step: r for r in run.records}
    start, end = by_step[w["first_step"]].t_start_ns / 1e3, by_step[w["last_step"]].t_end_ns / 1e3
    ops = [e for e in run.profiler_events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert any(start <= e["ts"] <= end for e in ops)  # the window's ops, on the run's clock
    path = run.save_trace(tmp_path / "run.trace.json")
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert "kvscope.forward" in names and any(str(n).startswith("aten::") for n in names)
    assert len(kvscope.load(path).profiler_events) == len(run.profiler_events)


def test_an_engine_without_telemetry_is_refused():
    with pytest.raises(ValueError, match="telemetry=True"):
        make_engine(telemetry=False).capture_slow(3)
