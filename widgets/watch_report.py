"""A watched vLLM run, shown again: one standalone HTML file (``save_html``: the watch panels filled from
the whole run, BokehJS inlined so it opens offline) or in a notebook (``show``). What
``WatchedRun.save_html`` / ``WatchedRun.show`` call (a run with ``meta["watch"]``); like ``report.py`` it
never imports ``kvscope.runs.result.run``. The panels and their rows are ``panels.registry.WATCH_PANELS``.

The header says which numbers are exact (counters, KV events), which are estimated (percentiles from
histogram buckets) and what cannot be known from outside (block ids, token-level fill, fragmentation).
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import Div
from bokeh.resources import INLINE

from kvscope.utils.files import atomic_write

from .feed import Feed
from .panels.registry import WATCH_PANELS, apply_tick, report_rows
from .panels.report_parts import RecordedRun, ReportContext
from .panels.requests_table import RequestsTable, request_texts
from .stats import LatencyStats
from .watch_dashboard import WatchDashboard, build_watch_panels

NOTES = ("exact: tokens, prefix-cache hits, preemptions and finished requests (vLLM's counters, deltas since "
         "the watch began); cached blocks, evictions and the prefix tree (KV events)",
         "exact: KV transfers, bytes and failures of vLLM's KV connectors (NIXL, offloading); the role is "
         "inferred from which metrics an instance has (vLLM exposes no kv_role)",
         "estimated (≈): TTFT / ITL / end-to-end / KV transfer time percentiles, interpolated inside vLLM's "
         "histogram buckets",
         "unknowable from outside: block ids, which request holds which block, token-level fill, fragmentation")


def _header(run: RecordedRun) -> Div:
    s = run.summary()
    watch = run.meta.get("watch") if isinstance(run.meta.get("watch"), dict) else {}

    def count(key: str) -> str:
        value = s.get(key)
        return "–" if not isinstance(value, (int, float)) or value != value else f"{int(value):,d}"

    def est(key: str) -> str:
        value = s.get(key)
        return "–" if not isinstance(value, float) or math.isnan(value) else f"≈{value * 1e3:.1f} ms"

    urls = ", ".join(str(u) for u in watch.get("urls", []))
    facts = [
        ("watched", html.escape(urls)), ("model", html.escape(str(run.meta.get("model", "?")))),
        ("engines", count("num_engines")), ("prompt tokens", count("prompt_tokens")),
        ("generation tokens", count("generation_tokens")),
        ("prefix-cache hit tokens", count("prefix_cache_hit_tokens")),
        ("preemptions", count("preemptions")), ("finished", count("requests_finished")),
        ("KV blocks stored", count("kv_blocks_stored")), ("TTFT p50", est("ttft_p50_s_estimate")),
        ("ITL p50", est("itl_p50_s_estimate")), ("connection lost", count("connection_lost")),
    ]
    if s.get("kv_transfers") is not None:  # a KV connector: vLLM's NIXL transfers (exact), their time (buckets)
        facts += [("KV transfers", count("kv_transfers")), ("KV bytes moved", count("kv_transfer_bytes")),
                  ("KV transfer p50", est("kv_transfer_time_p50_s_estimate")),
                  ("KV transfer failures", count("kv_transfer_failures"))]
    items = " · ".join(f"<b>{k}</b> {v}" for k, v in facts)
    faults = {k: v for k, v in (s.get("faults") or {}).items() if v and k not in ("event_batches", "plugin_lines")}
    fault_text = ", ".join(f"{html.escape(k)} {v}" for k, v in faults.items()) or "none"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in NOTES)
    return Div(text=f"<h2 style='font-family:sans-serif;margin:4px 0'>kvscope watch</h2>"
                    f"<div style='font-family:sans-serif;font-size:13px'>{items}<br><b>faults</b> {fault_text}"
                    f"<ul style='margin:4px 0;font-size:12px'>{notes}</ul></div>", width=1000)


def build_watch_report(run: RecordedRun):
    """The report's Bokeh layout: the header, then every watch panel filled from the whole run."""
    stats = LatencyStats()
    meta = dict(run.meta)
    meta.setdefault("t0_ns", run.t0_ns)
    panels = build_watch_panels(stats, None, meta)
    apply_tick(panels, stats, Feed.of(run.records, run.events).poll(final=True))
    parts = [_header(run), *report_rows(WATCH_PANELS, panels, ReportContext(run))]
    if len(run.requests):
        parts.append(RequestsTable(run.requests, request_texts(run.meta)).model)
    return column(*parts)


def save_html(run: RecordedRun, path: str | os.PathLike) -> Path:
    """Write the report of the watched ``run`` to ``path`` atomically; returns the path."""
    title = f"kvscope watch · {run.meta.get('model', 'vLLM')}"
    page = file_html(build_watch_report(run), resources=INLINE, title=title)
    return atomic_write(path, lambda f: f.write(page))


def show(run: RecordedRun) -> None:
    """The watch panels of a saved run in a notebook."""
    from IPython.display import display

    meta = dict(run.meta)
    meta.setdefault("t0_ns", run.t0_ns)
    dashboard = WatchDashboard(Feed.of(run.records, run.events), meta=meta, rollover=None)
    dashboard.tick(final=True)
    display(dashboard)
