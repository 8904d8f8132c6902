"""Triton kernel that writes the step's new K and V into their cache pages (layout: ``reference.py``).

One program per (token, group of KV heads): it reads the token's slot, skips the token when the slot is
negative (padding, or a token whose K/V must not be stored), and otherwise copies a
``[BLOCK_H, D_PAD]`` tile of K and one of V into ``cache[slot // block_size, slot % block_size]``.
``D_PAD`` is the head size rounded up to a power of two; masks cover the padding, so any head size
works. Values are cast to the cache's dtype on store (fp32, fp16 or bf16). Slots at or past the end of
the cache are skipped too, so a bad slot can never write outside the cache (the torch reference
raises on them instead; a kernel cannot).

The launcher checks shapes, dtypes, devices and the strides the kernel relies on (``checks.py``: the head
dimension must be contiguous; every other dimension may have any stride, so transposed views work without a
copy) and raises ``ValueError`` saying what is wrong and how to fix it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_caches, check_device, check_float, check_int, fail


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr,  # [T, Hkv, D] and [T, Hkv, Dv]
    key_cache_ptr, value_cache_ptr,  # [num_blocks, BLOCK_SIZE, Hkv, D] and [..., Dv]
    slot_mapping_ptr,  # [T] int32/int64
    num_slots,  # num_blocks * BLOCK_SIZE
    stride_slot_mapping,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,  # key, value: token, head
    stride_kc_blk, stride_kc_slot, stride_kc_h,  # key_cache: block, slot in block, head
    stride_vc_blk, stride_vc_slot, stride_vc_h,  # value_cache: the same
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,  # KV heads per program (power of two)
    D_PAD: tl.constexpr,  # max(HEAD_DIM, HEAD_DIM_V) rounded up to a power of two
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token * stride_slot_mapping).to(tl.int64)
    if (slot < 0) | (slot >= num_slots):
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    dims = tl.arange(0, D_PAD)  # [D_PAD]
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]  # [BLOCK_H, D_PAD]

    k = tl.load(key_ptr + token * stride_k_t + heads[:, None] * stride_k_h + dims[None, :], mask=mask)
    k_dst = key_cache_ptr + block * stride_kc_blk + offset * stride_kc_slot
    tl.store(
        k_dst + heads[:, None] * stride_kc_h + dims[None, :], k.to(key_cache_ptr.dtype.element_ty), mask=mask
    )

    mask_v = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM_V)[None, :]
    v = tl.load(value_ptr + token * stride_v_t + heads[:, None] * stride_v_h + dims[None, :], mask=mask_v)
    v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_slot
    tl.store(
        v_dst + heads[:, None] * stride_vc_h + dims[None, :],
        v.to(value_cache_ptr.dtype.element_ty),
        mask=mask_v,
    )


def store_kv(
    key: torch.Tensor,  # [T, num_kv_heads, head_dim]
    value: torch.Tensor,  # [T, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T] int, < 0 means "do not store"
) -> None:
    """Write each token's K and V into its slot (``block * block_size + offset``); negative slots are skipped."""
    num_blocks, block_size, num_kv_heads, head_dim = check_caches(key_cache, value_cache)
    head_dim_v = value_cache.shape[3]
    token_layout = f"[num_tokens, num_kv_heads={num_kv_heads}, head_dim={head_dim}]"
    check_float("key", key, 3, token_layout)
    check_float("value", value, 3, token_layout)
    check_int("slot_mapping", slot_mapping, 1, "[num_tokens]")
    num_tokens = slot_mapping.shape[0]
    for name, t, dim in (("key", key, head_dim), ("value", value, head_dim_v)):
        if tuple(t.shape) != (num_tokens, num_kv_heads, dim):
            fail(
                f"{name} has shape {tuple(t.shape)} but the cache and slot_mapping need "
                f"{(num_tokens, num_kv_heads, dim)} = (num_tokens, num_kv_heads, head_dim)"
            )
    check_device(
        _store_kv_kernel,
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
    )
    if num_tokens == 0 or key_cache.numel() == 0:
        return
    d_pad = triton.next_power_of_2(max(head_dim, head_dim_v))
    block_h = min(triton.next_power_of_2(num_kv_heads), max(1, 4096 // d_pad))  # <= 4096 elements per tile
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    _store_kv_kernel[grid](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        num_blocks * block_size,
        slot_mapping.stride(0),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v,
        BLOCK_SIZE=block_size,
        BLOCK_H=block_h,
        D_PAD=d_pad,
    )
