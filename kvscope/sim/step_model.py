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

from kvscope.sim.admission import MAX_ADMISSION_S
from kvscope.telemetry.step_features import FEATURE_NAMES, PHASES, StepFeatures, phase_of

# Bounds of a step model (docs/reliability.md): a file from ``kvscope calibrate`` is a few KB, and its values are
# seconds per step or per unit of a feature. Beyond these a simulation's virtual clock would leave 64 bits within a
# few steps (``kvscope.utils.clock.MAX_VIRTUAL_NS``), so they are refused when the model is read.
MAX_STEP_MODEL_BYTES = 256 << 10
MAX_INTERCEPT_S = 3600.0  # a step's fixed cost: an hour at most
MAX_COEF_S = 60.0  # the cost of one unit of a feature (a token, a sequence, a block): a minute at most
MAX_RATIO = 1000.0  # the scatter: measured / line
MAX_QUANTILES = 1001
_PHASE_FIELDS = {"intercept_s", "coef", "ratio_quantiles"}


def check_number(where: str, value: Any, hi: float) -> float:
    """``value`` as a float if it is a JSON number (never a string or a boolean), finite, from 0 to ``hi``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {str(value)[:40]!r} ({type(value).__name__}): it must be a number")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or x < 0 or x > hi:
        raise ValueError(f"{where}={str(value)[:40]} must be a finite number from 0 to {hi:g}")
    return x


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
        check_number("intercept_s", self.intercept_s, MAX_INTERCEPT_S)
        for name, value in self.coef.items():
            check_number(f"coef.{name}", value, MAX_COEF_S)
        if not self.ratio_quantiles or len(self.ratio_quantiles) > MAX_QUANTILES:
            raise ValueError(f"ratio_quantiles has {len(self.ratio_quantiles)} values: 1 to "
                             f"{MAX_QUANTILES} are allowed")
        for i, q in enumerate(self.ratio_quantiles):
            check_number(f"ratio_quantiles[{i}]", q, MAX_RATIO)

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
    admission_s: float = 0.0  # before a request's first step at an idle engine (kvscope.sim.admission)
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
        return {"kind": "linear", "phases": phases, "fit": self.fit, "source": self.source, "seed": self.seed,
                "admission_s": self.admission_s}

    def save(self, path: str | os.PathLike) -> Path:
        from kvscope.utils.files import atomic_write

        text = json.dumps(self.describe(), indent=2) + "\n"

        def write(f: IO[str]) -> None:
            f.write(text)

        return atomic_write(path, write)


def load_step_model(path: str | os.PathLike) -> LinearStepModel:
    """A step model saved by ``kvscope calibrate``; ``ValueError`` naming the file and the field otherwise. Read
    strictly: at most ``MAX_STEP_MODEL_BYTES``, every value of its JSON type (no number as a string, no boolean as
    a number), every number within its bound, and each phase able to time a step (``_check_moves``)."""
    shown = str(path)
    try:
        with open(Path(path).expanduser(), "rb") as f:
            raw = f.read(MAX_STEP_MODEL_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"step model {shown!r} does not exist; make one with `kvscope calibrate RUN -o {shown}`") \
            from None
    except OSError as exc:
        raise ValueError(f"cannot read step model {shown!r}: {exc.strerror or exc}") from None
    if len(raw) > MAX_STEP_MODEL_BYTES:
        raise ValueError(f"step model {shown!r} is larger than {MAX_STEP_MODEL_BYTES >> 10} KiB: not a file of "
                         "`kvscope calibrate` (a few KB)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: also an integer of 4,300+ digits
        raise ValueError(f"cannot read step model {shown!r}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(data, dict) or data.get("kind") != "linear" or not isinstance(data.get("phases"), dict):
        raise ValueError(f"{shown!r} is not a step model written by `kvscope calibrate`")
    try:
        model = _parse(data)
    except ValueError as exc:
        raise ValueError(f"step model {shown!r}: {exc}") from None
    return model


def _parse(data: dict[str, Any]) -> LinearStepModel:
    phases = data["phases"]
    if set(phases) != set(PHASES):
        raise ValueError(f"phases are {sorted(phases)}; a step model has exactly {list(PHASES)}")
    fits = {}
    for name in PHASES:
        p = phases[name]
        if not isinstance(p, dict) or set(p) != _PHASE_FIELDS:
            got = sorted(p) if isinstance(p, dict) else type(p).__name__
            raise ValueError(f"phases.{name} has {got}; it needs exactly {sorted(_PHASE_FIELDS)}")
        coef, quantiles = p["coef"], p["ratio_quantiles"]
        if not isinstance(coef, dict):
            raise ValueError(f"phases.{name}.coef is a {type(coef).__name__}: it must be an object of feature: cost")
        if not isinstance(quantiles, list):
            raise ValueError(f"phases.{name}.ratio_quantiles is a {type(quantiles).__name__}: it must be a list of "
                             "numbers")
        try:
            fits[name] = PhaseFit(check_number("intercept_s", p["intercept_s"], MAX_INTERCEPT_S),
                                  {k: check_number(f"coef.{k}", v, MAX_COEF_S) for k, v in coef.items()},
                                  [check_number(f"ratio_quantiles[{i}]", q, MAX_RATIO)
                                   for i, q in enumerate(quantiles)])
        except ValueError as exc:
            raise ValueError(f"phases.{name}.{exc}") from None
        _check_moves(name, fits[name])
    fit, source, seed = data.get("fit", {}), data.get("source", ""), data.get("seed", 0)
    if not isinstance(fit, dict):
        raise ValueError(f"fit is a {type(fit).__name__}: it must be an object")
    if not isinstance(source, str):
        raise ValueError(f"source is a {type(source).__name__}: it must be a string")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed={str(seed)[:40]} must be an integer from 0 to 2**64 - 1")
    admission = check_number("admission_s", data.get("admission_s", 0.0), MAX_ADMISSION_S)  # older files: 0
    return LinearStepModel(fits, fit, source[:1000], seed, admission)


def _check_moves(name: str, phase: PhaseFit) -> None:
    """A step of the phase's smallest kind (one sequence, one token) must take time, else a simulation's clock
    never moves and its rates are NaN (an all-zero model)."""
    token = "prefill_tokens" if name == "prefill" else "decode_tokens"
    smallest = phase.intercept_s + phase.coef.get("num_seqs", 0.0) + phase.coef.get(token, 0.0)
    if smallest <= 0 or max(phase.ratio_quantiles) <= 0:
        raise ValueError(f"phases.{name} times a step of one sequence and one token at 0 s: a simulation's clock "
                         "would never move. Fit it again with `kvscope calibrate RUN -o FILE`")
