"""The page map, kept incrementally: which request owns each KV block and how full it is.

``PageMapTracker`` is fed the block pool's events (``records.BLOCK_EVENT_KINDS``: it keeps each block's
reference count and whether it is cached from them alone) and, at the end of each step, the step's
scheduled requests with their block tables. It looks only at the blocks the events named plus the
blocks the step wrote into (each scheduled request's tail), so the cost per step is proportional to
what changed, not to the pool size; only the occasional full snapshot walks every block.

KV cache groups and sliding windows: a hybrid model's request hands in its groups' tables interleaved
(``ScheduledItem.num_kv_groups``; entry ``j * G + g`` is block ``j`` of group ``g``), and an entry of
``-1`` is a block that left a sliding window: the request no longer holds it (its last release came
as ``"window_freed"``). ``group[b]`` is the group of the table block ``b`` last entered.

Bounded whatever the pool's size: the map covers the pool's first ``MAX_MAPPED_BLOCKS`` blocks (65,536) and no
more (``mapped_blocks``). The pool hands out its lowest free block first, so a workload that uses fewer blocks
shows whole; a bigger pool's later blocks are left out of the map (their counts stay in ``KVState``, which covers
the whole pool). The tracker's lists, a snapshot and a record's ``page_map`` are therefore at most 65,536 entries
(about 2 MB of JSON per snapshot), even for a simulated GPU pool of millions of blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvscope.telemetry.records import (
    BLOCK_ALLOCATED,
    BLOCK_CACHED,
    BLOCK_EVICTED,
    BLOCK_FREED,
    BLOCK_HIT,
    BLOCK_RELEASED,
    BLOCK_WINDOW_FREED,
    FREE_PAGE,
    PageEntry,
    ScheduledItem,
    StepRecord,
)

MAX_MAPPED_BLOCKS = 1 << 16  # the page map's cover: the pool's first blocks (module doc)


def mapped_blocks(num_blocks: int) -> int:
    """How many of a pool's blocks its page map covers (the first ones)."""
    return min(num_blocks, MAX_MAPPED_BLOCKS)


class PageMapTracker:
    """Owner convention: a used block's owner is its longest-standing current holder (the request
    that took it from the free pool, until that one lets go); a cached block keeps its last owner."""

    def __init__(self, num_blocks: int, block_size: int, snapshot_every: int | None = None) -> None:
        n = mapped_blocks(num_blocks)
        self.num_blocks, self.block_size = n, block_size  # num_blocks: the blocks mapped (the first n)
        self.pool_blocks = num_blocks
        if n < num_blocks:  # events of blocks past the map are dropped (the bounded map: module doc)
            self.on_block_event = self._on_mapped_block_event  # type: ignore[method-assign]
        # A full snapshot every N records keeps replay cheap; bigger pools snapshot less often so
        # that snapshots stay a small share of the recorder's memory.
        self.snapshot_every = snapshot_every or max(128, n // 16)
        self.entries: list[PageEntry] = [FREE_PAGE] * n  # the current map
        self.owner: list[str] = [""] * n
        self.refs: list[int] = [0] * n  # reference counts, from the pool's events
        self.cached: list[bool] = [False] * n  # findable by the prefix cache, from the pool's events
        self.holders: dict[int, list[str]] = {}  # block id -> request ids holding it, oldest first
        self.tables: dict[str, list[int]] = {}  # request id -> its block table as attributed so far
        self.group: list[int] = [0] * n  # KV cache group of each block (of the table it last entered)
        self.live_from: dict[str, int] = {}  # request id -> first table row with no null entry seen
        self.dirty: set[int] = set(range(n))
        # owner -> its "used" entries by fill level (group 0): a decode's tail block reuses them (update)
        self.used_entries: dict[str, list[PageEntry | None]] = {}
        self.since_snapshot = self.snapshot_every  # the first update is a snapshot

    def on_block_event(self, kind: str, block_id: int) -> None:
        """A block-pool event (the pool's listener)."""
        self.dirty.add(block_id)
        if kind == BLOCK_ALLOCATED:
            self.refs[block_id] = 1
            self.cached[block_id] = False
        elif kind == BLOCK_HIT:
            self.refs[block_id] += 1
        elif kind == BLOCK_CACHED:
            self.cached[block_id] = True
        elif kind in (BLOCK_FREED, BLOCK_WINDOW_FREED):
            self.refs[block_id] = 0
        elif kind == BLOCK_RELEASED:
            self.refs[block_id] -= 1
        elif kind == BLOCK_EVICTED:
            self.cached[block_id] = False
        else:
            raise ValueError(f"unknown block event {kind!r} (block {block_id})")

    def _on_mapped_block_event(self, kind: str, block_id: int) -> None:
        if block_id < self.num_blocks:
            PageMapTracker.on_block_event(self, kind, block_id)

    def forget(self, request_id: str) -> None:
        """The request finished or was preempted: it holds none of its blocks any more."""
        self.live_from.pop(request_id, None)
        self.used_entries.pop(request_id, None)
        for b in self.tables.pop(request_id, ()):
            if b >= 0:
                self._let_go(request_id, b)

    def _let_go(self, request_id: str, b: int) -> None:
        holders = self.holders.get(b)
        if holders is None:
            return
        holders.remove(request_id)
        if not holders:
            del self.holders[b]  # the owner stays: a cached block shows whose tokens it holds
        elif self.owner[b] == request_id:
            self.owner[b] = holders[0]
        self.dirty.add(b)

    def _drop_nulls(self, rid: str, mine: list[int], table: list[int], groups: int) -> None:
        """Let go of the blocks whose entries became null (left a window) since the last step. Null
        entries are a prefix of each group's table, so this scans from the first row that had none."""
        j = self.live_from.get(rid, 0)
        while (j + 1) * groups <= len(mine):
            row = range(j * groups, (j + 1) * groups)
            if all(table[t] >= 0 for t in row):
                break
            for t in row:
                if table[t] < 0 <= mine[t]:
                    self._let_go(rid, mine[t])
                    mine[t] = -1
            j += 1
        self.live_from[rid] = j

    def update(
        self, scheduled: Sequence[ScheduledItem], block_tables: Sequence[list[int]]
    ) -> tuple[dict[int, PageEntry], bool]:
        """The map's changes for a finished step (or all of it, on a snapshot step): ``block_tables[i]``
        is the block table of ``scheduled[i]``'s request after the step."""
        bs, dirty, tables, mapped = self.block_size, self.dirty, self.tables, self.num_blocks
        entries, refs, owner, group, used = self.entries, self.refs, self.owner, self.group, self.used_entries
        filled: dict[int, int] = {}
        changes: dict[int, PageEntry] = {}
        for item, table in zip(scheduled, block_tables):
            if not table:  # finished this step: its blocks were freed (and reported by the pool)
                continue
            rid, n, groups = item.request_id, item.num_tokens, item.num_kv_groups
            computed = item.context_len  # already includes this step's tokens
            mine = tables.get(rid)
            if n == 1 and groups == 1 and mine is not None and len(mine) == len(table) and table[0] >= 0:
                j = (computed - 1) // bs  # the common case: a decode into its tail block (one group, no nulls)
                b = table[j]
                if b >= mapped:  # past the map
                    continue
                if refs[b] == 1 and b not in dirty and not group[b]:  # its one holder's, untouched by events
                    o, f = owner[b], computed - j * bs
                    row = used.get(o)  # its entry now, made once per owner and fill level
                    if row is None:
                        row = used[o] = [None] * (bs + 1)
                    entry = row[f]
                    if entry is None:
                        entry = row[f] = _new_entry(PageEntry, (o, f, "used", 1, 0))
                    if entry != entries[b]:
                        entries[b] = changes[b] = entry
                    continue
                filled[b] = computed - j * bs
                dirty.add(b)
                continue
            if mine is None:
                mine = tables[rid] = []
            if min(table[:groups]) < 0:  # a window dropped blocks (null entries start at row 0)
                self._drop_nulls(rid, mine, table, groups)
            first_written = (computed - n) // bs
            if n == 1 and len(mine) == len(table):  # a decode into its tail block (each group's)
                j = (computed - 1) // bs
                for b in table[j * groups : (j + 1) * groups]:
                    if b >= mapped:
                        continue
                    filled[b] = computed - j * bs
                    dirty.add(b)
                continue
            self._enter(rid, mine, table, groups, first_written, filled)
            for t in range(first_written * groups, min(((computed - 1) // bs + 1) * groups, len(table))):
                b = table[t]
                if b >= mapped:
                    continue
                filled[b] = min(bs, computed - t // groups * bs)
                dirty.add(b)
        return self._changes(filled, changes)

    def _enter(self, rid: str, mine: list[int], table: list[int], groups: int, first_written: int,
               filled: dict[int, int]) -> None:
        """The blocks that entered ``rid``'s table this step: held, owned if first, full if a cache hit."""
        for t in range(len(mine), len(table)):
            b = table[t]
            mine.append(b)
            if b < 0 or b >= self.num_blocks:  # a prefix-cache hit's entry outside the window (never held), or
                continue  # a block past the map
            self.group[b] = t % groups
            holders = self.holders.setdefault(b, [])
            holders.append(rid)
            if len(holders) == 1:
                self.owner[b] = rid
            self.dirty.add(b)
            if t // groups < first_written:  # a prefix-cache hit: a full block
                filled[b] = self.block_size

    def _changes(self, filled: dict[int, int], changes: dict[int, PageEntry]) -> tuple[dict[int, PageEntry], bool]:
        """Add the entries of the other blocks touched this step that changed to ``changes`` (the decodes'
        tail blocks, already there); all of them on a snapshot step."""
        owner, dirty, cached, bs = self.owner, self.dirty, self.cached, self.block_size
        entries, entry_of, refs, group = self.entries, self._entry, self.refs, self.group
        for b in dirty:  # _entry, inlined for the common blocks: written by their one holder, freed, cached
            f, r = filled.get(b), refs[b]
            if r == 1 and f is not None:
                entry = _new_entry(PageEntry, (owner[b], f, "used", 1, group[b]))
            elif r == 0:  # a finished request's blocks, mostly
                if cached[b]:
                    entry = _new_entry(PageEntry, (owner[b], bs, "cached", 0, group[b]))
                else:
                    entry, owner[b] = FREE_PAGE, ""
            else:
                entry = entry_of(b, f)
            if entry != entries[b]:
                entries[b] = entry
                changes[b] = entry
        dirty.clear()
        self.since_snapshot += 1
        if self.since_snapshot >= self.snapshot_every:
            self.since_snapshot = 0
            return dict(enumerate(entries)), True
        return changes, False

    def resume(self) -> None:
        """Start again after steps without updates (a long simulation's light steps: ``Recorder.set_detail``).
        The reference counts and cached flags are current (the pool's events kept coming); who holds what is
        not, so it is forgotten and the next update enters every scheduled request's table afresh, owners in
        schedule order; a block whose events came meanwhile keeps no owner (a cached one shows ``""``). The
        next update is a full snapshot."""
        self.holders.clear()
        self.tables.clear()
        self.live_from.clear()
        self.used_entries.clear()
        for b in self.dirty:
            self.owner[b] = ""
        self.since_snapshot = self.snapshot_every

    def has_changes(self) -> bool:
        """Whether a block touched since the last update would now read differently (no step needed)."""
        return any(self._entry(b, None) != self.entries[b] for b in self.dirty)

    def _entry(self, b: int, filled: int | None) -> PageEntry:
        """Block ``b``'s entry now; ``filled`` if the step wrote into it, else what it held before."""
        refs = self.refs[b]
        if refs == 0:
            if not self.cached[b]:
                return FREE_PAGE
            return _new_entry(PageEntry, (self.owner[b], self.block_size, "cached", 0, self.group[b]))
        if filled is None:
            old = self.entries[b]
            filled = old.filled if old.refs else self.block_size
        return _new_entry(PageEntry, (self.owner[b], filled, "shared" if refs > 1 else "used", refs, self.group[b]))


_new_entry = tuple.__new__  # a PageEntry without the namedtuple's argument parsing (once per changed block)


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
