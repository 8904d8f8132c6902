"""Sliding windows, chunked local attention, logit softcapping, attention sinks and a value head size of
its own: the oracle against transformers' own eager attention, then the torch path and the Triton kernel
(under the interpreter on the CPU) against the oracle, on ragged batches of decodes and prefill chunks."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from transformers import masking_utils
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

from kvscope.kernels import paged_attention as pa
from kvscope.kernels import reference, torch_paged, torch_run

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=4e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=3.2e-2)}  # fmt: skip
CPU = torch.device("cpu")


def oracle(b, **features) -> torch.Tensor:
    return reference.paged_attention_naive(
        b.query.cpu().float(), b.key_cache.cpu().float(), b.value_cache.cpu().float(), b.block_tables.cpu(),
        b.query_start_loc.cpu(), b.seq_lens.cpu(), b.scale, **features,
    ).to(b.query.device)  # fmt: skip


def hf_mask(n: int, window: int | None, chunk: int | None) -> torch.Tensor:
    """transformers' own mask functions on an n x n grid, as an additive [1, 1, n, n] mask."""
    if window:
        fn = masking_utils.sliding_window_causal_mask_function(window)
    elif chunk:
        fn = masking_utils.chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
    else:
        fn = masking_utils.causal_mask_function
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    seen = fn(torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long), q, k)
    return torch.zeros(n, n).masked_fill(~seen, float("-inf"))[None, None]


@pytest.mark.parametrize(
    "features",
    [dict(window=5), dict(chunk=8), dict(softcap=2.0), dict(sinks=True), dict(window=7, sinks=True),
     dict(window=4, softcap=1.5)],
    ids=lambda f: "+".join(f),
)  # fmt: skip
def test_oracle_matches_transformers_eager(paged_batch, features):
    """One dense sequence: the oracle over pages equals Gemma 2's eager attention (softcap) or
    gpt-oss' (sinks) with transformers' own sliding-window / chunked masks."""
    n, hkv, group, d = 29, 2, 2, 16
    b = paged_batch(1, query_lens=[n], context_lens=[0], num_kv_heads=hkv, group=group, head_dim=d,
                    block_size=4, device=CPU)  # fmt: skip
    sinks = torch.randn(hkv * group, generator=torch.Generator().manual_seed(3)) if features.get("sinks") else None
    window, chunk, softcap = features.get("window"), features.get("chunk"), features.get("softcap")
    ours = oracle(b, window=window, chunk=chunk, softcap=softcap, sinks=sinks)

    pages = b.block_tables[0, : -(-n // 4)].long()
    k = b.key_cache[pages].reshape(-1, hkv, d)[:n].transpose(0, 1)[None]  # [1, Hkv, n, D]
    v = b.value_cache[pages].reshape(-1, hkv, d)[:n].transpose(0, 1)[None]
    q = b.query.transpose(0, 1)[None]  # [1, Hq, n, D]
    module = SimpleNamespace(num_key_value_groups=group, training=False, sinks=sinks)
    mask = hf_mask(n, window, chunk)
    if sinks is not None:
        ref, _ = gpt_oss_eager(module, q, k, v, mask, scaling=b.scale)
    else:
        ref, _ = gemma2_eager(module, q, k, v, mask, scaling=b.scale, softcap=softcap)
    torch.testing.assert_close(ours, ref[0], atol=1e-5, rtol=1e-5)


def random_case(seed: int) -> dict:
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    query_lens, context_lens = [], []
    for _ in range(rng.randint(1, 8)):
        q, c = rng.choice([(1, rng.randint(0, 90)), (1, rng.randint(0, 90)), (rng.randint(2, 40), 0),
                           (rng.randint(2, 30), rng.randint(1, 70)), (0, rng.randint(0, 20))])  # fmt: skip
        query_lens.append(q)
        context_lens.append(c)
    if sum(query_lens) == 0:
        query_lens[0] = 1
    if seed % 2 == 0:  # the engine's order: decodes first, shortest context first
        order = sorted(range(len(query_lens)), key=lambda i: (query_lens[i] != 1, context_lens[i]))
        query_lens, context_lens = [query_lens[i] for i in order], [context_lens[i] for i in order]
    kind = seed % 6
    features = dict(
        window=rng.choice([1, 3, 8, 17, 40]) if kind in (0, 3, 5) else None,
        chunk=rng.choice([4, 8, 16, 32]) if kind in (1, 5) else None,
        softcap=rng.choice([0.5, 5.0, 30.0]) if kind in (2, 3) else None,
        sinks=kind in (4, 5) or (kind == 0 and seed % 4 == 0),
    )
    return dict(query_lens=query_lens, context_lens=context_lens, block_size=block_size,
                num_kv_heads=rng.choice([1, 2]), group=rng.choice([1, 2, 4]), head_dim=rng.choice([16, 32]),
                head_dim_v=rng.choice([None, None, 8, 48]), features=features,
                dtype=[torch.float32, torch.float32, torch.float16, torch.bfloat16][seed % 4])  # fmt: skip


def make(paged_batch, seed: int, case: dict, device=CPU):
    case = dict(case)
    features = case.pop("features")
    b = paged_batch(seed, **case, device=device)
    sinks = None
    if features["sinks"]:  # per head, or per token and head (inkling-style) on odd seeds
        gen = torch.Generator().manual_seed(seed)
        num_heads = b.query.shape[1]
        shape = (b.query.shape[0], num_heads) if seed % 2 else (num_heads,)
        sinks = (torch.randn(shape, generator=gen) * 2).to(device)
    return b, {**features, "sinks": sinks}


@pytest.mark.parametrize("seed", range(36))
def test_torch_path_matches_the_oracle(paged_batch, seed):
    b, features = make(paged_batch, seed, random_case(seed))
    out = reference.paged_attention(*b.args(), **features)
    torch.testing.assert_close(out.float(), oracle(b, **features), **TOL[b.query.dtype])


@pytest.mark.parametrize("seed", range(24))
def test_triton_matches_the_oracle(paged_batch, seed):
    b, features = make(paged_batch, seed, random_case(seed))
    out = pa.paged_attention(*b.args(), query_lens=b.query_lens, seq_lens_list=b.seq_lens_list, **features)
    torch.testing.assert_close(out.float(), oracle(b, **features), **TOL[b.query.dtype])


@pytest.mark.parametrize("num_splits", [2, 4])
@pytest.mark.parametrize("features", [dict(window=9, sinks=True), dict(chunk=16, softcap=3.0)], ids=str)
def test_triton_split_kv_with_local_attention_and_sinks(paged_batch, num_splits, features):
    b = paged_batch(11, query_lens=[1, 1, 1, 7], context_lens=[60, 3, 33, 50], num_kv_heads=2, group=2,
                    head_dim=32, block_size=8)  # fmt: skip
    if features.get("sinks"):
        features = {**features, "sinks": torch.randn(4, generator=torch.Generator().manual_seed(1)).to(b.query.device)}
    out = pa._launch(*b.args(), query_lens=b.query_lens, num_splits=num_splits, **features)
    torch.testing.assert_close(out, oracle(b, **features), **TOL[torch.float32])


def test_decodes_read_only_the_pages_of_their_window(paged_batch):
    """A sliding window bounds the pages gathered: a decode at position 300 with a window of 20 and
    pages of 8 reads 4 pages, not 38."""
    b = paged_batch(2, query_lens=[1, 1, 1], context_lens=[299, 150, 10], num_kv_heads=2, group=2, head_dim=16,
                    block_size=8, device=CPU)  # fmt: skip
    plan = torch_paged.build_plan(b.block_tables.long(), b.query_lens, b.seq_lens_list, 3, 8, 2, torch.float32,
                                  window=20)  # fmt: skip
    assert max(d.num_pages for d in plan.decodes) <= 4
    out = torch_run.run_plan(plan, b.query, b.key_cache, b.value_cache, b.scale, torch.empty_like(b.query))
    torch.testing.assert_close(out, oracle(b, window=20), **TOL[torch.float32])


def test_exact_plan_is_required_for_scores_that_sdpa_cannot_compute(paged_batch):
    b = paged_batch(4, query_lens=[1, 5], context_lens=[9, 0], device=CPU)
    plan = torch_paged.build_plan(b.block_tables.long(), b.query_lens, b.seq_lens_list, 1, 16, 1, torch.float32)
    with pytest.raises(ValueError, match="exact=True"):
        torch_run.run_plan(plan, b.query, b.key_cache, b.value_cache, b.scale, torch.empty_like(b.query),
                             softcap=5.0)  # fmt: skip


@pytest.mark.parametrize(
    ("features", "message"),
    [(dict(window=0), "window=0 must be a positive"), (dict(chunk=-4), "chunk=-4 must be a positive"),
     (dict(softcap=float("inf")), "softcap=inf must be a positive"), (dict(sinks="x"), "sinks must be a tensor"),
     (dict(sinks=torch.zeros(3)), r"sinks has shape \(3,\)")],
    ids=["window", "chunk", "softcap", "sinks type", "sinks shape"],
)  # fmt: skip
def test_triton_rejects_bad_options(paged_batch, features, message):
    b = paged_batch(5, query_lens=[2], context_lens=[3], head_dim=16)
    with pytest.raises(ValueError, match=message):
        pa.paged_attention(*b.args(), **features)
