"""Helpers of the real-vLLM tests (the fixtures are in conftest.py; ``serve`` is in tests/helpers.py)."""

from __future__ import annotations

from helpers import serve  # noqa: F401  (the watch tests import it from here)


def prompt(start: int, n: int) -> list[int]:
    """``n`` consecutive token ids from ``start`` on (modulo the tiny vocabulary, clear of its specials 0-2)."""
    return [3 + (start + i) % 509 for i in range(n)]
