"""The exported HTML report in a real browser: headless Chromium, network blocked.

Every panel must render, no legend may cover its plot's data, the static reservation must read in times
the pool, the step slider must replay the page map (checked against ``Run.page_map_at``), hostile
prompt text must show as text and run nothing, and a screenshot is kept in ``artifacts/`` for people
to look at.
"""

from __future__ import annotations

import pytest
from widget_util import COUNT_CANVASES_JS, COUNT_VIEWS_JS, XSS_PROMPTS

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

NUM_FIGURES = 10  # memory, page map, occupancy, batch, phases, TTFT, ITL, timeline, prefix misses, queue reasons

MODEL_DATA_JS = """(name) => {
  const m = Bokeh.documents[0].get_model_by_name(name);
  return m.data !== undefined ? {owner: [...m.data.owner], state: [...m.data.state]} : m.value;
}"""

FIGURE_BOX_JS = """(title) => {
  const view = [...Bokeh.index.all_views()].find(v => v.model.type == "Figure" && v.model.title.text == title);
  const r = view.el.getBoundingClientRect();
  return {x: r.x, y: r.y, width: r.width, height: r.height};
}"""

ELEMENTS_JS = """(tag) => {
  const found = [];
  const walk = (root) => root.querySelectorAll('*').forEach(e => {
    if (e.tagName == tag) found.push(e.outerHTML);
    if (e.shadowRoot) walk(e.shadowRoot);
  });
  walk(document);
  return found;
}"""


# Per figure as drawn: its plot area (frame), the boxes of its legends and the tick labels of its axes.
LAYOUT_JS = """() => [...Bokeh.index.all_views()].filter(v => v.model.type == "Figure").map(v => {
  const box = (b) => ({left: b.left, top: b.top, right: b.right, bottom: b.bottom});
  const parts = [...v.renderer_views.values()];
  return {
    title: v.model.title.text, frame: box(v.frame.bbox),
    legends: parts.filter(p => p.model.type == "Legend").map(p => box(p.bbox)),
    axes: parts.filter(p => p.model.type == "LinearAxis").map(p => ({
      label: p.model.axis_label, ticks: p.compute_labels(p.tick_coords.major[p.dimension]).items.map(t => t.text)})),
  };
})"""


@pytest.fixture(scope="module")
def report(finished_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "run.html"
    finished_run.save_html(path)
    return path


def _open(page, report):
    page.goto(report.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function(f"() => ({COUNT_VIEWS_JS})('Figure') >= {NUM_FIGURES}", timeout=30_000)
    page.wait_for_timeout(500)  # let the canvases paint


def test_every_panel_renders_offline(page, report, artifacts):
    html = report.read_text(encoding="utf-8")
    assert "cdn.bokeh.org" not in html and "<script src=" not in html  # BokehJS is inlined
    _open(page, report)
    assert page.evaluate(COUNT_VIEWS_JS, "Figure") == NUM_FIGURES
    assert page.evaluate(COUNT_VIEWS_JS, "DataTable") == 1
    assert page.evaluate(COUNT_VIEWS_JS, "Slider") == 1
    assert page.evaluate(COUNT_CANVASES_JS) >= NUM_FIGURES
    kpi = page.locator(".kvs-kpi").inner_text()
    assert "8 / 8" in kpi and "finished / requests" in kpi
    page.screenshot(path=str(artifacts / "report.png"), full_page=True)
    log = page.kvscope_log
    assert log["blocked"] == [], f"the report tried to reach the network: {log['blocked']}"
    assert log["errors"] == [] and log["dialogs"] == []


def test_no_legend_covers_data_and_the_static_reservation_reads_in_times_the_pool(page, report, artifacts):
    _open(page, report)
    figures = {f["title"]: f for f in page.evaluate(LAYOUT_JS)}
    with_legend = {t: f for t, f in figures.items() if f["legends"]}
    assert len(with_legend) == 6, sorted(with_legend)  # memory, page map (its key), occupancy, batch, phases, timeline
    for title, fig in with_legend.items():
        frame = fig["frame"]
        for legend in fig["legends"]:
            assert legend["right"] > legend["left"] and legend["bottom"] > legend["top"], title  # drawn
            assert legend["top"] >= frame["bottom"], f"{title}: the legend overlaps the plot area"
    occupancy = figures["KV occupancy vs. static reservation"]
    (static,) = [a for a in occupancy["axes"] if "x the pool" in a["label"]]
    assert static["ticks"] and all(t.endswith("x") for t in static["ticks"]), static
    assert max(float(t[:-1].replace(",", "")) for t in static["ticks"]) > 1  # this run's reservation exceeds the pool
    (share,) = [a for a in occupancy["axes"] if a["label"] == "share of KV pool"]
    assert share["ticks"][-1] == "100%" and not any("000%" in t for a in occupancy["axes"] for t in a["ticks"])
    page.screenshot(clip=page.evaluate(FIGURE_BOX_JS, "KV occupancy vs. static reservation"),
                    path=str(artifacts / "report_occupancy.png"))


def test_slider_replays_the_page_map(page, report, finished_run, artifacts):
    _open(page, report)
    last = page.evaluate(MODEL_DATA_JS, "page-map-slider")
    before = page.evaluate(MODEL_DATA_JS, "page-map-cells")
    box = page.evaluate(FIGURE_BOX_JS, "KV page map")
    shot_before = page.screenshot(clip=box)

    handle = page.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("Home")  # to the first step: a user's keypress, not a model write
    for _ in range(8):
        page.keyboard.press("ArrowRight")
    page.wait_for_timeout(300)
    step = page.evaluate(MODEL_DATA_JS, "page-map-slider")
    assert step != last
    after = page.evaluate(MODEL_DATA_JS, "page-map-cells")
    assert after != before, "the page map did not change"
    expected = finished_run.page_map_at(step)
    assert after["state"] == [e.state for e in expected]
    assert after["owner"] == [e.owner for e in expected]
    assert "used" in after["state"]  # mid-run: blocks are held
    assert page.get_by_text(f"page map after step {step}:").count() == 1  # the label under the map
    page.wait_for_timeout(300)
    assert page.screenshot(clip=box) != shot_before, "the page map's pixels did not change"
    page.screenshot(clip=box, path=str(artifacts / "report_page_map_replay.png"))


def test_hostile_prompts_show_as_text_and_run_nothing(page, report):
    _open(page, report)
    cells = page.locator(".slick-cell").all_inner_texts()
    for prompt in XSS_PROMPTS:
        assert prompt in cells, f"{prompt!r} is not shown as text"
    assert page.evaluate("() => window.__kvscope_xss") is None
    assert page.kvscope_log["dialogs"] == []
    images = page.evaluate(ELEMENTS_JS, "IMG")
    assert not [i for i in images if "onerror" in i]
    scripts = page.evaluate(ELEMENTS_JS, "SCRIPT")
    runnable = [s for s in scripts if 'type="application/json"' not in s]  # the data block is inert
    assert not [s for s in runnable if "__kvscope_xss" in s]
    raw = report.read_text(encoding="utf-8")
    assert "<script>window.__kvscope_xss" not in raw and "<img src=x" not in raw  # escaped in the file


def test_slider_replays_a_pool_drawn_in_runs_of_blocks(page, finished_run, tmp_path, monkeypatch):
    from kvscope.widgets.panels import page_map

    monkeypatch.setattr(page_map, "MAX_CELLS", 16)  # 40 blocks -> 14 cells of 3 blocks
    path = finished_run.save_html(tmp_path / "grouped.html")
    _open(page, path)
    page.locator(".noUi-handle").first.focus()
    page.keyboard.press("Home")
    for _ in range(12):
        page.keyboard.press("ArrowRight")
    page.wait_for_timeout(300)
    step = page.evaluate(MODEL_DATA_JS, "page-map-slider")
    shown = page.evaluate(MODEL_DATA_JS, "page-map-cells")
    expected = finished_run.page_map_at(step)
    cells = [page_map.merge_entries(expected[c * 3:c * 3 + 3]) for c in range(14)]
    assert shown["state"] == [e.state for e in cells] and shown["owner"] == [e.owner for e in cells]
