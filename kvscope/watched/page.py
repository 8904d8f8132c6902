"""A ``/metrics`` page fetched and cut into families.

Fetched: one bounded HTTP GET, an overall deadline, a stop that breaks out of it, a size cap.

``urllib.request.urlopen(timeout=)`` bounds each socket read, not the request: a server that drips one
byte every half second holds it forever. Here the socket is read in slices of ``SLICE_S``, so the whole
request (connect, send, every read) ends at its deadline, and within one slice of ``cancel`` being set.
The response is collected raw and then parsed by ``http.client`` (status, headers, chunked or
``Content-Length`` bodies), so only the transport loop is ours.

What a watched server cannot make the watcher do: follow a redirect (to another host, port or scheme: a
3xx is an error naming where it pointed), go through a proxy from the environment (``http_proxy`` and
friends are not read: the connection goes to the URL's host), or read more than ``max_bytes`` (the page
is cut there and reported as truncated).
"""

from __future__ import annotations

import http.client
import io
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kvscope.watched.limits import MAX_SAMPLE_LINES

SLICE_S = 0.1  # the longest a stop waits for the scrape in progress


class FetchError(Exception):
    """The page could not be fetched (refused, timed out, not HTTP 200, a redirect); the message says why."""


class FetchCancelled(FetchError):
    """The watch was stopped while the page was being fetched."""


@dataclass(slots=True)
class Page:
    body: bytes
    truncated: bool  # the body was longer than max_bytes and is cut there


class _Raw:
    """A finished response's bytes, as the socket ``http.client.HTTPResponse`` reads from."""

    def __init__(self, data: bytes) -> None:
        self._file = io.BytesIO(data)

    def makefile(self, *args: object, **kwargs: object) -> io.BytesIO:
        return self._file


def _connect(host: str, port: int, tls: bool, deadline: float, cancel: threading.Event | None) -> socket.socket:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FetchError("timed out connecting")
        if cancel is not None and cancel.is_set():
            raise FetchCancelled("stopped")
        try:
            sock = socket.create_connection((host, port), timeout=min(left, 0.5))
            break
        except TimeoutError:
            continue  # another try while time is left (a stop is checked between tries)
    if tls:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    return sock


def _read_all(sock: socket.socket, limit: int, deadline: float, cancel: threading.Event | None) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (or ``Content-Length`` is reached), at most ``limit``
    bytes (then ``True``: cut)."""
    chunks, size, wanted = [], 0, None
    sock.settimeout(SLICE_S)
    while True:
        if cancel is not None and cancel.is_set():
            raise FetchCancelled("stopped")
        if time.monotonic() >= deadline:
            raise FetchError("no complete page within the timeout (the server sends too slowly)")
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        if not data:
            return b"".join(chunks), False
        chunks.append(data)
        size += len(data)
        if wanted is None and size < (1 << 16) and b"\r\n\r\n" in b"".join(chunks):
            wanted = _expected_size(b"".join(chunks))
        if wanted is not None and size >= wanted:
            return b"".join(chunks), False
        if size > limit:
            return b"".join(chunks), True


def _expected_size(head: bytes) -> int | None:
    """Header bytes + ``Content-Length`` when the headers give it (the server may keep the socket open)."""
    end = head.index(b"\r\n\r\n") + 4
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return end + int(value.strip())
    return None


def get(url: str, *, timeout: float, max_bytes: int, cancel: threading.Event | None = None) -> Page:
    """The body of ``url`` (http or https), fetched within ``timeout`` seconds in all; ``FetchError`` saying
    why not (``FetchCancelled`` when ``cancel`` was set meanwhile)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("not an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise FetchError("the URL's port is not a number from 0 to 65535") from None
    deadline = time.monotonic() + timeout
    host_header = parts.netloc.rsplit("@", 1)[-1]
    request = (f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"
               f"Host: {host_header}\r\nUser-Agent: kvscope-watch\r\nAccept: text/plain\r\n"
               "Accept-Encoding: identity\r\nConnection: close\r\n\r\n").encode("latin-1", "replace")
    try:
        sock = _connect(parts.hostname, port, parts.scheme == "https", deadline, cancel)
    except (OSError, ssl.SSLError) as exc:
        raise FetchError(_reason(exc)) from None
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        sock.sendall(request)
        raw, truncated = _read_all(sock, max_bytes + (1 << 16), deadline, cancel)
    except (OSError, ssl.SSLError) as exc:
        raise FetchError(_reason(exc)) from None
    finally:
        sock.close()
    return _parse(raw, truncated, max_bytes)


def _parse(raw: bytes, truncated: bool, max_bytes: int) -> Page:
    response = http.client.HTTPResponse(_Raw(raw))  # type: ignore[arg-type]
    try:
        response.begin()
    except (http.client.HTTPException, ValueError) as exc:
        raise FetchError(f"not an HTTP response ({type(exc).__name__})") from None
    if 300 <= response.status < 400:
        where = (response.getheader("Location") or "?")[:200]
        raise FetchError(f"HTTP {response.status} redirect to {where!r}, not followed (give the final URL)")
    if response.status != 200:
        raise FetchError(f"HTTP {response.status} {response.reason[:100]}")
    try:
        body = response.read()
    except http.client.IncompleteRead as exc:
        if not truncated:
            raise FetchError("the server closed the connection in the middle of the page") from None
        body = exc.partial
    except (http.client.HTTPException, ValueError) as exc:
        raise FetchError(f"a damaged HTTP body ({type(exc).__name__})") from None
    if len(body) > max_bytes:
        body, truncated = body[:max_bytes], True
    return Page(body, truncated)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(getattr(exc, "strerror", None) or exc)[:200]


# ---- the families of a page -----------------------------------------------------------------------------
_FAMILY_START = re.compile(r"^# (?:HELP|TYPE) (\S+)", re.M)


def _wanted_family(name: str | None, samples: frozenset[str], bases: frozenset[str]) -> bool:
    return name is not None and (name in samples or name.removesuffix("_total") in bases)


def _sample_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0].strip()


def _chunks(text: str) -> Iterator[tuple[str | None, int, int]]:
    """The page cut at its ``# HELP`` / ``# TYPE`` lines: (family name or ``None``, start, end); the
    header lines of one family in a row make one chunk."""
    name, start = None, 0
    for m in _FAMILY_START.finditer(text):
        if m.group(1) != name:
            if m.start() > start or name is not None:
                yield name, start, m.start()
            name, start = m.group(1), m.start()
    if len(text) > start:
        yield name, start, len(text)


def families(text: str, samples: frozenset[str], bases: frozenset[str], counts: list[int]) -> Iterator[Metric]:
    """The metric families named in ``samples`` (sample names) or ``bases`` (family names), each parsed on
    its own: another family is skipped unparsed (by its name), a damaged one counted in ``counts[0]`` and
    skipped; past ``MAX_SAMPLE_LINES`` lines of wanted samples the rest is skipped and ``counts[1]`` set
    (the page counts as truncated)."""
    lines_left = MAX_SAMPLE_LINES
    for name, start, end in _chunks(text):
        if name is not None and not _wanted_family(name, samples, bases):
            continue
        chunk = text[start:end]
        if name is None:  # samples without a HELP / TYPE line: keep the lines of wanted samples only
            chunk = "\n".join(line for line in chunk.split("\n") if _sample_name(line) in samples)
        if not chunk.strip():
            continue
        lines_left -= chunk.count("\n") + 1
        if lines_left < 0:
            counts[1] = 1
            return
        try:
            yield from list(text_string_to_metric_families(chunk))
        except Exception:  # the parser raises ValueError, TypeError, IndexError, ... on damaged text
            counts[0] += 1
