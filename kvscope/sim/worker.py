"""The model-free worker: what ``Engine.step`` calls in place of the ``ModelRunner`` in a simulation.

It is a ``kvscope.engine.protocols.Worker`` (as the ``ModelRunner`` is: ``EngineParts.runner`` is typed with it), and
has none of the runner's tensors:
``prepare`` reads the step's features off the ``SchedulerOutput`` and picks the requests that sample (in
the runner's packing order, so ``update_from_output`` sees them in the same order as in a real run);
``forward`` advances the virtual clock by the step-time model's prediction; ``sample`` gives each of them
one token that ends nothing (output lengths come from the requests' ``max_tokens``: the workload's, or
the recorded run's for a replay); ``verify``, with speculative decoding, accepts drafts at a given rate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from kvscope.engine.core.kv_groups import KVCacheConfig
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request
from kvscope.sim.speculative import accepted_drafts
from kvscope.sim.step_model import StepTimeModel
from kvscope.telemetry.step_features import StepFeatures, multi_token_indices, prefill_indices
from kvscope.utils.clock import VirtualClock


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
    backend_name: str = "simulated"  # no attention kernels run (the run metadata's attention_backend)
    predicted_s: float = 0.0  # total over the run
    acceptance_rate: float = 0.0  # speculative decoding: each draft position's chance (sim/speculative.py)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.kv_bytes_per_block

    def prepare(self, sched: SchedulerOutput) -> SimInput:
        requests, num_tokens, is_decode = sched.requests, sched.num_tokens, sched.is_decode
        spec = sched.scheduled_spec_decode_tokens
        if spec or not len(requests) == len(num_tokens) == len(is_decode):
            return self._prepare_general(sched)
        prefills = prefill_indices(is_decode)
        others = multi_token_indices(num_tokens, prefills)
        computed = [r.num_computed_tokens for r in requests]
        features = StepFeatures.of_columns(computed, num_tokens, prefills, others, self.block_size)
        return SimInput(_samples(requests, num_tokens, others), features, sched.total_num_tokens)

    def _prepare_general(self, sched: SchedulerOutput) -> SimInput:
        """``prepare`` of a step with drafts (or of a hand-made output whose lists disagree)."""
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


_computed = attrgetter("num_computed_tokens")


def _samples(requests: list[Request], num_tokens: list[int], others: list[int]) -> list[Request]:
    """The requests that reach the end of their tokens (and so sample), in packing order: the one-token
    requests by computed tokens, ties in schedule order, then the rest (``others``: their indices), as
    ``SchedulerOutput.packing_order``, whose order the runner's sampled tokens come in. Once per step over
    the batch: a stable sort of the requests themselves (no index lists to pick through), the one-token
    requests cut out by slices around the few others, and one filter."""
    ones, start = requests, 0
    if others:
        ones = []
        for i in others:
            ones += requests[start:i]
            start = i + 1
        ones += requests[start:]
    samples = [r for r in sorted(ones, key=_computed) if r.num_computed_tokens + 1 == len(r.all_token_ids)]
    for i in others:
        r = requests[i]
        if r.num_computed_tokens + num_tokens[i] == len(r.all_token_ids):
            samples.append(r)
    return samples
