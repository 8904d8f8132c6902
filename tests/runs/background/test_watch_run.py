"""``WatchRun`` against stand-ins of vLLM on 127.0.0.1 (tests/watched/fakes.py): the whole lifecycle, the
faults (a server unreachable at the start, lost and back, event gaps, publisher restarts, damaged payloads),
replay, both socket modes, the plugin's log, Ctrl-C, and the exports loading back with ``kvscope.load``."""

from __future__ import annotations

import _thread
import json
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "watched"))
from fakes import FakePublisher, FakeServer, free_port, removed, stored

import kvscope
from kvscope.runs.background.status import Outputs, RunStatus
from kvscope.runs.background.watch import WatchError, WatchRun
from kvscope.telemetry.export import LANES_PID

FAST = 0.05  # seconds between polls


def until(check, what: str, timeout: float = 30.0):
    """Wait for ``check()`` to be true (a guard against hanging, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(0.02)
    return value


@pytest.fixture
def server():
    s = FakeServer(1).start()
    yield s
    s.stop()


@pytest.fixture
def endpoint():
    return f"tcp://127.0.0.1:{free_port()}"


def polls(run: WatchRun, n: int = 2) -> None:
    """Let ``n`` more polls happen."""
    start = run._num_ticks
    until(lambda: run._num_ticks >= start + n or run.done, f"{n} polls")


def subscribed(run: WatchRun, pub: FakePublisher) -> None:
    """Probe batches until the watch receives one (PUB drops what it sends before a subscription)."""
    def probe():
        pub.send([])
        time.sleep(0.02)
        return run.source.faults["event_batches"] > 0
    until(probe, "the subscription")


def test_a_watch_from_start_to_files(server, endpoint, tmp_path):
    pub = FakePublisher(endpoint, bind=True)
    files = {k: tmp_path / f"w.{k}" for k in ("trace", "metrics", "html")}
    run = kvscope.watch(server.url, kv_events=endpoint, interval=FAST, trace=files["trace"],
                        metrics=files["metrics"], html=files["html"])
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        subscribed(run, pub)
        m = server.engines["0"]
        for i in range(3):
            m.prompt_tokens += 64
            m.generation_tokens += 8
            m.prefix_queries += 64
            m.prefix_hits += 32 * (i > 0)
            m.ttft.append(0.03)
            pub.send([stored([10 * i + 1, 10 * i + 2])])
            polls(run)
        pub.send([stored([99], parent=22)])
        pub.send([removed([1])])
        until(lambda: run.summary()["kv_blocks_evicted"] == 1, "the eviction")
        running = run.summary()
    finally:
        run.stop()
        pub.close()
    run.wait(30)
    assert run.status == RunStatus.STOPPED and run.error is None
    s = run.summary()
    assert (s["prompt_tokens"], s["generation_tokens"], s["prefix_cache_hit_tokens"],
            s["preemptions"]) == (192, 24, 64, 0)
    assert (s["kv_blocks_stored"], s["kv_blocks_evicted"], s["kv_blocks_resident"]) == (7, 1, 6)
    assert list(s["engines"]) == [f"127.0.0.1:{server.port}/0"] and s["output_tokens"] == 24
    assert running["kv_blocks_stored"] == 7 and 0.02 < s["ttft_p50_s_estimate"] <= 0.04
    assert set(run.files.written) == {"trace", "metrics", "html"} and not run.files.errors
    for kind in ("trace", "metrics"):
        back = kvscope.load(files[kind])
        assert back.summary()["prompt_tokens"] == 192 and back.summary()["kv_blocks_stored"] == 7, kind
        assert back.summary()["engines"].keys() == s["engines"].keys() and back.profiler_events == []
        assert len(back.records) == len(run.run.records)
    trace = json.loads(files["trace"].read_text())
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert processes[LANES_PID] == f"127.0.0.1:{server.port}/0" and processes[LANES_PID + 1] == "fleet"
    counters = {e["name"] for e in trace["traceEvents"] if e.get("pid") == LANES_PID and e["ph"] == "C"}
    assert counters == {"KV cache usage", "requests", "tokens/s", "KV cache events"}
    page = files["html"].read_text()
    assert "kvscope watch" in page and "estimated" in page


def test_unreachable_at_the_start_is_one_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    run = WatchRun(url, outputs=Outputs(trace=tmp_path / "t.json")).start()
    with pytest.raises(WatchError, match=f"cannot reach {url}/metrics.*refused"):
        run.wait(30)
    assert run.status == RunStatus.FAILED and "failed: WatchError: cannot reach" in run.status_text
    assert not (tmp_path / "t.json").exists()  # nothing was watched


def test_a_server_that_is_not_vllm_is_refused(server):
    server.page = "# TYPE python_info gauge\npython_info{version=\"3\"} 1.0\n"
    with pytest.raises(WatchError, match="no vllm: metrics"):
        WatchRun(server.url).start().wait(30)


def test_connection_lost_then_back(server, tmp_path):
    files = Outputs(trace=tmp_path / "t.json", metrics=tmp_path / "m.jsonl")
    run = WatchRun(server.url, interval=FAST, outputs=files).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        server.engines["0"].generation_tokens = 10
        until(lambda: run.summary()["generation_tokens"] == 10, "the tokens")
        server.stop()
        until(lambda: "connection lost" in run.status_text, "the loss")
        assert run.status == RunStatus.RUNNING
        until(lambda: files.metrics.exists(), "the files written at the loss")
        at_loss = kvscope.load(files.metrics).summary()
        assert at_loss["generation_tokens"] == 10 and at_loss["engines"][next(iter(at_loss["engines"]))]["state"] \
            == "connection lost"
        server.engines["0"].generation_tokens = 25
        server.start()
        until(lambda: "connection lost" not in run.status_text, "the server back")
        until(lambda: run.summary()["generation_tokens"] == 25, "the tokens after")
    finally:
        run.stop()
    run.wait(30)
    s = run.summary()
    assert s["connection_lost"] == 1 and run.run.meta["watch"]["lost"][0][2] is not None  # closed when it came back
    assert kvscope.load(files.trace).summary()["generation_tokens"] == 25


def test_a_restarted_server_counts_on(server):
    run = WatchRun(server.url, interval=FAST).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        server.engines["0"].prompt_tokens = 50
        until(lambda: run.summary()["prompt_tokens"] == 50, "the tokens")
        server.restart()
        server.engines["0"].prompt_tokens = 7
        until(lambda: run.summary()["prompt_tokens"] == 57, "the tokens after the restart")
    finally:
        run.stop()
    run.wait(30)
    assert run.summary()["faults"]["server_restarts"] == 1


def test_gaps_restarts_and_damaged_payloads(server, endpoint):
    pub = FakePublisher(endpoint, bind=True)
    run = WatchRun(server.url, kv_events=endpoint, interval=FAST).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        subscribed(run, pub)
        pub.send([stored([1])])
        pub.seq += 3  # three batches lost
        pub.send([stored([2])])
        pub.send([], raw=b"\xc1 not msgpack")
        pub.send([{"type": "BlockStored", "block_hashes": "x", "block_size": 32}, stored([3])])
        until(lambda: run.source.watch["residency"] and run.summary()["kv_blocks_stored"] == 3, "the events")
        assert "1 KV event gap" in run.status_text
        pub.send([stored([4])], seq=0)  # the publisher started again
        until(lambda: run.summary()["faults"]["event_restarts"] == 1, "the restart")
        polls(run)
    finally:
        run.stop()
        pub.close()
    run.wait(30)
    f = run.summary()["faults"]
    assert (f["event_gaps"], f["events_missed"], f["events_malformed"]) == (1, 3, 2)
    s = run.summary()
    assert s["kv_blocks_resident"] == 1 and s["kv_blocks_stored"] == 4  # the restart emptied the cache


def test_replay_catches_up_and_fills_gaps(server, endpoint):
    replay_port = free_port()
    pub = FakePublisher(endpoint, bind=True, replay_port=replay_port)
    pub.send([stored([1, 2])])  # before the watch: only the replay has them
    pub.send([stored([3], parent=2)])
    run = WatchRun(server.url, kv_events=endpoint, replay=f"tcp://127.0.0.1:{replay_port}", interval=FAST).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        assert run.summary()["kv_blocks_stored"] == 3 and run.summary()["faults"]["events_replayed"] == 2
        subscribed(run, pub)
        gap_from = pub.seq
        pub.buffer.append((gap_from, pub.payload([stored([50])])))  # published while the watcher missed it
        pub.seq += 1
        pub.send([stored([51])])
        until(lambda: run.summary()["kv_blocks_stored"] == 5, "the replayed gap")
    finally:
        run.stop()
        pub.close()
    run.wait(30)
    f = run.summary()["faults"]
    assert f["event_gaps"] == 1 and f["events_missed"] == 0 and f["events_replayed"] == 3


def test_the_watcher_binds_for_a_publisher_that_connects(server, endpoint):
    run = WatchRun(server.url, kv_events_bind=endpoint, interval=FAST).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        pub = FakePublisher(endpoint, bind=False)
        subscribed(run, pub)
        pub.send([stored([5, 6])])
        until(lambda: run.summary()["kv_blocks_stored"] == 2, "the events")
    finally:
        run.stop()
    run.wait(30)
    pub.close()


def test_data_parallel_ranks_are_lanes_and_the_fleet_adds_up(tmp_path):
    server = FakeServer(["0", "1"]).start()
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    pubs = [FakePublisher(e, bind=True, rank=r) for r, e in enumerate(endpoints)]
    run = WatchRun(server.url, kv_events=endpoints, interval=FAST).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        for pub in pubs:
            subscribed(run, pub)
        pubs[0].send([stored([1])])
        pubs[1].send([stored([2, 3])])
        server.engines["0"].generation_tokens, server.engines["1"].generation_tokens = 4, 6
        until(lambda: run.summary()["generation_tokens"] == 10 and run.summary()["kv_blocks_stored"] == 3, "both")
    finally:
        run.stop()
        server.stop()
        for pub in pubs:
            pub.close()
    run.wait(30)
    engines = run.summary()["engines"]
    base = f"127.0.0.1:{server.port}"
    assert {k: (e["generation_tokens"], e["kv_blocks_stored"]) for k, e in engines.items()} == {
        f"{base}/0": (4, 1), f"{base}/1": (6, 2)}


def plugin_lines(t: float) -> str:
    start = {"type": "start", "format": "kvscope-vllm-plugin", "version": 1, "engine": 0, "pid": 7, "t": t,
             "block_size": 32, "num_gpu_blocks": 8}
    first = {"type": "step", "engine": 0, "pid": 7, "t": t, "step": 0, "num_running_reqs": 1, "num_waiting_reqs": 0,
             "kv_cache_usage": 0.25, "num_prompt_tokens": 40, "num_generation_tokens": 1,
             "time_to_first_tokens_s": [0.02], "inter_token_latencies_s": [], "finished": []}
    last = {**first, "t": t + 0.01, "step": 1, "num_prompt_tokens": 0, "time_to_first_tokens_s": [],
            "inter_token_latencies_s": [0.01],
            "finished": [{"request_id": "cmpl-1", "finish_reason": "length", "num_prompt_tokens": 40,
                          "num_generation_tokens": 2, "e2e_latency_s": 0.04, "queued_time_s": 0.005,
                          "prefill_time_s": 0.015, "decode_time_s": 0.01}]}
    return "".join(json.dumps(x) + "\n" for x in (start, first, last))


def test_the_plugins_log_makes_records_and_request_lanes(server, tmp_path):
    log = tmp_path / "steps.jsonl"
    run = WatchRun(server.url, plugin_log=log, interval=FAST, outputs=Outputs(trace=tmp_path / "t.json")).start()
    try:
        until(lambda: run.status == RunStatus.RUNNING, "running")
        log.write_text(plugin_lines(time.time()))
        until(lambda: len(run.run.records) == 2, "the plugin's steps")
    finally:
        run.stop()
    run.wait(30)
    steps = run.run.steps
    assert steps["num_output_tokens"].tolist() == [1, 1] and steps["num_prefill_tokens"].tolist() == [40, 0]
    (request,) = run.run.requests.itertuples()
    assert request.request_id == "cmpl-1" and request.finish_reason == "length"
    assert request.ttft_s == pytest.approx(0.03)  # e2e 0.04 - decode 0.01
    back = kvscope.load(tmp_path / "t.json")
    assert len(back.records) == 2 and back.requests.request_id.tolist() == ["cmpl-1"]


def test_ctrl_c_in_wait_stops_the_watch_and_writes_the_files(server, tmp_path):
    run = WatchRun(server.url, interval=FAST, outputs=Outputs(metrics=tmp_path / "m.jsonl")).start()
    until(lambda: run.status == RunStatus.RUNNING, "running")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        run.wait(60)
    timer.join()
    assert run.done and run.status == RunStatus.STOPPED
    assert kvscope.load(tmp_path / "m.jsonl").meta["watch"]["urls"] == [server.url + "/metrics"]


def test_duration_ends_the_watch(server):
    run = WatchRun(server.url, interval=FAST, duration=0.3).start()
    run.wait(30)
    assert run.status == RunStatus.FINISHED and run._num_ticks >= 2


@pytest.mark.parametrize("kwargs, message", [
    ({"urls": []}, "at least one"),
    ({"interval": 0}, "positive"),
    ({"kv_events": "http://x:1"}, "not a ZMQ endpoint"),
    ({"urls": ["http://a:1", "http://b:1"], "kv_events": ["tcp://a:1"]}, "one per URL"),
    ({"kv_events": "tcp://a:1", "replay": ["tcp://a:2", "tcp://a:3"]}, "one per event endpoint"),
])
def test_bad_arguments(kwargs, message):
    kwargs = {"urls": "http://127.0.0.1:1", **kwargs}
    with pytest.raises(ValueError, match=message):
        WatchRun(kwargs.pop("urls"), **kwargs)


def test_binding_an_address_in_use_fails_the_start(server, endpoint):
    first = WatchRun(server.url, kv_events_bind=endpoint, interval=FAST).start()
    until(lambda: first.status == RunStatus.RUNNING, "running")
    second = WatchRun(server.url, kv_events_bind=endpoint).start()
    with pytest.raises(WatchError, match="cannot bind"):
        second.wait(30)
    first.stop()
    first.wait(30)


def test_kvscope_watch_is_the_package_and_the_function():
    import kvscope.watched.summary

    assert callable(kvscope.watch) and kvscope.WatchRun is WatchRun
    with pytest.raises(ValueError, match="at least one"):
        kvscope.watch([])
