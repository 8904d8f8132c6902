"""Prefix-cache misses per request, from real engine runs (tiny model) and one hand-made run: each cause."""

from __future__ import annotations

import math

import pytest

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.explain.prefix import prefix_misses
from kvscope.runs.result.run import Run
from kvscope.telemetry.records import KVState, RequestEvent, ScheduledItem, StepRecord

BS = 4
ONE = SamplingParams(max_tokens=1, ignore_eos=True)


def tokens(start: int, n: int) -> list[int]:
    return [3 + (start + i) % 500 for i in range(n)]


def rows_of(run: Run) -> dict:
    return {r.request_id: r for r in prefix_misses(run.records, run.events, {**run.meta, "t0_ns": run.t0_ns})}


@pytest.fixture(scope="module")
def eviction_run() -> Run:
    """A small pool (12 blocks of 4), one request at a time: A, four fillers that push A's cached blocks out,
    then A again with a new last token."""
    engine = Engine("tiny", num_blocks=12, block_size=BS, max_num_seqs=1)
    a = tokens(0, 13)
    fillers = [tokens(100 * (i + 1), 13) for i in range(4)]
    engine.generate([a, *fillers, [*a[:12], 499]], ONE)
    return Run.from_engine(engine)


def test_eviction_under_a_small_pool(eviction_run):
    rows = list(rows_of(eviction_run).values())
    again = rows[5]
    assert (again.num_reusable_tokens, again.num_cached_tokens, again.miss_cause) == (12, 0, "evicted")
    assert (again.diverged_at, again.diverged_from) == (12, rows[0].request_id)
    assert again.num_missed_tokens == 12
    # A finished in its step; its blocks were evicted at a later step, under a full pool, before the lookup
    finished = next(
        e for e in eviction_run.events if e.kind == "finished" and e.request_id == rows[0].request_id
    )
    assert again.released_s == pytest.approx((finished.t_ns - eviction_run.t0_ns) / 1e9)
    assert finished.step < again.evicted_at_step <= again.lookup_step
    # before step 3, A and two fillers held 9 of the 12 blocks cached: the third filler needs 4, evicts A's oldest
    assert (again.evicted_at_step, again.pool_filled) == (3, 0.75) and again.idle_s >= 0
    assert all(r.miss_cause is None for r in rows[:5])


def test_duplicates_submitted_together_hit_every_whole_block_but_the_last():
    engine = Engine("tiny", num_blocks=64, block_size=BS)
    twelve, thirteen = tokens(0, 12), tokens(50, 13)
    engine.generate([twelve, twelve, twelve, thirteen, thirteen], ONE)
    rows = rows_of(Run.from_engine(engine))
    got = [(r.num_cached_tokens, r.num_reusable_tokens, r.miss_cause, r.diverged_at) for r in rows.values()]
    # the engine offers a block to the cache when it is scheduled: copies in one step share it
    assert got == [
        (0, 0, None, None),
        (8, 8, None, None),
        (8, 8, None, None),
        (0, 0, None, None),
        (12, 12, None, None),
    ]


def test_cache_off():
    engine = Engine("tiny", num_blocks=64, block_size=BS, enable_prefix_caching=False)
    engine.generate([tokens(0, 13), tokens(0, 13)], ONE)
    first, second = rows_of(Run.from_engine(engine)).values()
    assert (first.miss_cause, second.miss_cause, second.num_missed_tokens) == (None, "cache_off", 12)


def test_rows_survive_the_files(eviction_run, tmp_path):
    path = eviction_run.save_metrics(tmp_path / "run.metrics.jsonl")
    loaded = kvscope.load(path)
    frame, again = eviction_run.prefix_misses(), loaded.prefix_misses()
    assert list(frame["miss_cause"]) == list(again["miss_cause"]) == [None] * 5 + ["evicted"]
    assert frame["num_reusable_tokens"].tolist() == again["num_reusable_tokens"].tolist()
    assert str(frame["diverged_at"].dtype) == "Int64" and frame["diverged_at"].iloc[5] == 12


def _record(step: int, t: int, items: list[ScheduledItem]) -> StepRecord:
    kv = KVState(16, BS, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0)
    return StepRecord(
        step,
        t,
        t + 100,
        10,
        10,
        60,
        10,
        10,
        len(items),
        sum(i.num_tokens for i in items),
        0,
        0,
        len(items),
        0,
        0,
        0,
        0,
        items,
        kv,
    )


def test_in_flight_copies_submitted_together():
    """A scheduler that caps each prefill chunk (vLLM's long_prefill_token_threshold) admits the second copy in
    the step in which the first one computes only its first block: the copy finds that block (scheduled before
    it in the step) but not the second one, still in flight. (kvscope's own scheduler gives a running prefill
    the whole budget before it admits anyone, so its copies never find a block in flight.)"""
    prompt = tokens(0, 12)
    events = [
        RequestEvent(0, 0, "p", "queued", 12, prompt_token_ids=prompt),
        RequestEvent(1, 0, "q", "queued", 12, prompt_token_ids=prompt),
        RequestEvent(10, 0, "p", "scheduled", 12, num_cached_tokens=0),
        RequestEvent(10, 0, "q", "scheduled", 12, num_cached_tokens=4),
    ]
    records = [
        _record(0, 10, [ScheduledItem("p", "prefill", 4, 4), ScheduledItem("q", "prefill", 4, 8)]),
        _record(1, 200, [ScheduledItem("p", "prefill", 4, 8), ScheduledItem("q", "prefill", 4, 12, True)]),
    ]
    rows = {r.request_id: r for r in prefix_misses(records, events, {"block_size": BS, "t0_ns": 0})}
    q = rows["q"]
    assert (q.num_cached_tokens, q.num_reusable_tokens, q.miss_cause, q.num_missed_tokens) == (
        4,
        8,
        "in_flight",
        4,
    )
    assert q.released_s is None and q.evicted_at_step is None
    assert rows["p"].miss_cause is None


def test_a_run_without_prompts_is_refused():
    events = [RequestEvent(0, 0, "p", "queued", 12)]
    with pytest.raises(ValueError, match="did not record its prompts"):
        prefix_misses([], events, {"block_size": BS})


def test_no_nan_in_rows(eviction_run):
    for row in prefix_misses(eviction_run.records, eviction_run.events, eviction_run.meta):
        assert all(
            not (isinstance(v, float) and math.isnan(v)) for v in (row.idle_s, row.pool_filled, row.arrival_s)
        )


def test_window_blocks_evicted_while_their_request_runs():
    """A sliding-window model (window 8) gives back the blocks a long request left behind; they stay cached until
    two fillers take the small pool, while that request still decodes. A copy of its prompt then misses them:
    the chain must be cached from its first block, and the request that shares it still runs."""
    from kvscope.models.loader import build_tiny_model

    engine = Engine(
        build_tiny_model("mistral", sliding_window=8), num_blocks=14, block_size=BS, max_num_seqs=4
    )
    first = tokens(0, 24)
    engine.add_request(first, SamplingParams(max_tokens=30, ignore_eos=True))
    for _ in range(6):
        engine.step()
    for start in (200, 300):
        engine.add_request(tokens(start, 16), SamplingParams(max_tokens=4, ignore_eos=True))
    for _ in range(6):
        engine.step()
    engine.add_request([*first[:20], 499, 498, 497], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    run = Run.from_engine(engine)
    rows = list(rows_of(run).values())
    copy = rows[3]
    assert (copy.num_reusable_tokens, copy.diverged_at, copy.diverged_from) == (20, 20, rows[0].request_id)
    assert copy.num_cached_tokens < 20 and copy.miss_cause == "window"
    assert run.records[-1].kv.num_window_freed_blocks > 0 and run.records[-1].kv.num_evictions > 0
    finished = {e.request_id: e.step for e in run.events if e.kind == "finished"}
    assert finished[rows[0].request_id] > copy.lookup_step  # the sharer still ran when the copy looked up
