"""``ModelInput``: one step packed for the model by ``ModelRunner.prepare`` (the worker's side of the step's
hand-off; the scheduler's side is ``engine/core/output.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope.engine.request import Request
from kvscope.engine.worker.attention import AttentionMetadata


@dataclass(slots=True)
class ModelInput:
    """One step, packed: all scheduled tokens of all requests as a single sequence ``[1, T]``."""

    input_ids: torch.Tensor  # [1, T]
    positions: torch.Tensor  # [1, T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [S]: packed positions whose logits produce a token
    sample_requests: list[Request]  # request of each sampled token (its logits rows, in order)
    num_tokens: int
    # speculative decoding: the drafts of each sample request ([] for none), whose 1 + k logits rows
    # are consecutive; None when nothing in the step has drafts
    spec_drafts: list[list[int]] | None = None
