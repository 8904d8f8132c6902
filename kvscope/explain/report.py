"""What ``kvscope explain`` shows of the prefix-cache rows: run totals, the top divergence points, the text
around a divergence (when a tokenizer is known), a DataFrame, the JSON document and the printed table.

A ``decode`` argument is any ``list[int] -> str`` (a tokenizer's ``decode``); without one, the run's own prompt
texts (``meta["texts"]``, where its prompts were text) are split where the two texts first differ
(``split_texts``), and only where it has none, token ids are shown.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pandas as pd

from kvscope.explain.prefix import MISS_CAUSES, PrefixMiss

Decode = Callable[[list[int]], str]
CONTEXT_TOKENS = 6  # tokens shown on each side of a divergence
CONTEXT_CHARS = 30  # characters shown on each side of a divergence of two texts


def split_text(tokens: list[int], at: int, decode: Decode | None, width: int = CONTEXT_TOKENS) -> str:
    """``...before|after...`` around token ``at`` of ``tokens``."""
    before, after = tokens[max(0, at - width) : at], tokens[at : at + width]
    show = decode or (lambda ids: " ".join(map(str, ids)) + (" " if ids else ""))
    left = ("..." if at > width else "") + show(before)
    right = show(after) + ("..." if at + width < len(tokens) else "")
    return f"{left}|{right}"


def split_texts(a: str, b: str, width: int = CONTEXT_CHARS) -> tuple[str, str] | None:
    """``...before|after...`` of each of two texts around their first differing character; None where they do
    not differ (the tokens differ elsewhere: a template, special tokens)."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if a == b:
        return None

    def side(t: str) -> str:
        return (("..." if at > width else "") + t[max(0, at - width) : at] + "|" + t[at : at + width]
                + ("..." if at + width < len(t) else ""))

    return side(a), side(b)


def add_text(rows: list[dict[str, Any]], prompts: dict[str, list[int]], decode: Decode | None,
             texts: dict[str, str] | None = None) -> None:
    """Give each diverged row ``text`` (its side of the divergence) and ``text_from`` (the earlier request's):
    decoded tokens with ``decode``; else the prompts' own ``texts`` (request id -> prompt text) where both have
    one; else token ids."""
    for row in rows:
        at, other = row.get("diverged_at"), row.get("diverged_from")
        if at is None or other is None:
            row["text"] = row["text_from"] = None
            continue
        rid = row["request_id"]
        pair = split_texts(texts[rid], texts[other]) if decode is None and texts and rid in texts and \
            other in texts else None
        if pair is not None:
            row["text"], row["text_from"] = pair
            continue
        row["text"] = split_text(prompts[rid], at, decode)
        row["text_from"] = split_text(prompts[other], at, decode)


def row_dicts(rows: list[PrefixMiss]) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts (no NaN: unknown values are None)."""
    return [{**asdict(r), "num_missed_tokens": r.num_missed_tokens} for r in rows]


def totals(rows: list[PrefixMiss]) -> dict[str, Any]:
    """Tokens hit, reusable and missed (by cause) over the run, and requests per cause."""
    missed = {cause: 0 for cause in MISS_CAUSES}
    requests = {cause: 0 for cause in MISS_CAUSES}
    for r in rows:
        if r.miss_cause is not None:
            missed[r.miss_cause] += r.num_missed_tokens
            requests[r.miss_cause] += 1
    return {
        "num_requests": len(rows),
        "prompt_tokens": sum(r.num_prompt_tokens for r in rows),
        "tokens_hit": sum(r.num_cached_tokens for r in rows),
        "tokens_reusable": sum(r.num_reusable_tokens for r in rows),
        "tokens_missed": sum(r.num_missed_tokens for r in rows),
        "tokens_missed_by_cause": missed,
        "requests_by_cause": requests,
    }


def top_divergences(rows: list[dict[str, Any]], n: int = 5) -> list[dict[str, Any]]:
    """The token indices where most requests split from an earlier one, with an example's text."""
    counts = Counter(r["diverged_at"] for r in rows if r.get("diverged_at") is not None)
    out = []
    for at, count in counts.most_common(n):
        example = next(r for r in rows if r.get("diverged_at") == at)
        out.append(
            {
                "diverged_at": at,
                "num_requests": count,
                "request_id": example["request_id"],
                "diverged_from": example["diverged_from"],
                "text": example.get("text"),
                "text_from": example.get("text_from"),
            }
        )
    return out


def misses_frame(rows: list[PrefixMiss]) -> pd.DataFrame:
    """One row per request (columns: the ``PrefixMiss`` fields and ``num_missed_tokens``), in arrival order."""
    columns = [*PrefixMiss.__dataclass_fields__, "num_missed_tokens"]
    frame = pd.DataFrame(row_dicts(rows), columns=columns)
    for name in ("diverged_at", "lookup_step", "evicted_at_step", "num_waiting"):
        frame[name] = frame[name].astype("Int64")  # ints with nulls (not floats with NaN)
    for name in ("miss_cause", "diverged_from"):
        frame[name] = frame[name].astype(object).where(frame[name].notna(), None)
    return frame


def explain_document(rows: list[dict[str, Any]], queries: int, hits: int, **extra: Any) -> dict[str, Any]:
    """What ``kvscope explain --json`` writes."""
    return {"prefix_cache_queries": int(queries), "prefix_cache_hits": int(hits), **extra, "requests": rows}


def format_report(
    summary: dict[str, Any], top: list[dict[str, Any]], queries: int, hits: int, title: str = "prefix cache"
) -> str:
    """The printed table: hit rate, tokens by cause, the top divergence points."""
    rate = f"{hits / queries:.1%}" if queries else "n/a"
    lines = [f"{title}: {hits} of {queries} prompt tokens hit ({rate})"]
    if "tokens_hit" in summary:  # a run: its requests' first lookups (the counters also count re-lookups)
        first = summary["tokens_hit"]
        lines.append(
            f"first lookups: {first} of {summary['prompt_tokens']} hit, {summary['tokens_reusable']} "
            f"reusable, {summary['tokens_missed']} missed, over {summary['num_requests']} requests"
        )
    if summary.get("requests_by_cause"):
        lines += ["", f"{'cause':<12}{'requests':>10}{'tokens missed':>16}"]
        for cause in MISS_CAUSES:
            lines.append(
                f"{cause:<12}{summary['requests_by_cause'].get(cause, 0):>10}"
                f"{summary['tokens_missed_by_cause'].get(cause, 0):>16}"
            )
    if top:
        lines += ["", "top divergence points (token index: requests, example)"]
        for d in top:
            lines.append(
                f"  token {d['diverged_at']}: {d['num_requests']} requests, "
                f"{d['request_id']} vs {d['diverged_from']}"
            )
            if d.get("text") is not None:
                lines.append(f"      {d['text']!r}")
                lines.append(f"      {d['text_from']!r}  ({d['diverged_from']})")
    return "\n".join(lines)


def read_explain(path: str) -> dict[str, Any]:
    """A file ``kvscope explain --json`` wrote (``ValueError`` naming the file otherwise)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a kvscope explain file ({exc})") from None
    if not isinstance(doc, dict) or not {"prefix_cache_queries", "prefix_cache_hits", "requests"} <= set(doc):
        raise ValueError(f"{path}: not a kvscope explain file (no prefix_cache_queries / hits / requests)")
    return doc
