"""The live dashboard's own cost, and the governor that keeps it inside the telemetry budget.

The dashboard's update thread (``Dashboard._loop``) polls the feed, updates the panels and serializes the
browser's patches, all in Python and holding the GIL: CPU that the engine's step does not get. Its share is
measured as the update thread's CPU time (``time.thread_time`` read on that thread) against the whole process's
(``time.process_time``: the engine, the kernel, the dashboard) over a sliding window of ``WINDOW_S`` seconds.

``CostGovernor`` judges each full window:

- over ``COST_BUDGET`` (1% of the run's CPU, the telemetry budget): halve the refresh rate, down to
  ``MIN_REFRESH_HZ`` (the lowest the dashboard takes), and say so on the status line;
- under a quarter of the budget after a lowering: double it again (a rate twice as high would stay under half the
  budget), never above the ceiling: the rate the user chose (the control's dropdown sets a new ceiling).

A window in which the process used less than ``MIN_BUSY`` cores is not judged: the engine was idle (paused,
sleeping between steps, waiting for requests) and the dashboard took nothing from it. The browser is another
process and is not counted here; what it costs the kernel (the acknowledgements it sends back) is read on the
shell thread, and ``transport.Pacer`` already gives a slow browser fewer ticks.

Everything here is pure: clocks are passed in (``observe``), so tests drive it with made-up times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

COST_BUDGET = 0.01  # the telemetry budget: the dashboard's share of the process's CPU
WINDOW_S = 3.0  # the sliding window a share is judged over
MIN_BUSY = 0.5  # cores the process must have used over a window for it to be judged
MIN_REFRESH_HZ = 0.5  # the lowest refresh rate (Dashboard.set_refresh's floor)
RAISE_BELOW = 0.25  # a lowered rate is doubled again when the share falls under this fraction of the budget
MAX_CHANGES = 32  # changes kept for the run metadata (then only counted)


@dataclass(slots=True)
class CostSample:
    """One reading: wall seconds, the update thread's CPU seconds, the process's CPU seconds."""

    wall_s: float
    own_cpu_s: float
    process_cpu_s: float


@dataclass(slots=True)
class RefreshChange:
    """A change of the refresh rate by the governor (``t_s``: seconds since the first reading)."""

    t_s: float
    from_hz: float
    to_hz: float
    share: float  # the window's share that caused it


@dataclass(slots=True)
class CostGovernor:
    """Measures the dashboard's share of the process's CPU and sets its refresh rate (see the module doc).

    ``observe(wall, own_cpu, process_cpu)`` after each pass of the update thread returns the new refresh rate when
    it changes, else ``None``; ``set_ceiling`` when the user picks a rate."""

    ceiling_hz: float
    budget: float = COST_BUDGET
    window_s: float = WINDOW_S
    min_busy: float = MIN_BUSY
    refresh_hz: float = 0.0  # the rate now (the ceiling until lowered)
    window: deque[CostSample] = field(default_factory=deque)
    first: CostSample | None = None
    last: CostSample | None = None
    share: float | None = None  # the last judged window's share
    peak_share: float = 0.0  # the highest judged window share
    changes: list[RefreshChange] = field(default_factory=list)
    num_changes: int = 0
    lowered_share: float | None = None  # the share that caused the latest lowering (what the status line says)

    def __post_init__(self) -> None:
        if not self.budget > 0 or not self.window_s > 0:
            raise ValueError(f"a cost budget and window must be positive, got {self.budget}, {self.window_s}")
        self.ceiling_hz = self.refresh_hz = max(float(self.ceiling_hz), MIN_REFRESH_HZ)

    def set_ceiling(self, hz: float) -> None:
        """The user chose ``hz``: the rate now and the most the governor may raise to; a new window starts."""
        self.ceiling_hz = self.refresh_hz = max(float(hz), MIN_REFRESH_HZ)
        self.lowered_share = None
        self._restart()

    def observe(self, wall_s: float, own_cpu_s: float, process_cpu_s: float) -> float | None:
        """Take one reading (cumulative clocks); judge the window once it spans ``window_s``."""
        sample = CostSample(wall_s, own_cpu_s, process_cpu_s)
        if self.first is None:
            self.first = sample
        self.last = sample
        window = self.window
        window.append(sample)
        while len(window) > 2 and wall_s - window[1].wall_s >= self.window_s:
            window.popleft()  # keep one reading at or before the window's start
        oldest = window[0]
        span = wall_s - oldest.wall_s
        if span < self.window_s:
            return None
        process = process_cpu_s - oldest.process_cpu_s
        if process < self.min_busy * span or process <= 0:
            return None  # the engine was idle: nothing was taken from it
        share = max(0.0, own_cpu_s - oldest.own_cpu_s) / process
        self.share, self.peak_share = share, max(self.peak_share, share)
        if share > self.budget:
            if self.refresh_hz > MIN_REFRESH_HZ:
                return self._change(max(self.refresh_hz / 2, MIN_REFRESH_HZ), share, lowered=True)
            self.lowered_share = share  # at the floor: the status line says what it still takes
        elif self.refresh_hz >= self.ceiling_hz:
            self.lowered_share = None
        elif share < self.budget * RAISE_BELOW:
            return self._change(min(self.refresh_hz * 2, self.ceiling_hz), share, lowered=False)
        return None

    def _change(self, hz: float, share: float, *, lowered: bool) -> float:
        assert self.first is not None and self.last is not None
        if len(self.changes) < MAX_CHANGES:
            self.changes.append(RefreshChange(self.last.wall_s - self.first.wall_s, self.refresh_hz, hz, share))
        self.num_changes += 1
        self.refresh_hz = hz
        if lowered:
            self.lowered_share = share
        elif hz >= self.ceiling_hz:
            self.lowered_share = None
        self._restart()
        return hz

    def _restart(self) -> None:
        """Judge the next window from scratch: the readings taken at the old rate say little about the new one."""
        last = self.last
        self.window.clear()
        if last is not None:
            self.window.append(last)

    # ---- what it says ------------------------------------------------------------------------------------
    @property
    def total_share(self) -> float | None:
        """The update thread's share of the process's CPU since the first reading."""
        if self.first is None or self.last is None:
            return None
        process = self.last.process_cpu_s - self.first.process_cpu_s
        return (self.last.own_cpu_s - self.first.own_cpu_s) / process if process > 0 else None

    def note(self) -> str | None:
        """The status line's words while the rate is below the user's, or at the floor and still over budget."""
        if self.lowered_share is None:
            return None
        took = f"the dashboard took {_percent(self.lowered_share)} of the run's CPU (budget {_percent(self.budget)})"
        lowest = ", the lowest" if self.refresh_hz <= MIN_REFRESH_HZ else ""
        if self.refresh_hz < self.ceiling_hz:
            return f"refresh lowered to {self.refresh_hz:g} Hz{lowest}: {took}"
        return f"refresh at {self.refresh_hz:g} Hz{lowest}: {took}"

    def describe(self) -> dict[str, Any]:
        """The run metadata's ``dashboard_cost`` (JSON values)."""
        first, last = self.first, self.last
        own = last.own_cpu_s - first.own_cpu_s if first is not None and last is not None else 0.0
        total = self.total_share
        return {"budget": self.budget, "window_s": self.window_s, "cpu_s": round(own, 4),
                "share": round(total, 5) if total is not None else None,
                "peak_window_share": round(self.peak_share, 5), "refresh_hz": self.refresh_hz,
                "ceiling_hz": self.ceiling_hz,
                "changes": [{"t_s": round(c.t_s, 3), "from_hz": c.from_hz, "to_hz": c.to_hz, "share": round(c.share, 5)}
                            for c in self.changes],
                "num_changes": self.num_changes}


def _percent(share: float) -> str:
    """Three significant digits at most: 2.3%, 1.04% (not a rounded 1.0% over a 1% budget), 50%."""
    return f"{share * 100:.3g}%"
