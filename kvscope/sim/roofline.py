"""A roofline step-time model for a GPU that is not here: ``kvscope simulate --gpu a100-40gb``.

A step moves bytes (every weight once, the K/V it reads and writes) and does FLOPs (2 per parameter per
token computed, plus attention: 4 x layers x query heads x head size per query-key pair). It takes the
longer of bytes / bandwidth and FLOPs / peak, each derated to what real kernels reach, plus a fixed
overhead per step (scheduling, launches, sampling). Decode steps are bandwidth-bound (the weights are
read for a handful of tokens); long prefills are compute-bound.

The GPUs' figures are their data sheets' (``kvscope.planning.gpus``, the one GPU table, which the options list
too). The efficiencies and the overhead are assumptions, named here and written into the run's metadata.

Tensor parallelism (``tp`` > 1, Megatron's split): each GPU holds 1/tp of the weights and of the KV heads, so a
step moves and computes 1/tp of the bytes and FLOPs on each, and adds two all-reduces per layer (after attention
and after the MLP) of ``tokens x hidden x dtype bytes``, each a ring all-reduce: ``2 (tp - 1) / tp`` of the
message over the interconnect's per-direction bandwidth (``kvscope.planning.gpus.INTERCONNECT_BYTES_S``: NVLink
or PCIe, from the data sheets) plus a fixed ``allreduce_latency_s``.

Mixture of experts (``num_experts`` > 0): ``expert_params`` of the ``num_params`` sit in the experts, and each
token uses ``experts_per_token`` of them. FLOPs count the active parameters; the bytes count the dense ones plus
the experts a step touches: with ``t`` tokens routed uniformly, each expert is touched with probability
``1 - (1 - k / E) ** t`` (one token reads its k experts; a large batch reads them all).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvscope.planning.gpus import INTERCONNECT_BYTES_S, GPUSpec
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
    tp: int = 1  # tensor-parallel degree: the GPUs one instance spans
    interconnect_bytes_s: float = 0.0  # per GPU and direction, for tp > 1 (0: the GPU table's)
    allreduce_latency_s: float = 5e-6  # per all-reduce: launch and synchronisation (NCCL's small-message time)
    hidden_size: int = 0  # the all-reduced width (0: query heads x head size)
    num_experts: int = 0  # MoE: experts per layer (0: a dense model)
    experts_per_token: int = 0  # MoE: experts each token is routed to
    expert_params: int = 0  # MoE: the parameters in the experts (all layers), of num_params

    def __post_init__(self) -> None:
        if self.num_params <= 0:
            raise ValueError("the roofline needs the model's parameter count; this shape does not give one")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp={self.tp!r} must be a whole number of GPUs >= 1")
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts
                                     and 0 < self.expert_params < self.num_params):
            raise ValueError("a mixture of experts needs 0 < experts_per_token <= num_experts and 0 < expert_params "
                             "< num_params")
        if self.tp > 1 and not self.interconnect_bytes_s:
            self.interconnect_bytes_s = INTERCONNECT_BYTES_S.get(self.gpu.name, (32e9, ""))[0]

    @property
    def active_params(self) -> int:
        """The parameters one token computes with (all of them for a dense model)."""
        if not self.num_experts:
            return self.num_params
        return self.num_params - self.expert_params + self.expert_params * self.experts_per_token // self.num_experts

    def weight_bytes(self, tokens: int) -> float:
        """The weights a step of ``tokens`` tokens reads (every GPU's share together)."""
        if not self.num_experts:
            return self.num_params * self.dtype_bytes
        touched = 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** tokens
        return (self.num_params - self.expert_params + self.expert_params * touched) * self.dtype_bytes

    def allreduce_s(self, tokens: int) -> float:
        """The step's all-reduces under tensor parallelism (two per layer; 0 for tp=1)."""
        if self.tp == 1:
            return 0.0
        message = tokens * (self.hidden_size or self.num_heads * self.head_dim) * self.dtype_bytes
        one = 2 * (self.tp - 1) / self.tp * message / self.interconnect_bytes_s + self.allreduce_latency_s
        return 2 * self.num_layers * one

    def predict(self, f: StepFeatures) -> float:
        tokens = f.prefill_tokens + f.decode_tokens
        if not tokens:
            return 0.0
        moved = self.weight_bytes(tokens) + (f.context_tokens + tokens) * self.kv_bytes_per_token
        attention_pairs = f.prefill_attention + f.decode_context
        flops = 2 * self.active_params * tokens \
            + 4 * self.num_layers * self.num_heads * self.head_dim * attention_pairs
        memory_s = moved / self.tp / (self.gpu.bandwidth_bytes_s * self.mem_efficiency)
        compute_s = flops / self.tp / (self.gpu.peak_flops * self.flop_efficiency)
        return max(memory_s, compute_s) + self.allreduce_s(tokens) + self.overhead_s

    def describe(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = "roofline"
        return out
