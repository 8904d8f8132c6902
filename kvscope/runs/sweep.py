"""Sweeps: the same seeded workload once per value of one run option, compared.

```python
cmp = kvscope.runs.sweep.sweep("block_size", [8, 16, 32, 64], requests=16, num_blocks=64)  # blocks until done
cmp.table; cmp.per_run; cmp.save_csv("sweep.csv"); cmp.save_html("sweep.html")
```

``kvscope sweep --block-size 8,16,32,64 [run options] -o sweep.html`` and ``%kvscope sweep ...`` parse
the run options of ``kvscope.options.run`` with one change (``kvscope.options.sweep``): every option that
takes one value (workload, sampling, engine) also takes a comma-separated list, and exactly one of them
must get two or more values. Each value is one ``RunSpec`` (the others' spec with that one field replaced),
checked by ``kvscope.runs.setup.prepare`` before the first run starts, so a bad value fails at once. The runs share everything else, so the synthetic
workload (seeded, drawn from the model's vocabulary) is the same prompts and the same per-request seeds
in every run.

``Sweep`` is a ``Comparison`` that fills in: the runs go one after another on a background thread, and
each finished run joins ``runs`` / ``labels`` / ``summaries`` (appended in that order, read by zipping
them, so a reader never sees half a run). A run that fails is kept in ``errors`` and the sweep goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.options.run import CLI, RUN_OPTIONS, OptionError, OptionParser, OptionSpec
from kvscope.options.sweep import SWEPT_GROUPS, Values, add_sweep_options, dest_of, sweepable
from kvscope.runs.comparison import Comparison, unique_labels
from kvscope.runs.lifecycle import Lifecycle
from kvscope.runs.spec import RunSpec
from kvscope.runs.status import RunStatus, SweepOutputs

if TYPE_CHECKING:
    from kvscope.runs.live import LiveRun
    from kvscope.runs.setup import RunSetup


@dataclass(slots=True)
class SweepPlan:
    """Checked runs, one per value of ``option``; nothing started."""

    option: str  # the flag, e.g. "--block-size"
    dest: str  # its namespace name, e.g. "block_size"
    values: list[Any]
    labels: list[str]  # "block-size=8", ...
    setups: list[RunSetup]  # each with its RunSpec: the base spec with this value


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
    return plan_runs(RunSpec.from_args(args, cell=cell), dest, flag, values)  # dest: replaced per value


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


def plan_runs(base: RunSpec, dest: str, flag: str, values: Values) -> SweepPlan:
    """A checked run per value: ``base`` with the option ``dest`` (given as ``flag``) set to it.
    ``OptionError`` naming the value if any run would be refused."""
    from kvscope.runs.setup import prepare  # here: it brings torch

    setups = []
    for value, text in zip(values, values.texts):
        try:
            setups.append(prepare(base.with_option(dest, value)))
        except OptionError as exc:
            raise OptionError(f"{flag} {text}: {exc}") from None
    labels = unique_labels([f"{flag.lstrip('-')}={t}" for t in values.texts])
    return SweepPlan(flag, dest, list(values), labels, setups)


class Sweep(Lifecycle, Comparison):
    """A sweep in progress, and the comparison of the runs finished so far (see the module docstring).

    Both bases, each for its own half: ``Lifecycle`` (first, so its control, ``wait`` and ``repr`` win)
    holds no comparison state, and ``Comparison`` is what faces and widgets read (``table``, ``per_run``,
    ``warnings``, ``save_html``) while the runs arrive; a sweep goes wherever a ``Comparison`` goes."""

    noun = "sweep"
    show = Comparison.show  # the comparison's figures (displaying the sweep itself shows it filling in)

    def __init__(self, plan: SweepPlan, *, dashboard: bool = False, dashboard_options: dict | None = None,
                 html: str | os.PathLike | None = None, csv: str | os.PathLike | None = None) -> None:
        # not Comparison.__init__: the runs arrive one by one
        Lifecycle.__init__(self, SweepOutputs(html=Path(html) if html is not None else None,
                                              csv=Path(csv) if csv is not None else None))
        self.plan = plan
        self.runs, self.labels, self.summaries = [], [], []
        self.swept = (plan.dest, [])  # the values of the finished runs
        self.workloads: list[list] = []  # the work items of each finished run (WorkItem lists)
        self.errors: dict[str, BaseException] = {}  # label -> why that run failed
        self.current: LiveRun | None = None
        self.index = -1  # the run going now (0-based)
        self.run_dashboards = dashboard  # each run shows its own dashboard (the sweep's view swaps them in)
        self.dashboard_options = dashboard_options
        self.listeners: list[Callable[[Sweep], None]] = []  # called on the sweep's thread as runs start and end
        self._view = None

    @property
    def written(self) -> dict[str, Path]:
        """The files written at the end: kind ("html", "csv") -> path."""
        return self.files.written

    @property
    def file_errors(self) -> dict[str, str]:
        """Kind -> why that file could not be written."""
        return self.files.errors

    # ---- the sweep's thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            super()._main()
        finally:
            self._changed()

    def _body(self) -> None:
        from kvscope.runs.live import LiveRun

        plan = self.plan
        self.status = RunStatus.RUNNING
        for i, (value, label, setup) in enumerate(zip(plan.values, plan.labels, plan.setups)):
            self._running.wait()  # paused between two runs
            if self._stop.is_set():
                break
            run = LiveRun(setup.make_engine, setup.workload, **setup.run_options(),  # its spec: files, pace
                          dashboard=self.run_dashboards, dashboard_options=self.dashboard_options)
            self.index, self.current = i, run
            self._changed()
            if self.paused:
                run.pause()
            try:
                run.start().wait()
            except Exception as exc:  # this value failed (a pool too small, ...); the sweep goes on
                self.errors[label] = exc
            finished = run.run
            if finished.records and label not in self.errors:
                self.summaries.append(finished.summary())
                self.runs.append(finished)
                self.swept[1].append(value)
                self.workloads.append(list(run.workload))
                self.labels.append(label)
            self._changed()

    def _wind_down(self) -> None:
        if self.runs:
            self._write_files()

    def _file_writers(self) -> dict[str, Callable[[Path], Path]]:
        return {"html": self.save_html, "csv": self.save_csv}

    def _changed(self) -> None:
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):  # a display problem never stops the sweep
                listener(self)

    # ---- control (the rest: ``Lifecycle``) ---------------------------------------------------------------
    def stop(self) -> None:
        """Stop the run going now (its numbers so far are kept) and start no more."""
        super().stop()
        if self.current is not None:
            self.current.stop()

    def pause(self) -> None:
        """Pause the run going now, and start no other until ``resume()``."""
        super().pause()
        if self.current is not None:
            self.current.pause()

    def resume(self) -> None:
        super().resume()
        if self.current is not None:
            self.current.resume()

    def _progress(self) -> str:
        return f"run {self.index + 1}"

    @property
    def status_text(self) -> str:
        n = len(self.plan.values)
        if self.done:
            failed = f", {len(self.errors)} failed" if self.errors else ""
            return f"sweep of {self.plan.option}: {len(self.runs)} of {n} runs done{failed}"
        run = self.current
        if run is None or self.index < 0:
            return f"sweep of {self.plan.option}: starting ({n} runs)"
        return f"sweep of {self.plan.option}: run {self.index + 1} of {n}, {self.plan.labels[self.index]} ({run.status_text})"

    @property
    def warnings(self) -> list[str]:
        failed = [f"{label} failed: {type(exc).__name__}: {exc}" for label, exc in self.errors.items()]
        return (super().warnings if self.runs else []) + failed

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        """In a notebook: the status, the table filling in, the current run's dashboard."""
        from kvscope.widgets.sweep_view import SweepView

        if self._view is None:
            self._view = SweepView(self)
        return self._view.box._repr_mimebundle_(include=include, exclude=exclude)


def default_args() -> argparse.Namespace:
    """The run options' defaults, as ``kvscope run`` with no options would have them."""
    parser = OptionParser(add_help=False)
    add_sweep_options(parser, CLI)
    return parser.parse_args([])


def sweep(option: str, values: Sequence[Any], *, dashboard: bool = False, **options: Any) -> Sweep:
    """Run one seeded workload once per value of ``option`` and wait; returns the finished ``Sweep``.

    ``option`` and the keys of ``options`` are run options by their Python names (``block_size``,
    ``num_blocks``, ``requests``, ``prompt_len``, ``prefix_caching``, ...) or flags (``"--block-size"``);
    a string value is read by the option's own parser (``kv_memory="64MiB"``, ``prompt_len="16-64"``).
    """
    specs = {dest_of(s): s for s in RUN_OPTIONS if s.group in SWEPT_GROUPS}

    def spec_of(name: str) -> OptionSpec:
        key = name.lstrip("-").replace("-", "_")
        if key not in specs:
            raise OptionError(f"unknown run option {name!r}; one of {', '.join(sorted(specs))}")
        return specs[key]

    def read(spec: OptionSpec, value: Any) -> Any:
        return spec.type(value) if isinstance(value, str) and spec.type is not None else value

    args = default_args()
    listed_options(args)  # the defaults, as single values
    base = RunSpec.from_args(args)
    for name, value in options.items():
        given = spec_of(name)
        base = base.with_option(dest_of(given), read(given, value))
    swept = spec_of(option)
    if not sweepable(swept):
        raise OptionError(f"{swept.name} is a switch, not an option with a value; it cannot be swept")
    listed_values = Values(read(swept, v) for v in values)
    listed_values.texts = [str(v) for v in values]
    plan = plan_runs(base, dest_of(swept), swept.name, listed_values)
    return Sweep(plan, dashboard=dashboard).start().wait()
