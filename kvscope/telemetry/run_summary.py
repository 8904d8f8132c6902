"""A run's headline numbers (``Run.summary()``): throughput, latency percentiles, KV peaks,
fragmentation, prefix-cache hits and speculative decoding (definitions in docs/telemetry.md).

Latencies are those of the per-request frame (``frames.requests_frame``) and the pooled inter-token
intervals (``frames.all_itls``), so the summary and the frames agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvscope.telemetry.frames import NS, all_itls, pct
from kvscope.telemetry.records import RequestEvent, StepRecord


def summary(
    records: Sequence[StepRecord],
    events: Sequence[RequestEvent],
    meta: dict[str, Any],
    requests: pd.DataFrame,
) -> dict[str, Any]:
    """Headline numbers of a run (definitions in docs/telemetry.md)."""
    out: dict[str, Any] = {"requests": len(requests), "steps": len(records)}
    out["finished"] = int(requests["finish_reason"].notna().sum()) if len(requests) else 0
    out["errors"] = int((requests["finish_reason"] == "error").sum()) if len(requests) else 0
    starts = [e.t_ns for e in events if e.kind == "queued"] + [r.t_start_ns for r in records[:1]]
    ends = [r.t_end_ns for r in records[-1:]] + [e.t_ns for e in events[-1:]]
    duration = (max(ends) - min(starts)) / NS if starts and ends else 0.0
    out_tokens = sum(r.num_output_tokens for r in records)
    prompt_tokens = sum(r.num_prefill_tokens for r in records)
    step_ns = [r.duration_ns for r in records if r.scheduled or r.duration_ns]  # not state records
    out.update(
        duration_s=duration,
        output_tokens=out_tokens,
        computed_prefill_tokens=prompt_tokens,
        output_tokens_per_s=out_tokens / duration if duration > 0 else math.nan,
        total_tokens_per_s=(out_tokens + prompt_tokens) / duration if duration > 0 else math.nan,
        mean_step_ms=float(np.mean(step_ns) / 1e6) if step_ns else math.nan,
    )
    for col, name in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_s", "e2e"), ("queue_s", "queue")):
        values = requests[col].dropna().to_numpy() if len(requests) else np.empty(0)
        out[f"{name}_mean_s"] = float(values.mean()) if len(values) else math.nan
        out[f"{name}_p50_s"], out[f"{name}_p99_s"] = pct(values, 50), pct(values, 99)
        out[f"{name}_p90_s"] = pct(values, 90)
    itl = all_itls(records)
    out["itl_mean_s"] = float(itl.mean()) if len(itl) else math.nan
    out["itl_p50_s"], out["itl_p99_s"] = pct(itl, 50), pct(itl, 99)
    kvs = [r.kv for r in records]
    used = [k.fragmentation for k in kvs if k.blocks_used > 0]
    out.update(
        peak_block_usage=max((k.block_usage for k in kvs), default=0.0),
        peak_token_usage=max((k.token_usage for k in kvs), default=0.0),
        peak_kv_bytes=max((k.paged_bytes for k in kvs), default=0),
        peak_static_reservation_bytes=max((k.static_reservation_bytes for k in kvs), default=0),
        mean_fragmentation=float(np.mean(used)) if used else 0.0,
        peak_fragmentation=max(used, default=0.0),
        preemptions=sum(r.num_preempted for r in records),
        peak_running=max((r.num_running for r in records), default=0),
    )
    base_q = meta.get("prefix_cache_queries_before", 0)
    base_h = meta.get("prefix_cache_hits_before", 0)
    queries = kvs[-1].prefix_cache_queries - base_q if kvs else 0
    hits = kvs[-1].prefix_cache_hits - base_h if kvs else 0
    out.update(
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hits / queries if queries else math.nan,
        # blocks given back while their requests ran, for leaving every reading layer's sliding window
        window_freed_blocks=(kvs[-1].num_window_freed_blocks - meta.get("window_freed_blocks_before", 0)) if kvs else 0,
    )
    out.update(spec_summary(records))
    return out


def spec_summary(records: Sequence[StepRecord]) -> dict[str, Any]:
    """Speculative decoding over the run, vLLM's definitions: ``spec_acceptance_rate`` = accepted /
    draft tokens; ``spec_mean_acceptance_length`` = 1 + accepted / drafts (tokens a request gets per
    verification step, the bonus token included). NaN when nothing was drafted."""
    drafts = draft_tokens = accepted = 0
    for r in records:
        spec = r.spec_decode
        if spec is not None:
            drafts += spec.num_drafts
            draft_tokens += spec.num_draft_tokens
            accepted += spec.num_accepted_tokens
    return {
        "spec_num_drafts": drafts,
        "spec_num_draft_tokens": draft_tokens,
        "spec_num_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / draft_tokens if draft_tokens else math.nan,
        "spec_mean_acceptance_length": 1 + accepted / drafts if drafts else math.nan,
    }
