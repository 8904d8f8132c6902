"""Continuous batching under one token budget per step (the scheduling idea of vLLM v1).

There are no separate prefill and decode phases. Each step the scheduler hands out at most
``max_num_batched_tokens`` tokens and keeps at most ``max_num_seqs`` requests running:

1. **Running requests first**, in admission order. A request in decode gets 1 token; one still
   prefilling gets the rest of its prompt, cut to what is left of the budget (a *chunk*). If the pool
   cannot hold the new tokens, the most recently admitted running request is **preempted**: its blocks
   are freed (cached ones stay findable, so resuming is often cheap), its progress is reset to zero,
   and it goes to the front of the waiting queue to be recomputed later.
2. **Then waiting requests**, in arrival order, only if nobody was preempted this step: each first
   looks up its prompt in the prefix cache, then gets a chunk of what remains. A request that could
   never fit in the whole pool fails at once with a reason, so it cannot stall the queue.

The result is a ``SchedulerOutput`` (``core/output.py``, with ``SchedulerUpdate``); the engine runs it and
hands the sampled tokens back to ``update_from_output`` (vLLM's name), which owns the step's second half:
progress, new tokens, stop conditions (``core/stop.py``), finishing (the scheduler's ``StepUpdateMixin``,
``core/step_update.py``). ``make_stats`` reads the counters
telemetry records after each step.

Speculative decoding: a decoding request with drafts (``request.spec_token_ids``, set by the engine's
``Speculator`` before scheduling) is scheduled its last sampled token plus the drafts that fit in the
budget; their KV slots are allocated like any token's (never offered to the prefix cache), and if the
pool cannot hold them the drafts are dropped before anyone is preempted. ``update_from_output`` keeps
the accepted drafts, moves ``num_computed_tokens`` back past the rejected ones and gives back the
blocks that held only rejected drafts (``KVCacheManager.trim``).

Sliding windows: ``KVCacheManager.allocate_slots`` first gives back the blocks of a running request
that left the window of every layer reading them (from ``num_computed_tokens``, never counting drafts),
so a long request on a windowed model holds about ``window / block_size`` blocks per sliding group.

Engine rules (``EngineConfig.scheduler_rules``, ``core/rules.py``): kvscope's own by default; vLLM's
(``--engine vllm``) admit a waiting request only if the free blocks hold its whole sequence
(``reserve_full_isl``), free the requests a step finishes in schedule order, and index the prefix cache as
vLLM does (``hash_index``, set on the pool here). All act outside the running loop, so kvscope's rules cost
that loop nothing (docs/vllm_scheduling.md lists every rule of vLLM's that can change a schedule).
"""

from __future__ import annotations

from collections import deque

from kvscope.engine.config import EngineConfig
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.core.rules import SchedulerRules
from kvscope.engine.core.stats import scheduler_stats
from kvscope.engine.core.step_update import StepUpdateMixin
from kvscope.engine.request import Request, RequestStatus
from kvscope.telemetry.inputs import SchedulerStats
from kvscope.telemetry.records import WAIT_MAX_NUM_SEQS, WAIT_NO_FREE_BLOCKS, WAIT_TOKEN_BUDGET


class Scheduler(StepUpdateMixin):
    def __init__(
        self,
        config: EngineConfig,
        kv: KVCacheManager,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids  # end a request unless its params say ignore_eos
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.wait_reason: str | None = None  # why the last schedule() left requests waiting (WAIT_REASONS)
        self.rules = SchedulerRules.coerce(getattr(config, "scheduler_rules", None))
        if self.rules.hash_index:
            kv.pool.use_hash_index()
        kv.pool.preempted_hits_apart = self.rules.preempted_hits_apart

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """The next step: the running requests' tokens, then admissions (none if anyone was preempted)."""
        self.kv.begin_step()
        out = SchedulerOutput()
        self._schedule_running(out)
        reason: str | None = WAIT_NO_FREE_BLOCKS  # a running request needed blocks: nobody is admitted now
        if not out.preempted:
            reason = self._schedule_waiting(out)
        self.wait_reason = reason if self.waiting else None
        return out

    def _schedule_running(self, out: SchedulerOutput) -> None:
        """Give each running request, in admission order, its tokens of this step until the budget is spent:
        one in decode (and the drafts that fit, if it has any), the rest of its prompt in prefill, cut to what
        is left of the budget (a chunk). ``_make_room`` preempts where the pool cannot hold them.

        The engine's CPU cost per step is this loop (once per running request): its one call per request is
        ``slots_ready`` (``allocate_slots`` only where that says it would change something), and the requests
        it schedules, the first ones of ``running``, are recorded all at once after it."""
        running, max_tokens, slots_ready = self.running, self.config.max_num_batched_tokens, self.kv.slots_ready
        total = out.total_num_tokens
        new_tokens: list[int] = []  # new_tokens[i]: the tokens of running[i] in this step
        for request in running:  # preemption pops from the end: the iterator then stops before the victims
            budget = max_tokens - total
            if budget <= 0:
                break
            computed, num_tokens = request.num_computed_tokens, len(request.all_token_ids)
            num_new = num_tokens - computed
            if num_new > budget:
                num_new = budget
            drafts = request.spec_token_ids
            if drafts:  # a decode verifies the drafts that fit; either way they are the request's no more
                request.spec_token_ids = []
                drafts = drafts[: budget - 1] if computed == num_tokens - 1 else []
                num_new += len(drafts)
            if not slots_ready(request, num_new):
                num_new, drafts = self._make_room(request, num_new, drafts, out)
                if not num_new:  # the request itself was preempted
                    break
            if drafts:
                out.scheduled_spec_decode_tokens[request.request_id] = drafts
            new_tokens.append(num_new)
            total += num_new
        self._add(out, running[: len(new_tokens)], new_tokens)

    def _make_room(self, request: Request, num_new: int, drafts: list[int],
                   out: SchedulerOutput) -> tuple[int, list[int]]:
        """Allocate the slots of a running request's ``num_new`` tokens. While the pool cannot hold them, its
        drafts are dropped (rather than preempt anyone), then the most recently admitted running request is
        preempted. Returns the tokens and drafts it gets, ``(0, [])`` when it was preempted itself."""
        while not self.kv.allocate_slots(request, num_new):
            if drafts:
                num_new, drafts = num_new - len(drafts), []
                continue
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                return 0, []
        return num_new, drafts

    def _schedule_waiting(self, out: SchedulerOutput) -> str | None:
        """Admit waiting requests in order; returns why the rest still wait (``WAIT_REASONS``), if any do."""
        cfg = self.config
        while self.waiting:
            if len(self.running) >= cfg.max_num_seqs:
                return WAIT_MAX_NUM_SEQS
            budget = cfg.max_num_batched_tokens - out.total_num_tokens
            if budget <= 0:
                return WAIT_TOKEN_BUDGET
            request = self.waiting[0]
            final_len = min(
                request.num_prompt_tokens + request.sampling_params.max_tokens, self.max_model_len
            )
            if not self.kv.can_fit(request, final_len):
                self.waiting.popleft()
                needed, bs, total = self.kv.num_blocks_needed(final_len), self.kv.block_size, self.kv.pool.num_blocks
                self._fail(
                    request,
                    out,
                    (
                        f"request {request.request_id} needs {needed} blocks of {bs} tokens "
                        f"({final_len} tokens: prompt + max_tokens) but the whole KV pool has {total}; "
                        "raise num_blocks / kv_cache_memory, or lower max_tokens"
                    ),
                )
                continue
            hits = self.kv.get_computed_blocks(request)
            num_computed = len(hits) * self.kv.block_size
            num_new = request.num_tokens - num_computed
            if not cfg.enable_chunked_prefill and num_new > budget:
                if num_new > cfg.max_num_batched_tokens:  # would never fit in one step
                    self.waiting.popleft()
                    self._fail(
                        request,
                        out,
                        (
                            f"request {request.request_id} has {num_new} tokens to prefill but chunked prefill is "
                            f"off and a step holds {cfg.max_num_batched_tokens}; turn enable_chunked_prefill on "
                            "or raise max_num_batched_tokens"
                        ),
                    )
                    continue
                return WAIT_TOKEN_BUDGET
            num_new = min(num_new, budget)
            if self.rules.reserve_full_isl and not self.kv.can_allocate(request, request.num_tokens - num_computed,
                                                                         hits):
                return WAIT_NO_FREE_BLOCKS  # vLLM's rule: the whole sequence must fit, not only this chunk
            if not self.kv.allocate_slots(request, num_new, hits):
                return WAIT_NO_FREE_BLOCKS  # wait for running requests to free blocks
            self.waiting.popleft()
            request.num_computed_tokens = num_computed
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.admitted.append(request)
            self._add(out, [request], [num_new])
        return None

    @staticmethod
    def _fail(request: Request, out: SchedulerOutput, error: str) -> None:
        request.status = RequestStatus.FINISHED_ERROR
        request.error = error
        out.failed.append(request)

    @staticmethod
    def _add(out: SchedulerOutput, requests: list[Request], num_tokens: list[int]) -> None:
        """Schedule ``num_tokens[i]`` tokens of ``requests[i]`` in this step: the drafts of a request in
        ``out.scheduled_spec_decode_tokens`` are among them (after the one token of its decode)."""
        out.requests += requests
        out.num_tokens += num_tokens
        out.total_num_tokens += sum(num_tokens)
        drafts = out.scheduled_spec_decode_tokens
        if drafts:  # a decode with drafts is still a decode
            num_tokens = [n - len(drafts.get(r.request_id, ())) for r, n in zip(requests, num_tokens)]
        out.is_decode += [n == 1 and len(r.output_token_ids) > 0 for r, n in zip(requests, num_tokens)]

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.spec_token_ids = []
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def make_stats(self) -> SchedulerStats:
        """Queue lengths, pool counts and prefix-cache counters now, in O(running requests)."""
        return scheduler_stats(self.kv, self.running, len(self.waiting))
