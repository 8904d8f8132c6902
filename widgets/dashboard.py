"""The live dashboard: panels in an ipywidgets layout, updated from a background run.

Threading rules (jupyter_bokeh and ipykernel):

- Only the dashboard's update thread changes the panels' Bokeh documents while a run is live. The
  engine thread never touches Bokeh: it only pushes records into the ``Feed`` (non-blocking).
- jupyter_bokeh would also apply browser-side changes on the kernel's shell thread (and re-applies
  the kernel's own streams that the browser echoes back, duplicating rows); ``view._OneWayBokehModel``
  drops them, so no other thread ever writes the documents. The shell thread only reads them, under
  the same lock as a tick, to re-send the whole state when the dashboard is displayed again.
- Each tick is one batch: every document is held with ``hold("combine")`` while all panels update
  and released after (one combined event per source), and each widget sends the tick's events as
  one message (``view._OneWayBokehModel``).
- Ticks are throttled (``refresh_hz``, 5 Hz by default, 1-10 Hz from the control) and paced to
  the browser (``transport.Pacer``: a slow browser gets fewer ticks, not a growing backlog). The update
  thread measures its own share of the process's CPU and lowers a rate whose cost exceeds the 1%
  telemetry budget, saying so on the status line (``cost.CostGovernor``); time
  series stream with ``rollover`` so memory stays bounded in the kernel and in the browser.
- Figures are built once; updates are ``stream`` / ``patch`` / small property changes.
- jupyter_bokeh sends updates as custom widget messages, which a browser drops until the widget's
  view exists, and a view created between the parts of one message ignores every later one. So
  from each display until the browser reports the new views, each widget holds its patches and
  then sends them as one; if no view is reported within a couple of seconds it sends its whole
  state instead (``transport.ViewGate``). No full state is sent while patches flow to a view.
- Comm messages sent from a background thread reach the browser while the kernel is idle, and
  button clicks are delivered only while it is idle; that is why the magic returns at once.

At the end (``final`` tick) the widgets' synced state is refreshed from the documents, so a saved
notebook holds the finished dashboard with its data.

The widgets (buttons, status line, one ``BokehModel`` per panel) belong to a ``view.DashboardView``,
built the first time the dashboard is shown; this class owns the panels, their documents and the
update thread, and tells the view what the status line says.

``headless=True`` builds the panels and runs the same update code with no widgets and no browser
(for the overhead benchmark); with ``serialize=True`` it also builds the messages a live dashboard
would send (``transport.SerializingSink``), so the measured cost matches a live dashboard's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bokeh.document import Document
from bokeh.models import CustomJS

from .bokehjs import ensure_bokehjs
from .cost import CostGovernor
from .feed import Feed, Tick
from .panels.base import DEFAULT_ROLLOVER, Panel
from .panels.registry import apply_tick, build_panels
from .stats import LatencyStats
from .transport import ACK_JS, Pacer, PatchBatcher, SerializingSink

if TYPE_CHECKING:  # view.py brings ipywidgets and jupyter_bokeh: imported when first shown
    from .panels.report_parts import RecordedRun
    from .view import Control, DashboardView

class Dashboard:
    """All panels, fed by ``feed`` and ticked by ``tick()`` or a background thread (``start``)."""

    update_every_tick = False  # panels that read more than the feed (a watch's lanes) update on every tick

    def __init__(
        self,
        feed: Feed | None = None,
        *,
        control: Control | None = None,
        meta: dict | None = None,
        rollover: int | None = DEFAULT_ROLLOVER,
        refresh_hz: float = 5.0,
        headless: bool = False,
        serialize: bool = True,
        extra_controls: list | None = None,
        panels: list[Panel] | None = None,
        rows: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self.feed = feed or Feed()
        self.control = control
        self.meta = meta if meta is not None else {}  # filled in place by a live run (held, not copied)
        self.refresh_hz = refresh_hz
        # the update thread's share of the process's CPU, and the rate it allows (cost.py)
        self.governor = CostGovernor(refresh_hz)
        self.cost_note: str | None = None  # the governor's words on the status line
        self.headless = headless
        self.extra_controls = extra_controls or []  # more widgets for the header (a replay's slider)
        self.stats = LatencyStats()
        # panels: another set than the run's (a watched vLLM server's), laid out in ``rows`` of names
        self.panels = panels if panels is not None else build_panels(self.stats, rollover, meta)
        self.rows = rows
        self.panel = {p.name: p for p in self.panels}
        self.docs: list[Document] = []
        for panel in self.panels:
            doc = Document()
            doc.add_root(panel.model)
            self.docs.append(doc)
        # What sends each document's events: the BokehModel widgets once built, or in headless mode
        # sinks that serialize the same messages and drop them.
        self._senders: list[PatchBatcher] = [SerializingSink(d) for d in self.docs] if headless and serialize else []
        if not headless:  # the browser acknowledges each tick (transport.ACK_JS)
            for panel in self.panels:
                panel.model.js_on_change("tags", CustomJS(code=ACK_JS))
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self.view: DashboardView | None = None  # the widgets, once built (never in headless mode)
        self._displays = 0
        self.pacer = Pacer()
        self.num_ticks = 0
        self.finished = False
        self.error: BaseException | None = None  # an exception that ended the update thread
        self.note: str | None = None  # said last on the status line ("a newer run ...": set_note)

    # ---- updates (one thread at a time) -----------------------------------------------------------------
    def tick(self, final: bool = False) -> Tick:
        """Apply what the feed has: stats first, then every panel, in one held batch per document."""
        with self._lock:
            tick = self.feed.poll(final)
            if tick or final or self.update_every_tick:
                for sender in self._senders:
                    sender.begin_batch()
                for doc in self.docs:
                    doc.hold("combine")
                try:
                    apply_tick(self.panels, self.stats, tick)
                    if self.view is not None:
                        for panel in self.panels:
                            panel.model.tags = [self.num_ticks + 1]  # acknowledged by the browser
                finally:
                    for doc in self.docs:
                        doc.unhold()
                    for sender in self._senders:
                        sender.end_batch()
                self.num_ticks += 1
                self.pacer.sent()
            if final:
                self.finished = True
                self.sync_state()
            self._show_status()
        return tick

    def start(self, done: Callable[[], bool]) -> None:
        """Tick from a background thread until ``done()`` is true, then once more with ``final``."""
        if self._thread is not None:
            raise RuntimeError("this dashboard is already running")
        self._thread = threading.Thread(target=self._loop, args=(done,), name="kvscope-dashboard", daemon=True)
        self._thread.start()

    def _loop(self, done: Callable[[], bool]) -> None:
        try:
            while not self._halt.is_set():
                finished = done()  # read before polling, so the last tick sees every record
                if finished:
                    break
                if self.pacer.may_send(self.num_ticks, self.view.models if self.view is not None else ()):
                    self.tick()
                self._govern()
                self._halt.wait(1.0 / self.refresh_hz)
            self.tick(final=True)
        except BaseException as exc:  # shown in the status line; never kills the kernel
            self.error = exc
            self._show_status()

    def _govern(self) -> None:
        """Update thread: read the clocks for the cost governor; a new rate and its words take effect now."""
        with self._lock:
            self._apply_rate(self.governor.observe(time.monotonic(), time.thread_time(), time.process_time()))

    def _apply_rate(self, hz: float | None) -> None:
        """The governor's new rate (if any) from now on, and its words on the status line."""
        with self._lock:
            if hz is not None:
                self.refresh_hz = hz
            note = self.governor.note()
            if note != self.cost_note:
                self.cost_note = note
                self._show_status()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        """Stop the update thread (the run goes on) and close this dashboard's widgets."""
        self._halt.set()
        self.join(5)
        if self.view is not None:
            self.view.close()

    def sync_state(self) -> None:
        """Re-send each figure whole as widget state (what a saved notebook keeps)."""
        with self._lock:
            for model in self.view.models if self.view is not None else ():
                model.send_snapshot()

    # ---- widgets ----------------------------------------------------------------------------------------
    @property
    def widget(self):
        """The ipywidgets layout (built on first use; never in headless mode)."""
        if self.headless:
            raise RuntimeError("a headless dashboard has no widgets")
        if self.view is None:
            from .view import DashboardView

            with self._lock:
                self.view = DashboardView(self.panels, self._lock, control=self.control,
                                          refresh_hz=self.governor.ceiling_hz,
                                          on_refresh=self.set_refresh, extra_controls=self.extra_controls,
                                          rows=self.rows)
                self._senders = list(self.view.models)  # each awaits a view
            self._show_status()
        return self.view.box

    def offer_replay(self, run: RecordedRun) -> None:
        """Once a live run is over (any thread): a step slider in the header that shows the page map at
        any recorded step of ``run`` (the whole run), as a replay's does."""
        if self.headless or not run.records or "page_map" not in self.panel:
            return
        from .page_map_slider import PageMapSlider

        slider = PageMapSlider(run)
        slider.attach(self.panel["page_map"], self._lock)
        with self._lock:
            self.extra_controls.append(slider.widget)
            if self.view is not None:
                self.view.add_control(slider.widget)

    def status_parts(self) -> list[str]:
        """What the status line says: the run's status (or "replay") and an error that ended the update
        thread. No step or count: those are the tiles', which reach the browser with the plots (a status
        line of its own ran ahead of them: "step 77" over a step tile of 59)."""
        parts = [self.control.status_text if self.control is not None else "replay"]
        simulated = self.meta.get("simulated")
        if isinstance(simulated, dict):  # nobody should take a simulation for a measurement
            parts.insert(0, f"SIMULATED ({simulated.get('step_model_from') or 'step-time model'}; no model ran)")
        if self.error is not None:
            parts.append(f"dashboard error: {self.error!r}")
        if self.cost_note:
            parts.append(self.cost_note)
        if self.note:
            parts.append(self.note)
        return parts

    def set_note(self, note: str | None) -> None:
        """Say ``note`` at the end of the status line from now on (any thread; the magic's "a newer run is
        going: %kvscope show displays it" on an older run's dashboard, which a reloaded page still shows)."""
        with self._lock:
            self.note = note
            self._show_status()

    def _show_status(self) -> None:
        if self.view is not None:
            self.view.show_status(self.status_parts())

    def set_refresh(self, hz: float) -> None:
        """The user's rate (the control): the rate now, and the most the cost governor may raise it to."""
        with self._lock:
            self.refresh_hz = min(max(float(hz), 0.5), 10.0)
            self.governor.set_ceiling(self.refresh_hz)
            if self.cost_note is not None:
                self.cost_note = None
                self._show_status()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        """Each display makes a new view of every widget: the widgets hold their patches until the
        browser reports it (``transport.ViewGate``; the first display's view is awaited from the start)."""
        ensure_bokehjs()  # before the widget's output: this page may be new (a reload; bokehjs.py)
        widget = self.widget
        if self._displays:
            for model in self.view.models:
                model.expect_view()
        self._displays += 1
        return widget._repr_mimebundle_(include=include, exclude=exclude)


def attach_headless(engine, **options: Any) -> Callable[[], None]:
    """Attach a headless dashboard to ``engine``'s recorder, ticking on its own thread as a live
    one would (``serialize=True``: it also builds the widget messages); returns ``detach()``, which
    runs the final tick and stops the thread. For the overhead benchmark."""
    if engine.recorder is None:
        raise ValueError("a dashboard needs an engine with telemetry=True")
    dash = Dashboard(headless=True, **options)
    unsubscribe = engine.recorder.subscribe(dash.feed.push)
    finished = threading.Event()
    dash.start(finished.is_set)

    def detach() -> None:
        unsubscribe()
        finished.set()
        dash.join()

    return detach
