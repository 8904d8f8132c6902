"""The per-layer half of the CPU fast path: ``run_plan`` runs a step's ``AttentionPlan`` (``torch_paged.py``)
over one layer's caches.

- **Decode buckets**: ``index_select`` of whole page rows (not per-token slots), then one
  ``scaled_dot_product_attention`` per bucket with the query heads of a KV head folded into the query axis
  (GQA without repeating K/V).
- **Prefill chunks**: ``baddbmm`` + ``softmax`` + ``bmm`` with the query heads of a KV head folded into rows
  (2-3x faster than CPU SDPA at these sizes); a chunk that is the whole context (no cached prefix) attends
  over the new K/V as given, without reading pages. A chunk planned without a mask takes SDPA.
- **Exact scores**: logit softcapping (Gemma 2: ``cap * tanh(s / cap)`` before the softmax) and attention
  sinks (gpt-oss: one extra logit per head, or per token and head, in the softmax's denominator) change the
  scores themselves, which SDPA cannot do; those layers compute scores, softmax and ``P @ V`` explicitly in
  float32, decodes and prefills alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # torch_paged.py imports this module
    from .torch_paged import AttentionPlan


def _pages(flat_cache: torch.Tensor, blocks: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Whole pages ``blocks`` of ``flat_cache`` ([num_blocks, block_size * Hkv * D]) as ``shape``."""
    return flat_cache.index_select(0, blocks).view(shape)


def _exact_attention(q, k, v, scale, mask, softcap, sinks) -> torch.Tensor:
    """softmax(softcap(q k^T * scale) + mask, with a sink logit per row) @ v, in float32.
    q [..., M, D], k [..., S, D], v [..., S, Dv], mask broadcastable to [..., M, S], sinks [..., M, 1]."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s + mask
    if sinks is None:
        return torch.matmul(torch.softmax(s, dim=-1), v.float())
    top = torch.maximum(s.amax(dim=-1, keepdim=True), sinks)
    p = torch.exp(s - top)
    denom = p.sum(dim=-1, keepdim=True) + torch.exp(sinks - top)
    return torch.matmul(p, v.float()) / denom


def run_plan(
    plan: AttentionPlan,
    query: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, Dv]
    scale: float,
    out: torch.Tensor,  # [T, Hq, Dv]
    new_key: torch.Tensor | None = None,  # [T, Hkv, D]: this step's K, for chunks with no cached prefix
    new_value: torch.Tensor | None = None,
    *,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [T, Hq] float32 sink logits (an [Hq] vector expanded is fine)
) -> torch.Tensor:
    if (softcap or sinks is not None) and not plan.exact:
        raise ValueError("softcap and sinks need a plan built with exact=True")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    head_dim_v = value_cache.shape[3]
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    flat_k = key_cache.view(num_blocks, -1)  # [num_blocks, block_size * Hkv * D]
    flat_v = value_cache.view(num_blocks, -1)
    dtype = query.dtype  # the caches may be stored in another dtype: convert what is gathered

    for b in plan.decodes:
        n, kv_len = b.num_seqs, b.kv_len
        k = _pages(flat_k, b.blocks, (n, b.num_pages * block_size, num_kv_heads, head_dim))
        v = _pages(flat_v, b.blocks, (n, b.num_pages * block_size, num_kv_heads, head_dim_v))
        k = k[:, :kv_len].transpose(1, 2).to(dtype)  # [n, Hkv, S, D]
        v = v[:, :kv_len].transpose(1, 2).to(dtype)
        rows = b.rows
        q = query[rows] if isinstance(rows, slice) else query.index_select(0, rows)
        q = q.reshape(n, num_kv_heads, group, head_dim)  # [n, Hkv, G, D]
        if plan.exact:
            sink = None
            if sinks is not None:
                sink = (sinks[rows] if isinstance(rows, slice) else sinks.index_select(0, rows))
                sink = sink.reshape(n, num_kv_heads, group, 1).float()
            o = _exact_attention(q, k, v, scale, b.mask, softcap, sink).to(dtype)  # [n, Hkv, G, Dv]
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=b.mask, scale=scale)  # [n, Hkv, G, Dv]
        if isinstance(rows, slice):
            out[rows] = o.reshape(n, num_heads, head_dim_v)
        else:
            out.index_copy_(0, rows, o.reshape(n, num_heads, head_dim_v))

    for c in plan.prefills:
        n, span = c.end - c.start, c.seq_len - c.key_start
        if c.fresh and new_key is not None and new_value is not None:
            k = new_key[c.start + c.key_start : c.end].transpose(0, 1).to(dtype)  # [Hkv, S, D]
            v = new_value[c.start + c.key_start : c.end].transpose(0, 1).to(dtype)
        else:
            k = _pages(flat_k, c.blocks, (-1, num_kv_heads, head_dim))[:span].transpose(0, 1).to(dtype)
            v = _pages(flat_v, c.blocks, (-1, num_kv_heads, head_dim_v))[:span].transpose(0, 1).to(dtype)
        q = query[c.start : c.end].transpose(0, 1)  # [Hq, n, D]
        if c.mask is None:  # too large to materialise the scores: SDPA blocks over them
            causal = c.bool_mask is None
            o = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal, attn_mask=c.bool_mask,
                                               enable_gqa=group > 1)  # fmt: skip
            out[c.start : c.end] = o.transpose(0, 1)
            continue
        folded = q.reshape(num_kv_heads, group * n, head_dim)  # [Hkv, G * n, D]
        if plan.exact:
            sink = None
            if sinks is not None:  # rows of a KV head are (query head g, token i)
                sink = sinks[c.start : c.end].t().reshape(num_kv_heads, group * n, 1).float()
            o = _exact_attention(folded, k, v, scale, c.mask, softcap, sink).to(dtype)  # [Hkv, G * n, Dv]
        else:
            scores = torch.baddbmm(c.mask, folded, k.transpose(1, 2), alpha=scale)  # [Hkv, G * n, S]
            torch.softmax(scores, dim=-1, out=scores)
            o = torch.bmm(scores, v)  # [Hkv, G * n, Dv]
        out[c.start : c.end] = o.view(num_heads, n, head_dim_v).transpose(0, 1)
    return out
