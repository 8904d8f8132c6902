"""A P/D run's instances' page maps, side by side, with the blocks of a transfer marked (the report's part; a
live P/D run has no maps until its end, so the panel stays hidden there).

Drawn from ``meta["pd"]["page_maps"]`` (``kvscope.pd.page_maps``): one ``PageMapPanel`` grid per instance
(same cell looks and one colour per request across all of them), and a slider over the recorded moments
(transfers in time order, then the end of the run) whose ``CustomJS`` swaps every grid's cells and marks for
that moment's, from arrays embedded once (JSON text, parsed in the browser: per moment and instance only the
columns a cell's look and hover read, at most ``MAX_CELLS`` cells each). A black-edged white diamond marks
each block in flight: on the producer the blocks being sent, on the consumer the blocks that arrived (see
``kvscope.pd.page_maps`` for which blocks those are when a transfer does not name them).
"""

from __future__ import annotations

import html
import json
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, CustomJS, Div, Slider

from kvscope.telemetry.pagemap import mapped_blocks
from kvscope.telemetry.records import FREE_PAGE, PageEntry

from ..feed import Tick
from ..theme import FULL_WIDTH, OwnerColors, add_hover
from .base import Panel, PanelContext
from .page_map import PATCHED, PageMapPanel

MAX_CELLS = 1024  # per instance's grid (runs of blocks beyond): each moment embeds its cells' looks
MARK_COLUMNS = ("x", "y", "block", "request")
SWAP_JS = """
const m = moments[slider.value];
for (let i = 0; i < sources.length; i++) {
  const d = m.maps[i];
  if (d != null) { sources[i].data = Object.assign({}, sources[i].data, d.cells); marks[i].data = d.marks; }
}
div.text = m.label;
"""


class InstancePageMap(PageMapPanel):
    """One instance's grid (no draft marks: P/D does not combine with speculative decoding)."""

    name = "pd_page_map"
    marks_drafts = False


def _label(moment: dict[str, Any], count: int, index: int) -> str:
    flying = sum(len(m.get("in_flight", ())) for m in moment["maps"].values())
    text = f"{index + 1} of {count} · {moment['label']}" + (f" · {flying} blocks marked in flight" if flying else "")
    unknown = [n for n, m in moment["maps"].items() if m.get("marks_from") == "owner" and not m.get("in_flight")]
    if unknown:  # kvscope.pd.page_maps: the page map attributed none of the blocks to the request there
        text += f" · not marked on {', '.join(unknown)}: the transfer does not record which blocks it read there"
    return f"<div style='font-family:sans-serif;font-size:13px'>{html.escape(text)}</div>"


class PDPageMapsPanel(Panel):
    name = "pd_page_maps"
    title = "KV page maps of the P/D instances"

    @classmethod
    def create(cls, context: PanelContext) -> PDPageMapsPanel:
        return cls(context.meta)

    def __init__(self, meta: dict | None = None) -> None:
        self.meta = meta if meta is not None else {}
        self.maps: dict[str, InstancePageMap] = {}
        self.marks: dict[str, ColumnDataSource] = {}
        self.moments: list[dict[str, Any]] = []  # per moment: label, per instance (in ``maps`` order) its data
        self.div = Div(text="", width=FULL_WIDTH)
        self.slider = Slider(start=0, end=1, value=0, step=1, title="moment", width=FULL_WIDTH - 100, name="pd-moment")
        self.grids = row()
        self.model = column(Div(text=f"<b style='font-family:sans-serif'>{self.title}</b>"), self.div, self.slider,
                            self.grids, visible=False)

    def update(self, tick: Tick) -> None:
        pd = self.meta.get("pd")
        page_maps = pd.get("page_maps") if isinstance(pd, dict) else None
        if self.maps or not isinstance(page_maps, dict) or not page_maps.get("moments"):
            return
        self._build(page_maps)

    def _build(self, page_maps: dict[str, Any]) -> None:
        pools, roles = page_maps.get("pools", {}), page_maps.get("roles", {})
        colors = OwnerColors()
        width = max(300, (FULL_WIDTH - 10) // max(len(pools), 1))
        for name, pool in pools.items():
            panel = InstancePageMap(width=width, max_cells=MAX_CELLS)
            panel.colors = colors  # one colour per request on every instance
            panel.title = f"{name} ({roles.get(name) or '?'}): {pool['num_blocks']} blocks"
            panel.figure.title.text = panel.title
            panel.source.name = f"pd-page-map-{name}-cells"
            panel.grid(mapped_blocks(int(pool["num_blocks"])), int(pool["block_size"]))  # the blocks its maps cover
            panel.source.data = panel.cells_of([FREE_PAGE] * panel.num_blocks)  # every column; moments patch looks
            marks = ColumnDataSource({c: [] for c in MARK_COLUMNS}, name=f"pd-page-map-{name}-in-flight")
            glyph = panel.figure.scatter("x", "y", source=marks, marker="diamond", size=11, fill_color="#ffffff",
                                         line_color="#000000", line_width=2, legend_label="in flight (transferred)")
            add_hover(panel.figure, [("block", "@block"), ("in flight for", "@request")], renderers=[glyph])
            self.maps[name], self.marks[name] = panel, marks
        moments = page_maps["moments"]
        for i, moment in enumerate(moments):
            maps = [self._instance_data(name, moment["maps"].get(name), moment.get("request_id"))
                    for name in self.maps]
            self.moments.append({"label": _label(moment, len(moments), i), "maps": maps})
        first = next((i for i, m in enumerate(moments) if any(x.get("in_flight") for x in m["maps"].values())), 0)
        self.show(first)
        self.slider.update(end=max(len(moments) - 1, 1), value=first, disabled=len(moments) < 2)
        self.slider.js_on_change("value", CustomJS(
            args={"slider": self.slider, "div": self.div, "sources": [p.source for p in self.maps.values()],
                  "marks": list(self.marks.values()), "moments_json": json.dumps(self.moments)},
            code="const moments = JSON.parse(moments_json);\n" + SWAP_JS))
        self.grids.children = [p.model for p in self.maps.values()]
        self.model.visible = True

    def _instance_data(self, name: str, data: dict[str, Any] | None, rid: str | None) -> dict[str, Any] | None:
        if data is None:
            return None
        panel = self.maps[name]
        entries = [FREE_PAGE] * panel.num_blocks
        for block, owner, filled, state in data.get("blocks", ()):
            if 0 <= block < len(entries):
                refs = 1 if state == "used" else 2 if state == "shared" else 0
                entries[block] = PageEntry(owner, filled, state, refs)
        cells = {c: v for c, v in panel.cells_of(entries).items() if c in PATCHED}  # positions stay
        flying = [b for b in data.get("in_flight", ()) if 0 <= b < len(entries)]
        xy = [panel.xy_of(b) for b in flying]
        marks = {"x": [x for x, _ in xy], "y": [y for _, y in xy], "block": flying, "request": [rid or ""] * len(xy)}
        return {"cells": cells, "marks": marks, "step": data.get("step")}

    def show(self, index: int) -> None:
        """Show moment ``index`` (what the slider's ``CustomJS`` does in the browser)."""
        moment = self.moments[index]
        for (name, panel), data in zip(self.maps.items(), moment["maps"]):
            if data is not None:
                panel.source.data = {**panel.source.data, **data["cells"]}
                self.marks[name].data = data["marks"]
        self.div.text = moment["label"]
        self.slider.value = index
