"""A notebook executed headless by nbclient on a real kernel: it loads the extension, runs
``%kvscope --wait`` on the tiny model, and the saved notebook holds the dashboard's widget state
with the run's data in it."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from kvscope.widgets.panels.registry import PANELS
from kvscope.widgets.panels.timeline import QUEUE_STATES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NUM_REQUESTS = 6
CELLS = [
    "%load_ext kvscope",
    f"run = %kvscope --requests {NUM_REQUESTS} --prompt-len 8-40 --output-len 12-24 --num-blocks 48 "
    "--block-size 8 --wait -o",
    "print(run.status, run.step, len(run.outputs))",
]


def _bokeh_docs(nb) -> list[dict]:
    """The Bokeh documents the saved widget state holds (one per BokehModel widget)."""
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    docs = []
    for model in state.values():
        if model["model_name"] != "BokehModel":
            continue
        bundle = model["state"]["render_bundle"]
        bundle = json.loads(bundle) if isinstance(bundle, str) else bundle
        docs.extend(bundle["docs_json"].values())
    return docs


def _sources(docs: list[dict]) -> dict[str, dict]:
    """ColumnDataSources by name or by their first column, with their data decoded to lists."""
    found: dict[str, dict] = {}

    def walk(obj):
        if isinstance(obj, dict):
            if obj.get("type") == "object" and obj.get("name") == "ColumnDataSource":
                data = obj["attributes"]["data"]
                entries = data["entries"] if isinstance(data, dict) and "entries" in data else data
                cols = dict(entries) if isinstance(entries, list) else entries
                found[obj["attributes"].get("name") or ",".join(sorted(cols))] = cols
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(docs)
    return found


def _texts(docs: list[dict]) -> list[str]:
    out: list[str] = []

    def walk(obj):
        if isinstance(obj, dict):
            if obj.get("name") == "Div":
                out.append(obj["attributes"].get("text", ""))
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(docs)
    return out


def _length(column) -> int:
    if isinstance(column, dict) and column.get("type") == "ndarray":
        return column["shape"][0]
    return len(column)


def test_saved_notebook_holds_the_finished_dashboard(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a 2-core machine: no spinning intra-op threads
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    NotebookClient(nb, timeout=150, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")
    saved = nbformat.read(tmp_path / "executed.ipynb", as_version=4)

    errors = [o for c in saved.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    printed = "".join(o.get("text", "") for o in saved.cells[2].outputs)
    assert printed.startswith("finished") and printed.split()[-1] == str(NUM_REQUESTS)

    widget = "application/vnd.jupyter.widget-view+json"
    widget_outputs = [o for o in saved.cells[1].outputs if widget in o.get("data", {})]
    assert len(widget_outputs) == 1  # the dashboard was displayed once
    docs = _bokeh_docs(saved)
    assert len(docs) == len([s for s in PANELS if s.when is None])  # one BokehModel per panel (not P/D: no "pd")
    sources = _sources(docs)
    cells = sources["page-map-cells"]
    assert _length(cells["block"]) == 48
    assert "cached" in cells["state"] or "free" in cells["state"]
    owners = {o for o in cells["owner"] if o}
    assert owners, "the page map shows no owners: it holds no data from the run"
    timeline = next(c for c in sources.values() if "lane" in c)
    assert len({r for r in timeline["request"]}) == NUM_REQUESTS
    assert set(timeline["state"]) >= {"prefill", "decode"} and set(timeline["state"]) & set(QUEUE_STATES)
    batch = next(c for c in sources.values() if "prefill" in c and "running" in c)
    assert _length(batch["step"]) > 10
    kpi = next(t for t in _texts(docs) if "kvs-kpi" in t)
    assert f"{NUM_REQUESTS} / {NUM_REQUESTS}" in kpi  # finished / requests
