"""The occupancy panel draws the blocks a sliding-window model frees, and only for such a model."""

from __future__ import annotations

import torch

from kvscope import Engine, Run, SamplingParams
from kvscope.models.loader import build_tiny_model
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.base import PanelContext
from kvscope.widgets.panels.occupancy import OccupancyPanel

torch.set_num_threads(1)


def _run(**model_kwargs) -> Run:
    engine = Engine(build_tiny_model("mistral", **model_kwargs), block_size=4, num_blocks=64, max_model_len=256)
    engine.generate([list(range(5, 85))], SamplingParams(max_tokens=40, ignore_eos=True))
    return Run.from_engine(engine)


def test_occupancy_panel_shows_the_freed_blocks_only_when_there_are_some():
    run = _run(sliding_window=16)
    panel = OccupancyPanel.create(PanelContext(stats=None, rollover=None))
    assert not panel.window_line.visible
    panel.update(Tick(steps=run.records, final=True))
    freed = panel.source.data["window_freed"]
    assert panel.window_line.visible and panel.window_item.visible
    total = sum(round(f * run.records[0].kv.num_blocks) for f in freed)
    assert total == run.records[-1].kv.num_window_freed_blocks - run.records[0].kv.num_window_freed_blocks



def test_no_line_without_a_window():
    panel = OccupancyPanel.create(PanelContext(stats=None, rollover=None))
    panel.update(Tick(steps=_run().records, final=True))
    assert not panel.window_line.visible and set(panel.source.data["window_freed"]) == {0.0}


def test_page_map_cells_carry_the_kv_group():
    from kvscope.models.zoo import tiny_model
    from kvscope.widgets.panels.page_map import PageMapPanel

    engine = Engine(tiny_model("gemma3_text"), block_size=4, num_blocks=256, max_model_len=256)
    engine.generate([list(range(5, 45))], SamplingParams(max_tokens=8, ignore_eos=True))
    run = Run.from_engine(engine)
    panel = PageMapPanel.create(PanelContext(stats=None, rollover=None))
    panel.update(Tick(steps=run.records[:3], final=False))  # while the request holds its blocks
    cells = panel.source.data
    held = [g for g, s in zip(cells["kv_group"], cells["state"]) if s != "free"]
    assert len(set(held)) == engine.kv_config.num_groups > 1
    assert ("KV group", "@kv_group") in panel.figure.hover[0].tooltips
