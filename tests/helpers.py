"""Helpers shared by tests: reference generation with transformers, seeded prompt sets."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvscope.watched.vllm_demo import VllmServer, start_vllm


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos: bool = False) -> list[int]:
    """transformers' own greedy ``generate`` for one prompt, with its default (dynamic) cache.

    ``eos=False`` makes it run all ``max_new_tokens`` by giving it no EOS token, which matches
    ``SamplingParams(ignore_eos=True)``.
    """
    attn = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        kwargs = {} if eos else {"eos_token_id": None}
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
            **kwargs,
        )
    finally:
        model.set_attn_implementation(attn)
    return out[0, len(prompt_ids) :].tolist()


def random_prompts(
    n: int, lo: int, hi: int, vocab: int = 512, seed: int = 0, shared_prefix: int = 0, num_shared: int = 0
) -> list[list[int]]:
    """``n`` prompts of lengths in [lo, hi]; the last ``num_shared`` start with one common prefix."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n - num_shared)]
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    prompts += [
        prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 8))] for _ in range(num_shared)
    ]
    return prompts


def serve(python: Path, model: Path, workdir: Path, **kwargs) -> Iterator[VllmServer]:
    """A server for a fixture to yield from: started (or the test fails with its log), always stopped."""
    try:
        server = start_vllm(model, workdir, python=python, **kwargs)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def print_reliability_figures(terminalreporter, figures: dict[str, dict[str, int]]) -> None:
    """The reliability tests' figures (tests/reliability/conftest.py gathers them), one line a module."""
    if figures:
        terminalreporter.section("kvscope reliability figures")
        for name in sorted(figures):
            terminalreporter.write_line(f"{name}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(figures[name].items())))
