"""The watch's panels (prefix tree, fleet, KPIs, latency distributions) filled from a ``WatchSource``'s
description, live (growing) and final, and the watch report and dashboard built from a watched run."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "watched"))
from fakes import EngineMetrics, removed, render, stored

from kvscope.runs.result.run import Run
from kvscope.watched.events import EventBatch, parse_event
from kvscope.watched.samples import parse
from kvscope.watched.source import WatchSource
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.base import PanelContext
from kvscope.widgets.panels.fleet import FleetPanel
from kvscope.widgets.panels.prefix_tree import PrefixTreePanel, chain_color, icicle
from kvscope.widgets.panels.watch_kpi import WatchKpiPanel
from kvscope.widgets.panels.watch_latency import WatchLatencyPanel, bucket_bars
from kvscope.widgets.stats import LatencyStats
from kvscope.widgets.watch_dashboard import WatchDashboard
from kvscope.widgets.watch_report import build_watch_report, save_html

S = 1_000_000_000


class Fleet:
    """Two engines of one server with KV events, polled by hand."""

    def __init__(self, plugin: bool = False) -> None:
        self.src = WatchSource(["http://h:1"], t0_ns=0, plugin_records=plugin)
        self.engines = {"0": EngineMetrics(), "1": EngineMetrics()}
        self.t = 0
        self.records, self.events = [], []

    def poll(self, events: dict[int, list] | None = None, **changes) -> None:
        self.t += S
        for m in self.engines.values():
            for k, v in changes.items():
                setattr(m, k, getattr(m, k) + v if isinstance(v, (int, float)) else v)
        self.src.on_scrape(0, parse(render(self.engines), self.t).samples)
        for rank, evs in (events or {}).items():
            self.src.on_events(0, EventBatch(0.0, [parse_event(e) for e in evs], rank), self.t)
        records, events = self.src.tick(self.t, layout=True)
        self.records += records
        self.events += events

    @property
    def meta(self) -> dict:
        return {"watch": self.src.watch, "t0_ns": 0, "model": "tiny"}


@pytest.fixture
def fleet() -> Fleet:
    f = Fleet()
    f.poll()
    f.poll({0: [stored([1, 2, 3]), stored([4], parent=2)], 1: [stored([9])]}, prompt_tokens=128,
           generation_tokens=16, prefix_queries=128, prefix_hits=32, kv_usage=0.25, running=2,
           ttft=[0.015, 0.03], itl=[0.004] * 4)
    return f


def context(meta: dict) -> PanelContext:
    return PanelContext(LatencyStats(), None, meta)


def test_icicle_stacks_engines_and_spans_shared_prefixes(fleet):
    cols, labels = icicle(fleet.src.watch["residency"], 0)
    assert [label for label, _ in labels] == ["h:1/0", "h:1/1"]
    rows = {k: (x0, y0, y1, c) for k, x0, y0, y1, c in zip(cols["key"], cols["x0"], cols["y0"], cols["y1"],
                                                            cols["chains"])}
    assert rows["1"] == (0, 0, -2, 2) and rows["2"] == (1, 0, -2, 2)  # shared by two chains: spans two rows
    assert rows["3"][3] == rows["4"][3] == 1
    assert rows["9"][1] == -(2 + 2)  # engine 1's tree below engine 0's two rows and the gap
    assert cols["color"][cols["key"].index("1")] == chain_color(2) != chain_color(1)


def test_prefix_tree_panel_follows_stores_and_evictions(fleet):
    panel = PrefixTreePanel.create(context(fleet.meta))
    panel.update(Tick())
    assert sorted(panel.source.data["key"]) == ["1", "2", "3", "4", "9"]
    assert panel.flow.data["stored"] == [5] and panel.flow.data["cached"] == [5]
    assert "most shared: block 1 (tokens 1-32) × 2 chains" in panel.hot.text
    fleet.poll({0: [removed([3, 4])]})
    panel.update(Tick())
    assert sorted(panel.source.data["key"]) == ["1", "2", "9"]
    assert panel.flow.data["evicted"][-1] == -2 and panel.flow.data["cached"][-1] == 3


def test_fleet_panel_has_a_lane_per_engine_and_the_fleet(fleet):
    panel = FleetPanel.create(context(fleet.meta))
    panel.update(Tick())
    assert list(panel.sources) == ["h:1/0", "h:1/1"]
    assert panel.fleet.data["tokens_per_s"][-1] == pytest.approx(2 * (128 + 16))
    assert panel.sources["h:1/0"].data["kv_usage"][-1] == 0.25
    assert "h:1/1" in panel.table.text and ">ok<" in panel.table.text
    n = len(panel.fleet.data["t"])
    panel.update(Tick())  # nothing new: nothing streamed twice
    assert len(panel.fleet.data["t"]) == n
    fleet.src.on_scrape_error(0, "refused", 3 * S)
    fleet.src.tick(3 * S)
    panel.update(Tick())
    assert "connection lost" in panel.table.text


def test_kpis_mark_estimates(fleet):
    panel = WatchKpiPanel.create(context(fleet.meta))
    panel.update(Tick())
    v = panel.values
    assert (v["running"], v["kv_usage"], v["prefix_hit_rate"], v["blocks_cached"]) == (4, 0.25, 0.25, 5)
    assert v["generation_tokens_per_s"] == pytest.approx(32.0)
    assert "≈" in panel.div.text and "TTFT p50 / p99 (est., buckets)" in panel.div.text


def test_latency_bars_from_buckets(fleet):
    bars = bucket_bars([(0.01, 1.0), (0.02, 3.0), (0.04, 3.0), (0.08, 3.0), (float("inf"), 3.0)])
    assert bars == {"i": [0, 1, 2], "label": ["≤ 10 ms", "≤ 20 ms", "≤ 40 ms"], "count": [1.0, 2.0, 0.0]}
    panel = WatchLatencyPanel.create(context(fleet.meta))
    panel.update(Tick())
    assert sum(panel.sources["ttft"].data["count"]) == 4 and sum(panel.sources["itl"].data["count"]) == 8
    p50, p99 = panel.marks["ttft"]
    assert p50.visible and p99.visible and p50.location < p99.location


def test_watch_report_and_dashboard_of_a_plugin_run(tmp_path):
    f = Fleet(plugin=True)
    f.poll()
    t = f.src._unix0 + 1.5
    f.src.on_plugin(0, {"type": "step", "engine": 0, "t": t, "num_running_reqs": 1, "num_generation_tokens": 1,
                        "num_prompt_tokens": 40, "time_to_first_tokens_s": [0.02],
                        "finished": [{"request_id": "r1", "finish_reason": "stop", "num_prompt_tokens": 40,
                                      "num_generation_tokens": 1, "e2e_latency_s": 0.1}]})
    f.poll({0: [stored([1])]}, generation_tokens=1)
    run = Run(f.records, f.events, f.meta)
    layout = build_watch_report(run)
    assert len(layout.children) == 1 + 6 + 1  # header, the watch panels with the plugin's two, the requests
    path = save_html(run, tmp_path / "w.html")
    page = path.read_text()
    assert "kvscope watch" in page and "unknowable from outside" in page
    dash = WatchDashboard(meta=f.meta, headless=True)
    assert [p.name for p in dash.panels] == ["watch_kpi", "fleet", "kv_transfer", "prefix_tree", "watch_latency",
                                             "batch", "timeline"]
    dash.tick()  # no new records: the watch panels still update
    assert dash.panel["watch_kpi"].values["blocks_cached"] == 1
    assert dash.status_parts() == ["saved watch"]
