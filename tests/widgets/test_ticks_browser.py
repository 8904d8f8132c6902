"""Every axis of the report and of the comparison (the sweep's page too) reads at every range: in
headless Chromium, BokehJS computes each axis's ticks and labels for hand-made runs whose numbers are
tiny (0.1% of the pool, 0-1 waiting requests, a reservation of a thousandth of the pool) or large (the
whole pool, hundreds of requests, thousands of times the pool, an 8 s stall); no two labels of an axis
may read the same, and counts (requests, tokens, steps) tick at whole numbers only. The runs are made
by hand (the recorder's API, as ``tests/telemetry/test_handmade_run.py`` does)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from widget_util import COUNT_VIEWS_JS

from kvscope.runs.result.comparison import compare
from kvscope.runs.result.run import Run
from kvscope.telemetry.inputs import BatchSummary, SchedulerStats, StepTimings
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import ScheduledItem

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

MS = 1_000_000


@dataclass(frozen=True, slots=True)
class Range:
    """What a hand-made run's steps span."""

    num_blocks: int
    max_blocks_used: int
    max_waiting: int
    max_running: int
    max_model_len: int
    tokens_per_step: int
    steps: int
    step_ns: int
    stall_ns: int = 0  # one step this long (an 8 s stall among milliseconds)


TINY = Range(num_blocks=4000, max_blocks_used=6, max_waiting=1, max_running=1, max_model_len=64,
             tokens_per_step=3, steps=12, step_ns=20_000)
LARGE = Range(num_blocks=64, max_blocks_used=64, max_waiting=400, max_running=300, max_model_len=32768,
              tokens_per_step=8000, steps=300, step_ns=30 * MS, stall_ns=8000 * MS)


def ranged_run(r: Range, label: str = "run") -> Run:
    """A run of ``r.steps`` steps: one request per running slot, decoding a token a step; blocks used,
    waiting and running grow from 0 (or 1) to their maxima and back."""
    block_size = 16
    meta = {"model": f"hand-made {label}", "block_size": block_size, "num_blocks": r.num_blocks,
            "kv_bytes_per_token": 64, "kv_bytes_per_block": 64 * block_size, "max_model_len": r.max_model_len}
    rec = Recorder(meta)
    t = 1000
    ids = [f"r{i}" for i in range(max(r.max_running, 1))]
    for rid in ids:
        rec.request_event("queued", rid, 0, 8, 0, t_ns=t)
    for step in range(r.steps):
        share = 1 - abs(2 * step / max(r.steps - 1, 1) - 1)  # 0 -> 1 -> 0
        running = max(1, round(share * r.max_running))
        used = max(1, round(share * r.max_blocks_used))
        waiting = round(share * r.max_waiting)
        tokens = max(1, round(share * r.tokens_per_step))
        items = [ScheduledItem(rid, "prefill" if step == 0 else "decode", max(1, tokens // running), 8 + step, True)
                 for rid in ids[:running]]
        if step == 0:
            for rid in ids:
                rec.request_event("first_token", rid, 0, 8, 1, t_ns=t + r.step_ns)
        duration = r.stall_ns if r.stall_ns and step == r.steps // 2 else r.step_ns
        d = duration // 5
        timings = StepTimings(t, t + d, t + 2 * d, t + 3 * d, t + 4 * d, t + duration)
        stats = SchedulerStats(running, waiting, r.num_blocks, used, 0, min(used * block_size, 8 * used), 0, 0)
        rec.record_step(BatchSummary(step, items, [[] for _ in items]), timings, stats)
        t += duration
    for rid in ids:
        rec.request_event("finished", rid, r.steps, 8, r.steps, reason="length", t_ns=t)
    return Run(*rec.snapshot())

# Per figure: its title and, per visible linear axis, its label and tick labels as drawn.
AXES_JS = """() => [...Bokeh.index.all_views()].filter(v => v.model.type == "Figure").map(v => ({
  title: v.model.title.text,
  axes: [...v.renderer_views.values()].filter(p => p.model.type == "LinearAxis" && p.model.visible).map(p => ({
    label: p.model.axis_label || "",
    ticks: p.compute_labels(p.tick_coords.major[p.dimension]).items.map(t => t.text)})),
}))"""

COUNT_LABELS = ("requests", "tokens", "count", "step", "draft position")
COUNT_TITLES = ("Batch composition", "Running requests", "Waiting requests", "Tokens per step", "Output tokens")


def _axes(page, path, num_figures: int) -> dict[str, list[dict]]:
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function(f"() => ({COUNT_VIEWS_JS})('Figure') >= {num_figures}", timeout=30_000)
    page.wait_for_timeout(300)
    assert page.kvscope_log["errors"] == []
    return {f["title"]: f["axes"] for f in page.evaluate(AXES_JS)}


def _check(figures: dict[str, list[dict]]) -> int:
    """Assert every axis's labels are distinct and counts whole; returns the number of axes checked."""
    checked = 0
    for title, axes in figures.items():
        for axis in axes:
            ticks = axis["ticks"]
            assert ticks, (title, axis)  # an axis drawn with no labels: leave it out
            assert len(set(ticks)) == len(ticks), f"{title} ({axis['label']}): {ticks}"
            if axis["label"] in COUNT_LABELS or title.startswith(COUNT_TITLES):
                assert all(re.fullmatch(r"-?[\d,]+", t) for t in ticks), f"{title} ({axis['label']}): {ticks}"
            checked += 1
    return checked


@pytest.mark.parametrize("span", [TINY, LARGE], ids=["tiny", "large"])
def test_report_axes_read_at_every_range(page, tmp_path, span, artifacts):
    run = ranged_run(span)
    figures = _axes(page, run.save_html(tmp_path / "run.html"), 8)
    assert _check(figures) >= 12
    occupancy = {a["label"]: a["ticks"] for a in figures["KV occupancy vs. static reservation"]}
    share, static = occupancy["share of KV pool"], occupancy["static reservation, x the pool"]
    assert all(t.endswith("%") for t in share) and all(t.endswith("x") for t in static), occupancy
    page.screenshot(path=str(artifacts / f"report_ticks_{'tiny' if span is TINY else 'large'}.png"), full_page=True)


@pytest.mark.parametrize("span", [TINY, LARGE], ids=["tiny", "large"])
def test_comparison_axes_read_at_every_range_by_step_and_by_time(page, tmp_path, span, artifacts):
    cmp = compare(ranged_run(span, "a"), ranged_run(span, "b"), labels=["a", "b"])
    path = cmp.save_html(tmp_path / "cmp.html")
    figures = _axes(page, path, 10)
    (waiting,) = [a["ticks"] for a in figures["Waiting requests"] if a["label"] == "requests"]  # was "0 0 0 1 1 1"
    assert _check(figures) >= 20
    if span is TINY:
        assert waiting == ["0", "1"], waiting
    page.get_by_text("align by time").click()  # x becomes seconds: fractions, still distinct
    page.wait_for_timeout(300)
    xs = [a["ticks"] for f in page.evaluate(AXES_JS) for a in f["axes"] if a["label"].startswith("seconds")]
    assert xs and all(len(set(x)) == len(x) >= 2 for x in xs), xs
    page.screenshot(path=str(artifacts / f"compare_ticks_{'tiny' if span is TINY else 'large'}.png"), full_page=True)
