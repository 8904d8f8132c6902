"""``generate`` and ``stream``: whole calls over the engine's step API (vLLM's ``LLM.generate``).

A mixin of ``Engine``: it uses the engine's lock (``_lock``), ``make_request`` / ``add_request`` /
``step`` / ``abort`` / ``record_state`` / ``output`` / ``decode``. The lock is taken per step, not per
call, so two threads' calls share the steps and both finish; each call re-checks under the lock
whether its own requests are done (another thread's step may have finished them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from kvscope.engine.request import Request, RequestOutput, SamplingParams, StreamDelta
from kvscope.engine.validation import is_one_prompt

if TYPE_CHECKING:
    from kvscope.telemetry.records import StepRecord

Prompt = str | list[int]  # also a tuple, or a 1-D integer np.ndarray / torch.Tensor, of token ids


class GenerateMixin:
    """Run prompts to completion (``generate``) or token by token (``stream``)."""

    # What the mixin uses of ``Engine``, declared for the type checker (``Engine`` defines each; mypy checks
    # that its definitions agree with these).
    _lock: threading.RLock
    tokenizer: Any

    if TYPE_CHECKING:
        def make_request(self, prompt: Prompt, params: SamplingParams | None = None,
                         request_id: str | None = None) -> Request: ...

        def add_request(self, prompt: Prompt | Request, params: SamplingParams | None = None,
                        request_id: str | None = None) -> str: ...

        def step(self, deltas: bool = True) -> list[StreamDelta]: ...

        def abort(self, request_id: str) -> bool: ...

        def record_state(self) -> StepRecord | None: ...

        def output(self, request: Request) -> RequestOutput: ...

        def decode(self, token_ids: list[int]) -> str: ...

    def _add_all(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None) -> list[Request]:
        """Validate every prompt of a ``generate`` / ``stream`` call, then queue them all (under the lock,
        so no step runs between). One bad prompt refuses the whole call, naming it ("prompt 3: ..."),
        before anything is queued."""
        # one prompt (a string, 1-D token ids: is_one_prompt checks which) or a sequence of them
        batch = [cast(Prompt, prompts)] if is_one_prompt(prompts) else cast(Sequence[Prompt], prompts)
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(batch)
        if len(params_list) != len(batch):
            raise ValueError(f"got {len(batch)} prompts but {len(params_list)} SamplingParams")
        with self._lock:
            requests = []
            for i, (prompt, p) in enumerate(zip(batch, params_list)):
                try:
                    request = self.make_request(prompt, p)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"prompt {i}: {exc}") from None
                request.index = i
                requests.append(request)
            for request in requests:
                self.add_request(request)
        return requests

    def _step_until(self, requests: list[Request]) -> bool:
        """One step if any of ``requests`` is unfinished (checked under the lock: another thread may
        have stepped them meanwhile); False once all are finished."""
        with self._lock:
            if all(r.is_finished for r in requests):
                return False
            self.step()
        time.sleep(0)  # between steps, out of the lock: another thread's call gets its turn (fair sharing)
        return True

    def _abort_own(self, requests: list[Request]) -> None:
        with self._lock:
            for request in requests:
                self.abort(request.request_id)
            self.record_state()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; one ``RequestOutput`` per prompt, in order.

        All prompts are validated before any runs (one bad prompt raises, naming it, and nothing
        starts). A request that cannot run (e.g. larger than the whole pool) comes back with
        ``finish_reason == "error"`` and ``error`` set; the rest go on. On an exception or
        KeyboardInterrupt every request of this call is aborted before it propagates.
        """
        requests = self._add_all(prompts, params)
        try:
            while self._step_until(requests):
                pass
        except BaseException:
            self._abort_own(requests)
            raise
        return [self.output(r) for r in requests]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamDelta]:
        """Yield tokens as they are produced (with the text each adds), then a final delta per request.

        Deltas are read from the requests themselves, so tokens that a step driven by another thread
        produced are yielded too. Closing the stream early aborts its requests."""
        requests = self._add_all(prompts, params)
        sent = [0] * len(requests)  # tokens yielded per request
        texts = [""] * len(requests)
        ended = [False] * len(requests)
        try:
            while not all(ended):
                self._step_until(requests)
                with self._lock:  # a consistent view: tokens so far and whether it ended
                    states = [(list(r.output_token_ids[n:]), r.finish_reason) for r, n in zip(requests, sent)]
                for i, (request, (new, reason)) in enumerate(zip(requests, states)):
                    if ended[i]:
                        continue
                    for k, token in enumerate(new):
                        sent[i] += 1
                        last = reason is not None and k == len(new) - 1
                        yield StreamDelta(request.request_id, i, token, self._text_delta(request, sent[i], texts, i),
                                          last, reason if last else None)
                    if reason is not None and not new:  # ended without a token (abort, error)
                        yield StreamDelta(request.request_id, i, None, "", True, reason)
                    ended[i] = reason is not None
        finally:
            self._abort_own(requests)

    def chat(
        self,
        messages: Sequence[dict] | Sequence[Sequence[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """``generate`` for conversations, as vLLM's ``LLM.chat``: ``messages`` is one conversation (a list of
        ``{"role": ..., "content": ...}``) or a list of them; each is put through the tokenizer's chat template
        (with the prompt for the assistant's turn) and generated from its token ids. ``ValueError`` when the
        tokenizer has no chat template (a base model: use ``generate``)."""
        conversations = conversations_of(messages)
        prompts = [chat_prompt_ids(self.tokenizer, c, i if len(conversations) > 1 else None)
                   for i, c in enumerate(conversations)]
        outputs = self.generate(prompts, params)
        for out in outputs:  # the templated prompt, as vLLM's RequestOutput.prompt
            out.prompt = self.tokenizer.decode(out.prompt_token_ids)
        return outputs

    def _text_delta(self, request: Request, n: int, texts: list[str], i: int) -> str:
        if self.tokenizer is None:
            return ""
        text = self.decode(request.output_token_ids[:n])
        delta, texts[i] = text[len(texts[i]) :], text
        return delta


_CHAT_FORM = "[{'role': 'user', 'content': 'text'}, ...]"


def conversations_of(messages: Any) -> list[list[dict]]:
    """``chat``'s argument as a list of conversations, each checked message by message: a ``ValueError`` naming
    the conversation and message otherwise (never the template's ``KeyError`` / ``TypeError`` / jinja2 error)."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence) or not messages:
        got = "an empty list" if isinstance(messages, Sequence) and not messages and not isinstance(
            messages, (str, bytes)) else f"a {type(messages).__name__}"
        raise ValueError(f"chat() takes a conversation, a non-empty list of messages {_CHAT_FORM}, or a list of "
                         f"conversations; got {got}" + (" (put the message in a list)" if isinstance(messages, dict)
                                                        else ""))
    one = isinstance(messages[0], dict)  # one conversation, or a list of them
    conversations = [messages] if one else list(messages)
    out = []
    for i, conversation in enumerate(conversations):
        where = "" if one else f"conversation {i}: "
        if isinstance(conversation, (str, bytes, dict)) or not isinstance(conversation, Sequence) or not conversation:
            raise ValueError(f"{where}a conversation is a non-empty list of messages {_CHAT_FORM}; got "
                             f"{type(conversation).__name__ if conversation else 'an empty one'}")
        for j, m in enumerate(conversation):
            if not isinstance(m, dict):
                raise ValueError(f"{where}message {j} is a {type(m).__name__}, not a dict {{'role': ..., "
                                 "'content': ...}")
            for key in ("role", "content"):
                value = m.get(key)
                if not isinstance(value, str) or (key == "role" and not value):
                    raise ValueError(f"{where}message {j} ({str(m.get('role'))[:20]!r}): its {key!r} is "
                                     f"{str(value)[:40]!r} ({type(value).__name__}); it must be a "
                                     f"{'non-empty ' if key == 'role' else ''}string (kvscope's chat takes text)")
        out.append(list(conversation))
    return out


def chat_prompt_ids(tokenizer, conversation: Sequence[dict], index: int | None = None) -> list[int]:
    """A conversation's token ids through ``tokenizer``'s chat template, ending with the assistant's turn to speak.
    A conversation the template refuses (roles that must alternate, say) is a ``ValueError`` naming it."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template (a base model?): use generate() with plain "
                         "prompts, or give a tokenizer that has one")
    (conversation,) = conversations_of(conversation)
    try:
        ids = tokenizer.apply_chat_template(list(conversation), add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # jinja2's TemplateError (raise_exception in a template), TypeError, ...
        where = "the conversation" if index is None else f"conversation {index}"
        raise ValueError(f"the chat template refused {where}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if hasattr(ids, "keys"):  # transformers returns a BatchEncoding when asked for a dict
        ids = ids["input_ids"]
    return [int(t) for t in ids]
