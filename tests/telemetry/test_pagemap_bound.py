"""The page map is bounded whatever the pool's size (issue 38 item 3): it covers the pool's first
``MAX_MAPPED_BLOCKS`` blocks, its snapshots are that long at most, and blocks past it never enter it."""

from __future__ import annotations

import tracemalloc

from telemetry_util import greedy, make_engine
from test_pagemap import expected_entry

from kvscope import Run
from kvscope.telemetry import pagemap
from kvscope.telemetry.pagemap import MAX_MAPPED_BLOCKS, PageMapTracker
from kvscope.telemetry.records import BLOCK_ALLOCATED, StepRecord


def test_a_huge_pool_makes_a_bounded_tracker():
    tracemalloc.start()
    tracker = PageMapTracker(10**12, 16)  # a pool no memory holds: the map is the first 65,536 blocks
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert tracker.num_blocks == MAX_MAPPED_BLOCKS == 65_536 and tracker.pool_blocks == 10**12
    assert size < 16 * 2**20, size  # a few lists of 65,536 entries
    tracker.on_block_event(BLOCK_ALLOCATED, 10**11)  # past the map: dropped
    assert 10**11 not in tracker.dirty
    changes, full = tracker.update([], [])
    assert full and len(changes) == MAX_MAPPED_BLOCKS


def test_blocks_past_the_map_are_left_out_and_the_rest_is_right(monkeypatch):
    monkeypatch.setattr(pagemap, "MAX_MAPPED_BLOCKS", 6)
    engine = make_engine(num_blocks=40, max_num_batched_tokens=24)
    assert engine.recorder.pages.num_blocks == 6
    engine.recorder.clear()
    seen: list[StepRecord] = []
    current = {}

    def check(item):
        if not isinstance(item, StepRecord):
            return
        assert all(0 <= b < 6 for b in item.page_map), sorted(item.page_map)
        if item.page_map_full:
            assert sorted(item.page_map) == list(range(6))
        current.update(item.page_map)
        for b in range(6):  # the mapped blocks read as the pool says, though requests hold blocks past them
            state, filled, holders = expected_entry(engine, b)
            assert (current[b].state, current[b].filled) == (state, filled), b
            if holders:
                assert current[b].owner in holders
        seen.append(item)

    engine.recorder.subscribe(check)
    prompts = [[60, 61, 62, 63, 64, 65, 66, 67, 70 + i, 71, 72] for i in range(4)] + [[80 + i] * 13 for i in range(3)]
    engine.generate(prompts, [greedy(n) for n in (3, 9, 6, 9, 9, 9, 9)])
    assert max(r.kv.blocks_used for r in seen) > 6  # the run did use blocks past the map
    assert seen[-1].kv.num_blocks == 40  # the counts still cover the whole pool
    run = Run.from_engine(engine)
    assert len(run.page_map_at(seen[-1].step)) == 6
