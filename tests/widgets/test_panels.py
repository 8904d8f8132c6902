"""Panels fed from real step records: what each one holds must match the run."""

from __future__ import annotations

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ColumnsPatchedEvent, ModelChangedEvent
from bokeh.models import CustomJSTickFormatter, HoverTool, Legend, LinearAxis
from bokeh.plotting import figure

from kvscope.telemetry import frames as metrics
from kvscope.telemetry.records import FREE_PAGE, PageEntry
from kvscope.widgets.feed import Feed, Tick
from kvscope.widgets.panels import apply_tick, build_panels
from kvscope.widgets.panels.page_cells import merge_entries
from kvscope.widgets.panels.page_map import PageMapPanel
from kvscope.widgets.panels.timeline import QUEUE_STATES, STATES, TimelinePanel
from kvscope.widgets.stats import LatencyStats

pytestmark = pytest.mark.timeout(60)


def _chunks(run, size: int):
    """The run's items as the recorder published them, in ticks of ``size`` records."""
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
        yield feed, feed.poll()
    for event in events[i:]:
        feed.push(event)
    yield feed, feed.poll(final=True)


def _fill(run, size: int = 7, rollover: int | None = None):
    stats = LatencyStats()
    panels = {p.name: p for p in build_panels(stats, rollover, {"t0_ns": run.t0_ns})}
    for _feed, tick in _chunks(run, size):
        apply_tick(list(panels.values()), stats, tick)
    return stats, panels


def test_feed_holds_events_until_their_step_arrives(finished_run):
    records, events = finished_run.records, finished_run.events
    feed = Feed()
    later = [e for e in events if e.t_ns > records[0].t_end_ns]
    for event in events:
        feed.push(event)
    feed.push(records[0])
    tick = feed.poll()
    assert tick.steps == [records[0]] and all(e.t_ns <= records[0].t_end_ns for e in tick.events)
    assert feed.poll().events == []  # nothing new yet: later events stay held
    assert feed.poll(final=True).events == later
    items = list(Tick([records[1]], [e for e in events if e.step == 1]).ordered())
    assert items[-1] is records[1]  # a step's own events come before its record


def test_latency_stats_match_the_telemetry_definitions(finished_run):
    stats, _ = _fill(finished_run)
    expected_itl = np.sort(metrics.all_itls(finished_run.records))
    assert np.allclose(np.sort(np.array(stats.itl)), expected_itl)
    ttft = finished_run.requests["ttft_s"].dropna().to_numpy()
    assert np.allclose(np.sort(np.array(stats.ttft)), np.sort(ttft))
    assert stats.num_requests == stats.num_finished == 8 and stats.num_active == 0
    assert stats.num_preemptions == finished_run.summary()["preemptions"] > 0


def test_series_panels_have_one_row_per_step(finished_run):
    _, panels = _fill(finished_run)
    n = len(finished_run.records)
    for name in ("memory", "occupancy", "batch", "latency"):
        assert list(panels[name].source.data["step"]) == [r.step for r in finished_run.records], name
    batch = panels["batch"].source.data
    assert list(batch["prefill"]) == [r.num_prefill_tokens for r in finished_run.records]
    assert list(batch["running"]) == [r.num_running for r in finished_run.records]
    occupancy = panels["occupancy"].source.data
    assert max(occupancy["static_x_pool"]) > 1  # a static reservation would not fit this pool
    assert len(panels["memory"].source.data["kv_used"]) == n
    kpi = panels["kpi"].values
    assert (kpi["finished"], kpi["requests"], kpi["step"]) == (8, 8, finished_run.records[-1].step)
    assert "8 / 8" in panels["kpi"].div.text


def test_page_map_matches_the_run_and_is_patched_not_resent(finished_run):
    panel = PageMapPanel()
    doc = Document()
    doc.add_root(panel.model)
    events = []
    doc.on_change(lambda event: events.append(event))
    records = finished_run.records
    for i, (_feed, tick) in enumerate(_chunks(finished_run, 5)):
        events.clear()
        panel.update(tick)
        if tick.steps:
            expected = finished_run.page_map_at(tick.steps[-1].step)
            assert panel.source.data["state"] == [e.state for e in expected]
            assert panel.source.data["owner"] == [e.owner for e in expected]
            assert list(panel.source.data["filled"]) == [e.filled for e in expected]
        data_sends = [e for e in events if isinstance(e, ColumnDataChangedEvent)
                      or (isinstance(e, ModelChangedEvent) and e.attr == "data")]
        if i == 0:
            assert data_sends  # the grid goes out once
        else:
            assert not data_sends, "the grid was sent again"
            assert all(isinstance(e, ColumnsPatchedEvent) for e in events if getattr(e, "model", None) is panel.source)
    assert len(panel.source.data["block"]) == records[0].kv.num_blocks == 40
    assert "shared" in {e.state for r in records for e in r.page_map.values()}


def test_timeline_follows_each_request(finished_run):
    _, panels = _fill(finished_run)
    data = panels["timeline"].source.data
    rows = sorted(zip(data["request"], data["state"], data["left"], data["right"]), key=lambda r: r[2:])
    assert all(left <= right for _, _, left, right in rows)
    by_request: dict[str, list[str]] = {}
    for rid, state, _, _ in rows:
        by_request.setdefault(rid, []).append(state)
    assert len(by_request) == 8
    preempted = set(finished_run.requests.query("num_preemptions > 0")["request_id"])
    assert preempted
    for rid, states in by_request.items():
        queue = states[:states.index("prefill")]  # its wait, one bar per reason (test_timeline_reasons.py)
        assert queue and set(queue) <= set(QUEUE_STATES)
        assert states[len(queue):len(queue) + 2] == ["prefill", "decode"]
        if rid in preempted:  # it may end in the recompute that sampled its last token
            assert "preempted" in states and states[-1] in ("decode", "prefill")
        else:
            assert states == [*queue, "prefill", "decode"]
    finished = finished_run.requests.set_index("request_id")["finished_s"]
    for rid in by_request:
        last = max(r for q, _, _, r in rows if q == rid)
        assert last == pytest.approx(finished[rid], abs=1e-6)  # the last bar ends when it finished
    assert panels["timeline"].num_active == 0


def test_timeline_rollover_keeps_the_newest_bars_right(finished_run):
    full = _fill(finished_run, size=3)[1]["timeline"].source.data
    panel = TimelinePanel(rollover=6, meta={"t0_ns": finished_run.t0_ns})
    stats = LatencyStats()
    for _feed, tick in _chunks(finished_run, 3):
        apply_tick([panel], stats, tick)
    rolled = panel.source.data
    assert len(rolled["left"]) == 6
    for column in ("request", "state", "left", "right"):
        assert list(rolled[column]) == list(full[column])[-6:], column


def test_rollover_bounds_every_series(finished_run):
    _, panels = _fill(finished_run, size=4, rollover=10)
    for name in ("memory", "occupancy", "batch", "latency", "timeline"):
        source = panels[name].source
        assert all(len(v) <= 10 for v in source.data.values()), name
    assert list(panels["batch"].source.data["step"]) == [r.step for r in finished_run.records[-10:]]


def test_a_large_pool_is_drawn_in_runs_of_blocks(finished_run):
    panel = PageMapPanel(max_cells=16)  # 40 blocks -> runs of 3 blocks, 14 cells
    for _feed, tick in _chunks(finished_run, 5):
        panel.update(tick)
        if not tick.steps:
            continue
        expected = finished_run.page_map_at(tick.steps[-1].step)
        cells = [merge_entries(expected[c * 3:c * 3 + 3]) for c in range(14)]
        assert panel.source.data["state"] == [e.state for e in cells]
        assert panel.source.data["owner"] == [e.owner for e in cells]
        assert list(panel.source.data["filled"]) == [e.filled for e in cells]
    assert (panel.group, panel.num_cells, len(panel.source.data["x"])) == (3, 14, 14)
    assert panel.source.data["blocks"][:2] == ["0–2", "3–5"] and panel.source.data["blocks"][-1] == "39–39"
    shared = PageEntry("a", 8, "shared", 2)
    assert merge_entries([FREE_PAGE, PageEntry("b", 3, "used", 1), shared]) == PageEntry("a", 11, "shared", 2)


def test_the_registry_builds_every_panel_once_in_the_layout_order():
    from kvscope.widgets.panels import PANELS
    from kvscope.widgets.panels.registry import ROWS

    panels = build_panels(LatencyStats(), 10, {"model": "m"})
    names = [p.name for p in panels]
    kinds = [s.kind for s in PANELS if s.when is None]  # a plain run: not the P/D run's own panels
    assert names == [k.name for k in kinds] and len(set(names)) == len(names) == len(PANELS) - 1
    assert [type(p) for p in panels] == kinds
    pd_panels = build_panels(LatencyStats(), 10, {"model": "m", "pd": {}})
    assert [p.name for p in pd_panels] == [s.kind.name for s in PANELS]
    assert sorted(n for row in ROWS for n in row) == sorted(p.name for p in pd_panels)  # the live layout shows each
    assert panels[0].meta == {"model": "m"} and panels[1].rollover == 10


def _figures(panels) -> list:
    return [f for p in panels.values() for f in p.model.select({"type": figure})]


def test_every_legend_sits_below_its_plot_and_hides_on_click(finished_run):
    _, panels = _fill(finished_run)
    with_legend = {f.title.text: f for f in _figures(panels) if f.select(type=Legend)}
    # memory, occupancy, batch, phases, timeline, drafts, slow steps, and the two page maps' keys of states
    assert len(with_legend) == 9, sorted(with_legend)
    for title, fig in with_legend.items():
        (legend,) = fig.select(type=Legend)
        assert legend in fig.below and legend not in fig.center, title  # never over the data
        policy = "none" if "page map" in title else "hide"  # a key of the cells' looks hides nothing
        assert legend.orientation == "horizontal" and legend.click_policy == policy, title
        assert all(item.renderers for item in legend.items), title
    timeline = panels["timeline"].figure
    (legend,) = timeline.select(type=Legend)
    assert [item.label.value for item in legend.items] == [label for label, _ in STATES.values()]
    data = panels["timeline"].source.data
    shown = sorted(i for item in legend.items for r in item.renderers
                   for i, state in enumerate(data["state"]) if state == r.view.filter.group)
    assert shown == list(range(len(data["state"])))  # each bar drawn by exactly one state's renderer


def test_the_static_reservation_reads_in_times_the_pool(finished_run):
    _, panels = _fill(finished_run)
    fig = panels["occupancy"].figure
    (right,) = [a for a in fig.right if isinstance(a, LinearAxis)]
    assert right.y_range_name == "static" and "x the pool" in right.axis_label
    assert isinstance(right.formatter, CustomJSTickFormatter) and right.formatter.args["suffix"] == "x"
    (hover,) = fig.select(type=HoverTool)
    assert dict(hover.tooltips)["static reservation"] == "@{static_x_pool}{0.0[0]}x"
    kv = finished_run.records[-2].kv
    bytes_per_block = next(r.kv.paged_bytes // r.kv.blocks_used for r in finished_run.records if r.kv.blocks_used)
    expected = kv.static_reservation_bytes / (kv.num_blocks * bytes_per_block)
    assert panels["occupancy"].source.data["static_x_pool"][-2] == pytest.approx(expected)


def test_page_map_title_names_the_kv_cache_groups():
    from kvscope import Engine, Run
    from kvscope.engine.request import SamplingParams
    from kvscope.models.zoo import tiny_model
    from kvscope.widgets.panels.page_map import kv_groups_label

    assert kv_groups_label({}) is None
    full = {"kv_cache_groups": {"groups": [{"layers": [0, 1], "sliding_window": None}], "num_slots": 2}}
    assert kv_groups_label(full) is None  # nothing to say about a full-attention model
    engine = Engine(tiny_model("gemma3_text"), block_size=4, num_blocks=160, max_model_len=256)
    engine.generate([list(range(100, 150))], SamplingParams(max_tokens=8, ignore_eos=True))
    run = Run.from_engine(engine)
    assert kv_groups_label(run.meta) == "6 KV groups of 1 layer (full, window 16), 5 freeing by window"
    panel = next(p for p in build_panels(LatencyStats(), None, run.meta) if type(p) is PageMapPanel)
    for _feed, tick in _chunks(run, 5):
        panel.update(tick)
    assert panel.figure.title.text.endswith("5 freeing by window")
    fallback = Engine(tiny_model("gemma4_text"), block_size=4, num_blocks=64, max_model_len=256)
    assert kv_groups_label(fallback.run_metadata()).startswith("one KV group, window not freed: layers with")
