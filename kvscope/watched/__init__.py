"""A watched vLLM: a running vLLM server (or a fleet) as a telemetry source (``kvscope watch``).

- ``page`` / ``metrics`` / ``samples``: fetch ``/metrics`` (bounded) and parse it (prometheus_client's parser)
  into ``MetricsSample``s; ``quantiles``: histogram buckets and their quantiles;
- ``kv_transfer`` / ``transfer_summary``: vLLM's KV connector metrics (NIXL, offloading), the role, their
  summary keys;
- ``events`` / ``subscriber`` / ``streams``: vLLM's KV cache events (both encodings), their ZMQ socket, and the
  publishers of a watch (gaps, restarts, replay);
- ``residency`` / ``block_tree``: the prefix tree of cached blocks that the events describe, and its shape;
- ``plugin`` / ``plugin_format`` / ``plugin_log`` / ``plugin_steps``: the vLLM stat-logger plugin, its JSONL
  lines, their tail, and its step lines as records;
- ``engines`` / ``fleet``: what the watch keeps per engine, and what the engines add up to;
- ``source`` / ``watch_meta``: all of it turned into kvscope records and the ``meta["watch"]`` description;
- ``summary``: what that description adds up to (standard library only); ``check``: a file's description
  checked at load;
- ``limits``: every bound of a watch; ``vllm_demo``: a real vLLM server on a tiny random Llama.

This package emits plain records and never imports the engine, the widgets, the runs or the faces;
``kvscope.runs.background.watch.WatchRun`` (the live layer) drives it, and ``kvscope.watch(urls, ...)`` starts one.
"""
