"""The engine's core, which needs no model: ``Scheduler`` (continuous batching, chunked prefill, preemption,
``update_from_output``), ``KVCacheManager`` and ``BlockPool`` (paged KV with prefix caching), KV cache groups
(sliding windows), and the step's hand-off types (``output.py``)."""
