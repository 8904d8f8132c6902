"""A watched vLLM: a running vLLM server (or a fleet) as a telemetry source (``kvscope watch``).

- ``metrics`` / ``samples``: scrape ``/metrics`` and parse it (prometheus_client's parser) into ``MetricsSample``s;
- ``events`` / ``subscriber``: vLLM's KV cache events (both encodings) and their ZMQ socket (gaps, restarts, replay);
- ``residency`` / ``block_tree``: the prefix tree of cached blocks that the events describe, and its shape;
- ``plugin`` / ``plugin_format`` / ``plugin_log``: the vLLM stat-logger plugin, its JSONL lines and their tail;
- ``source``: all of it turned into kvscope records and the ``meta["watch"]`` description;
- ``summary``: what that description adds up to (standard library only).

This package emits plain records and never imports the engine, the widgets, the runs or the faces;
``kvscope.runs.background.watch.WatchRun`` (the live layer) drives it, and ``kvscope.watch(urls, ...)`` starts one.
"""
