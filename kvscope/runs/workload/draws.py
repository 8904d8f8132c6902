"""``Draws``: the draws of ``random.Random(seed)``, the same numbers, made in bulk with NumPy.

A synthetic workload draws every prompt token with ``random.Random.choices``: one Python call per token,
a tenth of a simulation's cost of submitting a request. ``random.Random`` and NumPy's ``MT19937`` are the
same generator (the Mersenne Twister), so started from ``random.Random(seed)``'s state NumPy makes the
very 32-bit words Python would, thousands at a time; the draws are then built from them with CPython's
own arithmetic (Lib/random.py, Modules/_randommodule.c):

- ``random()``: two words ``a``, ``b``: ``((a >> 5) * 2**26 + (b >> 6)) / 2**53`` (exact in a double);
- ``getrandbits(k)``: ``ceil(k / 32)`` words, the first the lowest 32 bits, the last shifted right to
  keep ``k`` bits in all;
- ``randint(lo, hi)``: ``lo + getrandbits(width.bit_length())``, drawn again while ``>= width``
  (``width = hi - lo + 1``);
- ``choices(population, k=n)``: ``population[floor(random() * len(population))]``, ``n`` times.

So a workload is the same, token for token, whichever makes it (``tests/runs/test_draws.py`` compares
every draw with ``random.Random``'s over many seeds, ranges and vocabularies).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

_CHUNK = 1 << 14  # words drawn at a time: their floats (128 KiB) stay in the cache (1 << 16: 2x the time per word)


class Draws:
    """``random.Random(seed)``'s ``randint`` and ``choices(population, k=...)``, from one stream as it would
    draw them. ``population``: the token ids ``choices`` picks from (fixed, so the index each pair of words
    picks is worked out with the others, in bulk; a pick is the population's own object, as
    ``random.choices`` returns)."""

    __slots__ = ("_bits", "_index", "_n", "_population", "_pos", "_words")

    def __init__(self, seed: int | None, population: Sequence[int]) -> None:
        state = random.Random(seed).getstate()[1]  # 624 words of state, then the position in them
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937",
                            "state": {"key": np.array(state[:624], dtype=np.uint32), "pos": state[624]}}
        self._population = np.array(list(population), dtype=object)  # picks share its int objects
        self._n = float(len(population))  # as choices does: random() * n in floats
        self._words = np.empty(0, dtype=np.uint32)  # drawn, from _pos on not used yet
        self._index = np.empty(0, dtype=np.int64)  # [j]: the index choices picks with words j and j + 1
        self._pos = 0

    def _need(self, n: int) -> None:
        """Draw more words if fewer than ``n`` are left, and the index each pair of them picks."""
        if self._pos + n <= len(self._words):
            return
        fresh = self._bits.random_raw(max(n, _CHUNK)).astype(np.uint32)  # uint32: to floats 6x faster
        words = np.concatenate((self._words[self._pos:], fresh))
        self._words, self._pos = words, 0
        # random() from words a, b: x * 2**-53 with x = (a >> 5) * 2**26 + (b >> 6), an integer below 2**53
        # (exact in a double, as each step here is); choices' random() * n rounds x * 2**-53 * n once, and so
        # does x * (n * 2**-53) (n * 2**-53 is exact): the same double, one pass fewer
        unit = (words[:-1] >> 5).astype(np.float64)
        unit *= 2.0**26
        unit += words[1:] >> 6
        unit *= self._n * 2.0**-53
        self._index = unit.astype(np.int64)  # floor: the values are >= 0

    def getrandbits(self, k: int) -> int:
        if 0 < k <= 32:  # one word, its top k bits (every randint of a workload's lengths)
            if self._pos >= len(self._words):
                self._need(1)
            self._pos += 1
            return self._words.item(self._pos - 1) >> (32 - k)
        if k == 0:
            return 0
        n = (k - 1) // 32 + 1
        self._need(n)
        words = self._words[self._pos:self._pos + n].tolist()
        self._pos += n
        r = 0
        for i, word in enumerate(words):  # the first word is the lowest bits; the last keeps its top ones
            bits = min(k - 32 * i, 32)
            r |= (word >> (32 - bits)) << (32 * i)
        return r

    def randint(self, lo: int, hi: int) -> int:
        """An int in ``[lo, hi]`` (``hi >= lo``)."""
        width = hi - lo + 1
        k = width.bit_length()
        r = self.getrandbits(k)
        while r >= width:
            r = self.getrandbits(k)
        return lo + r

    def choices(self, k: int) -> list[int]:
        """``k`` picks from the population, a list of Python ints."""
        self._need(2 * k)
        pos = self._pos
        self._pos += 2 * k
        return self._population[self._index[pos:pos + 2 * k:2]].tolist()
