"""The clocks a run's times come from: the wall clock (a real run) or a virtual one (a simulation).

Everything that stamps a time (the engine's ``StepClock``, ``Engine.make_request``, the ``Recorder``)
asks a ``Clock`` for ``now_ns()``, and a run that waits for its next arrival calls ``sleep_until_ns``.
The wall clock reads ``time.perf_counter_ns`` and really sleeps; the ``VirtualClock`` moves only when
told to: the simulator's worker ``advance``s it by each step's predicted time, and sleeping jumps to
the wake-up time at once. So the same engine loop and recorder serve a real run and a simulated one.

A virtual clock never passes ``MAX_VIRTUAL_NS`` (2**62 ns, ~146 years): every time a run's files hold is then a
64-bit integer that loads back, with room for the differences taken of them. A step or a wait that would pass it
raises ``VirtualTimeOverflow`` (a ``ValueError``), so the simulation fails naming why instead of writing times
that no reader takes (docs/reliability.md).
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


MAX_VIRTUAL_NS = 1 << 62


class VirtualTimeOverflow(ValueError):
    """A simulated step or wait would move the virtual clock past ``MAX_VIRTUAL_NS``."""


def _overflow(t_ns: int, what: str) -> VirtualTimeOverflow:
    return VirtualTimeOverflow(f"the virtual clock would reach {t_ns / 1e9 / 86400 / 365.25:.3g} years ({what}): "
                               f"past 2**62 ns (~146 years), beyond what a run's files can hold; the step model's "
                               "costs or the arrival times are absurd (check --step-model, --rate and the replayed "
                               "run's times)")


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
        if t_ns > MAX_VIRTUAL_NS:
            raise _overflow(t_ns, "waiting for the next arrival")
        self.t_ns = max(self.t_ns, t_ns)

    def advance(self, ns: int) -> None:
        if ns < 0:
            raise ValueError(f"a clock cannot go back ({ns} ns)")
        t = self.t_ns + int(ns)
        if t > MAX_VIRTUAL_NS:
            raise _overflow(t, "a simulated step")
        self.t_ns = t
