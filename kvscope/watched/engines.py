"""What the watch keeps per engine (``EngineState``), the lane columns, and small readers of untrusted
numbers (pages, plugin lines and files may hold anything)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvscope.watched import kv_transfer as kvt
from kvscope.watched.limits import MAX_COUNT
from kvscope.watched.residency import Residency
from kvscope.watched.samples import Histogram, MetricsSample
from kvscope.watched.watch_meta import LANE_COLUMNS

WATCH_FORMAT_VERSION = 1
COUNTER_OF = {  # lane / totals column -> vLLM counter
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "finished": "vllm:request_success_total",
    "computed_prompt_tokens": "vllm:prompt_tokens_by_source_total{source=local_compute}",
}
HIST_NAMES = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
              "e2e": "vllm:e2e_request_latency_seconds", "queue": "vllm:request_queue_time_seconds"}
LOST, OK, WAITING, GONE = "connection lost", "ok", "waiting", "gone"


def finite(value: Any) -> float | None:
    """``value`` as a finite float, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def finite_in(value: Any, low: float, high: float) -> float | None:
    """``value`` as a float in ``[low, high]``, else ``None``."""
    v = finite(value)
    return v if v is not None and low <= v <= high else None


def count(value: Any) -> int:
    """``value`` as a count: a non-negative int of at most ``MAX_COUNT`` (so files load back); 0 for what
    is not a finite number."""
    v = finite(value)
    return min(max(round(v), 0), MAX_COUNT) if v is not None else 0


def server_name(url: str) -> str:
    """``http://127.0.0.1:8000/metrics`` -> ``127.0.0.1:8000``."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0] or url


def hist_json(h: Histogram) -> dict[str, Any]:
    """A histogram as JSON values (``"+Inf"`` for the last bound: JSON has no infinity)."""
    return {"le": ["+Inf" if math.isinf(le) else le for le, _ in h.buckets], "counts": [c for _, c in h.buckets],
            "sum": h.sum, "count": h.count}


def _hist_add(a: Histogram | None, b: Histogram) -> Histogram:
    if a is None or [le for le, _ in a.buckets] != [le for le, _ in b.buckets]:
        return Histogram(list(b.buckets), b.sum, b.count)
    return Histogram([(le, x + y) for (le, x), (_, y) in zip(a.buckets, b.buckets)], a.sum + b.sum, a.count + b.count)


@dataclass(slots=True)
class EngineState:
    """One engine (a server's ``engine`` label, or a data-parallel rank) as the watch knows it."""

    key: str  # "host:port/engine"
    server: int  # index into the watched URLs
    label: str
    last: MetricsSample | None = None
    totals: dict[str, float] = field(default_factory=dict)  # counters since the watch began
    hist_base: dict[str, Histogram] = field(default_factory=dict)  # as at the first sample (or a restart)
    hist_done: dict[str, Histogram] = field(default_factory=dict)  # observed before a restart
    residency: Residency = field(default_factory=Residency)
    has_events: bool = False
    plugin: dict[str, Any] = field(default_factory=dict)  # the latest plugin step's state
    plugin_totals: dict[str, float] = field(default_factory=dict)
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    config: dict[str, Any] | None = None  # the server's settings, from the plugin's start line (plugin_config.py)
    connected: bool = False
    seen_ns: int = 0  # when data of it last came (a sample, events, a plugin line)
    gone: bool = False  # nothing came for ENGINE_TTL_S: out of the fleet, its lane stops (back when data comes)
    transfer_before: dict[str, Any] | None = None  # the KV-transfer entry at the last lane row
    transfer_cache: tuple[Any, Any] = (None, None)  # (the sample it was made from, the KV-transfer entry)

    def histograms(self, bases: tuple[str, ...] | None = None) -> dict[str, Histogram]:
        """Observations since the watch began (across restarts); ``bases``: only those families (a split
        series, ``name{label=value}``, by its name)."""
        now = self.last.histograms if self.last is not None else {}
        out = dict(self.hist_done) if bases is None else {
            k: h for k, h in self.hist_done.items() if k.split("{", 1)[0] in bases}
        for name, h in now.items():
            if bases is None or name.split("{", 1)[0] in bases:
                out[name] = _hist_add(self.hist_done.get(name), h.minus(self.hist_base.get(name)))
        return out

    def totals_json(self) -> dict[str, Any]:
        """Counters since the watch began, by lane name (``meta["watch"]["totals"][engine]``), with the
        finishes by reason and the plugin's totals."""
        t: dict[str, Any] = {name: count(self.totals.get(counter)) for name, counter in COUNTER_OF.items()}
        if COUNTER_OF["computed_prompt_tokens"] not in self.totals:  # an older vLLM: prompt less cache hits
            t["computed_prompt_tokens"] = max(t["prompt_tokens"] - t["prefix_hits"], 0)
        t["finished_by_reason"] = {
            k.split("=", 1)[1].rstrip("}"): count(v) for k, v in self.totals.items()
            if k.startswith("vllm:request_success_total{")}
        if self.plugin_totals:
            t["plugin"] = {k: count(v) for k, v in self.plugin_totals.items()}
        return t

    def histograms_json(self) -> dict[str, dict[str, Any]]:
        """The latency histograms since the watch began, by short name (``ttft``, ``itl``, ...), as JSON."""
        hists = self.histograms()
        return {short: hist_json(h) for short, name in HIST_NAMES.items() if (h := hists.get(name)) is not None}

    def transfer_json(self) -> dict[str, Any] | None:
        """The engine's KV transfers and role since the watch began (``kv_transfer.engine_entry``); ``None``
        when its page shows no KV connector."""
        if self.last is None:
            return None
        if self.transfer_cache[0] is self.last:  # a new sample (or a restart) replaces ``last``
            return self.transfer_cache[1]
        names = [*self.last.counters, *self.last.histograms]
        entry = None
        if kvt.connectors(names) or any(k.startswith(kvt.KV_FETCH) for k in self.last.gauges):
            hists = {name: hist_json(h) for name, h in self.histograms(kvt.HISTOGRAMS).items()}
            entry = kvt.engine_entry(names, self.last.gauges, self.totals, hists)
        self.transfer_cache = (self.last, entry)
        return entry

    def lane_row(self, pending: dict[str, float]) -> dict[str, Any]:
        """This interval's row of the engine's lane (``LANE_COLUMNS``; ``None`` where not known), from its
        last sample, its counter deltas since the last tick (``pending``, by vLLM counter) and its KV events."""
        row: dict[str, Any] = dict.fromkeys(LANE_COLUMNS)
        row["connected"] = self.connected
        if self.connected and self.last is not None:
            g = self.last.gauges
            row["running"] = g.get("vllm:num_requests_running")
            row["waiting"] = g.get("vllm:num_requests_waiting")
            row["kv_usage"] = g.get("vllm:kv_cache_usage_perc")
            for name in ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "preemptions",
                         "finished"):
                row[name] = count(pending.get(COUNTER_OF[name], 0.0))
            entry = self.transfer_json()
            row["kv_transfers"], row["kv_transfer_bytes"], row["kv_offload_bytes"] = \
                kvt.interval_values(entry, self.transfer_before)
            self.transfer_before = entry
        if self.has_events:
            counts = self.residency.take_interval()
            row["blocks_stored"] = counts.stored
            row["blocks_evicted"] = counts.removed + counts.cleared
            row["blocks_resident"] = self.residency.num_resident
        return row
