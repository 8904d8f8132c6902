"""What a P/D run's ``meta["pd"]`` adds: summary keys (the system's figures end to end, transfers, each instance's
own figures) and the trace's transfer track. Standard library only: ``Run`` reads a loaded file's meta with it.

A P/D run's steps are its first decode instance's, so ``run_summary`` alone would describe that instance: its
prefix-cache hits are mostly the blocks transferred to it, its tokens/s leave the prefill side's work out.
``pd_summary(pd, base)`` puts the system's figures in their place (``SYSTEM_KEYS``):

- ``output_tokens``: every decode instance's, plus those of requests that ended on the prefill side (their
  first token ended them); ``computed_prefill_tokens``: every instance's (the decode side's recomputed last
  partial blocks included); tokens/s: those over the run's duration, first arrival to last event;
- ``prefix_cache_queries`` / ``hits`` / ``hit_rate``: the prefill instances', where each prompt first meets a
  cache; transferred blocks are not hits. The decode side's lookups (transferred or already held blocks) are
  ``decode_prefix_cache_hits`` / ``decode_prefix_cache_queries``, labelled so;
- each instance's own figures as ``<instance>_<key>`` (``INSTANCE_FIGURES``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

MB = 1e6
INSTANCE_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")
# each instance's own figures, in meta["pd"]["instances"][i]["summary"] and as summary keys <instance>_<key>
INSTANCE_FIGURES = (*INSTANCE_KEYS, "steps", "output_tokens", "computed_prefill_tokens", "prefix_cache_queries",
                    "prefix_cache_hits", "peak_block_usage", "preemptions")
SYSTEM_KEYS = ("output_tokens", "computed_prefill_tokens", "output_tokens_per_s", "total_tokens_per_s",
               "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate")


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


def _instances(pd: dict[str, Any]) -> list[dict[str, Any]]:
    items = pd.get("instances") if isinstance(pd, dict) else None
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _figure(inst: dict[str, Any], key: str) -> float | None:
    s = inst.get("summary")
    v = s.get(key) if isinstance(s, dict) else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def system_summary(pd: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """The system's figures (``SYSTEM_KEYS`` and the decode side's lookups) from each instance's own; empty for
    a file written before its instances recorded them."""
    insts = _instances(pd)
    figures = {k: [(i.get("role"), _figure(i, k)) for i in insts] for k in INSTANCE_FIGURES}
    if not insts or any(v is None for k in ("output_tokens", "computed_prefill_tokens", "prefix_cache_queries",
                                            "prefix_cache_hits") for _, v in figures[k]):
        return {}

    def total(key: str, roles: Callable[[Any], bool] = lambda r: True) -> int:
        return int(sum(v or 0 for r, v in figures[key] if roles(r)))

    producers = {i.get("name") for i in insts if i.get("role") == "kv_producer"}
    items = pd.get("requests")
    requests: list[Any] = items if isinstance(items, list) else []
    at_prefill = 0  # tokens of requests their first token ended (on a prefill instance)
    for r in requests:
        if isinstance(r, dict) and r.get("decode") is None and r.get("prefill") in producers:
            at_prefill += int(r.get("num_output_tokens") or 0)
    # tokens out: where requests finish (decode instances; an instance that does both); the prompt's first
    # cache lookup: where requests arrive (prefill instances; one that does both); the decode side's: apart
    out_tokens = total("output_tokens", lambda r: r != "kv_producer") + at_prefill
    prefill = total("computed_prefill_tokens")
    queries = total("prefix_cache_queries", lambda r: r != "kv_consumer")
    hits = total("prefix_cache_hits", lambda r: r != "kv_consumer")
    d_queries = total("prefix_cache_queries", lambda r: r == "kv_consumer")
    d_hits = total("prefix_cache_hits", lambda r: r == "kv_consumer")
    return {"output_tokens": out_tokens, "computed_prefill_tokens": prefill,
            "output_tokens_per_s": out_tokens / duration_s if duration_s > 0 else math.nan,
            "total_tokens_per_s": (out_tokens + prefill) / duration_s if duration_s > 0 else math.nan,
            "prefix_cache_queries": queries, "prefix_cache_hits": hits,
            "prefix_cache_hit_rate": hits / queries if queries else math.nan,
            "decode_prefix_cache_queries": d_queries, "decode_prefix_cache_hits": d_hits}


def pd_summary(pd: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The system's figures in place of the first decode instance's (``system_summary``; ``base``: the run's
    summary so far, for its duration), ``kv_transfers`` (made), ``kv_transfer_failures``, ``kv_transfer_bytes``,
    ``kv_transfer_blocks``, ``kv_transfer_held_blocks`` (not moved: the consumer had them), transfer time p50 /
    p99 (producer's pack to consumer's unpack), throughput (bytes / summed transfer time), and per instance
    ``<instance>_<figure>`` (``INSTANCE_FIGURES``: each instance's own view, e.g. TTFT from its queue to its first
    token)."""
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
    for inst in _instances(pd):
        if isinstance(inst.get("summary"), dict):
            for key in INSTANCE_FIGURES:
                v = _figure(inst, key)
                if v is not None or key in INSTANCE_KEYS:
                    out[f"{inst.get('name')}_{key}"] = math.nan if v is None else v
    duration = (base or {}).get("duration_s")
    out.update(system_summary(pd, duration if isinstance(duration, (int, float)) else 0.0))
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
