"""``RunSpec``: one run, typed, as a face hands it on: the model, the workload, the engine's options, sampling,
the outputs. The parsed ``argparse.Namespace`` stops at the face: ``RunSpec.from_args`` is the one place
that reads it; ``kvscope.runs.setup.prepare.prepare`` checks a spec and makes the run's pieces; a sweep is one spec
per value with one field replaced (``spec.with_option("block_size", 32)``, ``dataclasses.replace`` inside).

Standard library only, so a face builds its spec before importing torch. The fields are named as the run
options' namespace names (``block_size``, ``kv_memory``, ``prompt_len``), so an option maps to one field.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from kvscope.options.parser import OptionError

OUTPUT_KINDS = ("trace", "metrics", "html")  # the order messages list them in, on both faces


@dataclass(slots=True, frozen=True)
class WorkloadSpec:
    """What requests to submit: ``cell`` (a ``%%kvscope`` cell's lines) or ``prompts`` (a file) or
    ``requests`` synthetic ones (16 by default)."""

    requests: int | None = None
    prompts: str | None = None
    cell: str | None = None
    prompt_len: tuple[int, int] = (32, 256)
    output_len: tuple[int, int] | None = None  # None: 32-128 for synthetic requests, 64 for prompts
    shared_prefix: int = 0
    ignore_eos: bool = False
    chat_template: bool = True  # prompts are user messages for an instruct model's chat template
    rate: float | None = None  # requests per second (None: all at once)
    arrival: str = "poisson"  # or "gamma:CV"


@dataclass(slots=True, frozen=True)
class SamplingSpec:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0  # also the synthetic workload's


@dataclass(slots=True, frozen=True)
class EngineSpec:
    """The engine options a face takes (``None``: not given, the engine's default; so a replay knows which
    options the user typed: ``kvscope.runs.setup.simulated`` starts from the recorded run's settings)."""

    block_size: int | None = None
    num_blocks: int | None = None
    kv_memory: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    prefix_caching: bool | None = None
    speculative: dict[str, Any] | None = None  # the engine's speculative_config
    pd: str | None = None  # prefill/decode disaggregation ("1P1D"; kvscope.pd), None: colocated


@dataclass(slots=True, frozen=True)
class OutputSpec:
    """Files written at the end, and what messages call each (``names``, in ``OUTPUT_KINDS`` order)."""

    trace: Path | None = None
    metrics: Path | None = None
    html: Path | None = None
    names: tuple[str, str, str] = ("--trace", "--metrics", "--html")

    def labelled(self) -> dict[str, Path | None]:
        """What messages call each output -> its path (``kvscope.utils.files.check_outputs`` takes it)."""
        return {name: getattr(self, kind) for name, kind in zip(self.names, OUTPUT_KINDS)}


@dataclass(slots=True, frozen=True)
class RunSpec:
    """One run, not checked yet (``kvscope.runs.setup.prepare.prepare`` checks it)."""

    model: str = "tiny"
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    outputs: OutputSpec = field(default_factory=OutputSpec)
    profile_steps: int = 0
    step_delay: float = 0.0
    capture_slow: tuple[int, int] | None = None  # (steps per window, most windows) after each slow step

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, cell: str | None = None,
                  outputs: OutputSpec | None = None) -> RunSpec:
        """The spec of parsed run options (``cell``: a ``%%kvscope`` cell's text, whose lines are the prompts;
        ``outputs``: the files, by default ``--trace``, ``--metrics`` and ``--html`` as given). Options the
        namespace lacks keep their defaults."""
        values = {k: _typed(k, v) for k, v in vars(args).items()}
        if outputs is None:
            outputs = OutputSpec(trace=values.get("trace"), metrics=values.get("metrics"), html=values.get("html"))
        top = {k: values[k] for k in ("model", "step_delay", "capture_slow") if values.get(k) is not None}
        return cls(workload=_part(WorkloadSpec, {**values, "cell": cell}), sampling=_part(SamplingSpec, values),
                   engine=_part(EngineSpec, values), outputs=outputs,
                   profile_steps=values.get("profile") or 0, **top)

    def with_option(self, name: str, value: Any) -> RunSpec:
        """A copy with the run option ``name`` (its namespace name: ``"block_size"``) set to ``value``."""
        value = _typed(name, value)
        if name == "profile":
            return dataclasses.replace(self, profile_steps=value)
        if name in ("model", "step_delay", "capture_slow"):
            return dataclasses.replace(self, **{name: value})
        for part in ("workload", "sampling", "engine"):
            inner = getattr(self, part)
            if name in _FIELDS[type(inner)]:
                return dataclasses.replace(self, **{part: dataclasses.replace(inner, **{name: value})})
        raise KeyError(f"no run option {name!r}")

    def check(self) -> None:
        """Refuse options that each parse but do not go together (``OptionError``)."""
        w = self.workload
        sources = [name for name, given in (("cell prompts", w.cell is not None), ("--prompts", w.prompts),
                                            ("--requests", w.requests)) if given]
        if len(sources) > 1:
            raise OptionError(f"give requests one way only, not {' and '.join(sources)}")
        if self.engine.num_blocks is not None and self.engine.kv_memory is not None:
            raise OptionError("give --num-blocks or --kv-memory, not both")
        if self.engine.pd is not None:
            clash = [name for name, given in (("--speculative", self.engine.speculative is not None),
                                              ("--prefix-caching off", self.engine.prefix_caching is False),
                                              ("--profile", self.profile_steps > 0),
                                              ("--capture-slow", self.capture_slow is not None)) if given]
            if clash:
                raise OptionError(f"--pd {self.engine.pd} does not combine with {clash[0]}")
        if w.arrival != "poisson" and w.rate is None:
            raise OptionError(f"--arrival {w.arrival} needs --rate (requests per second)")


_FIELDS: dict[type, set[str]] = {cls: {f.name for f in fields(cls)}
                                 for cls in (WorkloadSpec, SamplingSpec, EngineSpec)}


_Part = TypeVar("_Part", WorkloadSpec, SamplingSpec, EngineSpec)


def _typed(name: str, value: Any) -> Any:
    """The spec's type of an option's parsed value: ``--prefix-caching on`` is ``True``."""
    if name == "prefix_caching" and isinstance(value, str):
        return value == "on"
    return value


def _part(cls: type[_Part], values: dict[str, Any]) -> _Part:
    return cls(**{name: values[name] for name in _FIELDS[cls] if values.get(name) is not None})
