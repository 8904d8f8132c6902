"""The block pool's plain parts: BlockHash (hashable, compared by value) and FreeBlockQueue's order."""

from kvscope.engine.core.kv_block import BlockHash, FreeBlockQueue, KVBlock


def test_block_hash_is_hashable_and_compares_by_value():
    a, b = BlockHash(3, (1, 2)), BlockHash(3, (1, 2))
    assert a == b and hash(a) == hash(b) and a != BlockHash(4, (1, 2))
    assert len({a, b, BlockHash(4, (1, 2)), BlockHash(3, (1, 3))}) == 3


def test_free_queue_hands_out_empty_blocks_first_then_the_least_recently_freed_cached_one():
    blocks = [KVBlock(i) for i in range(4)]
    queue = FreeBlockQueue(blocks)
    taken = [queue.pop() for _ in range(4)]
    assert [b.block_id for b in taken] == [0, 1, 2, 3] and len(queue) == 0
    for i in (2, 0, 3):
        taken[i].block_hash = BlockHash(i, (i,))
    for i in (2, 1, 0, 3):  # freed in this order; block 1 is empty
        queue.append(taken[i])
    queue.remove(taken[0])  # a prefix-cache hit revives it
    assert len(queue) == 3 and [queue.pop().block_id for _ in range(3)] == [1, 2, 3]
