"""The dashboard's ipywidgets layout: controls on top, then the panels, each in a ``BokehModel``."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as w
from jupyter_bokeh import BokehModel

if TYPE_CHECKING:
    from .dashboard import Dashboard

# Rows of panel names; a row with two panels puts them side by side.
ROWS = (("kpi",), ("memory", "page_map"), ("occupancy", "batch"), ("latency",), ("timeline",))


class _LockedBokehModel(BokehModel):
    """A ``BokehModel`` that applies browser-side changes under the dashboard's lock, so that the
    shell thread (which delivers them) and the update thread never change a document together."""

    def __init__(self, model, lock, **kwargs: Any) -> None:
        self._kvscope_lock = lock
        super().__init__(model, **kwargs)

    def _sync_model(self, model, content: dict[str, Any], buffers: list[Any]) -> None:
        with self._kvscope_lock:
            super()._sync_model(model, content, buffers)


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
    refresh = w.Dropdown(
        options=[(f"{hz:g} Hz", hz) for hz in (1.0, 2.0, 5.0, 10.0)],
        value=dash.refresh_hz if dash.refresh_hz in (1.0, 2.0, 5.0, 10.0) else 5.0,
        description="refresh",
        layout=w.Layout(width="150px"),
        style={"description_width": "50px"},
    )
    refresh.observe(lambda change: dash.set_refresh(change["new"]), names="value")
    if control is None:
        return [refresh]
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
    return [stop, pause, refresh]


def build_layout(dash: Dashboard) -> tuple[w.VBox, list[BokehModel], w.HTML]:
    """(the whole layout, the BokehModels, the status line). Called under the dashboard's lock."""
    models = {p.name: _LockedBokehModel(p.model, dash._lock) for p in dash.panels}
    status = w.HTML(layout=w.Layout(margin="0 0 0 12px"))
    header = w.HBox([*_controls(dash), status], layout=w.Layout(align_items="center"))
    rows = [w.HBox([models[name] for name in row]) for row in ROWS if all(n in models for n in row)]
    box = w.VBox([header, *rows], layout=w.Layout(width="1040px"))
    box.add_class("kvscope-dashboard")
    return box, list(models.values()), status
