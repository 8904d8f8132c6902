"""What a P/D run's ``meta["pd"]`` adds: summary keys (transfers, and TTFT / ITL per instance) and the trace's
transfer track. Standard library only: ``Run`` reads a loaded file's meta with it."""

from __future__ import annotations

import math
from typing import Any

MB = 1e6
INSTANCE_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")


def percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _transfers(pd: dict[str, Any]) -> list[dict[str, Any]]:
    items = pd.get("transfers") if isinstance(pd, dict) else None
    return [t for t in items if isinstance(t, dict)] if isinstance(items, list) else []


def pd_summary(pd: dict[str, Any]) -> dict[str, Any]:
    """``kv_transfers`` (made), ``kv_transfer_failures``, ``kv_transfer_bytes``, ``kv_transfer_blocks``,
    ``kv_transfer_held_blocks`` (not moved: the consumer had them), transfer time p50 / p99 (producer's
    pack to consumer's unpack), throughput (bytes / summed transfer time), and per instance
    ``<instance>_ttft_p50_s`` ... (each instance's own view: its queue to its first token)."""
    ok = [t for t in _transfers(pd) if t.get("ok")]
    secs = [max(0, t["end_ns"] - t["start_ns"]) / 1e9 for t in ok]
    total_bytes = sum(int(t.get("num_bytes", 0)) for t in ok)
    busy = sum(secs)
    out: dict[str, Any] = {
        "pd_layout": pd.get("layout"),
        "kv_transfers": len(ok),
        "kv_transfer_failures": len(_transfers(pd)) - len(ok),
        "kv_transfer_bytes": total_bytes,
        "kv_transfer_blocks": sum(int(t.get("num_blocks", 0)) for t in ok),
        "kv_transfer_held_blocks": sum(int(t.get("num_held_blocks", 0)) for t in ok),
        "kv_transfer_time_p50_s": percentile(secs, 50),
        "kv_transfer_time_p99_s": percentile(secs, 99),
        "kv_transfer_mb_per_s": total_bytes / MB / busy if busy > 0 else math.nan,
    }
    for inst in pd.get("instances", []) if isinstance(pd.get("instances"), list) else []:
        s = inst.get("summary") if isinstance(inst, dict) else None
        if isinstance(s, dict):
            for key in INSTANCE_KEYS:
                v = s.get(key)
                out[f"{inst.get('name')}_{key}"] = math.nan if v is None else v
    return out


def transfer_lane(pd: dict[str, Any]) -> list[tuple[str, dict[str, list], list[tuple[str, int, int]]]]:
    """The trace's transfer track: one slice per transfer (request, route, blocks, bytes) and a counter of
    the MB in flight."""
    spans, points = [], []
    for t in _transfers(pd):
        start, end = int(t["start_ns"]), int(t["end_ns"])
        label = (f"{t['request_id']} {t['src']}->{t['dst']}: {t.get('num_blocks', 0)} blocks, "
                 f"{t.get('num_bytes', 0)} B" + ("" if t.get("ok") else f" FAILED: {t.get('error')}"))
        spans.append((label, start, max(end, start + 1)))
        points += [(start, int(t.get("num_bytes", 0)) / MB), (max(end, start + 1), -int(t.get("num_bytes", 0)) / MB)]
    if not spans:
        return []
    level, series = 0.0, []
    for t_ns, d in sorted(points):
        level += d
        series.append((t_ns, {"MB": max(level, 0.0)}))
    return [("KV transfers", {"KV in flight (MB)": series}, spans)]
