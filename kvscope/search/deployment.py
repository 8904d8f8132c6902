"""One configuration of a search made concrete: ``deploy(problem, point)`` -> a ``Deployment`` that builds its
simulated engines at any arrival rate, and says how many GPUs it takes and what they cost.

The engine options of the point replace the problem's (``kvscope simulate``'s own checks, through
``prepare_simulation``); then the deployment's shape:

- ``replicas=N``: N copies behind the router (``kvscope.pd.replicas``); ``pd=<n>P<m>D``: a P/D engine
  (``kvscope.pd.sim_engine``); both together: N copies of the layout, as one ``(N n)P(N m)D`` engine;
- ``tp=N``: the roofline's tensor parallelism (``kvscope.sim.roofline``); an instance's KV budget is then N GPUs'
  memory less the weights and N activation reserves. It needs a roofline (``--gpu`` or ``gpu=``): a step model
  fitted on one GPU says nothing of N;
- GPUs: ``instances x tp``; their cost: ``--gpu-cost`` or the GPU table's price per hour.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from kvscope.engine.config import EngineConfig
from kvscope.engine.engine import Engine
from kvscope.engine.protocols import EngineClient
from kvscope.options.parser import OptionError
from kvscope.pd.config import PDLayout
from kvscope.pd.replicas import SimReplicaEngine
from kvscope.pd.sim_engine import SimLink, SimPDEngine
from kvscope.planning.gpus import USD_PER_HOUR, find_gpu
from kvscope.planning.shapes import known_shape, shape_from_config
from kvscope.runs.setup.simulated import SimSetup, prepare_simulation
from kvscope.runs.workload.items import WorkItem
from kvscope.search.problem import SearchProblem
from kvscope.search.space import Point
from kvscope.sim.build import simulated_engine
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import SimShape
from kvscope.sim.step_model import StepTimeModel
from kvscope.utils.clock import VirtualClock

ENGINE_KEYS = {"block_size": "block_size", "max_num_seqs": "max_num_seqs", "kv_memory": "kv_memory",
               "max_num_batched_tokens": "max_num_batched_tokens", "num_blocks": "num_blocks",
               "prefix_caching": "prefix_caching", "pd": "pd"}


@dataclass(slots=True)
class Deployment:
    """A configuration ready to simulate."""

    shape: SimShape
    config: EngineConfig
    step_model: StepTimeModel
    kv_budget: int | None
    pd: PDLayout | None
    link: SimLink | None
    replicas: int
    router: str
    tp: int
    gpu: str | None
    usd_per_gpu_hour: float | None
    items: list[WorkItem]  # the workload without arrival times (re-timed per rate)
    arrival: str = "poisson"
    seed: int = 0

    @property
    def num_instances(self) -> int:
        return self.replicas * (self.pd.num_prefill + self.pd.num_decode if self.pd else 1)

    @property
    def num_gpus(self) -> int:
        return self.num_instances * self.tp

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour * self.num_gpus

    def _engine(self, name: str, clock: VirtualClock) -> Engine:
        return simulated_engine(self.shape, self.config, self.step_model, kv_budget=self.kv_budget, clock=clock)

    def engine(self, clock: VirtualClock, arrivals_s: Iterable[float]) -> EngineClient:
        """The deployment's engine on ``clock``: one simulated engine, or a router over several."""
        if self.pd is not None:
            layout = PDLayout(self.pd.num_prefill * self.replicas, self.pd.num_decode * self.replicas)
            return SimPDEngine(self._engine, layout, self.link, clock=clock, arrivals_s=arrivals_s)
        if self.replicas > 1:
            return SimReplicaEngine(self._engine, self.replicas, self.router, clock=clock, arrivals_s=arrivals_s)
        return self._engine("engine", clock)


def deploy(problem: SearchProblem, point: Point, items: list[WorkItem] | None = None) -> Deployment:
    """The deployment of ``point``; ``OptionError`` for a configuration that cannot run (named). ``items``: the
    workload if already made (every configuration of a problem submits the same requests)."""
    spec, sim = problem.spec, problem.sim
    for key, field in ENGINE_KEYS.items():
        if key in point.keys:
            spec = spec.with_option(field, point.get(key))  # type: ignore[attr-defined]
    if "gpu" in point.keys:
        if getattr(sim, "step_model", None):
            raise OptionError("gpu= in the space times steps by a roofline: leave out --step-model")
        sim = replace(sim, gpu=point.get("gpu"))  # type: ignore[type-var]
    tp = point.get("tp", 1)
    if tp > 1:  # the instance's KV budget: tp GPUs' memory less the weights (prepare_simulation's rule)
        sim = replace(sim, tp=tp)  # type: ignore[type-var]
    setup: SimSetup = prepare_simulation(spec, sim)  # type: ignore[arg-type]
    config = replace(setup.config, telemetry=False)  # a trial reads its requests' times, not the records
    if "chunked_prefill" in point.keys:
        config = replace(config, enable_chunked_prefill=point.get("chunked_prefill"))
    step_model, kv_budget = setup.step_model, setup.kv_budget
    gpu = getattr(sim, "gpu", None)
    if isinstance(step_model, RooflineModel):
        step_model = _with_shape(step_model, setup.shape.name, tp)
    elif tp > 1:
        raise OptionError("tp= needs a roofline step model (--gpu NAME or gpu= in the space): a step model fitted "
                          "on one device says nothing of tensor parallelism")
    cost = problem.gpu_cost if problem.gpu_cost is not None else USD_PER_HOUR.get(find_gpu(gpu).name) if gpu else None
    w = spec.workload  # type: ignore[attr-defined]
    if items is None:
        items = base_items(setup)
    pd = PDLayout.parse(setup.spec.engine.pd) if setup.spec.engine.pd else None
    return Deployment(setup.shape, config, step_model, kv_budget, pd, setup.link, point.get("replicas", 1),
                      point.get("router", problem.router), tp, find_gpu(gpu).name if gpu else None, cost, items,
                      w.arrival, spec.sampling.seed)  # type: ignore[attr-defined]


def _with_shape(model: RooflineModel, name: str, tp: int) -> RooflineModel:
    """The roofline at ``tp``, with the known shape's mixture of experts (active vs total parameters)."""
    known = known_shape(name)
    if known is None and os.path.isdir(name):
        known = shape_from_config(name)
    moe: dict[str, Any] = {}
    if known is not None and known.num_experts and 0 < known.expert_params < model.num_params:
        moe = {"num_experts": known.num_experts, "experts_per_token": known.experts_per_token,
               "expert_params": known.expert_params}
    return replace(model, tp=tp, interconnect_bytes_s=0.0, **moe) if tp > 1 or moe else model


def base_items(setup: SimSetup) -> list[WorkItem]:
    """The problem's requests, token ids, without arrival times."""
    work = setup.workload
    if callable(work):  # synthetic: made as kvscope simulate makes them (the same ids), against the shape
        items = list(work(_ShapeView(setup.shape)))
    else:
        items = list(work)
    out = []
    for item in items:
        prompt = item.prompt
        if isinstance(prompt, str):  # a prompts file: tokenized once here, not at every rate
            if setup.shape.tokenizer is None:
                raise OptionError(f"{setup.shape.name} has no tokenizer for text prompts: give --model a folder "
                                  "with one (or smollm2), or search synthetic requests (--requests N)")
            prompt = list(item.prompt_for(setup.shape.tokenizer)) if item.chat else \
                setup.shape.tokenizer.encode(prompt)
        out.append(WorkItem(prompt, item.params, item.source))
    return out


@dataclass(slots=True)
class _ShapeView:
    """What a synthetic workload reads of an engine (its vocabulary and special ids), from the shape alone."""

    shape: SimShape

    @property
    def spec(self) -> Any:
        return self.shape.spec

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.shape.eos_token_ids

    @property
    def tokenizer(self) -> Any:
        return self.shape.tokenizer
