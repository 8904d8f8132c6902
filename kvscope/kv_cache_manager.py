"""Request-level view of the block pool: block tables, prefix-cache lookups, slot allocation."""

from __future__ import annotations

from .block_pool import BlockPool, KVBlock
from .config import cdiv
from .request import Request


class KVCacheManager:
    """Grows and frees the block tables of requests on top of a ``BlockPool``.

    Full blocks are offered to the prefix cache as soon as they are *scheduled* to be filled, not after
    the forward pass: within one forward pass every layer stores the K/V of all tokens before it
    attends, so a request scheduled later in the same step can already share them. If the forward pass
    fails, ``rollback_step`` forgets those blocks again. ``begin_step`` (the scheduler calls it first
    thing in ``schedule``) starts a step's list of them afresh.
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self._num_offered: dict[str, int] = {}  # request id -> full blocks already offered to the cache
        self.cached_this_step: list[KVBlock] = []  # blocks offered to the cache in the current step

    def begin_step(self) -> None:
        """A new step is being scheduled: the previous one's forward pass succeeded, keep its blocks."""
        self.cached_this_step = []

    def blocks_of(self, request: Request) -> list[KVBlock]:
        blocks = self.pool.blocks
        return [blocks[i] for i in request.block_ids]

    def get_computed_blocks(self, request: Request) -> list[KVBlock]:
        """Cached blocks that match the start of a request that has nothing computed yet.

        At least one token is always left to compute, since the step must produce its logits.
        """
        if not self.pool.enable_caching or request.num_computed_tokens > 0:
            return []
        hashes = self.pool.hash_blocks(request.all_token_ids, request.block_hashes)
        max_hits = (request.num_tokens - 1) // self.block_size
        return self.pool.find_cached_prefix(hashes[:max_hits])

    def can_fit(self, request: Request, num_tokens: int) -> bool:
        """Could the whole pool ever hold ``num_tokens`` tokens of this request?"""
        return cdiv(num_tokens, self.block_size) <= self.pool.num_blocks

    def allocate_slots(
        self, request: Request, num_new_tokens: int, hits: list[KVBlock] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens (after the prefix-cache ``hits``, if any).

        Returns False, changing nothing, when the pool has too few free blocks.
        """
        bs = self.block_size
        hits = hits or []
        num_computed = request.num_computed_tokens + len(hits) * bs
        num_total = num_computed + num_new_tokens
        num_new_blocks = cdiv(num_total, bs) - len(request.block_ids) - len(hits)
        revived = sum(1 for b in hits if b.ref_cnt == 0)  # hits that leave the free queue
        if num_new_blocks > self.pool.num_free_blocks - revived:
            return False
        if request.num_computed_tokens == 0 and self.pool.enable_caching:  # count admissions, not retries
            self.pool.prefix_cache_queries += request.num_tokens
            self.pool.prefix_cache_hits += len(hits) * bs
        if hits:
            self.pool.touch(hits)
            request.block_ids.extend(b.block_id for b in hits)
            self._num_offered[request.request_id] = len(hits)
        if num_new_blocks > 0:
            request.block_ids.extend(b.block_id for b in self.pool.allocate(num_new_blocks))
        if self.pool.enable_caching:  # only tokens the request has: draft tokens never enter the cache
            self._offer_full_blocks(request, min(num_total, request.num_tokens))
        return True

    def _offer_full_blocks(self, request: Request, num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        start = self._num_offered.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self.pool.hash_blocks(request.all_token_ids[:num_tokens], request.block_hashes)
        blocks = self.pool.blocks
        parent = blocks[request.block_ids[start - 1]] if start > 0 else None
        for i in range(start, num_full):
            block = blocks[request.block_ids[i]]
            if block.block_hash is None:
                self.pool.cache_block(block, hashes[i], parent)
                if block.block_hash is not None:
                    self.cached_this_step.append(block)
            parent = block
        self._num_offered[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first (see ``BlockPool.free``)."""
        blocks = self.pool.blocks
        self.pool.free([blocks[i] for i in reversed(request.block_ids)])
        request.block_ids = []
        self._num_offered.pop(request.request_id, None)

    def trim(self, request: Request) -> list[int]:
        """Free the tail blocks that hold none of the request's computed tokens (the slots of rejected
        draft tokens); returns their ids. Blocks offered to the prefix cache are never among them."""
        keep = cdiv(request.num_computed_tokens, self.block_size)
        if len(request.block_ids) <= keep:
            return []
        dropped = request.block_ids[keep:]
        del request.block_ids[keep:]
        blocks = self.pool.blocks
        self.pool.free([blocks[i] for i in reversed(dropped)])
        return dropped

    def rollback_step(self) -> None:
        """The step's forward pass failed: blocks cached for it hold no valid K/V."""
        self.pool.uncache(self.cached_this_step)
        self.cached_this_step = []
