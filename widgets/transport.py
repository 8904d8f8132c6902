"""The channel to the browser: what goes over the wire per tick, and when.

jupyter_bokeh 4.1 shapes all of it:

- It sends one PATCH-DOC (three widget messages, plus two per binary buffer) for every document
  event. ``PatchBatcher`` collects a tick's events (``begin_batch`` ... ``end_batch``) and sends them
  as a single PATCH-DOC in jupyter_bokeh's own wire format, which BokehJS applies in order.
  ``SerializingSink`` does the same work with nowhere to send it: the headless dashboard uses it so
  that the overhead benchmark pays the serialization a live dashboard pays.
- Updates are custom widget messages, which the browser drops while a widget has no view yet
  (BokehJS still loading, output not rendered): ``ViewReadiness`` re-sends the whole widget state
  (never lost) now and then until every view has confirmed it rendered.
- A slow browser (a small machine, a busy tab) falls behind a 5 Hz stream and the backlog grows:
  the plots then show the past. So every tick also sets ``tags = [tick]`` on each panel's root, and
  ``ACK_JS`` (a ``js_on_change`` callback) answers with an event once the browser has applied it.
  ``Pacer`` lets at most ``max_in_flight`` unacknowledged ticks out; without answers (no view yet,
  or a busy kernel, which reads messages only when idle) it falls back to one tick a second.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

from bokeh.document import Document
from bokeh.document.events import DocumentPatchedEvent
from bokeh.protocol import Protocol


class PatchBatcher:
    """Mixin for a receiver of a document's events (``Document.on_change_dispatch_to``); the class
    it is mixed into provides ``send(content, buffers=None)`` (an ipywidgets ``Widget`` does)."""

    _batch: list[DocumentPatchedEvent] | None = None

    def begin_batch(self) -> None:
        self._batch = []

    def end_batch(self) -> None:
        events, self._batch = self._batch or [], None
        if events:
            self._send_patch(events)

    def _document_patched(self, event: DocumentPatchedEvent) -> None:
        if event.setter is self:
            return
        if self._batch is not None:
            self._batch.append(event)
        else:
            self._send_patch([event])

    def _send_patch(self, events: list[DocumentPatchedEvent]) -> None:
        """jupyter_bokeh's wire format (``BokehModel._document_patched``), for a list of events."""
        msg = Protocol().create("PATCH-DOC", events)
        send = self.send  # type: ignore[attr-defined]
        for part in (msg.header_json, msg.metadata_json, msg.content_json):
            send({"msg": "patch", "payload": part})
        for buffer in msg.buffers:
            send({"msg": "patch", "payload": json.dumps(buffer.ref)})
            send({"msg": "patch"}, [buffer.to_bytes()])


class SerializingSink(PatchBatcher):
    """Builds the messages a BokehModel would send for ``doc`` and drops them (headless mode)."""

    def __init__(self, doc: Document) -> None:
        self.bytes_sent = 0
        doc.on_change_dispatch_to(self)

    def send(self, content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        self.bytes_sent += len(json.dumps(content)) + sum(len(b) for b in buffers or ())


ACK_PREFIX = "kvscope-ack:"
ACK_JS = f"""
const {{MenuItemClick}} = Bokeh.require("core/bokeh_events");
cb_obj.document.event_manager.send_event(new MenuItemClick("{ACK_PREFIX}" + cb_obj.tags[0]));
"""
_ACK_RE = re.compile(re.escape(ACK_PREFIX) + r"(\d+)")


def parse_ack(values: Any) -> int | None:
    """The tick number in an acknowledgement event's values, if it is one."""
    match = _ACK_RE.search(json.dumps(values))
    return int(match.group(1)) if match else None


class ViewReadiness:
    """Whether the browser has views for every BokehModel yet, and when to re-send their state.

    jupyter_bokeh sends updates as custom widget messages, which the browser drops while a widget has
    no view (the page is still loading BokehJS, the output is not rendered yet): a lost stream leaves
    a gap, a lost page-map grid leaves patches with nothing to patch. Widget *state* is never lost,
    so until every view has confirmed it rendered (BokehJS sends ``document_ready``, which
    jupyter_bokeh forwards; it reaches the kernel only while the kernel is idle), ``due()`` asks for
    the whole state to be re-sent every ``interval_s``, and once more right after confirmation.
    """

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self._models: list[Any] = []
        self._ready: set[int] = set()
        self._settled = True
        self._last = 0.0

    def expect(self, models: list[Any]) -> None:
        """New views are coming (a display): each model must confirm again."""
        self._models = list(models)
        self._ready = set()
        self._settled = False
        self._last = time.monotonic()

    def mark(self, model: Any) -> None:
        """A view of ``model`` rendered (shell thread)."""
        self._ready.add(id(model))

    @property
    def confirmed(self) -> bool:
        return all(id(m) in self._ready for m in self._models)

    def due(self) -> bool:
        """Whether to re-send the widgets' state after this tick (update thread)."""
        if self._settled:
            return False
        now = time.monotonic()
        if self.confirmed:
            self._settled = True  # views exist now; one last full send covers what they missed
            return True
        if now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


class Pacer:
    """Whether the update thread may send a tick now (see the module docstring)."""

    def __init__(self, max_in_flight: int = 2, slow_interval_s: float = 1.0) -> None:
        self.max_in_flight = max_in_flight
        self.slow_interval_s = slow_interval_s
        self.last_sent = 0.0

    def may_send(self, tick: int, views: ViewReadiness, models: Sequence[Any]) -> bool:
        if not models:  # headless, or not displayed: nothing to wait for
            return True
        if views.confirmed and tick - min(m.acked for m in models) <= self.max_in_flight:
            return True
        return time.monotonic() - self.last_sent >= self.slow_interval_s

    def sent(self) -> None:
        self.last_sent = time.monotonic()
