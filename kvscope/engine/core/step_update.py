"""The scheduler's second half of a step: ``update_from_output`` (progress, new tokens, drafts kept, finishing).

A mixin of ``Scheduler`` (``kvscope.engine.core.scheduler``). After the engine ran a ``SchedulerOutput``, every
scheduled request advances, the sampled tokens (after the accepted drafts, with speculative decoding) are
appended and checked for stop conditions (``core/stop.py``), and the requests that stopped are finished: their
blocks go back to the pool and they leave the queues (``finish``, which the engine's abort calls too).
"""

from __future__ import annotations

import contextlib
from collections import deque

from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.output import SchedulerOutput, SchedulerUpdate
from kvscope.engine.core.rules import SchedulerRules
from kvscope.engine.core.stop import take_token, take_tokens
from kvscope.engine.request import Request, RequestStatus


class StepUpdateMixin:
    """``update_from_output`` and ``finish`` of ``Scheduler`` (see the module doc)."""

    # What the mixin uses of ``Scheduler``, declared for the type checker (its ``__init__`` sets each).
    kv: KVCacheManager
    max_model_len: int
    eos_token_ids: frozenset[int]
    waiting: deque[Request]
    running: list[Request]
    rules: SchedulerRules

    def update_from_output(
        self, out: SchedulerOutput, sampled: list[Request], token_ids: list[int],
        num_accepted: dict[str, int] | None = None,
    ) -> SchedulerUpdate:
        """The step ran: ``sampled[i]`` (the requests that reached the end of their known tokens)
        got ``token_ids[i]``. Advance every scheduled request, append the tokens, and finish the
        requests that hit a stop token, EOS, ``max_tokens`` or ``max_model_len`` (their blocks are
        freed and they leave ``running``). With drafts (``out.scheduled_spec_decode_tokens``),
        ``num_accepted[request_id]`` of a request's drafts were accepted and ``token_ids[i]`` follows
        them (see ``_update_speculative``)."""
        for request, n in zip(out.requests, out.num_tokens):
            request.num_computed_tokens += n
        if out.scheduled_spec_decode_tokens:
            return self._update_speculative(out, sampled, token_ids, num_accepted or {})
        stopped = take_tokens(sampled, token_ids, self.eos_token_ids, self.max_model_len)
        if len(stopped) > 1 and self.rules.finish_in_schedule_order:  # vLLM frees them as it walks its schedule
            stopped = {r: stopped[r] for r in out.requests if r in stopped}
        for request, status in stopped.items():
            self.finish(request, status)
        return SchedulerUpdate(sampled, token_ids, list(stopped))

    def _update_speculative(self, out: SchedulerOutput, sampled: list[Request], token_ids: list[int],
                            num_accepted: dict[str, int]) -> SchedulerUpdate:
        """``update_from_output`` of a step with drafts. A request with ``k`` drafts of which ``j`` were
        accepted gets ``drafts[:j] + [token]``, checked for stop conditions one by one (a stop drops
        what follows it); its ``num_computed_tokens`` goes back by the ``k - j`` rejected drafts, whose
        K/V the next step overwrites, and the blocks that held only those go back to the pool."""
        drafts_of = out.scheduled_spec_decode_tokens
        eos, max_len = self.eos_token_ids, self.max_model_len
        finished: list[Request] = []
        last_tokens: list[int] = []
        update = SchedulerUpdate(sampled, last_tokens, finished)
        for request, token in zip(sampled, token_ids):
            rid = request.request_id
            drafts = drafts_of.get(rid)
            new = [token]
            if drafts:
                j = num_accepted.get(rid, 0)
                request.num_computed_tokens -= len(drafts) - j
                new = [*drafts[:j], token]
            status, kept = None, 0
            for t in new:  # a stop drops the tokens after it
                status = take_token(request, t, eos, max_len)
                kept += 1
                if status is not None:
                    break
            last_tokens.append(new[kept - 1])
            if drafts:
                update.spec_accepted[rid] = new[: kept - 1]
            if status is not None:
                self.finish(request, status)
                finished.append(request)
            elif drafts:
                freed = self.kv.trim(request)
                if freed:
                    update.spec_freed[rid] = freed
        return update


    def finish(self, request: Request, status: RequestStatus, error: str | None = None) -> None:
        """End a request (stop, length, abort or error) and free its blocks. Idempotent."""
        if request.is_finished:
            return
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            with contextlib.suppress(ValueError):
                self.waiting.remove(request)
        else:
            with contextlib.suppress(ValueError):
                self.running.remove(request)
        self.kv.free(request)
        request.status = status
        if error is not None:
            request.error = error
