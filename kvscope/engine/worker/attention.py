"""The ``kvscope`` attention: how an unchanged HuggingFace model reads and writes the paged KV cache.

``transformers`` looks attention functions up by name in ``AttentionInterface``; after
``model.set_attn_implementation("kvscope")`` every attention layer calls ``kvscope_attention`` below
with its projected (and rotary-embedded) query, key and value and its own keyword arguments
(``softcap``, ``s_aux``, ...). The step's ``AttentionMetadata`` reaches it through a thread-local that
the runner sets around the forward pass (``use_metadata``), not through the model's keyword
arguments, which not every model hands down to its layers.

The n-th attention call of a forward pass is *KV layer* n: its pages are ``meta.kv_caches[n]``, its
kind (sliding window, chunk, sinks, softcap) is ``meta.layers[n]`` and its plan ``meta.plans[n]``. With
KV cache groups (a hybrid model, ``kvscope.engine.core.kv_groups``) its pages are its group's slot, shared with the
layers of the same rank in other groups, and it stores and reads through its group's slot mapping and
block table (``meta.layer_group[n]``).
``kvscope.engine.probe.probe`` established at ``Engine()`` which calls a forward makes and what each passes, and
refused the model if any of it is something these kernels do not implement.

Since "kvscope" is not in ``transformers``' mask interface, the model builds no attention mask: the
structure of the packed batch (causal per sequence, windows) comes from the metadata instead (see
``kernels/reference.py``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

from kvscope.engine.config import LayerSpec
from kvscope.kernels.backend import KernelBackend
from kvscope.kernels.torch_paged import AttentionPlan
from kvscope.utils.thread_scope import thread_value

ATTN_NAME = "kvscope"
_local = threading.local()


class UnsupportedModelError(ValueError):
    """A model that kvscope cannot run exactly; refused at ``Engine()`` with the reason and a fix."""

    def __init__(self, model_type: str, reason: str, fix: str | None = None) -> None:
        self.model_type, self.reason = model_type, reason
        fix = fix or "run it with transformers itself (attn_implementation='sdpa' or 'eager')"
        super().__init__(f"kvscope cannot run this {model_type} model: {reason}. Fix: {fix}")


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
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per KV layer (key_cache, value_cache)
    backend: KernelBackend
    layers: tuple[LayerSpec, ...] = ()  # per KV layer: window, chunk, ...
    num_layer_calls: int = 0
    plans: list[AttentionPlan] | None = None  # per KV layer, one object per kind: built once per step
    # KV cache groups (kvscope.engine.core.kv_groups; empty with one group): per KV layer its group, and per group
    # its slot mapping [T] and block table [B, max_blocks] (slot_mapping / block_tables are group 0's)
    layer_group: tuple[int, ...] = ()
    group_slot_mappings: list[torch.Tensor] = field(default_factory=list)
    group_block_tables: list[torch.Tensor] = field(default_factory=list)


@contextlib.contextmanager
def use_metadata(meta: AttentionMetadata) -> Iterator[AttentionMetadata]:
    """Make ``meta`` the metadata of every kvscope attention call on this thread, for the ``with``."""
    with thread_value(_local, "meta", meta):
        yield meta


def sink_logits(sinks: torch.Tensor, num_tokens: int, num_heads: int) -> torch.Tensor | None:
    """Sinks as passed by a layer, as float32 ``[T, Hq]``: gpt-oss' ``s_aux`` is ``[Hq]`` (one logit per
    head), Inkling's ``sinks`` ``[1, Hq, T, 1]`` (per token and head). None for any other shape."""
    if sinks.numel() == num_heads:
        return sinks.reshape(1, num_heads).float().expand(num_tokens, num_heads)
    if sinks.dim() == 4 and tuple(sinks.shape) == (1, num_heads, num_tokens, 1):
        return sinks[0, :, :, 0].t().float()
    return None


def _next_layer() -> tuple[AttentionMetadata, int]:
    """The step's metadata on this thread and the KV layer of this attention call (the calls are counted)."""
    meta: AttentionMetadata | None = getattr(_local, "meta", None)
    if meta is None:
        raise RuntimeError(
            "the 'kvscope' attention only runs inside kvscope.Engine (no step metadata is set); "
            "call model.set_attn_implementation('sdpa') to use this model outside the engine"
        )
    index = meta.num_layer_calls
    meta.num_layer_calls = index + 1
    if index >= len(meta.kv_caches):
        raise RuntimeError(
            f"the model called the attention more than the {len(meta.kv_caches)} times per forward pass "
            "that the probe at Engine() saw; its attention layers depend on the input"
        )
    return meta, index


def _sinks(kwargs: dict, q: torch.Tensor) -> torch.Tensor | None:
    """A layer's attention sinks (gpt-oss' ``s_aux``, Inkling's ``sinks``) as ``[T, Hq]`` logits, or None."""
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    return sink_logits(sinks, q.shape[0], q.shape[1]) if sinks is not None else None


def kvscope_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, T, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, T, head_dim]
    value: torch.Tensor,  # [1, num_kv_heads, T, head_dim_v]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    meta, index = _next_layer()
    if dropout and module.training:
        raise RuntimeError("attention dropout is on (the model is in training mode): call model.eval()")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    k = key[0].transpose(0, 1)  # [T, Hkv, D]
    v = value[0].transpose(0, 1)  # [T, Hkv, Dv]
    if k.shape[0] != q.shape[0]:
        raise RuntimeError(f"attention call {index} got {k.shape[0]} keys for {q.shape[0]} queries: the model "
                           "adds or drops keys, which the paged cache cannot hold")  # fmt: skip
    softcap = kwargs.get("softcap") or None
    sinks = _sinks(kwargs, q)
    key_cache, value_cache = meta.kv_caches[index]
    slot_mapping, block_tables = meta.slot_mapping, meta.block_tables
    if meta.layer_group:  # a hybrid model: this layer's group's table (its slot is kv_caches[index])
        g = meta.layer_group[index]
        slot_mapping, block_tables = meta.group_slot_mappings[g], meta.group_block_tables[g]
    meta.backend.store_kv(k, v, key_cache, value_cache, slot_mapping)
    out = torch.empty((*q.shape[:2], v.shape[2]), dtype=q.dtype, device=q.device)  # [T, Hq, Dv] contiguous
    run_plan = meta.backend.run_plan
    if meta.plans is not None and run_plan is not None:  # planned once per step, reused by each layer of a kind
        run_plan(meta.plans[index], q, key_cache, value_cache, scaling, out, k, v, softcap=softcap, sinks=sinks)
        return out.unsqueeze(0), None  # [1, T, Hq, Dv]
    layer = meta.layers[index] if meta.layers else None
    meta.backend.paged_attention(
        q,
        key_cache,
        value_cache,
        block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scaling,
        num_decodes=meta.num_decodes,
        query_lens=meta.query_lens,
        seq_lens_list=meta.seq_lens_list,
        out=out,
        window=layer.sliding_window if layer else None,
        chunk=layer.attention_chunk if layer else None,
        softcap=softcap,
        sinks=sinks,
    )
    return out.unsqueeze(0), None  # [1, T, Hq, Dv], as transformers' own attention functions return


def register() -> None:
    """Make ``attn_implementation="kvscope"`` known to transformers (idempotent)."""
    AttentionInterface.register(ATTN_NAME, kvscope_attention)
