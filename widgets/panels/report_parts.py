"""How a panel appears in a finished run's HTML report: the ``report`` of its ``registry.PanelSpec``.

A part is a function of the filled panel and the ``ReportContext``; it returns the Bokeh layout that
stands in the panel's row of the report, or ``None`` to leave the panel out of this report. Most panels
are ``shown`` as they are; the page maps add a replay slider (``replay``).

``RecordedRun`` says what the report reads of a run (``kvscope.Run`` has all of it): the widgets take any
object of that shape and never import ``kvscope.runs.result.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd
from bokeh.models import LayoutDOM, Slider

from kvscope.telemetry.records import PageEntry, RequestEvent, StepRecord

from .base import Panel


class RecordedRun(Protocol):
    """What the report and the replay read of a run (``kvscope.Run`` has all of it)."""

    records: list[StepRecord]
    events: list[RequestEvent]
    meta: dict[str, Any]

    @property
    def t0_ns(self) -> int: ...
    @property
    def requests(self) -> pd.DataFrame: ...
    def summary(self) -> dict[str, Any]: ...
    def page_map_at(self, step: int) -> list[PageEntry]: ...


@dataclass(slots=True)
class ReportContext:
    """What the parts of one report share: the run, whether any of its steps speculated, and the page
    map's replay slider once the page map's part has made it (the draft page map follows it)."""

    run: RecordedRun
    speculative: bool = False
    slider: Slider | None = None

    @classmethod
    def of(cls, run: RecordedRun) -> ReportContext:
        return cls(run, speculative=any(r.spec_decode is not None for r in run.records))


ReportPart = Callable[[Panel, ReportContext], "LayoutDOM | None"]


def shown(panel: Panel, context: ReportContext) -> LayoutDOM:
    """The panel as it is."""
    return panel.model


def if_speculative(panel: Panel, context: ReportContext) -> LayoutDOM | None:
    """The panel, in the report of a run that speculated."""
    return panel.model if context.speculative else None
