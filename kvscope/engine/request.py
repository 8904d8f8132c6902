"""Requests, their sampling parameters and their outputs."""

from __future__ import annotations

import enum
import itertools
import numbers
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kvscope.engine.validation import UINT64_MAX, check_bool, check_int, check_real, prompt_ids, token_ids

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): at 1e-5 a logit gap of 0.001 is already a
# factor e^100 between two tokens, so the distribution is the argmax to float32 precision, while
# dividing by a smaller temperature could overflow the logits to inf and the probabilities to NaN.
TEMPERATURE_FLOOR = 1e-5


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens for one request. ``temperature=0`` is greedy, and so is any temperature
    below ``TEMPERATURE_FLOOR`` (it is stored as 0). ``seed``: an unsigned 64-bit integer
    (``0 <= seed < 2**64``) or ``None`` (the global generator). Checked at construction and again when
    a request is made from it (``validate``): a wrong type raises ``TypeError``, a wrong value
    ``ValueError``, each naming the field."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check (and normalise) every field; ``Engine.make_request`` calls it again, so params
        changed after construction cannot reach the sampler unchecked."""
        self.max_tokens = check_int("max_tokens", self.max_tokens, 1)
        self.temperature = check_real("temperature", self.temperature, 0.0,
                                      must="a finite number >= 0 (0 means greedy)")
        if self.temperature < TEMPERATURE_FLOOR:
            self.temperature = 0.0
        self.top_k = check_int("top_k", self.top_k, 0, must="a non-negative integer (0 turns it off)")
        self.top_p = check_real("top_p", self.top_p, 0.0, 1.0, lo_open=True, must="in (0, 1] (1 turns it off)")
        self.seed = check_int("seed", self.seed, 0, UINT64_MAX, optional=True,
                              must="an unsigned 64-bit integer (0 to 2**64 - 1) or None")
        if type(self.stop_token_ids) is not list and isinstance(self.stop_token_ids, numbers.Integral):
            raise TypeError(f"stop_token_ids={self.stop_token_ids!r} must be a list of token ids, e.g. "
                            f"[{self.stop_token_ids!r}]")
        ids = token_ids(self.stop_token_ids, "stop_token_ids", text_ok=False, set_ok=True)
        if ids and min(ids) < 0:  # ints by now
            raise ValueError(f"stop_token_ids={ids!r} must be non-negative token ids")
        self.stop_token_ids = ids
        self.ignore_eos = check_bool("ignore_eos", self.ignore_eos)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in _FINISHED  # the members themselves: no lookup of .value (a Python-level property)


_FINISHED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED,
             RequestStatus.FINISHED_ERROR)
_request_counter = itertools.count()


@dataclass(slots=True, eq=False)
class Request:
    """One sequence: its tokens, where its KV lives, and how far the model has got.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache; ``block_ids`` is the block table
    (of KV cache group 0; a hybrid model's other groups' tables are ``extra_block_ids``, and a sliding
    group's entries that left the window are ``-1``, see ``kvscope.engine.core.kv_groups``).
    When ``num_computed_tokens == num_tokens`` the next step decodes one token; below that it prefills.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    prompt: str | None = None
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    block_ids: list[int] = field(default_factory=list)  # KV cache group 0's; -1: left the window
    extra_block_ids: list[list[int]] = field(default_factory=list)  # groups 1.. (hybrid models)
    block_hashes: list = field(default_factory=list)  # BlockHash per full block of all_token_ids
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first schedule; -1 until then
    num_preemptions: int = 0
    error: str | None = None
    generator: torch.Generator | None = None
    index: int = 0  # position in the caller's list (generate / stream)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts for its next step (speculative decoding)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        if self.sampling_params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.sampling_params.seed)

    @property
    def block_tables(self) -> list[list[int]]:
        """The block table of every KV cache group (group 0's is ``block_ids``)."""
        return [self.block_ids, *self.extra_block_ids]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)


def checked_params(params: SamplingParams | None) -> SamplingParams:
    """A request's params (None: the defaults), checked again since their fields may have been changed
    after construction: ``TypeError`` for anything but ``SamplingParams``, else ``validate``'s errors."""
    params = params if params is not None else SamplingParams()
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling params must be a SamplingParams, not {type(params).__name__}")
    params.validate()
    return params


def next_request_id() -> str:
    return f"req-{next(_request_counter)}"


def new_request(prompt: Any, params: SamplingParams | None, request_id: str | None, tokenizer: Any,
                vocab_size: int, max_model_len: int, arrival_time: float) -> Request:
    """A prompt and its params checked into a ``Request`` (``Engine.make_request``; vLLM's input processing):
    ``TypeError`` for a prompt, params or id of the wrong type, ``ValueError`` for a bad value (empty, too long,
    outside the vocabulary), each naming the problem. ``request_id`` None: a new one."""
    params = checked_params(params)
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise TypeError(f"request_id={request_id!r} must be a non-empty string (or None for a new one)")
    ids, text = prompt_ids(prompt, tokenizer, vocab_size, max_model_len)
    return Request(request_id or next_request_id(), ids, params, prompt=text, arrival_time=arrival_time)


def rejected_request(prompt: Any, params: Any, error: str, tokenizer: Any = None) -> Request:
    """A request that cannot run (``Engine.reject``), finished at once with status ``error``: its prompt's
    tokens where they can be read (else none), default params where ``params`` are not ``SamplingParams``."""
    text = prompt if isinstance(prompt, str) else None
    try:
        tokens = tokenizer.encode(prompt) if text and tokenizer else token_ids(prompt)
    except (TypeError, ValueError):
        tokens = []
    if not isinstance(params, SamplingParams):
        params = SamplingParams()
    request = Request(next_request_id(), tokens, params, prompt=text, arrival_time=time.perf_counter())
    request.status, request.error = RequestStatus.FINISHED_ERROR, error
    return request


@dataclass(slots=True)
class RequestOutput:
    """What ``Engine.generate`` returns per prompt."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    error: str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def of(cls, request: Request, text: str) -> RequestOutput:
        """A copy of where ``request`` stands (``text``: its output tokens, decoded)."""
        return cls(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            token_ids=list(request.output_token_ids),
            text=text,
            finish_reason=request.finish_reason,
            error=request.error,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            num_preemptions=request.num_preemptions,
        )


@dataclass(slots=True)
class StreamDelta:
    """One new token of one request, as ``Engine.stream`` yields it."""

    request_id: str
    index: int
    token_id: int | None
    text: str
    finished: bool
    finish_reason: str | None = None
