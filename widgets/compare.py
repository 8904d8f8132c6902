"""Runs compared in one page: ``save_html`` (standalone, BokehJS inlined, opens offline) and ``show``
(the same layout in a notebook, as one ``jupyter_bokeh.BokehModel``).

From top to bottom: the runs (a colour each) and any warning that they are not like for like; the
summary table with ratios against the first run; the per-step time series of the dashboard's panels
with one line per run, aligned by step or by time (a switch: its ``CustomJS`` swaps every source's
``x`` column and the shared x range); the latency distributions (TTFT, ITL, step time) overlaid as
cumulative shares; the page map of every run side by side under one replay slider.

The key of run colours sits above the plots with a toggle per run, so no legend covers data; the
static reservation is drawn in times the pool. The text parts (header, warnings, table) come from
``compare_table.py``. The page maps reuse the report's parts: ``PageMapPanel`` draws each run's map,
``panels.replay.page_map_history`` packs its history and ``panels.replay.REPLAY_JS`` rebuilds it at the
slider's step (in time mode, at the last step that ended by the slider's time). Every text from a run passes
``html.escape`` before it reaches a ``Div``.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import numpy as np
from bokeh.embed import file_html
from bokeh.layouts import column, row
from bokeh.models import (
    CheckboxButtonGroup,
    ColumnDataSource,
    CustomJS,
    Div,
    RadioButtonGroup,
    Range1d,
    Slider,
)
from bokeh.resources import INLINE

from kvscope.telemetry.frames import all_itls
from kvscope.utils.files import atomic_write

from .compare_table import Compared, MiB, header_html, run_color, summary_html
from .feed import Tick
from .panels.page_map import PageMapPanel
from .panels.replay import REPLAY_JS, caption, page_map_history
from .theme import (
    AMOUNT,
    COUNT,
    FULL_WIDTH,
    HALF_WIDTH,
    HEIGHT,
    SHARE,
    TIMES,
    add_hover,
    format_axis,
    hover_value,
    new_figure,
    tick_formatter,
)

# (column, title, y axis label, tick format: theme.tick_formatter's): one figure per quantity, one line per run.
SERIES = {
    "Throughput and batch": (
        ("output_tokens", "Output tokens so far", "tokens", COUNT),
        ("num_tokens", "Tokens per step (prefill + decode)", "tokens", COUNT),
        ("num_running", "Running requests", "requests", COUNT),
        ("num_waiting", "Waiting requests", "requests", COUNT),
    ),
    "KV cache": (
        ("block_usage", "KV blocks used (share of the pool)", "share of pool", SHARE),
        ("kv_mib", "KV memory used (MiB)", "MiB", AMOUNT),
        ("fragmentation", "Fragmentation (unused slots in used blocks)", "share of used slots", SHARE),
        ("static_x_pool", "A static max-length reservation, in times the pool", "x the pool", TIMES),
    ),
    "Device memory": (("device_mib", "Device memory used (NVML, MiB)", "MiB", AMOUNT),),  # GPU runs only
}
STEP_TIME = ("step_ms", "Step time (ms)", "ms", AMOUNT)

ALIGN_JS = """
const by_time = align.active == 1, key = by_time ? "t" : "step";
for (const s of sources) s.data = Object.assign({}, s.data, {x: s.data[key]});
const [lo, hi] = by_time ? [0, t_max] : [step_min, step_max];
xr.start = lo; xr.end = hi; xr.reset_start = lo; xr.reset_end = hi;
for (const a of axes) { a.axis_label = by_time ? "seconds since the run started" : "step";
                        a.ticker.min_interval = by_time ? 0 : 1; }  // whole steps; seconds in any fraction
if (slider !== null) {
  slider.title = by_time ? "replay time (s)" : "replay step";
  slider.start = lo; slider.end = hi; slider.step = by_time ? Math.max(t_max / 400, 1e-6) : 1;
  slider.value = hi;
}
"""

TOGGLE_JS = """
for (let i = 0; i < renderers.length; i++) for (const r of renderers[i]) r.visible = toggle.active.includes(i);
"""

# Before replay.REPLAY_JS: the step to show (by time: the last one that ended by the slider's time),
# handed over as the ``slider.value`` that REPLAY_JS reads.
REPLAY_PRELUDE_JS = """
let target = ctl.value;
if (align.active == 1) { target = hist.step.length ? hist.step[0] : 0;
  for (let j = 0; j < hist.t.length; j++) if (hist.t[j] <= ctl.value) target = hist.step[j]; }
const slider = {value: target};
"""


# ---- time series and distributions ------------------------------------------------------------------
def series_columns(run, label: str) -> dict[str, list]:
    """Per step of ``run``: step, t (seconds from the run's first arrival), and every SERIES column."""
    steps = run.steps
    requests = run.requests
    origin = float(np.nanmin([requests["queued_s"].min() if len(requests) else math.nan, steps["t_start_s"].iloc[0]]))
    pool = run.meta.get("kv_pool_bytes") or run.meta.get("num_blocks", 0) * run.meta.get("kv_bytes_per_block", 0)
    nan = np.full(len(steps), math.nan)
    cols = {
        "step": steps["step"].to_numpy(), "t": (steps["t_end_s"] - origin).to_numpy(),
        "output_tokens": steps["num_output_tokens"].cumsum().to_numpy(), "num_tokens": steps["num_tokens"].to_numpy(),
        "num_running": steps["num_running"].to_numpy(), "num_waiting": steps["num_waiting"].to_numpy(),
        "block_usage": steps["kv_block_usage"].to_numpy(), "kv_mib": (steps["kv_paged_bytes"] / MiB).to_numpy(),
        "fragmentation": steps["kv_fragmentation"].to_numpy(),
        "static_x_pool": (steps["kv_static_reservation_bytes"] / pool).to_numpy() if pool else nan,
        "device_mib": (steps["mem_device_used_bytes"] / MiB).to_numpy() if "mem_device_used_bytes" in steps else nan,
        "step_ms": (steps["duration_s"] * 1e3).to_numpy(),
    }
    cols["x"] = cols["step"]
    cols["run"] = [label] * len(steps)
    return {k: list(v) if k == "run" else np.asarray(v, dtype=float) for k, v in cols.items()}


def ecdf(samples_s) -> dict[str, list[float]]:
    """Sorted samples in ms and the share of samples at or below each."""
    values = np.sort(np.asarray(samples_s, dtype=float) * 1e3)
    values = values[~np.isnan(values)]
    return {"x": values.tolist(), "y": (np.arange(1, len(values) + 1) / max(len(values), 1)).tolist()}


class _Builder:
    """Builds the page, keeping what the switch and the toggles drive."""

    def __init__(self, cmp: Compared) -> None:
        self.cmp = cmp
        self.sources = [ColumnDataSource(series_columns(r, label), name=f"compare-series-{i}")
                        for i, (r, label) in enumerate(zip(cmp.runs, cmp.labels))]
        self.renderers: list[list] = [[] for _ in cmp.runs]  # per run, for the toggles
        self.x_range = Range1d(*self.step_span, name="compare-x-range")
        self.axes: list = []

    @property
    def step_span(self) -> tuple[float, float]:
        return (min(float(s.data["step"][0]) for s in self.sources),
                max(float(s.data["step"][-1]) for s in self.sources))

    @property
    def t_max(self) -> float:
        return max(float(np.nanmax(s.data["t"])) for s in self.sources)

    def series_figure(self, key: str, title: str, y_label: str, fmt: str):
        if all(np.isnan(s.data[key]).all() for s in self.sources):
            return None  # a probe no run has (NVML on a CPU)
        fig = new_figure(title, x_range=self.x_range, x_axis_label="step", y_axis_label=y_label)
        lines = []
        for i, source in enumerate(self.sources):
            line = fig.line("x", key, source=source, color=run_color(i), line_width=2, alpha=0.85)
            self.renderers[i].append(line)
            lines.append(line)
        fig.y_range.renderers = lines
        fig.y_range.start = 0
        format_axis(fig.yaxis[0], fmt)
        fig.xaxis[0].formatter = tick_formatter(AMOUNT)  # whole steps, or seconds (ALIGN_JS)
        add_hover(fig, [("run", "@run"), ("step", "@step"), ("time", "@t{0.000} s"), (y_label, hover_value(key, fmt))],
                  mode="vline", renderers=lines)
        self.axes.append(fig.xaxis[0])
        return fig

    def ecdf_figure(self, title: str, samples: list, width: int):
        fig = new_figure(title, width=width, x_axis_label="ms", y_axis_label="share at or below",
                         y_range=Range1d(0, 1.02))
        fig.yaxis[0].formatter = tick_formatter(SHARE)
        lines = []
        for i, (label, values) in enumerate(zip(self.cmp.labels, samples)):
            data = ecdf(values)
            data["run"] = [label] * len(data["x"])
            line = fig.step("x", "y", source=ColumnDataSource(data), mode="after", color=run_color(i), line_width=2)
            self.renderers[i].append(line)
            lines.append(line)
        add_hover(fig, [("run", "@run"), ("latency", "@x{0,0.00} ms"), ("share at or below", "@y{0.0%}")],
                  renderers=lines)
        return fig

    def page_maps(self, align: RadioButtonGroup):
        cmp = self.cmp
        n = len(cmp.runs)
        width = HALF_WIDTH if n <= 2 else max(FULL_WIDTH // min(n, 3) - 5, 240)
        cells, hists = [], []
        for i, (run, label) in enumerate(zip(cmp.runs, cmp.labels)):
            panel = PageMapPanel(width=width, height=HEIGHT if n <= 2 else 220)
            panel.update(Tick(list(run.records), [], final=True))
            panel.source.name = f"compare-page-map-{i}"
            panel.figure.title.text = f"{label}: {panel.num_blocks} blocks x {panel.block_size} tokens"
            panel.figure.title.text_color = run_color(i)
            hist = page_map_history(run, panel)
            times = dict(zip(self.sources[i].data["step"].tolist(), self.sources[i].data["t"].tolist()))
            hist["t"] = [times.get(step, 0.0) for step in hist["step"]]
            steps = hist["step"]
            text = caption("page map", steps[-1], panel.entries) if steps else "no page map recorded"
            status = Div(text=text, width=width, name=f"compare-page-map-label-{i}")
            cells.append(column(panel.model, status))
            hists.append((hist, panel, status))
        lo, hi = self.step_span
        slider = None
        if hi > lo:
            slider = Slider(start=lo, end=hi, value=hi, step=1, title="replay step", width=FULL_WIDTH // 2,
                            name="compare-slider")
            for hist, panel, status in hists:
                slider.js_on_change("value", CustomJS(
                    args={"hist": hist, "source": panel.source, "ctl": slider, "align": align, "label": status,
                          "block_size": panel.block_size, "group": panel.group, "num_blocks": panel.num_blocks},
                    code=REPLAY_PRELUDE_JS + "{\n" + REPLAY_JS + "\n}"))
        per_row = 2 if n <= 2 else 3
        grid = [row(*cells[k:k + per_row]) for k in range(0, len(cells), per_row)]
        return slider, grid


def _heading(text: str) -> Div:
    return Div(text=f"<h3 style='font-family:sans-serif;margin:10px 0 0 0'>{html.escape(text)}</h3>", width=FULL_WIDTH)


def _pairs(figures: list) -> list:
    return [row(*figures[k:k + 2]) for k in range(0, len(figures), 2)]


def build_comparison(cmp: Compared):
    """The comparison's Bokeh layout."""
    b = _Builder(cmp)
    align = RadioButtonGroup(labels=["align by step", "align by time"], active=0, name="compare-align")
    toggle = CheckboxButtonGroup(labels=list(cmp.labels), active=list(range(len(cmp.runs))), name="compare-runs")
    parts = [Div(text=header_html(cmp), width=FULL_WIDTH, name="compare-header"),
             Div(text=summary_html(cmp), width=FULL_WIDTH, name="compare-summary"),
             row(align, Div(text="<span style='font-family:sans-serif'>show runs:</span>"), toggle)]
    for section, specs in SERIES.items():
        figures = [f for f in (b.series_figure(*spec) for spec in specs) if f is not None]
        if figures:
            parts += [_heading(section), *_pairs(figures)]
    third = FULL_WIDTH // 3 - 4
    step_fig = b.series_figure(*STEP_TIME)
    step_fig.width = third
    ttft = b.ecdf_figure("TTFT distribution", [r.requests["ttft_s"].dropna().tolist() for r in cmp.runs], third)
    itl = b.ecdf_figure("ITL distribution", [all_itls(r.records).tolist() for r in cmp.runs], third)
    parts += [_heading("Latency"), row(step_fig, ttft, itl)]
    slider, maps = b.page_maps(align)
    parts += [_heading("KV page maps"), *([slider] if slider is not None else []), *maps]
    lo, hi = b.step_span
    align.js_on_change("active", CustomJS(
        args={"align": align, "sources": b.sources, "xr": b.x_range, "axes": b.axes, "slider": slider,
              "t_max": b.t_max, "step_min": lo, "step_max": hi},
        code=ALIGN_JS))
    toggle.js_on_change("active", CustomJS(args={"toggle": toggle, "renderers": b.renderers}, code=TOGGLE_JS))
    return column(*parts)


def save_html(cmp: Compared, path: str | os.PathLike) -> Path:
    """Write the comparison of ``cmp`` to ``path`` atomically; returns the path."""
    page = file_html(build_comparison(cmp), resources=INLINE, title="kvscope comparison · " + " vs ".join(cmp.labels))
    return atomic_write(path, lambda f: f.write(page))


def show(cmp: Compared) -> None:
    """Display the comparison in a notebook (BokehJS inline, so it works offline)."""
    from IPython.display import display
    from jupyter_bokeh import BokehModel

    from .bokehjs import ensure_bokehjs

    ensure_bokehjs()
    display(BokehModel(build_comparison(cmp)))
