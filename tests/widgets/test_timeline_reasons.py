"""The request timeline colours each queue segment by why the request waited: the bars of each reason add up,
per request, to ``kvscope.explain.waits``' split of its queue time, fed live (tick by tick) or all at once."""

from __future__ import annotations

import pytest
from bokeh.models import GroupFilter, Legend

from kvscope import Engine, SamplingParams
from kvscope.explain.waits import queue_times
from kvscope.runs.result.run import Run
from kvscope.widgets.feed import Feed, Tick
from kvscope.widgets.panels.timeline import QUEUE_STATES, STATES, TimelinePanel
from kvscope.widgets.panels.wait_styles import QUEUE_COLORS, QUEUE_LABELS

pytestmark = pytest.mark.timeout(120)
BS = 4


def tokens(start: int, n: int) -> list[int]:
    return [3 + (start + i) % 500 for i in range(n)]


def run_of(prompts: list[list[int]], max_tokens: int, **engine) -> Run:
    e = Engine("tiny", block_size=BS, **engine)
    e.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return Run.from_engine(e)


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """One run per reason: requests wait for max_num_seqs, for the token budget, for free blocks (and after a
    preemption, to be recomputed)."""
    return {
        "max_num_seqs": run_of([tokens(100 * i, 9) for i in range(3)], 4, num_blocks=64, max_num_seqs=1),
        "token_budget": run_of([tokens(0, 40), tokens(100, 40)], 2, num_blocks=64, max_num_batched_tokens=16),
        "no_free_blocks": run_of([tokens(0, 12), tokens(100, 12), tokens(200, 12)], 12, num_blocks=8),
    }


def _ticks(run: Run, size: int):
    """The run as a live dashboard gets it: ``size`` records per tick, each with the events up to its end."""
    feed = Feed()
    events = sorted(run.events, key=lambda e: e.t_ns)
    i = 0
    for start in range(0, len(run.records), size):
        chunk = run.records[start:start + size]
        while i < len(events) and events[i].t_ns <= chunk[-1].t_end_ns:
            feed.push(events[i])
            i += 1
        for record in chunk:
            feed.push(record)
        yield feed.poll()
    for event in events[i:]:
        feed.push(event)
    yield feed.poll(final=True)


def _by_reason(panel: TimelinePanel) -> dict[str, dict[str, float]]:
    data = panel.source.data
    out: dict[str, dict[str, float]] = {}
    for rid, state, left, right in zip(data["request"], data["state"], data["left"], data["right"]):
        assert left <= right
        if state in QUEUE_STATES or state == "preempted":
            out.setdefault(rid, {})
            out[rid][state] = out[rid].get(state, 0.0) + right - left
    return out


@pytest.mark.parametrize("reason", ["max_num_seqs", "token_budget", "no_free_blocks"])
@pytest.mark.parametrize("size", [1, 3, None])
def test_queue_bars_split_like_explain_waits(runs, reason, size):
    run = runs[reason]
    panel = TimelinePanel(rollover=None, meta={"t0_ns": run.t0_ns})
    ticks = [Tick(run.records, sorted(run.events, key=lambda e: e.t_ns), final=True)] if size is None \
        else _ticks(run, size)
    for tick in ticks:
        panel.update(tick)
    drawn = _by_reason(panel)
    expected = {row.request_id: row.by_reason for row in queue_times(run.records, run.events)}
    assert any(reason in parts for parts in expected.values())  # the run has waits for this reason
    for rid, parts in expected.items():
        got = drawn.get(rid, {})
        for state in {*parts, *got}:
            assert got.get(state, 0.0) == pytest.approx(parts.get(state, 0.0), abs=2e-6), (rid, state)
    assert any(drawn[rid].get(reason, 0) > 0 for rid in drawn)
    if reason == "no_free_blocks":  # and a victim waited to be recomputed
        assert any(drawn[rid].get("preempted", 0) > 0 for rid in drawn)


def test_each_reason_has_its_colour_and_legend_entry(runs):
    panel = TimelinePanel(rollover=None)
    (legend,) = panel.figure.select(type=Legend)
    labels = [item.label.value for item in legend.items]
    assert labels == [label for label, _ in STATES.values()]
    for item in legend.items:
        (renderer,) = item.renderers
        group = renderer.view.filter
        assert isinstance(group, GroupFilter) and group.column_name == "state"
        label, color = STATES[group.group]
        assert item.label.value == label and renderer.glyph.fill_color == color
        if group.group in QUEUE_COLORS:
            assert color == QUEUE_COLORS[group.group] and label == QUEUE_LABELS[group.group]
    assert len(set(c for _, c in STATES.values())) == len(STATES)  # no two states look alike


BOX_JS = """(name) => {
  const v = [...Bokeh.index.all_views()].find(v => v.model.name == name);
  const r = v.el.getBoundingClientRect();
  return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height};
}"""


@pytest.mark.browser
def test_queue_reasons_in_the_report_in_chromium(page, tmp_path, artifacts):
    """Requests that wait for each reason; the report's timeline draws their queue bars in the reasons' colours
    (screenshot: the timeline above the queue-reasons panel, artifacts/queue_reasons.png)."""
    from PIL import Image

    run = run_of([tokens(100 * i, 12 + 2 * i) for i in range(6)], 10, num_blocks=14, max_num_seqs=3,
                 max_num_batched_tokens=16)
    path = run.save_html(tmp_path / "waits.html")
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_function("() => [...Bokeh.index.all_views()].some(v => v.model.name == 'queue-reasons')",
                           timeout=30_000)
    page.wait_for_timeout(500)
    states = page.evaluate("""() => [...Bokeh.documents[0].get_model_by_name("request-timeline-bars").data.state]""")
    drawn = {s for s in states if s in QUEUE_STATES or s == "preempted"}
    totals = {r: s for row in queue_times(run.records, run.events) for r, s in row.by_reason.items() if s > 0}
    assert drawn == set(totals) and {"token_budget", "max_num_seqs", "no_free_blocks", "preempted"} <= drawn
    shots = []
    for i, name in enumerate(("request-timeline", "queue-reasons")):
        shot = tmp_path / f"{i}.png"
        page.screenshot(path=str(shot), clip=page.evaluate(BOX_JS, name), full_page=True)
        shots.append(Image.open(shot))
    out = Image.new("RGB", (max(s.width for s in shots), sum(s.height for s in shots)), "white")
    out.paste(shots[0], (0, 0))
    out.paste(shots[1], (0, shots[0].height))
    out.save(artifacts / "queue_reasons.png")
    log = page.kvscope_log
    assert log["blocked"] == [] and log["errors"] == [] and log["dialogs"] == []
