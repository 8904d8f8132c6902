"""Step latency by phase (stacked, per step) and TTFT / ITL histograms."""

from __future__ import annotations

import numpy as np
from bokeh.layouts import row
from bokeh.models import ColumnDataSource

from kvscope.telemetry.records import StepRecord

from ..feed import Tick
from ..stats import LatencyStats
from ..theme import HEIGHT, PHASE_COLORS, add_hover, empty_source, new_figure, stream_rows, style_legend
from .base import Panel, PanelContext

PHASES = tuple(PHASE_COLORS)  # schedule, prepare, forward, sample, update
NUM_BINS = 30


def phase_row(record: StepRecord) -> dict:
    row_ = {p: getattr(record, f"{p}_ns") / 1e6 for p in PHASES}
    row_["step"] = record.step
    row_["total"] = record.duration_ns / 1e6
    return row_


def histogram(samples_s, bins: int = NUM_BINS) -> dict[str, list[float]]:
    """Histogram of samples in seconds, as quad columns in milliseconds."""
    if not samples_s:
        return {"left": [], "right": [], "count": []}
    values = np.fromiter(samples_s, dtype=float) * 1e3
    counts, edges = np.histogram(values, bins=bins, range=(0.0, max(values.max(), 1e-3)))  # from 0: context
    return {"left": edges[:-1].tolist(), "right": edges[1:].tolist(), "count": counts.tolist()}


class LatencyPanel(Panel):
    name = "latency"
    title = "Latency"

    @classmethod
    def create(cls, context: PanelContext) -> LatencyPanel:
        return cls(context.stats, context.rollover)

    def __init__(self, stats: LatencyStats, rollover: int | None) -> None:
        self.stats = stats
        self.rollover = rollover
        self.source = empty_source("step", "total", *PHASES)
        phases = new_figure("Step time by phase (ms)", width=490, height=HEIGHT, x_axis_label="step")
        phases.varea_stack(
            stackers=list(PHASES), x="step", source=self.source,
            color=list(PHASE_COLORS.values()), legend_label=list(PHASES),
        )
        add_hover(
            phases,
            [("step", "@step"), ("total", "@total{0.000} ms"),
             *[(p, f"@{p}{{0.000}} ms") for p in PHASES]],
            mode="vline",
        )
        style_legend(phases, ncols=5)
        self.ttft_source = ColumnDataSource(histogram([]))
        self.itl_source = ColumnDataSource(histogram([]))
        # As tall as the phases (their legend below adds height): the row's bottoms line up.
        self.ttft_figure = self._histogram_figure("TTFT (ms)", self.ttft_source, "#ff7f0e", phases.height)
        self.itl_figure = self._histogram_figure("ITL (ms)", self.itl_source, "#1f77b4", phases.height)
        self.phase_figure = phases
        self.model = row(phases, self.ttft_figure, self.itl_figure)
        self._seen = (-1, -1)

    @staticmethod
    def _histogram_figure(title: str, source: ColumnDataSource, color: str, height: int):
        fig = new_figure(title, width=250, height=height, y_axis_label="count")
        fig.quad(left="left", right="right", bottom=0, top="count", source=source, color=color, alpha=0.8)
        fig.xaxis.ticker.desired_num_ticks = 4  # a narrow plot: fewer, readable labels
        add_hover(fig, [("range", "@left{0.00}–@right{0.00} ms"), ("count", "@count")])
        return fig

    def update(self, tick: Tick) -> None:
        stream_rows(self.source, [phase_row(r) for r in tick.steps], self.rollover)
        seen = (self.stats.output_tokens, self.stats.num_finished)
        if seen != self._seen or tick.final:  # histograms are small: replace them when samples arrive
            self._seen = seen
            self.ttft_source.data = histogram(self.stats.ttft)
            self.itl_source.data = histogram(self.stats.itl)
