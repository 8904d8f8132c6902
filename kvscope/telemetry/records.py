"""What the engine records: one ``StepRecord`` per step and a ``RequestEvent`` per request transition.

Times are ``time.perf_counter_ns()`` values (one monotonic clock for the whole process). Every metric is
defined in ``docs/telemetry.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Request event kinds, in the order a request can go through them.
EVENT_KINDS = ("queued", "scheduled", "first_token", "preempted", "resumed", "finished")


@dataclass(slots=True)
class RequestEvent:
    t_ns: int
    step: int
    request_id: str
    kind: str  # one of EVENT_KINDS
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    reason: str | None = None  # finished: stop | length | abort | error; error text in ``error``
    error: str | None = None


@dataclass(slots=True)
class ScheduledItem:
    """One request's share of a step."""

    request_id: str
    kind: str  # "prefill" (a prompt chunk, or a recompute after preemption) or "decode"
    num_tokens: int
    context_len: int  # tokens in its KV cache after this step


@dataclass(slots=True)
class KVState:
    num_blocks: int
    block_size: int
    blocks_used: int
    blocks_cached_free: int  # free, but still holding a findable prefix
    tokens_stored: int  # filled slots in used blocks (a shared block counts once)
    block_usage: float  # blocks_used / num_blocks
    token_usage: float  # tokens_stored / (num_blocks * block_size)
    fragmentation: float  # 1 - tokens_stored / (blocks_used * block_size); 0 when nothing is used
    static_reservation_bytes: int  # running requests x max_model_len x bytes per token
    paged_bytes: int  # blocks_used x bytes per block
    prefix_cache_queries: int  # cumulative tokens looked up
    prefix_cache_hits: int  # cumulative tokens found
    num_evictions: int  # cumulative cached blocks reused for new content


@dataclass(slots=True)
class StepRecord:
    step: int
    t_start_ns: int
    t_end_ns: int
    # phases (ns)
    schedule_ns: int
    prepare_ns: int
    forward_ns: int
    sample_ns: int
    update_ns: int
    # batch composition
    num_prefill_seqs: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_preempted: int  # this step
    num_finished: int  # this step
    num_output_tokens: int  # tokens sampled this step
    scheduled: list[ScheduledItem]
    kv: KVState
    # page map: block id -> (owner request id or "" for none, tokens filled, state) for blocks that
    # changed since the previous step; ``page_map_full`` marks a full snapshot of every block
    page_map: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    page_map_full: bool = False
    memory: dict[str, int] = field(default_factory=dict)
    profile: dict[str, Any] | None = None  # kernel time by category (ns) when the step was profiled

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens
