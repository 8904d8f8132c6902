"""KV occupancy per step: blocks used, tokens stored and fragmentation as shares of the pool,
against a static max-length reservation in times the pool (its own right axis: "42.0x"); for a model
with sliding-window layers also the blocks the step gave back for leaving the window (shown once any
step frees one). One row per ``StepRecord``, streamed with ``rollover``.
"""

from __future__ import annotations

from bokeh.models import DataRange1d, LinearAxis, Range1d

from kvscope.telemetry.records import StepRecord

from ..feed import Tick
from ..theme import (
    SHARE,
    TIMES,
    add_hover,
    empty_source,
    hover_value,
    new_figure,
    stream_rows,
    style_legend,
    tick_formatter,
)
from .base import Panel, PanelContext, kv_bytes_per_block


class OccupancyPanel(Panel):
    """KV blocks used, token slots filled and internal fragmentation as shares of the pool, against
    what reserving ``max_model_len`` per running request (a static KV cache) would need."""

    name = "occupancy"
    title = "KV occupancy vs. static reservation"

    @classmethod
    def create(cls, context: PanelContext) -> OccupancyPanel:
        return cls(context.rollover)

    def __init__(self, rollover: int | None) -> None:
        self.rollover = rollover
        self._bytes_per_block: int | None = None
        self._window_freed: int | None = None  # the cumulative count at the previous record
        self.source = empty_source("step", "block_usage", "token_usage", "fragmentation", "static_x_pool",
                                   "window_freed")
        fig = new_figure(self.title, x_axis_label="step", y_axis_label="share of KV pool",
                         y_range=Range1d(0, 1.05))
        fig.line("step", "block_usage", source=self.source, color="#fd8d3c", width=2, legend_label="blocks used")
        fig.line("step", "token_usage", source=self.source, color="#31a354", width=2, legend_label="tokens stored")
        fig.line("step", "fragmentation", source=self.source, color="#756bb1", legend_label="fragmentation")
        self.window_line = fig.line("step", "window_freed", source=self.source, color="#3182bd", dash="dotted",
                                    width=2, legend_label="freed by the window this step", visible=False)
        self.window_item = fig.legend[0].items[-1]
        self.window_item.visible = False
        # A static cache reserves max_model_len per request: often many times the pool, so it gets
        # its own (right) axis, in times the pool, and the paged lines keep their detail on the left one.
        fig.extra_y_ranges = {"static": DataRange1d(start=0)}
        static = fig.line("step", "static_x_pool", source=self.source, color="#d62728", dash="dashed", width=2,
                          y_range_name="static", legend_label="static reservation, x the pool (right axis)")
        fig.extra_y_ranges["static"].renderers = [static]
        fig.add_layout(LinearAxis(y_range_name="static", axis_label="static reservation, x the pool",
                                  formatter=tick_formatter(TIMES)), "right")
        fig.yaxis[0].formatter = tick_formatter(SHARE)
        add_hover(
            fig,
            [("step", "@step"), ("blocks used", "@block_usage{0.0%}"), ("tokens stored", "@token_usage{0.0%}"),
             ("fragmentation", "@fragmentation{0.0%}"), ("static reservation", hover_value("static_x_pool", TIMES)),
             ("freed by the window", "@window_freed{0.0%}")],
            mode="vline",
        )
        style_legend(fig, ncols=2)
        self.figure = fig
        self.model = fig

    def row(self, record: StepRecord) -> dict:
        kv = record.kv
        self._bytes_per_block = kv_bytes_per_block(record) or self._bytes_per_block
        pool = kv.num_blocks * self._bytes_per_block if self._bytes_per_block else 0
        freed = kv.num_window_freed_blocks - (self._window_freed if self._window_freed is not None
                                              else kv.num_window_freed_blocks)
        self._window_freed = kv.num_window_freed_blocks
        return {
            "step": record.step,
            "block_usage": kv.block_usage,
            "token_usage": kv.token_usage,
            "fragmentation": kv.fragmentation,
            "static_x_pool": kv.static_reservation_bytes / pool if pool else 0.0,
            "window_freed": max(freed, 0) / kv.num_blocks if kv.num_blocks else 0.0,
        }

    def update(self, tick: Tick) -> None:
        rows = [self.row(r) for r in tick.steps]
        if not self.window_line.visible and any(row["window_freed"] > 0 for row in rows):
            self.window_line.visible = self.window_item.visible = True
        stream_rows(self.source, rows, self.rollover)
