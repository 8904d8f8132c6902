"""The watch report (``kvscope watch --html``) in headless Chromium, network blocked: every figure renders,
no legend covers its plot's data, hostile engine names and hashes show as text, and a screenshot is kept."""

from __future__ import annotations

import pytest
from test_watch_panels import Fleet, stored  # (it puts tests/watched, the fakes' folder, on the path)
from widget_util import COUNT_VIEWS_JS

from kvscope.runs.result.run import Run
from kvscope.widgets.watch_report import save_html

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

NUM_FIGURES = 2 + 2 + 3  # KV usage and tokens/s; the prefix tree and its flow; TTFT, ITL, end-to-end
HOSTILE = "<img src=x onerror=window.__kvscope_xss=1>"

LEGENDS_JS = """() => [...Bokeh.index.all_views()].filter(v => v.model.type == "Figure").map(v => {
  const box = (b) => ({left: b.left, top: b.top, right: b.right, bottom: b.bottom});
  const parts = [...v.renderer_views.values()];
  return {title: v.model.title.text, frame: box(v.frame.bbox),
          legends: parts.filter(p => p.model.type == "Legend").map(p => box(p.bbox))};
})"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    f = Fleet()
    f.poll()
    f.poll({0: [stored([1, 2, 3]), stored([4], parent=2)], 1: [stored([9])]}, prompt_tokens=128,
           generation_tokens=16, kv_usage=0.25, running=2, ttft=[0.015, 0.03], itl=[0.004] * 4)
    f.src.watch["model"] = HOSTILE
    f.poll(generation_tokens=4)
    meta = {**f.meta, "model": HOSTILE}
    return save_html(Run(f.records, f.events, meta), tmp_path_factory.mktemp("watch") / "watch.html")


def test_every_figure_renders_offline_and_no_legend_covers_data(page, report, artifacts):
    page.goto(report.as_uri())
    page.wait_for_function(f"() => window.Bokeh !== undefined && ({COUNT_VIEWS_JS})('Figure') >= {NUM_FIGURES}",
                           timeout=30_000)
    page.wait_for_timeout(500)
    assert page.evaluate(COUNT_VIEWS_JS, "Figure") == NUM_FIGURES
    figures = page.evaluate(LEGENDS_JS)
    for fig in figures:
        for legend in fig["legends"]:
            assert legend["top"] >= fig["frame"]["bottom"], f"{fig['title']}: the legend overlaps the plot area"
    assert sum(bool(f["legends"]) for f in figures) == 3  # KV usage, tokens/s, stored / evicted
    kpi = page.locator(".kvs-kpi").inner_text()
    assert "≈" in kpi and "blocks cached / ever stored" in kpi and HOSTILE in kpi  # shown as text
    assert page.evaluate("() => window.__kvscope_xss") is None
    page.screenshot(path=str(artifacts / "watch_report.png"), full_page=True)
    log = page.kvscope_log
    assert log["blocked"] == [] and log["errors"] == [] and log["dialogs"] == []
