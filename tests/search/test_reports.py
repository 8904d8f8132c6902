"""The run reports behind a search's page (``kvscope.search.reports``): the front's points and the best re-run at
their goodput with telemetry on, their files beside the page (relative links from the points and the rows), loading
back with their settings; a configuration without a goodput gets none; the default is bounded."""

from __future__ import annotations

import html
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote

import pytest

import kvscope
from kvscope.search.goodput import Outcome
from kvscope.search.page import front
from kvscope.search.reports import chosen_for_reports, runs_folder, safe_name, write_reports
from kvscope.search.session import Search
from kvscope.search.space import SearchSpace
from tests.search.conftest import small_problem

# max_num_batched_tokens=16 prefills a 64-256-token prompt in 4-16 steps: over the TTFT threshold at any rate
SPACE = "max_num_batched_tokens=16,2048 max_num_seqs=4,64 replicas=1,2"


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    problem = small_problem(requests=20, slo="ttft_p99=0.1,itl_p99=0.03")
    result = Search(SearchSpace.parse(SPACE), problem, "sequential").run()
    page = tmp_path_factory.mktemp("search") / "s.html"
    result.save_html(page)
    return result, page


def _links(text: str) -> dict[str, str]:
    """The table's links (its HTML is a Bokeh Div's text: escaped inside the page's JSON): file name -> href."""
    text = html.unescape(text).replace('\\"', '"')
    return {name: href for href, name in re.findall(r'<a href="([^"]+)">([^<]+)</a>', text)}


def test_front_points_and_the_best_link_to_their_runs(searched):
    result, page = searched
    slo = result.search.problem.slo
    linked = {o.point.index for o in front(result.outcomes, slo)} | {result.best.point.index}
    text = page.read_text()
    hrefs = _links(text)
    assert len(linked) >= 2 and {name.split("_", 1)[0] for name in hrefs} == {f"{i:04d}" for i in linked}
    assert any(o.goodput > 0 and o.point.index not in linked for o in result.outcomes)  # off the front: no link
    for o in result.outcomes:
        if o.point.index not in linked:
            continue
        href = hrefs[safe_name(o) + ".html"]
        assert not href.startswith(("/", "file:")) and str(page.parent) not in href  # relative: the folder moves
        report = page.parent / unquote(href)
        assert report.is_file() and "kvscope" in report.read_text()[:5000]
        assert f'"{unquote(href)}"' in text  # the point's OpenURL target (TapTool)
        run = kvscope.load(report.with_name(safe_name(o) + ".metrics.jsonl"))
        assert run.meta["search"]["settings"] == dict(zip(o.point.keys, o.point.texts))
        assert run.meta["search"]["rate_rps"] == o.goodput
        assert run.meta["config"]["max_num_batched_tokens"] == o.point.get("max_num_batched_tokens")
        assert len(run.requests) == 20 and kvscope.load(report.with_name(safe_name(o) + ".trace.json")).meta
        ttft = sorted(run.requests["ttft_s"])  # the trial that held, recorded: the table's nearest-rank p99
        assert ttft[math.ceil(0.99 * len(ttft)) - 1] == pytest.approx(o.percentiles["ttft_p99"], abs=1e-9)
    assert "TapTool" in text and "OpenURL" in text


def test_a_configuration_without_goodput_has_no_report(searched):
    result, page = searched
    zero = [o for o in result.outcomes if o.goodput == 0]
    assert zero and all(o.error is None for o in zero)  # never met the SLO: a row, no point, no run
    names = {p.name for p in runs_folder(page).iterdir()}
    for o in zero:
        assert not any(n.startswith(safe_name(o)) for n in names)
        assert safe_name(o) not in page.read_text()


def test_links_resolve_after_the_page_and_its_folder_move(searched, tmp_path):
    _, page = searched
    moved = tmp_path / "elsewhere"
    shutil.copytree(page.parent, moved)
    for href in _links((moved / page.name).read_text()).values():
        assert (moved / unquote(href)).is_file()


def test_reports_are_deterministic(searched, tmp_path):
    result, page = searched
    o = result.best
    again = write_reports(result.search.problem, [o], tmp_path / "again.runs")
    first = kvscope.load(runs_folder(page) / (safe_name(o) + ".metrics.jsonl"))
    second = kvscope.load(again.files[o.point.index]["metrics"])
    assert first.summary() == second.summary() and len(first.records) == len(second.records)


def test_no_report_overwrites_an_input(searched, tmp_path):
    result, _ = searched
    o = result.best
    folder = tmp_path / "r.runs"
    folder.mkdir()
    victim = folder / (safe_name(o) + ".metrics.jsonl")
    victim.write_text("recorded run\n")
    problem = replace(result.search.problem, sim=replace(result.search.problem.sim, replay=str(victim)))
    with pytest.raises(ValueError, match="--replay"):
        write_reports(problem, [o], folder)
    assert victim.read_text() == "recorded run\n"


def _fake(index: int, goodput: float) -> Outcome:
    from kvscope.search.space import Point

    return Outcome(Point(index, ("max_num_seqs",), (index,), (str(index),)), goodput=goodput, num_gpus=1)


def test_which_configurations_get_a_report_is_bounded(monkeypatch):
    outcomes = [_fake(i, float(i)) for i in range(6)]  # 0: no goodput
    on_front, best = outcomes[2:], outcomes[5]
    picked, rule = chosen_for_reports(outcomes, on_front, best)
    assert [o.point.index for o in picked] == [2, 3, 4, 5] and "--reports all" in rule
    monkeypatch.setattr("kvscope.search.reports.MAX_FRONT", 2)
    picked, rule = chosen_for_reports(outcomes, on_front, best)
    assert [o.point.index for o in picked] == [4, 5] and "2 more front points have none" in rule
    assert [o.point.index for o in chosen_for_reports(outcomes, on_front, best, "all")[0]] == [1, 2, 3, 4, 5]
    assert chosen_for_reports(outcomes, on_front, best, "none")[0] == []
    with pytest.raises(ValueError, match="--reports"):
        chosen_for_reports(outcomes, on_front, best, "some")


def test_the_page_without_reports_links_nothing(searched, tmp_path):
    result, _ = searched
    page = result.save_html(tmp_path / "bare.html", reports="none")
    assert not _links(page.read_text()) and not runs_folder(page).exists()
    assert "no run reports were written" in page.read_text()


def test_safe_names_are_portable():
    o = _fake(7, 1.0)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", safe_name(o)) and Path(safe_name(o)).name == safe_name(o)


def test_clicking_a_point_or_a_row_opens_its_report_in_a_browser(searched, chromium):
    """The page as a browser runs it: the linked points' OpenURL (what a tap on a point runs) and a row's link
    open the report, loaded from the page's folder."""
    result, page = searched
    best = safe_name(result.best) + ".html"
    tab = chromium.new_page()
    try:
        tab.goto(page.as_uri())
        tab.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0")
        with tab.expect_popup() as popup:  # the TapTool's callback, on the linked point of the best configuration
            tab.evaluate("""(name) => {
                const models = [...Bokeh.documents[0].all_models];
                const tap = models.find(m => m.constructor.__name__ === "TapTool");
                const source = tap.renderers[0].data_source;
                source.selected.indices = [source.data.url.findIndex(u => u.endsWith(name))];
                tap.callback.execute(tap, {source});
            }""", best)
        opened = popup.value
        opened.wait_for_load_state()
        assert opened.url == (runs_folder(page) / best).as_uri() and "kvscope" in opened.title()
        opened.close()
        tab.click(f"a[href$='{best}']")  # the table's row
        tab.wait_for_url((runs_folder(page) / best).as_uri())
    finally:
        tab.close()
