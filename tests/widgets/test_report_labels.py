"""What the report's words say (issue 37): the demo's title, the two prefix-cache rates told apart, page-map
legends that fit their figure (a sweep's side-by-side maps are narrow)."""

from __future__ import annotations

from kvscope.widgets.panels.kpi import PREFIX_TILE, KpiPanel
from kvscope.widgets.panels.page_cells import LEGEND_CHAR_PX, STATE_LEGEND
from kvscope.widgets.panels.page_map import PageMapPanel
from kvscope.widgets.panels.prefix_misses import PrefixMissesPanel
from kvscope.widgets.report import run_title
from kvscope.widgets.stats import LatencyStats


def test_the_title_is_the_commands_and_a_simulation_says_so_whatever_it_was_given():
    assert run_title({}) == "kvscope run"
    assert run_title({"title": "kvscope demo · smollm2"}) == "kvscope demo · smollm2"
    assert run_title({"title": 3}) == run_title({"title": "  "}) == "kvscope run"  # read from a file: checked
    assert run_title({"title": "kvscope demo", "simulated": {}}).startswith("kvscope simulation — SIMULATED")


def test_the_tile_and_the_prefix_panel_say_which_lookups_they_count():
    assert "all lookups" in PREFIX_TILE
    kpi = KpiPanel(LatencyStats(), {})
    assert PREFIX_TILE in kpi._html()
    facts = PrefixMissesPanel._html({"tokens_hit": 465, "prompt_tokens": 1000, "tokens_reusable": 600,
                                     "tokens_missed": 135}, [])
    assert "hit at first lookup</b> 46.5% of prompt tokens" in facts and "all-lookups rate" in facts


def _legend_width(panel: PageMapPanel) -> float:
    """The widest row of the legend, by the labels' estimated widths (LEGEND_CHAR_PX a character)."""
    legend = panel.figure.legend[0]
    ncols = legend.ncols
    widths = [16 + 12 + LEGEND_CHAR_PX * len(label) for label, _, _ in STATE_LEGEND]
    columns = [max(widths[i::ncols]) for i in range(ncols)]
    return sum(columns) + 24


def test_page_map_legends_fit_their_figure_at_the_dashboards_and_a_sweeps_widths():
    for width in (495, 328):  # the dashboard's half width (a sweep of one or two runs); a sweep's three maps a row
        panel = PageMapPanel(width=width)
        assert _legend_width(panel) <= width, (width, panel.figure.legend[0].ncols)
    assert PageMapPanel(width=495).figure.legend[0].ncols == 2  # two columns where they fit
    assert PageMapPanel(width=328).figure.legend[0].ncols == 1
