"""A sweep's plan: one checked run per value of the one listed option (``plan_from_args``), nothing started;
``kvscope.runs.background.sweep.Sweep`` runs it. Every check that can fail runs here, before the first run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.options.run import CLI, RUN_OPTIONS, OptionError, OptionParser
from kvscope.options.sweep import Values, add_sweep_options, dest_of, sweepable
from kvscope.runs.result.comparison import unique_labels
from kvscope.runs.setup.spec import RunSpec

if TYPE_CHECKING:
    from kvscope.runs.setup.prepare import RunSetup


@dataclass(slots=True)
class SweepPlan:
    """Checked runs, one per value of ``option``; nothing started."""

    option: str  # the flag, e.g. "--block-size"
    dest: str  # its namespace name, e.g. "block_size"
    values: list[Any]
    labels: list[str]  # "block-size=8", ...
    setups: list[RunSetup]  # each with its RunSpec: the base spec with this value
    repeat: int = 1  # runs per value: the summary is their median, the comparison shows their range
    warmup: bool = True  # one unmeasured run first (the first value's), so no value pays the start-up


def plan_from_args(args: argparse.Namespace, cell: str | None = None) -> SweepPlan:
    """The one listed option of ``args`` (parsed by ``add_sweep_options``) and a checked run per value
    (``cell``: a ``%%kvscope sweep`` cell's text, whose lines are the prompts).

    ``OptionError`` if no option or more than one has several values, or if any run would be refused.
    """
    lists = listed_options(args)
    if not lists:
        raise OptionError("give one option a list of values to sweep, like --block-size 8,16,32,64")
    if len(lists) > 1:
        raise OptionError(f"sweep one option at a time, not {' and '.join(flag for flag, _ in lists.values())}")
    (dest, (flag, values)), = lists.items()
    base = RunSpec.from_args(args, cell=cell)
    if getattr(args, "simulate", False):  # each run simulated (kvscope simulate), with the same step model
        from kvscope.options.simulate import simulate_fields
        from kvscope.runs.setup.simulated import SimSpec, prepare_simulation

        sim = SimSpec(**simulate_fields(args))
        plan = plan_runs(base, dest, flag, values, lambda spec: prepare_simulation(spec, sim))
        plan.warmup = False  # a virtual clock has no start-up to pay
    else:
        plan = plan_runs(base, dest, flag, values)  # dest: replaced per value
        plan.warmup = not getattr(args, "no_warmup", False)
    plan.repeat = getattr(args, "repeat", 1) or 1
    return plan


def listed_options(args: argparse.Namespace) -> dict[str, tuple[str, Values]]:
    """The options of ``args`` given two or more values: dest -> (flag, values). A list of one value is
    the value: ``args`` holds it in place of the list."""
    lists = {}
    for spec in filter(sweepable, RUN_OPTIONS):
        dest = dest_of(spec)
        value = getattr(args, dest, None)
        if isinstance(value, Values):
            if len(value) == 1:
                setattr(args, dest, value[0])
            else:
                lists[dest] = (spec.name, value)
    return lists


def plan_runs(base: RunSpec, dest: str, flag: str, values: Values,
              prepare: Callable[[RunSpec], RunSetup] | None = None) -> SweepPlan:
    """A checked run per value: ``base`` with the option ``dest`` (given as ``flag``) set to it, made by
    ``prepare`` (default ``kvscope.runs.setup.prepare.prepare``; a simulation's ``prepare_simulation``).
    ``OptionError`` naming the value if any run would be refused."""
    if prepare is None:
        from kvscope.runs.setup.prepare import prepare as prepare_run  # here: it brings torch

        prepare = prepare_run

    setups = []
    for value, text in zip(values, values.texts):
        try:
            setups.append(prepare(base.with_option(dest, value)))
        except OptionError as exc:
            raise OptionError(f"{flag} {text}: {exc}") from None
    labels = unique_labels([f"{flag.lstrip('-')}={t}" for t in values.texts])
    return SweepPlan(flag, dest, list(values), labels, setups)


def default_args() -> argparse.Namespace:
    """The run options' defaults, as ``kvscope run`` with no options would have them."""
    parser = OptionParser(add_help=False)
    add_sweep_options(parser, CLI)
    return parser.parse_args([])
