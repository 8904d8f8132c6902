"""Loaded engines kept for the next run in the same process (a notebook's kernel), so a rerun of ``%kvscope``
does not load the model again.

An engine is kept under its key, the model's name and the whole ``EngineConfig`` (so a run with other engine
settings gets its own engine), and handed to one run at a time: ``acquire`` takes an idle engine of that key and
resets it (``Engine.reset``: the model and its KV pages kept, everything a run leaves behind, cached blocks and
records included, made new, so the run records what it would on a fresh engine), or loads a new one if every
engine of that key is busy (a run still going); ``release`` gives it back at the run's end.

Engines are let go of (``release_all``, which ``%kvscope release`` calls) on demand, when more than
``max_idle`` are idle (the least recently used first), and under memory pressure: before a model is loaded, idle
engines are let go of while the memory available (``kvscope.utils.host.available_memory``) is below what the
largest kept engine takes. Letting go of an engine drops the cache's reference; a run object the user still holds
keeps its engine until it is dropped too. After letting go, freed heap is handed back to the system
(``malloc_trim``), so the process's RSS falls rather than staying at its peak.

Only a plain ``Engine`` loaded by name is kept: P/D engines (instances in their own processes), engines with
speculative decoding (a draft side ``reset`` does not renew) and simulated ones (nothing to load) are built for
each run as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvscope.engine.config import EngineConfig
from kvscope.engine.engine import Engine
from kvscope.engine.protocols import EngineClient
from kvscope.runs.setup.prepare import RunSetup
from kvscope.utils.host import available_memory

MAX_IDLE = 2  # idle engines kept (least recently used let go first)
NO_ENGINE_BYTES = 1 << 30  # what a load is assumed to need when no engine was kept to measure


@dataclass(slots=True)
class CachedEngine:
    """One kept engine: its key, whether a run uses it, when it was last given back."""

    key: tuple[str, str]
    engine: Engine
    busy: bool = True
    last_used: float = field(default_factory=time.monotonic)
    drop: bool = False  # let go of when its run gives it back (``release_all`` while it was busy)

    @property
    def nbytes(self) -> int:
        """Its weights and KV pages (the run metadata's figures)."""
        meta = self.engine.recorder.meta if self.engine.recorder is not None else {}
        return int(meta.get("weights_bytes", 0) or 0) + int(meta.get("kv_pool_bytes", 0) or 0)

    def describe(self) -> str:
        state = "in use" if self.busy else "idle"
        return f"{self.key[0]} ({state}, {self.nbytes / 2**20:,.0f} MiB)"


def engine_key(model: str, config: EngineConfig) -> tuple[str, str]:
    """The model's name and every engine setting (``EngineConfig``'s repr names each field)."""
    return model, repr(config)


class EngineCache:
    """Engines kept across runs (see the module doc); ``loads`` counts the engines it built."""

    def __init__(self, max_idle: int = MAX_IDLE, memory=available_memory) -> None:
        self.max_idle = max_idle
        self._memory = memory  # () -> AvailableMemory (a test's stand-in)
        self._entries: list[CachedEngine] = []
        self._lock = threading.Lock()
        self.loads = 0
        self.reuses = 0

    @property
    def entries(self) -> list[CachedEngine]:
        with self._lock:
            return list(self._entries)

    def acquire(self, model: str, config: EngineConfig) -> Engine:
        """An idle engine of ``(model, config)``, reset, or a new one (kept from now on); marked busy until
        ``release``. Called on the run's thread: loading takes as long as it takes."""
        key = engine_key(model, config)
        with self._lock:
            entry = next((e for e in reversed(self._entries) if e.key == key and not e.busy and not e.drop), None)
            if entry is not None:
                entry.busy = True
        if entry is not None:
            try:
                entry.engine.reset()
            except BaseException:
                self._forget(entry)
                raise
            self.reuses += 1
            return entry.engine
        self._relieve_pressure()
        engine = Engine(model, config=config)
        with self._lock:
            self.loads += 1
            self._entries.append(CachedEngine(key, engine))
        return engine

    def release(self, engine: Any) -> None:
        """``engine``'s run is over: it is idle again (or let go of, if ``release_all`` asked meanwhile or it
        still holds requests another caller added)."""
        with self._lock:
            entry = next((e for e in self._entries if e.engine is engine), None)
            if entry is None:
                return
            entry.busy, entry.last_used = False, time.monotonic()
            if entry.drop or engine.has_unfinished_requests():
                self._entries.remove(entry)
            dropped = self._over_limit()
        if entry.drop or dropped:
            trim_heap()

    def release_all(self) -> list[str]:
        """Let go of every idle engine now and of every busy one when its run ends; what was let go of (or will
        be), described."""
        with self._lock:
            said = [e.describe() for e in self._entries]
            for e in self._entries:
                e.drop = True
            self._entries = [e for e in self._entries if e.busy]
        trim_heap()
        return said

    def _forget(self, entry: CachedEngine) -> None:
        with self._lock:
            if entry in self._entries:
                self._entries.remove(entry)

    def _over_limit(self) -> bool:
        """Lock held: idle engines beyond ``max_idle`` let go of, least recently used first."""
        idle = sorted((e for e in self._entries if not e.busy), key=lambda e: e.last_used)
        extra = idle[:max(0, len(idle) - self.max_idle)]
        for e in extra:
            self._entries.remove(e)
        return bool(extra)

    def _relieve_pressure(self) -> None:
        """Before a load: idle engines let go of (least recently used first) while the memory available is
        below what the largest kept engine takes."""
        with self._lock:
            need = max((e.nbytes for e in self._entries), default=NO_ENGINE_BYTES)
            idle = sorted((e for e in self._entries if not e.busy), key=lambda e: e.last_used)
        dropped = False
        for entry in idle:
            if self._memory().bytes >= need:
                break
            self._forget(entry)
            dropped = True
            trim_heap()
        if dropped:
            gc.collect()


def trim_heap() -> None:
    """Collect, then hand the heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere):
    without it a freed model's pages stay in the process's RSS."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(name).malloc_trim(0)


class EngineLease:
    """A run's engine factory (``LiveRun``'s ``make_engine``): a kept engine for the run's model and settings when
    the setup allows one, else the setup's own engine; ``release`` (called by ``LiveRun`` at its end) gives it
    back."""

    def __init__(self, cache: EngineCache, setup: RunSetup) -> None:
        self.cache, self.setup = cache, setup

    @property
    def cached(self) -> bool:
        engine = self.setup.spec.engine
        return engine.pd is None and not engine.speculative and self.setup.config.speculative_config is None

    def __call__(self) -> EngineClient:
        if not self.cached:
            return self.setup.make_engine()
        return self.cache.acquire(self.setup.model, self.setup.config)

    def release(self, engine: EngineClient) -> None:
        self.cache.release(engine)


ENGINES = EngineCache()  # the process's (a notebook kernel's): %kvscope takes its engines from here
