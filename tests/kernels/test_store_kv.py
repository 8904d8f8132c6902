"""The Triton store_kv (under the interpreter) against the torch reference.

A store is a copy, so the check is exact (``torch.equal``) whenever no dtype conversion happens, and for
float32 -> float16. float32 -> bfloat16 is allowed one bf16 ulp (rtol 2**-7): Triton's interpreter
truncates that conversion where torch (and a GPU) round to nearest. With a GPU the same tests run on
CUDA tensors.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvscope.kernels import reference
from kvscope.kernels import store_kv as sk

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the interpreter (conftest)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def make_case(seed: int, *, num_tokens: int, num_blocks: int, block_size: int, num_kv_heads: int,
              head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype | None = None,
              negative: int = 0, slot_dtype: torch.dtype = torch.int64):  # fmt: skip
    """Distinct random slots (a permutation of the cache's slots), ``negative`` of them set to -1 or less."""
    gen = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    value_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    drop = torch.randperm(num_tokens, generator=gen)[:negative]
    slots[drop] = -torch.randint(1, 1000, (negative,), generator=gen)
    return tuple(t.to(DEVICE) for t in (key, value, key_cache, value_cache, slots.to(slot_dtype)))


def run_both(key, value, key_cache, value_cache, slots):
    """(Triton caches, reference caches), both starting from the same contents. (The reference's
    ``index_copy_`` needs int64 slots; the kernel takes int32 and int64.)"""
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    reference.store_kv(key, value, ref_k, ref_v, slots.long())
    sk.store_kv(key, value, key_cache, value_cache, slots)
    return (key_cache, value_cache), (ref_k, ref_v)


def sweep_cases(n: int = 15) -> list[dict]:
    rng = random.Random(7)
    return [
        dict(seed=i, num_tokens=rng.randint(1, 40), num_blocks=rng.randint(6, 12),
             block_size=(8, 16, 32, 64, 128)[i % 5],
             num_kv_heads=rng.choice([1, 2, 3, 4, 8]), head_dim=(64, 80, 96, 128, 256)[(i + i // 5) % 5],
             dtype=DTYPES[i % 3], negative=rng.randint(0, 3), slot_dtype=(torch.int32, torch.int64)[i % 2])
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "case",
    sweep_cases(),
    ids=lambda c: (
        f"{c['dtype']}-bs{c['block_size']}-h{c['num_kv_heads']}-d{c['head_dim']}-T{c['num_tokens']}"
    ),
)
def test_matches_reference_exactly(case):  # fmt: skip
    key, value, key_cache, value_cache, slots = make_case(**case)
    (k, v), (ref_k, ref_v) = run_both(key, value, key_cache, value_cache, slots)
    assert torch.equal(k, ref_k) and torch.equal(v, ref_v)


def test_negative_slots_leave_the_cache_untouched():
    key, value, key_cache, value_cache, slots = make_case(1, num_tokens=10, num_blocks=4, block_size=8,
                                                          num_kv_heads=2, head_dim=64, dtype=torch.float16)  # fmt: skip
    slots[:] = -1
    before_k, before_v = key_cache.clone(), value_cache.clone()
    sk.store_kv(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, before_k) and torch.equal(value_cache, before_v)


def test_slots_past_the_cache_are_skipped_not_written():
    key, value, key_cache, value_cache, slots = make_case(2, num_tokens=6, num_blocks=3, block_size=16,
                                                          num_kv_heads=1, head_dim=64, dtype=torch.float32)  # fmt: skip
    slots[2] = 3 * 16  # one past the last slot
    keep = torch.arange(6, device=DEVICE) != 2
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    reference.store_kv(key[keep], value[keep], ref_k, ref_v, slots[keep])
    sk.store_kv(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, ref_k) and torch.equal(value_cache, ref_v)


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_casts_to_the_cache_dtype(cache_dtype):
    case = make_case(3, num_tokens=12, num_blocks=4, block_size=16, num_kv_heads=2, head_dim=96,
                     dtype=torch.float32, cache_dtype=cache_dtype, negative=2)  # fmt: skip
    (k, v), (ref_k, ref_v) = run_both(*case)
    tol = dict(atol=0.0, rtol=0.0) if cache_dtype == torch.float16 else dict(atol=1e-30, rtol=2**-7)
    torch.testing.assert_close(k, ref_k, **tol)
    torch.testing.assert_close(v, ref_v, **tol)


def test_many_heads_split_over_programs_and_strided_inputs():
    """32 KV heads x 256 dims span two programs per token; K and V are strided views of one fused
    projection output ``[T, 3 * H * D]`` (query, key, value side by side), as a model produces them."""
    num_tokens, heads, dim = 5, 32, 256
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(num_tokens, 3 * heads * dim, generator=gen).to(DEVICE)
    key = qkv[:, heads * dim : 2 * heads * dim].view(num_tokens, heads, dim)
    value = qkv[:, 2 * heads * dim :].view(num_tokens, heads, dim)
    assert not key.is_contiguous()
    key_cache = torch.zeros(2, 16, heads, dim, device=DEVICE)
    value_cache = torch.zeros(2, 16, heads, dim, device=DEVICE)
    slots = torch.tensor([31, 0, -1, 17, 5], device=DEVICE)
    (k, v), (ref_k, ref_v) = run_both(key, value, key_cache, value_cache, slots)
    assert torch.equal(k, ref_k) and torch.equal(v, ref_v)


def test_no_tokens_is_a_no_op():
    key = torch.empty(0, 2, 64, device=DEVICE)
    key_cache = torch.zeros(2, 8, 2, 64, device=DEVICE)
    sk.store_kv(key, key, key_cache, key_cache.clone(), torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert not key_cache.any()


BAD_INPUTS = {
    "key 2-D": (lambda c: dict(key=c["key"][0]), "key must be 3-D"),
    "key shape": (lambda c: dict(key=c["key"][:, :1]), r"key has shape \(4, 1, 64\)"),
    "int key": (lambda c: dict(key=c["key"].to(torch.int32)), "dtype torch.int32"),
    "float slots": (lambda c: dict(slot_mapping=c["slot_mapping"].float()), "slot_mapping has dtype"),
    "cache shapes": (lambda c: dict(value_cache=c["value_cache"][:1]), "differ in shape"),
    "strided head dim": (lambda c: dict(value=c["value"].transpose(1, 2).contiguous().transpose(1, 2)),
                         "contiguous last"),
    "two devices": (lambda c: dict(slot_mapping=c["slot_mapping"].to("meta")), "one device"),
}  # fmt: skip


@pytest.mark.parametrize("label", list(BAD_INPUTS))
def test_invalid_inputs_raise_clear_errors(label):
    names = ["key", "value", "key_cache", "value_cache", "slot_mapping"]
    args = make_case(
        0, num_tokens=4, num_blocks=2, block_size=8, num_kv_heads=2, head_dim=64, dtype=torch.float32
    )
    kwargs = dict(zip(names, args))
    change, message = BAD_INPUTS[label]
    kwargs.update(change(kwargs))
    with pytest.raises(ValueError, match=message):
        sk.store_kv(**kwargs)
