"""``kvscope watch``: a running vLLM server (or a fleet) as a telemetry source.

- ``metrics``: scrape and parse ``/metrics`` (prometheus_client's parser) into ``MetricsSample``s;
- ``events``: vLLM's KV cache events over ZMQ (both encodings, sequence gaps, restarts, replay);
- ``residency``: the prefix tree of cached blocks that the events describe;
- ``plugin`` / ``plugin_log``: the vLLM stat-logger plugin and the tail of the JSONL it writes;
- ``source``: all of it turned into kvscope records and the ``meta["watch"]`` description;
- ``summary``: what that description adds up to (standard library only).

This package emits plain records and never imports the engine, the widgets, ``kvscope.runs.result.run`` or the
faces; ``kvscope.runs.background.watch.WatchRun`` (the live layer) drives it. The package is also callable:
``kvscope.watch(urls, ...)`` is ``kvscope.runs.background.watch.watch`` (imported on the call, by name, as
``kvscope/__init__`` imports its lazy exports), so the package and the function share one name.
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``kvscope.watch(urls, ...)``: see ``kvscope.runs.background.watch.watch``."""
        return import_module("kvscope.runs.background.watch").watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
