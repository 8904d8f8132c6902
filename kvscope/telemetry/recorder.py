"""Recorder: turns each engine step into a ``StepRecord`` and keeps the recent ones in a ring buffer.

The engine calls ``record_step`` and ``request_event`` from its own thread. Subscribers are called
inline with each record and event and must return at once (put the item on a ``queue.SimpleQueue``,
append it to a list); one that raises is dropped (its error kept in ``subscriber_errors``) rather
than stopping the engine. Readers on other threads can instead poll ``steps_since(step)``, which
takes no lock, so the engine never waits for them either.

Events that a step's results cause (``first_token``, and ``finished`` with reason stop / length) are
held until the step's record is made and stamped with its ``t_end_ns``: the moment the step hands its
tokens back. ``scheduled``, ``resumed`` and ``preempted`` are stamped with the end of scheduling.
"""

from __future__ import annotations

import platform
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .pagemap import PageMapTracker
from .probes import MemoryProbe
from .records import KVState, RequestEvent, ScheduledItem, StepRecord

if TYPE_CHECKING:
    from ..engine import Engine
    from ..request import Request
    from ..runner import ModelInput
    from ..scheduler import SchedulerOutput

Subscriber = Callable[[StepRecord | RequestEvent], None]
_STEP_CAUSED = ("stop", "length")


class Recorder:
    def __init__(
        self,
        engine: Engine,
        capacity: int = 100_000,
        memory_interval_s: float = 0.05,
        snapshot_every: int | None = None,
    ) -> None:
        self.engine = engine
        self.capacity = capacity
        self.subscribers: list[Subscriber] = []
        self.subscriber_errors: list[str] = []
        self.pages = PageMapTracker(engine.pool, snapshot_every)
        self.memory = MemoryProbe(engine, memory_interval_s)
        # constants of the engine, read once (ModelSpec computes them on every access)
        self.kv_bytes_per_token = engine.spec.kv_bytes_per_token
        self.kv_bytes_per_block = engine.spec.kv_bytes_per_block(engine.pool.block_size)
        self.clear()

    def clear(self) -> None:
        """Forget what was recorded (a new run on the same engine). The page map carries on."""
        self.steps: deque[StepRecord] = deque(maxlen=self.capacity)
        self.events: deque[RequestEvent] = deque(maxlen=self.capacity * 4)
        self.profiler_events: list[dict[str, Any]] = []  # torch.profiler windows (telemetry/profiler.py)
        self.num_steps_recorded = 0  # total, including any that fell out of the ring
        self._pending: list[RequestEvent] = []
        self._seen_scheduled: set[str] = set()
        self._was_preempted: set[str] = set()
        self.pages.since_snapshot = self.pages.snapshot_every  # the next record is a full snapshot
        sched = self.engine.scheduler
        self._last_counts = (len(sched.running), len(sched.waiting))  # as of the last record
        pool = self.engine.pool
        self.baseline = {
            "prefix_cache_queries_before": pool.prefix_cache_queries,
            "prefix_cache_hits_before": pool.prefix_cache_hits,
        }

    # ---- readers ---------------------------------------------------------------------------------
    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(item)`` with every new ``RequestEvent`` and ``StepRecord``; returns an unsubscribe."""
        self.subscribers.append(fn)
        return lambda: self.subscribers.remove(fn) if fn in self.subscribers else None

    def _publish(self, item: StepRecord | RequestEvent) -> None:
        for fn in tuple(self.subscribers):  # a copy: a subscriber may unsubscribe while called
            try:
                fn(item)
            except Exception as exc:
                self.subscriber_errors.append(f"{fn!r}: {type(exc).__name__}: {exc}")
                if fn in self.subscribers:
                    self.subscribers.remove(fn)

    def steps_since(self, step: int) -> list[StepRecord]:
        """Records of steps ``>= step`` that the ring still holds (safe from any thread)."""
        items = _copy(self.steps)
        lo, hi = 0, len(items)
        while lo < hi:  # step indices increase along the ring
            mid = (lo + hi) // 2
            if items[mid].step < step:
                lo = mid + 1
            else:
                hi = mid
        return items[lo:]

    def snapshot(self) -> tuple[list[StepRecord], list[RequestEvent], dict[str, Any], list[dict[str, Any]]]:
        """(records, events, meta, profiler_events): copies, as ``Run`` takes them."""
        records, events = _copy(self.steps), _copy(self.events)
        meta = run_metadata(self.engine)
        meta.update(self.baseline)
        meta["num_steps_dropped"] = self.num_steps_recorded - len(records)
        meta["nvml"] = self.memory.nvml_status
        starts = [e.t_ns for e in events[:1]] + [r.t_start_ns for r in records[:1]]
        meta["t0_ns"] = min(starts) if starts else time.perf_counter_ns()
        return records, events, meta, list(self.profiler_events)

    # ---- request events ----------------------------------------------------------------------------
    def request_event(
        self,
        kind: str,
        request: Request,
        t_ns: int | None = None,
        num_cached_tokens: int = 0,
        num_output_tokens: int | None = None,
    ) -> None:
        finished = kind == "finished"
        event = RequestEvent(
            t_ns=t_ns if t_ns is not None else time.perf_counter_ns(),
            step=self.engine.step_index,
            request_id=request.request_id,
            kind=kind,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens if num_output_tokens is None else num_output_tokens,
            reason=request.finish_reason if finished else None,
            error=request.error if finished else None,
            num_cached_tokens=num_cached_tokens,
        )
        if finished or kind == "preempted":
            self.pages.forget(request.request_id)
        if finished:
            self._seen_scheduled.discard(request.request_id)
            self._was_preempted.discard(request.request_id)
        if t_ns is None and (kind == "first_token" or (finished and event.reason in _STEP_CAUSED)):
            self._pending.append(event)  # stamped with the step's end in record_step
            return
        self.events.append(event)
        self._publish(event)

    # ---- steps -----------------------------------------------------------------------------------
    def state_changed(self) -> bool:
        """Whether the queue lengths or the page map differ from the last record (e.g. after aborts
        between steps); ``Engine.record_state`` records such a change."""
        sched = self.engine.scheduler
        return (len(sched.running), len(sched.waiting)) != self._last_counts or self.pages.has_changes()

    def record_step(self, sched: SchedulerOutput, inp: ModelInput | None, t: tuple[int, ...]) -> StepRecord:
        """``t`` = (start, scheduled, prepared, forwarded, sampled, end) in perf_counter_ns."""
        engine = self.engine
        t_sched, t_end = t[1], t[5]
        sampled = {id(r) for r in inp.sample_requests} if inp is not None else set()
        for request in sched.preempted:
            self._was_preempted.add(request.request_id)
            self.request_event("preempted", request, t_sched)
        if sched.admitted:
            new_tokens = {id(r): n for r, n in zip(sched.requests, sched.num_tokens)}
            for request in sched.admitted:
                rid = request.request_id
                cached = request.num_computed_tokens - new_tokens.get(id(request), 0)
                n_out = request.num_output_tokens - (id(request) in sampled)
                if rid in self._was_preempted:
                    self._was_preempted.discard(rid)
                    self.request_event("resumed", request, t_sched, cached, n_out)
                elif rid not in self._seen_scheduled:
                    self._seen_scheduled.add(rid)
                    self.request_event("scheduled", request, t_sched, cached, n_out)
        for event in self._pending:
            event.t_ns = t_end
            self.events.append(event)
            self._publish(event)
        self._pending.clear()

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
                ScheduledItem(
                    request.request_id,
                    "decode" if is_decode else "prefill",
                    n,
                    request.num_computed_tokens,
                    id(request) in sampled,
                )
            )
        num_finished = sum(1 for r in sched.requests if r.is_finished) + len(sched.failed)
        page_map, full = self.pages.update(sched)
        record = StepRecord(
            step=engine.step_index,
            t_start_ns=t[0],
            t_end_ns=t_end,
            schedule_ns=t[1] - t[0],
            prepare_ns=t[2] - t[1],
            forward_ns=t[3] - t[2],
            sample_ns=t[4] - t[3],
            update_ns=t_end - t[4],
            num_prefill_seqs=prefill_seqs,
            num_prefill_tokens=prefill_tokens,
            num_decode_seqs=decode_seqs,
            num_decode_tokens=decode_tokens,
            num_running=len(engine.scheduler.running),
            num_waiting=len(engine.scheduler.waiting),
            num_preempted=len(sched.preempted),
            num_finished=num_finished,
            num_output_tokens=len(sampled),
            scheduled=scheduled,
            kv=self.kv_state(),
            page_map=page_map,
            page_map_full=full,
            memory=self.memory.sample(t_end),
        )
        self.steps.append(record)
        self.num_steps_recorded += 1
        self._last_counts = (record.num_running, record.num_waiting)
        self._publish(record)
        return record

    def attach_profile(self, step: int, summary: dict[str, int]) -> None:
        """Set ``profile`` on the record of ``step`` (if the ring still has it)."""
        for record in reversed(self.steps):
            if record.step == step:
                record.profile = summary
                return
            if record.step < step:
                return

    def kv_state(self) -> KVState:
        """KV numbers from the pool and the running requests' block tables, in O(running requests).

        Every used block sits in the table of at least one running request, blocks of a running request
        cover exactly its computed tokens, and only full blocks are ever shared, so each extra holder of
        a shared block over-counts exactly ``block_size`` tokens.
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
            static_reservation_bytes=len(running) * engine.max_model_len * self.kv_bytes_per_token,
            paged_bytes=used * self.kv_bytes_per_block,
            prefix_cache_queries=pool.prefix_cache_queries,
            prefix_cache_hits=pool.prefix_cache_hits,
            num_evictions=pool.num_evictions,
        )


def _copy(ring: deque) -> list:
    """``list(ring)`` while another thread may append (retry the rare 'mutated during iteration')."""
    for _ in range(100):
        try:
            return list(ring)
        except RuntimeError:
            continue
    return list(ring)


def run_metadata(engine: Engine) -> dict[str, Any]:
    """What a saved run needs to be read without the engine (all JSON values)."""
    from .. import __version__

    spec = engine.spec
    return {
        "kvscope_version": __version__,
        "model": engine.model_name,
        "config": _jsonable(asdict(engine.config)),
        "spec": _jsonable(asdict(spec)),
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "kv_bytes_per_block": spec.kv_bytes_per_block(engine.pool.block_size),
        "max_model_len": engine.max_model_len,
        "num_blocks": engine.pool.num_blocks,
        "block_size": engine.pool.block_size,
        "device": str(engine.device),
        "attention_backend": engine.runner.backend.name,
        "weights_bytes": engine.recorder.memory.static["weights_bytes"] if engine.recorder else None,
        "kv_pool_bytes": int(engine.runner.kv_cache_bytes),
        "created_unix_s": time.time(),
        "host": platform.node(),
        "python": platform.python_version(),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
