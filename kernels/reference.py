"""Plain torch kernels for the paged KV cache: the CPU path and the oracle for every kernel test.

Layout shared by every backend:

- ``key_cache`` / ``value_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
  A *slot* is ``block_id * block_size + offset``.
- a flat batch of ``T`` new tokens from ``B`` sequences: ``query`` ``[T, num_heads, head_dim]``,
  ``query_start_loc`` ``[B + 1]`` (sequence ``b`` owns tokens ``query_start_loc[b]:query_start_loc[b+1]``),
  ``seq_lens`` ``[B]`` (context length of each sequence *including* its new tokens),
  ``block_tables`` ``[B, max_blocks]`` (pages of each sequence, in order; unused entries must still be valid
  block ids, e.g. 0: the torch path gathers them before masking; the Triton kernel never reads them).
- The new tokens of a sequence are its last ``q_len`` positions, so query ``i`` of sequence ``b`` sits at
  position ``p = seq_lens[b] - q_len + i`` and attends causally to positions ``0..p``. A decode is a
  sequence with ``q_len == 1``; a prefill chunk over a cached prefix is ``q_len > 1`` with
  ``seq_lens[b] > q_len``. Grouped-query attention: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
  The value cache may have another head size than the key cache (``[..., head_dim_v]``, e.g. DeepSeek's
  MLA); the output has the value's.
- Per layer, optionally: ``window`` (sliding window: ``p`` sees ``p - window + 1..p``, transformers'
  ``sliding_window``), ``chunk`` (chunked local attention: ``p`` sees ``p - p % chunk..p``), ``softcap``
  (scores become ``softcap * tanh(scores / softcap)`` before the softmax) and ``sinks`` (``[num_heads]`` or
  ``[T, num_heads]`` logits that join each softmax's denominator and attend to nothing, gpt-oss' ``s_aux``).

``paged_attention`` is the fast CPU path (``torch_paged.py``): decodes sorted by length and batched in
buckets, each one ``scaled_dot_product_attention`` over gathered pages; prefill chunks one sequence at
a time. The engine builds that path's per-step plan once and reuses it in every layer; this function
builds it per call. ``paged_attention_naive`` is a per-sequence loop in float32 that spells out the
math; tests use it as the oracle.
"""

from __future__ import annotations

import torch

from .torch_paged import build_plan
from .torch_run import run_plan


def store_kv(
    key: torch.Tensor,  # [T, num_kv_heads, head_dim]
    value: torch.Tensor,  # [T, num_kv_heads, head_dim_v]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim_v]
    slot_mapping: torch.Tensor,  # [T] int, < 0 means "do not store"
) -> None:
    """Write each token's K and V into its slot. Tokens with a negative slot are skipped."""
    num_kv_heads = key_cache.shape[2]
    flat_k = key_cache.view(-1, num_kv_heads, key_cache.shape[3])  # [num_slots, Hkv, D]
    flat_v = value_cache.view(-1, num_kv_heads, value_cache.shape[3])  # [num_slots, Hkv, Dv]
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    slot_mapping = slot_mapping.long()  # index_copy_ wants int64; int32 mappings are fine too
    flat_k.index_copy_(0, slot_mapping, key.to(flat_k.dtype))
    flat_v.index_copy_(0, slot_mapping, value.to(flat_v.dtype))


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
    """Attention of a flat batch of prefill chunks and decodes over paged K/V (see module doc).

    The optional host-side arguments (``num_decodes``: how many leading sequences are single-token
    decodes, ``query_lens``/``seq_lens_list``: the same lengths as Python ints) save device syncs when
    the caller already knows them; they are derived from the tensors otherwise.
    """
    if out is None:
        out = query.new_empty(*query.shape[:2], value_cache.shape[3])
    if query.shape[0] == 0:
        return out
    if query_lens is None:
        query_lens = (query_start_loc[1:] - query_start_loc[:-1]).tolist()
    if seq_lens_list is None:
        seq_lens_list = seq_lens.tolist()
    if num_decodes is None:
        num_decodes = 0
        while num_decodes < len(query_lens) and query_lens[num_decodes] == 1:
            num_decodes += 1
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    exact = bool(softcap) or sinks is not None
    plan = build_plan(block_tables, query_lens, seq_lens_list, num_decodes, block_size,
                      query.shape[1] // num_kv_heads, query.dtype, num_kv_heads * head_dim,
                      window=window, chunk=chunk, exact=exact)  # fmt: skip
    sinks = None if sinks is None else expand_sinks(sinks, query.shape[0], query.shape[1])
    return run_plan(plan, query, key_cache, value_cache, scale, out, softcap=softcap, sinks=sinks)


def expand_sinks(sinks: torch.Tensor, num_tokens: int, num_heads: int) -> torch.Tensor:
    """``[num_heads]`` or ``[num_tokens, num_heads]`` sink logits as a float32 ``[num_tokens, num_heads]`` view
    (``ValueError`` for any other shape)."""
    sinks = sinks.float()
    if sinks.dim() == 1 and sinks.shape[0] == num_heads:
        return sinks[None, :].expand(num_tokens, num_heads)
    if tuple(sinks.shape) != (num_tokens, num_heads):
        raise ValueError(
            f"sinks has shape {tuple(sinks.shape)}; it must be [{num_heads}] or [{num_tokens}, {num_heads}]"
        )
    return sinks


def paged_attention_naive(
    query: torch.Tensor,  # [T, num_heads, head_dim]
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The oracle: one sequence at a time, every step written out, math in float32."""
    num_tokens, num_heads = query.shape[:2]
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(num_tokens, num_heads, value_cache.shape[3], dtype=torch.float32, device=query.device)
    sinks = None if sinks is None else expand_sinks(sinks, num_tokens, num_heads)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[b], starts[b + 1]
        n = q_end - q_start
        if n == 0:
            continue
        slots = [
            int(block_tables[b, pos // block_size]) * block_size + pos % block_size for pos in range(seq_len)
        ]
        k = key_cache.view(-1, num_kv_heads, key_cache.shape[3])[slots].float()  # [L, Hkv, D]
        v = value_cache.view(-1, num_kv_heads, value_cache.shape[3])[slots].float()  # [L, Hkv, Dv]
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        q = query[q_start:q_end].float()  # [n, Hq, D]
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale  # [Hq, n, L]
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - n, seq_len, device=query.device)[:, None]
        k_pos = torch.arange(seq_len, device=query.device)[None, :]
        hidden = k_pos > q_pos
        if window:
            hidden |= k_pos <= q_pos - window
        if chunk:
            hidden |= k_pos < q_pos - q_pos % chunk
        scores = scores.masked_fill(hidden, float("-inf"))
        if sinks is not None:  # one more logit per (head, query) that attends to nothing
            scores = torch.cat([scores, sinks[q_start:q_end].t()[:, :, None]], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :seq_len]
        out[q_start:q_end] = torch.einsum("hnl,lhd->nhd", probs, v)
    return out.to(query.dtype)
