"""The incremental page map against the block pool and the requests' block tables, step by step."""

from __future__ import annotations

import pytest
from telemetry_util import greedy, make_engine

from kvscope import Run
from kvscope.telemetry.pagemap import page_map_at
from kvscope.telemetry.records import FREE_PAGE, StepRecord


def replayed(records):
    """The full map after each record, by applying the diffs in order."""
    current = [FREE_PAGE] * len(records[0].page_map)
    for r in records:
        for b, entry in r.page_map.items():
            current[b] = entry
        yield list(current)


def expected_entry(engine, block_id: int):
    """What the page map must say about a block, from the pool and the running requests alone."""
    block = engine.pool.blocks[block_id]
    bs = engine.pool.block_size
    holders = [r for r in engine.scheduler.running if block_id in r.block_ids]
    if block.ref_cnt == 0:
        return (
            ("cached" if block.block_hash is not None else "free"),
            (bs if block.block_hash is not None else 0),
            set(),
        )
    fills = {min(bs, r.num_computed_tokens - r.block_ids.index(block_id) * bs) for r in holders}
    assert len(fills) == 1, f"holders disagree on how full block {block_id} is: {fills}"
    return ("shared" if block.ref_cnt > 1 else "used"), fills.pop(), {r.request_id for r in holders}


@pytest.mark.parametrize("num_blocks, snapshot_every", [(12, None), (12, 3), (64, 5)])
def test_page_map_follows_the_pool_every_step(num_blocks, snapshot_every):
    engine = make_engine(num_blocks=num_blocks, max_num_batched_tokens=24)
    tracker = engine.recorder.pages
    if snapshot_every:
        tracker.snapshot_every = snapshot_every
    engine.recorder.clear()
    current = [FREE_PAGE] * num_blocks
    steps = []

    def check(item):
        if not isinstance(item, StepRecord):
            return
        if item.page_map_full:
            assert sorted(item.page_map) == list(range(num_blocks))
        for b, entry in item.page_map.items():
            current[b] = entry
        for b in range(num_blocks):
            entry = current[b]
            state, filled, holders = expected_entry(engine, b)
            assert (entry.state, entry.filled, entry.refs) == (
                state,
                filled,
                engine.pool.blocks[b].ref_cnt,
            ), b
            if holders:
                assert entry.owner in holders  # the owner is a request that holds the block now
            elif state == "free":
                assert entry.owner == ""
        steps.append(item)

    engine.recorder.subscribe(check)
    shared = [60, 61, 62, 63, 64, 65, 66, 67]
    prompts = [[*shared, 70 + i, 71, 72] for i in range(4)] + [[80 + i] * (5 + 3 * i) for i in range(3)]
    # the first holder of the shared blocks finishes first, so ownership must pass on
    engine.generate(prompts, [greedy(n) for n in (3, 9, 6, 9, 9, 9, 9)])
    assert len(steps) > 8
    assert any(e.state == "shared" for r in steps for e in r.page_map.values())
    assert any(e.state == "cached" for r in steps for e in r.page_map.values())
    full = [r.step for r in steps if r.page_map_full]
    assert full[0] == steps[0].step
    if snapshot_every:
        assert full == [r.step for i, r in enumerate(steps) if i % snapshot_every == 0]
    # a diff names only blocks whose entry changed
    for prev_map, r in zip(replayed(steps), steps[1:]):
        if not r.page_map_full:
            assert all(prev_map[b] != entry for b, entry in r.page_map.items())
    # replay from snapshots + diffs gives the same map as the live tracker ended with
    run = Run.from_engine(engine)
    assert run.page_map_at(steps[-1].step) == tracker.entries


def test_diffs_are_small_in_a_big_pool():
    """The page map is incremental: a decode step in a 4096-block pool reports one or two blocks."""
    engine = make_engine(num_blocks=4096)
    engine.add_request([5, 6, 7, 8, 9], greedy(6), request_id="req-x")
    while engine.has_unfinished_requests():
        engine.step()
    records = list(engine.recorder.steps)
    assert records[0].page_map_full and len(records[0].page_map) == 4096
    assert all(len(r.page_map) <= 2 for r in records[1:-1])
    # it ends with 10 tokens computed (5 prompt + 5 of its 6 outputs): blocks 0-1 full, block 2 holds
    # 2 tokens. Finished, the full ones stay cached (owner kept), the partial one is free again.
    last = records[-1].page_map
    assert sorted((e.state, e.filled, e.owner) for e in last.values()) == [
        ("cached", 4, "req-x"),
        ("cached", 4, "req-x"),
        ("free", 0, ""),
    ]


def test_page_map_at_needs_a_snapshot():
    engine = make_engine()
    engine.generate([[5, 6, 7, 8, 9]], greedy(4))
    records = list(engine.recorder.steps)
    with pytest.raises(ValueError, match="no full page-map snapshot"):
        page_map_at(records[1:], 3)
    assert page_map_at(records, 0)[0].owner == records[0].scheduled[0].request_id


def test_reset_prefix_cache_shows_in_the_next_record():
    engine = make_engine()
    engine.generate([[5, 6, 7, 8, 9, 10, 11, 12, 13]], greedy(2))
    cached = [b for b, e in enumerate(engine.recorder.pages.entries) if e.state == "cached"]
    assert len(cached) == 2
    engine.pool.reset_prefix_cache()
    engine.generate([[40, 41]], greedy(1))
    first = list(engine.recorder.steps)[-1]
    assert all(first.page_map[b].state == "free" for b in cached if b in first.page_map)
    assert all(engine.recorder.pages.entries[b].state in ("free", "used") for b in cached)


def test_finished_requests_leave_no_tracker_state():
    engine = make_engine()
    pages = engine.recorder.pages
    seen = []  # the decodes' tail entries are kept per owner while it runs (PageMapTracker.used_entries)
    engine.recorder.subscribe(
        lambda item: seen.append(len(pages.used_entries)) if isinstance(item, StepRecord) else None)
    engine.generate([[5 + i] * (3 + i) for i in range(6)], greedy(8))
    assert max(seen) > 0
    assert pages.tables == {} and pages.holders == {} and pages.used_entries == {}


@pytest.mark.parametrize("model_type", ["ministral", "gemma3_text"])
def test_page_map_follows_window_freeing_and_groups(model_type):
    """Windows of 16 on a block size of 4: blocks leave the tables while their requests run (null
    entries), a hybrid model's groups share the pool; the map must still match the pool every step,
    and say which group each held block is in."""
    from kvscope import Engine
    from kvscope.models.zoo import tiny_model

    engine = Engine(tiny_model(model_type), block_size=4, num_blocks=160, max_num_batched_tokens=16,
                    max_model_len=256)
    tracker, bs = engine.recorder.pages, 4
    checked = []

    def check(item):
        if not isinstance(item, StepRecord):
            return
        for b in range(engine.pool.num_blocks):
            block, entry = engine.pool.blocks[b], tracker.entries[b]
            fills, holders = set(), set()
            for r in engine.scheduler.running:
                for table in r.block_tables:
                    if b in table:
                        holders.add(r.request_id)
                        fills.add(min(bs, r.num_computed_tokens - table.index(b) * bs))
            assert entry.refs == block.ref_cnt == len(holders), b
            if holders:
                assert entry.owner in holders and entry.filled == fills.pop() and not fills
                assert tracker.group[b] == block.group
            else:
                assert entry.state == ("cached" if block.block_hash is not None else "free")
        checked.append(item.step)

    engine.recorder.subscribe(check)
    shared = list(range(100, 140))
    prompts = [[*shared, *range(200 + 10 * i, 205 + 10 * i)] for i in range(3)]
    engine.generate(prompts, greedy(20))
    assert len(checked) > 10 and engine.pool.num_window_freed_blocks > 0
    assert tracker.tables == {} and tracker.holders == {} and tracker.live_from == {}


def test_after_light_steps_the_page_map_starts_again_from_the_pool():
    """A long simulation's light steps (``Recorder.set_detail(False)``) carry no items and no page-map changes;
    back in detail, the next record is a full snapshot and every record after it matches the pool again."""
    engine = make_engine(num_blocks=24, max_num_batched_tokens=24)
    engine.recorder.clear()
    records: list[StepRecord] = []

    def toggle(item):
        if isinstance(item, StepRecord):
            records.append(item)
            if len(records) == 3:
                engine.recorder.set_detail(False)
            if len(records) == 9:
                engine.recorder.set_detail(True)
            if len(records) > 9:  # in detail again: the map replayed from the snapshot is the pool's
                current = page_map_at(records, item.step)
                for b, entry in enumerate(current):
                    state, filled, holders = expected_entry(engine, b)
                    assert (entry.state, entry.filled, entry.refs) == (state, filled, len(holders) or entry.refs), b
                    assert entry.owner in holders if holders else entry.owner in ("", *_ids(records))

    engine.recorder.subscribe(toggle)
    shared = [60, 61, 62, 63, 64, 65, 66, 67]
    prompts = [[*shared, 70 + i, 71, 72] for i in range(4)] + [[80 + i] * (5 + 3 * i) for i in range(4)]
    engine.generate(prompts, [greedy(n) for n in (3, 14, 6, 14, 9, 12, 9, 16)])
    light = records[3:9]
    assert all(r.sampled_ids is not None and not r.scheduled and not r.page_map for r in light)
    assert sum(len(r.sampled_ids) for r in light) == sum(r.num_output_tokens for r in light) > 0
    assert records[9].page_map_full and records[9].scheduled
    assert len(records) > 14


def _ids(records: list[StepRecord]) -> set[str]:
    return {i.request_id for r in records for i in r.scheduled}
