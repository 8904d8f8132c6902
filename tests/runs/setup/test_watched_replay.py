"""``for_replay``: a watched vLLM's header made replayable (the shape from the model folder, the plugin's settings,
the pool less vLLM's null block); a kvscope run unchanged; what cannot be replayed refused with the fix."""

from __future__ import annotations

import pytest

from kvscope.options.parser import OptionError
from kvscope.runs.result.run import Run
from kvscope.runs.setup.replay import check_replay_header, replay_settings
from kvscope.runs.setup.spec import EngineSpec
from kvscope.runs.setup.watched_replay import NULL_BLOCKS, for_replay, replay_meta

CONFIG = {"block_size": 32, "num_blocks": 24, "max_num_seqs": 7, "max_num_batched_tokens": 96, "max_model_len": 256,
          "enable_prefix_caching": True, "enable_chunked_prefill": True, "async_scheduling": False,
          "scheduler_reserve_full_isl": True, "policy": "fcfs"}


def watched_meta(model: str, **over) -> dict:
    return {"model": model, "block_size": 32, "num_blocks": 24, "kv_bytes_per_token": 0, "max_model_len": 256,
            "config": dict(CONFIG), "watch": {"version": 1}, **over}


def test_a_watched_header_becomes_a_replayable_one(tiny_llama):
    meta = replay_meta(watched_meta("elsewhere"), str(tiny_llama), None, "w.metrics.jsonl")
    check_replay_header(meta, "w.metrics.jsonl")  # no refusal
    assert meta["num_blocks"] == meta["config"]["num_blocks"] == 24 - NULL_BLOCKS
    # the tiny Llama of the watch tests: 2 layers, 2 KV heads of 64, fp32 -> 2 x 2 x 2 x 64 x 4 bytes a token
    assert meta["spec"]["num_layers"] == 2 and meta["spec"]["head_dim"] == 64
    assert meta["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 4
    settings = replay_settings(meta, "w", EngineSpec(), gpu=None)
    c = settings.config
    assert (c.num_blocks, c.block_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len) == (
        23, 32, 7, 96, 256)
    assert settings.assumed == ["seed"]


def test_the_model_folder_the_watch_recorded_is_used_without_model(tiny_llama):
    meta = replay_meta(watched_meta(str(tiny_llama)), "tiny", None, "w")
    assert meta["spec"]["head_dim"] == 64


def test_no_settings_or_no_model_is_refused_with_the_fix(tiny_llama):
    with pytest.raises(OptionError, match="plugin"):
        replay_meta(watched_meta(str(tiny_llama), config=None), str(tiny_llama), None, "w")
    with pytest.raises(OptionError, match="give --model DIR"):
        replay_meta(watched_meta("/no/such/folder"), "tiny", None, "w")
    with pytest.raises(OptionError, match="num_blocks"):
        replay_meta(watched_meta(str(tiny_llama), config={**CONFIG, "num_blocks": 1}), str(tiny_llama), None, "w")


def test_a_kvscope_run_comes_back_unchanged_and_a_watched_one_is_a_copy(tiny_llama):
    run = Run([], [], {"model": "tiny", "block_size": 16})
    assert for_replay(run, "tiny", None, "r") is run
    watched = Run([], [], watched_meta(str(tiny_llama)))
    adapted = for_replay(watched, "tiny", None, "w")
    assert adapted is not watched and watched.meta["num_blocks"] == 24 and adapted.meta["num_blocks"] == 23


def test_requests_without_a_known_prompt_are_left_out_with_a_note(tiny_llama):
    from kvscope.telemetry.records import RequestEvent

    events = [RequestEvent(0, -1, "a", "queued", 4, 0, prompt_token_ids=[5, 6, 7, 8]),
              RequestEvent(1, -1, "b", "queued", 4, 0),
              RequestEvent(9, -1, "a", "finished", 4, 3), RequestEvent(9, -1, "b", "finished", 4, 3)]
    adapted = for_replay(Run([], events, watched_meta(str(tiny_llama))), "tiny", None, "w")
    assert {e.request_id for e in adapted.events} == {"a"}
    assert "1 of the watched requests have no prompt" in adapted.meta["replay_notes"][0]
