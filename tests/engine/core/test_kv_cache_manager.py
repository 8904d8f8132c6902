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
