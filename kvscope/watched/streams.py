"""A watch's KV event publishers: one ``EventSubscriber`` each, mapped to its server and data-parallel rank,
with sequence tracking, the catch-up replay at the start, gaps filled from the replay, and restarts.

Endpoints pair with the watched URLs: one per URL (in order), or, for one URL, one per data-parallel rank
(rank r publishes on port + r; the batch's own ``data_parallel_rank`` wins when it has one). ``lock`` is the
watch's: held while ``WatchSource`` is changed (the dashboard and the caller read it from other threads).

Replays are bounded: one at a time (they run on the watch's thread), each waiting at most
``REPLAY_TIMEOUT_S`` and never past the watch's ``deadline``; after one that went unanswered the stream
asks again only after a backoff (1 s, 2 s, 4 s, ...), and after ``REPLAY_MAX_FAILURES`` in a row not at all
(each counted in ``faults["replay_failures"]``): a replay endpoint that does not answer costs seconds, not
the watch's duration.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import zmq

from kvscope.watched.events import EventBatch
from kvscope.watched.limits import REPLAY_MAX_FAILURES, REPLAY_TIMEOUT_S
from kvscope.watched.source import WatchSource
from kvscope.watched.subscriber import EventSubscriber

DUPLICATE_WINDOW = 64  # a seq at most this far behind the next expected one is a duplicate, not a restart


@dataclass(slots=True)
class SeqTracker:
    """One publisher's sequence numbers: gaps (batches never received), restarts (seq back to 0, or far
    back) and duplicates (a seq at most ``DUPLICATE_WINDOW`` behind: dropped)."""

    expected: int | None = None  # the next seq, once one was seen
    first_seq: int | None = None  # the first seq received: what came before was missed (or replayed)
    num_batches: int = 0
    num_missed: int = 0  # batches skipped over by gaps (and not replayed)
    num_gaps: int = 0
    num_restarts: int = 0
    num_duplicates: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)  # recent [from, to) ranges missed

    def observe(self, seq: int) -> str:
        """``"ok"``, ``"first"``, ``"gap"`` (batches ``expected..seq-1`` missed), ``"duplicate"`` (a seq
        just behind: drop the batch) or ``"restart"`` (back to 0, or far back: a new publisher)."""
        expected = self.expected
        if expected is None:
            self.first_seq, self.expected, self.num_batches = seq, seq + 1, self.num_batches + 1
            return "first"
        if seq == expected:
            self.expected, self.num_batches = seq + 1, self.num_batches + 1
            return "ok"
        if seq > expected:
            self.num_gaps += 1
            self.num_missed += seq - expected
            self.gaps = [*self.gaps[-19:], (expected, seq)]
            self.expected, self.num_batches = seq + 1, self.num_batches + 1
            return "gap"
        if seq != 0 and expected - seq <= DUPLICATE_WINDOW:
            self.num_duplicates += 1
            return "duplicate"
        self.num_restarts += 1  # back to 0, or far back: the publisher counts from 0 again
        self.expected, self.num_batches = seq + 1, self.num_batches + 1
        return "restart"

    def replayed(self, num: int) -> None:
        """``num`` of the batches counted missed were recovered by a replay."""
        self.num_missed = max(self.num_missed - num, 0)


class Stream:
    """One publisher: its socket, the server it belongs to, its sequence numbers."""

    def __init__(self, sub: EventSubscriber, server: int, rank: int) -> None:
        self.sub, self.server, self.rank = sub, server, rank
        self.seq = SeqTracker()
        self.replayed_to = -1  # live batches up to this seq were already applied from the start's replay
        self.replay_failures = 0  # unanswered replays in a row
        self.replay_after = 0.0  # monotonic time before which no replay is asked (backoff)

    @property
    def can_replay(self) -> bool:
        return (self.sub.replay_endpoint is not None and self.replay_failures < REPLAY_MAX_FAILURES
                and time.monotonic() >= self.replay_after)


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
        self.deadline: float | None = None  # monotonic: no replay waits past it (the watch's end)
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

    def _replay(self, stream: Stream, start: int, until: int | None = None) -> list[EventBatch]:
        """A bounded replay (see the module docstring); ``[]`` when it cannot be asked or got no answer."""
        left = REPLAY_TIMEOUT_S if self.deadline is None else min(REPLAY_TIMEOUT_S, self.deadline - time.monotonic())
        if not stream.can_replay or left <= 0:
            return []
        batches = stream.sub.replay(start, min(left, self.timeout_s), until)
        if batches is None:
            stream.replay_failures += 1
            stream.replay_after = time.monotonic() + 2.0 ** (stream.replay_failures - 1)
            self.source.faults["replay_failures"] += 1
            return []
        stream.replay_failures = 0
        return batches

    def catch_up(self) -> None:
        """With a replay endpoint: what each publisher still buffers, before the live events."""
        for stream in self.streams:
            batches = self._replay(stream, 0)
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
        for stream in self.streams:
            stream.sub.keep_connected()
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
        if kind == "duplicate":
            return
        if kind == "gap" and expected is not None:
            missed = [b for b in self._replay(stream, expected, batch.seq) if expected <= b.seq < batch.seq]
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
        faults["events_duplicate"] = sum(s.seq.num_duplicates for s in self.streams)
        faults["event_disconnects"] = sum(s.sub.num_disconnects for s in self.streams)
        for s in self.streams:
            faults["events_malformed"] += s.sub.num_malformed
            s.sub.num_malformed = 0

    def close(self) -> None:
        for stream in self.streams:
            stream.sub.close()
