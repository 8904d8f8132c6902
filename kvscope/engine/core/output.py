"""The step's hand-off types: what one part of ``Engine.step`` hands the next.

``Scheduler.schedule`` -> ``SchedulerOutput`` -> the worker (``ModelRunner.prepare`` packs it into a
``ModelInput``, ``worker/model_input.py``; ``forward``; ``sample`` or ``verify``) -> token ids ->
``Scheduler.update_from_output`` -> ``SchedulerUpdate`` -> the engine's ``StreamDelta``s and the step's
telemetry (``engine/source.py``). Plain data only (vLLM: ``v1/core/sched/output.py``). ``ModelInput`` holds
tensors and attention metadata, so it lives with the worker: the core never imports the worker, which is what
lets a model-free worker drive the same scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from kvscope.engine.request import Request

_computed = attrgetter("num_computed_tokens")


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes: ``requests[i]`` gets ``num_tokens[i]`` new tokens."""

    requests: list[Request] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    is_decode: list[bool] = field(default_factory=list)  # one new token after an output token
    admitted: list[Request] = field(default_factory=list)  # left the waiting queue this step
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)  # could never fit; finished with an error
    total_num_tokens: int = 0
    # request id -> the drafts verified this step, after its last sampled token (vLLM's name)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.requests

    def packing_order(self) -> tuple[list[Request], list[int], list[int]]:
        """The scheduled requests, their new tokens and their computed tokens, in the order a worker packs
        them: decodes first, shortest context first (the torch path buckets them by length), then prefills.
        The tokens a step samples come back to ``update_from_output`` in this order, for any worker."""
        # Once per step over every scheduled request: a stable sort (ties keep schedule order) of the
        # requests themselves when all get one token, else of indices by computed tokens, rather than of
        # (computed, index) tuples.
        scheduled, num_tokens = self.requests, self.num_tokens
        if num_tokens.count(1) == len(num_tokens) == len(scheduled):  # one token each (the common step)
            requests = sorted(scheduled, key=_computed)
            return requests, num_tokens[:], [r.num_computed_tokens for r in requests]
        computed = [r.num_computed_tokens for r in scheduled]
        order = [i for i, n in enumerate(num_tokens) if n == 1]
        order.sort(key=computed.__getitem__)
        order += [i for i, n in enumerate(num_tokens) if n != 1]
        return [scheduled[i] for i in order], [num_tokens[i] for i in order], [computed[i] for i in order]


@dataclass(slots=True)
class SchedulerUpdate:
    """What ``update_from_output`` did (vLLM: ``EngineCoreOutputs``)."""

    requests: list[Request] = field(default_factory=list)  # got a token this step, in sampling order
    token_ids: list[int] = field(default_factory=list)  # the token each got
    finished: list[Request] = field(default_factory=list)  # of those, finished by a stop condition
    # speculative decoding, by request id: the accepted drafts it got before ``token_ids[i]``, and the
    # blocks that held only rejected drafts and went back to the pool
    spec_accepted: dict[str, list[int]] = field(default_factory=dict)
    spec_freed: dict[str, list[int]] = field(default_factory=dict)
