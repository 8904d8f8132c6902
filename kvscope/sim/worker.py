"""The model-free worker: what ``Engine.step`` calls in place of the ``ModelRunner`` in a simulation.

It has the runner's methods and the attributes the run metadata reads, and none of its tensors:
``prepare`` reads the step's features off the ``SchedulerOutput`` and picks the requests that sample (in
the runner's packing order, so ``update_from_output`` sees them in the same order as in a real run);
``forward`` advances the virtual clock by the step-time model's prediction; ``sample`` gives each of them
one token that ends nothing (output lengths come from the requests' ``max_tokens``: the workload's, or
the recorded run's for a replay); ``verify``, with speculative decoding, accepts drafts at a given rate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from kvscope.engine.core.kv_groups import KVCacheConfig
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request
from kvscope.sim.features import StepFeatures
from kvscope.sim.speculative import accepted_drafts
from kvscope.sim.step_model import StepTimeModel
from kvscope.utils.clock import VirtualClock


@dataclass(slots=True)
class SimBackend:
    name: str = "simulated"


@dataclass(slots=True)
class SimInput:
    """One simulated step: who samples, and what the step-time model is asked about."""

    sample_requests: list[Request]
    features: StepFeatures
    num_tokens: int
    spec_drafts: list[list[int]] | None = None  # per sample request, the drafts it verifies (None: no drafts)


@dataclass(slots=True)
class SimWorker:
    step_model: StepTimeModel
    clock: VirtualClock
    block_size: int
    num_blocks: int
    kv_bytes_per_block: int
    kv_config: KVCacheConfig
    token_id: int = 0  # what every simulated step samples (never an end-of-sequence token)
    backend: SimBackend = field(default_factory=SimBackend)
    predicted_s: float = 0.0  # total over the run
    acceptance_rate: float = 0.0  # speculative decoding: each draft position's chance (sim/speculative.py)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.kv_bytes_per_block

    def prepare(self, sched: SchedulerOutput) -> SimInput:
        requests, new, computed = sched.packing_order()
        features = StepFeatures.of_schedule(sched, self.block_size)
        spec = sched.scheduled_spec_decode_tokens
        if not spec:
            samples = [r for r, n, c in zip(requests, new, computed) if c + n == len(r.all_token_ids)]
            return SimInput(samples, features, sched.total_num_tokens)
        samples, drafts = [], []  # as the runner's: those that reach the end of their tokens and drafts
        for r, n, c in zip(requests, new, computed):
            d = spec.get(r.request_id, [])
            if c + n == r.num_tokens + len(d):
                samples.append(r)
                drafts.append(d)
        return SimInput(samples, features, sched.total_num_tokens, drafts)

    def forward(self, inp: SimInput) -> None:
        seconds = self.step_model.predict(inp.features)
        self.predicted_s += seconds
        self.clock.advance(round(seconds * 1e9))

    def sample(self, logits: Any, inp: SimInput) -> list[int]:
        return [self.token_id] * len(inp.sample_requests)

    def verify(self, logits: Any, inp: SimInput, draft_probs: Any = None) -> tuple[list[int], dict[str, int]]:
        """A step with drafts: a token per sample request, and how many of each one's drafts were accepted."""
        accepted = {r.request_id: accepted_drafts(len(d), self.acceptance_rate, self.rng)
                    for r, d in zip(inp.sample_requests, inp.spec_drafts or []) if d}
        return self.sample(logits, inp), accepted
