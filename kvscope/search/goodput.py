"""A configuration's goodput (DistServe's: the highest arrival rate at which the SLO holds), found by bisection:
``evaluate(problem, point)`` -> ``Outcome``, a pure function of its arguments (seeded workload, virtual clock),
so any process or Ray task computes the same numbers.

The bracket (``kvscope.search.problem.Bisection``): start at ``start`` req/s; while the SLO holds double the rate
(up to ``maximum``: goodput reported as at least that), while it fails halve it (below ``minimum``: goodput 0);
then ``steps`` bisections of ``[holds, fails]`` at the geometric middle. The goodput is the highest rate tried
that held; ``broke`` is what failed at the lowest rate tried that failed (the SLO term furthest over its
threshold, or ``fraction``): why this configuration cannot serve more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvscope.options.parser import OptionError
from kvscope.runs.workload.items import WorkItem
from kvscope.search.deployment import Deployment, deploy
from kvscope.search.problem import SearchProblem
from kvscope.search.space import Point
from kvscope.search.trial import Trial, run_trial

_ITEMS: dict[str, list[WorkItem]] = {}  # per process: a workload's requests, made once (by _workload_key)


@dataclass(slots=True)
class Outcome:
    """One configuration's row: its point, goodput, cost, the percentiles at the goodput and why it stops there."""

    point: Point
    goodput: float = 0.0  # requests per second
    capped: bool = False  # held at the bisection's maximum rate: the goodput is at least that
    num_gpus: int = 0
    usd_per_hour: float | None = None
    percentiles: dict[str, float] = field(default_factory=dict)  # at the goodput (empty if none)
    attained: float = 0.0  # share of requests meeting every threshold at the goodput
    broke: str | None = None  # the first SLO term that fails above the goodput
    broke_at: float | None = None  # the lowest failing rate tried
    error: str | None = None  # the configuration cannot run (named)
    trials: int = 0
    stopped_early: int = 0  # trials stopped by the early-stop rule
    steps: int = 0  # engine steps simulated, all trials

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.num_gpus if self.num_gpus else 0.0

    @property
    def per_dollar_hour(self) -> float | None:
        """Requests per USD: goodput x 3600 / (USD per hour)."""
        return None if not self.usd_per_hour else self.goodput * 3600 / self.usd_per_hour

    def to_row(self) -> dict[str, Any]:
        return {"goodput": self.goodput, "capped": self.capped, "gpus": self.num_gpus,
                "usd_per_hour": self.usd_per_hour, "percentiles": dict(self.percentiles), "attained": self.attained,
                "broke": self.broke, "broke_at": self.broke_at, "error": self.error}


def evaluate(problem: SearchProblem, point: Point) -> Outcome:
    """The goodput of ``point`` under ``problem`` (a configuration that cannot run gets ``error``, not a raise)."""
    try:
        dep = deploy(problem, point, _items(problem))
    except (OptionError, ValueError) as exc:
        return Outcome(point, error=str(exc))
    if len(_ITEMS) > 4:
        _ITEMS.clear()
    _ITEMS[_workload_key(problem)] = dep.items
    out = Outcome(point, num_gpus=dep.num_gpus, usd_per_hour=dep.usd_per_hour)
    b = problem.bisection
    held: Trial | None = None
    failed: Trial | None = None

    def trial(rate: float) -> Trial:
        t = run_trial(dep, problem.slo, rate)
        out.trials += 1
        out.stopped_early += t.verdict.stopped_early
        out.steps += t.num_steps
        return t

    try:
        t = trial(b.start)
        if t.verdict.ok:
            held = t
            while held.rate < b.maximum:
                t = trial(min(held.rate * 2, b.maximum))
                if not t.verdict.ok:
                    failed = t
                    break
                held = t
        else:
            failed = t
            while failed.rate > b.minimum:
                t = trial(max(failed.rate / 2, b.minimum))
                if t.verdict.ok:
                    held = t
                    break
                failed = t
        if held is not None and failed is not None:
            for _ in range(b.steps):
                t = trial(math.sqrt(held.rate * failed.rate))
                if t.verdict.ok:
                    held = t
                else:
                    failed = t
    except (RuntimeError, ValueError) as exc:  # a configuration the engine cannot run (a pool too small, ...)
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    if held is not None:
        out.goodput, out.percentiles, out.attained = held.rate, held.verdict.percentiles, held.verdict.attained
        out.capped = failed is None
    if failed is not None:
        out.broke, out.broke_at = failed.verdict.broke, failed.rate
    return out


def _workload_key(problem: SearchProblem) -> str:
    """What a problem's requests depend on: the model, the workload and sampling options, what is replayed."""
    spec, sim = problem.spec, problem.sim
    return repr((getattr(spec, "model", None), getattr(spec, "workload", None), getattr(spec, "sampling", None),
                 getattr(sim, "replay", None), getattr(sim, "dtype", None)))


def _items(problem: SearchProblem) -> list[WorkItem] | None:
    """The requests this process already made for ``problem``'s workload."""
    return _ITEMS.get(_workload_key(problem))


def deployment(problem: SearchProblem, point: Point) -> Deployment:
    """``point``'s deployment (for the ``vllm serve`` line and tests)."""
    return deploy(problem, point, _items(problem))
