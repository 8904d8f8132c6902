"""Soak: hundreds of requests with random arrivals and aborts on a pool that forces preemptions.

Every request that is not aborted must produce exactly what it produces when run alone; the pool must
return to empty; and the recorded steps, token counts and request events must add up. The same with
speculative decoding (prompt lookup, and an early-exit draft model with its own pool, which must
return to empty too): drafts rolled back under preemption and abort must change no output.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvscope import Engine, SamplingParams
from kvscope.engine.spec_decode.draft_model import early_exit_draft
from kvscope.models.loader import build_tiny_model, build_tiny_tokenizer

NUM_REQUESTS = 300
COUNTS: dict[str, int] = {}  # what the soak did (figures for docs/reliability.md)


def soak_engine(speculative: str | None) -> Engine:
    kw = dict(block_size=8, num_blocks=40, max_num_batched_tokens=32, max_num_seqs=16)
    if speculative is None:
        return Engine("tiny", **kw)
    if speculative == "ngram":
        return Engine("tiny", **kw, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                        "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    target = build_tiny_model("llama")  # the weights of "tiny"
    return Engine(target, tokenizer=build_tiny_tokenizer(), **kw, speculative_config={
        "method": "draft_model", "model": early_exit_draft(target, 1), "num_speculative_tokens": 3})


@pytest.mark.parametrize("speculative", [None, "ngram", "draft_model"])
def test_soak_random_arrivals_aborts_preemptions_prefix_sharing(speculative):
    rng = random.Random(1234)
    system = [rng.randrange(3, 512) for _ in range(24)]
    prompts = []
    for _ in range(NUM_REQUESTS):
        body = [rng.randrange(3, 512) for _ in range(rng.randint(1, 40))]
        prompts.append(system + body if rng.random() < 0.5 else body)
    params = [SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]

    engine = soak_engine(speculative)
    ids: dict[str, int] = {}
    outputs: dict[str, list[int]] = {}
    aborted: dict[str, str] = {}
    pending = list(range(NUM_REQUESTS))
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.choice([0, 0, 1, 2, 5])):  # bursty arrivals
            if pending:
                i = pending.pop(0)
                # own ids: the random choices below sort by id, so ids from the process-wide counter
                # would make the soak depend on how many requests earlier tests made
                ids[engine.add_request(prompts[i], params[i], request_id=f"soak-{i}")] = i
        if rng.random() < 0.08 and engine.requests:
            live = sorted(engine.requests)
            mid_prefill = [
                k
                for k in live
                if 0 < engine.requests[k].num_computed_tokens < engine.requests[k].num_prompt_tokens
            ]
            rid = rng.choice(mid_prefill if mid_prefill and rng.random() < 0.5 else live)
            r = engine.requests[rid]
            phase = "decode" if r.num_output_tokens else ("prefill" if r.num_computed_tokens else "waiting")
            assert engine.abort(rid)
            aborted[rid] = phase
        for delta in engine.step():
            if delta.token_id is not None:
                outputs.setdefault(delta.request_id, []).append(delta.token_id)

    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # back to the baseline
    assert all(b.ref_cnt == 0 for b in engine.pool.blocks)
    draft_pool = getattr(engine.speculator.proposer, "pool", None) if engine.speculator else None
    if draft_pool is not None:  # the draft model's own pool too
        assert draft_pool.num_free_blocks == draft_pool.num_blocks and not engine.speculator.proposer.shadows
    recorder = engine.recorder  # nothing kept per request once it ended (tests/reliability/test_request_ids.py)
    assert engine.requests == {} and engine.kv._num_offered == {} and recorder._pending == []
    assert recorder._seen_scheduled == set() and recorder._was_preempted == set() and recorder._renamed == {}
    assert recorder.pages.tables == {} and recorder.pages.holders == {}
    phases = Counter(aborted.values())
    if speculative is not None:
        s = engine.recorder.steps
        drafted = sum(r.spec_decode.num_draft_tokens for r in s if r.spec_decode is not None)
        accepted = sum(r.spec_decode.num_accepted_tokens for r in s if r.spec_decode is not None)
        assert 0 < accepted < drafted, (accepted, drafted)
        COUNTS[f"{speculative}: draft tokens"] = drafted
        COUNTS[f"{speculative}: accepted"] = accepted
    COUNTS.update(requests=NUM_REQUESTS, steps=engine.step_index, aborted=len(aborted),
                  **{f"aborted while {k}": v for k, v in sorted(phases.items())},
                  preemptions=engine.scheduler.num_preemptions, prefix_cache_hit_tokens=engine.pool.prefix_cache_hits)
    assert phases["prefill"] > 0 and phases["decode"] > 0, phases
    assert engine.scheduler.num_preemptions > 0 and engine.pool.prefix_cache_hits > 0

    # every finished request equals an isolated run of it
    finished = {e.request_id: e for e in engine.recorder.events if e.kind == "finished"}
    alone = Engine("tiny", block_size=8, num_blocks=64, enable_prefix_caching=False, telemetry=False)
    for rid, i in ids.items():
        if rid in aborted:
            assert finished[rid].reason == "abort"
            continue
        assert finished[rid].reason == "length"
        assert outputs.get(rid, []) == alone.generate([prompts[i]], params[i])[0].token_ids, (
            f"request {i} differs"
        )

    # the records add up
    steps = engine.recorder.steps
    assert len(steps) == engine.step_index == engine.recorder.num_steps_recorded
    assert [s.step for s in steps] == list(range(len(steps)))
    assert sum(s.num_output_tokens for s in steps) == sum(len(t) for t in outputs.values())
    events = Counter(e.kind for e in engine.recorder.events)
    assert events["queued"] == events["finished"] == NUM_REQUESTS
    assert events["first_token"] == sum(1 for t in outputs.values() if t)
    assert events["preempted"] == engine.scheduler.num_preemptions >= events["resumed"]
    for s in steps:
        assert (
            s.num_prefill_tokens + s.num_decode_tokens == sum(item.num_tokens for item in s.scheduled) <= 32
        )
        assert s.kv.blocks_used <= s.kv.num_blocks
