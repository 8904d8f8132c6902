"""A run built from hand-made steps and events, with no ``Engine``: the recorder's API is all a source
(another scheduler, a real server) needs. The records, the page map (from hand-made block-pool events)
and the exported trace and metrics are checked, and the files load back with ``kvscope.load``."""

from __future__ import annotations

import pytest

import kvscope
from kvscope.runs.result.run import Run
from kvscope.telemetry.inputs import BatchSummary, RequestProgress, SchedulerStats, StepTimings
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import PageEntry, ScheduledItem, StepRecord

BS, NUM_BLOCKS = 4, 6
META = {
    "model": "hand-made",
    "block_size": BS,
    "num_blocks": NUM_BLOCKS,
    "kv_bytes_per_token": 64,
    "kv_bytes_per_block": 64 * BS,
    "max_model_len": 32,
}


class HandSource:
    """A stand-in for a scheduler that is not kvscope's: it speaks only the recorder's API."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.step = recorder, 0

    def pool(self, *events: tuple[str, int]) -> None:
        for kind, block_id in events:
            self.recorder.block_event(kind, block_id)

    def event(self, kind: str, rid: str, prompt: int, out: int = 0, **kw) -> None:
        self.recorder.request_event(kind, rid, self.step, prompt, out, **kw)

    def step_done(self, t0: int, scheduled, tables, stats, admitted=(), preempted=(), finished=0) -> StepRecord:
        batch = BatchSummary(self.step, scheduled, tables, list(admitted), list(preempted), finished)
        timings = StepTimings(t0, t0 + 100, t0 + 200, t0 + 500, t0 + 600, t0 + 700)
        record = self.recorder.record_step(batch, timings, stats)
        self.step += 1
        return record


def stats(running, waiting, used, cached_free, stored, queries, hits) -> SchedulerStats:
    return SchedulerStats(running, waiting, NUM_BLOCKS, used, cached_free, stored, queries, hits, 0)


def item(rid, kind, n, ctx, sampled=True) -> ScheduledItem:
    return ScheduledItem(rid, kind, n, ctx, sampled)


@pytest.fixture(scope="module")
def handmade():
    """Three requests on a 6-block pool: a (6-token prompt) and b (3) prefill together; b finishes;
    c shares a's first block (a prefix hit); a is preempted and resumed from the cache; c stops; a
    is aborted between steps (a state record)."""
    rec = Recorder(dict(META))
    src = HandSource(rec)
    src.event("queued", "a", 6, t_ns=900)
    src.event("queued", "b", 3, t_ns=950)
    # step 0: a takes blocks 0-1 (block 0 full, so cached), b takes block 2
    src.pool(("allocated", 0), ("allocated", 1), ("cached", 0), ("allocated", 2))
    src.event("first_token", "a", 6, 1)
    src.event("first_token", "b", 3, 1)
    src.step_done(1000, [item("a", "prefill", 6, 6), item("b", "prefill", 3, 3)], [[0, 1], [2]],
                  stats(2, 0, 3, 0, 9, 9, 0), admitted=[RequestProgress("a", 6, 0), RequestProgress("b", 3, 0)])
    # step 1: both decode; b's block fills (cached) and b finishes at its length: block 2 is freed
    src.pool(("cached", 2), ("freed", 2))
    src.event("finished", "b", 3, 2, reason="length")
    src.step_done(2000, [item("a", "decode", 1, 7), item("b", "decode", 1, 4)], [[0, 1], []],
                  stats(1, 0, 2, 1, 7, 9, 0), finished=1)
    # step 2: c arrives, finds a's block 0 in the cache (hit) and takes block 3; a fills block 1
    src.event("queued", "c", 5, t_ns=2800)
    src.pool(("cached", 1), ("hit", 0), ("allocated", 3))
    src.event("first_token", "c", 5, 1)
    src.step_done(3000, [item("a", "decode", 1, 8), item("c", "prefill", 1, 5)], [[0, 1], [0, 3]],
                  stats(2, 0, 3, 1, 9, 14, 4), admitted=[RequestProgress("c", 5, 0, 4)])
    # step 3: a is preempted (blocks freed tail first: 1 stays cached, 0 is still c's); c decodes
    src.pool(("freed", 1), ("released", 0))
    src.step_done(4000, [item("c", "decode", 1, 6)], [[0, 3]], stats(1, 1, 2, 2, 6, 14, 4),
                  preempted=[RequestProgress("a", 6, 3)])
    # step 4: a resumes from the cache (blocks 0 and 1) plus block 4; c stops and lets go of 3 and 0
    src.pool(("hit", 0), ("hit", 1), ("allocated", 4), ("freed", 3), ("released", 0))
    src.event("finished", "c", 5, 2, reason="stop")
    src.step_done(5000, [item("c", "decode", 1, 7), item("a", "prefill", 1, 9)], [[], [0, 1, 4]],
                  stats(1, 0, 3, 1, 9, 23, 12), admitted=[RequestProgress("a", 6, 3, 8)], finished=1)
    # between steps: a is aborted; its blocks go back (0 and 1 stay cached), then a state record
    src.pool(("freed", 4), ("freed", 1), ("freed", 0))
    src.event("finished", "a", 6, 4, reason="abort", t_ns=6000)
    after = stats(0, 0, 0, 3, 0, 23, 12)
    assert rec.state_changed(after)
    rec.record_step(BatchSummary(src.step), StepTimings.instant(6100), after)
    assert not rec.state_changed(after)  # recorded: nothing new
    return rec, Run(*rec.snapshot())


def pages(run: Run, step: int) -> dict[int, tuple]:
    """The page map after ``step`` as {block: (owner, filled, state, refs)}, free blocks left out."""
    return {b: tuple(e) for b, e in enumerate(run.page_map_at(step)) if e.state != "free"}


def test_records_follow_the_hand_made_steps(handmade):
    _, run = handmade
    r = run.records
    assert [x.step for x in r] == [0, 1, 2, 3, 4, 5]
    assert [(x.num_prefill_seqs, x.num_prefill_tokens, x.num_decode_seqs, x.num_decode_tokens) for x in r] == [
        (2, 9, 0, 0), (0, 0, 2, 2), (1, 1, 1, 1), (0, 0, 1, 1), (1, 1, 1, 1), (0, 0, 0, 0)]
    assert [x.num_output_tokens for x in r] == [2, 2, 2, 1, 2, 0]
    assert [(x.num_running, x.num_waiting, x.num_preempted, x.num_finished) for x in r] == [
        (2, 0, 0, 0), (1, 0, 0, 1), (2, 0, 0, 0), (1, 1, 1, 0), (1, 0, 0, 1), (0, 0, 0, 0)]
    assert [(x.schedule_ns, x.prepare_ns, x.forward_ns, x.sample_ns, x.update_ns) for x in r[:5]] == [
        (100, 100, 300, 100, 100)] * 5
    assert r[5].duration_ns == 0 and r[5].scheduled == []
    kv = r[0].kv  # 9 tokens in 3 blocks of 4
    assert (kv.blocks_used, kv.tokens_stored, kv.fragmentation, kv.block_usage) == pytest.approx(
        (3, 9, 1 - 9 / 12, 3 / 6))
    assert kv.static_reservation_bytes == 2 * 32 * 64 and kv.paged_bytes == 3 * 4 * 64
    assert [x.kv.blocks_cached_free for x in r] == [0, 1, 1, 2, 1, 3]
    assert all(x.memory == {} for x in r)  # no memory probe given


def test_page_map_from_hand_made_pool_events(handmade):
    rec, run = handmade
    assert run.records[0].page_map_full and len(run.records[0].page_map) == NUM_BLOCKS
    a_used, b_cached = PageEntry("a", 4, "used", 1), PageEntry("b", 4, "cached", 0)  # as most steps leave them
    assert pages(run, 0) == {0: a_used, 1: PageEntry("a", 2, "used", 1), 2: PageEntry("b", 3, "used", 1)}
    assert pages(run, 1) == {0: a_used, 1: PageEntry("a", 3, "used", 1), 2: b_cached}
    assert set(run.records[1].page_map) == {1, 2}  # a diff names only what changed
    assert pages(run, 2) == {0: PageEntry("a", 4, "shared", 2), 1: a_used, 2: b_cached, 3: PageEntry("c", 1, "used", 1)}
    # preempted, a lets go: c, the next holder, owns block 0; block 1 keeps a's tokens, cached
    assert pages(run, 3) == {0: PageEntry("c", 4, "used", 1), 1: PageEntry("a", 4, "cached", 0), 2: b_cached,
                             3: PageEntry("c", 2, "used", 1)}
    assert pages(run, 4) == {0: a_used, 1: a_used, 2: b_cached, 4: PageEntry("a", 1, "used", 1)}
    assert pages(run, 5) == {0: PageEntry("a", 4, "cached", 0), 1: PageEntry("a", 4, "cached", 0), 2: b_cached}
    assert run.page_map_at(5) == rec.pages.entries
    assert rec.pages.tables == {} and rec.pages.holders == {}  # every request ended


def test_request_events_and_metrics(handmade):
    _, run = handmade
    kinds = [(e.request_id, e.kind) for e in run.events]
    assert kinds == [
        ("a", "queued"), ("b", "queued"), ("a", "scheduled"), ("b", "scheduled"), ("a", "first_token"),
        ("b", "first_token"), ("b", "finished"), ("c", "queued"), ("c", "scheduled"), ("c", "first_token"),
        ("a", "preempted"), ("a", "resumed"), ("c", "finished"), ("a", "finished")]
    by = {(e.request_id, e.kind): e for e in run.events}
    assert by["a", "scheduled"].t_ns == 1100 and by["a", "first_token"].t_ns == 1700  # end of scheduling / step
    assert by["b", "finished"].t_ns == 2700 and by["b", "finished"].reason == "length"
    assert by["c", "scheduled"].num_cached_tokens == 4 and by["a", "resumed"].num_cached_tokens == 8
    assert (by["a", "preempted"].t_ns, by["a", "preempted"].step, by["a", "resumed"].step) == (4100, 3, 4)
    assert by["a", "finished"].reason == "abort" and by["a", "finished"].step == 5
    req = run.requests.set_index("request_id")
    assert req.loc["a", "ttft_s"] == pytest.approx((1700 - 900) / 1e9)
    assert req.loc["c", "finish_reason"] == "stop" and req.loc["a", "num_preemptions"] == 1
    summary = run.summary()
    assert summary["requests"] == 3 and summary["preemptions"] == 1
    assert summary["prefix_cache_hit_rate"] == pytest.approx(12 / 23)


@pytest.mark.parametrize("name", ["run.json", "run.jsonl"])
def test_exports_load_back(handmade, tmp_path, name):
    _, run = handmade
    path = run.save_trace(tmp_path / name) if name.endswith(".json") else run.save_metrics(tmp_path / name)
    back = kvscope.load(path)
    assert back.records == run.records and back.events == run.events
    assert back.meta["model"] == "hand-made" and back.meta["num_blocks"] == NUM_BLOCKS
    assert back.page_map_at(4) == run.page_map_at(4)
    assert back.summary()["prefix_cache_hit_rate"] == pytest.approx(run.summary()["prefix_cache_hit_rate"])


def test_telemetry_loads_without_the_engine():
    """Importing the recorder, page map, probes and profiler pulls in no engine-layer module."""
    import subprocess
    import sys

    code = (
        "import sys, kvscope.telemetry.recorder, kvscope.telemetry.profiler\n"
        "engine = ['kvscope.' + m for m in ('engine', 'scheduler', 'runner', 'block_pool', 'kv_cache_manager',"
        " 'request', 'engine_telemetry')]\n"
        "print(sorted(m for m in engine if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
