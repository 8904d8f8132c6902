"""Speculative decoding in a simulation: the engine's own ``Speculator`` with a model-free proposer.

``SimProposer`` drafts ``k`` placeholder tokens for every request ready to decode (what the engine's
``Speculator`` asks for, capped as it caps them), so the scheduler schedules, allocates and trims exactly as
for real drafts. Which of them are accepted is the worker's ``verify``: each draft position is accepted with
probability ``acceptance_rate`` until the first rejection (``accepted_drafts``), seeded, so a run is repeatable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvscope.engine.request import Request


class SimProposer:
    def __init__(self, token_id: int) -> None:
        self.token_id = token_id

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        return [[self.token_id] * max(0, cap) for cap in max_drafts]

    def free(self, request_id: str) -> None:
        """Nothing is kept per request."""


def accepted_drafts(num_drafts: int, acceptance_rate: float, rng: random.Random) -> int:
    """How many of ``num_drafts`` drafts are accepted: each in turn with probability ``acceptance_rate``,
    stopping at the first rejection (what rejection sampling does to a run of drafts)."""
    n = 0
    while n < num_drafts and rng.random() < acceptance_rate:
        n += 1
    return n
