"""Tiny random models of any causal-LM type that the installed ``transformers`` registers.

``tiny_model(model_type)`` takes the type's default config, shrinks every size it knows by name (width
64, 4 query and 2 KV heads of size 16, 128-wide MLPs, 4 experts, a vocabulary of 512, sliding windows
and attention chunks of 16 tokens), keeps enough layers to hold one of each layer kind the default
config interleaves (e.g. Gemma 3's five sliding layers and one full one), and builds it in float32 with
a seeded init. ``BuildError`` says why a type cannot be built that way (it needs a checkpoint, a second
modality, or a config transformers cannot make from defaults).

It is how ``benchmarks/model_sweep.py`` runs every architecture through the engine (docs/models.md).
"""

from __future__ import annotations

import contextlib
import io
import threading
import warnings
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

VOCAB = 512
MAX_LAYERS = 8
MAX_PARAMS = 20_000_000
_GLOBAL_RNG = threading.Lock()

# attribute -> value, wherever a config has that attribute (widths, heads, experts, ranks, windows)
SHRINK: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embedding_size", "word_embed_proj_dim",
                     "input_embedding_size", "output_embedding_size", "attention_hidden_size", "lru_width"), 64),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "n_inner",
                     "ffn_hidden_size", "intermediate_size_mlp", "dense_intermediate_size", "dim_ff", "dff",
                     "feed_forward_size", "d_inner"), 128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
                     "moe_shared_expert_intermediate_size", "expert_ffn_hidden_size",
                     "shared_experts_intermediate_size"), 32),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
                     "encoder_attention_heads", "attention_heads", "swa_num_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads", "num_query_groups",
                     "multi_query_group_num"), 2),
    **dict.fromkeys(("head_dim", "attention_head_dim", "kv_channels", "d_head", "dim_head", "attention_head_size",
                     "swa_head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_head_dim",
                     "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim", "mamba_d_head",
                     "mamba_head_dim", "mamba_headdim"), 16),
    "qk_head_dim": 32,
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank", "o_lora_rank"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_topk"), 2),
    **dict.fromkeys(("n_group", "topk_group", "num_expert_group"), 1),
    **dict.fromkeys(("sliding_window", "attention_chunk_size", "sliding_window_size", "attention_window_size",
                     "local_attention_window_len"), 16),
    **dict.fromkeys(("linear_num_key_heads", "index_n_heads", "mamba_n_heads", "n_mamba_heads",
                     "mamba_num_heads", "linear_num_heads"), 2),
    "linear_num_value_heads": 4,
    **dict.fromkeys(("mamba_d_state", "state_size", "ssm_state_size"), 16),
    **dict.fromkeys(("mamba_d_ssm", "embedding_dim"), 64),
    "rotary_dim": 8,
    **dict.fromkeys(("expand", "mamba_expand", "n_groups", "mamba_n_groups", "first_k_dense_replace",
                     "num_dense_layers"), 1),
    "time_step_rank": 8,
    "moe_k": 2,
    "n_shared_experts": 1,
    "vocab_size": VOCAB,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
}
# sizes whose None means "off" (a full-attention model), not "unset"
OPTIONAL = frozenset({"sliding_window", "attention_chunk_size", "sliding_window_size", "attention_window_size",
                      "local_attention_window_len", "q_lora_rank"})  # fmt: skip
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")


class BuildError(Exception):
    """A model type that cannot be built as a tiny random causal LM (the reason is the message)."""


def causal_lm_types() -> list[str]:
    """Every model type with a causal-LM class in the installed transformers, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _num_layers(text: Any) -> tuple[str, int] | None:
    for name in LAYER_COUNTS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def _layers_to_keep(text: Any, default: int) -> int:
    """Enough layers for one of each kind the default config interleaves (at least 2, at most MAX_LAYERS)."""
    kinds = getattr(text, "layer_types", None)
    if not isinstance(kinds, (list, tuple)) or not kinds:
        return min(2, default)
    first = {}
    for i, kind in enumerate(kinds):
        first.setdefault(kind, i)
    return min(max(2, max(first.values()) + 1), MAX_LAYERS, default)


def _is_size(value: Any) -> bool:
    """An int size, or None (a size the default config leaves unset, which the model would need)."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _shrunk(text: Any) -> dict[str, Any]:
    """Overrides for one (text) config: every known size, and per-layer lists cut to the kept layers."""
    values = text.to_dict()
    overrides = {k: v for k, v in SHRINK.items() if k in values and _is_size(values[k])
                 and not (k in OPTIONAL and values[k] is None)}  # fmt: skip
    if values.get("kv_lora_rank") and "num_key_value_heads" in overrides:  # MLA: one K/V per query head
        overrides["num_key_value_heads"] = overrides.get("num_attention_heads", 4)
    if "is_decoder" in values:  # BERT-style models are causal LMs only as decoders
        overrides.update(is_decoder=True, add_cross_attention=False)
    counted = _num_layers(text)
    if counted is not None:
        name, default = counted
        keep = _layers_to_keep(text, default)
        overrides[name] = keep
        for other in LAYER_COUNTS:  # e.g. BART's decoder_layers next to num_hidden_layers
            if other != name and isinstance(values.get(other), int) and values[other] > keep:
                overrides[other] = keep
        for key, value in values.items():  # per-layer lists and pattern strings ("M-M*-...")
            if isinstance(value, (list, tuple, str)) and len(value) == default and key not in overrides:
                overrides[key] = value[:keep] if not isinstance(value, tuple) else list(value[:keep])
            elif isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
                overrides[key] = {k: _per_layer(v, values) for k, v in value.items() if int(k) < keep}
    overrides["initializer_range"] = 0.25  # spread the logits: greedy is not decided by rounding noise
    return overrides


def _per_layer(layer: Any, values: dict[str, Any]) -> Any:
    """One layer's overrides (Gemma 4's wider global heads): shrunk too, twice the size where it was larger."""
    if not isinstance(layer, dict):
        return layer
    out = dict(layer)
    for key, value in layer.items():
        if key in SHRINK and isinstance(value, int) and not isinstance(value, bool):
            base = values.get(key)
            out[key] = SHRINK[key] * (2 if isinstance(base, int) and value > base else 1)
    if "kv_lora_rank" in out and "num_key_value_heads" in out:  # MLA: one K/V per query head
        out["num_key_value_heads"] = out.get("num_attention_heads", SHRINK["num_attention_heads"])
    return out


def tiny_config(model_type: str) -> Any:
    """The type's default config with every size shrunk (see the module doc); raises ``BuildError``."""
    try:
        base = AutoConfig.for_model(model_type)
    except Exception as exc:
        raise BuildError(f"no default config: {type(exc).__name__}: {_first_line(exc)}") from None
    try:
        text = base.get_text_config()
    except Exception as exc:
        raise BuildError(f"no single text config: {_first_line(exc)}") from None
    overrides = _shrunk(text)
    try:
        if text is base:
            return type(base)(**{**base.to_dict(), **overrides})
        sub = next(k for k, v in vars(base).items() if v is text)
        merged = base.to_dict()
        for key, value in vars(base).items():  # other towers (vision, audio): sizes only
            if key != sub and hasattr(value, "to_dict") and hasattr(value, "model_type"):
                merged[key] = {**value.to_dict(), **_shrunk(value)}
        merged[sub] = {**text.to_dict(), **overrides}
        for key in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"):
            if key in merged and not isinstance(merged[key], dict):
                merged[key] = SHRINK[key]
        return type(base)(**merged)
    except StopIteration:
        raise BuildError("its text config is not an attribute of the model config") from None
    except Exception as exc:
        raise BuildError(f"shrunk config rejected: {type(exc).__name__}: {_first_line(exc)}") from None


def tiny_model(model_type: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random float32 causal LM of ``model_type`` (seeded; torch's global RNG left as it was)."""
    config = tiny_config(model_type)
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]), _quiet():
        try:
            with torch.device("meta"):  # count first: a size the shrinking missed must not fill the RAM
                size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if size > MAX_PARAMS:
                raise BuildError(f"still {size / 1e6:.0f}M parameters after shrinking (sizes it does not know)")
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except BuildError:
            raise
        except Exception as exc:
            raise BuildError(f"from_config failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return model.eval()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:200]


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield
