"""``thread_value``: a value that one thread sees for the length of a ``with`` (a step's attention metadata, the
fused linears of a forward pass), put back as it was afterwards, so that scopes nest and other threads (another
engine stepping in the same process) never see it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def thread_value(local: threading.local, name: str, value: T) -> Iterator[T]:
    """``local.<name> = value`` on this thread for the ``with``; the previous value (or none) after it."""
    previous = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield value
    finally:
        setattr(local, name, previous)
