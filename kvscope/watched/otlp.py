"""vLLM's OpenTelemetry request spans (OTLP/HTTP protobuf) as request rows.

vLLM (0.32, ``vllm/v1/engine/output_processor.py``, ``do_tracing``) ends one ``llm_request`` span per finished
request, started at the request's arrival (``start_time_unix_nano``: the API server's wall clock), with the
attributes of ``vllm/tracing/utils.py``'s ``SpanAttributes``. ``ATTRIBUTES`` maps those read here to the keys of
the plugin's ``finished`` entries (``plugin_format.py``), so one reader (``plugin_steps.request_events``) makes
the request's lane from either. Other spans (vLLM's start-up: "Load weights", "Warmup (CPU)", ...) are counted
and skipped.

A body is decoded with ``opentelemetry-proto``'s ``ExportTraceServiceRequest``; every value is then checked
(``limits.py``): a span without a request id, a plausible arrival, its end-to-end latency and its token counts,
or with a number out of range, is malformed (counted, skipped). At most ``max_spans`` spans of one body are
read; the rest are counted as dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscope.watched.engines import finite_in
from kvscope.watched.limits import MAX_COUNT, MAX_LABEL, MAX_SPAN_S, MAX_UNIX_TIME

LLM_SPAN = "llm_request"  # the span name of a request (vLLM's do_tracing)
REQUEST_ID = "gen_ai.request.id"
# vLLM's attribute -> the key of a plugin ``finished`` entry; durations are seconds, counts whole numbers
ATTRIBUTES = {
    "gen_ai.latency.time_in_queue": "queued_time_s",
    "gen_ai.latency.time_to_first_token": "time_to_first_token_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_time_s",
    "gen_ai.latency.time_in_model_decode": "decode_time_s",
    "gen_ai.latency.time_in_model_inference": "inference_time_s",
    "gen_ai.latency.e2e": "e2e_latency_s",
    "gen_ai.usage.prompt_tokens": "num_prompt_tokens",
    "gen_ai.usage.completion_tokens": "num_generation_tokens",
    "gen_ai.request.max_tokens": "max_tokens",
}
COUNTS = frozenset(("num_prompt_tokens", "num_generation_tokens", "max_tokens"))
REQUIRED = ("e2e_latency_s", "num_prompt_tokens", "num_generation_tokens")


@dataclass(slots=True)
class Decoded:
    """One body's request rows (each a plugin-style ``finished`` dict with ``arrival_time``, Unix seconds, and
    ``span_id``) and what was not kept of it."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    num_spans: int = 0  # spans in the body
    num_other: int = 0  # not a request span
    num_malformed: int = 0
    num_dropped: int = 0  # past max_spans


def _value(v: Any) -> Any:
    """An OTLP ``AnyValue``'s plain value (``None`` for arrays, maps, bytes or nothing)."""
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def request_row(span: Any) -> dict[str, Any] | None:
    """One ``llm_request`` span as a request row; ``None`` if it is malformed."""
    attrs = {kv.key: _value(kv.value) for kv in span.attributes if kv.key == REQUEST_ID or kv.key in ATTRIBUTES}
    rid = attrs.get(REQUEST_ID)
    arrival = finite_in(span.start_time_unix_nano / 1e9, 0.0, MAX_UNIX_TIME) if span.start_time_unix_nano else None
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_LABEL or arrival is None:
        return None
    row: dict[str, Any] = {"request_id": rid, "arrival_time": arrival, "span_id": span.span_id.hex()}
    for name, key in ATTRIBUTES.items():
        value = attrs.get(name)
        if value is None:
            continue
        if isinstance(value, (bool, str)):
            return None
        if key in COUNTS:
            if not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
                return None
        elif finite_in(value, 0.0, MAX_SPAN_S) is None:
            return None
        row[key] = value
    return row if all(k in row for k in REQUIRED) else None


def decode_traces(body: bytes, max_spans: int) -> Decoded:
    """The request rows of an ``ExportTraceServiceRequest``; ``ValueError`` if ``body`` is no such message."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"not an OTLP ExportTraceServiceRequest ({exc})") from None
    out = Decoded()
    for resource_spans in message.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.num_spans += 1
                if out.num_spans > max_spans:
                    out.num_dropped += 1
                elif span.name != LLM_SPAN:
                    out.num_other += 1
                else:
                    row = request_row(span)
                    if row is None:
                        out.num_malformed += 1
                    else:
                        out.rows.append(row)
    return out
