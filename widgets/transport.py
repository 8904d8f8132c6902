"""The channel to the browser: what goes over the wire per tick, and when.

jupyter_bokeh 4.1 shapes all of it (its browser side is ``BokehView`` in
``jupyter_bokeh/labextension/static/824.*.js``):

- A PATCH-DOC travels as three custom widget messages (header, metadata, content) plus two per
  binary buffer (``send_patch``). jupyter_bokeh sends one PATCH-DOC per document event;
  ``PatchBatcher`` collects a tick's events (``begin_batch`` ... ``end_batch``) and sends them as one,
  which BokehJS applies in order. ``SerializingSink`` does the same work with nowhere to send it: the
  headless dashboard uses it so that the overhead benchmark pays the serialization a live one pays.
- Each view feeds those messages, one at a time, to the single BokehJS ``Receiver`` it creates with
  itself, which tells the parts apart only by counting them and never resynchronises. The browser
  drops custom messages while a widget has no view, and creates a widget's view asynchronously after
  the output that shows it arrives, possibly between two parts of one PATCH-DOC. Such a view takes a
  later part for a header and stays out of phase for good: every later patch is mis-assembled and
  silently ignored, and that panel freezes (seen in JupyterLab: the KPI tiles stuck at step 3 while
  the plots went on; a text-only panel never falls back into phase). Widget *state* (``render_bundle``)
  is never lost, and a view that re-renders new state keeps its receiver, so state sends are always
  safe. Hence ``ViewGate``: from a display until the kernel hears that the view exists (ipywidgets'
  ``_view_count`` goes up), a widget sends no patch part; it holds its events and sends them as one
  PATCH-DOC when the view is there (they apply on top of the state it rendered), or, if no view is
  reported within ``max_hold_s`` / ``max_hold_bytes`` (no frontend; a busy kernel, which reads the
  browser's messages only when idle), sends its whole state instead and holds anew.
- A slow browser (a small machine, a busy tab) falls behind a 5 Hz stream and the backlog grows:
  the plots then show the past. So every tick also sets ``tags = [tick]`` on each panel's root, and
  ``ACK_JS`` (a ``js_on_change`` callback) answers with an event once the browser has applied it.
  ``Pacer`` lets at most ``max_in_flight`` unacknowledged ticks out; without answers (a view not
  there yet, or a busy kernel) it falls back to one tick a second.

A view the kernel did not announce (the page reloaded during a run, a second view of the output)
gets the whole state when it is reported, but if it was created in the middle of a patch its
receiver cannot be put back in phase from the kernel: that panel shows only later state sends.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bokeh.document import Document
from bokeh.document.events import DocumentPatchedEvent
from bokeh.protocol import Protocol
from bokeh.protocol.message import Message
from bokeh.protocol.messages.patch_doc import patch_doc

Send = Callable[..., None]  # ipywidgets' ``Widget.send(content, buffers=None)``


def send_patch(send: Send, msg: Message) -> None:
    """jupyter_bokeh's wire format (``BokehModel._document_patched``) for one PATCH-DOC message."""
    for part in (msg.header_json, msg.metadata_json, msg.content_json):
        send({"msg": "patch", "payload": part})
    for buffer in msg.buffers:
        send({"msg": "patch", "payload": json.dumps(buffer.ref)})
        send({"msg": "patch"}, [buffer.to_bytes()])


def merge_patches(msgs: list[Message]) -> Message:
    """One PATCH-DOC with the events of ``msgs`` in order (buffer ids are unique across messages)."""
    if len(msgs) == 1:
        return msgs[0]
    merged = patch_doc(patch_doc.create_header(), {}, {"events": [e for m in msgs for e in m.content["events"]]})
    merged.add_buffers(*(b for m in msgs for b in m.buffers))
    return merged


class PatchBatcher:
    """Mixin for a receiver of a document's events (``Document.on_change_dispatch_to``); the class
    it is mixed into provides ``send(content, buffers=None)`` (an ipywidgets ``Widget`` does)."""

    _batch: list[DocumentPatchedEvent] | None = None

    def begin_batch(self) -> None:
        self._batch = []

    def end_batch(self) -> None:
        events, self._batch = self._batch or [], None
        if events:
            self._deliver(Protocol().create("PATCH-DOC", events))

    def _document_patched(self, event: DocumentPatchedEvent) -> None:
        if event.setter is self:
            return
        if self._batch is not None:
            self._batch.append(event)
        else:
            self._deliver(Protocol().create("PATCH-DOC", [event]))

    def _deliver(self, msg: Message) -> None:
        send_patch(self.send, msg)  # type: ignore[attr-defined]


class SerializingSink(PatchBatcher):
    """Builds the messages a BokehModel would send for ``doc`` and drops them (headless mode)."""

    def __init__(self, doc: Document) -> None:
        self.bytes_sent = 0
        doc.on_change_dispatch_to(self)

    def send(self, content: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        self.bytes_sent += len(json.dumps(content)) + sum(len(b) for b in buffers or ())


class ViewGate(PatchBatcher):
    """Mixin for a ``BokehModel`` (which provides ``send``, ``update_from_model`` and ``_model``):
    its patches go out only while no view of it can be in creation (see the module docstring).

    ``expect_view()`` at each display, ``view_arrived()`` when the browser reports a new view. The
    caller passes the lock that guards the document (``init_gate``): the update thread delivers
    patches under it, the shell thread reports views under it, so no patch is ever cut in two.
    """

    max_hold_s = 2.0
    max_hold_bytes = 4 << 20

    def init_gate(self, lock: threading.RLock) -> None:
        self._gate_lock = lock
        self._awaited = 1  # views announced (displays) and not reported yet; the first display comes
        self._held: list[Message] = []  # this widget's patches since the last state send, unsent
        self._held_bytes = 0
        self._since = time.monotonic()  # start of the current hold
        self._patched = False  # patches went out since the last state send

    @property
    def gate_open(self) -> bool:
        return self._awaited == 0

    def send_snapshot(self) -> None:
        """Send the whole document as widget state: every view re-renders it, nothing held is needed."""
        with self._gate_lock:
            self.update_from_model(self._model)  # type: ignore[attr-defined]
            self._held, self._held_bytes = [], 0
            self._since, self._patched = time.monotonic(), False

    def expect_view(self) -> None:
        """A display: a view is coming at any moment from now on. Hold patches until it is reported."""
        with self._gate_lock:
            if self.gate_open:
                self._since = time.monotonic()
            self._awaited += 1

    def view_arrived(self) -> None:
        """The browser created a view (shell thread). Once every announced view is there, bring them
        to one state (the held patches, or the whole state if some views already had patches the new
        ones missed) and let patches flow."""
        with self._gate_lock:
            self._awaited = max(self._awaited - 1, 0)
            if not self.gate_open:
                return
            if self._patched:
                self.send_snapshot()
            elif self._held:
                send_patch(self.send, merge_patches(self._held))  # type: ignore[attr-defined]
                self._held, self._held_bytes, self._patched = [], 0, True

    def _deliver(self, msg: Message) -> None:
        """A tick's patch (under the lock): out now, or held while a view may be in creation."""
        if self.gate_open:
            send_patch(self.send, msg)  # type: ignore[attr-defined]
            self._patched = True
            return
        if not self._patched:  # held patches apply on the last state; else views differ: state it is
            self._held.append(msg)
            self._held_bytes += len(msg.content_json) + sum(memoryview(b.data).nbytes for b in msg.buffers)
        if time.monotonic() - self._since >= self.max_hold_s or self._held_bytes >= self.max_hold_bytes:
            self.send_snapshot()


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


class Pacer:
    """Whether the update thread may send a tick now (see the module docstring)."""

    def __init__(self, max_in_flight: int = 2, slow_interval_s: float = 1.0) -> None:
        self.max_in_flight = max_in_flight
        self.slow_interval_s = slow_interval_s
        self.last_sent = 0.0

    def may_send(self, tick: int, models: Sequence[Any]) -> bool:
        """``models``: the widgets, each with ``gate_open`` and ``acked`` (the last tick it applied)."""
        if not models:  # headless, or not displayed: nothing to wait for
            return True
        if all(m.gate_open for m in models) and tick - min(m.acked for m in models) <= self.max_in_flight:
            return True
        return time.monotonic() - self.last_sent >= self.slow_interval_s

    def sent(self) -> None:
        self.last_sent = time.monotonic()
