"""Speculative decoding as the engine sees it: drafts before a step, what became of them after it.

``Speculator.propose`` runs at the start of every step, before scheduling (vLLM runs its proposer at
the end of the previous step; the drafts are the same, and here the step that verifies them also
accounts for their cost, in its schedule phase): each running request that is ready to decode gets
``request.spec_token_ids``, at most ``num_speculative_tokens`` and never more than its ``max_tokens``
or ``max_model_len`` leave room for. The scheduler then gives such a request ``1 + len(drafts)``
tokens (its last sampled token and the drafts, cut to the token budget), the runner verifies them in
the same forward pass as everything else, and ``Scheduler.update_from_output`` keeps the accepted ones.
``stats`` turns a step's drafts and acceptances into the ``SpecDecodeStats`` telemetry records.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from kvscope.engine.request import Request
from kvscope.engine.spec_decode.config import SpeculativeConfig
from kvscope.telemetry.records import PageEntry, SpecDecodeStats


class Proposer(Protocol):
    """What drafts tokens: ``NgramProposer`` or ``DraftModelProposer``."""

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]: ...

    def free(self, request_id: str) -> None: ...


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int) -> None:
        self.config = config
        self.proposer = proposer
        self.k = config.k
        self.max_model_len = max_model_len
        self.propose_ns = 0  # the last proposal's time

    @property
    def draft_probs(self) -> dict[str, torch.Tensor]:
        """Draft distributions of sampled requests (draft model only; n-gram drafts are point masses)."""
        return getattr(self.proposer, "draft_probs", {})

    def propose(self, running: Sequence[Request]) -> None:
        """Drafts for this step of every running request that will decode in it. If the proposer
        fails (a draft model's forward pass), no request keeps drafts or draft KV, and the error
        propagates before anything of the step happened."""
        t0 = time.perf_counter_ns()
        ready, caps = [], []
        limit = self.max_model_len - 1
        for r in running:
            if r.num_computed_tokens == r.num_tokens - 1 and not r.is_finished:
                cap = min(self.k, r.sampling_params.max_tokens - r.num_output_tokens - 1, limit - r.num_tokens)
                ready.append(r)
                caps.append(cap)
        try:
            drafts = self.proposer.propose(ready, caps)
        except BaseException:
            for r in running:
                r.spec_token_ids = []
                self.proposer.free(r.request_id)
            raise
        for request, d in zip(ready, drafts):
            request.spec_token_ids = d
        self.propose_ns = time.perf_counter_ns() - t0

    def free(self, request_id: str) -> None:
        self.proposer.free(request_id)

    def describe(self) -> dict[str, Any]:
        """The run metadata's ``speculative`` entry: the config, and the draft model's pool if any."""
        out = self.config.describe()
        pool, runner = getattr(self.proposer, "pool", None), getattr(self.proposer, "runner", None)
        if pool is not None and runner is not None:  # a draft model's (DraftModelProposer)
            out.update(draft_num_blocks=pool.num_blocks, draft_block_size=pool.block_size,
                       draft_kv_bytes_per_block=runner.spec.kv_bytes_per_block(pool.block_size))
        return out

    # ---- telemetry -------------------------------------------------------------------------------------
    def stats(
        self,
        drafts: dict[str, list[int]],  # request id -> drafts verified this step
        requests: Sequence[Request],  # the step's scheduled requests
        accepted: dict[str, list[int]],  # request id -> accepted drafts kept
        freed: dict[str, list[int]],  # request id -> blocks given back after the verification
        block_size: int,
    ) -> SpecDecodeStats:
        """The step's ``SpecDecodeStats``, read after ``Scheduler.update_from_output``."""
        k = self.k
        drafted_pos, accepted_pos = [0] * k, [0] * k
        slots: dict[int, list[int]] = {}
        num_drafts = num_draft_tokens = num_accepted = 0
        if drafts:
            for r in requests:
                d = drafts.get(r.request_id)
                if not d:
                    continue
                j = len(accepted.get(r.request_id, ()))
                num_drafts += 1
                num_draft_tokens += len(d)
                num_accepted += j
                for i in range(len(d)):
                    drafted_pos[i] += 1
                    accepted_pos[i] += i < j
                if r.block_ids:  # unfinished: where the drafts' K/V went (trimmed blocks at the end)
                    table = r.block_ids + freed.get(r.request_id, [])
                    first = r.num_computed_tokens - j  # position of the first draft
                    for p in range(first, first + len(d)):
                        cell = slots.setdefault(table[p // block_size], [0, 0])
                        cell[0] += 1
                        cell[1] += p < first + j
        page_map, full = self.draft_page_map()
        pool = getattr(self.proposer, "pool", None)
        propose_ns, self.propose_ns = self.propose_ns, 0  # counted once
        return SpecDecodeStats(
            num_spec_tokens=k, num_drafts=num_drafts, num_draft_tokens=num_draft_tokens,
            num_accepted_tokens=num_accepted, num_draft_tokens_per_pos=drafted_pos,
            num_accepted_tokens_per_pos=accepted_pos, draft_slots=slots, propose_ns=propose_ns,
            freed_blocks=sorted(b for blocks in freed.values() for b in blocks),
            draft_num_blocks=pool.num_blocks if pool is not None else 0,
            draft_blocks_used=pool.num_used_blocks if pool is not None else 0,
            draft_page_map=page_map, draft_page_map_full=full,
        )

    def draft_page_map(self) -> tuple[dict[int, PageEntry], bool]:
        update = getattr(self.proposer, "page_map_update", None)
        return update() if update is not None else ({}, False)
