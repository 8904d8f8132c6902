"""What one engine's prefix cache holds, rebuilt from its KV events: a forest of block hashes.

A ``BlockStored`` event names full blocks in order, the first one's parent given: each block's parent is
the block before it in its sequence, so the cached blocks form a prefix tree (a root is the first block
of a prompt; a block with many continuations below it is a shared prefix). ``BlockRemoved`` takes blocks
out when vLLM evicts them (reuses their memory): a block a request merely freed stays cached, and stays
here. Nothing in the events names a request or a block id, so this is the cache's content, not which
request holds what (occupancy and fragmentation are not knowable from outside).

``layout`` draws the tree as an icicle: one row per cached chain (a leaf), one column per block position,
a shared block spanning the rows of every chain below it.

Bounded for a watch of weeks (``limits.py``): at most ``MAX_RESIDENT`` cached blocks (past it the block
stored longest ago is forgotten, counted in ``num_forgotten``: a server that never says what it evicted
cannot grow the watcher without end), and the hashes seen before are remembered for the last
``MAX_REMEMBERED`` of them only, so ``num_distinct`` (distinct hashes ever stored) is exact until then and
afterwards counts a hash stored again after that many others as new. The cycle guard walks at most
``MAX_GUARD_STEPS`` blocks up a chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from kvscope.watched.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvscope.watched.limits import MAX_GUARD_STEPS, MAX_MEDIA, MAX_RESIDENT, Remembered

_MEDIA: dict[frozenset[str], frozenset[str]] = {}


def _media(media: frozenset[str]) -> frozenset[str]:
    """One shared object per set of media (a block's own set would cost 200 bytes a block)."""
    return _MEDIA.setdefault(media, media) if len(_MEDIA) < 64 else media


@dataclass(slots=True)
class CachedBlock:
    parent: str | None
    depth: int  # blocks before it in its sequence, as far as the events showed (0: a prompt's first block)
    stored_ns: int  # when it was last stored
    times_stored: int = 1  # > 1: stored again after an eviction (recomputed)
    media: frozenset[str] = frozenset()  # shared: one object per set of media (``_media``)


@dataclass(slots=True)
class IntervalCounts:
    stored: int = 0  # blocks stored (cached) since the last ``take_interval``
    removed: int = 0  # blocks evicted
    cleared: int = 0  # blocks dropped by AllBlocksCleared


class Residency:
    """The cached blocks of one engine. ``apply`` events in order; ``take_interval`` reads and resets
    the per-interval counts; ``num_distinct`` is how many different hashes were ever stored."""

    def __init__(self) -> None:
        self.blocks: dict[str, CachedBlock] = {}  # insertion order: stored longest ago first
        self.children: dict[str, str | set[str]] = {}  # parent -> its one child, or a set of several
        self.seen = Remembered()  # the hashes stored before (the last MAX_REMEMBERED) -> depth
        self.num_forgotten = 0  # cached blocks forgotten to stay within MAX_RESIDENT
        self.block_size: int | None = None
        self.num_stored = 0  # block stores, in total
        self.num_removed = 0  # evictions of blocks this watcher had seen stored
        self.num_removed_unseen = 0  # evictions of blocks stored before the watch began (or in a gap)
        self.num_restored = 0  # stores of a hash stored before (recomputed after an eviction)
        self.num_cleared = 0
        self.version = 0  # changes with every change of what is cached (derived views are cached on it)
        self._interval = IntervalCounts()
        self._chains_below: tuple[int, dict[str, int]] = (-1, {})
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
            kids = self.children.get(parent)
            if kids is None or kids == key:
                self.children[parent] = key
            elif isinstance(kids, str):
                self.children[parent] = {kids, key}
            else:
                kids.add(key)

    def _below(self, key: str, ancestor: str) -> bool:
        """Whether ``ancestor`` is on the cached path from ``key`` up to its root, as far as
        ``MAX_GUARD_STEPS`` blocks up (beyond: taken as not, so a guard never walks a whole long chain;
        a cycle it misses only hides its blocks from the tree, whose walks start at roots)."""
        for _ in range(MAX_GUARD_STEPS):
            block = self.blocks.get(key)
            if block is None or block.parent is None:
                return False
            key = block.parent
            if key == ancestor:
                return True
        return False

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

    def _unlink(self, key: str, block: CachedBlock) -> None:
        if block.parent is not None:
            kids = self.children.get(block.parent)
            if kids == key:
                del self.children[block.parent]
            elif isinstance(kids, set):
                kids.discard(key)
                if len(kids) == 1:
                    self.children[block.parent] = kids.pop()

    def clear(self) -> None:
        """Forget what is cached (the server restarted: its cache is empty); what was ever stored stays."""
        self.version += 1
        self.blocks.clear()
        self.children.clear()
        self.by_medium.clear()

    def take_interval(self) -> IntervalCounts:
        counts, self._interval = self._interval, IntervalCounts()
        return counts

    # ---- the tree ----------------------------------------------------------------------------------------
    def roots(self) -> list[str]:
        """Cached blocks whose parent is not cached (a prompt's first block, or one whose prefix was evicted)."""
        return [k for k, b in self.blocks.items() if b.parent is None or b.parent not in self.blocks]

    def _kids(self, key: str) -> list[str]:
        kids = self.children.get(key, ())
        return ([kids] if kids in self.blocks else []) if isinstance(kids, str) else [c for c in kids if c in self.blocks]

    def leaves_below(self) -> dict[str, int]:
        """block -> number of cached chains through it (1 for a block no other chain shares); computed once
        per ``version`` (treat the result as read-only)."""
        if self._chains_below[0] == self.version:
            return self._chains_below[1]
        counts: dict[str, int] = {}
        for root in self.roots():
            order, stack = [], [root]
            while stack:  # iterative DFS: chains can be thousands of blocks long
                key = stack.pop()
                order.append(key)
                stack.extend(self._kids(key))
            for key in reversed(order):
                kids = self._kids(key)
                counts[key] = sum(counts[c] for c in kids) if kids else 1
        self._chains_below = (self.version, counts)
        return counts

    def chains(self) -> list[list[str]]:
        """Every cached chain, root to leaf."""
        out = []
        for root in self.roots():
            stack = [(root, [root])]
            while stack:
                key, path = stack.pop()
                kids = sorted(self._kids(key))
                if not kids:
                    out.append(path)
                for kid in kids:
                    stack.append((kid, [*path, kid]))
        return out

    def hot(self, n: int = 5) -> list[tuple[str, int, int]]:
        """The ``n`` most shared cached blocks: (hash, chains through it, depth), most shared first
        (ties: nearer the root first)."""
        below = self.leaves_below()
        shared = [(k, c, self.blocks[k].depth) for k, c in below.items() if c > 1]
        shared.sort(key=lambda x: (-x[1], x[2], x[0]))
        return shared[:n]

    def layout(self, max_rows: int = 400) -> dict[str, list]:
        """The icicle of the cached tree: per block ``x0, x1`` (position in its sequence), ``y0, y1``
        (the rows of the chains through it), ``chains`` (how many), ``key``, ``stored_ns`` and ``restored``.
        At most ``max_rows`` chains: the trees with the most chains first."""
        below = self.leaves_below()
        cols: dict[str, list] = {k: [] for k in ("x0", "x1", "y0", "y1", "chains", "key", "stored_ns", "restored")}
        roots = sorted(self.roots(), key=lambda k: (-below.get(k, 1), self.blocks[k].depth, k))
        row = 0
        for root in roots:
            if row >= max_rows:
                break
            stack = [(root, row)]
            while stack:
                key, y = stack.pop()
                block = self.blocks[key]
                n = below.get(key, 1)
                cols["x0"].append(block.depth)
                cols["x1"].append(block.depth + 1)
                cols["y0"].append(y)
                cols["y1"].append(y + n)
                cols["chains"].append(n)
                cols["key"].append(key)
                cols["stored_ns"].append(block.stored_ns)
                cols["restored"].append(block.times_stored > 1)
                offset = y
                for kid in sorted(self._kids(key), key=lambda c: (-below.get(c, 1), c)):
                    stack.append((kid, offset))
                    offset += below.get(kid, 1)
            row += below.get(root, 1)
        return cols

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

    def tree(self, hot: int = 5, max_rows: int | None = None) -> dict:
        """What the tree's shape says: cached chains, shared blocks, the ``hot`` most shared, and (with
        ``max_rows``) the icicle ``layout``. Walks every cached block."""
        below = self.leaves_below()
        out = {"kv_chains": sum(1 for k in self.blocks if not self._kids(k)),
               "kv_shared_blocks": sum(1 for c in below.values() if c > 1), "hot": [list(h) for h in self.hot(hot)]}
        if max_rows is not None:
            out["layout"] = self.layout(max_rows)
        return out

    def summary(self) -> dict:
        """Counts and shape for ``Run.summary`` and the files (JSON values)."""
        return {**self.counts(), **self.tree()}
