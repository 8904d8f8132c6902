"""Step-time models for a simulation: ``predict(StepFeatures) -> seconds``, the fitted one saved as JSON
(``kvscope calibrate -o step.json``).

- ``LinearStepModel``: per phase (``kvscope.telemetry.step_features.phase_of``: steps with a prefill chunk, and
  decode-only steps), a fixed cost per step plus a non-negative cost per unit of each feature (``StepFeatures``),
  fitted on a recorded run (``sim/calibrate.py``). Linear because a step's work is: GEMMs linear in the tokens
  computed, attention linear in the context read (and in chunk x context for a prefill), and per-request
  bookkeeping linear in the batch (BLIS / inference-sim fit the same form). Per phase because a decode-only step
  and a step with a prefill chunk spend their time differently (bandwidth vs compute on a GPU; on this CPU,
  attention kernels of different kinds).
- Noise: a real step time scatters around that line (the allocator, the OS, the GC); the mean sets a run's
  duration and the median its ITL. So each phase keeps the quantiles of measured / predicted on the steps
  it was fitted on, and ``predict`` multiplies by one drawn from them (seeded: the same run every time).
- ``RooflineModel`` (``sim/roofline.py``): a GPU that is not here, from its data sheet and the model's shape.

Each predicts the step's *period*: its own time plus the engine loop's overhead until the next step
starts, so a simulated run's duration and latencies add up like a real one's.

The same family as telemetry's online baseline (``kvscope.telemetry.step_baseline.OnlineStepModel``): the same
features and phases, a line per phase. They are fitted apart because they answer different questions. This one
predicts *another* workload (other batches, lengths, block sizes), so it needs a cost per feature that carries
over: every feature, non-negative least squares over the whole finished run (numpy), and the scatter. The
baseline judges each step of *this* run against its recent pace while the run goes on: one regressor, the tokens
computed (``StepFeatures.of_counts``: O(1) per step whatever the batch, and all that a watched vLLM reports),
fitted by least squares with forgetting (a run whose contexts grow changes pace) on a few running sums.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from kvscope.telemetry.step_features import FEATURE_NAMES, PHASES, StepFeatures, phase_of


class StepTimeModel(Protocol):
    """What times a simulated step (``kvscope.sim.worker.SimWorker`` calls ``predict``): ``LinearStepModel`` or
    ``RooflineModel``; ``describe()`` goes into the run's metadata."""

    name: str

    def predict(self, features: StepFeatures) -> float: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class PhaseFit:
    """One phase's line and its scatter: ``(intercept_s + sum(coef * feature)) * ratio``."""

    intercept_s: float
    coef: dict[str, float]
    ratio_quantiles: list[float] = field(default_factory=lambda: [1.0])  # measured / line, evenly spaced

    def __post_init__(self) -> None:
        unknown = set(self.coef) - set(FEATURE_NAMES)
        if unknown:
            raise ValueError(f"step model has unknown features {sorted(unknown)}; known: {list(FEATURE_NAMES)}")
        for key, value in [("intercept_s", self.intercept_s), *self.coef.items(),
                           *(("ratio", q) for q in self.ratio_quantiles)]:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or value < 0 or value > 1e6:
                raise ValueError(f"step model value {key}={value!r} must be a finite number >= 0")
        if not self.ratio_quantiles:
            raise ValueError("step model ratio_quantiles is empty")

    def line(self, f: StepFeatures) -> float:
        total = self.intercept_s
        for name, value in zip(FEATURE_NAMES, f.values()):
            total += self.coef.get(name, 0.0) * value
        return total

    def ratio(self, u: float) -> float:
        """The scatter's quantile at ``u`` in [0, 1), interpolated."""
        q = self.ratio_quantiles
        x = u * (len(q) - 1)
        i = int(x)
        return q[i] if i + 1 >= len(q) else q[i] + (q[i + 1] - q[i]) * (x - i)


@dataclass(slots=True)
class LinearStepModel:
    phases: dict[str, PhaseFit]
    fit: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the run it was fitted on
    seed: int = 0
    name: str = "fitted"
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if set(self.phases) != set(PHASES):
            raise ValueError(f"step model needs the phases {list(PHASES)}, got {sorted(self.phases)}")
        self._rng = random.Random(self.seed)

    def expected(self, f: StepFeatures) -> float:
        """The line alone (no scatter): what the fit is judged on."""
        return self.phases[phase_of(f)].line(f)

    def predict(self, f: StepFeatures) -> float:
        phase = self.phases[phase_of(f)]
        return phase.line(f) * phase.ratio(self._rng.random())

    def describe(self) -> dict[str, Any]:
        phases = {k: {"intercept_s": p.intercept_s, "coef": p.coef, "ratio_quantiles": p.ratio_quantiles}
                  for k, p in self.phases.items()}
        return {"kind": "linear", "phases": phases, "fit": self.fit, "source": self.source, "seed": self.seed}

    def save(self, path: str | os.PathLike) -> Path:
        from kvscope.utils.files import atomic_write

        text = json.dumps(self.describe(), indent=2) + "\n"

        def write(f: IO[str]) -> None:
            f.write(text)

        return atomic_write(path, write)


def load_step_model(path: str | os.PathLike) -> LinearStepModel:
    """A step model saved by ``kvscope calibrate``; ``ValueError`` naming the problem otherwise."""
    shown = str(path)
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"step model {shown!r} does not exist; make one with `kvscope calibrate RUN -o {shown}`") \
            from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read step model {shown!r}: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "linear" or not isinstance(data.get("phases"), dict):
        raise ValueError(f"{shown!r} is not a step model written by `kvscope calibrate`")
    try:
        phases = {k: PhaseFit(float(p["intercept_s"]), dict(p["coef"]), [float(q) for q in p["ratio_quantiles"]])
                  for k, p in data["phases"].items()}
        return LinearStepModel(phases, data.get("fit") or {}, str(data.get("source", "")), int(data.get("seed", 0)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"step model {shown!r} is malformed ({exc})") from None
