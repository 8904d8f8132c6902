"""Where a profiled step's time went: each op (or kernel) of a torch.profiler capture sorted into a
category, and summed per engine step.

Categories: ops under ``kvscope.sample`` are *sampling*, under ``kvscope.store_kv`` *store_kv*, under
``kvscope.paged_attention`` (or named like attention) *attention*, matrix products *matmul*, everything
else *other*. On the CPU the time is the ops' self CPU time; on CUDA it is the device time of the kernels
each op launched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvscope.telemetry.records import PROFILE_CATEGORIES

if TYPE_CHECKING:
    from torch.profiler import profile

MATMUL_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::mv",
        "aten::addmv",
        "aten::_addmm_activation",
        "aten::linear",
        "aten::dot",
        "mkldnn::_linear_pointwise",  # the oneDNN GEMMs of kvscope/engine/worker/fusion.py
    }
)
ATTENTION_WORDS = ("attention", "flash", "sdpa", "fmha")
MATMUL_WORDS = ("gemm", "gemv", "matmul", "cublas", "cutlass", "xmma", "sm80_", "sm90_")
RANGE_CATEGORY = {
    "kvscope.sample": "sampling",
    "kvscope.store_kv": "store_kv",
    "kvscope.paged_attention": "attention",
}


def categorize(name: str, ranges: tuple[str, ...]) -> str:
    """Category of an op (or kernel) ``name`` nested in the ``kvscope.*`` ``ranges`` (outermost first)."""
    for r in reversed(ranges):
        if r in RANGE_CATEGORY:
            return RANGE_CATEGORY[r]
    low = name.lower()
    if "store_kv" in low or name == "aten::index_copy_":
        return "store_kv"
    if any(w in low for w in ATTENTION_WORDS):
        return "attention"
    if name in MATMUL_OPS or any(w in low for w in MATMUL_WORDS):
        return "matmul"
    return "other"


def time_by_category(prof: profile, steps: list[int], cuda: bool) -> dict[int, dict[str, int]]:
    """Kernel time (ns) by category per step of ``steps`` (the active ones, in order), plus ``total``;
    ``ProfilerStep*`` ranges in time order are the steps."""
    sums: dict[int, dict[str, float]] = {}
    roots = sorted(
        (e for e in prof.events() if e.name.startswith("ProfilerStep")), key=lambda e: e.time_range.start
    )
    for root, step in zip(roots, steps):
        acc = sums[step] = dict.fromkeys(PROFILE_CATEGORIES, 0.0)
        stack = [(child, ()) for child in root.cpu_children]
        while stack:
            ev, ranges = stack.pop()
            if ev.is_user_annotation:
                ranges = (*ranges, ev.name)
            elif cuda:  # device time of the kernels this op launched
                by_op = categorize(ev.name, ranges)
                for k in ev.kernels:
                    acc[by_op if by_op != "other" else categorize(k.name, ranges)] += k.duration
            else:
                acc[categorize(ev.name, ranges)] += ev.self_cpu_time_total
            stack.extend((child, ranges) for child in ev.cpu_children)
    out = {}
    for step, acc in sums.items():
        ns = {k: round(v * 1000) for k, v in acc.items()}  # torch reports microseconds
        ns["total"] = sum(ns.values())
        out[step] = ns
    return out
