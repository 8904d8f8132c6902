"""vLLM's KV-transfer metrics as the watch reads them: their names (vLLM 0.32: ``kv_connector/v1/nixl/stats.py``,
``kv_connector/v1/offloading/metrics.py``, ``v1/metrics/loggers.py``), the instance's role as far as the page
tells it, and one engine's part of ``meta["watch"]["kv_transfer"]`` (JSON values). Standard library only.

NIXL (``NixlConnector``: KV blocks between instances, prefill/decode disaggregation), per ``engine`` label:
``vllm:nixl_xfer_time_seconds`` (histogram: one observation per transfer, so its count is the transfers and
its sum the time spent in them), ``vllm:nixl_bytes_transferred`` (histogram: bytes per transfer),
``vllm:nixl_post_time_seconds`` and ``vllm:nixl_num_descriptors`` (histograms), and the counters
``vllm:nixl_num_failed_transfers`` (transfers, handshakes and notifications that failed),
``vllm:nixl_num_failed_notifications``, ``vllm:nixl_num_kv_expired_reqs`` (a producer's: KV released
unread when its lease ran out) and ``vllm:nixl_num_notifications_after_expiry``. vLLM records a transfer
where it is started: in its default pull mode the consumer (decode) reads from the producer, so the
consumer's engine shows the transfers; in push mode the producer's does.

Offloading (``OffloadingConnector``: KV between the GPU and another medium, CPU memory by default):
``vllm:kv_offload_total_bytes`` / ``vllm:kv_offload_total_time`` (counters) and ``vllm:kv_offload_size``
(histogram, bytes per transfer), each by ``transfer_type`` (``GPU_to_CPU``, ``CPU_to_GPU``), which vLLM
deprecates for the flat ``vllm:kv_offload_store_{bytes,time,size}`` (GPU to medium) and
``vllm:kv_offload_load_{bytes,time,size}`` (medium to GPU). Both are kept here under the ``transfer_type``
they match, the flat names first (vLLM counts each CPU transfer in both); ``vllm:kv_offload_allocation_failure``
counts stores that found no room.

The role: vLLM 0.32 exposes no ``kv_transfer_config`` metric or label. It registers the gauge
``vllm:num_requests_kv_fetch_by_stage`` only where ``kv_role`` is ``kv_consumer`` or ``kv_both``, and a
connector's families wherever that connector runs. So (``role_of``): the gauge with no sign of a producer's
work is ``kv_consumer``; the gauge and a producer's work (KV expired unread, notifications after expiry, or
offloading, which stores and loads on one engine) is ``kv_both``; a connector's families without the gauge
are ``kv_producer``; neither is no connector (``None``). ``role_from`` says which it was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvscope.watched.limits import MAX_COUNT

NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"
NIXL_POST_TIME = "vllm:nixl_post_time_seconds"
NIXL_BYTES = "vllm:nixl_bytes_transferred"
NIXL_DESCRIPTORS = "vllm:nixl_num_descriptors"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
NIXL_FAILED_NOTIFICATIONS = "vllm:nixl_num_failed_notifications_total"
NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
NIXL_AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry_total"
OFFLOAD_BYTES = "vllm:kv_offload_total_bytes_total"  # by transfer_type (deprecated in vLLM)
OFFLOAD_TIME = "vllm:kv_offload_total_time_total"
OFFLOAD_SIZE = "vllm:kv_offload_size"
OFFLOAD_ALLOC_FAILURES = "vllm:kv_offload_allocation_failure_total"
STORE, LOAD = "GPU_to_CPU", "CPU_to_GPU"  # vLLM's transfer_type values
FLAT = {  # transfer_type -> vLLM's flat (bytes counter, time counter, size histogram)
    STORE: ("vllm:kv_offload_store_bytes_total", "vllm:kv_offload_store_time_total", "vllm:kv_offload_store_size"),
    LOAD: ("vllm:kv_offload_load_bytes_total", "vllm:kv_offload_load_time_total", "vllm:kv_offload_load_size"),
}
KV_FETCH = "vllm:num_requests_kv_fetch_by_stage"  # registered for kv_consumer / kv_both only

NIXL_HISTOGRAMS = (NIXL_XFER_TIME, NIXL_POST_TIME, NIXL_BYTES, NIXL_DESCRIPTORS)
NIXL_COUNTERS = (NIXL_FAILED, NIXL_FAILED_NOTIFICATIONS, NIXL_EXPIRED, NIXL_AFTER_EXPIRY)
OFFLOAD_HISTOGRAMS = (OFFLOAD_SIZE, *(f[2] for f in FLAT.values()))
OFFLOAD_COUNTERS = (OFFLOAD_BYTES, OFFLOAD_TIME, OFFLOAD_ALLOC_FAILURES, *(n for f in FLAT.values() for n in f[:2]))
HISTOGRAMS = (*NIXL_HISTOGRAMS, *OFFLOAD_HISTOGRAMS)
COUNTERS = (*NIXL_COUNTERS, *OFFLOAD_COUNTERS)
GAUGES = (KV_FETCH,)
# series kept per value of one label, as 'name{label=value}' (counters: also summed under their name)
SPLIT_BY = {OFFLOAD_BYTES: "transfer_type", OFFLOAD_TIME: "transfer_type", OFFLOAD_SIZE: "transfer_type",
            KV_FETCH: "stage"}
ROLES = ("kv_producer", "kv_consumer", "kv_both")
HIST_KEYS = {"xfer_time": NIXL_XFER_TIME, "post_time": NIXL_POST_TIME, "bytes": NIXL_BYTES}
COUNT_KEYS = {"failures": NIXL_FAILED, "failed_notifications": NIXL_FAILED_NOTIFICATIONS,
              "kv_expired_reqs": NIXL_EXPIRED, "notifications_after_expiry": NIXL_AFTER_EXPIRY,
              "offload_allocation_failures": OFFLOAD_ALLOC_FAILURES}


def split_key(name: str, label: str, value: str) -> str:
    return f"{name}{{{label}={value}}}"


def _split_values(keys: Any, name: str) -> dict[str, str]:
    """``{label value: key}`` of the split series of ``name`` among ``keys``."""
    prefix = name + "{"
    return {k[len(prefix):-1].split("=", 1)[-1]: k for k in keys if k.startswith(prefix) and k.endswith("}")}


def _count(value: Any) -> int:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return min(max(round(value), 0), MAX_COUNT) if ok else 0


def _secs(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return max(float(value), 0.0) if ok else 0.0


def connectors(names: Any) -> list[str]:
    """Which connectors' families are among the series ``names``: ``"nixl"``, ``"offload"``."""
    names = set(names)
    found = []
    if any(n in names for n in (*NIXL_HISTOGRAMS, *NIXL_COUNTERS)):
        found.append("nixl")
    if any(n.split("{", 1)[0] in (*OFFLOAD_HISTOGRAMS, *OFFLOAD_COUNTERS) for n in names):
        found.append("offload")
    return found


def role_of(found: list[str], fetch_gauge: bool, totals: Mapping[str, float]) -> tuple[str | None, str]:
    """(``kv_role``, how it was told) from the connectors seen, whether the page has the KV fetch gauge and
    the counters since the watch began (see the module docstring)."""
    producer_work = [n for n in (NIXL_EXPIRED, NIXL_AFTER_EXPIRY) if totals.get(n, 0) > 0]
    if fetch_gauge and ("offload" in found or producer_work):
        why = "offloading" if "offload" in found else producer_work[0]
        return "kv_both", f"inferred: {KV_FETCH} (kv_consumer / kv_both only) and a producer's work ({why})"
    if fetch_gauge:
        return "kv_consumer", f"inferred: {KV_FETCH} is registered for kv_consumer / kv_both only"
    if found:
        return "kv_producer", f"inferred: {', '.join(found)} metrics without {KV_FETCH} (kv_consumer / kv_both only)"
    return None, "no KV connector metrics"


def engine_entry(names: Any, gauges: Mapping[str, float], totals: Mapping[str, float],
                 hists: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    """One engine's ``meta["watch"]["kv_transfer"]`` entry, or ``None`` when its page shows no KV connector.
    ``names``: the series of its latest page; ``totals``: counters since the watch began; ``hists``: the
    histograms since the watch began as JSON (``{"le", "counts", "sum", "count"}``) by vLLM name."""
    found = connectors(names)
    fetch = _split_values(gauges, KV_FETCH)
    if not found and not fetch:
        return None
    role, why = role_of(found, bool(fetch), totals)
    xfer, moved = hists.get(NIXL_XFER_TIME, {}), hists.get(NIXL_BYTES, {})
    counts = {k: _count(totals.get(n)) for k, n in COUNT_KEYS.items()}
    counts["transfers"] = _count(xfer.get("count"))
    counts["bytes"] = _count(moved.get("sum"))
    counts["descriptors"] = _count(hists.get(NIXL_DESCRIPTORS, {}).get("sum"))
    entry: dict[str, Any] = {
        "role": role, "role_from": why, "connectors": found, "counts": counts,
        "seconds": {"transfer": _secs(xfer.get("sum")), "post": _secs(hists.get(NIXL_POST_TIME, {}).get("sum"))},
        "histograms": {k: hists[n] for k, n in HIST_KEYS.items() if n in hists},
        "offload": offload_entry(totals, hists) if "offload" in found else {},
        "kv_fetch": {stage: _count(gauges[key]) for stage, key in fetch.items()},
    }
    return entry


def offload_entry(totals: Mapping[str, float], hists: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``transfer_type``: bytes, seconds and transfers since the watch began (the flat names first)."""
    out: dict[str, dict[str, Any]] = {}
    by_bytes, by_time = _split_values(totals, OFFLOAD_BYTES), _split_values(totals, OFFLOAD_TIME)
    by_size = _split_values(hists, OFFLOAD_SIZE)
    for kind in {*FLAT, *by_bytes, *by_time, *by_size}:
        flat = FLAT.get(kind)
        if flat is not None and any(n in totals or n in hists for n in flat):
            num_bytes, secs, size = totals.get(flat[0]), totals.get(flat[1]), hists.get(flat[2], {})
        elif kind in by_bytes or kind in by_time or kind in by_size:
            num_bytes, secs = totals.get(by_bytes.get(kind, "")), totals.get(by_time.get(kind, ""))
            size = hists.get(by_size.get(kind, ""), {})
        else:
            continue
        out[kind] = {"bytes": _count(num_bytes), "seconds": _secs(secs), "transfers": _count(size.get("count"))}
    return dict(sorted(out.items()))


def interval_values(entry: dict[str, Any] | None, before: dict[str, Any] | None) -> tuple[int | None, ...]:
    """(transfers, bytes, offloaded bytes) between two entries of one engine (``None``: no connector);
    a count that went down (the server restarted) counts from zero."""
    if entry is None:
        return None, None, None
    now = (entry["counts"]["transfers"], entry["counts"]["bytes"],
           sum(o["bytes"] for o in entry["offload"].values()))
    then = (before["counts"]["transfers"], before["counts"]["bytes"],
            sum(o["bytes"] for o in before["offload"].values())) if before else (0, 0, 0)
    return tuple(a - b if a >= b else a for a, b in zip(now, then))
