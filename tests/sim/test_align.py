"""``align_steps``: a watched vLLM's steps (counts and times only) paired with a replay's batches by their counts,
in order, skipping what only one side ran; the fit on the aligned steps then has the context features."""

from __future__ import annotations

import dataclasses
import itertools

from kvscope.sim.align import MIN_MATCHED, RecordedPace, align_steps, recorded_periods
from kvscope.sim.calibrate import fit_step_model
from kvscope.sim.step_model import LinearStepModel, PhaseFit
from kvscope.telemetry.records import ScheduledItem, StepRecord
from kvscope.telemetry.step_features import StepFeatures
from tests.sim.test_calibrate import record, synthetic_run, true_time


def counts_of(r: StepRecord) -> tuple[int, int, int, int]:
    pre = [s for s in r.scheduled if s.kind == "prefill"]
    dec = [s for s in r.scheduled if s.kind == "decode"]
    return len(pre), sum(s.num_tokens for s in pre), len(dec), sum(s.num_tokens for s in dec)


def simulated(n: int) -> list[StepRecord]:
    """Steps as the simulator records them: the batch and its counts."""
    return [dataclasses.replace(r, num_prefill_seqs=c[0], num_prefill_tokens=c[1], num_decode_seqs=c[2],
                                num_decode_tokens=c[3]) for r in synthetic_run(n) for c in [counts_of(r)]]


def watched(sim: list[StepRecord]) -> list[StepRecord]:
    """What a watch records of the same steps: counts and times, no batch (``plugin_steps.step_record``)."""
    return [dataclasses.replace(r, scheduled=[], num_prefill_seqs=c[0], num_prefill_tokens=c[1],
                                num_decode_seqs=c[2], num_decode_tokens=c[3], num_running=0, num_waiting=0)
            for r in sim for c in [counts_of(r)]]


def test_identical_schedules_align_step_for_step_and_carry_the_batches():
    sim = simulated(60)
    a = align_steps(watched(sim), sim)
    assert a.matched == a.watched_steps == 60 and a.ok
    assert [r.scheduled for r in a.records] == [r.scheduled for r in sim]
    # back to back, each lasts to the next one's start; the last its own length
    back_to_back = [(r.t_start_ns, n.t_start_ns) for r, n in itertools.pairwise(sim)]
    assert [(r.t_start_ns, r.t_end_ns) for r in a.records] == [*back_to_back, (sim[-1].t_start_ns, sim[-1].t_end_ns)]


def test_a_step_only_one_side_ran_is_skipped_and_the_rest_still_match():
    sim = simulated(60)
    real = watched(sim)
    extra = record(0, 0, 5, [], counts=(1, 999, 0, 0))  # a step the simulation did not run
    real = [*real[:20], extra, *real[20:40], *real[41:]]  # and one it ran that the server did not
    a = align_steps(real, sim)
    assert a.matched == 59 and a.watched_steps == 60
    assert len(a.records) == 59  # only the matched ones: the step only the server ran is left out
    assert [r.scheduled for r in a.records] == [r.scheduled for r in sim[:40] + sim[41:]]


def test_schedules_that_differ_fail_the_alignment():
    sim = simulated(60)
    real = [dataclasses.replace(r, num_decode_tokens=r.num_decode_tokens + 1) for r in watched(sim)]
    a = align_steps(real, sim)
    assert a.share < MIN_MATCHED and not a.ok and a.to_json()["ok"] is False


def test_the_fit_on_aligned_steps_recovers_the_context_cost_the_counts_alone_cannot():
    sim = simulated(300)
    a = align_steps(watched(sim), sim)
    with_context = fit_step_model(a.records, 16)
    counts_only = fit_step_model(watched(sim), 16)
    assert with_context.phases["decode"].coef.get("decode_context", 0) > 0
    assert "decode_context" not in counts_only.phases["decode"].coef
    truth = [true_time(StepFeatures.of_record(r, 16)) for r in sim]
    err = [abs(m.expected(StepFeatures.of_record(r, 16)) - t) / t for m in (with_context, counts_only)
           for r, t in zip(sim if m is with_context else watched(sim), truth)]
    half = len(err) // 2
    assert sum(err[:half]) < 0.5 * sum(err[half:])  # the context features matter in this step time


def test_recorded_periods_join_back_to_back_steps_and_not_idle_ones():
    a = record(0, 0, 10_000_000, [], counts=(0, 0, 1, 1))
    b = record(1, 10_500_000, 10_000_000, [], counts=(0, 0, 1, 1))  # 0.5 ms later: the engine's loop
    c = record(2, 2_000_000_000, 10_000_000, [], counts=(0, 0, 1, 1))  # two seconds later: it idled
    assert recorded_periods([a, b, c]) == [0.0105, 0.01, 0.01]
    pace = RecordedPace([0.5, 0.25], fallback=LinearStepModel({"prefill": PhaseFit(1.0, {}),
                                                               "decode": PhaseFit(2.0, {})}))
    assert [pace.predict(StepFeatures(decode_tokens=1, num_seqs=1)) for _ in range(3)] == [0.5, 0.25, 2.0]


def test_a_step_with_items_keeps_its_own_records_fields():
    sim = simulated(12)
    real = watched(sim)
    a = align_steps(real, sim)
    assert all(isinstance(r.scheduled[0], ScheduledItem) for r in a.records)
    assert [r.step for r in a.records] == [r.step for r in real]
