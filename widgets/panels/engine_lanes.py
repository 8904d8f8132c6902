"""What the panels drawn from a watched run's engine lanes share (``fleet.py``, ``kv_transfer.py``).

Read from ``meta["watch"]`` (``kvscope/watched/source.py``): an engine's lane has one row per poll. A panel
draws a line (or two) per engine, at most ``MAX_LINES`` of them, one colour each, the first time the engine
appears; each tick streams every lane's new rows from where the last tick left off, and redraws the table of
engines when the lanes grew (the table changes with each poll, not each tick) and at the end.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from typing import ClassVar

from bokeh.models import ColumnDataSource, Div

from ..theme import FULL_WIDTH, OWNER_PALETTE, empty_source, stream_rows
from .base import Panel, PanelContext

MAX_LINES = 16  # engines drawn one by one; the table has them all

# (lane, first row to read, the watch's t0_ns, its poll interval in seconds) -> (rows, the lane's length)
LaneRows = Callable[[dict, int, int, float], tuple[list[dict], int]]


class EngineLanesPanel(Panel):
    """A panel of per-engine lines over a watch's lanes, and a table of the engines (see the module docstring).
    A subclass says which ``columns`` its sources have, how a lane becomes rows (``lane_rows``), how an
    engine's lines are drawn (``draw``) and what the table says (``table_html``)."""

    columns: ClassVar[tuple[str, ...]]
    lane_rows: ClassVar[LaneRows]
    table_html: ClassVar[Callable[[dict], str]]

    @classmethod
    def create(cls, context: PanelContext) -> EngineLanesPanel:
        return cls(context.meta, context.rollover)

    def __init__(self, meta: dict, rollover: int | None) -> None:
        self.meta = meta
        self.rollover = rollover
        self.sources: dict[str, ColumnDataSource] = {}
        self.seen: dict[str, int] = {}  # per lane: the rows streamed so far
        self.table = Div(text="", width=FULL_WIDTH)
        self._shown = -1  # the lanes' total length when the table was last drawn

    @abstractmethod
    def draw(self, key: str, source: ColumnDataSource, colour: str) -> None:
        """Draw the lines of the engine ``key``, a new source."""

    def source_of(self, key: str) -> ColumnDataSource | None:
        """The source of the engine ``key``, drawn the first time (``None`` past ``MAX_LINES`` engines)."""
        source = self.sources.get(key)
        if source is None and len(self.sources) < MAX_LINES:
            source = self.sources[key] = empty_source(*self.columns)
            self.draw(key, source, OWNER_PALETTE[(len(self.sources) - 1) % len(OWNER_PALETTE)])
        return source

    def stream(self, watch: dict, lanes: Iterable[tuple[str, dict]]) -> None:
        """Stream the rows each lane grew by since the last tick."""
        t0, step = watch.get("t0_ns", 0), watch.get("interval_s", 0.5)
        for key, lane in lanes:
            rows, n = type(self).lane_rows(lane, self.seen.get(key, 0), t0, step)
            self.seen[key] = n
            source = self.source_of(key)
            if source is not None:
                stream_rows(source, rows, self.rollover)

    def show_table(self, watch: dict, final: bool) -> None:
        """Redraw the table when the lanes grew, and at the end."""
        grown = sum(self.seen.values())
        if grown != self._shown or final:
            self._shown = grown
            self.table.text = type(self).table_html(watch)
