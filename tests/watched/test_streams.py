"""A watch's event streams: endpoints checked against the URLs, the start's replay applied once even when
the same batches also arrive live, and a gap filled from the replay."""

from __future__ import annotations

import threading
import time

import pytest
from fakes import FakePublisher, free_port, stored

from kvscope.watched.source import WatchSource
from kvscope.watched.streams import EventStreams, check_endpoints


@pytest.mark.parametrize("connect, bind, replay, urls, message", [
    (["http://x:1"], [], [], 1, "not a ZMQ endpoint"),
    (["tcp://a:1"], [], [], 2, "one per URL"),
    (["tcp://a:1"], ["tcp://b:1"], ["tcp://a:2"], 1, "one per event endpoint"),
])
def test_endpoints_must_fit_the_urls(connect, bind, replay, urls, message):
    with pytest.raises(ValueError, match=message):
        check_endpoints(connect, bind, replay, urls)


def test_several_endpoints_for_one_url_are_its_ranks():
    check_endpoints(["tcp://a:1", "tcp://a:2"], [], [], 1)
    streams = EventStreams(WatchSource(["http://h:1"]), threading.Lock(), 1.0)
    streams.open([f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"], [], [])
    try:
        assert [(s.server, s.rank) for s in streams.streams] == [(0, 0), (0, 1)]
    finally:
        streams.close()


def test_the_start_replay_is_applied_once():
    endpoint, replay_port = f"tcp://127.0.0.1:{free_port()}", free_port()
    pub = FakePublisher(endpoint, replay_port=replay_port)
    source = WatchSource(["http://h:1"])
    streams = EventStreams(source, threading.Lock(), 2.0)
    streams.open([endpoint], [], [f"tcp://127.0.0.1:{replay_port}"])
    (stream,) = streams.streams
    try:
        deadline = time.monotonic() + 10
        while not stream.sub.socket.poll(50):  # subscribed: a probe waits in the socket
            assert time.monotonic() < deadline
            pub.send([])
        for i in range(3):
            pub.send([stored([i])])  # in the socket's queue and in the replay buffer alike
        time.sleep(0.2)
        streams.catch_up()
        streams.receive_all()
        res = source.engines["h:1/0"].residency
        assert res.num_stored == 3 and stream.seq.num_gaps == 0
        pub.seq += 2  # two batches the socket never gets, but the replay has
        pub.buffer += [(pub.seq - 2, pub.payload([stored([10])])), (pub.seq - 1, pub.payload([stored([11])]))]
        pub.send([stored([12])])
        assert streams.wait(5.0)
        streams.count_faults()
        assert res.num_stored == 6 and source.faults["event_gaps"] == 1 and source.faults["events_missed"] == 0
        assert source.faults["events_replayed"] >= 3 + 2
    finally:
        streams.close()
        pub.close()
