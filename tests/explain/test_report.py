"""Totals, top divergence points, the text around a divergence, the JSON document and the printed table."""

from __future__ import annotations

import json

from kvscope.explain.prefix import PrefixMiss
from kvscope.explain.report import (
    add_text,
    explain_document,
    format_report,
    misses_frame,
    row_dicts,
    split_text,
    top_divergences,
    totals,
)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


ROWS = [
    PrefixMiss("a", 40, 0, 0),
    PrefixMiss("b", 40, 16, 32, "evicted", 33, "a"),
    PrefixMiss("c", 40, 24, 32, "in_flight", 33, "a"),
    PrefixMiss("d", 40, 0, 0, None, 5, "a"),
]


def test_a_timestamp_shows_at_the_token_where_it_differs():
    before = chars("System. Current time: 10:03 UTC. Be brief.")
    after = chars("System. Current time: 10:04 UTC. Be brief.")
    at = next(i for i, (x, y) in enumerate(zip(before, after)) if x != y)
    assert split_text(after, at, decode) == "...: 10:0|4 UTC...."  # 6 tokens each side
    assert split_text(before, at, decode) == "...: 10:0|3 UTC...."
    assert split_text([1, 2, 3], 1, None) == "1 |2 3 "  # no tokenizer: the ids


def test_totals_by_cause():
    t = totals(ROWS)
    assert (t["tokens_hit"], t["tokens_reusable"], t["tokens_missed"]) == (40, 64, 24)
    assert t["tokens_missed_by_cause"] == {"evicted": 16, "in_flight": 8, "cache_off": 0, "window": 0}
    assert t["requests_by_cause"]["evicted"] == 1


def test_top_divergences_and_the_document_has_no_nan():
    dicts = row_dicts(ROWS)
    prompts = {r.request_id: list(range(40)) for r in ROWS}
    add_text(dicts, prompts, None)
    top = top_divergences(dicts, 5)
    assert [(d["diverged_at"], d["num_requests"]) for d in top] == [(33, 2), (5, 1)]
    assert top[0]["request_id"] == "b" and "|" in top[0]["text"]
    doc = explain_document(dicts, 160, 40)
    text = json.dumps(doc, allow_nan=False)  # raises on NaN
    assert json.loads(text)["requests"][1]["miss_cause"] == "evicted"
    report = format_report(totals(ROWS), top, 160, 40)
    assert "40 of 160 prompt tokens hit (25.0%)" in report and "token 33: 2 requests" in report
    assert "first lookups: 40 of 160 hit, 64 reusable, 24 missed, over 4 requests" in report
    assert report.splitlines()[4].split() == ["evicted", "1", "16"]


def test_frame_columns():
    frame = misses_frame(ROWS)
    assert list(frame["num_missed_tokens"]) == [0, 16, 8, 0]
    assert frame["miss_cause"].tolist() == [None, "evicted", "in_flight", None]
