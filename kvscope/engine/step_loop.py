"""The engine's step loop: drafts, schedule, prepare, forward, sample, update, record (vLLM's ``EngineCore.step``).

A mixin of ``Engine`` (``kvscope.engine.engine``), like ``generate.py``: ``step`` holds the engine's lock and drives
its scheduler, worker (``runner``), speculator and telemetry source; ``_finish`` ends one request (the engine's
``abort`` too), ``_fail_batch`` a batch whose forward pass raised.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from kvscope.engine.core.output import SchedulerOutput, SchedulerUpdate
from kvscope.engine.protocols import StepInput, Worker
from kvscope.engine.request import Request, RequestStatus, StreamDelta
from kvscope.engine.source import EngineSource, StepClock

if TYPE_CHECKING:
    from kvscope.engine.core.kv_cache_manager import KVCacheManager
    from kvscope.engine.core.scheduler import Scheduler
    from kvscope.engine.spec_decode import Speculator
    from kvscope.engine.threads import ThreadPolicy
    from kvscope.telemetry.phase_marks import PhaseMarks
    from kvscope.telemetry.records import StepRecord
    from kvscope.utils.clock import Clock


class StepLoopMixin:
    """``step`` and what it calls, and the finishing of requests (see the module doc)."""

    # What the mixin uses of ``Engine``, declared for the type checker (``Engine._adopt`` sets each).
    _lock: threading.RLock
    phase_marks: PhaseMarks
    clock: Clock
    scheduler: Scheduler
    kv: KVCacheManager
    runner: Worker[Any, Any]
    speculator: Speculator | None
    source: EngineSource
    threads: ThreadPolicy | None
    requests: dict[str, Request]

    if TYPE_CHECKING:
        def record_state(self) -> StepRecord | None: ...

    def step(self, deltas: bool = True) -> list[StreamDelta]:
        """One step (docs/ARCHITECTURE.md, "One step"): drafts, schedule, prepare, forward, sample (or
        verify the drafts), update the requests, record.

        Returns one ``StreamDelta`` per request that got a token or finished (``text`` left empty);
        ``deltas=False``: only those of requests that failed at scheduling (a caller that reads the
        records instead, like ``LiveRun``, saves building one per running request per step).
        If the forward pass raises, every request of that batch ends with status ``error``, the
        blocks cached for it are forgotten, and the exception propagates; the engine stays usable.
        """
        with self._lock:  # the engine's lock (see Engine), held for the whole step
            clock = StepClock(self.phase_marks, self.clock)
            clock.phase("schedule")
            if self.speculator is not None:  # drafts for the requests that decode in this step
                self.speculator.propose(self.scheduler.running)
            sched = self.scheduler.schedule()
            out = [self._finish(r, r.status) for r in sched.failed] if sched.failed else []
            if sched.is_empty:
                clock.stop()
                self.source.step_done(sched, None, clock)
                return out
            clock.phase("prepare")
            inp: StepInput = self.runner.prepare(sched)
            clock.phase("forward")
            try:  # a plain try rather than a context manager: no generator per step
                logits = self.runner.forward(inp)
                clock.phase("sample")
                sampled, num_accepted = self._sample(logits, inp)
            except BaseException as exc:
                self._batch_failed(sched, clock, exc)
                raise
            clock.phase("update")
            update = self.scheduler.update_from_output(sched, inp.sample_requests, sampled, num_accepted)
            if deltas:
                out += self._outputs(update)
            self._release(update)
            clock.marks.end(self.source.step_index)
            self.source.step_done(sched, update, clock)
            if self.threads is not None:
                self.threads.step_done(self.source.step_index - 1, False in sched.is_decode, sched.total_num_tokens,
                                       (self.clock.now_ns() - clock.times[0]) / 1e9)
            return out


    def _sample(self, logits: Any, inp: StepInput) -> tuple[list[int], dict[str, int] | None]:
        """A token per sample request, or with drafts in the step their verification (rejection sampling)."""
        if inp.spec_drafts is None:
            return self.runner.sample(logits, inp), None
        draft_probs = self.speculator.draft_probs if self.speculator is not None else None
        return self.runner.verify(logits, inp, draft_probs)

    def _batch_failed(self, sched: SchedulerOutput, clock: StepClock, exc: BaseException) -> None:
        """The forward pass or sampling raised: the batch fails (``_fail_batch``); the caller re-raises."""
        clock.marks.end(self.source.step_index)
        self._fail_batch(sched, exc)

    def _outputs(self, update: SchedulerUpdate) -> list[StreamDelta]:
        """One ``StreamDelta`` per new token (accepted drafts first), the last of a finished request
        marked so."""
        deltas: list[StreamDelta] = []
        accepted = update.spec_accepted
        for request, token in zip(update.requests, update.token_ids):
            rid, index, status = request.request_id, request.index, request.status
            if accepted:
                deltas.extend(StreamDelta(rid, index, t, "", False) for t in accepted.get(rid, ()))
            if status is RequestStatus.RUNNING:
                deltas.append(StreamDelta(rid, index, token, "", False))
            else:
                deltas.append(StreamDelta(rid, index, token, "", True, status.value))
        return deltas

    def _release(self, update: SchedulerUpdate) -> None:
        """Finished requests leave the engine, and the speculator (a draft model's blocks)."""
        for request in update.finished:
            self.requests.pop(request.request_id, None)
            if self.speculator is not None:
                self.speculator.free(request.request_id)

    # ---- finishing ----------------------------------------------------------------------------------
    def _finish(self, request: Request, status: RequestStatus, error: str | None = None) -> StreamDelta:
        self.scheduler.finish(request, status, error)
        if self.speculator is not None:
            self.speculator.free(request.request_id)
        request.status = status  # failed requests were marked by the scheduler already
        self.requests.pop(request.request_id, None)
        self.source.event("finished", request)
        return StreamDelta(request.request_id, request.index, None, "", True, status.value)

    def _fail_batch(self, sched: SchedulerOutput, exc: BaseException) -> None:
        self.kv.rollback_step()
        message = f"the forward pass failed: {type(exc).__name__}: {exc}"
        aborted = isinstance(exc, KeyboardInterrupt)
        status = RequestStatus.FINISHED_ABORTED if aborted else RequestStatus.FINISHED_ERROR
        for request in sched.requests:
            if not request.is_finished:
                self._finish(request, status, message)
        self.record_state()  # the failed requests' blocks are free again
