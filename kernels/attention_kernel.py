"""The Triton kernel of paged attention over a flat batch mixing prefill chunks and decodes (device code;
``paged_attention.py`` checks the inputs and launches it).

Semantics of ``reference.py``: query ``i`` of sequence ``b`` sits at position ``seq_lens[b] - q_len + i``
and attends causally to positions ``0..that`` of the sequence's pages. Tiling (FlashAttention-2 style,
the scheme of vLLM's Triton "unified attention"):

- A program owns one *q-block* (``BLOCK_Q`` consecutive queries of one sequence) and one KV head. Its
  ``BLOCK_M`` rows are (token, query head) pairs, row ``m`` = token ``m // GROUP``, head
  ``kv_head * GROUP + m % GROUP``: the query heads of a KV head share each read of K/V (GQA without
  repeating K/V), and GQA decodes fill the >= 16 rows ``tl.dot`` needs with real heads.
- Grid axis 0 walks the batch's q-blocks without host-side lengths: sequence ``b``'s q-blocks start at
  ``query_start_loc[b] // BLOCK_Q + b``, which grows with ``b``; a binary search finds a program's
  sequence, and ``T // BLOCK_Q + B`` programs cover any batch (spare ones return at once).
- K/V stream in tiles of ``TILE_N`` positions, each mapped to its page on its own
  (``block_tables[b, pos // block_size]``), so tiles need not match pages: any power-of-two block size
  works and entries past a sequence's pages are never read. Head sizes pad to a power of two (``D_PAD``).
- Masks: key ``pos`` is visible to a row when ``lo <= pos <=`` the row's position ``p`` (causal over the
  cached prefix), ``lo = 0`` for full attention, ``p - window + 1`` for a sliding window, ``p - p % chunk``
  for chunked local attention; a q-block reads keys ``[lo of its first query, its last query + 1)``, so
  tiles wholly before a window are never loaded.
- Softcapping (Gemma 2) maps each score to ``softcap * tanh(score / softcap)`` before the softmax; sinks
  (gpt-oss) add ``exp(sink)`` of one logit per (token, head) to the softmax's denominator at the end
  (in the merge kernel when the KV is split). The value head size may differ from the key's (``DV_PAD``).
- Online softmax in fp32, base 2 (``scale * log2 e`` folded into the scores), with rows that see nothing
  yet guarded against NaN. ``P`` is cast to the K/V dtype for ``P @ V`` as in FlashAttention; fp32
  inputs use IEEE dots (no TF32), so fp32 matches the fp32 oracle to ~1e-6.

Split-KV (flash-decoding): a few long decodes give few programs and idle SMs, so the same kernel takes a
third grid axis of ``NUM_SPLITS`` segments, each an equal share of the q-block's KV tiles, writing its
unnormalised ``acc`` and its ``m``, ``l`` to fp32 scratch; ``merge_splits_kernel`` returns
``sum_s w_s acc_s / sum_s w_s l_s``, ``w_s = exp2(m_s - max m)``. One kernel with a constexpr switch, rather
than a separate decode kernel, keeps one copy of the masking and softmax; splits are valid for prefill chunks
too, and the tests force them on mixed batches.

``DOT_FP32`` upcasts bf16 tiles to fp32 before the dots (the launcher sets it under Triton 3.9's interpreter,
which multiplies the raw bits of bf16 in ``tl.dot``); compiled kernels keep bf16 dots.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_attention_kernel(
    out_ptr,  # [T, Hq, D]                            written when NUM_SPLITS == 1
    part_acc_ptr,  # [T, Hq, NUM_SPLITS, D_PAD] fp32     written when NUM_SPLITS > 1
    part_ml_ptr,  # [T, Hq, NUM_SPLITS, 2] fp32 (m, l)   written when NUM_SPLITS > 1
    q_ptr,  # [T, Hq, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D] and [..., Dv]
    block_tables_ptr,  # [B, max_blocks]
    query_start_loc_ptr,  # [B + 1]
    seq_lens_ptr,  # [B]
    sinks_ptr,  # [T, Hq] fp32 sink logits (any strides), read when HAS_SINKS
    scale_log2,  # softmax scale * log2(e)
    scale, softcap,  # used when USE_SOFTCAP
    window, chunk,  # sliding window / attention chunk in tokens, used when HAS_WINDOW / HAS_CHUNK
    num_seqs, num_heads,
    stride_sink_t, stride_sink_h,
    stride_q_t, stride_q_h, stride_o_t, stride_o_h,  # query, out: token, head
    stride_k_blk, stride_k_slot, stride_k_h,  # key_cache: block, slot in block, head
    stride_v_blk, stride_v_slot, stride_v_h,  # value_cache: the same
    stride_bt,  # block_tables: sequence
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,  # head size and its power-of-two padding
    HEAD_DIM_V: tl.constexpr, DV_PAD: tl.constexpr,  # the value's head size, padded
    HAS_WINDOW: tl.constexpr, HAS_CHUNK: tl.constexpr, USE_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_SIZE: tl.constexpr,  # tokens per page
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,  # queries per program; rows, >= BLOCK_Q * GROUP, power of two
    TILE_N: tl.constexpr,  # key positions per tile
    NUM_SPLITS: tl.constexpr,  # KV segments (grid axis 2)
    DOT_FP32: tl.constexpr,  # upcast tiles before tl.dot (bf16 under the interpreter)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32), else "tf32" (ignored for 16-bit)
):  # fmt: skip
    q_block, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # Binary search: the last sequence whose first q-block, query_start_loc[b] // BLOCK_Q + b, is <= q_block.
    # (Inline rather than a jit helper: Triton's interpreter re-patches the language on every helper call.)
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    if seq < 0:  # only when query_start_loc[0] > 0
        return
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_in_seq = q_block - (q_start // BLOCK_Q + seq)
    if q_block_in_seq * BLOCK_Q >= q_len:  # a spare program
        return
    context_len = tl.load(seq_lens_ptr + seq) - q_len  # cached positions before this step's queries

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D_PAD)
    dims_v = tl.arange(0, DV_PAD)
    q_idx = q_block_in_seq * BLOCK_Q + rows // GROUP  # [BLOCK_M] query index within the sequence
    head = kv_head * GROUP + rows % GROUP  # [BLOCK_M] query head
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)  # [BLOCK_M]
    dim_ok = dims < HEAD_DIM  # [D_PAD]
    dim_v_ok = dims_v < HEAD_DIM_V  # [DV_PAD]
    q_pos = context_len + q_idx  # [BLOCK_M] position of each row's query
    # lo: the first key each row sees; first_pos: that of the q-block's first query (the smallest)
    first_q = context_len + q_block_in_seq * BLOCK_Q
    first_pos = first_q * 0
    lo = q_pos * 0
    if HAS_WINDOW:
        lo = tl.maximum(lo, q_pos - window + 1)
        first_pos = tl.maximum(first_pos, first_q - window + 1)
    if HAS_CHUNK:
        lo = tl.maximum(lo, q_pos - q_pos % chunk)
        first_pos = tl.maximum(first_pos, first_q - first_q % chunk)
    token = (q_start + q_idx).to(tl.int64)  # [BLOCK_M] row in the flat batch
    q = tl.load(
        q_ptr + token[:, None] * stride_q_t + head[:, None] * stride_q_h + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # [BLOCK_M, D_PAD]
    if DOT_FP32:
        q = q.to(tl.float32)

    # This q-block sees positions [first_pos, kv_end); with NUM_SPLITS > 1 this program takes one share of the tiles.
    kv_end = context_len + tl.minimum((q_block_in_seq + 1) * BLOCK_Q, q_len)
    first_tile = first_pos // TILE_N
    num_tiles = tl.cdiv(kv_end, TILE_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, first_tile + num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 domain)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)  # running sum of p @ V
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_k_h
    v_base = v_cache_ptr + kv_head * stride_v_h
    for tile in range(tile_lo, tile_hi):
        pos = tile * TILE_N + tl.arange(0, TILE_N)  # [TILE_N] key positions
        pos_ok = pos < kv_end
        page = tl.load(block_table + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)  # [TILE_N]
        k_off = page * stride_k_blk + (pos % BLOCK_SIZE) * stride_k_slot  # [TILE_N]
        v_off = page * stride_v_blk + (pos % BLOCK_SIZE) * stride_v_slot
        k_mask = dim_ok[:, None] & pos_ok[None, :]
        k = tl.load(k_base + k_off[None, :] + dims[:, None], mask=k_mask, other=0.0)  # [D_PAD, TILE_N]
        v_mask = pos_ok[:, None] & dim_v_ok[None, :]
        v = tl.load(v_base + v_off[:, None] + dims_v[None, :], mask=v_mask, other=0.0)  # [TILE_N, DV_PAD]
        k = k.to(q.dtype)  # fp32 when DOT_FP32
        v = v.to(q.dtype)
        if USE_SOFTCAP:
            x = tl.dot(q, k, input_precision=DOT_PRECISION) * scale / softcap
            s = softcap * (2.0 * tl.sigmoid(2.0 * x) - 1.0) * 1.4426950408889634  # cap * tanh(x), log2 domain
        else:
            s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2  # [BLOCK_M, TILE_N]
        visible = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] >= lo[:, None]) & pos_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp2(s - m_ref[:, None])  # [BLOCK_M, TILE_N]
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)  # [BLOCK_M, DV_PAD]
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if NUM_SPLITS == 1:
        if HAS_SINKS:  # the sink's exp joins the denominator (log2 domain, rescaled to a common max)
            sink = tl.load(sinks_ptr + token * stride_sink_t + head * stride_sink_h, mask=row_ok, other=0.0)
            sink = sink * 1.4426950408889634
            m_fin = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - m_fin)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - m_fin)
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_ptr = out_ptr + token[:, None] * stride_o_t + head[:, None] * stride_o_h + dims_v[None, :]
        tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_v_ok[None, :])
    else:
        part = (token * num_heads + head) * NUM_SPLITS + split  # [BLOCK_M] row of the scratch buffers
        tl.store(part_acc_ptr + part[:, None] * DV_PAD + dims_v[None, :], acc, mask=row_ok[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def merge_splits_kernel(
    out_ptr,  # [T, Hq, Dv]
    part_acc_ptr,  # [T, Hq, NUM_SPLITS, DV_PAD] fp32
    part_ml_ptr,  # [T, Hq, NUM_SPLITS, 2] fp32
    sinks_ptr,  # [T, Hq] fp32, read when HAS_SINKS
    num_heads, stride_o_t, stride_o_h, stride_sink_t, stride_sink_h,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    part = (token * num_heads + head) * NUM_SPLITS + tl.arange(0, NUM_SPLITS)  # [NUM_SPLITS]
    dims = tl.arange(0, D_PAD)
    m = tl.load(part_ml_ptr + part * 2)  # [NUM_SPLITS]; -inf for a segment with no keys
    l_s = tl.load(part_ml_ptr + part * 2 + 1)
    m_max = tl.max(m, axis=0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + token * stride_sink_t + head * stride_sink_h) * 1.4426950408889634
        m_max = tl.maximum(m_max, sink)
    w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))  # [NUM_SPLITS]
    acc = tl.load(part_acc_ptr + part[:, None] * D_PAD + dims[None, :])  # [NUM_SPLITS, D_PAD]
    total = tl.sum(w * l_s, axis=0)
    if HAS_SINKS:
        total += tl.exp2(sink - m_max)
    o = tl.sum(acc * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)  # [D_PAD]
    o_ptr = out_ptr + token * stride_o_t + head * stride_o_h + dims
    tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)
