"""The sweep's notebook view (``widgets/sweep_view.py``): the status, the table filling in and the
current run's dashboard, headless and in a notebook executed by nbclient on a real kernel."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from kvscope.options.sweep import Values
from kvscope.runs.background.sweep import Sweep, default_args, plan_from_args
from kvscope.widgets.sweep_view import SweepView


def _plan(**options):
    args = default_args()
    values = Values([8, 16])
    values.texts = ["8", "16"]
    args.block_size = values
    for key, value in {"requests": 3, "prompt_len": (12, 24), "output_len": (3, 3), **options}.items():
        setattr(args, key, value)
    return plan_from_args(args)


def test_the_view_follows_the_sweep():
    sweep = Sweep(_plan(), dashboard=True)
    view = SweepView(sweep)
    assert "starting (2 runs)" in view.status.value and view.table.value == ""
    shown = []
    sweep.listeners.append(lambda s: shown.append(view.current.children))
    sweep.start().wait()
    assert "2 of 2 runs done" in view.status.value
    assert "block-size=16" in view.table.value and "kvs-compare-table" in view.table.value
    assert view.current.children == (sweep.current.dashboard.widget,)  # the last run's dashboard
    dashboards = {id(c[0]) for c in shown if c}
    assert len(dashboards) == 3  # each run's own dashboard was shown in turn: the warm-up's, then one per value


def test_a_failed_run_shows_in_the_view():
    sweep = Sweep(_plan(max_model_len=10**6), dashboard=False)
    view = SweepView(sweep)
    sweep.start().wait()
    assert "0 of 2 runs done, 2 failed" in view.status.value
    assert "exceeds what the model supports" in view.table.value


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_in_a_notebook_the_sweep_shows_its_table_and_dashboards():
    cells = [
        "%load_ext kvscope",
        "from kvscope.magic.sweep import magic_sweep\n"
        "cmp = magic_sweep('--block-size 8,16 --requests 3 --prompt-len 8-24 --output-len 4 --wait -o')",
        "print(cmp.labels, len(cmp.runs), cmp.errors)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=180, kernel_name="python3", store_widget_state=True).execute()
    outputs = nb.cells[1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs), outputs
    assert "sweep of --block-size: 2 of 2 runs done" in "".join(o.get("text", "") for o in outputs)
    assert nb.cells[2].outputs[0]["text"].strip() == "['block-size=8', 'block-size=16'] 2 {}"
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    html = [m["state"].get("value", "") for m in state.values() if m["model_name"] == "HTMLModel"]
    assert any("kvs-compare-table" in v and "block-size=16" in v for v in html)
    assert sum(m["model_name"] == "BokehModel" for m in state.values()) >= 7  # a run's dashboard panels
