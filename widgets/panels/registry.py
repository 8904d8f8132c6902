"""Every panel of both dashboards, declared once, and what is done with the declarations: build the
panels from one context, apply a tick to each, lay them out in the live view's rows and in the report.

A ``PanelSpec`` is the one declaration of a panel: its class, its row (the live view and the report put
the panels of one row side by side, rows from the top), how the report shows it (``report_parts``;
``None``: not in the report) and when it is built at all (``when``; ``None``: always). ``PANELS`` are a
kvscope run's, ``WATCH_PANELS`` a watched vLLM server's, each in display order.

Adding a panel: a module in this package with a ``Panel`` subclass and one ``PanelSpec`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bokeh.layouts import row as bokeh_row
from bokeh.models import LayoutDOM

from ..feed import Tick
from ..stats import LatencyStats
from .base import DEFAULT_ROLLOVER, Panel, PanelContext
from .batch import BatchPanel
from .fleet import FleetPanel
from .kpi import KpiPanel
from .kv_transfer import KvTransferPanel
from .latency import LatencyPanel
from .memory import MemoryPanel
from .occupancy import OccupancyPanel
from .page_map import PageMapPanel
from .pd_page_maps import PDPageMapsPanel
from .pd_timeline import timeline_part
from .prefix_misses import PrefixMissesPanel, if_drawn
from .prefix_tree import PrefixTreePanel
from .queue_reasons import QueueReasonsPanel
from .replay import draft_page_map_with_replay, page_map_with_replay
from .report_parts import ReportContext, ReportPart, if_speculative, shown
from .slow_steps import SlowStepsPanel
from .speculation import DraftPageMapPanel, SpeculationPanel
from .timeline import TimelinePanel
from .watch_kpi import WatchKpiPanel
from .watch_latency import WatchLatencyPanel


@dataclass(frozen=True, slots=True)
class PanelSpec:
    """One panel, declared once (see the module docstring)."""

    kind: type[Panel]
    row: int
    report: ReportPart | None = shown
    when: Callable[[dict], bool] | None = None  # built only for a run whose meta passes

    @property
    def name(self) -> str:
        return self.kind.name


def is_pd(meta: dict) -> bool:
    """A prefill/decode disaggregated run (``meta["pd"]``)."""
    return isinstance(meta.get("pd"), dict)


def with_plugin(meta: dict) -> bool:
    """A watch with vLLM's own steps (the kvscope plugin in the server)."""
    watch = meta.get("watch") if isinstance(meta.get("watch"), dict) else {}
    return bool(watch.get("plugin"))


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(KpiPanel, row=0),  # tokens/s, running/waiting, KV usage, TTFT and ITL p50/p99
    PanelSpec(MemoryPanel, row=1),  # weights, KV used, KV free, other allocator memory, device used (NVML)
    PanelSpec(PageMapPanel, row=1, report=page_map_with_replay),  # every KV block, by owner and fill
    PanelSpec(OccupancyPanel, row=2),  # KV occupancy and fragmentation vs. a static max-length reservation
    PanelSpec(BatchPanel, row=2),  # prefill vs decode tokens per step, running/waiting requests
    PanelSpec(LatencyPanel, row=3),  # per-step time by phase; TTFT and ITL histograms
    # one lane per request: queue (by reason) / prefill / decode / preempted; a P/D run's lanes above it
    PanelSpec(TimelinePanel, row=4, report=timeline_part),
    # prompt tokens hit / missed by cause / not reusable (kvscope.explain; hidden without recorded prompts)
    PanelSpec(PrefixMissesPanel, row=7, report=if_drawn),
    # queue seconds by why requests were not admitted (kvscope.explain.waits; hidden until a step says why)
    PanelSpec(QueueReasonsPanel, row=8, report=if_drawn),
    # steps far above the run's own step model, and the --capture-slow windows they opened (hidden until one is)
    PanelSpec(SlowStepsPanel, row=9, report=if_drawn),
    # a P/D run's instances' page maps side by side, blocks in flight marked (its meta's; hidden until the end)
    PanelSpec(PDPageMapsPanel, row=10, report=if_drawn, when=is_pd),
    # drafted / accepted / rejected per step, acceptance by draft position (hidden live if the run doesn't
    # speculate), and the draft model's own KV pool (hidden without a draft model)
    PanelSpec(SpeculationPanel, row=5, report=if_speculative),
    PanelSpec(DraftPageMapPanel, row=6, report=draft_page_map_with_replay),
)

WATCH_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(WatchKpiPanel, row=0),
    PanelSpec(FleetPanel, row=1),  # one lane per engine, plus the fleet
    # KV connectors per engine: NIXL transfers, offloading, role, blocks by medium (hidden without any)
    PanelSpec(KvTransferPanel, row=2, report=if_drawn),
    PanelSpec(PrefixTreePanel, row=3),
    PanelSpec(WatchLatencyPanel, row=4),
    PanelSpec(BatchPanel, row=5, when=with_plugin),
    PanelSpec(TimelinePanel, row=6, when=with_plugin),
)


def rows_of(specs: Sequence[PanelSpec]) -> tuple[tuple[str, ...], ...]:
    """The live view's rows of panel names, from the top."""
    rows: dict[int, list[str]] = {}
    for spec in specs:
        rows.setdefault(spec.row, []).append(spec.name)
    return tuple(tuple(names) for _, names in sorted(rows.items()))


ROWS = rows_of(PANELS)
WATCH_ROWS = rows_of(WATCH_PANELS)


def build_panels(
    stats: LatencyStats,
    rollover: int | None = DEFAULT_ROLLOVER,
    meta: dict | None = None,
    specs: Sequence[PanelSpec] = PANELS,
) -> list[Panel]:
    """The panels of ``specs`` that ``meta`` calls for, in order, sharing one ``LatencyStats`` (the caller
    feeds it before each ``update``). ``rollover=None`` keeps every point (static reports of a finished run)."""
    context = PanelContext(stats, rollover, meta if meta is not None else {})
    return [spec.kind.create(context) for spec in specs if spec.when is None or spec.when(context.meta)]


def apply_tick(panels: list[Panel], stats: LatencyStats, tick: Tick) -> None:
    """Feed ``stats`` first (panels read it), then every panel, in order."""
    for item in tick.ordered():
        stats.add(item)
    if tick.final:
        stats.flush()
    for panel in panels:
        panel.update(tick)


def report_rows(specs: Sequence[PanelSpec], panels: Sequence[Panel], context: ReportContext) -> list[LayoutDOM]:
    """The report's rows: each built panel's part (``spec.report``), side by side where they share a row."""
    built = {p.name: p for p in panels}
    rows: dict[int, list[LayoutDOM]] = {}
    for spec in specs:
        panel = built.get(spec.name)
        part = spec.report(panel, context) if panel is not None and spec.report is not None else None
        if part is not None:
            rows.setdefault(spec.row, []).append(part)
    return [parts[0] if len(parts) == 1 else bokeh_row(*parts) for _, parts in sorted(rows.items())]
