"""What a watch's KV connectors add to ``Run.summary()``: ``meta["watch"]["kv_transfer"]`` (one entry per engine,
``kv_transfer.engine_entry``) and the residency's media, per engine and for the fleet. Read defensively (a
file may hold anything); standard library only.

The keys take the P/D engine's names where they mean the same (``kvscope/pd/summary.py``):
``kv_transfers`` (NIXL transfers: the count of ``vllm:nixl_xfer_time_seconds``), ``kv_transfer_bytes`` (the
sum of ``vllm:nixl_bytes_transferred``), ``kv_transfer_mb_per_s`` (those bytes over the summed transfer
time, MB = 10**6), ``kv_transfer_failures`` (``vllm:nixl_num_failed_transfers``: transfers, handshakes and
notifications), all exact since the watch began. The transfer time's p50 / p99 come from vLLM's buckets, so
they are estimates and named as the watch's other estimates are: ``kv_transfer_time_p50_s_estimate``,
``kv_transfer_time_p99_s_estimate``. ``kv_transfer_expired`` counts KV a producer released unread
(``vllm:nixl_num_kv_expired_reqs``). Offloading, by vLLM's ``transfer_type``: ``kv_offload_store_*``
(GPU_to_CPU) and ``kv_offload_load_*`` (CPU_to_GPU): bytes, transfers, MB/s. Per engine also ``kv_role``
and ``kv_blocks_by_medium`` (cached blocks per KV-event medium). A key is ``None`` where no engine shows
what it needs (no connector, no events), not 0.
"""

from __future__ import annotations

import math
from typing import Any

from kvscope.watched.quantiles import as_dict, buckets, merged, quantile

MB = 1e6
ROLES = ("kv_producer", "kv_consumer", "kv_both")
DIRECTIONS = {"store": "GPU_to_CPU", "load": "CPU_to_GPU"}  # summary word -> vLLM's transfer_type
COUNT_KEYS = ("kv_transfers", "kv_transfer_bytes", "kv_transfer_failures", "kv_transfer_expired",
              *(f"kv_offload_{d}_{k}" for d in DIRECTIONS for k in ("bytes", "transfers")))
RATE_KEYS = ("kv_transfer_mb_per_s", *(f"kv_offload_{d}_mb_per_s" for d in DIRECTIONS))
ESTIMATED = ("kv_transfer_time_p50_s_estimate", "kv_transfer_time_p99_s_estimate")
TRANSFER_KEYS = (*COUNT_KEYS, *RATE_KEYS, *ESTIMATED)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _secs(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else 0.0


def _rate(num_bytes: int, seconds: float) -> float:
    return num_bytes / MB / seconds if seconds > 0 else math.nan


def _raw(entry: dict) -> dict[str, Any]:
    """One entry's counts and the seconds behind its rates (``_s`` keys), checked."""
    counts, secs, offload = as_dict(entry.get("counts")), as_dict(entry.get("seconds")), as_dict(entry.get("offload"))
    raw: dict[str, Any] = {
        "kv_transfers": _int(counts.get("transfers")), "kv_transfer_bytes": _int(counts.get("bytes")),
        "kv_transfer_failures": _int(counts.get("failures")),
        "kv_transfer_expired": _int(counts.get("kv_expired_reqs")),
        "_s": _secs(secs.get("transfer")),
    }
    for word, kind in DIRECTIONS.items():
        o = as_dict(offload.get(kind))
        raw[f"kv_offload_{word}_bytes"] = _int(o.get("bytes"))
        raw[f"kv_offload_{word}_transfers"] = _int(o.get("transfers"))
        raw[f"_{word}_s"] = _secs(o.get("seconds"))
    return raw


def _finish(raw: dict[str, Any], xfer_buckets: list[tuple[float, float]]) -> dict[str, Any]:
    out = {k: raw[k] for k in COUNT_KEYS}
    out["kv_transfer_mb_per_s"] = _rate(raw["kv_transfer_bytes"], raw["_s"])
    for word in DIRECTIONS:
        out[f"kv_offload_{word}_mb_per_s"] = _rate(raw[f"kv_offload_{word}_bytes"], raw[f"_{word}_s"])
    out["kv_transfer_time_p50_s_estimate"] = quantile(xfer_buckets, 0.50)
    out["kv_transfer_time_p99_s_estimate"] = quantile(xfer_buckets, 0.99)
    return out


def engine_transfer(entry: Any) -> dict[str, Any]:
    """One engine's keys (``kv_role`` and ``TRANSFER_KEYS``; each ``None`` without a KV connector)."""
    if not isinstance(entry, dict):
        return {"kv_role": None, **dict.fromkeys(TRANSFER_KEYS)}
    role = entry.get("role")
    out = _finish(_raw(entry), buckets(as_dict(entry.get("histograms")).get("xfer_time")))
    return {"kv_role": role if role in ROLES else None, **out}


def media(residency: Any) -> dict[str, int] | None:
    """Cached blocks by medium (``None`` without KV events)."""
    if not isinstance(residency, dict):
        return None
    by = as_dict(residency.get("kv_blocks_by_medium"))
    return {str(m): n for m, n in by.items() if isinstance(n, int) and not isinstance(n, bool)}


def transfer_summary(watch: dict) -> dict[str, Any]:
    """The fleet's ``TRANSFER_KEYS`` (sums; rates over summed seconds; percentiles from the engines' buckets
    added up) and ``kv_roles`` ({engine: role}); ``None`` values when no engine has a KV connector."""
    entries = {str(k): e for k, e in as_dict(watch.get("kv_transfer")).items() if isinstance(e, dict)}
    out: dict[str, Any] = {"kv_roles": {k: engine_transfer(e)["kv_role"] for k, e in entries.items()}}
    if not entries:
        return {**out, **dict.fromkeys(TRANSFER_KEYS)}
    raws = [_raw(e) for e in entries.values()]
    total = {k: sum(r[k] for r in raws) for k in raws[0]}
    xfer = merged([as_dict(e.get("histograms")).get("xfer_time") for e in entries.values()])
    return {**out, **_finish(total, xfer)}
