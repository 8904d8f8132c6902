"""A P/D request's lane from a hand-made ``meta["pd"]``: the full path, a request that ended at prefill, a failed
transfer, an older file without the side times; segments contiguous and in order, on the right instances."""

from __future__ import annotations

import itertools

from kvscope.telemetry.export import build_trace
from kvscope.telemetry.pd_lanes import request_segments
from kvscope.telemetry.trace import PD_REQUESTS_PID, is_our_pid

TRANSFER = {"request_id": "a", "src": "prefill-0", "dst": "decode-1", "transport": "shm", "num_blocks": 3,
            "num_held_blocks": 1, "num_bytes": 3072, "start_ns": 500, "end_ns": 650, "ok": True, "error": None}
FULL = {"request_id": "a", "prefill": "prefill-0", "decode": "decode-1", "arrival_ns": 100,
        "prefill_scheduled_ns": 150, "prefill_done_ns": 400, "transfer_start_ns": 500, "transfer_end_ns": 650,
        "decode_scheduled_ns": 700, "finished_ns": 1000}


def _lane(request: dict, transfers: list[dict]) -> list[tuple]:
    (segments,) = request_segments({"requests": [request], "transfers": transfers})
    return [(s.state, s.instance, s.start_ns, s.end_ns) for s in segments]


def test_the_whole_path():
    assert _lane(FULL, [TRANSFER]) == [
        ("queue", "prefill-0", 100, 150), ("prefill", "prefill-0", 150, 400),
        ("transfer wait", "prefill-0", 400, 500), ("transfer", "prefill-0 -> decode-1", 500, 650),
        ("decode queue", "decode-1", 650, 700), ("decode", "decode-1", 700, 1000)]
    (segments,) = request_segments({"requests": [FULL], "transfers": [TRANSFER]})
    assert segments[3].label == "transfer prefill-0 -> decode-1: 3 blocks, 3072 B"
    assert segments[1].label == "prefill @ prefill-0"


def test_ended_at_prefill_and_failed_transfer():
    first_token_ends = {**FULL, "decode": None, "prefill_done_ns": None, "transfer_start_ns": None,
                        "transfer_end_ns": None, "decode_scheduled_ns": None, "finished_ns": 420}
    assert _lane(first_token_ends, []) == [("queue", "prefill-0", 100, 150), ("prefill", "prefill-0", 150, 420)]
    failed = {**TRANSFER, "ok": False, "error": "decode-1 refuses", "num_blocks": 0, "num_bytes": 0}
    lane = _lane({**FULL, "decode": None, "decode_scheduled_ns": None}, [failed])
    assert [s[0] for s in lane] == ["queue", "prefill", "transfer wait", "transfer"]
    (segments,) = request_segments({"requests": [FULL], "transfers": [failed]})
    assert segments[-1].error == "decode-1 refuses" and "FAILED" in segments[-1].label


def test_an_older_file_and_times_that_go_backwards():
    older = {k: v for k, v in FULL.items() if k not in ("prefill_scheduled_ns", "decode_scheduled_ns")}
    assert [s[0] for s in _lane(older, [TRANSFER])] == ["prefill", "transfer wait", "transfer", "decode"]
    assert _lane(older, [TRANSFER])[0][2] == 100  # prefill from the arrival: its queue is not known
    skewed = {**FULL, "decode_scheduled_ns": 600}  # before the transfer's end: clamped, never backwards
    lane = _lane(skewed, [TRANSFER])
    assert all(a[3] == b[2] and a[2] <= a[3] for a, b in itertools.pairwise(lane))
    assert request_segments({}) == request_segments({"requests": "x"}) == []


def test_the_trace_draws_them_as_our_own_process():
    meta = {"t0_ns": 0, "pd": {"requests": [FULL], "transfers": [TRANSFER]}}
    trace = build_trace([], [], meta)
    ours = [e for e in trace["traceEvents"] if e.get("pid") == PD_REQUESTS_PID]
    assert is_our_pid(PD_REQUESTS_PID)
    names = [e["name"] for e in ours if e["ph"] == "b"]
    assert names[0] == "a" and names[1:] == ["queue @ prefill-0", "prefill @ prefill-0", "transfer wait @ prefill-0",
                                             "transfer prefill-0 -> decode-1: 3 blocks, 3072 B",
                                             "decode queue @ decode-1", "decode @ decode-1"]
    transfer = next(e for e in ours if e["ph"] == "b" and e["name"].startswith("transfer prefill"))
    assert transfer["args"] == {"instance": "prefill-0 -> decode-1", "blocks": 3, "bytes": 3072}
    assert [e["ts"] for e in ours if e["ph"] in "be"] == sorted(e["ts"] for e in ours if e["ph"] in "be")
