"""vLLM's KV cache events: decoding them (no schema) into ``KVEvent``s (``subscriber.py`` receives them).

Wire format (vllm/distributed/kv_events.py): PUB frames ``[topic, seq, payload]``, ``seq`` 8 bytes big-endian
counting from 0 per publisher, ``payload`` msgpack of ``KVEventBatch`` = ``[ts, events, data_parallel_rank]``.
Events are maps tagged by ``type`` since vLLM 0.26 (``{"type": "BlockStored", "block_hashes": [...], ...}``)
and arrays tagged by class name before (``["BlockStored", hashes, parent, token_ids, block_size, lora_id,
medium]``); both decode, unknown fields are ignored. Hashes are ints (uint64) or bytes; here they become
strings (hex), which JSON keeps exactly. Hashes and the hashes of an event are bounded (``limits.py``); what
exceeds them is malformed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from kvscope.watched.limits import MAX_BLOCK_SIZE, MAX_BLOCKS_PER_EVENT, MAX_HASH_BYTES, MAX_MEDIUM, MAX_RANK


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
