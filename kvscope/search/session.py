"""A search as both faces run it: ``prepare_search(args, spec, sim)`` checks the options and builds the problem;
``Search.run(progress)`` evaluates every configuration; a ``SearchResult`` holds the outcomes, the best one, the
table (CSV, a DataFrame, HTML in a notebook), the page and the ``vllm serve`` line."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.search.executors import Progress, run_search
from kvscope.search.goodput import Outcome
from kvscope.search.problem import Bisection, SearchProblem
from kvscope.search.slo import SLO
from kvscope.search.space import SearchSpace
from kvscope.search.table import OBJECTIVES, best, csv_text, serve_line, write_csv


@dataclass(slots=True)
class Search:
    space: SearchSpace
    problem: SearchProblem
    executor: str = "processes"
    workers: int | None = None
    address: str | None = None
    objective: str = "per_dollar"

    @property
    def where(self) -> str:
        return {"sequential": "sequentially", "processes": f"in {self.workers or os.cpu_count()} processes",
                "ray": f"on Ray ({self.address or 'local'})"}[self.executor]

    def run(self, progress: Progress | None = None) -> SearchResult:
        started = time.perf_counter()
        outcomes = run_search(self.problem, list(self.space.points()), executor=self.executor, workers=self.workers,
                              address=self.address, progress=progress)
        return SearchResult(self, outcomes, best(outcomes, self.objective), time.perf_counter() - started)


@dataclass(slots=True)
class SearchResult:
    search: Search
    outcomes: list[Outcome]
    best: Outcome | None
    elapsed_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return str(getattr(self.search.problem.spec, "model", "?"))

    def csv(self, path: str | Path | None = None) -> str:
        """The table as CSV text; written to ``path`` too if given."""
        s = self.search
        if path is not None:
            write_csv(path, self.outcomes, s.space.names, s.problem.slo, self.best)
        return csv_text(self.outcomes, s.space.names, s.problem.slo, self.best)

    def table(self):
        """The table as a pandas DataFrame."""
        import io

        import pandas as pd

        return pd.read_csv(io.StringIO(self.csv()), keep_default_na=False)

    def save_html(self, path: str | Path, reports: str = "front") -> Path:
        """The Pareto page at ``path``; ``reports`` (``kvscope.search.reports.REPORTS``): which configurations are
        simulated again at their goodput with telemetry on, their run reports written into ``<page>.runs/`` and
        linked from their points and rows (``front``: the front and the best; ``all``; ``none``)."""
        from kvscope.search.page import front, save_page
        from kvscope.search.reports import chosen_for_reports, runs_folder, write_reports

        s = self.search
        picked, rule = chosen_for_reports(self.outcomes, front(self.outcomes, s.problem.slo), self.best, reports)
        links: dict[int, Path] = {}
        unlinked: dict[int, str] = {}
        if picked:
            written = write_reports(s.problem, picked, runs_folder(path), rule)
            links = {i: files["html"] for i, files in written.files.items() if "html" in files}
            unlinked = written.errors
        return save_page(path, self.outcomes, s.space.names, s.problem.slo, self.best, self.model, links=links,
                         note=rule, unlinked=unlinked)

    def serve_line(self) -> str | None:
        return serve_line(self.model, self.best) if self.best is not None else None

    def _repr_html_(self) -> str:
        import html

        line = self.serve_line() or "no configuration met the SLO"
        return (f"<p>{len(self.outcomes)} configurations in {self.elapsed_s:.1f} s; best: "
                f"<code>{html.escape(line)}</code></p>" + self.table().to_html(index=False))


def prepare_search(args: argparse.Namespace, spec: Any, sim: Any) -> Search:
    """The search the options describe; ``ValueError`` naming a bad option (before any work)."""
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers {args.workers} must be at least 1")
    if args.objective not in OBJECTIVES:
        raise ValueError(f"--objective {args.objective!r} must be one of {', '.join(OBJECTIVES)}")
    space = SearchSpace.parse(args.space)
    slo = SLO.parse(args.slo, args.goodput_fraction)
    bisection = Bisection(args.rate_start, min(1 / 64, args.rate_start), args.rate_max, args.bisect_steps)
    problem = SearchProblem(spec, sim, slo, bisection, args.router.replace("-", "_"), args.gpu_cost)
    executor = "sequential" if args.sequential else "ray" if args.ray is not None else "processes"
    return Search(space, problem, executor, args.workers, args.ray or None, args.objective)
