"""A roofline step-time model for a GPU that is not here: ``kvscope simulate --gpu a100-40gb``.

A step moves bytes (every weight once, the K/V it reads and writes) and does FLOPs (2 per parameter per
token computed, plus attention: 4 x layers x query heads x head size per query-key pair). It takes the
longer of bytes / bandwidth and FLOPs / peak, each derated to what real kernels reach, plus a fixed
overhead per step (scheduling, launches, sampling). Decode steps are bandwidth-bound (the weights are
read for a handful of tokens); long prefills are compute-bound.

The GPUs' figures are their data sheets' (``kvscope.planning.gpus``, the one GPU table, which the options list
too). The efficiencies and the overhead are assumptions, named here and written into the run's metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvscope.planning.gpus import GPUSpec
from kvscope.telemetry.step_features import StepFeatures


@dataclass(slots=True)
class RooflineModel:
    """``max(bytes / (bandwidth x mem_efficiency), flops / (peak x flop_efficiency)) + overhead_s``."""

    gpu: GPUSpec
    num_params: int
    dtype_bytes: int
    num_layers: int
    num_heads: int
    head_dim: int
    kv_bytes_per_token: int
    mem_efficiency: float = 0.8  # what a tuned kernel reaches of the HBM bandwidth
    flop_efficiency: float = 0.6  # of the dense tensor peak
    overhead_s: float = 0.002  # per step: scheduling, kernel launches, sampling
    name: str = "roofline"

    def __post_init__(self) -> None:
        if self.num_params <= 0:
            raise ValueError("the roofline needs the model's parameter count; this shape does not give one")

    def predict(self, f: StepFeatures) -> float:
        tokens = f.prefill_tokens + f.decode_tokens
        if not tokens:
            return 0.0
        moved = self.num_params * self.dtype_bytes + (f.context_tokens + tokens) * self.kv_bytes_per_token
        attention_pairs = f.prefill_attention + f.decode_context
        flops = 2 * self.num_params * tokens + 4 * self.num_layers * self.num_heads * self.head_dim * attention_pairs
        memory_s = moved / (self.gpu.bandwidth_bytes_s * self.mem_efficiency)
        compute_s = flops / (self.gpu.peak_flops * self.flop_efficiency)
        return max(memory_s, compute_s) + self.overhead_s

    def describe(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = "roofline"
        return out
