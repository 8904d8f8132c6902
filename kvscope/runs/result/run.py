"""``Run``: a recorded engine run (step records, request events, metadata) and what follows from it.

```python
engine = Engine("tiny"); engine.generate(prompts, params)
run = Run.from_engine(engine)        # snapshot of engine.recorder
run.steps, run.requests, run.summary()
run.save_trace("run.json"); run.save_metrics("run.jsonl"); run.save_html("run.html")
run = kvscope.load("run.json")       # or "run.jsonl": the same DataFrames back
```

``Run(records, events, meta, profiler_events=None)`` only stores its arguments; nothing in kvscope
changes a ``Run``'s lists afterwards (a ``LiveRun`` hands out a new ``Run`` as records arrive). The
DataFrames are cached per list lengths, so a caller who appends gets them rebuilt.

Imports go one way: ``Run`` uses ``telemetry`` (which works on plain records, events and meta), ``kvscope.pd.summary``
(a P/D run's ``meta["pd"]``: summary keys and the transfer track; standard library only) and,
for ``save_html`` / ``show`` only, ``kvscope.widgets.report`` (imported when called); neither
imports this module.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvscope.pd.summary import pd_summary, transfer_lane
from kvscope.telemetry import frames as metrics
from kvscope.telemetry.export import Lane, write_metrics, write_trace
from kvscope.telemetry.load import read_run_file
from kvscope.telemetry.pagemap import page_map_at
from kvscope.telemetry.records import PageEntry, RequestEvent, StepRecord
from kvscope.telemetry.run_summary import summary as run_summary

if TYPE_CHECKING:
    from kvscope.engine.protocols import EngineClient


class Run:
    """A recorded run.

    - ``records``: ``list[StepRecord]`` in step order; ``events``: ``list[RequestEvent]`` in time order;
    - ``meta``: ``dict`` of JSON values: model, config, spec, ``kv_bytes_per_token``, ``max_model_len``,
      ``num_blocks``, ``block_size``, ``t0_ns`` (the perf_counter_ns that run-relative times count
      from), ``kvscope_version``, ... (see ``Engine.run_metadata``);
    - ``profiler_events``: torch.profiler (Kineto) events of profiled windows, Chrome-trace dicts
      whose ``ts`` is in absolute perf_counter microseconds.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Run:
        """The kind of run is chosen here, once: the records of a watched vLLM run (its ``meta`` has a
        ``"watch"`` description) make a ``WatchedRun``, whoever builds them (a file, a watch, a test)."""
        meta = args[2] if len(args) > 2 else kwargs.get("meta")
        if cls is Run and isinstance(meta, dict) and "watch" in meta:
            cls = WatchedRun
        return super().__new__(cls)

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
    def from_engine(cls, engine: EngineClient) -> Run:
        """A snapshot of everything ``engine.recorder`` holds (copies of its lists; a ``kvscope.pd.PDEngine``'s
        gathers its instances' records, ``kvscope.pd.recorder``)."""
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
        run = cls(records, events, meta, profiler)  # a WatchedRun for a watched vLLM run's file
        run._check_loaded(path)
        run.meta.setdefault("source", str(path))
        return run

    def _check_loaded(self, path: str | os.PathLike) -> None:
        """``ValueError`` naming ``path`` if the loaded file's ``meta`` is not what its readers expect."""

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
        """Headline numbers: throughput, latency percentiles, KV peaks, fragmentation, prefix hits. A run
        longer than its recorder's ring carries the exact summary of all of it (``meta["summary"]``, kept
        by ``telemetry.summary_stream``); the records then hold only its last window of steps."""
        computed = run_summary(self.records, self.events, self.meta, self.requests)
        exact = self.meta.get("summary")
        if isinstance(exact, dict):
            computed.update({k: math.nan if v is None else v for k, v in exact.items() if k in computed})
        if isinstance(self.meta.get("pd"), dict):  # a P/D run: its transfers, TTFT / ITL per instance
            computed.update(pd_summary(self.meta["pd"], computed))  # the system's figures, end to end
        return computed

    def prefix_misses(self) -> pd.DataFrame:
        """One row per request looked up in the prefix cache: what it got (``num_cached_tokens``), what it
        could have got (``num_reusable_tokens``), why not (``miss_cause``) and where its prompt left the earlier
        one it shares the most with (``diverged_at``, ``diverged_from``); ``kvscope.explain.prefix``."""
        from kvscope.explain.prefix import prefix_misses
        from kvscope.explain.report import misses_frame

        return misses_frame(prefix_misses(self.records, self.events, {**self.meta, "t0_ns": self.t0_ns}))

    def queue_reasons(self) -> pd.DataFrame:
        """One row per request: its time in the waiting queue split by why it was not admitted (the token
        budget, max_num_seqs, no free blocks, preempted, a step in progress), its preemptions and the tokens
        recomputed after them; ``kvscope.explain.waits``."""
        from kvscope.explain.waits import queue_rows, queue_times

        return pd.DataFrame(queue_rows(queue_times(self.records, self.events)))

    def page_map_at(self, step: int) -> list[PageEntry]:
        """Every block's ``PageEntry`` after ``step`` (from the last full snapshot and the diffs since)."""
        return page_map_at(self.records, step)

    # ---- exports -------------------------------------------------------------------------------
    def save_trace(self, path: str | os.PathLike) -> Path:
        """Perfetto / Chrome trace JSON (open with ``kvscope view PATH --perfetto``, offline); also loadable with
        ``kvscope.load``."""
        meta = {**self.meta, "t0_ns": self.t0_ns}  # a hand-made run may lack t0_ns
        return write_trace(path, self.records, self.events, meta, self.profiler_events, self._lanes())

    def _lanes(self) -> list[Lane]:
        """Extra processes of the trace (a P/D run's transfer track; a watched run has one per engine)."""
        return transfer_lane(self.meta["pd"]) if isinstance(self.meta.get("pd"), dict) else []

    def save_metrics(self, path: str | os.PathLike) -> Path:
        """JSON Lines: a header with ``meta``, one line per step and per request event, an end line."""
        return write_metrics(path, self.records, self.events, {**self.meta, "t0_ns": self.t0_ns})

    def save_html(self, path: str | os.PathLike) -> Path:
        """A standalone HTML report (``kvscope.widgets.report``, imported here: widgets never import
        ``kvscope.runs.result.run``, so the dependency goes one way)."""
        from kvscope.widgets.report import save_html

        return save_html(self, path)

    def show(self) -> None:
        """Replay the run in a notebook: the dashboard's panels and a page-map step slider."""
        from kvscope.widgets.report import show

        show(self)

    def __repr__(self) -> str:
        s = self.summary() if self.records else {}
        tps = s.get("output_tokens_per_s", math.nan)
        return (
            f"<Run {self.meta.get('model', '?')}: {len(self.requests)} requests, {len(self.records)} steps"
            + (f", {tps:.1f} output tok/s" if tps == tps else "")
            + ">"
        )


class WatchedRun(Run):
    """A watched vLLM run (``kvscope watch``): ``meta["watch"]`` describes its servers, engines and lanes.
    ``Run(...)`` and ``load`` make one for such records; its summary adds the watch's counters, KV event
    counts, estimates and per-engine split, its trace has a process per engine, and its report and replay
    are the watch's own (``kvscope.widgets.watch_report``)."""

    def _check_loaded(self, path: str | os.PathLike) -> None:
        from kvscope.watched.summary import check_watch

        try:
            check_watch(self.meta["watch"])
        except ValueError as exc:
            raise ValueError(f"{path}: a damaged kvscope watch file ({exc})") from None

    def summary(self) -> dict[str, Any]:
        from kvscope.watched.summary import watch_summary

        out = {**super().summary(), **watch_summary(self.meta["watch"])}
        if out.get("itl_p50_s") != out.get("itl_p50_s"):  # no token times in the steps: vLLM's histogram's estimate
            out["itl_p50_s"] = out.get("itl_p50_s_estimate", math.nan)  # (so a simulation's compares with it)
        return out

    def _lanes(self) -> list[Lane]:
        from kvscope.watched.summary import engine_tracks

        return engine_tracks(self.meta["watch"], self.t0_ns)

    def save_html(self, path: str | os.PathLike) -> Path:
        from kvscope.widgets.watch_report import save_html

        return save_html(self, path)

    def show(self) -> None:
        from kvscope.widgets.watch_report import show

        show(self)


def load(path: str | os.PathLike) -> Run:
    """Load a kvscope trace (``.json``) or metrics file (``.jsonl``) into a ``Run``.

    A missing, empty, truncated, non-JSON or foreign file raises ``ValueError`` naming it and the problem.
    """
    return Run.load(path)
