"""What a watched run's ``meta["watch"]`` (written by ``source.WatchSource``) adds up to, read defensively
(it may come from a file): ``watch_summary`` for ``Run.summary()``, ``engine_tracks`` for the trace.

Exact, from vLLM's counters (deltas since the watch began): prompt and generation tokens, prefix-cache
queries and hits, preemptions, finished requests. Exact, from the KV events: distinct blocks stored,
evictions, what is cached now. Estimated, from histogram buckets (``*_estimate`` keys): TTFT, ITL and
end-to-end percentiles. Unknowable from outside: block ids, token-level fill and fragmentation (NaN here).
This module imports only the standard library.
"""

from __future__ import annotations

import math
from typing import Any

from kvscope.watched.check import check_watch
from kvscope.watched.quantiles import as_dict as _dict
from kvscope.watched.quantiles import buckets, merged, quantile
from kvscope.watched.transfer_summary import ESTIMATED as TRANSFER_ESTIMATED
from kvscope.watched.transfer_summary import engine_transfer, media, transfer_summary

__all__ = ["ENGINE_KEYS", "ESTIMATED", "buckets", "check_watch", "engine_tracks", "fleet_kpis", "merged", "quantile",
           "watch_summary"]

ESTIMATED = ("ttft_p50_s_estimate", "ttft_p99_s_estimate", "itl_p50_s_estimate", "itl_p99_s_estimate",
             "e2e_p50_s_estimate", "e2e_p99_s_estimate", *TRANSFER_ESTIMATED)
UNKNOWN = ("mean_fragmentation", "peak_fragmentation", "peak_token_usage", "peak_kv_bytes",
           "peak_static_reservation_bytes")
ENGINE_KEYS = ("prompt_tokens", "generation_tokens", "computed_prompt_tokens", "prefix_cache_queries",
               "prefix_cache_hit_tokens", "preemptions", "requests_finished")
_TOTAL_OF = {"prompt_tokens": "prompt_tokens", "generation_tokens": "generation_tokens",
             "computed_prompt_tokens": "computed_prompt_tokens", "prefix_cache_queries": "prefix_queries",
             "prefix_cache_hit_tokens": "prefix_hits", "preemptions": "preemptions", "requests_finished": "finished"}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _latency(hists: list[Any]) -> dict[str, float]:
    out = {}
    for short in ("ttft", "itl", "e2e"):
        b = merged([_dict(h).get(short) for h in hists])
        out[f"{short}_p50_s_estimate"] = quantile(b, 0.50)
        out[f"{short}_p99_s_estimate"] = quantile(b, 0.99)
    return out


def watch_summary(watch: Any) -> dict[str, Any]:
    """The watch's own headline numbers, fleet-wide and per engine (``engines``)."""
    w = _dict(watch)
    totals, hists, residency = _dict(w.get("totals")), _dict(w.get("histograms")), _dict(w.get("residency"))
    transfers = _dict(w.get("kv_transfer"))
    engines: dict[str, dict[str, Any]] = {}
    for key in _dict(w.get("engines")):
        t = _dict(totals.get(key))
        e: dict[str, Any] = {name: _int(t.get(src)) for name, src in _TOTAL_OF.items()}
        e["prefix_cache_hit_rate"] = (e["prefix_cache_hit_tokens"] / e["prefix_cache_queries"]
                                      if e["prefix_cache_queries"] else math.nan)
        res = _dict(residency.get(key))
        e["kv_blocks_stored"] = _int(res.get("kv_blocks_stored")) if res else None
        e["kv_blocks_evicted"] = _int(res.get("kv_blocks_evicted")) if res else None
        e["kv_blocks_resident"] = _int(res.get("kv_blocks_resident")) if res else None
        e["kv_blocks_by_medium"] = media(res) if res else None
        e.update(_latency([hists.get(key)]))
        e.update(engine_transfer(transfers.get(key)))  # kv_role, NIXL transfers, offloading (transfer_summary.py)
        e["state"] = _dict(_dict(w.get("engines")).get(key)).get("state")
        engines[str(key)] = e
    out: dict[str, Any] = {name: sum(_int(e[name]) for e in engines.values()) for name in ENGINE_KEYS}
    out["prefix_cache_hit_rate"] = (out["prefix_cache_hit_tokens"] / out["prefix_cache_queries"]
                                    if out["prefix_cache_queries"] else math.nan)
    with_events = [e for e in engines.values() if e["kv_blocks_stored"] is not None]
    stored = w.get("kv_blocks_stored")
    out["kv_blocks_stored"] = _int(stored) if isinstance(stored, int) else (
        sum(e["kv_blocks_stored"] for e in with_events) if with_events else None)
    out["kv_blocks_evicted"] = sum(e["kv_blocks_evicted"] for e in with_events) if with_events else None
    out["kv_blocks_resident"] = sum(e["kv_blocks_resident"] for e in with_events) if with_events else None
    by_medium: dict[str, int] = {}
    for e in with_events:
        for m, n in (e["kv_blocks_by_medium"] or {}).items():
            by_medium[m] = by_medium.get(m, 0) + n
    out["kv_blocks_by_medium"] = by_medium if with_events else None
    out.update(_latency(list(hists.values())))
    out.update(transfer_summary(w))
    out["engines"] = engines
    out["num_engines"] = len(engines)
    out["connection_lost"] = len(w.get("lost")) if isinstance(w.get("lost"), list) else 0
    out["faults"] = {k: _int(v) for k, v in _dict(w.get("faults")).items()}
    out["estimated"] = list(ESTIMATED)
    out.update(dict.fromkeys(UNKNOWN, math.nan))
    return out


def _num_at(values: list, i: int) -> float | None:
    x = values[i] if i < len(values) else None
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def engine_tracks(watch: Any, t0_ns: int) -> list[tuple[str, dict[str, list[tuple[int, dict[str, float]]]],
                                                        list[tuple[str, int, int]]]]:
    """Per engine (and the fleet): (name, counter tracks {track: [(t_ns, {series: value})]}, spans
    [(name, t0_ns, t1_ns)] of lost connections): what the trace draws as one process per engine."""
    w = _dict(watch)
    lanes = {**_dict(w.get("lanes")), "fleet": _dict(w.get("fleet"))}
    step_s = w.get("interval_s") if isinstance(w.get("interval_s"), (int, float)) else 0.5
    lost = [s for s in w.get("lost", []) if isinstance(s, list) and len(s) == 3] if isinstance(
        w.get("lost"), list) else []
    out = []
    for name, lane in lanes.items():
        ts = lane.get("t_ns") if isinstance(lane.get("t_ns"), list) else []
        n = len(ts)
        col = {c: (v if isinstance(v, list) else [])[:n] for c, v in lane.items()}
        tracks: dict[str, list] = {"KV cache usage": [], "requests": [], "tokens/s": [], "KV cache events": [],
                                   "KV transfers": []}
        prev = None
        for i, t in enumerate(ts):
            if not isinstance(t, int):
                continue
            dt = (t - prev) / 1e9 if prev is not None and t > prev else step_s
            prev = t
            row = {c: _num_at(col.get(c, []), i) for c in col}
            v = row.get

            if v("kv_usage") is not None:
                tracks["KV cache usage"].append((t, {"usage": v("kv_usage")}))
            if v("running") is not None:
                tracks["requests"].append((t, {"running": v("running"), "waiting": v("waiting") or 0}))
            if v("prompt_tokens") is not None:
                tracks["tokens/s"].append((t, {"prompt": v("prompt_tokens") / dt,
                                               "generation": (v("generation_tokens") or 0) / dt}))
            if v("blocks_stored") is not None:
                tracks["KV cache events"].append((t, {"stored": v("blocks_stored"),
                                                      "evicted": v("blocks_evicted") or 0,
                                                      "cached": v("blocks_resident") or 0}))
            if v("kv_transfer_bytes") is not None or v("kv_offload_bytes") is not None:  # a KV connector
                tracks["KV transfers"].append((t, {"NIXL MB/s": (v("kv_transfer_bytes") or 0) / 1e6 / dt,
                                                   "offload MB/s": (v("kv_offload_bytes") or 0) / 1e6 / dt,
                                                   "transfers": v("kv_transfers") or 0}))
        server = name.rsplit("/", 1)[0]
        end = ts[-1] if ts and isinstance(ts[-1], int) else t0_ns
        spans = [("connection lost", s[1], s[2] if isinstance(s[2], int) else end) for s in lost
                 if name != "fleet" and s[0] == server and isinstance(s[1], int)]
        out.append((str(name), {k: v for k, v in tracks.items() if v}, spans))
    return out


WATCH_KPI_FIELDS = (
    "running", "waiting", "kv_usage", "prompt_tokens_per_s", "generation_tokens_per_s", "prefix_hit_rate",
    "preemptions", "finished", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "blocks_cached", "blocks_stored",
    "kv_transfers", "kv_transfer_mb_per_s",
)
RATE_WINDOW = 4  # polls the tokens/s are averaged over


def _last(column: list, n: int):
    for i in range(n - 1, -1, -1):
        if column[i] is not None:
            return column[i]
    return None


def fleet_kpis(watch: dict) -> dict[str, float | int | None]:
    """The fleet's KPIs now (``None``: not known yet): what the dashboard's tiles and the CLI's status
    line show; tokens/s over the last ``RATE_WINDOW`` polls, latencies estimated from buckets."""
    v: dict[str, float | int | None] = dict.fromkeys(WATCH_KPI_FIELDS)
    fleet = watch.get("fleet", {})
    ts = fleet.get("t_ns", [])
    n = len(ts)
    for key in ("running", "waiting", "kv_usage"):
        v[key] = _last(fleet.get(key, []), n)
    rows = [i for i in range(max(n - RATE_WINDOW, 1), n) if fleet["prompt_tokens"][i] is not None]
    if rows:
        span = (ts[rows[-1]] - ts[rows[0] - 1]) / 1e9
        if span > 0:
            v["prompt_tokens_per_s"] = sum(fleet["prompt_tokens"][i] for i in rows) / span
            v["generation_tokens_per_s"] = sum(fleet["generation_tokens"][i] or 0 for i in rows) / span
    totals = list(watch.get("totals", {}).values())
    queries = sum(t.get("prefix_queries", 0) for t in totals)
    v["prefix_hit_rate"] = sum(t.get("prefix_hits", 0) for t in totals) / queries if queries else None
    if totals:
        v["preemptions"] = sum(t.get("preemptions", 0) for t in totals)
        v["finished"] = sum(t.get("finished", 0) for t in totals)
    hists = list(watch.get("histograms", {}).values())
    for short in ("ttft", "itl"):
        b = merged([h.get(short) for h in hists])
        for q in (50, 99):
            value = quantile(b, q / 100)
            v[f"{short}_p{q}"] = None if math.isnan(value) else value
    residency = [r for r in watch.get("residency", {}).values() if isinstance(r, dict)]
    if residency:
        v["blocks_cached"] = sum(r.get("kv_blocks_resident", 0) for r in residency)
        v["blocks_stored"] = watch.get("kv_blocks_stored") or sum(r.get("kv_blocks_stored", 0) for r in residency)
    if watch.get("kv_transfer"):  # an engine with a KV connector (NIXL transfers since the watch began)
        t = transfer_summary(watch)
        v["kv_transfers"] = t["kv_transfers"]
        v["kv_transfer_mb_per_s"] = None if math.isnan(t["kv_transfer_mb_per_s"]) else t["kv_transfer_mb_per_s"]
    return v
