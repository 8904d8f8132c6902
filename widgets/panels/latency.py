"""Step latency by phase (stacked, per step) and TTFT / ITL histograms."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from bokeh.layouts import row
from bokeh.models import ColumnDataSource

from kvscope.telemetry.records import StepRecord

from ..feed import Tick
from ..stats import LatencyStats
from ..theme import (
    AMOUNT,
    COUNT,
    HEIGHT,
    PHASE_COLORS,
    add_hover,
    empty_source,
    format_axis,
    new_figure,
    stream_rows,
    style_legend,
)
from .base import Panel, PanelContext

PHASES = tuple(PHASE_COLORS)  # schedule, prepare, forward, sample, update
NUM_BINS = 30


def phase_row(record: StepRecord) -> dict:
    row_ = {p: getattr(record, f"{p}_ns") / 1e6 for p in PHASES}
    row_["step"] = record.step
    row_["total"] = record.duration_ns / 1e6
    return row_


OUTLIER_FACTOR = 4.0  # the largest sample this many times past the bulk: the top 1% go to the overflow bin
OVERFLOW_COLOR = "#d62728"
HISTOGRAM_COLUMNS = ("left", "right", "count", "color", "label")
HISTOGRAM_COLORS = {"TTFT": "#ff7f0e", "ITL": "#1f77b4"}


def overflow_cap(values_ms: np.ndarray) -> float | None:
    """Where the histogram's x axis ends when a few samples lie far past the rest (one 8 s stall among
    20 ms ITLs would squeeze every other sample into one bar): at the largest sample once the top 1%
    (at least one) is set aside, when the largest of all is more than ``OUTLIER_FACTOR`` times that;
    else ``None`` (the axis ends at the largest sample)."""
    n = len(values_ms)
    if n < 2:
        return None
    rank = n - (max(1, n // 100) + 1)  # the bulk's largest: a partition, not a sort (the update thread's time)
    bulk = float(np.partition(values_ms, rank)[rank])
    return bulk if values_ms.max() > OUTLIER_FACTOR * bulk > 0 else None


def histogram(samples_s, bins: int = NUM_BINS, color: str = "#1f77b4") -> dict[str, list]:
    """Histogram of samples in seconds, as quad columns in milliseconds, from 0 (context). Samples past
    ``overflow_cap`` go to one last bar, drawn apart in ``OVERFLOW_COLOR``, whose label gives their range."""
    if not len(samples_s):
        return {c: [] for c in HISTOGRAM_COLUMNS}
    values = (samples_s if isinstance(samples_s, np.ndarray) else np.fromiter(samples_s, dtype=float)) * 1e3
    cap = overflow_cap(values)
    top = cap if cap is not None else max(values.max(), 1e-3)
    counts, edges = np.histogram(values[values <= top], bins=bins, range=(0.0, top))
    out = {"left": edges[:-1].tolist(), "right": edges[1:].tolist(), "count": counts.tolist(),
           "color": [color] * bins, "label": [f"{a:,.2f}–{b:,.2f} ms" for a, b in pairwise(edges)]}
    if cap is not None:
        over, width = values[values > cap], top / bins
        out["left"].append(top + width)
        out["right"].append(top + 3 * width)
        out["count"].append(len(over))
        out["color"].append(OVERFLOW_COLOR)
        out["label"].append(f"over {cap:,.2f} ms: {over.min():,.2f}–{over.max():,.2f} ms")
    return out


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
        format_axis(phases.yaxis[0], AMOUNT)
        style_legend(phases, ncols=5)
        self.ttft_source = ColumnDataSource(histogram([]))
        self.itl_source = ColumnDataSource(histogram([]))
        # As tall as the phases (their legend below adds height): the row's bottoms line up.
        self.ttft_figure = self._histogram_figure("TTFT (ms)", self.ttft_source, phases.height)
        self.itl_figure = self._histogram_figure("ITL (ms)", self.itl_source, phases.height)
        self.phase_figure = phases
        self.model = row(phases, self.ttft_figure, self.itl_figure)
        self._seen = (-1, -1)

    @staticmethod
    def _histogram_figure(title: str, source: ColumnDataSource, height: int):
        fig = new_figure(title, width=250, height=height, y_axis_label="count")
        fig.quad(left="left", right="right", bottom=0, top="count", source=source, color="color", alpha=0.8)
        fig.xaxis.ticker.desired_num_ticks = 4  # a narrow plot: fewer, readable labels
        format_axis(fig.xaxis[0], AMOUNT)
        format_axis(fig.yaxis[0], COUNT)
        add_hover(fig, [("range", "@label"), ("count", "@count")])
        return fig

    @staticmethod
    def _show_histogram(fig, source: ColumnDataSource, name: str, samples) -> None:
        """Replace the histogram; its title counts the samples in the overflow bar, if any."""
        data = histogram(samples, color=HISTOGRAM_COLORS[name])
        source.data = data
        over = data["count"][-1] if data["color"] and data["color"][-1] == OVERFLOW_COLOR else 0
        fig.title.text = f"{name} (ms)" + (f" · {over} far out (red bar)" if over else "")

    def update(self, tick: Tick) -> None:
        stream_rows(self.source, [phase_row(r) for r in tick.steps], self.rollover)
        seen = (self.stats.output_tokens, self.stats.num_finished)
        if seen != self._seen or tick.final:  # histograms are small: replace them when samples arrive
            self._seen = seen
            self._show_histogram(self.ttft_figure, self.ttft_source, "TTFT", self.stats.samples("ttft"))
            self._show_histogram(self.itl_figure, self.itl_source, "ITL", self.stats.samples("itl"))
