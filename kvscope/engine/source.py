"""kvscope's engine as a telemetry source: what it hands the recorder, as plain records.

Telemetry (``kvscope.telemetry``) never sees the engine, its scheduler or its requests. The engine
builds the static run metadata once (``run_metadata``), and after each step the ``BatchSummary`` of
its ``SchedulerOutput`` (``batch_summary``); ``Scheduler.make_stats`` gives the counters. The
profiler's backend hook is ``wrap_backend``.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from kvscope.engine.config import EngineConfig, ModelSpec
from kvscope.engine.core.scheduler import SchedulerOutput
from kvscope.engine.request import Request
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.telemetry.records import BatchSummary, RequestProgress, ScheduledItem, SpecDecodeStats


def batch_summary(step: int, sched: SchedulerOutput, sampled: list[Request], num_finished: int,
                  accepted: dict[str, list[int]] | None = None, spec: SpecDecodeStats | None = None) -> BatchSummary:
    """The step's batch as telemetry sees it, read after ``Scheduler.update_from_output``
    (``accepted``: ``SchedulerUpdate.spec_accepted``; ``spec``: the step's ``Speculator.stats``)."""
    sampled_ids = {id(r) for r in sampled}
    scheduled, tables = [], []
    drafts = sched.scheduled_spec_decode_tokens
    for request, n, is_decode in zip(sched.requests, sched.num_tokens, sched.is_decode):
        item = ScheduledItem(
            request.request_id,
            "decode" if is_decode else "prefill",
            n,
            request.num_computed_tokens,
            id(request) in sampled_ids,
        )
        if drafts and request.request_id in drafts:
            item.num_draft_tokens = len(drafts[request.request_id])
            item.num_accepted_tokens = len(accepted.get(request.request_id, ())) if accepted else 0
        scheduled.append(item)
        if request.extra_block_ids:  # a hybrid model: its groups' tables, interleaved (ScheduledItem)
            item.num_kv_groups = 1 + len(request.extra_block_ids)
            tables.append(_interleave(request.block_tables) if request.block_ids else [])
        else:
            tables.append(request.block_ids)
    admitted = []
    if sched.admitted:
        new_tokens = {id(r): n for r, n in zip(sched.requests, sched.num_tokens)}
        admitted = [
            RequestProgress(
                r.request_id,
                r.num_prompt_tokens,
                r.num_output_tokens - (id(r) in sampled_ids),
                r.num_computed_tokens - new_tokens.get(id(r), 0),
            )
            for r in sched.admitted
        ]
    preempted = [RequestProgress(r.request_id, r.num_prompt_tokens, r.num_output_tokens) for r in sched.preempted]
    return BatchSummary(step, scheduled, tables, admitted, preempted, num_finished, spec)


def _interleave(tables: list[list[int]]) -> list[int]:
    """Entry ``j * G + g`` = block ``j`` of group ``g`` (every group's table has the same length)."""
    return [b for column in zip(*tables) for b in column]


def wrap_backend(runner: ModelRunner, wrap: Callable[[str, Callable], Callable]) -> Callable[[], None]:
    """Route the runner's attention-backend calls through ``wrap(kind, fn)`` (``kind``: "store_kv" or
    "paged_attention"); returns the function that puts the original backend back."""
    saved = backend = runner.backend
    runner.backend = replace(
        backend,
        store_kv=wrap("store_kv", backend.store_kv),
        paged_attention=wrap("paged_attention", backend.paged_attention),
        run_plan=wrap("paged_attention", backend.run_plan) if backend.run_plan else None,
    )

    def restore() -> None:
        runner.backend = saved

    return restore


def weights_bytes(model: torch.nn.Module) -> int:
    """Parameters and buffers of ``model``, tied weights counted once."""
    tensors = [*model.parameters(), *model.buffers()]
    seen = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return int(sum(seen.values()))


def run_metadata(
    model_name: str,
    config: EngineConfig,
    spec: ModelSpec,
    runner: ModelRunner,
    device: torch.device,
    weights: int,
    speculative: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a saved run needs to be read without the engine (all JSON values); the keys the
    recorder itself reads are ``block_size``, ``num_blocks``, ``kv_bytes_per_token``,
    ``kv_bytes_per_block`` and ``max_model_len``."""
    from kvscope._version import __version__

    return {
        "kvscope_version": __version__,
        "model": model_name,
        # a draft model given as a module is named, not copied (asdict would deep-copy it)
        "config": _jsonable({**asdict(replace(config, speculative_config=None)),
                             "speculative_config": speculative}),
        "spec": _jsonable(asdict(spec)),
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "kv_bytes_per_block": runner.kv_bytes_per_block,  # a page in every slot (groups share slots)
        "max_model_len": spec.max_model_len,
        "static_kv_bytes_per_request": spec.kv_bytes_for_tokens(spec.max_model_len),  # window-aware
        "num_blocks": runner.num_blocks,
        "block_size": config.block_size,
        "device": str(device),
        "attention_backend": runner.backend.name,
        "weights_bytes": weights,
        "kv_pool_bytes": int(runner.kv_cache_bytes),
        # KV cache groups (kvscope.engine.core.kv_groups): layers per group, slots, padding, why a window is not freed
        "kv_cache_groups": runner.kv_config.describe(),
        "created_unix_s": time.time(),
        "host": platform.node(),
        "python": platform.python_version(),
        "speculative": speculative,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
