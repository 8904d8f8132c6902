"""torch.profiler windows: per-step kernel categories on the CPU, clean detach, the clock relation."""

from __future__ import annotations

import json
import time

import pytest
from telemetry_util import PROMPT_A, PROMPT_B, greedy, make_engine
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from kvscope import Run
from kvscope.telemetry.kernel_time import MATMUL_OPS, categorize
from kvscope.telemetry.profiler import NULL_MARKS
from kvscope.telemetry.records import PROFILE_CATEGORIES

pytestmark = pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")


@pytest.fixture(scope="module")
def profiled():
    engine = make_engine()
    backend = engine.runner.backend
    with engine.profile(num_steps=2, wait=1, warmup=1) as prof:
        engine.generate([PROMPT_A, PROMPT_B], greedy(7))
    assert engine.phase_marks is NULL_MARKS and engine.runner.backend is backend  # detached
    return engine, prof, Run.from_engine(engine)


def test_profiled_steps_get_kernel_category_summaries(profiled):
    _, prof, run = profiled
    profiled_steps = [r.step for r in run.records if r.profile is not None]
    assert profiled_steps == [2, 3] == sorted(prof.summaries)  # wait 1 + warmup 1, then 2 active
    for r in run.records:
        if r.profile is None:
            continue
        assert set(r.profile) == {*PROFILE_CATEGORIES, "total"}
        assert r.profile["total"] == sum(r.profile[c] for c in PROFILE_CATEGORIES)
        for category in ("attention", "matmul", "store_kv", "sampling"):
            assert r.profile[category] > 0, category
        # kernel time is part of the step's wall time
        assert r.profile["total"] < r.duration_ns
    cols = [f"prof_{c}_ns" for c in (*PROFILE_CATEGORIES, "total")]
    assert list(run.steps.columns[-len(cols) :]) == cols
    assert run.steps[cols].notna().all(axis=1).sum() == 2


def test_steps_after_the_window_are_not_profiled(profiled):
    engine, _, _ = profiled
    before = engine.recorder.num_steps_recorded
    engine.generate([PROMPT_A], greedy(2))
    assert engine.recorder.num_steps_recorded == before + 2
    assert all(r.profile is None for r in list(engine.recorder.steps)[-2:])


def test_kineto_events_land_inside_our_phases(profiled):
    """The offset is calibrated on the kvscope.* ranges; aten ops (not used for it) must then fall
    inside the forward phase of the step that ran them, on our clock."""
    _, prof, run = profiled
    records = {r.step: r for r in run.records if r.profile is not None}
    forward_windows = [
        (
            r.t_start_ns + r.schedule_ns + r.prepare_ns,
            r.t_start_ns + r.schedule_ns + r.prepare_ns + r.forward_ns,
        )
        for r in records.values()
    ]
    # the GEMMs: aten::mm, or the oneDNN linears of kvscope/engine/worker/fusion.py where it runs them
    mms = [e for e in run.profiler_events if e.get("name") in MATMUL_OPS and e.get("ph") == "X"]
    assert mms
    for e in mms:
        start = e["ts"] * 1000
        assert any(a - 20_000 <= start <= b + 20_000 for a, b in forward_windows), e  # within 20 us
    assert abs(prof.clock_offset_ns - prof._fallback_offset) < 5_000_000


def test_torch_profiler_clock_is_unix_time(tmp_path):
    """What the exporter relies on: Kineto's ``baseTimeNanoseconds + ts * 1000`` is Unix-epoch time,
    i.e. ``time.time_ns()``, not ``perf_counter_ns`` / ``CLOCK_MONOTONIC``."""
    with profile(activities=[ProfilerActivity.CPU]) as p:
        wall, perf = time.time_ns(), time.perf_counter_ns()
        with record_function("clock-probe"):
            time.sleep(0.002)
    path = tmp_path / "clock-probe.json"
    p.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    event = next(e for e in trace["traceEvents"] if e.get("name") == "clock-probe")
    stamp = trace["baseTimeNanoseconds"] + round(event["ts"] * 1000)
    assert 0 <= stamp - wall < 5_000_000  # Unix time, a few microseconds after we read it
    assert abs(stamp - perf) > 10**15  # and nowhere near the monotonic clock


def test_categories():
    assert categorize("aten::mm", ("kvscope.forward",)) == "matmul"
    assert categorize("aten::softmax", ("kvscope.forward", "kvscope.paged_attention")) == "attention"
    assert categorize("aten::softmax", ("kvscope.sample",)) == "sampling"
    assert categorize("aten::index_copy_", ("kvscope.forward",)) == "store_kv"
    assert categorize("_paged_attention_kernel", ()) == "attention"
    assert categorize("sm90_xmma_gemm_bf16", ()) == "matmul"
    assert categorize("aten::add", ("kvscope.forward",)) == "other"


def test_profiling_needs_telemetry_and_one_window_at_a_time():
    with pytest.raises(ValueError, match="telemetry=True"):
        make_engine(telemetry=False).profile()
    engine = make_engine()
    prof = engine.profile(num_steps=1)
    with pytest.raises(RuntimeError, match="already open"):
        engine.profile()
    prof.stop()  # stopped before any step: nothing recorded, engine restored
    assert engine.phase_marks is NULL_MARKS and prof.summaries == {}
    engine.generate([PROMPT_A], greedy(2))
