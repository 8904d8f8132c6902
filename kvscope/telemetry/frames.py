"""A run's DataFrames: one row per step (``steps_frame``), per request (``requests_frame``) and per draft
position (``spec_acceptance_by_position``); the headline numbers are ``run_summary.py``'s.

Latencies follow vLLM's definitions (docs/design/metrics.md there; exact wording in
docs/telemetry.md here). A token "arrives" at the end of the step that sampled it (``t_end_ns``), which
is also the time of the ``first_token`` event, so TTFT and ITL are measured on one clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvscope.telemetry.records import PROFILE_CATEGORIES, RequestEvent, StepRecord

NS = 1e9


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (NaN when empty)."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def token_times(records: Sequence[StepRecord]) -> dict[str, list[int]]:
    """request id -> ``t_end_ns`` of every step that sampled a token for it, in order."""
    out: dict[str, list[int]] = defaultdict(list)
    for r in records:
        for item in r.scheduled:
            if item.sampled:
                out[item.request_id].append(r.t_end_ns)
    return out


def steps_frame(records: Sequence[StepRecord], t0_ns: int) -> pd.DataFrame:
    """One row per step, flat columns: the record's scalars, ``kv_*``, ``mem_*``, ``prof_*_ns``."""
    rows = []
    for r in records:
        row: dict[str, Any] = {
            "step": r.step,
            "t_start_s": (r.t_start_ns - t0_ns) / NS,
            "t_end_s": (r.t_end_ns - t0_ns) / NS,
            "duration_s": r.duration_ns / NS,
            "t_start_ns": r.t_start_ns,
            "t_end_ns": r.t_end_ns,
            "schedule_ns": r.schedule_ns,
            "prepare_ns": r.prepare_ns,
            "forward_ns": r.forward_ns,
            "sample_ns": r.sample_ns,
            "update_ns": r.update_ns,
            "num_tokens": r.num_tokens,
            "num_prefill_seqs": r.num_prefill_seqs,
            "num_prefill_tokens": r.num_prefill_tokens,
            "num_decode_seqs": r.num_decode_seqs,
            "num_decode_tokens": r.num_decode_tokens,
            "num_scheduled": len(r.scheduled),
            "num_running": r.num_running,
            "num_waiting": r.num_waiting,
            "num_preempted": r.num_preempted,
            "num_finished": r.num_finished,
            "num_output_tokens": r.num_output_tokens,
            "page_map_changes": len(r.page_map),
            "page_map_full": r.page_map_full,
        }
        spec = r.spec_decode
        if spec is not None:
            row["spec_num_drafts"] = spec.num_drafts
            row["spec_num_draft_tokens"] = spec.num_draft_tokens
            row["spec_num_accepted_tokens"] = spec.num_accepted_tokens
            row["spec_propose_ns"] = spec.propose_ns
        kv = r.kv
        for name in KV_COLUMNS:
            row["kv_" + name] = getattr(kv, name)
        for key, value in r.memory.items():
            row["mem_" + key] = value
        if r.profile is not None:
            for key, value in r.profile.items():
                row[f"prof_{key}_ns"] = value
        rows.append(row)
    frame = pd.DataFrame(rows)
    # A probe or category that only some steps have: absent elsewhere (NaN), never a fake 0.
    return frame.reindex(columns=sorted(frame.columns, key=_column_order)) if rows else frame


KV_COLUMNS = (
    "num_blocks",
    "block_size",
    "blocks_used",
    "blocks_cached_free",
    "tokens_stored",
    "block_usage",
    "token_usage",
    "fragmentation",
    "static_reservation_bytes",
    "paged_bytes",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_evictions",
    "num_window_freed_blocks",
)
_PROF_ORDER = {f"prof_{c}_ns": i for i, c in enumerate((*PROFILE_CATEGORIES, "total"))}


def _column_order(name: str) -> tuple[int, int | str]:
    """Fixed columns first (in insertion order), then mem_* by name, then prof_* by category."""
    if name.startswith("mem_"):
        return (1, name)
    if name.startswith("prof_"):
        return (2, _PROF_ORDER.get(name, 99))
    return (0, 0)


def requests_frame(records: Sequence[StepRecord], events: Sequence[RequestEvent], t0_ns: int) -> pd.DataFrame:
    """One row per request, in order of first appearance. Times in seconds from ``t0_ns``; NaN where
    a moment never happened (or fell out of the recorder's ring)."""
    times = token_times(records)
    drafted = _draft_counts(records)
    rows = [_request_row(row, times.get(rid, []), drafted.get(rid, (0, 0)), t0_ns)
            for rid, row in _request_moments(events).items()]
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def _draft_counts(records: Sequence[StepRecord]) -> dict[str, list[int]]:
    """request id -> [draft tokens verified, accepted] (speculative decoding)."""
    drafted: dict[str, list[int]] = {}
    for r in records:
        if r.spec_decode is not None:
            for item in r.scheduled:
                if item.num_draft_tokens:
                    counts = drafted.setdefault(item.request_id, [0, 0])
                    counts[0] += item.num_draft_tokens
                    counts[1] += item.num_accepted_tokens
    return drafted


def _request_moments(events: Sequence[RequestEvent]) -> dict[str, dict[str, Any]]:
    """request id -> its counts and the moments of its events (``*_ns``, ``None`` if never seen), in
    order of first appearance."""
    by_id: dict[str, dict[str, Any]] = {}
    for e in events:
        row = by_id.get(e.request_id)
        if row is None:
            row = by_id[e.request_id] = {
                "request_id": e.request_id,
                "num_prompt_tokens": e.num_prompt_tokens,
                "num_output_tokens": 0,
                "num_cached_tokens": 0,
                "queued_ns": None,
                "scheduled_ns": None,
                "first_token_ns": None,
                "finished_ns": None,
                "num_preemptions": 0,
                "finish_reason": None,
                "error": None,
            }
        row["num_output_tokens"] = max(row["num_output_tokens"], e.num_output_tokens)
        kind = e.kind
        if kind == "queued":
            row["queued_ns"] = e.t_ns
        elif kind == "scheduled":
            row["scheduled_ns"] = e.t_ns
            row["num_cached_tokens"] = e.num_cached_tokens
        elif kind == "first_token":
            row["first_token_ns"] = e.t_ns
        elif kind == "preempted":
            row["num_preemptions"] += 1
        elif kind == "finished":
            row["finished_ns"] = e.t_ns
            row["finish_reason"] = e.reason
            row["error"] = e.error
    return by_id


def _request_row(row: dict[str, Any], tt: list[int], drafted: Sequence[int], t0_ns: int) -> dict[str, Any]:
    """A request's row from its moments (``_request_moments``), token times and draft counts."""
    q, s, f, end = (row.pop(k) for k in ("queued_ns", "scheduled_ns", "first_token_ns", "finished_ns"))
    last = tt[-1] if tt else None
    itl = np.diff(tt) / NS if len(tt) > 1 else np.empty(0)
    n_out = row["num_output_tokens"]
    return {
        **row,
        "queued_s": _rel(q, t0_ns),
        "scheduled_s": _rel(s, t0_ns),
        "first_token_s": _rel(f, t0_ns),
        "finished_s": _rel(end, t0_ns),
        "queue_s": _span(q, s),
        "prefill_s": _span(s, f),
        "decode_s": _span(f, last),
        "inference_s": _span(s, last),
        "ttft_s": _span(q, f),
        "e2e_s": _span(q, end),
        "tpot_s": _span(f, last) / (n_out - 1) if n_out > 1 and f is not None and last is not None else math.nan,
        "itl_mean_s": float(itl.mean()) if len(itl) else math.nan,
        "itl_p50_s": pct(itl, 50),
        "itl_p99_s": pct(itl, 99),
        "num_draft_tokens": drafted[0],
        "num_accepted_tokens": drafted[1],
    }


REQUEST_COLUMNS = [
    "request_id",
    "num_prompt_tokens",
    "num_output_tokens",
    "num_cached_tokens",
    "queued_s",
    "scheduled_s",
    "first_token_s",
    "finished_s",
    "queue_s",
    "prefill_s",
    "decode_s",
    "inference_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "itl_mean_s",
    "itl_p50_s",
    "itl_p99_s",
    "num_preemptions",
    "finish_reason",
    "error",
    "num_draft_tokens",  # speculative decoding: draft tokens verified for it, and accepted
    "num_accepted_tokens",
]


def _rel(t: int | None, t0: int) -> float:
    return (t - t0) / NS if t is not None else math.nan


def _span(a: int | None, b: int | None) -> float:
    return (b - a) / NS if a is not None and b is not None else math.nan


def all_itls(records: Sequence[StepRecord]) -> np.ndarray:
    """Every inter-token interval of every request (seconds), pooled like vLLM's ITL histogram."""
    parts = [np.diff(t) for t in token_times(records).values() if len(t) > 1]
    return np.concatenate(parts) / NS if parts else np.empty(0)


def spec_acceptance_by_position(records: Sequence[StepRecord]) -> pd.DataFrame:
    """One row per draft position (0-based): drafts made there, accepted there, and the share accepted
    (vLLM's per-position acceptance)."""
    drafted: list[int] = []
    accepted: list[int] = []
    for r in records:
        spec = r.spec_decode
        if spec is None:
            continue
        for counts, values in ((drafted, spec.num_draft_tokens_per_pos), (accepted, spec.num_accepted_tokens_per_pos)):
            counts.extend([0] * (len(values) - len(counts)))
            for i, v in enumerate(values):
                counts[i] += v
    accepted.extend([0] * (len(drafted) - len(accepted)))
    return pd.DataFrame({
        "position": range(len(drafted)),
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "acceptance_rate": [a / d if d else math.nan for a, d in zip(accepted, drafted)],
    })
