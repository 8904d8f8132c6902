"""ModelRunner: the HF model, its paged KV tensors, and the packing of one step into one flat batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from kvscope.engine.config import LayerSpec, ModelSpec
from kvscope.engine.core.kv_groups import KVCacheConfig, single_group
from kvscope.engine.core.output import SchedulerOutput
from kvscope.engine.request import Request
from kvscope.engine.worker.attention import AttentionMetadata, use_metadata
from kvscope.engine.worker.fusion import FastModel
from kvscope.engine.worker.model_input import ModelInput
from kvscope.engine.worker.rejection import verify
from kvscope.engine.worker.sampler import sample
from kvscope.kernels.backend import KernelBackend, resolve_backend
from kvscope.kernels.torch_paged import AttentionPlan


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module | FastModel,  # FastModel: the model with its fused projections (fusion.py)
        spec: ModelSpec,
        block_size: int,
        num_blocks: int,
        backend: KernelBackend,
        device: torch.device,
        kv_config: KVCacheConfig | None = None,
    ) -> None:
        self.model = model
        self.spec = spec
        self.block_size = block_size
        self.backend = backend
        self._resolved = backend  # the backend as resolved or switched to (``self.backend`` may be a wrapped copy)
        self.device = device
        # one spec per KV layer (the probe's), or num_layers alike ones from the spec's fields
        self.layers: tuple[LayerSpec, ...] = spec.layers or (
            LayerSpec(spec.num_heads, spec.num_kv_heads, spec.head_dim),
        ) * spec.num_layers
        # KV cache groups (kvscope.engine.core.kv_groups): layer i lives in slot layer_slot[i], read through its
        # group's block table; without groups every layer is its own slot of one group
        self.kv_config = kv_config or single_group(len(self.layers))
        self.kv_slots: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.allocate_kv(num_blocks)

    def allocate_kv(self, num_blocks: int) -> None:
        """Per slot, K pages ``[num_blocks, block_size, num_kv_heads, head_dim]`` and V pages
        ``[..., head_dim_v]`` of its layers' shape, zeroed (so a masked-out page never holds NaN);
        ``kv_caches[i]`` is KV layer ``i``'s slot (the j-th layer of every group shares slot j)."""
        self.kv_caches, self.kv_slots = [], []  # free the old pages first
        dev, dtype, bs, cfg = self.device, self.spec.dtype, self.block_size, self.kv_config
        shape_of: dict[int, LayerSpec] = {}  # slot -> the first layer that uses it (all its layers have one page shape)
        for i, slot in enumerate(cfg.layer_slot):
            shape_of.setdefault(slot, self.layers[i])
        self.kv_slots = [
            (
                torch.zeros((num_blocks, bs, layer.num_kv_heads, layer.head_dim), dtype=dtype, device=dev),
                torch.zeros((num_blocks, bs, layer.num_kv_heads, layer.value_dim), dtype=dtype, device=dev),
            )
            for layer in (shape_of[j] for j in range(cfg.num_slots))
        ]
        self.kv_caches = [self.kv_slots[slot] for slot in cfg.layer_slot]
        self.num_blocks = num_blocks

    def _switch_backend(self) -> None:
        """At a step boundary: the kernel built in the background (``kernels/background_build.py``) replaces
        the torch one once its build is done; a failed build leaves torch, with nothing pending."""
        pending = self.backend.pending
        done = pending.poll() if pending is not None else None
        if pending is None or done is None:
            return
        self.backend = self._resolved = (resolve_backend(pending.name, self.device) if done
                                         else replace(self.backend, pending=None))

    @property
    def backend_name(self) -> str:
        """The attention backend's name (``kvscope.engine.protocols.Worker``: what the run metadata reports)."""
        return self.backend.name

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_slots)

    @property
    def kv_bytes_per_block(self) -> int:
        """What one block id holds: a page in every slot."""
        return self.kv_cache_bytes // max(1, self.num_blocks)

    def prepare(self, sched: SchedulerOutput) -> ModelInput:
        """Pack the scheduled tokens: decodes (one token) first, then prefill chunks.

        The per-request loop only gathers Python lists (``_gather``); positions, slots and offsets are
        computed with numpy over all tokens at once.
        """
        if self.backend.pending is not None and self.backend is self._resolved:  # not while a profiler wraps it
            self._switch_backend()
        requests, query_lens, starts = sched.packing_order()
        spec = sched.scheduled_spec_decode_tokens  # a verification: its last sampled token, then its drafts
        token_ids, group_tables = self._gather(requests, query_lens, starts, spec)
        q_lens = np.asarray(query_lens, dtype=np.int64)  # [B]
        seq_lens = np.asarray(starts, dtype=np.int64) + q_lens  # [B]
        query_start_loc = np.zeros(len(requests) + 1, dtype=np.int64)  # [B + 1]
        np.cumsum(q_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        seq_of_token = np.repeat(np.arange(len(requests)), q_lens)  # [T]
        positions = np.arange(num_tokens) - query_start_loc[seq_of_token] + np.repeat(starts, q_lens)  # [T]
        bs = self.block_size
        slot_mappings = group_tables[:, seq_of_token, positions // bs] * bs + positions % bs  # [G, T]
        samples, logits_indices, spec_drafts = _samples(requests, seq_lens, query_start_loc, spec)
        dev = self.device
        return ModelInput(
            input_ids=torch.tensor(token_ids, dtype=torch.long, device=dev)[None],
            positions=torch.from_numpy(positions).to(dev)[None],
            meta=self._metadata(group_tables, slot_mappings, query_start_loc, seq_lens, query_lens),
            logits_indices=torch.from_numpy(logits_indices).to(dev),
            sample_requests=[requests[i] for i in samples],
            num_tokens=num_tokens,
            spec_drafts=spec_drafts,
        )

    def _gather(self, requests: list[Request], query_lens: list[int], starts: list[int],
                spec: dict[str, list[int]]) -> tuple[list[int], np.ndarray]:
        """The step's token ids (each request's new tokens, then its drafts) and every group's block
        tables ``[G, B, max_blocks]``, null entries pointing at block 0."""
        token_ids: list[int] = []
        num_groups = self.kv_config.num_groups
        # per group: a request's table (one made without groups, e.g. sizing's, serves every group)
        tables = [[t[g] if len(t) > g else t[0] for t in (r.block_tables for r in requests)]
                  for g in range(num_groups)]  # fmt: skip
        max_blocks = max(len(t) for group in tables for t in group)
        group_tables = np.zeros((num_groups, len(requests), max_blocks), dtype=np.int64)  # [G, B, max_blocks]
        for i, r in enumerate(requests):
            token_ids.extend(r.all_token_ids[starts[i] : starts[i] + query_lens[i]])
            if spec:
                token_ids.extend(spec.get(r.request_id, ()))
            for g in range(num_groups):
                group_tables[g, i, : len(tables[g][i])] = tables[g][i]
        # null entries (blocks that left a window, -1) point at block 0: the kernels never read keys
        # before a query's window, and pages are zeroed or hold finite K/V, so masked scores add 0
        np.maximum(group_tables, 0, out=group_tables)
        return token_ids, group_tables

    def _metadata(self, group_tables: np.ndarray, slot_mappings: np.ndarray, query_start_loc: np.ndarray,
                  seq_lens: np.ndarray, query_lens: list[int]) -> AttentionMetadata:
        """The step's ``AttentionMetadata`` on the device (group 0's table and slots first, every
        group's with a hybrid model), with the backend's plans when it builds them."""
        dev, num_groups = self.device, self.kv_config.num_groups
        num_decodes = sum(1 for n in query_lens if n == 1)
        seq_lens_list = seq_lens.tolist()
        group_tables_t = torch.from_numpy(group_tables).to(dev)  # [G, B, max_blocks]
        slot_mappings_t = torch.from_numpy(slot_mappings).to(dev)  # [G, T]
        plans, build_plan = None, self.backend.build_plan
        if build_plan is not None:
            plans = self._plans(build_plan, group_tables_t, query_lens, seq_lens_list, num_decodes)
        return AttentionMetadata(
            slot_mapping=slot_mappings_t[0],
            block_tables=group_tables_t[0],
            query_start_loc=torch.from_numpy(query_start_loc).to(dev, torch.int32),
            seq_lens=torch.from_numpy(seq_lens).to(dev, torch.int32),
            num_decodes=num_decodes,
            query_lens=query_lens,
            seq_lens_list=seq_lens_list,
            kv_caches=self.kv_caches,
            backend=self.backend,
            layers=self.layers,
            plans=plans,
            layer_group=self.kv_config.layer_group if num_groups > 1 else (),
            group_slot_mappings=list(slot_mappings_t) if num_groups > 1 else [],
            group_block_tables=list(group_tables_t) if num_groups > 1 else [],
        )

    def _plans(self, build_plan: Callable[..., AttentionPlan], group_tables: torch.Tensor, query_lens: list[int],
               seq_lens: list[int], num_decodes: int) -> list[AttentionPlan]:
        """Per KV layer its attention plan (the backend's ``build_plan``): one per (group, kind of layer), shared
        by its layers."""
        layers, layer_group = self.layers, self.kv_config.layer_group
        by_kind: dict[tuple[int, Any], AttentionPlan] = {}
        for layer, g in zip(layers, layer_group):
            if (g, layer.kind) not in by_kind:
                by_kind[g, layer.kind] = build_plan(
                    group_tables[g], query_lens, seq_lens, num_decodes, self.block_size,
                    layer.num_heads // layer.num_kv_heads, self.spec.dtype,
                    layer.num_kv_heads * layer.head_dim, window=layer.sliding_window,
                    chunk=layer.attention_chunk, exact=bool(layer.softcap) or layer.sinks,
                )
        return [by_kind[g, layer.kind] for layer, g in zip(layers, layer_group)]

    @torch.inference_mode()
    def forward(self, inp: ModelInput) -> torch.Tensor:
        """Run the model over the packed batch; logits only where a token is sampled: ``[S, vocab]``."""
        with use_metadata(inp.meta):
            logits = call_model(self.model, inp.input_ids, inp.positions, inp.logits_indices)
        if inp.meta.num_layer_calls != len(self.kv_caches):
            raise RuntimeError(
                f"the model ran the kvscope attention {inp.meta.num_layer_calls} times in this step but "
                f"{len(self.kv_caches)} times in the probe at Engine(): its attention layers depend on the input"
            )
        return logits.float()  # [S, vocab]

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, inp: ModelInput) -> list[int]:
        if not inp.sample_requests:
            return []
        return sample(logits, inp.sample_requests)

    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, inp: ModelInput,
               draft_probs: dict[str, torch.Tensor] | None = None) -> tuple[list[int], dict[str, int]]:
        """A step with drafts: per sample request the token after its accepted drafts, and per request
        with drafts how many were accepted (``worker/rejection.py``: ``verify``)."""
        drafts = inp.spec_drafts
        if drafts is None:
            raise ValueError("verify() takes a step with drafts (ModelInput.spec_drafts); sample() one without")
        tokens, accepted = verify(logits, inp.sample_requests, drafts, draft_probs)
        return tokens, {r.request_id: a for r, a, d in zip(inp.sample_requests, accepted, drafts) if d}


def call_model(
    model: Callable[..., Any], input_ids: torch.Tensor, positions: torch.Tensor, logits_indices: torch.Tensor | None
) -> torch.Tensor:
    """The one way the engine (and its probe) calls a model: a packed ``[1, T]`` batch with explicit
    positions and no transformers cache; logits of the rows in ``logits_indices`` (all when None)."""
    out = model(
        input_ids=input_ids,
        position_ids=positions,
        use_cache=False,
        logits_to_keep=0 if logits_indices is None else logits_indices,
    )
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[0]  # [S, vocab]


def _samples(requests: list[Request], seq_lens: np.ndarray, query_start_loc: np.ndarray,
             spec: dict[str, list[int]]) -> tuple[list[int], np.ndarray, list[list[int]] | None]:
    """Which requests produce a token this step (those that reach the end of everything they have, their
    drafts included), the packed rows whose logits they need, and their drafts (None: no drafts)."""
    if not spec:
        samples = [i for i, r in enumerate(requests) if seq_lens[i] == r.num_tokens]
        return samples, query_start_loc[1:][samples] - 1, None
    spec_drafts, samples = [], []  # a verification keeps the logits of all 1 + k positions
    for i, r in enumerate(requests):
        drafts = spec.get(r.request_id, [])
        if seq_lens[i] == r.num_tokens + len(drafts):
            samples.append(i)
            spec_drafts.append(drafts)
    ends = query_start_loc[1:][samples]
    logits_indices = np.concatenate([np.arange(e - 1 - len(d), e) for e, d in zip(ends, spec_drafts)])
    return samples, logits_indices, spec_drafts
