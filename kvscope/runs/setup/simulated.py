"""A simulated run, set up like a real one: ``prepare_simulation(spec, sim)`` -> a ``SimSetup`` that
``kvscope simulate``, ``%kvscope simulate`` and ``kvscope sweep --simulate`` drive exactly as they drive a
``RunSetup`` (``LiveRun(setup.make_engine, setup.workload, **setup.run_options())``).

The run options are the same as ``kvscope run``'s (``RunSpec``), so the same options submit the same
requests; ``SimSpec`` adds what a simulation needs instead of a model: a step-time model (``--step-model``,
fitted by ``kvscope calibrate``, or ``--gpu`` for a roofline), and optionally ``--replay RUN``, which takes the
recorded run's requests and model shape. With ``--pd 1P1D`` the engine is a ``SimPDEngine``
(``kvscope.pd.sim_engine``): one simulated engine per instance on one virtual clock, KV transfers timed by
``--kv-bandwidth`` and ``--kv-latency``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvscope.engine.config import EngineConfig
from kvscope.engine.engine import Engine
from kvscope.engine.protocols import EngineClient
from kvscope.options.parser import OptionError
from kvscope.pd.sim_engine import SimLink, SimPDEngine
from kvscope.planning.gpus import find_gpu
from kvscope.runs.setup.prepare import (
    LAZY_ABOVE,
    RunSetup,
    check_run_outputs,
    engine_config,
    sampling_params,
    workload,
)
from kvscope.runs.setup.spec import RunSpec
from kvscope.runs.workload.items import WorkItem, iter_arrival_times, parse_arrival, with_arrivals
from kvscope.runs.workload.recorded import replay_workload
from kvscope.sim.build import simulated_engine
from kvscope.sim.calibrate import fit_step_model
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import SimShape, resolve_shape, shape_of_run
from kvscope.sim.step_model import StepTimeModel, load_step_model
from kvscope.utils.clock import VirtualClock

if TYPE_CHECKING:
    from kvscope.runs.result.run import Run

GiB = 1 << 30
ACTIVATION_RESERVE = 4 * GiB  # the course's 40 GB - 14 - 4: what a GPU plan keeps for activations


@dataclass(slots=True, frozen=True)
class SimSpec:
    step_model: str | None = None  # a file of kvscope calibrate
    gpu: str | None = None  # a roofline on this GPU's data sheet
    replay: str | None = None  # a recorded run's files
    dtype: str | None = None
    static: bool = False  # static reservation: as many requests as max_model_len slots fit, no more
    acceptance_rate: float | None = None  # speculative decoding: each draft's chance of acceptance
    kv_bandwidth: float | None = None  # --pd: GB/s between instances (default SimLink's)
    kv_latency: float | None = None  # --pd: seconds added to every transfer (default SimLink's)


@dataclass(slots=True, kw_only=True)
class SimSetup(RunSetup):
    """A ``RunSetup`` whose engine is simulated (``make_engine`` builds no model)."""

    shape: SimShape
    step_model: StepTimeModel
    kv_budget: int | None = None
    sim_meta: dict[str, Any] | None = None
    acceptance_rate: float | None = None
    link: SimLink | None = None  # --pd: the transfer between instances

    def run_options(self) -> dict[str, Any]:
        """``RunSetup.run_options``; past ``LAZY_ABOVE`` requests finished ones are let go (bounded memory)."""
        many = (self.spec.workload.requests or 0) > LAZY_ABOVE
        return {**RunSetup.run_options(self), "keep_outputs": not many, "total_requests": self.spec.workload.requests}

    def make_engine(self) -> EngineClient:
        if self.spec.engine.pd is not None:  # instances on one virtual clock (kvscope.pd.sim_engine)
            return SimPDEngine(self._instance, self.spec.engine.pd, self.link, arrivals_s=self._arrivals())
        return simulated_engine(self.shape, self.config, self.step_model, kv_budget=self.kv_budget,
                                meta=self.sim_meta, acceptance_rate=self.acceptance_rate)

    def _arrivals(self) -> Iterable[float]:
        """The workload's arrival times (seconds from the start), as ``LiveRun`` will submit them."""
        if isinstance(self.workload, list):
            return sorted(item.arrival_s for item in self.workload)
        w = self.spec.workload  # synthetic requests, made when the engine exists: the same times as theirs
        return iter_arrival_times(w.rate, parse_arrival(w.arrival), self.spec.sampling.seed) if w.rate else ()

    def _instance(self, name: str, clock: VirtualClock) -> Engine:
        """One instance of a simulated P/D engine: its own pool (a GPU's budget each) on the shared clock."""
        meta = {**(self.sim_meta or {}), "pd": {"layout": self.spec.engine.pd, "instance": name,
                                                  **(self.link or SimLink()).to_json()}}
        return simulated_engine(self.shape, self.config, self.step_model, kv_budget=self.kv_budget, meta=meta,
                                clock=clock)


def prepare_simulation(spec: RunSpec, sim: SimSpec) -> SimSetup:
    """Every check before the simulation starts (``OptionError`` naming the problem), then its pieces."""
    spec.check()
    check_run_outputs(spec)
    if spec.profile_steps or spec.capture_slow:
        flag = "--profile" if spec.profile_steps else "--capture-slow"
        raise OptionError(f"a simulation has no kernels to profile: leave {flag} out")
    if bool(spec.engine.speculative) != (sim.acceptance_rate is not None):
        raise OptionError("simulating speculative decoding takes --speculative (how many drafts) and "
                          "--acceptance-rate P (each draft accepted with probability P) together")
    link = _link(spec, sim)
    try:
        recorded = _load_replay(sim.replay) if sim.replay else None
        default_dtype = torch.bfloat16 if sim.gpu else torch.float32
        shape = shape_of_run(recorded.meta) if recorded is not None and spec.model == "tiny" else \
            resolve_shape(spec.model, sim.dtype, default_dtype=default_dtype)
        step_model, how = _step_model(sim, shape, recorded)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    config = engine_config(spec.engine)
    kv_budget = None
    if sim.gpu:
        kv_budget = find_gpu(sim.gpu).memory_bytes - shape.spec.num_params * shape.spec.dtype_bytes \
            - ACTIVATION_RESERVE
        if kv_budget <= 0:
            raise OptionError(f"{shape.name} does not fit on {sim.gpu}: its weights and the activation reserve "
                              "leave no KV memory")
    if sim.static:
        config = _static(config, shape, kv_budget)
    params = sampling_params(spec.sampling)
    items = _replayed(recorded, spec) if recorded is not None else workload(spec, params)
    meta = {"step_model_from": how, "replay_of": sim.replay, "static_reservation": sim.static, "gpu": sim.gpu}
    return SimSetup(shape.name, config, params, items, spec, shape=shape, step_model=step_model, kv_budget=kv_budget,
                    sim_meta=meta, acceptance_rate=sim.acceptance_rate, link=link)


def _link(spec: RunSpec, sim: SimSpec) -> SimLink | None:
    """The simulated KV transfer of ``--pd``; its options without ``--pd`` are refused."""
    given = {"--kv-bandwidth": sim.kv_bandwidth, "--kv-latency": sim.kv_latency}
    if spec.engine.pd is None:
        flags = [flag for flag, value in given.items() if value is not None]
        if flags:
            raise OptionError(f"{flags[0]} is the KV transfer between P/D instances: add --pd 1P1D (or another "
                              "layout), or leave it out")
        return None
    default = SimLink()
    return SimLink(default.bandwidth_gb_per_s if sim.kv_bandwidth is None else sim.kv_bandwidth,
                   default.latency_s if sim.kv_latency is None else sim.kv_latency)


def _replayed(recorded: Run, spec: RunSpec) -> list[WorkItem]:
    """The recorded run's requests; with ``--rate``, re-timed at that rate (the same requests, more or less
    traffic). Other workload options would be ignored, so they are refused."""
    w = spec.workload
    given = [flag for flag, value in (("--requests", w.requests), ("--prompts", w.prompts), ("cell prompts", w.cell),
                                      ("--output-len", w.output_len), ("--shared-prefix", w.shared_prefix))
             if value]
    if given:
        raise OptionError(f"--replay submits the recorded run's requests; leave out {', '.join(given)} "
                          "(--rate re-times them)")
    items = replay_workload(recorded)
    return with_arrivals(items, w.rate, w.arrival, spec.sampling.seed) if w.rate is not None else items


def _load_replay(path: str) -> Run:
    from kvscope.runs.result.run import load

    try:
        return load(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot replay {path!r}: {exc}") from None


def _step_model(sim: SimSpec, shape: SimShape, recorded: Run | None) -> tuple[StepTimeModel, str]:
    """The step-time model and where it came from."""
    if sim.step_model and sim.gpu:
        raise ValueError("give --step-model or --gpu, not both")
    if sim.step_model:
        return load_step_model(sim.step_model), f"fitted: {Path(sim.step_model).name}"
    if sim.gpu:
        s = shape.spec
        model = RooflineModel(find_gpu(sim.gpu), s.num_params, s.dtype_bytes, s.num_layers, s.num_heads, s.head_dim,
                              s.kv_bytes_per_token)
        return model, f"roofline: {model.gpu.name}"
    if recorded is not None:  # calibrated on the run it replays
        return fit_step_model(recorded.records, int(recorded.meta["block_size"]), str(sim.replay)), \
            "fitted on the replayed run itself"
    raise ValueError("a simulation needs a step-time model: --step-model FILE (from `kvscope calibrate RUN -o FILE`) "
                     "or --gpu NAME (a roofline from the GPU's data sheet)")


def _static(config: EngineConfig, shape: SimShape, kv_budget: int | None) -> EngineConfig:
    """Static reservation: each running request holds ``max_model_len`` token slots from its admission, so
    at most budget / (max_model_len x bytes per token) run at once; the paged pool is big enough for them."""
    max_len = config.max_model_len or shape.spec.max_model_len
    per_request = max_len * shape.spec.kv_bytes_per_token
    budget = config.kv_cache_memory or kv_budget
    if config.num_blocks is not None:
        budget = config.num_blocks * shape.spec.kv_bytes_per_block(config.block_size)
    if budget is None:
        raise OptionError("--static needs a KV budget: --gpu, --kv-memory or --num-blocks")
    seqs = budget // per_request
    if seqs < 1:
        raise OptionError(f"static reservation of {max_len} tokens per request does not fit even one request")
    blocks = seqs * math.ceil(max_len / config.block_size)
    return replace(config, max_num_seqs=min(seqs, config.max_num_seqs), num_blocks=blocks, kv_cache_memory=None)
