"""Scraping /metrics: the URL, a page fetched from a fake server, and fetch errors (parsing the pages is
test_samples.py's)."""

from __future__ import annotations

import pytest
from fakes import FakeServer, free_port

from kvscope.watched.metrics import ScrapeError, fetch, metrics_url, scrape


def test_metrics_url():
    assert metrics_url("http://h:1") == "http://h:1/metrics"
    assert metrics_url("h:1/") == "http://h:1/metrics"
    assert metrics_url("http://h:1/metrics") == "http://h:1/metrics"


def test_scrape_and_fetch_errors():
    server = FakeServer(1).start()
    try:
        assert scrape(server.url).samples[0].engine == "0"
        server.status = 500
        with pytest.raises(ScrapeError, match="HTTP 500"):
            fetch(server.url)
        server.status, server.page = 200, b"\xff\xfe not text"
        with pytest.raises(ScrapeError, match="not UTF-8"):
            fetch(server.url)
    finally:
        server.stop()
    with pytest.raises(ScrapeError, match="refused"):
        fetch(f"http://127.0.0.1:{free_port()}", timeout=2)
