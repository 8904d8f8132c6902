"""The Triton paged attention (under the interpreter) against the float32 oracle and the torch reference.

Tolerances, Triton vs the oracle computed in float32 on the same (rounded) inputs:
- float32: atol = rtol = 1e-5 (IEEE dots; observed ~5e-7);
- float16: atol 1e-3, rtol 2e-3 (output rounding, <= 1 ulp, plus P cast to fp16 for P @ V);
- bfloat16: atol 1e-2, rtol 1.6e-2 (about 2 bf16 ulps: the interpreter truncates fp32 -> bf16 instead of
  rounding, so bf16 results here sit one ulp further off than on a GPU).
Against ``reference.paged_attention`` (which itself rounds to the input dtype) the 16-bit tolerances double.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.kernels import paged_attention as pa
from kvscope.kernels import reference

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=1e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
}
TOL_VS_REFERENCE = {
    torch.float32: TOL[torch.float32],
    torch.float16: dict(atol=2e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=3.2e-2),
}
GROUPS = (1, 2, 4, 8)
BLOCK_SIZES = (8, 16, 32, 64, 128)
HEAD_DIMS = (64, 80, 96, 128, 256)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def oracle(batch) -> torch.Tensor:
    """``paged_attention_naive`` on the inputs upcast to float32 (on the CPU): the exact answer for them."""
    b = batch
    out = reference.paged_attention_naive(
        b.query.cpu().float(), b.key_cache.cpu().float(), b.value_cache.cpu().float(), b.block_tables.cpu(),
        b.query_start_loc.cpu(), b.seq_lens.cpu(), b.scale,
    )  # fmt: skip
    return out.to(b.query.device)


def random_lengths(rng: random.Random, num_seqs: int, block_size: int) -> tuple[list[int], list[int]]:
    """A ragged mix of decodes, fresh prefills, prefill chunks over a cached prefix and empty sequences."""
    query_lens, context_lens = [], []
    for _ in range(num_seqs):
        kind = rng.choice(["decode", "decode", "prefill", "chunk", "empty"])
        if kind == "decode":
            q, c = 1, rng.randint(0, 3 * block_size + 5)
        elif kind == "prefill":
            q, c = rng.randint(2, 40), 0
        elif kind == "chunk":
            q, c = rng.randint(2, 24), rng.randint(1, 2 * block_size + 20)
        else:
            q, c = 0, rng.randint(0, 40)
        query_lens.append(q)
        context_lens.append(c)
    if sum(query_lens) == 0:
        query_lens[0] = 1
    return query_lens, context_lens


def sweep_cases(n: int = 30) -> list[dict]:
    """Seeded cases; every GQA ratio x block size pair appears (i % 4, i % 5), and every head size and
    dtype several times."""
    rng = random.Random(2024)
    cases = []
    for i in range(n):
        block_size = BLOCK_SIZES[i % 5]
        query_lens, context_lens = random_lengths(rng, rng.randint(1, 5), block_size)
        if i % 3 == 0:  # the engine's order: decodes first
            order = sorted(range(len(query_lens)), key=lambda j: query_lens[j] != 1)
            query_lens, context_lens = [query_lens[j] for j in order], [context_lens[j] for j in order]
        cases.append(
            dict(
                seed=i,
                query_lens=query_lens,
                context_lens=context_lens,
                num_kv_heads=rng.choice([1, 2]),
                group=GROUPS[i % 4],
                head_dim=HEAD_DIMS[(i // 5 + i) % 5],
                block_size=block_size,
                dtype=DTYPES[i % 3],
            )
        )
    return cases


def case_id(c: dict) -> str:
    dt = str(c["dtype"]).removeprefix("torch.")
    return (
        f"{dt}-g{c['group']}-bs{c['block_size']}-d{c['head_dim']}-q{c['query_lens']}-ctx{c['context_lens']}"
    )


def check(actual: torch.Tensor, expected: torch.Tensor, tol: dict) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


@pytest.mark.parametrize("case", sweep_cases(), ids=case_id)
def test_matches_oracle_and_reference(paged_batch, case):
    batch = paged_batch(**case)
    out = pa.paged_attention(*batch.args())
    assert out.dtype == batch.query.dtype and out.shape == batch.query.shape
    check(out, oracle(batch), TOL[case["dtype"]])
    check(out, reference.paged_attention(*batch.args()), TOL_VS_REFERENCE[case["dtype"]])


@pytest.mark.parametrize(
    ("dtype", "num_splits"),
    [(torch.float32, 2), (torch.float32, 16), (torch.float16, 4), (torch.bfloat16, 8)],
    ids=["fp32-2", "fp32-16", "fp16-4", "bf16-8"],
)
def test_split_kv_matches_oracle(paged_batch, num_splits, dtype):
    """Split-KV on a mixed batch: long decodes, a chunk over a prefix, a fresh prefill, an empty sequence;
    16 splits leave most segments of the short sequences empty."""
    batch = paged_batch(num_splits, query_lens=[1, 1, 9, 17, 0], context_lens=[300, 5, 130, 0, 7],
                        num_kv_heads=1, group=4, head_dim=80, block_size=16, dtype=dtype)  # fmt: skip
    check(pa._launch(*batch.args(), num_splits=num_splits), oracle(batch), TOL[dtype])


def test_hints_do_not_change_the_result(paged_batch):
    decodes = paged_batch(7, query_lens=[1, 1, 1], context_lens=[40, 0, 17], group=8, block_size=8)
    plain = pa.paged_attention(*decodes.args())
    hinted = pa.paged_attention(*decodes.args(), num_decodes=3, query_lens=decodes.query_lens,
                                seq_lens_list=decodes.seq_lens_list)  # fmt: skip
    torch.testing.assert_close(plain, hinted, atol=1e-6, rtol=1e-6)
    check(plain, oracle(decodes), TOL[torch.float32])
    mixed = paged_batch(8, query_lens=[1, 6, 1], context_lens=[30, 3, 0], group=2)  # decode-sized T == B
    hinted = pa.paged_attention(*mixed.args(), query_lens=mixed.query_lens, seq_lens_list=mixed.seq_lens_list)
    check(hinted, oracle(mixed), TOL[torch.float32])


@pytest.mark.parametrize("group", [3, 7])
def test_gqa_ratio_that_does_not_divide_the_tile(paged_batch, group):
    """GROUP 3 or 7 leaves spare rows past BLOCK_Q * GROUP in each tile (masked; on a GPU an unmasked
    spare row would race with the next q-block's program, which the sequential interpreter cannot show)."""
    batch = paged_batch(group, query_lens=[1, 30, 12], context_lens=[20, 5, 0], num_kv_heads=2, group=group)
    check(pa.paged_attention(*batch.args()), oracle(batch), TOL[torch.float32])


@pytest.mark.parametrize(
    ("query_lens", "context_lens"),
    [
        ([1], [0]),  # a single token, nothing cached
        ([1], [15]),  # a decode that fills its page exactly
        ([16], [16]),  # a chunk that starts and ends on page boundaries
        ([0, 0, 3, 0], [5, 0, 0, 9]),  # zero-length sequences around one prefill
        ([2, 0], [0, 0]),  # trailing empty sequence
    ],
    ids=[
        "single-token",
        "decode-fills-page",
        "chunk-on-page-boundaries",
        "empty-seqs-around",
        "trailing-empty",
    ],
)
def test_edge_cases(paged_batch, query_lens, context_lens):
    batch = paged_batch(3, query_lens=query_lens, context_lens=context_lens, group=2, block_size=16)
    check(pa.paged_attention(*batch.args()), oracle(batch), TOL[torch.float32])


def test_empty_batch_returns_out_untouched(paged_batch):
    batch = paged_batch(0, query_lens=[0, 0], context_lens=[3, 0])
    out = torch.empty_like(batch.query)
    assert pa.paged_attention(*batch.args(), out=out) is out and out.shape[0] == 0


def test_unused_block_table_entries_are_never_read(paged_batch):
    batch = paged_batch(
        5, query_lens=[1, 4, 1], context_lens=[20, 9, 3], block_size=8, index_dtype=torch.int64
    )
    for b, n in enumerate(batch.seq_lens_list):
        batch.block_tables[b, -(-n // 8) :] = [10**12, -(10**12)][b % 2]  # far outside the cache
    check(pa.paged_attention(*batch.args()), oracle(batch), TOL[torch.float32])


def test_strided_views_and_out(paged_batch):
    """Query as the transposed view an HF attention layer hands over ([1, Hq, T, D] -> [T, Hq, D]), caches
    as slices of one padded [2, ...] tensor, ``out`` a strided view: no copies needed, same answer."""
    batch = paged_batch(
        11, query_lens=[1, 5, 1], context_lens=[12, 7, 0], num_kv_heads=2, group=2, head_dim=64
    )
    q4 = batch.query.transpose(0, 1).unsqueeze(0).contiguous()  # [1, Hq, T, D]
    query = q4[0].transpose(0, 1)
    kv = torch.zeros(2, *batch.key_cache.shape[:3], 72, device=query.device)  # head dim padded to 72
    kv[0, ..., :64], kv[1, ..., :64] = batch.key_cache, batch.value_cache
    out_buf = torch.zeros(query.shape[0], query.shape[1], 96, device=query.device)
    out = pa.paged_attention(
        query, kv[0, ..., :64], kv[1, ..., :64], *batch.args()[3:], out=out_buf[..., :64]
    )
    check(out_buf[..., :64], oracle(batch), TOL[torch.float32])
    assert out.data_ptr() == out_buf.data_ptr() and not out_buf[..., 64:].any()


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 40)), min_size=1, max_size=4),
    group=st.sampled_from(GROUPS),
    block_size=st.sampled_from(BLOCK_SIZES),
    head_dim=st.sampled_from(HEAD_DIMS),
)
def test_hypothesis_ragged_batches(paged_batch, lengths, group, block_size, head_dim):
    query_lens = [q for q, _ in lengths]
    if sum(query_lens) == 0:
        query_lens[0] = 1
    batch = paged_batch(1, query_lens=query_lens, context_lens=[c for _, c in lengths], num_kv_heads=1,
                        group=group, head_dim=head_dim, block_size=block_size)  # fmt: skip
    check(pa.paged_attention(*batch.args()), oracle(batch), TOL[torch.float32])


BAD_INPUTS = {
    "query 2-D": (lambda b: dict(query=b.query[0]), "query must be 3-D"),
    "int query": (lambda b: dict(query=b.query.to(torch.int32)), "dtype torch.int32"),
    "head_dim mismatch": (lambda b: dict(query=b.query[..., :32]), "head_dim 32 but the caches have 64"),
    "not GQA": (lambda b: dict(query=b.query[:, :3]), "not a multiple of num_kv_heads"),
    "block size 12": (lambda b: dict(key_cache=b.key_cache[:, :12], value_cache=b.value_cache[:, :12]), "power of two"),
    "cache shapes": (lambda b: dict(value_cache=b.value_cache[:1]), "differ in shape"),
    "strided head dim": (lambda b: dict(query=b.query.transpose(1, 2).contiguous().transpose(1, 2)), "contiguous last"),
    "float tables": (lambda b: dict(block_tables=b.block_tables.float()), "block_tables has dtype torch.float32"),
    "short query_start_loc": (lambda b: dict(query_start_loc=b.query_start_loc[:-1]), "query_start_loc needs 3"),
    "out dtype": (lambda b: dict(out=torch.empty_like(b.query, dtype=torch.float16)), "it must match query"),
    "two devices": (lambda b: dict(seq_lens=b.seq_lens.to("meta")), "one device"),
    "nan scale": (lambda b: dict(scale=float("nan")), "positive finite"),
}  # fmt: skip


@pytest.mark.parametrize("label", list(BAD_INPUTS))
def test_invalid_inputs_raise_clear_errors(paged_batch, label):
    batch = paged_batch(0, query_lens=[1, 3], context_lens=[4, 0], num_kv_heads=2, group=2)
    names = ["query", "key_cache", "value_cache", "block_tables", "query_start_loc", "seq_lens", "scale"]
    kwargs = dict(zip(names, batch.args()))
    change, message = BAD_INPUTS[label]
    kwargs.update(change(batch))
    with pytest.raises(ValueError, match=message):
        pa.paged_attention(**kwargs)
