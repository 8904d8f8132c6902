"""A watched vLLM: a running vLLM server (or a fleet) as a telemetry source (``kvscope watch``).

- ``metrics``: scrape and parse ``/metrics`` (prometheus_client's parser) into ``MetricsSample``s;
- ``events``: vLLM's KV cache events over ZMQ (both encodings, sequence gaps, restarts, replay);
- ``residency``: the prefix tree of cached blocks that the events describe;
- ``plugin`` / ``plugin_log``: the vLLM stat-logger plugin and the tail of the JSONL it writes;
- ``source``: all of it turned into kvscope records and the ``meta["watch"]`` description;
- ``summary``: what that description adds up to (standard library only).

This package emits plain records and never imports the engine, the widgets, the runs or the faces;
``kvscope.runs.background.watch.WatchRun`` (the live layer) drives it, and ``kvscope.watch(urls, ...)`` starts one.
"""
