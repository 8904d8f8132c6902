"""The CPU fast path of paged attention: a per-step plan, built once and reused by every layer.

Everything that depends only on the batch's shape (which pages each sequence reads, how long it is,
the masks) is the same in every layer of a step, so ``build_plan`` works it out once (the runner calls
it in ``prepare``; ``reference.paged_attention`` calls it per call) and ``run_plan`` does only the
per-layer work: gather pages, attend, write the output.

- **Decodes** (one query token) are sorted by context length and cut into buckets; each bucket
  gathers whole pages of its sequences (``index_select`` of 16 KiB page rows, not per-token slots)
  up to the bucket's longest context and runs one ``scaled_dot_product_attention`` with the query
  heads of a KV head folded into the query axis (GQA without repeating K/V). Buckets bound the
  padding: gathering every sequence to the batch's longest context copies ~1.5x the bytes on a
  uniform length mix, and the gather is the bulk of decode attention's memory traffic. The cut
  minimises (padded token rows + ``BUCKET_COST`` per bucket) by dynamic programming.
- **Prefill chunks** run one sequence at a time as ``baddbmm`` + ``softmax`` + ``bmm`` with the
  query heads of a KV head folded into rows (2-3x faster than CPU SDPA at these sizes); a chunk that
  is the whole context (no cached prefix) attends over the new K/V as given, without reading pages.
  Chunks whose score matrix would exceed ``MAX_SCORES`` elements, and 16-bit inputs (whose scores
  would be rounded), use SDPA instead.
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
    kv_len: int  # L: the longest context in the bucket
    num_pages: int  # ceil(L / block_size)
    mask: torch.Tensor | None  # [n, 1, 1, L] additive (0 / -inf); None when every context is L long


@dataclass(slots=True)
class PrefillChunk:
    start: int  # token rows start:end of the flat batch
    end: int
    seq_len: int  # L: context length including the new tokens
    blocks: torch.Tensor  # [ceil(L / block_size)] int64 page ids
    mask: torch.Tensor | None  # [G * n, L] additive causal mask (folded rows); None: the SDPA path

    @property
    def fresh(self) -> bool:
        """The chunk is its sequence's whole context: no cached prefix to read from the pages."""
        return self.end - self.start == self.seq_len


@dataclass(slots=True)
class AttentionPlan:
    decodes: list[DecodeBucket]
    prefills: list[PrefillChunk]


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


def build_plan(
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    query_lens: list[int],
    seq_lens: list[int],
    num_decodes: int,
    block_size: int,
    num_queries_per_kv: int,
    dtype: torch.dtype,
    kv_row_elems: int = 256,
) -> AttentionPlan:
    """The shape-only work of one step's attention (see the module doc). ``num_decodes`` leading
    sequences have one query token each; their rows are consecutive from 0. ``kv_row_elems``
    (KV heads x head size) scales what one more bucket is worth in padded rows."""
    device = block_tables.device
    dec_lens = seq_lens[:num_decodes]
    is_sorted = all(a <= b for a, b in itertools.pairwise(dec_lens))
    order = list(range(num_decodes)) if is_sorted else sorted(range(num_decodes), key=dec_lens.__getitem__)
    ordered = [dec_lens[i] for i in order]
    buckets = _cut_buckets(ordered, max(8, BUCKET_COST * 256 // kv_row_elems)) if num_decodes else []
    full_mask = None  # [num_decodes, longest] additive; buckets take views of it
    if any(ordered[i] != ordered[j - 1] for i, j in buckets):
        lens = torch.tensor(ordered, device=device)
        hide = torch.arange(ordered[-1], device=device)[None, :] >= lens[:, None]
        full_mask = torch.zeros(hide.shape, dtype=dtype, device=device).masked_fill_(hide, float("-inf"))
    decodes = []
    for i, j in buckets:
        kv_len = ordered[j - 1]
        num_pages = -(-kv_len // block_size)
        if is_sorted:
            rows: slice | torch.Tensor = slice(i, j)
            seqs = block_tables[i:j, :num_pages]
        else:
            rows = torch.tensor(order[i:j], dtype=torch.long, device=device)
            seqs = block_tables.index_select(0, rows)[:, :num_pages]
        mask = None if ordered[i] == kv_len else full_mask[i:j, None, None, :kv_len]  # [n, 1, 1, L]
        decodes.append(DecodeBucket(rows, seqs.reshape(-1), j - i, kv_len, num_pages, mask))

    prefills = []
    start = num_decodes
    causal_cache: dict[tuple[int, int], torch.Tensor] = {}
    for b in range(num_decodes, len(query_lens)):
        n, kv_len = query_lens[b], seq_lens[b]
        if n == 0:
            continue
        mask = None
        if dtype == torch.float32 and num_queries_per_kv * n * kv_len <= MAX_SCORES:
            mask = causal_cache.get((n, kv_len))
            if mask is None:  # query i sits at position kv_len - n + i
                rows = torch.arange(n, device=device)[:, None] + (kv_len - n)
                hide = torch.arange(kv_len, device=device)[None, :] > rows  # [n, L]
                mask = torch.zeros(hide.shape, dtype=dtype, device=device).masked_fill_(hide, float("-inf"))
                mask = causal_cache[(n, kv_len)] = mask.repeat(num_queries_per_kv, 1)  # [G * n, L]
        blocks = block_tables[b, : -(-kv_len // block_size)]
        prefills.append(PrefillChunk(start, start + n, kv_len, blocks, mask))
        start += n
    return AttentionPlan(decodes, prefills)


def _pages(flat_cache: torch.Tensor, blocks: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Whole pages ``blocks`` of ``flat_cache`` ([num_blocks, block_size * Hkv * D]) as ``shape``."""
    return flat_cache.index_select(0, blocks).view(shape)


def run_plan(
    plan: AttentionPlan,
    query: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,
    scale: float,
    out: torch.Tensor,  # [T, Hq, D]
    new_key: torch.Tensor | None = None,  # [T, Hkv, D]: this step's K, for chunks with no cached prefix
    new_value: torch.Tensor | None = None,
) -> torch.Tensor:
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    flat_k = key_cache.view(num_blocks, -1)  # [num_blocks, block_size * Hkv * D]
    flat_v = value_cache.view(num_blocks, -1)
    dtype = query.dtype  # the caches may be stored in another dtype: convert what is gathered

    for b in plan.decodes:
        n, kv_len = b.num_seqs, b.kv_len
        shape = (n, b.num_pages * block_size, num_kv_heads, head_dim)
        k = _pages(flat_k, b.blocks, shape)[:, :kv_len].transpose(1, 2).to(dtype)  # [n, Hkv, L, D]
        v = _pages(flat_v, b.blocks, shape)[:, :kv_len].transpose(1, 2).to(dtype)
        rows = b.rows
        q = query[rows] if isinstance(rows, slice) else query.index_select(0, rows)
        q = q.reshape(n, num_kv_heads, group, head_dim)  # [n, Hkv, G, D]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=b.mask, scale=scale)  # [n, Hkv, G, D]
        if isinstance(rows, slice):
            out[rows] = o.view(n, num_heads, head_dim)
        else:
            out.index_copy_(0, rows, o.view(n, num_heads, head_dim))

    for c in plan.prefills:
        n, kv_len = c.end - c.start, c.seq_len
        if c.fresh and new_key is not None and new_value is not None:
            k = new_key[c.start : c.end].transpose(0, 1).to(dtype)  # [Hkv, L, D]
            v = new_value[c.start : c.end].transpose(0, 1).to(dtype)
        else:
            shape = (-1, num_kv_heads, head_dim)
            k = _pages(flat_k, c.blocks, shape)[:kv_len].transpose(0, 1).to(dtype)  # [Hkv, L, D]
            v = _pages(flat_v, c.blocks, shape)[:kv_len].transpose(0, 1).to(dtype)
        q = query[c.start : c.end].transpose(0, 1)  # [Hq, n, D]
        if c.mask is None:  # too large to materialise the scores: SDPA blocks over them
            o = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=c.fresh,
                                               attn_mask=None if c.fresh else _bool_causal(n, kv_len, q.device),
                                               enable_gqa=group > 1)
            out[c.start : c.end] = o.transpose(0, 1)
            continue
        folded = q.reshape(num_kv_heads, group * n, head_dim)  # [Hkv, G * n, D]
        scores = torch.baddbmm(c.mask, folded, k.transpose(1, 2), alpha=scale)  # [Hkv, G * n, L]
        torch.softmax(scores, dim=-1, out=scores)
        o = torch.bmm(scores, v)  # [Hkv, G * n, D]
        out[c.start : c.end] = o.view(num_heads, n, head_dim).transpose(0, 1)
    return out


def _bool_causal(n: int, kv_len: int, device: torch.device) -> torch.Tensor:
    rows = torch.arange(n, device=device)[:, None] + (kv_len - n)
    return torch.arange(kv_len, device=device)[None, :] <= rows  # [n, L]
