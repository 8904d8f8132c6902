"""The run's own step-time baseline, learnt online, and the rule that calls a step slow.

``OnlineStepModel``: per phase (``step_features.phase_of``: steps with a prefill chunk; decode-only steps), a
line ``intercept + slope x tokens computed`` fitted by least squares with exponential forgetting (``DECAY`` per
step of the phase, so it follows a run whose contexts grow). It reads a step through ``StepFeatures.of_counts``
(the one reader of a step's features). Each update and prediction is a handful of float operations on five
running sums: O(1) per step whatever the run's length or the batch's size.

It is one of kvscope's step-time models (``kvscope.telemetry.step_features`` lists them): the same features and
phases as the model ``kvscope calibrate`` fits (``kvscope.sim.step_model.LinearStepModel``), a line per phase
too, fitted another way because it serves another purpose. It judges each step of this run against the run's
recent pace as the run goes on, so it must be cheap per step, standard library only (it runs in the engine's
loop, under ``--capture-slow``), follow a change of pace, and fit from the few dozen steps it remembers: one
regressor, not the fitted model's seven non-negative costs solved by numpy over the whole finished run (which
must carry over to another workload, as this baseline never has to).

``SlowRule``: a step is slow when its duration is at least ``ratio`` x the prediction *and* at least
``min_excess_s`` above it, judged only once the run has ``warmup_steps`` timed steps and the step's phase has
``MIN_PHASE_SAMPLES`` of its own. The prediction comes from the steps before it only. A slow step is learnt
clipped to ``ratio`` x its prediction, so one spike barely moves the line while a lasting change of pace is
still followed. ``kvscope.explain.slow`` flags steps by the same rule (and its defaults, ``SLOW_RATIO`` and
``MIN_EXCESS_S``), against whatever expected time it is given.

``judge_steps(records, rule)`` replays the same model over a finished run's records: the same verdicts as
online, for the report (``kvscope.widgets``) and ``kvscope.explain.slow`` (as its ``expected``).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from kvscope.telemetry.records import StepRecord
from kvscope.telemetry.step_features import PHASES, StepFeatures, phase_of

DECAY = 0.98  # per step of a phase: about the last 50 steps count
MIN_PHASE_SAMPLES = 8
SLOW_RATIO = 2.0  # a step is slow at twice its expected time...
MIN_EXCESS_S = 1e-3  # ...and 1 ms over it
WARMUP_STEPS = 16


@dataclass(slots=True, frozen=True)
class SlowRule:
    """When a step counts as slow (see the module doc)."""

    ratio: float = SLOW_RATIO
    min_excess_s: float = MIN_EXCESS_S
    warmup_steps: int = WARMUP_STEPS

    def __post_init__(self) -> None:
        if not self.ratio > 1 or not 0 <= self.min_excess_s < 3600 or self.warmup_steps < 0:
            raise ValueError(f"slow-step rule ratio={self.ratio} must be > 1, min_excess_s={self.min_excess_s} "
                             f"in [0, 3600) and warmup_steps={self.warmup_steps} >= 0")

    def is_slow(self, duration_s: float, expected_s: float) -> bool:
        return duration_s >= self.ratio * expected_s and duration_s - expected_s >= self.min_excess_s

    def describe(self) -> dict[str, float | int]:
        return {"ratio": self.ratio, "min_excess_ms": self.min_excess_s * 1e3, "warmup_steps": self.warmup_steps}


@dataclass(slots=True)
class _PhaseLine:
    """Exponentially weighted least squares of y on x: five running sums."""

    n: int = 0  # steps learnt
    s0: float = 0.0  # sum of the weights (DECAY ** age)
    sx: float = 0.0  # weighted sums of x (tokens computed), y (seconds), x^2 and x * y
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        d = DECAY
        self.n += 1
        self.s0 = d * self.s0 + 1.0
        self.sx = d * self.sx + x
        self.sy = d * self.sy + y
        self.sxx = d * self.sxx + x * x
        self.sxy = d * self.sxy + x * y

    def predict(self, x: float) -> float:
        mean_y = self.sy / self.s0
        det = self.s0 * self.sxx - self.sx * self.sx
        slope = (self.s0 * self.sxy - self.sx * self.sy) / det if det > 1e-9 * self.s0 * self.sxx else 0.0
        if slope <= 0:
            return mean_y
        # never below a quarter of the mean step: a line through a few points must not call everything slow
        return max((self.sy - slope * self.sx) / self.s0 + slope * x, 0.25 * mean_y)


PhaseLine = _PhaseLine  # the same line, for the engine's thread policy (a line per thread count: engine/threads.py)


@dataclass(slots=True)
class OnlineStepModel:
    """The run's step time learnt from its own steps, step by step (see the module doc)."""

    rule: SlowRule = field(default_factory=SlowRule)
    num_timed: int = 0
    _lines: dict[str, _PhaseLine] = field(default_factory=lambda: {phase: _PhaseLine() for phase in PHASES})

    def observe(self, record: StepRecord, learn: bool = True) -> tuple[float | None, bool]:
        """(the step's expected seconds, or ``None`` while warming up; whether it is slow), then learn the
        step (``learn=False``: a step that a profiler window slowed down). Steps that computed nothing:
        ``(None, False)``."""
        if not record.scheduled or record.t_end_ns <= record.t_start_ns:
            return None, False
        f = StepFeatures.of_counts(record)
        line = self._lines[phase_of(f)]
        x = float(f.num_tokens)
        y = (record.t_end_ns - record.t_start_ns) / 1e9
        expected, slow, learnt = None, False, y
        if line.n >= MIN_PHASE_SAMPLES and self.num_timed >= self.rule.warmup_steps:
            expected = line.predict(x)
            slow = self.rule.is_slow(y, expected)
            if slow:  # learnt clipped, so that one spike barely moves the line
                learnt = min(y, self.rule.ratio * expected)
        if learn:
            self.num_timed += 1
            line.add(x, learnt)
        return expected, slow


def judge_steps(records: Iterable[StepRecord], rule: SlowRule | None = None,
                skipped: Container[int] = frozenset()) -> dict[int, tuple[float, bool]]:
    """Step -> (expected seconds, slow) over a finished run, as ``OnlineStepModel`` judged it online. Steps in
    ``skipped`` (a capture window's) are neither judged nor learnt, profiled ones (``profile`` set) judged but
    not learnt, as online; warm-up steps are left out."""
    model = OnlineStepModel(rule or SlowRule())
    out = {}
    for r in records:
        if r.step in skipped:
            continue
        expected, slow = model.observe(r, learn=r.profile is None)
        if expected is not None:
            out[r.step] = (expected, slow)
    return out
