"""What every run kvscope writes satisfies, checked when a file is read (``load.read_run_file``): a file whose
records contradict each other (edited by hand, or damaged) is refused naming the record that breaks a rule,
rather than read into "2399976 of 3799 hit" or "-999.759 s in the queue".

- a step ends no earlier than it starts, and its token and request counts are not negative;
- a step's prefix-cache hits are at most its lookups (both cumulative counters);
- a request is scheduled no earlier than it was queued (its first of each).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvscope.telemetry.records import RequestEvent, StepRecord

_COUNTS = ("num_prefill_seqs", "num_prefill_tokens", "num_decode_seqs", "num_decode_tokens", "num_running",
           "num_waiting", "num_output_tokens")


def check_invariants(records: Sequence[StepRecord], events: Sequence[RequestEvent]) -> None:
    """``ValueError`` naming the first step or request that breaks a rule of the module doc."""
    for r in records:
        if r.t_end_ns < r.t_start_ns:
            raise ValueError(f"step {r.step} ends before it starts (t_start_ns {r.t_start_ns}, t_end_ns {r.t_end_ns})")
        negative = next((name for name in _COUNTS if getattr(r, name) < 0), None)
        if negative:
            raise ValueError(f"step {r.step} has {negative}={getattr(r, negative)} (a count below 0)")
        kv = r.kv
        if kv.prefix_cache_hits > kv.prefix_cache_queries or kv.prefix_cache_hits < 0:
            raise ValueError(f"step {r.step} counts {kv.prefix_cache_hits} prefix-cache hits of "
                             f"{kv.prefix_cache_queries} lookups (hits cannot exceed lookups)")
    queued: dict[str, int] = {}
    checked: set[str] = set()
    for e in events:
        if e.kind == "queued":
            queued.setdefault(e.request_id, e.t_ns)
        elif e.kind == "scheduled" and e.request_id not in checked:
            checked.add(e.request_id)
            t = queued.get(e.request_id)
            if t is not None and e.t_ns < t:
                raise ValueError(f"request {e.request_id!r} is scheduled {(t - e.t_ns) / 1e9:.3f} s before it was "
                                 f"queued (step {e.step})")
