"""``SummaryStream`` keeps the summary of a whole run, record by record: it must equal the summary made
from the records and events at the end (the one a run inside the recorder's ring gets)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from kvscope.engine.engine import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload
from kvscope.telemetry.summary_stream import SummaryStream, counted_percentile


def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12)
    return a == b


@pytest.mark.parametrize("q", [0, 1, 37.5, 50, 99, 100])
def test_counted_percentile_is_numpys(q):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 20, size=301)
    assert counted_percentile(Counter(values.tolist()), q) == pytest.approx(np.percentile(values, q))


def test_stream_equals_the_end_summary_with_preemptions_and_hits():
    engine = Engine("tiny", num_blocks=40, max_num_seqs=12, max_num_batched_tokens=192)
    stream = SummaryStream(engine.recorder.baseline)
    engine.recorder.subscribe(stream.add)
    items = synthetic_workload(30, (8, 100), (2, 30), vocab_size=512, shared_prefix_len=40, seed=5,
                               exclude_ids=(0, 1, 2))
    live = LiveRun(engine, items, dashboard=False).start()
    live.wait()
    expected = live.run.summary()
    assert expected["preemptions"] > 0 and expected["prefix_cache_hits"] > 0
    got = stream.summary()
    assert list(got) == list(expected)
    assert {k for k in expected if not same(got[k], expected[k])} == set()


def test_a_run_past_the_ring_keeps_its_exact_summary(tmp_path):
    """A ring of 20 steps: the run's records are its last window, its summary still counts every request,
    and the files load back with it."""
    from kvscope.runs.result.run import load

    engine = Engine("tiny", num_blocks=64, max_num_seqs=4)
    engine.recorder.capacity = 20
    engine.recorder.clear()
    items = synthetic_workload(12, (8, 16), (8, 16), vocab_size=512, seed=1, exclude_ids=(0, 1, 2))
    live = LiveRun(engine, items, dashboard=False).start()
    live.wait()
    run = live.run
    assert len(run.records) == 20 and run.meta["num_steps_dropped"] > 0
    s = run.summary()
    assert s["requests"] == s["finished"] == 12
    assert s["output_tokens"] == sum(i.params.max_tokens for i in items)
    run.save_metrics(tmp_path / "m.jsonl")
    assert load(tmp_path / "m.jsonl").summary()["output_tokens"] == s["output_tokens"]
