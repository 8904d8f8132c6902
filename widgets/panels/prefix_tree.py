"""Residency of a watched vLLM server: its prefix cache as a tree, and blocks stored / evicted per interval.

From the KV cache events only (``meta["watch"]["residency"]`` and the lanes, see ``kvscope/watched/source.py``):

- an icicle of the cached blocks, engine under engine: one row per cached chain, one column per block
  position, a block shared by several chains (a common prefix) spanning all their rows, coloured by how
  many chains share it (grey: one); a block outlined red was stored before, evicted and computed again;
- stored (up) and evicted (down) blocks per interval, and blocks cached now (line, right axis);
- the most shared prefixes (what is hot), per engine.

The events name no requests and no block ids: this is what the cache holds, not who holds it.
"""

from __future__ import annotations

import html
import math

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, LinearAxis, Range1d

from ..feed import Tick
from ..theme import FULL_WIDTH, add_hover, empty_source, new_figure, stream_rows, style_legend
from .base import Panel, PanelContext

SHARED_PALETTE = ("#fdd0a2", "#fdae6b", "#fd8d3c", "#e6550d", "#a63603")  # 2, 3-4, 5-8, 9-16, >16 chains
UNSHARED = "#bdbdbd"
ENGINE_GAP = 2  # empty rows between two engines' trees
_ICICLE = ("x0", "x1", "y0", "y1", "chains", "key", "engine", "stored_s", "color", "outline")


def chain_color(chains: int) -> str:
    if chains <= 1:
        return UNSHARED
    return SHARED_PALETTE[min(int(math.log2(chains - 1)), len(SHARED_PALETTE) - 1)]


def icicle(residency: dict, t0_ns: int) -> tuple[dict[str, list], list[tuple[str, float]]]:
    """Every engine's layout stacked into one set of quads, and (engine, first row) labels."""
    cols: dict[str, list] = {k: [] for k in _ICICLE}
    labels = []
    base = 0.0
    for engine, entry in list(residency.items()):
        layout = entry.get("layout") if isinstance(entry, dict) else None
        if not isinstance(layout, dict) or not layout.get("key"):
            continue
        labels.append((str(engine), base))
        n = len(layout["key"])
        top = 0.0
        for i in range(n):
            chains = layout["chains"][i]
            cols["x0"].append(layout["x0"][i])
            cols["x1"].append(layout["x1"][i])
            cols["y0"].append(-(base + layout["y0"][i]))  # the first chain on top
            cols["y1"].append(-(base + layout["y1"][i]))
            cols["chains"].append(chains)
            cols["key"].append(str(layout["key"][i]))
            cols["engine"].append(str(engine))
            cols["stored_s"].append((layout["stored_ns"][i] - t0_ns) / 1e9)
            cols["color"].append(chain_color(chains))
            cols["outline"].append("#d62728" if layout["restored"][i] else "white")
            top = max(top, layout["y1"][i])
        base += top + ENGINE_GAP
    return cols, labels


def hot_html(residency: dict, block_size: int | None) -> str:
    parts = []
    for engine, entry in list(residency.items()):
        if not isinstance(entry, dict):
            continue
        hot = entry.get("hot") or []
        cached, stored = entry.get("kv_blocks_resident", 0), entry.get("kv_blocks_stored", 0)
        line = f"<b>{html.escape(str(engine))}</b>: {cached:,} blocks cached, {stored:,} distinct stored"
        if hot:
            items = ", ".join(
                f"block {depth + 1}" + (f" (tokens {depth * block_size + 1}-{(depth + 1) * block_size})"
                                        if block_size else "") + f" × {chains} chains"
                for _, chains, depth in hot[:3])
            line += f"; most shared: {items}"
        parts.append(line)
    text = "<br>".join(parts) or "no KV cache events yet (start vLLM with --kv-events-config, watch with --kv-events)"
    return f"<div style='font-family:sans-serif;font-size:12px'>{text}</div>"


class PrefixTreePanel(Panel):
    """The cached prefix tree (icicle), stored / evicted blocks per interval, and the hot prefixes."""

    name = "prefix_tree"
    title = "KV cache residency (prefix tree, from KV events)"

    @classmethod
    def create(cls, context: PanelContext) -> PrefixTreePanel:
        return cls(context.meta, context.rollover)

    def __init__(self, meta: dict, rollover: int | None) -> None:
        self.meta = meta
        self.rollover = rollover
        self.source = ColumnDataSource({k: [] for k in _ICICLE})
        tree = new_figure("Cached blocks: one row per chain, shared prefixes span rows", width=FULL_WIDTH // 2 + 100,
                          height=320, x_axis_label="block position in the sequence")
        tree.quad(left="x0", right="x1", top="y0", bottom="y1", source=self.source, fill_color="color",
                  line_color="outline", line_width=1)
        tree.yaxis.visible = False
        tree.ygrid.visible = False
        add_hover(tree, [("engine", "@engine"), ("block", "@x1"), ("chains through it", "@chains"),
                         ("hash", "@key"), ("stored at", "@stored_s{0.0} s")])
        self.tree = tree
        self.flow = empty_source("t", "stored", "evicted", "cached")
        flow = new_figure("Blocks stored / evicted per interval", width=FULL_WIDTH // 2 - 110, height=320,
                          x_axis_label="time (s)")
        flow.vbar(x="t", top="stored", width=0.0, source=self.flow, color="#31a354", legend_label="stored",
                  line_width=3)
        flow.vbar(x="t", top="evicted", width=0.0, source=self.flow, color="#d62728", legend_label="evicted (down)",
                  line_width=3)
        flow.extra_y_ranges = {"cached": Range1d(0, 1)}
        flow.add_layout(LinearAxis(y_range_name="cached", axis_label="blocks cached"), "right")
        flow.line("t", "cached", source=self.flow, y_range_name="cached", color="#3182bd", width=2,
                  legend_label="cached now")
        add_hover(flow, [("t", "@t{0.0} s"), ("stored", "@stored"), ("evicted", "@evicted"), ("cached", "@cached")],
                  mode="vline")
        style_legend(flow, ncols=3)
        self.flow_figure = flow
        self.hot = Div(text=hot_html({}, None), width=FULL_WIDTH)
        self.model = column(row(tree, flow), self.hot)
        self._seen_rows = 0
        self._signature = None
        self._max_cached = 1

    def update(self, tick: Tick) -> None:
        watch = self.meta.get("watch")
        if not isinstance(watch, dict):
            return
        t0 = watch.get("t0_ns", self.meta.get("t0_ns", 0))
        fleet = watch.get("fleet", {})
        n = len(fleet.get("t_ns", []))
        rows = []
        for i in range(self._seen_rows, n):
            stored = fleet["blocks_stored"][i]
            if stored is None:
                continue
            cached = fleet["blocks_resident"][i] or 0
            rows.append({"t": (fleet["t_ns"][i] - t0) / 1e9, "stored": stored,
                         "evicted": -(fleet["blocks_evicted"][i] or 0), "cached": cached})
            if cached > self._max_cached:
                self._max_cached = cached
                self.flow_figure.extra_y_ranges["cached"].end = cached * 1.1
        self._seen_rows = n
        stream_rows(self.flow, rows, self.rollover)
        residency = watch.get("residency", {})
        signature = tuple((k, v.get("kv_block_stores"), v.get("kv_blocks_evicted"), "layout" in v)
                          for k, v in list(residency.items()) if isinstance(v, dict))
        if signature != self._signature or tick.final:  # the tree is replaced whole, only when it changed
            self._signature = signature
            cols, _ = icicle(residency, t0)
            self.source.data = cols
            block_size = next((v.get("kv_block_size") for v in residency.values()
                               if isinstance(v, dict) and v.get("kv_block_size")), None)
            self.hot.text = hot_html(residency, block_size)
