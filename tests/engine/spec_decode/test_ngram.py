"""Prompt lookup: the longest suffix match within [min, max], the earliest of equals, k tokens after it."""

from __future__ import annotations

import numpy as np

from kvscope.engine.request import Request, SamplingParams
from kvscope.engine.spec_decode.ngram import NgramProposer, find_draft


def draft(tokens, lo, hi, k):
    return find_draft(np.asarray(tokens), lo, hi, k)


def test_vllm_docstring_example():
    # [4, 2, 3] has no earlier match; [2, 3] matches at the start and 4, 2, 3 followed it (only 3 left)
    assert draft([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]


def test_longest_match_wins_then_the_earliest():
    #        0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [7, 1, 2, 9, 5, 2, 8, 1, 2, 6, 1, 2]
    # suffix [1, 2]: at 1-2 (then 9), 7-8 (then 6); [6, 1, 2] never occurred before: earliest [1, 2] wins
    assert draft(tokens, 1, 3, 2) == [9, 5]
    # suffix [2] alone also matches at 5 (then 8), but a longer match exists
    assert draft(tokens, 1, 1, 1) == [9]  # n = 1 only: the earliest 2 is at 2, followed by 9
    longer = [3, 1, 2, 4, 4, 9, 1, 2, 4, 5, 9, 1, 2]  # [9, 1, 2] matched at 5-7 beats [1, 2] at 1-2
    assert draft(longer, 1, 3, 2) == [4, 5]


def test_no_match_or_too_short():
    assert draft([1, 2, 3, 4], 1, 3, 3) == []  # 4 never occurred before
    assert draft([5, 6, 1, 5, 6], 3, 4, 3) == []  # only a 2-gram repeats, and min is 3
    assert draft([5, 6, 1, 5, 6], 2, 4, 3) == [1, 5, 6]
    assert draft([5], 1, 2, 3) == []
    assert draft([1, 1, 1, 1], 1, 2, 0) == []


def test_repeats_draft_as_far_as_k_allows():
    assert draft([1, 2, 3, 1, 2, 3, 1, 2], 2, 2, 5) == [3, 1, 2, 3, 1]


def test_proposer_caps_and_follows_growing_sequences():
    proposer = NgramProposer(3, 1, 2)
    a = Request("a", [1, 2, 3, 4, 1, 2], SamplingParams())
    b = Request("b", [8, 9, 10], SamplingParams())
    assert proposer.propose([a, b], [3, 3]) == [[3, 4, 1], []]
    assert proposer.propose([a], [1]) == [[3]]  # a cap below k
    a.append_token(3)
    assert proposer.propose([a], [5]) == [[4, 1, 2]]  # k bounds the cap; the copy grew by one token
    assert set(proposer._arrays) == {"a"}  # b left: its copy was dropped
    assert proposer.propose([a], [0]) == [[]]
