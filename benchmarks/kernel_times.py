"""Kernel benchmark: Triton store_kv and paged attention against torch, as a share of memory bandwidth.

    python benchmarks/kernel_times.py            # decode, batch 1..64 x context 1k..32k (a few minutes)
    python benchmarks/kernel_times.py --quick    # a tiny grid
    python benchmarks/kernel_times.py --peak-gbs 3350   # when the GPU is not in the table below

Decode attention is memory-bound, so each implementation is scored by the bytes a single pass must move
(K and V of every context token, the queries, the output and the block tables) divided by its time,
and that bandwidth as a share of the device's peak, the way FlashInfer and llm.c report kernels. The
peers run on the same pages: ``reference.paged_attention`` (torch: gather the pages, then SDPA) and
``torch.nn.functional.scaled_dot_product_attention`` on the same K/V already laid out contiguously
(no paging at all: the bar to meet). store_kv is scored on the K/V bytes it reads and writes, against
``reference.store_kv`` (``index_copy_``). Times come from ``triton.testing.do_bench`` (CUDA events,
L2 flushed between runs). Ratios (peer time / Triton time) come last; above 1 means Triton is faster.
Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

# Peak DRAM bandwidth in GB/s by device-name fragment, most specific first (vendor datasheets).
PEAK_GBS = [
    ("H200", 4800), ("H100 PCIe", 2000), ("H100 NVL", 3900), ("H100", 3350), ("H800", 3350), ("H20", 4000),
    ("B200", 8000), ("GH200", 4000), ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555),
    ("A800", 2039), ("L40S", 864), ("L40", 864), ("L4", 300), ("A10G", 600), ("A10", 600),
    ("RTX 4090", 1008), ("RTX 4080", 717), ("RTX 3090", 936), ("A6000", 768), ("V100", 900), ("T4", 320),
]  # fmt: skip


def peak_gbs(name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((gbs for fragment, gbs in PEAK_GBS if fragment.lower() in name.lower()), None)


def timer(device: torch.device):
    """``fn -> milliseconds``: do_bench on CUDA; one plain call elsewhere (the CPU dry run only)."""
    if device.type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100)

    def once(fn):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return once


def decode_case(batch: int, context: int, args, device: torch.device, dtype: torch.dtype):
    """Paged K/V for ``batch`` decodes of ``context`` tokens (pages in random order) and the same K/V
    contiguous ``[B, Hkv, L, D]`` for SDPA."""
    hkv, hq, d, bs = args.num_kv_heads, args.num_heads, args.head_dim, args.block_size
    pages = -(-context // bs)
    num_blocks = batch * pages
    key_cache = torch.randn(num_blocks, bs, hkv, d, device=device, dtype=dtype)
    value_cache = torch.randn_like(key_cache)
    block_tables = torch.randperm(num_blocks, device=device).view(batch, pages).to(torch.int32)
    query = torch.randn(batch, hq, d, device=device, dtype=dtype)
    qsl = torch.arange(batch + 1, device=device, dtype=torch.int32)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    flat = lambda cache: cache[block_tables.long()].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()  # noqa: E731
    k, v = flat(key_cache), flat(value_cache)  # [B, Hkv, L, D]
    paged = (query, key_cache, value_cache, block_tables, qsl, seq_lens, d**-0.5)
    hints = dict(num_decodes=batch, query_lens=[1] * batch, seq_lens_list=[context] * batch)
    elem = key_cache.element_size()
    nbytes = 2 * batch * context * hkv * d * elem + 2 * batch * hq * d * elem + block_tables.numel() * 4
    return paged, hints, (query.unsqueeze(2), k, v), nbytes


def bench_attention(args, device, dtype, kernels, reference, measure, peak) -> list[list[str]]:
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * torch.finfo(dtype).bits // 8
            if args.max_kv_gib is None or kv_bytes <= args.max_kv_gib * 2**30:
                rows.append(
                    attention_row(batch, context, args, device, dtype, kernels, reference, measure, peak)
                )
    return rows


def attention_row(batch, context, args, device, dtype, kernels, reference, measure, peak) -> list[str]:
    paged, hints, (q, k, v), nbytes = decode_case(batch, context, args, device, dtype)
    out = torch.empty_like(paged[0])
    fns = [
        lambda: kernels.paged_attention(*paged, **hints, out=out),
        lambda: reference.paged_attention(*paged, **hints, out=out),
        lambda: F.scaled_dot_product_attention(q, k, v, scale=paged[-1], enable_gqa=True),
    ]
    expected = fns[2]().squeeze(2).float()
    ok = torch.allclose(fns[0]().float(), expected, atol=2e-2, rtol=2e-2)
    ms = [measure(fn) for fn in fns]
    return [*row(f"{batch}", f"{context}", nbytes, ms, peak), "ok" if ok else "MISMATCH"]


def bench_store(args, device, dtype, kernels, reference, measure, peak) -> list[list[str]]:
    return [
        store_row(tokens, args, device, dtype, kernels, reference, measure, peak)
        for tokens in args.store_tokens
    ]


def store_row(tokens, args, device, dtype, kernels, reference, measure, peak) -> list[str]:
    hkv, d, bs = args.num_kv_heads, args.head_dim, args.block_size
    num_blocks = -(-tokens // bs) + 1
    key_cache = torch.zeros(num_blocks, bs, hkv, d, device=device, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    key = torch.randn(tokens, hkv, d, device=device, dtype=dtype)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * bs, device=device)[:tokens]  # int64
    nbytes = 4 * key.numel() * key.element_size() + slots.numel() * slots.element_size()
    fns = [
        lambda: kernels.store_kv(key, value, key_cache, value_cache, slots),
        lambda: reference.store_kv(key, value, key_cache, value_cache, slots),
    ]
    return row(f"{tokens}", "", nbytes, [measure(fn) for fn in fns], peak)


def row(a: str, b: str, nbytes: int, ms: list[float], peak: float | None) -> list[str]:
    gbs = nbytes / (ms[0] * 1e-3) / 1e9
    cells = [a, b, f"{ms[0] * 1e3:.1f}", f"{gbs:.0f}", f"{100 * gbs / peak:.0f}%" if peak else "n/a"]
    cells += [f"{m * 1e3:.1f}" for m in ms[1:]]
    return cells + [f"{m / ms[0]:.2f}x" for m in ms[1:]]


def show(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for cells in [header, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny grid (seconds)")
    parser.add_argument("--peak-gbs", type=float, default=None, help="peak memory bandwidth, GB/s")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="bfloat16")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--max-kv-gib", type=float, default=None, help="skip cases with more K/V (default: free/4)"
    )
    parser.add_argument("--cpu-dry-run", action="store_true", help=argparse.SUPPRESS)  # tests: interpreter
    args = parser.parse_args(argv)
    args.batches, args.contexts, args.store_tokens = (
        [1, 4, 16, 64],
        [1024, 4096, 16384, 32768],
        [64, 1024, 16384],
    )
    if args.quick:
        args.batches, args.contexts, args.store_tokens = [1, 8], [1024, 4096], [64, 4096]
    if args.cpu_dry_run:  # exercise every code path through Triton's interpreter on tiny shapes
        device, name = torch.device("cpu"), "cpu (dry run: timings meaningless)"
        args.batches, args.contexts, args.store_tokens = [2], [40], [8]
        args.num_heads, args.num_kv_heads, args.head_dim = 4, 2, 64
    elif not torch.cuda.is_available():
        print("kernels benchmark: no CUDA GPU found; nothing to measure (run it on a machine with one).")
        return 0
    else:
        device, name = torch.device("cuda"), torch.cuda.get_device_name()
        if args.max_kv_gib is None:  # paged K/V, its contiguous copy for SDPA and the reference's gather
            args.max_kv_gib = torch.cuda.mem_get_info()[0] / 4 / 2**30
    from kvscope.kernels import paged_attention as triton_attention
    from kvscope.kernels import reference
    from kvscope.kernels import store_kv as triton_store

    kernels = SimpleNamespace(
        paged_attention=triton_attention.paged_attention, store_kv=triton_store.store_kv
    )

    dtype = getattr(torch, args.dtype)
    peak = peak_gbs(name, args.peak_gbs)
    print(f"device: {name}; peak {f'{peak:.0f} GB/s' if peak else 'unknown (pass --peak-gbs)'}; {args.dtype}, "
          f"{args.num_heads} query / {args.num_kv_heads} KV heads, head size {args.head_dim}, block size "
          f"{args.block_size}")  # fmt: skip
    measure = timer(device)
    rows = bench_attention(args, device, dtype, kernels, reference, measure, peak)
    show("decode attention (times in us; bandwidth of the Triton kernel; ratio = peer time / Triton time)",
         ["batch", "context", "triton", "GB/s", "of peak", "torch-ref", "sdpa-contig", "vs torch-ref",
          "vs sdpa", "check"], rows)  # fmt: skip
    rows = bench_store(args, device, dtype, kernels, reference, measure, peak)
    show("store_kv (times in us; ratio = reference time / Triton time)",
         ["tokens", "", "triton", "GB/s", "of peak", "torch-ref", "vs torch-ref"], rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
