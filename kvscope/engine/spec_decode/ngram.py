"""Prompt lookup (vLLM's ``ngram`` method): draft what followed the sequence's last n tokens earlier on.

For a sequence ``t``, the proposer looks for an earlier occurrence of its suffix ``t[-n:]`` with
``prompt_lookup_min <= n <= prompt_lookup_max``: the longest such n wins, and among equally long matches
the earliest one (vLLM's choice). The tokens that followed that occurrence, up to k of them, are the
draft. Nothing runs on the model: on a workload whose answers copy from the prompt (extraction,
summaries that quote, code edits) the drafts are often right, and each right one saves a forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvscope.engine.request import Request


def find_draft(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The draft for one sequence ``tokens`` ([L] integers): up to ``k`` tokens, ``[]`` without a match.

    Every earlier position holding the last token is a candidate; one comparison per n-gram length
    (at most ``max_n``, vectorised over the candidates) measures how far back each match reaches.
    """
    length = len(tokens)
    if length < min_n + 1 or k < 1:
        return []
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # [C] candidate positions of the last token
    if len(ends) == 0:
        return []
    match = np.ones(len(ends), dtype=np.int64)  # [C] length of the match ending at each candidate
    alive = np.ones(len(ends), dtype=bool)
    for back in range(1, max_n):
        prev = ends - back
        alive &= prev >= 0
        if not alive.any():
            break
        alive[alive] = tokens[prev[alive]] == tokens[length - 1 - back]
        match += alive
    best = int(match.max())
    if best < min_n:
        return []
    start = int(ends[np.argmax(match == best)]) + 1  # the earliest of the longest matches
    return tokens[start : start + k].tolist()


class NgramProposer:
    """Drafts for many requests from their own tokens; keeps one NumPy copy of each sequence, grown
    by the tokens added since the last call (so a step costs O(new tokens + matches), not O(length))."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self._arrays: dict[str, np.ndarray] = {}  # request id -> its tokens so far

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        """Up to ``max_drafts[i]`` draft tokens for ``requests[i]`` (each ``<= k``)."""
        arrays, seen = self._arrays, {}
        drafts = []
        for request, limit in zip(requests, max_drafts):
            rid = request.request_id
            array = arrays.get(rid)
            tokens = request.all_token_ids
            if array is None or len(array) > len(tokens):
                array = np.asarray(tokens, dtype=np.int64)
            elif len(array) < len(tokens):
                array = np.concatenate([array, np.asarray(tokens[len(array):], dtype=np.int64)])
            seen[rid] = array
            drafts.append(find_draft(array, self.min_n, self.max_n, min(limit, self.k)) if limit > 0 else [])
        self._arrays = seen  # requests that left (finished, preempted) are dropped
        return drafts

    def free(self, request_id: str) -> None:
        self._arrays.pop(request_id, None)
