"""``DetailWindow``: which steps of a long simulation get per-request detail.

A simulation of 10**6 requests keeps its last ``window_steps`` records (the recorder's ring): the time series,
the page map and the files are that window, and the exact summary covers the whole run
(``summary_stream.py``). Per-request detail (scheduled items, block tables, page-map changes) is most of
telemetry's cost per step, and outside the window nobody reads it, so the other steps are recorded light
(``Recorder.set_detail(False)``: the same counts, no items, the page map resting).

Which steps the window keeps is known only at the end, so this estimates it: the steps still to come are the
steps per finished request so far times the requests not yet finished. Detail is on at the start (until
``warmup`` requests have finished and the estimate is worth something), off while more than ``margin`` windows
of steps remain, and on again, for good, from when at most that many do. An estimate that comes late leaves the
window's first records light (exact counts, no items); the page map of the window starts at its first
snapshot either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class DetailWindow:
    window_steps: int  # the recorder's ring
    total_requests: int  # the workload's
    margin: float = 2.0  # windows of steps that get detail, at least, by the estimate
    warmup: int = 64  # finished requests before the first estimate
    on: bool = True
    settled: bool = False  # on for good (the end is near)

    @classmethod
    def for_run(cls, recorder: Any, total_requests: int, unwatched_simulation: bool) -> DetailWindow | None:
        """One for a simulation that no dashboard watches, of a known number of requests, on a recorder that can
        go light; ``None`` (detail everywhere) for anything else."""
        if not (unwatched_simulation and total_requests and hasattr(recorder, "set_detail")):
            return None
        return cls(recorder.capacity, total_requests)

    def update(self, steps: int, finished: int) -> bool:
        """Whether the next step gets detail, after ``steps`` steps and ``finished`` finished requests."""
        if self.settled or finished < self.warmup:
            return self.on
        left = (self.total_requests - finished) * steps / finished
        self.on = left <= self.margin * self.window_steps
        self.settled = self.on
        return self.on
