"""Recorder: turns each step's plain data into a ``StepRecord`` and keeps the recent ones in a ring buffer.

The recorder knows no engine. A source (kvscope's engine, or anything else that schedules steps)
hands it plain records (``telemetry.records``): the static run metadata at construction; block-pool
events as they happen (``block_event``); request events (``request_event``); and after each step
``record_step(batch, timings, stats)``. The same source thread makes every call.

Subscribers are called inline with each record and event and must return at once (put the item on
a ``queue.SimpleQueue``, append it to a list); one that raises is dropped (its error kept in
``subscriber_errors``) rather than stopping the source. Readers on other threads can instead poll
``steps_since(step)``, which takes no lock, so the source never waits for them either.

Events that a step's results cause (``first_token``, and ``finished`` with reason stop / length) are
held until the step's record is made and stamped with its ``t_end_ns``: the moment the step hands its
tokens back. ``scheduled``, ``resumed`` and ``preempted`` are stamped with the end of scheduling.

Request ids are unique in a run's records: a reused source id is recorded as ``id#2``, ...
(``request_names.py``). What the recorder keeps per request is dropped when it finishes.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from kvscope.telemetry.inputs import BatchSummary, SchedulerStats, StepTimings
from kvscope.telemetry.memory import MemoryProbe
from kvscope.telemetry.pagemap import PageMapTracker
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.telemetry.request_names import RequestNames
from kvscope.telemetry.step_record import kv_state, step_record
from kvscope.utils.clock import WALL_CLOCK, Clock

Subscriber = Callable[[StepRecord | RequestEvent], None]
_STEP_CAUSED = ("stop", "length")


class Recorder(RequestNames):
    """``meta``: the run's static metadata (JSON values); the recorder reads ``block_size``,
    ``num_blocks``, ``kv_bytes_per_token``, ``kv_bytes_per_block`` and ``max_model_len`` from it and
    hands a copy of all of it to every ``snapshot``. ``memory``: the probe sampled with each record
    (``None``: records carry no memory readings). ``clock``: where event times come from."""

    def __init__(
        self,
        meta: dict[str, Any],
        memory: MemoryProbe | None = None,
        capacity: int = 100_000,
        snapshot_every: int | None = None,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self.meta = meta
        self.clock = clock  # what stamps events made without a time (a simulation's virtual clock)
        self.memory = memory
        self.capacity = capacity
        self.subscribers: list[Subscriber] = []
        self.subscriber_errors: list[str] = []
        self.block_size: int = meta["block_size"]
        self.max_model_len: int = meta["max_model_len"]
        self.kv_bytes_per_token: int = meta["kv_bytes_per_token"]
        self.kv_bytes_per_block: int = meta["kv_bytes_per_block"]
        # a static cache's reservation per request: max_model_len slots in every full-attention layer,
        # min(max_model_len, window) in a sliding one (transformers' static cache); older metadata lacks it
        self.static_bytes_per_request: int = meta.get("static_kv_bytes_per_request",
                                                      self.max_model_len * self.kv_bytes_per_token)
        self.pages = PageMapTracker(meta["num_blocks"], self.block_size, snapshot_every)
        self.block_event = self.pages.on_block_event  # the block pool's listener: (kind, block_id)
        self._stats: SchedulerStats | None = None  # as of the last record
        self.detail = True  # False: light batches (``BatchCounts``), the page map resting (``set_detail``)
        self.clear()

    def clear(self) -> None:
        """Forget what was recorded (a new run from the same source). The page map carries on."""
        self.steps: deque[StepRecord] = deque(maxlen=self.capacity)
        self.events: deque[RequestEvent] = deque(maxlen=self.capacity * 4)
        self.profiler_events: list[dict[str, Any]] = []  # torch.profiler windows (telemetry/profiler.py)
        self.num_steps_recorded = 0  # total, including any that fell out of the ring
        self._pending: list[RequestEvent] = []
        # per unfinished request (by recorded id), dropped when it finishes
        self._seen_scheduled: set[str] = set()
        self._was_preempted: set[str] = set()
        self._reset_names(self.events.maxlen)  # the recorded ids of this run (request_names.py)
        self.pages.since_snapshot = self.pages.snapshot_every  # the next record is a full snapshot
        last = self._stats
        self.baseline = {  # prefix-cache counters are cumulative over the source's life
            "prefix_cache_queries_before": last.prefix_cache_queries if last else 0,
            "prefix_cache_hits_before": last.prefix_cache_hits if last else 0,
            "window_freed_blocks_before": last.num_window_freed_blocks if last else 0,
        }

    # ---- readers ---------------------------------------------------------------------------------
    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(item)`` with every new ``RequestEvent`` and ``StepRecord``; returns an unsubscribe."""
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn) if fn in self.subscribers else None

    def _publish(self, item: StepRecord | RequestEvent) -> None:
        for fn in tuple(self.subscribers):  # a copy: a subscriber may unsubscribe while called
            try:
                fn(item)
            except Exception as exc:
                self.subscriber_errors.append(f"{fn!r}: {type(exc).__name__}: {exc}")
                if fn in self.subscribers:
                    self.subscribers.remove(fn)

    def steps_since(self, step: int) -> list[StepRecord]:
        """Records of steps ``>= step`` that the ring still holds (safe from any thread)."""
        items = _copy(self.steps)
        lo, hi = 0, len(items)
        while lo < hi:  # step indices increase along the ring
            mid = (lo + hi) // 2
            if items[mid].step < step:
                lo = mid + 1
            else:
                hi = mid
        return items[lo:]

    def snapshot(self) -> tuple[list[StepRecord], list[RequestEvent], dict[str, Any], list[dict[str, Any]]]:
        """(records, events, meta, profiler_events): copies, as ``Run`` takes them."""
        records, events = _copy(self.steps), _copy(self.events)
        meta = copy.deepcopy(self.meta)
        meta.update(self.baseline)
        meta["created_unix_s"] = time.time()
        meta["num_steps_dropped"] = self.num_steps_recorded - len(records)
        meta["nvml"] = self.memory.nvml_status if self.memory is not None else "unavailable: no memory probe"
        starts = [e.t_ns for e in events[:1]] + [r.t_start_ns for r in records[:1]]
        meta["t0_ns"] = min(starts) if starts else self.clock.now_ns()
        return records, events, meta, list(self.profiler_events)

    # ---- request events ----------------------------------------------------------------------------
    def request_event(
        self,
        kind: str,
        request_id: str,
        step: int,
        num_prompt_tokens: int = 0,
        num_output_tokens: int = 0,
        reason: str | None = None,
        error: str | None = None,
        *,
        t_ns: int | None = None,
        num_cached_tokens: int = 0,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        """A request changed state (``kind``: one of ``records.EVENT_KINDS``) during or before
        ``step``; ``reason`` and ``error`` count for ``finished`` only. Without ``t_ns`` it is stamped
        now, or, for a first token or a stop / length finish, with the end of the step recorded next.
        ``queued`` starts a request: an id this run already recorded is recorded as ``id#2``, ..."""
        rid = self._recorded_id(kind, request_id)
        held = self._event(kind, rid, step, num_prompt_tokens, num_output_tokens, reason, error, t_ns,
                           num_cached_tokens, prompt_token_ids if kind == "queued" else None)
        if kind == "finished" and not held:  # a held finish keeps its name until the step's record
            self._forget_name(request_id)

    def _event(self, kind: str, rid: str, step: int, num_prompt_tokens: int, num_output_tokens: int,
               reason: str | None, error: str | None, t_ns: int | None, num_cached_tokens: int = 0,
               prompt_token_ids: list[int] | None = None) -> bool:
        """Make and publish an event of a recorded id; True if it is held for the next step's end."""
        finished = kind == "finished"
        event = RequestEvent(
            t_ns=t_ns if t_ns is not None else self.clock.now_ns(),
            step=step,
            request_id=rid,
            kind=kind,
            num_prompt_tokens=num_prompt_tokens,
            num_output_tokens=num_output_tokens,
            reason=reason if finished else None,
            error=error if finished else None,
            num_cached_tokens=num_cached_tokens,
            prompt_token_ids=prompt_token_ids,
        )
        if finished or kind == "preempted":
            self.pages.forget(rid)
        if finished:
            self._seen_scheduled.discard(rid)
            self._was_preempted.discard(rid)
            self._remember(rid)  # its last event: remembered as long as the ring may hold it
        if t_ns is None and (kind == "first_token" or (finished and event.reason in _STEP_CAUSED)):
            self._pending.append(event)  # stamped with the step's end in record_step
            return True
        self.events.append(event)
        self._publish(event)
        return False

    # ---- steps -----------------------------------------------------------------------------------
    def state_changed(self, stats: SchedulerStats) -> bool:
        """Whether the queue lengths in ``stats`` (now) or the page map differ from the last record
        (e.g. after aborts between steps); ``Engine.record_state`` records such a change."""
        last = self._stats
        counts = (last.num_running, last.num_waiting) if last is not None else (0, 0)
        return (stats.num_running, stats.num_waiting) != counts or self.pages.has_changes()

    def record_step(self, batch: BatchSummary, timings: StepTimings, stats: SchedulerStats) -> StepRecord:
        """Record a finished step: its batch, phase times and the counters after it."""
        if self._renamed:
            batch = self._rename(batch)
            self._forget_names(e.request_id for e in self._pending if e.kind == "finished")
        self._step_events(batch, timings)
        record = self._make_record(batch, timings, stats)
        self.steps.append(record)
        self.num_steps_recorded += 1
        self._stats = stats
        self._publish(record)
        return record

    def _step_events(self, batch: BatchSummary, timings: StepTimings) -> None:
        """The step's own request events (preempted, resumed / scheduled at the end of scheduling),
        then the ones held for its end (first tokens, stop / length finishes). Ids are recorded ids."""
        t_sched, step = timings.scheduled_ns, batch.step
        for p in batch.preempted:
            self._was_preempted.add(p.request_id)
            self._event("preempted", p.request_id, step, p.num_prompt_tokens, p.num_output_tokens, None, None,
                        t_sched)
        for p in batch.admitted:
            rid = p.request_id
            if rid in self._was_preempted:
                self._was_preempted.discard(rid)
                kind = "resumed"
            elif rid not in self._seen_scheduled:
                self._seen_scheduled.add(rid)
                kind = "scheduled"
            else:
                continue
            self._event(kind, rid, step, p.num_prompt_tokens, p.num_output_tokens, None, None, t_sched,
                        p.num_cached_tokens)
        t_end = timings.end_ns
        for event in self._pending:
            event.t_ns = t_end
            self.events.append(event)
            self._publish(event)
            if event.kind == "finished":  # finished in the step that admitted it: forget it now
                self._seen_scheduled.discard(event.request_id)
        self._pending.clear()

    def set_detail(self, on: bool) -> None:
        """Per-request detail (items, tables, page-map changes) from the next step, or not (telemetry/detail.py).
        Back on, the page map starts again from the blocks' state then, with a full snapshot."""
        if on and not self.detail:
            self.pages.resume()
        self.detail = on

    def _make_record(self, batch: BatchSummary, t: StepTimings, stats: SchedulerStats) -> StepRecord:
        page_map, full = ({}, False) if batch.counts is not None else self.pages.update(batch.scheduled,
                                                                                        batch.block_tables)
        kv = kv_state(stats, self.block_size, self.kv_bytes_per_block, self.static_bytes_per_request)
        memory = self.memory.sample(t.end_ns) if self.memory is not None else {}
        record = step_record(batch, t, stats, kv, page_map, full, memory)
        record.wait_reason, record.gc_ns = batch.wait_reason, batch.gc_ns or None
        record.attention_backend = batch.attention_backend
        return record


def _copy(ring: deque) -> list:
    """``list(ring)`` while another thread may append (retry the rare 'mutated during iteration')."""
    for _ in range(100):
        try:
            return list(ring)
        except RuntimeError:
            continue
    return list(ring)
