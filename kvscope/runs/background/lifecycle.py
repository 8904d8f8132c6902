"""``Lifecycle``: what every run that fills in on a background thread shares (``LiveRun``, ``WatchRun``,
``Sweep``; the next ones too): start / stop / pause / resume, ``wait``, the status in words, the files
at the end and the notebook display.

Threads: one **worker thread** (``kvscope-<noun>``) does the run's work (``_body``), then winds it
down (``_wind_down``: the last records, the files, letting go of what it held) and sets ``done``; it
is the only writer of ``status``. The **caller** only sets flags (``stop``, ``pause``, ``resume``) and reads
results; ``wait`` blocks it until the run is over. A ``KeyboardInterrupt`` during ``wait`` (Ctrl-C, Jupyter's
"interrupt kernel") stops the run, waits for it to wind down (files included), and propagates. A live view
(``dashboard``), when there is one, runs on its own thread and is started and joined with the run.

A subclass gives ``noun`` (for messages and the thread's name), ``_body`` (returns when the work is
done or ``stop()`` was called; ``_stop`` / ``_running`` are the flags to honour), ``_file_writers``
(kind -> writer of the files named in ``files``) and, for more than the files, ``_wind_down``.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from kvscope.runs.background.status import RunStatus, status_text

L = TypeVar("L", bound="Lifecycle")


class Files(Protocol):
    """Files to write at the end (``status.Outputs``, ``status.SweepOutputs``)."""

    written: dict[str, Path]  # kind -> path, once written
    errors: dict[str, str]  # kind -> why it could not be written

    def wanted(self) -> dict[str, Path]: ...


class Lifecycle(ABC):
    """A run on a worker thread: ``start()``; then ``wait()``, ``stop()``, ``pause()`` / ``resume()``,
    ``status`` / ``status_text``, ``done``; ``files`` written at the end (or now: ``save_outputs()``)."""

    noun: ClassVar[str] = "run"  # "the run is still going", "this run was already started", "kvscope-run"

    def __init__(self, files: Files) -> None:
        self.files = files
        self.status = RunStatus.STARTING
        self.error: BaseException | None = None  # what ended the run, if it failed
        self.writing_files = False  # the files are being written (the run itself is over)
        self.dashboard: Any = None  # the live view, if any (``kvscope.widgets.dashboard.Dashboard``)
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the hooks -------------------------------------------------------------------------------------
    @abstractmethod
    def _body(self) -> None:
        """The worker thread's work; returns when it is done or ``_stop`` is set (an exception fails the run)."""

    def _wind_down(self) -> None:
        """Worker thread, after ``_body`` (even a failed one): the last records, the files, letting go.
        By default: the files."""
        self._write_files()

    @abstractmethod
    def _file_writers(self) -> dict[str, Callable[[Path], Path]]:
        """Kind -> the function writing that file at the given path (see ``files``)."""

    # ---- control (any thread) --------------------------------------------------------------------------
    def start(self: L) -> L:
        """Start the worker thread (and the live view's); returns ``self`` at once. ``RuntimeError`` if
        this run was started before."""
        if self._thread is not None:
            raise RuntimeError(f"this {self.noun} was already started")
        self._thread = threading.Thread(target=self._main, name=f"kvscope-{self.noun}", daemon=True)
        self._thread.start()
        if self.dashboard is not None:
            self.dashboard.start(self._done.is_set)
        return self

    def stop(self) -> None:
        """End the run at its next boundary (a step, a poll); the files are still written."""
        self._stop.set()
        self._running.set()

    def pause(self) -> None:
        """Hold the run at its next boundary until ``resume()`` (or ``stop()``)."""
        if not self.done:
            self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def close(self) -> None:
        """Stop the run if it is going, wait for it to wind down, and close the live view's widgets (they
        leave the notebook's output). The results stay readable."""
        if self._thread is not None and not self.done:
            self.stop()
            self._done.wait()
        if self.dashboard is not None:
            self.dashboard.close()

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

    def wait(self: L, timeout: float | None = None) -> L:
        """Block until the run (and its live view's last update) is over; returns ``self``.

        Raises ``TimeoutError`` after ``timeout`` seconds, the run's own exception if it failed, and
        ``KeyboardInterrupt`` (after stopping the run and letting it write its files) if interrupted.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._done.wait(0.05):  # short waits keep Ctrl-C / kernel interrupts prompt
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the {self.noun} is still going after {timeout} s ({self._progress()})")
            self._join_view()
        except KeyboardInterrupt:
            self.stop()
            self._done.wait()
            self._join_view()
            raise
        if self.error is not None:
            raise self.error
        return self

    def _progress(self) -> str:
        """Where the run is, for ``wait``'s ``TimeoutError``."""
        return self.status_text

    def _join_view(self) -> None:
        if self.dashboard is not None:
            self.dashboard.join()

    # ---- files at the end --------------------------------------------------------------------------
    def save_outputs(self) -> dict[str, Path]:
        """Write the files named in ``files`` now; returns those written (errors in ``files.errors``)."""
        writers = self._file_writers()
        for kind, path in self.files.wanted().items():
            try:
                self.files.written[kind] = writers[kind](path)
                self.files.errors.pop(kind, None)
            except Exception as exc:
                self.files.errors[kind] = f"{type(exc).__name__}: {exc}"
        return dict(self.files.written)

    def _write_files(self) -> None:
        """The files, if any are wanted, with ``writing_files`` set meanwhile."""
        if not self.files.wanted():
            return
        self.writing_files = True
        try:
            self.save_outputs()
        finally:
            self.writing_files = False

    # ---- the worker thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._body()
            self.status = RunStatus.STOPPED if self._stop.is_set() else RunStatus.FINISHED
        except BaseException as exc:  # reported by wait() and on the live view
            self.error, self.status = exc, RunStatus.FAILED
        finally:
            try:
                self._wind_down()
            except BaseException as exc:  # never leave wait() hanging
                if self.error is None:
                    self.error, self.status = exc, RunStatus.FAILED
            finally:
                self._done.set()

    # ---- display -----------------------------------------------------------------------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict | None:
        if self.dashboard is None or self.dashboard.headless:
            return {"text/plain": repr(self)}
        return self.dashboard._repr_mimebundle_(include=include, exclude=exclude)

    def show(self) -> None:
        from IPython.display import display

        display(self)

    def _describe(self) -> str:
        """What ``repr`` says after the class name."""
        return self.status_text

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._describe()}>"
