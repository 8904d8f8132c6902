"""Helpers of the telemetry tests (importable from test modules, unlike conftest)."""

from __future__ import annotations

from kvscope import Engine, SamplingParams

# Prompts of known lengths with no common first block (block_size 4): 5 and 7 tokens.
PROMPT_A = [11, 12, 13, 14, 15]
PROMPT_B = [21, 22, 23, 24, 25, 26, 27]


def make_engine(**kwargs) -> Engine:
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("num_blocks", 64)
    kwargs.setdefault("max_model_len", 128)
    return Engine("tiny", **kwargs)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)
