"""torch.profiler over a window of engine steps, summarised per step by kernel category.

```python
with engine.profile(num_steps=4, wait=0, warmup=1) as prof:   # or prof = engine.profile(...) ... prof.stop()
    engine.generate(prompts, params)
prof.summaries            # {step: {"attention": ns, "matmul": ns, "store_kv": ns, "sampling": ns, "other": ns,
                          #         "total": ns}}
engine.recorder.steps     # the profiled records carry the same dict in ``.profile``
```

The window follows ``torch.profiler.schedule(wait, warmup, active=num_steps, repeat=1)`` with one
profiler step per engine step: ``wait`` steps ignored, ``warmup`` steps traced and thrown away, then
``num_steps`` steps recorded. When the window closes the profiler detaches itself; the engine's step
loop is back to its no-op phase marks.

The profiler sees no engine. It gets the recorder (summaries go onto its records), a hook that routes
the step's phase marks to it (``set_phase_marks(marks)`` / ``set_phase_marks(None)``: it is then called
as ``begin(phase)`` and ``end(step)``, see ``phase_marks.PhaseMarks``), and optionally a hook that wraps the
attention backend's calls (``wrap_backend(wrap)`` calls ``wrap(kind, fn)`` for each call it routes,
``kind`` being ``"store_kv"`` or ``"paged_attention"``, and returns the function that undoes it).
``Engine.profile`` passes its own. While capturing, the phases run inside
``record_function("kvscope.<phase>")`` ranges, and the attention kernels inside ``kvscope.store_kv`` /
``kvscope.paged_attention``; ``kernel_time.py`` sorts the ops by category and sums them per step.

Kineto stamps events in Unix-epoch nanoseconds (``ts`` microseconds after ``baseTimeNanoseconds`` in
its JSON); ours are ``perf_counter_ns``. The offset is measured from the phase ranges themselves
(Kineto's start of each ``kvscope.*`` range minus our clock read just before entering it; median),
falling back to ``time_ns() - perf_counter_ns()`` read at start.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

from kvscope.telemetry.kernel_time import time_by_category
from kvscope.telemetry.phase_marks import NULL_MARKS, NullMarks, PhaseMarks
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import StepRecord

__all__ = ["NULL_MARKS", "NullMarks", "Profiler"]

Wrap = Callable[[str, Callable], Callable]  # (kind, backend function) -> the function to call instead

class Profiler:
    """One profiling window over the next engine steps (see the module doc)."""

    def __init__(
        self,
        recorder: Recorder,
        set_phase_marks: Callable[[PhaseMarks | None], None],
        wrap_backend: Callable[[Wrap], Callable[[], None]] | None = None,
        *,
        cuda: bool = False,
        num_steps: int = 3,
        wait: int = 0,
        warmup: int = 1,
        record_shapes: bool = False,
        with_stack: bool = False,
        keep_trace: bool = True,
    ) -> None:
        if num_steps < 1 or wait < 0 or warmup < 0:
            raise ValueError(f"num_steps={num_steps} must be >= 1 and wait={wait}, warmup={warmup} >= 0")
        self.recorder = recorder
        self._set_marks, self._wrap_backend = set_phase_marks, wrap_backend
        self.num_steps, self.wait, self.warmup = num_steps, wait, warmup
        self.keep_trace = keep_trace
        self.cuda = cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with warnings.catch_warnings():  # warmup=0 (a slow-step capture's window) is chosen, not an oversight
            warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
            steps = schedule(wait=wait, warmup=warmup, active=num_steps, repeat=1)
        self.prof = profile(
            activities=activities,
            record_shapes=record_shapes,
            with_stack=with_stack,
            schedule=steps,
            on_trace_ready=self._ready,
        )
        self.summaries: dict[int, dict[str, int]] = {}
        self.trace_events: list[dict[str, Any]] = []  # Kineto events, ts in perf_counter microseconds
        self.clock_offset_ns: int | None = None  # Kineto clock - perf_counter_ns
        self.running = self.done = False
        self._step_map: list[tuple[int, int]] = []  # (profiler step_num, engine step) per engine step
        self._marks: list[tuple[int, str, int]] = []  # (profiler step_num, range name, perf_counter_ns)
        self._open: record_function | None = None
        self._unsubscribe = None
        self._unwrap: Callable[[], None] | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Profiler:
        """Open the window: the next step is the profiler's first. ``RuntimeError`` if the source's
        phase marks already go to another window."""
        self._set_marks(self)  # raises if another window is open
        self._fallback_offset = time.time_ns() - time.perf_counter_ns()
        try:
            if self._wrap_backend is not None:
                self._unwrap = self._wrap_backend(_ranged)
            self._unsubscribe = self.recorder.subscribe(self._on_record)
            self.prof.start()
        except BaseException:
            self._restore()
            self._detach()
            raise
        self.running = True
        return self

    def stop(self) -> None:
        """Close the window now (what the active steps recorded so far is kept) and stop listening
        to the recorder."""
        self._close()
        self._detach()

    def _close(self) -> None:
        if not self.running:
            return
        self._close_range()
        self.running = False
        self._restore()
        self.prof.stop()  # calls _ready if the window had started recording
        self.done = True

    def _restore(self) -> None:
        """Give the source back its phase marks and its backend."""
        self._set_marks(None)
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None

    def __enter__(self) -> Profiler:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    # ---- phase marks (called by the source's step) --------------------------------------------------
    def begin(self, phase: str) -> None:
        self._close_range()
        name = "kvscope." + phase
        self._marks.append((self.prof.step_num, name, time.perf_counter_ns()))
        self._open = record_function(name)
        self._open.__enter__()

    def end(self, step: int) -> None:
        """Step ``step`` is over: one profiler step."""
        self._close_range()
        self._step_map.append((self.prof.step_num, step))
        self.prof.step()
        if self.prof.step_num >= self.wait + self.warmup + self.num_steps:
            self._close()  # this step's record is published next; _on_record then detaches

    def _close_range(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None

    # ---- results ---------------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        """The engine steps the window recorded so far (its active steps, not the wait / warm-up ones)."""
        return self._active_steps()

    def _active_steps(self) -> list[int]:
        first = self.wait + self.warmup
        return [step for num, step in self._step_map if first <= num < first + self.num_steps]

    def _ready(self, prof: profile) -> None:
        steps = self._active_steps()
        per_step = time_by_category(prof, steps, self.cuda)
        self.summaries.update(per_step)
        for step, summary in per_step.items():
            _attach(self.recorder, step, summary)
        if self.keep_trace:
            self.trace_events = self._kineto_events(prof)
            self.recorder.profiler_events.extend(self.trace_events)

    def _on_record(self, item: Any) -> None:
        """Attach a summary to a record published after the window closed (the last profiled step's,
        the first record after closing), then stop listening."""
        if not isinstance(item, StepRecord):
            return
        if item.step in self.summaries and item.profile is None:
            item.profile = self.summaries[item.step]
        if self.done:
            self._detach()

    def _kineto_events(self, prof: profile) -> list[dict[str, Any]]:
        """Kineto's Chrome-trace events with ``ts`` moved to perf_counter microseconds."""
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
        base = int(trace.get("baseTimeNanoseconds", 0))
        events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
        self.clock_offset_ns = self._measure_offset(events, base)
        shift_us = (base - self.clock_offset_ns) / 1000
        return [
            {**e, "ts": e["ts"] + shift_us} if isinstance(e.get("ts"), (int, float)) else e for e in events
        ]

    def _measure_offset(self, events: list[dict[str, Any]], base: int) -> int:
        first = self.wait + self.warmup
        ours: dict[str, list[int]] = {}
        for num, name, t in self._marks:
            if first <= num < first + self.num_steps:
                ours.setdefault(name, []).append(t)
        theirs: dict[str, list[int]] = {}
        for e in events:
            if (
                e.get("ph") == "X"
                and e.get("name", "").startswith("kvscope.")
                and e.get("cat") == "user_annotation"
            ):
                theirs.setdefault(e["name"], []).append(round(e["ts"] * 1000) + base)
        diffs = [
            k - o
            for name, ts in theirs.items()
            if len(ts) == len(ours.get(name, ()))
            for k, o in zip(sorted(ts), ours[name])
        ]
        return int(statistics.median(diffs)) if diffs else self._fallback_offset


def _ranged(kind: str, fn: Callable) -> Callable:
    """``fn`` inside a ``kvscope.<kind>`` range."""
    name = "kvscope." + kind

    def wrapped(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapped


def _attach(recorder: Recorder, step: int, summary: dict[str, int]) -> None:
    """Set ``profile`` on the record of ``step`` (if the ring still has it)."""
    for record in reversed(recorder.steps):
        if record.step == step:
            record.profile = summary
            return
        if record.step < step:
            return
