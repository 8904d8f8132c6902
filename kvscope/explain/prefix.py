"""Prefix-cache misses per request, read from a run's records: ``prefix_misses(records, events, meta)``.

Each request that was looked up (admitted at least once) gets a ``PrefixMiss``: what it got
(``num_cached_tokens``, from its first ``scheduled`` event), what it could have got (``num_reusable_tokens``,
``sharing.py``) and, when it got less, why (``miss_cause``), judged on the first block it missed (``k0``)
and the earlier requests that hold that block (its providers):

- ``cache_off``: the run had prefix caching off;
- ``in_flight``: no provider had that block scheduled when the request looked it up (the engine caches a
  block when it is scheduled to be filled, so a provider earlier in the same step counts as done);
- ``window``: a provider had it, and a provider still held it at the lookup, on a model with sliding-window
  groups (only a block that left a window is let go while its request runs);
- ``evicted``: a provider had it and every provider had let it go: it was evicted before the lookup. Then
  ``released_s`` (when its last provider let it go), ``evicted_at_step`` (the first step after that at which
  the page map shows a cached page of a provider taken for other content; else the first step that evicted
  anything), ``idle_s`` (released to evicted) and the pressure then: ``pool_filled`` (blocks used or cached,
  of the pool, before that step: at 1 every new block evicts one) and ``num_waiting`` (requests waiting after
  it).

Nothing here needs the engine: the prompts come from ``queued`` events (``prompt_token_ids``), progress from
each step's ``ScheduledItem.context_len``, evictions from the page map.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from kvscope.explain.sharing import Sharing, SharingIndex
from kvscope.telemetry.records import RequestEvent, StepRecord

MISS_CAUSES = ("evicted", "in_flight", "cache_off", "window")


@dataclass(slots=True)
class PrefixMiss:
    """One request's prefix-cache lookup, explained (fields in docs/telemetry.md, "Explain")."""

    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_reusable_tokens: int
    miss_cause: str | None = None
    diverged_at: int | None = None
    diverged_from: str | None = None
    lookup_step: int | None = None
    arrival_s: float = 0.0
    released_s: float | None = None
    evicted_at_step: int | None = None
    idle_s: float | None = None
    pool_filled: float | None = None
    num_waiting: int | None = None

    @property
    def num_missed_tokens(self) -> int:
        return max(0, self.num_reusable_tokens - self.num_cached_tokens)


@dataclass(slots=True)
class _Lookup:
    request_id: str
    t_ns: int
    step: int
    num_cached_tokens: int


class _Timeline:
    """The records with their end times and step indices (both increasing), for bisection."""

    def __init__(self, records: list[StepRecord]) -> None:
        self.records = records
        self.ends = [r.t_end_ns for r in records]
        self.steps = [r.step for r in records]


class _Progress:
    """Per request, its context after each step it was scheduled in, and when it held its blocks."""

    def __init__(self, records: list[StepRecord], events: list[RequestEvent]) -> None:
        self.ctx: dict[str, list[tuple[int, int, int]]] = {}  # rid -> [(step, position in step, context_len)]
        for record in records:
            for pos, item in enumerate(record.scheduled):
                self.ctx.setdefault(item.request_id, []).append((record.step, pos, item.context_len))
        self.first_step = records[0].step if records else 0
        self.holding: dict[
            str, list[list[int | None]]
        ] = {}  # rid -> [[admitted t_ns, released t_ns or None]]
        for e in events:
            spans = self.holding.setdefault(e.request_id, [])
            if e.kind in ("scheduled", "resumed"):
                spans.append([e.t_ns, None])
            elif e.kind in ("preempted", "finished") and spans and spans[-1][1] is None:
                spans[-1][1] = e.t_ns

    def computed_before(self, rid: str, step: int, pos: int) -> int | None:
        """Tokens ``rid`` had scheduled before position ``pos`` of ``step`` (None: not recorded)."""
        entries = self.ctx.get(rid)
        if not entries:
            return None
        best = 0
        for s, p, ctx in entries:
            if (s, p) >= (step, pos):
                break
            best = max(best, ctx)
        return best

    def position(self, rid: str, step: int) -> int:
        for s, p, _ in self.ctx.get(rid, ()):
            if s == step:
                return p
        return 0

    def held_at(self, rid: str, t_ns: int) -> bool:
        return any(a <= t_ns and (b is None or b > t_ns) for a, b in self.holding.get(rid, ()))

    def released_before(self, rid: str, t_ns: int) -> int | None:
        ends = [b for a, b in self.holding.get(rid, ()) if b is not None and b <= t_ns]
        return max(ends) if ends else None


def prefix_misses(records: list[StepRecord], events: list[RequestEvent], meta: dict) -> list[PrefixMiss]:
    """One ``PrefixMiss`` per request that was looked up, in arrival order (``ValueError`` if the run did not
    record its prompts)."""
    bs = int(meta["block_size"])
    queued = [e for e in events if e.kind == "queued"]
    if any(e.prompt_token_ids is None for e in queued):
        raise ValueError(
            "the run did not record its prompts (queued events without prompt_token_ids): "
            "record it again with this kvscope version"
        )
    lookups: dict[str, _Lookup] = {}
    for e in events:
        if e.kind == "scheduled" and e.request_id not in lookups:
            lookups[e.request_id] = _Lookup(e.request_id, e.t_ns, e.step, e.num_cached_tokens)
    t0 = int(meta.get("t0_ns") or (queued[0].t_ns if queued else 0))
    index = SharingIndex(bs)
    sharings = [(e, index.add(e.request_id, list(e.prompt_token_ids))) for e in queued]
    progress = _Progress(records, events)
    evictions = _evictions(records)
    timeline = _Timeline(records)
    caching = bool((meta.get("config") or {}).get("enable_prefix_caching", True))
    sliding = any(g.get("sliding_window") for g in (meta.get("kv_cache_groups") or {}).get("groups", []))
    rows = []
    for e, share in sharings:
        lookup = lookups.get(e.request_id)
        if lookup is None:
            continue
        row = PrefixMiss(
            e.request_id,
            share.num_prompt_tokens,
            lookup.num_cached_tokens,
            share.num_reusable_tokens,
            diverged_at=share.diverged_at,
            diverged_from=share.diverged_from,
            lookup_step=lookup.step,
            arrival_s=(e.t_ns - t0) / 1e9,
        )
        if row.num_missed_tokens > 0:
            _explain(row, share, lookup, index, progress, evictions, timeline, caching, sliding, bs, t0)
        rows.append(row)
    return rows


def _explain(
    row: PrefixMiss,
    share: Sharing,
    lookup: _Lookup,
    index: SharingIndex,
    progress: _Progress,
    evictions: dict[str, list[int]],
    timeline: _Timeline,
    caching: bool,
    sliding: bool,
    bs: int,
    t0: int,
) -> None:
    if not caching:
        row.miss_cause = "cache_off"
        return
    k0 = lookup.num_cached_tokens // bs
    mine = index.order[row.request_id]
    providers = [rid for rid in index.holders(share.chain[k0]) if index.order[rid] < mine]
    pos = progress.position(row.request_id, lookup.step)
    had = []
    for rid in providers:
        done = progress.computed_before(rid, lookup.step, pos)
        if done is None:  # not in the recorded steps: had it if it was admitted before (a window of steps)
            done = (k0 + 1) * bs if lookup.step > progress.first_step and rid in progress.holding else 0
        if done >= (k0 + 1) * bs:
            had.append(rid)
    if not had:
        row.miss_cause = "in_flight"
        return
    if any(progress.held_at(rid, lookup.t_ns) for rid in had):
        row.miss_cause = "window" if sliding else "evicted"
        return
    row.miss_cause = "evicted"
    released = max(t for t in (progress.released_before(rid, lookup.t_ns) for rid in had) if t is not None)
    row.released_s = (released - t0) / 1e9
    _eviction_step(row, had, released, lookup, evictions, timeline)


def _eviction_step(
    row: PrefixMiss,
    providers: list[str],
    released: int,
    lookup: _Lookup,
    evictions: dict[str, list[int]],
    timeline: _Timeline,
) -> None:
    """The first step in (released, lookup] that evicted a provider's page (else any page), and its pressure."""
    records = timeline.records
    lo = bisect_right(timeline.ends, released)
    hi = bisect_right(timeline.steps, lookup.step)
    in_window = {records[i].step for i in range(lo, hi)}
    steps = {s for rid in providers for s in evictions.get(rid, ()) if s in in_window}
    for i in range(lo, hi):
        record, previous = records[i], records[i - 1] if i else None
        evicted = (
            record.step in steps
            if steps
            else (previous is not None and record.kv.num_evictions > previous.kv.num_evictions)
        )
        if evicted:
            row.evicted_at_step = record.step
            row.idle_s = max(0.0, (record.t_start_ns - released) / 1e9)
            kv = (previous or record).kv
            row.pool_filled = (kv.blocks_used + kv.blocks_cached_free) / max(kv.num_blocks, 1)
            row.num_waiting = record.num_waiting
            return


def _evictions(records: list[StepRecord]) -> dict[str, list[int]]:
    """Owner -> steps at which one of its cached pages was taken for other content (from the page map)."""
    pages: dict[int, tuple[str, str]] = {}
    out: dict[str, list[int]] = {}
    for record in records:
        for block_id, entry in record.page_map.items():
            before = pages.get(block_id)
            if before is not None and before[1] == "cached" and entry.owner != before[0]:
                steps = out.setdefault(before[0], [])
                if not steps or steps[-1] != record.step:
                    steps.append(record.step)
            pages[block_id] = (entry.owner, entry.state)
    return out
