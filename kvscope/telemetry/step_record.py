"""A step's ``StepRecord`` from the plain data its source hands the ``Recorder``: the batch's
composition, the phase times between the timings' marks, and the ``KVState`` computed from the
scheduler's counters and the run's constants (definitions in docs/telemetry.md).

Pure functions: the recorder supplies what it tracks itself (the page map's changes, a memory sample).
"""

from __future__ import annotations

from typing import Any

from kvscope.telemetry.inputs import BatchSummary, SchedulerStats, StepTimings
from kvscope.telemetry.records import KVState, PageEntry, StepRecord


def kv_state(stats: SchedulerStats, block_size: int, kv_bytes_per_block: int,
             static_bytes_per_request: int) -> KVState:
    """The ``KVState`` of a step from its counters and the run's constants (docs/telemetry.md)."""
    bs, num_blocks, used, stored = block_size, stats.num_blocks, stats.blocks_used, stats.tokens_stored
    slots_used = used * bs
    return KVState(
        num_blocks=num_blocks,
        block_size=bs,
        blocks_used=used,
        blocks_cached_free=stats.blocks_cached_free,
        tokens_stored=stored,
        block_usage=used / num_blocks,
        token_usage=stored / (num_blocks * bs),
        fragmentation=1.0 - stored / slots_used if slots_used else 0.0,
        static_reservation_bytes=stats.num_running * static_bytes_per_request,
        paged_bytes=used * kv_bytes_per_block,
        prefix_cache_queries=stats.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits,
        num_evictions=stats.num_evictions,
        num_window_freed_blocks=stats.num_window_freed_blocks,
    )


def step_record(batch: BatchSummary, t: StepTimings, stats: SchedulerStats, kv: KVState,
                page_map: dict[int, PageEntry], page_map_full: bool, memory: dict[str, Any]) -> StepRecord:
    """The record of a finished step: its batch, phase times, the counters after it, and what the
    recorder tracked (``kv``, the page map's changes or snapshot, a memory sample)."""
    scheduled, counts = batch.scheduled, batch.counts  # the batch's composition (comprehensions: one pass each)
    if counts is not None:  # a light batch: counted by its source
        prefill_seqs, prefill_tokens = counts.num_prefill_seqs, counts.num_prefill_tokens
        decode_seqs, decode_tokens = counts.num_decode_seqs, counts.num_decode_tokens
        num_sampled = counts.num_output_tokens
    else:
        decodes = [item.num_tokens for item in scheduled if item.kind == "decode"]
        decode_seqs, decode_tokens = len(decodes), sum(decodes)
        prefill_seqs = len(scheduled) - decode_seqs
        prefill_tokens = sum([i.num_tokens for i in scheduled]) - decode_tokens
        num_sampled = sum([i.sampled + i.num_accepted_tokens for i in scheduled])  # drafts accepted: more tokens
    return StepRecord(
        step=batch.step,
        t_start_ns=t.start_ns,
        t_end_ns=t.end_ns,
        schedule_ns=t.scheduled_ns - t.start_ns,
        prepare_ns=t.prepared_ns - t.scheduled_ns,
        forward_ns=t.forwarded_ns - t.prepared_ns,
        sample_ns=t.sampled_ns - t.forwarded_ns,
        update_ns=t.end_ns - t.sampled_ns,
        num_prefill_seqs=prefill_seqs,
        num_prefill_tokens=prefill_tokens,
        num_decode_seqs=decode_seqs,
        num_decode_tokens=decode_tokens,
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_preempted=len(batch.preempted),
        num_finished=batch.num_finished,
        num_output_tokens=num_sampled,
        scheduled=batch.scheduled,
        kv=kv,
        page_map=page_map,
        page_map_full=page_map_full,
        memory=memory,
        spec_decode=batch.spec_decode,
        sampled_ids=counts.sampled_ids if counts is not None else None,
    )
