"""``ServerPoller``: what a ``WatchRun`` reads from the vLLM servers it watches at each poll, into its
``WatchSource``: every URL's ``/metrics`` page and the plugin's JSONL of each (the KV events come on their own,
``kvscope.watched.streams``).

The watch thread calls it; it changes the source only under the watch's lock. A scrape has one deadline
(``timeout``, cut to what is left of the watch's duration) and stops within 0.1 s of the ``stop`` event, so a
server that drips its page cannot hold the watch past its duration or a stop.
"""

from __future__ import annotations

import threading
import time

from kvscope.watched.metrics import Scrape, ScrapeError, ScrapeStopped, scrape
from kvscope.watched.plugin_log import PluginLog
from kvscope.watched.source import WatchSource

MIN_SCRAPE_S = 0.05  # the shortest deadline a scrape gets near the end of the watch


class WatchError(RuntimeError):
    """The watch could not start (a server that does not answer, an address that cannot be bound)."""


class ServerPoller:
    """Reads ``urls`` (and ``plugin_logs``: one per URL at most) into ``source`` under ``lock``."""

    def __init__(self, urls: list[str], plugin_logs: list[PluginLog], source: WatchSource, lock: threading.Lock,
                 timeout: float, stop: threading.Event) -> None:
        self.urls, self.plugin_logs, self.source = urls, plugin_logs, source
        self.lock, self.timeout, self.stop = lock, timeout, stop

    def first(self) -> bool:
        """Every URL must answer once before the watch begins (a ``WatchError`` naming it otherwise); ``False``
        if the watch was stopped meanwhile."""
        for i, url in enumerate(self.urls):
            try:
                result = scrape(url, self.timeout, self.stop)
            except ScrapeStopped:
                return False
            except ScrapeError as exc:
                raise WatchError(f"cannot reach {exc}; is the vLLM server running there "
                                 "(python -m vllm.entrypoints.openai.api_server ...)?") from None
            if not result.samples:
                raise WatchError(f"{url} answers, but with no vllm: metrics; is it a vLLM server?")
            with self.lock:
                self._on_scrape(i, result)
        return True

    def poll(self, end: float | None) -> None:
        """Scrape every URL (a server that does not answer is lost, until it answers again), then read the
        plugin logs. ``end``: the watch's end (``time.monotonic``), or ``None``."""
        for i, url in enumerate(self.urls):
            left = None if end is None else end - time.monotonic()
            try:
                result = scrape(url, self.timeout if left is None else max(min(self.timeout, left), MIN_SCRAPE_S),
                                self.stop)
            except ScrapeStopped:
                return
            except ScrapeError as exc:
                if end is not None and time.monotonic() >= end:
                    return  # cut off by the end of the watch: no loss
                with self.lock:
                    self.source.on_scrape_error(i, str(exc), time.perf_counter_ns())
                continue
            with self.lock:
                self._on_scrape(i, result)
        self.read_plugins()

    def read_plugins(self) -> None:
        """The lines each plugin log gained since the last read (damaged ones counted and skipped)."""
        for i, log in enumerate(self.plugin_logs):
            before = log.num_malformed
            lines = log.read()
            with self.lock:
                self.source.faults["plugin_malformed"] += log.num_malformed - before
                for obj in lines:
                    self.source.on_plugin(i, obj)

    def _on_scrape(self, i: int, result: Scrape) -> None:
        self.source.on_scrape(i, result.samples, result.num_malformed, truncated=result.truncated,
                              engines_dropped=result.num_engines_dropped)
