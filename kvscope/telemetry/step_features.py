"""``StepFeatures``: what a step-time model sees of a step, read the same way from a recorded step and from a
step the scheduler is about to run, so a model fitted on records predicts simulated steps; and the two
*phases* every step-time model keeps apart (``phase_of``): steps with a prefill chunk and decode-only steps.

This is the one reader of a step's features. kvscope's step-time models are one family over it: a line per
phase in these features, fitted two ways for two uses (their module docs say why):

- ``kvscope.telemetry.step_baseline.OnlineStepModel``: the run's own pace, learnt step by step (the
  slow-step rule of ``--capture-slow`` and the report);
- ``kvscope.sim.step_model.LinearStepModel``: fitted on a whole recorded run by ``kvscope calibrate``, to
  time a simulation (``kvscope.sim.roofline.RooflineModel`` reads the same features from a data sheet).

It lives in telemetry, the lowest layer that reads ``StepRecord`` and that both the online baseline (in
telemetry) and the simulator may import. A step about to run is read through ``ScheduledBatch`` (the fields of
the engine's ``SchedulerOutput`` that it reads), so this module imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvscope.telemetry.records import StepRecord

FEATURE_NAMES = ("prefill_tokens", "decode_tokens", "num_seqs", "context_tokens", "prefill_attention", "blocks",
                 "decode_context")
PHASES = ("prefill", "decode")


class _Scheduled(Protocol):
    @property
    def num_computed_tokens(self) -> int: ...


class ScheduledBatch(Protocol):
    """A step about to run (``kvscope.engine.core.output.SchedulerOutput``): ``requests[i]`` gets
    ``num_tokens[i]`` new tokens, and decodes when ``is_decode[i]``."""

    @property
    def requests(self) -> Sequence[_Scheduled]: ...

    @property
    def num_tokens(self) -> list[int]: ...

    @property
    def is_decode(self) -> list[bool]: ...


@dataclass(slots=True)
class StepFeatures:
    prefill_tokens: int = 0  # tokens computed for prompt chunks and recomputes
    decode_tokens: int = 0  # tokens computed for decodes: one each (more with drafts)
    num_seqs: int = 0  # requests in the batch
    context_tokens: int = 0  # K/V tokens attention reads, summed over the batch (each one's context after the step)
    prefill_attention: int = 0  # sum over the prefill chunks of chunk tokens x context: a prefill's quadratic part
    blocks: int = 0  # KV blocks the batch's block tables cover (ceil(context / block_size) each)
    decode_context: int = 0  # the context of the decoding requests only (what decode attention reads)

    def values(self) -> tuple[int, ...]:
        """The features in ``FEATURE_NAMES``' order (``dataclasses.astuple`` deep-copies: 10x slower, and a
        simulation asks for them every step)."""
        return (self.prefill_tokens, self.decode_tokens, self.num_seqs, self.context_tokens, self.prefill_attention,
                self.blocks, self.decode_context)

    @property
    def num_tokens(self) -> int:
        """Tokens computed in the step (``StepRecord.num_tokens``)."""
        return self.prefill_tokens + self.decode_tokens

    @classmethod
    def of_counts(cls, record: StepRecord) -> StepFeatures:
        """The features a record's counts give, in O(1): tokens and requests, no context (all that a watched
        vLLM's plugin reports of its iteration)."""
        return cls(prefill_tokens=record.num_prefill_tokens, decode_tokens=record.num_decode_tokens,
                   num_seqs=record.num_prefill_seqs + record.num_decode_seqs)

    @classmethod
    def of_record(cls, record: StepRecord, block_size: int) -> StepFeatures:
        """The features of a recorded step: from its scheduled items, or, for a step of a watched vLLM (whose
        plugin reports only its iteration's counts), from its token and request counts (``of_counts``)."""
        if not record.scheduled:
            return cls.of_counts(record)
        f = cls()
        for item in record.scheduled:
            f._add(item.kind == "decode", item.num_tokens, item.context_len, block_size)
        return f

    @classmethod
    def of_schedule(cls, sched: ScheduledBatch, block_size: int) -> StepFeatures:
        """The features of a step about to run (``context``: computed tokens plus this step's)."""
        requests, num_tokens, is_decode = sched.requests, sched.num_tokens, sched.is_decode
        k = min(len(requests), len(num_tokens), len(is_decode))
        if not len(requests) == len(num_tokens) == len(is_decode):  # a hand-made output: zip's rule
            requests, num_tokens, is_decode = requests[:k], num_tokens[:k], is_decode[:k]
        prefills = prefill_indices(is_decode)
        others = multi_token_indices(num_tokens, prefills)
        return cls.of_columns([r.num_computed_tokens for r in requests], num_tokens, prefills, others, block_size)

    @classmethod
    def of_columns(cls, computed: list[int], num_tokens: list[int], prefills: list[int], others: list[int],
                   block_size: int) -> StepFeatures:
        """``of_schedule`` from the batch's columns (of one length): request ``i`` has ``computed[i]`` tokens
        and gets ``num_tokens[i]``; ``prefills`` and ``others`` are the indices of the requests that do not
        decode and of those that get other than one token. Once per step over every scheduled request: list
        comprehensions and sums instead of an ``_add`` per request (integer sums, so the same values in any
        order), and the terms that differ read from the few prefills alone."""
        n, total = len(computed), sum(num_tokens)
        f = cls(num_seqs=n, context_tokens=sum(computed) + total)
        # ceil((c + 1) / block_size) is c // block_size + 1: every request's, then the others' corrected
        f.blocks = n + sum([c // block_size for c in computed])
        for i in others:
            c, t = computed[i], num_tokens[i]
            f.blocks += -(-(c + t) // block_size) - c // block_size - 1
        prefill_context = 0
        for i in prefills:
            t = num_tokens[i]
            context = computed[i] + t
            f.prefill_tokens += t
            f.prefill_attention += t * context
            prefill_context += context
        f.decode_tokens, f.decode_context = total - f.prefill_tokens, f.context_tokens - prefill_context
        return f

    def _add(self, is_decode: bool, n: int, context: int, block_size: int) -> None:
        """One scheduled request of ``n`` tokens whose context after the step is ``context``."""
        if is_decode:
            self.decode_tokens += n
            self.decode_context += context
        else:
            self.prefill_tokens += n
            self.prefill_attention += n * context
        self.num_seqs += 1
        self.context_tokens += context
        self.blocks += -(-context // block_size)


def phase_of(f: StepFeatures) -> str:
    """``"prefill"`` for a step with a prefill chunk (mixed steps too), else ``"decode"``."""
    return "prefill" if f.prefill_tokens else "decode"


def prefill_indices(is_decode: list[bool]) -> list[int]:
    """The indices of the scheduled requests that do not decode, in order (``list.index`` scans in C, and a
    step has few of them)."""
    found, i = [], -1
    for _ in range(is_decode.count(False)):
        i = is_decode.index(False, i + 1)
        found.append(i)
    return found


def multi_token_indices(num_tokens: list[int], prefills: list[int]) -> list[int]:
    """The indices of the scheduled requests that get other than one token, in order: found among the
    prefills (``prefill_indices``) unless a decode gets more (drafts), then by a pass over the batch."""
    others = [i for i in prefills if num_tokens[i] != 1]
    if len(others) != len(num_tokens) - num_tokens.count(1):
        others = [i for i, t in enumerate(num_tokens) if t != 1]
    return others
