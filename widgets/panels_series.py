"""Per-step time series: memory, KV occupancy/fragmentation, batch composition.

Each panel turns every new ``StepRecord`` into one row and streams the rows of a tick in one
``stream(..., rollover=N)`` call; x is the step index.
"""

from __future__ import annotations

from bokeh.models import DataRange1d, LinearAxis, NumeralTickFormatter, Range1d

from kvscope.telemetry.records import StepRecord

from .feed import Tick
from .panels import Panel
from .theme import add_hover, empty_source, new_figure, stream_rows, style_legend

MEMORY_STACK = ("weights", "kv_used", "kv_free", "other")
MEMORY_LABELS = {"weights": "weights", "kv_used": "KV used", "kv_free": "KV free", "other": "other allocator"}
MEMORY_COLORS = {"weights": "#6baed6", "kv_used": "#fd8d3c", "kv_free": "#fdd0a2", "other": "#bdbdbd"}


def _kv_bytes_per_block(record: StepRecord) -> int | None:
    kv = record.kv
    return kv.paged_bytes // kv.blocks_used if kv.blocks_used else None


class MemoryPanel(Panel):
    """Weights, KV used / free and other allocator memory, stacked; device used (NVML) as a line when
    the probes have it, host RSS on its own right axis (on a CPU it dwarfs the rest). Absent probes
    (no GPU) give zero-height bands and no line. Values are in MiB, or GiB for large models."""

    name = "memory"
    title = "Memory"

    def __init__(self, rollover: int | None) -> None:
        self.rollover = rollover
        self._bytes_per_block: int | None = None
        self.unit: tuple[str, int] | None = None  # ("MiB", 2**20) once the first record is seen
        self.source = empty_source("step", *MEMORY_STACK, "device_used", "host_rss")
        fig = new_figure(self.title, x_axis_label="step", y_axis_label="MiB")
        stack = fig.varea_stack(
            stackers=list(MEMORY_STACK), x="step", color=[MEMORY_COLORS[k] for k in MEMORY_STACK],
            legend_label=[MEMORY_LABELS[k] for k in MEMORY_STACK], source=self.source,
        )
        device = fig.line("step", "device_used", source=self.source, color="#d62728", width=2,
                          legend_label="device used (NVML)")
        fig.y_range = DataRange1d(renderers=[*stack, device], start=0)
        fig.extra_y_ranges = {"rss": DataRange1d(start=0)}
        rss = fig.line("step", "host_rss", source=self.source, color="#636363", dash="dashed",
                       y_range_name="rss", legend_label="host RSS (right axis)")
        fig.extra_y_ranges["rss"].renderers = [rss]
        self.rss_axis = LinearAxis(y_range_name="rss", axis_label="host RSS, MiB")
        fig.add_layout(self.rss_axis, "right")
        add_hover(
            fig,
            [("step", "@step"), *[(MEMORY_LABELS[k], f"@{k}{{0,0.00}}") for k in MEMORY_STACK],
             ("device used", "@device_used{0,0.00}"), ("host RSS", "@host_rss{0,0.00}")],
            mode="vline",
        )
        style_legend(fig)
        self.figure = fig
        self.model = fig

    def _pick_unit(self, record: StepRecord) -> tuple[str, int]:
        mem = record.memory
        big = mem.get("device_total_bytes", 0) + mem.get("weights_bytes", 0) + mem.get("kv_pool_bytes", 0)
        unit = ("GiB", 1 << 30) if big >= 4 << 30 else ("MiB", 1 << 20)
        self.figure.yaxis[0].axis_label = unit[0]
        self.rss_axis.axis_label = f"host RSS, {unit[0]}"
        return unit

    def row(self, record: StepRecord) -> dict:
        mem = record.memory
        kv = record.kv
        if self.unit is None:
            self.unit = self._pick_unit(record)
        scale = self.unit[1]
        self._bytes_per_block = _kv_bytes_per_block(record) or self._bytes_per_block
        pool = mem.get("kv_pool_bytes")
        if pool is None and self._bytes_per_block:
            pool = kv.num_blocks * self._bytes_per_block
        weights = mem.get("weights_bytes", 0)
        allocated = mem.get("torch_allocated_bytes")
        other = max(allocated - weights - (pool or 0), 0) if allocated is not None else 0
        nan = float("nan")  # a gap where a probe is absent
        return {
            "step": record.step,
            "weights": weights / scale,
            "kv_used": kv.paged_bytes / scale,
            "kv_free": max((pool or 0) - kv.paged_bytes, 0) / scale,
            "other": other / scale,
            "device_used": mem.get("device_used_bytes", nan) / scale,
            "host_rss": mem.get("host_rss_bytes", nan) / scale,
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
        fig = new_figure(self.title, x_axis_label="step", y_axis_label="share of KV pool",
                         y_range=Range1d(0, 1.05))
        fig.line("step", "block_usage", source=self.source, color="#fd8d3c", width=2, legend_label="blocks used")
        fig.line("step", "token_usage", source=self.source, color="#31a354", width=2, legend_label="tokens stored")
        fig.line("step", "fragmentation", source=self.source, color="#756bb1", legend_label="fragmentation")
        # A static cache reserves max_model_len per request: often many times the pool, so it gets
        # its own (right) axis and the paged lines keep their detail on the left one.
        fig.extra_y_ranges = {"static": DataRange1d(start=0)}
        static = fig.line("step", "static_share", source=self.source, color="#d62728", dash="dashed", width=2,
                          y_range_name="static", legend_label="static reservation (right axis)")
        fig.extra_y_ranges["static"].renderers = [static]
        fig.add_layout(LinearAxis(y_range_name="static", axis_label="static reservation / pool",
                                  formatter=NumeralTickFormatter(format="0%")), "right")
        fig.yaxis[0].formatter = NumeralTickFormatter(format="0%")
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
