"""The watch as a telemetry source: metrics samples, KV events and plugin step records in, kvscope records out.

The plugin's lines follow ``plugin_format.py``; ``WatchSource`` describes the watch in ``meta["watch"]``.
"""

from __future__ import annotations

import time
from typing import Any

from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.watched.engines import (
    COUNTER_OF,
    GONE,
    LOST,
    OK,
    WAITING,
    WATCH_FORMAT_VERSION,
    EngineState,
    server_name,
)
from kvscope.watched.events import BlockStored, EventBatch
from kvscope.watched.fleet import fleet_kv, fleet_queues, interval_record
from kvscope.watched.limits import (
    ENGINE_TTL_S,
    MAX_ENGINES,
    MAX_LABEL,
    MAX_LOST,
    MAX_RANK,
    MAX_SPAN_S,
    Remembered,
)
from kvscope.watched.otlp_receiver import COUNTS as OTLP_COUNTS
from kvscope.watched.plugin_steps import apply_line, request_events
from kvscope.watched.samples import MetricsSample, interval, restarted
from kvscope.watched.watch_meta import LANE_COLUMNS, append_row, describe, new_lane

__all__ = ["LANE_COLUMNS", "LOST", "OK", "WAITING", "WatchSource"]
FAULTS = ("metrics_malformed", "metrics_truncated", "scrape_errors", "server_restarts", "engines_dropped",
          "engines_forgotten", "event_batches", "events_malformed", "events_duplicate", "event_disconnects",
          "event_gaps", "events_missed", "event_restarts", "events_replayed", "replay_failures", "blocks_forgotten",
          "plugin_lines", "plugin_malformed", "plugin_restarts", *OTLP_COUNTS, "otlp_spans_duplicate")


class WatchSource:
    """The state of a watch, fed by the watcher's one thread: ``on_scrape`` / ``on_scrape_error`` per
    URL and poll, ``on_events`` per KV event batch, ``on_plugin`` per plugin line, then ``tick`` once per
    poll, which appends a row to every engine's lane and returns the new ``StepRecord``s and
    ``RequestEvent``s. Without plugin records (``plugin_records=False``) each tick makes one record of the
    fleet's state (zero duration: an interval is no step); with them, each engine step the plugin reported
    is a record (its batch, and the fleet's state after it) and each finished request a lane of events.
    The fleet's queues, KV pool and interval records are ``fleet.py``'s; an engine's lane row and totals
    are its ``EngineState``'s.

    Engines are bounded (``limits.py``): at most ``MAX_ENGINES``; one absent from its server's page is out
    of the fleet at once (not connected), and one nothing came of for ``ENGINE_TTL_S`` is "gone" (its lane
    stops; the first to be forgotten when a new engine needs the room; back when data comes again).

    ``watch`` is the JSON-ready description of the watch (``meta["watch"]`` of the run, the shape read by
    ``summary.py`` and the widgets): lanes grow in place (the ``t_ns`` column last; a full lane is replaced
    by a merged one, ``lanes.py``), everything else is replaced whole at each tick, so a reader on another
    thread sees a consistent picture.
    """

    def __init__(self, urls: list[str], *, t0_ns: int | None = None, interval_s: float = 0.5,
                 plugin_records: bool = False, otlp: bool = False, layout_rows: int = 400) -> None:
        self.urls = list(urls)
        self.names = [server_name(u) for u in self.urls]
        self.t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns
        self._unix0, self._perf0 = time.time(), time.perf_counter_ns()
        self.plugin_records = plugin_records
        self.otlp = otlp  # requests come from vLLM's OTLP spans (on_spans), not from the plugin's finished lines
        self.spans_seen = Remembered(1 << 16)  # span ids (an exporter that retries sends a batch again)
        self.layout_rows = layout_rows
        self.engines: dict[str, EngineState] = {}
        self.server_state = [WAITING] * len(urls)
        self.server_error: list[str | None] = [None] * len(urls)
        self.faults: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.lost: list[list] = []  # [engine or server name, t_lost_ns, t_back_ns or None], the latest MAX_LOST
        self.step = 0
        self.num_lanes = 0  # request lanes the plugin's lines made (numbers the requests without an id)
        self.fleet_hashes = Remembered()  # distinct block hashes over every engine (bounded)
        self._new_records: list[StepRecord] = []
        self._new_events: list[RequestEvent] = []
        self._pending: dict[str, dict[str, float]] = {}  # engine -> counter deltas since the last tick
        self.plugin_pids: dict[str, Any] = {}
        self.residency_cache: dict[str, tuple[int, bool, float, float, dict[str, Any]]] = {}
        self.watch: dict[str, Any] = {
            "version": WATCH_FORMAT_VERSION, "urls": self.urls, "interval_s": interval_s, "t0_ns": self.t0_ns,
            "plugin": plugin_records, "engines": {}, "lanes": {}, "fleet": new_lane(),
            "totals": {}, "histograms": {}, "residency": {}, "kv_transfer": {}, "faults": dict(self.faults), "lost": [],
            "servers": {}, "model": None, "otlp": otlp, "config": None,
        }

    # ---- inputs -----------------------------------------------------------------------------------------
    def unix_to_ns(self, t: float) -> int:
        """A Unix time (another process's ``time.time()``, checked plausible) on this process's clock."""
        return self._perf0 + int((t - self._unix0) * 1e9)

    def engine(self, server: int, label: str) -> EngineState | None:
        """The engine ``label`` of ``server`` (at most ``MAX_ENGINES``: a gone or disconnected one is forgotten
        to make room); ``None`` (counted) when every one is live."""
        key = f"{self.names[server]}/{label}"
        eng = self.engines.get(key)
        if eng is None:
            if len(self.engines) >= MAX_ENGINES and not self._forget_one():
                self.faults["engines_dropped"] += 1
                return None
            eng = self.engines[key] = EngineState(key, server, label)
            self.watch["lanes"][key] = new_lane()
        eng.seen_ns, eng.gone = time.perf_counter_ns(), False
        return eng

    def _forget_one(self) -> bool:
        """Forget the gone (else the disconnected) engine heard of longest ago; ``False`` if none is."""
        idle = [e for e in self.engines.values() if e.gone] or [e for e in self.engines.values() if not e.connected]
        if not idle:
            return False
        oldest = min(idle, key=lambda e: e.seen_ns)
        del self.engines[oldest.key]
        self.watch["lanes"].pop(oldest.key, None)
        self._pending.pop(oldest.key, None)
        self.residency_cache.pop(oldest.key, None)
        self.faults["engines_forgotten"] += 1
        return True

    def on_scrape(self, server: int, samples: list[MetricsSample], num_malformed: int = 0, *,
                  truncated: bool = False, engines_dropped: int = 0) -> None:
        self.faults["metrics_malformed"] += num_malformed
        self.faults["metrics_truncated"] += truncated
        self.faults["engines_dropped"] += engines_dropped
        if self.server_state[server] == LOST:
            self._back(self.names[server], samples[0].t_ns if samples else time.perf_counter_ns())
        self.server_state[server], self.server_error[server] = OK, None
        labels = {s.engine for s in samples}
        for eng in self.engines.values():  # an engine the page no longer has is out of the fleet now
            if eng.server == server and eng.last is not None and eng.label not in labels:
                eng.connected = False
        for sample in samples:
            eng = self.engine(server, sample.engine)
            if eng is not None:
                self._sample(eng, sample)

    def _sample(self, eng: EngineState, sample: MetricsSample) -> None:
        if eng.last is None:
            eng.hist_base = dict(sample.histograms)
        else:
            for name, value in eng.last.counters.items():  # one missing from this page: as it was
                sample.counters.setdefault(name, value)
            if restarted(eng.last, sample):  # the server started again: its counters and cache are new
                self.faults["server_restarts"] += 1
                eng.hist_done, eng.hist_base = eng.histograms(), {}
                eng.residency.clear()
        deltas = interval(eng.last, sample)
        pending = self._pending.setdefault(eng.key, {})
        for name, value in deltas.items():
            eng.totals[name] = eng.totals.get(name, 0.0) + value
            pending[name] = pending.get(name, 0.0) + value
        eng.last, eng.connected = sample, True
        eng.num_gpu_blocks = sample.num_gpu_blocks or eng.num_gpu_blocks
        eng.block_size = sample.block_size or eng.block_size
        if sample.model_name and not self.watch["model"]:
            self.watch["model"] = sample.model_name

    def on_scrape_error(self, server: int, message: str, t_ns: int) -> None:
        self.faults["scrape_errors"] += 1
        if self.server_state[server] == OK:
            self.server_state[server] = LOST
            self.lost = [*self.lost[-(MAX_LOST - 1):], [self.names[server], t_ns, None]]
        self.server_error[server] = message[:MAX_LABEL * 2]
        for eng in self.engines.values():
            if eng.server == server:
                eng.connected = False

    def _back(self, name: str, t_ns: int) -> None:
        for span in self.lost:
            if span[0] == name and span[2] is None:
                span[2] = t_ns

    def on_events(self, server: int, batch: EventBatch, t_ns: int, rank: int | None = None) -> None:
        """A batch from the publisher of ``server`` (``rank``: its data-parallel rank when the batch
        does not say)."""
        label = batch.data_parallel_rank if batch.data_parallel_rank is not None else (rank or 0)
        self.faults["event_batches"] += 1
        self.faults["events_malformed"] += batch.num_malformed
        eng = self.engine(server, str(label))
        if eng is None:
            return
        eng.has_events = True
        eng.residency.apply_all(batch.events, t_ns)
        self.fleet_hashes.note_all(k for e in batch.events if isinstance(e, BlockStored) for k in e.block_hashes)
        self.faults["blocks_forgotten"] = sum(e.residency.num_forgotten for e in self.engines.values())

    def on_event_restart(self, server: int, rank: int) -> None:
        """The publisher started again (its seq went back to 0): the engine's cache starts empty."""
        self.faults["event_restarts"] += 1
        eng = self.engine(server, str(rank))
        if eng is not None:
            eng.residency.clear()

    def on_plugin(self, server: int, obj: dict[str, Any]) -> None:
        """One plugin line (``plugin_format.py``; every field checked in ``plugin_steps.apply_line``)."""
        self.faults["plugin_lines"] += 1
        label = obj.get("engine", 0)
        if isinstance(label, bool) or not ((isinstance(label, int) and 0 <= label < MAX_RANK)
                                           or (isinstance(label, str) and 0 < len(label) <= MAX_LABEL)):
            self.faults["plugin_malformed"] += 1
            return
        eng = self.engine(server, str(label))
        if eng is not None and not apply_line(self, eng, obj):
            self.faults["plugin_malformed"] += 1

    def on_spans(self, rows: list[dict[str, Any]], counts: dict[str, int]) -> None:
        """Request rows of vLLM's OTLP spans (``otlp.py``: checked there) and the receiver's counts so far: each
        row a request's lane, from its arrival to its end (arrival + end-to-end latency)."""
        for name, value in counts.items():
            self.faults[name] = value
        for row in rows:
            if self.spans_seen.note(row["span_id"]):
                self.faults["otlp_spans_duplicate"] += 1
                continue
            arrival = self.unix_to_ns(row["arrival_time"])
            t_end = arrival + int(min(row["e2e_latency_s"], MAX_SPAN_S) * 1e9)
            self._new_events.extend(request_events(row, t_end, f"otlp#{self.num_lanes}", arrival))
            self.num_lanes += 1

    # ---- ticks -------------------------------------------------------------------------------------------
    def tick(self, t_ns: int, *, layout: bool = False,
             force: bool = True) -> tuple[list[StepRecord], list[RequestEvent]]:
        """Close the interval ending at ``t_ns``: a lane row per engine (and the fleet), the records and
        events it made, and a fresh ``watch`` description (``layout``: with the residency icicles;
        ``force=False``: a huge tree's shape may lag up to a second, see ``watch_meta``)."""
        self._age(t_ns)
        fleet = {c: None for c in LANE_COLUMNS}
        sums = dict.fromkeys(COUNTER_OF, 0.0)
        any_connected = False
        lanes = self.watch["lanes"]
        for eng in self.engines.values():
            if eng.gone:
                continue
            row = eng.lane_row(self._pending.get(eng.key, {}))
            lanes[eng.key] = append_row(lanes[eng.key], row, t_ns)
            for name, value in row.items():
                if value is not None and name not in ("connected", "kv_usage"):
                    fleet[name] = (fleet[name] or 0) + value
            any_connected |= bool(row["connected"])
            for name in sums:
                sums[name] += self._pending.get(eng.key, {}).get(COUNTER_OF[name], 0.0)
            self._pending.pop(eng.key, None)
        fleet["connected"] = any_connected
        live = [e for e in self.engines.values() if not e.gone]
        kv = fleet_kv(live, self.plugin_records)
        fleet["kv_usage"] = kv.block_usage if any_connected else None
        self.watch["fleet"] = append_row(self.watch["fleet"], fleet, t_ns)
        if not self.plugin_records and any_connected:
            computed = sums["computed_prompt_tokens"] if self._has_by_source() else \
                max(sums["prompt_tokens"] - sums["prefix_hits"], 0.0)
            self._new_records.append(interval_record(t_ns, sums, computed, fleet_queues(live, False), kv))
        records = sorted(self._new_records, key=lambda r: r.t_end_ns)
        events = sorted(self._new_events, key=lambda e: e.t_ns)
        self._new_records, self._new_events = [], []
        for record in records:
            record.step, self.step = self.step, self.step + 1
        last_step = max(self.step - 1, 0)
        for event in events:
            event.step = last_step
        self.refresh(layout=layout, force=force)
        return records, events

    def _age(self, t_ns: int) -> None:
        """Engines nothing came of for ``ENGINE_TTL_S`` are gone (out of the fleet; their lanes stop)."""
        for eng in self.engines.values():
            if not eng.gone and t_ns - eng.seen_ns > ENGINE_TTL_S * 1e9:
                eng.gone, eng.connected = True, False
                eng.plugin.clear()

    def _has_by_source(self) -> bool:
        return any(COUNTER_OF["computed_prompt_tokens"] in (e.last.counters if e.last else {})
                   for e in self.engines.values())

    def add_record(self, record: StepRecord, events: list[RequestEvent]) -> None:
        """A record (and request events) the plugin's lines made, numbered at the next tick."""
        self._new_records.append(record)
        self._new_events.extend(events)
        self.num_lanes += len(events) // 4

    def state_of(self, eng: EngineState) -> str:
        if eng.gone:
            return GONE
        return self.server_state[eng.server] if eng.last is not None or eng.plugin else WAITING

    def refresh(self, *, layout: bool = False, force: bool = True) -> None:
        """Replace the derived parts of ``watch`` (engines, totals, histograms, residency, faults);
        ``force=False`` lets a huge residency tree lag up to a second behind (see ``watch_meta``)."""
        describe(self, layout=layout, force=force)
