"""A slow step on demand, for the slow-step tests (``--capture-slow``, its report panel): the engine's
``at``-th forward pass sleeps ``seconds`` first."""

from __future__ import annotations

import time
from typing import Any


def slow_once(engine: Any, at: int, seconds: float) -> Any:
    """``engine`` with its ``at``-th forward pass (counted from 1) made ``seconds`` slower; returns it."""
    forward, calls = engine.runner.forward, [0]

    def forward_once_slow(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            time.sleep(seconds)
        return forward(*args, **kwargs)

    engine.runner.forward = forward_once_slow
    return engine
