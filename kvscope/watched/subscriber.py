"""Receiving vLLM's KV cache events over ZMQ: a SUB socket per publisher, and the optional replay.

A publisher binds when its endpoint has ``*`` (vLLM with ``tcp://*:5557``): ``EventSubscriber(connect=...)``.
Given a concrete address, vLLM connects, so the watcher binds it: ``EventSubscriber(bind=...)``. Frames are
``[topic, seq, payload]`` (``events.py`` decodes the payload).

``streams.SeqTracker`` follows one publisher's sequence numbers: a jump forward is a gap (batches lost, e.g. the
subscriber's queue overflowed), a jump back to 0 or by more than ``streams.DUPLICATE_WINDOW`` is a publisher restart
(vLLM counts from 0 again), a seq seen just before is a duplicate (dropped, counted). Frames are bounded
(``zmq.MAXMSGSIZE``: ZMQ drops a longer one, which then shows as a gap). The replay endpoint (a ROUTER) answers
``[b"", start_seq]`` from a DEALER with the batches it still buffers from that seq, then an end marker (seq -1,
empty payload): ``EventSubscriber.replay`` fetches them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import zmq

from kvscope.watched.events import EventBatch, decode_batch
from kvscope.watched.limits import MAX_FRAME_BYTES, MAX_REPLAY_BATCHES, RCVHWM

END_SEQ = (1 << 64) - 1  # the replay's end marker, (-1).to_bytes(8, "big", signed=True), read unsigned


class EventSubscriber:
    """A SUB socket for one vLLM publisher: ``connect`` to one that binds, or ``bind`` for one that
    connects; ``topic`` filters (``""``: all). ``recv(timeout_s)`` returns the next batch, or ``None``.
    Frames that are not ``[topic, seq, payload]`` are counted in ``num_malformed`` and skipped; a payload
    that does not decode is an empty batch with ``num_malformed=1`` (its seq still counts)."""

    def __init__(self, *, connect: str | None = None, bind: str | None = None, topic: str = "",
                 replay: str | None = None, context: zmq.Context | None = None) -> None:
        if (connect is None) == (bind is None):
            raise ValueError("give one of connect= (the publisher binds) or bind= (the publisher connects)")
        self.endpoint = connect or bind
        self.mode = "connect" if connect else "bind"
        self.replay_endpoint = replay
        self.topic = topic.encode()
        self._ctx = context or zmq.Context.instance()
        self.socket = self._ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, RCVHWM)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.socket.setsockopt(zmq.SUBSCRIBE, self.topic)
        try:
            if connect:
                self.socket.connect(connect)
            else:
                self.socket.bind(bind)
        except zmq.ZMQError as exc:
            self.socket.close(0)
            raise ValueError(f"cannot {self.mode} {self.endpoint}: {exc}") from None
        self.num_malformed = 0
        self.num_disconnects = 0  # connections lost (a frame over MAX_FRAME_BYTES, a publisher gone)
        # ZMQ does not reconnect after dropping an oversized frame: watch for the drop and connect again
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED) if connect else None

    def keep_connected(self) -> None:
        """Connect again after ZMQ dropped the connection (it does so, for good, on a frame over
        ``MAX_FRAME_BYTES``); a publisher that binds is reached again that way."""
        if self._monitor is None:
            return
        dropped = False
        while self._monitor.poll(0):
            self._monitor.recv_multipart()
            dropped = True
        if dropped:
            self.num_disconnects += 1
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disconnect(self.endpoint)
            self.socket.connect(self.endpoint)

    def recv(self, timeout_s: float) -> EventBatch | None:
        if not self.socket.poll(int(timeout_s * 1000)):
            return None
        frames = self.socket.recv_multipart()
        return self._batch(frames)

    def _batch(self, frames: Sequence[bytes]) -> EventBatch | None:
        if len(frames) == 2:  # no topic frame
            frames = [b"", *frames]
        if len(frames) != 3 or len(frames[1]) != 8:
            self.num_malformed += 1
            return None
        seq = int.from_bytes(frames[1], "big")
        try:
            return decode_batch(frames[2], seq)
        except ValueError:  # the batch came (its seq counts) but cannot be read
            return EventBatch(0.0, [], None, seq, num_malformed=1)

    def replay(self, start_seq: int, timeout_s: float = 2.0, until: int | None = None) -> list[EventBatch] | None:
        """The batches the publisher still buffers from ``start_seq`` on (up to ``until``, at most
        ``MAX_REPLAY_BATCHES``): ``[]`` without a replay endpoint, ``None`` when it does not answer within
        ``timeout_s``."""
        if self.replay_endpoint is None:
            return []
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        out: list[EventBatch] = []
        answered = False
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", start_seq.to_bytes(8, "big")], zmq.NOBLOCK)
            deadline = time.monotonic() + timeout_s
            while len(out) < MAX_REPLAY_BATCHES and (left := deadline - time.monotonic()) > 0:
                if not dealer.poll(max(int(left * 1000), 1)):
                    break
                frames, answered = dealer.recv_multipart(), True
                if frames and frames[0] == b"":
                    frames = frames[1:]  # the DEALER keeps the ROUTER's empty delimiter
                if len(frames) >= 2 and len(frames[1]) == 8 and int.from_bytes(frames[1], "big") == END_SEQ:
                    break
                batch = self._batch(frames)
                if batch is not None:
                    out.append(batch)
                    if until is not None and batch.seq >= until - 1:
                        break
        except zmq.ZMQError:
            self.num_malformed += 1
        finally:
            dealer.close(0)
        return out if answered else None

    def close(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.disable_monitor()
            self._monitor.close(0)
        self.socket.close(0)
