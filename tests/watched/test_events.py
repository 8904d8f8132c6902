"""KV cache events: both encodings (maps since vLLM 0.26, tagged arrays before), damaged payloads (counted,
skipped), sequence gaps and restarts (the SUB socket's tests are in test_subscriber.py)."""

from __future__ import annotations

import msgspec
import pytest
from fakes import cleared, removed, stored

from kvscope.watched.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch, hash_key
from kvscope.watched.streams import SeqTracker


def test_hash_keys_are_exact_strings():
    assert hash_key(255) == "ff"
    assert hash_key(2**64 - 1) == "f" * 16  # a uint64 beyond int64 stays exact
    assert hash_key(b"\x01\xab") == "b01ab"
    assert hash_key(-5) == "-5"
    with pytest.raises(ValueError):
        hash_key(True)
    with pytest.raises(ValueError):
        hash_key(1.5)


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_both_encodings_decode_alike(encoding):
    events = [stored([1, 2], parent=None, encoding=encoding), stored([3], parent=2, encoding=encoding),
              removed([1], encoding=encoding), cleared(encoding)]
    batch = decode_batch(msgspec.msgpack.encode([12.5, events, 1]), seq=7)
    assert (batch.ts, batch.data_parallel_rank, batch.seq, batch.num_malformed) == (12.5, 1, 7, 0)
    assert batch.events == [BlockStored(["1", "2"], None, 64, 32, "GPU", 0), BlockStored(["3"], "2", 32, 32, "GPU", 0),
                            BlockRemoved(["1"], "GPU", 0), AllBlocksCleared()]


def test_unknown_fields_and_kinds_are_ignored_damaged_events_counted():
    future = {**stored([9]), "a_field_from_the_future": [1, 2]}
    unknown = {"type": "BlockMoved", "block_hashes": [1]}
    damaged = [{"type": "BlockStored", "block_hashes": 5, "block_size": 32}, {"type": "BlockStored",
               "block_hashes": [1], "block_size": 0}, "not an event", {"type": 3}, ["BlockRemoved", [1.5], "GPU"]]
    batch = decode_batch(msgspec.msgpack.encode([1.0, [future, unknown, *damaged], None]))
    assert [type(e) for e in batch.events] == [BlockStored]
    assert batch.num_malformed == len(damaged) and batch.data_parallel_rank is None


@pytest.mark.parametrize("payload", [b"", b"\xc1", msgspec.msgpack.encode("a string"),
                                     msgspec.msgpack.encode([1.0]), msgspec.msgpack.encode([1.0, 5, 0])])
def test_unreadable_batches_raise_value_error(payload):
    with pytest.raises(ValueError):
        decode_batch(payload)


def test_seq_tracker_sees_gaps_and_restarts():
    t = SeqTracker()
    assert [t.observe(s) for s in (5, 6, 7)] == ["first", "ok", "ok"]
    assert t.observe(10) == "gap" and (t.num_gaps, t.num_missed, t.gaps) == (1, 2, [(8, 10)])
    assert t.observe(0) == "restart" and t.num_restarts == 1
    assert t.observe(1) == "ok" and t.expected == 2
    t.replayed(2)
    assert t.num_missed == 0
