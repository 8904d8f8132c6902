"""The end of a run shows the run (issue 26, items 3 and 7): the tiles of a finished run show its peaks
and totals and say so, the page map has a key of its cells' looks and its caption counts blocks, a
finished live dashboard offers the page-map replay slider; the memory legend leaves out probes without
data, and one far-out latency goes to an overflow bar instead of squeezing the histogram."""

from __future__ import annotations

import re

import ipywidgets as w
import numpy as np
import pytest
from bokeh.models import Div, Legend
from bokeh.plotting import figure

from kvscope import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload
from kvscope.widgets.feed import Feed
from kvscope.widgets.panels.latency import OVERFLOW_COLOR, histogram, overflow_cap
from kvscope.widgets.panels.memory import MemoryPanel
from kvscope.widgets.panels.page_cells import STATE_LEGEND
from kvscope.widgets.panels.registry import apply_tick, build_panels
from kvscope.widgets.report import build_report
from kvscope.widgets.stats import LatencyStats


def _tiles(text: str) -> dict[str, str]:
    """The KPI tiles, label -> value, from the panel's HTML."""
    return {label: value for value, label in re.findall(r"<div><b>(.*?)</b><span>(.*?)</span></div>", text)}


def test_a_finished_runs_tiles_show_its_peaks_and_totals(finished_run):
    stats = LatencyStats()
    panels = build_panels(stats, rollover=None)
    feed = Feed.of(finished_run.records, finished_run.events)
    apply_tick(panels, stats, feed.poll())  # as a live tick: the last step
    kpi = panels[0]
    live = _tiles(kpi.div.text)
    assert "running / waiting" in live and "KV blocks used" in live and "step" in live
    apply_tick(panels, stats, feed.poll(final=True))
    tiles = _tiles(kpi.div.text)
    records = finished_run.records
    summary = finished_run.summary()
    assert kpi.values["kv_usage"] == 0.0 and records[-1].kv.blocks_used == 0  # the last step: all freed
    assert tiles["peak KV blocks used"] == f"{summary['peak_block_usage']:.1%}" != "0.0%"
    peak_waiting = max(r.num_waiting for r in records)
    assert tiles["peak running / waiting"] == f"{summary['peak_running']} / {peak_waiting}" != "0 / 0"
    assert tiles["steps"] == f"{len(records)}" and "step" not in tiles and "running / waiting" not in tiles


def test_the_page_map_has_a_key_and_its_caption_counts_blocks(finished_run):
    layout = build_report(finished_run)
    (label,) = layout.select({"type": Div, "name": "page-map-label"})
    last = finished_run.records[-1].step
    entries = finished_run.page_map_at(last)
    cached = sum(e.state == "cached" for e in entries)
    assert cached > 0  # the end of this run: nothing held, blocks kept for the prefix cache
    assert label.text == f"page map after step {last}: 0 blocks used, {cached} cached"
    (legend,) = next(f for f in layout.select({"type": figure}) if f.title.text == "KV page map").select(type=Legend)
    assert [item.label.value for item in legend.items] == [label for label, _, _ in STATE_LEGEND]
    assert "cached" in legend.items[1].label.value and legend.items[0].label.value == "free"


def test_a_finished_live_dashboard_offers_the_page_map_replay():
    engine = Engine("tiny", num_blocks=32, block_size=8, max_num_seqs=4)
    items = synthetic_workload(5, (8, 30), (12, 12), vocab_size=512, exclude_ids=[0, 1, 2], seed=3)
    run = LiveRun(engine, items, dashboard_options={"refresh_hz": 10.0})
    dash = run.dashboard
    header = dash.widget.children[0]  # the widgets, as a notebook shows them
    assert not [c for c in header.children if isinstance(c, w.IntSlider)]  # no replay while it runs
    run.start().wait(timeout=90)
    (slider,) = [c for c in header.children if isinstance(c, w.IntSlider)]
    assert header.children[-1] is dash.view.status and slider.max == run.run.records[-1].step
    middle = next(r.step for r in run.run.records if any(e.state == "used" for e in r.page_map.values()))
    slider.value = middle  # what a drag in the browser runs on the kernel
    shown = dash.panel["page_map"].source.data["state"]
    assert list(shown) == [e.state for e in run.run.page_map_at(middle)] and "used" in shown
    dash.close()


def test_the_memory_legend_leaves_out_probes_without_data(finished_run):
    panel = MemoryPanel(rollover=None)
    records = finished_run.records
    assert all("device_used_bytes" not in r.memory and "torch_allocated_bytes" not in r.memory for r in records)
    panel.update(Feed.of(records[:5], []).poll())
    (legend,) = panel.figure.select(type=Legend)
    shown = [item.label.value for item in legend.items if item.visible]
    assert "device used (NVML)" not in shown and "other allocator" not in shown  # a CPU has neither
    assert {"weights", "KV used", "KV free", "host RSS (right axis)"} <= set(shown) and panel.rss_axis.visible
    gpu = records[5]
    gpu.memory.update(device_used_bytes=2 << 30, torch_allocated_bytes=3 << 30, weights_bytes=1 << 30)
    try:
        panel.update(Feed.of([gpu], []).poll())
    finally:
        for key in ("device_used_bytes", "torch_allocated_bytes", "weights_bytes"):
            gpu.memory.pop(key)
    assert all(item.visible for item in legend.items)


def test_one_far_out_latency_goes_to_an_overflow_bar():
    samples = [0.020 + 0.001 * (i % 7) for i in range(200)] + [8.0]  # ITLs of ~20 ms and one 8 s stall
    cap = overflow_cap(np.asarray(samples) * 1e3)
    assert cap == pytest.approx(26.0)  # the axis ends at the largest of the bulk
    data = histogram(samples)
    assert data["color"][-1] == OVERFLOW_COLOR and data["count"][-1] == 1 and "8,000.00 ms" in data["label"][-1]
    bulk = data["count"][:-1]
    assert sum(bulk) == 200 and max(data["right"][:-1]) == pytest.approx(cap)
    assert sum(1 for c in bulk if c) >= 5  # the 20 ms samples spread over bars, not one
    spread = histogram([0.05 * i for i in range(1, 60)])  # a long, even tail is not an outlier
    assert OVERFLOW_COLOR not in spread["color"] and overflow_cap(np.asarray([10.0])) is None
