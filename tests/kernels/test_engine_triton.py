"""The whole engine on the Triton kernels (through the interpreter) gives the torch backend's greedy
tokens on the tiny model (GQA 4:2, head size 16), with chunked prefill, mixed prefill/decode steps and
prefix-cache hits. Kept small: on a CPU-only machine the interpreter runs every kernel program in Python
(with a GPU, both engines run on it in float32)."""

from __future__ import annotations

import random

import pytest
import torch

from kvscope import Engine, SamplingParams

BUDGET = 16  # max_num_batched_tokens: the 23- and 25-token prompts are chunked


def prompts() -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(3)
    tokens = lambda n: [rng.randrange(3, 512) for _ in range(n)]  # noqa: E731
    prefix = tokens(20)  # two full pages of 8 are shared
    return [prefix + tokens(3)], [prefix + tokens(5), tokens(9)]


def run(backend: str) -> tuple[Engine, list[list[int]]]:
    engine = Engine(
        "tiny", attention_backend=backend, block_size=8, num_blocks=32, max_num_batched_tokens=BUDGET
    )
    first, second = prompts()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = engine.generate(first, params) + engine.generate(second, params)  # the second call hits the prefix
    return engine, [o.token_ids for o in outs]


def test_triton_backend_matches_torch_backend():
    _, expected = run("torch")
    engine, got = run("triton")
    assert engine.runner.backend.name == "triton"
    assert got == expected
    steps = engine.recorder.steps
    assert engine.pool.prefix_cache_hits > 0
    assert all(s.num_tokens <= BUDGET for s in steps)
    assert any(s.num_prefill_seqs > 0 and s.num_decode_seqs > 0 for s in steps)  # mixed batches


def reference(model, prompt: list[int], n: int) -> list[int]:
    """The model's own greedy tokens, one full forward pass per token (no transformers cache)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("model_type", ["gpt_oss", "gemma2", "llama4_text", "deepseek_v3"])
def test_triton_runs_windows_sinks_softcaps_chunks_and_mla_like_transformers(model_type):
    """Sliding windows and sinks (gpt-oss), softcapping (Gemma 2), chunked attention (Llama 4), value heads
    of their own size (DeepSeek's MLA), all through the Triton kernels: prompts past the 16-token windows
    and chunks, decoding across them, a cached prefix read by a later prefill chunk."""
    from kvscope.models.zoo import tiny_model

    model = tiny_model(model_type)
    first, second = prompts()
    with torch.inference_mode():
        expected = [reference(model, p, 4) for p in first + second]
    engine = Engine(model, attention_backend="triton", block_size=8, num_blocks=32, max_num_batched_tokens=BUDGET,
                    dtype="float32", max_model_len=512)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = engine.generate(first, params) + engine.generate(second, params)
    assert [o.token_ids for o in outs] == expected
    assert engine.pool.prefix_cache_hits > 0
    layers = engine.spec.layers
    assert any(x.sliding_window or x.attention_chunk or x.softcap or x.sinks or x.head_dim_v for x in layers)
