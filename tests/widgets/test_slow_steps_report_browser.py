"""The slow-steps panel of a run with ``--capture-slow`` in a real browser (headless Chromium, network blocked):
it renders beside the other panels, its legend stays off the data, and a screenshot of the spike, its marker
and its window is kept in ``artifacts/report_slow_steps.png`` for people to look at."""

from __future__ import annotations

import pytest
from test_report_browser import FIGURE_BOX_JS, LAYOUT_JS
from widget_util import COUNT_VIEWS_JS

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]
TITLE = "Slow steps and their profiler windows"
SCROLL_TO_JS = """(title) => [...Bokeh.index.all_views()]
  .find(v => v.model.type == "Figure" && v.model.title.text == title).el.scrollIntoView({block: "center"})"""


@pytest.fixture(scope="module")
def captured_report(tmp_path_factory):
    """A tiny-model run whose 40th forward sleeps 150 ms, with ``--capture-slow 3``; its report."""
    from slow_forward import slow_once

    from kvscope import Engine
    from kvscope.runs.background.live import LiveRun
    from kvscope.runs.workload.items import synthetic_workload

    engine = slow_once(Engine("tiny", num_blocks=64), at=40, seconds=0.15)
    items = synthetic_workload(4, (8, 32), (60, 60), vocab_size=512, exclude_ids=[0, 1, 2], seed=5)
    run = LiveRun(engine, items, capture_slow=(3, 4), dashboard=False).start().wait(timeout=120)
    assert run.error is None and run.meta["capture_slow"]["num_triggered"] >= 1
    path = tmp_path_factory.mktemp("slow") / "run.html"
    run.save_html(path)
    return path, run.meta["capture_slow"]


def test_the_panel_renders_with_its_window(page, captured_report, artifacts):
    path, capture = captured_report
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function(f"() => ({COUNT_VIEWS_JS})('Figure') >= 9", timeout=30_000)
    page.wait_for_timeout(500)
    figures = {f["title"]: f for f in page.evaluate(LAYOUT_JS)}
    assert TITLE in figures
    fig = figures[TITLE]
    assert fig["legends"] and all(legend["top"] >= fig["frame"]["bottom"] for legend in fig["legends"])
    w = capture["windows"][0]
    assert f"steps {w['first_step']}-{w['last_step']} (after step {w['trigger_step']})" in page.content()
    page.evaluate(SCROLL_TO_JS, TITLE)  # the last row of the report: below the first screen
    page.wait_for_timeout(300)
    page.screenshot(clip=page.evaluate(FIGURE_BOX_JS, TITLE), path=str(artifacts / "report_slow_steps.png"))
    log = page.kvscope_log
    assert log["blocked"] == [] and log["errors"] == [] and log["dialogs"] == []
