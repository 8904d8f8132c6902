"""What the engine records: one ``StepRecord`` per step and a ``RequestEvent`` per request transition.

Times are ``time.perf_counter_ns()`` values (on Linux: ``CLOCK_MONOTONIC``, one clock for the whole
process). Every field and metric is defined in ``docs/telemetry.md``; this module is plain data only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# Request event kinds, in the order a request can go through them.
EVENT_KINDS = ("queued", "scheduled", "first_token", "preempted", "resumed", "finished")

# Page states, see ``PageEntry``.
PAGE_STATES = ("free", "used", "shared", "cached")

# Kernel-time categories of ``StepRecord.profile`` (plus "total").
PROFILE_CATEGORIES = ("attention", "matmul", "store_kv", "sampling", "other")


@dataclass(slots=True)
class RequestEvent:
    """A request changed state. ``t_ns`` of ``first_token`` and of a ``finished`` that a step caused
    (stop / length) is that step's ``t_end_ns``: the moment the step hands its tokens back."""

    t_ns: int
    step: int  # index of the step during or before which it happened
    request_id: str
    kind: str  # one of EVENT_KINDS
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # output tokens the request had at that moment
    reason: str | None = None  # finished: stop | length | abort | error
    error: str | None = None  # finished with reason "error": what went wrong
    num_cached_tokens: int = 0  # scheduled / resumed: prompt tokens served from the prefix cache


@dataclass(slots=True)
class ScheduledItem:
    """One request's share of a step."""

    request_id: str
    kind: str  # "prefill" (a prompt chunk, or a recompute after preemption) or "decode"
    num_tokens: int  # tokens computed for it this step
    context_len: int  # tokens in its KV cache after this step
    sampled: bool = False  # it got an output token this step (the last chunk of a prefill, or a decode)


@dataclass(slots=True)
class KVState:
    """The KV pool after the step (see docs/telemetry.md for each definition)."""

    num_blocks: int
    block_size: int
    blocks_used: int  # ref_cnt > 0
    blocks_cached_free: int  # free, but still holding a findable prefix
    tokens_stored: int  # filled slots in used blocks (a shared block counts once)
    block_usage: float  # blocks_used / num_blocks
    token_usage: float  # tokens_stored / (num_blocks * block_size)
    fragmentation: float  # 1 - tokens_stored / (blocks_used * block_size); 0 when nothing is used
    static_reservation_bytes: int  # running requests x max_model_len x KV bytes per token
    paged_bytes: int  # blocks_used x KV bytes per block
    prefix_cache_queries: int  # cumulative prompt tokens looked up
    prefix_cache_hits: int  # cumulative prompt tokens found
    num_evictions: int  # cumulative cached blocks reused for new content


class PageEntry(NamedTuple):
    """One block of the page map.

    ``owner``: the request that took the block from the free pool (allocated it, or revived it from
    the prefix cache); later holders of a shared block do not change it. For a ``cached`` block it is
    the request whose tokens it still holds; ``""`` for a ``free`` block.
    ``state``: ``used`` (one holder), ``shared`` (``refs`` > 1 holders), ``cached`` (no holder, but
    findable by the prefix cache), ``free`` (no holder, nothing kept).
    """

    owner: str
    filled: int  # token slots holding K/V (block_size for shared and cached blocks, 0 for free)
    state: str  # one of PAGE_STATES
    refs: int  # requests holding it (ref count)


FREE_PAGE = PageEntry("", 0, "free", 0)


@dataclass(slots=True)
class StepRecord:
    step: int
    t_start_ns: int
    t_end_ns: int
    # phases (ns); they add up to t_end_ns - t_start_ns
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
    num_running: int  # after the step
    num_waiting: int  # after the step
    num_preempted: int  # this step
    num_finished: int  # this step
    num_output_tokens: int  # tokens sampled this step
    scheduled: list[ScheduledItem]
    kv: KVState
    # Page map: block id -> PageEntry for every block that changed since the previous record. When
    # ``page_map_full`` is set it holds every block instead (a snapshot; see docs/telemetry.md).
    page_map: dict[int, PageEntry] = field(default_factory=dict)
    page_map_full: bool = False
    # Memory probes (see telemetry/probes.py): keys that could not be read are absent, never 0.
    memory: dict[str, int | float] = field(default_factory=dict)
    # Kernel time by category (ns, PROFILE_CATEGORIES + "total") when the step was profiled; filled
    # in place when the profiling window closes.
    profile: dict[str, int] | None = None

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens
