"""The engine's thread policy: how many intra-op threads torch uses, chosen from what the machine offers and
adjusted while the engine runs, for a CPU shared with other work (a notebook's browser, a server, tests).

Why: two OpenMP threads on two cores that another process also wants wait for each other at every parallel
region (the one descheduled holds up the step), and a spinning one takes the core the other needs. One busy
process on a 2-core machine took kvscope from 543 to ~170 tok/s at 2 threads, while 1 thread ran at 341.

At ``Engine()`` (``for_engine``): nothing changes when the user chose (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
``torch.set_num_threads`` before the engine, ``KVSCOPE_THREAD_POLICY=fixed``: ``kvscope.utils.threads``), on one
usable core, or off the CPU. Otherwise the policy is adaptive: it starts with as many threads as cores are free
(the usable cores less other processes' busy cores since the last reading, ``kvscope.utils.cpu_load``, or
the tasks runnable now when that reading is older than ``STALE_S``; at most torch's default), then judges the
steps window by window (``WINDOW_S`` of steps, at least ``MIN_WINDOW_STEPS``):

- Expected times come from a step-time line per thread count and phase (``PhaseLine``, the online step model's
  fit: intercept + slope x tokens computed), learnt from the steps run at that count.
- **Drop**: when other work holds some of the usable cores (``loaded``: fewer than the maximum free) and the
  window's steps took at least ``SLOW`` x their expected time at this count, go to the free cores (at least one
  fewer thread).
- **Probe** (an A/B test on live steps): after a while below the maximum (``probe_up_s``; soon when the machine
  is quiet) try one thread more, and while loaded try one fewer (``probe_down_s``), for one window; keep the new
  count if its steps took at most ``KEEP`` x what the old count's line predicts for them, else go back and wait
  twice as long before the next probe in that direction (up to ``MAX_PROBE_S``; reset when the load changes).

``torch.set_num_threads`` sets the count of the calling thread (OpenMP's is a per-thread setting, taken from
torch's global one by a thread's first parallel op): the count is set again on the thread that steps, at its first
step. Each decision costs a read of ``/proc/stat`` per window; a step costs a few float operations. The thread count
never changes the tokens: greedy outputs are the same at any count (``tests/engine/test_threads.py``).
``describe()`` is the run metadata's ``thread_policy``: the mode, why, the cores, the wait policy and every change
(step, seconds since the start, threads, reason; the first ``MAX_CHANGES``, then a count).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kvscope.telemetry.step_baseline import PhaseLine
from kvscope.utils import threads as settings
from kvscope.utils.cpu_load import LoadMeter, runnable_others, usable_cores

WINDOW_S = 0.5
MIN_WINDOW_STEPS = 8
MIN_SAMPLES = 6  # steps a line needs (at its phase) before it predicts
SLOW = 1.3  # a window this much slower than expected, on a loaded machine, drops threads at once
KEEP = 0.92  # a probed count is kept when its steps take at most this share of the old count's expected time
PROBE_S = 2.0  # the first wait before a probe; doubled after each failed one
QUIET_PROBE_S = 0.5  # the wait before probing up when the machine has become quiet
MAX_PROBE_S = 60.0
MAX_PROBE_WINDOWS = 4  # a probe whose steps the old line could not predict gives up after this many windows
LOADED_MARGIN = 0.25  # loaded: fewer than max_threads - margin cores free
MAX_CHANGES = 64
STALE_S = 3.0  # a load reading over a longer interval says little about now

_meter = LoadMeter()  # the process's reading between engines (the first engine reads since this import)


class ThreadPolicy:
    """The intra-op threads of one engine (see the module doc). ``set_threads``: applies a count (torch's);
    ``load``: other processes' busy cores since its previous call (``None``: unknown); ``clock``: seconds."""

    def __init__(self, *, mode: str, reason: str, cores: float, max_threads: int, threads: int,
                 set_threads: Callable[[int], None], load: Callable[[], float | None],
                 clock: Callable[[], float] = time.monotonic, wait: dict[str, str] | None = None) -> None:
        self.mode, self.reason, self.cores, self.max_threads = mode, reason, cores, max_threads
        self.threads, self._set, self._load, self._clock = threads, set_threads, load, clock
        self.wait = wait or {}
        self.changes: list[dict[str, Any]] = []
        self.num_changes = 0
        self.on_change: Callable[[dict[str, Any]], None] | None = None  # gets describe() after each change
        self._t0 = clock()
        self._lines: dict[tuple[int, str], PhaseLine] = {}
        self._window_start, self._steps, self._actual, self._expected = self._t0, 0, 0.0, 0.0
        self._probe_from: int | None = None  # the count a probe left (its line judges the probe)
        self._probe_windows = 0
        self._loaded: bool | None = None
        self._wait_up = self._wait_down = PROBE_S
        self._next_up = self._next_down = self._t0 + PROBE_S
        self._thread: int | None = None  # the thread that steps (torch's setting is that thread's)

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"

    # ---- per step -------------------------------------------------------------------------------------
    def step_done(self, step: int, prefill: bool, num_tokens: int, seconds: float) -> None:
        """Learn a step that ran at the current count; at the end of a window, decide (see the module doc)."""
        if self.mode != "adaptive" or seconds <= 0:
            return
        if self._thread != threading.get_ident():  # OpenMP's thread count is per calling thread: the stepping one's
            self._thread = threading.get_ident()
            self._set(self.threads)
        phase = "prefill" if prefill else "decode"
        line = self._line(self.threads, phase)
        judge = self._line(self._probe_from, phase) if self._probe_from is not None else line
        if judge.n >= MIN_SAMPLES:
            self._actual += seconds
            self._expected += judge.predict(float(num_tokens))
        line.add(float(num_tokens), seconds)
        self._steps += 1
        now = self._clock()
        if now - self._window_start >= WINDOW_S and self._steps >= MIN_WINDOW_STEPS:
            self._decide(step, now)
            self._window_start, self._steps, self._actual, self._expected = now, 0, 0.0, 0.0

    def _line(self, threads: int, phase: str) -> PhaseLine:
        key = (threads, phase)
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = PhaseLine()
        return line

    # ---- per window -----------------------------------------------------------------------------------
    def _decide(self, step: int, now: float) -> None:
        others = self._load()
        free = self.cores - others if others is not None else float(self.max_threads)
        loaded = free < self.max_threads - LOADED_MARGIN  # other work holds cores our threads could use
        if loaded != self._loaded:  # the load changed: probe again soon, in either direction
            self._loaded = loaded
            self._wait_up = self._wait_down = PROBE_S
            self._next_up = now + (QUIET_PROBE_S if not loaded else PROBE_S)
            self._next_down = now
        ratio = self._actual / self._expected if self._expected > 0 else None
        busy = f"{min(others, self.cores):.2f}" if others is not None else "?"
        if self._probe_from is not None:
            self._judge_probe(step, now, ratio, busy)
        elif loaded and self.threads > 1 and ratio is not None and ratio >= SLOW:
            target = max(1, min(self.threads - 1, int(free + 0.5)))
            self._change(step, now, target, f"steps took {ratio:.2f}x their expected time at {self.threads} "
                                            f"threads with {busy} of {self.cores:g} cores busy with other work")
        elif self.threads < self.max_threads and now >= self._next_up:
            self._start_probe(step, now, self.threads + 1, f"probe: other work on {busy} of {self.cores:g} cores")
        elif loaded and self.threads > 1 and now >= self._next_down:
            self._start_probe(step, now, self.threads - 1, f"probe: other work on {busy} of {self.cores:g} cores")

    def _start_probe(self, step: int, now: float, threads: int, reason: str) -> None:
        self._probe_from, self._probe_windows = self.threads, 0
        self._change(step, now, threads, reason)

    def _judge_probe(self, step: int, now: float, ratio: float | None, busy: str) -> None:
        old = self._probe_from
        assert old is not None
        self._probe_windows += 1
        if ratio is None and self._probe_windows < MAX_PROBE_WINDOWS:
            return  # the old count's line could not judge these steps yet: another window
        self._probe_from = None
        up = self.threads > old
        if ratio is not None and ratio <= KEEP:
            self._change(step, now, self.threads, f"kept: steps took {ratio:.2f}x the time {old} threads would "
                                                  f"({busy} cores busy with other work)", applied=False)
            if up:
                self._wait_up = PROBE_S
            else:
                self._wait_down = PROBE_S
        else:
            said = f"{ratio:.2f}x" if ratio is not None else "an unknown share of"
            self._change(step, now, old, f"back: steps took {said} the time {old} threads would")
            if up:
                self._wait_up = min(MAX_PROBE_S, 2 * self._wait_up)
            else:
                self._wait_down = min(MAX_PROBE_S, 2 * self._wait_down)
        self._next_up, self._next_down = now + self._wait_up, now + self._wait_down

    def _change(self, step: int, now: float, threads: int, reason: str, applied: bool = True) -> None:
        if applied and threads != self.threads:
            self._set(threads)
            self.threads = threads
        self.num_changes += 1
        if len(self.changes) < MAX_CHANGES:
            self.changes.append({"step": step, "t_s": round(now - self._t0, 3), "threads": self.threads,
                                 "reason": reason})
        if self.on_change is not None:
            self.on_change(self.describe())

    def new_run(self) -> None:
        """A new run on the same engine (``Engine.reset``): its changes start afresh, from the count it has now;
        what the lines learnt is kept."""
        self.changes, self.num_changes = [], 0
        self._t0 = self._window_start = self._clock()
        self._steps, self._actual, self._expected = 0, 0.0, 0.0
        if self.mode == "adaptive":
            self._change(0, self._t0, self.threads, "a new run on the same engine", applied=False)

    # ---- what the run metadata says -------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The run metadata's ``thread_policy`` (a new dict each time: JSON values)."""
        return {"mode": self.mode, "reason": self.reason, "usable_cores": self.cores, "max_threads": self.max_threads,
                "threads": self.threads, "start_threads": self.changes[0]["threads"] if self.changes else self.threads,
                "omp_wait": dict(self.wait), "attention_kernel_threads": 1, "changes": list(self.changes),
                "num_changes": self.num_changes}


def for_engine(device_type: str, clock: Callable[[], float] = time.monotonic) -> ThreadPolicy:
    """The policy of an engine whose model runs on ``device_type`` (see the module doc): applies its first
    count to torch now, and records it as the first change."""
    import torch

    global _meter
    settings.release_env()
    wait = settings.wait_choice().describe()
    current = torch.get_num_threads()
    cores = usable_cores()

    def fixed(reason: str) -> ThreadPolicy:
        return ThreadPolicy(mode="fixed", reason=reason, cores=cores, max_threads=current, threads=current,
                            set_threads=torch.set_num_threads, load=lambda: None, clock=clock, wait=wait)

    if device_type != "cpu":
        return fixed(f"the model runs on {device_type}")
    if settings.policy_mode() == "fixed":
        return fixed(f"{settings.POLICY_ENV}=fixed")
    user = settings.user_threads(current)
    if user is not None:
        return fixed(f"the user's: {user}")
    max_threads = max(1, min(settings.torch_default_threads(), int(cores + 0.5)))
    if max_threads == 1:
        return fixed("one usable core")
    # others' load since the previous engine's last window, or now when that is stale (a notebook's idle hour)
    first = _meter.read() if _meter.age_s() <= STALE_S else runnable_others()
    first = min(first, cores) if first is not None else None  # more runnable tasks than cores: all cores are busy
    _meter = meter = LoadMeter()

    def load() -> float | None:
        global _meter
        value = meter.read()
        _meter = meter  # the next engine reads on from here
        return value

    free = cores - first if first is not None else float(max_threads)
    threads = max(1, min(max_threads, int(free + 0.5)))

    def apply(n: int) -> None:
        torch.set_num_threads(n)
        settings.set_by_kvscope(n)

    apply(threads)
    policy = ThreadPolicy(mode="adaptive", reason="no thread setting of the user's", cores=cores,
                          max_threads=max_threads, threads=threads, set_threads=apply, load=load, clock=clock,
                          wait=wait)
    busy = f"{first:.2f}" if first is not None else "unknown"
    policy._change(0, policy._t0, threads, f"start: {busy} of {cores:g} usable cores busy with other work",
                   applied=False)
    return policy
