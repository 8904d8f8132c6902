"""Why requests waited: each request's queue time split by reason, read from a run's records and events.

A request waits from ``queued`` to its first ``scheduled``, and from each ``preempted`` to its ``resumed``. The
scheduler records, per step, why the requests still waiting after its schedule were not admitted
(``StepRecord.wait_reason``: ``token_budget``, ``max_num_seqs``, ``no_free_blocks``); admission is in order,
so every request behind the head of the queue waits for the head's reason. The time from a step's start to the
next step's start goes to that step's reason; the time from a request's arrival to the first step that starts
after it (and the admitting step's own schedule) to ``step_in_progress``; a wait after a preemption to
``preempted`` (it waits to be recomputed). Steps recorded without a reason (older files) count as ``unknown``.

``num_recomputed_tokens``: per resumption, the tokens the request had in the KV cache when it was preempted
(its last ``context_len``) that the prefix cache did not give back (``resumed``'s ``num_cached_tokens``).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from kvscope.telemetry.records import (
    WAIT_PREEMPTED,
    WAIT_REASONS,
    WAIT_STEP_IN_PROGRESS,
    RequestEvent,
    StepRecord,
)

UNKNOWN = "unknown"


@dataclass(slots=True)
class QueueTime:
    """One request's time in the waiting queue, by reason (seconds)."""

    request_id: str
    queue_s: float = 0.0
    by_reason: dict[str, float] = field(default_factory=dict)
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0

    def add(self, reason: str, ns: int) -> None:
        if ns > 0:
            self.by_reason[reason] = self.by_reason.get(reason, 0.0) + ns / 1e9


class _Steps:
    """The records' start times, in order, with their reasons, and per reason the running sum of the intervals
    from one step's start to the next's (a wait over many steps is split in a few look-ups: the live panel
    recomputes every request's wait while a run goes on)."""

    def __init__(self, records: list[StepRecord]) -> None:
        real = [r for r in records if r.t_end_ns > r.t_start_ns or r.scheduled]  # not a state record
        self.starts = [r.t_start_ns for r in real]
        self.steps = [r.step for r in real]
        self.reasons = [r.wait_reason or UNKNOWN for r in real]
        # cum[reason][k]: ns of the intervals [starts[m], starts[m + 1]) with m < k given to ``reason``
        self.cum: dict[str, list[int]] = {reason: [0] for reason in set(self.reasons)}
        for m in range(len(real) - 1):
            gap, own = self.starts[m + 1] - self.starts[m], self.reasons[m]
            for reason, sums in self.cum.items():
                sums.append(sums[-1] + (gap if reason == own else 0))

    def split(self, row: QueueTime, a: int, b: int, admitted_step: int | None) -> None:
        """Add the wait ``[a, b)`` of a request admitted in ``admitted_step`` to ``row`` by reason: the time before
        the first step that starts in it to ``step_in_progress``, each step's time to the next step's start (the
        last one's up to ``b``) to that step's reason, until the admitting step."""
        i = bisect_left(self.starts, a)
        first = self.starts[i] if i < len(self.starts) else b
        row.add(WAIT_STEP_IN_PROGRESS, min(first, b) - a)
        done = min(first, b)
        j = bisect_left(self.starts, b, lo=i)  # the steps that start before b ...
        if admitted_step is not None:  # ... and before the admitting one (steps and starts go up together)
            j = min(j, bisect_left(self.steps, admitted_step, lo=i))
        if j > i:
            for reason, sums in self.cum.items():  # whole intervals i .. j-2
                row.add(reason, sums[j - 1] - sums[i])
            end = min(self.starts[j] if j < len(self.starts) else b, b)
            row.add(self.reasons[j - 1], end - self.starts[j - 1])
            done = end
        row.add(WAIT_STEP_IN_PROGRESS, b - done)  # the admitting step's own schedule


def queue_times(records: list[StepRecord], events: list[RequestEvent]) -> list[QueueTime]:
    """One ``QueueTime`` per request, in the order they were queued."""
    steps = _Steps(records)
    contexts = _contexts(records)
    rows: dict[str, QueueTime] = {}
    since: dict[str, tuple[int, bool]] = {}  # request -> (waiting since, after a preemption)
    lost: dict[str, int] = {}  # request -> tokens it had when it was preempted
    for e in events:
        rid = e.request_id
        if e.kind == "queued":
            rows[rid] = QueueTime(rid)
            since[rid] = (e.t_ns, False)
        elif e.kind == "preempted" and rid in rows:
            rows[rid].num_preemptions += 1
            since[rid] = (e.t_ns, True)
            lost[rid] = _context_before(contexts, rid, e.step)
        elif e.kind in ("scheduled", "resumed") and rid in since:
            start, preempted = since.pop(rid)
            row = rows[rid]
            row.queue_s += (e.t_ns - start) / 1e9
            if preempted:
                row.add(WAIT_PREEMPTED, e.t_ns - start)
                row.num_recomputed_tokens += max(0, lost.pop(rid, 0) - e.num_cached_tokens)
            else:
                steps.split(row, start, e.t_ns, e.step)
    return list(rows.values())


def _contexts(records: list[StepRecord]) -> dict[str, list[tuple[int, int]]]:
    """Per request: (step, context_len after it) for every step that scheduled it."""
    out: dict[str, list[tuple[int, int]]] = {}
    for record in records:
        for item in record.scheduled:
            out.setdefault(item.request_id, []).append((record.step, item.context_len))
    return out


def _context_before(contexts: dict[str, list[tuple[int, int]]], rid: str, step: int) -> int:
    """The request's context after the last step before ``step`` that scheduled it (a victim of preemption is
    not scheduled in the step that preempts it)."""
    last = 0
    for s, ctx in contexts.get(rid, ()):
        if s >= step:
            break
        last = ctx
    return last


def queue_totals(rows: list[QueueTime]) -> dict[str, float | int]:
    """Seconds waited per reason over the run, the queue time, the preemptions and recomputed tokens."""
    out: dict[str, float | int] = {f"queue_{reason}_s": 0.0 for reason in (*WAIT_REASONS, UNKNOWN)}
    for row in rows:
        for reason, s in row.by_reason.items():
            out[f"queue_{reason}_s"] += s
    out["queue_s"] = sum(r.queue_s for r in rows)
    out["num_preemptions"] = sum(r.num_preemptions for r in rows)
    out["num_recomputed_tokens"] = sum(r.num_recomputed_tokens for r in rows)
    return out


def queue_rows(rows: list[QueueTime]) -> list[dict[str, float | int | str]]:
    """Flat rows (one column per reason), JSON-ready."""
    reasons = (*WAIT_REASONS, UNKNOWN)
    return [
        {
            "request_id": r.request_id,
            "queue_s": r.queue_s,
            **{f"queue_{k}_s": r.by_reason.get(k, 0.0) for k in reasons},
            "num_preemptions": r.num_preemptions,
            "num_recomputed_tokens": r.num_recomputed_tokens,
        }
        for r in rows
    ]


def format_queue(totals: dict[str, float | int]) -> str:
    """The printed table of why requests waited."""
    total = float(totals["queue_s"])
    lines = [
        f"why requests waited: {total:.3f} s in the queue over the run; {totals['num_preemptions']} "
        f"preemptions, {totals['num_recomputed_tokens']} tokens recomputed",
        "",
        f"{'reason':<18}{'seconds':>10}{'share':>8}",
    ]
    for reason in (*WAIT_REASONS, UNKNOWN):
        s = float(totals[f"queue_{reason}_s"])
        if s or reason != UNKNOWN:
            lines.append(f"{reason:<18}{s:>10.3f}{(s / total if total else 0.0):>8.0%}")
    return "\n".join(lines)
