"""The ``kvscope`` attention: how an unchanged HuggingFace model reads and writes the paged KV cache.

``transformers`` looks attention functions up by name in ``AttentionInterface``; after
``model.set_attn_implementation("kvscope")`` every attention layer calls ``kvscope_attention`` below
with its projected (and rotary-embedded) query, key and value, and with every extra keyword argument
that was given to ``model(...)``. The engine passes the step's ``AttentionMetadata`` that way
(``kvscope_meta=...``); ``module.layer_idx`` says which layer's pages to use.

Since "kvscope" is not in ``transformers``' mask interface, the model builds no attention mask: the
causal structure of the packed batch is given by the metadata instead (see ``kernels/reference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from .kernels import KernelBackend
from .kernels.torch_paged import AttentionPlan

ATTN_NAME = "kvscope"


@dataclass(slots=True)
class AttentionMetadata:
    """Where the step's tokens go and what they attend to. Sequences with one query token come first."""

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    block_tables: torch.Tensor  # [B, max_blocks] int64
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32: context length including the new tokens
    num_decodes: int
    query_lens: list[int]
    seq_lens_list: list[int]
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (key_cache, value_cache)
    backend: KernelBackend
    num_layer_calls: int = 0
    plan: AttentionPlan | None = None  # the torch backend's per-step plan (built once, used by every layer)


def kvscope_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, T, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, T, head_dim]
    value: torch.Tensor,  # [1, num_kv_heads, T, head_dim]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    meta: AttentionMetadata | None = kwargs.get("kvscope_meta")
    if meta is None:
        raise RuntimeError(
            "the 'kvscope' attention only runs inside kvscope.Engine (no kvscope_meta was passed); "
            "call model.set_attn_implementation('sdpa') to use this model outside the engine"
        )
    meta.num_layer_calls += 1
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    k = key[0].transpose(0, 1)  # [T, Hkv, D]
    v = value[0].transpose(0, 1)
    key_cache, value_cache = meta.kv_caches[module.layer_idx]
    meta.backend.store_kv(k, v, key_cache, value_cache, meta.slot_mapping)
    if meta.plan is not None:  # planned once per step by the runner, reused by every layer
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D] contiguous: the model reshapes it
        meta.backend.run_plan(meta.plan, q, key_cache, value_cache, scaling, out, k, v)
        return out.unsqueeze(0), None  # [1, T, Hq, D]
    out = meta.backend.paged_attention(
        q,
        key_cache,
        value_cache,
        meta.block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scaling,
        num_decodes=meta.num_decodes,
        query_lens=meta.query_lens,
        seq_lens_list=meta.seq_lens_list,
    )
    return out.unsqueeze(0), None  # [1, T, Hq, D], as transformers' own attention functions return


def register() -> None:
    """Make ``attn_implementation="kvscope"`` known to transformers (idempotent)."""
    AttentionInterface.register(ATTN_NAME, kvscope_attention)


def check_attention_supported(config) -> None:
    """Refuse models whose attention the kvscope kernels do not implement (rather than run them wrong)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    name = type(text).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{name} is an encoder-decoder model; kvscope runs decoder-only causal LMs")
    layer_types = getattr(text, "layer_types", None) or []
    others = sorted({t for t in layer_types if t != "full_attention"})
    if others:
        raise ValueError(
            f"{name} has layers of kind {others}; kvscope implements full causal attention only "
            "(sliding-window, linear or chunked attention would run wrong)"
        )
    for attr in ("attn_logit_softcapping", "attention_chunk_size"):
        if getattr(text, attr, None):
            raise ValueError(f"{name} uses {attr}={getattr(text, attr)}, which kvscope does not implement")
    if getattr(text, "alibi", False) or getattr(text, "position_embedding_type", "") == "alibi":
        raise ValueError(f"{name} uses ALiBi position biases, which kvscope does not implement")
