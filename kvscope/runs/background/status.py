"""A live run's small state, in the standard library only (the faces read it without importing the
engine): ``RunStatus``, the ``Outputs`` it writes at the end (a sweep's: ``SweepOutputs``; both set up before the
run, in ``kvscope.runs.setup.outputs``), ``status_text`` (the status in words), and which live run drives each
engine (``claim_engine`` / ``release_engines``)."""

from __future__ import annotations

import threading
import weakref
from enum import Enum
from typing import Any, Protocol

from kvscope.runs.setup.outputs import Outputs, SweepOutputs

__all__ = ["Outputs", "RunStatus", "SweepOutputs", "claim_engine", "release_engines", "status_text"]


class RunStatus(str, Enum):
    """Where a live run is. Details live beside it: ``LiveRun.error``, ``writing_files``, ``files.errors``."""

    STARTING = "starting"
    LOADING = "loading"  # building the engine (loading the model)
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"  # stop() ended it early
    FINISHED = "finished"  # every request ended
    FAILED = "failed"  # an exception ended it (``LiveRun.error``)

    def __str__(self) -> str:
        return self.value


def status_text(status: RunStatus, error: BaseException | None, writing_files: bool,
                file_errors: dict[str, str]) -> str:
    """``status`` in words with its details: "loading model", "failed: RuntimeError: boom",
    "finished · writing files", "stopped · could not write trace, html"."""
    text = "loading model" if status is RunStatus.LOADING else status.value
    if status is RunStatus.FAILED and error is not None:
        text += f": {type(error).__name__}: {error}"
    if writing_files:
        text += " · writing files"
    if file_errors:
        text += " · could not write " + ", ".join(file_errors)
    return text


class _Driver(Protocol):
    @property
    def done(self) -> bool: ...


# The live run driving each engine (two threads stepping one engine would corrupt it), kept here rather
# than on the engine. Weak keys: an entry left behind goes with its engine.
_drivers: weakref.WeakKeyDictionary[Any, _Driver] = weakref.WeakKeyDictionary()
_drivers_lock = threading.Lock()


def claim_engine(engine: Any, run: _Driver) -> None:
    """Record ``run`` as the driver of ``engine``; ``RuntimeError`` if another run still drives it."""
    with _drivers_lock:
        owner = _drivers.get(engine)
        if owner is not None and owner is not run and not owner.done:
            raise RuntimeError(
                f"this engine is already running {owner!r}; wait for it (run.wait()) or stop it "
                "(run.stop()) first, or give the new run its own engine"
            )
        _drivers[engine] = run


def release_engines(run: _Driver) -> None:
    """Let go of every engine ``run`` drives (claimed by ``start`` or when it built its engine)."""
    with _drivers_lock:
        for engine in [e for e, owner in _drivers.items() if owner is run]:
            del _drivers[engine]
