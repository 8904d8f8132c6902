"""The run's own online step model and the slow-step rule: steady runs stay quiet, spikes are caught after the
warm-up, a prefill's expected time follows its tokens, and a replay judges as the online pass did."""

from __future__ import annotations

import pytest
from step_records import steady, step

from kvscope.telemetry.step_baseline import (
    MIN_PHASE_SAMPLES,
    OnlineStepModel,
    SlowRule,
    judge_steps,
)


def judge_all(records, rule=None):
    model = OnlineStepModel(rule or SlowRule())
    return [model.observe(r) for r in records]


def test_a_steady_run_has_no_slow_step():
    verdicts = judge_all(steady(500, ms=5.0, jitter=0.8))
    assert not any(slow for _, slow in verdicts)
    expected = [e for e, _ in verdicts if e is not None]
    assert len(expected) == 500 - 16 and all(4.0e-3 < e < 6.0e-3 for e in expected)


def test_a_spike_after_the_warmup_is_slow_and_barely_moves_the_line():
    records = steady(40)
    records[30] = step(30, 50.0)
    model = OnlineStepModel()
    verdicts = [model.observe(r) for r in records]
    assert [r.step for r, (_, slow) in zip(records, verdicts) if slow] == [30]
    before, after = verdicts[29][0], verdicts[31][0]
    assert after < 1.2 * before  # learnt clipped to 2x its prediction, not at 50 ms


def test_nothing_is_judged_during_the_warmup():
    records = steady(20)
    records[5] = step(5, 80.0)
    verdicts = judge_all(records)
    assert verdicts[5] == (None, False)
    assert all(e is None for e, _ in verdicts[:16]) and verdicts[16][0] is not None


def test_the_excess_must_also_exceed_the_minimum():
    records = steady(30, ms=0.1, jitter=0.0)
    records[25] = step(25, 0.5)  # 5x a 0.1 ms step, but only 0.4 ms over it
    assert not any(slow for _, slow in judge_all(records))
    assert judge_all(records, SlowRule(min_excess_s=1e-4))[25][1]


def test_a_longer_prefill_is_expected_to_take_longer():
    # prefill steps whose time grows with the chunk: 1 ms + 0.01 ms per token
    records = [step(i, 1.0 + 0.01 * (64 + 32 * (i % 4)), prefill=64 + 32 * (i % 4), decode=0) for i in range(40)]
    records.append(step(40, 1.0 + 0.01 * 512, prefill=512, decode=0))  # a chunk twice as long as any before
    verdicts = judge_all(records)
    assert not any(slow for _, slow in verdicts)
    assert verdicts[-1][0] == pytest.approx(6.12e-3, rel=0.05)


def test_phases_learn_apart():
    records = [step(i, 20.0, prefill=256, decode=0) if i % 2 else step(i, 2.0) for i in range(60)]
    verdicts = judge_all(records)
    assert not any(slow for _, slow in verdicts)
    # a decode step as slow as a prefill one is slow
    model = OnlineStepModel()
    for r in records:
        model.observe(r)
    assert model.observe(step(60, 20.0))[1]


def test_replay_matches_the_online_pass_and_skips_window_steps():
    records = steady(60)
    records[30] = step(30, 50.0)
    records[45] = step(45, 60.0)
    online = {r.step: v for r, v in zip(records, judge_all(records)) if v[0] is not None}
    assert judge_steps(records) == online
    skipped = judge_steps(records, skipped={45, 46})
    assert 45 not in skipped and 46 not in skipped and skipped[30][1]


def test_a_phase_needs_its_own_samples():
    records = [*steady(30), step(30, 30.0, prefill=64, decode=0)]  # the first prefill step after 30 decodes
    assert judge_all(records)[-1] == (None, False)
    assert MIN_PHASE_SAMPLES > 1


@pytest.mark.parametrize("kwargs", [{"ratio": 1.0}, {"min_excess_s": -1.0}, {"warmup_steps": -1}])
def test_a_bad_rule_is_refused(kwargs):
    with pytest.raises(ValueError, match="slow-step rule"):
        SlowRule(**kwargs)
