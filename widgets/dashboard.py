"""The live dashboard: panels in an ipywidgets layout, updated from a background run.

Threading rules (jupyter_bokeh and ipykernel):

- Only the dashboard's update thread changes the panels' Bokeh documents while a run is live. The
  engine thread never touches Bokeh: it only pushes records into the ``Feed`` (non-blocking).
- The one other writer is jupyter_bokeh itself, which applies browser-side changes (a pan, a zoom)
  on the kernel's shell thread; ``_LockedBokehModel`` makes that take the same lock as a tick, so
  the documents are only ever changed by one thread at a time.
- Each tick is one batch: every document is held with ``hold("combine")`` while all panels update
  and released after, so a tick sends one combined patch per source.
- Ticks are throttled (``refresh_hz``, 5 Hz by default, 1-10 Hz from the control); time series
  stream with ``rollover`` so memory stays bounded in the kernel and in the browser.
- Figures are built once; updates are ``stream`` / ``patch`` / small property changes.
- Comm messages sent from a background thread reach the browser while the kernel is idle, and
  button clicks are delivered only while it is idle; that is why the magic returns at once.

At the end (``final`` tick) the widgets' synced state is refreshed from the documents, so a saved
notebook holds the finished dashboard with its data.

``headless=True`` builds the panels and runs the same update code with no widgets and no browser
(for the overhead benchmark); with ``serialize=True`` it also serializes every document change the
way jupyter_bokeh does before sending it, so the measured cost matches a live dashboard's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from bokeh.document import Document
from bokeh.document.events import DocumentPatchedEvent
from bokeh.protocol import Protocol as BokehProtocol

from .feed import Feed, Tick
from .panels import DEFAULT_ROLLOVER, build_panels
from .stats import LatencyStats

REFRESH_CHOICES = (1.0, 2.0, 5.0, 10.0)
_bokehjs_loaded = False


def ensure_bokehjs() -> None:
    """Load BokehJS into the notebook page once (inline, works offline). Without it JupyterLab
    cannot create jupyter_bokeh's views ("Failed to create view for 'BokehView'")."""
    global _bokehjs_loaded
    if _bokehjs_loaded:
        return
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(INLINE, hide_banner=True)
    _bokehjs_loaded = True


class Control(Protocol):
    """What the buttons drive (``kvscope.live.LiveRun`` implements it)."""

    done: bool
    paused: bool
    status: str

    def stop(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class Dashboard:
    """All panels, fed by ``feed`` and ticked by ``tick()`` or a background thread (``start``)."""

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
    ) -> None:
        self.feed = feed or Feed()
        self.control = control
        self.refresh_hz = refresh_hz
        self.headless = headless
        self.stats = LatencyStats()
        self.panels = build_panels(self.stats, rollover, meta)
        self.panel = {p.name: p for p in self.panels}
        self.docs: list[Document] = []
        for panel in self.panels:
            doc = Document()
            doc.add_root(panel.model)
            if headless and serialize:
                doc.on_change(_serialize_like_jupyter_bokeh)
            self.docs.append(doc)
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._widget = None
        self.num_ticks = 0
        self.finished = False
        self.error: BaseException | None = None  # an exception that ended the update thread

    # ---- updates (one thread at a time) -----------------------------------------------------------------
    def tick(self, final: bool = False) -> Tick:
        """Apply what the feed has: stats first, then every panel, in one held batch per document."""
        with self._lock:
            tick = self.feed.poll(final)
            if tick or final:
                for item in tick.ordered():
                    self.stats.add(item)
                for doc in self.docs:
                    doc.hold("combine")
                try:
                    for panel in self.panels:
                        panel.update(tick)
                finally:
                    for doc in self.docs:
                        doc.unhold()
                self.num_ticks += 1
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
                self.tick()
                if finished:
                    break
                self._halt.wait(1.0 / self.refresh_hz)
            self.tick(final=True)
        except BaseException as exc:  # shown in the status line; never kills the kernel
            self.error = exc
            self._show_status()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        """Stop the update thread (the run goes on) and close the widgets."""
        self._halt.set()
        self.join(5)
        if self._widget is not None:
            self._widget.close_all()

    def sync_state(self) -> None:
        """Re-send each figure whole as widget state (what a saved notebook keeps)."""
        with self._lock:
            for model in getattr(self, "_bokeh_models", []):
                model.update_from_model(model._model)

    # ---- widgets ----------------------------------------------------------------------------------------
    @property
    def widget(self):
        """The ipywidgets layout (built on first use; never in headless mode)."""
        if self.headless:
            raise RuntimeError("a headless dashboard has no widgets")
        if self._widget is None:
            from .layout import build_layout

            ensure_bokehjs()
            with self._lock:
                self._widget, self._bokeh_models, self._status = build_layout(self)
            self._show_status()
        return self._widget

    def _show_status(self) -> None:
        if self._widget is not None:
            from .layout import show_status

            show_status(self)

    def set_refresh(self, hz: float) -> None:
        self.refresh_hz = min(max(float(hz), 0.5), 10.0)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        return self.widget._repr_mimebundle_(include=include, exclude=exclude)


def _serialize_like_jupyter_bokeh(event: Any) -> None:
    if isinstance(event, DocumentPatchedEvent):
        msg = BokehProtocol().create("PATCH-DOC", [event])
        _ = (msg.header_json, msg.metadata_json, msg.content_json, [b.to_bytes() for b in msg.buffers])


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass (for tests and --wait)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
