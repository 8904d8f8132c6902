"""The dashboard of a watched vLLM server or fleet (``kvscope watch``), live or from a saved run.

The same ``Dashboard`` machinery as a kvscope run (one update thread, ticks batched per document, the
view's Stop / Pause buttons driving the watch), with the watch's own panels: KPIs, one lane per engine
plus the fleet, the prefix-tree residency, latency distributions from vLLM's histograms, and, with the
plugin (vLLM's own steps), the run's batch-composition and per-request panels. The watch panels read
``meta["watch"]``, which grows with every poll, so they update on every tick (``update_every_tick``).
"""

from __future__ import annotations

from typing import Any

from .dashboard import Dashboard
from .feed import Feed
from .panels.base import DEFAULT_ROLLOVER, Panel, PanelContext
from .panels.batch import BatchPanel
from .panels.fleet import FleetPanel
from .panels.prefix_tree import PrefixTreePanel
from .panels.timeline import TimelinePanel
from .panels.watch_kpi import WatchKpiPanel
from .panels.watch_latency import WatchLatencyPanel
from .stats import LatencyStats

WATCH_PANELS: tuple[type[Panel], ...] = (WatchKpiPanel, FleetPanel, PrefixTreePanel, WatchLatencyPanel)
PLUGIN_PANELS: tuple[type[Panel], ...] = (BatchPanel, TimelinePanel)  # with vLLM's own steps (the plugin)
WATCH_ROWS = (("watch_kpi",), ("fleet",), ("prefix_tree",), ("watch_latency",), ("batch",), ("timeline",))


def build_watch_panels(stats: LatencyStats, rollover: int | None, meta: dict) -> list[Panel]:
    context = PanelContext(stats, rollover, meta)
    watch = meta.get("watch") if isinstance(meta.get("watch"), dict) else {}
    kinds = WATCH_PANELS + (PLUGIN_PANELS if watch.get("plugin") else ())
    return [kind.create(context) for kind in kinds]


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
