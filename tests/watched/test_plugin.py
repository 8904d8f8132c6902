"""kvscope's vLLM stat-logger plugin (kvscope/watched/plugin.py): off unless asked for, light to import, one
whole JSONL line per engine step, never an exception into vLLM. Most tests drive ``StepLines`` with stand-ins
of vLLM 0.32's stats classes; the last one loads the plugin the way vLLM does, in the vLLM virtualenv, and
feeds it vLLM's own classes."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from kvscope.watched import plugin
from kvscope.watched.plugin_log import PluginLog

CONFIG = NS(model_config=NS(served_model_name="tiny", model="/models/tiny", max_model_len=256),
            cache_config=NS(block_size=32, num_gpu_blocks=24))


class Reason:
    def __str__(self) -> str:  # vLLM's FinishReason is an IntEnum whose str() is its name
        return "length"


def scheduler_stats(**kw) -> NS:
    base = dict(num_running_reqs=2, num_waiting_reqs=3, num_skipped_waiting_reqs=1, kv_cache_usage=0.25,
                prefix_cache_stats=NS(requests=1, queries=97, hits=64), iteration_details=None,
                spec_decoding_stats=None, kv_cache_eviction_events=[])
    return NS(**{**base, **kw})


def iteration_stats(**kw) -> NS:
    finished = NS(finish_reason=Reason(), request_id="cmpl-1", e2e_latency=0.5, num_prompt_tokens=97,
                  num_preemptions=0, num_generation_tokens=8, queued_time=0.01, prefill_time=0.1,
                  inference_time=0.4, decode_time=0.3, num_cached_tokens=64)
    base = dict(prompt_token_stats=NS(total=97, cached_tokens=64), num_generation_tokens=3, num_preempted_reqs=1,
                time_to_first_tokens_iter=[0.12], inter_token_latencies_iter=[0.02, 0.03],
                finished_requests=[finished])
    return NS(**{**base, **kw})


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_importing_the_plugin_pulls_nothing_heavy():
    code = ("import sys, kvscope.watched.plugin\n"
            "heavy = ('torch', 'numpy', 'pandas', 'transformers', 'vllm', 'zmq', 'prometheus_client', 'bokeh',\n"
            "         'kvscope.engine.engine', 'kvscope.telemetry', 'kvscope.runs.result.run')\n"
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_the_variable_the_entry_point_refuses_to_load(monkeypatch):
    monkeypatch.delenv(plugin.ENV, raising=False)
    with pytest.raises(plugin.PluginOff, match=plugin.ENV):
        _ = plugin.KvscopeStatLogger
    monkeypatch.setenv(plugin.ENV, "")
    with pytest.raises(plugin.PluginOff):
        _ = plugin.KvscopeStatLogger
    with pytest.raises(AttributeError):
        _ = plugin.NoSuchThing


def test_vllms_failed_to_load_traceback_for_the_refusal_becomes_one_info_line(monkeypatch, caplog):
    monkeypatch.delenv(plugin.ENV, raising=False)
    vllm_log = logging.getLogger("vllm.plugins")
    caplog.set_level(logging.INFO)
    try:
        for _ in range(2):  # asked twice: one filter, not two
            try:
                _ = plugin.KvscopeStatLogger
            except Exception:  # what vllm.plugins.load_plugins_by_group does
                vllm_log.exception("Failed to load plugin %s", "kvscope")
        try:
            raise ValueError("another plugin's bug")
        except ValueError:
            vllm_log.exception("Failed to load plugin %s", "other")
        assert sum(isinstance(f, plugin._OffNotice) for f in vllm_log.filters) == 1
    finally:
        for f in [f for f in vllm_log.filters if isinstance(f, plugin._OffNotice)]:
            vllm_log.removeFilter(f)
    ours, theirs = caplog.records[:2], caplog.records[2]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in ours] == [("INFO", plugin.OFF_NOTICE, None)] * 2
    assert theirs.levelname == "ERROR" and theirs.exc_info is not None  # other failures are left as they are


def test_a_step_line_holds_the_schedulers_and_the_iterations_stats():
    spec = NS(num_drafts=2, num_draft_tokens=4, num_accepted_tokens=3, num_accepted_tokens_per_pos=[2, 1])
    details = NS(num_ctx_requests=1, num_ctx_tokens=33, num_generation_requests=2, num_generation_tokens=2,
                 elapsed_ms=12.5)
    evicted = [NS(lifetime_seconds=3.0, idle_seconds=1.0, reuse_gaps_seconds=(0.5,))]
    line = plugin.step_line(scheduler_stats(spec_decoding_stats=spec, iteration_details=details,
                                            kv_cache_eviction_events=evicted), iteration_stats(), 1, 42, 7)
    head = {k: line[k] for k in ("type", "engine", "pid", "step")}
    assert head == {"type": "step", "engine": 1, "pid": 42, "step": 7}
    assert line["num_running_reqs"] == 2
    assert (line["num_waiting_reqs"], line["num_skipped_waiting_reqs"]) == (4, 1)  # like vllm:num_requests_waiting
    assert (line["kv_cache_usage"], line["prefix_cache_queries"], line["prefix_cache_hits"]) == (0.25, 97, 64)
    assert (line["num_prompt_tokens"], line["num_cached_prompt_tokens"]) == (97, 64)
    assert (line["num_generation_tokens"], line["num_preempted_reqs"]) == (3, 1)
    assert line["time_to_first_tokens_s"] == [0.12] and line["inter_token_latencies_s"] == [0.02, 0.03]
    assert line["finished"] == [{
        "request_id": "cmpl-1", "finish_reason": "length", "num_prompt_tokens": 97, "num_generation_tokens": 8,
        "num_cached_tokens": 64, "num_preemptions": 0, "e2e_latency_s": 0.5, "queued_time_s": 0.01,
        "prefill_time_s": 0.1, "decode_time_s": 0.3, "inference_time_s": 0.4}]
    assert line["iteration"]["num_ctx_tokens"] == 33 and line["iteration"]["elapsed_ms"] == 12.5
    assert line["spec_decoding"] == {"num_drafts": 2, "num_draft_tokens": 4, "num_accepted_tokens": 3,
                                     "num_accepted_tokens_per_pos": [2, 1]}
    assert line["kv_block_evictions"] == [[3.0, 1.0]]
    json.dumps(line, allow_nan=False)


def test_the_start_line_holds_the_servers_settings_under_kvscopes_names():
    config = NS(model_config=NS(served_model_name="tiny", max_model_len=256),
                cache_config=NS(block_size=32, num_gpu_blocks=24, enable_prefix_caching=True),
                scheduler_config=NS(max_num_seqs=8, max_num_batched_tokens=2048, enable_chunked_prefill=False,
                                    async_scheduling=None, policy=NS(value="fcfs"), watermark=float("nan"),
                                    long_prefill_token_threshold=object()))
    got = plugin.start_line(config, 0, 1)["config"]
    keys = ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
            "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling")
    assert {k: got[k] for k in keys} == {
        "block_size": 32, "num_blocks": 24, "max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_model_len": 256,
        "enable_prefix_caching": True, "enable_chunked_prefill": False, "async_scheduling": None}
    assert got["policy"] == "fcfs"  # an enum: its value
    assert got["watermark"] is None and got["long_prefill_token_threshold"] is None  # not JSON-plain: not kept
    assert got["scheduler_reserve_full_isl"] is None  # a field this config lacks
    json.dumps(got, allow_nan=False)


def test_a_finished_request_carries_its_arrival_from_the_iterations_time():
    it = iteration_stats(iteration_timestamp=1000.5)
    it.finished_requests[0].max_tokens_param = 8
    (f,) = plugin.step_line(None, it, 0, 1, 0)["finished"]
    assert f["arrival_time"] == 1000.0 and f["max_tokens"] == 8  # 1000.5 less its e2e latency of 0.5


def test_a_step_with_only_one_kind_of_stats():
    only_sched = plugin.step_line(scheduler_stats(), None, 0, 1, 0)
    assert only_sched["num_prompt_tokens"] == 0 and only_sched["finished"] == [] and only_sched["iteration"] is None
    assert "spec_decoding" not in only_sched and "kv_block_evictions" not in only_sched
    only_iter = plugin.step_line(None, iteration_stats(), 0, 1, 0)
    assert "num_running_reqs" not in only_iter and only_iter["num_generation_tokens"] == 3


def test_engines_sharing_a_file_append_whole_lines_each_counting_its_steps(tmp_path):
    path = tmp_path / "steps.jsonl"
    a, b = plugin.StepLines(str(path), CONFIG, 0), plugin.StepLines(str(path), CONFIG, 1)
    for _ in range(3):
        a.record(scheduler_stats(), iteration_stats())
        b.record(scheduler_stats(), None)
    a.record(None, None)  # nothing to say: no line
    a.close()
    b.close()
    got = lines(path)
    starts = [x for x in got if x["type"] == "start"]
    assert [(s["engine"], s["block_size"], s["num_gpu_blocks"], s["max_model_len"], s["model"]) for s in starts] == \
        [(0, 32, 24, 256, "tiny"), (1, 32, 24, 256, "tiny")]
    assert starts[0]["format"] == plugin.FORMAT and starts[0]["version"] == plugin.VERSION
    for engine in (0, 1):
        assert [x["step"] for x in got if x["type"] == "step" and x["engine"] == engine] == [0, 1, 2]
    tail = PluginLog(path).read()  # the watcher's tailer reads the same lines back
    assert [(x["type"], x["engine"]) for x in tail] == [(x["type"], x["engine"]) for x in got]


def test_stats_of_another_shape_turn_the_writer_off_never_raise(tmp_path, caplog):
    path = tmp_path / "steps.jsonl"
    writer = plugin.StepLines(str(path), CONFIG, 0)
    writer.record(NS(num_running_reqs=1), None)  # a vLLM whose SchedulerStats changed
    writer.record(scheduler_stats(), iteration_stats())  # and nothing more is written
    assert writer.fd is None
    assert [x["type"] for x in lines(path)] == ["start"]
    assert "is this vLLM 0.32?" in caplog.text


def test_a_value_json_cannot_write_turns_the_writer_off_never_raises(tmp_path, caplog):
    path = tmp_path / "steps.jsonl"
    writer = plugin.StepLines(str(path), CONFIG, 0)
    odd = iteration_stats()
    odd.finished_requests[0].request_id = object()
    writer.record(scheduler_stats(), odd)
    assert writer.fd is None and [x["type"] for x in lines(path)] == ["start"]
    assert "cannot read vLLM's stats" in caplog.text


def test_a_file_that_cannot_be_opened_leaves_the_server_alone(tmp_path, caplog):
    writer = plugin.StepLines(str(tmp_path / "missing" / "steps.jsonl"), CONFIG, 0)
    writer.record(scheduler_stats(), iteration_stats())
    assert writer.fd is None and "cannot open" in caplog.text


VLLM_SCRIPT = textwrap.dedent("""
    import json, logging, os, sys
    from types import SimpleNamespace as NS
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    path = os.environ.pop("KVSCOPE_VLLM_PLUGIN")
    off = load_stat_logger_plugin_factories()
    os.environ["KVSCOPE_VLLM_PLUGIN"] = path
    (factory,) = load_stat_logger_plugin_factories()
    assert issubclass(factory, StatLoggerBase) and factory.__module__ == "kvscope.watched.plugin", factory
    from vllm.config import CacheConfig, SchedulerConfig
    cache = CacheConfig(block_size=32, enable_prefix_caching=True)
    cache.num_gpu_blocks = 9  # (set by the engine once it has sized the pool)
    config = NS(model_config=NS(served_model_name="m", max_model_len=256), cache_config=cache,
                scheduler_config=SchedulerConfig(max_model_len=256, is_encoder_decoder=False, max_num_seqs=7,
                                                 max_num_batched_tokens=512, async_scheduling=False))
    logger = factory(config, 0)
    logger.log_engine_initialized()
    pcs = PrefixCacheStats()
    pcs.record(num_tokens=97, num_hits=64, preempted=False)
    spec = SpecDecodingStats.new(2)
    spec.observe_draft(num_draft_tokens=2, num_accepted_tokens=1)
    sched = SchedulerStats(num_running_reqs=1, num_waiting_reqs=2, kv_cache_usage=0.5, prefix_cache_stats=pcs,
                           spec_decoding_stats=spec)
    it = IterationStats()
    it.iteration_timestamp = 1764590000.5
    it.num_generation_tokens, it.num_preempted_reqs = 3, 1
    it.prompt_token_stats.total, it.prompt_token_stats.cached_tokens = 97, 64
    it.time_to_first_tokens_iter.append(0.1)
    it.inter_token_latencies_iter.append(0.02)
    it.finished_requests.append(FinishedRequestStats(
        FinishReason.LENGTH, request_id="r1", e2e_latency=0.5, num_prompt_tokens=97, num_generation_tokens=8,
        queued_time=0.01, prefill_time=0.1, inference_time=0.4, decode_time=0.3, num_cached_tokens=64,
        max_tokens_param=8))
    logger.record(sched, it, None, engine_idx=0)
    logger.log()
    print("OFF", off)
""")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_vllm_loads_the_plugin_only_when_asked_and_it_reads_vllms_own_stats(vllm_py, tmp_path):
    path = tmp_path / "steps.jsonl"
    proc = subprocess.run([str(vllm_py), "-c", VLLM_SCRIPT], capture_output=True, text=True, timeout=280,
                          env={"KVSCOPE_VLLM_PLUGIN": str(path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OFF []" in proc.stdout  # unset: not loaded, so the server runs as without kvscope ...
    assert f"INFO vllm.plugins {plugin.OFF_NOTICE}" in proc.stdout  # ... and says so in one line
    assert "Traceback" not in proc.stdout + proc.stderr
    start, step = lines(path)
    assert (start["type"], start["vllm_version"]) == ("start", "0.32.0")
    assert (start["num_gpu_blocks"], start["model"]) == (9, "m")
    # the server's settings, read from vLLM 0.32's own config classes (their attribute names checked here)
    assert start["config"] == {
        "block_size": 32, "num_blocks": 9, "max_num_seqs": 7, "max_num_batched_tokens": 512, "max_model_len": 256,
        "enable_prefix_caching": True, "enable_chunked_prefill": True, "async_scheduling": False, "policy": "fcfs",
        "long_prefill_token_threshold": 0, "max_num_scheduled_tokens": start["config"]["max_num_scheduled_tokens"],
        "max_num_active_seqs": None, "scheduler_reserve_full_isl": True, "watermark": 0.0,
        "prefill_schedule_interval": 1, "stream_interval": 1, "num_gpu_blocks_override": None,
        "prefix_caching_hash_algo": "sha256"}
    assert (step["num_running_reqs"], step["num_waiting_reqs"], step["kv_cache_usage"]) == (1, 2, 0.5)
    assert (step["prefix_cache_queries"], step["prefix_cache_hits"], step["prefix_cache_requests"]) == (97, 64, 1)
    assert (step["num_prompt_tokens"], step["num_cached_prompt_tokens"], step["num_generation_tokens"]) == (97, 64, 3)
    assert step["spec_decoding"] == {"num_drafts": 1, "num_draft_tokens": 2, "num_accepted_tokens": 1,
                                     "num_accepted_tokens_per_pos": [1, 0]}
    (finished,) = step["finished"]
    assert (finished["finish_reason"], finished["request_id"], finished["num_cached_tokens"]) == ("length", "r1", 64)
    assert (finished["queued_time_s"], finished["prefill_time_s"], finished["decode_time_s"]) == (0.01, 0.1, 0.3)
    assert (finished["arrival_time"], finished["max_tokens"]) == (1764590000.0, 8)  # the iteration's time less e2e
