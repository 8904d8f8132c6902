"""The engine's core, which needs no model: ``Scheduler`` (``scheduler.py``: continuous batching, chunked prefill,
preemption, ``update_from_output``; ``stop.py``: the stop conditions; ``stats.py``: its ``SchedulerStats``),
``KVCacheManager`` (``kv_cache_manager.py``) and ``BlockPool`` (``block_pool.py``, with its plain parts in
``kv_block.py``: paged KV with prefix caching), KV cache groups (``kv_groups.py``: sliding windows), and the
step's hand-off types (``output.py``)."""
