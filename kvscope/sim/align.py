"""A watched vLLM's steps with the batches they ran, for ``kvscope calibrate`` to fit the context features too.

vLLM's iteration details (``--enable-logging-iteration-details``, the plugin's step lines) give each step's
counts and time: context (prefill) requests and tokens, generation requests and tokens, ``elapsed_ms``; not the
context each request read, which attention's cost grows with. The schedule is deterministic given the arrivals,
so the watched workload replayed through the simulator under vLLM's rules (``kvscope.runs.setup.watched_replay``)
runs the same batches; each simulated step knows its requests and their context lengths (``scheduled``).

``align_steps`` pairs the watched steps with the simulated ones by their counts, in order: two steps match when
their four counts are equal; where they differ (a request that arrived a moment earlier or later than the
simulated clock put it, a preemption), the shortest skip on either side (at most ``WINDOW`` steps) that finds
the next match is taken, and the steps skipped stay unmatched. The matched watched steps are what calibrate fits
on: each gets the simulated step's ``scheduled`` items (so ``kvscope.sim.calibrate`` reads the context features
of the batch) and lasts its period (``recorded_periods``: its ``elapsed_ms`` and, when the next step followed
at once, the engine's loop between them, which a simulated step must include). Unmatched steps are left out
rather than fitted without their context (that would bias the context coefficients); the matched ones lean to
steady stretches of the run, which is the price of knowing their batches.

The alignment fails when fewer than ``MIN_MATCHED`` of the watched steps that computed tokens matched (the
replay did not schedule as the server did: e.g. another vLLM version's rules, a workload whose prompts were not
all matched, a watch that began mid-run). ``kvscope calibrate`` then fits on the watched counts alone
(``with_periods``: tokens and requests, no context features), and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.sim.step_model import StepTimeModel
from kvscope.telemetry.records import StepRecord
from kvscope.telemetry.step_features import StepFeatures

WINDOW = 16
MIN_MATCHED = 0.5
BACK_TO_BACK_S = 2e-3  # a gap between two steps below this (or below the step's own length) is the engine's loop


def recorded_periods(records: Sequence[StepRecord]) -> list[float]:
    """Each watched step's period (seconds): to the next step's start when they ran back to back (the gap is
    vLLM's loop: scheduling, output processing), else its own length (the engine then idled)."""
    steps = [r for r in records if r.num_tokens > 0]
    out = []
    for r, nxt in zip(steps, [*steps[1:], None]):
        own = r.duration_ns / 1e9
        gap = (nxt.t_start_ns - r.t_end_ns) / 1e9 if nxt is not None else None
        out.append(own + gap if gap is not None and 0 <= gap <= max(BACK_TO_BACK_S, own) else own)
    return out


def with_periods(records: Sequence[StepRecord]) -> list[StepRecord]:
    """The watched steps that computed tokens, each lasting its period (``recorded_periods``) and with empty
    queues after it, so that ``kvscope.sim.calibrate`` times each by that period (it cannot tell back-to-back
    steps from the watch's queue counts, which are the last poll's)."""
    steps = [r for r in records if r.num_tokens > 0]
    return [dataclasses.replace(r, t_end_ns=r.t_start_ns + round(p * 1e9), num_running=0, num_waiting=0)
            for r, p in zip(steps, recorded_periods(steps))]


@dataclass(slots=True)
class RecordedPace:
    """A step-time model that times the k-th simulated step as the k-th watched step took (``recorded_periods``),
    and past them as ``fallback`` does: a replay of the watched run then sees its arrivals fall between the same
    steps as the server did, as long as their batches agree."""

    periods: list[float]
    fallback: StepTimeModel
    name: str = "recorded pace"
    _next: int = field(default=0, repr=False)

    def predict(self, features: StepFeatures) -> float:
        if self._next < len(self.periods):
            self._next += 1
            return self.periods[self._next - 1]
        return self.fallback.predict(features)

    def describe(self) -> dict[str, Any]:
        return {"kind": "recorded pace", "steps": len(self.periods), "fallback": self.fallback.describe()}


def counts(r: StepRecord) -> tuple[int, int, int, int]:
    return r.num_prefill_seqs, r.num_prefill_tokens, r.num_decode_seqs, r.num_decode_tokens


@dataclass(slots=True)
class Alignment:
    records: list[StepRecord]  # the matched watched steps, each with the simulated batch, lasting its period
    matched: int  # watched steps that computed tokens and matched a simulated step
    watched_steps: int  # watched steps that computed tokens
    simulated_steps: int

    @property
    def share(self) -> float:
        return self.matched / self.watched_steps if self.watched_steps else 0.0

    @property
    def ok(self) -> bool:
        return self.watched_steps > 0 and self.share >= MIN_MATCHED

    def to_json(self) -> dict[str, float | int | bool]:
        return {"matched_steps": self.matched, "watched_steps": self.watched_steps,
                "simulated_steps": self.simulated_steps, "matched_share": round(self.share, 4), "ok": self.ok,
                "min_matched_share": MIN_MATCHED}


def _next_match(key: tuple[int, ...], keys: Sequence[tuple[int, ...]], start: int) -> int | None:
    """Steps to skip in ``keys`` from ``start`` to reach ``key`` (at most ``WINDOW``), or None."""
    for skip in range(min(WINDOW, len(keys) - start)):
        if keys[start + skip] == key:
            return skip
    return None


def align_steps(watched: Sequence[StepRecord], simulated: Sequence[StepRecord]) -> Alignment:
    """The watched steps, each matched one with the simulated step's batch (the module doc)."""
    real = [r for r in watched if r.num_tokens > 0]
    sim = [r for r in simulated if r.scheduled]
    rk, sk = [counts(r) for r in real], [counts(r) for r in sim]
    pairs: dict[int, StepRecord] = {}
    i = j = 0
    while i < len(real) and j < len(sim):
        if rk[i] == sk[j]:
            pairs[i] = sim[j]
            i, j = i + 1, j + 1
            continue
        skip_sim = _next_match(rk[i], sk, j)  # simulated steps the server did not run
        skip_real = _next_match(sk[j], rk, i)  # watched steps the simulation did not run
        if skip_sim is None and skip_real is None:
            i, j = i + 1, j + 1
        elif skip_real is None or (skip_sim is not None and skip_sim <= skip_real):
            j += skip_sim or 0
        else:
            i += skip_real
    timed = with_periods(real)
    out = [dataclasses.replace(timed[n], scheduled=list(s.scheduled)) for n, s in sorted(pairs.items())]
    return Alignment(out, len(pairs), len(real), len(sim))
