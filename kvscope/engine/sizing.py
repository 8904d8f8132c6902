"""How big an engine is: its dtype, the longest sequence it admits and the number of KV blocks.

All of it is decided once, when the ``Engine`` is built, from ``EngineConfig`` and the model.
"""

from __future__ import annotations

import torch

from kvscope.engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig, ModelSpec, cdiv
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.request import Request, SamplingParams
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.utils.host import check_kv_fits

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto``: float32 on the CPU, bfloat16 on a GPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} must be one of float32, float16, bfloat16 or auto") from None


def resolve_max_model_len(config: EngineConfig, spec: ModelSpec, hf_config=None) -> int:
    """``config.max_model_len``, checked against the positions the model has (``spec.max_model_len``).
    Sliding windows and attention chunks are run as such, so they do not limit the length."""
    limit = spec.max_model_len
    wanted = config.max_model_len
    if wanted is not None and wanted > limit:
        raise ValueError(f"max_model_len={wanted} exceeds what the model supports ({limit})")
    return wanted or limit


def resolve_num_blocks(config: EngineConfig, spec: ModelSpec, runner: ModelRunner, max_model_len: int) -> int:
    """``num_blocks`` if given, else a KV budget (``kv_cache_memory``; on a GPU the free memory after
    a profiling pass; on the CPU enough for ``max_num_seqs`` full-length sequences, capped) in blocks."""
    bs = config.block_size
    per_block = runner.kv_bytes_per_block  # a page in every KV slot (hybrid groups share slots: kv_groups)
    if config.num_blocks is not None:
        if runner.device.type == "cpu":  # refused before allocating, not by the OOM killer mid-run
            check_kv_fits(config.num_blocks, per_block, f"num_blocks={config.num_blocks}")
        return config.num_blocks
    if config.kv_cache_memory is not None:
        budget, source = int(config.kv_cache_memory), f"kv_cache_memory={config.kv_cache_memory}"
    elif runner.device.type == "cuda":
        budget = cuda_kv_budget(config, runner, max_model_len)
        source = f"{config.gpu_memory_utilization:.0%} of free GPU memory"
    else:
        # every layer's pages for every token: an upper bound on what the sequences hold, grouped or not
        needed = config.max_num_seqs * cdiv(max_model_len, bs) * spec.kv_bytes_per_block(bs)
        budget, source = min(DEFAULT_CPU_KV_BYTES, needed), "the CPU default"
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV budget ({source}: {budget} bytes) cannot hold one block: a block of {bs} tokens "
            f"over {spec.num_layers} layers needs {per_block} bytes; give more memory or num_blocks"
        )
    if runner.device.type == "cpu":
        check_kv_fits(num_blocks, per_block, source)
    return num_blocks


def cuda_kv_budget(config: EngineConfig, runner: ModelRunner, max_model_len: int) -> int:
    """Free memory after a forward pass of a full token budget, times gpu_memory_utilization."""
    device = runner.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    profile_run(config, runner, max_model_len)
    free, total = torch.cuda.mem_get_info(device)
    activation_peak = torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)
    return int(free - total * (1 - config.gpu_memory_utilization) - activation_peak)


def profile_run(config: EngineConfig, runner: ModelRunner, max_model_len: int) -> None:
    """One dummy step of ``max_num_batched_tokens`` prompt tokens through a scratch cache."""
    n = min(config.max_num_batched_tokens, max_model_len)
    bs = config.block_size
    runner.allocate_kv(cdiv(n, bs))
    pool = BlockPool(cdiv(n, bs), bs, enable_caching=False)
    sched = Scheduler(config, KVCacheManager(pool), max_model_len)
    sched.add_request(Request("profile", [0] * n, SamplingParams(max_tokens=1)))
    runner.forward(runner.prepare(sched.schedule()))
    runner.allocate_kv(1)
