"""``SchedulerStats`` of a scheduler's state: what each step record reports of the queues, the pool and the
prefix cache (vLLM: ``Scheduler.make_stats``)."""

from __future__ import annotations

from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.request import Request
from kvscope.telemetry.inputs import SchedulerStats


def scheduler_stats(kv: KVCacheManager, running: list[Request], num_waiting: int) -> SchedulerStats:
    """Queue lengths, pool counts and prefix-cache counters now, in O(running requests).

    ``tokens_stored``: every used block sits in the table of at least one running request, the
    table of a running request covers exactly its computed tokens in each of the ``G`` KV cache
    groups, and only full blocks are ever shared, so each extra holder of a shared block
    over-counts exactly ``block_size`` tokens; so does each null entry (a full block that left a
    sliding window), counted in the table's length but held by nobody.
    """
    pool = kv.pool
    used = pool.num_used_blocks
    groups = kv.num_groups
    computed = groups * sum([r.num_computed_tokens for r in running])  # list comprehensions: faster than
    table_entries = sum([len(r.block_ids) for r in running])  # generators, and this runs every step
    if groups > 1:
        table_entries += sum([len(t) for r in running for t in r.extra_block_ids])
    return SchedulerStats(
        num_running=len(running),
        num_waiting=num_waiting,
        num_blocks=pool.num_blocks,
        blocks_used=used,
        blocks_cached_free=pool.num_cached_free_blocks,
        tokens_stored=computed - pool.block_size * (table_entries - used),
        prefix_cache_queries=pool.prefix_cache_queries,
        prefix_cache_hits=pool.prefix_cache_hits,
        num_evictions=pool.num_evictions,
        num_window_freed_blocks=pool.num_window_freed_blocks,
        blocks_used_per_group=[pool.used_per_group.get(g, 0) for g in range(groups)],
    )
