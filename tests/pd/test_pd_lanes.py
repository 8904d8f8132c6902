"""A P/D run's telemetry per request and per instance: each request's lane (queue, prefill on its prefill
instance, transfer, queue and decode on its decode instance) in the meta and in the trace, in time order and
loading back; each instance's page map around the transfers, with the blocks in flight, bounded."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import pytest

import kvscope
from kvscope import PDEngine, Run, SamplingParams
from kvscope.pd.page_maps import MAX_MOMENTS, transfer_page_maps
from kvscope.telemetry.export import PD_REQUESTS_PID
from kvscope.telemetry.pd_lanes import LANE_STATES, request_segments

BS = 4
ORDER = {state: i for i, state in enumerate(LANE_STATES)}


@pytest.fixture(scope="module")
def run() -> Run:
    rng = random.Random(24)
    prompts = [[rng.randrange(5, 250) for _ in range(rng.randrange(9, 30))] for _ in range(6)]
    with PDEngine("tiny", pd="1P1D", block_size=BS, num_blocks=64) as engine:
        engine.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
        return Run.from_engine(engine)


def test_each_request_has_its_path_on_its_instances(run):
    pd = run.meta["pd"]
    lanes = request_segments(pd)
    assert len(lanes) == len(pd["requests"]) == 6
    transfers = {t["request_id"]: t for t in pd["transfers"]}
    for r, segments in zip(pd["requests"], lanes):
        states = [s.state for s in segments]
        assert states[0] == "queue" and states[-1] == "decode"
        assert {"prefill", "transfer", "decode queue"} <= set(states)
        assert states == sorted(states, key=ORDER.get)  # the path's order
        for a, b in pairwise(segments):  # contiguous, never backwards
            assert a.start_ns <= a.end_ns == b.start_ns <= b.end_ns
        where = {s.state: s.instance for s in segments}
        assert where["queue"] == where["prefill"] == r["prefill"] == "prefill-0"
        assert where["decode queue"] == where["decode"] == r["decode"] == "decode-0"
        t = transfers[r["request_id"]]
        (moved,) = [s for s in segments if s.state == "transfer"]
        assert (moved.start_ns, moved.end_ns, moved.num_blocks, moved.num_bytes) == (
            t["start_ns"], t["end_ns"], t["num_blocks"], t["num_bytes"])
        assert segments[0].start_ns == r["arrival_ns"] and segments[-1].end_ns == r["finished_ns"]
        assert r["arrival_ns"] <= r["prefill_scheduled_ns"] <= r["prefill_done_ns"] <= t["start_ns"]
        assert t["end_ns"] <= r["decode_scheduled_ns"] <= r["finished_ns"]


def test_the_trace_has_a_lane_per_request_and_loads_back(run, tmp_path):
    path = run.save_trace(tmp_path / "pd.trace.json")
    trace = json.loads(path.read_text())
    ours = [e for e in trace["traceEvents"] if e.get("pid") == PD_REQUESTS_PID and e["ph"] in "be"]
    by_lane: dict[str, list[dict]] = {}
    for e in ours:
        by_lane.setdefault(e["id2"]["local"], []).append(e)
    assert len(by_lane) == 6
    for r, events in zip(run.meta["pd"]["requests"], by_lane.values()):
        assert events[0]["name"] == events[-1]["name"] == r["request_id"]  # the request's slice holds the parts
        begins = [e for e in events[1:-1] if e["ph"] == "b"]
        names = [e["name"] for e in begins]
        assert names[:2] == ["queue @ prefill-0", "prefill @ prefill-0"] and names[-2:] == [
            "decode queue @ decode-0", "decode @ decode-0"]
        assert any(n.startswith("transfer prefill-0 -> decode-0: ") for n in names)
        ts = [e["ts"] for e in events[1:-1]]
        assert ts == sorted(ts)  # queue <= prefill <= transfer <= decode, each closed before the next opens
        assert [e["ph"] for e in events[1:-1]] == ["b", "e"] * len(begins)
    loaded = kvscope.load(path)
    assert len(loaded.records) == len(run.records) and loaded.profiler_events == []
    assert request_segments(loaded.meta["pd"]) == request_segments(run.meta["pd"])
    assert loaded.summary()["kv_transfers"] == 6


def test_each_instance_has_page_maps_with_blocks_in_flight(run):
    maps = run.meta["pd"]["page_maps"]
    assert set(maps["pools"]) == {"prefill-0", "decode-0"} and maps["truncated"] is False
    moments = maps["moments"]
    transfers = run.meta["pd"]["transfers"]
    assert [m["transfer"] for m in moments] == [*range(len(transfers)), None]  # each transfer, then the end
    for m, t in zip(moments, transfers):
        assert (m["request_id"], m["src"], m["dst"]) == (t["request_id"], t["src"], t["dst"])
        dst = m["maps"]["decode-0"]
        held = {b: (owner, state) for b, owner, _filled, state in dst["blocks"]}
        assert len(dst["in_flight"]) >= t["num_blocks"] > 0  # the blocks that arrived, held by the request
        assert all(held[b][0] == t["request_id"] and held[b][1] != "free" for b in dst["in_flight"])
        assert dst["in_flight"] == t["dst_block_ids"] and dst["marks_from"] == "transfer"
        src = m["maps"]["prefill-0"]  # the producer's blocks that were sent: still in its pool (cached)
        sent = {b: state for b, _owner, _filled, state in src["blocks"]}
        assert src["in_flight"] == t["src_block_ids"] and len(t["src_block_ids"]) == t["num_blocks"]
        assert all(sent.get(b, "free") != "free" for b in src["in_flight"])
    end = moments[-1]["maps"]
    assert all(not m["in_flight"] for m in end.values())
    json.dumps(maps, allow_nan=False)  # JSON as it is written


def test_page_maps_stay_bounded(run):
    snaps = {"prefill-0": (run.records, run.events, {}, [])}
    t = {"request_id": "x", "src": "prefill-0", "dst": "decode-0", "start_ns": run.records[-1].t_end_ns,
         "end_ns": run.records[-1].t_end_ns, "num_blocks": 1, "ok": True}
    maps = transfer_page_maps(snaps, [t] * (3 * MAX_MOMENTS), {"prefill-0": "kv_consumer"})
    assert len(maps["moments"]) == MAX_MOMENTS + 1 and maps["truncated"] is True
