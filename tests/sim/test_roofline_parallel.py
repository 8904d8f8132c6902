"""The roofline's tensor parallelism (1/tp of the bytes and FLOPs per GPU, two ring all-reduces per layer over the
interconnect) and mixture of experts (FLOPs of the active parameters, bytes of the experts a step touches), with
MoE shapes read from config.json."""

from __future__ import annotations

import json

import pytest

from kvscope.planning.gpus import INTERCONNECT_BYTES_S, find_gpu
from kvscope.planning.shapes import shape_from_config, shape_of_config
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import resolve_shape
from kvscope.telemetry.step_features import StepFeatures

LLAMA = resolve_shape("llama-70b", "bfloat16").spec
DECODE = StepFeatures(decode_tokens=32, num_seqs=32, context_tokens=32000, decode_context=32000)


def model(**kw) -> RooflineModel:
    return RooflineModel(find_gpu("h100"), LLAMA.num_params, 2, LLAMA.num_layers, LLAMA.num_heads, LLAMA.head_dim,
                         LLAMA.kv_bytes_per_token, overhead_s=0.0, **kw)


def test_tp_splits_the_step_and_adds_the_all_reduces_at_nvlink_speed():
    one, four = model(), model(tp=4)
    assert four.interconnect_bytes_s == INTERCONNECT_BYTES_S["h100"][0] == 450e9
    message = 32 * LLAMA.num_heads * LLAMA.head_dim * 2  # tokens x hidden x bf16
    allreduce = 2 * LLAMA.num_layers * (2 * 3 / 4 * message / 450e9 + 5e-6)
    assert four.allreduce_s(32) == pytest.approx(allreduce)
    assert four.predict(DECODE) == pytest.approx(one.predict(DECODE) / 4 + allreduce)
    slow = model(tp=4, interconnect_bytes_s=32e9)  # PCIe: the all-reduces cost more
    assert slow.predict(DECODE) > four.predict(DECODE)
    with pytest.raises(ValueError, match="tp=0"):
        model(tp=0)


MIXTRAL = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
           "max_position_embeddings": 32768}


def test_moe_shape_from_config_and_its_roofline(tmp_path):
    shape = shape_of_config(MIXTRAL, "mixtral")
    assert (shape.num_experts, shape.experts_per_token) == (8, 2)
    assert shape.expert_params == 32 * 8 * 3 * 4096 * 14336  # 45.1B of Mixtral-8x7B's 46.7B
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    assert shape_from_config(tmp_path).expert_params == shape.expert_params
    assert shape_of_config({**MIXTRAL, "num_local_experts": None}, "dense").num_experts == 0
    total = 46_702_792_704
    moe = RooflineModel(find_gpu("a100-80gb"), total, 2, 32, 32, 128, 32 * 8 * 128 * 2 * 2, overhead_s=0.0,
                        num_experts=8, experts_per_token=2, expert_params=shape.expert_params)
    assert moe.active_params == pytest.approx(12.9e9, rel=0.01)  # Mixtral's published 12.9B active
    dense = RooflineModel(find_gpu("a100-80gb"), total, 2, 32, 32, 128, 32 * 8 * 128 * 2 * 2, overhead_s=0.0)
    one = StepFeatures(decode_tokens=1, num_seqs=1, context_tokens=100, decode_context=100)
    assert moe.weight_bytes(1) == pytest.approx((total - shape.expert_params * 6 / 8) * 2)  # 2 of 8 experts read
    assert moe.predict(one) < dense.predict(one) / 3
    assert moe.weight_bytes(512) == pytest.approx(total * 2, rel=1e-6)  # a big batch reads every expert
    prefill = StepFeatures(prefill_tokens=8192, num_seqs=1, context_tokens=8192, prefill_attention=8192 * 4096)
    assert moe.predict(prefill) < dense.predict(prefill) / 3  # FLOPs of the active parameters only
    with pytest.raises(ValueError, match="mixture of experts"):
        RooflineModel(find_gpu("h100"), 10, 2, 1, 1, 1, 1, num_experts=8, experts_per_token=9, expert_params=5)
