"""What telemetry records: plain data only, no engine types.

Recorded: one ``StepRecord`` per step and a ``RequestEvent`` per request transition. What a source hands
the recorder per step (``BatchSummary``, ``StepTimings``, ``SchedulerStats``) is ``inputs.py``'s (which imports
the parts it shares with a record from here); block-pool events (``BLOCK_EVENT_KINDS``) are named here. The source
may import this module;
nothing here imports the source.

Times are ``time.perf_counter_ns()`` values (on Linux: ``CLOCK_MONOTONIC``, one clock for the whole
process). Every field and metric is defined in ``docs/telemetry.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

# Request event kinds, in the order a request can go through them.
EVENT_KINDS = ("queued", "scheduled", "first_token", "preempted", "resumed", "finished")

# Page states, see ``PageEntry``.
PAGE_STATES = ("free", "used", "shared", "cached")

# Kernel-time categories of ``StepRecord.profile`` (plus "total").
PROFILE_CATEGORIES = ("attention", "matmul", "store_kv", "sampling", "other")

# Block-pool events, ``listener(kind, block_id)``: the block was taken from the free pool with one
# reference ("allocated"), got one more reference from a prefix-cache hit ("hit"), lost one but is
# still held ("released"), lost its last one ("freed"), became findable by its hash ("cached"), or
# had its cached contents dropped ("evicted"; also for a block that stays held). "window_freed": like
# "freed", but its last holder dropped it because it left a sliding window (the request goes on; the
# block stays cached if it was).
BLOCK_ALLOCATED, BLOCK_HIT, BLOCK_RELEASED, BLOCK_FREED = "allocated", "hit", "released", "freed"
BLOCK_CACHED, BLOCK_EVICTED, BLOCK_WINDOW_FREED = "cached", "evicted", "window_freed"
BLOCK_EVENT_KINDS = (BLOCK_ALLOCATED, BLOCK_HIT, BLOCK_RELEASED, BLOCK_FREED, BLOCK_CACHED, BLOCK_EVICTED,
                     BLOCK_WINDOW_FREED)
BlockEventListener = Callable[[str, int], None]

# Why waiting requests were not admitted in a step (``StepRecord.wait_reason``, the scheduler's): the step's token
# budget was spent, max_num_seqs requests were running, or the pool had no free blocks (for the next waiting
# request, or a running one needed blocks and nobody was admitted). A request waiting after a preemption waits to
# be recomputed ("preempted", from its events), and one that arrived while a step ran waits for the next
# ("step_in_progress"); kvscope.explain.waits splits queue times by these.
WAIT_TOKEN_BUDGET, WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCKS = "token_budget", "max_num_seqs", "no_free_blocks"
WAIT_PREEMPTED, WAIT_STEP_IN_PROGRESS = "preempted", "step_in_progress"
WAIT_REASONS = (WAIT_TOKEN_BUDGET, WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCKS, WAIT_PREEMPTED, WAIT_STEP_IN_PROGRESS)


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
    # queued: the prompt's token ids (None where the source does not give them), so a run can be replayed
    # (``kvscope simulate --replay``) with the same prefix-cache hits, under any block size
    prompt_token_ids: list[int] | None = None


@dataclass(slots=True)
class ScheduledItem:
    """One request's share of a step."""

    request_id: str
    kind: str  # "prefill" (a prompt chunk, or a recompute after preemption) or "decode"
    num_tokens: int  # tokens computed for it this step
    context_len: int  # tokens in its KV cache after this step
    sampled: bool = False  # it got an output token this step (the last chunk of a prefill, or a decode)
    # speculative decoding: draft tokens verified for it this step (part of num_tokens), and how many
    # of them were accepted and kept (its output tokens this step: 1 + num_accepted_tokens)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # KV cache groups (kvscope.engine.core.kv_groups): the request's block table handed with it interleaves its
    # groups' tables, entry ``j * num_kv_groups + g`` = block ``j`` of group ``g`` (-1: left the window)
    num_kv_groups: int = 1


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
    static_reservation_bytes: int  # running requests x what a static cache reserves for max_model_len tokens
    paged_bytes: int  # blocks_used x KV bytes per block
    prefix_cache_queries: int  # cumulative prompt tokens looked up
    prefix_cache_hits: int  # cumulative prompt tokens found
    num_evictions: int  # cumulative cached blocks reused for new content
    num_window_freed_blocks: int = 0  # cumulative blocks freed for leaving every reading layer's window


class PageEntry(NamedTuple):
    """One block of the page map.

    ``owner``: the request that took the block from the free pool (allocated it, or revived it from
    the prefix cache); later holders of a shared block do not change it. For a ``cached`` block it is
    the request whose tokens it still holds; ``""`` for a ``free`` block.
    ``state``: ``used`` (one holder), ``shared`` (``refs`` > 1 holders), ``cached`` (no holder, but
    findable by the prefix cache), ``free`` (no holder, nothing kept).
    ``kv_group``: the KV cache group (ARCHITECTURE.md) of the block table it last entered; always 0 for
    a model with one group.
    """

    owner: str
    filled: int  # token slots holding K/V (block_size for shared and cached blocks, 0 for free)
    state: str  # one of PAGE_STATES
    refs: int  # requests holding it (ref count)
    kv_group: int = 0


FREE_PAGE = PageEntry("", 0, "free", 0)


@dataclass(slots=True)
class SpecDecodeStats:
    """What speculative decoding did in one step (vLLM's ``SpecDecodingStats``, plus where it happened).

    Per draft position ``i`` (0-based): ``num_draft_tokens_per_pos[i]`` requests had an ``i``-th draft,
    ``num_accepted_tokens_per_pos[i]`` of them had it accepted (acceptance stops at the first
    rejection, so these fall with ``i``). ``draft_slots``: target KV block -> ``[draft slots the
    verification wrote into it, of them accepted]``; ``freed_blocks``: those of them that held nothing
    but rejected drafts, given back to the pool at the end of the step. ``draft_page_map``: the draft
    model's own pool, like ``StepRecord.page_map`` (changed blocks, or every block when
    ``draft_page_map_full``)."""

    num_spec_tokens: int  # k: drafts asked for per request per step
    num_drafts: int = 0  # requests verified with at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    draft_slots: dict[int, list[int]] = field(default_factory=dict)
    freed_blocks: list[int] = field(default_factory=list)
    propose_ns: int = 0  # proposing the next step's drafts (part of update_ns)
    draft_num_blocks: int = 0  # the draft model's pool (0: no draft model)
    draft_blocks_used: int = 0
    draft_page_map: dict[int, PageEntry] = field(default_factory=dict)
    draft_page_map_full: bool = False

    @property
    def num_rejected_tokens(self) -> int:
        return self.num_draft_tokens - self.num_accepted_tokens


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
    # Memory readings (see telemetry/memory.py): keys that could not be read are absent, never 0.
    memory: dict[str, int | float] = field(default_factory=dict)
    # Kernel time by category (ns, PROFILE_CATEGORIES + "total") when the step was profiled; filled
    # in place when the profiling window closes.
    profile: dict[str, int] | None = None
    # Speculative decoding in this step; None when speculation is off (and in files written before it).
    spec_decode: SpecDecodeStats | None = None
    # Why the requests still waiting after this step's schedule were not admitted (WAIT_REASONS' first three);
    # None when none waited (and in files written before it, or from a source that does not say)
    wait_reason: str | None = None
    # ns this process spent in the garbage collector since the previous record (None: none, or not measured)
    gc_ns: int | None = None
    # The attention kernel this step ran ("torch", "cpu", "triton": meta's attention_backend until a kernel built in
    # the background took over, see meta's attention_backend_switches); None in files written before it
    attention_backend: str | None = None
    # A light record (``Recorder.detail`` off: a step of a long simulation that its window will not keep) has no
    # ``scheduled`` items and no page-map changes; these are the requests that sampled in it (the exact summary's
    # inter-token intervals need them). None for every other record; not written to files
    sampled_ids: list[str] | None = None

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens
