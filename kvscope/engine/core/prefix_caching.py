"""The KV cache manager's prefix caching: hits at admission, full blocks offered as they are scheduled, rollback.

A mixin of ``KVCacheManager`` (``kvscope.engine.core.kv_cache_manager``). At admission ``get_computed_blocks`` finds
the longest prefix every KV cache group serves (``KVCacheBlocks``) and ``_count_lookup`` counts the lookup; as a
request's blocks become full they are offered to the pool's prefix index (``_offer_full_blocks``) in the step that
schedules them, and ``rollback_step`` forgets a failed step's offers again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvscope.engine.core.block_pool import BlockPool, KVBlock
from kvscope.engine.core.kv_groups import NULL_BLOCK, num_skipped_blocks
from kvscope.engine.request import Request


@dataclass(slots=True)
class KVCacheBlocks:
    """A prefix-cache hit of ``num_blocks`` blocks in every group (vLLM's ``KVCacheBlocks``):
    ``blocks[g][i]`` is group ``g``'s block ``i``, or None where a sliding group does not need it."""

    blocks: Sequence[Sequence[KVBlock | None]]
    num_blocks: int = 0

    def __len__(self) -> int:
        return self.num_blocks


def as_hits(hits: KVCacheBlocks | list[KVBlock] | None) -> KVCacheBlocks:
    """A prefix-cache hit as ``KVCacheBlocks`` (a plain list is group 0's hits: one group)."""
    if isinstance(hits, KVCacheBlocks):
        return hits
    return KVCacheBlocks([list(hits or [])], len(hits or []))


class PrefixCachingMixin:
    """Prefix-cache lookups and offers of ``KVCacheManager`` (see the module doc)."""

    # What the mixin uses of ``KVCacheManager``, declared for the type checker (its ``__init__`` sets each).
    pool: BlockPool
    block_size: int
    windows: list[int | None]
    num_groups: int
    _one_full_group: bool
    _num_offered: dict[str, int]  # request id -> full blocks already offered to the cache
    _parents: dict[str, list[tuple[KVBlock, int] | None]]
    cached_this_step: list[KVBlock]

    if TYPE_CHECKING:
        def tables(self, request: Request) -> list[list[int]]: ...

    @property
    def num_offered(self) -> dict[str, int]:
        """Request id -> how many of its full blocks were offered to the prefix cache (read only)."""
        return self._num_offered

    def begin_step(self) -> None:
        """A new step is being scheduled: the previous one's forward pass succeeded, keep its blocks."""
        self.cached_this_step = []

    def get_computed_blocks(self, request: Request) -> KVCacheBlocks:
        """Cached blocks that match the start of a request that has nothing computed yet.

        At least one token is always left to compute, since the step must produce its logits. The hit
        is the longest ``n`` that every group serves: each group's verified chain (``BlockPool``'s
        rule, from the first block) is prefix-closed, so the shortest chain is the fixed point that
        vLLM's coordinator iterates to. A sliding group then takes only the blocks that a query at
        ``n * block_size`` can read; the earlier ones become null entries.
        """
        if not self.pool.enable_caching or request.num_computed_tokens > 0:
            return KVCacheBlocks([[] for _ in self.windows])
        hashes = self.pool.hash_blocks(request.all_token_ids, request.block_hashes)
        n = (len(request.all_token_ids) - 1) // self.block_size
        if self._one_full_group:  # once per admission: the general case below, for one group
            chain = self.pool.find_cached_prefix(hashes[:n]) if n else []
            return KVCacheBlocks([chain], len(chain))
        chains = []
        for g in range(self.num_groups):
            chains.append(self.pool.find_cached_prefix(hashes[:n], g) if n else [])
            n = min(n, len(chains[-1]))
        if n == 0:
            return KVCacheBlocks([[] for _ in self.windows])
        out: list[list[KVBlock | None]] = []
        for window, chain in zip(self.windows, chains):
            skip = num_skipped_blocks(window, n * self.block_size, self.block_size)
            out.append([None] * skip + list(chain[skip:n]))
        return KVCacheBlocks(out, n)

    def _count_lookup(self, request: Request, queries: int, hits: int) -> None:
        """An admission's prefix-cache lookup, in tokens; a preempted request's apart under vLLM's rules."""
        pool = self.pool
        if request.num_preemptions and pool.preempted_hits_apart:
            pool.preempted_prefix_cache_queries += queries
            pool.preempted_prefix_cache_hits += hits
        else:
            pool.prefix_cache_queries += queries
            pool.prefix_cache_hits += hits

    def _offer_full_blocks(self, request: Request, num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        rid = request.request_id
        start = self._num_offered.get(rid, 0)
        if num_full <= start:
            return
        hashes = self.pool.hash_blocks(request.all_token_ids, request.block_hashes, num_tokens)
        blocks = self.pool.blocks
        parents = self._parents.get(rid) or [None] * self.num_groups
        one = self.num_groups == 1 and not request.extra_block_ids  # tables() without building the list
        for g, table in enumerate((request.block_ids,) if one else self.tables(request)):
            last = parents[g] if start > 0 else (None, 0)  # the last block offered and its epoch then
            if last is None or (last[0] is not None and last[0].epoch != last[1]):
                parents[g] = None  # no known parent (a block left the window, or was reused since):
                continue  # nothing more of this group is findable
            ids = table[start:num_full]
            cut = ids.index(NULL_BLOCK) if NULL_BLOCK in ids else len(ids)  # a block left the window
            chain = [blocks[i] for i in (ids if cut == len(ids) else ids[:cut])]
            self.cached_this_step += self.pool.cache_chain(chain, hashes[start : start + cut], last[0])
            parents[g] = (chain[-1], chain[-1].epoch) if cut == len(ids) else None
        self._parents[rid] = parents
        self._num_offered[rid] = num_full

    def rollback_step(self) -> None:
        """The step's forward pass failed: blocks cached for it hold no valid K/V."""
        self.pool.uncache(self.cached_this_step)
        self.cached_this_step = []

