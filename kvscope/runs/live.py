"""``LiveRun``: an engine stepping in a background thread while a dashboard watches; it has a ``Run``.

Threads:

- the **engine thread** (``kvscope-run``) is the only one that touches the engine: it builds it
  (loading a model can take seconds), submits the workload, calls ``engine.step()`` until nothing is
  left, honours stop / pause between steps, and at the end writes the requested files. It is also
  the only writer of ``status``;
- the **dashboard thread** (``kvscope-dashboard``, see ``widgets/dashboard.py``) is the only one
  that touches the Bokeh documents; it reads what the recorder published through a ``Feed``;
- the **caller** (the notebook's main thread) only sets flags (``stop``, ``pause``, ``resume``) and
  reads results; ``wait`` blocks it until the run is over. A ``KeyboardInterrupt`` during ``wait``
  (Jupyter's "interrupt kernel") stops the run, waits for it to wind down, and propagates.

``run`` is the ``Run`` so far: while the engine steps, a new ``Run`` over copies of what has been
recorded whenever more has arrived (a ``Run``'s lists never change under its cached DataFrames);
once over, the whole run. ``steps``, ``requests``, ``summary()``, ``save_trace()``, ... read it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pandas as pd

from kvscope.engine.engine import Engine
from kvscope.engine.request import Request, RequestOutput
from kvscope.runs.run import Run, RunBuffer
from kvscope.runs.status import Outputs, RunStatus, claim_engine, release_engines, status_text
from kvscope.runs.workload import WorkItem
from kvscope.telemetry.records import PageEntry, RequestEvent, StepRecord


class LiveRun:
    """A run in progress. ``LiveRun(make_engine, workload).start()``; then ``wait()``, ``stop()``,
    ``pause()`` / ``resume()``, ``outputs``, ``steps``, ``requests``; shows its dashboard in a notebook.

    ``make_engine`` is an ``Engine`` or a no-argument callable returning one (called on the engine
    thread, so a slow model load does not block the caller). ``workload`` is a list of ``WorkItem`` or
    a function of the engine returning one (synthetic prompts need its vocabulary). ``step_delay`` (seconds) sleeps
    between steps, to watch a fast model. ``profile_steps`` > 0 captures that many steps with
    torch.profiler (after one warm-up step). ``dashboard=False`` runs without one (scripts, benchmarks).

    A prompt the engine refuses (empty, too long, outside the vocabulary) fails alone: its request ends
    with status ``error`` naming it (``item.source``, e.g. "line 3 of prompts.txt") and the others run.
    An engine can be driven by one live run at a time; ``start()`` refuses a second one.
    """

    def __init__(
        self,
        make_engine: Engine | Callable[[], Engine],
        workload: Sequence[WorkItem] | Callable[[Engine], Sequence[WorkItem]],
        *,
        outputs: Outputs | None = None,
        step_delay: float = 0.0,
        profile_steps: int = 0,
        dashboard: bool = True,
        dashboard_options: dict[str, Any] | None = None,
    ) -> None:
        self._make_engine = make_engine
        self._workload = workload
        self.workload: list[WorkItem] = [] if callable(workload) else list(workload)
        self.files = outputs or Outputs()
        self.step_delay = step_delay
        self.profile_steps = profile_steps
        self.engine: Engine | None = None
        self.status = RunStatus.STARTING
        self.error: BaseException | None = None  # what ended the run, if it failed
        self.writing_files = False  # the files are being written (the run itself is over)
        self.meta: dict[str, Any] = {}  # filled in place as the run learns it (the dashboard holds it)
        self._requests: list[Request] = []
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._so_far = RunBuffer(self.meta)  # what the recorder published (sized to it in _build_engine)
        self._final: Run | None = None  # the whole run, once over
        self.dashboard = None
        if dashboard:
            from kvscope.widgets.dashboard import Dashboard

            self.dashboard = Dashboard(control=self, meta=self.meta, **(dashboard_options or {}))

    # ---- control (any thread) ---------------------------------------------------------------------------
    def start(self) -> LiveRun:
        """Start the engine thread (and the dashboard's); returns at once. Raises ``RuntimeError`` if
        this run was started before or its engine is driven by another live run that is not over."""
        if self._thread is not None:
            raise RuntimeError("this run was already started")
        if isinstance(self._make_engine, Engine):
            claim_engine(self._make_engine, self)
        self._thread = threading.Thread(target=self._main, name="kvscope-run", daemon=True)
        self._thread.start()
        if self.dashboard is not None:
            self.dashboard.start(self._done.is_set)
        return self

    def stop(self) -> None:
        """Abort every request at the next step boundary and end the run (files are still written)."""
        self._stop.set()
        self._running.set()

    def close(self) -> None:
        """Stop the run if it is going, wait for it to wind down, and close the dashboard's widgets
        (they leave the notebook's output). The results stay readable; dropping the last reference
        to the run then frees its engine (its KV pool) too."""
        if self._thread is not None and not self.done:
            self.stop()
            self._done.wait()
        if self.dashboard is not None:
            self.dashboard.close()

    def pause(self) -> None:
        """Hold the engine between steps until ``resume()`` (or ``stop()``); ``status`` says
        ``paused`` from the next step boundary."""
        if not self.done:
            self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def status_text(self) -> str:
        """The status in words with its details: "failed: RuntimeError: ...", "finished · could not
        write trace"."""
        return status_text(self.status, self.error, self.writing_files, self.files.errors)

    def wait(self, timeout: float | None = None) -> LiveRun:
        """Block until the run (and its dashboard's last update) is over; returns ``self``.

        Raises ``TimeoutError`` after ``timeout`` seconds, the run's own exception if it failed, and
        ``KeyboardInterrupt`` (after stopping the run cleanly) if interrupted while waiting.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._done.wait(0.05):  # short waits keep Ctrl-C / kernel interrupts prompt
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the run is still going after {timeout} s ({self.status_text})")
            if self.dashboard is not None:
                self.dashboard.join()
        except KeyboardInterrupt:
            self.stop()
            self._done.wait()
            if self.dashboard is not None:
                self.dashboard.join()
            raise
        if self.error is not None:
            raise self.error
        return self

    # ---- results (any thread) ---------------------------------------------------------------------------
    @property
    def run(self) -> Run:
        """The ``Run`` so far (a new one whenever records or events have arrived), the whole run once over."""
        final = self._final
        return final if final is not None else self._so_far.run()

    @property
    def outputs(self) -> list[RequestOutput]:
        """One ``RequestOutput`` per submitted request, in workload order (partial while running)."""
        engine = self.engine
        return [engine.output(r) for r in list(self._requests)] if engine is not None else []

    @property
    def step(self) -> int:
        """Steps done so far."""
        return self._so_far.num_steps

    # ---- what a Run has, read from ``run`` (see ``kvscope.runs.run.Run``) ----
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
    def t0_ns(self) -> int:
        return self.run.t0_ns

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
        """The HTML report of the run so far, with the prompt and output texts (``Run.save_html``)."""
        run = self.run
        if "texts" not in run.meta and self.engine is not None:  # still going: the texts so far
            run = Run(run.records, run.events, {**run.meta, "texts": self._texts(self.engine)})
        return run.save_html(path)

    def save_outputs(self) -> dict[str, Path]:
        """Write the files named in ``files`` now; returns those written (errors in ``files.errors``)."""
        writers = {"trace": self.save_trace, "metrics": self.save_metrics, "html": self.save_html}
        for kind, path in self.files.wanted().items():
            try:
                self.files.written[kind] = writers[kind](path)
                self.files.errors.pop(kind, None)
            except Exception as exc:
                self.files.errors[kind] = f"{type(exc).__name__}: {exc}"
        return dict(self.files.written)

    # ---- the engine thread ---------------------------------------------------------------------------
    def _collect(self, item: StepRecord | RequestEvent) -> None:
        """Recorder subscriber (engine thread): keep the item, hand it to the dashboard."""
        self._so_far.add(item)
        if self.dashboard is not None:
            self.dashboard.feed.push(item)

    def _build_engine(self) -> Engine:
        self.status = RunStatus.LOADING
        engine = self._make_engine if isinstance(self._make_engine, Engine) else self._make_engine()
        if engine.recorder is None:
            raise ValueError("a live run needs an engine with telemetry=True")
        claim_engine(engine, self)
        engine.recorder.clear()
        self.meta.update(engine.run_metadata())
        self.meta["t0_ns"] = time.perf_counter_ns()
        self._so_far = RunBuffer(self.meta, engine.recorder.capacity)  # the recorder's own bounds
        return engine

    def _main(self) -> None:
        engine = None
        unsubscribe = None
        profiler = None
        try:
            engine = self.engine = self._build_engine()
            if callable(self._workload):
                self.workload = list(self._workload(engine))
            unsubscribe = engine.recorder.subscribe(self._collect)
            self._submit(engine)
            profiler = self._start_profiler(engine)
            self.status = RunStatus.RUNNING
            self._loop(engine)
            self.status = RunStatus.STOPPED if self._stop.is_set() else RunStatus.FINISHED
        except BaseException as exc:  # reported by wait() and on the dashboard
            self.error, self.status = exc, RunStatus.FAILED
        finally:
            try:
                if engine is not None:
                    self._abort_own(engine)  # the last "finished" events, and a record of the freed pages
                    self._finish(engine, profiler, unsubscribe)
            except BaseException as exc:  # never leave wait() hanging
                if self.error is None:
                    self.error, self.status = exc, RunStatus.FAILED
            finally:
                release_engines(self)
                self._done.set()

    def _submit(self, engine: Engine) -> None:
        """Add the workload. A prompt the engine refuses (empty, too long, outside the vocabulary)
        fails alone, as a request finished with status ``error`` naming it; the others run."""
        for i, item in enumerate(self.workload):
            try:
                request = engine.make_request(item.prompt, item.params)
            except (TypeError, ValueError) as exc:
                where = item.source or f"request {i + 1} of {len(self.workload)}"
                self._requests.append(engine.reject(item.prompt, item.params, f"{where}: {exc}"))
                continue
            self._requests.append(request)
            engine.add_request(request)

    def _abort_own(self, engine: Engine) -> None:
        """Abort this run's unfinished requests (not those another thread added to the same engine)
        and record the state that leaves."""
        for request in self._requests:
            if not request.is_finished:
                engine.abort(request.request_id)
        engine.record_state()

    def _loop(self, engine: Engine) -> None:
        while engine.has_unfinished_requests() and not self._stop.is_set():
            if not self._running.is_set():
                self.status = RunStatus.PAUSED
                self._running.wait()
                self.status = RunStatus.RUNNING
                continue
            engine.step()
            if self.step_delay:
                self._stop.wait(self.step_delay)

    def _start_profiler(self, engine: Engine) -> ExitStack:
        """The profiling window (``engine.profile``, a context manager) as an ``ExitStack`` to close."""
        stack = ExitStack()
        if self.profile_steps:
            stack.enter_context(engine.profile(num_steps=self.profile_steps))  # after one warm-up step
        return stack

    def _finish(self, engine: Engine, profiler, unsubscribe) -> None:
        """Engine thread, last: stop profiling, adopt the recorder's snapshot as the run, write the files."""
        if profiler is not None:
            try:
                profiler.close()
            except Exception as exc:
                self.files.errors["profile"] = f"{type(exc).__name__}: {exc}"
        if unsubscribe is not None:
            unsubscribe()
        records, events, meta, profiler_events = engine.recorder.snapshot()
        meta["t0_ns"] = self.meta.get("t0_ns", meta["t0_ns"])
        meta["texts"] = self._texts(engine)
        self.meta.update(meta)
        self._final = Run(records, events, self.meta, profiler_events)
        if self.files.wanted():
            self.writing_files = True
            try:
                self.save_outputs()
            finally:
                self.writing_files = False

    def _texts(self, engine: Engine) -> dict[str, dict[str, str | None]]:
        """Prompt and output text per request, kept in ``meta`` so saved runs (and reports) have it."""
        from kvscope.widgets.panels.requests_table import MAX_TEXT

        texts = {}
        for request in list(self._requests):
            output = engine.decode(list(request.output_token_ids))
            texts[request.request_id] = {"prompt": request.prompt and request.prompt[:MAX_TEXT],
                                         "output": output[:MAX_TEXT]}
        return texts

    # ---- display -----------------------------------------------------------------------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        if self.dashboard is None or self.dashboard.headless:
            return {"text/plain": repr(self)}
        return self.dashboard._repr_mimebundle_(include=include, exclude=exclude)

    def show(self) -> None:
        from IPython.display import display

        display(self)

    def __repr__(self) -> str:
        return (f"<LiveRun {self.meta.get('model', '?')}: {self.status_text}, {self.step} steps, "
                f"{len(self.workload)} requests>")
