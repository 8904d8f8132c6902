"""A draft model with its own paged KV cache (vLLM's ``draft_model`` method).

The draft keeps a *shadow* ``Request`` per target request: the same token ids, but its own block table
in its own ``BlockPool`` (its own prefix cache too) and its own progress, so the draft's ``ModelRunner``
packs and runs it exactly like the engine's runner packs the target. To propose for a request whose
target sequence has ``T`` tokens, the draft first computes what it has not yet seen (the tokens
accepted since its last proposal: usually 1-2, the whole prompt the first time) and samples ``d_1``,
then feeds each draft back for ``d_2 .. d_k``: k forward passes per step, batched over the requests.

Rollback: at the next proposal the shadow is compared with the target's tokens; drafts the target
rejected are cut off, its progress goes back to the last token both agree on, and its blocks that held
only rejected drafts return to the draft pool. Drafts never enter the draft's prefix cache (only full
blocks of tokens the target accepted are offered, as in the target's pool).

Sampled requests draw their drafts from ``q`` = the draft's distribution with the request's temperature,
top-k and top-p, using the request's own generator; ``draft_probs`` keeps ``q`` for the verifier.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from kvscope.engine.config import ModelSpec, cdiv, max_positions
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.probe.probe import probe_model
from kvscope.engine.request import Request, SamplingParams
from kvscope.engine.spec_decode.config import SpeculativeConfig
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.engine.worker.rejection import target_probs
from kvscope.models.loader import load_model
from kvscope.telemetry.pagemap import PageMapTracker
from kvscope.telemetry.records import PageEntry, ScheduledItem
from kvscope.utils.host import check_kv_fits


def check_compatible(draft: torch.nn.Module, draft_tokenizer, target_vocab: int, target_tokenizer,
                     max_model_len: int) -> None:
    """Refuse a draft whose tokens mean something else, or that cannot reach ``max_model_len``."""
    hf_config: Any = draft.config  # a transformers PretrainedConfig (nn.Module's attributes type as tensors)
    config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    vocab = getattr(config, "vocab_size", None)
    if vocab != target_vocab:
        raise ValueError(f"the draft model has a vocabulary of {vocab} tokens but the target {target_vocab}: "
                         "its drafts would be other tokens. Use a draft with the target's tokenizer")
    same_tokenizer = draft_tokenizer is None or target_tokenizer is None or (
        draft_tokenizer.get_vocab() == target_tokenizer.get_vocab())
    if not same_tokenizer:
        raise ValueError("the draft model's tokenizer maps tokens to other ids than the target's: its "
                         "drafts would be other tokens. Use a draft with the target's tokenizer")
    limit = max_positions(config)
    if limit < max_model_len:
        raise ValueError(f"the draft model handles {limit} positions, fewer than max_model_len={max_model_len}: "
                         f"lower max_model_len to {limit} or use another draft")


def early_exit_draft(model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """The first ``num_layers`` decoder layers of ``model`` with its own final norm and LM head, sharing
    its weights and its config (self-speculation by early exit, the idea of LayerSkip): a draft with the
    target's vocabulary that costs ``num_layers / total`` of a forward pass and no memory for weights.
    The layers read their attention implementation from the shared config, so draft and target always
    agree on it (the draft runs only its own, shorter layer list)."""
    for path in ("model", "transformer"):
        inner = getattr(model, path, None)
        stack_name = "layers" if hasattr(inner, "layers") else "h" if hasattr(inner, "h") else None
        if inner is not None and stack_name is not None:
            break
    else:
        raise ValueError(f"cannot find the decoder layers of a {type(model).__name__} (model.layers / transformer.h)")
    stack = getattr(inner, stack_name)
    if not 1 <= num_layers <= len(stack):
        raise ValueError(f"num_layers={num_layers} must be between 1 and the model's {len(stack)} layers")
    new_inner = copy.copy(inner)
    new_inner._modules = dict(inner._modules)
    setattr(new_inner, stack_name, torch.nn.ModuleList(list(stack)[:num_layers]))
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    setattr(draft, path, new_inner)
    return draft


def build_draft_proposer(config: SpeculativeConfig, target_vocab: int, target_tokenizer: Any, block_size: int,
                         num_blocks: int, enable_prefix_caching: bool, backend: Any, device: torch.device,
                         dtype: torch.dtype, max_model_len: int, telemetry: bool) -> DraftModelProposer:
    """Load the draft (a name or a module), check it against the target, switch it to the paged
    attention (``probe_model`` refuses what kvscope cannot run) and give it its own pool."""
    model, tokenizer = config.model, None
    if isinstance(model, str):
        model, tokenizer, _ = load_model(model, dtype=dtype)
    check_compatible(model, tokenizer, target_vocab, target_tokenizer, max_model_len)
    layers = probe_model(model, max_model_len)
    model = model.to(device=device, dtype=dtype).eval()
    spec = ModelSpec.from_layers(layers, model.config, dtype)
    spec.max_model_len = max_model_len
    if device.type == "cpu":
        check_kv_fits(num_blocks, spec.kv_bytes_per_block(block_size), "the draft model's KV pool")
    runner = ModelRunner(model, spec, block_size, num_blocks, backend, device)
    pool = BlockPool(num_blocks, block_size, enable_prefix_caching)
    return DraftModelProposer(runner, pool, config.k, track_pages=telemetry)


class DraftModelProposer:
    """Drafts from a small model over its own ``BlockPool`` (see the module docstring)."""

    def __init__(self, runner: ModelRunner, pool: BlockPool, num_speculative_tokens: int,
                 track_pages: bool = False) -> None:
        self.runner = runner
        self.pool = pool
        self.kv = KVCacheManager(pool)
        self.k = num_speculative_tokens
        self.shadows: dict[str, Request] = {}  # request id -> the draft's view of it
        self._synced: dict[str, int] = {}  # request id -> target tokens when it last proposed
        self.draft_probs: dict[str, torch.Tensor] = {}  # request id -> q [k, V] (sampled requests only)
        self.pages = PageMapTracker(pool.num_blocks, pool.block_size) if track_pages else None
        if self.pages is not None:
            pool.listeners.append(self.pages.on_block_event)
        self._items: list[ScheduledItem] = []  # what the last proposal computed (for the page map)
        self._tables: list[list[int]] = []

    # ---- the shadows --------------------------------------------------------------------------------
    def _sync(self, target: Request) -> Request:
        """The shadow of ``target``, with its rejected drafts rolled back."""
        rid = target.request_id
        shadow = self.shadows.get(rid)
        tokens = target.all_token_ids
        if shadow is None:
            shadow = self.shadows[rid] = Request(rid, list(target.prompt_token_ids), SamplingParams())
            shadow.all_token_ids = list(tokens)
            self._synced[rid] = len(tokens)
            return shadow
        mine, same = shadow.all_token_ids, self._synced[rid]
        end = min(len(mine), len(tokens))
        while same < end and mine[same] == tokens[same]:  # accepted drafts agree with the target
            same += 1
        del mine[same:]
        mine.extend(tokens[same:])
        self._synced[rid] = len(tokens)
        if shadow.num_computed_tokens > same:
            shadow.num_computed_tokens = same
            keep = cdiv(same, self.pool.block_size)
            if len(shadow.block_ids) > keep:  # blocks that held only rejected drafts
                blocks = self.pool.blocks
                self.pool.free([blocks[b] for b in reversed(shadow.block_ids[keep:])])
                del shadow.block_ids[keep:]
                if self.pages is not None:
                    self.pages.forget(rid)  # its table shrank: attribute it afresh
        if shadow.num_computed_tokens == shadow.num_tokens:  # no new token (not scheduled last step):
            shadow.num_computed_tokens -= 1  # recompute the last one, whose logits give d_1
        return shadow

    def free(self, request_id: str) -> None:
        """The request left the engine (or stopped decoding): its draft blocks return to the pool."""
        shadow = self.shadows.pop(request_id, None)
        self._synced.pop(request_id, None)
        self.draft_probs.pop(request_id, None)
        if shadow is not None:
            self.kv.free(shadow)
            if self.pages is not None:
                self.pages.forget(request_id)

    def _reserve(self, shadow: Request, limit: int) -> int:
        """Blocks for the tokens the draft has not computed plus ``limit - 1`` draft inputs; the drafts
        this request can get (fewer when the draft pool is short, 0 when nothing fits)."""
        if shadow.num_computed_tokens == 0 and not shadow.block_ids:
            hits = self.kv.get_computed_blocks(shadow)
            new = shadow.num_tokens - len(hits) * self.pool.block_size
            for extra in (limit - 1, 0):
                if self.kv.allocate_slots(shadow, new + extra, hits):
                    shadow.num_computed_tokens = len(hits) * self.pool.block_size
                    return extra + 1
            return 0
        new = shadow.num_tokens - shadow.num_computed_tokens
        for extra in (limit - 1, 0):
            if self.kv.allocate_slots(shadow, new + extra):
                return extra + 1
        return 0

    # ---- proposing ------------------------------------------------------------------------------------
    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        """Up to ``max_drafts[i]`` drafts for each of ``requests`` (target requests ready to decode)."""
        self.kv.begin_step()
        wanted = {r.request_id for r in requests}
        for rid in [rid for rid in self.shadows if rid not in wanted]:
            self.free(rid)
        self.draft_probs = {}
        shadows, limits, targets, starts = [], [], [], []
        for request, limit in zip(requests, max_drafts):
            shadow = self._sync(request)
            limit = self._reserve(shadow, min(limit, self.k)) if limit > 0 else 0
            if limit > 0:
                shadows.append(shadow)
                limits.append(limit)
                targets.append(request)
                starts.append(shadow.num_computed_tokens)
        drafts: dict[str, list[int]] = {}
        if shadows:
            try:
                self._run(shadows, limits, targets)
            except BaseException:
                self.kv.rollback_step()  # blocks offered to the draft's cache in this call hold no valid K/V
                raise
            drafts = {s.request_id: s.all_token_ids[t.num_tokens:] for s, t in zip(shadows, targets)}
        if self.pages is not None:
            self._items = [ScheduledItem(s.request_id, "decode", s.num_computed_tokens - c, s.num_computed_tokens)
                           for s, c in zip(shadows, starts)]
            self._tables = [s.block_ids for s in shadows]
        return [drafts.get(r.request_id, []) for r in requests]

    def _run(self, shadows: list[Request], limits: list[int], targets: list[Request]) -> None:
        """k forward passes: the catch-up with ``d_1``, then one token per pass for ``d_2 .. d_k``."""
        probs: dict[str, list[torch.Tensor]] = {}
        target_of = {id(s): t for s, t in zip(shadows, targets)}
        active = list(range(len(shadows)))
        first = True
        while active:
            reqs = [shadows[i] for i in active]
            n = [s.num_tokens - s.num_computed_tokens for s in reqs] if first else [1] * len(reqs)
            inp = self.runner.prepare(SchedulerOutput(reqs, n, [x == 1 for x in n], total_num_tokens=sum(n)))
            logits = self.runner.forward(inp)  # [len(active), V]: every shadow reaches its end
            order = inp.sample_requests  # the runner's packing order, the logits' rows
            tokens = self._sample(logits, [target_of[id(s)] for s in order], probs)
            for s, t in zip(order, tokens):
                s.num_computed_tokens = s.num_tokens
                s.all_token_ids.append(t)
            first = False
            active = [i for i in active if len(shadows[i].all_token_ids) - targets[i].num_tokens < limits[i]]
        # the last draft was sampled, never fed back: the shadow has computed all but it
        self.draft_probs = {rid: torch.stack(rows) for rid, rows in probs.items()}

    @staticmethod
    def _sample(logits: torch.Tensor, targets: list[Request], probs: dict[str, list[torch.Tensor]]) -> list[int]:
        """Greedy requests: the draft's argmax. Sampled ones: a draw from ``q`` (kept in ``probs``) with
        the target request's own generator, so draft and verification use one random stream."""
        tokens = logits.argmax(dim=-1).tolist()
        rows = [i for i, r in enumerate(targets) if not r.sampling_params.greedy]
        if rows:
            q = target_probs(logits, [targets[i] for i in rows], rows)  # [R, V]
            for j, i in enumerate(rows):
                tokens[i] = int(torch.multinomial(q[j], 1, generator=targets[i].generator))
                probs.setdefault(targets[i].request_id, []).append(q[j])
        return tokens

    # ---- telemetry -------------------------------------------------------------------------------------
    def page_map_update(self) -> tuple[dict[int, PageEntry], bool]:
        """The draft pool's page map changes since the last call (``({}, False)`` without tracking)."""
        if self.pages is None:
            return {}, False
        items, tables = self._items, self._tables
        self._items, self._tables = [], []
        return self.pages.update(items, tables)
