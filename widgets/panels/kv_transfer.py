"""KV transfers of a watched vLLM, per engine: what its KV connector moved (NIXL between instances, offloading
between the GPU and CPU memory), the instance's role, and where its cached blocks are (the KV events' medium).

Read from ``meta["watch"]`` (``kvscope/watched/kv_transfer.py``, ``transfer_summary.py``): the lanes' per-poll
``kv_transfer_bytes`` / ``kv_offload_bytes`` (MB/s over each poll's interval: solid NIXL, dashed offloading,
one colour per engine) and a table per engine. The role is inferred (vLLM exposes no ``kv_role``): the
table's tooltip on it says from what. Hidden until an engine shows a connector or a medium other than GPU.
Everything put into the HTML is a number or passes ``html.escape``.
"""

from __future__ import annotations

import html
import math

from bokeh.layouts import column
from bokeh.models import ColumnDataSource

from kvscope.watched.summary import watch_summary

from ..feed import Tick
from ..theme import FULL_WIDTH, add_hover, new_figure, style_legend
from .engine_lanes import EngineLanesPanel

_COLUMNS = ("t", "transfer_mb_per_s", "offload_mb_per_s")
HEAD = ("engine", "role", "transfers", "MB moved", "time p50 / p99 (est.)", "MB/s", "failures", "expired",
        "offload GPU→CPU / CPU→GPU MB", "KV fetch waiting / in progress / done", "cached blocks by medium")


def lane_rows(lane: dict, start: int, t0_ns: int, interval_s: float) -> tuple[list[dict], int]:
    """The lane's rows from ``start``: MB/s transferred and offloaded in each poll (NaN where not known)."""
    ts = lane.get("t_ns", [])
    n = len(ts)
    moved, offloaded = lane.get("kv_transfer_bytes", []), lane.get("kv_offload_bytes", [])
    rows = []
    for i in range(start, n):
        dt = (ts[i] - ts[i - 1]) / 1e9 if i > 0 and ts[i] > ts[i - 1] else interval_s

        def rate(col: list, i: int = i, dt: float = dt) -> float:
            value = col[i] if i < len(col) else None
            return math.nan if value is None else value / 1e6 / dt

        rows.append({"t": (ts[i] - t0_ns) / 1e9, "transfer_mb_per_s": rate(moved), "offload_mb_per_s": rate(offloaded)})
    return rows, n


def _num(value, fmt: str = "{:,}") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _ms(value) -> str:
    return _num(None if value is None else value * 1e3, "≈{:.1f} ms")


def table_html(watch: dict) -> str:
    """One row per engine that shows a KV connector or KV events."""
    engines = watch_summary(watch)["engines"]
    entries = watch.get("kv_transfer", {})
    rows = []
    for key, e in engines.items():
        if e["kv_role"] is None and not e["kv_blocks_by_medium"]:
            continue
        entry = entries.get(key, {})
        fetch = entry.get("kv_fetch", {})
        media = e["kv_blocks_by_medium"] or {}
        mb = None if e["kv_transfer_bytes"] is None else e["kv_transfer_bytes"] / 1e6
        store, load = e["kv_offload_store_bytes"], e["kv_offload_load_bytes"]
        cells = (
            html.escape(str(key)),
            f"<span title='{html.escape(str(entry.get('role_from', '')), quote=True)}'>"
            f"{html.escape(str(e['kv_role'] or '–'))}</span>",
            _num(e["kv_transfers"]), _num(mb, "{:,.2f}"),
            f"{_ms(e['kv_transfer_time_p50_s_estimate'])} / {_ms(e['kv_transfer_time_p99_s_estimate'])}",
            _num(e["kv_transfer_mb_per_s"], "{:,.1f}"), _num(e["kv_transfer_failures"]), _num(e["kv_transfer_expired"]),
            f"{_num(None if store is None else store / 1e6, '{:,.2f}')} / "
            f"{_num(None if load is None else load / 1e6, '{:,.2f}')}",
            " / ".join(_num(fetch.get(s)) for s in ("waiting_to_start", "in_progress", "completed_waiting"))
            if fetch else "–",
            ", ".join(f"{html.escape(str(m))} {n:,}" for m, n in media.items()) or "–",
        )
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th style='text-align:left'>{h}</th>" for h in HEAD) + "</tr>"
    note = ("<div style='font-size:11px;color:#555'>role: inferred from which metrics the page has (vLLM exposes "
            "no kv_role); transfers are counted where they start (the consumer, in NIXL's pull mode)</div>")
    return ("<table style='font-family:sans-serif;font-size:12px;border-spacing:10px 2px'>"
            f"{header}{''.join(rows)}</table>{note}")


def has_transfers(watch: dict) -> bool:
    """An engine with a KV connector, or blocks cached in a medium other than the GPU."""
    if watch.get("kv_transfer"):
        return True
    return any(set(r.get("kv_blocks_by_medium") or {}) - {"GPU"} for r in watch.get("residency", {}).values()
               if isinstance(r, dict))


class KvTransferPanel(EngineLanesPanel):
    """MB/s moved per engine over time (NIXL solid, offloading dashed) and the engines' KV-transfer table."""

    name = "kv_transfer"
    title = "KV transfers (vLLM's KV connectors) per engine"
    columns = _COLUMNS
    lane_rows = staticmethod(lane_rows)
    table_html = staticmethod(table_html)

    def __init__(self, meta: dict, rollover: int | None) -> None:
        super().__init__(meta, rollover)
        self.fig = new_figure("KV moved (MB/s): NIXL transfers solid, offloading dashed", width=FULL_WIDTH,
                              x_axis_label="time (s)")
        add_hover(self.fig, [("t", "@t{0.0} s"), ("NIXL", "@transfer_mb_per_s{0.00} MB/s"),
                             ("offload", "@offload_mb_per_s{0.00} MB/s")], mode="vline")
        self.model = column(self.fig, self.table)
        self.model.visible = False

    def draw(self, key: str, source: ColumnDataSource, colour: str) -> None:
        self.fig.line("t", "transfer_mb_per_s", source=source, color=colour, width=1.5, legend_label=key)
        self.fig.line("t", "offload_mb_per_s", source=source, color=colour, width=1.5, line_dash="dashed")
        style_legend(self.fig)

    def update(self, tick: Tick) -> None:
        watch = self.meta.get("watch")
        if not isinstance(watch, dict) or not has_transfers(watch):
            return
        self.model.visible = True
        transfers = watch.get("kv_transfer", {})
        self.stream(watch, [(key, lane) for key, lane in list(watch.get("lanes", {}).items()) if key in transfers])
        self.show_table(watch, tick.final)
