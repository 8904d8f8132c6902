"""The dashboard's panels, in display order, and the two things done with all of them: build them
from one context, and apply a tick to each.

Adding a panel: a module in this package with a ``Panel`` subclass, one entry in ``PANELS``, and
its name in a row of ``view.ROWS`` (the live layout) and ``report.build_report`` (the HTML report).
"""

from __future__ import annotations

from ..feed import Tick
from ..stats import LatencyStats
from .base import DEFAULT_ROLLOVER, Panel, PanelContext
from .batch import BatchPanel
from .kpi import KpiPanel
from .latency import LatencyPanel
from .memory import MemoryPanel
from .occupancy import OccupancyPanel
from .page_map import PageMapPanel
from .speculation import DraftPageMapPanel, SpeculationPanel
from .timeline import TimelinePanel

PANELS: tuple[type[Panel], ...] = (
    KpiPanel,  # tokens/s, running/waiting, KV usage, TTFT and ITL p50/p99
    MemoryPanel,  # weights, KV used, KV free, other allocator memory, device used (NVML)
    PageMapPanel,  # every KV block, coloured by owner, shaded by fill
    OccupancyPanel,  # KV occupancy and fragmentation vs. a static max-length reservation
    BatchPanel,  # prefill vs decode tokens per step, running/waiting requests
    LatencyPanel,  # per-step time by phase; TTFT and ITL histograms
    TimelinePanel,  # one lane per request, coloured by waiting/prefill/decode/preempted
    SpeculationPanel,  # drafted / accepted / rejected per step, acceptance by draft position (hidden if off)
    DraftPageMapPanel,  # the draft model's own KV pool (hidden without a draft model)
)


def build_panels(
    stats: LatencyStats, rollover: int | None = DEFAULT_ROLLOVER, meta: dict | None = None
) -> list[Panel]:
    """All panels of ``PANELS``, sharing one ``LatencyStats`` (the caller feeds it before each
    ``update``). ``rollover=None`` keeps every point (static reports of a finished run)."""
    context = PanelContext(stats, rollover, meta if meta is not None else {})
    return [panel_type.create(context) for panel_type in PANELS]


def apply_tick(panels: list[Panel], stats: LatencyStats, tick: Tick) -> None:
    """Feed ``stats`` first (panels read it), then every panel, in order."""
    for item in tick.ordered():
        stats.add(item)
    if tick.final:
        stats.flush()
    for panel in panels:
        panel.update(tick)
