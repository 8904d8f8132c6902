"""The run options of a sweep: those of ``kvscope.options.run``, where every option that takes one value
(workload, sampling, engine; not a switch, not an output) also takes a comma-separated list, read
item by item with the option's own parser and choices. Standard library only, like ``run.py``,
so ``kvscope --help`` and ``%kvscope sweep?`` load no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from kvscope.options.run import ENGINE, OUTPUTS, RUN_OPTIONS, SAMPLING, WORKLOAD, OptionError, OptionSpec
from kvscope.options.values import positive_int

SWEPT_GROUPS = (WORKLOAD, SAMPLING, ENGINE)


class Values(list):
    """The values of a listed option, with the text each was given as (for labels)."""

    __slots__ = ("texts",)
    texts: list[str]


def sweepable(spec: OptionSpec) -> bool:
    """An option that takes one value (not a flag, not an output path)."""
    return spec.group in SWEPT_GROUPS and spec.action is None


def dest_of(spec: OptionSpec) -> str:
    return spec.dest or spec.name.lstrip("-").replace("-", "_")


def listed(spec: OptionSpec) -> Callable[[str], Values]:
    """An argparse ``type`` reading "A,B,C" with the option's own parser and choices."""

    def parse(text: str) -> Values:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise OptionError(f"{spec.name} {text!r}: an empty value in the list; write it like 8,16,32")
        if spec.choices is not None:
            wrong = [p for p in parts if p not in spec.choices]
            if wrong:
                raise OptionError(f"{spec.name}: {wrong[0]!r} is not one of {', '.join(spec.choices)}")
        values = Values(spec.type(p) if spec.type is not None else p for p in parts)
        values.texts = parts
        return values

    return parse


def add_sweep_options(parser: argparse.ArgumentParser, face: str) -> None:
    """The run options of ``face`` but the outputs (each face adds its own), single values also as lists
    (the command's description says so once, rather than every option's help)."""
    groups: dict[str, Any] = {}
    for spec in RUN_OPTIONS:
        if face not in spec.faces or spec.group == OUTPUTS:
            continue
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(spec.group)
        if sweepable(spec):
            metavar = spec.metavar or ("{" + ",".join(spec.choices) + "}" if spec.choices else None)
            spec = dataclasses.replace(spec, type=listed(spec), choices=None, metavar=metavar)
        spec.add_to(groups[spec.group])
    sweep = parser.add_argument_group("sweep")
    sweep.add_argument("--repeat", type=positive_int, default=1, metavar="N", help="run each value N times: the "
                       "table shows their median and min-max, and a difference within that range is marked ≈, "
                       "neither a win nor a loss (default 1)")
    sweep.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up run the sweep starts "
                       "with (it takes the start-up costs, so the first value does not pay them)")
