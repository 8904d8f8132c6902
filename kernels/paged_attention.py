"""Triton paged attention (``attention_kernel.py``) behind the signature of ``reference.paged_attention``.

The launcher checks the inputs (``checks.py``; ``ValueError`` saying what is wrong), picks the tiles
(``BLOCK_M`` rows of (token, query head) pairs, ``TILE_N`` key positions; decode-sized rows when every query
is a decode) and the split-KV count: it splits only on CUDA, when ``(T // BLOCK_Q + B) * Hkv`` programs would
not fill the SMs and the longest context (``seq_lens_list``, else the block table's capacity) is >= 1024.
With splits, ``merge_splits_kernel`` combines the segments. Under Triton's interpreter, bf16 tiles are upcast
to fp32 before the dots (``DOT_FP32``).
"""

from __future__ import annotations

import math

import torch
import triton

from .attention_kernel import merge_splits_kernel, paged_attention_kernel
from .checks import check_caches, check_device, check_float, check_int, fail
from .reference import expand_sinks

_LOG2E = 1.4426950408889634


def _check_inputs(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out):
    _, block_size, num_kv_heads, head_dim = check_caches(key_cache, value_cache)
    head_dim_v = value_cache.shape[3]
    check_float("query", query, 3, f"[num_tokens, num_heads, head_dim={head_dim}]")
    num_heads = query.shape[1]
    if query.shape[2] != head_dim:
        fail(f"query has head_dim {query.shape[2]} but the caches have {head_dim}; they must match")
    if num_heads % num_kv_heads:
        fail(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads} (grouped-query attention)"
        )
    if not 0 < head_dim <= 256 or not 0 < head_dim_v <= 256:
        fail(f"head_dim={head_dim} (values: {head_dim_v}) is not supported: the kernel takes head sizes 1..256")
    if block_size & (block_size - 1):
        fail(f"block_size={block_size} must be a power of two (8, 16, 32, 64, 128, ...)")
    check_int("block_tables", block_tables, 2, "[num_seqs, max_blocks]")
    check_int("query_start_loc", query_start_loc, 1, "[num_seqs + 1]")
    check_int("seq_lens", seq_lens, 1, "[num_seqs]")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        fail(
            f"seq_lens has {num_seqs} sequences, so query_start_loc needs {num_seqs + 1} entries (has "
            f"{query_start_loc.shape[0]}) and block_tables {num_seqs} rows (has {block_tables.shape[0]})"
        )
    if block_tables.stride(1) != 1 or query_start_loc.stride(0) != 1 or seq_lens.stride(0) != 1:
        fail("block_tables (last dim), query_start_loc and seq_lens must be contiguous: call .contiguous()")
    if out is not None:
        want = (*query.shape[:2], head_dim_v)
        check_float("out", out, 3, "[num_tokens, num_heads, head_dim_v]")
        if tuple(out.shape) != want or out.dtype != query.dtype:
            fail(f"out is {tuple(out.shape)} {out.dtype}; it must match query (tokens, heads, dtype) with "
                  f"the value cache's head size: {want} {query.dtype}")  # fmt: skip
    extra = {} if out is None else {"out": out}
    return check_device(
        paged_attention_kernel, query=query, key_cache=key_cache, value_cache=value_cache,
        block_tables=block_tables, query_start_loc=query_start_loc, seq_lens=seq_lens, **extra,
    )  # fmt: skip


def paged_attention(
    query: torch.Tensor,  # [T, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int
    query_start_loc: torch.Tensor,  # [B + 1] int
    seq_lens: torch.Tensor,  # [B] int
    scale: float,
    *,
    num_decodes: int | None = None,
    query_lens: list[int] | None = None,
    seq_lens_list: list[int] | None = None,
    out: torch.Tensor | None = None,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton paged attention with the signature of ``reference.paged_attention``; returns ``out``.

    The host-side hints never change the result: ``query_lens`` (max query length) picks a decode-sized
    ``BLOCK_M``, ``seq_lens_list`` (max context) feeds the split-KV choice; ``num_decodes`` is unused.
    """
    return _launch(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
                   query_lens=query_lens, seq_lens_list=seq_lens_list, out=out, window=window, chunk=chunk,
                   softcap=softcap, sinks=sinks)  # fmt: skip


def _tile_config(elem_bytes: int, d_pad: int, group: int, decode_only: bool) -> tuple[int, int]:
    """(BLOCK_M, TILE_N) at num_warps=4. Checked with ptxas for sm_80/89/90: no register spills, and shared
    memory within the 99 KiB of sm_86/89. fp32 (IEEE dots) and head size 256 get smaller tiles."""
    wide = elem_bytes >= 4 or d_pad > 128
    tile_n = 16 if elem_bytes >= 4 and d_pad > 128 else (32 if wide else 64)
    block_m = 16 if decode_only else (32 if wide else 64)
    return max(block_m, triton.next_power_of_2(group)), tile_n


def _check_features(window, chunk, softcap, sinks, query) -> torch.Tensor | None:
    """Validate the per-layer options; returns the sinks as a float32 ``[T, Hq]`` view (or None)."""
    for name, value in (("window", window), ("chunk", chunk)):
        if value is not None and (not isinstance(value, int) or value < 1):
            fail(f"{name}={value!r} must be a positive number of tokens, or None")
    if softcap is not None and (not math.isfinite(softcap) or softcap <= 0):
        fail(f"softcap={softcap} must be a positive finite float, or None")
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or sinks.device != query.device:
        fail(f"sinks must be a tensor on {query.device} ([num_heads] or [num_tokens, num_heads])")
    return expand_sinks(sinks, *query.shape[:2])


def _launch(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, *,
            query_lens=None, seq_lens_list=None, out=None, num_splits=None, window=None, chunk=None,
            softcap=None, sinks=None):  # fmt: skip
    """``paged_attention`` with the split count exposed (``None``: the heuristic; tests force 1, 2, 4, ...)."""
    device = _check_inputs(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out)
    if not math.isfinite(scale) or scale <= 0:
        fail(f"scale={scale} must be a positive finite float (usually head_dim ** -0.5)")
    sinks = _check_features(window, chunk, softcap, sinks, query)
    num_tokens, num_heads, head_dim = query.shape
    head_dim_v = value_cache.shape[3]
    out = query.new_empty(num_tokens, num_heads, head_dim_v) if out is None else out
    num_seqs, block_size, num_kv_heads = seq_lens.shape[0], key_cache.shape[1], key_cache.shape[2]
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    d_pad = max(16, triton.next_power_of_2(head_dim))
    dv_pad = max(16, triton.next_power_of_2(head_dim_v))
    decode_only = max(query_lens) <= 1 if query_lens else num_tokens == num_seqs
    block_m, tile_n = _tile_config(query.element_size(), max(d_pad, dv_pad), group, decode_only)
    block_q = block_m // group
    num_q_blocks = num_tokens // block_q + num_seqs
    if num_splits is None:
        num_splits = 1
        if device.type == "cuda":
            max_len = max(seq_lens_list) if seq_lens_list else block_tables.shape[1] * block_size
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            if num_q_blocks * num_kv_heads < sms and max_len >= 1024:
                want = triton.cdiv(2 * sms, num_q_blocks * num_kv_heads)
                num_splits = min(triton.next_power_of_2(want), 64, triton.next_power_of_2(max_len // 256))
    if num_splits < 1 or num_splits & (num_splits - 1):
        fail(f"num_splits={num_splits} must be a power of two")
    interpreted = not isinstance(paged_attention_kernel, triton.runtime.JITFunction)
    if num_splits > 1:
        part_acc = torch.empty(num_tokens, num_heads, num_splits, dv_pad, device=device, dtype=torch.float32)
        part_ml = torch.empty(num_tokens, num_heads, num_splits, 2, device=device, dtype=torch.float32)
    else:
        part_acc = part_ml = out  # never touched
    sink_arg = sinks if sinks is not None else out  # never read without HAS_SINKS
    sink_strides = sinks.stride() if sinks is not None else (0, 0)
    paged_attention_kernel[(num_q_blocks, num_kv_heads, num_splits)](
        out, part_acc, part_ml, query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, sink_arg,
        scale * _LOG2E, scale, float(softcap or 1.0), int(window or 0), int(chunk or 0), num_seqs, num_heads,
        *sink_strides, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *key_cache.stride()[:3], *value_cache.stride()[:3], block_tables.stride(0),
        HEAD_DIM=head_dim, D_PAD=d_pad, HEAD_DIM_V=head_dim_v, DV_PAD=dv_pad, HAS_WINDOW=bool(window),
        HAS_CHUNK=bool(chunk), USE_SOFTCAP=bool(softcap), HAS_SINKS=sinks is not None,
        GROUP=group, BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_M=block_m,
        TILE_N=tile_n, NUM_SPLITS=num_splits, DOT_FP32=interpreted and query.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    if num_splits > 1:
        merge_splits_kernel[(num_tokens, num_heads)](
            out, part_acc, part_ml, sink_arg, num_heads, out.stride(0), out.stride(1), *sink_strides,
            HEAD_DIM=head_dim_v, D_PAD=dv_pad, NUM_SPLITS=num_splits, HAS_SINKS=sinks is not None,
        )  # fmt: skip
    return out
