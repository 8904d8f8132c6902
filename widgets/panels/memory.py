"""Memory per step: weights, KV used / free and other allocator memory stacked; device used
(NVML) and host RSS as lines. One row per ``StepRecord``, streamed with ``rollover``.
"""

from __future__ import annotations

from bokeh.models import DataRange1d, LinearAxis

from kvscope.telemetry.records import StepRecord

from ..feed import Tick
from ..theme import add_hover, empty_source, new_figure, stream_rows, style_legend
from .base import Panel, PanelContext, kv_bytes_per_block

MEMORY_STACK = ("weights", "kv_used", "kv_free", "other")
MEMORY_LABELS = {"weights": "weights", "kv_used": "KV used", "kv_free": "KV free", "other": "other allocator"}
MEMORY_COLORS = {"weights": "#6baed6", "kv_used": "#fd8d3c", "kv_free": "#fdd0a2", "other": "#bdbdbd"}
PROBED = ("other", "device_used", "host_rss")  # in the legend once a step has a value (not NaN, not 0)


class MemoryPanel(Panel):
    """Weights, KV used / free and other allocator memory, stacked; device used (NVML) as a line when
    the probes have it, host RSS on its own right axis (on a CPU it dwarfs the rest). Absent probes
    (no GPU) give zero-height bands and no line, and are left out of the legend until a step has them
    (``PROBED``). Values are in MiB, or GiB for large models."""

    name = "memory"
    title = "Memory"

    @classmethod
    def create(cls, context: PanelContext) -> MemoryPanel:
        return cls(context.rollover)

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
        self.rss_axis = LinearAxis(y_range_name="rss", axis_label="host RSS, MiB", visible=False)  # with its data
        fig.add_layout(self.rss_axis, "right")
        add_hover(
            fig,
            [("step", "@step"), *[(MEMORY_LABELS[k], f"@{k}{{0,0.00}}") for k in MEMORY_STACK],
             ("device used", "@device_used{0,0.00}"), ("host RSS", "@host_rss{0,0.00}")],
            mode="vline",
        )
        items = dict(zip((*MEMORY_STACK, "device_used", "host_rss"), fig.legend[0].items))
        self.probed = {key: items[key] for key in PROBED}  # shown once a step has the value
        for item in self.probed.values():
            item.visible = False
        style_legend(fig, ncols=3)
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
        self._bytes_per_block = kv_bytes_per_block(record) or self._bytes_per_block
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
            "other": other / scale if allocated is not None else nan,
            "device_used": mem.get("device_used_bytes", nan) / scale,
            "host_rss": mem.get("host_rss_bytes", nan) / scale,
        }

    def update(self, tick: Tick) -> None:
        rows = [self.row(r) for r in tick.steps]
        for key, item in self.probed.items():
            if not item.visible and any(row[key] == row[key] and row[key] > 0 for row in rows):
                item.visible = True
                self.rss_axis.visible |= key == "host_rss"
        stream_rows(self.source, rows, self.rollover)
