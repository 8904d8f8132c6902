"""A finished run, shown again: as one standalone HTML file (``save_html``: every panel, BokehJS
inlined so it opens offline, a requests table, a step slider that replays the page map), or in a
notebook (``Replay`` / ``show``, what ``kvscope.load(path).show()`` calls).

In the notebook the dashboard's panels are filled from the whole run at once (nothing rolls over),
and an ipywidgets step slider rebuilds the page map at any recorded step (``Run.page_map_at``: the
last full snapshot plus the diffs after it) and patches the cells that differ. Slider events arrive on
the kernel's shell thread; they take the dashboard's lock like every other change to its documents.

The report is laid out from ``panels.registry.PANELS``: each panel in its row, as its ``report`` part
says (``panels.report_parts``); the page map's part adds a step slider whose ``CustomJS`` replays the
map from compact arrays (``panels.replay``).

Text a user wrote (prompts) or a model produced (outputs) reaches the page only as Bokeh string
data shown through ``StringFormatter`` cells and ``@field`` hover values, which the browser receives
as text; every bit of HTML we write ourselves passes ``html.escape``.

The run is a ``kvscope.Run`` (``RecordedRun`` says what is read of it). This module never imports
``kvscope.runs.result.run``: ``Run.save_html`` / ``Run.show`` import this one, and imports go one way.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import Div
from bokeh.resources import INLINE

from kvscope.utils.files import atomic_write

from .dashboard import Dashboard
from .feed import Feed
from .page_map_slider import PageMapSlider
from .panels.registry import PANELS, apply_tick, build_panels, report_rows
from .panels.report_parts import RecordedRun, ReportContext
from .panels.requests_table import RequestsTable, request_texts
from .stats import LatencyStats

__all__ = ["RecordedRun", "Replay", "build_report", "save_html", "show"]

def _simulated(meta: dict) -> dict | None:
    simulated = meta.get("simulated")
    return simulated if isinstance(simulated, dict) else None


def run_title(meta: dict) -> str:
    """The report's title: a simulated run says so, and how its step times were made; another run the title its
    command gave it (``meta["title"]``: "kvscope demo · smollm2"), else "kvscope run"."""
    simulated = _simulated(meta)
    if simulated is None:
        title = meta.get("title")
        return title if isinstance(title, str) and title.strip() else "kvscope run"
    how = simulated.get("step_model_from") or "a step-time model"
    return f"kvscope simulation — SIMULATED, not measured (kvscope simulate; step times: {how})"


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
    return Div(text=f"<h2 style='font-family:sans-serif;margin:4px 0'>{html.escape(run_title(run.meta))}</h2>"
                    f"<div style='font-family:sans-serif;font-size:13px'>{items}</div>", width=1000)


def build_report(run: RecordedRun):
    """The report's Bokeh layout: the header, every panel of ``PANELS`` in its row as its ``report`` part
    says (filled from the whole run, nothing rolled over), and the requests table."""
    stats = LatencyStats()
    meta = dict(run.meta)
    meta.setdefault("t0_ns", run.t0_ns)
    panels = build_panels(stats, rollover=None, meta=meta)
    apply_tick(panels, stats, Feed.of(run.records, run.events).poll(final=True))
    rows = report_rows(PANELS, panels, ReportContext.of(run))
    return column(_header(run), *rows, RequestsTable(run.requests, request_texts(run.meta)).model)


def save_html(run: RecordedRun, path: str | os.PathLike) -> Path:
    """Write the report of ``run`` to ``path`` atomically; returns the path."""
    given = run.meta.get("title")  # the command's ("kvscope demo · smollm2"), as the header's (run_title)
    if isinstance(given, str) and given.strip() and not _simulated(run.meta):
        title = given
    else:
        title = f"kvscope · {run.meta.get('model', 'run')}" + (" · SIMULATED" if _simulated(run.meta) else "")
    page = file_html(build_report(run), resources=INLINE, title=title)
    return atomic_write(path, lambda f: f.write(page))


class Replay:
    """A finished run's dashboard plus a page-map step slider (``page_map_slider.PageMapSlider``)."""

    def __init__(self, run: RecordedRun) -> None:
        self.run = run
        meta = dict(run.meta)
        meta.setdefault("t0_ns", run.t0_ns)
        self.page_map_slider = PageMapSlider(run)
        self.slider = self.page_map_slider.widget
        self.dashboard = Dashboard(Feed.of(run.records, run.events), meta=meta, rollover=None,
                                   extra_controls=[self.slider])
        self.page_map_slider.attach(self.dashboard.panel["page_map"], self.dashboard._lock)
        self.dashboard.tick(final=True)

    def show_step(self, step: int) -> None:
        self.page_map_slider.show_step(step)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return self.dashboard._repr_mimebundle_(include=include, exclude=exclude)


def show(run: RecordedRun) -> None:
    """Display the replay of ``run`` (``Replay(run)`` gives the object itself)."""
    from IPython.display import display

    display(Replay(run))
