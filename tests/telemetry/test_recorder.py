"""Step records against hand-computed values and against the block pool at every step."""

from __future__ import annotations

import itertools

import pytest
from telemetry_util import PROMPT_A, PROMPT_B, greedy, make_engine

from kvscope import Run, SamplingParams
from kvscope.telemetry.records import StepRecord


def test_fragmentation_matches_hand_computed_values(two_request_run):
    _, run = two_request_run
    # block_size 4. Step 0 prefills 5 + 7 tokens: 2 + 2 blocks, 12 of 16 slots filled.
    # Step 1 decodes one token each: 6 + 8 tokens, still 4 blocks: 14 / 16.
    # Step 2: 7 + 9 tokens, B needs a third block: 16 / 20.  Step 3: both finish, nothing used.
    assert [r.kv.blocks_used for r in run.records] == [4, 4, 5, 0]
    assert [r.kv.tokens_stored for r in run.records] == [12, 14, 16, 0]
    assert [r.kv.fragmentation for r in run.records] == pytest.approx(
        [1 - 12 / 16, 1 - 14 / 16, 1 - 16 / 20, 0.0]
    )
    assert [r.kv.token_usage for r in run.records] == pytest.approx([12 / 256, 14 / 256, 16 / 256, 0.0])


def test_static_counterfactual_is_requests_times_max_len_times_bytes_per_token(two_request_run):
    engine, run = two_request_run
    cfg = engine.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # K and V, float32
    assert run.meta["kv_bytes_per_token"] == bytes_per_token
    expected = [n * 128 * bytes_per_token for n in (2, 2, 2, 0)]  # max_model_len=128
    assert [r.kv.static_reservation_bytes for r in run.records] == expected
    assert [r.kv.paged_bytes for r in run.records] == [n * 4 * bytes_per_token for n in (4, 4, 5, 0)]


def test_batch_composition_and_sampled_flags(two_request_run):
    _, run = two_request_run
    first, second = run.records[0], run.records[1]
    assert (first.num_prefill_seqs, first.num_prefill_tokens, first.num_decode_tokens) == (2, 12, 0)
    assert (second.num_prefill_seqs, second.num_decode_seqs, second.num_decode_tokens) == (0, 2, 2)
    assert [(s.kind, s.num_tokens, s.context_len, s.sampled) for s in first.scheduled] == [
        ("prefill", 5, 5, True),
        ("prefill", 7, 7, True),
    ]
    assert all(s.sampled for r in run.records for s in r.scheduled)
    assert [r.num_output_tokens for r in run.records] == [2, 2, 2, 2]
    assert [r.num_finished for r in run.records] == [0, 0, 0, 2]
    for r in run.records:  # phases add up to the step
        assert r.schedule_ns + r.prepare_ns + r.forward_ns + r.sample_ns + r.update_ns == r.duration_ns


def test_block_counts_match_the_pool_at_every_step():
    """Checked inline, by a subscriber, while the pool is in exactly the recorded state."""
    engine = make_engine(num_blocks=10, max_num_batched_tokens=16)
    checked = []

    def check(item):
        if isinstance(item, StepRecord):
            pool = engine.pool
            assert item.kv.blocks_used == pool.num_used_blocks
            assert item.kv.blocks_cached_free == pool.num_cached_free_blocks
            assert item.kv.blocks_used == sum(1 for b in pool.blocks if b.ref_cnt > 0)
            stored = sum(r.num_computed_tokens for r in engine.scheduler.running)
            shared_extra = sum(b.ref_cnt - 1 for b in pool.blocks if b.ref_cnt > 1)
            assert item.kv.tokens_stored == stored - shared_extra * pool.block_size
            assert item.num_running == len(engine.scheduler.running)
            checked.append(item.step)

    engine.recorder.subscribe(check)
    prompts = [[7, 8, 9, 10, 11, 12, 13, 14, i] for i in range(30, 36)]  # shared first 2 blocks
    outs = engine.generate(prompts, greedy(12))
    assert all(o.finish_reason == "length" for o in outs)
    assert checked == [r.step for r in engine.recorder.steps] and len(checked) > 10
    assert sum(r.num_preempted for r in engine.recorder.steps) > 0  # the small pool forced preemption


def test_request_events_and_latencies_agree_with_step_timestamps(two_request_run):
    _, run = two_request_run
    by_kind = {(e.request_id, e.kind): e for e in run.events}
    ends = [r.t_end_ns for r in run.records]
    for rid in run.requests["request_id"]:
        q, s = by_kind[(rid, "queued")], by_kind[(rid, "scheduled")]
        f, fin = by_kind[(rid, "first_token")], by_kind[(rid, "finished")]
        assert q.t_ns <= s.t_ns <= f.t_ns <= fin.t_ns
        assert (
            s.t_ns == run.records[0].t_start_ns + run.records[0].schedule_ns
        )  # stamped at end of scheduling
        assert f.t_ns == ends[0]  # the first token arrives when step 0 hands it back
        assert fin.t_ns == ends[3] and fin.reason == "length" and fin.num_output_tokens == 4
        row = run.requests.set_index("request_id").loc[rid]
        assert row.ttft_s == pytest.approx((ends[0] - q.t_ns) / 1e9, abs=1e-12)
        assert row.e2e_s == pytest.approx((ends[3] - q.t_ns) / 1e9, abs=1e-12)
        itl = [(b - a) / 1e9 for a, b in itertools.pairwise(ends)]
        assert row.itl_mean_s == pytest.approx(sum(itl) / 3)
        assert row.tpot_s == pytest.approx((ends[3] - ends[0]) / 1e9 / 3)
        assert row.queue_s == pytest.approx((s.t_ns - q.t_ns) / 1e9, abs=1e-12)
        assert row.num_output_tokens == 4 and row.finish_reason == "length"


def test_prefix_hits_are_counted():
    engine = make_engine()
    shared = [40, 41, 42, 43, 44, 45, 46, 47]  # two full blocks
    engine.generate([shared, [*shared, 50, 51]], greedy(2))
    run = Run.from_engine(engine)
    # A queries 8 tokens, finds none; B (10 tokens) finds A's two blocks, offered while A was scheduled.
    assert (run.records[0].kv.prefix_cache_queries, run.records[0].kv.prefix_cache_hits) == (18, 8)
    assert run.summary()["prefix_cache_hit_rate"] == pytest.approx(8 / 18)
    assert run.requests["num_cached_tokens"].tolist() == [0, 8]
    # B computed only its 2 uncached tokens; its first two blocks are shared with A.
    assert [s.num_tokens for s in run.records[0].scheduled] == [8, 2]
    shared_pages = {b: e for b, e in run.records[0].page_map.items() if e.state == "shared"}
    assert len(shared_pages) == 2
    assert all(
        e.refs == 2 and e.filled == 4 and e.owner == run.requests.request_id[0] for e in shared_pages.values()
    )


def test_preemption_events_and_lanes():
    engine = make_engine(num_blocks=6)
    outs = engine.generate([[30 + i] * 6 for i in range(3)], greedy(10))
    run = Run.from_engine(engine)
    kinds = [e.kind for e in run.events]
    assert kinds.count("preempted") == kinds.count("resumed") > 0
    assert kinds.count("preempted") == sum(r.num_preempted for r in run.records)
    assert run.requests["num_preemptions"].sum() == sum(o.num_preemptions for o in outs) > 0
    assert run.summary()["preemptions"] == kinds.count("preempted")
    assert (run.requests["num_output_tokens"] == 10).all()


def test_subscriber_errors_do_not_stop_the_engine_and_steps_since(engine):
    seen = []

    def broken(item):
        raise RuntimeError("boom")

    engine.recorder.subscribe(broken)
    unsubscribe = engine.recorder.subscribe(seen.append)
    engine.generate([PROMPT_A], greedy(3))
    assert broken not in engine.recorder.subscribers and "boom" in engine.recorder.subscriber_errors[0]
    assert [type(x).__name__ for x in seen].count("StepRecord") == 3
    assert [r.step for r in engine.recorder.steps_since(1)] == [1, 2]
    unsubscribe()
    engine.generate([PROMPT_B], greedy(1))
    assert [type(x).__name__ for x in seen].count("StepRecord") == 3


def test_ring_buffer_is_bounded():
    engine = make_engine()
    engine.recorder.capacity = 3
    engine.recorder.clear()
    engine.generate([PROMPT_A], greedy(6))
    assert [r.step for r in engine.recorder.steps] == [3, 4, 5]
    assert engine.recorder.num_steps_recorded == 6
    assert Run.from_engine(engine).meta["num_steps_dropped"] == 3


def test_telemetry_off_records_nothing():
    engine = make_engine(telemetry=False)
    assert engine.recorder is None
    out = engine.generate([PROMPT_A], SamplingParams(max_tokens=2))
    assert len(out[0].token_ids) >= 1
    with pytest.raises(ValueError, match="telemetry=False"):
        Run.from_engine(engine)
