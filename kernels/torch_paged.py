"""The CPU fast path of paged attention: a per-step plan, built once and reused by every layer.

Everything that depends only on the batch's shape (which pages each sequence reads, how long it is,
the masks) is the same in every layer of a step that has the same kind of attention, so ``build_plan``
works it out once per kind (the runner calls it in ``prepare``; ``reference.paged_attention`` calls it
per call) and ``torch_run.run_plan`` does only the per-layer work:
gather pages, attend, write the output.

What a query at position ``p`` sees is ``[lo(p), p]``: ``lo = 0`` for full causal attention,
``p - window + 1`` for a sliding window of ``window`` keys (the query included; transformers'
``sliding_window``), ``p - p % chunk`` for chunked local attention (Llama 4). Only the pages from
``lo``'s page on are gathered, so a window also bounds the work, not only the result.

- **Decodes** (one query token) are sorted by the span of keys they read and cut into buckets; each
  bucket gathers whole pages of its sequences up to the bucket's longest span (``DecodeBucket``). Buckets
  bound the padding: the cut minimises (padded token rows + ``BUCKET_COST`` per bucket) by dynamic
  programming.
- **Prefill chunks** run one sequence at a time (``PrefillChunk``), with an additive mask over the query
  heads of a KV head folded into rows; chunks whose score matrix would exceed ``MAX_SCORES`` elements, and
  16-bit inputs (whose scores would be rounded), get no such mask and take SDPA instead.
- **Exact scores** (``exact=True`` plans): logit softcapping and attention sinks, which SDPA cannot do;
  their masks are float32.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

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
