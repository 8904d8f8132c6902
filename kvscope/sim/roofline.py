"""A roofline step-time model for a GPU that is not here: ``kvscope simulate --gpu a100-40gb``.

A step moves bytes (every weight once, the K/V it reads and writes) and does FLOPs (2 per parameter per
token computed, plus attention: 4 x layers x query heads x head size per query-key pair). It takes the
longer of bytes / bandwidth and FLOPs / peak, each derated to what real kernels reach, plus a fixed
overhead per step (scheduling, launches, sampling). Decode steps are bandwidth-bound (the weights are
read for a handful of tokens); long prefills are compute-bound.

Figures are the vendors' data sheets (dense BF16/FP16 tensor throughput, HBM bandwidth, memory). The
efficiencies and the overhead are assumptions, named here and written into the run's metadata.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvscope.sim.features import StepFeatures

GB = 10**9


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    memory_bytes: int  # HBM capacity
    bandwidth_bytes_s: float  # HBM bandwidth
    peak_flops: float  # dense BF16 / FP16 tensor-core FLOP/s
    source: str


GPUS: dict[str, GPUSpec] = {g.name: g for g in (
    GPUSpec("a100-40gb", 40 * GB, 1555 * GB, 312e12, "NVIDIA A100 data sheet: 40 GB HBM2, 1,555 GB/s, 312 TFLOPS"),
    GPUSpec("a100-80gb", 80 * GB, 2039 * GB, 312e12, "NVIDIA A100 data sheet: 80 GB HBM2e, 2,039 GB/s (SXM)"),
    GPUSpec("h100", 80 * GB, 3350 * GB, 989e12, "NVIDIA H100 SXM data sheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOPS"),
    GPUSpec("h100-pcie", 80 * GB, 2000 * GB, 756e12, "NVIDIA H100 PCIe data sheet: 80 GB HBM2e, 2 TB/s, 756 TFLOPS"),
    GPUSpec("h200", 141 * GB, 4800 * GB, 989e12, "NVIDIA H200 SXM data sheet: 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS"),
    GPUSpec("l4", 24 * GB, 300 * GB, 121e12, "NVIDIA L4 data sheet: 24 GB GDDR6, 300 GB/s, 121 TFLOPS"),
    GPUSpec("a10g", 24 * GB, 600 * GB, 125e12, "NVIDIA A10 data sheet: 24 GB GDDR6, 600 GB/s, 125 TFLOPS"),
    GPUSpec("rtx-4090", 24 * GB, 1008 * GB, 165e12, "NVIDIA RTX 4090: 24 GB GDDR6X, 1,008 GB/s, 165 TFLOPS"),
    GPUSpec("mi300x", 192 * GB, 5300 * GB, 1307e12, "AMD MI300X data sheet: 192 GB HBM3, 5.3 TB/s, 1,307 TFLOPS"),
)}
ALIASES = {"a100": "a100-40gb", "h100-sxm": "h100", "h100-80gb": "h100", "h100-sxm-80gb": "h100", "4090": "rtx-4090",
           "a10": "a10g"}


def find_gpu(name: str) -> GPUSpec:
    key = name.strip().lower()
    gpu = GPUS.get(ALIASES.get(key, key))
    if gpu is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return gpu


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
