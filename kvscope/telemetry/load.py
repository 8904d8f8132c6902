"""Reading a run back from a trace JSON or a metrics JSON Lines file (the inverse of ``export.py``).

Every problem with the file (missing, empty, not JSON, truncated, another tool's trace, a newer
format) raises one ``ValueError`` that names the file and the problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .export import FORMAT_VERSION, METRICS_FORMAT, OUR_PIDS, TRACE_FORMAT
from .records import RequestEvent, StepRecord
from .serialize import event_from_dict, step_from_dict

Loaded = tuple[list[StepRecord], list[RequestEvent], dict[str, Any], list[dict[str, Any]]]


class RunFileError(ValueError):
    """A file that is not a readable kvscope run (a ``ValueError``)."""


def read_run_file(path: str | os.PathLike) -> Loaded:
    """(records, events, meta, profiler_events) from a kvscope trace or metrics file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RunFileError(f"{path}: is a folder, not a kvscope trace or metrics file") from None
    except UnicodeDecodeError:
        raise RunFileError(
            f"{path}: not a text file (a kvscope trace is JSON, a metrics file JSON Lines)"
        ) from None
    if not text.strip():
        raise RunFileError(f"{path}: the file is empty")
    first_line = text.lstrip().split("\n", 1)[0]
    try:
        head = json.loads(first_line)
    except json.JSONDecodeError:
        head = None
    try:
        if isinstance(head, dict) and head.get("type") == "header":
            return _read_metrics(path, text)
        return _read_trace(path, text)
    except RunFileError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        # malformed records inside an otherwise kvscope-shaped file (found by fuzzing)
        raise RunFileError(f"{path}: a damaged kvscope file ({type(exc).__name__}: {exc})") from None


def _check_format(path: Path, found: Any, version: Any, expected: str) -> None:
    if found != expected:
        raise RunFileError(f"{path}: format {found!r} is not {expected!r}; not written by kvscope")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RunFileError(
            f"{path}: format version {version!r} is newer than this kvscope reads ({FORMAT_VERSION}); upgrade kvscope"
        )


_INT_META = (
    "t0_ns",
    "prefix_cache_queries_before",
    "prefix_cache_hits_before",
    "kv_bytes_per_token",
    "kv_bytes_per_block",
    "num_blocks",
    "block_size",
    "max_model_len",
    "weights_bytes",
    "kv_pool_bytes",
    "num_steps_dropped",
)


def _checked_meta(meta: Any) -> dict[str, Any]:
    """The run metadata, with the fields that are computed on checked for type (found by fuzzing)."""
    if not isinstance(meta, dict):
        raise TypeError(f"meta is a {type(meta).__name__}, not an object")
    for key in _INT_META:
        value = meta.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"meta {key}={value!r} should be an integer")
    texts = meta.get("texts")
    if texts is not None and not (
        isinstance(texts, dict)
        and all(isinstance(t, dict) and all(v is None or isinstance(v, str) for v in t.values())
                for t in texts.values())  # None: a token-id prompt (live.py writes it so)
    ):
        raise TypeError("meta texts should map request ids to {prompt, output} strings")
    return meta


def _read_metrics(path: Path, text: str) -> Loaded:
    lines = text.splitlines()
    records: list[StepRecord] = []
    events: list[RequestEvent] = []
    meta: dict[str, Any] = {}
    end = None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            last = i == len(lines) or not any(s.strip() for s in lines[i:])
            why = "truncated (its last line is cut off)" if last else f"line {i} is not JSON ({exc.msg})"
            raise RunFileError(f"{path}: {why}") from None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if i == 1:
            _check_format(path, obj.get("format"), obj.get("version"), METRICS_FORMAT)
            meta = _checked_meta(obj.get("meta") or {})
        elif kind == "step":
            records.append(step_from_dict(obj))
        elif kind == "event":
            events.append(event_from_dict(obj))
        elif kind == "end":
            end = obj
        else:
            raise RunFileError(f"{path}: line {i} has unknown type {kind!r}")
    if end is None:
        raise RunFileError(
            f"{path}: truncated (no end line after {len(records)} steps and {len(events)} events)"
        )
    if end.get("num_steps") != len(records) or end.get("num_events") != len(events):
        raise RunFileError(
            f"{path}: damaged: the end line announces {end.get('num_steps')} steps and {end.get('num_events')} "
            f"events but the file holds {len(records)} and {len(events)}"
        )
    records.sort(key=lambda r: r.step)
    return records, events, meta, []


def _read_trace(path: Path, text: str) -> Loaded:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        # a cut inside a string reports where the string starts, but it ran to the end all the same
        at_end = exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")
        why = (
            "truncated JSON (it ends before the document closes)"
            if at_end
            else f"not valid JSON ({exc.msg} at line {exc.lineno})"
        )
        raise RunFileError(
            f"{path}: {why}; expected a kvscope trace (.json) or metrics file (.jsonl)"
        ) from None
    if not isinstance(obj, dict):
        raise RunFileError(
            f"{path}: JSON {type(obj).__name__}, not a kvscope trace (an object with 'traceEvents' and 'kvscope')"
        )
    data = obj.get("kvscope")
    if not isinstance(data, dict):
        what = (
            "a Chrome/Perfetto trace from another tool" if "traceEvents" in obj else "JSON from another tool"
        )
        raise RunFileError(
            f"{path}: {what} (no 'kvscope' key); kvscope.load reads the traces and metrics kvscope writes"
        )
    _check_format(path, data.get("format"), data.get("version"), TRACE_FORMAT)
    records = [step_from_dict(d) for d in data.get("records", [])]
    events = [event_from_dict(d) for d in data.get("events", [])]
    meta = _checked_meta(data.get("meta") or {})
    off = meta.get("t0_ns", 0) / 1000
    profiler = [
        {**e, "ts": e["ts"] + off} if "ts" in e else e
        for e in obj.get("traceEvents", [])
        if isinstance(e, dict) and e.get("pid") not in OUR_PIDS
    ]
    return records, events, meta, profiler
