"""BlockPool: reference counts, LRU eviction, the hash chain and its verification."""

import pytest

from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.prefix_index import ROOT_HASH, hash_block_tokens


def chain(pool: BlockPool, tokens: list[int]):
    return pool.hash_blocks(tokens, [])


def test_allocate_and_free_track_ref_counts():
    pool = BlockPool(8, 4)
    a = pool.allocate(3)
    assert [b.block_id for b in a] == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in a)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (5, 3)
    pool.free(a)
    assert all(b.ref_cnt == 0 for b in a)
    assert pool.num_free_blocks == 8
    with pytest.raises(RuntimeError, match="only 8 are free"):
        pool.allocate(9)


def test_double_free_is_caught():
    pool = BlockPool(2, 4)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([b])
    assert b.ref_cnt == 0 and pool.num_free_blocks == 2  # refused before changing anything


def test_hash_chain_depends_on_prefix_and_tokens():
    pool = BlockPool(8, 2)
    h = chain(pool, [1, 2, 3, 4, 5])  # two full blocks, one partial (not hashed)
    assert len(h) == 2
    assert h[0].value == hash_block_tokens(ROOT_HASH, (1, 2))
    assert h[1].value == hash_block_tokens(h[0].value, (3, 4))
    other = chain(pool, [9, 9, 3, 4])
    assert other[1].token_ids == h[1].token_ids and other[1].value != h[1].value


def _cache_sequence(pool: BlockPool, tokens: list[int]):
    hashes = chain(pool, tokens)
    blocks = pool.allocate(len(hashes))
    parent = None
    for block, h in zip(blocks, hashes):
        pool.cache_block(block, h, parent)
        parent = block
    return blocks, hashes


def test_prefix_hit_revives_cached_free_blocks():
    pool = BlockPool(6, 2)
    blocks, _ = _cache_sequence(pool, [1, 2, 3, 4])
    pool.free(list(reversed(blocks)))
    assert pool.num_cached_free_blocks == 2
    hits = pool.find_cached_prefix(chain(pool, [1, 2, 3, 4, 7, 7]))
    assert hits == blocks
    pool.touch(hits)
    assert [b.ref_cnt for b in hits] == [1, 1] and pool.num_free_blocks == 4
    # a different second block only matches the first
    assert pool.find_cached_prefix(chain(pool, [1, 2, 9, 9])) == blocks[:1]


def test_empty_blocks_go_first_then_lru_eviction_tail_first():
    pool = BlockPool(4, 2)
    a, _ = _cache_sequence(pool, [1, 2, 3, 4])  # blocks 0, 1
    b, _ = _cache_sequence(pool, [5, 6, 7, 8])  # blocks 2, 3
    pool.free(list(reversed(a)))  # freed first: a's tail (1), then a's head (0)
    pool.free(list(reversed(b)))  # then 3, 2
    events = []
    pool.listeners.append(lambda kind, bid: events.append((kind, bid)))
    got = pool.allocate(3)
    assert [blk.block_id for blk in got] == [1, 0, 3]  # least recently freed first, tails before heads
    assert [e for e in events if e[0] == "evicted"] == [("evicted", 1), ("evicted", 0), ("evicted", 3)]
    assert pool.num_evictions == 3
    assert pool.find_cached_prefix(chain(pool, [1, 2, 3, 4])) == []
    assert pool.find_cached_prefix(chain(pool, [5, 6, 7, 8])) == [pool.blocks[2]]  # its head survived


def test_uncached_free_blocks_are_used_before_evicting():
    pool = BlockPool(3, 2)
    cached, _ = _cache_sequence(pool, [1, 2])
    pool.free(cached)
    got = pool.allocate(2)
    assert cached[0] not in got
    assert pool.find_cached_prefix(chain(pool, [1, 2])) == cached


def test_hash_collision_never_serves_wrong_kv():
    pool = BlockPool(8, 2)
    pool.hash_fn = lambda parent, tokens: 42  # every block collides
    blocks, _ = _cache_sequence(pool, [1, 2])
    # same hash, other tokens: verification by tokens refuses it
    assert pool.find_cached_prefix(chain(pool, [3, 4])) == []
    assert pool.find_cached_prefix(chain(pool, [1, 2])) == blocks


def test_stale_child_is_not_served_after_its_parent_is_evicted():
    pool = BlockPool(4, 2)
    blocks, _ = _cache_sequence(pool, [1, 2, 3, 4])
    pool.free(list(reversed(blocks)))
    # evict only the parent (block 0) by taking it out of the LRU queue front
    pool.free_queue.cached.move_to_end(blocks[1].block_id)  # make the parent the LRU block
    pool.allocate(3)  # 2 empty blocks, then the parent is evicted
    assert blocks[0].block_hash is None and blocks[1].block_hash is not None
    # re-cache the same first block elsewhere: the old child must not attach to it
    new_first = pool.allocate(1)[0]
    pool.cache_block(new_first, chain(pool, [1, 2])[0], None)
    assert pool.find_cached_prefix(chain(pool, [1, 2, 3, 4])) == [new_first]


def test_uncache_moves_free_blocks_back_to_empty():
    pool = BlockPool(2, 2)
    blocks, _ = _cache_sequence(pool, [1, 2, 3, 4])
    pool.free(blocks)
    pool.uncache(blocks)
    assert pool.num_cached_free_blocks == 0 and pool.num_free_blocks == 2
    assert pool.find_cached_prefix(chain(pool, [1, 2])) == []


def test_same_tokens_after_another_prefix_are_not_served():
    pool = BlockPool(8, 2)
    pool.hash_fn = lambda parent, tokens: hash(tokens)  # collides whenever the tokens repeat
    _cache_sequence(pool, [5, 5, 1, 2])
    assert pool.find_cached_prefix(chain(pool, [1, 2])) == []  # (1, 2) is cached, but after (5, 5)
    pool2 = BlockPool(8, 2)
    pool2.hash_fn = lambda parent, tokens: 0
    blocks, _ = _cache_sequence(pool2, [1, 2, 1, 2])
    assert blocks[1].block_hash is None  # the index slot was taken by the first block
    assert pool2.find_cached_prefix(chain(pool2, [1, 2, 1, 2])) == blocks[:1]


def test_child_of_an_evicted_and_reused_parent_is_not_served():
    pool = BlockPool(3, 2)
    pool.hash_fn = lambda parent, tokens: hash(tokens)  # the child's hash ignores its parent
    (parent, child), _ = _cache_sequence(pool, [1, 2, 3, 4])
    pool.free([child, parent])  # LRU order: child first, then parent
    pool.free_queue.cached.move_to_end(child.block_id)  # evict the parent first
    reused = pool.allocate(2)  # the empty block, then the parent (evicted)
    assert parent in reused and child.block_hash is not None
    pool.cache_block(parent, chain(pool, [7, 8])[0], None)  # same block object, new contents
    assert pool.find_cached_prefix(chain(pool, [7, 8, 3, 4])) == [parent]


def test_every_reference_change_is_an_event():
    """What telemetry's page map counts references from: hit +1, released -1 (still held), freed -> 0."""
    pool = BlockPool(4, 2)
    events = []
    pool.listeners.append(lambda kind, bid: events.append((kind, bid)))
    blocks, _ = _cache_sequence(pool, [1, 2])
    pool.touch(blocks)  # a second holder
    pool.free(blocks)
    pool.free(blocks)
    assert events == [("allocated", 0), ("cached", 0), ("hit", 0), ("released", 0), ("freed", 0)]
    assert pool.num_cached_free_blocks == 1


def test_groups_have_their_own_prefix_index_and_window_frees_are_reported():
    from kvscope.engine.core.block_pool import BlockPool
    from kvscope.engine.core.prefix_index import cache_key
    from kvscope.telemetry.records import BLOCK_FREED, BLOCK_RELEASED, BLOCK_WINDOW_FREED

    pool = BlockPool(8, 2)
    events = []
    pool.listeners.append(lambda kind, b: events.append((kind, b)))
    hashes = pool.hash_blocks([1, 2, 3, 4], [])
    a0, a1 = pool.allocate(2, group=0)
    b0, b1 = pool.allocate(2, group=1)
    assert pool.used_per_group == {0: 2, 1: 2} and b0.group == 1
    pool.cache_block(a0, hashes[0], None)
    pool.cache_block(b0, hashes[0], None)  # the same tokens in another group: its own entry
    assert pool.cached[cache_key(0, hashes[0].value)] is a0 and pool.cached[(1, hashes[0].value)] is b0
    assert pool.find_cached_prefix(hashes[:1], 1) == [b0] and pool.find_cached_prefix(hashes[:1]) == [a0]
    pool.touch([b0])
    events.clear()
    pool.free([b0, b1], window=True)
    assert events == [(BLOCK_RELEASED, b0.block_id), (BLOCK_WINDOW_FREED, b1.block_id)]
    assert pool.num_window_freed_blocks == 1 and pool.used_per_group[1] == 1
    pool.free([b0])
    assert events[-1] == (BLOCK_FREED, b0.block_id) and pool.num_window_freed_blocks == 1
    assert pool.find_cached_prefix(hashes[:1], 1) == [b0]  # freed but cached: still findable in its group
    pool.free([a1, a0])
    assert pool.num_free_blocks == 8 and pool.used_per_group == {0: 0, 1: 0}


def test_hash_blocks_inline_default_equals_the_hash_function_and_extends_chains():
    import random

    from kvscope.engine.core.block_pool import BlockHash
    from kvscope.engine.core.prefix_index import ROOT_HASH, hash_block_tokens

    rng = random.Random(2)
    tokens = [rng.randrange(0, 1000) for _ in range(70)]
    pool = BlockPool(4, 8)
    full = pool.hash_blocks(tokens, [])
    parent, want = ROOT_HASH, []
    for i in range(0, 64, 8):
        parent = hash_block_tokens(parent, tuple(tokens[i : i + 8]))
        want.append(BlockHash(parent, tuple(tokens[i : i + 8])))
    assert full == want and len(full) == 70 // 8
    part = pool.hash_blocks(tokens, [], 23)  # only the first 23 tokens: 2 full blocks
    assert part == want[:2]
    assert pool.hash_blocks(tokens, part, 40) == want[:5] and part == want[:5]  # extends in place
    pool.hash_fn = lambda p, t: 7  # a custom function is still called
    assert [h.value for h in pool.hash_blocks(tokens, [], 16)] == [7, 7]


def test_cache_chain_caches_in_order_and_stops_where_the_parent_is_not_indexed():
    """``cache_chain`` is ``cache_block`` block after block: a block whose hash a valid block already holds
    stays uncached, so its successors (whose parent is then not findable) do too; returns what got cached."""
    pool = BlockPool(8, 2)
    events = []
    pool.listeners.append(lambda kind, b: events.append((kind, b)))
    _cache_sequence(pool, [1, 2])  # (1, 2) is cached by another sequence
    events.clear()
    hashes = chain(pool, [5, 6, 1, 2, 3, 4])
    blocks = pool.allocate(3)
    events.clear()
    assert pool.cache_chain(blocks, hashes, None) == blocks  # (1, 2) after (5, 6) has its own hash
    assert events == [("cached", b.block_id) for b in blocks] and [b.parent for b in blocks] == [None, *blocks[:2]]
    again = pool.allocate(2)
    events.clear()
    repeat = chain(pool, [5, 6, 1, 2])
    assert pool.cache_chain(again, repeat, None) == []  # a valid block holds each hash: nothing replaced
    assert events == [] and all(b.block_hash is None for b in again)
    pool2 = BlockPool(8, 2)
    pool2.hash_fn = lambda parent, tokens: hash(tokens)  # (1, 2) collides with the first sequence's block
    (held,), _ = _cache_sequence(pool2, [1, 2])
    hashes2 = chain(pool2, [9, 9, 1, 2, 3, 4])
    new = pool2.allocate(3)
    assert pool2.cache_chain(new, hashes2, None) == [new[0]]  # new[1]'s hash is held: it and new[2] stay out
    assert new[1].block_hash is None and new[2].block_hash is None and pool2.cached[hashes2[1].value] is held
    off = BlockPool(4, 2, enable_caching=False)
    assert off.cache_chain(off.allocate(1), hashes2[:1], None) == [] and off.cached == {}

