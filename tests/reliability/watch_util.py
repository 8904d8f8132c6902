"""What the hostile-server tests of ``kvscope watch`` share: ``HostileServer`` (an HTTP server on 127.0.0.1
whose every answer the test writes: a page, a drip, a redirect), the stand-ins of ``tests/watched/fakes.py``
(a vLLM ``/metrics`` page and a ZMQ KV event publisher), a short watch with its three files, and a check
that every file a watch wrote loads back.

(A module of its own, not ``conftest``: conftest names clash between test folders.)
"""

from __future__ import annotations

import contextlib
import http.server
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "watched"))

from fakes import FakePublisher, FakeServer, free_port, render, stored

import kvscope
from kvscope.runs.background.status import Outputs
from kvscope.runs.background.watch import WatchRun

__all__ = ["FakePublisher", "FakeServer", "HostileServer", "free_port", "render", "stored"]
Respond = Callable[[http.server.BaseHTTPRequestHandler], None]


class HostileServer:
    """``respond(handler)`` answers every request (set it, or use ``page`` / ``drip`` / ``redirect``);
    ``requests`` counts them, ``hosts`` keeps their ``Host`` headers."""

    def __init__(self) -> None:
        self.respond: Respond = self.page(render({"0": _engine()}))
        self.requests = 0
        self.hosts: list[str] = []
        self.port = free_port()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.requests += 1
                owner.hosts.append(self.headers.get("Host", ""))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the watcher hung up
                    owner.respond(self)

            def log_message(self, *args) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def page(body: str | bytes, status: int = 200, headers: dict[str, str] | None = None) -> Respond:
        data = body.encode() if isinstance(body, str) else body

        def respond(h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(status)
            for name, value in {"Content-Type": "text/plain", "Content-Length": str(len(data)),
                                **(headers or {})}.items():
                h.send_header(name, value)
            h.end_headers()
            h.wfile.write(data)
        return respond

    @staticmethod
    def drip(every_s: float = 0.5, first: bytes = b"") -> Respond:
        """Headers promising a page, then one byte every ``every_s`` seconds, for a minute."""
        def respond(h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(1 << 20))
            h.end_headers()
            h.wfile.write(first)
            h.wfile.flush()
            for _ in range(int(60 / every_s)):
                time.sleep(every_s)
                h.wfile.write(b"#")
                h.wfile.flush()
        return respond

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _engine():
    from fakes import EngineMetrics

    return EngineMetrics(running=1, kv_usage=0.25, prompt_tokens=100, generation_tokens=10)


def watch_outputs(tmp_path: Path, name: str = "w") -> Outputs:
    return Outputs(trace=tmp_path / f"{name}.trace.json", metrics=tmp_path / f"{name}.metrics.jsonl",
                   html=tmp_path / f"{name}.html")


def run_watch(url: str, tmp_path: Path, duration: float = 1.5, **kwargs) -> WatchRun:
    """A short watch of ``url`` to its end (its files written); the ``WatchRun``."""
    run = WatchRun(url, interval=0.2, duration=duration, outputs=watch_outputs(tmp_path), **kwargs).start()
    run.wait(timeout=duration + 30)
    return run


def assert_files_load(run: WatchRun) -> list[kvscope.Run]:
    """Every file the watch wrote exists and ``kvscope.load`` reads its trace and metrics back, with a
    summary of finite counts equal to the watch's own."""
    assert run.files.errors == {}, run.files.errors
    assert set(run.files.written) == {"trace", "metrics", "html"}, run.files.written
    loaded = []
    for kind in ("trace", "metrics"):
        back = kvscope.load(run.files.written[kind])
        assert back.summary()["prompt_tokens"] == run.summary()["prompt_tokens"], kind
        loaded.append(back)
    assert "</html>" in run.files.written["html"].read_text(encoding="utf-8")[-200:]
    return loaded


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / (1 << 20)


def saved_watch(folder: Path) -> Path:
    """The trace of a small watch (one engine, a page and a few KV events), made without a server."""
    from kvscope.runs.result.run import Run
    from kvscope.watched.events import EventBatch, parse_event
    from kvscope.watched.metrics import parse
    from kvscope.watched.source import WatchSource

    src = WatchSource(["http://127.0.0.1:9/metrics"], t0_ns=0)
    src.on_scrape(0, parse(render({"0": _engine()}), 1).samples)
    src.on_events(0, EventBatch(0.0, [parse_event(stored([1, 2, 3]))], 0, 0), 2)
    src.on_events(0, EventBatch(0.0, [parse_event(stored([4], "2"))], 0, 1), 3)
    records, events = src.tick(4, layout=True)
    meta = {"model": "vLLM", "source_kind": "kvscope watch", "t0_ns": 0, "watch": src.watch}
    return Run(records, events, meta).save_trace(folder / "watch.trace.json")
