"""The simulated run behind a point of a search's page: ``write_reports(problem, outcomes, folder)``
re-runs configurations at their goodput rate with telemetry on and writes each one's ``kvscope simulate`` files
(``NAME.html``, ``NAME.metrics.jsonl``, ``NAME.trace.json``) into ``folder``, for the page to link.

Which configurations (``REPORTS``): ``front`` (the default) the Pareto front's points and the best, at most
``MAX_FRONT`` of them (the best first, then the front's points by goodput, highest first); ``all`` every configuration
with a goodput (asked for: a 1,000-configuration search writes up to 1,000 reports); ``none`` no report. A
configuration with no goodput (it never met the SLO, or cannot run) has no run to show and gets no report.

A report is the trial at the goodput rate made again, not an approximation of it: the same ``Deployment``
(``kvscope.search.deployment.deploy``: engine options, replicas behind the router, a P/D layout, tp on the
roofline), the same requests re-timed with the same seed (``with_arrivals``), only ``telemetry`` on, driven by
``LiveRun`` as ``kvscope simulate`` drives its engine, which writes the files (each atomically). A replicated or
P/D deployment is one router over its instances, so its run is one report too (its records name each instance).
The run's ``meta["search"]`` holds the configuration's settings, the rate and the SLO, so a loaded file says
which point it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, is_dataclass, replace
from pathlib import Path

from kvscope.search.deployment import deploy
from kvscope.search.goodput import Outcome
from kvscope.search.problem import SearchProblem
from kvscope.utils.files import check_outputs

REPORTS = ("front", "all", "none")
MAX_FRONT = 32  # reports written by default, at most: a front can be long in a search of thousands
SUFFIXES = {"html": ".html", "metrics": ".metrics.jsonl", "trace": ".trace.json"}


@dataclass(slots=True)
class Reports:
    """What was written: each reported configuration's files (by the point's index), and why others have none."""

    folder: Path
    files: dict[int, dict[str, Path]] = field(default_factory=dict)  # point index -> kind -> path
    errors: dict[int, str] = field(default_factory=dict)  # point index -> why its run could not be written
    rule: str = ""  # which configurations were chosen, in words (the page says it)


def runs_folder(page: str | os.PathLike) -> Path:
    """The folder of a page's reports: ``s.html`` -> ``s.runs`` beside it."""
    page = Path(page)
    return page.with_name(page.stem + ".runs")


def safe_name(outcome: Outcome) -> str:
    """A file name for ``outcome``'s configuration: its index (unique) and its settings, in portable characters."""
    label = outcome.point.label().replace("=", "-")
    return f"{outcome.point.index:04d}_" + (re.sub(r"[^A-Za-z0-9.-]+", "_", label).strip("_.")[:100] or "config")


def chosen_for_reports(outcomes: Sequence[Outcome], front: Sequence[Outcome], best: Outcome | None,
                       which: str = "front") -> tuple[list[Outcome], str]:
    """The configurations to report under ``which`` (``REPORTS``), in the table's order, and the rule in words."""
    if which not in REPORTS:
        raise ValueError(f"--reports {which!r} must be one of {', '.join(REPORTS)}")
    ok = [o for o in outcomes if o.error is None and o.goodput > 0]
    if which == "none":
        return [], "no run reports were written (--reports none)"
    if which == "all":
        return ok, "every configuration with a goodput links to its run at that rate (--reports all)"
    first = [best] if best is not None and best in ok else []
    candidates = first + sorted((o for o in front if o in ok and o is not best), key=lambda o: -o.goodput)
    picked = candidates[:MAX_FRONT]
    left = len(candidates) - len(picked)
    rule = ("the Pareto front's configurations and the best link to their runs at the goodput rate; the others "
            "have none (--reports all writes one for every configuration with a goodput)")
    if left > 0:
        rule += f"; only the best and the front's {MAX_FRONT - len(first)} highest-goodput points do: {left} more " \
                "front points have none"
    return sorted(picked, key=lambda o: o.point.index), rule


def write_reports(problem: SearchProblem, outcomes: Sequence[Outcome], folder: str | os.PathLike,
                  rule: str = "") -> Reports:
    """Each of ``outcomes`` re-run at its goodput with telemetry on; its files in ``folder`` (made if missing).
    An output that is one of the search's inputs (``--step-model``, ``--replay``, ``--prompts``) is refused
    (``ValueError``) before anything is written."""
    folder = Path(folder)
    plan = {o.point.index: {kind: folder / (safe_name(o) + suffix) for kind, suffix in SUFFIXES.items()}
            for o in outcomes}
    check_outputs(_inputs(problem), [(f"the {kind} of a search run", p) for paths in plan.values()
                                     for kind, p in paths.items()])
    out = Reports(folder, rule=rule)
    for o in outcomes:
        try:
            out.files[o.point.index] = _write_one(problem, o, plan[o.point.index])
        except Exception as exc:  # this configuration's run failed: the page says why, the others are linked
            out.errors[o.point.index] = f"{type(exc).__name__}: {exc}"
    return out


def _write_one(problem: SearchProblem, outcome: Outcome, paths: dict[str, Path]) -> dict[str, Path]:
    from kvscope.runs.background.live import LiveRun
    from kvscope.runs.setup.outputs import Outputs
    from kvscope.runs.workload.items import with_arrivals
    from kvscope.utils.clock import VirtualClock

    dep = deploy(problem, outcome.point)
    dep = replace(dep, config=replace(dep.config, telemetry=True))
    if is_dataclass(dep.step_model):  # a fresh copy: a fitted model's scatter draws from its seed (as run_trial)
        dep = replace(dep, step_model=replace(dep.step_model))  # type: ignore[type-var]
    items = with_arrivals(dep.items, outcome.goodput, dep.arrival, dep.seed)
    arrivals = [i.arrival_s for i in items]
    paths["html"].parent.mkdir(parents=True, exist_ok=True)
    run = LiveRun(lambda: dep.engine(VirtualClock(0), arrivals), items, dashboard=False,
                  outputs=Outputs(trace=paths["trace"], metrics=paths["metrics"], html=paths["html"]))
    label = outcome.point.label()
    run.meta["title"] = f"kvscope search · {getattr(problem.spec, 'model', '?')} · {label} at " \
                        f"{outcome.goodput:.4g} req/s (simulated)"
    run.meta["search"] = {"configuration": label, "index": outcome.point.index,
                          "settings": dict(zip(outcome.point.keys, outcome.point.texts)),
                          "rate_rps": outcome.goodput, "slo": str(problem.slo), "percentiles": outcome.percentiles,
                          "gpus": outcome.num_gpus}
    run.start().wait()
    if run.files.errors:
        raise OSError("; ".join(f"{k}: {v}" for k, v in run.files.errors.items()))
    return dict(run.files.written)


def _inputs(problem: SearchProblem) -> list[tuple[str, Path | None]]:
    spec, sim = problem.spec, problem.sim
    prompts = getattr(getattr(spec, "workload", None), "prompts", None)
    found: list[tuple[str, Path | None]] = [
        ("--step-model", Path(sim.step_model) if getattr(sim, "step_model", None) else None),  # type: ignore[attr-defined]
        ("--replay", Path(sim.replay) if getattr(sim, "replay", None) else None),  # type: ignore[attr-defined]
        ("--prompts", Path(prompts) if prompts else None)]
    return found
