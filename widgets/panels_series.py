"""Per-step time series: memory, KV occupancy/fragmentation, batch composition.

Each panel turns every new ``StepRecord`` into one row and streams the rows of a tick in one
``stream(..., rollover=N)`` call; x is the step index.
"""

from __future__ import annotations

from bokeh.models import LinearAxis, NumeralTickFormatter, Range1d

from kvscope.telemetry.records import StepRecord

from .feed import Tick
from .panels import Panel
from .theme import BYTES_FORMAT, add_hover, empty_source, new_figure, stream_rows, style_legend

MEMORY_STACK = ("weights", "kv_used", "kv_free", "other")
MEMORY_LABELS = {"weights": "weights", "kv_used": "KV used", "kv_free": "KV free", "other": "other allocator"}
MEMORY_COLORS = {"weights": "#6baed6", "kv_used": "#fd8d3c", "kv_free": "#fdd0a2", "other": "#bdbdbd"}


def _kv_bytes_per_block(record: StepRecord) -> int | None:
    kv = record.kv
    return kv.paged_bytes // kv.blocks_used if kv.blocks_used else None


class MemoryPanel(Panel):
    """Weights, KV used / free and other allocator memory, stacked; device used (NVML) and host RSS
    as lines when the probes have them. Missing probes (no GPU) show as zero-height bands."""

    name = "memory"
    title = "Memory"

    def __init__(self, rollover: int | None) -> None:
        self.rollover = rollover
        self._bytes_per_block: int | None = None
        self.source = empty_source("step", *MEMORY_STACK, "device_used", "host_rss")
        fig = new_figure(self.title + " (bytes)", x_axis_label="step")
        fig.varea_stack(
            stackers=list(MEMORY_STACK),
            x="step",
            color=[MEMORY_COLORS[k] for k in MEMORY_STACK],
            legend_label=[MEMORY_LABELS[k] for k in MEMORY_STACK],
            source=self.source,
        )
        fig.line("step", "device_used", source=self.source, color="#d62728", width=2, legend_label="device used (NVML)")
        fig.line("step", "host_rss", source=self.source, color="#636363", dash="dashed", legend_label="host RSS")
        fig.yaxis.formatter = NumeralTickFormatter(format=BYTES_FORMAT)
        add_hover(
            fig,
            [("step", "@step"), ("weights", "@weights{0.0 ib}"), ("KV used", "@kv_used{0.0 ib}"),
             ("KV free", "@kv_free{0.0 ib}"), ("other", "@other{0.0 ib}"),
             ("device used", "@device_used{0.0 ib}"), ("host RSS", "@host_rss{0.0 ib}")],
            mode="vline",
        )
        style_legend(fig)
        self.figure = fig
        self.model = fig

    def row(self, record: StepRecord) -> dict:
        mem = record.memory
        kv = record.kv
        self._bytes_per_block = _kv_bytes_per_block(record) or self._bytes_per_block
        pool = mem.get("kv_pool_bytes")
        if pool is None and self._bytes_per_block:
            pool = kv.num_blocks * self._bytes_per_block
        weights = mem.get("weights_bytes", 0)
        kv_used = kv.paged_bytes
        allocated = mem.get("torch_allocated_bytes")
        other = max(allocated - weights - (pool or 0), 0) if allocated is not None else 0
        nan = float("nan")  # a line gap where a probe is absent
        return {
            "step": record.step,
            "weights": weights,
            "kv_used": kv_used,
            "kv_free": max((pool or 0) - kv_used, 0),
            "other": other,
            "device_used": mem.get("device_used_bytes", nan),
            "host_rss": mem.get("host_rss_bytes", nan),
        }

    def update(self, tick: Tick) -> None:
        stream_rows(self.source, [self.row(r) for r in tick.steps], self.rollover)


class OccupancyPanel(Panel):
    """KV blocks used, token slots filled and internal fragmentation as shares of the pool, against
    what reserving ``max_model_len`` per running request (a static KV cache) would need."""

    name = "occupancy"
    title = "KV occupancy vs. static reservation"

    def __init__(self, rollover: int | None) -> None:
        self.rollover = rollover
        self._bytes_per_block: int | None = None
        self.source = empty_source("step", "block_usage", "token_usage", "fragmentation", "static_share")
        fig = new_figure(self.title + " (share of KV pool)", x_axis_label="step")
        fig.line("step", "block_usage", source=self.source, color="#fd8d3c", width=2, legend_label="blocks used")
        fig.line("step", "token_usage", source=self.source, color="#31a354", width=2, legend_label="tokens stored")
        fig.line("step", "fragmentation", source=self.source, color="#756bb1", legend_label="fragmentation")
        fig.line("step", "static_share", source=self.source, color="#d62728", dash="dashed", width=2,
                 legend_label="static reservation")
        fig.yaxis.formatter = NumeralTickFormatter(format="0%")
        add_hover(
            fig,
            [("step", "@step"), ("blocks used", "@block_usage{0.0%}"), ("tokens stored", "@token_usage{0.0%}"),
             ("fragmentation", "@fragmentation{0.0%}"), ("static reservation", "@static_share{0.0%}")],
            mode="vline",
        )
        style_legend(fig)
        self.figure = fig
        self.model = fig

    def row(self, record: StepRecord) -> dict:
        kv = record.kv
        self._bytes_per_block = _kv_bytes_per_block(record) or self._bytes_per_block
        pool = kv.num_blocks * self._bytes_per_block if self._bytes_per_block else 0
        return {
            "step": record.step,
            "block_usage": kv.block_usage,
            "token_usage": kv.token_usage,
            "fragmentation": kv.fragmentation,
            "static_share": kv.static_reservation_bytes / pool if pool else 0.0,
        }

    def update(self, tick: Tick) -> None:
        stream_rows(self.source, [self.row(r) for r in tick.steps], self.rollover)


class BatchPanel(Panel):
    """Tokens per step, prefill stacked on decode, and running / waiting requests (right axis)."""

    name = "batch"
    title = "Batch composition"

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
        style_legend(fig)
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
