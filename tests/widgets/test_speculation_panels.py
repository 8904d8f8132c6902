"""The speculation panels and the page map's draft-slot marks, fed hand-made records (no engine)."""

from __future__ import annotations

from kvscope.telemetry.records import KVState, PageEntry, SpecDecodeStats, StepRecord
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.page_cells import DRAFT_MARK_COLORS
from kvscope.widgets.panels.page_map import PageMapPanel
from kvscope.widgets.panels.speculation import DraftPageMapPanel, SpeculationPanel


def step(i: int, spec: SpecDecodeStats | None, page_map=None) -> StepRecord:
    kv = KVState(8, 4, 2, 0, 6, 0.25, 0.19, 0.25, 0, 0, 0, 0, 0)
    return StepRecord(i, i * 10, i * 10 + 5, 1, 1, 1, 1, 1, 0, 0, 2, 2, 2, 0, 0, 0, 2, [], kv,
                      page_map=page_map or {}, page_map_full=page_map is not None, spec_decode=spec)


def spec(drafted_pos, accepted_pos, slots=None, draft_map=None, full=False, freed=()) -> SpecDecodeStats:
    return SpecDecodeStats(4, num_drafts=drafted_pos[0] if drafted_pos else 0, num_draft_tokens=sum(drafted_pos),
                           num_accepted_tokens=sum(accepted_pos), num_draft_tokens_per_pos=drafted_pos,
                           num_accepted_tokens_per_pos=accepted_pos, draft_slots=slots or {},
                           draft_num_blocks=6 if draft_map is not None else 0,
                           draft_page_map=draft_map or {}, draft_page_map_full=full, freed_blocks=list(freed))


def test_speculation_panel_stays_hidden_without_speculation_then_counts_each_step():
    panel = SpeculationPanel(rollover=None)
    panel.update(Tick([step(0, None)]))
    assert panel.model.visible is False and list(panel.tokens.data["step"]) == []
    panel.update(Tick([step(1, spec([2, 2, 1, 1], [2, 1, 0, 0])), step(2, spec([1, 1, 1, 1], [1, 1, 1, 1]))]))
    assert panel.model.visible is True
    data = panel.tokens.data
    assert list(data["accepted"]) == [3, 4] and list(data["rejected"]) == [3, 0] and list(data["requests"]) == [2, 1]
    cells = panel.cells.data
    assert list(cells["position"])[:4] == [1, 2, 3, 4] and list(cells["rate"])[:4] == [1.0, 0.5, 0.0, 0.0]
    assert panel.positions_figure.y_range.end == 4.5
    assert "70.0%" in panel.div.text  # 7 of 10 drafts accepted
    assert "3.33" in panel.div.text  # mean acceptance length: 1 + 7 accepted / 3 drafts (2 + 1 requests)


def test_page_map_marks_the_blocks_that_held_draft_slots():
    panel = PageMapPanel()
    entries = {b: PageEntry("a", 4, "used", 1) for b in range(3)}
    panel.update(Tick([step(0, spec([1, 1], [1, 0], slots={1: [1, 1], 2: [1, 0]}, freed=[2]), page_map=entries)]))
    marks = panel.marks.data
    assert list(marks["block"]) == [1, 2] and list(marks["color"]) == [DRAFT_MARK_COLORS[2], DRAFT_MARK_COLORS[0]]
    panel.update(Tick([step(1, spec([1], [0], slots={0: [3, 1], 1: [1, 0]}))]))  # rejected, but kept: orange
    assert list(panel.marks.data["block"]) == [0, 1]
    assert list(panel.marks.data["color"]) == [DRAFT_MARK_COLORS[1]] * 2
    panel.update(Tick([step(2, None)]))  # a step without speculation leaves the last marks
    assert list(panel.marks.data["block"]) == [0, 1]


def test_draft_page_map_draws_the_draft_pool():
    panel = DraftPageMapPanel.create(None)
    panel.update(Tick([step(0, None)]))
    assert panel.model.visible is False and panel.entries == []
    snapshot = {b: (PageEntry("a", 3, "used", 1) if b == 2 else PageEntry("", 0, "free", 0)) for b in range(6)}
    panel.update(Tick([step(1, spec([1], [1], draft_map=snapshot, full=True))]))
    assert panel.model.visible is True and panel.num_blocks == 6
    assert panel.source.data["owner"][2] == "a" and panel.source.data["state"][2] == "used"
    panel.update(Tick([step(2, spec([1], [0], draft_map={2: PageEntry("", 0, "free", 0)}))]))
    assert panel.source.data["state"][2] == "free"


def test_a_live_speculative_run_fills_the_panels_and_a_loaded_one_replays_them(tmp_path):
    """LiveRun's headless dashboard on the tiny model with prompt lookup, then the replay of its trace."""
    import kvscope
    from kvscope import Engine
    from kvscope.runs.background.live import LiveRun
    from kvscope.runs.workload.items import synthetic_workload
    from kvscope.widgets.report import Replay

    engine = Engine("tiny", num_blocks=64, block_size=4, max_num_seqs=4, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    items = synthetic_workload(6, (8, 16), (24, 24), vocab_size=16, exclude_ids=[0, 1, 2], seed=3)  # repeats
    run = LiveRun(engine, items, step_delay=0.0,
                  dashboard_options={"refresh_hz": 10.0, "headless": True}).start().wait(timeout=90)
    assert run.status == "finished"
    spec_steps = [r for r in run.run.records if r.spec_decode is not None]
    panel = run.dashboard.panel["speculation"]
    assert panel.model.visible and list(panel.tokens.data["step"]) == [r.step for r in spec_steps]
    assert panel.totals["drafted"] == run.run.summary()["spec_num_draft_tokens"] > 0
    path = run.run.save_trace(tmp_path / "spec.json")
    replay = Replay(kvscope.load(path))
    again = replay.dashboard.panel["speculation"]
    assert list(again.tokens.data["accepted"]) == [r.spec_decode.num_accepted_tokens for r in spec_steps]
