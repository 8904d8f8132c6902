"""The dashboard's widgets: a header (Stop, Pause, refresh rate, extra controls, status line) over the
panels, each in its own ``BokehModel``. ``DashboardView`` owns all of them; ``Dashboard`` builds one
when it is first shown and tells it the status; the buttons drive a ``Control`` (a ``LiveRun``)."""

from __future__ import annotations

import html
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ipywidgets as w
from bokeh.models import LayoutDOM
from jupyter_bokeh import BokehModel

from .panels.base import Panel
from .panels.registry import ROWS
from .transport import ViewGate, parse_ack

REFRESH_CHOICES = (1.0, 2.0, 5.0, 10.0)  # updates per second offered by the control


class Control(Protocol):
    """What the buttons drive (``kvscope.runs.background.live.LiveRun`` implements it)."""

    @property
    def done(self) -> bool: ...
    @property
    def paused(self) -> bool: ...
    @property
    def status_text(self) -> str: ...  # e.g. "running", "failed: RuntimeError: ..."

    def stop(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class _OneWayBokehModel(ViewGate, BokehModel):
    """A ``BokehModel`` whose documents only the kernel writes, sending one message per tick.

    - Inbound: jupyter_bokeh 4.1 sends every change of the browser's copy of a document back to the
      kernel, including the changes the kernel itself just sent: each ``stream`` comes back and,
      applied again, would duplicate the streamed rows in the kernel (seen in JupyterLab: twice the
      rows, steps out of order). Nothing in the kernel needs browser-side state (pan and zoom are the
      browser's business), so inbound changes are dropped; only the tick acknowledgements of
      ``transport.ACK_JS`` are noted.
    - Outbound: a tick's events go out as one PATCH-DOC message, and only while no view of the widget
      can be in creation (``transport.ViewGate``). ``_view_count = 0`` makes ipywidgets report each
      view the browser creates, which is when the gate learns that the view it waits for is there.
    """

    def __init__(self, model: LayoutDOM, lock: threading.RLock) -> None:
        self.acked = -1  # the last tick the browser has applied (see transport.ACK_JS)
        self.init_gate(lock)
        super().__init__(model, _view_count=0)
        self.observe(self._views_changed, names="_view_count")

    def close(self) -> None:
        """Close once: ``Widget.__del__`` closes again, and jupyter_bokeh's ``close`` raises a second time."""
        if not getattr(self, "_closed", False):
            self._closed = True
            super().close()

    def _views_changed(self, change: dict[str, Any]) -> None:
        if (change["new"] or 0) > (change["old"] or 0):  # a view was created (shell thread)
            self.view_arrived()

    def _sync_model(self, model, content: dict[str, Any], buffers: list[Any]) -> None:
        data = content.get("msg_data")
        if content.get("kind") != "MessageSent" or not isinstance(data, dict):
            return  # a change of the browser's copy (or an echo of ours): not applied
        if data.get("name") == "menu_item_click":
            tick = parse_ack(data.get("values"))
            if tick is not None:
                self.acked = max(self.acked, tick)


class DashboardView:
    """The widgets of one dashboard. Built under the dashboard's lock (each model awaits a view).

    ``models``: one ``BokehModel`` per panel, in the panels' order (what sends each tick's patches);
    ``buttons``: (Stop, Pause), empty for a replay (no ``control``); ``box``: the whole layout.

    The widgets outlive the Python objects that made them: ipywidgets keeps every widget until it is
    closed, and a displayed dashboard stays in the notebook. So they hold the ``control`` and
    ``on_refresh`` weakly: a run the user dropped (with its engine and KV pool) is freed while its
    dashboard still shows its last state; its buttons then do nothing. ``close()`` frees the widgets.
    """

    def __init__(
        self,
        panels: Sequence[Panel],
        lock: threading.RLock,
        *,
        control: Control | None,
        refresh_hz: float,
        on_refresh: Callable[[float], None],
        extra_controls: Sequence[w.Widget] = (),
        rows: Sequence[Sequence[str]] | None = None,
    ) -> None:
        # rows of panel names (a row with two panels puts them side by side): a run's (``registry.ROWS``)
        # unless given
        self._control = weakref.ref(control) if control is not None else None
        by_name = {p.name: _OneWayBokehModel(p.model, lock) for p in panels}
        self.models: list[_OneWayBokehModel] = list(by_name.values())
        self.buttons: tuple[w.Button, ...] = ()
        self.status = w.HTML(layout=w.Layout(margin="0 0 0 12px"))
        controls = [*self._run_controls(refresh_hz, on_refresh), *extra_controls]
        header = w.HBox([*controls, self.status], layout=w.Layout(align_items="center", flex_flow="row wrap"))
        self.header = header
        wrap = w.Layout(flex_flow="row wrap")  # side-by-side panels stack when the output area is narrow
        rows = [w.HBox([by_name[n] for n in row], layout=wrap) for row in rows or ROWS
                if all(n in by_name for n in row)]
        self.box = w.VBox([header, *rows], layout=w.Layout(max_width="1040px"))
        self.box.add_class("kvscope-dashboard")

    @property
    def control(self) -> Control | None:
        """The run the buttons drive, while it exists."""
        return self._control() if self._control is not None else None

    def _run_controls(self, refresh_hz: float, on_refresh: Callable[[float], None]) -> list[w.Widget]:
        control = self.control
        if control is None:  # a replay: no run to drive, nothing to refresh
            return []
        refresh_to = _weak_callable(on_refresh)
        refresh = w.Dropdown(
            options=[(f"{hz:g} Hz", hz) for hz in REFRESH_CHOICES],
            value=refresh_hz if refresh_hz in REFRESH_CHOICES else 5.0,
            description="refresh",
            layout=w.Layout(width="150px"),
            style={"description_width": "50px"},
        )
        refresh.observe(lambda change: refresh_to(change["new"]), names="value")
        live = not control.done
        stop = w.Button(description="Stop", icon="stop", button_style="danger", disabled=not live,
                        layout=w.Layout(width="90px"), tooltip="abort every request and end the run")
        pause = w.Button(description="Pause", icon="pause", disabled=not live, layout=w.Layout(width="100px"),
                         tooltip="pause / resume the engine between steps")

        # the callbacks read self.control each time: they hold no reference to the run
        def on_stop(_button: w.Button) -> None:
            control = self.control
            if control is not None:
                control.stop()
            stop.disabled = pause.disabled = True

        def on_pause(_button: w.Button) -> None:
            control = self.control
            if control is None:
                return
            if control.paused:
                control.resume()
                pause.description, pause.icon = "Pause", "pause"
            else:
                control.pause()
                pause.description, pause.icon = "Resume", "play"

        stop.on_click(on_stop)
        pause.on_click(on_pause)
        self.buttons = (stop, pause)
        return [stop, pause, refresh]

    def add_control(self, control: w.Widget) -> None:
        """One more control in the header, before the status line (a finished run's replay slider)."""
        self.header.children = (*self.header.children[:-1], control, self.status)

    def show_status(self, parts: Sequence[str]) -> None:
        """Show ``parts`` (plain text, escaped here) as the status line; once the run is over, disable
        the buttons."""
        self.parts = list(parts)  # what it says now (a dropped run's view is told more: kvscope.magic.history)
        text = " · ".join(html.escape(part) for part in parts)
        self.status.value = f"<span style='font-family:sans-serif;font-size:13px'>{text}</span>"
        control = self.control
        if control is not None and control.done:
            for button in self.buttons:
                button.disabled = True

    def close(self) -> None:
        """Close every widget of this view (not every widget of the kernel, as ``close_all`` would)."""
        _close_tree(self.box)


def _weak_callable(fn: Callable[[float], None]) -> Callable[[float], None]:
    """``fn`` without keeping its object alive if it is a bound method (then a no-op once it is gone)."""
    if not hasattr(fn, "__self__"):
        return fn
    ref = weakref.WeakMethod(fn)

    def call(value: float) -> None:
        method = ref()
        if method is not None:
            method(value)

    return call


def _close_tree(widget: w.Widget) -> None:
    """Close ``widget``, its children and their ``layout`` / ``style`` widgets (each its own comm, which closing
    the widget alone leaves registered in the kernel)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, w.Widget):
            part.close()
    widget.close()
