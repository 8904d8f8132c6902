"""The pool of KV pages ("blocks") with reference counts and a prefix cache.

Every block is in exactly one of three states:

- **used**: ``ref_cnt > 0``; it sits in the block table of ``ref_cnt`` live requests;
- **free, cached**: ``ref_cnt == 0`` but it still holds the K/V of a full block of tokens and is
  findable by its ``block_hash``; it can be revived by a prefix-cache hit, or evicted (least recently
  freed first) when a fresh block is needed;
- **free, empty**: ``ref_cnt == 0`` and nothing worth keeping.

``FreeBlockQueue`` hands out empty blocks first and evicts cached ones in LRU order; every operation is
O(1).

The prefix cache's index (chained hashes, verified hits, KV cache groups, vLLM's hash index) is the
pool's ``PrefixIndex`` (``kvscope.engine.core.prefix_index``); ``BlockHash``, ``KVBlock`` and
``FreeBlockQueue`` are in ``kvscope.engine.core.kv_block`` (re-exported here, where most callers take them).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvscope.engine.core.kv_block import BlockHash, FreeBlockQueue, KVBlock
from kvscope.engine.core.prefix_index import PrefixIndex, hash_block_tokens
from kvscope.telemetry.records import (
    BLOCK_ALLOCATED,
    BLOCK_EVICTED,
    BLOCK_FREED,
    BLOCK_HIT,
    BLOCK_RELEASED,
    BLOCK_WINDOW_FREED,
    BlockEventListener,
)

__all__ = ["BlockHash", "BlockPool", "FreeBlockQueue", "KVBlock"]


class BlockPool(PrefixIndex):
    """Allocation, reference counting and the prefix-cache index over ``num_blocks`` pages.

    Block events ``listener(kind, block_id)`` (kinds and their meaning: ``telemetry.records.
    BLOCK_EVENT_KINDS``) go to every listener in ``listeners``; the engine connects telemetry's page
    map here. With no listener no event is built.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int | tuple[int, int], KVBlock] = {}  # cache_key(group, hash value) -> block
        self.listeners: list[BlockEventListener] = []
        self.hash_fn = hash_block_tokens
        # counters (tokens, like vLLM's prefix_cache_queries / prefix_cache_hits)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # vLLM's rules (SchedulerRules.preempted_hits_apart): a preempted request's lookup when it is admitted
        # again is counted here instead
        self.preempted_hits_apart = False
        self.preempted_prefix_cache_queries = 0
        self.preempted_prefix_cache_hits = 0
        self.num_evictions = 0
        self.num_window_freed_blocks = 0  # cumulative: blocks whose last holder dropped them (window)
        self.used_per_group: dict[int, int] = {}  # KV cache group -> its blocks with ref_cnt > 0
        # vLLM's prefix index (use_hash_index): hashes are trusted, and blocks after the first of a key wait here
        self.hash_index = False
        self.duplicates: dict[int | tuple[int, int], list[KVBlock]] = {}

    # ---- state -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.free_queue.cached)

    def _emit(self, kind: str, block_id: int) -> None:
        for listener in self.listeners:
            listener(kind, block_id)

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, n: int, group: int = 0) -> list[KVBlock]:
        """Take ``n`` free blocks (evicting cached ones if needed) with ``ref_cnt = 1`` for ``group``."""
        free_queue = self.free_queue
        if n > len(free_queue):
            raise RuntimeError(f"asked for {n} blocks but only {len(free_queue)} are free")
        # Per block of every allocation (in a long run each one evicts a cached block): locals, and
        # ``FreeBlockQueue.pop``, the eviction (index entry, contents, epoch, event) and ``_emit`` inlined.
        empty, lru, index, listeners = free_queue.empty, free_queue.cached, self.cached, self.listeners
        duplicates = self.duplicates  # empty unless use_hash_index
        out = []
        for _ in range(n):
            block = empty.pop() if empty else lru.popitem(last=False)[1]
            h = block.block_hash
            if h is not None:  # evict it
                key = h.value if block.group == 0 else (block.group, h.value)  # cache_key
                if duplicates:
                    self._unindex(key, block)
                elif index.get(key) is block:
                    del index[key]
                block.block_hash = None
                block.parent = None
                block.epoch += 1
                self.num_evictions += 1
                for listener in listeners:
                    listener(BLOCK_EVICTED, block.block_id)
            block.ref_cnt = 1
            block.group = group
            out.append(block)
            for listener in listeners:
                listener(BLOCK_ALLOCATED, block.block_id)
        self.used_per_group[group] = self.used_per_group.get(group, 0) + n
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-cache hits (reviving them from the free queue if needed)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                self.used_per_group[block.group] = self.used_per_group.get(block.group, 0) + 1
            block.ref_cnt += 1
            if self.listeners:
                self._emit(BLOCK_HIT, block.block_id)

    def free(self, blocks: Iterable[KVBlock], window: bool = False) -> None:
        """Drop one reference from each block. Pass a sequence's blocks tail first, so that its tail is
        evicted before its prefix (the prefix is the part other requests are likely to share).
        ``window``: the blocks left a sliding window (their last release is a ``"window_freed"``)."""
        # Per block of every finished request: locals, ``FreeBlockQueue.append`` and ``_emit`` inlined.
        empty, cached = self.free_queue.empty, self.free_queue.cached
        used, listeners, kind = self.used_per_group, self.listeners, BLOCK_WINDOW_FREED if window else BLOCK_FREED
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than allocated (ref_cnt 0)")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    empty.append(block)
                else:
                    cached[block.block_id] = block
                used[block.group] -= 1
                if window:
                    self.num_window_freed_blocks += 1
                for listener in listeners:
                    listener(kind, block.block_id)
            else:
                for listener in listeners:
                    listener(BLOCK_RELEASED, block.block_id)

