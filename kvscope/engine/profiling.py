"""``profile`` and ``set_phase_marks``: torch.profiler windows over the engine's steps (a mixin of
``Engine``, like ``generate.py``; it uses the engine's lock, recorder, runner, device and phase marks)."""

from __future__ import annotations

from functools import partial

from kvscope.engine.source import wrap_backend
from kvscope.telemetry.phase_marks import NULL_MARKS, PhaseMarks


class ProfilingMixin:
    def set_phase_marks(self, marks: PhaseMarks | None) -> None:
        """Report each step's phases to ``marks`` (``begin(phase)``, ``end(step)``), or to nobody
        with ``None``. One observer at a time: ``RuntimeError`` while another has them."""
        with self._lock:
            if marks is not None and self.phase_marks is not NULL_MARKS:
                raise RuntimeError("a profiling window is already open on this engine")
            self.phase_marks = marks if marks is not None else NULL_MARKS

    def profile(self, num_steps: int = 3, wait: int = 0, warmup: int = 1, **kwargs):
        """Capture the next steps with torch.profiler: a started ``telemetry.profiler.Profiler``
        (also a context manager); per-step kernel time by category lands in ``StepRecord.profile``."""
        from kvscope.telemetry.profiler import Profiler

        with self._lock:
            if self.recorder is None:
                raise ValueError(
                    "profiling attaches its summaries to step records: create the engine with telemetry=True"
                )
            return Profiler(self.recorder, self.set_phase_marks, partial(wrap_backend, self.runner),
                            cuda=self.device.type == "cuda", num_steps=num_steps, wait=wait, warmup=warmup,
                            **kwargs).start()

    def capture_slow(self, num_steps: int, max_windows: int | None = None, *, ratio: float | None = None,
                     min_excess_s: float | None = None, warmup_steps: int | None = None):
        """Whenever a step is slow against the run's own step model, capture the next ``num_steps`` steps with
        torch.profiler, at most ``max_windows`` times (default 4): a started
        ``telemetry.slow_capture.SlowCapture`` (also a context manager; ``stop()`` ends it, ``describe()`` says
        what it caught). ``ratio`` / ``min_excess_s`` / ``warmup_steps``: the slow-step rule
        (``telemetry.step_baseline.SlowRule``; default 2x and 1 ms over, after 16 steps)."""
        from kvscope.telemetry.slow_capture import MAX_WINDOWS, SlowCapture
        from kvscope.telemetry.step_baseline import SlowRule

        given = {k: v for k, v in (("ratio", ratio), ("min_excess_s", min_excess_s),
                                   ("warmup_steps", warmup_steps)) if v is not None}
        rule = SlowRule(**given)
        with self._lock:
            if self.recorder is None:
                raise ValueError("capturing slow steps reads step records: create the engine with telemetry=True")
            return SlowCapture(self.recorder, partial(self.profile, num_steps=num_steps, wait=0, warmup=0),
                               num_steps, MAX_WINDOWS if max_windows is None else max_windows, rule,
                               busy=lambda: self.phase_marks is not NULL_MARKS).start()
