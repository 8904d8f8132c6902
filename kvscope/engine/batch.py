"""A step's batch as telemetry sees it: ``batch_summary`` (one ``ScheduledItem`` per scheduled request, their
block tables) and, for the steps a long simulation's window will not keep (``Recorder.detail`` off),
``light_batch``: the same counts and sampled requests, no per-request items (``BatchCounts``)."""

from __future__ import annotations

from itertools import compress

from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request
from kvscope.telemetry.inputs import BatchCounts, BatchSummary, RequestProgress
from kvscope.telemetry.records import ScheduledItem, SpecDecodeStats


def batch_summary(step: int, sched: SchedulerOutput, sampled: list[Request], num_finished: int,
                  accepted: dict[str, list[int]] | None = None, spec: SpecDecodeStats | None = None) -> BatchSummary:
    """The step's batch as telemetry sees it, read after ``Scheduler.update_from_output``
    (``accepted``: ``SchedulerUpdate.spec_accepted``; ``spec``: the step's ``Speculator.stats``)."""
    sampled_set = set(sampled)  # Requests hash and compare by identity (eq=False): no id() call per item
    requests = sched.requests
    # one item per scheduled request per step: built by comprehensions, the rare cases patched after
    scheduled = [ScheduledItem(r.request_id, "decode" if is_decode else "prefill", n, r.num_computed_tokens,
                               r in sampled_set)
                 for r, n, is_decode in zip(requests, sched.num_tokens, sched.is_decode)]
    tables = [r.block_ids for r in requests]
    drafts = sched.scheduled_spec_decode_tokens
    if drafts:
        for item in scheduled:
            if item.request_id in drafts:
                item.num_draft_tokens = len(drafts[item.request_id])
                item.num_accepted_tokens = len(accepted.get(item.request_id, ())) if accepted else 0
    # a hybrid model: its groups' tables, interleaved (ScheduledItem); a list, faster than a generator's any
    if any([r.extra_block_ids for r in requests]):
        for i, r in enumerate(requests):
            if r.extra_block_ids:
                scheduled[i].num_kv_groups = 1 + len(r.extra_block_ids)
                tables[i] = _interleave(r.block_tables) if r.block_ids else []
    admitted, preempted = _progress(sched, sampled_set)
    return BatchSummary(step, scheduled, tables, admitted, preempted, num_finished, spec)


def _progress(sched: SchedulerOutput, sampled: set[Request] | list[Request]
              ) -> tuple[list[RequestProgress], list[RequestProgress]]:
    """The admitted requests as they were before the step, and the preempted ones (``sampled``: a light
    batch's list is made a set only in a step that admitted a request)."""
    admitted = []
    if sched.admitted:
        if not isinstance(sampled, set):
            sampled = set(sampled)
        new_tokens = _new_tokens(sched)
        admitted = [
            RequestProgress(
                r.request_id,
                r.num_prompt_tokens,
                r.num_output_tokens - (r in sampled),
                r.num_computed_tokens - new_tokens.get(r, 0),
            )
            for r in sched.admitted
        ]
    preempted = [RequestProgress(r.request_id, r.num_prompt_tokens, r.num_output_tokens) for r in sched.preempted]
    return admitted, preempted


def _new_tokens(sched: SchedulerOutput) -> dict[Request, int]:
    """``request -> num_tokens`` of the admitted requests that were scheduled (the last entry of each).
    The scheduler appends the requests it admits after the running ones, so the walk from the end stops
    after a few entries instead of reading the whole batch (it reads it all only if one is missing)."""
    wanted, found = set(sched.admitted), {}
    requests, num_tokens = sched.requests, sched.num_tokens
    for i in range(len(requests) - 1, -1, -1):
        r = requests[i]
        if r in wanted and r not in found:
            found[r] = num_tokens[i]
            if len(found) == len(wanted):
                break
    return found


def _interleave(tables: list[list[int]]) -> list[int]:
    """Entry ``j * G + g`` = block ``j`` of group ``g`` (every group's table has the same length)."""
    return [b for column in zip(*tables) for b in column]


def light_batch(step: int, sched: SchedulerOutput, sampled: list[Request], num_finished: int,
                accepted: dict[str, list[int]] | None = None, spec: SpecDecodeStats | None = None) -> BatchSummary:
    """``batch_summary`` without the per-request items and tables: the counts ``step_record`` would take from
    them and the ids of the requests that sampled (``BatchCounts``), and the admitted and preempted requests."""
    decodes = list(compress(sched.num_tokens, sched.is_decode))  # zip's rule, truthy flags: a C-level pass
    drafts = sched.scheduled_spec_decode_tokens
    sampled_ids = [r.request_id for r in sampled]
    num_accepted = sum(len(accepted.get(rid, ())) for rid in drafts) if accepted else 0  # as step_record
    counts = BatchCounts(len(sched.num_tokens) - len(decodes), sum(sched.num_tokens) - sum(decodes), len(decodes),
                         sum(decodes), len(sampled) + num_accepted, sampled_ids)
    admitted, preempted = _progress(sched, sampled)
    return BatchSummary(step, admitted=admitted, preempted=preempted, num_finished=num_finished, spec_decode=spec,
                        counts=counts)
