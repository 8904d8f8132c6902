"""What the watch keeps per engine (``EngineState``), the lane columns, and small readers of untrusted
numbers (pages, plugin lines and files may hold anything)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvscope.watch.metrics import Histogram, MetricsSample
from kvscope.watch.residency import Residency

WATCH_FORMAT_VERSION = 1
# per-interval lane columns (meta["watch"]["lanes"][engine]); None where not known (not connected)
LANE_COLUMNS = (
    "connected", "running", "waiting", "kv_usage", "prompt_tokens", "generation_tokens", "prefix_queries",
    "prefix_hits", "preemptions", "finished", "blocks_stored", "blocks_evicted", "blocks_resident",
)
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
LOST, OK, WAITING = "connection lost", "ok", "waiting"


def finite(value: Any) -> float | None:
    """``value`` as a finite float, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def count(value: Any) -> int:
    """``value`` as a count (a non-negative int; 0 for what is not a finite number)."""
    v = finite(value)
    return max(round(v), 0) if v is not None else 0


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
    connected: bool = False

    def histograms(self) -> dict[str, Histogram]:
        """Observations since the watch began (across restarts)."""
        now = self.last.histograms if self.last is not None else {}
        out = dict(self.hist_done)
        for name, h in now.items():
            out[name] = _hist_add(self.hist_done.get(name), h.minus(self.hist_base.get(name)))
        return out
