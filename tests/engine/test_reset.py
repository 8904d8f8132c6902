"""Engine.reset (issue 37): a loaded engine made as new for the next run, model and KV pages kept."""

from __future__ import annotations

import pytest

from kvscope import Engine, SamplingParams

PROMPTS = [list(range(5, 45)), [*range(5, 37), 90, 91, 92]]  # a shared 32-token prefix


def _run(engine: Engine):
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    pool = engine.pool
    return [o.token_ids for o in outs], (pool.prefix_cache_queries, pool.prefix_cache_hits), engine.step_index


def test_a_reset_engine_runs_as_a_fresh_one_and_keeps_its_model():
    engine = Engine("tiny", block_size=8, num_blocks=32)
    model, pages = engine.model, engine.runner.kv_caches[0][0]
    first = _run(engine)
    assert first[1][1] > 0  # the second prompt found the first one's prefix
    assert engine.pool.cached  # blocks kept for the prefix cache
    engine.reset()
    assert not engine.pool.cached and engine.step_index == 0 and engine.recorder.num_steps_recorded == 0
    assert engine.model is model and engine.runner.kv_caches[0][0] is pages and not pages.any()
    assert _run(engine) == first == _run(Engine("tiny", block_size=8, num_blocks=32))


def test_reset_refuses_an_engine_with_requests_or_a_draft_side():
    engine = Engine("tiny", block_size=8, num_blocks=32)
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="1 unfinished requests: abort them first"):
        engine.reset()
    engine.abort_all()
    engine.reset()
    spec = Engine("tiny", block_size=8, num_blocks=32,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(RuntimeError, match="no speculative decoding can be reset"):
        spec.reset()
