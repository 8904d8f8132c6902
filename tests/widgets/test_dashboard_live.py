"""A Dashboard driven from a background run: data grows while the run goes, one thread writes the
documents, memory stays bounded past the rollover; the replay of a saved run."""

from __future__ import annotations

import threading
import time

import pytest
from kvscope.widgets.report import Replay
from kvscope.widgets.transport import Pacer, ViewReadiness, parse_ack

from kvscope import Engine
from kvscope.live import LiveRun
from kvscope.workload import synthetic_workload

pytestmark = pytest.mark.timeout(120)
SERIES = ("memory", "occupancy", "batch", "latency")


def _live(n_requests: int, out: int, rollover: int = 2000, delay: float = 0.01, **options) -> LiveRun:
    engine = Engine("tiny", num_blocks=48, block_size=8, max_num_seqs=6)
    items = synthetic_workload(n_requests, (8, 30), (out, out), vocab_size=512, exclude_ids=[0, 1, 2], seed=5)
    return LiveRun(engine, items, step_delay=delay,
                   dashboard_options={"rollover": rollover, "refresh_hz": 10.0, **options})


def _writers(dash) -> list[str]:
    """Record the name of every thread that changes one of the dashboard's documents."""
    names: list[str] = []
    for doc in dash.docs:
        doc.on_change(lambda event: names.append(threading.current_thread().name))
    return names


def test_sources_grow_while_the_run_goes(artifacts):
    run = _live(6, 60, headless=True)
    dash = run.dashboard
    writers = _writers(dash)
    run.start()
    sizes = []
    while not run.done:
        sizes.append((len(dash.panel["batch"].source.data["step"]), len(dash.panel["timeline"].source.data["left"])))
        time.sleep(0.1)
    run.wait(timeout=60)
    growth = sorted(set(sizes))
    assert len(growth) >= 3, f"the sources did not grow during the run: {growth}"
    assert sizes[-1][0] < run.step  # ... and the last look, before the end, was not yet everything
    assert len(dash.panel["batch"].source.data["step"]) == run.step  # the final tick brought the rest
    assert dash.finished and dash.error is None and dash.num_ticks >= 3
    assert set(writers) == {"kvscope-dashboard"}, set(writers)  # only the update thread wrote


def test_memory_stays_bounded_past_the_rollover():
    rollover = 25
    run = _live(16, 40, rollover=rollover, delay=0.0, headless=True)
    run.start().wait(timeout=90)
    dash = run.dashboard
    assert run.step > 3 * rollover and dash.panel["timeline"]._rows_sent > rollover
    for name in (*SERIES, "timeline"):
        lengths = {len(v) for v in dash.panel[name].source.data.values()}
        assert lengths == {rollover}, (name, lengths)
    assert list(dash.panel["batch"].source.data["step"]) == list(range(run.step - rollover, run.step))
    stats = dash.stats
    assert stats.num_active == 0 and dash.panel["timeline"].num_active == 0  # per-request state let go
    assert len(stats.itl) <= stats.itl.maxlen and len(stats.ttft) <= stats.ttft.maxlen
    assert dash.feed._held == [] and dash.feed._queue.empty()
    assert len(dash.panel["page_map"].source.data["block"]) == 48  # the grid never grows


def test_widget_dashboard_without_a_browser_still_updates_and_syncs():
    """With widgets built but no frontend (no view ever confirms), ticks slow to one a second and
    the full state is re-sent now and then; the end state is in the widgets' synced state."""
    run = _live(4, 40, delay=0.02)
    dash = run.dashboard
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    run.start().wait(timeout=60)
    assert dash.num_ticks >= 2
    state = dash._bokeh_models[2].render_bundle  # the page map's widget
    assert "page-map-cells" in str(state) and '"shape": [48]' in str(state).replace("'", '"')
    assert all(button.disabled for button in dash._buttons)


def test_pacing_waits_for_the_browser():
    class Model:
        acked = -1

    views, pacer, models = ViewReadiness(interval_s=0.0), Pacer(max_in_flight=2, slow_interval_s=60), [Model(), Model()]
    assert pacer.may_send(5, views, [])  # no widgets: never wait
    views.expect(models)
    pacer.sent()
    assert not pacer.may_send(1, views, models)  # views not confirmed: the slow pace
    assert views.due()  # ... and the state is re-sent
    for m in models:
        views.mark(m)
    assert views.confirmed and views.due() and not views.due()  # one last full send, then patches only
    models[0].acked = models[1].acked = 3
    assert pacer.may_send(5, views, models) and not pacer.may_send(6, views, models)
    assert parse_ack({"type": "map", "entries": [["item", "kvscope-ack:17"]]}) == 17
    assert parse_ack({"item": "something else"}) is None


def test_replay_of_a_saved_run_moves_the_page_map(finished_run, tmp_path):
    import kvscope

    path = finished_run.save_trace(tmp_path / "run.json")
    replay = Replay(kvscope.load(path))
    panel = replay.dashboard.panel["page_map"]
    last = finished_run.records[-1].step
    assert replay.slider.max == last and panel.source.data["state"] == [e.state for e in finished_run.page_map_at(last)]
    replay.slider.value = 10
    assert panel.source.data["state"] == [e.state for e in finished_run.page_map_at(10)]
    assert panel.source.data["owner"] == [e.owner for e in finished_run.page_map_at(10)]
    assert panel.step == 10
    bundle = replay._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
