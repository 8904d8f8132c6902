"""Reading attention patterns off transformers' own mask functions: full causal, sliding windows and
chunks are named (with their sizes); bidirectional, prefix-LM and irregular masks are refused."""

from __future__ import annotations

import pytest
import torch
from transformers import masking_utils as mu

from kvscope.engine.probe.masks import MaskPattern, read_pattern


class Refused(Exception):
    pass


def read(fn, max_len: int = 300) -> MaskPattern:
    return read_pattern(fn, max_len, Refused)


def test_names_causal_windows_and_chunks_with_their_sizes():
    assert read(mu.causal_mask_function) == MaskPattern()
    assert read(mu.sliding_window_causal_mask_function(7)) == MaskPattern(window=7)
    assert read(mu.chunked_causal_mask_function(32, torch.zeros(1, dtype=torch.long))) == MaskPattern(chunk=32)
    assert read(None) == MaskPattern()
    # a window longer than every position the engine will see is full attention there
    assert read(mu.sliding_window_causal_mask_function(4096), max_len=300) == MaskPattern()


def test_first_visible_matches_the_mask_function():
    pos = torch.arange(100)
    chunked = mu.chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long))
    for pattern, fn in [(MaskPattern(window=5), mu.sliding_window_causal_mask_function(5)),
                        (MaskPattern(chunk=8), chunked)]:
        lo = pattern.first_visible(pos)
        zero = torch.zeros((), dtype=torch.long)
        inside = lo > 0  # where a key before lo exists, the mask hides it
        assert bool(fn(zero, zero, pos, lo).all()) and not bool(fn(zero, zero, pos[inside], lo[inside] - 1).any())


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (mu.bidirectional_mask_function, "see later tokens"),
        (mu.or_masks(mu.causal_mask_function, lambda b, h, q, kv: kv < 4), "see later tokens"),  # prefix-LM
        (mu.and_masks(mu.causal_mask_function, lambda b, h, q, kv: kv % 2 == q % 2), "neither causal"),
        (lambda b, h, q, kv: kv < q, "hides a query from its own key"),
        (lambda b, h, q, kv: torch.tensor([True])[kv], "cannot be read"),
    ],
    ids=["bidirectional", "prefix-lm", "strided", "no-diagonal", "input-dependent"],
)
def test_other_masks_are_refused(fn, reason):
    with pytest.raises(Refused, match=reason):
        read(fn)
