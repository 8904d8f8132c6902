"""KV cache events: both encodings (maps since vLLM 0.26, tagged arrays before), damaged payloads and frames
(counted, skipped), sequence gaps and restarts, and the SUB socket in connect and bind modes with replay."""

from __future__ import annotations

import time

import msgspec
import pytest
from fakes import FakePublisher, cleared, free_port, removed, stored

from kvscope.watched.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventSubscriber,
    decode_batch,
    hash_key,
)
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


def receive(sub: EventSubscriber, pub: FakePublisher | None = None, n: int = 1, timeout: float = 10.0) -> list:
    """The next ``n`` batches; while none has come, ``pub`` sends empty probes (PUB drops messages sent before
    a subscription is in place)."""
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        if pub is not None and not out:
            pub.send([])
        batch = sub.recv(0.05)
        if batch is not None:
            out.append(batch)
    return out


@pytest.mark.parametrize("publisher_binds", [True, False])
def test_subscriber_connects_or_binds(publisher_binds):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    if publisher_binds:  # vLLM with tcp://*:PORT
        pub = FakePublisher(endpoint, bind=True)
        sub = EventSubscriber(connect=endpoint)
    else:  # vLLM given a concrete address connects to it
        sub = EventSubscriber(bind=endpoint)
        pub = FakePublisher(endpoint, bind=False)
    try:
        assert receive(sub, pub)  # subscribed
        seq = pub.send([stored([1, 2])])
        (batch,) = receive(sub)
        assert batch.seq == seq and [e.block_hashes for e in batch.events] == [["1", "2"]]
    finally:
        sub.close()
        pub.close()


def test_topic_filter_and_malformed_frames():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = FakePublisher(endpoint, topic="kv-events")
    sub = EventSubscriber(connect=endpoint, topic="kv-events")
    other = EventSubscriber(connect=endpoint, topic="something-else")
    try:
        assert receive(sub, pub)
        pub.send([], frames=[b"kv-events", b"\x00\x01", b"payload"])  # seq of 2 bytes
        pub.send([], frames=[b"kv-events", (1).to_bytes(8, "big"), b"p", b"extra"])  # four frames
        pub.send([], raw=b"\xc1")  # not msgpack
        pub.send([stored([3])])
        damaged, good = receive(sub, n=2)
        assert (damaged.seq, damaged.events, damaged.num_malformed) == (good.seq - 1, [], 1)  # its seq counts
        assert good.events[0].block_hashes == ["3"] and sub.num_malformed == 2
        assert other.recv(0.2) is None  # another topic's subscriber got none of it
    finally:
        for s in (sub, other):
            s.close()
        pub.close()


def test_replay_returns_the_buffered_batches():
    endpoint, replay_port = f"tcp://127.0.0.1:{free_port()}", free_port()
    pub = FakePublisher(endpoint, replay_port=replay_port)
    for i in range(5):
        pub.send([stored([100 + i])])  # nobody is subscribed yet: lost but for the replay buffer
    sub = EventSubscriber(connect=endpoint, replay=f"tcp://127.0.0.1:{replay_port}")
    try:
        batches = sub.replay(2)
        assert [b.seq for b in batches] == [2, 3, 4]
        assert [b.events[0].block_hashes for b in batches] == [["66"], ["67"], ["68"]]
        assert EventSubscriber(connect=endpoint).replay(0) == []  # no replay endpoint
    finally:
        sub.close()
        pub.close()


def test_replay_that_does_not_answer_gives_nothing():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sub = EventSubscriber(connect=endpoint, replay=f"tcp://127.0.0.1:{free_port()}")
    try:
        assert sub.replay(0, timeout_s=0.2) is None  # no answer: None (an empty answer is [])
    finally:
        sub.close()


def test_endpoint_errors():
    with pytest.raises(ValueError, match="one of"):
        EventSubscriber()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = EventSubscriber(bind=endpoint)
    try:
        with pytest.raises(ValueError, match="cannot bind"):
            EventSubscriber(bind=endpoint)  # the port is taken
    finally:
        first.close()
