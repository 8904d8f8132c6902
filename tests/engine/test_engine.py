"""The engine's greedy output equals transformers' own generate, token for token, on five architectures,
with batching, chunked prefill, prefix-cache hits, preemption and two block sizes."""

import pytest
from helpers import hf_greedy, random_prompts

from kvscope import Engine, SamplingParams
from kvscope.models.loader import TINY_ARCHS, build_tiny_model

MAX_TOKENS = 24
# 14 prompts of 1..70 tokens plus 6 that share a 40-token prefix
PROMPTS = random_prompts(20, 1, 70, seed=1, shared_prefix=40, num_shared=6)

SCENARIOS = {
    # name: engine kwargs
    "batched-bs16": dict(block_size=16, num_blocks=256, max_num_batched_tokens=2048),
    "chunked-bs8": dict(block_size=8, num_blocks=256, max_num_batched_tokens=24),
    "preempt-bs4": dict(block_size=4, num_blocks=48, max_num_batched_tokens=64),
}


@pytest.fixture(scope="module", params=TINY_ARCHS)
def arch_refs(request):
    arch = request.param
    model = build_tiny_model(arch)
    return arch, [hf_greedy(model, p, MAX_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_greedy_matches_transformers_generate(arch_refs, scenario):
    arch, refs = arch_refs
    engine = Engine(build_tiny_model(arch), **SCENARIOS[scenario])
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.token_ids == ref, f"{arch}/{scenario}: prompt {i} differs"
        assert out.finish_reason == "length"
    steps = engine.recorder.steps
    assert max(s.num_prefill_seqs + s.num_decode_seqs for s in steps) > 4  # really batched
    assert engine.pool.prefix_cache_hits > 0  # the shared prefix was served from the cache
    if scenario.startswith("chunked"):
        budget = SCENARIOS[scenario]["max_num_batched_tokens"]
        assert max(len(p) for p in PROMPTS) > budget
        assert all(s.num_tokens <= budget for s in steps)
    if scenario.startswith("preempt"):
        assert engine.scheduler.num_preemptions > 0
        assert any(o.num_preemptions > 0 for o in outs)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # nothing leaked


def test_eos_stops_like_generate():
    model = build_tiny_model("llama", seed=3)
    prompts = random_prompts(24, 2, 20, seed=5)
    engine = Engine(build_tiny_model("llama", seed=3), block_size=8, num_blocks=128)
    # make a token the model often emits its EOS, so that some requests stop early
    eos = engine.generate(prompts[:1], SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids[1]
    model.generation_config.eos_token_id = eos
    engine.eos_token_ids = frozenset([eos])
    outs = engine.generate(prompts, SamplingParams(max_tokens=16))
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(model, p, 16, eos=True)
    assert any(o.finish_reason == "stop" for o in outs) and any(o.finish_reason == "length" for o in outs)


def test_stop_token_ids_and_max_tokens():
    engine = Engine("tiny", block_size=8, num_blocks=64)
    full = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    stop_at = full.token_ids[3]
    out = engine.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=10, stop_token_ids=[stop_at], ignore_eos=True)
    )[0]
    assert (
        out.token_ids == full.token_ids[: full.token_ids.index(stop_at) + 1] and out.finish_reason == "stop"
    )


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    engine = Engine("tiny", block_size=8, num_blocks=64)
    prompt = [[10, 11, 12, 13]]
    greedy = engine.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    top1 = engine.generate(prompt, SamplingParams(max_tokens=12, temperature=1.0, top_k=1, ignore_eos=True))[
        0
    ]
    assert top1.token_ids == greedy
    p = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.9, seed=7, ignore_eos=True)
    a = engine.generate(
        prompt * 3, [p, p, SamplingParams(max_tokens=12, temperature=1.5, seed=8, ignore_eos=True)]
    )
    assert a[0].token_ids == a[1].token_ids != a[2].token_ids
    assert engine.generate(prompt, p)[0].token_ids == a[0].token_ids


def test_text_prompts_and_stream():
    engine = Engine("tiny", block_size=8, num_blocks=64)
    outs = engine.generate(["Hello world", "The KV cache"], SamplingParams(max_tokens=6, ignore_eos=True))
    assert outs[0].prompt == "Hello world" and outs[0].text == engine.decode(outs[0].token_ids)
    deltas = list(
        engine.stream(["Hello world", "The KV cache"], SamplingParams(max_tokens=6, ignore_eos=True))
    )
    for i, out in enumerate(outs):
        mine = [d for d in deltas if d.index == i]
        assert [d.token_id for d in mine if d.token_id is not None] == out.token_ids
        assert "".join(d.text for d in mine) == out.text
        assert mine[-1].finished and mine[-1].finish_reason == "length"


def test_abort_and_add_request_step_api():
    engine = Engine("tiny", block_size=4, num_blocks=64)
    ids = [
        engine.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True))
        for p in random_prompts(5, 3, 20)
    ]
    for _ in range(3):
        engine.step()
    assert engine.abort(ids[1]) and not engine.abort(ids[1]) and not engine.abort("nope")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    finished = [e for e in engine.recorder.events if e.kind == "finished"]
    assert sorted(e.reason for e in finished) == ["abort"] + ["length"] * 4


def test_forward_failure_errors_the_batch_and_engine_recovers():
    engine = Engine("tiny", block_size=4, num_blocks=64)
    prompts = random_prompts(4, 5, 12, seed=9, shared_prefix=8, num_shared=2)
    expected = engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    original = engine.runner.forward
    calls = {"n": 0}

    def flaky(inp):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return original(inp)

    engine.runner.forward = flaky
    engine.pool.reset_prefix_cache()
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and not engine.has_unfinished_requests()
    errors = [e for e in engine.recorder.events if e.kind == "finished" and e.reason == "error"]
    assert errors and "boom" in errors[0].error
    engine.runner.forward = original
    again = engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in again] == [o.token_ids for o in expected]


def test_runs_an_in_memory_model_with_its_tokenizer():
    from kvscope.models.loader import build_tiny_tokenizer

    engine = Engine(build_tiny_model("qwen3"), tokenizer=build_tiny_tokenizer(), num_blocks=32)
    assert engine.generate("paged attention", SamplingParams(max_tokens=4))[0].finish_reason in (
        "length",
        "stop",
    )
    assert engine.spec.num_layers == 2 and engine.spec.num_kv_heads == 2 and engine.spec.head_dim == 16
