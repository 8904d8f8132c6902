"""``Run``: a recorded engine run (step records, request events, metadata) and what follows from it.

```python
engine = Engine("tiny"); engine.generate(prompts, params)
run = Run.from_engine(engine)        # snapshot of engine.recorder
run.steps, run.requests, run.summary()
run.save_trace("run.json"); run.save_metrics("run.jsonl"); run.save_html("run.html")
run = kvscope.load("run.json")       # or "run.jsonl": the same DataFrames back
```

``Run(records, events, meta, profiler_events=None)`` only stores its arguments, so a live run (the
dashboard's background run) can subclass it and keep appending to ``records`` / ``events``: the
DataFrames are rebuilt whenever those lists have grown.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from .telemetry import metrics
from .telemetry.export import write_metrics, write_trace
from .telemetry.load import read_run_file
from .telemetry.pagemap import page_map_at
from .telemetry.records import PageEntry, RequestEvent, StepRecord

if TYPE_CHECKING:
    from .engine import Engine


class Run:
    """A recorded run.

    - ``records``: ``list[StepRecord]`` in step order; ``events``: ``list[RequestEvent]`` in time order;
    - ``meta``: ``dict`` of JSON values: model, config, spec, ``kv_bytes_per_token``, ``max_model_len``,
      ``num_blocks``, ``block_size``, ``t0_ns`` (the perf_counter_ns that run-relative times count
      from), ``kvscope_version``, ... (see ``telemetry.recorder.run_metadata``);
    - ``profiler_events``: torch.profiler (Kineto) events of profiled windows, Chrome-trace dicts
      whose ``ts`` is in absolute perf_counter microseconds.
    """

    def __init__(
        self,
        records: list[StepRecord],
        events: list[RequestEvent],
        meta: dict[str, Any],
        profiler_events: list[dict[str, Any]] | None = None,
    ) -> None:
        self.records = records
        self.events = events
        self.meta = meta
        self.profiler_events = profiler_events if profiler_events is not None else []
        self._frames: dict[str, tuple[tuple[int, int], pd.DataFrame]] = {}

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_engine(cls, engine: Engine) -> Run:
        """A snapshot of everything ``engine.recorder`` holds (copies of its lists)."""
        recorder = engine.recorder
        if recorder is None:
            raise ValueError(
                "this engine records nothing (it was made with telemetry=False): "
                "create it with telemetry=True to get a Run"
            )
        return cls(*recorder.snapshot())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Run:
        """A run from a trace JSON or metrics JSONL written by kvscope (``ValueError`` otherwise)."""
        records, events, meta, profiler = read_run_file(path)
        run = cls(records, events, meta, profiler)
        run.meta.setdefault("source", str(path))
        return run

    # ---- derived -------------------------------------------------------------------------------
    @property
    def t0_ns(self) -> int:
        """The moment run-relative times (``*_s`` columns, trace ``ts``) count from."""
        t0 = self.meta.get("t0_ns")
        if t0 is None:
            starts = [e.t_ns for e in self.events[:1]] + [r.t_start_ns for r in self.records[:1]]
            t0 = self.meta["t0_ns"] = min(starts) if starts else 0
        return t0

    def _cached(self, name: str, build) -> pd.DataFrame:
        key = (len(self.records), len(self.events))
        hit = self._frames.get(name)
        if hit is None or hit[0] != key:
            hit = self._frames[name] = (key, build())
        return hit[1]

    @property
    def steps(self) -> pd.DataFrame:
        """One row per step (columns in docs/telemetry.md)."""
        return self._cached("steps", lambda: metrics.steps_frame(self.records, self.t0_ns))

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request: token counts, moments, TTFT / TPOT / ITL / E2E, preemptions, finish reason."""
        return self._cached("requests", lambda: metrics.requests_frame(self.records, self.events, self.t0_ns))

    def summary(self) -> dict[str, Any]:
        """Headline numbers: throughput, latency percentiles, KV peaks, fragmentation, prefix hits."""
        return metrics.summary(self.records, self.events, self.meta, self.requests)

    def page_map_at(self, step: int) -> list[PageEntry]:
        """Every block's ``PageEntry`` after ``step`` (from the last full snapshot and the diffs since)."""
        return page_map_at(self.records, step)

    # ---- exports -------------------------------------------------------------------------------
    def save_trace(self, path: str | os.PathLike) -> Path:
        """Perfetto / Chrome trace JSON (open in ui.perfetto.dev); also loadable with ``kvscope.load``."""
        return write_trace(self, path)

    def save_metrics(self, path: str | os.PathLike) -> Path:
        """JSON Lines: a header with ``meta``, one line per step and per request event, an end line."""
        return write_metrics(self, path)

    def save_html(self, path: str | os.PathLike) -> Path:
        """A standalone HTML report (``kvscope.widgets.report``)."""
        from .widgets.report import save_html

        return save_html(self, path)

    def show(self) -> None:
        """Replay the run in a notebook: the dashboard's panels and a page-map step slider."""
        from .widgets.report import show

        show(self)

    def __repr__(self) -> str:
        s = self.summary() if self.records else {}
        tps = s.get("output_tokens_per_s", math.nan)
        return (
            f"<Run {self.meta.get('model', '?')}: {len(self.requests)} requests, {len(self.records)} steps"
            + (f", {tps:.1f} output tok/s" if tps == tps else "")
            + ">"
        )


def load(path: str | os.PathLike) -> Run:
    """Load a kvscope trace (``.json``) or metrics file (``.jsonl``) into a ``Run``.

    A missing, empty, truncated, non-JSON or foreign file raises ``ValueError`` naming it and the problem.
    """
    return Run.load(path)
