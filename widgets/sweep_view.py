"""A sweep in a notebook: its status, the comparison table filling in as runs finish, and the
dashboard of the run going now (each run's own live dashboard, swapped in when it starts).

``SweepView`` listens to the sweep (``Sweep.listeners``), so it changes on the sweep's thread, as the
dashboards themselves do; the previous run's dashboard is closed when the next one is shown.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from .bokehjs import ensure_bokehjs
from .compare_table import summary_html


class _SweepBox(w.VBox):
    """The sweep's layout; each display loads BokehJS first where the page may be new (``bokehjs``): the
    dashboards it holds are Bokeh widgets."""

    def _repr_mimebundle_(self, **kwargs: Any) -> dict | None:
        ensure_bokehjs()
        return super()._repr_mimebundle_(**kwargs)


class SweepView:
    # sweep: a kvscope.runs.background.sweep.Sweep (not imported: it imports this module)
    def __init__(self, sweep: Any) -> None:
        self.sweep = sweep
        self.status = w.HTML()
        self.table = w.HTML()
        self.current = w.Box()
        self.box = _SweepBox([self.status, self.table, self.current])
        self._shown = None  # the LiveRun whose dashboard is in ``current``
        sweep.listeners.append(self.refresh)
        self.refresh(sweep)

    def refresh(self, sweep: Any) -> None:
        self.status.value = f"<b style='font-family:sans-serif'>{html.escape(sweep.status_text)}</b>"
        if sweep.runs:
            self.table.value = summary_html(sweep)
        elif sweep.warnings:  # every run so far failed
            self.table.value = "<br>".join(html.escape(text) for text in sweep.warnings)
        run = sweep.current
        if run is not None and run is not self._shown and run.dashboard is not None:
            previous, self._shown = self._shown, run
            self.current.children = (run.dashboard.widget,)
            if previous is not None and previous.dashboard is not None:
                previous.dashboard.close()
