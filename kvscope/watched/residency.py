"""What one engine's prefix cache holds, rebuilt from its KV events: a forest of block hashes.

A ``BlockStored`` event names full blocks in order, the first one's parent given: each block's parent is
the block before it in its sequence, so the cached blocks form a prefix tree (``block_tree.py`` reads its
shape: chains, shared prefixes, the icicle ``layout``). ``BlockRemoved`` takes blocks out when vLLM evicts
them (reuses their memory): a block a request merely freed stays cached, and stays here. Nothing in the
events names a request or a block id, so this is the cache's content, not which request holds what
(occupancy and fragmentation are not knowable from outside).

Bounded for a watch of weeks (``limits.py``): at most ``MAX_RESIDENT`` cached blocks (past it the block
stored longest ago is forgotten, counted in ``num_forgotten``: a server that never says what it evicted
cannot grow the watcher without end), and the hashes seen before are remembered for the last
``MAX_REMEMBERED`` of them only, so ``num_distinct`` (distinct hashes ever stored) is exact until then and
afterwards counts a hash stored again after that many others as new.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from kvscope.watched.block_tree import BlockTree, CachedBlock
from kvscope.watched.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvscope.watched.limits import MAX_MEDIA, MAX_RESIDENT, Remembered

_MEDIA: dict[frozenset[str], frozenset[str]] = {}


def _media(media: frozenset[str]) -> frozenset[str]:
    """One shared object per set of media (a block's own set would cost 200 bytes a block)."""
    return _MEDIA.setdefault(media, media) if len(_MEDIA) < 64 else media


@dataclass(slots=True)
class IntervalCounts:
    stored: int = 0  # blocks stored (cached) since the last ``take_interval``
    removed: int = 0  # blocks evicted
    cleared: int = 0  # blocks dropped by AllBlocksCleared


class Residency(BlockTree):
    """The cached blocks of one engine. ``apply`` events in order; ``take_interval`` reads and resets
    the per-interval counts; ``num_distinct`` is how many different hashes were ever stored."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = Remembered()  # the hashes stored before (the last MAX_REMEMBERED) -> depth
        self.num_forgotten = 0  # cached blocks forgotten to stay within MAX_RESIDENT
        self.block_size: int | None = None
        self.num_stored = 0  # block stores, in total
        self.num_removed = 0  # evictions of blocks this watcher had seen stored
        self.num_removed_unseen = 0  # evictions of blocks stored before the watch began (or in a gap)
        self.num_restored = 0  # stores of a hash stored before (recomputed after an eviction)
        self.num_cleared = 0
        self._interval = IntervalCounts()
        self.by_medium: dict[str, int] = {}  # cached blocks per medium (a block in two media counts in both)

    def _count_media(self, media: Iterable[str], delta: int) -> None:  # MAX_MEDIA by name, then "other"
        for medium in media if delta else ():
            key = medium if medium in self.by_medium or len(self.by_medium) < MAX_MEDIA else "other"
            self.by_medium[key] = self.by_medium.get(key, 0) + delta

    @property
    def num_distinct(self) -> int:
        return self.seen.num_distinct

    @property
    def num_resident(self) -> int:
        return len(self.blocks)

    def apply(self, event: KVEvent, t_ns: int) -> None:
        self.version += 1
        if isinstance(event, BlockStored):
            self.block_size = event.block_size
            parent = event.parent_block_hash
            for key in event.block_hashes:
                self._store(key, parent, event.medium, t_ns)
                parent = key
        elif isinstance(event, BlockRemoved):
            for key in event.block_hashes:
                self._remove(key, event.medium)
        elif isinstance(event, AllBlocksCleared):
            n = len(self.blocks)
            self.num_cleared += n
            self._interval.cleared += n
            self.clear()

    def apply_all(self, events: Iterable[KVEvent], t_ns: int) -> None:
        for event in events:
            self.apply(event, t_ns)

    def _store(self, key: str, parent: str | None, medium: str, t_ns: int) -> None:
        self.num_stored += 1
        self._interval.stored += 1
        block = self.blocks.get(key)
        if block is not None:  # already cached (another medium, or stored twice)
            self._count_media((medium,), medium not in block.media)
            block.media = _media(block.media | {medium})
            block.times_stored += 1
            block.stored_ns = t_ns
            return
        if parent is not None and (parent == key or (self._kids(key) and self._below(parent, key))):
            parent = None  # damaged events would make a cycle (a block its own ancestor): start a new tree
        parent_depth = self.seen.get(parent) if parent is not None else None
        depth = parent_depth + 1 if parent_depth is not None else 0
        before = self.seen.note(key, depth)
        self.num_restored += before
        if len(self.blocks) >= MAX_RESIDENT:  # a batch at once: a dict's front is slow to pop one by one
            for old in list(islice(self.blocks, MAX_RESIDENT // 16)):
                self._forget(old)
        self.blocks[key] = CachedBlock(parent, depth, t_ns, 2 if before else 1, _media(frozenset((medium,))))
        self._count_media((medium,), 1)
        if parent is not None:
            self._link(key, parent)

    def _forget(self, key: str) -> None:
        """Drop a cached block to make room (not an eviction the server reported)."""
        self.num_forgotten += 1
        block = self.blocks.pop(key)
        self._count_media(block.media, -1)
        self._unlink(key, block)

    def _remove(self, key: str, medium: str) -> None:
        block = self.blocks.get(key)
        if block is None:
            self.num_removed_unseen += 1
            self._interval.removed += 1
            return
        self._count_media((medium,), -(medium in block.media))
        block.media = _media(block.media - {medium})
        if block.media:  # still cached elsewhere (e.g. offloaded to the CPU)
            return
        del self.blocks[key]
        self.num_removed += 1
        self._interval.removed += 1
        self._unlink(key, block)

    def clear(self) -> None:
        """Forget what is cached (the server restarted: its cache is empty); what was ever stored stays."""
        self.version += 1
        self.blocks.clear()
        self.children.clear()
        self.by_medium.clear()

    def take_interval(self) -> IntervalCounts:
        counts, self._interval = self._interval, IntervalCounts()
        return counts

    def counts(self) -> dict[str, int | None]:
        """The counts (cheap: no walk of the tree)."""
        return {
            "kv_blocks_stored": self.num_distinct,
            "kv_blocks_resident": self.num_resident,
            "kv_block_stores": self.num_stored,
            "kv_blocks_evicted": self.num_removed + self.num_removed_unseen,
            "kv_blocks_restored": self.num_restored,
            "kv_blocks_cleared": self.num_cleared,
            "kv_block_size": self.block_size,  # and cached blocks per the events' medium (GPU, CPU, ...):
            "kv_blocks_by_medium": {m: n for m, n in sorted(self.by_medium.items()) if n > 0},
        }

    def summary(self) -> dict:
        """Counts and shape for ``Run.summary`` and the files (JSON values)."""
        return {**self.counts(), **self.tree()}
