"""Why a step was slow: steps far above what a step-time model expects of them, and what was different.

``slow_steps(records, expected)``: ``expected(record)`` is the step time (seconds) a model of the run expects for
what the step computed, passed in by the caller (this package imports neither the simulator nor a source):
``kvscope explain`` gives the line of the model ``kvscope calibrate`` fits on the run itself
(``kvscope.sim.calibrate.fit_step_model``), the report's panel the run's online baseline replayed
(``kvscope.telemetry.step_baseline.judge_steps``). A step is slow by the baseline's ``SlowRule``: at least
``ratio`` times that (and ``min_excess_s`` more; its defaults, ``SLOW_RATIO`` and ``MIN_EXCESS_S``). It is flagged
with what set it apart from the steps before it:

- ``gc``: the garbage collector ran for at least a fifth of the excess (``StepRecord.gc_ns``);
- ``profiled``: a torch.profiler window was open (``StepRecord.profile``);
- ``new_batch_shape``: the first step with its number of sequences and tokens (a new shape to compile or tune);
- ``long_prefill_chunk``: its prefill tokens are above the run's 90th percentile of prefill chunks;
- ``block_table_growth``: the blocks in use grew by more than any step before it;
- ``phase``: the phase (schedule, prepare, forward, sample, update) furthest above its median, and by how much.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscope.telemetry.records import StepRecord
from kvscope.telemetry.step_baseline import MIN_EXCESS_S, SLOW_RATIO, SlowRule

PHASE_FIELDS = ("schedule_ns", "prepare_ns", "forward_ns", "sample_ns", "update_ns")
GC_SHARE = 0.2  # a GC pause explains a slow step when it is at least this share of the excess


@dataclass(slots=True)
class SlowStep:
    """A step far above the run's step-time model."""

    step: int
    duration_s: float
    expected_s: float
    ratio: float
    causes: list[str] = field(default_factory=list)
    phase: str = ""  # the phase furthest above its median
    phase_ratio: float = 0.0  # that phase's time / its median


def _timed(records: list[StepRecord]) -> list[StepRecord]:
    return [r for r in records if r.scheduled and r.duration_ns > 0]


def slow_steps(
    records: list[StepRecord],
    expected: Callable[[StepRecord], float],
    ratio: float = SLOW_RATIO,
    min_excess_s: float = MIN_EXCESS_S,
) -> list[SlowStep]:
    """The steps at least ``ratio`` x (and ``min_excess_s`` over) their expected time, with what differed."""
    rule = SlowRule(ratio, min_excess_s, warmup_steps=0)
    steps = _timed(records)
    if not steps:
        return []
    medians = {p: statistics.median(getattr(r, p) for r in steps) for p in PHASE_FIELDS}
    prefills = sorted(r.num_prefill_tokens for r in steps if r.num_prefill_tokens)
    p90 = prefills[int(0.9 * (len(prefills) - 1))] if prefills else 0
    shapes: set[tuple[int, int]] = set()
    growth_max, previous_used = 0, None
    out = []
    for r in steps:
        shape = (r.num_prefill_seqs + r.num_decode_seqs, r.num_tokens)
        new_shape = shape not in shapes
        shapes.add(shape)
        growth = r.kv.blocks_used - previous_used if previous_used is not None else 0
        previous_used = r.kv.blocks_used
        record_growth = growth > growth_max > 0
        growth_max = max(growth_max, growth)
        duration, want = r.duration_ns / 1e9, max(expected(r), 1e-9)
        if not rule.is_slow(duration, want):
            continue
        slow = SlowStep(r.step, duration, want, duration / want)
        if r.gc_ns and r.gc_ns >= GC_SHARE * (duration - want) * 1e9:
            slow.causes.append("gc")
        if r.profile is not None:
            slow.causes.append("profiled")
        if new_shape:
            slow.causes.append("new_batch_shape")
        if p90 and r.num_prefill_tokens > p90:
            slow.causes.append("long_prefill_chunk")
        if record_growth:
            slow.causes.append("block_table_growth")
        slow.phase, slow.phase_ratio = max(
            ((p[:-3], getattr(r, p) / max(medians[p], 1)) for p in PHASE_FIELDS), key=lambda x: x[1]
        )
        out.append(slow)
    return out


def format_slow(slow: list[SlowStep], num_steps: int, limit: int = 10) -> str:
    """The printed table of slow steps (the slowest ``limit``)."""
    lines = [f"slow steps: {len(slow)} of {num_steps} at least {SLOW_RATIO:g}x the run's own step model"]
    for s in sorted(slow, key=lambda s: -s.ratio)[:limit]:
        why = ", ".join(s.causes) or "nothing recorded set it apart"
        lines.append(
            f"  step {s.step}: {s.duration_s * 1e3:.2f} ms, {s.ratio:.1f}x expected "
            f"({s.expected_s * 1e3:.2f} ms); {s.phase} {s.phase_ratio:.1f}x its median; {why}"
        )
    return "\n".join(lines)
