"""The comparison page (``widgets/compare.py``) in a real browser: headless Chromium, network blocked.

Every plot must render with no console error, the step / time switch must re-align every series and
the replay slider, the slider must replay each run's page map (checked against ``Run.page_map_at``),
the run toggles must hide a run's lines, and a hostile label must show as text. Screenshots are kept
in ``artifacts/``.
"""

from __future__ import annotations

import re

import pytest
from bokeh.plotting import figure
from widget_util import COUNT_CANVASES_JS, COUNT_VIEWS_JS

from kvscope import Engine
from kvscope.runs.result.comparison import compare
from kvscope.runs.result.run import Run
from kvscope.runs.workload.items import synthetic_workload
from kvscope.widgets.compare import build_comparison

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

HOSTILE = '<img src=x onerror="window.__kvscope_xss = 1">'

DATA_JS = """([name, field]) => [...Bokeh.documents[0].get_model_by_name(name).data[field]]"""
MODEL_JS = """([name, attr]) => Bokeh.documents[0].get_model_by_name(name)[attr]"""
HIDDEN_JS = """(name) => [...Bokeh.index.all_views()].filter(v => v.model.data_source !== undefined &&
  v.model.data_source.name == name).map(v => v.model.visible)"""


def _run(block_size: int, requests: int) -> Run:
    engine = Engine("tiny", num_blocks=192 // block_size, block_size=block_size, max_num_seqs=4,
                    max_num_batched_tokens=64)
    for item in synthetic_workload(requests, (12, 40), (4, 16), vocab_size=engine.spec.vocab_size,
                                   shared_prefix_len=16, exclude_ids=engine.eos_token_ids):
        engine.add_request(item.prompt, item.params)
    while engine.has_unfinished_requests():
        engine.step()
    return Run.from_engine(engine)


@pytest.fixture(scope="module")
def comparison():
    return compare(_run(8, 8), _run(16, 8), _run(16, 5), labels=["block 8", "block 16", HOSTILE])


@pytest.fixture(scope="module")
def page_path(comparison, tmp_path_factory):
    return comparison.save_html(tmp_path_factory.mktemp("compare") / "cmp.html")


def _open(page, path, num_figures):
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function(f"() => ({COUNT_VIEWS_JS})('Figure') >= {num_figures}", timeout=30_000)
    page.wait_for_timeout(500)  # let the canvases paint


def _num_figures(comparison) -> int:
    return sum(isinstance(m, figure) for m in build_comparison(comparison).references())


def _press(page, key: str, times: int = 1):
    handle = page.locator(".noUi-handle").first
    handle.focus()
    for _ in range(times):
        page.keyboard.press(key)
    page.wait_for_timeout(300)


def _shown_steps(page, n: int) -> list[int]:
    texts = [page.evaluate(MODEL_JS, [f"compare-page-map-label-{i}", "text"]) for i in range(n)]
    return [int(re.match(r"page map after step (\d+)", t).group(1)) for t in texts]


def test_every_plot_renders_offline(page, comparison, page_path, artifacts):
    html = page_path.read_text(encoding="utf-8")
    assert "cdn.bokeh.org" not in html and "<script src=" not in html  # BokehJS is inlined
    n = _num_figures(comparison)
    assert n >= 12  # 8+ series, step time, two distributions, a page map per run
    _open(page, page_path, n)
    assert page.evaluate(COUNT_VIEWS_JS, "Figure") == n
    assert page.evaluate(COUNT_VIEWS_JS, "Slider") == 1
    assert page.evaluate(COUNT_CANVASES_JS) >= n
    assert page.get_by_text("not like for like").count() == 1
    assert page.get_by_text("different workloads").count() == 1
    assert page.get_by_text("throughput (output tokens/s)").count() == 1
    page.screenshot(path=str(artifacts / "compare.png"), full_page=True)
    log = page.kvscope_log
    assert log["blocked"] == [], f"the page tried to reach the network: {log['blocked']}"
    assert log["errors"] == [] and log["dialogs"] == []


def test_a_hostile_label_shows_as_text(page, comparison, page_path):
    _open(page, page_path, _num_figures(comparison))
    assert page.get_by_text(HOSTILE).count() >= 2  # the header and the table's column
    assert page.evaluate("() => window.__kvscope_xss") is None
    assert page.kvscope_log["dialogs"] == []


def test_the_slider_replays_every_page_map(page, comparison, page_path, artifacts):
    _open(page, page_path, _num_figures(comparison))
    n = len(comparison.runs)
    lasts = [r.records[-1].step for r in comparison.runs]
    assert _shown_steps(page, n) == lasts
    _press(page, "Home")
    _press(page, "ArrowRight", 6)
    step = page.evaluate(MODEL_JS, ["compare-slider", "value"])
    assert step == 6
    for i, run in enumerate(comparison.runs):
        shown = page.evaluate(DATA_JS, [f"compare-page-map-{i}", "state"])
        assert shown == [e.state for e in run.page_map_at(min(step, lasts[i]))], f"run {i}"
        assert "used" in shown  # mid-run: blocks are held
    assert _shown_steps(page, n) == [min(step, last) for last in lasts]
    page.screenshot(path=str(artifacts / "compare_page_maps.png"), full_page=True)


def test_align_by_time_switches_series_and_slider(page, comparison, page_path):
    _open(page, page_path, _num_figures(comparison))
    page.get_by_text("align by time").click()
    page.wait_for_timeout(300)
    for i in range(len(comparison.runs)):
        series = f"compare-series-{i}"
        assert page.evaluate(DATA_JS, [series, "x"]) == page.evaluate(DATA_JS, [series, "t"])
    t_max = max(max(page.evaluate(DATA_JS, [f"compare-series-{i}", "t"])) for i in range(len(comparison.runs)))
    assert page.evaluate(MODEL_JS, ["compare-x-range", "end"]) == pytest.approx(t_max)
    assert page.evaluate(MODEL_JS, ["compare-slider", "title"]) == "replay time (s)"
    _press(page, "Home")
    _press(page, "ArrowRight", 40)
    steps = _shown_steps(page, len(comparison.runs))
    for i, (run, step) in enumerate(zip(comparison.runs, steps)):
        assert page.evaluate(DATA_JS, [f"compare-page-map-{i}", "state"]) == [e.state for e in run.page_map_at(step)]
    assert steps != [r.records[-1].step for r in comparison.runs]
    page.get_by_text("align by step").click()
    page.wait_for_timeout(300)
    assert page.evaluate(DATA_JS, ["compare-series-0", "x"]) == page.evaluate(DATA_JS, ["compare-series-0", "step"])
    assert page.evaluate(MODEL_JS, ["compare-slider", "title"]) == "replay step"
    assert page.kvscope_log["errors"] == []


def test_a_run_toggle_hides_its_lines(page, comparison, page_path):
    _open(page, page_path, _num_figures(comparison))
    assert all(page.evaluate(HIDDEN_JS, "compare-series-0"))
    page.locator(".bk-btn", has_text="block 8").first.click()
    page.wait_for_timeout(300)
    hidden = page.evaluate(HIDDEN_JS, "compare-series-0")
    assert hidden and not any(hidden)
    assert all(page.evaluate(HIDDEN_JS, "compare-series-1"))
