"""What a source hands the recorder after each step: its batch (``BatchSummary``), the boundaries of its
phases (``StepTimings``) and the counters after it (``SchedulerStats``). Plain data only, no engine types;
``step_record.py`` turns them into a ``records.StepRecord``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.telemetry.records import ScheduledItem, SpecDecodeStats


@dataclass(slots=True)
class StepTimings:
    """``perf_counter_ns`` at the boundaries of one step's phases (schedule, prepare, forward,
    sample, update); a step that stopped early repeats its last time for the phases it skipped."""

    start_ns: int
    scheduled_ns: int
    prepared_ns: int
    forwarded_ns: int
    sampled_ns: int
    end_ns: int

    @classmethod
    def instant(cls, t_ns: int) -> StepTimings:
        """A zero-duration step (a state record)."""
        return cls(t_ns, t_ns, t_ns, t_ns, t_ns, t_ns)


@dataclass(slots=True)
class RequestProgress:
    """Where a request stood when the scheduler admitted or preempted it."""

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int  # before this step's sample
    num_cached_tokens: int = 0  # admitted: tokens already in the KV cache (prefix-cache hits)


@dataclass(slots=True)
class BatchSummary:
    """One step's batch, after the step: what the recorder needs of a ``SchedulerOutput``."""

    step: int  # unique, increasing index of the step (a state record takes one too)
    scheduled: list[ScheduledItem] = field(default_factory=list)
    # block_tables[i]: block ids of scheduled[i]'s request after the step ([] if it finished); read
    # during record_step only, so a source may pass its live lists
    block_tables: list[list[int]] = field(default_factory=list)
    admitted: list[RequestProgress] = field(default_factory=list)  # left the waiting queue this step
    preempted: list[RequestProgress] = field(default_factory=list)  # sent back to the waiting queue
    num_finished: int = 0  # finished this step (stop / length) plus failed at scheduling
    spec_decode: SpecDecodeStats | None = None  # speculative decoding's share of the step, if on
    wait_reason: str | None = None  # why requests still waited after the schedule (StepRecord.wait_reason)
    gc_ns: int = 0  # the source's time in the garbage collector since its previous step (StepRecord.gc_ns)
    attention_backend: str | None = None  # the attention kernel the step ran (StepRecord.attention_backend)
    counts: BatchCounts | None = None  # a light batch (no ``scheduled``): its counts (Recorder.detail)


@dataclass(slots=True)
class BatchCounts:
    """What ``step_record`` counts from a batch's ``scheduled`` items, for a light batch that has none: the
    steps of a long simulation that its recorder's window will not keep (``Recorder.detail``)."""

    num_prefill_seqs: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_decode_tokens: int
    num_output_tokens: int  # sampled, plus accepted drafts
    sampled_ids: list[str]  # the requests that sampled (StepRecord.sampled_ids)


@dataclass(slots=True)
class SchedulerStats:
    """Counters after a step (vLLM's ``SchedulerStats`` idea): queues, pool, prefix cache."""

    num_running: int
    num_waiting: int
    num_blocks: int
    blocks_used: int  # ref_cnt > 0
    blocks_cached_free: int  # free, but still holding a findable prefix
    tokens_stored: int  # filled slots in used blocks (a shared block counts once)
    prefix_cache_queries: int = 0  # cumulative prompt tokens looked up
    prefix_cache_hits: int = 0  # cumulative prompt tokens found
    num_evictions: int = 0  # cumulative cached blocks reused for new content
    # sliding windows (kvscope.engine.core.kv_groups): cumulative blocks given back because they left the window of
    # every layer that read them, and the blocks running requests hold in each KV cache group
    num_window_freed_blocks: int = 0
    blocks_used_per_group: list[int] = field(default_factory=list)

