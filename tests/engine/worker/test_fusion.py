"""oneDNN GEMMs and merged projections (kvscope/engine/worker/fusion.py): greedy tokens equal transformers', the
model object computes exactly what it did outside the engine, and the switch is the config's."""

import pytest
import torch
from helpers import hf_greedy, random_prompts

from kvscope import Engine, SamplingParams
from kvscope.engine.config import EngineConfig
from kvscope.engine.worker.fusion import FastModel, FusedLinears, onednn_usable, resolve_linear_backend
from kvscope.models.loader import TINY_ARCHS, build_tiny_model

ONEDNN = pytest.mark.skipif(not onednn_usable(torch.device("cpu"), torch.float32), reason="torch without oneDNN")
PROMPTS = random_prompts(10, 1, 60, seed=3)
# the throughput benchmark's model (benchmarks/harness.py LLAMA_60M), 2 layers instead of 8
BENCH_SHAPE = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, vocab_size=32000)


@ONEDNN
@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_matches_transformers(arch, merge):
    model = build_tiny_model(arch)
    refs = [hf_greedy(model, p, 16) for p in PROMPTS]
    engine = Engine(model, block_size=8, num_blocks=128, linear_backend="onednn", merge_projections=merge)
    assert engine.fused_linears is not None
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs


@ONEDNN
def test_benchmark_shape_matches_transformers():
    """Head size 64, GQA 2, SwiGLU 1376, a 32000 vocabulary, init std 0.02: the benchmark's layers."""
    model = build_tiny_model("llama", seed=0, init_std=0.02, **BENCH_SHAPE)
    prompts = random_prompts(6, 16, 200, seed=5, vocab=32000)
    refs = [hf_greedy(model, p, 24) for p in prompts]
    engine = Engine(model, block_size=16, num_blocks=128)  # the defaults: oneDNN, merged
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    assert engine.fused_linears.num_merged == 2 * BENCH_SHAPE["num_hidden_layers"]


@ONEDNN
def test_model_unchanged_outside_the_engine():
    model = build_tiny_model("qwen2")  # q/k/v with biases
    ids = torch.tensor([PROMPTS[0]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        fused = FusedLinears.build(model, "onednn", merge=True)
        after = model(input_ids=ids).logits
    assert torch.equal(before, after)  # the fast path only runs inside active()
    assert fused.num_merged == 2 * model.config.num_hidden_layers
    assert fused.extra_bytes > 0


@ONEDNN
@pytest.mark.parametrize("backend", ["onednn", "torch"])
def test_merged_outputs_match_each_linear(backend):
    torch.manual_seed(0)
    block = torch.nn.Module()
    block.q_proj, block.k_proj, block.v_proj = (torch.nn.Linear(64, n, bias=True) for n in (64, 32, 32))
    fused = FusedLinears.build(block, backend, merge=True)
    x, other = torch.randn(1, 7, 64), torch.randn(1, 7, 64)
    refs = [torch.nn.functional.linear(x, m.weight, m.bias) for m in (block.q_proj, block.k_proj, block.v_proj)]
    with torch.inference_mode(), fused.active():
        q = block.q_proj(x)
        k_other = block.k_proj(other)  # another input: its own GEMM, not the held slice
        k, v = block.k_proj(x), block.v_proj(x)
    for got, ref in zip((q, k, v), refs):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_other, torch.nn.functional.linear(other, block.k_proj.weight, block.k_proj.bias),
                               rtol=1e-5, atol=1e-5)
    assert fused.num_merged == 1
    group = fused.members[block.q_proj][0]
    assert group.x is None and group.outs == ()  # nothing held after the forward


def test_backend_choice():
    cpu = torch.device("cpu")
    assert resolve_linear_backend("torch", cpu, torch.float32) == "torch"
    assert resolve_linear_backend("auto", cpu, torch.bfloat16) == "torch"
    with pytest.raises(ValueError, match="float32"):
        resolve_linear_backend("onednn", cpu, torch.float16)
    with pytest.raises(ValueError, match="linear_backend"):
        EngineConfig(linear_backend="mkl")
    with pytest.raises(TypeError, match="merge_projections"):
        EngineConfig(merge_projections="yes")


def test_torch_without_merging_is_the_model_itself():
    model = build_tiny_model("llama")
    engine = Engine(model, num_blocks=64, linear_backend="torch", merge_projections=False)
    assert engine.fused_linears is None
    assert engine.runner.model is engine.model
    engine = Engine(model, num_blocks=64, linear_backend="torch", merge_projections=True)
    assert isinstance(engine.runner.model, FastModel)
    outs = engine.generate(PROMPTS[:3], SamplingParams(max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(model, p, 8) for p in PROMPTS[:3]]
