"""``batch_summary``: the step's ``BatchSummary`` as telemetry sees it, in the cases its fast paths skip
(admitted requests anywhere in the batch, or not in it; drafts; a hybrid model's tables)."""

from __future__ import annotations

from dataclasses import asdict

from kvscope.engine.batch import batch_summary
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request, SamplingParams


def req(rid: str, prompt: int, outputs: int = 0, computed: int = 0) -> Request:
    r = Request(rid, list(range(prompt)), SamplingParams(max_tokens=64))
    for t in range(outputs):
        r.append_token(t)
    r.num_computed_tokens = computed
    r.block_ids = [len(rid), prompt]
    return r


def expected_items(sched: SchedulerOutput, sampled: list[Request]) -> list[tuple]:
    """What each scheduled item must say, written plainly (one request at a time)."""
    out = []
    for r, n, is_decode in zip(sched.requests, sched.num_tokens, sched.is_decode):
        drafts = sched.scheduled_spec_decode_tokens.get(r.request_id)
        out.append((r.request_id, "decode" if is_decode else "prefill", n, r.num_computed_tokens,
                    any(s is r for s in sampled), len(drafts) if drafts else 0))
    return out


def test_items_flags_and_admitted_progress_wherever_the_admitted_stand():
    a, b, c, d = req("a", 8, 2, 10), req("b", 5, 0, 5), req("c", 9, 0, 4), req("d", 6, 0, 0)
    # "b" admitted at the front, "c" in the middle, "d" admitted but not scheduled (preempted at once)
    sched = SchedulerOutput([b, a, c], [5, 1, 4], [False, True, False], admitted=[c, b, d])
    sampled = [a, b]
    batch = batch_summary(3, sched, sampled, 0)
    got = [(i.request_id, i.kind, i.num_tokens, i.context_len, i.sampled, i.num_draft_tokens)
           for i in batch.scheduled]
    assert got == expected_items(sched, sampled)
    assert [asdict(p) for p in batch.admitted] == [
        {"request_id": "c", "num_prompt_tokens": 9, "num_output_tokens": 0, "num_cached_tokens": 0},
        {"request_id": "b", "num_prompt_tokens": 5, "num_output_tokens": -1, "num_cached_tokens": 0},
        {"request_id": "d", "num_prompt_tokens": 6, "num_output_tokens": 0, "num_cached_tokens": 0},
    ]
    assert batch.block_tables == [r.block_ids for r in sched.requests] and batch.step == 3


def test_admitted_at_the_end_and_drafts():
    a, b = req("a", 4, 3, 9), req("b", 7, 0, 7)
    sched = SchedulerOutput([a, b], [3, 7], [True, False], admitted=[b],
                            scheduled_spec_decode_tokens={"a": [5, 6]})
    batch = batch_summary(0, sched, [a, b], 1, accepted={"a": [5]})
    assert [(i.num_draft_tokens, i.num_accepted_tokens) for i in batch.scheduled] == [(2, 1), (0, 0)]
    got = [(i.request_id, i.kind, i.num_tokens, i.context_len, i.sampled, i.num_draft_tokens)
           for i in batch.scheduled]
    assert got == expected_items(sched, [a, b])
    assert [(p.request_id, p.num_output_tokens, p.num_cached_tokens) for p in batch.admitted] == [("b", -1, 0)]
    assert batch.num_finished == 1


def test_a_hybrid_models_tables_are_interleaved():
    a, b = req("a", 8, 1, 9), req("b", 8, 1, 9)
    a.block_ids, a.extra_block_ids = [1, 2], [[-1, 7]]
    sched = SchedulerOutput([a, b], [1, 1], [True, True])
    batch = batch_summary(0, sched, [b], 0)
    assert [i.num_kv_groups for i in batch.scheduled] == [2, 1]
    assert [i.sampled for i in batch.scheduled] == [False, True]
    assert batch.block_tables == [[1, -1, 2, 7], b.block_ids]
