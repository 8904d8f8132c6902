"""KV cache groups (kvscope/engine/core/kv_groups.py): the grouping, the window boundary, and the manager's freeing."""

import pytest

from kvscope.engine.config import LayerSpec
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.kv_groups import (
    NULL_BLOCK,
    max_blocks_held,
    num_skipped_blocks,
    num_skipped_tokens,
    plan_kv_cache_groups,
    single_group,
)
from kvscope.engine.request import Request, SamplingParams

FULL = LayerSpec(4, 2, 16)


def sliding(window: int, head_dim: int = 16) -> LayerSpec:
    return LayerSpec(4, 2, head_dim, sliding_window=window)


# ---- the boundary --------------------------------------------------------------------------------
def test_boundary_first_query_decides():
    # a query at p sees keys p-W+1..p; the next query is at num_computed: keys before num_computed-W+1 go
    assert num_skipped_tokens(16, 15) == 0  # the query at 15 sees 0..15
    assert num_skipped_tokens(16, 16) == 1  # the query at 16 sees 1..16: key 0 is never read again
    assert num_skipped_tokens(None, 1000) == 0
    bs = 4
    assert num_skipped_blocks(16, 18, bs) == 0  # query 18 sees 3..18: block 0 still has key 3
    assert num_skipped_blocks(16, 19, bs) == 1  # query 19 sees 4..19: block 0 (0..3) is out
    assert num_skipped_blocks(16, 22, bs) == 1  # query 22 sees 7..22: block 1 still has key 7
    assert num_skipped_blocks(16, 23, bs) == 2
    assert num_skipped_blocks(1, 8, bs) == 2  # a window of one: only the query itself


def test_max_blocks_held_bounds_a_sliding_group():
    assert max_blocks_held(None, 120, 4, 64) == 30
    assert max_blocks_held(16, 120, 4, 64) == 21  # keys 15 back + 64 new, one block of misalignment
    assert max_blocks_held(16, 8, 4, 64) == 2  # never more than the request's own length


# ---- the grouping --------------------------------------------------------------------------------
def test_no_window_is_one_group_each_layer_its_own_slot():
    cfg = plan_kv_cache_groups((FULL,) * 3)
    assert cfg.num_groups == 1 and cfg.groups[0].sliding_window is None and not cfg.frees_blocks
    assert cfg.layer_slot == (0, 1, 2) and cfg.num_slots == 3 and cfg.fallback_reason is None


def test_one_window_everywhere_is_one_group_that_frees():
    cfg = plan_kv_cache_groups((sliding(8),) * 4)
    assert cfg.num_groups == 1 and cfg.groups[0].sliding_window == 8 and cfg.frees_blocks
    assert cfg.num_slots == 4


def test_hybrid_groups_share_slots_and_pad_honestly():
    # gemma-3 style: 5 sliding to 1 full, 7 sliding + 2 full -> S = 2; sliding split 2+2+2+1
    layers = (sliding(8),) * 5 + (FULL,) + (sliding(8),) * 2 + (FULL,)
    cfg = plan_kv_cache_groups(layers)
    assert cfg.num_slots == 2
    assert [len(g.layer_ids) for g in cfg.groups] == [2, 2, 2, 1, 2]
    assert [g.sliding_window for g in cfg.groups] == [8, 8, 8, 8, None]
    assert cfg.groups[3].layer_ids == (7,) and cfg.groups[4].layer_ids == (5, 8)
    assert cfg.num_padded_slots == 1
    assert cfg.layer_group[5] == 4 and cfg.layer_slot[5] == 0 and cfg.layer_slot[8] == 1
    # every layer of a group uses a distinct slot; slot j of each group is its j-th layer
    for g in cfg.groups:
        assert [cfg.layer_slot[i] for i in g.layer_ids] == list(range(len(g.layer_ids)))
    assert cfg.describe()["num_padded_slots"] == 1


def test_page_shapes_that_differ_fall_back_with_a_reason():
    cfg = plan_kv_cache_groups((sliding(8, head_dim=16), LayerSpec(4, 2, 32)))
    assert cfg.num_groups == 1 and cfg.groups[0].sliding_window is None and not cfg.frees_blocks
    assert "page shapes" in cfg.fallback_reason
    assert cfg.describe()["fallback_reason"] == cfg.fallback_reason


# ---- the manager ---------------------------------------------------------------------------------
def request(n: int, rid: str = "r", first: int = 100) -> Request:
    return Request(rid, list(range(first, first + n)), SamplingParams(max_tokens=64, ignore_eos=True))


def windowed(num_blocks: int = 32, window: int = 8, bs: int = 4, caching: bool = True) -> KVCacheManager:
    cfg = single_group(1, window)
    return KVCacheManager(BlockPool(num_blocks, bs, caching), cfg, max_num_batched_tokens=64)


def test_blocks_outside_the_window_are_freed_at_the_next_allocation():
    kv = windowed()
    r = request(20)
    assert kv.allocate_slots(r, 20)
    r.num_computed_tokens = 20
    assert kv.pool.num_used_blocks == 5
    assert kv.allocate_slots(r, 1)  # query 20 sees 13..20: blocks 0-2 (0..11) go
    assert r.block_ids[:3] == [NULL_BLOCK] * 3 and NULL_BLOCK not in r.block_ids[3:]
    assert kv.pool.num_used_blocks == 3  # blocks 3, 4 and the new one
    assert kv.pool.num_window_freed_blocks == 3
    assert kv.pool.num_cached_free_blocks == 3  # full blocks: they stay findable
    kv.free(r)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks


def test_chunked_prefill_frees_by_the_next_chunk_first_token():
    kv = windowed()
    r = request(40)
    for start in range(0, 40, 8):
        assert kv.allocate_slots(r, 8)
        skipped = num_skipped_blocks(8, start, 4)
        assert r.block_ids.count(NULL_BLOCK) == skipped
        r.num_computed_tokens = start + 8
    kv.free(r)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks


def test_drafts_do_not_move_the_boundary_and_trim_keeps_the_window():
    kv = windowed()
    r = request(21)
    kv.allocate_slots(r, 21)
    r.num_computed_tokens = 20  # 21 tokens known, the last one is decoded with 5 drafts
    assert kv.allocate_slots(r, 1 + 5)
    assert r.block_ids.count(NULL_BLOCK) == num_skipped_blocks(8, 20, 4)  # from computed, not drafts
    r.num_computed_tokens = 22  # one draft accepted
    dropped = kv.trim(r)
    assert len(r.block_ids) == 6 and len(dropped) == 1
    kv.free(r)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks


def test_prefix_hit_in_a_sliding_group_takes_only_the_window():
    kv = windowed(window=8)
    a = request(33, "a")
    kv.allocate_slots(a, 33)
    a.num_computed_tokens = 33
    kv.allocate_slots(a, 1)  # frees its early blocks, cached
    kv.free(a)
    b = request(33, "b")
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 8  # 32 tokens: all eight full blocks of the prompt verify
    # a query at 32 sees 25..32: blocks 0-5 are not needed
    assert hits.blocks[0][:6] == [None] * 6 and all(x is not None for x in hits.blocks[0][6:])
    assert kv.allocate_slots(b, 1, hits)
    assert b.block_ids[:6] == [NULL_BLOCK] * 6 and kv.pool.num_used_blocks == 3
    kv.free(b)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks


def test_hybrid_hit_is_the_shortest_chain_of_any_group():
    cfg = plan_kv_cache_groups((sliding(8), FULL))
    kv = KVCacheManager(BlockPool(64, 4), cfg, 64)
    a = request(33, "a")
    kv.allocate_slots(a, 33)
    a.num_computed_tokens = 33
    kv.free(a)
    full_group = cfg.layer_group[1]
    # evict the full group's 5th block: its chain now stops at 4, so the hit does too
    victim = next(kv.pool.cached[k] for k in list(kv.pool.cached)
                  if kv.pool.cached[k].group == full_group and kv.pool.cached[k].block_hash.token_ids[0] == 116)
    kv.pool.uncache([victim])
    b = request(33, "b")
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 4
    assert all(x is not None for x in hits.blocks[full_group])
    assert hits.blocks[1 - full_group][:2] == [None, None]  # query at 16 sees 9..16: blocks 0, 1 out
    assert kv.allocate_slots(b, 17, hits)
    assert all(len(t) == 9 for t in b.block_tables)
    kv.free(b)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks


def test_can_fit_counts_the_window():
    kv = windowed(num_blocks=24, window=16)
    assert kv.can_fit(request(1), 120)  # 30 blocks of tokens, 21 held at once at most
    full = KVCacheManager(BlockPool(24, 4))
    assert not full.can_fit(request(1), 120)


@pytest.mark.parametrize("window", [None, 8])
def test_tables_hold_only_held_blocks(window):
    kv = windowed(window=window) if window else KVCacheManager(BlockPool(32, 4))
    r = request(20)
    kv.allocate_slots(r, 20)
    r.num_computed_tokens = 20
    kv.allocate_slots(r, 1)
    held = [b for table in kv.tables(r) for b in table if b != NULL_BLOCK]  # every group's, nulls left out
    assert len(held) == kv.pool.num_used_blocks


# ---- through the engine, against transformers ----------------------------------------------------
WINDOWED = {  # tiny random models of kvscope.models.zoo (windows of 16): groups, a pool that preempts
    "ministral": (1, 25),  # sliding layers only: one group that frees (a request needs 21 at most)
    "gemma3_text": (6, 136),  # five sliding layers to one full: S = 1, six groups (135)
    "gpt_oss": (2, 55),  # sliding + full layers with sinks (51)
}
SCENARIOS = {
    "batched": dict(num_blocks=256, max_num_batched_tokens=2048),
    "chunked": dict(num_blocks=256, max_num_batched_tokens=12),
    "preempt": dict(max_num_batched_tokens=64),  # num_blocks: just above what one request needs
    "ngram": dict(num_blocks=256, max_num_batched_tokens=64,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
}
PROMPTS = None


def prompts():
    global PROMPTS
    if PROMPTS is None:
        from helpers import random_prompts

        PROMPTS = random_prompts(6, 60, 90, seed=3, shared_prefix=48, num_shared=3)  # ~120 tokens each
    return PROMPTS


@pytest.fixture(scope="module", params=list(WINDOWED))
def windowed_refs(request):
    from models.test_loader import own_greedy

    from kvscope.models.zoo import tiny_model

    model = tiny_model(request.param)
    return request.param, model, [own_greedy(model, p, 30) for p in prompts()]


def run_tracking_peak(engine, ps, n):
    """Generate, and the most blocks the pool had in use at any moment (a pool listener)."""
    peak = [0]
    engine.pool.listeners.append(lambda kind, block: peak.__setitem__(0, max(peak[0], engine.pool.num_used_blocks)))
    outs = engine.generate(ps, SamplingParams(max_tokens=n, ignore_eos=True))
    return outs, peak[0]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_windowed_models_free_blocks_and_match_transformers(windowed_refs, scenario):
    from kvscope import Engine

    model_type, model, refs = windowed_refs
    kw = dict(SCENARIOS[scenario])
    groups, small_pool = WINDOWED[model_type]
    if scenario == "preempt":
        kw["num_blocks"] = small_pool
    engine = Engine(model, max_model_len=512, block_size=4, **kw)
    assert engine.kv_config.num_groups == groups and engine.kv_config.frees_blocks
    outs, peak = run_tracking_peak(engine, prompts(), 30)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.finish_reason == "length" and out.token_ids == ref, f"{model_type}/{scenario}: prompt {i}"
    assert engine.pool.num_window_freed_blocks > 0
    assert engine.pool.prefix_cache_hits > 0  # the shared prefix was served, window or not
    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # everything came back
    if scenario == "preempt":
        assert engine.scheduler.num_preemptions > 0
    # without freeing, every group of every request would hold a block per 4 tokens of it
    unfreed = groups * sum(-(-(len(p) + 30) // 4) for p in prompts())
    assert peak < unfreed


def test_a_long_request_holds_fewer_blocks_than_its_length_needs(windowed_refs):
    from kvscope import Engine

    _, model, refs = windowed_refs
    engine = Engine(model, max_model_len=512, block_size=4, num_blocks=256, max_num_batched_tokens=16)
    prompt = prompts()[0]
    (out,), peak = run_tracking_peak(engine, [prompt], 30)
    assert out.token_ids == refs[0]
    groups = engine.kv_config.groups
    needs = -(-(len(prompt) + 30) // 4)  # per group, without freeing
    bound = sum(max_blocks_held(g.sliding_window, len(prompt) + 30, 4, 16) for g in groups)
    assert peak <= bound < len(groups) * needs
    stats = engine.scheduler.make_stats()
    assert stats.num_window_freed_blocks == engine.pool.num_window_freed_blocks > 0
    assert stats.blocks_used_per_group == [0] * len(groups)


def test_page_shapes_that_differ_run_as_one_group_and_say_why():
    from kvscope import Engine
    from kvscope.models.zoo import tiny_model

    engine = Engine(tiny_model("gemma4_text"), max_model_len=512, block_size=4, num_blocks=128)
    assert engine.kv_config.num_groups == 1 and not engine.kv_config.frees_blocks
    assert "page shapes" in engine.kv_config.fallback_reason
    assert engine.run_metadata()["kv_cache_groups"]["fallback_reason"] == engine.kv_config.fallback_reason


def test_full_attention_models_keep_one_group_of_their_own_slots():
    from kvscope import Engine
    from kvscope.models.loader import build_tiny_model

    engine = Engine(build_tiny_model("llama"), block_size=4, num_blocks=64)
    cfg = engine.kv_config
    assert cfg.num_groups == 1 and not cfg.frees_blocks and cfg.fallback_reason is None
    assert cfg.layer_slot == tuple(range(len(engine.runner.kv_caches)))
    assert len({id(k) for k, _ in engine.runner.kv_caches}) == len(engine.runner.kv_caches)
    assert engine.run_metadata()["kv_bytes_per_block"] == engine.spec.kv_bytes_per_block(4)


@pytest.mark.parametrize("model_type", ["ministral", "gpt_oss"])
def test_triton_kernels_mask_the_null_entries(model_type):
    """The Triton path (the interpreter on a CPU) reads the same tables: null entries point at block 0
    and are never read (a q-block starts at its first query's window)."""
    from models.test_loader import own_greedy

    from kvscope import Engine
    from kvscope.models.zoo import tiny_model

    model = tiny_model(model_type)
    ps = [p[:40] for p in prompts()[:2]]
    refs = [own_greedy(model, p, 6) for p in ps]
    engine = Engine(model, attention_backend="triton", block_size=4, num_blocks=64, max_num_batched_tokens=16,
                    dtype="float32", max_model_len=512)
    outs = engine.generate(ps, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    assert engine.pool.num_window_freed_blocks > 0
