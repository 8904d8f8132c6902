"""The FLOP rate of a run against this CPU's fp32 GEMM peak (issue 39: how far a run is from the physical limit).

``workload_flops(model, items)``: the multiply-adds a workload must do, x 2, from the model's shape:

- the linear layers of the decoder (every ``nn.Linear`` but the output head): 2 x in x out per computed token,
  i.e. every prompt token and every output token but the last (which is sampled, never fed back);
- the output head (``lm_head``): 2 x hidden x vocab per sampled token (one per output token: a prompt's other
  positions need no logits);
- attention: 4 x heads x head_dim per layer per visible key (q.k and p.v), each token seeing itself and all
  before it (a sliding window would see fewer: this counts full attention, an upper bound for those models).

``gemm_peak(threads)``: the best fp32 ``torch.mm`` rate of square matrices (1024, 1536) at ``threads`` intra-op
threads, best of a few repeats (and the best per CPU-second): the rate this CPU's BLAS reaches on large GEMMs,
which a run's smaller ones can approach but not pass.

Where a run's time goes beyond its FLOPs at that peak (GEMM efficiency, attention, elementwise ops, copies, sampling,
Python), and the GEMM rate at the run's own shapes: ``benchmarks/flop_gap.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvscope.runs.workload.items import WorkItem


@dataclass(slots=True, frozen=True)
class WorkloadFlops:
    linear: float
    head: float
    attention: float

    @property
    def total(self) -> float:
        return self.linear + self.head + self.attention


def workload_flops(model: torch.nn.Module, items: Sequence[WorkItem]) -> WorkloadFlops:
    """The FLOPs of generating ``items`` with ``model`` (see the module doc)."""
    head = model.get_output_embeddings()
    head_weight = head.weight if head is not None else None
    per_token = sum(m.in_features * m.out_features for m in model.modules()
                    if isinstance(m, torch.nn.Linear) and m.weight is not head_weight)
    head_size = head_weight.numel() if head_weight is not None else 0
    cfg = model.config.get_text_config()
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    computed = sampled = keys = 0
    for item in items:
        prompt, out = len(item.prompt), item.params.max_tokens
        n = prompt + out - 1  # tokens that go through the model
        computed += n
        sampled += out
        keys += n * (n + 1) // 2  # token t sees t + 1 keys
    return WorkloadFlops(2.0 * per_token * computed, 2.0 * head_size * sampled,
                         4.0 * heads * head_dim * cfg.num_hidden_layers * keys)


def gemm_peak(threads: int, sizes: Sequence[int] = (1024, 1536), repeats: int = 3) -> tuple[float, float, str]:
    """(the best fp32 GEMM FLOP/s at ``threads`` threads, the best per CPU-second, what it was measured on); torch's
    threads are put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    best = best_cpu = 0.0
    where = ""
    try:
        with torch.inference_mode():
            for n in sizes:
                a, b = torch.randn(n, n), torch.randn(n, n)
                torch.mm(a, b)  # warm-up: packing buffers, thread start
                for _ in range(repeats):
                    t0, c0 = time.perf_counter(), time.process_time()
                    torch.mm(a, b)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    if 2.0 * n ** 3 / wall > best:
                        best, where = 2.0 * n ** 3 / wall, f"torch.mm {n}x{n} fp32, {threads} threads"
                    best_cpu = max(best_cpu, 2.0 * n ** 3 / max(cpu, 1e-9))
    finally:
        torch.set_num_threads(before)
    return best, best_cpu, where


def flop_rate_line(model: torch.nn.Module, items: Sequence[WorkItem], wall_s: float, cpu_s: float,
                   threads: int) -> str:
    """The run's FLOP rate, its parts, and its share of the GEMM peak at the same thread count: per wall-clock second,
    and per CPU-second (steadier where other work shares the machine: time descheduled counts in neither)."""
    work = workload_flops(model, items)
    peak, peak_cpu, where = gemm_peak(threads)
    rate, rate_cpu = work.total / wall_s, work.total / cpu_s
    return (f"FLOP rate kvscope = {rate / 1e9:.1f} GFLOP/s = {100 * rate / peak:.0f}% of this CPU's measured fp32 "
            f"GEMM peak {peak / 1e9:.1f} GFLOP/s ({where}); per CPU-second {rate_cpu / 1e9:.1f} vs "
            f"{peak_cpu / 1e9:.1f} GFLOP = {100 * rate_cpu / peak_cpu:.0f}%; the run's {work.total / 1e9:.1f} GFLOP: "
            f"linear {work.linear / 1e9:.1f}, output head {work.head / 1e9:.1f}, attention "
            f"{work.attention / 1e9:.1f}, in {wall_s:.2f} s")
