"""Bad input gets one clear error naming the problem, and the other requests go on."""

import pytest
from helpers import hf_greedy, random_prompts

from kvscope import Engine, EngineConfig, SamplingParams
from kvscope.models.loader import build_tiny_model


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny", block_size=8, num_blocks=64, max_model_len=128)


def test_empty_prompt(engine):
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate([""])
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request([])


def test_prompt_longer_than_the_model_allows(engine):
    with pytest.raises(ValueError, match=r"prompt has 200 tokens but the model allows at most 127"):
        engine.add_request(list(range(3, 203)))


def test_bad_prompt_in_a_batch_names_it_and_starts_nothing(engine):
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        engine.generate([[5, 6], [], [7, 8]])
    assert not engine.has_unfinished_requests() and engine.pool.num_free_blocks == engine.pool.num_blocks


def test_token_ids_outside_vocab(engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([5, 100000])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(max_tokens=0), "max_tokens=0 must be an integer of at least 1"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_sampling_params_out_of_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(block_size=12), "block_size=12 must be a power of two"),
        (dict(block_size=0), "block_size=0 must be a power of two"),
        (dict(num_blocks=0), "num_blocks=0 must be a positive integer"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(max_num_batched_tokens=-5), "max_num_batched_tokens"),
        (dict(attention_backend="cuda"), "attention_backend"),
    ],
)
def test_engine_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_unknown_model_name():
    with pytest.raises(
        ValueError, match=r"unknown model 'no-such-org/no-such-model'.*not in the local Hugging Face cache"
    ):
        Engine("no-such-org/no-such-model")
    with pytest.raises(ValueError, match="does not exist"):
        Engine("./no/such/folder")


def test_kv_budget_below_one_block():
    with pytest.raises(ValueError, match="cannot hold one block"):
        Engine("tiny", block_size=16, kv_cache_memory=1000)


def test_pool_smaller_than_one_request_fails_alone():
    model = build_tiny_model()
    prompts = random_prompts(3, 4, 12, seed=4)
    prompts.insert(1, list(range(3, 60)))  # 57 tokens + 8 outputs > 6 blocks of 8 tokens
    engine = Engine(build_tiny_model(), block_size=8, num_blocks=6)
    outs = engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert outs[1].finish_reason == "error" and "whole KV pool has 6" in outs[1].error
    assert outs[1].token_ids == []
    for i in (0, 2, 3):
        assert outs[i].token_ids == hf_greedy(model, prompts[i], 8)
    assert engine.pool.num_free_blocks == 6


def test_sliding_window_models_run_past_their_window_and_others_are_refused():
    """Sliding windows are implemented (issue 14): the window no longer caps max_model_len. A model whose
    layers compute attention themselves is refused at Engine() with the reason (tests/test_probe.py)."""
    from kvscope.engine.worker.attention import UnsupportedModelError
    from kvscope.models.zoo import tiny_model

    engine = Engine(build_tiny_model("mistral", sliding_window=64), num_blocks=8, max_model_len=256)
    assert engine.max_model_len == 256 and {x.sliding_window for x in engine.spec.layers} == {64}
    qwen = build_tiny_model("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=1)
    assert [x.sliding_window for x in Engine(qwen, num_blocks=8).spec.layers] == [None, 32]
    with pytest.raises(UnsupportedModelError, match="bloom model: its layers never call"):
        Engine(tiny_model("bloom"), num_blocks=8)
