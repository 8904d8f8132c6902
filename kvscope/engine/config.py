"""Engine configuration and the KV-cache sizing math.

``ModelSpec`` holds what the KV cache needs to know about a model (layers, KV heads, head size, dtype);
``EngineConfig`` holds the engine's knobs and checks them once, in ``__post_init__``, so that a bad value
fails at construction with a message that names the field and a fix.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from kvscope.engine.core.rules import SchedulerRules
from kvscope.engine.spec_decode.config import SpeculativeConfig
from kvscope.engine.validation import UINT64_MAX, check_bool, check_int, check_real, parse_device
from kvscope.models.hf_config import kv_bytes_per_token
from kvscope.models.hf_config import max_positions as hf_max_positions

GiB = 1 << 30
MiB = 1 << 20

LINEAR_BACKENDS = ("auto", "torch", "onednn")  # the CPU GEMMs (worker/fusion.py)
INT64_MAX = (1 << 63) - 1  # the largest size torch can index
# What the engine reserves for the KV cache on the CPU when the user gives no budget.
DEFAULT_CPU_KV_BYTES = 1 * GiB


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One attention layer, as the KV cache and the kernels see it: what one call of the attention
    function in a forward pass stores and reads (``kvscope.engine.probe.probe`` measures it on the model itself).

    ``sliding_window``: a query at position ``p`` sees keys ``p - sliding_window + 1..p`` (transformers'
    convention); ``attention_chunk``: keys ``p - p % attention_chunk..p`` (Llama 4's chunked attention);
    ``softcap`` and ``sinks`` change the scores (Gemma 2's logit softcapping, gpt-oss' attention sinks).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int = 0  # the value head size where it differs (DeepSeek's MLA); 0: head_dim
    sliding_window: int | None = None
    attention_chunk: int | None = None
    softcap: float | None = None
    sinks: bool = False

    @property
    def value_dim(self) -> int:
        return self.head_dim_v or self.head_dim

    @property
    def kv_elems_per_token(self) -> int:
        """K and V elements one token stores in this layer."""
        return self.num_kv_heads * (self.head_dim + self.value_dim)

    @property
    def kind(self) -> tuple:
        """What a step's attention plan depends on (layers of one kind share a plan)."""
        return (self.sliding_window, self.attention_chunk, self.num_heads // self.num_kv_heads,
                bool(self.softcap) or self.sinks)  # fmt: skip


@dataclass(slots=True)
class ModelSpec:
    """The shape of a decoder-only model as far as the KV cache is concerned.

    ``layers`` (one ``LayerSpec`` per attention call of a forward pass, as the engine's probe measured
    them) is the truth where it is given: layers may differ in heads, head size and window, and the
    scalar fields then describe the first layer. Without it (the capacity planner's known shapes) every
    layer is ``num_kv_heads x head_dim``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_heads: int
    dtype: torch.dtype = torch.float16
    max_model_len: int = 2048
    vocab_size: int = 0
    num_params: int = 0
    layers: tuple[LayerSpec, ...] = ()

    @classmethod
    def from_layers(cls, layers: tuple[LayerSpec, ...], config: Any, dtype: torch.dtype) -> ModelSpec:
        """The spec of a model whose attention layers were measured (``kvscope.engine.probe.probe``)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        first = layers[0]
        return cls(
            num_layers=len(layers),
            num_kv_heads=first.num_kv_heads,
            head_dim=first.head_dim,
            num_heads=first.num_heads,
            dtype=dtype,
            max_model_len=max_positions(text),
            vocab_size=getattr(text, "vocab_size", 0) or 0,
            layers=tuple(layers),
        )

    @property
    def dtype_bytes(self) -> int:
        return self.dtype.itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element; with ``layers``, the sum over
        layers of KV heads x (key + value head size) x bytes."""
        if self.layers:
            return sum(layer.kv_elems_per_token for layer in self.layers) * self.dtype_bytes
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    def kv_bytes_for_tokens(self, num_tokens: int) -> int:
        """KV bytes one sequence of ``num_tokens`` needs when every layer keeps only what it still reads
        (a sliding-window layer its last ``sliding_window`` tokens, a chunked one its current chunk): the
        window-aware counterpart of ``num_tokens * kv_bytes_per_token``."""
        if not self.layers:
            return num_tokens * self.kv_bytes_per_token
        total = 0
        for layer in self.layers:
            kept = num_tokens
            if layer.sliding_window:
                kept = min(kept, layer.sliding_window)
            if layer.attention_chunk:
                kept = min(kept, layer.attention_chunk)
            total += kept * layer.kv_elems_per_token
        return total * self.dtype_bytes


DEFAULT_MAX_POSITIONS = 2048  # a config that declares no length (the position names: models.hf_config)


def max_positions(text_config: Any) -> int:
    """The longest sequence a loaded model's text config declares, else 2048 (``hf_config.max_positions``)."""
    return hf_max_positions(text_config, DEFAULT_MAX_POSITIONS)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    # speculative decoding: None (off), a dict of SpeculativeConfig's fields (vLLM's names), or one
    speculative_config: Any = None
    # CPU GEMMs (kvscope/engine/worker/fusion.py): "auto" (oneDNN for float32 on the CPU, else the model's own),
    # "onednn" or "torch"; merge_projections: one GEMM for q/k/v and one for gate/up
    linear_backend: str = "auto"
    merge_projections: bool = True
    # where engines' schedulers differ (kvscope/engine/core/rules.py): None or "kvscope" (kvscope's own), "vllm"
    # (vLLM 0.32's: the whole sequence must fit to be admitted, ...), a dict of SchedulerRules' fields, or one
    scheduler_rules: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every field checked for its type and range: a wrong type is a ``TypeError``, a wrong value a
        ``ValueError``, both naming the field. Sizes are integers (never ``bool``), so they are finite;
        ``kv_cache_memory`` may be a float byte count and is rounded down. Whether ``device`` can run a
        model is checked by the engine (``validation.resolve_device``)."""
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, numbers.Integral) or not _is_power_of_two(int(bs)) or bs > 256:
            error = TypeError if isinstance(bs, bool) or not isinstance(bs, numbers.Integral) else ValueError
            raise error(f"block_size={bs!r} must be a power of two between 1 and 256 (16 is a good default)")
        self.block_size = int(bs)
        self.num_blocks = check_int("num_blocks", self.num_blocks, 1, INT64_MAX, optional=True,
                                    must="a positive integer below 2**63 (or None to size it)")
        memory = self.kv_cache_memory
        if isinstance(memory, float) and math.isfinite(memory) and memory >= 1:
            memory = int(memory)
        self.kv_cache_memory = check_int("kv_cache_memory", memory, 1, INT64_MAX, optional=True,
                                         must="a positive number of bytes below 2**63 (or None)")
        self.gpu_memory_utilization = check_real("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0,
                                                 lo_open=True, must="in (0, 1]")
        below = "below 2**63"
        self.max_num_seqs = check_int("max_num_seqs", self.max_num_seqs, 1, INT64_MAX, must=f"an integer >= 1 {below}")
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1, INT64_MAX,
                                                must=f"an integer >= 1 {below}")
        self.max_model_len = check_int("max_model_len", self.max_model_len, 2, INT64_MAX, optional=True,
                                       must=f"an integer >= 2 {below} (or None: the model's)")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "telemetry", "merge_projections"):
            setattr(self, name, check_bool(name, getattr(self, name)))
        if self.attention_backend not in ("auto", "torch", "cpu", "triton"):
            raise ValueError(
                f"attention_backend={self.attention_backend!r} must be 'auto', 'torch', 'cpu' or 'triton'"
            )
        if self.linear_backend not in LINEAR_BACKENDS:
            raise ValueError(f"linear_backend={self.linear_backend!r} must be one of {LINEAR_BACKENDS}")
        self.device = parse_device(self.device)
        if self.dtype is not None and not isinstance(self.dtype, (str, torch.dtype)):
            raise TypeError(f"dtype={self.dtype!r} must be a name ('float32', 'bfloat16', 'auto') or a torch.dtype")
        self.seed = check_int("seed", self.seed, 0, UINT64_MAX, must="an unsigned 64-bit integer (0 to 2**64 - 1)")
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra={self.extra!r} must be a dict")
        self.speculative_config = SpeculativeConfig.coerce(self.speculative_config)
        self.scheduler_rules = SchedulerRules.coerce(self.scheduler_rules)
