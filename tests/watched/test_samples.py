"""Parsing /metrics pages: vLLM 0.32's real page (captured from an idle server), the fakes' pages, damaged
pages (counted, the rest still read), counter intervals across a restart, and histogram differences."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fakes import FakeServer, render

from kvscope.watched.samples import Histogram, MetricsSample, interval, parse

REAL_PAGE = Path(__file__).parent / "data" / "vllm-0.32-metrics.txt"


def test_a_real_vllm_0_32_page():
    page = parse(REAL_PAGE.read_text())
    assert page.num_malformed == 0
    (sample,) = page.samples  # python_* / process_* / http_* series are no engine's
    assert sample.engine == "0" and sample.model_name == "/tmp/w1-model"
    assert set(sample.gauges) == {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    # 0.32 types counters under their _total name, with _created as a gauge family of its own
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:request_success_total{finished_reason=length}",
                 "vllm:prompt_tokens_by_source_total{source=local_compute}"):
        assert sample.counters[name] == 0.0, name
    assert not any("created" in name for name in sample.counters)
    assert (sample.block_size, sample.num_gpu_blocks) == (32, 16384)
    ttft = sample.histograms["vllm:time_to_first_token_seconds"]
    assert ttft.buckets[-1][0] == math.inf and ttft.count == 0
    assert [le for le, _ in ttft.buckets] == sorted(le for le, _ in ttft.buckets)


def test_engines_are_split_by_their_label():
    server = FakeServer(["0", "1"])
    server.engines["1"].prompt_tokens = 7
    server.engines["1"].finished = {"stop": 2, "length": 3}
    server.engines["1"].ttft = [0.003, 0.03, 0.3]
    page = parse(render(server.engines), t_ns=123)
    assert [s.engine for s in page.samples] == ["0", "1"]
    one = page.samples[1]
    assert one.t_ns == 123 and one.counters["vllm:prompt_tokens_total"] == 7
    assert one.counters["vllm:request_success_total"] == 5
    assert one.counters["vllm:request_success_total{finished_reason=stop}"] == 2
    h = one.histograms["vllm:time_to_first_token_seconds"]
    assert (h.count, round(h.sum, 3)) == (3, 0.333)
    assert dict(h.buckets)[0.005] == 1 and dict(h.buckets)[0.04] == 2 and dict(h.buckets)[math.inf] == 3


def test_damaged_families_are_counted_and_the_rest_still_read():
    text = render(FakeServer(1).engines)
    bad = text.replace('vllm:num_requests_waiting{engine="0"', 'vllm:num_requests_waiting{engine="0""', 1)
    page = parse(bad)
    assert page.num_malformed == 1
    (sample,) = page.samples
    assert "vllm:num_requests_waiting" not in sample.gauges
    assert "vllm:num_requests_running" in sample.gauges and "vllm:prompt_tokens_total" in sample.counters
    nan = text.replace('vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0',
                       'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} NaN')
    assert nan != text
    page = parse(nan)
    assert page.num_malformed == 1 and "vllm:kv_cache_usage_perc" not in page.samples[0].gauges


@pytest.mark.parametrize("text", ["", "not a metrics page at all {{{", "\x00\x01\x02", "# TYPE x counter\nx{ 1\n"])
def test_garbage_gives_no_samples_and_no_exception(text):
    page = parse(text)
    assert page.samples == []


def sample(**counters) -> MetricsSample:
    return MetricsSample(0, "0", counters={f"vllm:{k}_total": float(v) for k, v in counters.items()})


def test_intervals_count_from_the_first_sample_and_across_a_restart():
    first = sample(prompt_tokens=100, generation_tokens=10)
    assert interval(None, first) == {"vllm:prompt_tokens_total": 0.0, "vllm:generation_tokens_total": 0.0}
    later = sample(prompt_tokens=150, generation_tokens=14)
    assert interval(first, later) == {"vllm:prompt_tokens_total": 50.0, "vllm:generation_tokens_total": 4.0}
    restarted = sample(prompt_tokens=20, generation_tokens=2)  # the server started again in between
    assert interval(later, restarted) == {"vllm:prompt_tokens_total": 20.0, "vllm:generation_tokens_total": 2.0}


def test_histogram_minus_and_reset():
    a = Histogram([(0.1, 1.0), (math.inf, 2.0)], 0.3, 2.0)
    b = Histogram([(0.1, 4.0), (math.inf, 6.0)], 1.0, 6.0)
    d = b.minus(a)
    assert d.buckets == [(0.1, 3.0), (math.inf, 4.0)] and d.count == 4.0 and d.sum == pytest.approx(0.7)
    assert a.minus(b).count == a.count  # went down: a reset, so all of it
    assert b.minus(None).count == 6.0
