"""Histogram buckets as the watch keeps them in ``meta["watch"]`` (``{"le": [...], "counts": [...]}``, "+Inf"
for the last bound) read defensively, added up across engines, and Prometheus' ``histogram_quantile`` on them
(an estimate: linear inside the bucket). Standard library only."""

from __future__ import annotations

import math
from typing import Any


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def buckets(h: Any) -> list[tuple[float, float]]:
    """A histogram of the watch dict (``{"le": [...], "counts": [...]}``, "+Inf" for the last bound)."""
    h = as_dict(h)
    les, counts = h.get("le"), h.get("counts")
    if not isinstance(les, list) or not isinstance(counts, list) or len(les) != len(counts):
        return []
    out = []
    for le, c in zip(les, counts):
        bound = math.inf if le == "+Inf" else le
        if not isinstance(bound, (int, float)) or not isinstance(c, (int, float)) or isinstance(c, bool):
            return []
        out.append((float(bound), float(c)))
    return out


def merged(hists: list[Any]) -> list[tuple[float, float]]:
    """Several engines' buckets added up (those with other bounds are left out)."""
    total: list[tuple[float, float]] = []
    for h in hists:
        b = buckets(h)
        if not b:
            continue
        if not total:
            total = b
        elif [le for le, _ in total] == [le for le, _ in b]:
            total = [(le, x + y) for (le, x), (_, y) in zip(total, b)]
    return total


def quantile(cumulative: list[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile`` (an estimate: linear inside the bucket)."""
    if not cumulative or cumulative[-1][1] <= 0:
        return math.nan
    rank, lower, below = q * cumulative[-1][1], 0.0, 0.0
    for le, c in cumulative:
        if c >= rank:
            if math.isinf(le):
                return lower
            return le if c == below else lower + (le - lower) * (rank - below) / (c - below)
        lower, below = le, c
    return lower
