"""A P/D run's report: the request lanes (queue, prefill, transfer, decode, each on its instance) above the
decode side's timeline, and the instances' page maps side by side with the blocks in flight marked; a slider
over the transfers swaps every map and its marks, in the browser too (screenshot: artifacts/pd_report.png)."""

from __future__ import annotations

import json
import random

import pytest
from bokeh.models import ColumnDataSource, CustomJS, GroupFilter, Slider
from bokeh.plotting import figure

from kvscope import PDEngine, Run, SamplingParams
from kvscope.telemetry.pd_lanes import LANE_STATES
from kvscope.widgets.panels.pd_page_maps import PDPageMapsPanel
from kvscope.widgets.panels.pd_timeline import LANE_COLORS
from kvscope.widgets.panels.registry import build_panels
from kvscope.widgets.report import build_report
from kvscope.widgets.stats import LatencyStats

pytestmark = pytest.mark.timeout(240)
DATA_JS = """(name) => {
  const m = Bokeh.documents[0].get_model_by_name(name);
  return m.data !== undefined ? Object.fromEntries(Object.entries(m.data).map(([k, v]) => [k, [...v]])) : m.value;
}"""
VIEWS_JS = """(type) => [...Bokeh.index.all_views()].filter(v => v.model.type == type).length"""


@pytest.fixture(scope="module")
def run() -> Run:
    rng = random.Random(10)
    prompts = [[rng.randrange(5, 250) for _ in range(rng.randrange(9, 40))] for _ in range(6)]
    with PDEngine("tiny", pd="1P1D", block_size=4, num_blocks=64) as engine:
        engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
        return Run.from_engine(engine)


def _named(layout, name: str):
    (model,) = layout.select({"name": name})
    return model


def test_the_report_has_each_requests_lane_on_its_instances(run):
    layout = build_report(run)
    lanes = _named(layout, "pd-request-lanes")
    assert isinstance(lanes, figure)
    groups = {r.view.filter.group: r for r in lanes.renderers if isinstance(r.view.filter, GroupFilter)}
    assert list(groups) == list(LANE_STATES)
    assert all(r.glyph.fill_color == LANE_COLORS[s] for s, r in groups.items())
    data = next(iter(groups.values())).data_source.data
    requests = {r["request_id"]: r for r in run.meta["pd"]["requests"]}
    assert set(data["request"]) == set(requests)
    for rid, state, instance, left, right in zip(data["request"], data["state"], data["instance"], data["left"],
                                                data["right"]):
        assert left <= right
        r = requests[rid]
        other = f"{r['prefill']} -> {r['decode']}" if state == "transfer" else instance
        expected = {"queue": r["prefill"], "prefill": r["prefill"], "decode queue": r["decode"],
                    "decode": r["decode"]}.get(state, other)
        assert instance == expected
    transfer_rows = [i for i, s in enumerate(data["state"]) if s == "transfer"]
    assert len(transfer_rows) == 6 and all(data["blocks"][i] > 0 and data["bytes"][i] > 0 for i in transfer_rows)


def test_one_page_map_per_instance_with_blocks_in_flight(run):
    layout = build_report(run)
    maps = run.meta["pd"]["page_maps"]
    for name, pool in maps["pools"].items():
        cells = _named(layout, f"pd-page-map-{name}-cells")
        assert isinstance(cells, ColumnDataSource) and len(cells.data["block"]) == pool["num_blocks"]
        assert isinstance(_named(layout, f"pd-page-map-{name}-in-flight"), ColumnDataSource)
    (slider,) = [s for s in layout.select({"type": Slider}) if s.title == "moment"]
    (callback,) = slider.js_property_callbacks["change:value"]
    assert isinstance(callback, CustomJS)
    moments = json.loads(callback.args["moments_json"])
    assert len(moments) == len(maps["moments"]) == slider.end + 1 == len(run.meta["pd"]["transfers"]) + 1
    names = list(maps["pools"])
    for shown, recorded in zip(moments, maps["moments"]):
        for name, data in zip(names, shown["maps"]):
            m = recorded["maps"][name]
            assert data["marks"]["block"] == m["in_flight"]
            states = data["cells"]["state"]
            assert sum(s != "free" for s in states) == len(m["blocks"])
            assert all(states[b] != "free" for b in m["in_flight"])
    first = slider.value  # the first moment with blocks in flight is shown at first
    marks = _named(layout, "pd-page-map-decode-0-in-flight")
    assert marks.data["block"] == maps["moments"][first]["maps"]["decode-0"]["in_flight"] != []


def test_the_panel_waits_for_the_maps_and_is_only_built_for_pd_runs(run):
    panel = PDPageMapsPanel({"pd": {"layout": "1P1D"}})  # a live P/D run: no maps until its end
    from kvscope.widgets.feed import Tick

    panel.update(Tick([], []))
    assert not panel.model.visible and not panel.maps
    names = [p.name for p in build_panels(LatencyStats(), None, {"model": "m"})]
    assert "pd_page_maps" not in names
    assert "pd_page_maps" in [p.name for p in build_panels(LatencyStats(), None, dict(run.meta))]


@pytest.mark.browser
def test_the_pd_report_in_chromium(page, run, tmp_path, artifacts):
    path = run.save_html(tmp_path / "pd.html")
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function(f"() => ({VIEWS_JS})('Figure') >= 3", timeout=30_000)
    page.wait_for_timeout(500)
    maps = run.meta["pd"]["page_maps"]["moments"]
    shown = next(i for i, m in enumerate(maps) if m["maps"]["decode-0"]["in_flight"])
    marks = page.evaluate(DATA_JS, "pd-page-map-decode-0-in-flight")
    assert marks["block"] == maps[shown]["maps"]["decode-0"]["in_flight"]
    page.evaluate("""() => { const s = Bokeh.documents[0].get_model_by_name("pd-moment"); s.value = s.end; }""")
    page.wait_for_timeout(300)
    assert page.evaluate(DATA_JS, "pd-page-map-decode-0-in-flight")["block"] == []  # the end: nothing in flight
    assert page.get_by_text("end of the run").count() >= 1
    page.evaluate("""(i) => { Bokeh.documents[0].get_model_by_name("pd-moment").value = i; }""", shown)
    page.wait_for_timeout(300)
    page.screenshot(path=str(artifacts / "pd_report.png"), full_page=True)
    log = page.kvscope_log
    assert log["blocked"] == [] and log["errors"] == [] and log["dialogs"] == []
