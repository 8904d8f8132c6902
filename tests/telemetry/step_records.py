"""Hand-made step records of a known duration (the slow-step tests: baseline, capture, panel)."""

from __future__ import annotations

from kvscope.telemetry.records import KVState, ScheduledItem, StepRecord


def step(i: int, ms: float, *, prefill: int = 0, decode: int = 4, t0_ns: int | None = None) -> StepRecord:
    """Step ``i`` taking ``ms`` milliseconds (all of it in forward), ``decode`` requests decoding one token each
    and one prefill chunk of ``prefill`` tokens."""
    start = i * 1_000_000_000 if t0_ns is None else t0_ns
    ns = round(ms * 1e6)
    items = [ScheduledItem(f"d{j}", "decode", 1, 20 + i, True) for j in range(decode)]
    if prefill:
        items.append(ScheduledItem("p", "prefill", prefill, prefill, True))
    kv = KVState(64, 4, 8, 0, 30, 0.1, 0.1, 0.0, 0, 0, 0, 0, 0)
    return StepRecord(i, start, start + ns, 0, 0, ns, 0, 0, int(bool(prefill)), prefill, decode, decode,
                      decode + bool(prefill), 0, 0, 0, decode, items, kv)


def steady(n: int, ms: float = 5.0, jitter: float = 0.2, start: int = 0) -> list[StepRecord]:
    """``n`` decode steps of ``ms`` +- ``jitter`` ms (a fixed zig-zag, no randomness)."""
    return [step(start + i, ms + jitter * ((i * 7) % 5 - 2) / 2) for i in range(n)]
