"""Batch composition per step: prefill tokens stacked on decode tokens, running / waiting requests
on the right axis. One row per ``StepRecord``, streamed with ``rollover``.
"""

from __future__ import annotations

from bokeh.models import LinearAxis, Range1d

from ..feed import Tick
from ..theme import COUNT, add_hover, empty_source, format_axis, new_figure, stream_rows, style_legend
from .base import Panel, PanelContext


class BatchPanel(Panel):
    """Tokens per step, prefill stacked on decode, and running / waiting requests (right axis)."""

    name = "batch"
    title = "Batch composition"

    @classmethod
    def create(cls, context: PanelContext) -> BatchPanel:
        return cls(context.rollover)

    def __init__(self, rollover: int | None) -> None:
        self.rollover = rollover
        self.source = empty_source("step", "decode", "prefill", "running", "waiting")
        fig = new_figure(self.title + " (tokens per step)", x_axis_label="step")
        fig.vbar_stack(
            ["decode", "prefill"], x="step", width=0.9, source=self.source,
            color=["#1f77b4", "#ff7f0e"], legend_label=["decode tokens", "prefill tokens"],
        )
        fig.extra_y_ranges = {"requests": Range1d(0, 1)}
        fig.add_layout(LinearAxis(y_range_name="requests", axis_label="requests"), "right")
        for axis in fig.yaxis:  # tokens (left) and requests (right) are counts
            format_axis(axis, COUNT)
        fig.line("step", "running", source=self.source, y_range_name="requests", color="#2ca02c", width=2,
                 legend_label="running")
        fig.line("step", "waiting", source=self.source, y_range_name="requests", color="#7f7f7f", width=2,
                 dash="dashed", legend_label="waiting")
        add_hover(
            fig,
            [("step", "@step"), ("prefill tokens", "@prefill"), ("decode tokens", "@decode"),
             ("running", "@running"), ("waiting", "@waiting")],
            mode="vline",
        )
        style_legend(fig, ncols=4)
        self.figure = fig
        self.model = fig
        self._max_requests = 1

    def update(self, tick: Tick) -> None:
        rows = [
            {"step": r.step, "decode": r.num_decode_tokens, "prefill": r.num_prefill_tokens,
             "running": r.num_running, "waiting": r.num_waiting}
            for r in tick.steps
        ]
        if rows:
            peak = max(max(r["running"], r["waiting"]) for r in rows)
            if peak > self._max_requests:  # the right axis only grows (one change per new peak)
                self._max_requests = peak
                self.figure.extra_y_ranges["requests"].end = peak * 1.1
        stream_rows(self.source, rows, self.rollover)
