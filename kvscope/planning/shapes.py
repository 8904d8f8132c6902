"""Model shapes: ``ModelShape``, the known shapes by name (``KNOWN_MODELS``, ``known_shape``) and a model
folder's (``shape_from_config``). The one list of known model shapes: ``kvscope plan`` plans them and
``kvscope simulate`` simulates them (``kvscope.sim.shape``).

A model's shape is kvscope's in two types, for two reasons:

- ``ModelShape`` (here): torch-free and standard library only, so that ``kvscope plan``, ``--help`` and the
  options read it without loading torch (the "light modules" contract): the sizes the KV cache and a
  roofline need, with the name, parameter count and note the plan prints;
- ``kvscope.engine.config.ModelSpec``: the engine's, with a torch dtype and, for a loaded model, one
  ``LayerSpec`` per attention call as the engine's probe measured it (layers may differ in heads, head size and
  window, which no config states reliably). The simulator makes one from a ``ModelShape``
  (``kvscope.sim.shape``).

Both take their numbers from ``kvscope.models.hf_config`` (the one reader of ``config.json``) and their bytes
per token from its ``kv_bytes_per_token``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.models.hf_config import ConfigError, decoder_dims, max_positions, parse_config, sliding_layers, text_part


@dataclass(slots=True)
class ModelShape:
    """What the planner and the simulator need to know about a model."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_heads: int = 0  # query heads; 0 = unknown (as many as the KV heads)
    num_params: int = 0  # 0 = unknown
    max_position_embeddings: int = 0  # 0 = unknown
    note: str = ""
    sliding_window: int = 0  # 0 = no sliding-window layers
    num_sliding_layers: int = 0  # of num_layers (all of them when a window is given without a count)
    num_experts: int = 0  # mixture of experts: routed experts per MoE layer (0: a dense model; moe_of)
    experts_per_token: int = 0
    expert_params: int = 0  # the parameters in the routed experts, all layers (the roofline's total vs active)

    def __post_init__(self) -> None:
        if self.sliding_window and not self.num_sliding_layers:
            self.num_sliding_layers = self.num_layers


# Shapes from each model's published config.json (parameter counts from their model cards). The columns: layers,
# KV heads, head size, query heads, parameters, positions, note (then the sliding window and its layers).
KNOWN_MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("llama-7b", 32, 32, 128, 32, 6_738_415_616, 4096, "Llama-2-7B: 32 heads, no GQA"),
    ModelShape("llama-13b", 40, 40, 128, 40, 13_015_864_320, 4096, "Llama-2-13B: 40 heads, no GQA"),
    ModelShape("llama-70b", 80, 8, 128, 64, 68_976_648_192, 4096, "Llama-2-70B: 64 query heads share 8 KV heads"),
    ModelShape("llama-3-8b", 32, 8, 128, 32, 8_030_261_248, 8192, "Llama-3-8B: 32 query heads share 8 KV heads"),
    ModelShape("llama-3-70b", 80, 8, 128, 64, 70_553_706_496, 8192, "Llama-3-70B: 64 query heads, 8 KV heads"),
    ModelShape("mistral-7b", 32, 8, 128, 32, 7_241_732_096, 32768,
               "Mistral-7B-v0.1: 32 query heads, 8 KV heads, a 4096-token window in every layer", 4096),
    ModelShape("gemma-2-9b", 42, 8, 256, 16, 9_241_705_984, 8192,
               "Gemma-2-9B: 16 query heads, 8 KV heads; every other layer has a 4096-token window", 4096, 21),
    ModelShape("gpt-oss-20b", 24, 8, 64, 64, 0, 131072,
               "gpt-oss-20b: 64 query heads, 8 KV heads; every other layer has a 128-token window "
               "(MXFP4 weights: give --weights)", 128, 12),
    ModelShape("qwen2.5-0.5b", 24, 2, 64, 14, 494_032_768, 32768, "Qwen2.5-0.5B: 14 query heads, 2 KV heads"),
    ModelShape("qwen2.5-7b", 28, 4, 128, 28, 7_615_616_512, 32768, "Qwen2.5-7B: 28 query heads, 4 KV heads"),
    ModelShape("qwen2.5-14b", 48, 8, 128, 40, 14_770_033_664, 32768, "Qwen2.5-14B: 40 query heads, 8 KV heads"),
    ModelShape("gpt2", 12, 12, 64, 12, 124_439_808, 1024, "GPT-2 small: 12 heads"),
    ModelShape("smollm2", 30, 3, 64, 9, 134_515_008, 8192, "SmolLM2-135M: 9 query heads, 3 KV heads"),
    ModelShape("tiny", 2, 2, 16, 4, 139_584, 2048, "kvscope's random test model"),
)}
# The size class each known model is named by, in billions of parameters (Llama-2-7B has 6.74B: class 7). The
# course counts weights by it: 7B x 2 B (fp16) = 14 GB (``kvscope.planning.planner.weights_bytes``).
SIZE_CLASS_B: dict[str, float] = {"llama-7b": 7, "llama-13b": 13, "llama-70b": 70, "llama-3-8b": 8,
                                  "llama-3-70b": 70, "mistral-7b": 7, "gemma-2-9b": 9, "qwen2.5-0.5b": 0.5,
                                  "qwen2.5-7b": 7, "qwen2.5-14b": 14}
ALIASES = {"llama-2-7b": "llama-7b", "llama2-7b": "llama-7b", "llama-2-13b": "llama-13b",
           "llama-2-70b": "llama-70b", "llama3-8b": "llama-3-8b", "mistral": "mistral-7b",
           "qwen2.5": "qwen2.5-7b", "smollm2-135m": "smollm2", "gpt2-small": "gpt2"}


def known_shape(name: str) -> ModelShape | None:
    key = name.strip().lower()
    return KNOWN_MODELS.get(ALIASES.get(key, key))


def size_class(name: str) -> float | None:
    """The billions of parameters a known model is named by (``SIZE_CLASS_B``), ``None`` for others."""
    key = name.strip().lower()
    return SIZE_CLASS_B.get(ALIASES.get(key, key))


def shape_of_config(text: Mapping[str, Any], name: str, num_params: int = 0, note: str = "") -> ModelShape | None:
    """The shape the language model's settings (``hf_config.text_part`` of a config) declare, or ``None`` if
    they do not describe a decoder (layers, heads and hidden size)."""
    dims = decoder_dims(text)
    if dims is None:
        return None
    window, num_sliding = sliding_layers(text, dims.num_layers)
    return ModelShape(name, dims.num_layers, dims.num_kv_heads, dims.head_dim, dims.num_heads, num_params,
                      max_positions(text), note, window, num_sliding, *moe_of(text, dims.num_layers))


def moe_of(text: Mapping[str, Any], num_layers: int) -> tuple[int, int, int]:
    """A mixture of experts' (experts, experts per token, parameters in the experts) from its config's names:
    Mixtral's ``num_local_experts``, Qwen-MoE's ``num_experts``, DeepSeek's ``n_routed_experts`` (its first
    ``first_k_dense_replace`` layers dense); ``num_experts_per_tok``; an expert's gate, up and down projections,
    3 x hidden x (``moe_intermediate_size`` or ``intermediate_size``). ``(0, 0, 0)`` for a dense model."""
    experts = next((v for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if isinstance(v := text.get(k), int) and not isinstance(v, bool) and v > 1), 0)
    top_k, hidden = text.get("num_experts_per_tok"), text.get("hidden_size")
    inter = text.get("moe_intermediate_size") or text.get("intermediate_size")
    if not experts or not all(isinstance(v, int) and v > 0 for v in (top_k, hidden, inter)):
        return 0, 0, 0
    dense = text.get("first_k_dense_replace") or 0
    moe_layers = max(num_layers - (dense if isinstance(dense, int) else 0), 0)
    return experts, min(int(top_k), experts), moe_layers * experts * 3 * int(hidden) * int(inter)


def shape_from_config(folder: str | Path) -> ModelShape:
    """The shape of a local model folder (its ``config.json``, read by ``kvscope.models.hf_config``); the
    parameter count from the safetensors files when present, else left unknown. ``ValueError`` if unreadable."""
    folder = Path(folder).expanduser()
    path = folder / "config.json" if folder.is_dir() else folder
    try:
        cfg = text_part(parse_config(path))
    except FileNotFoundError:
        raise ValueError(f"{str(folder)!r} has no config.json; give a Hugging Face model folder") from None
    except (OSError, ConfigError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as a model config: {exc}") from None
    shape = shape_of_config(cfg, str(folder), note=f"from {path}")
    if shape is None:
        raise ValueError(f"{str(path)!r} does not describe a decoder (num_hidden_layers, num_attention_heads "
                         "and hidden_size are needed); give --layers, --kv-heads and --head-dim instead")
    shape.num_params = params_on_disk(path.parent)
    return shape


def params_on_disk(folder: Path) -> int:
    """Parameters counted from the headers of the folder's ``*.safetensors`` files (0 if none)."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if 0 < size < 100_000_000 else {}
        except (OSError, ValueError):
            return 0
        for name, info in header.items():
            if name != "__metadata__" and isinstance(info, dict):
                total += math.prod(info.get("shape", []))
    return total
