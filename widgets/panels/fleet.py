"""One lane per watched engine plus the fleet: KV cache usage and tokens/s over time, and a table.

Read from ``meta["watch"]`` (see ``kvscope/watched/source.py``): every engine's lane (one row per poll,
``None`` while its server did not answer) and the fleet's sums. An engine gets its own line the first
time it appears (a server or data-parallel rank that answers later joins then); the fleet is the thick
black line. Tokens/s are counter deltas over each poll's interval (exact counts, averaged over it).
"""

from __future__ import annotations

import html
import math

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Range1d

from ..feed import Tick
from ..theme import (
    LEGEND_PAD,
    LEGEND_ROW_HEIGHT,
    SHARE,
    add_hover,
    empty_source,
    new_figure,
    style_legend,
    tick_formatter,
)
from .engine_lanes import EngineLanesPanel

LEGEND_COLUMNS = 3
_COLUMNS = ("t", "kv_usage", "tokens_per_s", "generation_per_s", "running", "waiting")


def lane_rows(lane: dict, start: int, t0_ns: int, interval_s: float) -> tuple[list[dict], int]:
    """The rows of ``lane`` from index ``start`` (columns ``_COLUMNS``, NaN where unknown), and its length."""
    ts = lane.get("t_ns", [])
    n = len(ts)  # the time column is appended last: every other column has at least n values
    rows = []
    for i in range(start, n):
        prev = ts[i - 1] if i > 0 else None
        dt = (ts[i] - prev) / 1e9 if prev is not None and ts[i] > prev else interval_s

        def get(name: str, i: int = i) -> float:
            value = lane[name][i]
            return float("nan") if value is None else float(value)

        prompt, gen = get("prompt_tokens"), get("generation_tokens")
        rows.append({"t": (ts[i] - t0_ns) / 1e9, "kv_usage": get("kv_usage"), "tokens_per_s": (prompt + gen) / dt,
                     "generation_per_s": gen / dt, "running": get("running"), "waiting": get("waiting")})
    return rows, n


def table_html(watch: dict) -> str:
    """One row per engine: state, queue, KV usage, totals, prefix hit rate, cached blocks."""
    engines, lanes, totals = watch.get("engines", {}), watch.get("lanes", {}), watch.get("totals", {})
    residency = watch.get("residency", {})
    head = ("engine", "KV role", "state", "running / waiting", "KV usage", "prompt / generation tokens",
            "prefix hits", "blocks cached")
    rows = []
    for key, info in list(engines.items()):
        lane, t, res = lanes.get(key, {}), totals.get(key, {}), residency.get(key, {})

        def last(name: str, lane: dict = lane):
            values = lane.get(name, [])
            return values[len(lane.get("t_ns", [])) - 1] if lane.get("t_ns") else None

        state = info.get("state") or "?"
        colour = "#d62728" if state != "ok" else "#2ca02c"
        usage = last("kv_usage")
        q, h = t.get("prefix_queries", 0), t.get("prefix_hits", 0)
        cells = (
            html.escape(str(key)),
            html.escape(str(info.get("kv_role") or "–")),  # inferred (kvscope/watched/kv_transfer.py)
            f"<span style='color:{colour}'>{html.escape(str(state))}</span>",
            f"{last('running') if last('running') is not None else '–'} / "
            f"{last('waiting') if last('waiting') is not None else '–'}",
            f"{usage:.1%}" if isinstance(usage, (int, float)) else "–",
            f"{t.get('prompt_tokens', 0):,} / {t.get('generation_tokens', 0):,}",
            f"{h / q:.1%}" if q else "–",
            f"{res.get('kv_blocks_resident', 0):,}" if res else "no events",
        )
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th style='text-align:left'>{h}</th>" for h in head) + "</tr>"
    return ("<table style='font-family:sans-serif;font-size:12px;border-spacing:10px 2px'>"
            f"{header}{''.join(rows)}</table>")


class FleetPanel(EngineLanesPanel):
    """KV cache usage and tokens/s per engine and for the fleet, over time, and a table of engines."""

    name = "fleet"
    title = "Engines (one lane each) and the fleet"
    columns = _COLUMNS
    lane_rows = staticmethod(lane_rows)
    table_html = staticmethod(table_html)

    def __init__(self, meta: dict, rollover: int | None) -> None:
        super().__init__(meta, rollover)
        self.kv = new_figure("KV cache usage (vllm:kv_cache_usage_perc)", x_axis_label="time (s)",
                             y_range=Range1d(0, 1.05))
        self.kv.yaxis[0].formatter = tick_formatter(SHARE)
        self.tokens = new_figure("Tokens/s (prompt + generation, from counters)", x_axis_label="time (s)")
        self.fleet = empty_source(*_COLUMNS)
        self.kv.line("t", "kv_usage", source=self.fleet, color="black", width=3, legend_label="fleet")
        self.tokens.line("t", "tokens_per_s", source=self.fleet, color="black", width=3, legend_label="fleet")
        self._plot_height = self.kv.height
        for fig, field in ((self.kv, "kv_usage"), (self.tokens, "tokens_per_s")):
            add_hover(fig, [("t", "@t{0.0} s"), ("value", f"@{field}{{0.00}}")], mode="vline")
            style_legend(fig, ncols=LEGEND_COLUMNS)  # below the plot, as every panel's
        self.model = column(row(self.kv, self.tokens), self.table)

    def draw(self, key: str, source: ColumnDataSource, colour: str) -> None:
        self.kv.line("t", "kv_usage", source=source, color=colour, width=1.5, legend_label=key)
        self.tokens.line("t", "tokens_per_s", source=source, color=colour, width=1.5, legend_label=key)
        rows = math.ceil((len(self.sources) + 1) / LEGEND_COLUMNS)  # the legend grows below: so does the figure
        for fig in (self.kv, self.tokens):
            fig.height = self._plot_height + rows * LEGEND_ROW_HEIGHT + LEGEND_PAD

    def source_of(self, key: str) -> ColumnDataSource | None:
        return self.fleet if key == "fleet" else super().source_of(key)

    def update(self, tick: Tick) -> None:
        watch = self.meta.get("watch")
        if not isinstance(watch, dict):
            return
        self.stream(watch, [*list(watch.get("lanes", {}).items()), ("fleet", watch.get("fleet", {}))])
        self.show_table(watch, tick.final)
