"""``LiveRun``: an engine stepping in a background thread while a dashboard watches; it has a ``Run``.

Threads (the control, ``wait`` and Ctrl-C are ``kvscope.runs.background.lifecycle.Lifecycle``'s):

- the **engine thread** (``kvscope-run``) is the only one that touches the engine: it builds it (loading a model
  can take seconds), submits the workload, calls ``engine.step()`` until nothing is left, honours stop / pause
  between steps, and at the end writes the requested files. It is also the only writer of ``status``;
- the **dashboard thread** (``kvscope-dashboard``, see ``widgets/dashboard.py``) is the only one
  that touches the Bokeh documents; it reads what the recorder published through a ``Feed``;
- the **caller** (the notebook's main thread) only sets flags (``stop``, ``pause``, ``resume``) and
  reads results; ``wait`` blocks it until the run is over.

``run`` is the ``Run`` so far (a new one over copies whenever more was recorded: a ``Run``'s lists never change
under its cached DataFrames), the whole run once over; ``steps``, ``requests``, ``summary()``, ... read it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any, TypeGuard

from kvscope.engine.engine import Engine
from kvscope.engine.protocols import EngineClient, RunRecorder
from kvscope.engine.request import RequestOutput
from kvscope.runs.background.profiling import open_windows
from kvscope.runs.background.recording import Recording
from kvscope.runs.background.status import Outputs, RunStatus, claim_engine, release_engines
from kvscope.runs.background.submitter import Submitter
from kvscope.runs.result.buffer import RunBuffer
from kvscope.runs.result.run import Run
from kvscope.runs.workload.items import WorkItem
from kvscope.telemetry.detail import DetailWindow
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.telemetry.slow_capture import SlowCapture
from kvscope.telemetry.summary_stream import SummaryStream
from kvscope.utils.collector import fewer_collections

EngineFactory = Callable[[], EngineClient]
Workload = Iterable[WorkItem] | Callable[[EngineClient], Iterable[WorkItem]]


class LiveRun(Recording):
    """A run in progress. ``LiveRun(make_engine, workload).start()``; then ``wait()``, ``stop()``,
    ``pause()`` / ``resume()``, ``outputs``, ``steps``, ``requests``; shows its dashboard in a notebook.

    ``make_engine`` is an engine (``kvscope.engine.protocols.EngineClient``: an ``Engine``, a ``PDEngine``, a
    simulated one) or a no-argument callable returning one (called on the engine thread, so a slow model load
    does not block the caller; one with a ``release(engine)`` method gets the engine back when the run is over:
    ``kvscope.runs.setup.engine_cache.EngineLease``). ``workload`` is a list of ``WorkItem`` or
    a function of the engine returning one (synthetic prompts need its vocabulary). ``step_delay`` (seconds) sleeps
    between steps, to watch a fast model. ``profile_steps`` > 0 captures that many steps with
    torch.profiler (after one warm-up step); ``capture_slow=(steps, windows)``: ``Engine.capture_slow``, its
    findings in ``meta["capture_slow"]``. ``dashboard=False`` runs without one (scripts, benchmarks).

    A prompt the engine refuses (empty, too long, outside the vocabulary) fails alone: its request ends
    with status ``error`` naming it (``item.source``, e.g. "line 3 of prompts.txt") and the others run.
    An engine can be driven by one live run at a time; ``start()`` refuses a second one.
    """

    files: Outputs

    def __init__(
        self,
        make_engine: EngineClient | EngineFactory,
        workload: Workload,
        *,
        outputs: Outputs | None = None,
        step_delay: float = 0.0,
        profile_steps: int = 0,
        capture_slow: tuple[int, int] | None = None,
        dashboard: bool = True,
        dashboard_options: dict[str, Any] | None = None,
        keep_outputs: bool = True,
        total_requests: int | None = None,
        admission_s: float = 0.0,
    ) -> None:
        super().__init__(outputs or Outputs())
        self._make_engine = make_engine
        self._workload = workload
        # the items as their arrival times come, and the requests made of them; False: finished requests are
        # let go (a simulation of 10**6 requests)
        self._submitter = Submitter(keep_outputs, admission_s)  # admission_s: a simulated front end's delay
        if not callable(workload) and isinstance(workload, Sequence):
            self._submitter.workload = list(workload)
        self.total_requests = total_requests  # a lazy workload's length, if known (a list's is its own)
        self._detail: DetailWindow | None = None  # which steps get per-request detail (a long simulation)
        self.num_finished = 0  # requests whose "finished" event was recorded
        self.step_delay = step_delay
        self.profile_steps = profile_steps
        self.capture_slow = capture_slow
        self._capture: SlowCapture | None = None  # the SlowCapture's (telemetry/slow_capture.py)
        self.engine: EngineClient | None = None
        self.meta: dict[str, Any] = {}  # filled in place as the run learns it (the dashboard holds it)
        self._so_far = RunBuffer(self.meta)  # what the recorder published (sized to it in _build_engine)
        self._stream = SummaryStream({})
        self._final: Run | None = None  # the whole run, once over
        self._profiler: ExitStack | None = None  # the profiling window, closed at the end
        self._unsubscribe: Callable[[], None] | None = None  # from the recorder, at the end
        if dashboard:
            from kvscope.widgets.dashboard import Dashboard

            self.dashboard = Dashboard(control=self, meta=self.meta, **(dashboard_options or {}))

    # ---- control (the rest: ``Lifecycle``) ----------------------------------------------------------
    def start(self) -> LiveRun:
        """Start the engine thread (and the dashboard's); returns at once. Raises ``RuntimeError`` if
        this run was started before or its engine is driven by another live run that is not over."""
        if self._thread is None and not callable(self._make_engine):
            claim_engine(self._make_engine, self)
        return super().start()

    # ---- the workload (the submitter's) ------------------------------------------------------------------
    @property
    def workload(self) -> list[WorkItem]:
        """The work items (once known: a function of the engine makes them when it is built; empty for a lazy
        workload, an iterator)."""
        return self._submitter.workload

    @property
    def num_submitted(self) -> int:
        return self._submitter.num_submitted

    # ---- results (any thread) ---------------------------------------------------------------------------
    @property
    def run(self) -> Run:
        """The ``Run`` so far (a new one whenever records or events have arrived), the whole run once over."""
        final = self._final
        return final if final is not None else self._so_far.run()

    @property
    def outputs(self) -> list[RequestOutput]:
        """One ``RequestOutput`` per submitted request, in workload order (partial while running)."""
        return self._submitter.outputs(self.engine) if self.engine is not None else []

    @property
    def step(self) -> int:
        """Steps done so far."""
        return self._so_far.num_steps

    @property
    def elapsed_s(self) -> float:
        """Seconds since the run started, on the engine's clock (a simulation's: virtual time)."""
        engine = self.engine
        return (engine.clock.now_ns() - self.meta["t0_ns"]) / 1e9 if engine is not None else 0.0

    @property
    def t0_ns(self) -> int:
        return self.run.t0_ns

    def save_html(self, path: str | os.PathLike) -> Path:
        """The HTML report of the run so far, with the prompt and output texts (``Run.save_html``)."""
        run = self.run
        if "texts" not in run.meta and self.engine is not None:  # still going: the texts so far
            run = Run(run.records, run.events, {**run.meta, "texts": self._submitter.texts(self.engine)})
        return run.save_html(path)

    # ---- the engine thread ---------------------------------------------------------------------------
    def _collect(self, item: StepRecord | RequestEvent) -> None:
        """Recorder subscriber (engine thread): keep the item, hand it to the dashboard."""
        self._so_far.add(item)
        self._stream.add(item)
        if isinstance(item, RequestEvent) and item.kind == "finished":
            self.num_finished += 1
        if self.dashboard is not None:
            self.dashboard.feed.push(item)

    def _build_engine(self) -> EngineClient:
        self.status = RunStatus.LOADING
        make = self._make_engine
        engine = make() if callable(make) else make
        recorder = _recorder(engine)
        claim_engine(engine, self)
        recorder.clear()
        self.meta.update(engine.run_metadata())
        self.meta["t0_ns"] = engine.clock.now_ns()
        self._so_far = RunBuffer(self.meta, recorder.capacity)  # the recorder's own bounds
        self._stream = SummaryStream(recorder.baseline)  # the exact summary, past the recorder's ring
        return engine

    def _body(self) -> None:
        engine = self.engine = self._build_engine()
        recorder = _recorder(engine)
        items = self._workload(engine) if callable(self._workload) else self._workload
        self._submitter.start(items, engine.clock.now_ns())
        self._unsubscribe = recorder.subscribe(self._collect)
        self._detail = DetailWindow.for_run(recorder, self.total_requests or len(self.workload),
                                            engine.clock.virtual and self.dashboard is None)
        self._submitter.submit_due(engine)
        self._profiler, self._capture = open_windows(engine, self.profile_steps, self.capture_slow, self.meta,
                                                     self.files.trace)
        self.status = RunStatus.RUNNING
        self._loop(engine)

    def _wind_down(self) -> None:
        try:
            if self.engine is not None:
                self._abort_own(self.engine)  # the last "finished" events, and a record of the freed pages
                self._finish(self.engine)
        finally:
            release_engines(self)
            give_back = getattr(self._make_engine, "release", None)  # a kept engine's (runs/setup/engine_cache.py)
            if give_back is not None and self.engine is not None:
                give_back(self.engine)

    def _abort_own(self, engine: EngineClient) -> None:
        """Abort this run's unfinished requests (not those another thread added to the same engine)
        and record the state that leaves."""
        recorder = engine.recorder
        if self._detail is not None and isinstance(recorder, Recorder):  # the last records in detail, whatever
            recorder.set_detail(True)  # the estimate said
        self._submitter.abort_unfinished(engine)
        engine.record_state()

    def _loop(self, engine: EngineClient) -> None:
        # a simulation is all Python objects: the collector would take a third of its time (utils/collector.py)
        with fewer_collections() if engine.clock.virtual else nullcontext():
            self._steps(engine)

    def _steps(self, engine: EngineClient) -> None:
        # records, not stream deltas: a P/D router's step, or one a test replaced, is called as it is
        step = functools.partial(engine.step, deltas=False) if _plain_engine(engine) else engine.step
        recorder = engine.recorder  # one that can go light (a Recorder), when a detail window says when
        light = recorder if self._detail is not None and isinstance(recorder, Recorder) else None
        submitter = self._submitter
        while not self._stop.is_set():
            submitter.submit_due(engine)
            if not engine.has_unfinished_requests():
                wake = submitter.next_arrival_ns
                if wake is None:
                    break
                engine.clock.sleep_until_ns(wake, self._stop)  # idle until the next arrival
                continue
            if not self._running.is_set():
                self.status = RunStatus.PAUSED
                self._running.wait()
                self.status = RunStatus.RUNNING
                continue
            if light is not None and self._detail is not None:
                light.set_detail(self._detail.update(self._so_far.num_steps, self.num_finished))
            step()
            if self.step_delay:
                self._stop.wait(self.step_delay)

    def _finish(self, engine: EngineClient) -> None:
        """Engine thread, last: stop profiling, adopt the recorder's snapshot as the run, write the files."""
        if self._profiler is not None:
            try:
                self._profiler.close()
            except Exception as exc:
                self.files.errors["profile"] = f"{type(exc).__name__}: {exc}"
        if self._unsubscribe is not None:
            self._unsubscribe()
        recorder = _recorder(engine)
        records, events, meta, profiler_events = recorder.snapshot()
        meta["t0_ns"] = self.meta.get("t0_ns", meta["t0_ns"])
        meta["texts"] = self._submitter.texts(engine)
        if self._capture is not None and self._capture.on_change is not None:
            self._capture.on_change()  # its final word, into self.meta
        if meta["num_steps_dropped"] or self.num_submitted > (recorder.events.maxlen or 0) // 4:
            # the ring lost the start, the stream saw all of it (NaN as null: files hold no NaN)
            meta["summary"] = {k: None if isinstance(v, float) and v != v else v
                               for k, v in self._stream.summary().items()}
        if self.dashboard is not None:  # what its update thread took of the run's CPU, and any lowered rate
            meta["dashboard_cost"] = self.dashboard.governor.describe()
        self.meta.update(meta)
        self._final = Run(records, events, self.meta, profiler_events)
        if self.dashboard is not None:  # the end of a run does not hide it: a slider replays its page map
            self.dashboard.offer_replay(self._final)
        self._write_files()

    def _describe(self) -> str:
        return f"{self.meta.get('model', '?')}: {self.status_text}, {self.step} steps, {self.num_submitted} requests"


def _recorder(engine: EngineClient) -> RunRecorder:
    """The engine's recorder; ``ValueError`` for an engine that records nothing."""
    if engine.recorder is None:
        raise ValueError("a live run needs an engine with telemetry=True")
    return engine.recorder


def _plain_engine(engine: EngineClient) -> TypeGuard[Engine]:
    """An ``Engine`` whose own ``step`` runs (it takes ``deltas=False``), not a router or a test's stand-in."""
    return isinstance(engine, Engine) and "step" not in vars(engine)
