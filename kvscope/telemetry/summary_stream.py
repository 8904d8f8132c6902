"""``SummaryStream``: a run's ``summary()`` kept up to date record by record, exact, in bounded memory.

The recorder keeps the last ``capacity`` steps (a ring); a simulation of 10**6 requests runs far past
that, so its ``Run`` would summarize only the window it still holds. This subscriber sees every record
and event as it is published and keeps what the summary needs: per finished request four numbers (TTFT,
TPOT, end-to-end, queue: 32 bytes, so 32 MB for 10**6 requests), the inter-token intervals as a count per
distinct value in nanoseconds (as many entries as distinct step periods, not tokens), running sums and
peaks, and per unfinished request its moments. Its ``summary()`` equals ``telemetry.run_summary.summary``
of the same run (percentiles with numpy's linear interpolation, over the counted values).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from operator import itemgetter
from typing import Any

import numpy as np

from kvscope.telemetry.frames import NS, pct
from kvscope.telemetry.records import RequestEvent, StepRecord

_LAST_TOKEN = itemgetter(3)  # of a request's moments


def counted_percentile(counts: Counter, q: float) -> float:
    """``np.percentile`` (linear) of the multiset ``value -> count``, without expanding it."""
    n = sum(counts.values())
    if not n:
        return math.nan
    values = sorted(counts)
    cum = np.cumsum([counts[v] for v in values])
    pos = q / 100 * (n - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    v_lo = values[int(np.searchsorted(cum, lo + 1))]
    v_hi = values[int(np.searchsorted(cum, hi + 1))]
    return float(v_lo + (v_hi - v_lo) * (pos - lo))


class SummaryStream:
    """Subscribe it to a recorder (``recorder.subscribe(stream.add)``) before the run's first item."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.moments: dict[str, list] = {}  # unfinished: [queued, scheduled, first_token, last_token, n_out]
        self.ending: list[tuple[RequestEvent, list]] = []  # finished, waiting for their step's record
        self.latency = {name: array("d") for name in ("ttft", "tpot", "e2e", "queue")}
        self.itl_ns: Counter = Counter()
        self.requests = self.finished = self.errors = 0
        self.steps = self.out_tokens = self.prefill_tokens = self.preemptions = self.peak_running = 0
        self.step_ns_sum, self.step_ns_count = 0, 0
        self.t_first: int | None = None
        self.t_last = 0
        self.peaks = {"peak_block_usage": 0.0, "peak_token_usage": 0.0, "peak_kv_bytes": 0,
                      "peak_static_reservation_bytes": 0}
        self.frag_sum, self.frag_n, self.frag_peak = 0.0, 0, 0.0
        self.spec = [0, 0, 0]  # drafts, draft tokens, accepted
        self.last_kv = None

    def add(self, item: StepRecord | RequestEvent) -> None:
        if isinstance(item, RequestEvent):
            self._event(item)
        else:
            self._record(item)

    def _event(self, e: RequestEvent) -> None:
        m = self.moments.get(e.request_id)
        if m is None:
            m = self.moments[e.request_id] = [None, None, None, None, 0]
            self.requests += 1
        m[4] = max(m[4], e.num_output_tokens)
        self.t_last = max(self.t_last, e.t_ns)
        kind = e.kind
        if kind == "queued":
            m[0] = e.t_ns
            self.t_first = e.t_ns if self.t_first is None else min(self.t_first, e.t_ns)
        elif kind == "scheduled":
            m[1] = e.t_ns
        elif kind == "first_token":
            m[2] = e.t_ns
        elif kind == "finished":  # its last token is in the record published next: finish after it
            self.ending.append((e, self.moments.pop(e.request_id)))

    def _finish(self, e: RequestEvent, m: list) -> None:
        q, s, f, last, n_out = m
        if e.reason is not None:
            self.finished += 1
        self.errors += e.reason == "error"
        for name, a, b in (("ttft", q, f), ("e2e", q, e.t_ns), ("queue", q, s)):
            if a is not None and b is not None:
                self.latency[name].append((b - a) / NS)
        if n_out > 1 and f is not None and last is not None:
            self.latency["tpot"].append((last - f) / NS / (n_out - 1))

    def _record(self, r: StepRecord) -> None:
        if self.steps == 0:
            self.t_first = r.t_start_ns if self.t_first is None else min(self.t_first, r.t_start_ns)
        self.steps += 1
        self.t_last = max(self.t_last, r.t_end_ns)
        self.out_tokens += r.num_output_tokens
        self.prefill_tokens += r.num_prefill_tokens
        self.preemptions += r.num_preempted
        self.peak_running = max(self.peak_running, r.num_running)
        if r.num_prefill_seqs or r.num_decode_seqs or r.duration_ns:  # a step (a state record: neither)
            self.step_ns_sum += r.duration_ns
            self.step_ns_count += 1
        self._sampled(r)
        self._flush()
        self._kv(r)

    def _sampled(self, r: StepRecord) -> None:
        """The step's sampled requests: an inter-token interval each (after their first token), and their
        last token now. Per scheduled request per step, so C-level passes where they beat a comprehension
        (map of ``dict.get``, filter, a ``Counter`` of the previous last-token times, which the requests of a
        step mostly share; not attrgetter: slower than a comprehension's attribute read) and one loop. The
        ids in a step are unique, so taking every interval before moving the last tokens changes nothing."""
        t_end, moments, ids = r.t_end_ns, self.moments, r.sampled_ids  # ids: a light record's
        if ids is None:
            sampled = [moments.get(item.request_id) for item in r.scheduled if item.sampled]
        else:
            sampled = list(map(moments.get, ids))
        if self.ending and None in sampled:  # finished in this step: its moments wait in ``ending``
            ending = {e.request_id: m for e, m in self.ending}
            if ids is None:
                ids = [item.request_id for item in r.scheduled if item.sampled]
            sampled = [ending.get(rid) if m is None else m for m, rid in zip(sampled, ids)]
        live = list(filter(None, sampled))  # the moments lists (never empty: truthy)
        before = Counter(map(_LAST_TOKEN, live))
        before.pop(None, None)  # a first token: no interval yet
        itl = self.itl_ns
        for t, k in before.items():
            itl[t_end - t] += k
        for m in live:
            m[3] = t_end

    def _flush(self) -> None:
        for e, m in self.ending:
            self._finish(e, m)
        self.ending.clear()

    def _kv(self, r: StepRecord) -> None:
        k = self.last_kv = r.kv
        p = self.peaks
        p["peak_block_usage"] = max(p["peak_block_usage"], k.block_usage)
        p["peak_token_usage"] = max(p["peak_token_usage"], k.token_usage)
        p["peak_kv_bytes"] = max(p["peak_kv_bytes"], k.paged_bytes)
        p["peak_static_reservation_bytes"] = max(p["peak_static_reservation_bytes"], k.static_reservation_bytes)
        if k.blocks_used > 0:
            self.frag_sum += k.fragmentation
            self.frag_n += 1
            self.frag_peak = max(self.frag_peak, k.fragmentation)
        if r.spec_decode is not None:
            sd = r.spec_decode
            self.spec[0] += sd.num_drafts
            self.spec[1] += sd.num_draft_tokens
            self.spec[2] += sd.num_accepted_tokens

    def summary(self) -> dict[str, Any]:
        """The run's summary so far: ``telemetry.run_summary.summary``'s keys and values."""
        self._flush()
        out: dict[str, Any] = {"requests": self.requests, "steps": self.steps, "finished": self.finished,
                               "errors": self.errors}
        duration = (self.t_last - self.t_first) / NS if self.t_first is not None else 0.0
        out.update(
            duration_s=duration,
            output_tokens=self.out_tokens,
            computed_prefill_tokens=self.prefill_tokens,
            output_tokens_per_s=self.out_tokens / duration if duration > 0 else math.nan,
            total_tokens_per_s=(self.out_tokens + self.prefill_tokens) / duration if duration > 0 else math.nan,
            mean_step_ms=self.step_ns_sum / self.step_ns_count / 1e6 if self.step_ns_count else math.nan,
        )
        for name in ("ttft", "tpot", "e2e", "queue"):
            values = np.frombuffer(self.latency[name], dtype=np.float64)
            out[f"{name}_mean_s"] = float(values.mean()) if len(values) else math.nan
            out[f"{name}_p50_s"], out[f"{name}_p99_s"] = pct(values, 50), pct(values, 99)
            out[f"{name}_p90_s"] = pct(values, 90)
        n = sum(self.itl_ns.values())
        out["itl_mean_s"] = sum(v * c for v, c in self.itl_ns.items()) / n / NS if n else math.nan
        out["itl_p50_s"] = counted_percentile(self.itl_ns, 50) / NS
        out["itl_p99_s"] = counted_percentile(self.itl_ns, 99) / NS
        out.update(self.peaks)
        out.update(mean_fragmentation=self.frag_sum / self.frag_n if self.frag_n else 0.0,
                   peak_fragmentation=self.frag_peak, preemptions=self.preemptions, peak_running=self.peak_running)
        kv, meta = self.last_kv, self.meta
        queries = kv.prefix_cache_queries - meta.get("prefix_cache_queries_before", 0) if kv else 0
        hits = kv.prefix_cache_hits - meta.get("prefix_cache_hits_before", 0) if kv else 0
        out.update(prefix_cache_queries=queries, prefix_cache_hits=hits,
                   prefix_cache_hit_rate=hits / queries if queries else math.nan,
                   window_freed_blocks=(kv.num_window_freed_blocks - meta.get("window_freed_blocks_before", 0))
                   if kv else 0)
        drafts, draft_tokens, accepted = self.spec
        out.update(spec_num_drafts=drafts, spec_num_draft_tokens=draft_tokens, spec_num_accepted_tokens=accepted,
                   spec_acceptance_rate=accepted / draft_tokens if draft_tokens else math.nan,
                   spec_mean_acceptance_length=1 + accepted / drafts if drafts else math.nan)
        return out
