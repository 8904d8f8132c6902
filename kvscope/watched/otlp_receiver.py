"""``OtlpReceiver``: an OTLP/HTTP trace receiver (``POST /v1/traces``, protobuf) for ``kvscope watch --otlp``.

vLLM started with ``--otlp-traces-endpoint http://HOST:PORT/v1/traces`` and
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` exports its request spans here (in batches, every few
seconds: OpenTelemetry's batch span processor). The standard library's ``http.server`` serves on its own thread,
bound to the address given; one request at a time, each connection closed after its answer (HTTP/1.0), a
socket timeout so a client that stalls cannot hold the receiver.

Checked at the edge (the sender is not trusted): a body longer than ``MAX_OTLP_BODY`` (after gzip too) is
refused (413), one that is not an ``ExportTraceServiceRequest`` gets 400 and a log line (the first few), JSON
OTLP gets 415 with the setting to change; at most ``MAX_OTLP_SPANS`` spans of a body are read and at most
``MAX_OTLP_PENDING`` request rows wait for the watch thread (the rest are reported to the sender as rejected,
OTLP's partial success). Every case is counted in ``counts`` (the watch's faults).
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import zlib
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from kvscope.watched.limits import MAX_OTLP_BODY, MAX_OTLP_PENDING, MAX_OTLP_SPANS, OTLP_SOCKET_TIMEOUT_S
from kvscope.watched.otlp import decode_traces

PATH = "/v1/traces"
COUNTS = ("otlp_posts", "otlp_rejected", "otlp_spans", "otlp_spans_other", "otlp_spans_malformed",
          "otlp_spans_dropped")
MAX_LOGGED = 10  # bad bodies logged (all are counted)
_log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ``ValueError`` naming the form otherwise."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--otlp {address!r}: give HOST:PORT to listen on, like 127.0.0.1:4318")
    return host, int(port)


class _Server(HTTPServer):
    receiver: OtlpReceiver

    def server_bind(self) -> None:
        """``TCPServer``'s bind, without ``HTTPServer``'s reverse DNS lookup of the host (slow offline)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = OTLP_SOCKET_TIMEOUT_S
    server_version = "kvscope-otlp"

    def do_POST(self) -> None:
        rec = self.server.receiver
        if self.path.split("?", 1)[0] != PATH:
            return self._answer(404, f"OTLP traces go to {PATH}".encode())
        ctype = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/x-protobuf":
            rec.reject(f"Content-Type {ctype or 'none'}")
            return self._answer(415, b"send OTLP/HTTP protobuf (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            rec.reject("no Content-Length")
            return self._answer(411, b"Content-Length required")
        if not 0 <= length <= MAX_OTLP_BODY:
            rec.reject(f"a body of {length:,} bytes (at most {MAX_OTLP_BODY:,})")
            return self._answer(413, b"body too large")
        body = self.rfile.read(length)
        if len(body) < length:
            rec.reject("a body cut short")
            return self._answer(400, b"body cut short")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding == "gzip":
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                body = inflate.decompress(body, MAX_OTLP_BODY)
            except zlib.error:
                rec.reject("a gzip body that does not inflate")
                return self._answer(400, b"bad gzip")
            if inflate.unconsumed_tail:
                rec.reject(f"a gzip body over {MAX_OTLP_BODY:,} bytes inflated")
                return self._answer(413, b"body too large")
        elif encoding != "identity":
            rec.reject(f"Content-Encoding {encoding}")
            return self._answer(415, b"Content-Encoding: gzip or none")
        status, answer = rec.receive(body)
        self._answer(status, answer, "application/x-protobuf" if status == 200 else "text/plain")

    def _answer(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("otlp %s: " + format, self.client_address[0], *args)


class OtlpReceiver:
    """Listens on ``address`` (``HOST:PORT``; port 0 picks a free one, ``address`` then says which) from
    construction (a ``ValueError`` if it cannot bind); ``start`` serves on a daemon thread, ``take`` hands the
    rows received since the last call to the watch thread, ``close`` stops serving and frees the port."""

    def __init__(self, address: str) -> None:
        host, port = parse_address(address)
        try:  # (the server closes its socket when the bind fails)
            self._server = (_Server6 if ":" in host else _Server)((host, port), _Handler)
        except OSError as exc:
            raise ValueError(f"--otlp {address}: cannot listen there ({exc.strerror or exc})") from None
        self._server.receiver = self
        bound = self._server.server_address
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in str(bound[0]) else f"{bound[0]}:{bound[1]}"
        self.endpoint = f"http://{self.address}{PATH}"  # vLLM's --otlp-traces-endpoint
        self.counts = dict.fromkeys(COUNTS, 0)
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._num_logged = 0

    def start(self) -> OtlpReceiver:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="kvscope-otlp", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def take(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The rows received since the last call, and the counts (since the start)."""
        with self._lock:
            rows, self._rows = self._rows, []
            return rows, dict(self.counts)

    def reject(self, why: str) -> None:
        with self._lock:
            self.counts["otlp_posts"] += 1
            self.counts["otlp_rejected"] += 1
            self._num_logged += 1
            n = self._num_logged
        if n <= MAX_LOGGED:
            _log.warning("kvscope watch --otlp: refused %s%s", why,
                         " (further refusals are only counted)" if n == MAX_LOGGED else "")

    def receive(self, body: bytes) -> tuple[int, bytes]:
        """One body: (HTTP status, answer). The rows past ``MAX_OTLP_PENDING`` waiting are rejected."""
        try:
            decoded = decode_traces(body, MAX_OTLP_SPANS)
        except ValueError as exc:
            self.reject(str(exc))
            return 400, str(exc).encode()
        with self._lock:
            room = max(MAX_OTLP_PENDING - len(self._rows), 0)
            kept = decoded.rows[:room]
            self._rows.extend(kept)
            c = self.counts
            c["otlp_posts"] += 1
            c["otlp_spans"] += decoded.num_spans
            c["otlp_spans_other"] += decoded.num_other
            c["otlp_spans_malformed"] += decoded.num_malformed
            c["otlp_spans_dropped"] += decoded.num_dropped + len(decoded.rows) - len(kept)
        return 200, _response(decoded.num_dropped + len(decoded.rows) - len(kept), decoded.num_malformed)


def _response(num_rejected: int, num_malformed: int) -> bytes:
    """An ``ExportTraceServiceResponse``: a partial success when spans were rejected or malformed."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    out = ExportTraceServiceResponse()
    if num_rejected or num_malformed:
        out.partial_success.rejected_spans = num_rejected + num_malformed
        out.partial_success.error_message = (f"{num_rejected} spans over kvscope's limits, "
                                             f"{num_malformed} malformed request spans")
    return out.SerializeToString()
