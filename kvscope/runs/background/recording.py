"""``Recording``: a ``Lifecycle`` whose result is a ``Run`` (``LiveRun``, ``WatchRun``; the coming
simulation run). What a ``Run`` has is read from ``run`` (the run so far while it goes, the whole run
once over), and the files at the end are the run's trace, metrics and HTML report."""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from kvscope.runs.background.lifecycle import Lifecycle
from kvscope.runs.result.run import Run
from kvscope.telemetry.records import PageEntry, RequestEvent, StepRecord


class Recording(Lifecycle):
    """A run in progress that records a ``Run``; see ``Lifecycle`` for its control."""

    @property
    @abstractmethod
    def run(self) -> Run:
        """The ``Run`` so far, the whole run once over."""

    def _file_writers(self) -> dict[str, Callable[[Path], Path]]:
        return {"trace": self.save_trace, "metrics": self.save_metrics, "html": self.save_html}

    # ---- what a Run has, read from ``run`` (see ``kvscope.runs.result.run.Run``) ----
    @property
    def records(self) -> list[StepRecord]:
        return self.run.records

    @property
    def events(self) -> list[RequestEvent]:
        return self.run.events

    @property
    def profiler_events(self) -> list[dict[str, Any]]:
        return self.run.profiler_events

    @property
    def steps(self) -> pd.DataFrame:
        return self.run.steps

    @property
    def requests(self) -> pd.DataFrame:
        return self.run.requests

    def summary(self) -> dict[str, Any]:
        return self.run.summary()

    def page_map_at(self, step: int) -> list[PageEntry]:
        return self.run.page_map_at(step)

    def save_trace(self, path: str | os.PathLike) -> Path:
        return self.run.save_trace(path)

    def save_metrics(self, path: str | os.PathLike) -> Path:
        return self.run.save_metrics(path)

    def save_html(self, path: str | os.PathLike) -> Path:
        return self.run.save_html(path)
