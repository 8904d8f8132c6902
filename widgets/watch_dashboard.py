"""The dashboard of a watched vLLM server or fleet (``kvscope watch``), live or from a saved run.

The same ``Dashboard`` machinery as a kvscope run (one update thread, ticks batched per document, the
view's Stop / Pause buttons driving the watch), with the watch's own panels: KPIs, one lane per engine
plus the fleet, the prefix-tree residency, latency distributions from vLLM's histograms, and, with the
plugin (vLLM's own steps), the run's batch-composition and per-request panels. The watch panels read
``meta["watch"]``, which grows with every poll, so they update on every tick (``update_every_tick``).
The panels and their rows are declared once, in ``panels.registry.WATCH_PANELS``.
"""

from __future__ import annotations

from typing import Any

from .dashboard import Dashboard
from .feed import Feed
from .panels.base import DEFAULT_ROLLOVER, Panel
from .panels.registry import WATCH_PANELS, WATCH_ROWS, build_panels
from .stats import LatencyStats


def build_watch_panels(stats: LatencyStats, rollover: int | None, meta: dict) -> list[Panel]:
    """The panels of ``registry.WATCH_PANELS`` that the watch calls for (the plugin's only with vLLM's own steps)."""
    return build_panels(stats, rollover, meta, WATCH_PANELS)


class WatchDashboard(Dashboard):
    update_every_tick = True

    def __init__(self, feed: Feed | None = None, *, meta: dict, rollover: int | None = DEFAULT_ROLLOVER,
                 **options: Any) -> None:
        stats = LatencyStats()
        panels = build_watch_panels(stats, rollover, meta)
        super().__init__(feed, meta=meta, rollover=rollover, panels=panels, rows=WATCH_ROWS, **options)
        self.stats = stats  # the panels' (Dashboard feeds it before each update)

    def status_parts(self) -> list[str]:
        parts = [self.control.status_text if self.control is not None else "saved watch"]
        if self.error is not None:
            parts.append(f"dashboard error: {self.error!r}")
        return parts
