"""A Dashboard driven from a background run: data grows while the run goes, one thread writes the
documents, memory stays bounded past the rollover; the replay of a saved run."""

from __future__ import annotations

import threading
import time

import pytest

from kvscope import Engine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload
from kvscope.widgets.report import Replay
from kvscope.widgets.transport import Pacer, ViewGate, parse_ack

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
    """With widgets built but no frontend (no view is ever reported), the patches are held and the
    full state is sent instead now and then; the end state is in the widgets' synced state."""
    run = _live(4, 40, delay=0.02)
    dash = run.dashboard
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    run.start().wait(timeout=60)
    assert dash.num_ticks >= 2
    state = dash.view.models[2].render_bundle  # the page map's widget
    assert "page-map-cells" in str(state) and '"shape": [48]' in str(state).replace("'", '"')
    assert all(button.disabled for button in dash.view.buttons)


class _Widget(ViewGate):
    """A stand-in for the BokehModel: records the patch parts and the state sends."""

    def __init__(self):
        from bokeh.document import Document
        from bokeh.models import Div

        self.div, self.parts, self.states = Div(text="0"), [], 0
        doc = Document()
        doc.add_root(self.div)
        self._model = self.div
        self.init_gate(threading.RLock())
        doc.on_change_dispatch_to(self)

    def send(self, content, buffers=None):
        self.parts.append(content)

    def update_from_model(self, model):
        self.states += 1

    def patches(self) -> list[list[str]]:
        """The texts each complete PATCH-DOC sets, in order (parts come in threes: no buffers here)."""
        import json

        assert len(self.parts) % 3 == 0
        return [[e["new"] for e in json.loads(self.parts[i + 2]["payload"])["events"]]
                for i in range(0, len(self.parts), 3)]


def test_patches_wait_for_the_view():
    """transport.ViewGate: no patch part goes out until the awaited view is reported; then the held
    events go out as one PATCH-DOC, later ones at once; a re-display holds again and brings every view
    to the whole state; without a view the state is sent instead after ``max_hold_s``."""
    w = _Widget()
    w.div.text = "1"
    w.div.text = "2"
    assert w.parts == [] and not w.gate_open  # held: the view may be in creation
    w.view_arrived()
    assert w.gate_open and w.patches() == [["1", "2"]] and w.states == 0
    w.div.text = "3"
    assert w.patches()[-1] == ["3"]
    w.view_arrived()  # a view nobody announced (a reloaded page): it gets the whole state
    assert w.states == 1 and len(w.patches()) == 2
    w.div.text = "4"
    w.expect_view()  # displayed twice more: both new views must be there
    w.expect_view()
    w.div.text = "5"
    w.view_arrived()
    w.div.text = "6"
    assert len(w.patches()) == 3 and w.states == 1
    w.view_arrived()  # the old view has "4", the new ones not: the whole state, then patches again
    assert w.states == 2 and len(w.patches()) == 3
    w.div.text = "7"
    assert w.patches()[-1] == ["7"]

    w = _Widget()
    w.max_hold_s = 0.0
    w.div.text = "1"  # no view comes: the state is sent, nothing held
    assert w.states == 1 and w.parts == [] and w._held == []
    w.max_hold_s = 60.0
    w.div.text = "2"
    w.view_arrived()
    assert w.patches() == [["2"]]  # only what came after that state


def test_pacing_waits_for_the_browser():
    class Model:
        acked = -1
        gate_open = False

    pacer, models = Pacer(max_in_flight=2, slow_interval_s=60), [Model(), Model()]
    assert pacer.may_send(5, [])  # no widgets: never wait
    pacer.sent()
    assert not pacer.may_send(1, models)  # views not there yet: the slow pace
    for m in models:
        m.gate_open = True
    models[0].acked = models[1].acked = 3
    assert pacer.may_send(5, models) and not pacer.may_send(6, models)
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
