"""The pool of KV pages ("blocks") with reference counts and a prefix cache.

Every block is in exactly one of three states:

- **used**: ``ref_cnt > 0``; it sits in the block table of ``ref_cnt`` live requests;
- **free, cached**: ``ref_cnt == 0`` but it still holds the K/V of a full block of tokens and is
  findable by its ``block_hash``; it can be revived by a prefix-cache hit, or evicted (least recently
  freed first) when a fresh block is needed;
- **free, empty**: ``ref_cnt == 0`` and nothing worth keeping.

``FreeBlockQueue`` hands out empty blocks first and evicts cached ones in LRU order; every operation is
O(1).

Prefix caching (the idea of vLLM's automatic prefix caching): a *full* block of tokens gets a chained
hash ``hash((parent_hash, token_ids))``, so equal hashes mean "same tokens after the same prefix". The
hash only finds a candidate. Before a candidate is served it is *verified*: its stored token ids must
equal the request's, and its parent must be exactly the block matched one position earlier (same
object, same ``epoch``; the epoch changes whenever a block is evicted and reused). By induction the
whole prefix is then equal token for token, so a hash collision can cost a cache miss but can never
serve wrong KV.

KV cache groups (``kvscope.engine.core.kv_groups``): every group has its own block tables and its own prefix index
in this one pool, keyed by ``(group, hash)`` (plain ``hash`` for group 0, as without groups), and a
block remembers the group it was last allocated to (``KVBlock.group``). A sliding group's request drops
blocks that left its window (``free(..., window=True)``, event ``"window_freed"`` when the last
reference goes); they stay cached, findable by a later request's prefix lookup. The verification rule
is unchanged in every group: a hit chain must be indexed and verified from the sequence's first block,
so a sliding group serves a prefix only while the whole chain is still cached, even the blocks outside
the window that it then does not take (see ``KVCacheManager.get_computed_blocks``). This is stricter
than vLLM, which looks up only the blocks inside the window, and keeps the by-induction argument whole:
a block whose parent is unknown is never served.

vLLM's prefix index (``use_hash_index``: the scheduler turns it on under vLLM's rules,
``SchedulerRules.hash_index``): a block is found by its chained hash and its tokens alone, whatever block held its
parent, and a second block filled with the same tokens after the same prefix is cached too (a *duplicate*: it is
freed to the cached part of the queue, and served once the first is evicted). vLLM trusts its hash (sha256) in the
same way; here a parent chain's 64-bit hash collision could go unseen.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvscope.engine.core.kv_block import BlockHash, FreeBlockQueue, KVBlock
from kvscope.telemetry.records import (
    BLOCK_ALLOCATED,
    BLOCK_CACHED,
    BLOCK_EVICTED,
    BLOCK_FREED,
    BLOCK_HIT,
    BLOCK_RELEASED,
    BLOCK_WINDOW_FREED,
    BlockEventListener,
)

ROOT_HASH = 0x6B7673636F7065  # "kvscope": the parent hash of a sequence's first block


def hash_block_tokens(parent_value: int, token_ids: tuple[int, ...]) -> int:
    """Deterministic across processes: Python hashes ints and tuples of ints without a random salt."""
    return hash((parent_value, token_ids))


def cache_key(group: int, value: int) -> int | tuple[int, int]:
    """The prefix index's key of a hash in a group (the bare hash in group 0)."""
    return value if group == 0 else (group, value)


class BlockPool:
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

    def use_hash_index(self) -> None:
        """Index blocks as vLLM does (see the module doc): by hash and tokens, several blocks per hash."""
        self.hash_index = True

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

    # ---- prefix cache ----------------------------------------------------------------------------
    def hash_blocks(self, token_ids: list[int], start: list[BlockHash],
                    num_tokens: int | None = None) -> list[BlockHash]:
        """Extend the chain ``start`` (hashes of the first full blocks) over all full blocks of ``token_ids``
        (of its first ``num_tokens``, if given: no copy of a long sequence to hash its new block)."""
        bs = self.block_size
        chain = start
        parent = chain[-1].value if chain else ROOT_HASH
        n = len(token_ids)
        if num_tokens is not None and num_tokens < n:
            n = num_tokens
        first, end = len(chain) * bs, n // bs * bs
        # Per full block of every prompt: the new tokens made a tuple once (a block is a slice of it),
        # locals, and the default hash without a call.
        tokens_all = tuple(token_ids[first:end])
        hash_fn, append = self.hash_fn, chain.append
        inline = hash_fn is hash_block_tokens
        for i in range(0, end - first, bs):
            tokens = tokens_all[i : i + bs]
            parent = hash((parent, tokens)) if inline else hash_fn(parent, tokens)
            append(BlockHash(parent, tokens))
        return chain

    def find_cached_prefix(self, hashes: list[BlockHash], group: int = 0) -> list[KVBlock]:
        """Longest verified run of ``group``'s cached blocks matching ``hashes`` from the start (see
        module doc)."""
        hits: list[KVBlock] = []
        prev: KVBlock | None = None
        index, verify_parents = self.cached, not self.hash_index
        for h in hashes:
            block = index.get(h.value if group == 0 else (group, h.value))  # cache_key
            if block is None or block.block_hash is None or block.block_hash.token_ids != h.token_ids:
                break
            if verify_parents and (block.parent is not prev or (prev is not None and block.parent_epoch != prev.epoch)):
                break
            hits.append(block)
            prev = block
        return hits

    def cache_block(self, block: KVBlock, block_hash: BlockHash, parent: KVBlock | None) -> None:
        """Make a full, used block findable in its group's index. If a valid block already holds this
        hash, the first one stays in the index and this one stays uncached (it is freed as empty later);
        so does a block whose parent is not findable, since no lookup could ever reach it."""
        self.cache_chain([block], [block_hash], parent)

    def cache_chain(self, blocks: list[KVBlock], hashes: list[BlockHash], parent: KVBlock | None) -> list[KVBlock]:
        """``cache_block(blocks[i], hashes[i], blocks[i - 1])`` for each block in order (``parent``
        before the first; a block already cached is left as it is); returns the blocks that became
        cached. Once per admitted prompt's full blocks: ``cache_block``'s checks written out, in order."""
        if not self.enable_caching:
            return []
        index, listeners, out = self.cached, self.listeners, []
        for block, block_hash in zip(blocks, hashes):
            previous, parent = parent, block
            if block.block_hash is not None:
                continue
            if previous is not None:  # no lookup could reach it unless its parent is indexed (_is_indexed)
                ph, pg = previous.block_hash, previous.group
                if ph is None or (index.get(ph.value if pg == 0 else (pg, ph.value)) is not previous
                                  and not self.hash_index):
                    continue
            key = block_hash.value if block.group == 0 else (block.group, block_hash.value)  # cache_key
            existing = index.get(key)
            if existing is not None:
                if self.hash_index:  # vLLM's: the first block of a hash is served, the others wait their turn
                    self.duplicates.setdefault(key, []).append(block)
                    self._set_cached(block, block_hash, previous)
                    out.append(block)
                    continue
                if self._is_valid(existing):
                    continue
                self.uncache([existing])  # stale: its prefix was evicted
            block.block_hash = block_hash
            block.parent = previous
            block.parent_epoch = previous.epoch if previous is not None else 0
            index[key] = block
            out.append(block)
            for listener in listeners:
                listener(BLOCK_CACHED, block.block_id)
        return out

    def _set_cached(self, block: KVBlock, block_hash: BlockHash, parent: KVBlock | None) -> None:
        """``cache_chain``'s marking of a block as cached, for a duplicate (``use_hash_index``)."""
        block.block_hash = block_hash
        block.parent = parent
        block.parent_epoch = parent.epoch if parent is not None else 0
        if self.listeners:
            self._emit(BLOCK_CACHED, block.block_id)

    def _unindex(self, key: int | tuple[int, int], block: KVBlock) -> None:
        """Take ``block`` out of the prefix index; the oldest duplicate of its hash, if any, is served next."""
        waiting = self.duplicates.get(key)
        if self.cached.get(key) is block:
            if waiting:
                self.cached[key] = waiting.pop(0)
            else:
                del self.cached[key]
        elif waiting and block in waiting:
            waiting.remove(block)
        if waiting is not None and not waiting:
            del self.duplicates[key]

    def _is_indexed(self, block: KVBlock) -> bool:
        h = block.block_hash
        return h is not None and self.cached.get(cache_key(block.group, h.value)) is block

    def _is_valid(self, block: KVBlock) -> bool:
        parent = block.parent
        return parent is None or (self._is_indexed(parent) and block.parent_epoch == parent.epoch)

    def uncache(self, blocks: Iterable[KVBlock]) -> None:
        """Forget cached contents that turned out invalid (a forward pass failed before writing them)."""
        for block in blocks:
            if block.block_hash is not None:
                key = cache_key(block.group, block.block_hash.value)
                if self.duplicates:
                    self._unindex(key, block)
                elif self.cached.get(key) is block:
                    del self.cached[key]
                if block.ref_cnt == 0:  # move it from the cached part of the queue to the empty part
                    self.free_queue.remove(block)
                    block.block_hash = None
                    self.free_queue.append(block)
                block.block_hash = None
                block.parent = None
                block.epoch += 1
                if self.listeners:
                    self._emit(BLOCK_EVICTED, block.block_id)

    def reset_prefix_cache(self) -> None:
        """Drop every cached-but-free block's contents (used blocks keep theirs until freed)."""
        self.uncache([b for b in self.blocks if b.block_hash is not None and b.ref_cnt == 0])
