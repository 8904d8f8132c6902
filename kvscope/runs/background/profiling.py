"""A live run's profiling windows, opened when its steps start and closed at its end: ``profile_steps``
(``engine.profile``: torch.profiler over the next steps, after one warm-up step) and ``capture_slow``
(``engine.capture_slow``: a window whenever a step is slow against the run's own step model)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kvscope.engine.protocols import EngineClient
from kvscope.telemetry.slow_capture import SlowCapture


def open_windows(engine: EngineClient, profile_steps: int, capture_slow: tuple[int, int] | None,
                 meta: dict[str, Any], trace: Path | None) -> tuple[ExitStack, SlowCapture | None]:
    """The windows as an ``ExitStack`` to close at the end, and the slow-step capture if any: what it found is
    ``meta["capture_slow"]``, replaced whenever that changes (the dashboard reads it), naming ``trace`` as the
    file its windows' kernels will be in."""
    stack = ExitStack()
    if profile_steps:
        stack.enter_context(engine.profile(num_steps=profile_steps))
    if not capture_slow:
        return stack, None
    capture = stack.enter_context(engine.capture_slow(*capture_slow))
    where = str(trace) if trace else None

    def describe() -> None:  # one dict replaced at a time
        meta["capture_slow"] = capture.describe(where)

    capture.on_change = describe
    describe()
    return stack, capture
