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
from kvscope.planning.planner import DEFAULT_RESERVE, default_max_len, weights_bytes
from kvscope.runs.result.lineage import run_identity
from kvscope.runs.setup.prepare import (
    LAZY_ABOVE,
    RunSetup,
    check_run_outputs,
    engine_config,
    sampling_params,
    workload,
)
from kvscope.runs.setup.replay import check_replay_header, replay_settings
from kvscope.runs.setup.spec import RunSpec
from kvscope.runs.setup.watched_replay import for_replay
from kvscope.runs.workload.items import WorkItem, iter_arrival_times, parse_arrival, with_arrivals
from kvscope.runs.workload.recorded import replay_workload
from kvscope.sim.admission import measure as measure_admission
from kvscope.sim.build import VLLM_CPU_DEFAULTS, WINDOW_STEPS, pool_blocks, simulated_engine, with_engine_rules
from kvscope.sim.calibrate import fit_step_model
from kvscope.sim.roofline import RooflineModel
from kvscope.sim.shape import SimShape, resolve_shape, shape_of_run
from kvscope.sim.step_model import LinearStepModel, StepTimeModel, load_step_model
from kvscope.utils.clock import VirtualClock

if TYPE_CHECKING:
    from kvscope.runs.result.run import Run

ACTIVATION_RESERVE = DEFAULT_RESERVE  # the course's 40 GB - 14 - 4: what a GPU plan keeps (kvscope.planning.planner)


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
    engine: str = "kvscope"  # whose scheduling rules (kvscope.engine.core.rules): "kvscope" or "vllm"
    tp: int = 1  # with gpu: the GPUs one instance spans (tensor parallelism: their memory less the weights is KV)


@dataclass(slots=True, kw_only=True)
class SimSetup(RunSetup):
    """A ``RunSetup`` whose engine is simulated (``make_engine`` builds no model)."""

    shape: SimShape
    step_model: StepTimeModel
    kv_budget: int | None = None
    sim_meta: dict[str, Any] | None = None
    acceptance_rate: float | None = None
    link: SimLink | None = None  # --pd: the transfer between instances
    admission_s: float = 0.0  # each request is submitted this long after it arrives (kvscope.sim.admission)
    window_steps: int = WINDOW_STEPS  # the steps whose records are kept (all of them: a replay to align with)

    def run_options(self) -> dict[str, Any]:
        """``RunSetup.run_options``; past ``LAZY_ABOVE`` requests (synthetic, or a replay's) finished ones are let
        go (bounded memory)."""
        count = len(self.workload) if isinstance(self.workload, list) else self.spec.workload.requests
        many = (count or 0) > LAZY_ABOVE
        return {**RunSetup.run_options(self), "keep_outputs": not many, "total_requests": self.spec.workload.requests,
                "admission_s": self.admission_s}

    def make_engine(self) -> EngineClient:
        if self.spec.engine.pd is not None:  # instances on one virtual clock (kvscope.pd.sim_engine)
            return SimPDEngine(self._instance, self.spec.engine.pd, self.link, arrivals_s=self._arrivals())
        return simulated_engine(self.shape, self.config, self.step_model, kv_budget=self.kv_budget,
                                meta=self.sim_meta, acceptance_rate=self.acceptance_rate,
                                window_steps=self.window_steps)

    def _arrivals(self) -> Iterable[float]:
        """When ``LiveRun`` will submit the workload's items (seconds from the start): arrival + admission."""
        late = self.admission_s
        if isinstance(self.workload, list):
            return sorted(item.arrival_s + late for item in self.workload)
        w = self.spec.workload  # synthetic requests, made when the engine exists: the same times as theirs
        times = iter_arrival_times(w.rate, parse_arrival(w.arrival), self.spec.sampling.seed) if w.rate else ()
        return (t + late for t in times) if late else times

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
    replay = None
    try:
        recorded = _load_replay(sim.replay) if sim.replay else None
        recorded = for_replay(recorded, spec.model, sim.dtype, str(sim.replay)) if recorded is not None else None
        if recorded is not None:  # the run's header, then its settings with the options given over them
            check_replay_header(recorded.meta, str(sim.replay))
            replay = replay_settings(recorded.meta, str(sim.replay), spec.engine, gpu=sim.gpu)
        default_dtype = torch.bfloat16 if sim.gpu else torch.float32
        shape = shape_of_run(recorded.meta) if recorded is not None and spec.model == "tiny" else \
            resolve_shape(spec.model, sim.dtype, default_dtype=default_dtype)
        step_model, how = _step_model(sim, shape, recorded)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    config = replay.config if replay is not None else engine_config(spec.engine)
    config = _engine_rules(config, sim.engine, spec, replay=replay is not None)
    kv_budget = None
    if sim.gpu:  # the GPU's memory - the weights - the reserve, counted as kvscope plan counts them
        counted = weights_bytes(shape.name, shape.spec.num_params, shape.spec.dtype_bytes)
        weights = counted[0] if counted is not None else 0
        kv_budget = sim.tp * (find_gpu(sim.gpu).memory_bytes - ACTIVATION_RESERVE) - weights
        if kv_budget <= 0:
            on = sim.gpu if sim.tp == 1 else f"{sim.tp} x {sim.gpu}"
            raise OptionError(f"{shape.name} does not fit on {on}: its weights and the activation reserve "
                              "leave no KV memory")
    notes: list[str] = []
    if sim.static:
        config = _static(config, shape, kv_budget)
        notes.append(f"kvscope: static reservation: {config.max_model_len} token slots per request (--max-model-len "
                     f"to change), so at most {config.max_num_seqs} requests run at once, as `kvscope plan` counts")
        if replay is not None:
            replay.reasons.update(max_num_seqs="--static: as many as max_model_len slots fit",
                                  num_blocks="--static: the slots of those requests")
    try:  # the pool's size checked before anything runs (bounded: kvscope.sim.build.MAX_SIM_BLOCKS)
        pool_blocks(config, shape, kv_budget)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    params = sampling_params(spec.sampling)
    items = _replayed(recorded, spec) if recorded is not None else workload(spec, params)
    admission = step_model.admission_s if isinstance(step_model, LinearStepModel) else 0.0
    meta: dict[str, Any] = {"step_model_from": how, "replay_of": sim.replay, "static_reservation": sim.static,
                            "gpu": sim.gpu, "admission_s": admission}
    if recorded is not None and replay is not None:
        try:
            replay.finish(config, pool_blocks(config, shape, kv_budget))
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        meta["replay"] = {"run": run_identity(recorded.meta, recorded.events, str(sim.replay)), **replay.to_json()}
        notes = replay.notes() + list(recorded.meta.get("replay_notes", [])) + notes
    return SimSetup(shape.name, config, params, items, spec, notes, shape=shape, step_model=step_model,
                    kv_budget=kv_budget, sim_meta=meta, acceptance_rate=sim.acceptance_rate, link=link,
                    admission_s=admission)


def _engine_rules(config: EngineConfig, engine: str, spec: RunSpec, replay: bool) -> EngineConfig:
    """``--engine``: the config under that engine's scheduling rules, with its defaults for the settings not given
    (a replay keeps the recorded run's; ``kvscope.sim.build.with_engine_rules``)."""
    given = set(VLLM_CPU_DEFAULTS) if replay else {k for k in VLLM_CPU_DEFAULTS if getattr(spec.engine, k) is not None}
    try:
        return with_engine_rules(config, engine, given)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


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
    try:
        items = replay_workload(recorded)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
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
        fitted = fit_step_model(recorded.records, int(recorded.meta["block_size"]), str(sim.replay))
        delay = measure_admission(recorded.requests)
        fitted.admission_s = delay.seconds if delay is not None else 0.0
        return fitted, "fitted on the replayed run itself"
    raise ValueError("a simulation needs a step-time model: --step-model FILE (from `kvscope calibrate RUN -o FILE`) "
                     "or --gpu NAME (a roofline from the GPU's data sheet)")


def _static(config: EngineConfig, shape: SimShape, kv_budget: int | None) -> EngineConfig:
    """Static reservation: each running request holds ``max_model_len`` token slots from its admission, so
    at most budget / (max_model_len x bytes per token) run at once; the paged pool is big enough for them.
    Without --max-model-len, ``max_model_len`` is ``kvscope plan``'s ``--max-len`` default (2048, or the model's
    maximum if below: ``kvscope.planning.planner.default_max_len``), so the two agree on the same inputs."""
    max_len = config.max_model_len or default_max_len(shape.spec.max_model_len)
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
    return replace(config, max_num_seqs=min(seqs, config.max_num_seqs), num_blocks=blocks, kv_cache_memory=None,
                   max_model_len=max_len)
