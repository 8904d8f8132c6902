"""A watched server sends numbers and sequences no vLLM sends (issue 25, items 1-3, 11, 14): the watch
counts them as malformed and drops them, never crashes, and every file it writes loads back."""

from __future__ import annotations

import json
import math
import time

import pytest
from reliability_util import FIGURES
from watch_util import (
    FakePublisher,
    HostileServer,
    assert_files_load,
    free_port,
    render,
    run_watch,
    saved_watch,
    stored,
)

import kvscope
from kvscope.cli.main import main
from kvscope.watched.events import EventBatch, parse_event
from kvscope.watched.metrics import parse
from kvscope.watched.source import WatchSource

T0 = 1_700_000_000.0


def _engine(**kw):
    from fakes import EngineMetrics

    return EngineMetrics(**{"running": 1, "kv_usage": 0.25, "prompt_tokens": 100, "generation_tokens": 10,
                            "ttft": [0.02, 0.03], **kw})


def _nixl(**kw):
    from fakes import NixlMetrics

    return NixlMetrics(**{"xfer_time": [0.01], "bytes_transferred": [4096.0], **kw})


def _offload(**kw):
    from fakes import OffloadMetrics

    return OffloadMetrics(**kw)


def _page(**kw) -> str:
    return render({"0": _engine(**kw)})


HOSTILE_PAGES = {  # what the page says from the third scrape on
    "counter +1e30": _page(prompt_tokens=1e30),
    "bucket le=NaN": _page().replace('le="0.005"', 'le="NaN"'),
    "+Inf KV usage": _page(kv_usage=float("inf")),
    "running 1e300": _page(running=1e300),
    "block size 1e300": _page().replace('block_size="32"', 'block_size="1e300"').replace(
        'num_gpu_blocks="64"', 'num_gpu_blocks="inf"'),
    "negative counter": _page(generation_tokens=-5),
    # vLLM's KV connector families (issue 24): NIXL, offloading by transfer_type, the KV fetch gauge
    "NIXL bytes 1e30": _page(nixl=_nixl(bytes_transferred=[1e30])),
    "NIXL failures -1": _page(nixl=_nixl(failed_transfers=-1)),
    "offload time NaN": _page(offload=_offload(seconds={"GPU_to_CPU": math.nan, "CPU_to_GPU": 0.0})),
    "KV fetch gauge 1e300": _page(kv_fetch={"in_progress": 1e300}),
}


def _after(n: int, good: str, bad: str):
    state = {"n": 0}

    def respond(h):
        state["n"] += 1
        HostileServer.page(good if state["n"] <= n else bad)(h)
    return respond


@pytest.mark.parametrize("name", list(HOSTILE_PAGES))
def test_a_hostile_number_on_the_page_is_dropped_and_the_files_load_back(name, tmp_path):
    server = HostileServer()
    server.respond = _after(2, _page(), HOSTILE_PAGES[name])
    try:
        run = run_watch(server.url, tmp_path, duration=1.2)
    finally:
        server.stop()
    assert run.error is None, run.error  # before: +Inf usage crashed the watch and wrote no files
    for back in assert_files_load(run):  # before: "an integer of 30 digits", "the file holds NaN"
        s = back.summary()
        assert all(math.isfinite(s[k]) for k in ("prompt_tokens", "generation_tokens"))
        assert s["prompt_tokens"] < 2**53
    assert run.summary()["faults"]["metrics_malformed"] > 0 or name == "block size 1e300"
    FIGURES["hostile /metrics pages watched, files loaded back"] += 1


HOSTILE_LINES = [
    {"type": "start", "engine": 0, "pid": 7, "t": T0, "block_size": 1e300, "num_gpu_blocks": float("inf")},
    {"type": "step", "engine": 0, "pid": 7, "t": 1e200, "step": 1},
    {"type": "step", "engine": 0, "pid": 7, "t": 1e300, "step": 2},
    {"type": "step", "engine": 0, "pid": 7, "t": T0, "step": 3, "num_prompt_tokens": 1e300,
     "kv_cache_usage": 1e300, "num_running_reqs": -1e300,
     "iteration": {"elapsed_ms": 1e300, "num_ctx_tokens": 1e300},
     "finished": [{"request_id": "r", "e2e_latency_s": 1e300, "queued_time_s": 1e300, "decode_time_s": 1e300,
                   "prefill_time_s": -1e300, "num_prompt_tokens": 1e300, "num_generation_tokens": 3}]},
    {"type": "step", "engine": ["not", "a", "label"], "t": T0},
    {"type": "step", "engine": 10**30, "t": T0},
    {"type": "step", "engine": 0, "pid": 7, "t": T0 + 1, "step": 4, "num_generation_tokens": 2},
]


def test_hostile_plugin_lines_are_dropped_and_the_files_load_back(tmp_path):
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in HOSTILE_LINES))
    server = HostileServer()
    try:
        run = run_watch(server.url, tmp_path, duration=1.0, plugin_log=log)
    finally:
        server.stop()
    assert run.error is None, run.error  # before: "t": 1e300 overflowed int(x * 1e9) mid-run
    faults = run.summary()["faults"]
    assert faults["plugin_malformed"] == 4 and faults["plugin_lines"] == len(HOSTILE_LINES)
    for back in assert_files_load(run):  # before: "t": 1e200 made a 200-digit time the loader refused
        assert all(0 <= r.t_end_ns - back.t0_ns < 10**18 or r.t_end_ns < back.t0_ns for r in back.records)
        assert max(r.num_prefill_tokens for r in back.records) <= 2**53
    FIGURES["hostile plugin lines watched, files loaded back"] += len(HOSTILE_LINES)


def test_hostile_kv_events_are_dropped_and_the_files_load_back(tmp_path):
    port = free_port()
    pub = FakePublisher(f"tcp://127.0.0.1:{port}", rank=2**40)
    server = HostileServer()
    try:
        run = kvscope.watch(server.url, kv_events=f"tcp://127.0.0.1:{port}", interval=0.2, duration=2.0,
                            trace=tmp_path / "w.trace.json", metrics=tmp_path / "w.metrics.jsonl",
                            html=tmp_path / "w.html")
        time.sleep(0.6)  # the SUB socket is connected
        huge_block = {**stored([1, 2]), "token_ids": [1], "block_size": 2**40}
        pub.send([stored([b"x" * (1 << 20)]), huge_block, stored([3, 4])])
        run.wait(timeout=30)
    finally:
        pub.close()
        server.stop()
    assert run.error is None
    s = run.summary()
    assert s["faults"]["events_malformed"] == 2 and s["kv_blocks_stored"] == 2  # only [3, 4]
    assert list(s["engines"]) == [f"127.0.0.1:{server.port}/0"]  # the rank 2**40 was not taken as a label
    assert_files_load(run)


def test_infinite_kv_usage_is_counted_not_a_crash_at_any_tick():
    src = WatchSource(["http://127.0.0.1:9/metrics"], t0_ns=0)
    scrape = parse(_page(kv_usage=float("inf")), 1)
    assert scrape.num_malformed == 1 and "vllm:kv_cache_usage_perc" not in scrape.samples[0].gauges
    src.on_scrape(0, scrape.samples, scrape.num_malformed)
    src.tick(2)  # before: round(inf * num_gpu_blocks) raised OverflowError here and in the final tick
    src.tick(3, layout=True)
    assert src.watch["faults"]["metrics_malformed"] == 1 and src.watch["fleet"]["kv_usage"] == [0.0, 0.0]


def _stored_batch(seq: int, hashes: list, parent=None) -> EventBatch:
    return EventBatch(0.0, [parse_event(stored(hashes, parent))], 0, seq)


def test_a_repeated_seq_is_a_duplicate_and_only_a_jump_back_to_0_is_a_restart(tmp_path):
    port = free_port()
    pub = FakePublisher(f"tcp://127.0.0.1:{port}")
    server = HostileServer()
    try:
        run = kvscope.watch(server.url, kv_events=f"tcp://127.0.0.1:{port}", interval=0.1)
        time.sleep(0.6)
        parent = None
        for seq in range(101):  # 101 blocks in one chain
            pub.send([stored([seq + 1], parent)], seq=seq)
            parent = seq + 1
        pub.send([stored([999], parent)], seq=100)  # the last seq again
        deadline = time.monotonic() + 10
        while run.summary()["faults"]["events_duplicate"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        s = run.summary()
        assert s["kv_blocks_resident"] == 101 and s["faults"]["event_restarts"] == 0  # before: 1 resident
        assert s["faults"]["events_duplicate"] == 1
        pub.send([stored([5000])], seq=0)  # a jump back to 0: the publisher started again
        while run.summary()["faults"]["event_restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.summary()["kv_blocks_resident"] == 1
        run.stop()
        run.wait(timeout=20)
    finally:
        pub.close()
        server.stop()


CRAFTED = {
    "kv_block_size AAAAAAAAAA, hot depth 10**8": lambda r: r.update(kv_block_size="A" * 10, hot=[["h", 3, 10**8]]),
    "kv_blocks_resident 'x'": lambda r: r.update(kv_blocks_resident="x"),
    "hot depth 2**40": lambda r: r.update(hot=[["h", 3, 2**40]]),
    "layout of strings": lambda r: r["layout"].update(x0=["a"] * len(r["layout"]["x0"])),
    "kv_chains -1": lambda r: r.update(kv_chains=-1),
}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_watch_metadata_is_refused_in_one_line(name, tmp_path, capsys):
    path = saved_watch(tmp_path)
    doc = json.loads(path.read_text())
    CRAFTED[name](next(iter(doc["kvscope"]["meta"]["watch"]["residency"].values())))
    path.write_text(json.dumps(doc))
    t = time.monotonic()
    with pytest.raises(ValueError, match=r"damaged kvscope watch file .*residency"):
        kvscope.load(path)  # before: a bare TypeError, or a 1 GB string built by `kvscope view`
    assert main(["view", str(path), "-o", str(tmp_path / "v.html")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "residency" in err and not (tmp_path / "v.html").exists()
    assert time.monotonic() - t < 10
    FIGURES["crafted watch files refused"] += 1
