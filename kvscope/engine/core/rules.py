"""The scheduling rules where engines differ: kvscope's own, or vLLM's (``--engine vllm``), carried by
``EngineConfig.scheduler_rules`` to the ``Scheduler``.

Every rule of vLLM 0.32's scheduler that can change a schedule, which of them kvscope follows and why, is in
docs/vllm_scheduling.md. Those that differ are the fields here; their defaults are kvscope's, so a config that
names no rules schedules exactly as before. ``VLLM_RULES`` turns on vLLM's, and ``VLLM_CPU_DEFAULTS`` holds the
engine settings a vLLM server on the CPU backend starts with when it is given none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(slots=True, frozen=True)
class SchedulerRules:
    """How the scheduler decides where kvscope and vLLM differ (vLLM's names for the fields).

    ``reserve_full_isl`` (vLLM's ``scheduler_reserve_full_isl``): a waiting or preempted request is admitted
    only if the free blocks hold its whole sequence (prompt and the outputs it already has, after its
    prefix-cache hit), not only the chunk scheduled now; otherwise it waits and so does everyone behind it.
    ``finish_in_schedule_order``: the requests a step
    finishes give back their blocks in the order they were scheduled (vLLM frees them as it walks its
    schedule), not in the worker's packing order; this decides which cached blocks are evicted first.
    ``hash_index``: vLLM's prefix index (``BlockPool.use_hash_index``): a cached block is found by its chained
    hash and tokens whatever block held its parent, and a second block with the same contents is cached too.
    ``preempted_hits_apart``: the prefix-cache lookup of a preempted request when it is admitted again is
    not counted in ``prefix_cache_queries`` / ``prefix_cache_hits`` but apart (vLLM's
    ``PrefixCacheStats.preempted_queries`` / ``preempted_hits``, which ``vllm:prefix_cache_hits`` leaves out);
    kvscope counts every admission's lookup.
    ``name``: what the run metadata calls these rules.
    """

    name: str = "kvscope"
    reserve_full_isl: bool = False
    finish_in_schedule_order: bool = False
    hash_index: bool = False
    preempted_hits_apart: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"scheduler_rules name={self.name!r} must be a non-empty string")
        for flag in ("reserve_full_isl", "finish_in_schedule_order", "hash_index", "preempted_hits_apart"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"scheduler_rules {flag}={getattr(self, flag)!r} must be True or False")

    @property
    def is_default(self) -> bool:
        """kvscope's own rules: the scheduler's plain paths."""
        return not (self.reserve_full_isl or self.finish_in_schedule_order or self.hash_index
                    or self.preempted_hits_apart)

    @classmethod
    def coerce(cls, value: Any) -> SchedulerRules:
        """``None`` (kvscope's), an engine's name (``"kvscope"``, ``"vllm"``), a dict of the fields, or rules."""
        if value is None:
            return KVSCOPE_RULES
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            if value not in ENGINE_RULES:
                raise ValueError(f"scheduler_rules={value!r} is not an engine's rules: use one of "
                                 f"{sorted(ENGINE_RULES)}, or a dict of SchedulerRules' fields")
            return ENGINE_RULES[value]
        if not isinstance(value, dict):
            raise TypeError(f"scheduler_rules={value!r} must be 'kvscope', 'vllm', a dict of SchedulerRules' fields "
                            "or SchedulerRules")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise ValueError(f"scheduler_rules has unknown keys {unknown}; it takes {sorted(known)}")
        return cls(**{"name": "custom", **value})


KVSCOPE_RULES = SchedulerRules()
VLLM_RULES = SchedulerRules(name="vllm", reserve_full_isl=True, finish_in_schedule_order=True, hash_index=True,
                            preempted_hits_apart=True)
ENGINE_RULES = {"kvscope": KVSCOPE_RULES, "vllm": VLLM_RULES}

# vLLM 0.32's engine settings on the CPU backend when none are given (vllm/engine/arg_utils.py,
# _get_default_max_num_seqs_and_batched_tokens: the OpenAI server's, one CPU socket; vllm/platforms/cpu.py: the
# block size it picks when none is given). Async scheduling is forced off there, as in kvscope.
VLLM_CPU_DEFAULTS: dict[str, int] = {"max_num_batched_tokens": 2048, "max_num_seqs": 128, "block_size": 128}
