"""Sweeps: the same seeded workload once per value of one run option, compared.

```python
# blocks until done
cmp = kvscope.runs.background.sweep.sweep("block_size", [8, 16, 32, 64], requests=16, num_blocks=64)
cmp.table; cmp.per_run; cmp.save_csv("sweep.csv"); cmp.save_html("sweep.html")
```

``kvscope sweep --block-size 8,16,32,64 [run options] -o sweep.html`` and ``%kvscope sweep ...`` parse
the run options of ``kvscope.options.run`` with one change (``kvscope.options.sweep``): every option that
takes one value (workload, sampling, engine) also takes a comma-separated list, and exactly one of them
must get two or more values. Each value is one ``RunSpec`` (the others' spec with that one field replaced),
checked by ``kvscope.runs.setup.prepare.prepare`` before the first run starts, so a bad value fails at once.
The runs share everything else, so the synthetic workload (seeded, drawn from the model's vocabulary) is the
same prompts and the same per-request seeds in every run.

``Sweep`` is a ``Comparison`` that fills in: the runs go one after another on a background thread, and
each finished run joins ``runs`` / ``labels`` / ``summaries`` (appended in that order, read by zipping
them, so a reader never sees half a run). A run that fails is kept in ``errors`` and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.options.run import RUN_OPTIONS, OptionError, OptionSpec
from kvscope.options.sweep import SWEPT_GROUPS, Values, dest_of, sweepable
from kvscope.runs.background.lifecycle import Lifecycle
from kvscope.runs.background.status import RunStatus, SweepOutputs
from kvscope.runs.background.sweep_plan import (
    SweepPlan,
    default_args,
    listed_options,
    plan_from_args,
    plan_runs,
)
from kvscope.runs.result.comparison import Comparison
from kvscope.runs.setup.spec import RunSpec

if TYPE_CHECKING:
    from kvscope.runs.background.live import LiveRun
    from kvscope.runs.setup.prepare import RunSetup
    from kvscope.widgets.sweep_view import SweepView

__all__ = ["Sweep", "SweepPlan", "default_args", "listed_options", "plan_from_args", "plan_runs", "sweep"]


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
        self.runs, self.labels, self.summaries, self.spreads = [], [], [], []
        self._swept_values: list[Any] = []  # the values of the finished runs
        self.swept = (plan.dest, self._swept_values)
        self.workloads: list[list] = []  # the work items of each finished run (WorkItem lists)
        self.errors: dict[str, BaseException] = {}  # label -> why that run failed
        self.current: LiveRun | None = None
        self.index = -1  # the run going now (0-based)
        self.run_dashboards = dashboard  # each run shows its own dashboard (the sweep's view swaps them in)
        self.dashboard_options = dashboard_options
        self.listeners: list[Callable[[Sweep], None]] = []  # called on the sweep's thread as runs start and end
        self._view: SweepView | None = None

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
        plan = self.plan
        self.status = RunStatus.RUNNING
        if plan.warmup and plan.setups:  # start-up costs (kernels, allocator, caches) land here, unmeasured
            self._one_run(plan.setups[0], -1)
        for i, (value, label, setup) in enumerate(zip(plan.values, plan.labels, plan.setups)):
            runs = []
            for _ in range(plan.repeat):
                self._running.wait()  # paused between two runs
                if self._stop.is_set():
                    return
                run = self._one_run(setup, i)
                if run is None:
                    break
                runs.append(run)
            if runs and label not in self.errors:
                self._keep(value, label, runs)
            self._changed()

    def _one_run(self, setup: RunSetup, index: int) -> LiveRun | None:
        """One run of ``setup`` (``index`` -1: the warm-up); None if it failed (kept in ``errors``)."""
        from kvscope.runs.background.live import LiveRun

        run = LiveRun(setup.make_engine, setup.workload, **setup.run_options(),  # its spec: files, pace
                      dashboard=self.run_dashboards, dashboard_options=self.dashboard_options)
        self.index, self.current = index, run
        self._changed()
        if self.paused:
            run.pause()
        try:
            run.start().wait()
        except Exception as exc:  # this value failed (a pool too small, ...); the sweep goes on
            if index >= 0:  # a failed warm-up says nothing: the first value's own run fails the same way
                self.errors[self.plan.labels[index]] = exc
            return None
        return run if run.run.records else None

    def _keep(self, value: Any, label: str, runs: list[LiveRun]) -> None:
        """A value's result: the run of median duration (its figures), the median of each metric over the
        repeats (the table) and their min-max (the spread shown, and what counts as noise)."""
        summaries = [r.run.summary() for r in runs]
        order = sorted(range(len(runs)), key=lambda j: summaries[j]["duration_s"])
        middle = runs[order[len(runs) // 2]]
        summary, spread = dict(summaries[order[len(runs) // 2]]), {}
        if len(runs) > 1:
            for key, v in summary.items():
                values = [s[key] for s in summaries if isinstance(s.get(key), (int, float)) and s[key] == s[key]]
                if isinstance(v, (int, float)) and not isinstance(v, bool) and len(values) == len(runs):
                    summary[key] = statistics.median(values)
                    spread[key] = (min(values), max(values))
        self.summaries.append(summary)
        self.spreads.append(spread)
        self.runs.append(middle.run)
        self._swept_values.append(value)
        self.workloads.append(list(middle.workload))
        self.labels.append(label)

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
            what = "a warm-up run (not measured)" if run is not None else "starting"
            runs = f"{n} runs" if self.plan.repeat == 1 else f"{n} values x {self.plan.repeat} runs"
            return f"sweep of {self.plan.option}: {what} ({runs})"
        label = self.plan.labels[self.index]
        return f"sweep of {self.plan.option}: run {self.index + 1} of {n}, {label} ({run.status_text})"

    @property
    def warnings(self) -> list[str]:
        failed = [f"{label} failed: {type(exc).__name__}: {exc}" for label, exc in self.errors.items()]
        return (super().warnings if self.runs else []) + failed

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict | None:
        """In a notebook: the status, the table filling in, the current run's dashboard."""
        from kvscope.widgets.sweep_view import SweepView

        view = self._view
        if view is None:
            view = self._view = SweepView(self)
        return view.box._repr_mimebundle_(include=include, exclude=exclude)


def sweep(option: str, values: Sequence[Any], *, dashboard: bool = False, repeat: int = 1, warmup: bool = True,
          **options: Any) -> Sweep:
    """Run one seeded workload ``repeat`` times per value of ``option`` (after one unmeasured ``warmup`` run) and
    wait; returns the finished ``Sweep``.

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
    plan.repeat, plan.warmup = repeat, warmup
    return Sweep(plan, dashboard=dashboard).start().wait()
