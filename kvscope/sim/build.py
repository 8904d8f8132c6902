"""``simulated_engine``: an ``Engine`` whose worker is the model-free ``SimWorker`` on a virtual clock.

The engine's own scheduler, KV cache manager and block pool, built here with this module's code (as
``engine/build.py`` builds them for ``Engine()``, with one KV cache group: ``sim/shape.py`` refuses sliding-window
models); only the worker differs, so the schedule, the preemptions and the prefix-cache hits are the real engine's.
Nothing loads or builds a model. The pool is sized here too (``pool_blocks``), in the order ``Engine()`` follows:
``num_blocks``, else ``kv_cache_memory`` bytes, else what the KV budget of a GPU plan leaves (``kvscope.planning``),
else the CPU default.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from kvscope.engine.build import EngineParts
from kvscope.engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig, cdiv
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.kv_groups import KVCacheConfig, single_group
from kvscope.engine.core.rules import ENGINE_RULES, KVSCOPE_RULES, VLLM_CPU_DEFAULTS
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.engine import Engine
from kvscope.engine.spec_decode.speculator import Speculator
from kvscope.sim.shape import SimShape
from kvscope.sim.speculative import SimProposer
from kvscope.sim.step_model import StepTimeModel
from kvscope.sim.worker import SimWorker
from kvscope.utils.clock import VirtualClock

WINDOW_STEPS = 4096
# The most blocks a simulated pool may have: the engine's BlockPool keeps one Python object per block (about 150
# bytes with its queue entry), so 2**20 blocks cost ~150 MB; a real model on one GPU of today has fewer (llama-7b
# on an H100: ~7,000 blocks of 16 tokens; a 135M model on an H200: ~400,000). docs/reliability.md.
MAX_SIM_BLOCKS = 1 << 20


def pool_blocks(config: EngineConfig, shape: SimShape, kv_budget: int | None = None) -> int:
    """Blocks in the simulated pool (see the module doc); at most ``MAX_SIM_BLOCKS`` (a ``ValueError`` says why)."""
    if config.num_blocks is not None:
        return _bounded(config.num_blocks, "--num-blocks", shape)
    per_block = shape.spec.kv_bytes_per_block(config.block_size)
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    elif kv_budget is not None:
        budget = kv_budget
    else:  # as Engine() on the CPU: enough for max_num_seqs full-length sequences, capped
        max_len = config.max_model_len or shape.spec.max_model_len
        budget = min(DEFAULT_CPU_KV_BYTES, config.max_num_seqs * cdiv(max_len, config.block_size) * per_block)
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"a KV budget of {budget} bytes cannot hold one block of {config.block_size} tokens "
                         f"({per_block} bytes); give more memory or --num-blocks")
    how = "the KV memory given" if config.kv_cache_memory is not None else "the GPU's KV budget"
    return _bounded(blocks, f"{how} ({budget:,} bytes at {per_block:,} bytes per block)", shape)


def _bounded(blocks: int, source: str, shape: SimShape) -> int:
    if blocks <= MAX_SIM_BLOCKS:
        return blocks
    toy = shape.name.startswith("tiny")
    fix = (f"{shape.name} is a toy of {shape.spec.kv_bytes_per_token:,} bytes per token: give the model the pool is "
           "for (--model llama-7b, smollm2, a folder), or " if toy else "give ")
    raise ValueError(f"a pool of {blocks:,} blocks ({source}, model {shape.name}) is more than a simulation holds: "
                     f"at most {MAX_SIM_BLOCKS:,} blocks (2**20; the simulator keeps an object per block, ~150 MB "
                     f"at the bound); {fix}a larger --block-size, or --num-blocks / --kv-memory within the bound")


def simulated_scheduler(config: EngineConfig, num_blocks: int, max_model_len: int,
                        eos_token_ids: frozenset[int] = frozenset(),
                        kv_config: KVCacheConfig | None = None) -> Scheduler:
    """The engine's own ``Scheduler`` over a ``KVCacheManager`` and a ``BlockPool`` of ``num_blocks``, as a
    simulation builds them (one KV cache group unless ``kv_config`` says otherwise), under the config's
    ``scheduler_rules`` (kvscope's, or vLLM's: ``--engine vllm``)."""
    pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
    kv = KVCacheManager(pool, kv_config or single_group(1), config.max_num_batched_tokens)
    return Scheduler(config, kv, max_model_len, eos_token_ids)


def with_engine_rules(config: EngineConfig, engine: str, given: Iterable[str] = ()) -> EngineConfig:
    """``config`` under an engine's scheduling rules (``"kvscope"``: unchanged; ``"vllm"``: vLLM 0.32's,
    kvscope/engine/core/rules.py), with that engine's default settings for the fields not in ``given`` (vLLM
    on the CPU backend: ``VLLM_CPU_DEFAULTS``; the user's options and a replayed run's settings win)."""
    if engine not in ENGINE_RULES:
        raise ValueError(f"--engine {engine!r} is not an engine whose rules kvscope knows: use one of "
                         f"{', '.join(sorted(ENGINE_RULES))}")
    if engine == "kvscope":
        return replace(config, scheduler_rules=KVSCOPE_RULES)
    defaults: dict[str, Any] = {k: v for k, v in VLLM_CPU_DEFAULTS.items() if k not in set(given)}
    config = replace(config, scheduler_rules=ENGINE_RULES[engine], **defaults)
    if config.max_num_batched_tokens < config.max_num_seqs:  # vLLM's SchedulerConfig refuses it
        raise ValueError(f"vLLM needs max_num_batched_tokens ({config.max_num_batched_tokens}) >= max_num_seqs "
                         f"({config.max_num_seqs}): raise --max-num-batched-tokens or lower --max-num-seqs")
    return config


def simulated_engine(shape: SimShape, config: EngineConfig, step_model: StepTimeModel, *,
                     kv_budget: int | None = None, meta: dict[str, Any] | None = None,
                     clock: VirtualClock | None = None, window_steps: int = WINDOW_STEPS,
                     acceptance_rate: float | None = None) -> Engine:
    """An engine that simulates ``shape`` under ``config``, timed by ``step_model``; ``meta`` is added to
    its run metadata (with ``simulated``: what it stood for and how it was timed). Its recorder keeps the
    last ``window_steps`` steps (the time series, page map and files of a long simulation are that window;
    ``LiveRun`` keeps the exact summary of all of it)."""
    if config.speculative_config is not None and acceptance_rate is None:
        raise ValueError("a simulation of speculative decoding needs the drafts' acceptance rate: give "
                         "--acceptance-rate P (each draft accepted with probability P, until the first rejection)")
    spec = shape.spec
    max_len = config.max_model_len or spec.max_model_len
    if max_len > spec.max_model_len:
        raise ValueError(f"max_model_len={max_len} exceeds what the model supports ({spec.max_model_len})")
    spec.max_model_len = max_len
    clock = clock or VirtualClock()
    num_blocks = pool_blocks(config, shape, kv_budget)
    kv_config = single_group(spec.num_layers)
    token = next(t for t in range(max(spec.vocab_size, 1) + len(shape.eos_token_ids) + 1)
                 if t not in shape.eos_token_ids)
    worker = SimWorker(step_model, clock, config.block_size, num_blocks, spec.kv_bytes_per_block(config.block_size),
                       kv_config, token, acceptance_rate=acceptance_rate or 0.0, rng=random.Random(config.seed))
    speculator = None
    if config.speculative_config is not None:  # the engine's own Speculator, with placeholder drafts
        speculator = Speculator(config.speculative_config, SimProposer(token), max_len)
    scheduler = simulated_scheduler(config, num_blocks, max_len, shape.eos_token_ids, kv_config)
    pool, kv = scheduler.kv.pool, scheduler.kv
    simulated = {"step_model": step_model.describe(), "shape_source": shape.source,
                 "scheduler_rules": scheduler.rules.name, **(meta or {})}
    if speculator is not None:
        simulated["acceptance_rate"] = acceptance_rate
    extra = {"simulated": simulated, "device": f"simulated ({step_model.name})"}
    parts = EngineParts(None, shape.tokenizer, shape.name, spec, None, kv_config, worker, pool, kv, scheduler,
                        speculator, clock, extra)
    engine = Engine.from_parts(parts, config)
    if engine.recorder is not None:  # memory bounded at any length: the last window of steps, the exact summary
        engine.recorder.capacity = window_steps
        engine.recorder.clear()
    return engine
