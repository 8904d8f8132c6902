"""The dashboard's ipywidgets layout: controls on top, then the panels, each in a ``BokehModel``."""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w
from jupyter_bokeh import BokehModel

from .transport import ViewGate, parse_ack

if TYPE_CHECKING:
    from .dashboard import Dashboard

REFRESH_CHOICES = (1.0, 2.0, 5.0, 10.0)  # updates per second offered by the control
# Rows of panel names; a row with two panels puts them side by side.
ROWS = (("kpi",), ("memory", "page_map"), ("occupancy", "batch"), ("latency",), ("timeline",))


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

    def __init__(self, model, lock: threading.RLock) -> None:
        self.acked = -1  # the last tick the browser has applied (see transport.ACK_JS)
        self.init_gate(lock)
        super().__init__(model, _view_count=0)
        self.observe(self._views_changed, names="_view_count")

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


def show_status(dash: Dashboard) -> None:
    """Refresh the status line; disable the buttons once the run is over."""
    dash._status.value = _status_html(dash)
    buttons = getattr(dash, "_buttons", ())
    if dash.control is not None and dash.control.done:
        for button in buttons:
            button.disabled = True


def _status_html(dash: Dashboard) -> str:
    control = dash.control
    parts = [html.escape(control.status) if control is not None else "replay"]
    stats = dash.stats
    page_map = dash.panel["page_map"]
    if page_map.step is not None:
        parts.append(f"step {page_map.step}")
    parts.append(f"{stats.num_finished}/{stats.num_requests} requests finished")
    if dash.error is not None:
        parts.append(f"dashboard error: {html.escape(repr(dash.error))}")
    return "<span style='font-family:sans-serif;font-size:13px'>" + " · ".join(parts) + "</span>"


def _controls(dash: Dashboard) -> list[w.Widget]:
    control = dash.control
    if control is None:  # a replay: no run to drive, nothing to refresh
        return list(dash.extra_controls)
    refresh = w.Dropdown(
        options=[(f"{hz:g} Hz", hz) for hz in REFRESH_CHOICES],
        value=dash.refresh_hz if dash.refresh_hz in REFRESH_CHOICES else 5.0,
        description="refresh",
        layout=w.Layout(width="150px"),
        style={"description_width": "50px"},
    )
    refresh.observe(lambda change: dash.set_refresh(change["new"]), names="value")
    live = not control.done
    stop = w.Button(description="Stop", icon="stop", button_style="danger", disabled=not live,
                    layout=w.Layout(width="90px"), tooltip="abort every request and end the run")
    pause = w.Button(description="Pause", icon="pause", disabled=not live, layout=w.Layout(width="100px"),
                     tooltip="pause / resume the engine between steps")

    def on_stop(_button: w.Button) -> None:
        control.stop()
        stop.disabled = pause.disabled = True

    def on_pause(_button: w.Button) -> None:
        if control.paused:
            control.resume()
            pause.description, pause.icon = "Pause", "pause"
        else:
            control.pause()
            pause.description, pause.icon = "Resume", "play"

    stop.on_click(on_stop)
    pause.on_click(on_pause)
    dash._buttons = (stop, pause)
    return [stop, pause, refresh, *dash.extra_controls]


def build_layout(dash: Dashboard) -> tuple[w.VBox, list[BokehModel], w.HTML]:
    """(the whole layout, the BokehModels, the status line). Called under the dashboard's lock."""
    models = {p.name: _OneWayBokehModel(p.model, dash._lock) for p in dash.panels}
    status = w.HTML(layout=w.Layout(margin="0 0 0 12px"))
    header = w.HBox([*_controls(dash), status], layout=w.Layout(align_items="center"))
    wrap = w.Layout(flex_flow="row wrap")  # side-by-side panels stack when the output area is narrow
    rows = [w.HBox([models[name] for name in row], layout=wrap) for row in ROWS if all(n in models for n in row)]
    box = w.VBox([header, *rows], layout=w.Layout(max_width="1040px"))
    box.add_class("kvscope-dashboard")
    return box, list(models.values()), status


def close_tree(widget: w.Widget) -> None:
    """Close a widget and everything inside it (not every widget of the kernel, as ``close_all``)."""
    for child in getattr(widget, "children", ()):
        close_tree(child)
    widget.close()
