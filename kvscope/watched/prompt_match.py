"""The prompts a load generator sent (``kvscope watch --prompts``) matched to the requests the watched server saw,
so that a replay of the watch (``kvscope simulate --replay``) has each request's prompt token ids.

Neither vLLM's spans nor its stats carry a prompt's tokens, only its length, so the match is by order, checked
by length. **The rule:** the requests are taken in order of arrival (their ``queued`` moment; ties in the order
the watch saw them). A cursor stands at the prompt after the last one given (the first one at the start; given
ones are stepped over). Each request is given the prompt at the cursor if its token count equals the request's
prompt length; otherwise the nearest prompt not yet given, at most ``window`` places before or after the
cursor (the one before first on a tie), whose length is the request's: concurrent senders reach the server a
little out of their sending order, and a request that failed before it reached vLLM leaves its prompt behind.
Those are counted as ``reordered``. Past the window, the nearest prompt of that length not yet given, however
far (``far``, also counted as reordered): requests sent all at once reach the server in any order (64 at once
from ``vllm bench serve``: 5 came more than 16 places from where they were sent), and a prompt of the right
length is a better guess than none. A request none of them fits keeps no ids (``unmatched``: a wrong tokenizer
or chat template, or a request the file does not hold); prompts never given are ``prompts_unused``. Two
prompts of the same length that swap places within the window are not told apart: every count of a replay but
its prefix-cache hits is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvscope.telemetry.records import RequestEvent

MATCH_WINDOW = 16


@dataclass(slots=True)
class PromptMatch:
    """What the match did (``meta["watch"]["prompts"]``)."""

    num_prompts: int = 0
    num_requests: int = 0
    matched: int = 0
    reordered: int = 0  # matched to a prompt sent after one still open
    far: int = 0  # of those, matched beyond the window
    unmatched: int = 0  # requests that got no prompt ids
    prompts_unused: int = 0
    window: int = MATCH_WINDOW
    rule: str = "arrival order, prompt lengths checked"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def match_prompts(events: Sequence[RequestEvent], prompts: Sequence[Sequence[int]],
                  window: int = MATCH_WINDOW) -> PromptMatch:
    """Give the ``queued`` events of ``events`` their prompts' token ids (``prompt_token_ids``, set in place; the
    ones already set are replaced) by the module's rule."""
    queued = sorted((e for e in events if e.kind == "queued"), key=lambda e: e.t_ns)  # stable: ties as seen
    out = PromptMatch(num_prompts=len(prompts), num_requests=len(queued), window=window)
    n = len(prompts)
    used = [False] * n
    cursor = 0
    for event in queued:
        event.prompt_token_ids = None
        while cursor < n and used[cursor]:
            cursor += 1
        chosen = None
        for d in range(window + 1):
            for i in ((cursor,) if d == 0 else (cursor - d, cursor + d)):
                if 0 <= i < n and not used[i] and len(prompts[i]) == event.num_prompt_tokens:
                    chosen = i
                    break
            if chosen is not None:
                break
        if chosen is None:  # beyond the window: the nearest of that length anywhere
            chosen = _nearest(prompts, used, cursor, event.num_prompt_tokens)
            out.far += chosen is not None
        if chosen is None:
            out.unmatched += 1
            continue
        used[chosen] = True
        event.prompt_token_ids = list(prompts[chosen])
        out.matched += 1
        out.reordered += chosen != cursor
        cursor = chosen + 1
    out.prompts_unused = n - out.matched
    return out


def _nearest(prompts: Sequence[Sequence[int]], used: list[bool], cursor: int, length: int) -> int | None:
    """The prompt of ``length`` not yet given nearest to ``cursor`` (the one before first on a tie), or None."""
    best = None
    for i, p in enumerate(prompts):
        if not used[i] and len(p) == length and (best is None or abs(i - cursor) < abs(best - cursor)):
            best = i
    return best
