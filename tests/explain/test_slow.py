"""Why a step was slow: steps far above the expected time are flagged with what set them apart."""

from __future__ import annotations

import statistics

import pytest

from kvscope import Engine, SamplingParams
from kvscope.explain.slow import format_slow, slow_steps
from kvscope.runs.result.run import Run


@pytest.fixture(scope="module")
def records():
    engine = Engine("tiny", num_blocks=64, block_size=4)
    engine.generate([[3 + i] * 9 for i in range(4)], SamplingParams(max_tokens=12, ignore_eos=True))
    return Run.from_engine(engine).records


def _stretch(record, by_ns: int) -> None:
    record.forward_ns += by_ns
    record.t_end_ns += by_ns


def test_a_stretched_profiled_step_is_flagged_with_its_phase(records):
    typical = statistics.median(r.duration_ns for r in records if r.scheduled) / 1e9
    target = records[8]
    _stretch(target, 50_000_000)  # 50 ms more in forward
    target.profile = {"total": 1}
    try:
        slow = slow_steps(records, lambda r: typical)
    finally:
        _stretch(target, -50_000_000)
        target.profile = None
    flagged = {s.step: s for s in slow}
    assert target.step in flagged
    s = flagged[target.step]
    assert s.ratio > 2 and s.phase == "forward" and s.phase_ratio > 2 and "profiled" in s.causes
    assert "new_batch_shape" not in s.causes  # a decode of 4 sequences, like the steps before it
    assert f"step {target.step}:" in format_slow(slow, len(records))


def test_first_steps_carry_their_new_shape_and_long_prefill(records):
    slow = slow_steps(records, lambda r: 1e-9, min_excess_s=0)  # every step is "slow" against 1 ns
    first = slow[0]
    assert first.step == records[0].step and "new_batch_shape" in first.causes
    assert "block_table_growth" not in first.causes  # nothing before it to grow from
    assert all("profiled" not in s.causes for s in slow)


def test_nothing_is_flagged_against_a_generous_model(records):
    assert slow_steps(records, lambda r: 10.0) == []
    assert slow_steps([], lambda r: 1.0) == []


def test_a_gc_pause_is_recorded_and_named(tmp_path):
    import gc

    import kvscope

    engine = Engine("tiny", num_blocks=64, block_size=4)
    engine.add_request([5] * 9, SamplingParams(max_tokens=6, ignore_eos=True))
    engine.step()
    garbage = [[i] for i in range(200_000)]  # something for a full collection to walk
    gc.collect()
    engine.step()
    del garbage
    while engine.has_unfinished_requests():
        engine.step()
    run = Run.from_engine(engine)
    assert run.records[1].gc_ns > 0  # the collection between the steps
    loaded = kvscope.load(run.save_metrics(tmp_path / "r.metrics.jsonl"))
    assert [r.gc_ns for r in loaded.records] == [r.gc_ns for r in run.records]
    record = run.records[1]
    excess = 0.75 * record.duration_ns / 1e9  # expected a quarter of its time
    record.gc_ns = int(0.3 * excess * 1e9)
    (flagged,) = slow_steps([record], lambda r: r.duration_ns / 4e9, min_excess_s=0)
    assert "gc" in flagged.causes
    record.gc_ns = int(0.1 * excess * 1e9)  # too small a share of the excess to explain it
    (flagged,) = slow_steps([record], lambda r: r.duration_ns / 4e9, min_excess_s=0)
    assert "gc" not in flagged.causes
