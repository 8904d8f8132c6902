"""``kvscope.pd.blocks``: which of a prompt's blocks a hand-over may move, and caching those that arrived."""

from __future__ import annotations

from kvscope.engine.core.block_pool import BlockPool
from kvscope.pd.blocks import attach, prompt_prefix


def test_the_last_tokens_block_never_moves():
    pool = BlockPool(16, 4)
    assert len(prompt_prefix(pool, list(range(8)))[0]) == 1  # 8 tokens: the 2nd block holds the last token
    assert len(prompt_prefix(pool, list(range(9)))[0]) == 2
    assert prompt_prefix(pool, [1]) == ([], [])


def test_attached_blocks_extend_the_held_chain():
    producer, consumer = BlockPool(16, 4), BlockPool(16, 4)
    prompt = list(range(100, 117))  # 4 full blocks may move
    hashes, held = prompt_prefix(consumer, prompt)
    assert len(hashes) == 4 and held == []
    first = consumer.allocate(2)
    attach(consumer, hashes[:2], [], first)  # an earlier request brought the first two
    _, held = prompt_prefix(consumer, prompt)
    assert held == first
    new = consumer.allocate(2)
    attach(consumer, hashes, held, new)
    assert prompt_prefix(consumer, prompt)[1] == first + new
    assert prompt_prefix(producer, prompt)[1] == []  # each pool has its own prefix cache
    other = prompt[:8] + [0] * 9  # shares the first two blocks only
    assert prompt_prefix(consumer, other)[1] == first
