"""Latency distributions of a watched vLLM server: vLLM's own histograms (TTFT, ITL, end-to-end), all
engines added up, as the observations per bucket since the watch began. Bucket bounds are vLLM's; the
p50 / p99 marks are interpolated inside a bucket, so they are estimates (exact per-request latencies need
the plugin: then the requests' lanes and the run's summary have them)."""

from __future__ import annotations

import math

from bokeh.layouts import row
from bokeh.models import ColumnDataSource, FixedTicker, Span

from kvscope.watched.summary import merged, quantile

from ..feed import Tick
from ..theme import add_hover, new_figure
from .base import Panel, PanelContext

HISTOGRAMS = (("ttft", "TTFT", "#ff7f0e"), ("itl", "ITL", "#1f77b4"), ("e2e", "end-to-end", "#2ca02c"))


def bucket_bars(cumulative: list[tuple[float, float]]) -> dict[str, list]:
    """Per bucket: its index, label ("≤ 20 ms"), and the observations that fell in it."""
    out: dict[str, list] = {"i": [], "label": [], "count": []}
    below = 0.0
    for i, (le, c) in enumerate(cumulative):
        out["i"].append(i)
        out["label"].append("> " + _ms(cumulative[i - 1][0]) if math.isinf(le) and i else "≤ " + _ms(le))
        out["count"].append(max(c - below, 0.0))
        below = c
    last = max((i for i, c in enumerate(out["count"]) if c > 0), default=-1)
    return {k: v[: last + 2] for k, v in out.items()}  # up to one empty bucket after the last observation


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms" if seconds < 1 else f"{seconds:g} s"


def _position(cumulative: list[tuple[float, float]], value: float) -> float:
    """Where ``value`` (seconds) falls on the bucket-index axis (for the p50 / p99 marks)."""
    lower = 0.0
    for i, (le, _) in enumerate(cumulative):
        if value <= le:
            return i - 0.5 + ((value - lower) / (le - lower) if math.isfinite(le) and le > lower else 0.5)
        lower = le
    return len(cumulative) - 0.5


class WatchLatencyPanel(Panel):
    name = "watch_latency"
    title = "Latency distributions (vLLM histograms; percentiles estimated)"

    @classmethod
    def create(cls, context: PanelContext) -> WatchLatencyPanel:
        return cls(context.meta)

    def __init__(self, meta: dict) -> None:
        self.meta = meta
        self.sources: dict[str, ColumnDataSource] = {}
        self.marks: dict[str, tuple[Span, Span]] = {}
        self.figures = []
        for key, label, colour in HISTOGRAMS:
            source = self.sources[key] = ColumnDataSource(bucket_bars([]))
            fig = new_figure(f"{label}: requests per bucket", width=330, height=230, y_axis_label="count")
            fig.vbar(x="i", top="count", width=0.9, source=source, color=colour, alpha=0.8)
            p50 = Span(location=0, dimension="height", line_color="black", line_dash="dashed", visible=False)
            p99 = Span(location=0, dimension="height", line_color="#d62728", line_dash="dashed", visible=False)
            fig.add_layout(p50)
            fig.add_layout(p99)
            self.marks[key] = (p50, p99)
            fig.xaxis.major_label_orientation = 0.9
            fig.xaxis.axis_label = "bucket (p50 black, p99 red, both ≈)"
            add_hover(fig, [("bucket", "@label"), ("count", "@count")])
            self.figures.append(fig)
        self.model = row(*self.figures)
        self._signature = None

    def update(self, tick: Tick) -> None:
        watch = self.meta.get("watch")
        if not isinstance(watch, dict):
            return
        hists = list(watch.get("histograms", {}).values())
        signature = tuple(h.get(k, {}).get("count") for h in hists for k, *_ in HISTOGRAMS if isinstance(h, dict))
        if signature == self._signature and not tick.final:
            return
        self._signature = signature
        for (key, *_), fig in zip(HISTOGRAMS, self.figures):
            cumulative = merged([h.get(key) for h in hists if isinstance(h, dict)])
            bars = bucket_bars(cumulative)
            self.sources[key].data = bars
            fig.xaxis.ticker = FixedTicker(ticks=list(bars["i"]))
            fig.xaxis.major_label_overrides = {i: label for i, label in zip(bars["i"], bars["label"])}
            for mark, q in zip(self.marks[key], (0.5, 0.99)):
                value = quantile(cumulative, q)
                mark.visible = not math.isnan(value)
                if mark.visible:
                    mark.location = _position(cumulative, value)
