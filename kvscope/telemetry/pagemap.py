"""The page map, kept incrementally: which request owns each KV block and how full it is.

``PageMapTracker`` listens to the block pool's events (allocated, hit, cached, evicted, freed) and, at
the end of each step, looks only at the blocks those events named plus the blocks the step wrote
into (each scheduled request's tail). The cost per step is proportional to what changed, not to the
pool size; only the occasional full snapshot walks every block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .records import FREE_PAGE, PageEntry, StepRecord

if TYPE_CHECKING:
    from ..block_pool import BlockPool
    from ..scheduler import SchedulerOutput


class PageMapTracker:
    """Owner convention: a used block's owner is its longest-standing current holder (the request
    that took it from the free pool, until that one lets go); a cached block keeps its last owner."""

    def __init__(self, pool: BlockPool, snapshot_every: int | None = None) -> None:
        self.pool = pool
        n = pool.num_blocks
        # A full snapshot every N records keeps replay cheap; bigger pools snapshot less often so
        # that snapshots stay a small share of the recorder's memory.
        self.snapshot_every = snapshot_every or max(128, n // 16)
        self.entries: list[PageEntry] = [FREE_PAGE] * n  # the current map
        self.owner: list[str] = [""] * n
        self.holders: dict[int, list[str]] = {}  # block id -> request ids holding it, oldest first
        self.tables: dict[str, list[int]] = {}  # request id -> its block table as attributed so far
        self.dirty: set[int] = set(range(n))
        self.since_snapshot = self.snapshot_every  # the first update is a snapshot
        pool.listeners.append(self.on_block_event)

    def detach(self) -> None:
        if self.on_block_event in self.pool.listeners:
            self.pool.listeners.remove(self.on_block_event)

    def on_block_event(self, kind: str, block_id: int) -> None:
        self.dirty.add(block_id)

    def forget(self, request_id: str) -> None:
        """The request finished or was preempted: it holds none of its blocks any more."""
        for b in self.tables.pop(request_id, ()):
            holders = self.holders.get(b)
            if holders is None:
                continue
            holders.remove(request_id)
            if not holders:
                del self.holders[b]  # the owner stays: a cached block shows whose tokens it holds
            elif self.owner[b] == request_id:
                self.owner[b] = holders[0]
            self.dirty.add(b)

    def update(self, sched: SchedulerOutput) -> tuple[dict[int, PageEntry], bool]:
        """The map's changes for a finished step (or all of it, on a snapshot step)."""
        bs, owner, dirty, all_holders = self.pool.block_size, self.owner, self.dirty, self.holders
        filled: dict[int, int] = {}
        for request, n in zip(sched.requests, sched.num_tokens):
            rid, table = request.request_id, request.block_ids
            if not table:  # finished this step: its blocks were freed (and reported by the pool)
                continue
            computed = request.num_computed_tokens  # already includes this step's tokens
            first_written = (computed - n) // bs
            mine = self.tables.setdefault(rid, [])
            if n == 1 and len(mine) == len(table):  # the common case: a decode into its tail block
                j = (computed - 1) // bs
                b = table[j]
                filled[b] = computed - j * bs
                dirty.add(b)
                continue
            for j in range(len(mine), len(table)):  # blocks that entered its table this step
                b = table[j]
                mine.append(b)
                holders = all_holders.setdefault(b, [])
                holders.append(rid)
                if len(holders) == 1:
                    owner[b] = rid
                dirty.add(b)
                if j < first_written:  # a prefix-cache hit: a full block
                    filled[b] = bs
            for j in range(first_written, min((computed - 1) // bs + 1, len(table))):
                b = table[j]
                filled[b] = min(bs, computed - j * bs)
                dirty.add(b)
        changes: dict[int, PageEntry] = {}
        entries, entry_of = self.entries, self._entry
        for b in dirty:
            entry = entry_of(b, filled.get(b))
            if entry is FREE_PAGE:
                owner[b] = ""
            if entry != entries[b]:
                entries[b] = entry
                changes[b] = entry
        dirty.clear()
        self.since_snapshot += 1
        if self.since_snapshot >= self.snapshot_every:
            self.since_snapshot = 0
            return dict(enumerate(entries)), True
        return changes, False

    def has_changes(self) -> bool:
        """Whether a block touched since the last update would now read differently (no step needed)."""
        return any(self._entry(b, None) != self.entries[b] for b in self.dirty)

    def _entry(self, b: int, filled: int | None) -> PageEntry:
        """Block ``b``'s entry now; ``filled`` if the step wrote into it, else what it held before."""
        block = self.pool.blocks[b]
        refs = block.ref_cnt
        if refs == 0:
            if block.block_hash is None:
                return FREE_PAGE
            return PageEntry(self.owner[b], self.pool.block_size, "cached", 0)
        if filled is None:
            old = self.entries[b]
            filled = old.filled if old.refs else self.pool.block_size
        return PageEntry(self.owner[b], filled, "shared" if refs > 1 else "used", refs)


def page_map_at(records: Sequence[StepRecord], step: int) -> list[PageEntry]:
    """Every block's entry after ``step``: the latest full snapshot at or before it, plus the diffs
    after that snapshot. Raises ``ValueError`` if no snapshot precedes it (it fell out of the ring)."""
    upto = [r for r in records if r.step <= step]
    start = next((i for i in range(len(upto) - 1, -1, -1) if upto[i].page_map_full), None)
    if start is None:
        raise ValueError(f"no full page-map snapshot at or before step {step} in these records")
    snap = upto[start].page_map
    current = [snap.get(b, FREE_PAGE) for b in range(len(snap))]
    for r in upto[start + 1 :]:
        for b, entry in r.page_map.items():
            current[b] = entry
    return current
