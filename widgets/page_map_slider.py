"""The page map's step slider in a notebook: a finished run's page map at any recorded step, shown in a
dashboard's page-map panel. ``report.Replay`` has one from the start; a live dashboard gets one when
its run is over (``Dashboard.offer_replay``), so the end of a run does not hide the run.

The map at a step is ``run.page_map_at(step)`` (the last full snapshot plus the diffs after it); only
the cells that differ from what is shown are patched. Slider events arrive on the kernel's shell
thread; they take the dashboard's lock like every other change to its documents.
"""

from __future__ import annotations

import threading

import ipywidgets as w

from .panels.page_map import PageMapPanel
from .panels.report_parts import RecordedRun


class PageMapSlider:
    """``widget``: an ``IntSlider`` over the run's recorded steps (disabled when no page map was recorded);
    moving it shows the page map at that step in the page-map panel it is ``attach``-ed to, under the lock
    of that panel's dashboard."""

    def __init__(self, run: RecordedRun) -> None:
        self.run = run
        self.page_map: PageMapPanel | None = None
        self.lock: threading.RLock | None = None
        steps = [r.step for r in run.records if r.page_map_full]
        first = steps[0] if steps else 0
        last = run.records[-1].step if run.records else 0
        self.widget = w.IntSlider(value=last, min=first, max=last, description="page map at step",
                                  continuous_update=False, style={"description_width": "120px"},
                                  layout=w.Layout(width="420px"), disabled=not steps)
        self.widget.observe(lambda change: self.show_step(change["new"]), names="value")

    def attach(self, page_map: PageMapPanel, lock: threading.RLock) -> None:
        """Show the steps in ``page_map``, whose document only a holder of ``lock`` changes."""
        self.page_map, self.lock = page_map, lock

    def show_step(self, step: int) -> None:
        page_map, lock = self.page_map, self.lock
        if page_map is None or lock is None:
            return
        entries = self.run.page_map_at(step)
        with lock:
            doc = page_map.model.document
            doc.hold("combine")
            try:
                page_map.show_entries(entries)
                page_map.step = step
            finally:
                doc.unhold()
