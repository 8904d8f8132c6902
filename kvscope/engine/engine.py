"""Engine: requests in, tokens out, one scheduled step at a time (vLLM's ``LLM`` / ``LLMEngine`` shape).

This module builds the engine (``Engine()``, ``Engine.from_parts``, ``reset``) and takes its requests; the step
loop is ``StepLoopMixin`` (``kvscope.engine.step_loop``), the whole calls over it ``GenerateMixin`` (``generate.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch

from kvscope.engine.build import EngineParts, build_core, build_parts
from kvscope.engine.config import EngineConfig
from kvscope.engine.generate import GenerateMixin, Prompt
from kvscope.engine.profiling import ProfilingMixin
from kvscope.engine.request import (
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
    new_request,
    rejected_request,
)
from kvscope.engine.source import EngineSource, make_recorder, run_metadata
from kvscope.engine.step_loop import StepLoopMixin
from kvscope.engine.threads import ThreadPolicy, for_engine
from kvscope.engine.validation import resolve_device
from kvscope.telemetry.phase_marks import NULL_MARKS, PhaseMarks
from kvscope.telemetry.recorder import Recorder
from kvscope.telemetry.records import StepRecord

P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[Concatenate[Engine, P], R]) -> Callable[Concatenate[Engine, P], R]:
    """Run ``method`` holding the engine's lock (see ``Engine``: one thread inside at a time)."""

    @wraps(method)
    def locked(self: Engine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class Engine(GenerateMixin, ProfilingMixin, StepLoopMixin):
    """A paged-KV inference engine around an unchanged HuggingFace causal LM.

    ``Engine("tiny")``, ``Engine("smollm2")``, ``Engine("path/to/folder")`` or ``Engine(model, tokenizer=tok)``;
    keyword arguments are the fields of ``EngineConfig`` (``block_size``, ``num_blocks``, ...).

    Threads: every public method holds one re-entrant lock while it reads or changes the engine, so
    calls from several threads are serialized, never interleaved inside a step. ``generate`` and
    ``stream`` take it per step, not per call: two threads' calls share the steps (their requests are
    batched together) and both finish, rather than one waiting for the other's whole call.
    """

    def __init__(self, model: str | torch.nn.Module = "tiny", tokenizer=None, *, config: EngineConfig | None = None,
                 **kwargs) -> None:
        if "pd" in kwargs:  # the disaggregated engine is its own class, a layer above (kvscope.pd)
            raise TypeError(f"Engine runs one instance; for prefill/decode disaggregation use "
                            f"kvscope.PDEngine(model, pd={kwargs['pd']!r}) with the same arguments")
        config = replace(config, **kwargs) if config is not None else EngineConfig(**kwargs)
        device = resolve_device(config.device)
        # the model (loaded, probed, moved), its spec, runner, KV pool, scheduler and speculator (build.py)
        parts = build_parts(model, tokenizer, config, device)
        self.threads: ThreadPolicy | None = for_engine(device.type)  # torch's threads on a shared CPU (threads.py)
        self._adopt(parts, config, device)

    @classmethod
    def from_parts(cls, parts: EngineParts, config: EngineConfig, device: torch.device | None = None) -> Engine:
        """An engine around parts built elsewhere: the simulator's (``kvscope.sim``), whose worker has no model
        and whose clock is virtual. The loop, scheduler, KV cache and telemetry are this class's own."""
        engine = cls.__new__(cls)
        engine.threads = None  # a simulated engine's steps run no model: no thread policy
        engine._adopt(parts, config, device)
        return engine

    def _adopt(self, p: EngineParts, config: EngineConfig, device: torch.device | None) -> None:
        self.config, self._lock, self.device, self.clock = config, threading.RLock(), device, p.clock
        self.model, self.tokenizer, self.model_name, self.spec = p.model, p.tokenizer, p.model_name, p.spec
        self.fused_linears, self.kv_config, self.runner, self.pool = p.fused_linears, p.kv_config, p.runner, p.pool
        self.kv, self.scheduler, self.speculator = p.kv, p.scheduler, p.speculator
        self.extra_meta = p.extra_meta  # what the run metadata adds (a simulation says so)
        self.max_model_len = self.spec.max_model_len
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.phase_marks: PhaseMarks = NULL_MARKS  # a Profiler window's, while one is open
        self.recorder: Recorder | None = None
        if config.telemetry:
            self.recorder = make_recorder(self.run_metadata(), device, self.pool, self.clock)
        # the engine as a telemetry source (source.py): events and records, and the step index
        self.source = EngineSource(self.recorder, self.scheduler, self.speculator, config.block_size, self.runner)
        if self.threads is not None:
            self.threads.on_change = self._threads_changed

    def _threads_changed(self, described: dict) -> None:
        """The thread policy changed the threads: the run metadata says so (a new value for an existing key, so a
        snapshot copying the metadata on another thread never sees the dict change size)."""
        if self.recorder is not None:
            self.recorder.meta["thread_policy"] = described

    @_locked
    def reset(self) -> None:
        """The engine as ``Engine()`` built it, without loading the model again: the loaded model, its fused
        projections and the KV pages (zeroed, as new ones are) are kept; the block pool (nothing cached), the
        scheduler, the recorder and the step index are new, so a run on a reset engine records what a run on a
        fresh one does. For reusing a loaded engine across runs (``kvscope.runs.setup.engine_cache``).
        ``RuntimeError`` with unfinished requests (``abort_all()`` first), for a simulated engine or one with
        speculative decoding (its draft side is not reset: build a new engine)."""
        if self.requests or self.scheduler.has_unfinished_requests():
            raise RuntimeError(f"reset() with {len(self.requests)} unfinished requests: abort them first "
                               "(engine.abort_all())")
        if self.model is None or self.speculator is not None:
            raise RuntimeError("only an engine with a model and no speculative decoding can be reset; build a new one")
        for k, v in getattr(self.runner, "kv_slots", ()):
            k.zero_()
            v.zero_()
        eos = self.scheduler.eos_token_ids
        self.pool, self.kv, self.scheduler = build_core(self.config, self.kv_config, self.pool.num_blocks,
                                                        self.max_model_len, eos)
        self.requests = {}
        self.phase_marks = NULL_MARKS
        if self.threads is not None:  # the thread policy's changes start afresh with the new run (threads.py)
            self.threads.new_run()
        self.recorder = None
        if self.config.telemetry:
            self.recorder = make_recorder(self.run_metadata(), self.device, self.pool, self.clock)
        self.source = EngineSource(self.recorder, self.scheduler, self.speculator, self.config.block_size,
                                   self.runner)

    @property
    @_locked
    def step_index(self) -> int:
        """The index of the next recorded step."""
        return self.source.step_index

    @property
    @_locked
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a request (unless ``ignore_eos``); the scheduler checks them."""
        return self.scheduler.eos_token_ids

    @eos_token_ids.setter
    @_locked
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        self.scheduler.eos_token_ids = frozenset(ids)

    @_locked
    def run_metadata(self) -> dict:
        """What a saved run needs to be read without the engine (all JSON values; docs/telemetry.md)."""
        meta = run_metadata(self.model_name, self.config, self.spec, self.runner, self.device, self.model,
                            self.speculator)
        if self.threads is not None:  # which thread policy the run used, and when it changed (threads.py)
            meta["thread_policy"] = self.threads.describe()
        return {**meta, **self.extra_meta}

    # ---- requests --------------------------------------------------------------------------------
    @_locked
    def make_request(self, prompt: Prompt, params: SamplingParams | None = None,
                     request_id: str | None = None) -> Request:
        """Validate a prompt and its parameters into a ``Request``. Raises ``TypeError`` (a prompt or
        params of the wrong type) or ``ValueError`` (empty, too long, outside the vocabulary, an id in
        use), naming the problem; the engine is left as it was."""
        request = new_request(prompt, params, request_id, self.tokenizer, self.spec.vocab_size, self.max_model_len,
                              self.clock.now_ns() / 1e9)
        self._check_id_free(request.request_id)
        return request

    def _check_id_free(self, request_id: str) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")

    @_locked
    def add_request(self, prompt: Prompt | Request, params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request; returns its id. A bad one raises here (``make_request``) and changes nothing:
        the requests already queued go on. An id may be reused once its request has finished; the
        records then keep the two apart (the later one is recorded as ``id#2``; docs/reliability.md)."""
        if isinstance(prompt, Request):
            request = prompt
            self._check_id_free(request.request_id)
        else:
            request = self.make_request(prompt, params, request_id)
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)
        # queued at its arrival: one that came during a step (LiveRun submits between steps) waited for it
        self.source.event("queued", request, min(self.clock.now_ns(), round(request.arrival_time * 1e9)))
        return request.request_id

    @_locked
    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is; its blocks return to the pool. False if it is unknown or done."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self._finish(request, RequestStatus.FINISHED_ABORTED)
        return True

    @_locked
    def abort_all(self) -> None:
        """Abort every unfinished request and record the resulting state (``record_state``)."""
        for request_id in list(self.requests):
            self.abort(request_id)
        self.record_state()

    @_locked
    def reject(self, prompt: Any, params: Any, error: str) -> Request:
        """A request that cannot run, recorded as queued and at once finished with status ``error``
        (so a background run can fail one bad prompt alone while the others go on)."""
        request = rejected_request(prompt, params, error, self.tokenizer)
        self.source.event("queued", request)
        self.source.event("finished", request)
        return request

    @_locked
    def record_state(self) -> StepRecord | None:
        """Record the engine's state if it changed since the last record without a step (requests
        aborted or failed between steps): a ``StepRecord`` with nothing scheduled and zero duration,
        under the next step index. Returns it, or ``None`` when there was nothing new to record."""
        return self.source.record_state()

    @_locked
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @_locked
    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @_locked
    def output(self, request: Request) -> RequestOutput:
        return RequestOutput.of(request, self.decode(request.output_token_ids))
