"""A watch's KV event publishers: one ``EventSubscriber`` each, mapped to its server and data-parallel rank,
with sequence tracking, the catch-up replay at the start, gaps filled from the replay, and restarts.

Endpoints pair with the watched URLs: one per URL (in order), or, for one URL, one per data-parallel rank
(rank r publishes on port + r; the batch's own ``data_parallel_rank`` wins when it has one). ``lock`` is the
watch's: held while ``WatchSource`` is changed (the dashboard and the caller read it from other threads).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

import zmq

from kvscope.watch.events import EventBatch, EventSubscriber, SeqTracker
from kvscope.watch.source import WatchSource


class Stream:
    """One publisher: its socket, the server it belongs to, its sequence numbers."""

    def __init__(self, sub: EventSubscriber, server: int, rank: int) -> None:
        self.sub, self.server, self.rank = sub, server, rank
        self.seq = SeqTracker()
        self.replayed_to = -1  # live batches up to this seq were already applied from the start's replay


def check_endpoints(connect: list[str], bind: list[str], replay: list[str], num_urls: int) -> None:
    """``ValueError`` naming what does not fit (before anything starts)."""
    endpoints = connect + bind
    for e in endpoints:
        if not e.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"{e!r} is not a ZMQ endpoint like tcp://127.0.0.1:5557")
    if num_urls > 1 and endpoints and len(endpoints) != num_urls:
        raise ValueError(f"{len(endpoints)} KV event endpoints for {num_urls} URLs: give one per URL "
                         "(in the same order), or several for one URL's data-parallel ranks")
    if replay and len(replay) != len(endpoints):
        raise ValueError(f"{len(replay)} replay endpoints for {len(endpoints)} KV event endpoints: "
                         "give one per event endpoint")


class EventStreams:
    def __init__(self, source: WatchSource, lock: AbstractContextManager, timeout_s: float) -> None:
        self.source, self.lock, self.timeout_s = source, lock, timeout_s
        self.streams: list[Stream] = []
        self._poller = zmq.Poller()
        self._by_socket: dict[zmq.Socket, Stream] = {}

    def open(self, connect: list[str], bind: list[str], replay: list[str], topic: str = "") -> None:
        """One subscriber per endpoint (``ValueError`` for an address that cannot be bound)."""
        endpoints = [("connect", e) for e in connect] + [("bind", e) for e in bind]
        one_server = len(self.source.urls) == 1
        for i, (mode, endpoint) in enumerate(endpoints):
            sub = EventSubscriber(**{mode: endpoint}, topic=topic, replay=replay[i] if replay else None)
            stream = Stream(sub, 0 if one_server else i, i if one_server else 0)
            self.streams.append(stream)
            self._poller.register(sub.socket, zmq.POLLIN)
            self._by_socket[sub.socket] = stream

    def catch_up(self) -> None:
        """With a replay endpoint: what each publisher still buffers, before the live events."""
        for stream in self.streams:
            if stream.sub.replay_endpoint is None:
                continue
            batches = stream.sub.replay(0, self.timeout_s)
            with self.lock:
                for batch in batches:
                    stream.seq.observe(batch.seq)
                    self._apply(stream, batch)
                    stream.replayed_to = batch.seq
                self.source.faults["events_replayed"] += len(batches)

    def wait(self, timeout_s: float) -> bool:
        """Receive what comes within ``timeout_s``; ``False`` with no publisher to wait on."""
        if not self.streams:
            return False
        for socket, _ in self._poller.poll(max(int(timeout_s * 1000), 1)):
            self.receive(self._by_socket[socket])
        return True

    def receive_all(self) -> None:
        for stream in self.streams:
            self.receive(stream)

    def receive(self, stream: Stream, limit: int = 1000) -> None:
        """The batches waiting on ``stream``'s socket (at most ``limit``, so polls stay on time)."""
        for _ in range(limit):
            batch = stream.sub.recv(0)
            if batch is None:
                return
            with self.lock:
                self._on_batch(stream, batch)

    def _on_batch(self, stream: Stream, batch: EventBatch) -> None:
        expected = stream.seq.expected
        if batch.seq <= stream.replayed_to and expected is not None and batch.seq < expected:
            return  # already applied from the start's replay
        stream.replayed_to = -1
        kind = stream.seq.observe(batch.seq)
        if kind == "gap" and stream.sub.replay_endpoint is not None and expected is not None:
            missed = [b for b in stream.sub.replay(expected, self.timeout_s) if expected <= b.seq < batch.seq]
            for old in missed:
                self._apply(stream, old)
            stream.seq.replayed(len(missed))
            self.source.faults["events_replayed"] += len(missed)
        elif kind == "restart":
            label = batch.data_parallel_rank if batch.data_parallel_rank is not None else stream.rank
            self.source.on_event_restart(stream.server, label)
        self._apply(stream, batch)

    def _apply(self, stream: Stream, batch: EventBatch) -> None:
        self.source.on_events(stream.server, batch, time.perf_counter_ns(), stream.rank)

    def count_faults(self) -> None:
        """The streams' counts into ``source.faults`` (call under the lock)."""
        faults = self.source.faults
        faults["event_gaps"] = sum(s.seq.num_gaps for s in self.streams)
        faults["events_missed"] = sum(s.seq.num_missed for s in self.streams)
        faults["event_restarts"] = max(faults["event_restarts"], sum(s.seq.num_restarts for s in self.streams))
        for s in self.streams:
            faults["events_malformed"] += s.sub.num_malformed
            s.sub.num_malformed = 0

    def close(self) -> None:
        for stream in self.streams:
            stream.sub.close()
