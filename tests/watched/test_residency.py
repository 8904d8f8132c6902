"""The prefix tree rebuilt from KV events: chains, shared prefixes, evictions (of a leaf, of a prefix, of
blocks never seen stored), blocks stored again, media, clears, per-interval counts and the icicle layout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.watched.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvscope.watched.residency import Residency


def store(res: Residency, hashes: list[str], parent: str | None = None, medium: str = "GPU", t: int = 0) -> None:
    res.apply(BlockStored(hashes, parent, 32 * len(hashes), 32, medium), t)


def shared_tree() -> Residency:
    """a-b shared by two continuations c and d-e; f alone."""
    res = Residency()
    store(res, ["a", "b", "c"])
    store(res, ["d", "e"], parent="b")
    store(res, ["f"])
    return res


def test_one_store_is_one_chain():
    res = Residency()
    store(res, ["a", "b", "c"])
    assert res.chains() == [["a", "b", "c"]]
    assert [res.blocks[k].depth for k in "abc"] == [0, 1, 2]
    assert res.roots() == ["a"] and res.num_distinct == 3


def test_a_shared_prefix_is_one_chain_with_branches():
    res = shared_tree()
    assert sorted(res.chains()) == [["a", "b", "c"], ["a", "b", "d", "e"], ["f"]]
    assert res.leaves_below() == {"a": 2, "b": 2, "c": 1, "d": 1, "e": 1, "f": 1}
    assert res.hot() == [("a", 2, 0), ("b", 2, 1)]
    s = res.summary()
    assert (s["kv_blocks_stored"], s["kv_blocks_resident"], s["kv_chains"], s["kv_shared_blocks"]) == (6, 6, 3, 2)


def test_icicle_layout_spans_the_rows_of_the_chains_below():
    layout = shared_tree().layout()
    block = {k: (x0, y0, y1) for k, x0, y0, y1 in zip(layout["key"], layout["x0"], layout["y0"], layout["y1"])}
    assert block["a"] == (0, 0, 2) and block["b"] == (1, 0, 2)  # the shared prefix spans both chains' rows
    assert {block["c"][1:], block["d"][1:]} == {(0, 1), (1, 2)} and block["e"][1:] == block["d"][1:]
    assert block["f"] == (0, 2, 3)  # the next tree below
    assert len(shared_tree().layout(max_rows=2)["key"]) == 5  # a-b-c-d-e fills the two rows; f is cut


def test_evictions_shrink_the_tree():
    res = shared_tree()
    res.apply(BlockRemoved(["e", "d"]), 1)
    assert sorted(res.chains()) == [["a", "b", "c"], ["f"]] and res.hot() == []
    res.apply(BlockRemoved(["a"]), 2)  # a prefix evicted before its continuation: b becomes a root, keeps its depth
    assert sorted(res.roots()) == ["b", "f"] and res.blocks["b"].depth == 1
    res.apply(BlockRemoved(["zz"]), 3)  # stored before the watch began
    s = res.summary()
    assert (s["kv_blocks_evicted"], s["kv_blocks_resident"], res.num_removed_unseen) == (4, 3, 1)
    assert s["kv_blocks_stored"] == 6  # distinct ever stored: evictions do not lower it


def test_a_block_stored_again_after_eviction():
    res = Residency()
    store(res, ["a"])
    res.apply(BlockRemoved(["a"]), 1)
    store(res, ["a"], t=5)
    assert res.num_restored == 1 and res.blocks["a"].times_stored == 2 and res.num_distinct == 1
    assert res.layout()["restored"] == [True]


def test_a_block_cached_on_two_media_stays_until_both_drop_it():
    res = Residency()
    store(res, ["a"], medium="GPU")
    store(res, ["a"], medium="CPU")
    res.apply(BlockRemoved(["a"], "GPU"), 1)
    assert "a" in res.blocks
    res.apply(BlockRemoved(["a"], "CPU"), 2)
    assert "a" not in res.blocks


def test_interval_counts_and_clears():
    res = shared_tree()
    counts = res.take_interval()
    assert (counts.stored, counts.removed, counts.cleared) == (6, 0, 0)
    res.apply(BlockRemoved(["f"]), 1)
    res.apply(AllBlocksCleared(), 2)
    counts = res.take_interval()
    assert (counts.stored, counts.removed, counts.cleared) == (0, 1, 5)
    assert res.num_resident == 0 and res.num_distinct == 6
    assert res.take_interval().stored == 0


ops = st.lists(st.tuples(st.sampled_from(["store", "remove", "clear"]), st.lists(st.integers(0, 12), min_size=1,
                                                                              max_size=4),
                         st.one_of(st.none(), st.integers(0, 12))), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_under_any_event_sequence(sequence):
    res = Residency()
    ever = set()
    for kind, keys, parent in sequence:
        keys = [str(k) for k in keys]
        if kind == "store":
            store(res, keys, str(parent) if parent is not None else None)
            ever.update(keys)
        elif kind == "remove":
            res.apply(BlockRemoved(keys), 0)
        else:
            res.apply(AllBlocksCleared(), 0)
    assert res.num_distinct == len(ever)
    assert set(res.blocks) <= ever
    below = res.leaves_below()
    assert set(below) == set(res.blocks)  # every cached block is reached from a root, once
    leaves = [k for k in res.blocks if not res._kids(k)]
    assert sum(below[r] for r in res.roots()) == len(leaves) == len(res.chains())
    layout = res.layout(max_rows=10_000)
    assert sorted(layout["key"]) == sorted(res.blocks)
