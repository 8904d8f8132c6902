"""Scraping a vLLM server's Prometheus ``/metrics`` into one ``MetricsSample`` per engine.

The text is parsed with ``prometheus_client``'s own parser, one metric family at a time, so a damaged
family (a bad line, a value that is not a number) is counted in ``num_malformed`` and skipped while the
rest of the page still counts. Samples are sorted by their ``engine`` label (vLLM labels every series
with ``model_name`` and ``engine``; a data-parallel server has one engine per rank).

Counters are cumulative since the server started; ``interval`` turns two samples into deltas, and a
counter that went down means the server restarted (its deltas then start from zero). Histograms keep
their cumulative buckets (``summary.quantile`` estimates percentiles from them, as Prometheus'
``histogram_quantile`` does: estimates, never exact).
"""

from __future__ import annotations

import math
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total", "vllm:request_success_total",
    "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_by_source_total",
)
# counters also kept per value of one label, as "name{label=value}"
SPLIT_BY = {"vllm:request_success_total": "finished_reason", "vllm:prompt_tokens_by_source_total": "source"}
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
)
CACHE_INFO = "vllm:cache_config_info"
_FAMILY_START = re.compile(r"^# (?:HELP|TYPE) (\S+)", re.M)


@dataclass(slots=True)
class Histogram:
    """Cumulative bucket counts (``le`` ascending, the last one ``inf``), their sum and count."""

    buckets: list[tuple[float, float]] = field(default_factory=list)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, before: Histogram | None) -> Histogram:
        """The observations since ``before`` (the whole histogram when the bounds differ or it reset)."""
        if before is None or [le for le, _ in before.buckets] != [le for le, _ in self.buckets] \
                or before.count > self.count:
            return Histogram(list(self.buckets), self.sum, self.count)
        buckets = [(le, c - b) for (le, c), (_, b) in zip(self.buckets, before.buckets)]
        return Histogram(buckets, self.sum - before.sum, self.count - before.count)


@dataclass(slots=True)
class MetricsSample:
    """One engine's series from one scrape (``t_ns``: ``perf_counter_ns`` when the page arrived)."""

    t_ns: int
    engine: str  # the ``engine`` label ("0" when absent)
    model_name: str | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    # full sample names, e.g. vllm:prompt_tokens_total (summed over other labels), and per SPLIT_BY label
    # value, e.g. 'vllm:request_success_total{finished_reason=stop}'
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_info: dict[str, str] = field(default_factory=dict)  # labels of vllm:cache_config_info

    def gauge(self, name: str) -> float | None:
        return self.gauges.get(name)

    @property
    def block_size(self) -> int | None:
        return _int(self.cache_info.get("block_size"))

    @property
    def num_gpu_blocks(self) -> int | None:
        return _int(self.cache_info.get("num_gpu_blocks"))


@dataclass(slots=True)
class Scrape:
    """What one fetch of ``/metrics`` gave: a sample per engine, and how many families were damaged."""

    samples: list[MetricsSample]
    num_malformed: int = 0


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _families(text: str, num_bad: list[int]):
    """Every metric family of ``text``, each parsed on its own; a family that fails is counted and skipped."""
    starts = sorted({m.start() for m in _FAMILY_START.finditer(text)} | {0})
    chunks, names = [], []
    for a, b in zip(starts, [*starts[1:], len(text)]):
        chunk = text[a:b]
        name = _FAMILY_START.match(chunk)
        if chunks and name and names[-1] == name.group(1):  # HELP and TYPE of one family belong together
            chunks[-1] += chunk
        else:
            chunks.append(chunk)
            names.append(name.group(1) if name else None)
    for chunk in chunks:
        if not chunk.strip():
            continue
        try:
            yield from list(text_string_to_metric_families(chunk))
        except Exception:  # the parser raises ValueError, TypeError, IndexError, ... on damaged text
            num_bad[0] += 1


def parse(text: str, t_ns: int | None = None) -> Scrape:
    """The samples of a ``/metrics`` page, one ``MetricsSample`` per ``engine`` label."""
    t_ns = time.perf_counter_ns() if t_ns is None else t_ns
    num_bad = [0]
    by_engine: dict[str, MetricsSample] = {}
    wanted_hist = {f"{h}{s}": (h, s) for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
    for family in _families(text, num_bad):
        for s in family.samples:
            name, labels, value = s.name, s.labels, s.value
            if not name.startswith("vllm:"):  # the process's own series (python_gc_*, http_*): not an engine's
                continue
            if not isinstance(value, (int, float)) or math.isnan(value):
                num_bad[0] += 1
                continue
            engine = str(labels.get("engine", "0"))
            sample = by_engine.get(engine)
            if sample is None:
                sample = by_engine[engine] = MetricsSample(t_ns, engine)
            if sample.model_name is None and "model_name" in labels:
                sample.model_name = labels["model_name"]
            if name in GAUGES:
                sample.gauges[name] = float(value)
            elif name in COUNTERS:
                sample.counters[name] = sample.counters.get(name, 0.0) + float(value)
                split = SPLIT_BY.get(name)
                if split is not None:
                    key = f"{name}{{{split}={labels.get(split, '?')}}}"
                    sample.counters[key] = sample.counters.get(key, 0.0) + float(value)
            elif name in wanted_hist:
                _add_hist(sample, *wanted_hist[name], labels, float(value), num_bad)
            elif name == CACHE_INFO:
                sample.cache_info = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
    for sample in by_engine.values():
        for h in sample.histograms.values():
            h.buckets.sort()
    return Scrape(sorted(by_engine.values(), key=lambda s: (len(s.engine), s.engine)), num_bad[0])


def _add_hist(sample: MetricsSample, base: str, suffix: str, labels: dict, value: float, num_bad: list[int]) -> None:
    hist = sample.histograms.setdefault(base, Histogram())
    if suffix == "_sum":
        hist.sum += value
    elif suffix == "_count":
        hist.count += value
    else:
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            num_bad[0] += 1
            return
        for i, (bound, count) in enumerate(hist.buckets):  # several label sets: add them up
            if bound == le:
                hist.buckets[i] = (le, count + value)
                return
        hist.buckets.append((le, value))


class ScrapeError(Exception):
    """``/metrics`` could not be fetched (refused, timed out, not HTTP 200, not text)."""


def metrics_url(url: str) -> str:
    """``http://host:port`` -> ``http://host:port/metrics`` (a URL already ending in /metrics is kept)."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/metrics") else url + "/metrics"


def fetch(url: str, timeout: float = 2.0) -> str:
    """The text of ``url``'s ``/metrics`` page; ``ScrapeError`` saying why not."""
    target = metrics_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = response.read(64 << 20)
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{target}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ScrapeError(f"{target}: {reason}") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError(f"{target}: the page is not UTF-8 text") from None


def scrape(url: str, timeout: float = 2.0) -> Scrape:
    text = fetch(url, timeout)
    return parse(text, time.perf_counter_ns())


def restarted(before: MetricsSample, after: MetricsSample) -> bool:
    """A counter went down: the server behind the URL started again."""
    return any(after.counters.get(k, 0.0) < v for k, v in before.counters.items())


def interval(before: MetricsSample | None, after: MetricsSample) -> dict[str, float]:
    """Counter increases from ``before`` to ``after``: none for the first sample (the baseline, what the
    server did before the watch), all of ``after`` when the server restarted in between."""
    if before is None:
        return dict.fromkeys(after.counters, 0.0)
    base = {} if restarted(before, after) else before.counters
    return {k: max(v - base.get(k, 0.0), 0.0) for k, v in after.counters.items()}
