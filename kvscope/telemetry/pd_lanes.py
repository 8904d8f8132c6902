"""A P/D run's request lanes, read from its ``meta["pd"]`` (``kvscope.pd.recorder``): each request's path as
segments in time order, on the instance where each happened. Standard library only: the report's timeline and
the trace (``telemetry.export``) draw them, from a run in memory or a loaded file.

A request's segments: ``queue`` (arrival at the router to its prefill instance's schedule), ``prefill`` (on
the prefill instance, to the end of the step that sampled its first token), ``transfer wait`` (prefill done,
the producer or every consumer busy), ``transfer`` (the producer starts packing to the consumer has unpacked;
its blocks and bytes), ``decode queue`` (on the decode instance, to its schedule there) and ``decode`` (to
``finished``). A request that ended at prefill (its first token ended it) or whose transfer failed has the
segments it reached. Boundaries missing from the meta (files written before a key existed) drop the segment;
each segment starts where the previous one ended, so they never overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LANE_STATES = ("queue", "prefill", "transfer wait", "transfer", "decode queue", "decode")


@dataclass(slots=True)
class PDSegment:
    """One stretch of one request's path (times: the run's ``perf_counter_ns``)."""

    request_id: str
    state: str  # one of LANE_STATES
    instance: str  # where: an instance's name, or "src -> dst" for a transfer
    start_ns: int
    end_ns: int
    num_blocks: int | None = None  # transfer: blocks moved
    num_bytes: int | None = None  # transfer: bytes moved
    error: str | None = None  # a failed transfer's error

    @property
    def label(self) -> str:
        if self.state != "transfer":
            return f"{self.state} @ {self.instance}"
        text = f"transfer {self.instance}: {self.num_blocks} blocks, {self.num_bytes} B"
        return text + (f" FAILED: {self.error}" if self.error else "")


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _transfers(pd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = pd.get("transfers")
    return {t["request_id"]: t for t in items if isinstance(t, dict) and "request_id" in t} \
        if isinstance(items, list) else {}


def request_segments(pd: dict[str, Any]) -> list[list[PDSegment]]:
    """Per request of ``pd["requests"]`` (their order), its segments in time order (see the module docstring)."""
    if not isinstance(pd, dict) or not isinstance(pd.get("requests"), list):
        return []
    transfers = _transfers(pd)
    return [_segments(r, transfers.get(r.get("request_id"))) for r in pd["requests"] if isinstance(r, dict)]


def _segments(r: dict[str, Any], t: dict[str, Any] | None) -> list[PDSegment]:
    rid, src, dst = str(r.get("request_id")), str(r.get("prefill")), r.get("decode")
    finished = _int(r.get("finished_ns"))
    t_start = _int(t.get("start_ns")) if t else _int(r.get("transfer_start_ns"))
    t_end = _int(t.get("end_ns")) if t else _int(r.get("transfer_end_ns"))
    prefill_done = _int(r.get("prefill_done_ns"))
    if prefill_done is None and t is None and dst is None:  # ended at prefill
        prefill_done = finished
    decoded = dst is not None and not (t is not None and not t.get("ok", True))  # a decode instance took it
    dst_name = str(dst if dst is not None else (t or {}).get("dst"))
    plan = [
        ("queue", src, _int(r.get("arrival_ns")), _int(r.get("prefill_scheduled_ns"))),
        ("prefill", src, None, prefill_done),
        ("transfer wait", src, None, t_start),
        ("transfer", f"{src} -> {dst_name}", None, t_end),
        ("decode queue", dst_name, None, _int(r.get("decode_scheduled_ns")) if decoded else None),
        ("decode", dst_name, None, finished if decoded else None),
    ]
    out: list[PDSegment] = []
    at = plan[0][2]
    for state, where, start, end in plan:
        start = start if start is not None else at
        if start is None or end is None:
            at = start if end is None else end
            continue
        seg = PDSegment(rid, state, where, start, max(end, start))
        if state == "transfer" and t is not None:
            seg.num_blocks, seg.num_bytes = int(t.get("num_blocks", 0)), int(t.get("num_bytes", 0))
            seg.error = None if t.get("ok", True) else str(t.get("error"))
        out.append(seg)
        at = seg.end_ns
    return out
