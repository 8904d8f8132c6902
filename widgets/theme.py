"""Shared look of the panels: sizes, colours, and the one place figures are made."""

from __future__ import annotations

import math

import numpy as np
from bokeh.models import (
    AdaptiveTicker,
    Axis,
    ColumnDataSource,
    CustomJSTickFormatter,
    HoverTool,
    TickFormatter,
)
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
    if kwargs.get("x_axis_label") == "step":  # steps are whole numbers
        format_axis(fig.xaxis[0], COUNT)
    fig.title.text_font_size = "12px"
    fig.xaxis.axis_label_text_font_size = "11px"
    fig.yaxis.axis_label_text_font_size = "11px"
    return fig


# Every legend sits below its plot, outside the data (one rule for every panel, live and in reports),
# in rows of up to ``ncols`` items; clicking an item hides its series. The figure grows by the
# legend's rows, so the plot area keeps its size.
LEGEND_ROW_HEIGHT = 16  # px per row of legend items (glyph and label height, plus spacing)
LEGEND_PAD = 12  # px around the legend: its padding and its margin to the x axis


def style_legend(fig: figure, ncols: int = 3) -> None:
    """Move ``fig``'s legend below the plot area, horizontal, ``ncols`` items a row, click to hide."""
    legend = fig.legend[0]
    fig.add_layout(legend, "below")
    legend.orientation = "horizontal"
    legend.ncols = ncols
    legend.location = "top_left"
    legend.label_text_font_size = "10px"
    legend.glyph_height, legend.glyph_width = 12, 16  # wide enough to show a dashed line
    legend.label_height = 12
    legend.spacing = 4
    legend.padding = 2
    legend.margin = 4
    legend.border_line_alpha = 0
    legend.click_policy = "hide"
    rows = math.ceil(len(legend.items) / ncols)
    fig.height += rows * LEGEND_ROW_HEIGHT + LEGEND_PAD


# A tick / hover format: a NumeralJS format ("0%", "0,0") or TIMES, a multiple ("42.0x"), which is how
# the static reservation reads (times the KV pool, rather than thousands of percent). Axes do not use
# the NumeralJS format as it is ("0%" reads 0.1%, 0.2%, 0.3% as "0% 0% 0%"): ``tick_formatter`` gives
# each axis as many decimals as its tick spacing needs, and counts get whole-number ticks only.
TIMES = "x"
SHARE = "0%"
COUNT = "0,0"  # requests, tokens, steps: ticks at whole numbers only
AMOUNT = "0,0.[00]"  # MiB, ms

# The labels of one axis with as many decimals as the spacing of its ticks needs (more while two read
# the same): 0.1% 0.2% 0.3%, 0.00x 0.01x 0.02x, 0 25% 50%. Bokeh calls it per tick with every tick.
ADAPTIVE_TICKS_JS = """
const all = Array.from(ticks);
let spacing = Infinity;
for (let i = 1; i < all.length; i++) {
  const d = Math.abs(all[i] - all[i - 1]);
  if (d > 0) spacing = Math.min(spacing, d);
}
let digits = isFinite(spacing) ? Math.max(0, Math.ceil(-Math.log10(spacing * scale) - 1e-9)) : 0;
const text = (v, n) => (v * scale).toLocaleString("en-US", {minimumFractionDigits: n, maximumFractionDigits: n,
                                                            useGrouping: grouping});
while (digits < 12 && new Set(all.map(t => text(t, digits))).size < new Set(all).size) digits++;
return text(tick, digits) + suffix;
"""


def tick_formatter(fmt: str) -> TickFormatter:
    """The axis formatter of a format (see ``TIMES``): distinct labels at every range."""
    scale, suffix = (100.0, "%") if fmt == SHARE else (1.0, "x") if fmt == TIMES else (1.0, "")
    return CustomJSTickFormatter(code=ADAPTIVE_TICKS_JS,
                                 args={"scale": scale, "suffix": suffix, "grouping": fmt != SHARE})


def integer_ticker() -> AdaptiveTicker:
    """Ticks at whole numbers only (counts: a range of 0-1 requests reads 0 1, not 0 0 0 1 1 1)."""
    return AdaptiveTicker(min_interval=1, num_minor_ticks=0)


def format_axis(axis: Axis, fmt: str) -> None:
    """``axis`` in a format: its formatter, and for counts its ticker."""
    axis.formatter = tick_formatter(fmt)
    if fmt == COUNT:
        axis.ticker = integer_ticker()


def hover_value(field: str, fmt: str) -> str:
    """A hover tooltip's value of ``field`` in a format (see ``TIMES``)."""
    if fmt == TIMES:
        return f"@{{{field}}}{{0.0[0]}}x"
    return f"@{{{field}}}{{{'0.[00]%' if fmt == SHARE else fmt}}}"  # a share to the hundredth of a percent


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
