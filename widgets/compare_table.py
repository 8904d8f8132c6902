"""The comparison's text parts, as HTML: the header (runs, colours, settings that differ), the warnings
and the summary table with ratios (``summary_html``, also ``Comparison._repr_html_`` and the sweep's
notebook view), and ``format_value``, which the terminal table shares. Every text that comes from a run
(labels, model names, file names) passes ``html.escape``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd
from bokeh.palettes import Category10

if TYPE_CHECKING:
    from .panels.report_parts import RecordedRun

MiB = 1 << 20


class Compared(Protocol):
    """What is read of a ``kvscope.runs.result.comparison.Comparison`` (this module never imports it: the
    comparison imports this one to draw itself, and imports go one way)."""

    labels: list[str]
    summaries: list[dict[str, Any]]
    metrics: Sequence[Any]  # kvscope.runs.result.comparison.Metric: key, name, unit, better
    spreads: list[dict[str, tuple[float, float]]]  # per run, metric -> (min, max) over its repeats

    def within_noise(self, key: str, index: int) -> bool: ...

    @property
    def runs(self) -> Sequence[RecordedRun]: ...  # read only: a Comparison's list of Runs fits
    @property
    def table(self) -> pd.DataFrame: ...
    @property
    def warnings(self) -> list[str]: ...
    @property
    def differences(self) -> dict[str, list[Any]]: ...


RUN_COLORS = Category10[10]
FONT = "font-family:sans-serif;font-size:13px"


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


# ---- the summary table ------------------------------------------------------------------------------
def format_value(unit: str, value: float) -> str:
    if value is None or value != value:
        return "–"
    if math.isinf(value):
        return "∞"
    if unit == "ms":
        ms = value * 1e3
        return f"{ms:,.2f} ms" if abs(ms) < 10 else f"{ms:,.1f} ms"
    if unit == "%":
        return f"{value:.1%}"
    if unit == "MiB":
        return f"{value / MiB:,.2f} MiB"
    if unit == "x":
        return f"{value:,.1f}x"
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:,.2f}"


def _ratio_html(ratio: float, better: str, noise: bool = False) -> str:
    if ratio != ratio:
        return "<span style='color:#999'>–</span>"
    if noise:  # the repeats' ranges overlap: no win, no loss
        return f"<span style='color:#999;font-size:11px' title='within the repeats&#39; spread'>≈{ratio:,.2f}x</span>"
    color = "#666"
    if better and abs(ratio - 1) > 0.02:
        good = (ratio > 1) == (better == "higher")
        color = "#1a7f37" if good else "#c62828"
    return f"<span style='color:{color};font-size:11px'>{ratio:,.2f}x</span>"


def notes_html(cmp: Compared) -> str:
    """What relates the runs without a warning (``Comparison.notes``: a simulation replaying another run)."""
    notes = getattr(cmp, "notes", [])
    if not notes:
        return ""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f"<div class='kvs-compare-notes' style='border:1px solid #ccc;border-radius:4px;padding:4px 10px;"
            f"margin:6px 0;{FONT}'><b>how these runs relate:</b>"
            f"<ul style='margin:2px 0'>{items}</ul></div>")


def warnings_html(cmp: Compared) -> str:
    if not cmp.warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in cmp.warnings)
    return ("<div class='kvs-compare-warnings' style='background:#fff4ce;border:1px solid #e0b000;"
            f"border-radius:4px;padding:4px 10px;margin:6px 0;{FONT}'><b>⚠ not like for like:</b>"
            f"<ul style='margin:2px 0'>{items}</ul></div>")


def summary_html(cmp: Compared) -> str:
    """The warnings and the summary table as HTML (also ``Comparison._repr_html_``)."""
    table = cmp.table
    first = cmp.labels[0]
    head = "".join(f"<th style='text-align:right;padding:2px 10px;border-bottom:2px solid {run_color(i)}'>"
                   f"{html.escape(label)}</th>" for i, label in enumerate(cmp.labels))
    rows = []
    for m in cmp.metrics:
        cells = []
        for i, label in enumerate(cmp.labels):
            text = html.escape(format_value(m.unit, table.at[m.key, label]))
            spread = cmp.spreads[i].get(m.key) if len(cmp.spreads) > i else None
            if spread is not None and spread[0] != spread[1]:
                lo, hi = (html.escape(format_value(m.unit, v)) for v in spread)
                text += f" <span style='color:#888;font-size:11px'>({lo}–{hi})</span>"
            if i:
                text += " " + _ratio_html(table.at[m.key, f"{label} / {first}"], m.better, cmp.within_noise(m.key, i))
            cells.append(f"<td style='text-align:right;padding:1px 10px'>{text}</td>")
        rows.append(f"<tr><td style='padding:1px 10px 1px 0'>{html.escape(m.name)}</td>{''.join(cells)}</tr>")
    note = f"ratios: each run over {html.escape(first)}; green is better, red worse"
    if cmp.spreads:
        note += "; (lo–hi): the repeats' range, the value their median; ≈: within that range, neither"
    return (f"{notes_html(cmp)}{warnings_html(cmp)}"
            f"<table class='kvs-compare-table' style='border-collapse:collapse;{FONT}'>"
            f"<tr><th style='text-align:left'>metric</th>{head}</tr>{''.join(rows)}</table>"
            f"<div style='{FONT};color:#666;font-size:11px'>{note}</div>")


def header_html(cmp: Compared) -> str:
    """The title, the runs with their colours and facts, the settings that differ."""
    runs = []
    for i, (label, run) in enumerate(zip(cmp.labels, cmp.runs)):
        s = cmp.summaries[i]
        facts = (f"{run.meta.get('model', '?')} on {run.meta.get('device', '?')}, {s['requests']} requests, "
                 f"{s['steps']} steps")
        runs.append(f"<span style='color:{run_color(i)};font-size:16px'>■</span> <b>{html.escape(label)}</b> "
                    f"<span style='color:#555'>{html.escape(facts)}</span>")
    diffs = "; ".join(f"{html.escape(k)}: " + " · ".join(html.escape(str(v)) for v in values)
                      for k, values in cmp.differences.items())
    text = (f"<h2 style='font-family:sans-serif;margin:4px 0'>kvscope comparison</h2>"
            f"<div style='{FONT}'>{'<br>'.join(runs)}</div>"
            + (f"<div style='{FONT};margin-top:4px'><b>settings that differ</b> {diffs}</div>" if diffs else ""))
    return text
