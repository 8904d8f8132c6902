"""``profile`` and ``set_phase_marks``: torch.profiler windows over the engine's steps (a mixin of
``Engine``, like ``generate.py``; it uses the engine's lock, recorder, runner, device and phase marks)."""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from kvscope.engine.protocols import Worker
from kvscope.engine.source import wrap_backend
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.telemetry.phase_marks import NULL_MARKS, PhaseMarks
from kvscope.telemetry.recorder import Recorder

if TYPE_CHECKING:
    from kvscope.telemetry.profiler import Profiler
    from kvscope.telemetry.slow_capture import SlowCapture


class ProfilingMixin:
    # What the mixin uses of ``Engine``, declared for the type checker (``Engine`` sets each in ``_adopt``).
    _lock: threading.RLock
    phase_marks: PhaseMarks
    recorder: Recorder | None
    runner: Worker[Any, Any]
    device: torch.device | None

    def set_phase_marks(self, marks: PhaseMarks | None) -> None:
        """Report each step's phases to ``marks`` (``begin(phase)``, ``end(step)``), or to nobody
        with ``None``. One observer at a time: ``RuntimeError`` while another has them."""
        with self._lock:
            if marks is not None and self.phase_marks is not NULL_MARKS:
                raise RuntimeError("a profiling window is already open on this engine")
            self.phase_marks = marks if marks is not None else NULL_MARKS

    def profile(self, num_steps: int = 3, wait: int = 0, warmup: int = 1, **kwargs: Any) -> Profiler:
        """Capture the next steps with torch.profiler: a started ``telemetry.profiler.Profiler``
        (also a context manager); per-step kernel time by category lands in ``StepRecord.profile``."""
        from kvscope.telemetry.profiler import Profiler

        with self._lock:
            if self.recorder is None:
                raise ValueError(
                    "profiling attaches its summaries to step records: create the engine with telemetry=True"
                )
            runner = self.runner
            if not isinstance(runner, ModelRunner) or self.device is None:
                raise ValueError("a simulated engine runs no kernels to profile")
            return Profiler(self.recorder, self.set_phase_marks, partial(wrap_backend, runner),
                            cuda=self.device.type == "cuda", num_steps=num_steps, wait=wait, warmup=warmup,
                            **kwargs).start()

    def capture_slow(self, num_steps: int, max_windows: int | None = None, *, ratio: float | None = None,
                     min_excess_s: float | None = None, warmup_steps: int | None = None) -> SlowCapture:
        """Whenever a step is slow against the run's own step model, capture the next ``num_steps`` steps with
        torch.profiler, at most ``max_windows`` times (default 4): a started
        ``telemetry.slow_capture.SlowCapture`` (also a context manager; ``stop()`` ends it, ``describe()`` says
        what it caught). ``ratio`` / ``min_excess_s`` / ``warmup_steps``: the slow-step rule
        (``telemetry.step_baseline.SlowRule``; default 2x and 1 ms over, after 16 steps)."""
        from kvscope.telemetry.slow_capture import MAX_WINDOWS, SlowCapture
        from kvscope.telemetry.step_baseline import SlowRule

        default = SlowRule()
        rule = SlowRule(default.ratio if ratio is None else ratio,
                        default.min_excess_s if min_excess_s is None else min_excess_s,
                        default.warmup_steps if warmup_steps is None else warmup_steps)
        with self._lock:
            if self.recorder is None:
                raise ValueError("capturing slow steps reads step records: create the engine with telemetry=True")
            return SlowCapture(self.recorder, partial(self.profile, num_steps=num_steps, wait=0, warmup=0),
                               num_steps, MAX_WINDOWS if max_windows is None else max_windows, rule,
                               busy=lambda: self.phase_marks is not NULL_MARKS).start()
