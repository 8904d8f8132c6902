"""Records to JSON-ready dicts and back, losslessly (the format of both export files).

A step is a flat dict of its scalar fields plus ``scheduled`` (a list of
``[request_id, kind, num_tokens, context_len, sampled]``), ``kv`` (a dict of ``KVState``), ``page_map``
(``{"block_id": [owner, filled, state, refs]}``, JSON object keys being strings), ``page_map_full``,
``memory`` and ``profile``. An event is the flat dict of its fields.

Speculative decoding adds to a step, only where it happened (so other files are as before): two more
values to a ``scheduled`` item that had drafts (``num_draft_tokens, num_accepted_tokens``), and
``spec_decode`` (a dict of ``SpecDecodeStats``; its page map written like ``page_map``).
"""

from __future__ import annotations

import types
from dataclasses import MISSING, fields
from typing import Any, get_type_hints

from kvscope.telemetry.records import (
    KVState,
    PageEntry,
    RequestEvent,
    ScheduledItem,
    SpecDecodeStats,
    StepRecord,
)

_STEP_SCALARS = tuple(
    f.name for f in fields(StepRecord)
    if f.name not in ("scheduled", "kv", "page_map", "memory", "profile", "spec_decode")
)
# added later: written only when set, absent from older files
_STEP_OPTIONAL = ("wait_reason", "gc_ns", "attention_backend")
_SPEC_SCALARS = ("num_spec_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "propose_ns",
                 "draft_num_blocks", "draft_blocks_used", "draft_page_map_full")
_KV_FIELDS = tuple(f.name for f in fields(KVState))
_KV_DEFAULTS = {f.name for f in fields(KVState) if f.default is not MISSING}
_EVENT_FIELDS = tuple(f.name for f in fields(RequestEvent))


def _allowed_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Field name -> the JSON types it may hold (an ``int`` is fine for a ``float``; ``bool`` is no int)."""
    out = {}
    for name, hint in get_type_hints(cls).items():
        parts = hint.__args__ if isinstance(hint, types.UnionType) else (hint,)
        # list[int] checks as list (its items are checked where it is read)
        allowed = tuple(type(None) if p is None else getattr(p, "__origin__", p) for p in parts)
        out[name] = (*allowed, int) if float in allowed else allowed
    return out


_TYPES = {cls: _allowed_types(cls) for cls in (StepRecord, KVState, RequestEvent)}
_TYPES[SpecDecodeStats] = {k: v for k, v in _allowed_types(SpecDecodeStats).items() if k in _SPEC_SCALARS}


def _checked(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Refuse values of the wrong JSON type before they become records (found by fuzzing the loader)."""
    allowed = _TYPES[cls]
    for name, value in values.items():
        kinds = allowed.get(name)
        if kinds and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise TypeError(f"{name}={value!r} should be {' or '.join(k.__name__ for k in kinds)}")
    return values


def _page(entry: PageEntry) -> list:
    """A page-map entry: ``[owner, filled, state, refs]``, plus its KV group where it is not 0."""
    return list(entry) if entry.kv_group else list(entry[:4])


def _entry(values: list) -> PageEntry:
    """A page-map entry from 4 values, or 5 with the KV group (files of hybrid models)."""
    o, f, s, r, *group = values
    if len(group) > 1:
        raise ValueError(f"a page-map entry has {len(values)} values; 4 or 5 expected")
    return PageEntry(str(o), int(f), str(s), int(r), int(group[0]) if group else 0)


def step_to_dict(record: StepRecord) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(record, name) for name in _STEP_SCALARS}
    for name in _STEP_OPTIONAL:
        if out[name] is None:
            del out[name]
    out["scheduled"] = [
        [s.request_id, s.kind, s.num_tokens, s.context_len, s.sampled]
        + ([s.num_draft_tokens, s.num_accepted_tokens] if s.num_draft_tokens else [])
        for s in record.scheduled
    ]
    kv = record.kv
    out["kv"] = {name: getattr(kv, name) for name in _KV_FIELDS}
    out["page_map"] = {str(b): _page(entry) for b, entry in record.page_map.items()}
    out["memory"] = dict(record.memory)
    out["profile"] = dict(record.profile) if record.profile is not None else None
    if record.spec_decode is not None:
        out["spec_decode"] = spec_to_dict(record.spec_decode)
    return out


def spec_to_dict(spec: SpecDecodeStats) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(spec, name) for name in _SPEC_SCALARS}
    out["num_draft_tokens_per_pos"] = list(spec.num_draft_tokens_per_pos)
    out["num_accepted_tokens_per_pos"] = list(spec.num_accepted_tokens_per_pos)
    out["draft_slots"] = {str(b): list(v) for b, v in spec.draft_slots.items()}
    out["freed_blocks"] = list(spec.freed_blocks)
    out["draft_page_map"] = {str(b): _page(entry) for b, entry in spec.draft_page_map.items()}
    return out


def spec_from_dict(d: dict[str, Any]) -> SpecDecodeStats:
    kwargs = _checked(SpecDecodeStats, {name: d[name] for name in _SPEC_SCALARS if name in d})
    kwargs["num_draft_tokens_per_pos"] = [int(x) for x in d.get("num_draft_tokens_per_pos", [])]
    kwargs["num_accepted_tokens_per_pos"] = [int(x) for x in d.get("num_accepted_tokens_per_pos", [])]
    kwargs["draft_slots"] = {int(b): [int(n), int(a)] for b, (n, a) in d.get("draft_slots", {}).items()}
    kwargs["freed_blocks"] = [int(b) for b in d.get("freed_blocks", [])]
    kwargs["draft_page_map"] = {
        int(b): _entry(values) for b, values in d.get("draft_page_map", {}).items()
    }
    return SpecDecodeStats(**kwargs)


def _item(values: list) -> ScheduledItem:
    """A ``scheduled`` entry: 5 values, or 7 with the drafts verified and accepted."""
    r, k, n, c, s, *spec = values
    if spec and len(spec) != 2:
        raise ValueError(f"a scheduled item has {len(values)} values; 5 or 7 expected")
    drafted, accepted = (int(spec[0]), int(spec[1])) if spec else (0, 0)
    return ScheduledItem(str(r), str(k), int(n), int(c), bool(s), drafted, accepted)


def step_from_dict(d: dict[str, Any]) -> StepRecord:
    try:
        kwargs = _checked(StepRecord, {name: d[name] for name in _STEP_SCALARS
                                       if name in d or name not in _STEP_OPTIONAL})
        kwargs["scheduled"] = [_item(values) for values in d["scheduled"]]
        kv = d["kv"]  # fields added later (num_window_freed_blocks) may be missing from older files
        kwargs["kv"] = KVState(**_checked(KVState, {name: kv[name] for name in _KV_FIELDS
                                                    if name in kv or name not in _KV_DEFAULTS}))
        kwargs["page_map"] = {
            int(b): _entry(values) for b, values in d["page_map"].items()
        }
        kwargs["memory"] = {str(k): int(v) for k, v in (d.get("memory") or {}).items()}
        profile = d.get("profile")
        kwargs["profile"] = {str(k): int(v) for k, v in profile.items()} if profile is not None else None
        spec = d.get("spec_decode")
        kwargs["spec_decode"] = spec_from_dict(spec) if spec is not None else None
    except (KeyError, TypeError, ValueError) as exc:
        step = d.get("step", "?") if isinstance(d, dict) else "?"
        raise ValueError(f"step record {step} is malformed ({type(exc).__name__}: {exc})") from None
    return StepRecord(**kwargs)


def event_to_dict(event: RequestEvent) -> dict[str, Any]:
    out = {name: getattr(event, name) for name in _EVENT_FIELDS}
    if out["prompt_token_ids"] is None:  # only queued events of an engine's run carry it
        del out["prompt_token_ids"]
    return out


def event_from_dict(d: dict[str, Any]) -> RequestEvent:
    try:
        event = RequestEvent(**_checked(RequestEvent, {name: d[name] for name in _EVENT_FIELDS if name in d}))
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"request event is malformed ({exc})") from None
    ids = event.prompt_token_ids
    if ids is not None and ids and not (set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < 1 << 63):
        raise ValueError(f"request event of {event.request_id!r} is malformed (prompt_token_ids must be "
                         "non-negative integers)")
    return event
