"""Every architecture the engine tests check, through a 1P1D engine over both transports: the colocated
engine's greedy tokens, with prompts long enough to chunk and sharing a prefix."""

import pytest

from kvscope import Engine, PDEngine, SamplingParams
from kvscope.models.loader import TINY_ARCHS

CASES = [("tiny-qwen2", "zmq"), ("tiny-qwen3", "shm"), ("tiny-mistral", "zmq"), ("tiny-gpt2", "shm")]
PROMPTS = [list(range(3, 70)), list(range(3, 40)) + [9] * 20, [5, 6, 7], list(range(100, 133))]
KW = dict(block_size=8, num_blocks=96, max_num_batched_tokens=32)  # a 67-token prompt takes 3 chunks


def test_the_cases_cover_every_tiny_architecture():
    assert {m.removeprefix("tiny-") for m, _ in CASES} | {"llama"} == set(TINY_ARCHS)  # llama: test_pd_engine


@pytest.mark.parametrize(("model", "transport"), CASES)
def test_greedy_tokens_match_colocated(model, transport):
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    ref = Engine(model, **KW).generate(PROMPTS, params)
    config = {"kv_connector_extra_config": {"transport": transport}}
    with PDEngine(model, pd="1P1D", kv_transfer_config=config, **KW) as engine:
        outs = engine.generate(PROMPTS, params)
        assert [o.token_ids for o in outs] == [r.token_ids for r in ref]
        assert {t.transport for t in engine.transfers} == {transport}
        assert engine.transfers[1].num_held_blocks == 4  # the shared 37-token prefix: 4 full blocks
        assert all(s["num_used_blocks"] == 0 for s in engine.instance_stats().values())
