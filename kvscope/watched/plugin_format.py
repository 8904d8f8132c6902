"""The plugin's JSONL: the line format shared by ``plugin.py``, which writes it, and the watch, which tails it
(``plugin_log.py``) and reads its lines (``plugin_steps.py``). Constants only: the plugin stays light.

One JSON object per line, UTF-8, ending in ``\\n``, each line written with one ``write`` on a file opened for
appending (so lines of several engines or processes never interleave). Times ``t`` are Unix seconds
(``time.time()``: the watcher may run elsewhere, so no monotonic clock crosses processes). Unknown fields are
ignored and missing ones mean "not reported"; a line that is not JSON or not an object is counted and skipped.

``{"type": "start", "format": "kvscope-vllm-plugin", "version": 1, "engine": 0, "pid": 1234,``
``  "t": 1764590000.1, "vllm_version": "0.32.0", "model": "/tmp/tiny", "block_size": 32,``
``  "num_gpu_blocks": 512, "max_model_len": 2048, "config": {"block_size": 32, "num_blocks": 512, ...}}``
    when a stat logger is created (once per engine index and process); a new ``pid`` is a server restart.
    ``config``: the server's scheduler and cache settings (keys and types: ``plugin_config.py``).
``{"type": "step", "engine": 0, "pid": 1234, "t": 1764590000.4, "step": 17,``
``  "num_running_reqs": 3, "num_waiting_reqs": 1, "kv_cache_usage": 0.25,``   SchedulerStats (absent when None)
``  "prefix_cache_queries": 96, "prefix_cache_hits": 64,``   this step's, SchedulerStats.prefix_cache_stats
``  "num_prompt_tokens": 96, "num_cached_prompt_tokens": 64, "num_generation_tokens": 3,``
``  "num_preempted_reqs": 0,``
    IterationStats (0 when None; ``num_cached_prompt_tokens`` is ``prompt_token_stats.cached_tokens``)
``  "time_to_first_tokens_s": [0.12], "inter_token_latencies_s": [0.02, 0.021],``
``  "finished": [{"request_id": "cmpl-1", "finish_reason": "length", "num_prompt_tokens": 40,``
``                "num_generation_tokens": 8, "num_cached_tokens": 32, "num_preemptions": 0,``
``                "e2e_latency_s": 0.5, "queued_time_s": 0.01, "prefill_time_s": 0.1, "decode_time_s": 0.3,``
``                "inference_time_s": 0.4, "arrival_time": 1764590000.0, "max_tokens": 8}],``
``  "iteration": {"num_ctx_requests": 1, "num_ctx_tokens": 96, "num_generation_requests": 2,``
``                "num_generation_tokens": 2, "elapsed_ms": 12.5} or null}``   SchedulerStats.iteration_details
    once per ``record()`` call; ``step`` counts the calls of that engine's logger from 0, ``finish_reason`` is
    ``str(FinishReason)`` (stop, length, abort, error, repetition); ``arrival_time`` (Unix seconds) and
    ``max_tokens`` may be absent.

What the writer adds on top, which readers may ignore, is listed in ``plugin.py``.
"""

FORMAT = "kvscope-vllm-plugin"  # the "format" of a start line
VERSION = 1
