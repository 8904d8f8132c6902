"""The fleet: what the watched engines add up to at a moment (queues, the KV pool, prefix-cache counters)
and the record of one poll interval when no plugin reports vLLM's own steps.

From the plugin's latest step where ``plugin_records`` (its state is exact and per step), else from each
connected engine's last ``/metrics`` sample.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvscope.telemetry.records import KVState, StepRecord
from kvscope.watched.engines import COUNTER_OF, EngineState, count


def kv_usage(eng: EngineState, plugin_records: bool) -> float | None:
    """The engine's KV usage (0-1), or ``None`` while it reports none (not connected)."""
    if plugin_records and "kv_cache_usage" in eng.plugin:
        return eng.plugin["kv_cache_usage"]
    if eng.connected and eng.last is not None:
        return eng.last.gauges.get("vllm:kv_cache_usage_perc")
    return None


def fleet_queues(engines: Iterable[EngineState], plugin_records: bool) -> tuple[int, int]:
    """(running, waiting) requests over every engine."""
    running = waiting = 0
    for eng in engines:
        if plugin_records and "num_running_reqs" in eng.plugin:
            running += count(eng.plugin["num_running_reqs"])
            waiting += count(eng.plugin.get("num_waiting_reqs"))
        elif eng.connected and eng.last is not None:
            running += count(eng.last.gauges.get("vllm:num_requests_running"))
            waiting += count(eng.last.gauges.get("vllm:num_requests_waiting"))
    return running, waiting


def fleet_kv(engines: Iterable[EngineState], plugin_records: bool) -> KVState:
    """The fleet's KV pool: blocks used from each engine's usage x its pool; no token-level fill
    (``tokens_stored`` is the upper bound ``blocks_used x block_size``, fragmentation unknown: 0 here,
    NaN in the summary), no bytes."""
    engines = list(engines)
    num_blocks = used = 0
    usages = []
    block_size = 0
    for eng in engines:
        usage = kv_usage(eng, plugin_records)
        if usage is None:
            continue
        usages.append(usage)
        if eng.num_gpu_blocks:
            num_blocks += eng.num_gpu_blocks
            used += round(usage * eng.num_gpu_blocks)
        block_size = block_size or (eng.block_size or 0)
    block_usage = used / num_blocks if num_blocks else (sum(usages) / len(usages) if usages else 0.0)
    source = "plugin_totals" if plugin_records else "totals"
    queries = sum(count(getattr(e, source).get("prefix_cache_queries" if plugin_records
                                              else COUNTER_OF["prefix_queries"])) for e in engines)
    hits = sum(count(getattr(e, source).get("prefix_cache_hits" if plugin_records
                                           else COUNTER_OF["prefix_hits"])) for e in engines)
    evicted = sum(e.residency.num_removed + e.residency.num_removed_unseen for e in engines)
    return KVState(num_blocks=num_blocks, block_size=block_size, blocks_used=used, blocks_cached_free=0,
                   tokens_stored=used * block_size, block_usage=block_usage, token_usage=block_usage,
                   fragmentation=0.0, static_reservation_bytes=0, paged_bytes=0, prefix_cache_queries=queries,
                   prefix_cache_hits=hits, num_evictions=evicted)


def interval_record(t_ns: int, sums: dict[str, float], computed: float, queues: tuple[int, int],
                    kv: KVState) -> StepRecord:
    """The record of one poll interval ending at ``t_ns`` (zero duration: an interval is no step) from the
    fleet's counter deltas ``sums`` (by ``COUNTER_OF`` name), prompt tokens ``computed``, queues and pool."""
    running, waiting = queues
    return StepRecord(
        step=-1, t_start_ns=t_ns, t_end_ns=t_ns, schedule_ns=0, prepare_ns=0, forward_ns=0, sample_ns=0,
        update_ns=0, num_prefill_seqs=0, num_prefill_tokens=count(computed), num_decode_seqs=0,
        num_decode_tokens=count(sums["generation_tokens"]), num_running=running, num_waiting=waiting,
        num_preempted=count(sums["preemptions"]), num_finished=count(sums["finished"]),
        num_output_tokens=count(sums["generation_tokens"]), scheduled=[], kv=kv)
