"""The trace JSON is well-formed for Perfetto / Chrome; export works on plain records, events and meta.
(Atomic writes: tests/test_files.py.)"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import pytest
from telemetry_util import greedy, make_engine

from kvscope import Run
from kvscope.telemetry.export import build_trace, write_metrics, write_trace
from kvscope.telemetry.load import read_run_file
from kvscope.telemetry.trace import ENGINE_PID, REQUESTS_PID


def to_ns(us: float) -> int:
    return round(us * 1000)


def check_chrome_trace(trace: dict) -> dict[str, int]:
    """Structural rules Perfetto's JSON importer relies on; returns counts by phase."""
    assert isinstance(trace["traceEvents"], list)
    counts: dict[str, int] = defaultdict(int)
    slices = defaultdict(list)
    asyncs = defaultdict(list)
    for e in trace["traceEvents"]:
        ph = e["ph"]
        counts[ph] += 1
        assert isinstance(e["pid"], int)
        if ph == "M":
            assert e["name"] in (
                "process_name",
                "thread_name",
                "process_sort_index",
                "thread_sort_index",
                "process_labels",
            )
            continue
        assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]), e
        if ph == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append(e)
        elif ph == "C":
            assert e["args"] and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in e["args"].values()
            ), e
        elif ph in ("b", "e"):  # an id, or an id2 that says its scope: process-local or global
            assert ("id" in e) != ("id2" in e), e
            if "id" in e:
                scope, key = "global", e["id"]
            else:
                ((scope, key),) = e["id2"].items()
                assert scope in ("local", "global"), e
            asyncs[(e["pid"] if scope == "local" else None, e["cat"], scope, key)].append(e)
    for thread, events in slices.items():  # complete events on one thread must nest
        stack: list[int] = []
        for e in sorted(events, key=lambda e: (to_ns(e["ts"]), -to_ns(e["dur"]))):
            start, end = to_ns(e["ts"]), to_ns(e["ts"]) + to_ns(e["dur"])
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1, f"{e['name']} overlaps its parent on {thread}"
            stack.append(end)
    for lane, events in asyncs.items():  # async begin/end pairs nest per id
        stack_names: list[str] = []
        last = -math.inf
        for e in events:
            assert e["ts"] >= last, f"async events out of order on {lane}"
            last = e["ts"]
            if e["ph"] == "b":
                stack_names.append(e["name"])
            else:
                assert stack_names and stack_names.pop() == e["name"], f"unbalanced async end on {lane}"
        assert not stack_names, f"async slices left open on {lane}"
    return counts


@pytest.fixture(scope="module")
def preempted_run():
    engine = make_engine(num_blocks=6)
    engine.generate([[30 + i] * 6 for i in range(3)], greedy(10))
    return Run.from_engine(engine)


def test_trace_structure(preempted_run, tmp_path):
    run = preempted_run
    path = run.save_trace(tmp_path / "run.json")
    trace = json.loads(path.read_text())
    counts = check_chrome_trace(trace)
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert len(steps) == len(run.records)
    assert counts["X"] == 6 * len(run.records)  # a step and its five phases
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {"KV usage", "KV fragmentation", "KV bytes", "batch tokens", "requests", "memory bytes"} <= names
    lanes = [e for e in trace["traceEvents"] if e["pid"] == REQUESTS_PID and e["ph"] == "b"]
    assert {e["name"] for e in lanes} >= {
        "waiting",
        "prefill",
        "decode",
        "preempted",
        *run.requests.request_id,
    }
    # each request's lane is local to the "kvscope requests" process (a global id would put the lanes
    # under Perfetto's "Global Legacy Events"), one id per request
    request_events = [e for e in trace["traceEvents"] if e["pid"] == REQUESTS_PID and e["ph"] in ("b", "e")]
    assert all("id" not in e and set(e["id2"]) == {"local"} for e in request_events)
    lane_ids = {e["name"]: e["id2"]["local"] for e in lanes if e["name"] in set(run.requests.request_id)}
    assert len(lane_ids) == len(set(lane_ids.values())) == len(run.requests)
    assert {e["id2"]["local"] for e in request_events} == set(lane_ids.values())
    assert trace["displayTimeUnit"] == "ms" and trace["kvscope"]["meta"]["model"] == run.meta["model"]
    # a step's counters sit at its end, on our clock
    first = run.records[0]
    kv = next(e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "KV usage")
    assert to_ns(kv["ts"]) == first.t_end_ns - run.meta["t0_ns"]
    assert kv["args"]["blocks"] == first.kv.block_usage
    assert all(e["pid"] in (ENGINE_PID, REQUESTS_PID) for e in trace["traceEvents"])


def test_export_works_on_plain_records_events_and_meta(preempted_run, tmp_path):
    """telemetry.export needs no Run: the lists and the meta dict are enough, and load gives them back."""
    run = preempted_run
    trace = build_trace(run.records, run.events, run.meta)
    assert trace == json.loads(run.save_trace(tmp_path / "run.json").read_text())
    write_metrics(tmp_path / "plain.jsonl", run.records, run.events, run.meta)
    write_trace(tmp_path / "plain.json", run.records, run.events, run.meta)
    for name in ("plain.jsonl", "plain.json"):
        records, events, meta, _ = read_run_file(tmp_path / name)
        assert records == run.records and events == run.events and meta == run.meta


def trace_processor_binary() -> str | None:
    """The trace_processor_shell binary if this machine has it (it is never downloaded here)."""
    path = os.environ.get("KVSCOPE_TRACE_PROCESSOR")
    if path and os.path.isfile(path):
        return path
    try:
        import platform
        import sys

        from perfetto.prebuilts.manifests.trace_processor_shell import TRACE_PROCESSOR_SHELL_MANIFEST
    except ImportError:
        return None
    for entry in TRACE_PROCESSOR_SHELL_MANIFEST:
        if entry.get("platform") == sys.platform and platform.machine().lower() in entry.get("machine", []):
            root, ext = os.path.splitext(entry["file_name"])
            cached = Path.home() / ".local/share/perfetto/prebuilts" / f"{root}-{entry['sha256'][:16]}{ext}"
            return str(cached) if cached.is_file() else None
    return None


@pytest.mark.timeout(120)
def test_perfetto_trace_processor_reads_the_trace(preempted_run, tmp_path):
    binary = trace_processor_binary()
    if binary is None:
        pytest.skip(
            "Perfetto's trace_processor_shell is not on this machine (the perfetto package downloads it "
            "on first use, which needs the internet); set KVSCOPE_TRACE_PROCESSOR to a binary to run this"
        )
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    path = preempted_run.save_trace(tmp_path / "run.json")
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=binary, load_timeout=60))
    try:
        n_steps = (
            tp.query("select count(*) as n from slice where name like 'step %'").as_pandas_dataframe().n[0]
        )
        assert n_steps == len(preempted_run.records)
        phases = tp.query("select count(*) as n from slice where depth = 1 and category = 'phase'")
        assert phases.as_pandas_dataframe().n[0] == 5 * len(preempted_run.records)
        counters = tp.query("select distinct name from counter_track").as_pandas_dataframe().name.tolist()
        assert any("KV usage" in c for c in counters)
        lanes = (
            tp.query("select count(*) as n from slice where name = 'preempted'").as_pandas_dataframe().n[0]
        )
        assert lanes == preempted_run.summary()["preemptions"]
    finally:
        tp.close()
