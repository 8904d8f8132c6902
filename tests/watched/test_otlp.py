"""vLLM's OTLP request spans: decoded and checked (kvscope/watched/otlp.py), received over HTTP with every bound
(otlp_receiver.py), and as request rows of a watch (one row per request, vLLM's own times)."""

from __future__ import annotations

import math
import time

import pytest
from fakes import FakeServer
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otlp_spans import T0, body, post, request_span, response

import kvscope
from kvscope.runs.background.status import RunStatus
from kvscope.watched import otlp_receiver
from kvscope.watched.otlp import decode_traces
from kvscope.watched.otlp_receiver import OtlpReceiver, parse_address
from kvscope.watched.source import WatchSource


def test_a_request_span_becomes_a_row_with_vllms_names_mapped():
    decoded = decode_traces(body(request_span("cmpl-1", prompt=97, out=8, ttft=0.12, e2e=0.5)), 100)
    (row,) = decoded.rows
    assert row["request_id"] == "cmpl-1" and row["arrival_time"] == pytest.approx(T0)
    assert (row["num_prompt_tokens"], row["num_generation_tokens"], row["max_tokens"]) == (97, 8, 8)
    assert (row["time_to_first_token_s"], row["e2e_latency_s"]) == (0.12, 0.5)
    assert (row["queued_time_s"], row["prefill_time_s"], row["decode_time_s"]) == (0.01, 0.03, 0.15)
    assert (decoded.num_spans, decoded.num_other, decoded.num_malformed, decoded.num_dropped) == (1, 0, 0, 0)


def test_other_and_malformed_spans_are_counted_and_skipped():
    startup = Span(name="Load weights", span_id=b"12345678", start_time_unix_nano=1)
    bad = [
        request_span("no-id", gen_ai__request__id=None),
        request_span("no-e2e", gen_ai__latency__e2e=None),
        request_span("negative", e2e=-1.0),
        request_span("nan", ttft=math.nan),
        request_span("text-count", gen_ai__usage__prompt_tokens="40"),
        request_span("float-count", gen_ai__usage__prompt_tokens=40.0),
        request_span("too-long", e2e=1e9),
        request_span("x" * 300),
        request_span("no-arrival", arrival=0.0),
        request_span("year-2445", arrival=1.5e10),
    ]
    decoded = decode_traces(body(startup, request_span("ok"), *bad), 100)
    assert [r["request_id"] for r in decoded.rows] == ["ok"]
    assert (decoded.num_spans, decoded.num_other, decoded.num_malformed) == (12, 1, len(bad))


def test_spans_past_the_cap_are_dropped_and_garbage_is_a_value_error():
    decoded = decode_traces(body(*[request_span(f"r{i}") for i in range(10)]), 4)
    assert len(decoded.rows) == 4 and decoded.num_dropped == 6
    for garbage in (b"\xff\xff\xff", b"\x0a\x05abc", b"{\"resourceSpans\": []}"):
        with pytest.raises(ValueError, match="ExportTraceServiceRequest"):
            decode_traces(garbage, 4)


def test_addresses():
    assert parse_address("127.0.0.1:4318") == ("127.0.0.1", 4318)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("4318", "host:", ":4318", "host:port", "h:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(bad)


@pytest.fixture
def receiver():
    rec = OtlpReceiver("127.0.0.1:0").start()
    yield rec
    rec.close()


def test_the_receiver_answers_otlp_and_keeps_the_rows(receiver):
    status, answer = post(receiver.endpoint, body(request_span("a"), request_span("b")))
    assert status == 200 and not response(answer).HasField("partial_success")
    status, _ = post(receiver.endpoint, body(request_span("c")), encoding="gzip")
    assert status == 200
    rows, counts = receiver.take()
    assert [r["request_id"] for r in rows] == ["a", "b", "c"]
    assert counts["otlp_posts"] == 2 and counts["otlp_spans"] == 3 and counts["otlp_rejected"] == 0
    assert receiver.take()[0] == []


def test_bad_bodies_are_refused_at_the_edge_and_the_receiver_goes_on(receiver, caplog, monkeypatch):
    url = receiver.endpoint
    assert post(url, b"\xff\xff\xff")[0] == 400  # not protobuf
    assert "ExportTraceServiceRequest" in caplog.text
    assert post(url, b"{}", "application/json")[0] == 415  # OTLP JSON: the setting to change is named
    assert post(url.replace("/v1/traces", "/v1/metrics"), body())[0] == 404
    assert post(url, b"x" * 16, headers={"Content-Encoding": "br"})[0] == 415
    monkeypatch.setattr(otlp_receiver, "MAX_OTLP_BODY", 1000)
    assert post(url, b"\0" * 1001)[0] == 413  # over the cap: not even read
    assert post(url, b"\0" * 5000, encoding="gzip")[0] == 413  # inflates past the cap
    status, _ = post(url, body(request_span("after")))
    assert status == 200
    rows, counts = receiver.take()
    assert [r["request_id"] for r in rows] == ["after"]
    assert counts["otlp_rejected"] == 5 and counts["otlp_posts"] == 6  # (the wrong path is no OTLP post)


def test_too_many_spans_are_rejected_as_a_partial_success(receiver, monkeypatch):
    monkeypatch.setattr(otlp_receiver, "MAX_OTLP_SPANS", 3)
    monkeypatch.setattr(otlp_receiver, "MAX_OTLP_PENDING", 5)
    status, answer = post(receiver.endpoint, body(*[request_span(f"r{i}") for i in range(4)]))
    assert status == 200 and response(answer).partial_success.rejected_spans == 1
    _, answer = post(receiver.endpoint, body(*[request_span(f"s{i}") for i in range(3)]))  # 2 more fit
    assert response(answer).partial_success.rejected_spans == 1
    rows, counts = receiver.take()
    assert len(rows) == 5 and counts["otlp_spans_dropped"] == 2


def test_a_port_in_use_is_a_clear_error(receiver):
    with pytest.raises(ValueError, match="cannot listen"):
        OtlpReceiver(receiver.address)


def test_a_watch_never_started_lets_go_of_its_port():
    from kvscope.runs.background.watch import WatchRun

    run = WatchRun("http://127.0.0.1:1", otlp="127.0.0.1:0")
    address = run.otlp.address
    run.close()
    OtlpReceiver(address).close()  # free again


def test_spans_are_request_lanes_of_the_source_once_each():
    src = WatchSource(["http://127.0.0.1:1"], otlp=True)
    rows = decode_traces(body(request_span("a", T0, ttft=0.1, e2e=0.4, queue=0.02, prefill=0.05, decode=0.3),
                              request_span("b", T0 + 1.0)), 10).rows
    src.on_spans(rows, {"otlp_spans": 2})
    src.on_spans(rows[:1], {"otlp_spans": 3})  # an exporter's retry: the same span again
    _, events = src.tick(time.perf_counter_ns())
    assert src.faults["otlp_spans_duplicate"] == 1 and src.faults["otlp_spans"] == 3
    a = {e.kind: e.t_ns for e in events if e.request_id == "a"}
    assert list(a) == ["queued", "scheduled", "first_token", "finished"]
    assert (a["first_token"] - a["queued"]) / 1e9 == pytest.approx(0.1)  # vLLM's TTFT, from the arrival
    assert (a["finished"] - a["queued"]) / 1e9 == pytest.approx(0.4)
    assert (a["finished"] - a["first_token"]) / 1e9 == pytest.approx(0.3)
    assert (a["first_token"] - a["scheduled"]) / 1e9 == pytest.approx(0.05)
    b_queued = next(e.t_ns for e in events if e.request_id == "b" and e.kind == "queued")
    assert (b_queued - a["queued"]) / 1e9 == pytest.approx(1.0)


def test_a_watch_with_otlp_has_one_request_row_per_span_with_vllms_times(tmp_path):
    server = FakeServer().start()
    try:
        watch = kvscope.watch(server.url, otlp="127.0.0.1:0", interval=0.1,
                              metrics=tmp_path / "w.metrics.jsonl", prompts=[[5] * 40, [6] * 41, [7] * 40])
        deadline = time.monotonic() + 30
        while watch.status != RunStatus.RUNNING and not watch.done and time.monotonic() < deadline:
            time.sleep(0.05)
        now = time.time()
        spans = [request_span(f"r{i}", now + 0.1 * i, prompt=p, ttft=0.05 + i / 100, e2e=0.3)
                 for i, p in enumerate((40, 41, 40))]
        assert post(watch.otlp_endpoint, body(*reversed(spans)))[0] == 200  # finish order is not arrival order
        while len(watch.run.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.stop()
        watch.wait(30)
    finally:
        server.stop()
    req = watch.run.requests
    assert list(req["request_id"]) == ["r0", "r1", "r2"]
    assert list(req["ttft_s"]) == pytest.approx([0.05, 0.06, 0.07])
    assert list(req["e2e_s"]) == pytest.approx([0.3] * 3)
    assert list(req["num_prompt_tokens"]) == [40, 41, 40] and list(req["num_output_tokens"]) == [8] * 3
    assert watch.run.meta["watch"]["prompts"]["matched"] == 3
    loaded = kvscope.load(tmp_path / "w.metrics.jsonl")
    queued = {e.request_id: e.prompt_token_ids for e in loaded.events if e.kind == "queued"}
    assert queued == {"r0": [5] * 40, "r1": [6] * 41, "r2": [7] * 40}
    assert loaded.meta["watch"]["faults"]["otlp_spans"] == 3
    # what kvscope simulate --replay submits: the prompts, the output lengths, the arrivals 0.1 s apart
    from kvscope.runs.workload.recorded import replay_workload

    items = replay_workload(loaded)
    assert [(item.prompt, item.params.max_tokens) for item in items] == [([5] * 40, 8), ([6] * 41, 8), ([7] * 40, 8)]
    assert [item.arrival_s for item in items] == pytest.approx([0.0, 0.1, 0.2], abs=1e-6)
