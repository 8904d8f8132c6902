"""A run file whose records contradict each other is refused at load naming the record (issue 38 item 8), rather
than explained as "2399976 of 3799 hit" or "-999.759 s in the queue"."""

from __future__ import annotations

import json

import pytest
from telemetry_util import greedy, make_engine

from kvscope import Run
from kvscope.runs.result.run import load


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    engine = make_engine()
    engine.generate([[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 8, 9, 10, 11, 12, 14]], greedy(3))
    path = Run.from_engine(engine).save_metrics(tmp_path_factory.mktemp("inv") / "run.metrics.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def edited(tmp_path, lines, edit):
    docs = json.loads(json.dumps(lines))
    edit(docs)
    path = tmp_path / "edited.metrics.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def test_a_consistent_run_loads(tmp_path, lines):
    assert load(edited(tmp_path, lines, lambda docs: None)).records


def _more_hits(docs):
    step = next(d for d in docs if d.get("type") == "step")
    step["kv"]["prefix_cache_hits"] = 2_399_976


def _scheduled_early(docs):
    queued = next(d for d in docs if d.get("type") == "event" and d["kind"] == "queued")
    scheduled = next(d for d in docs if d.get("type") == "event" and d["kind"] == "scheduled"
                     and d["request_id"] == queued["request_id"])
    scheduled["t_ns"] = queued["t_ns"] - 999_759_000_000


def _backwards_step(docs):
    step = next(d for d in docs if d.get("type") == "step")
    step["t_end_ns"] = step["t_start_ns"] - 1


@pytest.mark.parametrize("edit, message", [
    (_more_hits, r"step 0 counts 2399976 prefix-cache hits of \d+ lookups"),
    (_scheduled_early, r"request '.*' is scheduled 999.759 s before it was queued"),
    (_backwards_step, r"step 0 ends before it starts"),
])
def test_contradictions_are_refused_naming_the_record(tmp_path, lines, edit, message):
    with pytest.raises(ValueError, match=f"records that contradict each other: {message}"):
        load(edited(tmp_path, lines, edit))
