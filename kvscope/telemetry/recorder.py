"""Recorder: turns each engine step into a ``StepRecord`` and keeps the recent ones in a ring buffer.

The engine calls ``record_step`` and ``request_event`` from its own thread. Subscribers are called
inline with each record and must not block (put it on a ``queue.SimpleQueue``, append to a list);
readers on other threads can instead poll ``steps_since(n)``, which never blocks the engine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .records import KVState, RequestEvent, ScheduledItem, StepRecord

if TYPE_CHECKING:
    from ..engine import Engine
    from ..request import Request
    from ..runner import ModelInput
    from ..scheduler import SchedulerOutput

Subscriber = Callable[[StepRecord | RequestEvent], None]


class Recorder:
    def __init__(self, engine: Engine, capacity: int = 100_000) -> None:
        self.engine = engine
        self.steps: deque[StepRecord] = deque(maxlen=capacity)
        self.events: deque[RequestEvent] = deque(maxlen=capacity * 4)
        self.num_steps_recorded = 0  # total, including any that fell out of the ring
        self.subscribers: list[Subscriber] = []
        self._seen_scheduled: set[str] = set()
        self._was_preempted: set[str] = set()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn) if fn in self.subscribers else None

    def _publish(self, item: StepRecord | RequestEvent) -> None:
        for fn in self.subscribers:
            fn(item)

    def steps_since(self, n: int) -> list[StepRecord]:
        """Records with index >= n (index = count of records before it), as far as the ring still has them."""
        first = self.num_steps_recorded - len(self.steps)
        start = max(n - first, 0)
        return [self.steps[i] for i in range(start, len(self.steps))]

    # ---- request events ----------------------------------------------------------------------------
    def request_event(self, kind: str, request: Request, t_ns: int | None = None) -> None:
        event = RequestEvent(
            t_ns=t_ns if t_ns is not None else time.perf_counter_ns(),
            step=self.engine.step_index,
            request_id=request.request_id,
            kind=kind,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            reason=request.finish_reason if kind == "finished" else None,
            error=request.error if kind == "finished" else None,
        )
        self.events.append(event)
        self._publish(event)

    # ---- steps -----------------------------------------------------------------------------------
    def record_step(self, sched: SchedulerOutput, inp: ModelInput | None, t: tuple[int, ...]) -> StepRecord:
        """``t`` = (start, scheduled, prepared, forwarded, sampled, end) in perf_counter_ns."""
        engine = self.engine
        t_sched = t[1]
        for request in sched.preempted:
            self._was_preempted.add(request.request_id)
            self.request_event("preempted", request, t_sched)
        for request in sched.admitted:
            rid = request.request_id
            if rid in self._was_preempted:
                self._was_preempted.discard(rid)
                self.request_event("resumed", request, t_sched)
            elif rid not in self._seen_scheduled:
                self._seen_scheduled.add(rid)
                self.request_event("scheduled", request, t_sched)

        scheduled = []
        prefill_seqs = prefill_tokens = decode_seqs = decode_tokens = 0
        for request, n, is_decode in zip(sched.requests, sched.num_tokens, sched.is_decode):
            if is_decode:
                decode_seqs += 1
                decode_tokens += n
            else:
                prefill_seqs += 1
                prefill_tokens += n
            scheduled.append(
                ScheduledItem(request.request_id, "decode" if is_decode else "prefill", n, request.num_computed_tokens)
            )
        num_finished = sum(1 for r in sched.requests if r.is_finished) + len(sched.failed)
        record = StepRecord(
            step=engine.step_index,
            t_start_ns=t[0],
            t_end_ns=t[5],
            schedule_ns=t[1] - t[0],
            prepare_ns=t[2] - t[1],
            forward_ns=t[3] - t[2],
            sample_ns=t[4] - t[3],
            update_ns=t[5] - t[4],
            num_prefill_seqs=prefill_seqs,
            num_prefill_tokens=prefill_tokens,
            num_decode_seqs=decode_seqs,
            num_decode_tokens=decode_tokens,
            num_running=len(engine.scheduler.running),
            num_waiting=len(engine.scheduler.waiting),
            num_preempted=len(sched.preempted),
            num_finished=num_finished,
            num_output_tokens=len(inp.sample_requests) if inp is not None else 0,
            scheduled=scheduled,
            kv=self.kv_state(),
        )
        self.steps.append(record)
        self.num_steps_recorded += 1
        self._publish(record)
        return record

    def kv_state(self) -> KVState:
        """KV numbers from the pool and the running requests' block tables, in O(running requests).

        Blocks of a running request cover exactly its computed tokens, and only full blocks are ever
        shared, so each extra holder of a shared block over-counts exactly ``block_size`` tokens.
        """
        engine = self.engine
        pool = engine.pool
        bs = pool.block_size
        running = engine.scheduler.running
        computed = sum(r.num_computed_tokens for r in running)
        table_entries = sum(len(r.block_ids) for r in running)
        used = pool.num_used_blocks
        tokens_stored = computed - bs * (table_entries - used)
        slots_used = used * bs
        return KVState(
            num_blocks=pool.num_blocks,
            block_size=bs,
            blocks_used=used,
            blocks_cached_free=pool.num_cached_free_blocks,
            tokens_stored=tokens_stored,
            block_usage=used / pool.num_blocks,
            token_usage=tokens_stored / (pool.num_blocks * bs),
            fragmentation=1.0 - tokens_stored / slots_used if slots_used else 0.0,
            static_reservation_bytes=len(running) * engine.max_model_len * engine.spec.kv_bytes_per_token,
            paged_bytes=used * engine.spec.kv_bytes_per_block(bs),
            prefix_cache_queries=pool.prefix_cache_queries,
            prefix_cache_hits=pool.prefix_cache_hits,
            num_evictions=pool.num_evictions,
        )
