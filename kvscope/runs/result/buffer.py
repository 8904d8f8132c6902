"""``RunBuffer``: a run's step records and request events as they arrive, and the ``Run`` so far.

A live run (``LiveRun``: what its engine's recorder publishes) and a watch (``WatchRun``: what each poll makes)
add items on their own thread; any thread reads ``run()``, a ``Run`` over copies that stays the same object until
more has arrived, so its cached DataFrames stay valid while nothing changes.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from kvscope.runs.result.run import Run
from kvscope.telemetry.records import RequestEvent, StepRecord


class RunBuffer:
    """Step records and request events as they arrive (``add``, from one thread), bounded like the
    recorder's ring, and ``run()`` (from any thread): a ``Run`` over copies of them, the same object
    until more has arrived, so its cached DataFrames stay valid. ``meta`` is copied into each."""

    def __init__(self, meta: dict[str, Any], capacity: int = 100_000) -> None:
        self.meta = meta
        self._lock = threading.Lock()
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._events: deque[RequestEvent] = deque(maxlen=4 * capacity)
        self._num_added = 0
        self._run: Run | None = None
        self._run_at = -1  # _num_added when _run was made
        self.num_steps = 0  # the last record's step + 1

    def add(self, item: StepRecord | RequestEvent) -> None:
        with self._lock:
            if isinstance(item, StepRecord):
                self._records.append(item)
                self.num_steps = item.step + 1
            else:
                self._events.append(item)
            self._num_added += 1

    def run(self) -> Run:
        with self._lock:
            run = self._run
            if run is None or self._run_at != self._num_added:
                run = self._run = Run(list(self._records), list(self._events), dict(self.meta))
                self._run_at = self._num_added
            return run
