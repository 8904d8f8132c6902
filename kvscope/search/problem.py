"""``SearchProblem``: everything a search's configurations share (the workload, the step-time model's source, the
SLO, the rate bisection's bounds, the costs), as plain frozen data that pickles, so a local process or a Ray
task receives it whole and evaluates any configuration alone (``kvscope.search.goodput.evaluate``).

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.search.slo import SLO
from kvscope.search.space import POLICIES


@dataclass(frozen=True, slots=True)
class Bisection:
    """How the goodput rate is bracketed and bisected (requests per second): start at ``start``; double while it
    holds (up to ``maximum``) or halve while it fails (down to ``minimum``); then ``steps`` bisections of the
    bracket at its geometric middle (6 steps: within 1.1% of the goodput)."""

    start: float = 1.0
    minimum: float = 1 / 64
    maximum: float = 4096.0
    steps: int = 6

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.start <= self.maximum:
            raise ValueError(f"the rate bounds must satisfy 0 < minimum ({self.minimum:g}) <= start ({self.start:g}) "
                             f"<= maximum ({self.maximum:g})")
        if not 0 <= self.steps <= 30:
            raise ValueError(f"bisection steps={self.steps} must be from 0 to 30")


@dataclass(frozen=True, slots=True)
class SearchProblem:
    """A search's shared part. ``spec`` / ``sim``: ``kvscope.runs.setup.spec.RunSpec`` and
    ``kvscope.runs.setup.simulated.SimSpec`` as ``kvscope simulate`` takes them (without ``--rate``: the bisection
    sets it); ``router``: the replicas' policy unless the space varies it; ``gpu_cost``: USD per GPU-hour
    (``None``: the GPU table's, ``kvscope.planning.gpus.USD_PER_HOUR``)."""

    spec: object  # RunSpec (typed loosely: this module loads no torch and imports no runs)
    sim: object  # SimSpec
    slo: SLO
    bisection: Bisection = Bisection()
    router: str = "least_outstanding"
    gpu_cost: float | None = None

    def __post_init__(self) -> None:
        if self.router not in POLICIES:
            raise ValueError(f"--router {self.router!r}: known policies are {', '.join(POLICIES)}")
        if self.gpu_cost is not None and not 0 < self.gpu_cost < 1e6:
            raise ValueError(f"--gpu-cost {self.gpu_cost!r} must be a positive number of USD per GPU-hour")
