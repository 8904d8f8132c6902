"""vLLM's KV cache events over ZMQ: decoding them (no schema) and receiving them (SUB, optional replay).

Wire format (vllm/distributed/kv_events.py): PUB frames ``[topic, seq, payload]``, ``seq`` 8 bytes big-endian
counting from 0 per publisher, ``payload`` msgpack of ``KVEventBatch`` = ``[ts, events, data_parallel_rank]``.
Events are maps tagged by ``type`` since vLLM 0.26 (``{"type": "BlockStored", "block_hashes": [...], ...}``)
and arrays tagged by class name before (``["BlockStored", hashes, parent, token_ids, block_size, lora_id,
medium]``); both decode, unknown fields are ignored. Hashes are ints (uint64) or bytes; here they become
strings (hex), which JSON keeps exactly.

A publisher binds when its endpoint has ``*`` (vLLM with ``tcp://*:5557``): ``EventSubscriber(connect=...)``.
Given a concrete address, vLLM connects, so the watcher binds it: ``EventSubscriber(bind=...)``.

``streams.SeqTracker`` follows one publisher's sequence numbers: a jump forward is a gap (batches lost, e.g. the
subscriber's queue overflowed), a jump back to 0 or by more than ``streams.DUPLICATE_WINDOW`` is a publisher restart
(vLLM counts from 0 again), a seq seen just before is a duplicate (dropped, counted). Frames are bounded
(``zmq.MAXMSGSIZE``: ZMQ drops a longer one, which then shows as a gap), so are hashes and the hashes of an
event (``limits.py``); what exceeds them is malformed. The replay
endpoint (a ROUTER) answers ``[b"", start_seq]`` from a DEALER with the batches it still buffers from that
seq, then an end marker (seq -1, empty payload): ``EventSubscriber.replay`` fetches them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from kvscope.watched.limits import (
    MAX_BLOCK_SIZE,
    MAX_BLOCKS_PER_EVENT,
    MAX_FRAME_BYTES,
    MAX_HASH_BYTES,
    MAX_MEDIUM,
    MAX_RANK,
    MAX_REPLAY_BATCHES,
    RCVHWM,
)

END_SEQ = (1 << 64) - 1  # the replay's end marker, (-1).to_bytes(8, "big", signed=True), read unsigned


def hash_key(value: Any) -> str:
    """A block hash as a string: ints in hex (uint64 may exceed int64), bytes in hex with a ``b`` prefix."""
    if isinstance(value, bool):
        raise ValueError("a block hash is not a bool")
    if isinstance(value, int):
        return format(value, "x") if value >= 0 else "-" + format(-value, "x")
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) > MAX_HASH_BYTES:
            raise ValueError(f"a block hash of {len(value):,} bytes")
        return "b" + bytes(value).hex()
    if isinstance(value, str):
        if len(value) > 2 * MAX_HASH_BYTES:
            raise ValueError(f"a block hash of {len(value):,} characters")
        return "s" + value
    raise ValueError(f"a block hash of type {type(value).__name__}")


@dataclass(slots=True)
class BlockStored:
    """Full blocks became cached: ``block_hashes`` in order, the first one's parent ``parent_block_hash``."""

    block_hashes: list[str]
    parent_block_hash: str | None
    num_tokens: int  # len(token_ids): tokens of all the blocks together
    block_size: int
    medium: str = "GPU"
    group_idx: int = 0


@dataclass(slots=True)
class BlockRemoved:
    """Cached blocks were evicted (their memory reused), not merely freed by a request."""

    block_hashes: list[str]
    medium: str = "GPU"
    group_idx: int = 0


@dataclass(slots=True)
class AllBlocksCleared:
    """The prefix cache was reset."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class EventBatch:
    ts: float  # the publisher's time.time()
    events: list[KVEvent]
    data_parallel_rank: int | None = None
    seq: int = -1
    num_malformed: int = 0  # events of the batch that could not be read (skipped)


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_REMOVED_FIELDS = ("block_hashes", "medium")


def _as_map(obj: Any) -> dict[str, Any]:
    """An event as a map: maps as they are, tagged arrays by the field order of vLLM before 0.26."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], str):
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(obj[0], ())
        return {"type": obj[0], **dict(zip(names, obj[1:]))}
    raise ValueError(f"an event that is neither a map nor a tagged array: {type(obj).__name__}")


def _medium(value: Any) -> str:
    """Where the blocks are (vLLM: "GPU", "CPU", ...; absent or ``None``: "GPU"); ``ValueError`` for text
    longer than ``MAX_MEDIUM`` or with other than ASCII letters, digits, ``_`` and ``-``."""
    if value is None or value == "":
        return "GPU"
    if not isinstance(value, str) or len(value) > MAX_MEDIUM or not value.isascii() \
            or not value.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"an event with medium {str(value)[:40]!r}")
    return value


def _group(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_event(obj: Any) -> KVEvent | None:
    """One decoded event as a ``KVEvent``; ``None`` for a kind this watcher does not know (skipped quietly);
    ``ValueError`` for one that is damaged."""
    d = _as_map(obj)
    kind = d.get("type")
    if kind == "BlockStored":
        hashes = [hash_key(h) for h in _list(d.get("block_hashes"))]
        parent = d.get("parent_block_hash")
        tokens = d.get("token_ids")
        size = d.get("block_size")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_BLOCK_SIZE:
            raise ValueError(f"BlockStored with block_size {size!r}")
        n = len(tokens) if isinstance(tokens, (list, tuple)) else len(hashes) * size
        return BlockStored(hashes, hash_key(parent) if parent is not None else None, n, size,
                           _medium(d.get("medium")), _group(d.get("group_idx")))
    if kind == "BlockRemoved":
        return BlockRemoved([hash_key(h) for h in _list(d.get("block_hashes"))], _medium(d.get("medium")),
                            _group(d.get("group_idx")))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if isinstance(kind, str):
        return None
    raise ValueError(f"an event with type {kind!r}")


def _list(value: Any) -> list:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"block_hashes is a {type(value).__name__}, not a list")
    if len(value) > MAX_BLOCKS_PER_EVENT:
        raise ValueError(f"{len(value):,} block hashes in one event")
    return list(value)


def decode_batch(payload: bytes, seq: int = -1) -> EventBatch:
    """A ``KVEventBatch`` payload (``ValueError`` if the batch itself is unreadable; a damaged event in
    it is skipped and counted in ``num_malformed``)."""
    try:
        obj = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise ValueError(f"not msgpack ({exc})") from None
    if isinstance(obj, dict):
        obj = [obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")]
    if not isinstance(obj, (list, tuple)) or len(obj) < 2 or not isinstance(obj[1], (list, tuple)):
        raise ValueError("not a KVEventBatch ([ts, events, data_parallel_rank])")
    ts = obj[0] if isinstance(obj[0], (int, float)) and not isinstance(obj[0], bool) else 0.0
    rank = obj[2] if len(obj) > 2 and isinstance(obj[2], int) and not isinstance(obj[2], bool) else None
    batch = EventBatch(float(ts) if abs(ts) < 1e12 else 0.0, [], rank if rank is None or 0 <= rank < MAX_RANK
                       else None, seq)
    for raw in obj[1]:
        try:
            event = parse_event(raw)
        except (ValueError, TypeError):
            batch.num_malformed += 1
            continue
        if event is not None:
            batch.events.append(event)
    return batch


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
