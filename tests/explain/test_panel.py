"""The "prefix-cache misses by cause" and "why requests waited" panels: what they draw for a run with an
eviction, one request at a time; hidden without prompts or reasons; in the HTML report."""

from __future__ import annotations

import pytest

from kvscope import Engine, SamplingParams
from kvscope.explain.waits import queue_times
from kvscope.runs.result.run import Run
from kvscope.telemetry.records import RequestEvent
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.prefix_misses import KINDS, PrefixMissesPanel
from kvscope.widgets.panels.queue_reasons import QueueReasonsPanel


def tokens(start: int, n: int) -> list[int]:
    return [3 + (start + i) % 500 for i in range(n)]


@pytest.fixture(scope="module")
def run() -> Run:
    engine = Engine("tiny", num_blocks=12, block_size=4, max_num_seqs=1)
    a = tokens(0, 13)
    engine.generate(
        [a, a, *[tokens(100 * (i + 1), 13) for i in range(4)], [*a[:12], 499]],
        SamplingParams(max_tokens=1, ignore_eos=True),
    )
    return Run.from_engine(engine)


def test_bars_by_cause(run):
    panel = PrefixMissesPanel({**run.meta, "t0_ns": run.t0_ns})
    half = len(run.records) // 2
    panel.update(Tick(run.records[:half], [e for e in run.events if e.step < half]))
    assert panel.model.visible  # the first tick computes at once
    panel.update(Tick(run.records[half:], [e for e in run.events if e.step >= half], final=True))
    data = dict(zip(panel.source.data["kind"], panel.source.data["tokens"]))
    assert list(panel.source.data["kind"]) == list(KINDS)
    # the copy hits 12 of A's tokens; the last request misses 12 to the eviction; 7 x 13 prompt tokens in all
    assert (data["hit"], data["evicted"], data["in_flight"]) == (12, 12, 0)
    assert data["not reusable"] == 7 * 13 - 24
    assert "most requests diverge at token" in panel.div.text and "Prefix cache" in panel.div.text


def test_hidden_without_prompts():
    panel = PrefixMissesPanel({"block_size": 4})
    panel.update(
        Tick([], [RequestEvent(1, 0, "r", "queued", 5), RequestEvent(2, 0, "r", "scheduled", 5)], final=True)
    )
    assert not panel.model.visible


def test_in_the_report(run, tmp_path):
    page = run.save_html(tmp_path / "run.html").read_text()
    assert "Prefix-cache misses by cause" in page and "Why requests waited" in page


def test_queue_reasons_panel(run):
    panel = QueueReasonsPanel({**run.meta, "t0_ns": run.t0_ns})
    panel.update(Tick(run.records, run.events, final=True))
    data = dict(zip(panel.source.data["reason"], panel.source.data["seconds"]))
    assert panel.model.visible and data["max_num_seqs"] > 0  # one request at a time: the rest waited for it
    assert data["no_free_blocks"] == data["preempted"] == data["unknown"] == 0
    assert sum(data.values()) == pytest.approx(sum(r.queue_s for r in queue_times(run.records, run.events)))
    assert "tokens recomputed</b> 0" in panel.div.text
    hidden = QueueReasonsPanel({"block_size": 4})
    hidden.update(
        Tick([], [RequestEvent(1, 0, "r", "queued", 5), RequestEvent(2, 0, "r", "scheduled", 5)], final=True)
    )
    assert not hidden.model.visible
