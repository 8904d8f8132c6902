"""What ``kvscope explain`` runs beside the explainer: the offline simulation of ``--prompts`` (the simulator's
engine: the real scheduler, KV cache manager and block pool, no model; all prompts at once, a constant step
time, on which the explanation does not depend) and the slow-step report (the run's own step model, fitted by
``kvscope.sim.calibrate``, handed to ``kvscope.explain.slow``, which does not import the simulator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONSTANT_STEP_S = 1e-3  # offline: every simulated step takes this long


@dataclass(slots=True)
class ConstantStepModel:
    """A step-time model whose every step takes ``step_s`` (virtual) seconds."""

    step_s: float = CONSTANT_STEP_S
    name: str = "constant"

    def predict(self, features: Any) -> float:
        return self.step_s

    def describe(self) -> dict[str, Any]:
        return {"kind": "constant", "step_s": self.step_s}


def simulate_prompts(
    prompts: list[list[int]],
    model: str,
    *,
    block_size: int = 16,
    num_blocks: int | None = None,
    kv_memory: int | None = None,
    max_num_seqs: int | None = None,
    max_tokens: int = 1,
):
    """A ``Run`` of ``prompts`` (token ids) on a simulated engine shaped like ``model`` (``ValueError`` when a
    request cannot fit the pool or the model is unknown)."""
    from kvscope.engine.config import EngineConfig
    from kvscope.engine.request import SamplingParams
    from kvscope.runs.result.run import Run
    from kvscope.sim.build import simulated_engine
    from kvscope.sim.shape import resolve_shape

    if not prompts:
        raise ValueError("no prompts to explain")
    shape = resolve_shape(model)
    options: dict[str, Any] = {
        "block_size": block_size,
        "num_blocks": num_blocks,
        "kv_cache_memory": kv_memory,
    }
    if max_num_seqs is not None:
        options["max_num_seqs"] = max_num_seqs
    engine = simulated_engine(
        shape, EngineConfig(**options), ConstantStepModel(), meta={"explain_prompts": len(prompts)}
    )
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    failed = [o for o in outputs if getattr(o, "finish_reason", None) == "error"]
    if failed:
        raise ValueError(
            f"{len(failed)} prompts could not run in this pool (e.g. {failed[0].error}): "
            "give more --num-blocks / --kv-memory"
        )
    return Run.from_engine(engine)


def slow_report(run) -> tuple[list[dict[str, Any]], str]:
    """Steps far above the step-time model calibrated on the run itself (none when it is too short to fit)."""
    from dataclasses import asdict

    from kvscope.explain.slow import format_slow, slow_steps
    from kvscope.sim.calibrate import fit_step_model
    from kvscope.telemetry.step_features import StepFeatures

    bs = int(run.meta["block_size"])
    try:
        model = fit_step_model(run.records, bs)
    except ValueError as exc:
        return [], f"slow steps: not judged ({str(exc).split(';')[0]})"
    slow = slow_steps(run.records, lambda r: model.expected(StepFeatures.of_record(r, bs)))
    return [asdict(s) for s in slow], format_slow(slow, sum(1 for r in run.records if r.scheduled))
