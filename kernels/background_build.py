"""The CPU kernel's build, off the run's path: a run starts on the torch kernel while it builds.

A cold build of ``cpu_paged``'s C++ kernel takes 30-60 s; a run must not wait for it (its first token
would). ``resolve_backend("auto", "cpu")`` therefore takes the C++ kernel at once only where it is built
already (``cpu_paged.ready``); else it returns the torch kernels with ``pending`` set to the process's
``BackgroundBuild``, and the ``ModelRunner`` swaps in the C++ kernel at the first step boundary after the
build succeeds (``ModelRunner.prepare``). Both kernels give the same tokens (``tests/kernels``).

The build runs on a daemon thread; almost all of it is the compiler and ninja in a subprocess, which the
thread waits on without the GIL, so the engine's thread keeps stepping. A failed build is one warning
(``cpu_paged.load`` logs it) and the run stays on torch. One build per process: every engine made while it
runs shares it (``cpu_kernel_build``); across processes the build folder's lock (``cpu_build.py``) applies.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


EXIT_WAIT_S = 300.0  # the longest a process waits at exit for a build it started


class BackgroundBuild:
    """``build()`` (True: the kernel is loaded and usable) on a daemon thread; ``poll`` says how it went."""

    def __init__(self, build: Callable[[], bool], name: str = "cpu") -> None:
        self.name = name  # the backend the build makes available
        self.seconds: float | None = None  # how long the build took, once done
        self._result: bool | None = None
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(build,), name=f"kvscope-build-{name}", daemon=True)
        self._thread.start()
        atexit.register(self._finish_at_exit)

    def _finish_at_exit(self) -> None:
        """A process that ends while the build runs (a short ``kvscope demo``) waits for it, up to
        ``EXIT_WAIT_S``: cut off, the compiler would be left behind holding the build folder's lock, and every
        later run would start the build again and never finish it. Ctrl-C skips the wait."""
        if self._result is not None:
            return
        print(f"kvscope: finishing the {self.name} kernel's build ({time.monotonic() - self._start:.0f} s so far) so "
              "that the next run starts on it; Ctrl-C skips", file=sys.stderr, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            self._thread.join(EXIT_WAIT_S)

    def _run(self, build: Callable[[], bool]) -> None:
        try:
            ok = bool(build())
        except Exception as exc:  # the builder's own failure: the run keeps the torch kernel
            log.warning("kvscope: building the %s kernel failed (%s); staying on the torch kernel", self.name, exc)
            ok = False
        self.seconds = time.monotonic() - self._start
        self._result = ok  # set last: a reader that sees it also sees ``seconds``

    def poll(self) -> bool | None:
        """None while building; True once built and loaded; False if it failed."""
        return self._result

    def wait(self, timeout: float | None = None) -> bool | None:
        """Block up to ``timeout`` seconds for the build (tests, ``kvscope`` commands that prefer to wait)."""
        self._thread.join(timeout)
        return self._result


_lock = threading.Lock()
_current: BackgroundBuild | None = None
_builder: Callable[[], bool] | None = None  # None: cpu_paged.load (tests inject a slow or failing one)


def set_builder(builder: Callable[[], bool] | None) -> None:
    """Use ``builder`` for the next background build (None: the real one) and forget a finished build."""
    global _builder, _current
    with _lock:
        _builder = builder
        if _current is not None and _current.poll() is not None:
            _current = None


def cpu_kernel_build() -> BackgroundBuild:
    """The process's background build of the CPU kernel, started on first call (later calls share it)."""
    global _current
    with _lock:
        if _current is None:
            if _builder is None:
                from . import cpu_paged

                _current = BackgroundBuild(cpu_paged.load)
            else:
                _current = BackgroundBuild(_builder)
        return _current
