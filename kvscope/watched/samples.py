"""A vLLM ``/metrics`` page read into one ``MetricsSample`` per engine, and the counter deltas between samples.

The text is parsed with ``prometheus_client``'s own parser, one metric family at a time (``page.families``),
so a damaged family (a bad line, a value that is not a number) is counted in ``num_malformed`` and skipped
while the rest of the page still counts. Families kvscope does not read are skipped by their name, unparsed;
every value is checked (finite, in the range its series can hold) and a bad one counted and dropped. Samples
are sorted by their ``engine`` label (vLLM labels every series with ``model_name`` and ``engine``; a
data-parallel server has one engine per rank).

Counters are cumulative since the server started; ``interval`` turns two samples into deltas, and a
counter that went down means the server restarted (its deltas then start from zero). Histograms keep
their cumulative buckets (``summary.quantile`` estimates percentiles from them, as Prometheus'
``histogram_quantile`` does: estimates, never exact).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from kvscope.watched import kv_transfer as kvt
from kvscope.watched.limits import (
    MAX_BLOCK_SIZE,
    MAX_BUCKETS,
    MAX_COUNTERS,
    MAX_ENGINES,
    MAX_HISTOGRAMS,
    MAX_INFO_LABELS,
    MAX_LABEL,
    MAX_NUM_BLOCKS,
    MAX_QUEUE,
    MAX_VALUE,
)
from kvscope.watched.page import families

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", *kvt.GAUGES)
COUNTERS = (
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total", "vllm:request_success_total",
    "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_by_source_total", *kvt.COUNTERS,
)
# series kept per value of one label, as "name{label=value}" (counters: also summed under their name;
# gauges and histograms: only split); the KV-transfer families are kv_transfer.py's
SPLIT_BY = {"vllm:request_success_total": "finished_reason", "vllm:prompt_tokens_by_source_total": "source",
            **kvt.SPLIT_BY}
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    *kvt.HISTOGRAMS,
)
CACHE_INFO = "vllm:cache_config_info"
_HIST_SAMPLES = {f"{h}{s}": (h, s) for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
WANTED_SAMPLES = frozenset((*GAUGES, *COUNTERS, *_HIST_SAMPLES, CACHE_INFO))
WANTED_BASES = frozenset((*GAUGES, *(c.removesuffix("_total") for c in COUNTERS), *HISTOGRAMS, CACHE_INFO))



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
    gauges: dict[str, float] = field(default_factory=dict)  # split ones as counters: 'name{stage=in_progress}'
    # full sample names, e.g. vllm:prompt_tokens_total (summed over other labels), and per SPLIT_BY label
    # value, e.g. 'vllm:request_success_total{finished_reason=stop}'
    counters: dict[str, float] = field(default_factory=dict)
    # split ones by their label: 'vllm:kv_offload_size{transfer_type=..}'
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_info: dict[str, str] = field(default_factory=dict)  # labels of vllm:cache_config_info

    def gauge(self, name: str) -> float | None:
        return self.gauges.get(name)

    @property
    def block_size(self) -> int | None:
        return _int(self.cache_info.get("block_size"), MAX_BLOCK_SIZE)

    @property
    def num_gpu_blocks(self) -> int | None:
        return _int(self.cache_info.get("num_gpu_blocks"), MAX_NUM_BLOCKS)


@dataclass(slots=True)
class Scrape:
    """What one fetch of ``/metrics`` gave: a sample per engine, how many families or values were damaged,
    whether the page was cut (``MAX_PAGE_BYTES``, ``MAX_SAMPLE_LINES``), and engines beyond ``MAX_ENGINES``."""

    samples: list[MetricsSample]
    num_malformed: int = 0
    truncated: bool = False
    num_engines_dropped: int = 0


def _int(value: str | None, top: int) -> int | None:
    """A label's whole number in 1..``top`` (``None`` for anything else: absent, not a number, out of range)."""
    try:
        number = float(value) if value not in (None, "", "None") else math.nan
    except (TypeError, ValueError):
        return None
    return int(number) if 1 <= number <= top else None


def _plausible(name: str, value: object) -> float | None:
    """``value`` if it is a number the series can hold (finite; counts and times >= 0 and below 2**53;
    queue lengths below 2**31; KV usage a fraction, a hair above 1 read as 1), else ``None``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    value = float(value)
    if name == "vllm:kv_cache_usage_perc":
        return min(value, 1.0) if 0.0 <= value <= 1.0 + 1e-6 else None
    top = MAX_QUEUE if name in GAUGES else MAX_VALUE
    return value if 0.0 <= value <= top else None


def parse(text: str, t_ns: int | None = None) -> Scrape:
    """The samples of a ``/metrics`` page, one ``MetricsSample`` per ``engine`` label (at most
    ``MAX_ENGINES``); every value checked (``_plausible``): a bad one is counted in ``num_malformed``."""
    t_ns = time.perf_counter_ns() if t_ns is None else t_ns
    counts = [0, 0]
    by_engine: dict[str, MetricsSample] = {}
    dropped: set[str] = set()
    for family in families(text, WANTED_SAMPLES, WANTED_BASES, counts):
        for s in family.samples:
            name, labels = s.name, s.labels
            if name not in WANTED_SAMPLES:
                continue
            value = _plausible(name, s.value) if name != CACHE_INFO else 0.0
            engine = str(labels.get("engine", "0"))
            if value is None or len(engine) > MAX_LABEL:
                counts[0] += 1
                continue
            sample = by_engine.get(engine)
            if sample is None:
                if len(by_engine) >= MAX_ENGINES:
                    dropped.add(engine)
                    continue
                sample = by_engine[engine] = MetricsSample(t_ns, engine)
            model = labels.get("model_name")
            if sample.model_name is None and model and len(model) <= MAX_LABEL:
                sample.model_name = model
            if not _add(sample, name, labels, value):
                counts[0] += 1
    for sample in by_engine.values():
        for h in sample.histograms.values():
            h.buckets.sort()
    samples = sorted(by_engine.values(), key=lambda s: (len(s.engine), s.engine))
    return Scrape(samples, counts[0], truncated=bool(counts[1]), num_engines_dropped=len(dropped))


def _split(name: str, labels: dict, into: dict, top: int) -> str | None:
    """The key of ``name`` in ``into``: ``name{label=value}`` for a series split by a label (``None`` when
    ``into`` holds ``top`` keys already and this would be a new one), else ``name``."""
    split = SPLIT_BY.get(name)
    if split is None:
        return name
    key = kvt.split_key(name, split, str(labels.get(split, "?"))[:MAX_LABEL])
    return key if key in into or len(into) < top else None


def _add(sample: MetricsSample, name: str, labels: dict, value: float) -> bool:
    """One checked sample into ``sample``; ``False`` if it cannot be used (a bad bucket bound, or one series
    more than ``MAX_COUNTERS`` / ``MAX_HISTOGRAMS``)."""
    if name in GAUGES:
        key = _split(name, labels, sample.gauges, MAX_COUNTERS)
        if key is None:
            return False
        sample.gauges[key] = sample.gauges.get(key, 0.0) + value if key != name else value
    elif name in COUNTERS:
        key = _split(name, labels, sample.counters, MAX_COUNTERS)
        if key is None:
            return False
        sample.counters[name] = sample.counters.get(name, 0.0) + value
        if key != name:
            sample.counters[key] = sample.counters.get(key, 0.0) + value
    elif name == CACHE_INFO:
        sample.cache_info = {k: v for k, v in list(labels.items())[:MAX_INFO_LABELS]
                             if k not in ("engine", "model_name") and len(v) <= MAX_LABEL}
    else:
        return _add_hist(sample, *_HIST_SAMPLES[name], labels, value)
    return True


def _add_hist(sample: MetricsSample, base: str, suffix: str, labels: dict, value: float) -> bool:
    key = _split(base, labels, sample.histograms, MAX_HISTOGRAMS)
    if key is None or (key not in sample.histograms and len(sample.histograms) >= MAX_HISTOGRAMS):
        return False
    hist = sample.histograms.setdefault(key, Histogram())
    if suffix == "_sum":
        hist.sum += value
    elif suffix == "_count":
        hist.count += value
    else:
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            return False
        if math.isnan(le) or le < 0:
            return False
        for i, (bound, count) in enumerate(hist.buckets):  # several label sets: add them up
            if bound == le:
                hist.buckets[i] = (le, count + value)
                return True
        if len(hist.buckets) >= MAX_BUCKETS:
            return False
        hist.buckets.append((le, value))
    return True


def restarted(before: MetricsSample, after: MetricsSample) -> bool:
    """A counter went down: the server behind the URL started again (a counter missing from ``after``, as
    on a truncated page, is no restart)."""
    return any(k in after.counters and after.counters[k] < v for k, v in before.counters.items())


def interval(before: MetricsSample | None, after: MetricsSample) -> dict[str, float]:
    """Counter increases from ``before`` to ``after``: none for the first sample (the baseline, what the
    server did before the watch), all of ``after`` when the server restarted in between."""
    if before is None:
        return dict.fromkeys(after.counters, 0.0)
    base = {} if restarted(before, after) else before.counters
    return {k: max(v - base.get(k, 0.0), 0.0) for k, v in after.counters.items()}
