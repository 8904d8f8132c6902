"""What each change to kvscope's CPU attention path bought: the steps of the speed work, A/B in one process.

    python benchmarks/speedups.py            # default workload of throughput.py, 3 interleaved rounds
    python benchmarks/speedups.py --quick    # tiny model (the smoke test runs this)

Variants, each a fresh engine per run over the same model and workload, rounds interleaved:

- ``before``: the torch path as it was before the speed work (commit fbbbf9d, copied below): decodes
  gathered to the batch's longest context (``cache[block_tables]``), masks built in every layer,
  prefill chunks through SDPA;
- ``buckets``: decodes sorted by length and cut into buckets, whole pages gathered with
  ``index_select``; the plan still built in every layer (the public ``reference.paged_attention``);
- ``plan once``: the same plan built once per step in ``ModelRunner.prepare``, reused by every layer,
  fresh prefills attending over the new K/V without reading pages; prefills still through SDPA;
- ``+ bmm prefill``: prefill chunks as ``baddbmm`` + ``softmax`` + ``bmm`` (today's engine).

Greedy tokens must be identical across variants. Ratios (variant / ``before``) come last.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch
import torch.nn.functional as F
from harness import add_omp_wait_option, build_model, machine_line, make_workload, median, set_omp_wait, table
from systems import workload_blocks

from kvscope import Engine
from kvscope.kernels import reference, torch_paged
from kvscope.kernels.backend import KernelBackend
from kvscope.runs.workload.items import parse_range


def _before_gather(cache, block_table, length):
    pages = cache[block_table]  # [..., nb, bs, Hkv, D]
    return pages.flatten(-4, -3)[..., :length, :, :].transpose(-3, -2)  # [..., Hkv, L, D]


def before_paged_attention(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, *,
                           num_decodes=None, query_lens=None, seq_lens_list=None, out=None, **features):
    """The torch path before the speed work, verbatim in substance (commit fbbbf9d): full causal attention
    only (the benchmark's Llama), so a window, chunk, softcap or sinks is refused."""
    used = {k: v for k, v in features.items() if v is not None}
    if used:
        raise ValueError(f"the 'before' attention implements full causal attention only, not {sorted(used)}")
    out = torch.empty_like(query) if out is None else out
    bs, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    num_heads, head_dim = query.shape[1], query.shape[2]
    if num_decodes:
        lens = seq_lens_list[:num_decodes]
        longest = max(lens)
        table_ = block_tables[:num_decodes, : -(-longest // bs)]
        k, v = _before_gather(key_cache, table_, longest), _before_gather(value_cache, table_, longest)
        q = query[:num_decodes].view(num_decodes, num_kv_heads, num_heads // num_kv_heads, head_dim)
        mask = (torch.arange(longest)[None, :] < seq_lens[:num_decodes, None])[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[:num_decodes] = o.reshape(num_decodes, num_heads, head_dim)
    start = num_decodes
    for b in range(num_decodes, len(query_lens)):
        n, seq_len = query_lens[b], seq_lens_list[b]
        if n > 0:
            k = _before_gather(key_cache, block_tables[b, : -(-seq_len // bs)], seq_len)
            v = _before_gather(value_cache, block_tables[b, : -(-seq_len // bs)], seq_len)
            q = query[start : start + n].transpose(0, 1)
            gqa = num_heads != num_kv_heads
            if n == seq_len:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
            else:
                mask = torch.arange(seq_len)[None, :] <= torch.arange(n)[:, None] + (seq_len - n)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            out[start : start + n] = o.transpose(0, 1)
        start += n
    return out


@contextlib.contextmanager
def no_bmm_prefill():
    saved = torch_paged.MAX_SCORES
    torch_paged.MAX_SCORES = 0  # every prefill chunk takes the SDPA branch
    try:
        yield
    finally:
        torch_paged.MAX_SCORES = saved


VARIANTS = {  # name: (backend or None for the engine's own, context manager around the run)
    "before": (KernelBackend("torch-before", reference.store_kv, before_paged_attention), contextlib.nullcontext),
    "buckets": (KernelBackend("torch-per-layer", reference.store_kv, reference.paged_attention), no_bmm_prefill),
    "plan once": (None, no_bmm_prefill),
    "+ bmm prefill": (None, contextlib.nullcontext),
}


def run(model, items, variant: str, kwargs: dict) -> tuple[float, float, list[list[int]]]:
    backend, context = VARIANTS[variant]
    engine = Engine(model, **kwargs)
    if backend is not None:  # a backend not named "torch" gets no per-step plan from the runner
        engine.runner.backend = backend
    with context(), torch.inference_mode():
        t0, c0 = time.perf_counter(), time.process_time()
        outs = engine.generate([i.prompt for i in items], [i.params for i in items])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = sum(len(o.token_ids) for o in outs)
    return n / wall, n / cpu, [o.token_ids for o in outs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-60m")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", default="16-256")
    p.add_argument("--output-len", default="8-128")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny model, 8 requests, 2 rounds")
    add_omp_wait_option(p)
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.requests, args.prompt_len, args.output_len, args.rounds = "llama-quick", 8, "8-48", "4-16", 2
    set_omp_wait(args.omp_wait)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, desc = build_model(args.model, args.seed)
    items = make_workload(model, args.requests, parse_range(args.prompt_len), parse_range(args.output_len), args.seed)
    kwargs = dict(num_blocks=workload_blocks(items, 16) + 1, max_model_len=max(len(i.prompt) + i.params.max_tokens
                  for i in items) + 1, max_num_batched_tokens=1024)
    print(f"model: {desc}\nworkload: {len(items)} requests, prompts {args.prompt_len}, outputs {args.output_len}")
    print(f"machine: {machine_line()}")
    run(model, items[:2], "before", kwargs)  # warm-up
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    tokens: dict[str, list[list[int]]] = {}
    names = list(VARIANTS)
    for r in range(args.rounds):
        for k in range(len(names)):
            name = names[(k + r) % len(names)]
            tok_s, tok_cpu_s, tokens[name] = run(model, items, name, kwargs)
            results[name].append((tok_s, tok_cpu_s))
            print(f"  round {r + 1} {name:<14} {tok_s:7.1f} tok/s {tok_cpu_s:7.1f} tok/CPU-s", flush=True)
    same = all(t == tokens["before"] for t in tokens.values())
    print(f"\ngreedy tokens identical across variants: {same}")
    base = results["before"]
    rows = []
    for name, runs in results.items():
        wall = [a[0] / b[0] for a, b in zip(runs, base)]
        cpu = [a[1] / b[1] for a, b in zip(runs, base)]
        rows.append([name, f"{median([x[0] for x in runs]):.1f}", f"{median([x[1] for x in runs]):.1f}",
                     f"{median(wall):.2f}", f"{median(cpu):.2f}"])
    print(table(["variant", "tok/s", "tok/CPU-s", "vs before (wall)", "vs before (CPU)"], rows))
    print("\nratios (variant / before, median of per-round ratios):")
    for row in rows[1:]:
        print(f"RATIO {row[0]} / before: wall {row[3]}x, cpu {row[4]}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
