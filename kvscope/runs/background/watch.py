"""``WatchRun``: one or more running vLLM servers watched from outside, live; it has a ``Run``.

One thread (``kvscope-watch``) does all the watching, so the state needs no locks of its own: it
polls every URL's ``/metrics`` each ``interval`` seconds, receives KV events in between (ZMQ, as they
come), tails the plugin's JSONL, and after each poll hands ``WatchSource.tick`` the interval: lanes
grow, records and events go to the ``Run`` so far and to the dashboard. The caller only sets flags and
reads results; ``wait`` blocks it (Ctrl-C stops the watch, lets it write its files, and propagates).

Faults: a URL that cannot be read at the start fails the watch with one line naming it (``status``
failed, ``error`` a ``WatchError``); a server lost later is shown as "connection lost" (the files are
written at that moment, so they hold everything up to it) and watched again when it answers; damaged
pages, event payloads and plugin lines are counted (``summary()["faults"]``) and skipped.

Time: ``duration`` counts from the start; a scrape has one deadline (``timeout``) and ``stop()`` breaks out
of one within 0.1 s, so a server that drips its page or a replay endpoint that does not answer cannot hold
the watch past its duration or a stop. A last tick that fails still leaves the files of what was watched.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvscope._version import __version__
from kvscope.runs.background.polling import ServerPoller, WatchError
from kvscope.runs.background.recording import Recording
from kvscope.runs.background.status import Outputs, RunStatus
from kvscope.runs.result.buffer import RunBuffer
from kvscope.runs.result.run import Run, WatchedRun
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.watched.limits import MAX_RECORDS
from kvscope.watched.metrics import metrics_url
from kvscope.watched.otlp_receiver import OtlpReceiver
from kvscope.watched.plugin_log import PluginLog
from kvscope.watched.prompt_match import match_prompts
from kvscope.watched.source import LOST, WatchSource
from kvscope.watched.streams import EventStreams, check_endpoints

__all__ = ["WatchError", "WatchRun", "watch"]


def _listed(value: str | os.PathLike | Sequence[str] | None) -> list[str]:
    if value is None or isinstance(value, (str, os.PathLike)):
        return [] if value is None else [os.fspath(value)]
    return [os.fspath(v) for v in value]


class WatchRun(Recording):
    """A watch in progress: ``WatchRun(urls, ...).start()``; then ``wait()``, ``stop()``, ``run``,
    ``summary()``, ``engines``. ``kv_events`` (connect: vLLM binds ``tcp://*:PORT``) and ``kv_events_bind``
    (bind: vLLM connects to a concrete address) give one endpoint per URL, or, for one URL, one per
    data-parallel rank (rank r publishes on port + r); ``replay`` one replay endpoint per event endpoint.
    ``plugin_log``: the JSONL that kvscope's vLLM plugin appends to (one per URL): with it, the records are
    vLLM's own steps. ``duration``: stop after that many seconds (``None``: until ``stop()``).
    ``otlp``: ``HOST:PORT`` to receive vLLM's OTLP/HTTP request spans on (``otlp_endpoint`` is the URL to give
    vLLM's ``--otlp-traces-endpoint``): with it, each finished request is a row of ``run.requests()`` from vLLM's
    own per-request times. ``prompts``: the prompts the load generator sent, in sending order (token id lists,
    or a file: ``kvscope.runs.workload.sent``, with ``tokenizer`` and ``chat_template`` for text), matched to the
    requests by ``kvscope.watched.prompt_match``'s rule so that a replay has their token ids."""

    noun = "watch"

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        kv_events: str | Sequence[str] | None = None,
        kv_events_bind: str | Sequence[str] | None = None,
        replay: str | Sequence[str] | None = None,
        topic: str = "",
        interval: float = 0.5,
        duration: float | None = None,
        outputs: Outputs | None = None,
        plugin_log: str | os.PathLike | Sequence[str] | None = None,
        timeout: float | None = None,
        dashboard: bool = False,
        dashboard_options: dict[str, Any] | None = None,
        otlp: str | None = None,
        prompts: str | os.PathLike | Sequence[Sequence[int]] | None = None,
        tokenizer: str | None = None,
        chat_template: bool = False,
    ) -> None:
        self.urls = [metrics_url(u) for u in _listed(urls)]
        if not self.urls:
            raise ValueError("give at least one server URL, like http://127.0.0.1:8000")
        if not interval > 0 or (duration is not None and not duration > 0):
            raise ValueError(f"interval ({interval}) and duration ({duration}) must be positive seconds")
        self.connect, self.bind, self.replay = _listed(kv_events), _listed(kv_events_bind), _listed(replay)
        check_endpoints(self.connect, self.bind, self.replay, len(self.urls))
        self.plugin_logs = [PluginLog(p) for p in _listed(plugin_log)]
        if len(self.plugin_logs) > len(self.urls):
            raise ValueError(f"{len(self.plugin_logs)} plugin logs for {len(self.urls)} URLs: one per URL at most")
        self.topic, self.interval, self.duration = topic, float(interval), duration
        self.timeout = timeout if timeout is not None else min(max(self.interval, 1.0), 5.0)
        super().__init__(outputs or Outputs())
        self.t0_ns = time.perf_counter_ns()
        if isinstance(prompts, (str, os.PathLike)):
            from kvscope.runs.workload.sent import sent_prompt_ids

            prompts = sent_prompt_ids(prompts, tokenizer, chat_template)
        self.prompts = None if prompts is None else [list(p) for p in prompts]
        self.source = WatchSource(self.urls, t0_ns=self.t0_ns, interval_s=self.interval,
                                  plugin_records=bool(self.plugin_logs), otlp=otlp is not None)
        self.meta: dict[str, Any] = {
            "model": "vLLM", "device": "vLLM server" + ("s" if len(self.urls) > 1 else ""),
            "source_kind": "kvscope watch", "kvscope_version": __version__, "t0_ns": self.t0_ns,
            "block_size": 0, "num_blocks": 0, "kv_bytes_per_token": 0, "kv_bytes_per_block": 0, "max_model_len": 0,
            "watch": self.source.watch,
        }
        self._so_far = RunBuffer(self.meta, capacity=MAX_RECORDS)
        self._final: Run | None = None
        self._lock = threading.Lock()  # held by the watch thread while it changes the watch's state
        self.streams = EventStreams(self.source, self._lock, self.timeout)
        self.poller = ServerPoller(self.urls, self.plugin_logs, self.source, self._lock, self.timeout, self._stop)
        self._num_ticks = 0
        self._ticked = False  # the watch began (every URL answered): there is something to write
        self._num_lost = 0  # servers lost (and not back) at the last tick
        self._lost_written = -60.0  # monotonic: when the files were last written for a loss
        self._end: float | None = None  # monotonic: the end of the watch (None: until stop())
        self._copy: tuple[int, Run] | None = None
        if dashboard:
            from kvscope.widgets.watch_dashboard import WatchDashboard

            self.dashboard = WatchDashboard(control=self, meta=self.meta, **(dashboard_options or {}))
        # listens from here on (last, so nothing fails after it binds); closed when the watch winds down
        self.otlp = OtlpReceiver(otlp) if otlp is not None else None
        self.otlp_endpoint = self.otlp.endpoint if self.otlp is not None else None  # vLLM's --otlp-traces-endpoint

    # ---- state (any thread; the control is ``Lifecycle``'s) ----------------------------------------
    @property
    def engines(self) -> dict[str, dict[str, Any]]:
        """Engine name ("host:port/engine") -> what the watch knows of it (url, state, pool, model)."""
        return dict(self.source.watch["engines"])

    @property
    def status_text(self) -> str:
        """The status in words: "running · connection lost: 127.0.0.1:8000", "failed: WatchError: ..."."""
        text = super().status_text
        lost = [name for name, state in zip(self.source.names, self.source.server_state) if state == LOST]
        if lost and not self.done:
            text += " · connection lost: " + ", ".join(lost)
        gaps = self.source.faults["event_gaps"]
        if gaps:
            text += f" · {gaps} KV event gap{'s' if gaps > 1 else ''}"
        return text

    def close(self) -> None:
        """``Lifecycle.close``; a watch never started lets go of its OTLP port too."""
        super().close()
        if self.otlp is not None and self._thread is None:
            self.otlp.close()

    # ---- results (any thread) -------------------------------------------------------------------------
    @property
    def run(self) -> Run:
        """The ``Run`` so far (a copy, made once per poll), the whole run once over."""
        if self._final is not None:
            return self._final
        with self._lock:
            n = self._num_ticks
            if self._copy is None or self._copy[0] != n:
                live = self._so_far.run()
                events = sorted(live.events, key=lambda e: e.t_ns)
                self._match_prompts(events)
                self._copy = (n, WatchedRun(live.records, events, self._meta_copy()))
            return self._copy[1]

    def _meta_copy(self) -> dict[str, Any]:
        """``meta`` as it is now (under the lock): the lanes' columns copied (they grow in place), the rest of
        the watch description shared (the watch thread replaces those parts whole, never changes them)."""
        watch = dict(self.meta["watch"])
        for name in ("lanes", "fleet"):
            lanes = watch[name] if name == "lanes" else {"": watch[name]}
            copied = {key: {c: list(v) for c, v in lane.items()} for key, lane in lanes.items()}
            watch[name] = copied if name == "lanes" else copied[""]
        return {**self.meta, "watch": watch}

    def _match_prompts(self, events: list[RequestEvent]) -> None:
        """The sent prompts' token ids onto the requests' queued events (``prompt_match``), and what the match did
        in ``meta["watch"]["prompts"]`` (under the lock)."""
        if self.prompts is not None:
            self.meta["watch"]["prompts"] = match_prompts(events, self.prompts).as_json()

    def _file_writers(self) -> dict[str, Callable[[Path], Path]]:
        run = self.run  # the three files from the same moment
        return {"trace": run.save_trace, "metrics": run.save_metrics, "html": run.save_html}

    # ---- the watch thread -----------------------------------------------------------------------------
    def _body(self) -> None:
        self._end = None if self.duration is None else time.monotonic() + self.duration
        self.streams.deadline = self._end
        if self.otlp is not None:
            self.otlp.start()
        try:
            self.streams.open(self.connect, self.bind, self.replay, self.topic)
        except ValueError as exc:
            raise WatchError(f"KV events: {exc}") from None
        if not self.poller.first():
            return
        self.streams.catch_up()
        self.status = RunStatus.RUNNING
        self._ticked = True
        self._tick()
        self._loop()

    def _wind_down(self) -> None:
        try:
            self._finish()
        finally:
            self.streams.close()
            if self.otlp is not None:
                self.otlp.close()

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.interval
        end = self._end
        while not self._stop.is_set():
            now = time.monotonic()
            if end is not None and now >= end:
                return
            if now < next_tick:
                wait = min(next_tick - now, 0.1, (end - now) if end is not None else 0.1)
                if not self.streams.wait(wait):
                    self._stop.wait(wait)
                continue
            next_tick = max(next_tick + self.interval, now + self.interval / 2)
            if self._running.is_set():
                self.poller.poll(self._end)
                self._tick()

    def _tick(self, *, final: bool = False) -> None:
        # servers lost since the last tick (the poll before this tick is what notices a loss)
        was_lost, self._num_lost = self._num_lost, sum(span[2] is None for span in self.source.lost)
        with self._lock:
            self.streams.count_faults()
            if self.otlp is not None:
                self.source.on_spans(*self.otlp.take())
            records, events = self.source.tick(time.perf_counter_ns(), layout=final or self.dashboard is not None,
                                               force=final)
            self._update_meta()
            items: list[StepRecord | RequestEvent] = [*events, *records]
            for item in items:
                self._so_far.add(item)
                if self.dashboard is not None:
                    self.dashboard.feed.push(item)
            self._num_ticks += 1
        if self._num_lost > was_lost and not final and time.monotonic() - self._lost_written >= 30.0:
            self._lost_written = time.monotonic()  # (at most every 30 s: a server that flaps costs no more)
            self._write_files()  # a server went away: the files hold everything up to now

    def _update_meta(self) -> None:
        w = self.source.watch
        engines = list(w["engines"].values())
        self.meta["model"] = w.get("model") or "vLLM"
        self.meta["block_size"] = next((e["block_size"] for e in engines if e["block_size"]), 0)
        self.meta["num_blocks"] = sum(e["num_gpu_blocks"] or 0 for e in engines)
        config = w.get("config")  # the server's settings (the plugin's), under a kvscope run's meta["config"] names
        if config is not None:
            self.meta["config"] = config
            if isinstance(config.get("max_model_len"), int) and not isinstance(config["max_model_len"], bool):
                self.meta["max_model_len"] = config["max_model_len"]

    def _finish(self) -> None:
        if not self._ticked:  # nothing was watched: no files
            return
        try:
            self.streams.receive_all()  # what arrived since the last poll still counts
            self.poller.read_plugins()
            self._tick(final=True)
        except Exception as exc:  # the files of what was watched are written all the same
            if self.error is None:
                self.error, self.status = exc, RunStatus.FAILED
        self._final = None
        with self._lock:
            live = self._so_far.run()
            events = sorted(live.events, key=lambda e: e.t_ns)
            self._match_prompts(events)
            meta = copy.deepcopy(self.meta)  # the whole run's: nothing changes it any more
            self._final = WatchedRun(live.records, events, meta)
        self._write_files()

    def _describe(self) -> str:
        return f"{', '.join(self.source.names)}: {self.status_text}, {self._num_ticks} polls"


def watch(urls: str | Sequence[str], *, kv_events: str | Sequence[str] | None = None,
          kv_events_bind: str | Sequence[str] | None = None, replay: str | Sequence[str] | None = None,
          interval: float = 0.5, duration: float | None = None, trace: str | os.PathLike | None = None,
          metrics: str | os.PathLike | None = None, html: str | os.PathLike | None = None,
          plugin_log: str | os.PathLike | Sequence[str] | None = None, dashboard: bool = False,
          **options: Any) -> WatchRun:
    """Start watching vLLM server(s) at ``urls`` (``http://HOST:PORT``); returns the started ``WatchRun``
    (the options are ``WatchRun``'s; ``trace`` / ``metrics`` / ``html``: the files, written at the end)."""
    outputs = Outputs(trace=Path(trace) if trace else None, metrics=Path(metrics) if metrics else None,
                      html=Path(html) if html else None)
    return WatchRun(urls, kv_events=kv_events, kv_events_bind=kv_events_bind, replay=replay, interval=interval,
                    duration=duration, outputs=outputs, plugin_log=plugin_log, dashboard=dashboard,
                    **options).start()
