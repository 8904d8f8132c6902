"""The clocks a run's times come from: the wall clock (a real run) or a virtual one (a simulation).

Everything that stamps a time (the engine's ``StepClock``, ``Engine.make_request``, the ``Recorder``)
asks a ``Clock`` for ``now_ns()``, and a run that waits for its next arrival calls ``sleep_until_ns``.
The wall clock reads ``time.perf_counter_ns`` and really sleeps; the ``VirtualClock`` moves only when
told to: the simulator's worker ``advance``s it by each step's predicted time, and sleeping jumps to
the wake-up time at once. So the same engine loop and recorder serve a real run and a simulated one.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """The wall clock: ``time.perf_counter_ns`` (one monotonic clock for the whole process)."""

    __slots__ = ()
    virtual = False

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def sleep_until_ns(self, t_ns: int, stop: threading.Event | None = None) -> None:
        """Wait until ``now_ns() >= t_ns``, or until ``stop`` is set."""
        delay = (t_ns - self.now_ns()) / 1e9
        if delay > 0:
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)

    def advance(self, ns: int) -> None:
        """Time passes by itself on the wall clock: nothing to do."""


WALL_CLOCK = Clock()


class VirtualClock(Clock):
    """A clock that moves only when told: ``advance(ns)`` (a simulated step), ``sleep_until_ns`` (idle
    until the next arrival). Starts at ``start_ns`` (default: the wall clock now, so the run's times
    look like a real run's)."""

    __slots__ = ("t_ns",)
    virtual = True

    def __init__(self, start_ns: int | None = None) -> None:
        self.t_ns = time.perf_counter_ns() if start_ns is None else start_ns

    def now_ns(self) -> int:
        return self.t_ns

    def sleep_until_ns(self, t_ns: int, stop: threading.Event | None = None) -> None:
        self.t_ns = max(self.t_ns, t_ns)

    def advance(self, ns: int) -> None:
        if ns < 0:
            raise ValueError(f"a clock cannot go back ({ns} ns)")
        self.t_ns += int(ns)
