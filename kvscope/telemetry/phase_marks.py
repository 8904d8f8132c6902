"""Where a source reports its step's phase boundaries: the profiler's ``record_function`` ranges while a
profiling window is open (``telemetry/profiler.py``), nothing otherwise (``NULL_MARKS``)."""

from __future__ import annotations

from typing import Protocol


class PhaseMarks(Protocol):
    """Where a source reports its step's phase boundaries (the profiler's ``record_function`` ranges)."""

    def begin(self, phase: str) -> None: ...

    def end(self, step: int) -> None: ...


class NullMarks:
    """The phase marks of a step nobody watches: nothing."""

    __slots__ = ()

    def begin(self, phase: str) -> None:
        pass

    def end(self, step: int) -> None:
        pass


NULL_MARKS = NullMarks()
