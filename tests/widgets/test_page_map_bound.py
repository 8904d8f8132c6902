"""The page-map panel draws the blocks the page map covers (issue 38 item 3): a record of a pool of 10**12
blocks builds a grid of the first 65,536 (bounded), and the title says which part of the pool it shows."""

from __future__ import annotations

import dataclasses

from kvscope.engine.engine import Engine
from kvscope.engine.request import SamplingParams
from kvscope.runs.result.run import Run
from kvscope.telemetry.pagemap import MAX_MAPPED_BLOCKS
from kvscope.widgets.feed import Tick
from kvscope.widgets.panels.page_map import PageMapPanel


def test_a_huge_pool_draws_the_mapped_blocks_and_says_so():
    engine = Engine("tiny", num_blocks=32, block_size=4)
    engine.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=2, ignore_eos=True))
    record = Run.from_engine(engine).records[0]
    huge = dataclasses.replace(record, kv=dataclasses.replace(record.kv, num_blocks=10**12))
    panel = PageMapPanel()
    panel.update(Tick([huge]))
    assert panel.num_blocks == MAX_MAPPED_BLOCKS
    assert "first 65,536 of 1,000,000,000,000 blocks" in panel.figure.title.text
    small = PageMapPanel()
    small.update(Tick([record]))
    assert small.num_blocks == 32 and "of" not in small.figure.title.text
