"""A finished run, shown again: as one standalone HTML file (``save_html``: every panel, BokehJS
inlined so it opens offline, a requests table, a step slider that replays the page map), or in a
notebook (``Replay`` / ``show``, what ``kvscope.load(path).show()`` calls).

In the notebook the dashboard's panels are filled from the whole run at once (nothing rolls over),
and an ipywidgets step slider rebuilds the page map at any recorded step (``Run.page_map_at``: the
last full snapshot plus the diffs after it) and patches the cells that differ. Slider events arrive on
the kernel's shell thread; they take the dashboard's lock like every other change to its documents.

The page map's history goes into the page as compact arrays: for each recorded step its page-map
entries (a full snapshot now and then, diffs in between; see ``telemetry/pagemap.py``), flattened
into one array per field with per-step offsets. The slider's ``CustomJS`` rebuilds the map at a step
from the last snapshot at or before it plus the diffs after, and styles cells with the same rules as
the live panel (``panels.page_map.CELL_STYLE_JS``).

Text a user wrote (prompts) or a model produced (outputs) reaches the page only as Bokeh string
data shown through ``StringFormatter`` cells and ``@field`` hover values, which the browser receives
as text; every bit of HTML we write ourselves passes ``html.escape``.

The run is a ``kvscope.Run`` (``RecordedRun`` says what is read of it). This module never imports
``kvscope.runs.run``: ``Run.save_html`` / ``Run.show`` import this one, and imports go one way.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Protocol

import ipywidgets as w
import pandas as pd
from bokeh.embed import file_html
from bokeh.layouts import column, row
from bokeh.models import CustomJS, Div, Slider
from bokeh.resources import INLINE

from kvscope.telemetry.records import PAGE_STATES, PageEntry, RequestEvent, StepRecord
from kvscope.utils.files import atomic_write

from .dashboard import Dashboard
from .feed import Feed
from .panels.page_map import CELL_STYLE_JS, DRAFT_MARK_COLORS, STATE_RANK, PageMapPanel
from .panels.registry import apply_tick, build_panels
from .panels.requests_table import RequestsTable, request_texts
from .stats import LatencyStats


class RecordedRun(Protocol):
    """What the report and the replay read of a run (``kvscope.Run`` has all of it)."""

    records: list[StepRecord]
    events: list[RequestEvent]
    meta: dict[str, Any]

    @property
    def t0_ns(self) -> int: ...
    @property
    def requests(self) -> pd.DataFrame: ...
    def summary(self) -> dict[str, Any]: ...
    def page_map_at(self, step: int) -> list[PageEntry]: ...


def _target_pages(record: StepRecord) -> tuple[dict[int, PageEntry], bool]:
    return record.page_map, record.page_map_full


def _draft_pages(record: StepRecord) -> tuple[dict[int, PageEntry], bool]:
    spec = record.spec_decode
    return (spec.draft_page_map, spec.draft_page_map_full) if spec is not None else ({}, False)


def page_map_history(run: RecordedRun, panel: PageMapPanel, pages=_target_pages) -> dict[str, list]:
    """The page map of every replayable step as flat arrays (see the module docstring); ``pages``:
    a record's (entries, is a full snapshot) of the pool to replay (the draft model's: ``_draft_pages``)."""
    records = list(run.records)
    first_full = next((i for i, r in enumerate(records) if pages(r)[1]), None)
    hist: dict[str, list] = {k: [] for k in ("step", "full", "offset", "block", "owner", "filled", "state", "refs",
                                             "kv_group")}
    owners: dict[str, int] = {}
    for record in records[first_full:] if first_full is not None else []:
        page_map, full = pages(record)
        hist["step"].append(record.step)
        hist["full"].append(int(full))
        hist["offset"].append(len(hist["block"]))
        for block, entry in sorted(page_map.items()):
            hist["block"].append(block)
            hist["owner"].append(owners.setdefault(entry.owner, len(owners)) if entry.owner else -1)
            hist["filled"].append(entry.filled)
            hist["state"].append(PAGE_STATES.index(entry.state) if entry.state in PAGE_STATES else 0)
            hist["refs"].append(entry.refs)
            hist["kv_group"].append(entry.kv_group)
    hist["offset"].append(len(hist["block"]))
    hist["owners"] = list(owners)
    hist["owner_colors"] = [panel.colors(o) for o in owners]
    hist["states"] = list(PAGE_STATES)
    hist["rank"] = [STATE_RANK[state] for state in PAGE_STATES]
    return hist


REPLAY_JS = CELL_STYLE_JS + """
const h = hist, d = source.data, n = num_blocks, g = group, cells = d.block.length;
let i = h.step.indexOf(slider.value);
if (i < 0) { i = 0; while (i + 1 < h.step.length && h.step[i + 1] <= slider.value) i++; }
let k = i; while (k > 0 && !h.full[k]) k--;
const owner = new Array(n).fill(-1), filled = new Array(n).fill(0), state = new Array(n).fill(0),
      refs = new Array(n).fill(0), kvg = new Array(n).fill(0);
for (let r = k; r <= i; r++) {
  for (let j = h.offset[r]; j < h.offset[r + 1]; j++) {
    const b = h.block[j];
    owner[b] = h.owner[j]; filled[b] = h.filled[j]; state[b] = h.state[j]; refs[b] = h.refs[j];
    kvg[b] = h.kv_group[j];
  }
}
const cols = {owner: [], filled: [], state: [], refs: [], kv_group: [], color: [], alpha: [], outline: []};
let used = 0, cached = 0;
for (let b = 0; b < n; b++) {
  const s = h.states[state[b]];
  if (s == "used" || s == "shared") used++; else if (s == "cached") cached++;
}
for (let c = 0; c < cells; c++) {  // a cell is a run of g blocks (panels.page_map.merge_entries)
  let top = c * g, tokens = 0, holders = 0;
  for (let b = c * g; b < Math.min((c + 1) * g, n); b++) {
    if (h.rank[state[b]] > h.rank[state[top]]) top = b;
    tokens += filled[b]; holders = Math.max(holders, refs[b]);
  }
  const s = h.states[state[top]];
  const color = owner[top] >= 0 ? h.owner_colors[owner[top]] : null;
  const style = cell_style(color, tokens, s, block_size * g);
  cols.owner.push(owner[top] >= 0 ? h.owners[owner[top]] : ""); cols.filled.push(tokens);
  cols.state.push(s); cols.refs.push(holders); cols.kv_group.push(kvg[top]);
  cols.color.push(style[0]); cols.alpha.push(style[1]); cols.outline.push(style[2]);
}
source.data = Object.assign({}, d, cols);
label.text = (typeof prefix === "undefined" ? "page map" : prefix) + " after step " + h.step[i] + ": " + used + " blocks used, " + cached + " cached";
"""

# The draft-slot triangles of the page map at the slider's step (speculative decoding).
MARKS_JS = """
const m = marks, i = m.step.indexOf(slider.value), cols = {x: [], y: [], block: [], drafted: [], accepted: [], color: []};
if (i >= 0) {
  for (let j = m.offset[i]; j < m.offset[i + 1]; j++) {
    const b = m.block[j], c = Math.floor(b / group), n = m.drafted[j], a = m.accepted[j];
    cols.x.push(c % ncols + 0.3); cols.y.push(Math.floor(c / ncols) - 0.3); cols.block.push(b);
    cols.drafted.push(n); cols.accepted.push(a); cols.color.push(colors[m.freed[j] ? 0 : a == n ? 2 : 1]);
  }
}
source.data = cols;
"""


def draft_marks_history(run: RecordedRun) -> dict[str, list]:
    """Per speculative step, the blocks that held draft slots, as flat arrays with offsets."""
    marks: dict[str, list] = {k: [] for k in ("step", "offset", "block", "drafted", "accepted", "freed")}
    for record in run.records:
        if record.spec_decode is None:
            continue
        marks["step"].append(record.step)
        marks["offset"].append(len(marks["block"]))
        freed = set(record.spec_decode.freed_blocks)
        for block, (drafted, accepted) in sorted(record.spec_decode.draft_slots.items()):
            marks["block"].append(block)
            marks["drafted"].append(drafted)
            marks["accepted"].append(accepted)
            marks["freed"].append(int(block in freed))
    marks["offset"].append(len(marks["block"]))
    return marks


def _header(run: RecordedRun) -> Div:
    meta = run.meta
    s = run.summary() if run.records else {}

    def fmt(key: str, spec: str, scale: float = 1.0) -> str:
        value = s.get(key)
        return "–" if value is None or value != value else format(value * scale, spec)

    def count(key: str) -> str:
        value = s.get(key)
        return "–" if value is None else f"{int(value):,d}"

    facts = [
        ("model", html.escape(str(meta.get("model", "?")))),
        ("device", html.escape(str(meta.get("device", "?")))),
        ("requests", count("requests")), ("steps", count("steps")),
        ("output tokens/s", fmt("output_tokens_per_s", ",.1f")),
        ("TTFT p50", fmt("ttft_p50_s", ".1f", 1e3) + " ms"), ("ITL p50", fmt("itl_p50_s", ".2f", 1e3) + " ms"),
        ("peak KV blocks used", fmt("peak_block_usage", ".1%")), ("preemptions", count("preemptions")),
    ]
    items = " · ".join(f"<b>{k}</b> {v}" for k, v in facts)
    return Div(text=f"<h2 style='font-family:sans-serif;margin:4px 0'>kvscope run</h2>"
                    f"<div style='font-family:sans-serif;font-size:13px'>{items}</div>", width=1000)


def build_report(run: RecordedRun):
    """The report's Bokeh layout (all panels filled from the whole run, nothing rolled over)."""
    stats = LatencyStats()
    meta = dict(run.meta)
    meta.setdefault("t0_ns", run.t0_ns)
    panels = {p.name: p for p in build_panels(stats, rollover=None, meta=meta)}
    apply_tick(list(panels.values()), stats, Feed.of(run.records, run.events).poll(final=True))
    page_map: PageMapPanel = panels["page_map"]
    hist = page_map_history(run, page_map)
    steps = hist["step"]
    label = Div(text=f"page map after step {steps[-1]}" if steps else "no page map recorded", width=480,
                name="page-map-label")
    parts = [page_map.model, label]
    speculative = any(r.spec_decode is not None for r in run.records)
    draft_map: PageMapPanel = panels["draft_page_map"]
    draft_parts = [draft_map.model] if draft_map.entries else []
    if len(steps) > 1:
        slider = Slider(start=steps[0], end=steps[-1], value=steps[-1], step=1, title="replay step", width=480,
                        name="page-map-slider")
        slider.js_on_change("value", CustomJS(
            args={"hist": hist, "source": page_map.source, "slider": slider, "label": label, "prefix": "page map",
                  "block_size": page_map.block_size, "group": page_map.group, "num_blocks": page_map.num_blocks},
            code=REPLAY_JS,
        ))
        parts.insert(1, slider)
        if speculative:
            slider.js_on_change("value", CustomJS(
                args={"marks": draft_marks_history(run), "source": page_map.marks, "slider": slider,
                      "group": page_map.group, "ncols": page_map.cols, "colors": list(DRAFT_MARK_COLORS)},
                code=MARKS_JS,
            ))
        if draft_parts:
            draft_label = Div(text="draft page map after the last step", width=480, name="draft-page-map-label")
            draft_parts.append(draft_label)
            slider.js_on_change("value", CustomJS(
                args={"hist": page_map_history(run, draft_map, _draft_pages), "source": draft_map.source,
                      "slider": slider, "label": draft_label, "prefix": "draft page map",
                      "block_size": draft_map.block_size, "group": draft_map.group,
                      "num_blocks": draft_map.num_blocks},
                code=REPLAY_JS,
            ))
    return column(
        _header(run),
        panels["kpi"].model,
        row(panels["memory"].model, column(*parts)),
        row(panels["occupancy"].model, panels["batch"].model),
        panels["latency"].model,
        panels["timeline"].model,
        *([panels["speculation"].model] if speculative else []),
        *([column(*draft_parts)] if draft_parts else []),
        RequestsTable(run.requests, request_texts(run.meta)).model,
    )


def save_html(run: RecordedRun, path: str | os.PathLike) -> Path:
    """Write the report of ``run`` to ``path`` atomically; returns the path."""
    title = f"kvscope · {run.meta.get('model', 'run')}"
    page = file_html(build_report(run), resources=INLINE, title=title)
    return atomic_write(path, lambda f: f.write(page))


class Replay:
    """A finished run's dashboard plus a page-map step slider."""

    def __init__(self, run: RecordedRun) -> None:
        self.run = run
        meta = dict(run.meta)
        meta.setdefault("t0_ns", run.t0_ns)
        steps = [r.step for r in run.records if r.page_map_full]
        first = steps[0] if steps else 0
        last = run.records[-1].step if run.records else 0
        self.slider = w.IntSlider(value=last, min=first, max=last, description="page map at step",
                                  continuous_update=False, style={"description_width": "120px"},
                                  layout=w.Layout(width="420px"), disabled=not steps)
        self.dashboard = Dashboard(Feed.of(run.records, run.events), meta=meta, rollover=None,
                                   extra_controls=[self.slider])
        self.dashboard.tick(final=True)
        self.slider.observe(lambda change: self.show_step(change["new"]), names="value")

    def show_step(self, step: int) -> None:
        entries = self.run.page_map_at(step)
        dash = self.dashboard
        page_map = dash.panel["page_map"]
        with dash._lock:
            doc = page_map.model.document
            doc.hold("combine")
            try:
                page_map.show_entries(entries)
                page_map.step = step
            finally:
                doc.unhold()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return self.dashboard._repr_mimebundle_(include=include, exclude=exclude)


def show(run: RecordedRun) -> None:
    """Display the replay of ``run`` (``Replay(run)`` gives the object itself)."""
    from IPython.display import display

    display(Replay(run))
