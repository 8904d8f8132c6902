"""Speculative decoding: n-gram (prompt lookup, ``ngram.py``) and draft-model (``draft_model.py``) proposers,
configured by ``SpeculativeConfig`` (``config.py``) and verified by rejection sampling
(``kvscope.engine.worker.rejection``) in the target's one forward pass per step (see ``speculator.py`` for how a
step uses them)."""

from __future__ import annotations

from typing import Any

import torch

from kvscope.engine.spec_decode.config import SpeculativeConfig
from kvscope.engine.spec_decode.ngram import NgramProposer
from kvscope.engine.spec_decode.speculator import Proposer, Speculator

__all__ = ["SpeculativeConfig", "Speculator", "build_speculator"]


def build_speculator(
    config: SpeculativeConfig,
    *,
    target_vocab: int,
    target_tokenizer: Any,
    block_size: int,
    num_blocks: int,
    enable_prefix_caching: bool,
    backend: Any,
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
    telemetry: bool,
) -> Speculator:
    """The engine's ``Speculator``: an n-gram proposer, or a draft model loaded, checked against the
    target (vocabulary, context length; ``ValueError`` with the reason) and given its own KV pool of
    ``num_blocks`` blocks of ``block_size`` tokens."""
    if config.method == "ngram":
        proposer: Proposer = NgramProposer(config.k, *config.prompt_lookup)
    else:
        from kvscope.engine.spec_decode.draft_model import build_draft_proposer

        proposer = build_draft_proposer(config, target_vocab, target_tokenizer, block_size, num_blocks,
                                        enable_prefix_caching, backend, device, dtype, max_model_len, telemetry)
    return Speculator(config, proposer, max_model_len)
