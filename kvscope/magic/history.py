"""The runs ``%kvscope`` started in this kernel: the last one (``%kvscope show`` displays its dashboard again: a
page reloaded during a run of an unsaved notebook lost its output, not the run), the note on older dashboards that
a newer run exists, and which dashboards a kernel can let go of.

A displayed dashboard's widgets live in the kernel until they are closed (ipywidgets keeps every widget), so a
cell run again and again would keep every earlier run's dashboard: its Bokeh documents, a few MiB a run. A cell
run again replaced its output in the page, so a dashboard shown only in cells that have run again since is no
longer on the page; it is closed (its widgets freed) unless it belongs to one of the ``KEEP_LIVE`` newest runs
(the previous run's stays: a page reloaded from a notebook saved earlier shows that run's output, and its status
line says a newer run exists). Without cell ids (a plain IPython shell, a frontend that sends none) a dashboard
is closed once ``KEEP_SHOWN`` newer runs exist. Closing a dashboard leaves its run and results readable.

The cell being run comes from IPython's ``pre_run_cell`` event (``ExecutionInfo.cell_id``: the ``cellId`` a
Jupyter frontend sends with each execution).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

KEEP_LIVE = 2  # the newest runs whose dashboards stay open whatever happened to their cells
KEEP_SHOWN = 8  # without cell ids: the newest runs whose dashboards stay open
NO_CELL = ""  # a display in a cell without an id: never known to be replaced
NOTE = "a newer run started at"


@dataclass(slots=True)
class Shown:
    """A run a magic started, held weakly, its dashboard's widgets once displayed (held: they outlive a dropped run
    in the kernel, which is why they must be closed), and the cells they were displayed in."""

    run: weakref.ref
    started: float
    view: Any = None  # the dashboard's DashboardView
    cells: set[str] = field(default_factory=set)

    def note(self, note: str) -> None:
        """Say ``note`` at the end of the dashboard's status line (the run's, or a dropped run's last words)."""
        run = self.run()
        if run is not None and run.dashboard is not None:
            run.dashboard.set_note(note)
        elif self.view is not None:
            self.view.show_status([p for p in getattr(self.view, "parts", []) if not p.startswith(NOTE)] + [note])

    def close(self) -> None:
        run = self.run()
        if run is not None and run.dashboard is not None:
            run.dashboard.close()  # its update thread too
        elif self.view is not None:
            self.view.close()
        self.view = None


class RunHistory:
    """The magic's runs in this kernel (see the module doc); the last one is held (``%kvscope show``)."""

    def __init__(self) -> None:
        self.last: Any = None  # the last run started (kept alive for %kvscope show)
        self.runs: list[Shown] = []  # oldest first
        self.cell: str = NO_CELL  # the cell running now
        self.closed = 0  # dashboards closed so far (tests and the report read it)

    # ---- events ---------------------------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        """IPython's event: a cell starts; the dashboards it showed left the page."""
        self.cell = getattr(info, "cell_id", None) or NO_CELL
        if self.cell != NO_CELL:
            for shown in self.runs:
                shown.cells.discard(self.cell)
        self._close_unseen()

    def started(self, run: Any) -> None:
        """A magic started ``run`` (shown in the current cell unless it is quiet): older dashboards say so."""
        self.last = run
        self.runs.append(Shown(weakref.ref(run), time.time()))
        note = f"{NOTE} {time.strftime('%H:%M:%S')}: %kvscope show displays it"
        for shown in self.runs[:-1]:
            shown.note(note)
        self._close_unseen()

    def let_go_of_last(self) -> None:
        """Stop holding the last run if it is over (``%kvscope release``: its engine can go once nobody else holds
        the run); ``%kvscope show`` still shows its dashboard's widgets."""
        if self.last is not None and self.last.done:
            self.last = None

    def newest_view(self) -> Any:
        """The newest displayed dashboard's view whose run is gone (a finished run let go of), or ``None``."""
        shown = self.runs[-1] if self.runs else None
        return shown.view if shown is not None and shown.run() is None else None

    def displayed(self, run: Any) -> None:
        """``run``'s dashboard was displayed in the current cell."""
        for shown in self.runs:
            if shown.run() is run:
                shown.cells.add(self.cell)
                if run.dashboard is not None and getattr(run.dashboard, "view", None) is not None:
                    shown.view = run.dashboard.view

    # ---- letting go -------------------------------------------------------------------------------------
    def _close_unseen(self) -> None:
        """Close the dashboards no longer on the page (see the module doc); forget runs that are gone and showed
        nothing."""
        kept = [s for s in self.runs if s.run() is not None or s.view is not None]
        for age, shown in enumerate(list(reversed(kept))):  # age 0: the newest
            if age < KEEP_LIVE:
                continue
            unseen = not shown.cells if NO_CELL not in shown.cells else age >= KEEP_SHOWN
            if unseen:
                run = shown.run()
                if shown.view is not None or (run is not None and run.dashboard is not None):
                    self.closed += 1
                shown.close()
                kept.remove(shown)
        self.runs = kept


HISTORY = RunHistory()
