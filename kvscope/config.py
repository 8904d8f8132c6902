"""Engine configuration and the KV-cache sizing math.

``ModelSpec`` holds what the KV cache needs to know about a model (layers, KV heads, head size, dtype);
``EngineConfig`` holds the engine's knobs and checks them once, in ``__post_init__``, so that a bad value
fails at construction with a message that names the field and a fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

GiB = 1 << 30
MiB = 1 << 20

# What the engine reserves for the KV cache on the CPU when the user gives no budget.
DEFAULT_CPU_KV_BYTES = 1 * GiB


@dataclass(slots=True)
class ModelSpec:
    """The shape of a decoder-only model as far as the KV cache is concerned."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_heads: int
    dtype: torch.dtype = torch.float16
    max_model_len: int = 2048
    vocab_size: int = 0
    num_params: int = 0

    @classmethod
    def from_hf_config(cls, config: Any, dtype: torch.dtype | None = None) -> ModelSpec:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
        return cls(
            num_layers=text.num_hidden_layers,
            num_kv_heads=getattr(text, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            num_heads=num_heads,
            dtype=dtype or getattr(text, "dtype", None) or torch.float32,
            max_model_len=getattr(text, "max_position_embeddings", 2048),
            vocab_size=getattr(text, "vocab_size", 0),
        )

    @property
    def dtype_bytes(self) -> int:
        return self.dtype.itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens (the last one may be partly filled)."""
    return cdiv(num_tokens, block_size)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(slots=True)
class EngineConfig:
    """Knobs of the engine. Sizes of ``None`` are filled in by the engine from the model and device.

    KV pool size: ``num_blocks`` wins; else ``kv_cache_memory`` bytes; else on CUDA
    ``gpu_memory_utilization`` of the device minus what the model uses, on the CPU ``DEFAULT_CPU_KV_BYTES``
    (capped at what ``max_num_seqs`` full-length sequences could ever need).
    """

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float = 0.90
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str = "auto"
    device: str | None = None
    dtype: str | torch.dtype | None = None
    seed: int = 0
    telemetry: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (
            not isinstance(self.block_size, int)
            or not _is_power_of_two(self.block_size)
            or self.block_size > 256
        ):
            raise ValueError(
                f"block_size={self.block_size!r} must be a power of two between 1 and 256 (16 is a good default)"
            )
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks < 1):
            raise ValueError(
                f"num_blocks={self.num_blocks!r} must be a positive integer (or None to size it)"
            )
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory!r} must be a positive number of bytes")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be at least 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len={self.max_model_len} must be at least 2")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"attention_backend={self.attention_backend!r} must be 'auto', 'torch' or 'triton'"
            )


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str | int | float) -> int:
    """'40GiB', '512MB', '1.5G', 1024 -> bytes. Binary units for both spellings (GB == GiB), as the
    course's worked examples use them."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", text.upper())
    if match is None:
        raise ValueError(f"cannot read {text!r} as a size; write it like '40GiB', '512MiB' or a byte count")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)
