"""Request-level view of the block pool: block tables, prefix-cache lookups, slot allocation.

One ``KVCacheManager`` serves every KV cache group (``kvscope.engine.core.kv_groups``; one group unless the model
is hybrid): a request has one block table per group, all drawn from the one ``BlockPool``, and every
group's table covers the same token positions. A sliding group drops the blocks that left its window
(``remove_skipped_blocks``, at the start of each ``allocate_slots``, as in vLLM); their entries become
``NULL_BLOCK``.

Prefix caching (lookups at admission, offers of full blocks, their rollback) is the manager's
``PrefixCachingMixin`` (``kvscope.engine.core.prefix_caching``, with ``KVCacheBlocks``, re-exported here).
"""

from __future__ import annotations

from kvscope.engine.config import cdiv
from kvscope.engine.core.block_pool import BlockPool, KVBlock
from kvscope.engine.core.kv_groups import (
    NULL_BLOCK,
    KVCacheConfig,
    max_blocks_held,
    num_skipped_blocks,
    single_group,
)
from kvscope.engine.core.prefix_caching import KVCacheBlocks, PrefixCachingMixin, as_hits
from kvscope.engine.request import Request

__all__ = ["KVCacheBlocks", "KVCacheManager"]


class KVCacheManager(PrefixCachingMixin):
    """Grows and frees the block tables of requests on top of a ``BlockPool``.

    Full blocks are offered to the prefix cache as soon as they are *scheduled* to be filled, not after
    the forward pass: within one forward pass every layer stores the K/V of all tokens before it
    attends, so a request scheduled later in the same step can already share them. If the forward pass
    fails, ``rollback_step`` forgets those blocks again. ``begin_step`` (the scheduler calls it first
    thing in ``schedule``) starts a step's list of them afresh.

    ``max_num_batched_tokens`` (the most tokens one step computes for a request) bounds how many blocks
    a sliding group holds at once, for ``can_fit``.
    """

    def __init__(self, pool: BlockPool, kv_config: KVCacheConfig | None = None,
                 max_num_batched_tokens: int | None = None) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.kv_config = kv_config or single_group(1)
        self.windows = [g.sliding_window for g in self.kv_config.groups]
        self.num_groups = len(self.windows)
        self._one_full_group = self.num_groups == 1 and not self.windows[0]  # allocate_slots's fast path
        self.max_num_batched_tokens = max_num_batched_tokens
        self._num_offered: dict[str, int] = {}  # request id -> full blocks already offered to the cache
        # request id -> per group, the last block offered and its epoch (its next block's parent);
        # None: the chain is broken (a block left the window before it was offered)
        self._parents: dict[str, list[tuple[KVBlock, int] | None]] = {}
        self.cached_this_step: list[KVBlock] = []  # blocks offered to the cache in the current step

    @property
    def one_full_group(self) -> bool:
        """One KV cache group of full attention (every model without sliding windows)."""
        return self._one_full_group

    def slots_ready(self, request: Request, num_new_tokens: int) -> bool:
        """True when ``allocate_slots(request, num_new_tokens)`` would change nothing: a running request
        of a one-group, full-attention model whose table already holds the new slots and none of whose
        blocks became full (most decode steps). False means: call it. The scheduler asks once per running
        request per step: its hot path, written without ``bool()`` or ``min()`` calls."""
        computed, bs = request.num_computed_tokens, self.block_size
        end = computed + num_new_tokens
        if not (computed and self._one_full_group and end <= len(request.block_ids) * bs):
            return False
        num_tokens = len(request.all_token_ids)  # fewer than end where drafts follow
        return (end if end < num_tokens else num_tokens) // bs <= self._num_offered.get(request.request_id, 0)

    def tables(self, request: Request) -> list[list[int]]:
        """The request's block table per group (made on first use)."""
        if len(request.extra_block_ids) != self.num_groups - 1:
            request.extra_block_ids = [[] for _ in range(self.num_groups - 1)]
        return request.block_tables

    def num_blocks_needed(self, num_tokens: int) -> int:
        """The most blocks a request of ``num_tokens`` tokens holds at once, over all groups."""
        step = self.max_num_batched_tokens or num_tokens
        return sum(max_blocks_held(w, num_tokens, self.block_size, step) for w in self.windows)

    def can_fit(self, request: Request, num_tokens: int) -> bool:
        """Could the whole pool ever hold ``num_tokens`` tokens of this request?"""
        if self._one_full_group:  # once per admission: num_blocks_needed's sum of one group's blocks
            return -(-num_tokens // self.block_size) <= self.pool.num_blocks
        return self.num_blocks_needed(num_tokens) <= self.pool.num_blocks

    def remove_skipped_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Give back every sliding group's blocks that no query from ``num_computed_tokens`` on reads
        (``kv_groups.num_skipped_tokens``); their entries become ``NULL_BLOCK``. Null entries are a
        prefix of the table, so this walks back from the boundary over the new ones only, freeing the
        later blocks first (the earliest, most shareable prefix is evicted last)."""
        blocks = self.pool.blocks
        for window, table in zip(self.windows, self.tables(request)):
            if not window:
                continue
            dropped = []
            i = min(num_skipped_blocks(window, num_computed_tokens, self.block_size), len(table)) - 1
            while i >= 0 and table[i] != NULL_BLOCK:
                dropped.append(blocks[table[i]])
                table[i] = NULL_BLOCK
                i -= 1
            if dropped:
                self.pool.free(dropped, window=True)

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hits: KVCacheBlocks | list[KVBlock] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens (after the prefix-cache ``hits``, if any).

        First gives back the blocks that left a sliding window (always safe). Returns False, changing
        nothing else, when the pool has too few free blocks.

        The engine's hottest call (once per running request per step): the path of a running request of a
        one-group, full-attention model (no hits, nothing leaves a window) is written out here, with the
        same outcome as the general ``_allocate``; most decodes need no new block and fill no block, so
        both are checked before any call.
        """
        if hits or not self._one_full_group:  # no hits (None or empty) takes the written-out path
            return self._allocate(request, num_new_tokens, hits)
        table, pool, bs = request.block_ids, self.pool, self.block_size
        computed = request.num_computed_tokens
        num_total = computed + num_new_tokens
        need = -(-num_total // bs) - len(table)
        if need > 0 and need > len(pool.free_queue):  # pool.num_free_blocks, without the property calls
            return False
        if computed == 0 and pool.enable_caching:  # as _allocate counts
            self._count_lookup(request, len(request.all_token_ids), 0)
        if need > 0:
            table.extend([b.block_id for b in pool.allocate(need, 0)])
        if pool.enable_caching:
            num_tokens = len(request.all_token_ids)
            if num_total < num_tokens:
                num_tokens = num_total
            if num_tokens // bs > self._num_offered.get(request.request_id, 0):  # a block became full
                self._offer_full_blocks(request, num_tokens)
        return True

    def can_allocate(self, request: Request, num_new_tokens: int,
                     hits: KVCacheBlocks | list[KVBlock] | None = None) -> bool:
        """Whether the free blocks now hold ``num_new_tokens`` more tokens of ``request`` after ``hits``
        (counting the hits that would leave the free queue), changing nothing: vLLM's admission check of a
        whole sequence (``SchedulerRules.reserve_full_isl``; its ``full_sequence_must_fit``)."""
        hits = as_hits(hits)
        return self._blocks_to_allocate(request, num_new_tokens, hits)[1] <= self.pool.num_free_blocks

    def _blocks_to_allocate(self, request: Request, num_new_tokens: int,
                            hits: KVCacheBlocks) -> tuple[list[int], int]:
        """Per group, the blocks ``num_new_tokens`` more tokens (after ``hits``) add to the request's
        tables; and the free blocks that takes, the hits revived from the free queue included."""
        bs, num_hits = self.block_size, len(hits)
        num_total = request.num_computed_tokens + num_hits * bs + num_new_tokens
        num_new_blocks = [cdiv(num_total, bs) - len(t) - num_hits for t in self.tables(request)]
        revived = sum(1 for group in hits.blocks for b in group if b is not None and b.ref_cnt == 0)
        return num_new_blocks, sum(max(0, n) for n in num_new_blocks) + revived

    def _allocate(self, request: Request, num_new_tokens: int, hits: KVCacheBlocks | list[KVBlock] | None) -> bool:
        """``allocate_slots`` in general: any groups, windows and prefix-cache hits."""
        bs = self.block_size
        hits = as_hits(hits)
        tables = self.tables(request)
        self.remove_skipped_blocks(request, request.num_computed_tokens)
        num_hits = len(hits)
        num_total = request.num_computed_tokens + num_hits * bs + num_new_tokens
        num_new_blocks, needed = self._blocks_to_allocate(request, num_new_tokens, hits)
        hit_blocks = [b for group in hits.blocks for b in group if b is not None]
        if needed > self.pool.num_free_blocks:  # the hits that leave the free queue count too
            return False
        if request.num_computed_tokens == 0 and self.pool.enable_caching:  # count admissions, not retries
            self._count_lookup(request, request.num_tokens, num_hits * bs)
        if num_hits:
            self.pool.touch(hit_blocks)
            for table, group in zip(tables, hits.blocks):
                table.extend(NULL_BLOCK if b is None else b.block_id for b in group)
            self._num_offered[request.request_id] = num_hits
            # the last block of a hit is never a null entry: only those a window skips before it are
            self._parents[request.request_id] = [(b, b.epoch) if (b := g[-1]) is not None else None
                                                 for g in hits.blocks]
        for g, (table, n) in enumerate(zip(tables, num_new_blocks)):
            if n > 0:
                table.extend(b.block_id for b in self.pool.allocate(n, g))
        if self.pool.enable_caching:  # only tokens the request has: draft tokens never enter the cache
            self._offer_full_blocks(request, min(num_total, request.num_tokens))
        return True

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first (see ``BlockPool.free``)."""
        blocks = self.pool.blocks
        for table in (request.block_ids,) if self.num_groups == 1 else self.tables(request):
            self.pool.free([blocks[i] for i in reversed(table) if i != NULL_BLOCK])
        request.block_ids = []
        request.extra_block_ids = [[] for _ in range(self.num_groups - 1)]
        self._num_offered.pop(request.request_id, None)
        self._parents.pop(request.request_id, None)

    def trim(self, request: Request) -> list[int]:
        """Free the tail blocks that hold none of the request's computed tokens (the slots of rejected
        draft tokens) in every group; returns group 0's ids. Blocks offered to the prefix cache are
        never among them, nor are null entries (those hold tokens before the computed ones)."""
        keep = cdiv(request.num_computed_tokens, self.block_size)
        blocks, out = self.pool.blocks, []
        for g, table in enumerate(self.tables(request)):
            if len(table) <= keep:
                continue
            dropped = table[keep:]
            del table[keep:]
            self.pool.free([blocks[i] for i in reversed(dropped)])
            if g == 0:
                out = dropped
        return out

