"""One Triton kernel for paged attention over a flat batch mixing prefill chunks and decodes.

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
unnormalised ``acc`` and its ``m``, ``l`` to fp32 scratch; ``_merge_splits_kernel`` returns
``sum_s w_s acc_s / sum_s w_s l_s``, ``w_s = exp2(m_s - max m)``. The launcher splits only on CUDA, when
``(T // BLOCK_Q + B) * Hkv`` programs would not fill the SMs and the longest context (``seq_lens_list``,
else the block table's capacity) is >= 1024. One kernel with a constexpr switch, rather than a separate
decode kernel, keeps one copy of the masking and softmax; splits are valid for prefill chunks too, and
the tests force them on mixed batches.

Triton 3.9's interpreter multiplies the raw bits of bf16 in ``tl.dot``, so under the interpreter bf16
tiles are upcast to fp32 before the dots (``DOT_FP32``); compiled kernels keep bf16 dots.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .store_kv import _check_caches, _check_device, _check_float, _check_int, _fail

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
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
def _merge_splits_kernel(
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


def _check_inputs(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out):
    _, block_size, num_kv_heads, head_dim = _check_caches(key_cache, value_cache)
    head_dim_v = value_cache.shape[3]
    _check_float("query", query, 3, f"[num_tokens, num_heads, head_dim={head_dim}]")
    num_heads = query.shape[1]
    if query.shape[2] != head_dim:
        _fail(f"query has head_dim {query.shape[2]} but the caches have {head_dim}; they must match")
    if num_heads % num_kv_heads:
        _fail(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads} (grouped-query attention)"
        )
    if not 0 < head_dim <= 256 or not 0 < head_dim_v <= 256:
        _fail(f"head_dim={head_dim} (values: {head_dim_v}) is not supported: the kernel takes head sizes 1..256")
    if block_size & (block_size - 1):
        _fail(f"block_size={block_size} must be a power of two (8, 16, 32, 64, 128, ...)")
    _check_int("block_tables", block_tables, 2, "[num_seqs, max_blocks]")
    _check_int("query_start_loc", query_start_loc, 1, "[num_seqs + 1]")
    _check_int("seq_lens", seq_lens, 1, "[num_seqs]")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        _fail(
            f"seq_lens has {num_seqs} sequences, so query_start_loc needs {num_seqs + 1} entries (has "
            f"{query_start_loc.shape[0]}) and block_tables {num_seqs} rows (has {block_tables.shape[0]})"
        )
    if block_tables.stride(1) != 1 or query_start_loc.stride(0) != 1 or seq_lens.stride(0) != 1:
        _fail("block_tables (last dim), query_start_loc and seq_lens must be contiguous: call .contiguous()")
    if out is not None:
        want = (*query.shape[:2], head_dim_v)
        _check_float("out", out, 3, "[num_tokens, num_heads, head_dim_v]")
        if tuple(out.shape) != want or out.dtype != query.dtype:
            _fail(f"out is {tuple(out.shape)} {out.dtype}; it must match query (tokens, heads, dtype) with "
                  f"the value cache's head size: {want} {query.dtype}")  # fmt: skip
    extra = {} if out is None else {"out": out}
    return _check_device(
        _paged_attention_kernel, query=query, key_cache=key_cache, value_cache=value_cache,
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
            _fail(f"{name}={value!r} must be a positive number of tokens, or None")
    if softcap is not None and (not math.isfinite(softcap) or softcap <= 0):
        _fail(f"softcap={softcap} must be a positive finite float, or None")
    if sinks is None:
        return None
    num_tokens, num_heads = query.shape[:2]
    if not isinstance(sinks, torch.Tensor) or sinks.device != query.device:
        _fail(f"sinks must be a tensor on {query.device} ([num_heads] or [num_tokens, num_heads])")
    sinks = sinks.float()
    if sinks.dim() == 1 and sinks.shape[0] == num_heads:
        return sinks[None, :].expand(num_tokens, num_heads)
    if tuple(sinks.shape) != (num_tokens, num_heads):
        _fail(f"sinks has shape {tuple(sinks.shape)}; it must be [{num_heads}] or [{num_tokens}, {num_heads}]")
    return sinks


def _launch(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, *,
            query_lens=None, seq_lens_list=None, out=None, num_splits=None, window=None, chunk=None,
            softcap=None, sinks=None):  # fmt: skip
    """``paged_attention`` with the split count exposed (``None``: the heuristic; tests force 1, 2, 4, ...)."""
    device = _check_inputs(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out)
    if not math.isfinite(scale) or scale <= 0:
        _fail(f"scale={scale} must be a positive finite float (usually head_dim ** -0.5)")
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
        _fail(f"num_splits={num_splits} must be a power of two")
    interpreted = not isinstance(_paged_attention_kernel, triton.runtime.JITFunction)
    if num_splits > 1:
        part_acc = torch.empty(num_tokens, num_heads, num_splits, dv_pad, device=device, dtype=torch.float32)
        part_ml = torch.empty(num_tokens, num_heads, num_splits, 2, device=device, dtype=torch.float32)
    else:
        part_acc = part_ml = out  # never touched
    sink_arg = sinks if sinks is not None else out  # never read without HAS_SINKS
    sink_strides = sinks.stride() if sinks is not None else (0, 0)
    _paged_attention_kernel[(num_q_blocks, num_kv_heads, num_splits)](
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
        _merge_splits_kernel[(num_tokens, num_heads)](
            out, part_acc, part_ml, sink_arg, num_heads, out.stride(0), out.stride(1), *sink_strides,
            HEAD_DIM=head_dim_v, D_PAD=dv_pad, NUM_SPLITS=num_splits, HAS_SINKS=sinks is not None,
        )  # fmt: skip
    return out
