"""The block pool's prefix index: chained block hashes, verified lookups, caching and uncaching blocks.

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

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kvscope.engine.core.kv_block import BlockHash, FreeBlockQueue, KVBlock
from kvscope.telemetry.records import BLOCK_CACHED, BLOCK_EVICTED, BlockEventListener

ROOT_HASH = 0x6B7673636F7065  # "kvscope": the parent hash of a sequence's first block


def hash_block_tokens(parent_value: int, token_ids: tuple[int, ...]) -> int:
    """Deterministic across processes: Python hashes ints and tuples of ints without a random salt."""
    return hash((parent_value, token_ids))


def cache_key(group: int, value: int) -> int | tuple[int, int]:
    """The prefix index's key of a hash in a group (the bare hash in group 0)."""
    return value if group == 0 else (group, value)


class PrefixIndex:
    """The prefix-cache side of ``BlockPool`` (a mixin of it): hashing, lookups, caching, uncaching."""

    # What the mixin uses of ``BlockPool``, declared for the type checker (``BlockPool.__init__`` sets each).
    block_size: int
    enable_caching: bool
    blocks: list[KVBlock]
    free_queue: FreeBlockQueue
    cached: dict[int | tuple[int, int], KVBlock]  # cache_key(group, hash value) -> block
    duplicates: dict[int | tuple[int, int], list[KVBlock]]
    hash_index: bool
    hash_fn: Callable[[int, tuple[int, ...]], int]
    listeners: list[BlockEventListener]

    if TYPE_CHECKING:
        def _emit(self, kind: str, block_id: int) -> None: ...

    def use_hash_index(self) -> None:
        """Index blocks as vLLM does (see the module doc): by hash and tokens, several blocks per hash."""
        self.hash_index = True

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
