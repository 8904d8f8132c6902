"""``fewer_collections``: the collector's settings during a simulation, and back as they were after it."""

from __future__ import annotations

import gc
import weakref

import pytest

from kvscope.utils.collector import fewer_collections


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_settings_restored_after_the_block_even_on_error():
    thresholds, callbacks, frozen = gc.get_threshold(), list(gc.callbacks), gc.get_freeze_count()
    with pytest.raises(RuntimeError), fewer_collections(12_345):
        assert gc.get_threshold()[0] == 12_345
        assert len(gc.callbacks) == len(callbacks) + 1
        raise RuntimeError("boom")
    assert gc.get_threshold() == thresholds
    assert gc.callbacks == callbacks
    assert gc.get_freeze_count() == frozen


def test_heap_frozen_at_start_and_survivors_frozen_after_each_collection():
    gc.unfreeze()
    with fewer_collections():
        at_start = gc.get_freeze_count()
        assert at_start > 0
        kept = [Node() for _ in range(1000)]  # alive through the collection below
        gc.collect(0)
        assert gc.get_freeze_count() >= at_start + len(kept)
        assert all(gc.is_tracked(node) for node in kept)
    assert gc.get_freeze_count() == 0


def test_young_cycles_are_still_collected():
    with fewer_collections():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        alive = weakref.ref(a)
        del a, b
        gc.collect(0)
        assert alive() is None


def test_cycles_frozen_during_the_run_are_collected_after_it():
    with fewer_collections():
        a, b = Node(), Node()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        gc.collect(0)  # survives: frozen
        del a, b
        gc.collect(0)
        assert alive() is not None  # frozen: left to the first full collection after the run
    gc.collect()
    assert alive() is None
