"""The shape of an engine's cached blocks: a forest of block hashes, each block's parent the block before it.

A root is the first block of a prompt (or one whose prefix was evicted); a block with many continuations
below it is a shared prefix. ``BlockTree`` holds the links (``blocks``, ``children``) and reads the shape:
the chains, how many chains go through each block, the most shared blocks and the icicle ``layout`` (one
row per cached chain, a leaf; one column per block position; a shared block spans the rows of every chain
below it). ``residency.Residency`` keeps it up to date from the KV events.

Walks are iterative (chains can be thousands of blocks long); the cycle guard (``_below``) walks at most
``MAX_GUARD_STEPS`` blocks up a chain.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.watched.limits import MAX_GUARD_STEPS

LAYOUT_COLUMNS = ("x0", "x1", "y0", "y1", "chains", "key", "stored_ns", "restored")


@dataclass(slots=True)
class CachedBlock:
    parent: str | None
    depth: int  # blocks before it in its sequence, as far as the events showed (0: a prompt's first block)
    stored_ns: int  # when it was last stored
    times_stored: int = 1  # > 1: stored again after an eviction (recomputed)
    media: frozenset[str] = frozenset()  # shared: one object per set of media (``residency._media``)


class BlockTree:
    """Cached blocks by hash and their links; ``version`` changes with every change (derived views are
    cached on it)."""

    def __init__(self) -> None:
        self.blocks: dict[str, CachedBlock] = {}  # insertion order: stored longest ago first
        self.children: dict[str, str | set[str]] = {}  # parent -> its one child, or a set of several
        self.version = 0
        self._chains_below: tuple[int, dict[str, int]] = (-1, {})

    # ---- links ---------------------------------------------------------------------------------------------
    def _link(self, key: str, parent: str) -> None:
        kids = self.children.get(parent)
        if kids is None or kids == key:
            self.children[parent] = key
        elif isinstance(kids, str):
            self.children[parent] = {kids, key}
        else:
            kids.add(key)

    def _unlink(self, key: str, block: CachedBlock) -> None:
        if block.parent is not None:
            kids = self.children.get(block.parent)
            if kids == key:
                del self.children[block.parent]
            elif isinstance(kids, set):
                kids.discard(key)
                if len(kids) == 1:
                    self.children[block.parent] = kids.pop()

    def _kids(self, key: str) -> list[str]:
        kids = self.children.get(key, ())
        if isinstance(kids, str):
            return [kids] if kids in self.blocks else []
        return [c for c in kids if c in self.blocks]

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

    # ---- shape ---------------------------------------------------------------------------------------------
    def roots(self) -> list[str]:
        """Cached blocks whose parent is not cached (a prompt's first block, or one whose prefix was evicted)."""
        return [k for k, b in self.blocks.items() if b.parent is None or b.parent not in self.blocks]

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
        cols: dict[str, list] = {k: [] for k in LAYOUT_COLUMNS}
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

    def tree(self, hot: int = 5, max_rows: int | None = None) -> dict:
        """What the tree's shape says: cached chains, shared blocks, the ``hot`` most shared, and (with
        ``max_rows``) the icicle ``layout``. Walks every cached block."""
        below = self.leaves_below()
        out = {"kv_chains": sum(1 for k in self.blocks if not self._kids(k)),
               "kv_shared_blocks": sum(1 for c in below.values() if c > 1), "hot": [list(h) for h in self.hot(hot)]}
        if max_rows is not None:
            out["layout"] = self.layout(max_rows)
        return out
