"""The one reader of a model's ``config.json``, as plain JSON (standard library only: ``kvscope plan`` and the
faces' early checks read it without torch or transformers), and the KV arithmetic of a decoder's shape.

- ``read_config(folder)``: the folder's ``config.json`` as a dict, or ``ValueError`` in one line naming the
  folder (missing, not UTF-8, not JSON, nested too deeply, not an object);
- ``text_part``: the settings of the language model (``text_config`` of a multimodal config, else all);
- ``decoder_dims``, ``max_positions``, ``sliding_layers``, ``gives_size``: what those settings say, under
  each family's names (``num_hidden_layers`` / ``n_layer``, ``hidden_size`` / ``n_embd``, ...); the planner's
  ``ModelShape`` is made of them (``kvscope.planning.shapes.shape_of_config``);
- ``kv_bytes_per_token``: 2 (K and V) x layers x KV heads x head dim x bytes per element, the formula both
  the planner and the engine's ``ModelSpec`` use.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A config must say how big the model is; without it transformers builds its default size (Llama's: 7B)
SIZE_KEYS = (("hidden_size", "n_embd", "d_model", "dim", "hidden_dim"),
             ("num_hidden_layers", "n_layer", "num_layers", "n_layers"))
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                   "max_seq_len")


class ConfigError(ValueError):
    """``config.json`` cannot be read as settings; the message says why, without naming the file."""


def parse_config(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in ``path``; ``ConfigError`` saying why not (``FileNotFoundError`` if it is missing)."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("config.json is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ConfigError(f"config.json is not valid JSON ({exc.msg} at {where})") from None
    except RecursionError:
        raise ConfigError("config.json is nested too deeply to read") from None
    except IsADirectoryError:
        raise ConfigError("config.json is a folder") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config.json holds a JSON {type(config).__name__}, not an object of settings")
    return config


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of ``folder`` as a dict; ``ValueError`` in one line if it is missing or not a JSON object."""
    path = Path(folder) / "config.json"
    where = f"model folder {str(folder)!r}"
    if not path.is_file():
        raise ValueError(f"{where} has no config.json; give a Hugging Face model folder (config.json and weights)")
    try:
        return parse_config(path)
    except ConfigError as exc:
        raise ValueError(f"{where}: {exc}") from None


def text_part(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: ``text_config`` where a multimodal config nests them, else ``config``."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def gives_size(text: Mapping[str, Any]) -> bool:
    """Whether the settings say how big the model is (a hidden size and a layer count, under any name)."""
    return all(any(key in text for key in keys) for keys in SIZE_KEYS)


@dataclass(slots=True, frozen=True)
class DecoderDims:
    """The attention shape a config declares (every layer alike)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


def decoder_dims(text: Mapping[str, Any]) -> DecoderDims | None:
    """Layers, heads, KV heads (GQA / MQA) and head size, or ``None`` if the settings do not give them."""
    layers = text.get("num_hidden_layers", text.get("n_layer"))
    heads = text.get("num_attention_heads", text.get("n_head"))
    hidden = text.get("hidden_size", text.get("n_embd"))
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0 and (text.get("head_dim") or hidden)):
        return None
    return DecoderDims(layers, heads, text.get("num_key_value_heads") or heads, text.get("head_dim") or hidden // heads)


def max_positions(text: Mapping[str, Any] | Any, default: int = 0) -> int:
    """The longest sequence the settings declare (the first positive one of ``POSITION_LIMITS``), else ``default``.
    ``text``: the settings as a dict, or a transformers config (read by attribute: the engine's loaded model)."""
    for name in POSITION_LIMITS:
        value = text.get(name) if isinstance(text, Mapping) else getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return default


def sliding_layers(text: Mapping[str, Any], num_layers: int) -> tuple[int, int]:
    """(window, how many layers have it): ``layer_types`` where given (transformers 5), else Gemma 3's
    ``sliding_window_pattern`` (every n-th layer full), else every layer, unless ``use_sliding_window`` is
    false (Qwen 2 keeps a window in its config that it does not use) or at least as long as the positions
    (Mistral's 4096 of 4096: it never bites, as the engine's probe finds). (0, 0): no sliding window."""
    window = text.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or text.get("use_sliding_window") is False:
        return 0, 0
    if window >= max_positions(text, default=window + 1):
        return 0, 0
    types = text.get("layer_types")
    pattern = text.get("sliding_window_pattern")
    if isinstance(types, list) and types:
        count = sum(1 for t in types if t == "sliding_attention")
    elif isinstance(pattern, int) and pattern > 0:
        count = num_layers - num_layers // pattern
    else:
        count = num_layers
    return (window, count) if count else (0, 0)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """2 (K and V) x layers x KV heads x head dim x bytes per element: what one token keeps in the KV cache."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes
