"""Hand-built OTLP trace bodies shaped like vLLM 0.32's (``vllm/v1/engine/output_processor.py``, ``do_tracing``)."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

T0 = 1_764_590_000.0  # a Unix time (s)


def attrs(**values) -> list[KeyValue]:
    out = []
    for key, v in values.items():
        if isinstance(v, bool):
            value = AnyValue(bool_value=v)
        elif isinstance(v, int):
            value = AnyValue(int_value=v)
        elif isinstance(v, float):
            value = AnyValue(double_value=v)
        else:
            value = AnyValue(string_value=v)
        out.append(KeyValue(key=key, value=value))
    return out


def request_span(rid: str, arrival: float = T0, *, prompt: int = 40, out: int = 8, ttft: float = 0.05,
                 e2e: float = 0.2, queue: float = 0.01, prefill: float = 0.03, decode: float = 0.15,
                 span_id: bytes | None = None, **extra) -> Span:
    values = {"gen_ai.request.id": rid, "gen_ai.latency.time_in_queue": queue,
              "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
              "gen_ai.usage.prompt_tokens": prompt, "gen_ai.usage.completion_tokens": out,
              "gen_ai.latency.time_in_model_prefill": prefill, "gen_ai.latency.time_in_model_decode": decode,
              "gen_ai.latency.time_in_model_inference": prefill + decode, "gen_ai.request.max_tokens": out}
    values.update({k.replace("__", "."): v for k, v in extra.items()})  # gen_ai__usage__prompt_tokens=None: left out
    values = {k: v for k, v in values.items() if v is not None}
    sid = span_id if span_id is not None else rid.encode().ljust(8, b"_")[:8]
    return Span(name="llm_request", trace_id=b"t" * 16, span_id=sid, start_time_unix_nano=int(arrival * 1e9),
                end_time_unix_nano=int((arrival + e2e) * 1e9), kind=Span.SPAN_KIND_SERVER, attributes=attrs(**values))


def body(*spans: Span) -> bytes:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])]
                                     ).SerializeToString()


def post(url: str, data: bytes, ctype: str = "application/x-protobuf", *, encoding: str | None = None,
         headers: dict | None = None) -> tuple[int, bytes]:
    head = {"Content-Type": ctype, **(headers or {})}
    if encoding == "gzip":
        data = gzip.compress(data)
        head["Content-Encoding"] = "gzip"
    req = urllib.request.Request(url, data=data, headers=head, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def response(data: bytes) -> ExportTraceServiceResponse:
    out = ExportTraceServiceResponse()
    out.ParseFromString(data)
    return out
