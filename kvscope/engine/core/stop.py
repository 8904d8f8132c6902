"""The stop conditions: whether a request ends after a token it was given (vLLM: ``check_stop``).

In this order: a stop token (``SamplingParams.stop_token_ids``) or an end-of-sequence token (unless the params
say ``ignore_eos``) ends it as ``FINISHED_STOPPED`` (finish reason ``stop``); ``max_tokens`` output tokens or
``max_model_len`` tokens in all end it as ``FINISHED_LENGTH`` (``length``). ``Scheduler.update_from_output``
hands a step's sampled tokens to ``take_tokens``, and a speculative step's tokens one by one to ``take_token``
(its accepted drafts, then its sampled token: a stop drops the tokens after it).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvscope.engine.request import Request, RequestStatus


def take_tokens(requests: Sequence[Request], tokens: Sequence[int], eos_token_ids: frozenset[int],
                max_model_len: int) -> dict[Request, RequestStatus]:
    """Append ``tokens[i]`` to ``requests[i]`` (each request at most once) and check the stop conditions after it.

    Returns the requests that stopped, in order, with the status each finishes with (the caller finishes them).
    Once per step over every sampled request, so one loop without a call per request (``Request.append_token``'s
    two appends are written out, and no properties are read)."""
    stopped: dict[Request, RequestStatus] = {}
    for request, token in zip(requests, tokens):
        output, all_ids = request.output_token_ids, request.all_token_ids
        output.append(token)
        all_ids.append(token)
        params = request.sampling_params
        if token in params.stop_token_ids or (token in eos_token_ids and not params.ignore_eos):
            stopped[request] = RequestStatus.FINISHED_STOPPED
        elif len(output) >= params.max_tokens or len(all_ids) >= max_model_len:
            stopped[request] = RequestStatus.FINISHED_LENGTH
    return stopped


def take_token(request: Request, token: int, eos_token_ids: frozenset[int], max_model_len: int) -> RequestStatus | None:
    """``take_tokens`` for one token: the status ``request`` finishes with after ``token``, None if it goes on."""
    return take_tokens([request], [token], eos_token_ids, max_model_len).get(request)
