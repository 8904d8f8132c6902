"""kvscope's vLLM stat-logger plugin: each engine step's ``SchedulerStats`` / ``IterationStats`` as a JSONL line.

vLLM (0.32, ``vllm/v1/metrics/loggers.py``) finds stat loggers through the entry point group
``vllm.stat_logger_plugins``; kvscope registers ``kvscope = "kvscope.watched.plugin:KvscopeStatLogger"``. The
API server process (the one that serves ``/metrics``) loads it when it builds its ``AsyncLLM`` and makes one
logger per engine (data-parallel rank); ``record()`` then runs on the server's event loop once per
``EngineCoreOutputs`` it receives: one per engine step, the step that carries the scheduler's stats.

**Off unless asked for.** ``KVSCOPE_VLLM_PLUGIN=PATH`` turns it on: lines are appended to ``PATH``. Unset (or
empty), the entry point refuses to load: vLLM turns stats collection on for every stat-logger plugin it
loads (even under ``--disable-log-stats``) and insists on a ``StatLoggerBase`` subclass, so the only way to
leave a server exactly as it was is to not be loaded at all. vLLM reports a plugin that fails to load with a
traceback; for this refusal only, a logging filter turns that into one INFO line saying how to turn it on.

**Light.** This module imports only the standard library (and ``plugin_format.py``'s constants). vLLM's
base class is imported when vLLM asks for ``KvscopeStatLogger`` (vLLM is loaded by then); ``StepLines``, which
does the work, needs no vLLM at all, so kvscope's own tests drive it with stand-ins of the 0.32 stats classes.
kvscope must be importable in the server's environment (``pip install --no-deps -e PATH_TO_KVSCOPE``;
``.ci/vllm-env`` does it).

The line format is defined in ``kvscope/watched/plugin_format.py``; what this writer adds on top, which
readers may ignore: ``num_skipped_waiting_reqs`` (the deferred part of ``num_waiting_reqs``, which, like the
``vllm:num_requests_waiting`` gauge, counts both), ``prefix_cache_requests``, ``num_cached_prompt_tokens``,
``spec_decoding`` (``{"num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"}``,
only with speculative decoding) and ``kv_block_evictions`` (``[[lifetime_s, idle_s], ...]``, only with
``--kv-cache-metrics``). The ``config`` of the start line (the server's scheduler and cache settings, read once
from the ``vllm_config`` vLLM hands the logger) is ``plugin_config.py``'s.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from kvscope.watched.plugin_config import engine_config
from kvscope.watched.plugin_format import FORMAT, VERSION

ENV = "KVSCOPE_VLLM_PLUGIN"
OFF_NOTICE = f"kvscope's vLLM stat logger is off (set {ENV}=FILE.jsonl to write each engine step to FILE.jsonl)"
_log = logging.getLogger(__name__)


class PluginOff(RuntimeError):
    """Raised instead of handing vLLM the logger class while ``KVSCOPE_VLLM_PLUGIN`` is unset."""


def _num(value: Any) -> float:
    return float(value)


def step_line(scheduler_stats: Any, iteration_stats: Any, engine: int, pid: int, step: int) -> dict[str, Any]:
    """One ``record()`` call as a JSON-ready dict (fields of vLLM 0.32's stats classes; see the module doc)."""
    line: dict[str, Any] = {"type": "step", "engine": engine, "pid": pid, "t": time.time(), "step": step}
    s = scheduler_stats
    if s is not None:
        pcs = s.prefix_cache_stats
        line.update(
            num_running_reqs=s.num_running_reqs,
            num_waiting_reqs=s.num_waiting_reqs + s.num_skipped_waiting_reqs,
            num_skipped_waiting_reqs=s.num_skipped_waiting_reqs,
            kv_cache_usage=_num(s.kv_cache_usage),
            prefix_cache_queries=pcs.queries,
            prefix_cache_hits=pcs.hits,
            prefix_cache_requests=pcs.requests,
        )
        d = s.iteration_details
        line["iteration"] = None if d is None else {
            "num_ctx_requests": d.num_ctx_requests, "num_ctx_tokens": d.num_ctx_tokens,
            "num_generation_requests": d.num_generation_requests,
            "num_generation_tokens": d.num_generation_tokens, "elapsed_ms": _num(d.elapsed_ms)}
        sd = s.spec_decoding_stats
        if sd is not None:
            line["spec_decoding"] = {
                "num_drafts": sd.num_drafts, "num_draft_tokens": sd.num_draft_tokens,
                "num_accepted_tokens": sd.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(sd.num_accepted_tokens_per_pos)}
        if s.kv_cache_eviction_events:
            line["kv_block_evictions"] = [[_num(e.lifetime_seconds), _num(e.idle_seconds)]
                                          for e in s.kv_cache_eviction_events]
    it = iteration_stats
    line.update(
        num_prompt_tokens=0 if it is None else it.prompt_token_stats.total,
        num_cached_prompt_tokens=0 if it is None else it.prompt_token_stats.cached_tokens,
        num_generation_tokens=0 if it is None else it.num_generation_tokens,
        num_preempted_reqs=0 if it is None else it.num_preempted_reqs,
        time_to_first_tokens_s=[] if it is None else [_num(x) for x in it.time_to_first_tokens_iter],
        inter_token_latencies_s=[] if it is None else [_num(x) for x in it.inter_token_latencies_iter],
        finished=[] if it is None else [_finished(f, getattr(it, "iteration_timestamp", None))
                                        for f in it.finished_requests],
    )
    return line


def _finished(f: Any, now: float | None) -> dict[str, Any]:
    """A ``FinishedRequestStats``; ``arrival_time`` (Unix seconds) is the iteration's timestamp less the request's
    end-to-end latency (vLLM measures that latency from the request's arrival, on the same wall clock)."""
    line = {
        "request_id": f.request_id, "finish_reason": str(f.finish_reason),
        "num_prompt_tokens": f.num_prompt_tokens, "num_generation_tokens": f.num_generation_tokens,
        "num_cached_tokens": f.num_cached_tokens, "num_preemptions": f.num_preemptions,
        "e2e_latency_s": _num(f.e2e_latency), "queued_time_s": _num(f.queued_time),
        "prefill_time_s": _num(f.prefill_time), "decode_time_s": _num(f.decode_time),
        "inference_time_s": _num(f.inference_time),
    }
    if now is not None:
        line["arrival_time"] = _num(now) - _num(f.e2e_latency)
    max_tokens = getattr(f, "max_tokens_param", None)
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        line["max_tokens"] = max_tokens
    return line


def start_line(vllm_config: Any, engine: int, pid: int) -> dict[str, Any]:
    """The ``start`` line of one engine's logger: what the server's config says about its KV pool."""
    model, cache = getattr(vllm_config, "model_config", None), getattr(vllm_config, "cache_config", None)
    try:
        from vllm import __version__ as vllm_version
    except ImportError:
        vllm_version = None
    name = getattr(model, "served_model_name", None) or getattr(model, "model", None)
    return {"type": "start", "format": FORMAT, "version": VERSION, "engine": engine, "pid": pid, "t": time.time(),
            "vllm_version": vllm_version, "model": name if isinstance(name, str) else None,
            "block_size": getattr(cache, "block_size", None), "num_gpu_blocks": getattr(cache, "num_gpu_blocks", None),
            "max_model_len": getattr(model, "max_model_len", None), "config": engine_config(vllm_config)}


def _encode(line: dict[str, Any]) -> bytes:
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()


class StepLines:
    """Appends one engine's lines to ``path``: one ``os.write`` per line on an ``O_APPEND`` descriptor, so
    the lines of several engines and processes sharing the file never interleave. It never raises into
    vLLM (an exception in ``record`` would end the server's output loop): a failure is logged once and
    turns the writer off."""

    def __init__(self, path: str, vllm_config: Any, engine: int) -> None:
        self.path, self.engine, self.pid, self.num_steps = path, engine, os.getpid(), 0
        self.fd: int | None = None
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            _log.warning("kvscope stat logger: cannot open %s (%s); writing nothing", path, exc)
            return
        try:
            data = _encode(start_line(vllm_config, engine, self.pid))
        except Exception as exc:
            self._fail(f"cannot read vLLM's config ({exc!r})")
            return
        self._write(data)

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if self.fd is None or (scheduler_stats is None and iteration_stats is None):
            return
        try:
            data = _encode(step_line(scheduler_stats, iteration_stats, self.engine, self.pid, self.num_steps))
        except Exception as exc:  # a vLLM whose stats changed shape: say so once, stop
            self._fail(f"cannot read vLLM's stats ({exc!r}); is this vLLM 0.32?")
            return
        self.num_steps += 1
        self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            while data and self.fd is not None:
                data = data[os.write(self.fd, data):]
        except OSError as exc:
            self._fail(f"cannot write {self.path} ({exc})")

    def _fail(self, why: str) -> None:
        _log.warning("kvscope stat logger: %s; writing nothing more", why)
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def _logger_class() -> type:
    """``KvscopeStatLogger``: vLLM's ``StatLoggerBase`` around ``StepLines`` (vLLM checks the subclass)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class KvscopeStatLogger(StatLoggerBase):
        """Writes each engine step to ``$KVSCOPE_VLLM_PLUGIN`` (see ``kvscope.watched.plugin``)."""

        def __init__(self, vllm_config, engine_index: int = 0):
            self.lines = StepLines(os.environ.get(ENV, ""), vllm_config, engine_index)

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            self.lines.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass

    KvscopeStatLogger.__qualname__ = "KvscopeStatLogger"
    return KvscopeStatLogger


class _OffNotice(logging.Filter):
    """On vLLM's plugin logger: its "Failed to load plugin" record for a ``PluginOff`` becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PluginOff):
            record.msg, record.args, record.exc_info, record.exc_text = str(exc), (), None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_cached: type | None = None


def __getattr__(name: str) -> Any:
    global _cached
    if name != "KvscopeStatLogger":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not os.environ.get(ENV):
        plugins_log = logging.getLogger("vllm.plugins")
        if not any(isinstance(f, _OffNotice) for f in plugins_log.filters):
            plugins_log.addFilter(_OffNotice())
        raise PluginOff(OFF_NOTICE)
    if _cached is None:
        _cached = _logger_class()
    return _cached
