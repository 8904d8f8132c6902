"""Why requests waited: the scheduler's reason per step, each request's queue time split by reason, the tokens
recomputed after preemptions; the reasons survive the files."""

from __future__ import annotations

import pytest

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.explain.waits import queue_rows, queue_times, queue_totals
from kvscope.runs.result.run import Run

BS = 4


def tokens(start: int, n: int) -> list[int]:
    return [3 + (start + i) % 500 for i in range(n)]


def run_of(prompts: list[list[int]], max_tokens: int, **engine) -> Run:
    e = Engine("tiny", block_size=BS, **engine)
    e.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return Run.from_engine(e)


def check_split(rows) -> None:
    for row in rows:  # the parts add up to the queue time
        assert sum(row.by_reason.values()) == pytest.approx(row.queue_s, abs=1e-9)


def test_max_num_seqs():
    run = run_of([tokens(100 * i, 9) for i in range(3)], 4, num_blocks=64, max_num_seqs=1)
    assert {r.wait_reason for r in run.records if r.num_waiting} == {"max_num_seqs"}
    assert all(r.wait_reason is None for r in run.records if r.num_waiting == 0)
    rows = queue_times(run.records, run.events)
    check_split(rows)
    first, second, third = rows
    assert first.by_reason.get("max_num_seqs", 0) == 0
    assert (
        second.by_reason["max_num_seqs"] > 0
        and third.by_reason["max_num_seqs"] > second.by_reason["max_num_seqs"]
    )
    frame = run.queue_reasons()
    assert frame["queue_max_num_seqs_s"].tolist() == pytest.approx(
        [r.by_reason.get("max_num_seqs", 0) for r in rows]
    )


def test_token_budget():
    run = run_of([tokens(0, 40), tokens(100, 40)], 2, num_blocks=64, max_num_batched_tokens=16)
    assert "token_budget" in {r.wait_reason for r in run.records}
    rows = queue_times(run.records, run.events)
    check_split(rows)
    assert rows[1].by_reason["token_budget"] > 0 and "max_num_seqs" not in rows[1].by_reason


def test_preemption_no_free_blocks_and_recomputed_tokens():
    # 8 blocks of 4: two requests that grow to 8 + 12 tokens (5 blocks each) cannot both stay
    run = run_of([tokens(0, 8), tokens(100, 8)], 12, num_blocks=8)
    assert "no_free_blocks" in {r.wait_reason for r in run.records}
    rows = queue_times(run.records, run.events)
    check_split(rows)
    victim = next(r for r in rows if r.num_preemptions)
    assert victim.by_reason["preempted"] > 0
    preempted = next(e for e in run.events if e.kind == "preempted")
    resumed = next(e for e in run.events if e.kind == "resumed")
    context = max(
        i.context_len
        for r in run.records
        if r.step < preempted.step
        for i in r.scheduled
        if i.request_id == victim.request_id
    )
    assert victim.num_recomputed_tokens == context - resumed.num_cached_tokens > 0
    totals = queue_totals(rows)
    assert totals["num_preemptions"] == 1 and totals["num_recomputed_tokens"] == victim.num_recomputed_tokens
    assert totals["queue_s"] == pytest.approx(sum(r.queue_s for r in rows))
    flat = queue_rows(rows)
    assert flat[0]["queue_preempted_s"] >= 0 and set(flat[0]) >= {
        "queue_token_budget_s",
        "num_recomputed_tokens",
    }


def test_reasons_survive_the_files(tmp_path):
    run = run_of([tokens(100 * i, 9) for i in range(3)], 3, num_blocks=64, max_num_seqs=1)
    for path in (run.save_metrics(tmp_path / "r.metrics.jsonl"), run.save_trace(tmp_path / "r.trace.json")):
        loaded = kvscope.load(path)
        assert [r.wait_reason for r in loaded.records] == [r.wait_reason for r in run.records]
    assert all(
        "wait_reason" not in line or '"wait_reason": "max_num_seqs"' in line
        for line in (tmp_path / "r.metrics.jsonl").read_text().splitlines()
    )


def _walk(records, events) -> dict[str, dict[str, float]]:
    """Each first wait split step by step, as the split was computed before it read running sums (the reference)."""
    real = [r for r in records if r.t_end_ns > r.t_start_ns or r.scheduled]
    out: dict[str, dict[str, float]] = {}
    queued = {e.request_id: e.t_ns for e in events if e.kind == "queued"}
    for e in events:
        if e.kind != "scheduled" or e.request_id not in queued:
            continue
        a, b, parts = queued.pop(e.request_id), e.t_ns, {}

        def add(reason, ns, parts=parts):
            if ns > 0:
                parts[reason] = parts.get(reason, 0.0) + ns / 1e9

        later = [k for k, r in enumerate(real) if r.t_start_ns >= a]
        i = later[0] if later else len(real)
        done = min(real[i].t_start_ns if i < len(real) else b, b)
        add("step_in_progress", done - a)
        while i < len(real) and real[i].t_start_ns < b and real[i].step < e.step:
            end = min(real[i + 1].t_start_ns if i + 1 < len(real) else b, b)
            add(real[i].wait_reason or "unknown", end - real[i].t_start_ns)
            done, i = end, i + 1
        add("step_in_progress", b - done)
        out[e.request_id] = parts
    return out


def test_the_running_sums_split_as_a_walk_over_the_steps_does():
    run = run_of([tokens(40 * i, 12 + 3 * (i % 5)) for i in range(12)], 6, num_blocks=64, max_num_seqs=3,
                 max_num_batched_tokens=16)
    reasons = {r.wait_reason for r in run.records if r.wait_reason}
    assert len(reasons) >= 2, reasons  # several reasons, so the sums per reason are exercised
    walked = _walk(run.records, run.events)
    rows = {r.request_id: r for r in queue_times(run.records, run.events) if not r.num_preemptions}
    assert len(rows) >= 8 and any(len(parts) >= 3 for parts in walked.values())
    for rid, row in rows.items():
        assert row.by_reason.keys() == walked[rid].keys()
        for reason, seconds in walked[rid].items():
            assert row.by_reason[reason] == pytest.approx(seconds, rel=1e-12, abs=1e-15)
