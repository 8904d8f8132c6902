"""The GPUs kvscope knows from their data sheets: ``GPUS`` (and ``find_gpu``, which also takes a few aliases).

The one GPU table: ``kvscope simulate --gpu`` times steps by a roofline of it (``kvscope.sim.roofline``) and
sizes the KV pool from its memory, and the options list its names in ``--help`` (``kvscope.options.simulate``).
It lives in the planner's package, the lowest that both the options and the simulator may import, and is
standard library only (the "light modules" contract: the options and the planner load no torch).

Figures are the vendors' data sheets (dense BF16/FP16 tensor throughput, HBM bandwidth, memory), in their
decimal units (``GB`` = 10^9 bytes; the planner's own sizes are binary).
"""

from __future__ import annotations

from dataclasses import dataclass

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


# The link tensor parallelism all-reduces over, per GPU and per direction (bytes/s), from the data sheets: NVLink 3
# on the A100 SXM (600 GB/s both ways), NVLink 4 on the H100 / H200 SXM (900 GB/s both ways), Infinity Fabric on
# the MI300X (~448 GB/s per direction to its 7 peers: 64 GB/s per link x 7), and PCIe for the cards without NVLink
# (Gen4 x16: 32 GB/s per direction; Gen5 x16: 64 GB/s). ``kvscope.sim.roofline`` times tp=N's all-reduces by it.
INTERCONNECT_BYTES_S: dict[str, tuple[float, str]] = {
    "a100-40gb": (300 * GB, "NVLink 3"), "a100-80gb": (300 * GB, "NVLink 3"), "h100": (450 * GB, "NVLink 4"),
    "h100-pcie": (64 * GB, "PCIe Gen5 x16"), "h200": (450 * GB, "NVLink 4"), "l4": (32 * GB, "PCIe Gen4 x16"),
    "a10g": (32 * GB, "PCIe Gen4 x16"), "rtx-4090": (32 * GB, "PCIe Gen4 x16"), "mi300x": (448 * GB, "Infinity Fabric"),
}

# What one GPU costs per hour (USD), for ``kvscope search``'s goodput per dollar (``--gpu-cost`` overrides it): on-
# demand list prices of one GPU's share of a cloud instance in 2025 (AWS p4d / p4de / p5 / g5 / g6, Azure ND MI300X
# v5; an RTX 4090 at community-cloud rates). Prices move; the ranking of configurations on one GPU does not.
USD_PER_HOUR: dict[str, float] = {
    "a100-40gb": 4.10, "a100-80gb": 5.12, "h100": 6.88, "h100-pcie": 4.50, "h200": 7.91, "l4": 0.98,
    "a10g": 1.01, "rtx-4090": 0.69, "mi300x": 6.00,
}


def find_gpu(name: str) -> GPUSpec:
    """The GPU called ``name`` (any case, or an alias); ``ValueError`` naming the known ones."""
    key = name.strip().lower()
    gpu = GPUS.get(ALIASES.get(key, key))
    if gpu is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return gpu
