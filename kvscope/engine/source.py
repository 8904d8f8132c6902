"""kvscope's engine as a telemetry source: what it hands the recorder, as plain records.

Telemetry (``kvscope.telemetry``) never sees the engine, its scheduler or its requests. The engine
builds the static run metadata once (``run_metadata``); its ``EngineSource`` hands the recorder request
events, and after each step (one call, ``step_done``) the events the step's tokens caused and the step's
record: the ``BatchSummary`` of its ``SchedulerOutput`` (``batch_summary``), the ``StepTimings`` its
``StepClock`` took and ``Scheduler.make_stats``'s counters. The profiler's backend hook is ``wrap_backend``.
"""

from __future__ import annotations

import gc
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from kvscope.engine.batch import batch_summary, light_batch
from kvscope.engine.config import EngineConfig, ModelSpec
from kvscope.engine.core.block_pool import BlockPool
from kvscope.engine.core.output import SchedulerOutput, SchedulerUpdate
from kvscope.engine.core.scheduler import Scheduler
from kvscope.engine.protocols import Worker
from kvscope.engine.request import Request, RequestStatus
from kvscope.engine.spec_decode import Speculator
from kvscope.engine.worker.model_runner import ModelRunner
from kvscope.telemetry.inputs import BatchSummary, StepTimings
from kvscope.telemetry.memory import MemoryProbe
from kvscope.telemetry.phase_marks import PhaseMarks
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import StepRecord
from kvscope.utils.clock import WALL_CLOCK, Clock


class StepClock:
    """A step's phase boundaries: ``phase(name)`` takes the time (for ``StepTimings``) and tells the
    profiler's marks that ``name`` begins; ``stop()`` only takes the time (a step that ran nothing)."""

    __slots__ = ("clock", "marks", "times")

    def __init__(self, marks: PhaseMarks, clock: Clock = WALL_CLOCK) -> None:
        self.marks, self.clock = marks, clock
        self.times: list[int] = []

    def phase(self, name: str) -> None:
        self.times.append(self.clock.now_ns())
        self.marks.begin(name)

    def stop(self) -> None:
        self.times.append(self.clock.now_ns())

    def timings(self) -> StepTimings:
        """The step's ``StepTimings``, ending now; the phases it skipped repeat its last time."""
        t = self.times
        t = t + [t[-1]] * (5 - len(t))
        return StepTimings(t[0], t[1], t[2], t[3], t[4], self.clock.now_ns())


class GcTimer:
    """The time this process spends in the garbage collector, summed (a ``gc.callbacks`` entry; one per
    process, installed by the first ``EngineSource`` that records): two clock reads per collection."""

    __slots__ = ("_start", "total_ns")

    def __init__(self) -> None:
        self.total_ns = self._start = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
        else:
            self.total_ns += time.perf_counter_ns() - self._start


GC_TIMER = GcTimer()


class EngineSource:
    """The engine's side of its ``Recorder`` (``None``: telemetry off, nothing is recorded): request
    events, one record per step, state records between steps. Owns the step index: the index of the
    next recorded step (every step that ran a batch takes one, recorded or not). No ``__slots__``:
    ``benchmarks/overhead.py`` times ``record`` by replacing it on the instance."""

    def __init__(self, recorder: Recorder | None, scheduler: Scheduler, speculator: Speculator | None,
                 block_size: int, worker: Worker[Any, Any] | None = None) -> None:
        self.recorder, self.scheduler, self.speculator = recorder, scheduler, speculator
        self.block_size = block_size
        # whose attention kernel each record names (StepRecord.attention_backend); a simulation's runs none
        self.worker = worker if worker is not None and worker.backend_name != "simulated" else None
        self._kernel = recorder.meta.get("attention_backend") if recorder is not None else None
        if recorder is not None and self.worker is not None:  # the key exists before any snapshot copies meta
            recorder.meta.setdefault("attention_backend_switches", [])
        self.step_index = 0
        if recorder is not None and GC_TIMER not in gc.callbacks:
            gc.callbacks.append(GC_TIMER)
        self._gc_seen = GC_TIMER.total_ns  # GC time already counted in a record

    def event(self, kind: str, request: Request, t_ns: int | None = None) -> None:
        if self.recorder is not None:
            self.recorder.request_event(kind, request.request_id, self.step_index, request.num_prompt_tokens,
                                        request.num_output_tokens, request.finish_reason, request.error, t_ns=t_ns,
                                        prompt_token_ids=request.prompt_token_ids if kind == "queued" else None)

    def step_done(self, sched: SchedulerOutput, update: SchedulerUpdate | None, clock: StepClock) -> None:
        """A step is over: the events its tokens caused and its record, then the next step index.
        ``update`` None: it ran nothing, and is recorded (taking an index) only if requests failed or
        were preempted in it."""
        if update is None:
            if self.recorder is not None and (sched.failed or sched.preempted):
                self.record(sched, [], len(sched.failed), clock.timings())
                self.step_index += 1  # a recorded step: keep step indices unique
            return
        if self.recorder is not None:
            self._token_events(update)
            self.record(sched, update.requests, len(update.finished) + len(sched.failed), clock.timings(), update)
        self.step_index += 1

    def _token_events(self, update: SchedulerUpdate) -> None:
        running, accepted = RequestStatus.RUNNING, update.spec_accepted
        requests = update.requests
        if not accepted:  # most steps: a comprehension keeps the few at their first token or finished
            requests = [r for r in requests if len(r.output_token_ids) == 1 or r.status is not running]
        for request in requests:  # events the step's tokens caused, in sampling order
            n = len(request.output_token_ids)  # all of them new: its first token (+ accepted drafts)
            if n == 1 or (accepted and n == 1 + len(accepted.get(request.request_id, ()))):
                self.event("first_token", request)
            if request.status is not running:
                self.event("finished", request)

    def record(self, sched: SchedulerOutput, sampled: list[Request], num_finished: int,
               timings: StepTimings, update: SchedulerUpdate | None = None) -> StepRecord:
        """The step's record: its batch summary, the speculator's stats and the scheduler's counters
        (what ``benchmarks/overhead.py`` times as telemetry's cost per step). Only with telemetry on."""
        recorder = self.recorder
        assert recorder is not None, "EngineSource.record is called only when the engine records"
        accepted, spec = update.spec_accepted if update is not None else {}, None
        if self.speculator is not None:
            spec = self.speculator.stats(sched.scheduled_spec_decode_tokens, sched.requests, accepted,
                                         update.spec_freed if update is not None else {}, self.block_size)
        make = batch_summary if recorder.detail else light_batch  # light: a step the window will not keep
        batch = make(self.step_index, sched, sampled, num_finished, accepted, spec)
        gc_total = GC_TIMER.total_ns
        batch.wait_reason, batch.gc_ns, self._gc_seen = self.scheduler.wait_reason, gc_total - self._gc_seen, gc_total
        if self.worker is not None:
            batch.attention_backend = self._kernel_of_step(recorder)
        return recorder.record_step(batch, timings, self.scheduler.make_stats())

    def _kernel_of_step(self, recorder: Recorder) -> str:
        """The attention kernel of the step just run; a change (the C++ kernel built in the background taking
        over from torch, ``kernels/background_build.py``) is added to meta's ``attention_backend_switches``."""
        assert self.worker is not None
        name = self.worker.backend_name
        if name != self._kernel:  # a new list for the existing key: a snapshot on another thread may be copying it
            switch = {"step": self.step_index, "from": self._kernel, "to": name, "t_unix_s": time.time()}
            recorder.meta["attention_backend_switches"] = [*recorder.meta.get("attention_backend_switches", ()), switch]
            self._kernel = name
        return name

    def record_state(self) -> StepRecord | None:
        """``Engine.record_state``: a zero-duration record with nothing scheduled, if the state changed."""
        if self.recorder is None:
            return None
        stats = self.scheduler.make_stats()
        if not self.recorder.state_changed(stats):
            return None
        timings = StepTimings.instant(self.recorder.clock.now_ns())
        spec = self.speculator.stats({}, [], {}, {}, self.block_size) if self.speculator is not None else None
        record = self.recorder.record_step(BatchSummary(self.step_index, spec_decode=spec), timings, stats)
        self.step_index += 1  # a recorded step: keep step indices unique
        return record


def wrap_backend(runner: ModelRunner, wrap: Callable[[str, Callable], Callable]) -> Callable[[], None]:
    """Route the runner's attention-backend calls through ``wrap(kind, fn)`` (``kind``: "store_kv" or
    "paged_attention"); returns the function that puts the original backend back."""
    saved = backend = runner.backend
    runner.backend = replace(
        backend,
        store_kv=wrap("store_kv", backend.store_kv),
        paged_attention=wrap("paged_attention", backend.paged_attention),
        run_plan=wrap("paged_attention", backend.run_plan) if backend.run_plan else None,
    )

    def restore() -> None:
        runner.backend = saved

    return restore


def make_recorder(meta: dict[str, Any], device: torch.device | None, pool: BlockPool,
                  clock: Clock = WALL_CLOCK) -> Recorder:
    """The engine's recorder (``meta``: ``run_metadata``), with a memory probe of ``device`` (``None``: no
    memory readings, a simulation's), stamping times from ``clock``, listening to its block pool's events."""
    memory = MemoryProbe(device, meta["weights_bytes"], meta["kv_pool_bytes"]) if device is not None else None
    recorder = Recorder(meta, memory, clock=clock)
    pool.listeners.append(recorder.block_event)
    return recorder


def weights_bytes(model: torch.nn.Module | None, spec: ModelSpec | None = None) -> int:
    """Parameters and buffers of ``model``, tied weights counted once; without a model (a simulation),
    the spec's parameter count in its dtype."""
    if model is None:
        return spec.num_params * spec.dtype_bytes if spec is not None else 0
    tensors = [*model.parameters(), *model.buffers()]
    seen = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return int(sum(seen.values()))


def run_metadata(
    model_name: str,
    config: EngineConfig,
    spec: ModelSpec,
    runner: Worker[Any, Any],
    device: torch.device | None,
    model: torch.nn.Module | None,
    speculator: Speculator | None = None,
) -> dict[str, Any]:
    """What a saved run needs to be read without the engine (all JSON values); the keys the
    recorder itself reads are ``block_size``, ``num_blocks``, ``kv_bytes_per_token``,
    ``kv_bytes_per_block`` and ``max_model_len``."""
    from kvscope._version import __version__

    speculative = speculator.describe() if speculator is not None else None

    return {
        "kvscope_version": __version__,
        "model": model_name,
        # a draft model given as a module is named, not copied (asdict would deep-copy it)
        "config": _jsonable({**asdict(replace(config, speculative_config=None)),
                             "speculative_config": speculative}),
        "spec": _jsonable(asdict(spec)),
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "kv_bytes_per_block": runner.kv_bytes_per_block,  # a page in every slot (groups share slots)
        "max_model_len": spec.max_model_len,
        "static_kv_bytes_per_request": spec.kv_bytes_for_tokens(spec.max_model_len),  # window-aware
        "num_blocks": runner.num_blocks,
        "block_size": config.block_size,
        "device": str(device),
        "attention_backend": runner.backend_name,
        "weights_bytes": weights_bytes(model, spec),
        "kv_pool_bytes": int(runner.kv_cache_bytes),
        # KV cache groups (kvscope.engine.core.kv_groups): layers per group, slots, padding, why a window is not freed
        "kv_cache_groups": runner.kv_config.describe(),
        "created_unix_s": time.time(),
        "host": platform.node(),
        "python": platform.python_version(),
        "speculative": speculative,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
