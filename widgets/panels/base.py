"""What every panel is: one plot (or a small row of them) that owns its Bokeh sources.

A panel builds its figures once, in ``__init__``, and changes them in place in ``update(tick)``:
time series grow with ``ColumnDataSource.stream(..., rollover=N)`` (bounded memory), the page map
with ``patch``. Panels never touch threads or widgets; ``Dashboard`` calls ``update`` from its one
update thread, inside ``Document.hold("combine")``, and ``report.save_html`` calls it to fill a
static page. ``registry.build_panels`` makes each panel of its ``PanelSpec`` from one ``PanelContext``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from bokeh.models import LayoutDOM

from kvscope.telemetry.records import StepRecord

from ..feed import Tick
from ..stats import LatencyStats

DEFAULT_ROLLOVER = 2000  # points kept per time series (steps); older ones scroll out


@dataclass(slots=True)
class PanelContext:
    """What panels are built from: the shared ``LatencyStats`` (fed before each ``update``), the
    rollover (``None`` keeps every point: static reports) and the run's metadata (filled in place
    as a live run learns it: model name, ``t0_ns``)."""

    stats: LatencyStats
    rollover: int | None = DEFAULT_ROLLOVER
    meta: dict = field(default_factory=dict)


class Panel(ABC):
    """One plot (or a small row of them) of the dashboard."""

    name: ClassVar[str]  # short key, e.g. "page_map"
    title: ClassVar[str]
    model: LayoutDOM  # what is shown (wrapped in one jupyter_bokeh.BokehModel)

    @classmethod
    @abstractmethod
    def create(cls, context: PanelContext) -> Panel:
        """The panel, built from what it needs of ``context``."""

    @abstractmethod
    def update(self, tick: Tick) -> None:
        """Apply new step records and request events; called once per tick, in time order."""


def kv_bytes_per_block(record: StepRecord) -> int | None:
    """Bytes of one KV block, from a step's paged bytes and used blocks (``None`` while none is used)."""
    kv = record.kv
    return kv.paged_bytes // kv.blocks_used if kv.blocks_used else None
