"""The CPU fast path of paged attention: a per-step plan, built once and reused by every layer.

Everything that depends only on the batch's shape (which pages each sequence reads, how long it is,
the masks) is the same in every layer of a step that has the same kind of attention, so ``build_plan``
works it out once per kind (the runner calls it in ``prepare``; ``reference.paged_attention`` calls it
per call) and ``run_plan`` does only the per-layer work: gather pages, attend, write the output.

What a query at position ``p`` sees is ``[lo(p), p]``: ``lo = 0`` for full causal attention,
``p - window + 1`` for a sliding window of ``window`` keys (the query included; transformers'
``sliding_window``), ``p - p % chunk`` for chunked local attention (Llama 4). Only the pages from
``lo``'s page on are gathered, so a window also bounds the work, not only the result.

- **Decodes** (one query token) are sorted by the span of keys they read and cut into buckets; each
  bucket gathers whole pages of its sequences (``index_select`` of page rows, not per-token slots)
  up to the bucket's longest span and runs one ``scaled_dot_product_attention`` with the query heads
  of a KV head folded into the query axis (GQA without repeating K/V). Buckets bound the padding: the
  cut minimises (padded token rows + ``BUCKET_COST`` per bucket) by dynamic programming.
- **Prefill chunks** run one sequence at a time as ``baddbmm`` + ``softmax`` + ``bmm`` with the
  query heads of a KV head folded into rows (2-3x faster than CPU SDPA at these sizes); a chunk that
  is the whole context (no cached prefix) attends over the new K/V as given, without reading pages.
  Chunks whose score matrix would exceed ``MAX_SCORES`` elements, and 16-bit inputs (whose scores
  would be rounded), use SDPA instead.
- **Exact scores** (``exact=True`` plans): logit softcapping (Gemma 2: ``cap * tanh(s / cap)`` before
  the softmax) and attention sinks (gpt-oss: one extra logit per head, or per token and head, in the
  softmax's denominator) change the scores themselves, which SDPA cannot do; those layers compute
  scores, softmax and ``P @ V`` explicitly in float32, decodes and prefills alike.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BUCKET_COST = 48  # padded token rows one more decode bucket is worth (its per-layer call overhead)
MAX_SCORES = 1 << 22  # largest [Hkv, G * n, L] score matrix materialised by the prefill path


@dataclass(slots=True)
class DecodeBucket:
    rows: slice | torch.Tensor  # query rows (one per sequence): a slice when they are consecutive
    blocks: torch.Tensor  # [n * num_pages] int64 page ids, row-major over the bucket's sequences
    num_seqs: int
    kv_len: int  # S: the longest span of key rows in the bucket (from each sequence's first page read)
    num_pages: int  # ceil(S / block_size)
    mask: torch.Tensor | None  # [n, 1, 1, S] additive (0 / -inf); None when every row sees all S keys


@dataclass(slots=True)
class PrefillChunk:
    start: int  # token rows start:end of the flat batch
    end: int
    seq_len: int  # L: context length including the new tokens
    key_start: int  # position of the first key row read (a page boundary; 0 without a window)
    blocks: torch.Tensor  # page ids covering positions key_start:L
    mask: torch.Tensor | None  # [G * n, L - key_start] additive (folded rows); None: the SDPA path
    bool_mask: torch.Tensor | None = None  # [n, L - key_start] for SDPA when a plain causal mask is wrong

    @property
    def fresh(self) -> bool:
        """The chunk is its sequence's whole context: no cached prefix to read from the pages."""
        return self.end - self.start == self.seq_len


@dataclass(slots=True)
class AttentionPlan:
    decodes: list[DecodeBucket]
    prefills: list[PrefillChunk]
    exact: bool = False  # scores computed explicitly (softcap, sinks)


def first_visible(pos: int, window: int | None, chunk: int | None) -> int:
    """The first key position a query at ``pos`` attends to (see the module doc)."""
    lo = 0
    if window:
        lo = max(lo, pos - window + 1)
    if chunk:
        lo = max(lo, pos - pos % chunk)
    return lo


def _cut_buckets(lens: list[int], cost: int, window: int = 32) -> list[tuple[int, int]]:
    """Split ascending ``lens`` into ranges [i, j) minimising sum((j - i) * lens[j - 1]) + cost each
    (dynamic programming; a bucket holds at most ``window`` sequences, which keeps it O(n x window))."""
    n = len(lens)
    best = [0] * (n + 1)  # best[j]: cheapest split of lens[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        top = lens[j - 1]
        lo = max(0, j - window)
        value, at = best[lo] + (j - lo) * top, lo
        for i in range(lo + 1, j):
            c = best[i] + (j - i) * top
            if c < value:
                value, at = c, i
        best[j], cut[j] = value + cost, at
    ranges, j = [], n
    while j > 0:
        ranges.append((cut[j], j))
        j = cut[j]
    return ranges[::-1]


def _additive(hide: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(hide.shape, dtype=dtype, device=hide.device).masked_fill_(hide, float("-inf"))


def build_plan(
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    query_lens: list[int],
    seq_lens: list[int],
    num_decodes: int,
    block_size: int,
    num_queries_per_kv: int,
    dtype: torch.dtype,
    kv_row_elems: int = 256,
    *,
    window: int | None = None,
    chunk: int | None = None,
    exact: bool = False,
) -> AttentionPlan:
    """The shape-only work of one step's attention for one kind of layer (see the module doc).
    ``num_decodes`` leading sequences have one query token each; their rows are consecutive from 0.
    ``kv_row_elems`` (KV heads x head size) scales what one more bucket is worth in padded rows."""
    device = block_tables.device
    mask_dtype = torch.float32 if exact else dtype
    max_col = block_tables.shape[1] - 1
    # Decodes: sequence b reads pages first[b]... (first[b] = its window's first page), span[b] key rows.
    firsts = [first_visible(n - 1, window, chunk) // block_size for n in seq_lens[:num_decodes]]
    spans = [n - f * block_size for n, f in zip(seq_lens, firsts)]
    offsets = [first_visible(n - 1, window, chunk) - f * block_size for n, f in zip(seq_lens, firsts)]
    is_sorted = all(a <= b for a, b in itertools.pairwise(spans))
    order = list(range(num_decodes)) if is_sorted else sorted(range(num_decodes), key=spans.__getitem__)
    ordered = [spans[i] for i in order]
    buckets = _cut_buckets(ordered, max(8, BUCKET_COST * 256 // kv_row_elems)) if num_decodes else []
    windowed = any(f > 0 for f in firsts) or any(offsets)
    full_mask = None  # [num_decodes, longest] additive; buckets take views of it
    if windowed or any(ordered[i] != ordered[j - 1] for i, j in buckets):
        cols = torch.arange(ordered[-1], device=device)[None, :]
        hide = (cols >= torch.tensor(ordered, device=device)[:, None]) | (
            cols < torch.tensor([offsets[i] for i in order], device=device)[:, None]
        )
        full_mask = _additive(hide, mask_dtype)
    decodes = []
    for i, j in buckets:
        kv_len = ordered[j - 1]
        num_pages = -(-kv_len // block_size)
        if is_sorted:
            rows: slice | torch.Tensor = slice(i, j)
            seqs = block_tables[i:j]
        else:
            rows = torch.tensor(order[i:j], dtype=torch.long, device=device)
            seqs = block_tables.index_select(0, rows)
        if windowed:
            start = torch.tensor([firsts[k] for k in order[i:j]], device=device)[:, None]
            cols = (start + torch.arange(num_pages, device=device)[None, :]).clamp_(max=max_col)
            seqs = seqs.gather(1, cols)
        else:
            seqs = seqs[:, :num_pages]
        needs_mask = windowed or ordered[i] != kv_len
        mask = full_mask[i:j, None, None, :kv_len] if needs_mask else None  # [n, 1, 1, S]
        decodes.append(DecodeBucket(rows, seqs.reshape(-1), j - i, kv_len, num_pages, mask))

    prefills = []
    start = num_decodes
    mask_cache: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}
    local = bool(window or chunk)
    for b in range(num_decodes, len(query_lens)):
        n, kv_len = query_lens[b], seq_lens[b]
        if n == 0:
            continue
        key_start = first_visible(kv_len - n, window, chunk) // block_size * block_size
        span = kv_len - key_start
        mask = bool_mask = None
        if exact or (dtype == torch.float32 and num_queries_per_kv * n * span <= MAX_SCORES):
            mask = mask_cache.get((n, kv_len))
            if mask is None:
                mask = _additive(~_visible(n, kv_len, key_start, window, chunk, device), mask_dtype)
                mask = mask_cache[(n, kv_len)] = mask.repeat(num_queries_per_kv, 1)  # [G * n, span]
        elif local or kv_len != n:  # SDPA's is_causal only fits a fresh chunk of full attention
            bool_mask = _visible(n, kv_len, key_start, window, chunk, device)
        blocks = block_tables[b, key_start // block_size : -(-kv_len // block_size)]
        prefills.append(PrefillChunk(start, start + n, kv_len, key_start, blocks, mask, bool_mask))
        start += n
    return AttentionPlan(decodes, prefills, exact)


def _visible(n: int, kv_len: int, key_start: int, window, chunk, device) -> torch.Tensor:
    """[n, kv_len - key_start] bool: query i (at position kv_len - n + i) sees key key_start + j."""
    q_pos = torch.arange(kv_len - n, kv_len, device=device)[:, None]  # [n, 1]
    k_pos = torch.arange(key_start, kv_len, device=device)[None, :]  # [1, S]
    seen = k_pos <= q_pos
    if window:
        seen &= k_pos > q_pos - window
    if chunk:
        seen &= k_pos >= q_pos - q_pos % chunk
    return seen


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
