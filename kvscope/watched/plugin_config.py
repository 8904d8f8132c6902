"""A vLLM server's scheduler and cache settings, as the plugin reads them once from its ``vllm_config`` and the
watch keeps them (``meta["watch"]["config"]``): what a replay of the watched workload needs to schedule as the
server did. Standard library only (the plugin imports it inside the server).

Keys are kvscope's own engine-setting names (``EngineConfig``'s, as a kvscope run's ``meta["config"]`` has them,
which ``kvscope simulate --replay`` reads: ``block_size``, ``num_blocks``, ``max_num_seqs``,
``max_num_batched_tokens``, ``max_model_len``, ``enable_prefix_caching``, ``enable_chunked_prefill``; the last
two are vLLM's names too), vLLM's names for the rest. ``num_blocks`` is vLLM's ``num_gpu_blocks``, the whole
pool: vLLM keeps one of those blocks as its "null" block, so ``num_blocks - 1`` hold tokens.
"""

from __future__ import annotations

import math
from typing import Any

# kvscope's key -> (vllm_config's part, its attribute) in vLLM 0.32 (vllm/config/cache.py, scheduler.py, model.py)
CONFIG_FIELDS: dict[str, tuple[str, str]] = {
    "block_size": ("cache_config", "block_size"),
    "num_blocks": ("cache_config", "num_gpu_blocks"),
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "max_model_len": ("model_config", "max_model_len"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "async_scheduling": ("scheduler_config", "async_scheduling"),
    # vLLM's own (kvscope has no such setting)
    "policy": ("scheduler_config", "policy"),
    "long_prefill_token_threshold": ("scheduler_config", "long_prefill_token_threshold"),
    "max_num_scheduled_tokens": ("scheduler_config", "max_num_scheduled_tokens"),
    "max_num_active_seqs": ("scheduler_config", "max_num_active_seqs"),
    "scheduler_reserve_full_isl": ("scheduler_config", "scheduler_reserve_full_isl"),
    "watermark": ("scheduler_config", "watermark"),
    "prefill_schedule_interval": ("scheduler_config", "prefill_schedule_interval"),
    "stream_interval": ("scheduler_config", "stream_interval"),
    "num_gpu_blocks_override": ("cache_config", "num_gpu_blocks_override"),
    "prefix_caching_hash_algo": ("cache_config", "prefix_caching_hash_algo"),
}
MAX_TEXT = 64  # characters of a text setting (policy, hash algorithm)
MAX_INT = 1 << 53


def plain(value: Any) -> bool | int | float | str | None:
    """A setting as JSON can hold it: ``None`` for anything that is no bool, whole number, finite number or
    short text (an enum is its value)."""
    value = getattr(value, "value", value)  # an Enum
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else None
    return None


def engine_config(vllm_config: Any) -> dict[str, bool | int | float | str | None]:
    """The settings of ``CONFIG_FIELDS`` from vLLM's ``VllmConfig`` (``None`` where it has no such field)."""
    return {key: plain(getattr(getattr(vllm_config, part, None), attr, None))
            for key, (part, attr) in CONFIG_FIELDS.items()}


def checked_config(raw: Any) -> dict[str, bool | int | float | str | None] | None:
    """A ``config`` read from a plugin line or a file: the known keys whose values are plain, the rest dropped;
    ``None`` if it is no object."""
    if not isinstance(raw, dict):
        return None
    return {key: plain(raw[key]) for key in CONFIG_FIELDS if key in raw}
