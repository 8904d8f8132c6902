"""The watch's KV-transfer panel: hidden without a KV connector, then per engine its role, transfers and MB/s
over time, offloading and cached blocks by medium; the KPI tile, the fleet table's role column and the report."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "watched"))
from fakes import EngineMetrics, NixlMetrics, render, stored

from kvscope.runs.result.run import Run
from kvscope.watched.events import EventBatch, parse_event
from kvscope.watched.samples import parse
from kvscope.watched.source import WatchSource
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.base import PanelContext
from kvscope.widgets.panels.fleet import table_html
from kvscope.widgets.panels.kv_transfer import KvTransferPanel
from kvscope.widgets.panels.watch_kpi import WatchKpiPanel
from kvscope.widgets.stats import LatencyStats
from kvscope.widgets.watch_report import build_watch_report

S = 1_000_000_000


def pair(transfers: bool = True) -> tuple[WatchSource, dict]:
    src = WatchSource(["http://p:1", "http://d:2"], t0_ns=0)
    p = EngineMetrics(nixl=NixlMetrics() if transfers else None)
    d = EngineMetrics(nixl=NixlMetrics() if transfers else None, kv_fetch={} if transfers else None)
    meta = {"model": "vLLM", "source_kind": "kvscope watch", "t0_ns": 0, "watch": src.watch}
    for t in (1, 2, 3):
        if transfers and t > 1:
            d.nixl.xfer_time.append(0.02)
            d.nixl.bytes_transferred.append(4e6)
        src.on_scrape(0, parse(render({"0": p}), t * S).samples)
        src.on_scrape(1, parse(render({"0": d}), t * S).samples)
        src.on_events(1, EventBatch(0.0, [parse_event({**stored([t]), "medium": "CPU"})], 0), t * S)
        src.tick(t * S)
    return src, meta


def test_the_panel_shows_each_engines_role_transfers_and_media():
    src, meta = pair()
    panel = KvTransferPanel.create(PanelContext(LatencyStats(), None, meta))
    panel.update(Tick(final=True))
    assert panel.model.visible
    text = panel.table.text
    assert "kv_producer" in text and "kv_consumer" in text and "CPU 3" in text
    rates = panel.sources["d:2/0"].data["transfer_mb_per_s"]
    assert list(rates)[1:] == [4.0, 4.0]  # 4 MB per 1 s poll
    assert list(panel.sources["p:1/0"].data["transfer_mb_per_s"]) == [0.0, 0.0, 0.0]  # pull mode: the consumer's
    kpi = WatchKpiPanel.create(PanelContext(LatencyStats(), None, meta))
    kpi.update(Tick(final=True))
    assert kpi.values["kv_transfers"] == 2 and "KV transfers" in kpi.div.text
    assert "kv_consumer" in table_html(src.watch)
    report = build_watch_report(Run([], [], meta))
    assert "<b>KV transfers</b>" in report.children[0].text
    _, plain = pair(transfers=False)
    plain["watch"]["residency"] = {}
    assert len(report.children) == len(build_watch_report(Run([], [], plain)).children) + 1  # the panel


def test_the_panel_stays_hidden_without_a_connector():
    src, meta = pair(transfers=False)
    src.watch["residency"] = {}
    panel = KvTransferPanel.create(PanelContext(LatencyStats(), None, meta))
    panel.update(Tick(final=True))
    assert not panel.model.visible and panel.table.text == ""
    assert "<b>KV transfers</b>" not in build_watch_report(Run([], [], meta)).children[0].text
