"""The capacity planner's arithmetic (kvscope/planning/planner.py), checked against hand calculations and the engine."""

from __future__ import annotations

import math

import pytest

from kvscope.engine.config import ModelSpec
from kvscope.planning.planner import make_plan, render
from kvscope.planning.shapes import KNOWN_MODELS, ModelShape, known_shape
from kvscope.utils.units import GiB, fmt_bytes, parse_bytes

LLAMA7B = ModelShape("llama-7b-shaped", num_layers=32, num_kv_heads=32, head_dim=128)


def test_course_worked_example():
    """7B Llama, fp16, 40 GB GPU, 14 GB weights, 4 GB reserve, max 2048, avg 512 (binary GB)."""
    p = make_plan(LLAMA7B, dtype="fp16", gpu_mem=parse_bytes("40GB"), weights=parse_bytes("14GB"),
                  reserve=parse_bytes("4GB"), max_len=2048, avg_len=512, block_size=16)
    assert p.kv_bytes_per_token == 512 * 1024 == 2 * 32 * 32 * 128 * 2
    assert p.kv_budget == 22 * GiB
    assert p.static_bytes_per_request == 1 * GiB
    assert p.static_max_requests == 22
    assert p.blocks_per_request == 32  # 512 / 16, no rounding needed
    assert p.paged_bytes_per_request == 256 * 1024**2
    assert p.paged_max_requests == 88
    assert p.ratio == 4.0
    assert p.static_waste == 0.75 and p.paged_waste == 0.0


@pytest.mark.parametrize("avg_len, block_size", [(500, 16), (513, 16), (100, 32), (1, 256), (2048, 1)])
def test_paged_figure_rounds_to_whole_blocks(avg_len, block_size):
    p = make_plan(LLAMA7B, gpu_mem=40 * GiB, weights=14 * GiB, reserve=4 * GiB, avg_len=avg_len,
                  block_size=block_size)
    blocks = math.ceil(avg_len / block_size)
    assert p.blocks_per_request == blocks
    per_request = blocks * block_size * p.kv_bytes_per_token
    assert p.paged_max_requests == (22 * GiB) // per_request
    # and the number is really the largest that fits, in whole blocks
    assert p.paged_max_requests * blocks <= p.kv_budget_blocks < (p.paged_max_requests + 1) * blocks
    assert 0 <= p.paged_waste < 1 and p.paged_waste == pytest.approx(1 - avg_len / (blocks * block_size))


def test_block_rounding_costs_concurrency():
    """513 tokens need 33 blocks of 16, so fewer requests fit than at 512 tokens."""
    kw = dict(gpu_mem=40 * GiB, weights=14 * GiB, reserve=4 * GiB)
    assert make_plan(LLAMA7B, avg_len=512, **kw).paged_max_requests == 88
    assert make_plan(LLAMA7B, avg_len=513, **kw).paged_max_requests == 2816 // 33 == 85


def test_gqa_and_dtype_shrink_the_cache():
    llama70 = known_shape("llama-70b")
    assert make_plan(llama70).kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # 320 KiB, GQA with 8 KV heads
    assert make_plan(LLAMA7B, dtype="fp32").kv_bytes_per_token == 1024 * 1024
    assert make_plan(LLAMA7B, dtype="fp8").kv_bytes_per_token == 256 * 1024


def test_weights_from_known_params():
    """The course's rule: billions of parameters x bytes as GiB, a known model by its size class (7B, not 6.74B);
    others by their count."""
    p = make_plan(known_shape("llama-7b"), gpu_mem=40 * GiB, reserve=4 * GiB)
    assert p.weights == 14 * GiB
    assert p.kv_budget == 40 * GiB - p.weights - 4 * GiB
    assert "7B params x 2 B" in p.weights_source and "6.74B" in p.weights_source
    assert make_plan(known_shape("smollm2"), gpu_mem=40 * GiB).weights == round(0.134515008 * 2 * GiB)


def test_the_defaults_are_the_course_chapters():
    """``kvscope plan --model llama-7b --gpu-mem 40GiB`` (the README's line): 14 GiB of weights, a 4 GiB reserve,
    2048 tokens at most -> 22 static, 88 paged; a model whose maximum is below 2048 plans for its maximum."""
    p = make_plan(known_shape("llama-7b"), gpu_mem=parse_bytes("40GiB"))
    assert (p.weights, p.reserve, p.kv_budget, p.max_len) == (14 * GiB, 4 * GiB, 22 * GiB, 2048)
    assert (p.static_max_requests, p.paged_max_requests) == (22, 88)
    assert make_plan(known_shape("gpt2"), gpu_mem=24 * GiB).max_len == 1024


def test_the_readme_line_reproduces_the_chapter(capsys):
    from kvscope.cli.parser import Parser
    from kvscope.cli.plan import COMMAND, cmd_plan

    parser = Parser(prog="kvscope")
    COMMAND.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    assert cmd_plan(parser.parse_args(["plan", "--model", "llama-7b", "--gpu-mem", "40GiB"])) == 0
    out = capsys.readouterr().out
    assert "max concurrent requests = 22 GiB / 1 GiB = 22" in out and "= 88" in out
    from pathlib import Path

    readme = Path(__file__).parents[2] / "README.md"
    assert "kvscope plan --model llama-7b --gpu-mem 40GiB" in readme.read_text(encoding="utf-8")


def test_plan_and_simulate_static_agree_on_the_same_inputs():
    """One rule for the weights, the reserve and the longest sequence: ``kvscope simulate --gpu G --static``
    runs as many requests at once as ``kvscope plan`` counts for G's memory."""
    from kvscope.planning.gpus import find_gpu
    from kvscope.runs.setup.simulated import SimSpec, prepare_simulation
    from kvscope.runs.setup.spec import EngineSpec, RunSpec, WorkloadSpec

    for gpu, model in (("a100-40gb", "llama-7b"), ("h100", "llama-13b"), ("l4", "qwen2.5-7b")):
        spec = RunSpec(model=model, workload=WorkloadSpec(requests=4), engine=EngineSpec(max_num_seqs=10_000))
        setup = prepare_simulation(spec, SimSpec(gpu=gpu, static=True))
        plan = make_plan(known_shape(model), dtype="bf16", gpu_mem=find_gpu(gpu).memory_bytes)
        assert setup.config.max_model_len == plan.max_len == 2048, (gpu, model)
        assert setup.config.max_num_seqs == plan.static_max_requests, (gpu, model)


def _spec_from_config(config, dtype) -> ModelSpec:
    """A ``ModelSpec`` read from a transformers config's attribute names (every layer alike)."""
    num_heads = config.num_attention_heads
    return ModelSpec(
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
        num_heads=num_heads,
        dtype=dtype,
    )


def test_planner_matches_engine_spec_for_embedded_models():
    """The known shape of 'tiny' and 'smollm2' gives the engine's own bytes per token (fp32 on the CPU)."""
    import torch

    from kvscope.models.loader import tiny_config

    spec = _spec_from_config(tiny_config(), torch.float32)
    assert make_plan(known_shape("tiny"), dtype="fp32").kv_bytes_per_token == spec.kv_bytes_per_token
    smol = known_shape("smollm2")
    assert (smol.num_layers, smol.num_kv_heads, smol.head_dim) == (30, 3, 64)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="avg-len"):
        make_plan(LLAMA7B, max_len=512, avg_len=1024)
    with pytest.raises(ValueError, match="nothing is left for the KV cache"):
        make_plan(LLAMA7B, gpu_mem=16 * GiB, weights=14 * GiB, reserve=4 * GiB)
    with pytest.raises(ValueError, match="--weights"):
        make_plan(ModelShape("x", 2, 2, 2), gpu_mem=GiB)
    with pytest.raises(ValueError, match="dtype"):
        make_plan(LLAMA7B, dtype="int3")


def test_no_static_request_fits():
    p = make_plan(LLAMA7B, gpu_mem=2 * GiB, weights=0, reserve=0, max_len=4096, avg_len=512)
    assert p.static_max_requests == 1 and p.paged_max_requests == 8
    p = make_plan(LLAMA7B, gpu_mem=GiB, weights=0, reserve=0, max_len=4096, avg_len=512)
    assert p.static_max_requests == 0 and p.ratio is None
    assert "not even one" in render(p)


def test_fmt_bytes():
    assert fmt_bytes(512 * 1024) == "512 KiB"
    assert fmt_bytes(22 * GiB) == "22 GiB"
    assert fmt_bytes(1536 * 1024**2) == "1.5 GiB"
    assert fmt_bytes(100) == "100 B"
    assert fmt_bytes(1023.9 * 1024**2) == "1024 MiB" and fmt_bytes(2.81 * GiB) == "2.81 GiB"


def test_every_known_model_plans():
    for name, shape in KNOWN_MODELS.items():
        p = make_plan(shape, dtype="bf16", gpu_mem=1024 * GiB, reserve=0, weights=shape.num_params * 2 or GiB)
        assert p.kv_bytes_per_token == 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2, name
        assert p.paged_max_requests >= p.static_max_requests >= 1, name
        assert (p.num_sliding_layers > 0) == (name in ("mistral-7b", "gemma-2-9b", "gpt-oss-20b")), name


def test_sliding_window_layers_hold_only_their_window():
    """Gemma-2-9B-shaped: 21 of 42 layers read the last 4096 tokens. At 32k tokens a static cache keeps
    4096 slots in those layers and a paged engine 257 blocks of 16 (the window plus one straddled block)."""
    shape = ModelShape("g2", 42, 8, 256, sliding_window=4096, num_sliding_layers=21)
    p = make_plan(shape, dtype="bf16", gpu_mem=80 * GiB, weights=0, reserve=0, max_len=32768, avg_len=32768,
                  block_size=16)
    per_layer = 2 * 8 * 256 * 2
    assert p.kv_bytes_per_token == 42 * per_layer  # the every-layer figure is still what one token costs
    assert p.static_bytes_per_request == (21 * 32768 + 21 * 4096) * per_layer
    assert p.blocks_per_request == 2048 and p.sliding_blocks_per_request == 4096 // 16 + 1
    assert p.paged_bytes_per_request == (21 * 2048 + 21 * 257) * 16 * per_layer
    assert p.paged_max_requests == (80 * GiB) // p.paged_bytes_per_request
    plain = make_plan(ModelShape("g2-full", 42, 8, 256), dtype="bf16", gpu_mem=80 * GiB, weights=0, reserve=0,
                      max_len=32768, avg_len=32768, block_size=16)
    assert p.paged_max_requests > 1.7 * plain.paged_max_requests  # about half the cache
    assert "21 of 42 layers read only the last 4096 tokens" in render(p)
    # a short request never reaches the window: the same blocks as without one
    short = make_plan(shape, avg_len=100, max_len=2048)
    assert short.sliding_blocks_per_request == short.blocks_per_request == 7
