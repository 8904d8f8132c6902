"""Scraping a vLLM server's Prometheus ``/metrics``: the page fetched within one overall deadline, at most
``MAX_PAGE_BYTES`` of it (``limits.py``, ``page.py``), and read into one ``MetricsSample`` per engine
(``samples.py``).
"""

from __future__ import annotations

import threading
import time

from kvscope.watched.limits import MAX_PAGE_BYTES
from kvscope.watched.page import FetchCancelled, FetchError, get
from kvscope.watched.samples import MetricsSample, Scrape, parse

# MetricsSample and parse (samples.py's) are still imported from here by the examples and tests/reliability
__all__ = ["MetricsSample", "Scrape", "ScrapeError", "ScrapeStopped", "fetch", "fetch_page", "metrics_url", "parse",
           "scrape"]


class ScrapeError(Exception):
    """``/metrics`` could not be fetched (refused, timed out, not HTTP 200, not text, a redirect)."""


class ScrapeStopped(ScrapeError):
    """The watch was stopped while a page was being fetched."""


def metrics_url(url: str) -> str:
    """``http://host:port`` -> ``http://host:port/metrics`` (a URL already ending in /metrics is kept)."""
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/metrics") else url + "/metrics"


def fetch_page(url: str, timeout: float = 2.0, cancel: threading.Event | None = None) -> tuple[str, bool]:
    """The text of ``url``'s ``/metrics`` page and whether it was cut at ``MAX_PAGE_BYTES``; the whole
    fetch ends within ``timeout`` seconds, or soon after ``cancel`` is set (``ScrapeStopped``).
    ``ScrapeError`` saying why not."""
    target = metrics_url(url)
    try:
        page = get(target, timeout=timeout, max_bytes=MAX_PAGE_BYTES, cancel=cancel)
    except FetchCancelled:
        raise ScrapeStopped(f"{target}: the watch was stopped") from None
    except FetchError as exc:
        raise ScrapeError(f"{target}: {exc}") from None
    body = page.body
    if page.truncated:  # cut at the last whole line
        body = body[:body.rfind(b"\n") + 1]
    try:
        return body.decode("utf-8"), page.truncated
    except UnicodeDecodeError:
        raise ScrapeError(f"{target}: the page is not UTF-8 text") from None


def fetch(url: str, timeout: float = 2.0, cancel: threading.Event | None = None) -> str:
    """The text of ``url``'s ``/metrics`` page (see ``fetch_page``)."""
    return fetch_page(url, timeout, cancel)[0]


def scrape(url: str, timeout: float = 2.0, cancel: threading.Event | None = None) -> Scrape:
    text, truncated = fetch_page(url, timeout, cancel)
    result = parse(text, time.perf_counter_ns())
    result.truncated |= truncated
    return result
