"""Writing a run: a Perfetto / Chrome trace JSON and a JSON Lines metrics file, both atomically.

The trace's events are ``trace.py``'s (its docstring has the layout). Beside them, the top-level key
``"kvscope"`` holds the run's metadata and raw records, so ``kvscope.load`` can rebuild the run from the
trace alone (Chrome's format allows extra top-level keys). The metrics file is a header line (with the
metadata), then step and event lines in time order, then an end line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.telemetry.serialize import event_to_dict, step_to_dict
from kvscope.telemetry.trace import LANES_PID, PD_REQUESTS_PID, Lane, trace_events
from kvscope.utils.files import atomic_write

# LANES_PID and PD_REQUESTS_PID (``trace.py``'s) are still imported from here by tests outside telemetry
__all__ = ["FORMAT_VERSION", "LANES_PID", "MAX_TEXT", "METRICS_FORMAT", "PD_REQUESTS_PID", "TRACE_FORMAT", "Lane",
           "build_trace", "write_metrics", "write_trace"]
TRACE_FORMAT = "kvscope-trace"
METRICS_FORMAT = "kvscope-metrics"
FORMAT_VERSION = 1
MAX_TEXT = 2000  # characters of each request's prompt / output kept in ``meta["texts"]`` (a cell, not an archive)


# ---- metrics (JSON Lines) -------------------------------------------------------------------------
def write_metrics(
    path: str | os.PathLike, records: Sequence[StepRecord], events: Sequence[RequestEvent], meta: dict[str, Any]
) -> Path:
    """Header line (with ``meta``), then step and event lines in time order, then an end line (so
    truncation shows)."""

    def write(f: IO[str]) -> None:
        header = {"type": "header", "format": METRICS_FORMAT, "version": FORMAT_VERSION, "meta": meta}
        f.write(json.dumps(header) + "\n")
        for kind, item in _time_ordered(records, events):
            body = step_to_dict(item) if kind == "step" else event_to_dict(item)
            f.write(json.dumps({"type": kind, **body}) + "\n")
        f.write(json.dumps({"type": "end", "num_steps": len(records), "num_events": len(events)}) + "\n")

    return atomic_write(path, write)


def _time_ordered(records: Sequence[StepRecord], events: Sequence[RequestEvent]) -> Iterable[tuple[str, Any]]:
    items = [(r.t_end_ns, 1, "step", r) for r in records] + [(e.t_ns, 0, "event", e) for e in events]
    items.sort(key=lambda x: (x[0], x[1]))
    return ((kind, item) for _, _, kind, item in items)


# ---- trace (Chrome / Perfetto JSON) ---------------------------------------------------------------
def write_trace(
    path: str | os.PathLike,
    records: Sequence[StepRecord],
    events: Sequence[RequestEvent],
    meta: dict[str, Any],
    profiler_events: Sequence[dict[str, Any]] = (),
    lanes: Sequence[Lane] = (),
) -> Path:
    """The trace of ``build_trace`` written atomically to ``path``."""
    trace = build_trace(records, events, meta, profiler_events, lanes)
    return atomic_write(path, lambda f: json.dump(trace, f, separators=(",", ":")))


def build_trace(
    records: Sequence[StepRecord],
    events: Sequence[RequestEvent],
    meta: dict[str, Any],
    profiler_events: Sequence[dict[str, Any]] = (),
    lanes: Sequence[Lane] = (),
) -> dict[str, Any]:
    """The Chrome trace of a run: ``trace.trace_events`` and the run itself under ``"kvscope"``. ``lanes``
    are derived data (a watched server's engines), so loading skips them."""
    return {
        "traceEvents": trace_events(records, events, meta, profiler_events, lanes),
        "displayTimeUnit": "ms",
        "kvscope": {
            "format": TRACE_FORMAT,
            "version": FORMAT_VERSION,
            "meta": meta,
            "records": [step_to_dict(r) for r in records],
            "events": [event_to_dict(e) for e in events],
        },
    }
