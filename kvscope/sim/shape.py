"""The model a simulation stands for: its shape only (layers, heads, head size, dtype), never its weights.

``resolve_shape`` takes a model name or folder (config.json and tokenizer only: ``tiny``, ``tiny-<arch>``,
``smollm2``, a Hugging Face folder), a known shape of the planner (``llama-7b``, ...), or a recorded run's
metadata (``--replay``). The tokenizer, where there is one, makes text prompts and synthetic prompts the
same token ids as ``kvscope run``'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kvscope.engine.config import DEFAULT_MAX_POSITIONS, ModelSpec
from kvscope.models.hf_config import decoder_dims, max_positions, read_config, sliding_layers, text_part
from kvscope.planning.planner import known_shape, shape_from_config

# query heads of the planner's known shapes (it keeps only what the KV cache needs)
KNOWN_QUERY_HEADS = {"llama-7b": 32, "llama-13b": 40, "llama-70b": 64, "llama-3-8b": 32, "llama-3-70b": 64,
                     "mistral-7b": 32, "gemma-2-9b": 16, "gpt-oss-20b": 64, "qwen2.5-0.5b": 14, "qwen2.5-7b": 28,
                     "qwen2.5-14b": 40, "gpt2": 12, "smollm2": 9, "tiny": 4}
DEFAULT_VOCAB = 32000  # for a known shape without a tokenizer (Llama-2's): synthetic prompts only need ids


@dataclass(slots=True)
class SimShape:
    name: str
    spec: ModelSpec
    tokenizer: Any = None
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    source: str = ""  # where the shape came from, for the run's metadata


def dtype_of(name: str | torch.dtype | None, default: torch.dtype) -> torch.dtype:
    from kvscope.engine.sizing import DTYPES

    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return default
    text = str(name).removeprefix("torch.")
    if text not in DTYPES:
        raise ValueError(f"dtype={name!r} must be one of float32, float16, bfloat16 or auto")
    return DTYPES[text]


def _from_config(name: str, cfg: Mapping[str, Any], dtype: torch.dtype, num_params: int, source: str) -> SimShape:
    text = text_part(cfg)
    dims = decoder_dims(text)
    if dims is None:
        raise ValueError(f"{name!r}: its config does not describe a decoder (layers, heads, hidden size)")
    window, _ = sliding_layers(text, dims.num_layers)
    limit = max_positions(text, DEFAULT_MAX_POSITIONS)
    if window and window < limit:
        raise ValueError(f"{name!r} has sliding-window layers ({window} tokens); kvscope simulate models full "
                         "attention only, so it would be wrong: simulate a full-attention model")
    spec = ModelSpec(dims.num_layers, dims.num_kv_heads, dims.head_dim, dims.num_heads, dtype, limit,
                     int(text.get("vocab_size") or 0), num_params)
    eos = text.get("eos_token_id", cfg.get("eos_token_id"))
    eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return SimShape(name, spec, None, eos_ids, source)


def resolve_shape(model: str, dtype: str | torch.dtype | None = None, *,
                  default_dtype: torch.dtype = torch.float32) -> SimShape:
    """The shape of ``model`` (a name, a folder, or a known shape); ``ValueError`` naming what is known."""
    from kvscope.models.loader import (
        TINY_ARCHS,
        build_tiny_tokenizer,
        load_tokenizer,
        smollm2_path,
        tiny_config,
    )

    dt = dtype_of(dtype, default_dtype)
    name = model.strip()
    if name == "tiny" or name in (f"tiny-{a}" for a in TINY_ARCHS):
        arch = name[5:] or "llama"
        cfg = tiny_config(arch).to_dict()
        shape = _from_config(name, cfg, dt, known_shape("tiny").num_params, "kvscope's tiny config")
        shape.tokenizer = build_tiny_tokenizer()
        return shape
    folder = str(smollm2_path()) if name in ("smollm2", "smollm2-135m") and smollm2_path() else name
    if os.path.isdir(folder):
        cfg = read_config(folder)
        shape = _from_config(name, cfg, dt, shape_from_config(folder).num_params, f"{folder}/config.json")
        shape.tokenizer = load_tokenizer(folder)
        return shape
    known = known_shape(name)
    if known is None:
        raise ValueError(f"unknown model {name!r} for a simulation: give 'tiny', 'smollm2', a model folder, or a "
                         "known shape (kvscope plan --list shows them)")
    if known.sliding_window:
        raise ValueError(f"{name!r} has sliding-window layers; kvscope simulate models full attention only")
    heads = KNOWN_QUERY_HEADS.get(known.name, known.num_kv_heads)
    spec = ModelSpec(known.num_layers, known.num_kv_heads, known.head_dim, heads, dt,
                     known.max_position_embeddings or DEFAULT_MAX_POSITIONS, DEFAULT_VOCAB, known.num_params)
    return SimShape(known.name, spec, None, frozenset(), f"known shape: {known.note}")


def shape_of_run(meta: Mapping[str, Any]) -> SimShape:
    """The shape a recorded run was made with (its ``spec`` metadata)."""
    spec = meta.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError("the run's metadata has no model spec (it was not made by kvscope's engine); give --model")
    try:
        layers = [s for s in spec.get("layers") or [] if isinstance(s, Mapping)]
        if any(s.get("sliding_window") or s.get("attention_chunk") for s in layers):
            raise ValueError("the run's model has sliding-window layers; kvscope simulate models full attention only")
        ms = ModelSpec(int(spec["num_layers"]), int(spec["num_kv_heads"]), int(spec["head_dim"]), int(spec["num_heads"]),
                       dtype_of(str(spec.get("dtype", "float32")), torch.float32), int(meta["max_model_len"]),
                       int(spec.get("vocab_size") or 0), int(spec.get("num_params") or 0))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the run's model spec is incomplete ({exc}); give --model") from None
    return SimShape(str(meta.get("model", "?")), ms, None, frozenset(), "the recorded run")
