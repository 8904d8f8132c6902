"""The dashboard's panels: one class per plot, each owning its Bokeh sources.

A panel builds its figures once, in ``__init__``, and changes them in place in ``update(tick)``:
time series grow with ``ColumnDataSource.stream(..., rollover=N)`` (bounded memory), the page map
with ``patch``. Panels never touch threads or widgets; ``Dashboard`` calls ``update`` from its one
update thread, inside ``Document.hold("combine")``, and ``report.save_html`` calls it to fill a
static page.

Panels, in the order ``build_panels`` returns them:

1. ``KpiPanel``: tokens/s, running/waiting, KV usage, TTFT and ITL p50/p99
2. ``MemoryPanel``: weights, KV used, KV free, other allocator memory, device used (NVML)
3. ``PageMapPanel``: every KV block, coloured by owner, shaded by fill
4. ``OccupancyPanel``: KV occupancy and fragmentation vs. a static max-length reservation
5. ``BatchPanel``: prefill vs decode tokens per step, running/waiting requests
6. ``LatencyPanel``: per-step time by phase; TTFT and ITL histograms
7. ``TimelinePanel``: one lane per request, coloured by waiting/prefill/decode/preempted
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from bokeh.models import LayoutDOM

from .feed import Tick
from .stats import LatencyStats

DEFAULT_ROLLOVER = 2000  # points kept per time series (steps); older ones scroll out


class Panel(ABC):
    """One plot (or a small row of them) of the dashboard."""

    name: ClassVar[str]  # short key, e.g. "page_map"
    title: ClassVar[str]
    model: LayoutDOM  # what is shown (wrapped in one jupyter_bokeh.BokehModel)

    @abstractmethod
    def update(self, tick: Tick) -> None:
        """Apply new step records and request events; called once per tick, in time order."""


def build_panels(
    stats: LatencyStats, rollover: int | None = DEFAULT_ROLLOVER, meta: dict | None = None
) -> list[Panel]:
    """All panels, sharing one ``LatencyStats`` (the caller feeds it before each ``update``).

    ``rollover=None`` keeps every point (static reports of a finished run).
    """
    from .panels_kpi import KpiPanel
    from .panels_latency import LatencyPanel
    from .panels_pagemap import PageMapPanel
    from .panels_series import BatchPanel, MemoryPanel, OccupancyPanel
    from .panels_timeline import TimelinePanel

    meta = meta if meta is not None else {}
    return [
        KpiPanel(stats, meta),
        MemoryPanel(rollover),
        PageMapPanel(),
        OccupancyPanel(rollover),
        BatchPanel(rollover),
        LatencyPanel(stats, rollover),
        TimelinePanel(rollover, meta),
    ]


def apply_tick(panels: list[Panel], stats: LatencyStats, tick: Tick) -> None:
    """Feed ``stats`` first (panels read it), then every panel, in order."""
    for item in tick.ordered():
        stats.add(item)
    if tick.final:
        stats.flush()
    for panel in panels:
        panel.update(tick)
