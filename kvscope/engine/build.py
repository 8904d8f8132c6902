"""How ``Engine()`` builds its parts from a model and an ``EngineConfig``, in this order.

1. The model: loaded by name (or taken as given), probed (``kvscope.engine.probe.probe``: refused with
   ``UnsupportedModelError`` if kvscope cannot run it exactly, else switched to the kvscope attention),
   moved to the device and dtype; its ``ModelSpec`` from the measured layers.
2. The worker: the attention backend, the model's fused projections (``worker/fusion.py``), the KV cache
   groups (``core/kv_groups.py``) and the ``ModelRunner`` with its KV pages, sized by ``sizing.py``.
3. The core: the ``BlockPool``, the ``KVCacheManager`` and the ``Scheduler`` (with the tokens that end a
   request), and the ``Speculator`` when speculative decoding is configured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvscope.engine.config import EngineConfig, ModelSpec
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.kv_cache_manager import KVCacheManager
from kvscope.engine.core.kv_groups import KVCacheConfig, plan_kv_cache_groups
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.probe.probe import probe_model
from kvscope.engine.protocols import Worker
from kvscope.engine.sizing import resolve_dtype, resolve_max_model_len, resolve_num_blocks
from kvscope.engine.spec_decode import Speculator, build_speculator
from kvscope.engine.worker.fusion import accelerate
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.kernels.backend import resolve_backend
from kvscope.models.loader import load_model
from kvscope.utils.clock import WALL_CLOCK, Clock


@dataclass(slots=True)
class EngineParts:
    """What ``build_parts`` made; the engine keeps each as an attribute of the same name."""

    model: torch.nn.Module | None  # None: a simulation's worker needs no model
    tokenizer: Any
    model_name: str
    spec: ModelSpec  # spec.max_model_len: the engine's (EngineConfig.max_model_len checked)
    fused_linears: Any
    kv_config: KVCacheConfig | None
    runner: Worker[Any, Any]  # a ModelRunner, or the simulator's model-free SimWorker (kvscope.sim.worker)
    pool: BlockPool
    kv: KVCacheManager
    scheduler: Scheduler
    speculator: Speculator | None
    clock: Clock = WALL_CLOCK  # a simulation's is virtual
    extra_meta: dict[str, Any] = field(default_factory=dict)  # added to the run metadata


def build_parts(model: str | torch.nn.Module, tokenizer: Any, config: EngineConfig,
                device: torch.device) -> EngineParts:
    """The engine's model, runner, KV pool, scheduler and speculator (see the module doc)."""
    dtype = resolve_dtype(config.dtype, device)
    model, tokenizer, model_name, spec = load_probed(model, tokenizer, config, device, dtype)
    backend = resolve_backend(config.attention_backend, device)
    # the runner calls the model through its fast GEMMs (fusion.py); the model object is unchanged
    runner_model, fused_linears = accelerate(model, config.linear_backend, config.merge_projections, device, dtype)
    # KV cache groups (kv_groups.py): one unless the model mixes windows; fallback_reason says why
    # a windowed model runs as one group that keeps every block
    kv_config = plan_kv_cache_groups(spec.layers) if spec.layers else None
    runner = ModelRunner(runner_model, spec, config.block_size, 1, backend, device, kv_config)
    num_blocks = resolve_num_blocks(config, spec, runner, spec.max_model_len)
    runner.allocate_kv(num_blocks)
    pool, kv, scheduler = build_core(config, kv_config, num_blocks, spec.max_model_len, eos_token_ids(model, tokenizer))
    speculator = None  # speculative decoding (spec_decode/), when configured
    if config.speculative_config is not None:
        speculator = build_speculator(
            config.speculative_config, target_vocab=spec.vocab_size, target_tokenizer=tokenizer,
            block_size=config.block_size, num_blocks=num_blocks, enable_prefix_caching=config.enable_prefix_caching,
            backend=backend, device=device, dtype=dtype, max_model_len=spec.max_model_len,
            telemetry=config.telemetry)
    return EngineParts(model, tokenizer, model_name, spec, fused_linears, kv_config, runner, pool, kv, scheduler,
                       speculator)


def build_core(config: EngineConfig, kv_config: KVCacheConfig | None, num_blocks: int, max_model_len: int,
               eos: frozenset[int]) -> tuple[BlockPool, KVCacheManager, Scheduler]:
    """The core as new: an empty ``BlockPool`` (nothing cached), its ``KVCacheManager`` and a ``Scheduler`` with
    no request (``Engine()``; ``Engine.reset`` builds it again around the same model)."""
    pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
    kv = KVCacheManager(pool, kv_config, config.max_num_batched_tokens)
    return pool, kv, Scheduler(config, kv, max_model_len, eos)


def load_probed(model: str | torch.nn.Module, tokenizer: Any, config: EngineConfig, device: torch.device,
                dtype: torch.dtype) -> tuple[torch.nn.Module, Any, str, ModelSpec]:
    """The model (by name, or as given) probed and on ``device`` in ``dtype``, its tokenizer (the one
    given wins), its name and its spec (``max_model_len`` resolved against ``config``)."""
    if isinstance(model, str):
        model, loaded_tok, model_name = load_model(model, dtype=dtype)
        tokenizer = tokenizer or loaded_tok
    else:
        model_name = type(model).__name__
    # a few one-token forwards: refuses (UnsupportedModelError, model left as it was) what kvscope
    # cannot run exactly, else measures each attention layer and switches the model to kvscope's
    layers = probe_model(model, config.max_model_len, config.max_num_batched_tokens)
    model = model.to(device=device, dtype=dtype).eval()
    spec = ModelSpec.from_layers(layers, model.config, dtype)
    spec.num_params = sum(p.numel() for p in model.parameters())
    spec.max_model_len = resolve_max_model_len(config, spec, model.config)
    return model, tokenizer, model_name, spec


def eos_token_ids(model: torch.nn.Module, tokenizer: Any) -> frozenset[int]:
    """The token ids that end a request, as ``generate`` reads them (generation config, else tokenizer)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos) if isinstance(eos, (list, tuple, set)) else frozenset([eos])
