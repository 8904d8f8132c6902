"""The roofline step model: decode is bandwidth-bound (the weights are read for a few tokens), a long prefill is
compute-bound, and the numbers are the data sheet's."""

from __future__ import annotations

import pytest

from kvscope.planning.gpus import GPUS, find_gpu
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import resolve_shape
from kvscope.telemetry.step_features import StepFeatures

LLAMA = resolve_shape("llama-7b", "bfloat16").spec


def model(gpu: str = "a100-40gb", **kw) -> RooflineModel:
    return RooflineModel(find_gpu(gpu), LLAMA.num_params, 2, LLAMA.num_layers, LLAMA.num_heads, LLAMA.head_dim,
                         LLAMA.kv_bytes_per_token, **kw)


def test_decode_is_bandwidth_bound_and_costs_the_weights_over_the_bandwidth():
    m = model(overhead_s=0.0)
    one = StepFeatures(decode_tokens=1, num_seqs=1, context_tokens=100, decode_context=100)
    weights_s = LLAMA.num_params * 2 / (1555e9 * 0.8)
    assert m.predict(one) == pytest.approx(weights_s, rel=0.01)  # ~10.8 ms: 13.5 GB at 1.24 TB/s
    batch = StepFeatures(decode_tokens=32, num_seqs=32, context_tokens=3200, decode_context=3200)
    moved = LLAMA.num_params * 2 + (3200 + 32) * LLAMA.kv_bytes_per_token  # the weights once, and the K/V read
    assert m.predict(batch) == pytest.approx(moved / (1555e9 * 0.8), rel=1e-9)
    assert m.predict(batch) < 32 * m.predict(one) / 20  # 32 tokens cost far less than 32 single steps


def test_a_long_prefill_is_compute_bound():
    m = model(overhead_s=0.0)
    prefill = StepFeatures(prefill_tokens=4096, num_seqs=1, context_tokens=4096, prefill_attention=4096 * 4096)
    flops = 2 * LLAMA.num_params * 4096 + 4 * 32 * 32 * 128 * 4096 * 4096
    assert m.predict(prefill) == pytest.approx(flops / (312e12 * 0.6), rel=1e-6)


def test_h100_is_faster_than_a100_and_gpus_are_named():
    f = StepFeatures(decode_tokens=8, num_seqs=8, context_tokens=8000, decode_context=8000)
    assert model("h100").predict(f) < model("a100-40gb").predict(f)
    assert find_gpu("A100").name == "a100-40gb" and find_gpu("h100-80gb").name == "h100"
    assert set(GPUS) >= {"a100-40gb", "h100", "h200"}
    with pytest.raises(ValueError, match="unknown GPU 'b300'"):
        find_gpu("b300")
    with pytest.raises(ValueError, match="parameter count"):
        RooflineModel(find_gpu("h100"), 0, 2, 1, 1, 1, 1)
