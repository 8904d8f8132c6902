"""A recorded run's requests as a workload (``kvscope simulate --replay RUN``).

Each request of the run comes back as a ``WorkItem``: its prompt's token ids (recorded with its ``queued``
event), its output length (the tokens it got, reached exactly: EOS ignored) and its arrival time (its
``queued`` moment, from the first one; those queued before the first step began arrive at 0). So the prefix
cache sees the same prompts, under any block size, and a replay of a run that had all its requests at once has
them all at once again.
"""

from __future__ import annotations

from typing import Any

from kvscope.engine.request import SamplingParams
from kvscope.runs.result.run import Run
from kvscope.runs.workload.items import WorkItem


def replay_workload(run: Run) -> list[WorkItem]:
    """The run's requests in arrival order; ``ValueError`` naming the file, the request and the fix if the run
    did not record its prompts, or records a request twice (a recorder names a reused id ``id#2``: two
    ``queued`` or ``finished`` events of one id are a damaged or edited file, not two requests)."""
    where = run.meta.get("source") or "the run"
    again = "record the run again with `kvscope run ... --out NAME` and replay NAME.metrics.jsonl"
    queued: dict[str, Any] = {}
    outputs: dict[str, int] = {}
    for event in run.events:
        if event.kind not in ("queued", "finished"):
            continue
        seen = queued if event.kind == "queued" else outputs
        if event.request_id in seen:
            raise ValueError(f"cannot replay {where}: request id {event.request_id!r} has two {event.kind!r} events "
                             "(request_id must be unique: a run records a reused id as id#2); the file is damaged "
                             f"or edited: {again}")
        if event.kind == "queued":
            queued[event.request_id] = event
        else:
            outputs[event.request_id] = event.num_output_tokens
    if not queued:
        raise ValueError(f"cannot replay {where}: it has no queued requests (no event of kind 'queued'): {again}")
    missing = [rid for rid, e in queued.items() if e.prompt_token_ids is None]
    if missing:
        raise ValueError(f"cannot replay {where}: the 'queued' events of {len(missing)} requests (e.g. {missing[0]!r}) "
                         "have no prompt_token_ids, so their prompts are unknown: record the run again with this "
                         "kvscope version (`kvscope run ... --out NAME`), which keeps each prompt's token ids")
    t0 = min(e.t_ns for e in queued.values())
    # submitted before the first step began (the run's "all at once"): arrival 0, not a few microseconds
    # later (that would put them after the first simulated step)
    first_step = next((r.t_start_ns for r in run.records if r.scheduled), None)
    items = []
    for rid, event in queued.items():
        n_out = outputs.get(rid, 0)
        if n_out < 1:
            continue  # failed or aborted before its first token: nothing to replay
        params = SamplingParams(max_tokens=n_out, ignore_eos=True)
        at_once = first_step is not None and event.t_ns <= first_step
        arrival = 0.0 if at_once else (event.t_ns - t0) / 1e9
        items.append(WorkItem(list(event.prompt_token_ids), params, f"request {rid} of the run", arrival))
    items.sort(key=lambda item: item.arrival_s)
    return items
