"""A watched server that stalls (issue 25, items 4 and 5): a ``/metrics`` page dripped a byte at a time,
a replay endpoint that never answers. The watch keeps its duration, stops at SIGTERM, writes its files."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
from reliability_util import FIGURES
from watch_util import FakePublisher, HostileServer, free_port, render, run_watch, stored

import kvscope
from kvscope.watched.metrics import ScrapeError, ScrapeStopped, fetch

COUNTS: dict[str, float] = {}  # seconds, printed with the reliability figures


def test_a_dripped_page_ends_at_the_fetch_deadline_and_at_a_stop():
    server = HostileServer()
    server.respond = HostileServer.drip(0.2)
    try:
        t = time.monotonic()
        with pytest.raises(ScrapeError, match="no complete page within the timeout"):
            fetch(server.url, timeout=1.0)  # before: each byte reset urlopen's timeout, for a minute
        COUNTS["dripped page, fetch with timeout 1 s"] = time.monotonic() - t
        assert COUNTS["dripped page, fetch with timeout 1 s"] < 1.5
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        t = time.monotonic()
        with pytest.raises(ScrapeStopped):
            fetch(server.url, timeout=30.0, cancel=cancel)
        assert time.monotonic() - t < 0.3 + 0.5
    finally:
        server.stop()


def _drip_after_first(server: HostileServer) -> None:
    page, drip, state = HostileServer.page(render({"0": _engine()})), HostileServer.drip(0.5), {"n": 0}

    def respond(h):
        state["n"] += 1
        (page if state["n"] == 1 else drip)(h)
    server.respond = respond


def _engine():
    from fakes import EngineMetrics

    return EngineMetrics(running=1, prompt_tokens=10)


def test_a_dripped_page_does_not_hold_the_watch_past_its_duration(tmp_path):
    server = HostileServer()
    _drip_after_first(server)
    try:
        t = time.monotonic()
        run = run_watch(server.url, tmp_path, duration=2.0, timeout=30.0)
        took = COUNTS["dripped page, watch --duration 2 (scrape timeout 30 s)"] = time.monotonic() - t
    finally:
        server.stop()
    assert run.error is None and took < 4.0, took  # before: until the drip ended (a minute here)
    assert set(run.files.written) == {"trace", "metrics", "html"}


def test_sigterm_during_a_dripped_page_stops_the_watch_with_its_files(tmp_path):
    server = HostileServer()
    _drip_after_first(server)
    html, metrics = tmp_path / "w.html", tmp_path / "w.metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kvscope", "watch", server.url, "--interval", "0.2",
                             "--html", str(html), "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while server.requests < 2:  # the second scrape is being dripped
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        took = COUNTS["dripped page, SIGTERM to exit"] = time.monotonic() - t
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err  # before: killed after 25 s and more, no files
    assert took < 10.0, took  # the exit writes the HTML report (a few seconds on 2 shared cores)
    assert kvscope.load(metrics).summary()["num_engines"] == 1 and html.exists()
    FIGURES["real signals to a watch stuck on a dripped page"] += 1


def test_a_replay_endpoint_that_never_answers_costs_seconds_not_the_duration(tmp_path):
    port, dead_replay = free_port(), f"tcp://127.0.0.1:{free_port()}"  # nothing answers there
    pub = FakePublisher(f"tcp://127.0.0.1:{port}")
    server = HostileServer()
    stop = threading.Event()

    def lossy() -> None:  # every other batch lost: a gap, and a replay asked, at each batch
        seq = 0
        while not stop.is_set():
            pub.send([stored([seq + 1])], seq=seq)
            seq += 2
            time.sleep(0.02)
    sender = threading.Thread(target=lossy, daemon=True)
    try:
        sender.start()
        t = time.monotonic()
        run = run_watch(server.url, tmp_path, duration=3.0, kv_events=f"tcp://127.0.0.1:{port}",
                        replay=dead_replay, timeout=5.0)
        took = COUNTS["lossy events + dead replay, watch --duration 3"] = time.monotonic() - t
    finally:
        stop.set()
        sender.join(5)
        pub.close()
        server.stop()
    faults = run.summary()["faults"]
    assert run.error is None and took < 5.0, took  # before: a full timeout per gap, for minutes
    assert faults["event_gaps"] > 20 and 1 <= faults["replay_failures"] <= 3, faults
    assert set(run.files.written) == {"trace", "metrics", "html"}
