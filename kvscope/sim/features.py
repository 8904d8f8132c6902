"""``StepFeatures``: what a step-time model sees of a step, read the same way from a recorded step and
from a step the scheduler is about to run, so a model fitted on records predicts simulated steps.

- ``prefill_tokens`` / ``decode_tokens``: tokens computed (prompt chunks and recomputes / one per decode);
- ``num_seqs``: requests in the batch;
- ``context_tokens``: K/V tokens attention reads, summed over the batch (each request's context after the
  step);
- ``prefill_attention``: sum over prefill chunks of chunk tokens x context (the quadratic part of a prefill);
- ``blocks``: KV blocks the batch's block tables cover (``ceil(context / block_size)`` per request);
- ``decode_context``: the context of the decoding requests only (what decode attention reads).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from kvscope.engine.core.output import SchedulerOutput
from kvscope.telemetry.records import StepRecord

FEATURE_NAMES = ("prefill_tokens", "decode_tokens", "num_seqs", "context_tokens", "prefill_attention", "blocks",
                 "decode_context")


@dataclass(slots=True)
class StepFeatures:
    prefill_tokens: int = 0
    decode_tokens: int = 0
    num_seqs: int = 0
    context_tokens: int = 0
    prefill_attention: int = 0
    blocks: int = 0
    decode_context: int = 0

    def values(self) -> tuple[int, ...]:
        return astuple(self)

    @classmethod
    def of_record(cls, record: StepRecord, block_size: int) -> StepFeatures:
        """The features of a recorded step: from its scheduled items, or, for a step of a watched vLLM (whose
        plugin reports only its iteration's counts), from its token and request counts (no context)."""
        f = cls()
        for item in record.scheduled:
            f._add(item.kind == "decode", item.num_tokens, item.context_len, block_size)
        if not record.scheduled:
            f.prefill_tokens, f.decode_tokens = record.num_prefill_tokens, record.num_decode_tokens
            f.num_seqs = record.num_prefill_seqs + record.num_decode_seqs
        return f

    @classmethod
    def of_schedule(cls, sched: SchedulerOutput, block_size: int) -> StepFeatures:
        """The features of a step about to run (``context``: computed tokens plus this step's)."""
        # Once per step over every scheduled request: list comprehensions and sums instead of an ``_add``
        # per request (integer sums, so the same values in any order).
        num_tokens, is_decode = sched.num_tokens, sched.is_decode
        contexts = [r.num_computed_tokens + n for r, n, _ in zip(sched.requests, num_tokens, is_decode)]
        f = cls(num_seqs=len(contexts), context_tokens=sum(contexts),
                blocks=sum([-(-c // block_size) for c in contexts]))
        if len(contexts) == len(num_tokens) == len(is_decode) and all(is_decode):
            f.decode_tokens, f.decode_context = sum(num_tokens), f.context_tokens
            return f
        for d, n, context in zip(is_decode, num_tokens, contexts):
            f._add_tokens(d, n, context)
        return f

    def _add_tokens(self, is_decode: bool, n: int, context: int) -> None:
        if is_decode:
            self.decode_tokens += n
            self.decode_context += context
        else:
            self.prefill_tokens += n
            self.prefill_attention += n * context

    def _add(self, is_decode: bool, n: int, context: int, block_size: int) -> None:
        self._add_tokens(is_decode, n, context)
        self.num_seqs += 1
        self.context_tokens += context
        self.blocks += -(-context // block_size)
