"""The plugin's step lines (format: ``plugin_format.py``) as kvscope records: each vLLM engine step a
``StepRecord`` (its batch; the fleet's state after it), each finished request four ``RequestEvent``s whose
moments are counted back from the step's end with vLLM's own intervals. Every field is read defensively:
what is missing or not a number counts as 0 (or "not reported"); a time ``t`` that is no plausible Unix time
makes the line malformed, and durations beyond ``MAX_SPAN_S``, counts beyond ``MAX_COUNT`` and states out
of their range are not used (``limits.py``), so no line can overflow a record or a file."""

from __future__ import annotations

from typing import Any

from kvscope.telemetry.records import KVState, RequestEvent, StepRecord
from kvscope.watched.engines import EngineState, count, finite_in
from kvscope.watched.fleet import fleet_kv, fleet_queues
from kvscope.watched.limits import (
    MAX_BLOCK_SIZE,
    MAX_LABEL,
    MAX_NUM_BLOCKS,
    MAX_QUEUE,
    MAX_SPAN_S,
    MAX_UNIX_TIME,
)
from kvscope.watched.plugin_config import checked_config

STATE_FIELDS = {"num_running_reqs": MAX_QUEUE, "num_waiting_reqs": MAX_QUEUE, "kv_cache_usage": 1.0}
TOTAL_FIELDS = ("num_prompt_tokens", "num_generation_tokens", "num_preempted_reqs", "prefix_cache_queries",
                "prefix_cache_hits")


def finished_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    raw = obj.get("finished")
    return [f for f in raw if isinstance(f, dict)] if isinstance(raw, list) else []


def note_step(eng: EngineState, obj: dict[str, Any]) -> None:
    """The engine's latest state and running totals, from one step line."""
    for name, top in STATE_FIELDS.items():
        value = finite_in(obj.get(name), 0.0, top)
        if value is not None:
            eng.plugin[name] = value
    totals = eng.plugin_totals
    for name in TOTAL_FIELDS:
        totals[name] = totals.get(name, 0) + count(obj.get(name))
    totals["finished"] = totals.get("finished", 0) + len(finished_of(obj))
    totals["steps"] = totals.get("steps", 0) + 1


def _list(obj: dict[str, Any], name: str) -> list:
    value = obj.get(name)
    return value if isinstance(value, list) else []


def step_record(obj: dict[str, Any], t_ns: int, running: int, waiting: int, kv: KVState) -> StepRecord:
    """One step line as a record (``step`` -1: numbered when the interval closes). With vLLM's iteration
    details the batch is theirs and the step lasts ``elapsed_ms``; without (vLLM 0.32 sends none by
    default), requests that got their first token finished a prefill (the prompt tokens less the cached
    ones were computed), the others decoded one token each, and the step is an instant."""
    it = obj.get("iteration") if isinstance(obj.get("iteration"), dict) else None
    elapsed = finite_in(it.get("elapsed_ms"), 0.0, MAX_SPAN_S * 1e3) if it else None
    t_start = t_ns - int(elapsed * 1e6) if elapsed and elapsed > 0 else t_ns
    if it:
        batch = (count(it.get("num_ctx_requests")), count(it.get("num_ctx_tokens")),
                 count(it.get("num_generation_requests")), count(it.get("num_generation_tokens")))
    else:
        itl = _list(obj, "inter_token_latencies_s")
        computed = count(obj.get("num_prompt_tokens")) - count(obj.get("num_cached_prompt_tokens"))
        batch = (len(_list(obj, "time_to_first_tokens_s")), max(computed, 0), len(itl), len(itl))
    return StepRecord(
        step=-1, t_start_ns=t_start, t_end_ns=t_ns, schedule_ns=0, prepare_ns=0, forward_ns=t_ns - t_start,
        sample_ns=0, update_ns=0, num_prefill_seqs=batch[0], num_prefill_tokens=batch[1],
        num_decode_seqs=batch[2], num_decode_tokens=batch[3], num_running=running, num_waiting=waiting,
        num_preempted=count(obj.get("num_preempted_reqs")), num_finished=len(finished_of(obj)),
        num_output_tokens=count(obj.get("num_generation_tokens")), scheduled=[], kv=kv,
    )


def request_events(f: dict[str, Any], t_end: int, fallback_id: str, arrival: int | None = None) -> list[RequestEvent]:
    """A finished request's lane: queued (its arrival), scheduled, first token, finished at ``t_end``. The
    moments are counted back from ``t_end`` with vLLM's intervals; ``arrival`` (the request's arrival on this
    process's clock, when the line or span gives it) is the queued moment, and with a ``time_to_first_token_s``
    (vLLM's, from the arrival) the first token's."""
    rid = f.get("request_id")
    rid = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else fallback_id

    def span(name: str) -> int:
        value = finite_in(f.get(name), 0.0, MAX_SPAN_S)
        return int(value * 1e9) if value is not None else 0

    first = t_end - span("decode_time_s")
    ttft = finite_in(f.get("time_to_first_token_s"), 0.0, MAX_SPAN_S)
    if arrival is not None and ttft is not None:
        first = min(arrival + int(ttft * 1e9), t_end)
    scheduled = first - span("prefill_time_s")
    queued = min(scheduled - span("queued_time_s"), t_end - span("e2e_latency_s")) if arrival is None else \
        min(arrival, first)
    scheduled = max(scheduled, queued)
    prompt, out = count(f.get("num_prompt_tokens")), count(f.get("num_generation_tokens"))
    reason = f.get("finish_reason") if isinstance(f.get("finish_reason"), str) else None
    return [
        RequestEvent(queued, -1, rid, "queued", prompt, 0),
        RequestEvent(scheduled, -1, rid, "scheduled", prompt, 0, num_cached_tokens=count(f.get("num_cached_tokens"))),
        RequestEvent(first, -1, rid, "first_token", prompt, min(out, 1)),
        RequestEvent(t_end, -1, rid, "finished", prompt, out, reason=reason),
    ]


def _arrival(src: Any, f: dict[str, Any]) -> int | None:
    t = finite_in(f.get("arrival_time"), 0.0, MAX_UNIX_TIME)
    return None if t is None else src.unix_to_ns(t)


def _start(src: Any, eng: EngineState, obj: dict[str, Any]) -> None:
    pid = obj.get("pid") if isinstance(obj.get("pid"), int) else None
    if eng.key in src.plugin_pids and src.plugin_pids[eng.key] != pid:
        src.faults["plugin_restarts"] += 1
    src.plugin_pids[eng.key] = pid
    blocks, size = finite_in(obj.get("num_gpu_blocks"), 1, MAX_NUM_BLOCKS), finite_in(obj.get("block_size"), 1,
                                                                                         MAX_BLOCK_SIZE)
    eng.num_gpu_blocks = eng.num_gpu_blocks or (int(blocks) if blocks else None)
    eng.block_size = eng.block_size or (int(size) if size else None)
    config = checked_config(obj.get("config"))
    if config is not None:
        eng.config = config
    model = obj.get("model")
    if isinstance(model, str) and 0 < len(model) <= MAX_LABEL and not src.watch["model"]:
        src.watch["model"] = model


def apply_line(src: Any, eng: EngineState, obj: dict[str, Any]) -> bool:
    """One plugin line of ``eng`` into the watch; ``False`` if it is malformed (a step without a plausible
    time: a Unix time from 0 to ``MAX_UNIX_TIME``, so its nanoseconds fit in 64 bits)."""
    kind = obj.get("type")
    if kind == "start":
        _start(src, eng, obj)
    elif kind == "step":
        t = finite_in(obj.get("t"), 0.0, MAX_UNIX_TIME)
        if t is None:
            return False
        note_step(eng, obj)
        if src.plugin_records:
            t_ns = src.unix_to_ns(t)
            kv = fleet_kv(src.engines.values(), True)
            record = step_record(obj, t_ns, *fleet_queues(src.engines.values(), True), kv)
            events = [] if src.otlp else [  # with OTLP spans, the spans are the requests (source.py)
                e for i, f in enumerate(finished_of(obj))
                for e in request_events(f, t_ns, f"{eng.key}#{src.num_lanes + i}", _arrival(src, f))]
            src.add_record(record, events)
    return True
