"""%kvscope show (issue 37, item 8): the running (or last) run's dashboard displayed again, after a reload lost
its output; an older run's status line says a newer run exists. In IPython's test shell and in a real kernel."""

from __future__ import annotations

import json

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from kvscope.magic.history import HISTORY, RunHistory

pytestmark = pytest.mark.timeout(180)
SMALL = "--requests 2 --prompt-len 8-16 --output-len 4-6 --num-blocks 32"
WIDGET = "application/vnd.jupyter.widget-view+json"


def _widget_ids(captured) -> list[str]:
    return [o.data[WIDGET]["model_id"] for o in captured.outputs if WIDGET in o.data]


def test_show_without_a_run_or_dashboard_says_what_to_do(ip, monkeypatch):
    monkeypatch.setattr(HISTORY, "last", None)
    monkeypatch.setattr(HISTORY, "runs", [])  # nor a dashboard kept from an earlier run of this kernel
    with pytest.raises(UsageError, match="no %kvscope run in this kernel yet"):
        ip.run_line_magic("kvscope", "show")
    ip.run_line_magic("kvscope", f"{SMALL} --wait -q")
    with pytest.raises(UsageError, match="was started with -q: it has no dashboard"):
        ip.run_line_magic("kvscope", "show")
    with pytest.raises(UsageError, match="takes no options"):
        ip.run_line_magic("kvscope", "show --last")
    with pytest.raises(UsageError, match="takes no cell"):
        ip.run_cell_magic("kvscope", "show", "x\n")


def test_show_displays_the_running_runs_dashboard_again_and_older_ones_say_a_newer_run_exists(ip):
    with capture_output() as first_out:
        first = ip.run_line_magic("kvscope", f"{SMALL} --refresh 10 -o")
    first.wait(timeout=60)
    with capture_output() as second_out:
        second = ip.run_line_magic("kvscope", f"{SMALL} --step-delay 0.2 --refresh 10 -o")
    assert not second.done
    with capture_output() as shown:
        assert ip.run_line_magic("kvscope", "show") is None
    assert _widget_ids(shown) == _widget_ids(second_out)  # the same live widgets, not a copy
    assert _widget_ids(shown) != _widget_ids(first_out)
    assert "a newer run started at" in first.dashboard.view.status.value
    assert "%kvscope show displays it" in first.dashboard.view.status.value
    assert "newer run" not in second.dashboard.view.status.value
    second.stop()
    second.wait(timeout=60)


def test_dashboards_of_a_cell_run_again_are_closed_but_the_newest_two():
    """Runs stand-ins: what a closed dashboard and a rerun cell do to the history's bookkeeping."""

    class Dash:
        closed = False
        note = None

        def close(self):
            self.closed = True

        def set_note(self, note):
            self.note = note

    class FakeRun:
        done = True

        def __init__(self):
            self.dashboard = Dash()

    class Info:
        def __init__(self, cell_id):
            self.cell_id = cell_id

    history = RunHistory()
    runs = []
    for cell in ("a", "b", "a", "a", "c"):
        history.pre_run_cell(Info(cell))
        runs.append(FakeRun())
        history.started(runs[-1])
        history.displayed(runs[-1])
    # a's first two runs: their cell ran again and two newer runs exist: closed; b's cell never ran again: kept;
    # a's last run: its cell ran again, but it is one of the newest two
    assert [r.dashboard.closed for r in runs] == [True, False, True, False, False]
    history.pre_run_cell(Info("a"))  # a runs again: its last run left the page and is now the third newest
    history.started(FakeRun())
    assert [r.dashboard.closed for r in runs] == [True, False, True, True, False]
    assert history.closed == 3
    assert all(r.dashboard.note.startswith("a newer run started at") for r in runs)


nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.slow
def test_show_in_a_real_kernel_reattaches_the_live_dashboard(tmp_path, monkeypatch):
    """A real kernel (nbclient): a run going on, `%kvscope show` in another cell shows its widgets again while it
    runs; after a newer run, the older run's status line in the saved widget state says so."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cells = [
        "%load_ext kvscope",
        f"old = %kvscope {SMALL} --wait -o",
        "live = %kvscope --requests 2 --prompt-len 8-16 --output-len 60 --ignore-eos --num-blocks 32 "
        "--step-delay 0.5 --refresh 10 -o",  # 30 s or more: stopped in the last cell
        "%kvscope show",
        "print(live.status, old.status); live.stop(); live.wait(timeout=60); print(live.dashboard.view.status.value)",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbclient.NotebookClient(nb, timeout=150, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors

    def ids(cell) -> list[str]:
        return [o["data"][WIDGET]["model_id"] for o in cell.outputs if WIDGET in o.get("data", {})]

    assert ids(nb.cells[3]) == ids(nb.cells[2]) and len(ids(nb.cells[3])) == 1
    printed = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert printed.startswith("running finished")  # shown while the run was going
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    statuses = [m["state"]["value"] for m in state.values()
                if m["model_name"] == "HTMLModel" and "font-size:13px" in str(m["state"].get("value", ""))]
    assert any("finished" in s and "a newer run started at" in s for s in statuses), json.dumps(statuses)[:2000]
