"""``fewer_collections()``: Python's garbage collector out of a long simulation's way.

A simulation makes and drops millions of small objects (records, page-map entries, requests) while
holding a large heap, and CPython's default thresholds (a young collection every 700 allocations, a
full one every 100 young ones) then spend about a third of its time scanning objects that are still
alive (measured: a 3,000-request simulation took 10.7-11.2 s with the defaults, 6.9-7.5 s with this). So,
as vLLM does after start-up, everything alive is frozen out of collections (``gc.freeze``) and young
collections run every 50,000 allocations; both are restored at the end.

What survives a young collection is, in a simulation, the run's own data (records, events, pages) kept
to its end, so it is frozen too, right after each collection: no later collection scans it again (the
middle and full collections otherwise rescan the whole run, 0.2 s each at 5,000 requests, and so did the
first collection after the run). The heap is frozen as it is at the start, without a full collection
first (0.2 s with torch loaded): its garbage waits for the first full collection after the run, as does
any cycle that dies after being frozen. Nothing is lost, only collected later.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def _freeze_survivors(phase: str, info: dict) -> None:
    """A ``gc.callbacks`` entry: after a collection, freeze what it left alive."""
    if phase == "stop":
        gc.freeze()


@contextlib.contextmanager
def fewer_collections(gen0: int = 50_000) -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(gen0, 20, 100)
    gc.callbacks.append(_freeze_survivors)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # in case it was removed from the list by someone else
            gc.callbacks.remove(_freeze_survivors)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
