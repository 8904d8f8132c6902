"""The SUB socket for KV cache events: connect and bind modes, topics, damaged frames (counted, skipped),
the replay of buffered batches, and endpoint errors."""

from __future__ import annotations

import time

import pytest
from fakes import FakePublisher, free_port, stored

from kvscope.watched.subscriber import EventSubscriber


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
