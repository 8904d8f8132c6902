"""Reading a run back from a trace JSON or a metrics JSON Lines file (the inverse of ``export.py``).

Every problem with the file (missing, empty, not JSON, truncated, another tool's trace, a newer
format; hostile JSON: nested too deeply, numbers beyond 64 bits or out of range, NaN, a file too large for
the memory) raises one ``ValueError`` that names the file and the problem, never a ``RecursionError``,
``OverflowError`` or ``MemoryError``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.telemetry.export import FORMAT_VERSION, METRICS_FORMAT, TRACE_FORMAT
from kvscope.telemetry.invariants import check_invariants
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.telemetry.serialize import event_from_dict, step_from_dict
from kvscope.telemetry.trace import is_our_pid

Loaded = tuple[list[StepRecord], list[RequestEvent], dict[str, Any], list[dict[str, Any]]]


class RunFileError(ValueError):
    """A file that is not a readable kvscope run (a ``ValueError``)."""


class _Hostile(ValueError):
    """A JSON value no kvscope file holds (raised by the parser's hooks)."""


def _parse_int(text: str) -> int:
    if len(text) > 21:  # before int(): it refuses 4,300+ digits with an error of its own
        raise _Hostile(f"an integer of {len(text):,} digits")
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise _Hostile(f"an integer beyond 64 bits ({text})")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Hostile(f"a number out of range ({text[:30]})")
    return value


def _parse_constant(text: str) -> float:
    raise _Hostile(f"{text}, which is not JSON")


_DIGITS_AS_ZERO = str.maketrans("123456789", "0" * 9)
_LONG_RUN = "0" * 19  # 2**63 has 19 digits: a text without a run of 19 holds no integer beyond 64 bits
_SCAN_CHUNK = 1 << 20


def may_hold_long_integers(text: str) -> bool:
    """Whether ``text`` has a run of 19 digits anywhere (then an integer in it may be beyond 64 bits). In chunks
    (overlapping by 18 characters), each with its digits made zeros: C passes, several times faster than a
    regular expression over a metrics file."""
    step = _SCAN_CHUNK
    return any(_LONG_RUN in text[i:i + step + len(_LONG_RUN) - 1].translate(_DIGITS_AS_ZERO)
               for i in range(0, len(text), step))


def parse_json(text: str, long_integers: bool | None = None) -> Any:
    """``json.loads`` that refuses what kvscope never writes: NaN / Infinity, numbers beyond 64 bits or
    out of a float's range (``_Hostile``). A text with no run of 19 digits holds no integer ``_parse_int``
    could refuse, so its integers are left to json's C scanner (a Python call per integer cost a metrics
    file of prompt token ids most of its load time); the others go through ``_parse_int``. ``long_integers``:
    ``may_hold_long_integers(text)`` if known (``False`` for a line of a file that has no such run)."""
    if long_integers is None:
        long_integers = may_hold_long_integers(text)
    if not long_integers:
        return json.loads(text, parse_float=_parse_float, parse_constant=_parse_constant)
    return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)


# Python objects take about 15 (metrics) to 26 (trace) bytes per byte of JSON read; a file that would need
# more than the memory available is refused before it is read.
MEMORY_PER_BYTE = 16


def read_run_file(path: str | os.PathLike) -> Loaded:
    """(records, events, meta, profiler_events) from a kvscope trace or metrics file."""
    path = Path(path)
    try:
        loaded = _read(path)
    except RunFileError:
        raise
    except Exception as exc:
        problem = next((why(exc) for kinds, why in _PROBLEMS if isinstance(exc, kinds)), None)
        if problem is None:
            raise
        raise RunFileError(f"{path}: {problem}") from None
    try:
        check_invariants(loaded[0], loaded[1])
    except ValueError as exc:
        raise RunFileError(f"{path}: records that contradict each other: {exc}") from None
    return loaded


# What an error met while reading a file says about the file: the first entry whose type matches (an error of
# none of these types is not the file's).
_PROBLEMS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], Callable[[Any], str]], ...] = (
    (FileNotFoundError, lambda exc: "no such file"),
    (IsADirectoryError, lambda exc: "is a folder, not a kvscope trace or metrics file"),
    (OSError, lambda exc: f"cannot read it ({exc.strerror or exc})"),
    (UnicodeDecodeError, lambda exc: "not a text file (a kvscope trace is JSON, a metrics file JSON Lines)"),
    (RecursionError, lambda exc: "JSON nested too deeply; not a kvscope trace or metrics file"),
    (MemoryError, lambda exc: "too large to load in the memory available"),
    (_Hostile, lambda exc: f"the file holds {exc}; not a kvscope trace or metrics file"),
    # malformed records inside an otherwise kvscope-shaped file (found by fuzzing)
    ((ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError),
     lambda exc: f"a damaged kvscope file ({type(exc).__name__}: {exc})"),
)


def _read(path: Path) -> Loaded:
    _check_size(path)
    data = path.read_bytes()  # bytes: no newline translation, so line numbers are the file's own
    text = data.decode("utf-8")
    del data
    if not text.strip():
        raise RunFileError(f"{path}: the file is empty")
    first_line = text.lstrip().split("\n", 1)[0]
    try:
        head = parse_json(first_line)
    except (ValueError, RecursionError):  # judged with the whole file below
        head = None
    if isinstance(head, dict) and head.get("type") == "header":
        return _read_metrics(path, text)
    return _read_trace(path, text)


def _check_size(path: Path) -> None:
    """Refuse a file whose objects would not fit in memory, before reading it (pipes have no size: 0)."""
    try:
        size = path.stat().st_size
    except OSError:  # reading it says why
        return
    if size * MEMORY_PER_BYTE < 1 << 30:  # small: no need to ask the system
        return
    from kvscope.utils.host import available_memory
    from kvscope.utils.units import fmt_bytes

    available = available_memory()
    if size * MEMORY_PER_BYTE > available.bytes:
        raise RunFileError(
            f"{path}: {fmt_bytes(size)} is too large to load here: reading it takes about "
            f"{fmt_bytes(size * MEMORY_PER_BYTE)}, and {available}"
        )


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
    "window_freed_blocks_before",
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
                for t in texts.values())  # None: a token-id prompt (kvscope/runs/background/live.py writes it so)
    ):
        raise TypeError("meta texts should map request ids to {prompt, output} strings")
    return meta


def _read_metrics(path: Path, text: str) -> Loaded:
    lines = text.split("\n")  # not splitlines(): a line is what ends at \\n, as the writer wrote it
    records: list[StepRecord] = []
    events: list[RequestEvent] = []
    meta: dict[str, Any] = {}
    end = None
    long_integers = None if may_hold_long_integers(text) else False  # None: each line decides for itself
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = parse_json(line, long_integers)
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
        obj = parse_json(text)
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
        if isinstance(e, dict) and not is_our_pid(e.get("pid"))
    ]
    return records, events, meta, profiler
