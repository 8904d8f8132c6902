"""Shared look of the panels: sizes, colours, and the one place figures are made."""

from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.palettes import Category20
from bokeh.plotting import figure

FULL_WIDTH = 1000
HALF_WIDTH = 495
HEIGHT = 250

# Category20 without its two greys: greys mean "no owner" / "cached" in the page map.
OWNER_PALETTE = tuple(c for c in Category20[20] if c not in ("#7f7f7f", "#c7c7c7"))
FREE_COLOR = "#eeeeee"
CACHED_COLOR = "#9e9e9e"
STATE_COLORS = {
    "waiting": "#c7c7c7",
    "prefill": "#ff7f0e",
    "decode": "#1f77b4",
    "preempted": "#d62728",
}
PHASE_COLORS = {
    "schedule": "#9467bd",
    "prepare": "#8c564b",
    "forward": "#1f77b4",
    "sample": "#2ca02c",
    "update": "#e377c2",
}


class OwnerColors:
    """A colour per request id, in the order requests are first seen (ids recur mod the palette)."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}

    def index(self, owner: str) -> int:
        return self._index.setdefault(owner, len(self._index))

    def __call__(self, owner: str) -> str:
        return OWNER_PALETTE[self.index(owner) % len(OWNER_PALETTE)]

    def forget(self, owner: str) -> None:
        """Drop a finished request (its colour index is not reused, so colours stay stable)."""
        self._index.pop(owner, None)


def new_figure(title: str, width: int = HALF_WIDTH, height: int = HEIGHT, **kwargs) -> figure:
    """A figure with the panels' common tools and styling; built once, updated in place."""
    fig = figure(
        title=title,
        width=width,
        height=height,
        tools="pan,xwheel_zoom,box_zoom,reset,save",
        toolbar_location="right",
        **kwargs,
    )
    fig.toolbar.logo = None
    fig.title.text_font_size = "12px"
    fig.xaxis.axis_label_text_font_size = "11px"
    fig.yaxis.axis_label_text_font_size = "11px"
    return fig


def style_legend(fig: figure, location: str = "top_left") -> None:
    fig.legend.location = location
    fig.legend.label_text_font_size = "10px"
    fig.legend.background_fill_alpha = 0.6
    fig.legend.spacing = 0
    fig.legend.padding = 4
    fig.legend.click_policy = "hide"


def add_hover(fig: figure, tooltips: list[tuple[str, str]], mode: str = "mouse", renderers=None) -> None:
    """Hover text; Bokeh escapes ``@field`` values (we never use the ``{safe}`` format)."""
    fig.add_tools(HoverTool(tooltips=tooltips, mode=mode, renderers=renderers or "auto"))


def empty_source(*columns: str) -> ColumnDataSource:
    return ColumnDataSource({c: [] for c in columns})


def columns(rows: list[dict], arrays: bool = False) -> dict[str, list | np.ndarray]:
    """Rows to columns. ``arrays=True`` makes numeric columns numpy arrays, which Bokeh sends as
    binary buffers: worth it for one big send (the page-map grid); a tick's few rows go as plain
    lists (each buffer is two more widget messages)."""
    out: dict[str, list | np.ndarray] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        numeric = arrays and isinstance(values[0], (int, float))
        out[key] = np.asarray(values, dtype=float) if numeric else values
    return out


def stream_rows(source: ColumnDataSource, rows: list[dict], rollover: int | None) -> None:
    """Append rows (dicts with the source's columns) in one ``stream`` call."""
    if rows:
        source.stream(columns(rows), rollover=rollover)
