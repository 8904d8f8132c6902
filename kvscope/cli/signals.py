"""Stopping a terminal run by a signal: while ``stop_signals()`` holds, SIGTERM and SIGHUP raise ``StopSignal``
in the main thread (a ``KeyboardInterrupt``, as SIGINT raises), so ``kvscope run``, ``demo`` and ``watch`` stop
the same way for all three: the work winds down, the files are written, and the exit code is 128 + the
signal's number (130 SIGINT, 143 SIGTERM, 129 SIGHUP)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as SIGINT raises ``KeyboardInterrupt``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum: int, frame: Any) -> None:
    raise StopSignal(signum)


@contextmanager
def _handled(names: tuple[str, ...], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """While the block runs, ``handler`` takes the signals ``names`` (those this platform has); the previous
    handlers after. Only the main thread can set handlers: elsewhere nothing changes."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in names:
            if hasattr(signal, name):
                signum = getattr(signal, name)
                previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


@contextmanager
def stop_signals() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise ``StopSignal`` (Python's default for them is to die
    at once, writing nothing); the previous handlers after. Only the main thread can set handlers."""
    with _handled(("SIGTERM", "SIGHUP"), _raise_stop):
        yield


def signal_number(exc: KeyboardInterrupt) -> int:
    """The signal that stopped the work: ``StopSignal``'s, else SIGINT (Ctrl-C)."""
    return getattr(exc, "signum", signal.SIGINT)


def wait_until_done(run: Any) -> None:
    """Wait for a stopped run (or watch) to wind down and write its files. More SIGTERMs / SIGHUPs ask for
    what is happening anyway; a second Ctrl-C quits at once (the temp files are removed at exit)."""
    while not run.done:
        try:
            time.sleep(0.05)
        except StopSignal:
            continue


@contextmanager
def files_first(what: str) -> Iterator[None]:
    """While the block writes ``what`` after a stop, SIGINT, SIGTERM and SIGHUP only say so (the files of
    what finished are the point of stopping: another Ctrl-C must not lose them). Main thread only."""

    def say(signum: int, frame: Any) -> None:
        with suppress(OSError):
            print(f"kvscope: {signal.Signals(signum).name}: writing {what} first", file=sys.stderr, flush=True)

    with _handled(("SIGINT", "SIGTERM", "SIGHUP"), say):
        yield
