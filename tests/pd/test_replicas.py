"""Replicas behind the router (kvscope.pd.replicas): each policy's choice, and one replica through the router
times requests exactly as the engine alone does."""

from __future__ import annotations

from collections import Counter

import pytest

from kvscope.engine.config import EngineConfig
from kvscope.engine.request import SamplingParams
from kvscope.pd.replicas import SimReplicaEngine, pick
from kvscope.planning.gpus import find_gpu
from kvscope.sim.build import simulated_engine
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import resolve_shape
from kvscope.utils.clock import VirtualClock

SHAPE = resolve_shape("llama-7b", "bfloat16")
S = SHAPE.spec
ROOF = RooflineModel(find_gpu("a100"), S.num_params, S.dtype_bytes, S.num_layers, S.num_heads, S.head_dim,
                     S.kv_bytes_per_token)
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def build(name, clock):
    return simulated_engine(SHAPE, EngineConfig(telemetry=False), ROOF, kv_budget=1 << 30, clock=clock)


def test_pick_by_policy():
    names, load = ["a", "b", "c"], {"a": 2, "b": 0, "c": 1}
    assert [pick("round_robin", names, load, t) for t in range(4)] == ["a", "b", "c", "a"]
    assert pick("least_outstanding", names, load, 0) == "b"
    assert pick("prefix_aware", names, load, 0, {"a": 5, "b": 0, "c": 5}.get) == "c"  # most cached, then least load
    assert pick("prefix_aware", names, load, 0, lambda n: 0) == "b"
    with pytest.raises(ValueError, match="unknown router policy 'random'"):
        pick("random", names, load, 0)


def routed(policy: str, prompts: list[list[int]]) -> Counter:
    engine = SimReplicaEngine(build, 3, policy, clock=VirtualClock(0))
    for p in prompts:  # one at a time, each finished before the next: the load never decides
        engine.generate([p], PARAMS)
    return Counter(r.prefill for r in engine.done)


def test_round_robin_spreads_and_prefix_aware_follows_the_cache():
    shared = list(range(100, 164))  # four full blocks
    prompts = [[*shared, i] for i in range(6)]
    assert routed("round_robin", prompts) == Counter({"replica-0": 2, "replica-1": 2, "replica-2": 2})
    assert routed("least_outstanding", prompts) == Counter({"replica-0": 6})  # all idle: the first
    engine = SimReplicaEngine(build, 3, "prefix_aware", clock=VirtualClock(0))
    engine.generate([[*shared, 0]], PARAMS)  # replica-0 caches the shared prefix
    engine.add_request(list(range(900, 1900)), SamplingParams(max_tokens=64, ignore_eos=True))  # keeps replica-0 busy
    for i in range(1, 4):
        engine.add_request([*shared, i], PARAMS)
    while engine.has_unfinished_requests():
        engine.step()
    where = {r.request_id: r.prefill for r in engine.done}
    assert list(where.values()).count("replica-0") == 5  # the shared prefix follows its cache, though busier


def test_one_replica_through_the_router_times_requests_as_the_engine_alone():
    prompts = [list(range(10 + i, 90 + i)) for i in range(5)]
    alone = build("e", VirtualClock(0))
    ends = {}
    for i, p in enumerate(prompts):
        alone.add_request(alone.make_request(p, PARAMS, f"r{i}"))
    while alone.has_unfinished_requests():
        for d in alone.step():
            if d.finished:
                ends[d.request_id] = alone.clock.now_ns()
    engine = SimReplicaEngine(build, 1, "round_robin", clock=VirtualClock(0))
    for i, p in enumerate(prompts):
        engine.add_request(engine.make_request(p, PARAMS, f"r{i}"))
    while engine.has_unfinished_requests():
        engine.step()
    assert {r.request_id: r.finished_ns for r in engine.done} == ends
