"""Reading an attention pattern off transformers' mask functions.

A transformers mask function answers ``mask_function(batch, head, q_idx, kv_idx) -> bool``: does the
query at ``q_idx`` see the key at ``kv_idx``. ``read_pattern`` asks it, for every query position up to
``max_len`` at once, where the run of keys it sees starts (a binary search: the keys a query sees
must be one run ending at itself), names the pattern (full causal, a sliding window of ``W`` keys,
chunks of ``C``), and then checks the named pattern against the function on sample rows, so that a
mask it does not recognise (bidirectional, prefix-LM, blockwise, ...) is refused rather than run as
something else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

SAMPLE_ROWS = 48  # rows checked in full against the named pattern
ROW_SPAN = 2048  # keys checked on each side of a sample row's diagonal


@dataclass(frozen=True, slots=True)
class MaskPattern:
    """Which keys a query at position ``p`` sees: ``lo(p)..p``; ``lo`` from a window or a chunk size."""

    window: int | None = None
    chunk: int | None = None

    def first_visible(self, pos: torch.Tensor) -> torch.Tensor:
        lo = torch.zeros_like(pos)
        if self.window:
            lo = torch.maximum(lo, pos - self.window + 1)
        if self.chunk:
            lo = torch.maximum(lo, pos - pos % self.chunk)
        return lo


def _elementwise(mask_function: Callable) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``f(q, kv)`` over equal-shaped index tensors: index-based mask functions broadcast as they are;
    others (custom ones transformers would vmap) through ``torch.vmap``."""
    zero = torch.zeros((), dtype=torch.long)

    def direct(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(mask_function(zero, zero, q, kv), dtype=torch.bool).expand(q.shape)

    def mapped(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return torch.vmap(lambda a, b: torch.as_tensor(mask_function(zero, zero, a, b)))(q, kv).bool()

    def f(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        try:
            return direct(q, kv)
        except Exception:
            return mapped(q, kv)

    return f


def read_pattern(mask_function: Callable | None, max_len: int, refuse: Callable[[str], Exception]) -> MaskPattern:
    """The pattern of ``mask_function`` over positions ``0..max_len - 1`` (see the module doc);
    ``refuse(reason)`` makes the exception raised for a pattern kvscope does not implement."""
    if mask_function is None:
        return MaskPattern()
    f = _elementwise(mask_function)
    pos = torch.arange(max_len)
    try:
        diagonal = f(pos, pos)
        if not bool(diagonal.all()):
            raise refuse("its attention mask hides a query from its own key")
        lo, hi = torch.zeros_like(pos), pos.clone()  # the first key each query sees lies in [lo, hi]
        while bool((lo < hi).any()):
            mid = (lo + hi) // 2
            seen = f(pos, mid)
            hi = torch.where(seen, mid, hi)
            lo = torch.where(seen, lo, mid + 1)
        pattern = _name(pos, lo)
        if pattern is None:
            raise refuse("its attention mask is neither causal, a sliding window nor chunked")
        _verify(f, pattern, max_len, refuse)
    except Exception as exc:
        if type(exc).__name__ == "UnsupportedModelError":
            raise
        raise refuse(f"its attention mask function cannot be read ({type(exc).__name__}: {exc})") from exc
    return pattern


def _name(pos: torch.Tensor, first: torch.Tensor) -> MaskPattern | None:
    """Full, window or chunk, from the first key each position sees; None if it is none of them."""
    if not bool(first.any()):
        return MaskPattern()
    window = int(pos[-1] - first[-1] + 1)
    if torch.equal(first, (pos - window + 1).clamp(min=0)):
        return MaskPattern(window=window)
    starts = ((first == pos) & (pos > 0)).nonzero()
    if len(starts):
        chunk = int(starts[0])
        if torch.equal(first, pos - pos % chunk):
            return MaskPattern(chunk=chunk)
    return None


def _verify(f, pattern: MaskPattern, max_len: int, refuse) -> None:
    """Check whole rows (keys on both sides of the diagonal) of sample queries against ``pattern``."""
    size = pattern.window or pattern.chunk or 0
    rows = set(range(min(max_len, 24)))
    rows |= {max_len - 1, max_len // 2, max_len // 3}
    for edge in (size, 2 * size, 3 * size):
        rows |= {r for r in range(edge - 2, edge + 3) if 0 <= r < max_len}
    gen = torch.Generator().manual_seed(0)
    rows |= set(torch.randint(0, max_len, (SAMPLE_ROWS,), generator=gen).tolist())
    for row in sorted(rows):
        keys = torch.arange(max(0, row - ROW_SPAN), min(max_len, row + ROW_SPAN))
        if row > ROW_SPAN:
            keys = torch.cat([torch.arange(0, min(ROW_SPAN, row - ROW_SPAN)), keys])
        q = torch.full_like(keys, row)
        got = f(q, keys)
        want = (keys <= row) & (keys >= pattern.first_visible(q))
        if not torch.equal(got, want):
            if bool((got & (keys > row)).any()):
                raise refuse("its attention mask lets queries see later tokens (bidirectional or prefix-LM "
                             "attention)")  # fmt: skip
            raise refuse("its attention mask is neither causal, a sliding window nor chunked")
