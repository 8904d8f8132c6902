"""The page map's replay in a static page: the history of a pool's page map as compact arrays, the
``CustomJS`` that rebuilds the map at a slider's step, and the report parts that add the slider.

The history goes into the page as flat arrays: for each recorded step its page-map entries (a full
snapshot now and then, diffs in between; see ``kvscope/telemetry/pagemap.py``), one array per field
with per-step offsets. ``REPLAY_JS`` rebuilds the map at a step from the last snapshot at or before it
plus the diffs after, and styles cells with the same rules as the live panel
(``page_cells.CELL_STYLE_JS``). The comparison page (``widgets/compare.py``) reuses both.
"""

from __future__ import annotations

from collections.abc import Sequence

from bokeh.layouts import column
from bokeh.models import CustomJS, Div, LayoutDOM, Slider

from kvscope.telemetry.records import PAGE_STATES, PageEntry, StepRecord

from .page_cells import CELL_STYLE_JS, DRAFT_MARK_COLORS, STATE_RANK
from .page_map import PageMapPanel
from .report_parts import RecordedRun, ReportContext


def caption(prefix: str, step: int, entries: Sequence[PageEntry]) -> str:
    """The label under a page map at ``step`` (what ``REPLAY_JS`` writes at every other step)."""
    used = sum(1 for e in entries if e.state in ("used", "shared"))
    cached = sum(1 for e in entries if e.state == "cached")
    return f"{prefix} after step {step}: {used} blocks used, {cached} cached"


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
for (let c = 0; c < cells; c++) {  // a cell is a run of g blocks (panels.page_cells.merge_entries)
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
label.text = (typeof prefix === "undefined" ? "page map" : prefix) + " after step " + h.step[i] + ": "
  + used + " blocks used, " + cached + " cached";
"""

# The draft-slot triangles of the page map at the slider's step (speculative decoding).
MARKS_JS = """
const m = marks, i = m.step.indexOf(slider.value);
const cols = {x: [], y: [], block: [], drafted: [], accepted: [], color: []};
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



def page_map_with_replay(panel: PageMapPanel, context: ReportContext) -> LayoutDOM:
    """The page map, a label, and (with more than one recorded step) a slider that replays it; the
    slider also moves the draft-slot marks of a run that speculated, and is kept in ``context``."""
    hist = page_map_history(context.run, panel)
    steps = hist["step"]
    label = Div(text=caption("page map", steps[-1], panel.entries) if steps else "no page map recorded",
                width=480, name="page-map-label")
    parts = [panel.model, label]
    if len(steps) > 1:
        slider = Slider(start=steps[0], end=steps[-1], value=steps[-1], step=1, title="replay step", width=480,
                        name="page-map-slider")
        slider.js_on_change("value", CustomJS(
            args={"hist": hist, "source": panel.source, "slider": slider, "label": label, "prefix": "page map",
                  "block_size": panel.block_size, "group": panel.group, "num_blocks": panel.num_blocks},
            code=REPLAY_JS,
        ))
        parts.insert(1, slider)
        if context.speculative:
            slider.js_on_change("value", CustomJS(
                args={"marks": draft_marks_history(context.run), "source": panel.marks, "slider": slider,
                      "group": panel.group, "ncols": panel.cols, "colors": list(DRAFT_MARK_COLORS)},
                code=MARKS_JS,
            ))
        context.slider = slider
    return column(*parts)


def draft_page_map_with_replay(panel: PageMapPanel, context: ReportContext) -> LayoutDOM | None:
    """The draft model's page map (left out when it never held a block), replayed by the page map's
    slider when there is one."""
    if not panel.entries:
        return None
    parts = [panel.model]
    if context.slider is not None:
        last = context.run.records[-1].step if context.run.records else 0
        label = Div(text=caption("draft page map", last, panel.entries), width=480, name="draft-page-map-label")
        parts.append(label)
        context.slider.js_on_change("value", CustomJS(
            args={"hist": page_map_history(context.run, panel, _draft_pages), "source": panel.source,
                  "slider": context.slider, "label": label, "prefix": "draft page map",
                  "block_size": panel.block_size, "group": panel.group, "num_blocks": panel.num_blocks},
            code=REPLAY_JS,
        ))
    return column(*parts)
