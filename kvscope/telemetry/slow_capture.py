"""``--capture-slow N``: a torch.profiler window over the next N steps whenever a step is slow.

``SlowCapture`` subscribes to the recorder. Each step record is judged by the run's own online step model
(``step_baseline.OnlineStepModel`` and its ``SlowRule``: at least 2x the prediction and 1 ms over it, after a
warm-up of 16 steps; O(1) per step). A slow step opens a window (``open_window()``, a started
``profiler.Profiler`` over the next ``num_steps`` steps, no warm-up) unless ``max_windows`` have opened already
or a window (this one's or an on-demand ``--profile``) is open. The windows' Kineto events go into the
recorder's ``profiler_events`` like any window's, so the run's trace holds their kernels; ``describe()`` is what
the run keeps in ``meta["capture_slow"]``: the rule, the slow steps, and each window's trigger and steps.

While nothing is slow the cost per step is one ``isinstance``, one model update and one comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import StepRecord
from kvscope.telemetry.step_baseline import OnlineStepModel, SlowRule

MAX_WINDOWS = 4  # windows per run unless told otherwise
MAX_LISTED = 256  # slow steps listed in the meta (all are counted)


@dataclass(slots=True)
class CaptureWindow:
    """One window the capture opened: the slow step that opened it and the steps it profiled."""

    index: int
    trigger_step: int
    first_step: int
    last_step: int  # planned until the window closes, then the last step it profiled
    duration_ms: float  # the trigger step's
    expected_ms: float


class SlowCapture:
    """Opens a profiling window after each slow step, at most ``max_windows`` times (see the module doc).
    ``open_window()`` returns a started window (``stop()``, ``running``, ``steps``) or raises ``RuntimeError``
    when the source's phase marks are taken; ``busy()`` says whether another window is open."""

    def __init__(self, recorder: Recorder, open_window: Callable[[], Any], num_steps: int,
                 max_windows: int = MAX_WINDOWS, rule: SlowRule | None = None,
                 busy: Callable[[], bool] = lambda: False) -> None:
        if num_steps < 1 or max_windows < 1:
            raise ValueError(f"capture-slow needs num_steps={num_steps} >= 1 and max_windows={max_windows} >= 1")
        self.recorder, self.num_steps, self.max_windows = recorder, num_steps, max_windows
        self.model = OnlineStepModel(rule or SlowRule())
        self._open_window, self._busy = open_window, busy
        self.windows: list[CaptureWindow] = []
        self.slow: list[dict[str, Any]] = []  # the first MAX_LISTED slow steps
        self.num_slow = self.num_skipped = 0
        self.error: str | None = None  # why a window could not open (then no more are tried)
        self._window: Any = None
        self._window_end = -1  # steps up to here are in (or planned for) the last window: not judged
        self._unsubscribe: Callable[[], None] | None = None
        self.on_change: Callable[[], None] | None = None  # called after a slow step and after a window closes

    def start(self) -> SlowCapture:
        self._unsubscribe = self.recorder.subscribe(self._on_record)
        return self

    def stop(self) -> None:
        """Stop judging and close a window still open (what it profiled so far is kept)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._close()

    def __enter__(self) -> SlowCapture:
        return self if self._unsubscribe is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_record(self, item: Any) -> None:
        if not isinstance(item, StepRecord):
            return
        if item.step <= self._window_end:  # profiled: slower by the profiler's own cost, neither judged nor learnt
            if item.step == self._window_end:
                self._close()
            return
        expected, slow = self.model.observe(item, learn=not self._busy())
        if slow and expected is not None:  # a slow step always has its expected time
            self._slow(item, expected)

    def _slow(self, record: StepRecord, expected: float) -> None:
        self.num_slow += 1
        duration = (record.t_end_ns - record.t_start_ns) / 1e9
        window = None
        if len(self.windows) < self.max_windows and self.error is None and not self._busy():
            window = self._open(record, duration, expected)
        if window is None:
            self.num_skipped += 1
        if len(self.slow) < MAX_LISTED:
            self.slow.append({"step": record.step, "duration_ms": duration * 1e3, "expected_ms": expected * 1e3,
                              "window": window})
        if self.on_change is not None:
            self.on_change()

    def _open(self, record: StepRecord, duration: float, expected: float) -> int | None:
        try:
            self._window = self._open_window()
        except RuntimeError:  # another window took the phase marks meanwhile
            return None
        except Exception as exc:  # the profiler cannot start here: say so once, open no more windows
            self.error = f"{type(exc).__name__}: {exc}"
            return None
        index = len(self.windows)
        self._window_end = record.step + self.num_steps
        self.windows.append(CaptureWindow(index, record.step, record.step + 1, self._window_end,
                                          duration * 1e3, expected * 1e3))
        return index

    def _close(self) -> None:
        window, self._window = self._window, None
        if window is None:
            return
        window.stop()
        steps = list(getattr(window, "steps", ()) or ())
        if steps:  # what it profiled (fewer than planned when the run ended first)
            self.windows[-1].first_step, self.windows[-1].last_step = min(steps), max(steps)
        if self.on_change is not None:
            self.on_change()

    def describe(self, trace: str | None = None) -> dict[str, Any]:
        """``meta["capture_slow"]``: the settings, the rule, the slow steps and the windows (``trace``: the file
        whose ``profiler`` events hold the windows' kernels)."""
        return {
            "num_steps": self.num_steps,
            "max_windows": self.max_windows,
            "rule": self.model.rule.describe(),
            "num_slow": self.num_slow,
            "num_triggered": len(self.windows),
            "num_skipped": self.num_skipped,
            "windows": [asdict(w) for w in self.windows],
            "slow_steps": list(self.slow),
            "trace": trace,
            "error": self.error,
        }
