"""``WatchSource`` fed by hand, no network: lanes, the fleet's records, restarts, lost connections, KV
events per engine and rank, and plugin step lines turned into records and request lanes."""

from __future__ import annotations

import pytest
from fakes import EngineMetrics, render, stored

from kvscope.watched.events import EventBatch, parse_event
from kvscope.watched.samples import parse
from kvscope.watched.source import LANE_COLUMNS, WatchSource

URL = "http://127.0.0.1:9/metrics"


def feed(src: WatchSource, engines: dict[str, EngineMetrics], t_ns: int, server: int = 0):
    src.on_scrape(server, parse(render(engines), t_ns).samples)
    return src.tick(t_ns)


def test_lanes_and_fleet_records_from_counter_deltas():
    src = WatchSource([URL], t0_ns=0)
    engines = {"0": EngineMetrics(prompt_tokens=1000, generation_tokens=50)}  # before the watch
    records, events = feed(src, engines, 1_000)
    assert events == [] and records[0].num_output_tokens == 0  # the first sample is the baseline
    m = engines["0"]
    m.prompt_tokens, m.generation_tokens, m.prefix_hits, m.running, m.waiting, m.kv_usage = 1064, 58, 32, 3, 1, 0.25
    m.preemptions, m.finished = 1, {"stop": 2, "length": 0}
    (r,), _ = feed(src, engines, 2_000)
    assert (r.step, r.t_start_ns, r.t_end_ns, r.duration_ns) == (1, 2_000, 2_000, 0)  # an interval is no step
    assert (r.num_decode_tokens, r.num_output_tokens, r.num_prefill_tokens) == (8, 8, 64 - 32)
    assert (r.num_running, r.num_waiting, r.num_preempted, r.num_finished) == (3, 1, 1, 2)
    assert (r.kv.num_blocks, r.kv.blocks_used, r.kv.block_usage, r.kv.block_size) == (64, 16, 0.25, 32)
    assert r.kv.prefix_cache_hits == 32
    lane = src.watch["lanes"]["127.0.0.1:9/0"]
    assert set(lane) == {"t_ns", *LANE_COLUMNS} and lane["t_ns"] == [1_000, 2_000]
    assert lane["prompt_tokens"] == [0, 64] and lane["running"] == [0, 3] and lane["blocks_stored"] == [None, None]
    assert src.watch["totals"]["127.0.0.1:9/0"]["finished_by_reason"] == {"stop": 2, "length": 0}
    assert src.watch["fleet"]["generation_tokens"] == [0, 8]


def test_two_engines_add_up_in_the_fleet():
    src = WatchSource([URL], t0_ns=0)
    engines = {"0": EngineMetrics(), "1": EngineMetrics(num_gpu_blocks=100)}
    feed(src, engines, 1)
    engines["0"].kv_usage, engines["1"].kv_usage = 0.5, 0.1
    engines["0"].running, engines["1"].running = 2, 5
    (r,), _ = feed(src, engines, 2)
    assert (r.kv.num_blocks, r.kv.blocks_used, r.num_running) == (164, 32 + 10, 7)
    assert list(src.watch["engines"]) == ["127.0.0.1:9/0", "127.0.0.1:9/1"]


def test_a_server_restart_keeps_the_totals_and_the_histograms():
    src = WatchSource([URL], t0_ns=0)
    engines = {"0": EngineMetrics(generation_tokens=10, ttft=[0.01])}
    feed(src, engines, 1)
    engines["0"].generation_tokens, engines["0"].ttft = 30, [0.01, 0.02, 0.03]
    feed(src, engines, 2)
    engines["0"] = EngineMetrics(generation_tokens=5, ttft=[0.5])  # started again: counters from zero
    feed(src, engines, 3)
    assert src.faults["server_restarts"] == 1
    assert src.watch["totals"]["127.0.0.1:9/0"]["generation_tokens"] == 20 + 5
    assert src.watch["histograms"]["127.0.0.1:9/0"]["ttft"]["count"] == 2 + 1


def test_lost_and_back():
    src = WatchSource([URL], t0_ns=0)
    engines = {"0": EngineMetrics(running=2)}
    feed(src, engines, 1)
    src.on_scrape_error(0, "refused", 5)
    records, _ = src.tick(5)
    assert records == []  # nothing known: no record rather than zeros
    lane = src.watch["lanes"]["127.0.0.1:9/0"]
    assert lane["connected"][-1] is False and lane["running"][-1] is None
    assert src.watch["engines"]["127.0.0.1:9/0"]["state"] == "connection lost"
    assert src.lost == [["127.0.0.1:9", 5, None]]
    feed(src, engines, 9)
    assert src.lost == [["127.0.0.1:9", 5, 9]] and src.watch["engines"]["127.0.0.1:9/0"]["state"] == "ok"


def batch(events: list, rank: int | None = 0) -> EventBatch:
    return EventBatch(0.0, [parse_event(e) for e in events], rank)


def test_events_go_to_the_engine_of_their_rank():
    src = WatchSource([URL], t0_ns=0)
    src.on_events(0, batch([stored([1, 2])], rank=0), 1)
    src.on_events(0, batch([stored([3])], rank=1), 1)
    src.on_events(0, batch([stored([4])], rank=None), 1, rank=2)  # no rank in the batch: the endpoint's
    src.tick(2)
    res = src.watch["residency"]
    assert {k: v["kv_blocks_stored"] for k, v in res.items()} == {
        "127.0.0.1:9/0": 2, "127.0.0.1:9/1": 1, "127.0.0.1:9/2": 1}
    assert src.watch["kv_blocks_stored"] == 4 and "layout" not in res["127.0.0.1:9/0"]
    src.on_event_restart(0, 0)
    src.tick(3, layout=True)
    assert src.watch["residency"]["127.0.0.1:9/0"]["kv_blocks_resident"] == 0
    assert src.watch["residency"]["127.0.0.1:9/1"]["layout"]["key"] == ["3"]
    assert src.watch["lanes"]["127.0.0.1:9/1"]["blocks_stored"] == [1, 0]


T0 = 1_700_000_000.0


def step(t: float, **fields) -> dict:
    return {"type": "step", "engine": 0, "pid": 1, "t": t, "step": 0, "num_running_reqs": 2, "num_waiting_reqs": 1,
            "kv_cache_usage": 0.5, "num_prompt_tokens": 0, "num_generation_tokens": 0, "num_preempted_reqs": 0,
            "time_to_first_tokens_s": [], "inter_token_latencies_s": [], "finished": [], "iteration": None, **fields}


def test_plugin_steps_become_records_and_finished_requests_lanes():
    src = WatchSource([URL], t0_ns=0, plugin_records=True)
    src.on_plugin(0, {"type": "start", "engine": 0, "pid": 1, "t": T0, "block_size": 32, "num_gpu_blocks": 10})
    src.on_plugin(0, step(T0 + 1, num_prompt_tokens=96, num_cached_prompt_tokens=64, num_generation_tokens=2,
                          time_to_first_tokens_s=[0.1, 0.2]))
    src.on_plugin(0, step(T0 + 2, num_generation_tokens=2, inter_token_latencies_s=[0.01, 0.01],
                          iteration={"num_ctx_requests": 0, "num_ctx_tokens": 0, "num_generation_requests": 2,
                                     "num_generation_tokens": 2, "elapsed_ms": 4.0},
                          finished=[{"request_id": "r1", "finish_reason": "length", "num_prompt_tokens": 48,
                                     "num_generation_tokens": 2, "num_cached_tokens": 32, "e2e_latency_s": 1.5,
                                     "queued_time_s": 0.25, "prefill_time_s": 0.5, "decode_time_s": 0.5}]))
    records, events = src.tick(0)
    a, b = records
    assert (a.num_prefill_seqs, a.num_prefill_tokens, a.num_decode_seqs, a.num_output_tokens) == (2, 32, 0, 2)
    assert (b.num_decode_seqs, b.num_decode_tokens, b.duration_ns, b.forward_ns) == (2, 2, 4_000_000, 4_000_000)
    assert (a.num_running, a.num_waiting, a.kv.blocks_used, a.kv.num_blocks) == (2, 1, 5, 10)
    assert [e.kind for e in events] == ["queued", "scheduled", "first_token", "finished"]
    end = src.unix_to_ns(T0 + 2)
    assert [e.t_ns - end for e in events] == [-1_500_000_000, -1_000_000_000, -500_000_000, 0]
    assert events[1].num_cached_tokens == 32 and events[3].reason == "length" and events[3].num_output_tokens == 2
    assert src.watch["totals"]["127.0.0.1:9/0"]["plugin"]["num_generation_tokens"] == 4


def test_the_plugins_settings_are_the_watchs_config_and_load_back_checked():
    from kvscope.watched.check import check_watch

    src = WatchSource([URL], t0_ns=0, plugin_records=True)
    config = {"block_size": 32, "num_blocks": 24, "max_num_seqs": 8, "max_num_batched_tokens": 2048,
              "enable_prefix_caching": True, "enable_chunked_prefill": True, "async_scheduling": False,
              "policy": "fcfs", "unknown_setting": 1, "watermark": {"not": "plain"}}
    src.on_plugin(0, {"type": "start", "engine": 0, "pid": 1, "t": T0, "config": config})
    src.tick(0)
    want = {k: v for k, v in config.items() if k != "unknown_setting"} | {"watermark": None}
    assert src.watch["config"] == want
    assert src.watch["engines"]["127.0.0.1:9/0"]["config"] == want
    check_watch(src.watch)
    for bad in ([1], {"block_size": [32]}, {"policy": "x" * 100}):
        with pytest.raises(ValueError, match=r"watch\.config"):
            check_watch({**src.watch, "config": bad})


def test_a_finished_line_with_its_arrival_starts_its_lane_there_and_otlp_takes_the_requests_over():
    finished = {"request_id": "r1", "num_prompt_tokens": 48, "num_generation_tokens": 2, "e2e_latency_s": 1.5,
                "queued_time_s": 0.25, "prefill_time_s": 0.5, "decode_time_s": 0.5, "arrival_time": T0 + 0.4}
    src = WatchSource([URL], t0_ns=0, plugin_records=True)
    src.on_plugin(0, step(T0 + 2, finished=[finished]))
    _, events = src.tick(0)
    assert events[0].t_ns == src.unix_to_ns(T0 + 0.4)  # vLLM's arrival, not the end less e2e (T0 + 0.5)
    otlp = WatchSource([URL], t0_ns=0, plugin_records=True, otlp=True)
    otlp.on_plugin(0, step(T0 + 2, finished=[finished]))
    records, events = otlp.tick(0)
    assert len(records) == 1 and records[0].num_finished == 1 and events == []  # the span makes its lane


@pytest.mark.parametrize("line", [{"type": "step", "engine": 0, "t": "soon"}, {"type": "step", "engine": [0], "t": 1.0},
                                  {"type": "step", "engine": 0, "t": float("nan")}])
def test_damaged_plugin_lines_are_counted(line):
    src = WatchSource([URL], t0_ns=0, plugin_records=True)
    src.on_plugin(0, line)
    assert src.faults["plugin_malformed"] == 1 and src.tick(0) == ([], [])


def test_plugin_numbers_that_are_not_numbers_count_as_zero():
    src = WatchSource([URL], t0_ns=0, plugin_records=True)
    src.on_plugin(0, step(T0, num_generation_tokens="many", num_prompt_tokens=float("inf"), finished="x",
                          kv_cache_usage=None))
    (r,), events = src.tick(0)
    assert (r.num_output_tokens, r.num_prefill_tokens, r.num_finished, events) == (0, 0, 0, [])


def test_a_new_plugin_pid_is_a_restart():
    src = WatchSource([URL], t0_ns=0)
    for pid in (1, 1, 2):
        src.on_plugin(0, {"type": "start", "engine": 0, "pid": pid, "t": T0})
    assert src.faults["plugin_restarts"] == 1
