"""What a watch description adds up to: the summary's keys (fleet and per engine), estimates from buckets,
what cannot be known (NaN), any damaged description read without an exception; the trace's engine tracks."""

from __future__ import annotations

import math

import pytest
from fakes import EngineMetrics, render, stored

from kvscope.watched.events import EventBatch, parse_event
from kvscope.watched.samples import parse
from kvscope.watched.source import WatchSource
from kvscope.watched.summary import (
    ESTIMATED,
    UNKNOWN,
    engine_tracks,
    fleet_kpis,
    merged,
    quantile,
    watch_summary,
)

URLS = ["http://a:1", "http://b:2"]


def two_servers() -> WatchSource:
    src = WatchSource(URLS, t0_ns=0)
    servers = [{"0": EngineMetrics()}, {"0": EngineMetrics()}]
    for t in (1_000_000_000, 2_000_000_000):
        for i, engines in enumerate(servers):
            m = engines["0"]
            m.prompt_tokens += 100 * (i + 1)
            m.generation_tokens += 10 * (i + 1)
            m.prefix_queries += 100
            m.prefix_hits += 50 * i
            m.ttft += [0.015, 0.03, 0.07]
            m.kv_usage = 0.5
            src.on_scrape(i, parse(render(engines), t).samples)
        src.on_events(0, EventBatch(0.0, [parse_event(stored([t, t + 1]))], 0), t)
        src.tick(t)
    return src


def test_summary_keys_with_a_per_engine_split():
    s = watch_summary(two_servers().watch)
    assert (s["prompt_tokens"], s["generation_tokens"]) == (300, 30)  # the second poll's deltas
    assert (s["prefix_cache_queries"], s["prefix_cache_hit_tokens"], s["prefix_cache_hit_rate"]) == (200, 50, 0.25)
    assert s["kv_blocks_stored"] == 4 and s["preemptions"] == 0 and s["num_engines"] == 2
    a, b = s["engines"]["a:1/0"], s["engines"]["b:2/0"]
    assert (a["prompt_tokens"], b["prompt_tokens"], a["kv_blocks_stored"], b["kv_blocks_stored"]) == (100, 200, 4, None)
    assert a["state"] == "ok" and b["prefix_cache_hit_rate"] == 0.5
    # three observations per engine since the baseline: 0.015 (<= 0.02), 0.03 (<= 0.04), 0.07 (<= 0.08)
    assert 0.02 < s["ttft_p50_s_estimate"] <= 0.04 and 0.06 < s["ttft_p99_s_estimate"] <= 0.08
    assert set(ESTIMATED) <= set(s) and all(math.isnan(s[k]) for k in UNKNOWN)


@pytest.mark.parametrize("damaged", [None, "x", [], {"engines": 5}, {"engines": {"e": 1}, "totals": {"e": "x"}},
                                     {"engines": {"e": {}}, "histograms": {"e": {"ttft": {"le": [1], "counts": []}}}},
                                     {"lanes": {"e": {"t_ns": [1, "x", 3], "kv_usage": [0.1]}}, "lost": [[1, 2]]}])
def test_damaged_descriptions_read_without_exceptions(damaged):
    s = watch_summary(damaged)
    assert isinstance(s["engines"], dict) and s["prompt_tokens"] >= 0
    assert isinstance(engine_tracks(damaged, 0), list)


def test_quantiles_from_buckets():
    cumulative = [(0.1, 2.0), (0.2, 6.0), (math.inf, 8.0)]
    assert quantile(cumulative, 0.25) == pytest.approx(0.1)
    assert quantile(cumulative, 0.5) == pytest.approx(0.15)  # half-way through the second bucket
    assert quantile(cumulative, 0.99) == 0.2  # in the +Inf bucket: its lower bound
    assert math.isnan(quantile([], 0.5)) and math.isnan(quantile([(1.0, 0.0)], 0.5))
    a = {"le": [0.1, "+Inf"], "counts": [1, 2]}
    assert merged([a, a, {"le": [0.5, "+Inf"], "counts": [1, 1]}]) == [(0.1, 2.0), (math.inf, 4.0)]


def test_engine_tracks_draw_each_engine_and_the_fleet():
    src = two_servers()
    src.on_scrape_error(1, "refused", 2_500_000_000)
    src.tick(3_000_000_000)
    tracks = {name: (t, spans) for name, t, spans in engine_tracks(src.watch, 0)}
    assert list(tracks) == ["a:1/0", "b:2/0", "fleet"]
    a, _ = tracks["a:1/0"]
    assert set(a) == {"KV cache usage", "requests", "tokens/s", "KV cache events"}
    assert a["tokens/s"][1] == (2_000_000_000, {"prompt": 100.0, "generation": 10.0})
    assert tracks["b:2/0"][1] == [("connection lost", 2_500_000_000, 3_000_000_000)]
    assert "KV cache events" not in tracks["b:2/0"][0]


def test_fleet_kpis():
    v = fleet_kpis(two_servers().watch)
    assert v["kv_usage"] == 0.5 and v["prefix_hit_rate"] == 0.25 and v["blocks_cached"] == 4
    assert v["prompt_tokens_per_s"] == pytest.approx(300.0) and v["generation_tokens_per_s"] == pytest.approx(30.0)
    assert 0.02 < v["ttft_p50"] <= 0.04
    assert fleet_kpis({})["running"] is None


MUTATIONS = [
    lambda w: w.update(lanes=[1]),
    lambda w: w["lanes"]["a:1/0"].update(t_ns=["x"]),
    lambda w: w["lanes"]["a:1/0"].update(running=[1]),  # shorter than t_ns
    lambda w: w["lanes"]["a:1/0"].update(kv_usage=["0.5", 1]),
    lambda w: w["fleet"].pop("t_ns"),
    lambda w: w["totals"]["a:1/0"].update(prompt_tokens="many"),
    lambda w: w["histograms"]["a:1/0"].update(ttft={"le": [1, 2], "counts": [1]}),
    lambda w: w["residency"]["a:1/0"].update(layout={"x0": [1]}),
    lambda w: w["residency"]["a:1/0"].update(hot=[["k", 2]]),
    lambda w: w.update(lost=[[1, 2]]),
    lambda w: w.update(interval_s=float("nan")),
]


@pytest.mark.parametrize("mutate", MUTATIONS)
def test_a_damaged_description_in_a_file_is_refused_on_load(mutate, tmp_path):
    import copy
    import json

    import kvscope
    from kvscope.runs.result.run import Run
    from kvscope.watched.summary import check_watch

    src = two_servers()
    src.refresh(layout=True)
    good = json.loads(json.dumps(src.watch))
    check_watch(good)
    bad = copy.deepcopy(good)
    mutate(bad)
    with pytest.raises(ValueError):
        check_watch(bad)
    path = Run([], [], {"model": "x", "watch": bad, "t0_ns": 0}).save_metrics(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=r"bad\.jsonl: (a damaged kvscope watch file|the file holds NaN)"):
        kvscope.load(path)
