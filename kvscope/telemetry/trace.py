"""The Chrome / Perfetto trace events of a run (``export.build_trace`` wraps them into the trace file).

Layout (Chrome trace event format, ``ts``/``dur`` in microseconds from the run's ``t0_ns``):

- process "kvscope engine" (``ENGINE_PID``), thread "steps": one ``X`` slice per step with its phases
  (schedule, prepare, forward, sample, update) as child ``X`` slices; counter tracks (``C``) for KV
  usage, fragmentation, KV bytes (paged vs static reservation), batch tokens, requests, memory; with
  speculative decoding, accepted / rejected draft tokens, the acceptance rate and the draft pool's blocks.
- process "kvscope requests" (``REQUESTS_PID``): one async lane per request (``b``/``e`` with the
  request's index as a process-local id, ``"id2": {"local": "0x.."}``, so Perfetto groups the lanes
  under that process; a plain ``id`` is global, and lands in "Global Legacy Events"): a slice named
  by the request id spanning queued to finished, with its states (waiting, prefill, decode,
  preempted) as nested slices.
- a P/D run (``meta["pd"]``): process "kvscope P/D requests" (``PD_REQUESTS_PID``), one async lane per
  request (``b``/``e``, ``id2`` local like the requests') spanning its path, with a nested slice per part
  named with the instance it ran on: "queue @ prefill-0", "prefill @ prefill-0", "transfer wait @ prefill-0",
  "transfer prefill-0 -> decode-0: N blocks, B B", "decode queue @ decode-0", "decode @ decode-0"
  (``kvscope.telemetry.pd_lanes``; args: instance, blocks, bytes). The transfer track itself is a lane
  (``kvscope.pd.summary.transfer_lane``).
- torch.profiler (Kineto) events, when a window was profiled, on their own pids, already moved onto
  our clock by ``telemetry/profiler.py``.
- a watched run (``kvscope watch``): one process per engine and one for the fleet (``LANES_PID`` on), with
  counter tracks (KV cache usage, requests, tokens/s, KV cache events) and "connection lost" slices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvscope.telemetry.frames import token_times
from kvscope.telemetry.pd_lanes import request_segments
from kvscope.telemetry.records import RequestEvent, StepRecord

ENGINE_PID = (1 << 30) + 1  # far above Linux pids (<= 2**22) and CUDA device ids, which Kineto uses
REQUESTS_PID = (1 << 30) + 2
PD_REQUESTS_PID = (1 << 30) + 3  # a P/D run's request lanes, by instance
OUR_PIDS = (ENGINE_PID, REQUESTS_PID, PD_REQUESTS_PID)
LANES_PID, MAX_LANES = (1 << 30) + 16, 4096  # engine lanes of a watched run (kvscope watch): one process each
PHASES = ("schedule", "prepare", "forward", "sample", "update")
# An engine lane of a watched run: (process name, {counter track: [(t_ns, {series: value})]}, [(slice, t0_ns, t1_ns)])
Lane = tuple[str, dict[str, list[tuple[int, dict[str, float]]]], list[tuple[str, int, int]]]
STATE_COLOURS = {
    "waiting": "grey",
    "prefill": "thread_state_runnable",
    "decode": "good",
    "preempted": "terrible",
}


def is_our_pid(pid: Any) -> bool:
    """A process of the trace kvscope draws itself (what ``kvscope.load`` does not take for profiler events)."""
    return pid in OUR_PIDS or (isinstance(pid, int) and LANES_PID <= pid < LANES_PID + MAX_LANES)


def trace_events(
    records: Sequence[StepRecord],
    events: Sequence[RequestEvent],
    meta: dict[str, Any],
    profiler_events: Sequence[dict[str, Any]] = (),
    lanes: Sequence[Lane] = (),
) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a run; ``meta["t0_ns"]`` is time zero (the layout is in the module docstring).
    ``lanes``: one process each (a watched server's engines: ``(name, {track: [(t_ns, {series: value})]},
    [(slice name, t0_ns, t1_ns)])``), drawn after the run's own."""
    t0 = meta["t0_ns"]

    def us(t_ns: int) -> float:
        return round((t_ns - t0) / 1000, 3)

    ev: list[dict[str, Any]] = [
        _meta("process_name", ENGINE_PID, 0, name="kvscope engine"),
        _meta("process_sort_index", ENGINE_PID, 0, sort_index=0),
        _meta("thread_name", ENGINE_PID, 1, name="steps"),
        _meta("process_name", REQUESTS_PID, 0, name="kvscope requests"),
        _meta("process_sort_index", REQUESTS_PID, 0, sort_index=1),
    ]
    for r in records:
        ev.extend(_step_events(r, us))
    ev.extend(_request_lanes(records, events, us))
    if isinstance(meta.get("pd"), dict):
        ev.extend(_pd_lanes(meta["pd"], us))
    ev.extend(_shift(profiler_events, t0))
    ev.extend(_lane_events(lanes, us))
    return ev


def _step_events(r: StepRecord, us: Callable[[int], float]) -> list[dict[str, Any]]:
    """A step's slice on the engine's ``steps`` thread, its phases inside it, and its counters."""
    ev: list[dict[str, Any]] = [
        {
            "ph": "X",
            "name": f"step {r.step}",
            "cat": "step",
            "pid": ENGINE_PID,
            "tid": 1,
            "ts": us(r.t_start_ns),
            "dur": round(r.duration_ns / 1000, 3),
            "args": {
                "prefill_tokens": r.num_prefill_tokens,
                "decode_tokens": r.num_decode_tokens,
                "running": r.num_running,
                "waiting": r.num_waiting,
                "sampled": r.num_output_tokens,
                **({"drafted": r.spec_decode.num_draft_tokens, "accepted": r.spec_decode.num_accepted_tokens}
                   if r.spec_decode is not None else {}),
            },
        }
    ]
    t = r.t_start_ns
    for phase in PHASES:
        d = getattr(r, phase + "_ns")
        ev.append({"ph": "X", "name": phase, "cat": "phase", "pid": ENGINE_PID, "tid": 1, "ts": us(t),
                   "dur": round(d / 1000, 3)})
        t += d
    ev.extend(_counters(r, us(r.t_end_ns)))
    return ev


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _counters(r: StepRecord, ts: float) -> list[dict[str, Any]]:
    kv = r.kv
    tracks = {
        "KV usage": {"blocks": kv.block_usage, "tokens": kv.token_usage},
        "KV fragmentation": {"internal": kv.fragmentation},
        "KV bytes": {"paged": kv.paged_bytes, "static reservation": kv.static_reservation_bytes},
        "KV blocks": {"used": kv.blocks_used, "cached free": kv.blocks_cached_free},
        "batch tokens": {"prefill": r.num_prefill_tokens, "decode": r.num_decode_tokens},
        "requests": {"running": r.num_running, "waiting": r.num_waiting},
    }
    spec = r.spec_decode
    if spec is not None:
        tracks["speculative tokens"] = {"accepted": spec.num_accepted_tokens, "rejected": spec.num_rejected_tokens}
        tracks["speculative acceptance"] = {
            "rate": spec.num_accepted_tokens / spec.num_draft_tokens if spec.num_draft_tokens else 0.0}
        if spec.draft_num_blocks:
            tracks["draft KV blocks"] = {"used": spec.draft_blocks_used}
    mem = {k: v for k, v in r.memory.items() if k.endswith("_bytes") and isinstance(v, (int, float))}
    if mem:
        tracks["memory bytes"] = mem
    return [
        {"ph": "C", "name": name, "pid": ENGINE_PID, "ts": ts, "args": args} for name, args in tracks.items()
    ]


def _request_lanes(
    records: Sequence[StepRecord], events: Sequence[RequestEvent], us: Callable[[int], float]
) -> list[dict[str, Any]]:
    """Per request: (state, start) segments from its events; a resumed request is in "prefill"
    (recomputing) until its next sampled token, then in "decode"."""
    tokens = token_times(records)
    by_id: dict[str, list] = {}
    for e in events:
        by_id.setdefault(e.request_id, []).append(e)
    out: list[dict[str, Any]] = []
    for index, (rid, evs) in enumerate(by_id.items()):
        segments: list[tuple[str, int]] = []
        for e in evs:
            if e.kind == "queued":
                segments.append(("waiting", e.t_ns))
            elif e.kind == "scheduled":
                segments.append(("prefill", e.t_ns))
            elif e.kind == "first_token":
                segments.append(("decode", e.t_ns))
            elif e.kind == "preempted":
                segments.append(("preempted", e.t_ns))
            elif e.kind == "resumed":
                segments.append(("prefill", e.t_ns))
                nxt = next((t for t in tokens.get(rid, ()) if t > e.t_ns), None)
                if nxt is not None:
                    segments.append(("decode", nxt))
        segments.sort(key=lambda s: s[1])
        finished = next((e for e in evs if e.kind == "finished"), None)
        end = finished.t_ns if finished else (records[-1].t_end_ns if records else evs[-1].t_ns)
        if not segments:
            continue
        base = {"cat": "request", "pid": REQUESTS_PID, "tid": 0, "id2": {"local": hex(index)}}
        start = segments[0][1]
        out.append(
            {
                **base,
                "ph": "b",
                "name": rid,
                "ts": us(start),
                "args": {
                    "prompt_tokens": evs[0].num_prompt_tokens,
                    "finish_reason": finished.reason if finished else None,
                },
            }
        )
        for (state, t), nxt in zip(segments, [*segments[1:], (None, end)]):
            t_end = max(nxt[1], t)
            out.append({**base, "ph": "b", "name": state, "ts": us(t), "cname": STATE_COLOURS[state]})
            out.append({**base, "ph": "e", "name": state, "ts": us(t_end)})
        out.append({**base, "ph": "e", "name": rid, "ts": us(max(end, start))})
    return out


def _pd_lanes(pd: dict[str, Any], us: Callable[[int], float]) -> list[dict[str, Any]]:
    """A P/D run's request lanes (see the module docstring)."""
    out = [_meta("process_name", PD_REQUESTS_PID, 0, name="kvscope P/D requests"),
           _meta("process_sort_index", PD_REQUESTS_PID, 0, sort_index=2)]
    for index, segments in enumerate(request_segments(pd)):
        if not segments:
            continue
        base = {"cat": "pd", "pid": PD_REQUESTS_PID, "tid": 0, "id2": {"local": hex(index)}}
        first = segments[0]
        out.append({**base, "ph": "b", "name": first.request_id, "ts": us(first.start_ns),
                    "args": {"prefill": first.instance}})
        for s in segments:
            args = {"instance": s.instance, **({"blocks": s.num_blocks, "bytes": s.num_bytes}
                                               if s.num_blocks is not None else {})}
            out.append({**base, "ph": "b", "name": s.label, "ts": us(s.start_ns), "args": args})
            out.append({**base, "ph": "e", "name": s.label, "ts": us(s.end_ns)})
        out.append({**base, "ph": "e", "name": first.request_id, "ts": us(segments[-1].end_ns)})
    return out


def _lane_events(lanes: Sequence[Lane], us: Callable[[int], float]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, (name, tracks, spans) in enumerate(lanes[:MAX_LANES]):
        pid = LANES_PID + i
        out += [_meta("process_name", pid, 0, name=name), _meta("process_sort_index", pid, 0, sort_index=2 + i),
                _meta("thread_name", pid, 1, name="connection")]
        for track, points in tracks.items():
            out += [{"ph": "C", "name": track, "pid": pid, "ts": us(t), "args": args} for t, args in points]
        out += [{"ph": "X", "name": label, "cat": "watch", "pid": pid, "tid": 1, "ts": us(a),
                 "dur": round(max(b - a, 0) / 1000, 3)} for label, a, b in spans]
    return out


def _shift(events: Sequence[dict[str, Any]], t0_ns: int) -> list[dict[str, Any]]:
    """Profiler events carry ``ts`` in absolute perf_counter microseconds; make them run-relative."""
    off = t0_ns / 1000
    return [{**e, "ts": round(e["ts"] - off, 3)} if "ts" in e else e for e in events]
