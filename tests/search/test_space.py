"""The search space's syntax: every combination in the order written, values parsed, bad input refused by name."""

from __future__ import annotations

import pytest

from kvscope.search.space import SearchSpace


def test_every_combination_in_order_last_key_fastest():
    space = SearchSpace.parse("block_size=16,32 max-num-seqs=64,128 replicas=1,2 pd=none,1p1d")
    points = list(space.points())
    assert len(space) == len(points) == 16
    assert space.keys == ("block_size", "max_num_seqs", "replicas", "pd")
    assert space.names == ("block_size", "max-num-seqs", "replicas", "pd")  # the table's columns, as written
    assert points[0].values == (16, 64, 1, None) and points[1].values == (16, 64, 1, "1P1D")
    assert points[-1].values == (32, 128, 2, "1P1D") and [p.index for p in points] == list(range(16))
    assert points[1].label() == "block_size=16 max_num_seqs=64 replicas=1 pd=1p1d"


def test_values_are_parsed_by_key():
    p = next(SearchSpace.parse("kv_memory=2GiB prefix_caching=off gpu=A100 router=round-robin tp=2").points())
    assert p.values == (2 << 30, False, "a100-40gb", "round_robin", 2)


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty"),
    ("block_size", "not KEY=V1,V2"),
    ("colour=red", "unknown search space key 'colour'; known: block_size"),
    ("block_size=16 block_size=32", "given twice"),
    ("block_size=16,16", "lists a value twice"),
    ("block_size=16,", "empty value"),
    ("max_num_seqs=0", "max_num_seqs='0': must be a whole number from 1"),
    ("pd=2X", "not a layout"),
    ("gpu=b300", "unknown GPU 'b300'"),
    ("router=random", "must be one of round_robin"),
    ("kv_memory=1GiB num_blocks=10", "kv_memory or num_blocks"),
    ("prefix_caching=maybe", "on or off"),
])
def test_bad_spaces_are_refused_with_the_fix(text, match):
    with pytest.raises(ValueError, match=match):
        SearchSpace.parse(text)
