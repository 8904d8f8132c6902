"""How panels get their data: ``Feed`` collects step records and request events and hands them out
in ticks.

The engine thread only calls ``Feed.push`` (a ``SimpleQueue.put``: it never waits on the dashboard).
The dashboard's update thread calls ``Feed.poll`` once per tick and gets a ``Tick``: the new records
and events, in time order.

Ordering: the recorder publishes a step's request events (first token, finished, scheduled, ...)
before that step's record, and all of them carry times up to the record's ``t_end_ns``. So ``poll``
hands out the events up to the newest record's end and holds later ones back until their record
arrives (or until the final poll), which keeps every tick causally complete: a panel never sees a
decode of a request before the event that scheduled it.
"""

from __future__ import annotations

import heapq
import queue
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kvscope.telemetry.records import RequestEvent, StepRecord

Item = StepRecord | RequestEvent


@dataclass(slots=True)
class Tick:
    """What arrived since the previous tick. ``final``: nothing more will come."""

    steps: list[StepRecord] = field(default_factory=list)
    events: list[RequestEvent] = field(default_factory=list)
    final: bool = False

    def __bool__(self) -> bool:
        return bool(self.steps or self.events)

    def ordered(self) -> Iterator[Item]:
        """Records and events merged by time; at equal times an event comes before its record."""
        keyed_events = ((e.t_ns, 0, i, e) for i, e in enumerate(self.events))
        keyed_steps = ((s.t_end_ns, 1, i, s) for i, s in enumerate(self.steps))
        for *_, item in heapq.merge(keyed_events, keyed_steps):
            yield item


class Feed:
    """A thread-safe hand-over from the engine thread (``push``) to one reader thread (``poll``)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._held: list[RequestEvent] = []
        self.num_steps = 0  # records handed out so far
        self.num_events = 0

    @classmethod
    def of(cls, steps: Iterable[StepRecord], events: Iterable[RequestEvent]) -> Feed:
        """A feed already holding a finished run (for replay and reports)."""
        feed = cls()
        for item in (*events, *steps):
            feed.push(item)
        return feed

    def push(self, item: Item) -> None:
        """Called by the recorder on the engine thread, once per record and per event."""
        self._queue.put(item)

    def poll(self, final: bool = False) -> Tick:
        """Everything new, in time order. Only one thread may call it."""
        steps: list[StepRecord] = []
        events = self._held
        self._held = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            (steps if isinstance(item, StepRecord) else events).append(item)
        steps.sort(key=lambda s: s.t_end_ns)
        events.sort(key=lambda e: e.t_ns)
        if not final:
            cut = 0  # with no new record, every event waits for the record of its step
            if steps:
                horizon = steps[-1].t_end_ns
                cut = next((i for i, e in enumerate(events) if e.t_ns > horizon), len(events))
            events, self._held = events[:cut], events[cut:]
        self.num_steps += len(steps)
        self.num_events += len(events)
        return Tick(steps, events, final)
