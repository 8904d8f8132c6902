"""The model a simulation stands for: its shape only (layers, heads, head size, dtype), never its weights.

``resolve_shape`` takes a model name or folder (config.json and tokenizer only: ``tiny``, ``tiny-<arch>``,
``smollm2``, a Hugging Face folder), a known shape (``llama-7b``, ...: ``kvscope.planning.shapes``, the one list of
known shapes, which ``kvscope plan`` plans too), or a recorded run's metadata (``--replay``). The tokenizer, where
there is one, makes text prompts and synthetic prompts the same token ids as ``kvscope run``'s.

``SimShape`` is not a third type of model shape: a name or a folder is read into the planner's ``ModelShape``
(``shape_of_config``, ``known_shape``), which ``_simulated`` makes into the engine's ``ModelSpec`` (a torch dtype:
what the engine's core, its sizing and the run's metadata read; ``kvscope.planning.shapes`` says why the two
differ), kept with what a simulation needs besides: the tokenizer, the end-of-sequence ids and where it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvscope.engine.config import DEFAULT_MAX_POSITIONS, ModelSpec
from kvscope.models.hf_config import read_config, text_part
from kvscope.planning.shapes import KNOWN_MODELS, ModelShape, known_shape, params_on_disk, shape_of_config

DEFAULT_VOCAB = 32000  # for a known shape without a tokenizer (Llama-2's): synthetic prompts only need ids


@dataclass(slots=True)
class SimShape:
    """A simulated model: its engine spec, its tokenizer (``None`` for a known shape or a replay) and end ids."""

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
    shape = shape_of_config(text, name, num_params, source)
    if shape is None:
        raise ValueError(f"{name!r}: its config does not describe a decoder (layers, heads, hidden size)")
    eos = text.get("eos_token_id", cfg.get("eos_token_id"))
    eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return _simulated(shape, dtype, int(text.get("vocab_size") or 0), eos_ids, source)


def _simulated(shape: ModelShape, dtype: torch.dtype, vocab_size: int, eos_ids: frozenset[int],
               source: str) -> SimShape:
    """``shape`` as the engine's ``ModelSpec`` (as many query heads as KV heads, and ``DEFAULT_MAX_POSITIONS``
    positions, where the shape does not say); refused if it has sliding-window layers."""
    limit = shape.max_position_embeddings or DEFAULT_MAX_POSITIONS
    if shape.sliding_window and shape.sliding_window < limit:
        raise ValueError(f"{shape.name!r} has sliding-window layers ({shape.sliding_window} tokens); kvscope "
                         "simulate models full attention only, so it would be wrong: simulate a full-attention model")
    spec = ModelSpec(shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.num_heads or shape.num_kv_heads,
                     dtype, limit, vocab_size, shape.num_params)
    return SimShape(shape.name, spec, None, eos_ids, source)


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
        shape = _from_config(name, cfg, dt, KNOWN_MODELS["tiny"].num_params, "kvscope's tiny config")
        shape.tokenizer = build_tiny_tokenizer()
        return shape
    folder = str(smollm2_path()) if name in ("smollm2", "smollm2-135m") and smollm2_path() else name
    if os.path.isdir(folder):
        cfg = read_config(folder)
        num_params = params_on_disk(Path(folder).expanduser())
        shape = _from_config(name, cfg, dt, num_params, f"{folder}/config.json")
        shape.tokenizer = load_tokenizer(folder)
        return shape
    known = known_shape(name)
    if known is None:
        raise ValueError(f"unknown model {name!r} for a simulation: give 'tiny', 'smollm2', a model folder, or a "
                         f"known shape ({', '.join(KNOWN_MODELS)})")
    return _simulated(known, dt, DEFAULT_VOCAB, frozenset(), f"known shape: {known.note}")


def shape_of_run(meta: Mapping[str, Any]) -> SimShape:
    """The shape a recorded run was made with (its ``spec`` metadata)."""
    spec = meta.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError("the run's metadata has no model spec (it was not made by kvscope's engine); give --model")
    try:
        layers = [s for s in spec.get("layers") or [] if isinstance(s, Mapping)]
        if any(s.get("sliding_window") or s.get("attention_chunk") for s in layers):
            raise ValueError("the run's model has sliding-window layers; kvscope simulate models full attention only")
        ms = ModelSpec(int(spec["num_layers"]), int(spec["num_kv_heads"]), int(spec["head_dim"]),
                       int(spec["num_heads"]), dtype_of(str(spec.get("dtype", "float32")), torch.float32),
                       int(meta["max_model_len"]), int(spec.get("vocab_size") or 0), int(spec.get("num_params") or 0))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"the run's model spec is incomplete ({exc}); give --model") from None
    return SimShape(str(meta.get("model", "?")), ms, None, frozenset(), "the recorded run")
