"""KVCacheManager: the speculative-decoding parts (slots for draft tokens, trimming rejected ones)."""

from __future__ import annotations

from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.request import Request, SamplingParams


def manager(num_blocks: int = 8, block_size: int = 4) -> KVCacheManager:
    return KVCacheManager(BlockPool(num_blocks, block_size, enable_caching=True))


def test_slots_for_draft_tokens_never_offer_drafts_to_the_prefix_cache():
    kv = manager()
    r = Request("r", list(range(10, 17)), SamplingParams())  # 7 tokens
    assert kv.allocate_slots(r, 7)
    r.num_computed_tokens = 6  # decoding: the last token is not computed yet
    # the last token + 5 drafts: positions 6..11, three blocks; only block 0 holds the request's tokens
    assert kv.allocate_slots(r, 1 + 5)
    assert len(r.block_ids) == 3
    cached = [b for b in kv.pool.blocks if b.block_hash is not None]
    assert [b.block_id for b in cached] == [r.block_ids[0]]  # block 1 holds 3 known tokens and a draft


def test_trim_frees_the_blocks_that_hold_only_rejected_drafts():
    kv = manager()
    r = Request("r", list(range(10, 17)), SamplingParams())
    kv.allocate_slots(r, 7)
    r.num_computed_tokens = 6
    kv.allocate_slots(r, 6)  # last token + 5 drafts: blocks 0-2
    free_before = kv.pool.num_free_blocks
    r.num_computed_tokens = 8  # the last token and one draft accepted
    dropped = kv.trim(r)
    assert len(dropped) == 1 and len(r.block_ids) == 2  # positions 0-7: two blocks
    assert kv.pool.num_free_blocks == free_before + 1 and kv.pool.blocks[dropped[0]].ref_cnt == 0
    assert kv.trim(r) == []  # nothing more to give back
    kv.free(r)
    assert kv.pool.num_free_blocks == kv.pool.num_blocks


def _state(kv: KVCacheManager, r: Request) -> tuple:
    pool = kv.pool
    return (list(r.block_ids), dict(kv.num_offered), pool.num_free_blocks, pool.prefix_cache_queries,
            pool.num_evictions, [(b.ref_cnt, b.block_hash, b.epoch) for b in pool.blocks])


def test_slots_ready_only_where_allocate_slots_changes_nothing():
    """The scheduler skips ``allocate_slots`` where ``slots_ready`` says so: then the call would have been a no-op.
    Checked along prefills and decodes (with and without drafts) across block boundaries."""
    import random

    rng = random.Random(5)
    kv = manager(num_blocks=64, block_size=4)
    events = []
    kv.pool.listeners.append(lambda kind, b: events.append(kind))
    r = Request("r", [rng.randrange(50) for _ in range(9)], SamplingParams())
    assert not kv.slots_ready(r, 9)  # an admission: counted as a prefix-cache query
    ready = 0
    for _ in range(40):
        drafts = rng.choice([0, 0, 2])
        n = r.num_tokens - r.num_computed_tokens + drafts
        if kv.slots_ready(r, n):
            ready += 1
            before, events[:] = _state(kv, r), []
            assert kv.allocate_slots(r, n) and _state(kv, r) == before and events == []
        else:
            assert kv.allocate_slots(r, n)
        r.num_computed_tokens = r.num_tokens
        r.append_token(rng.randrange(50))
    assert 0 < ready < 40  # most decodes need nothing; block boundaries do
    kv.free(r)


def test_slots_ready_is_never_claimed_for_windows_or_several_groups():
    from kvscope.engine.core.kv_groups import single_group

    kv = KVCacheManager(BlockPool(16, 4), single_group(2, sliding_window=8))
    r = Request("r", list(range(6)), SamplingParams())
    kv.allocate_slots(r, 6)
    r.num_computed_tokens = 5
    assert not kv.one_full_group and not kv.slots_ready(r, 1)
