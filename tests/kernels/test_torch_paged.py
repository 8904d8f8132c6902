"""The torch fast path (``kernels/torch_paged.py``) against the float32 oracle: decode buckets (sorted and
unsorted), prefill chunks with and without a cached prefix, attention over the new K/V, the SDPA
fallbacks, and the bucket cut itself. All on CPU tensors; no Triton involved."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from kvscope.kernels import reference, torch_paged, torch_run

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def oracle(b) -> torch.Tensor:
    return reference.paged_attention_naive(
        b.query.float(), b.key_cache.float(), b.value_cache.float(), b.block_tables, b.query_start_loc,
        b.seq_lens, b.scale,
    )  # fmt: skip


def check(out: torch.Tensor, b) -> None:
    tol = TOL[b.query.dtype]
    torch.testing.assert_close(out.float(), oracle(b), atol=tol, rtol=2 * tol)


def ragged(rng: random.Random, n: int, block_size: int) -> tuple[list[int], list[int]]:
    query_lens, context_lens = [], []
    for _ in range(n):
        kind = rng.choice(["decode", "decode", "decode", "prefill", "chunk", "empty"])
        q, c = {
            "decode": (1, rng.randint(0, 5 * block_size)),
            "prefill": (rng.randint(2, 60), 0),
            "chunk": (rng.randint(2, 30), rng.randint(1, 3 * block_size)),
            "empty": (0, rng.randint(0, 30)),
        }[kind]
        query_lens.append(q)
        context_lens.append(c)
    if sum(query_lens) == 0:
        query_lens[0] = 1
    return query_lens, context_lens


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_match_the_oracle(paged_batch, seed):
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16, 32])
    query_lens, context_lens = ragged(rng, rng.randint(1, 14), block_size)
    if seed % 2 == 0:  # the engine's order: decodes first, shortest context first
        order = sorted(range(len(query_lens)), key=lambda i: (query_lens[i] != 1, context_lens[i]))
        query_lens, context_lens = [query_lens[i] for i in order], [context_lens[i] for i in order]
    b = paged_batch(seed, query_lens=query_lens, context_lens=context_lens, num_kv_heads=rng.choice([1, 2, 4]),
                    group=rng.choice([1, 2, 4]), head_dim=rng.choice([32, 64]), block_size=block_size,
                    dtype=[torch.float32, torch.float32, torch.float16, torch.bfloat16][seed % 4],
                    index_dtype=rng.choice([torch.int32, torch.int64]), device=torch.device("cpu"))  # fmt: skip
    check(reference.paged_attention(*b.args()), b)


@pytest.mark.parametrize("sort", [True, False])
def test_many_decodes_split_into_buckets(paged_batch, sort):
    rng = random.Random(7)
    context = [rng.randint(1, 300) for _ in range(40)]
    if sort:
        context.sort()
    b = paged_batch(3, query_lens=[1] * 40, context_lens=context, num_kv_heads=2, group=4, head_dim=64,
                    block_size=16, device=torch.device("cpu"))  # fmt: skip
    plan = torch_paged.build_plan(b.block_tables, b.query_lens, b.seq_lens_list, 40, 16, 4, torch.float32, 128)
    assert len(plan.decodes) > 1  # really bucketed
    assert all(isinstance(d.rows, slice) for d in plan.decodes) == sort
    check(torch_run.run_plan(plan, b.query, b.key_cache, b.value_cache, b.scale, torch.empty_like(b.query)), b)


def test_fresh_prefills_can_attend_over_the_new_kv(paged_batch):
    """With ``new_key``/``new_value`` the chunks without a cached prefix never read the pages; the
    engine passes the layer's K/V, which it has just stored there, so the result is the same."""
    b = paged_batch(5, query_lens=[1, 1, 37, 12, 20], context_lens=[40, 9, 0, 30, 0], num_kv_heads=2, group=2,
                    block_size=8, device=torch.device("cpu"))  # fmt: skip
    new_k = torch.empty(b.query.shape[0], 2, b.query.shape[2])
    new_v = torch.empty_like(new_k)
    flat_k = b.key_cache.view(-1, 2, b.query.shape[2])
    flat_v = b.value_cache.view(-1, 2, b.query.shape[2])
    starts = b.query_start_loc.tolist()
    for s, (q, n) in enumerate(zip(b.query_lens, b.seq_lens_list)):
        for i in range(q):  # the new tokens are the last q positions of each sequence
            pos = n - q + i
            slot = int(b.block_tables[s, pos // 8]) * 8 + pos % 8
            new_k[starts[s] + i], new_v[starts[s] + i] = flat_k[slot], flat_v[slot]
    plan = torch_paged.build_plan(b.block_tables, b.query_lens, b.seq_lens_list, 2, 8, 2, torch.float32, 128)
    assert [c.fresh for c in plan.prefills] == [True, False, True]
    pages = b.key_cache.clone(), b.value_cache.clone()
    b.key_cache[:, :, :, :] = float("nan")  # a fresh chunk must not read its pages...
    b.value_cache[:, :, :, :] = float("nan")
    out = torch.zeros_like(b.query)
    fresh_rows = [r for c in plan.prefills if c.fresh for r in range(c.start, c.end)]
    torch_run.run_plan(torch_paged.AttentionPlan([], [c for c in plan.prefills if c.fresh]), b.query,
                         b.key_cache, b.value_cache, b.scale, out, new_k, new_v)  # fmt: skip
    b.key_cache.copy_(pages[0])
    b.value_cache.copy_(pages[1])
    expected = oracle(b)
    torch.testing.assert_close(out[fresh_rows], expected[fresh_rows], atol=1e-5, rtol=1e-5)
    # ...and the whole plan with the new K/V equals the oracle
    full = torch_run.run_plan(plan, b.query, b.key_cache, b.value_cache, b.scale, torch.empty_like(b.query),
                                new_k, new_v)  # fmt: skip
    torch.testing.assert_close(full, expected, atol=1e-5, rtol=1e-5)


def test_long_chunks_fall_back_to_sdpa(paged_batch, monkeypatch):
    monkeypatch.setattr(torch_paged, "MAX_SCORES", 0)
    b = paged_batch(9, query_lens=[1, 33, 17], context_lens=[20, 0, 25], num_kv_heads=2, group=2, block_size=16,
                    device=torch.device("cpu"))  # fmt: skip
    plan = torch_paged.build_plan(b.block_tables, b.query_lens, b.seq_lens_list, 1, 16, 2, torch.float32, 128)
    assert all(c.mask is None for c in plan.prefills)
    check(reference.paged_attention(*b.args()), b)


def _price(lens: list[int], cost: int, ranges) -> int:
    return sum((j - i) * lens[j - 1] + cost for i, j in ranges)


def test_bucket_cut_is_optimal_on_small_inputs():
    rng = random.Random(0)
    for _ in range(200):
        lens = sorted(rng.randint(1, 50) for _ in range(rng.randint(1, 7)))
        cost = rng.randint(0, 40)
        cut = torch_paged._cut_buckets(lens, cost)
        assert cut[0][0] == 0 and cut[-1][1] == len(lens)
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(cut))
        best = min(  # every way to cut len(lens) sorted items into consecutive ranges
            _price(lens, cost, itertools.pairwise((0, *points, len(lens))))
            for k in range(len(lens))
            for points in itertools.combinations(range(1, len(lens)), k)
        )
        assert _price(lens, cost, cut) == best
